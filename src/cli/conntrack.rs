//! `--conntrack FILE`: the node's connection-tracking table, for `verify` (findings KP6xx), `trace`
//! (live flows per endpoint) and `repair` (the `conntrack -D` of stale flows, in
//! `cli/repair/conntrack.rs`). The checks live in [`crate::pipeline::conntrack`]; this module
//! reads the listing and hands it over.

use super::common::read_named;
use crate::pipeline::{NamedText, conntrack};
use clap::Args;
use kproxy_parsers::conntrack::ConntrackListing;
use std::path::PathBuf;

/// The `--conntrack` flag.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Conntrack (offline)")]
pub struct ConntrackArgs {
    /// The node's conntrack table: `conntrack -L [-o extended]` or `cat /proc/net/nf_conntrack`
    /// output (`-` = stdin). Its TCP/UDP/SCTP flows are checked against the services' serving
    /// endpoints (findings KP6xx).
    #[arg(long = "conntrack", value_name = "FILE")]
    pub conntrack: Option<PathBuf>,
}

impl ConntrackArgs {
    /// The listing: the file given with `--conntrack`, else the one a collector fetched.
    pub fn text(
        &self,
        collected: Option<&str>,
        collector: &str,
    ) -> anyhow::Result<Option<NamedText>> {
        Ok(match (&self.conntrack, collected) {
            (Some(path), _) => Some(read_named(path)?),
            (None, Some(text)) => Some(NamedText {
                text: text.to_string(),
                label: format!("conntrack listing ({collector})"),
            }),
            (None, None) => None,
        })
    }
}

/// Parses a listing, naming it in errors; in lenient mode every skipped line is logged.
pub fn parse_listing(listing: &NamedText, lenient: bool) -> anyhow::Result<ConntrackListing<'_>> {
    let parsed = conntrack::parse_listing(listing, lenient)?;
    for line in conntrack::skipped_lines(&parsed, &listing.label) {
        tracing::warn!("{line}");
    }
    Ok(parsed)
}

/// `trace svc/NAME --conntrack FILE`: the live flows per endpoint on the path view. Only an
/// explicit file is read (a collected listing is not: trace's output stays what it was without
/// the flag).
pub fn annotate_path(
    args: &ConntrackArgs,
    lenient: bool,
    view: &mut crate::trace::path::PathView,
) -> anyhow::Result<()> {
    let Some(text) = args.text(None, "")? else {
        return Ok(());
    };
    let listing = parse_listing(&text, lenient)?;
    crate::trace::conntrack::annotate(view, &listing.flows);
    Ok(())
}
