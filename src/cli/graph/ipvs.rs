//! `graph --ipvsadm FILE`: the IPVS graph of a node. The logic lives in `collect::ipvs_dumps` and
//! `graph::ipvs`; this module calls them and formats.

use crate::cli::common::{IpvsArgs, with_warnings};
use crate::collect::ipvs_dumps::IpvsTexts;
use crate::graph::ipvs as g;

/// `graph --ipvsadm FILE [--ipset FILE]`: the IPVS graph in `table`, `json`, `yaml` or `dot`.
pub fn graph(args: &IpvsArgs, format: &str, no_headers: bool) -> anyhow::Result<String> {
    graph_of_texts(&args.read()?, format, no_headers)
}

/// The IPVS graph of texts read by [`IpvsTexts::read`] or [`IpvsTexts::from_texts`].
pub fn graph_of_texts(texts: &IpvsTexts, format: &str, no_headers: bool) -> anyhow::Result<String> {
    let graph = with_warnings(|w| texts.graph(w))?;
    Ok(match format {
        "json" => crate::output::to_json(&graph)?,
        "yaml" => crate::output::to_yaml(&graph)?,
        "dot" => g::dot(&graph),
        _ => {
            let t = g::table(&graph, no_headers);
            if t.is_empty() {
                let mut none = "No IPVS virtual servers found.\n".to_string();
                if !graph.gaps.is_empty() {
                    none.push_str("partial input: the graph shows only what it holds:\n");
                    for gap in &graph.gaps {
                        none.push_str(&format!("  - {gap}\n"));
                    }
                }
                none
            } else {
                t
            }
        }
    })
}
