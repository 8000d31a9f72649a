//! `--conntrack FILE`: the node's connection-tracking table, for `verify` (findings KP6xx), `trace`
//! (live flows per endpoint) and `repair` (the `conntrack -D` of stale flows, in
//! `cli/repair/conntrack.rs`). The checks live in [`crate::compare::conntrack`]; this module
//! reads and parses the listing and hands it over.

use super::common::read_input;
use crate::compare::conntrack::{ConntrackCheck, ServiceIndex, check};
use crate::compare::{Finding, Report};
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::node::NodeFacts;
use anyhow::Context;
use clap::Args;
use kproxy_parsers::conntrack::{ConntrackListing, ParseOptions, parse};
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

/// A listing's text and the name its messages use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConntrackText {
    /// The listing.
    pub text: String,
    /// The file name, or `conntrack -L (COLLECTOR)`.
    pub label: String,
}

impl ConntrackArgs {
    /// The listing: the file given with `--conntrack`, else the one a collector fetched.
    pub fn text(
        &self,
        collected: Option<&str>,
        collector: &str,
    ) -> anyhow::Result<Option<ConntrackText>> {
        Ok(match (&self.conntrack, collected) {
            (Some(path), _) => Some(ConntrackText {
                text: read_input(path)?,
                label: path.display().to_string(),
            }),
            (None, Some(text)) => Some(ConntrackText {
                text: text.to_string(),
                label: format!("conntrack listing ({collector})"),
            }),
            (None, None) => None,
        })
    }
}

/// Parses a listing, naming it in errors; in lenient mode every skipped line is a warning.
pub fn parse_listing<'a>(
    listing: &'a ConntrackText,
    lenient: bool,
) -> anyhow::Result<ConntrackListing<'a>> {
    let opts = if lenient {
        ParseOptions::lenient()
    } else {
        ParseOptions::strict()
    };
    let parsed = parse(&listing.text, opts)
        .map_err(|e| e.in_source(listing.label.clone()))
        .with_context(|| format!("reading the conntrack listing {}", listing.label))?;
    for s in &parsed.skipped {
        tracing::warn!("{}:{}: skipped: {}", listing.label, s.line, s.reason);
    }
    Ok(parsed)
}

/// Checks the listing's flows against the services of `state`.
pub fn check_listing(
    listing: &ConntrackListing<'_>,
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
) -> ConntrackCheck {
    check(&listing.flows, &ServiceIndex::new(state, config, facts))
}

/// The findings `verify` adds for a conntrack listing (nothing when none was given): KP6xx per
/// stale group, and KP013 when lines were skipped.
pub fn verify_findings(
    args: &ConntrackArgs,
    collected: Option<&str>,
    collector: &str,
    lenient: bool,
    inputs: (&ClusterState, &ProxyConfig, &NodeFacts),
) -> anyhow::Result<Vec<Finding>> {
    let Some(text) = args.text(collected, collector)? else {
        return Ok(Vec::new());
    };
    let listing = parse_listing(&text, lenient)?;
    let (state, config, facts) = inputs;
    let mut findings = check_listing(&listing, state, config, facts).findings();
    if !listing.skipped.is_empty() {
        findings.push(crate::compare::catalogue::LINES_SKIPPED.finding(format!(
            "{} lines of {} were skipped (--lenient)",
            listing.skipped.len(),
            text.label
        )));
    }
    Ok(findings)
}

/// `report` with `findings` added (sorted and counted again).
pub fn with_findings(report: Report, findings: Vec<Finding>) -> Report {
    if findings.is_empty() {
        return report;
    }
    let Report {
        node,
        mode,
        summary,
        findings: mut all,
        findings_truncated,
    } = report;
    all.extend(findings);
    let mut report =
        Report::new(node, mode, summary.service_ports, all).with_unchecked(summary.unchecked);
    report.left_out(findings_truncated.unwrap_or(0));
    report
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
