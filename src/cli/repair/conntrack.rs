//! The conntrack step of a repair: after the rules, the node's stale UDP/SCTP flows are deleted
//! by exact `conntrack -D` filters (`crate::apply::conntrack`), as kube-proxy does after each
//! sync.

use super::RepairArgs;
use super::report::PlanDoc;
use crate::apply::conntrack::{self as ct, ConntrackHost, ConntrackRepair, LocalConntrack};
use crate::cli::conntrack::parse_listing;
use crate::collect::NodeSnapshot;
use crate::output::color::{Painter, Role};
use crate::pipeline::NamedText;
use crate::pipeline::conntrack::check_listing;
use crate::state::ProxyInputs;
use std::fmt::Write as _;

/// The conntrack step of `repair --local` or of the offline plan: the listing (`--conntrack
/// FILE`, else with `--local` this host's own table) planned and, with `--apply` on this host,
/// run (see [`plan_and_apply`]). `None` when there is no listing (offline without
/// `--conntrack`, or no `conntrack` tool on the host: then a warning says so).
pub(super) fn repair_step(
    args: &RepairArgs,
    inputs: &ProxyInputs,
    refused: &[String],
) -> anyhow::Result<Option<ConntrackRepair>> {
    let host = LocalConntrack {
        netns: args.netns.clone(),
    };
    let on_host = args.local && args.iptables_save.is_none();
    let text = match args.conntrack.text(None, "")? {
        Some(t) => t,
        None if on_host => match ct::list(&host) {
            Ok(text) => NamedText {
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
pub(super) fn remote_repair_step(
    args: &RepairArgs,
    inputs: &ProxyInputs,
    snapshot: &NodeSnapshot,
    host: &impl ConntrackHost,
    refused: &[String],
) -> anyhow::Result<Option<ConntrackRepair>> {
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
    args: &RepairArgs,
    inputs: &ProxyInputs,
    text: &NamedText,
    host: Option<&impl ConntrackHost>,
    refused: &[String],
) -> anyhow::Result<ConntrackRepair> {
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
    doc: PlanDoc,
    step: Option<&ConntrackRepair>,
    painter: Painter,
) -> anyhow::Result<PlanDoc> {
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
