//! The iptables mode's service graph: [`build`] turns one parsed `iptables-save` / `iptables -S`
//! dump into a [`ServiceGraph`](crate::graph::ServiceGraph), and [`anomalies`] lists what does
//! not fit kube-proxy's shape.

mod anomalies;
mod build;

pub use build::{DumpSummary, build, build_ruleset, from_dump};

/// Parses `text` (named `source` in errors and in the graph) and builds its graph.
pub fn from_text<'a>(
    text: &'a str,
    source: &str,
    parse: &crate::parsers::iptables::ParseOptions,
    opts: &crate::graph::GraphOptions,
) -> Result<crate::graph::ServiceGraph<'a>, crate::parsers::ParseError> {
    let dump =
        crate::parsers::iptables::parse_dump(text, parse).map_err(|e| e.in_source(source))?;
    let opts = crate::graph::GraphOptions {
        source: Some(source.to_string()),
        ..opts.clone()
    };
    Ok(from_dump(dump, &opts))
}
