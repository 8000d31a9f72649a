//! A node's conntrack table (`conntrack -L [-o extended]`, `/proc/net/nf_conntrack`) read and
//! checked against the services' serving endpoints: `verify`'s findings KP6xx, and what
//! `repair` deletes. The checks are [`crate::compare::conntrack`]'s.

use super::{NamedText, Note};
use crate::compare::catalogue::LINES_SKIPPED;
use crate::compare::conntrack::{ConntrackCheck, ServiceIndex, check};
use crate::compare::{Finding, Report};
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::node::NodeFacts;
use kproxy_parsers::ParseError;
use kproxy_parsers::conntrack::{ConntrackListing, ParseOptions, parse};

/// A conntrack listing that did not parse.
#[derive(Debug, thiserror::Error)]
#[error("reading the conntrack listing {label}")]
pub struct ConntrackError {
    /// The listing's name.
    pub label: String,
    /// Where it went wrong (`listing:line:col`).
    #[source]
    pub source: Box<ParseError>,
}

/// Parses a listing, naming it in errors; lenient reading skips lines it cannot read (each is
/// in the listing's `skipped`, see [`skipped_lines`]).
pub fn parse_listing(
    listing: &NamedText,
    lenient: bool,
) -> Result<ConntrackListing<'_>, ConntrackError> {
    let opts = if lenient {
        ParseOptions::lenient()
    } else {
        ParseOptions::strict()
    };
    parse(&listing.text, opts).map_err(|e| ConntrackError {
        label: listing.label.clone(),
        source: Box::new(e.in_source(listing.label.clone())),
    })
}

/// The lines a lenient parse of `listing` skipped, one message each (`listing:line: skipped:
/// why`).
pub fn skipped_lines<'a>(
    listing: &'a ConntrackListing<'_>,
    label: &'a str,
) -> impl Iterator<Item = String> + 'a {
    listing
        .skipped
        .iter()
        .map(move |s| format!("{label}:{}: skipped: {}", s.line, s.reason))
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

/// The findings `verify` adds for a conntrack listing (nothing without one): KP6xx per stale
/// group, and KP013 when lines were skipped.
pub(super) fn findings(
    listing: Option<&NamedText>,
    lenient: bool,
    (state, config, facts): (&ClusterState, &ProxyConfig, &NodeFacts),
    notes: &mut Vec<Note>,
) -> Result<Vec<Finding>, ConntrackError> {
    let Some(text) = listing else {
        return Ok(Vec::new());
    };
    let listing = parse_listing(text, lenient)?;
    notes.extend(skipped_lines(&listing, &text.label).map(Note::Skipped));
    let mut findings = check_listing(&listing, state, config, facts).findings();
    if !listing.skipped.is_empty() {
        findings.push(LINES_SKIPPED.finding(format!(
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
