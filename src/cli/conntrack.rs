//! `--conntrack FILE`: the node's connection-tracking table, for `verify` (findings KP6xx), `trace`
//! (live flows per endpoint) and `repair` (the `conntrack -D` of stale flows). The checks live in
//! [`crate::compare::conntrack`]; this module reads and parses the listing and hands it over.

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
    } = report;
    all.extend(findings);
    Report::new(node, mode, summary.service_ports, all)
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

/// The conntrack step of `repair --local` or of the offline plan: the listing (`--conntrack
/// FILE`, else with `--local` this host's own table) planned and, with `--apply` on this host,
/// run (see [`plan_and_apply`]). `None` when there is no listing (offline without
/// `--conntrack`, or no `conntrack` tool on the host: then a warning says so).
pub fn repair_step(
    args: &super::repair::RepairArgs,
    inputs: &super::common::ProxyInputs,
    refused: &[String],
) -> anyhow::Result<Option<crate::apply::conntrack::ConntrackRepair>> {
    use crate::apply::conntrack::{self as ct, ConntrackHost, LocalConntrack};
    let host = LocalConntrack {
        netns: args.netns.clone(),
    };
    let on_host = args.local && args.iptables_save.is_none();
    let text = match args.conntrack.text(None, "")? {
        Some(t) => t,
        None if on_host => match ct::list(&host) {
            Ok(text) => ConntrackText {
                text,
                label: format!(
                    "conntrack {} on {}",
                    ct::LIST_ARGS.join(" "),
                    host.location()
                ),
            },
            Err(e) => {
                tracing::warn!("stale conntrack entries not checked: {e}");
                return Ok(None);
            }
        },
        None => return Ok(None),
    };
    plan_and_apply(args, inputs, &text, on_host.then_some(&host), refused).map(Some)
}

/// The conntrack step of `repair NODE`: the listing the collector fetched (or `--conntrack
/// FILE`), the deletions run in the collector's pod with `--apply`. `None` without a listing.
pub fn remote_repair_step(
    args: &super::repair::RepairArgs,
    inputs: &super::common::ProxyInputs,
    snapshot: &crate::collect::NodeSnapshot,
    host: &impl crate::apply::conntrack::ConntrackHost,
    refused: &[String],
) -> anyhow::Result<Option<crate::apply::conntrack::ConntrackRepair>> {
    match args
        .conntrack
        .text(snapshot.conntrack.as_deref(), &snapshot.collector)?
    {
        Some(text) => plan_and_apply(args, inputs, &text, Some(host), refused).map(Some),
        None => Ok(None),
    }
}

/// Checks `text` against the services, plans the deletion of its stale UDP/SCTP groups, and
/// runs them on `host` with `--apply` when the rules repair was not refused (after it: the new
/// flows must find the right rules).
fn plan_and_apply(
    args: &super::repair::RepairArgs,
    inputs: &super::common::ProxyInputs,
    text: &ConntrackText,
    host: Option<&impl crate::apply::conntrack::ConntrackHost>,
    refused: &[String],
) -> anyhow::Result<crate::apply::conntrack::ConntrackRepair> {
    use crate::apply::conntrack::{self as ct, ConntrackRepair};
    let listing = parse_listing(text, false)?;
    let check = check_listing(&listing, &inputs.state, &inputs.config, &inputs.facts);
    let mut plan = ConntrackRepair::plan(text.label.clone(), &check);
    if let Some(host) = host
        && args.apply
        && refused.is_empty()
        && !plan.is_empty()
    {
        ct::apply(host, &mut plan, &check)?;
    }
    Ok(plan)
}

/// Adds the conntrack step to a repair's plan document: a section after the text plan, or a
/// `conntrack` object in the JSON one.
pub(super) fn add_to_doc(
    doc: super::repair::PlanDoc,
    step: Option<&crate::apply::conntrack::ConntrackRepair>,
    painter: crate::output::color::Painter,
) -> anyhow::Result<super::repair::PlanDoc> {
    use super::repair::PlanDoc;
    use crate::output::color::Role;
    use std::fmt::Write as _;
    let Some(step) = step else {
        return Ok(doc);
    };
    Ok(match doc {
        PlanDoc::Json(mut m) => {
            m.insert("conntrack".into(), serde_json::to_value(step)?);
            PlanDoc::Json(m)
        }
        PlanDoc::Text(mut s) => {
            let n = step.deletions.len();
            let _ = writeln!(
                s,
                "conntrack: {} to delete (of {} flows listed in {})",
                match n {
                    0 => "no stale flow group".to_string(),
                    1 => "1 stale flow group".to_string(),
                    n => format!("{n} stale flow groups"),
                },
                step.flows,
                step.source
            );
            for d in &step.deletions {
                let _ = writeln!(
                    s,
                    "  {} {}{} → {} ({} flow{})",
                    painter.paint(Role::Error, d.id),
                    d.service
                        .as_deref()
                        .map(|x| format!("{x} "))
                        .unwrap_or_default(),
                    d.destination,
                    d.reply_source,
                    d.flows,
                    if d.flows == 1 { "" } else { "s" }
                );
                let _ = writeln!(s, "      {}", d.command);
                if let (Some(del), Some(left)) = (d.deleted, d.remaining) {
                    let line = format!("deleted {del}; listed again: {left} left");
                    let role = if left == 0 { Role::Ok } else { Role::Error };
                    let _ = writeln!(s, "      {}", painter.paint(role, &line));
                    if left > 0 {
                        let _ = writeln!(
                            s,
                            "      {}",
                            painter.paint(
                                Role::Error,
                                "new flows still go there: the rules still DNAT to it (repair the rules, then run this again)"
                            )
                        );
                    }
                }
            }
            if step.tcp_left > 0 {
                let _ = writeln!(
                    s,
                    "  {} stale TCP group(s) left alone: TCP connections end on their own",
                    step.tcp_left
                );
            }
            PlanDoc::Text(s)
        }
    })
}
