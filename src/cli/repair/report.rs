//! What a repair prints: its plan (text, or one JSON document) and what it came to, and the exit
//! outcome (0 nothing to do or applied, 1 dry run with drift, 2 refused).

use super::RepairArgs;
use crate::apply::allow::NOT_KUBE_PROXYS;
use crate::apply::iptables::plan::{ChainAction, Plan};
use crate::apply::iptables::repair::RepairError;
use crate::apply::transaction::{RollbackOutcome, Rotation};
use crate::compare::left_out::{NotChecked, shown};
use crate::exit::Outcome;
use crate::output::color::{Painter, Role};
use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

/// A duration in milliseconds, for JSON output.
pub(super) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What a repair came to, for the status lines after its plan (text) or the outcome fields
/// of its JSON document.
pub(super) struct Ending<'a> {
    /// The guard's refusals.
    pub refused: &'a [String],
    /// The plan was empty.
    pub nothing_to_do: bool,
    /// The line saying so (`None`: no line).
    pub clean: Option<&'a str>,
    /// A plan against saved dumps: nothing could be applied, so no dry-run line.
    pub offline: bool,
    /// The backup taken before applying.
    pub backup: Option<&'a Path>,
    /// Old backups removed after it was written.
    pub rotation: &'a Rotation,
    /// The line reporting the applied and verified plan.
    pub applied: String,
    /// The figures of the repair (a JSON object: sizes, timings), added to the JSON document.
    pub figures: serde_json::Value,
}

/// How a repair that ran to its end came out: the `outcome` field of `-o json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// The node (or the dumps) already match.
    NothingToDo,
    /// A plan was printed and nothing changed.
    DryRun,
    /// `--apply` was vetoed by the guard.
    Refused,
    /// The plan was applied and verified.
    Applied,
}

impl Status {
    fn of(args: &RepairArgs, ending: &Ending<'_>) -> Status {
        if !ending.refused.is_empty() && args.apply {
            Status::Refused
        } else if ending.nothing_to_do {
            Status::NothingToDo
        } else if !args.apply {
            Status::DryRun
        } else {
            Status::Applied
        }
    }

    fn name(self) -> &'static str {
        match self {
            Status::NothingToDo => "nothing_to_do",
            Status::DryRun => "dry_run",
            Status::Refused => "refused",
            Status::Applied => "applied",
        }
    }

    /// The exit outcome: 0 nothing to do or applied, 1 dry run with drift, 2 refused.
    fn exit(self) -> Outcome {
        match self {
            Status::NothingToDo | Status::Applied => Outcome::Clean,
            Status::DryRun => Outcome::Drift,
            Status::Refused => Outcome::Error,
        }
    }
}

/// A plan ready to print: text (the status lines follow it) or the JSON object the outcome's
/// fields are added to.
pub(super) enum PlanDoc {
    /// The plan as text.
    Text(String),
    /// The plan's JSON fields.
    Json(serde_json::Map<String, serde_json::Value>),
}

/// Prints the plan `doc` and what the repair came to — the status lines after a text plan, or
/// the outcome fields in the one JSON document — and returns the exit outcome: 0 nothing to do
/// or applied, 1 dry run with drift, 2 refused.
pub(super) fn finish(
    args: &RepairArgs,
    doc: PlanDoc,
    ending: &Ending<'_>,
) -> anyhow::Result<Outcome> {
    use serde_json::Value;
    let status = Status::of(args, ending);
    match doc {
        PlanDoc::Text(mut s) => {
            match status {
                Status::Refused => {}
                Status::NothingToDo => {
                    if let Some(line) = ending.clean {
                        let _ = writeln!(s, "{line}");
                    }
                }
                Status::DryRun => {
                    if !ending.offline {
                        let _ = writeln!(
                            s,
                            "dry run: nothing changed; re-run with --apply to install this plan"
                        );
                    }
                }
                Status::Applied => {
                    if let Some(b) = ending.backup {
                        let _ = writeln!(s, "backup: {}", b.display());
                    }
                    for old in &ending.rotation.removed {
                        let _ = writeln!(s, "removed old backup: {}", old.display());
                    }
                    let _ = writeln!(s, "{}", ending.applied);
                }
            }
            crate::cli::common::write_stdout(&s)?;
        }
        PlanDoc::Json(mut m) => {
            m.insert("outcome".into(), status.name().into());
            m.insert("applied".into(), (status == Status::Applied).into());
            m.insert(
                "backup".into(),
                ending
                    .backup
                    .map_or(Value::Null, |b| b.display().to_string().into()),
            );
            m.insert(
                "removed_backups".into(),
                ending
                    .rotation
                    .removed
                    .iter()
                    .map(|p| Value::from(p.display().to_string()))
                    .collect(),
            );
            if let Value::Object(figures) = &ending.figures {
                m.extend(figures.clone());
            }
            crate::cli::common::write_stdout(
                &(serde_json::to_string_pretty(&Value::Object(m))? + "\n"),
            )?;
        }
    }
    if let Some(e) = &ending.rotation.error {
        crate::cli::common::warn(e);
    }
    if status == Status::Refused {
        if ending
            .refused
            .iter()
            .all(|r| r.starts_with(NOT_KUBE_PROXYS))
        {
            eprintln!(
                "error: refusing to apply: the plan would change objects that are not kube-proxy's (--force does not override this)"
            );
        } else {
            eprintln!("error: refusing to apply (use --force to override the input checks)");
        }
    }
    Ok(status.exit())
}

/// The JSON document of a repair that failed: `outcome` is `rolled_back` (a change failed or
/// did not verify, and what the repair changed was put back), `rollback_failed` (putting it
/// back failed too: `rollback_error` says why and how to finish it by hand) or `failed`
/// (nothing was changed, also when the first change failed as a whole); `backup` is the
/// backup when one was taken, `rollback_notes` what the rollback left as it was (and why),
/// `error` the whole error message.
pub(super) fn failure_doc(e: &anyhow::Error) -> serde_json::Value {
    use crate::apply::ipvs::repair::IpvsRepairError;
    use crate::apply::nftables::repair::NftRepairError;
    let changed: Option<(&Path, Result<Undone, String>)> =
        if let Some(err) = e.downcast_ref::<RepairError>() {
            err.rolled_back().map(|(b, r)| (b, rollback_notes(r)))
        } else if let Some(err) = e.downcast_ref::<NftRepairError>() {
            err.rolled_back().map(|(b, r)| (b, rollback_notes(r)))
        } else {
            match e.downcast_ref::<IpvsRepairError>() {
                Some(
                    IpvsRepairError::Apply {
                        backup, rollback, ..
                    }
                    | IpvsRepairError::Verify {
                        backup, rollback, ..
                    },
                ) => Some((backup.as_path(), rollback_notes(rollback))),
                _ => None,
            }
        };
    let outcome = match &changed {
        None => "failed",
        Some((_, Ok(u))) if !u.anything => "failed",
        Some((_, Ok(_))) => "rolled_back",
        Some((_, Err(_))) => "rollback_failed",
    };
    serde_json::json!({
        "outcome": outcome,
        "applied": false,
        "backup": changed.as_ref().map(|(b, _)| b.display().to_string()),
        "rollback_error": changed.as_ref().and_then(|(_, r)| r.as_ref().err()),
        "rollback_notes": changed.as_ref().and_then(|(_, r)| r.as_ref().ok()).map(|u| u.notes.clone()).unwrap_or_default(),
        "error": crate::cli::common::error_text(e),
    })
}

/// What a rollback that ran put back.
struct Undone {
    /// Whether it had anything to put back (the failed change had changed something).
    anything: bool,
    /// What it left as it was, and why.
    notes: Vec<String>,
}

/// What a rollback put back, or why it failed.
fn rollback_notes(r: &RollbackOutcome) -> Result<Undone, String> {
    r.as_ref()
        .map(|done| Undone {
            // Notes without an attempt: the repair had changed what another writer has
            // changed again since, and the rollback left it.
            anything: done.attempts > 0 || !done.notes.is_empty(),
            notes: done.notes.clone(),
        })
        .map_err(Clone::clone)
}

/// How [`write_chain_changes`] lays out a plan's chain changes.
pub(super) struct ChainListing {
    /// Each table's heading before its name (`table`, `iptables table`).
    pub heading: &'static str,
    /// The width the action word is padded to.
    pub verb_width: usize,
    /// Colour the action word.
    pub paint_verbs: bool,
    /// Print each change's note.
    pub notes: bool,
}

impl ChainListing {
    /// The layout of an iptables-mode plan.
    pub const IPTABLES: ChainListing = ChainListing {
        heading: "table",
        verb_width: 8,
        paint_verbs: true,
        notes: true,
    };
}

/// Writes the chain changes of `p`, table by table, with the diff of each kept or rewritten chain.
pub(super) fn write_chain_changes(
    s: &mut String,
    p: &Plan,
    listing: &ChainListing,
    painter: Painter,
) {
    for t in &p.tables {
        if t.changes.is_empty() {
            continue;
        }
        let _ = writeln!(s, "{} {}:", listing.heading, t.table);
        for c in &t.changes {
            let (word, role) = match c.action {
                ChainAction::Create => ("create", Role::Ok),
                ChainAction::Rewrite => ("rewrite", Role::Warn),
                ChainAction::Delete => ("delete", Role::Error),
                ChainAction::KeepReferenced => ("keep", Role::Dim),
                ChainAction::InsertJumps => ("insert", Role::Ok),
            };
            let word = format!("{word:<width$}", width = listing.verb_width);
            let verb = if listing.paint_verbs {
                painter.paint(role, &word)
            } else {
                word
            };
            let _ = writeln!(
                s,
                "  {verb} {} ({} → {} rules)",
                c.chain, c.rules_before, c.rules_after
            );
            if let (true, Some(n)) = (listing.notes, &c.note) {
                let _ = writeln!(s, "           {n}");
            }
            if c.action != ChainAction::Delete {
                for r in &c.removed {
                    let _ = writeln!(s, "      {}", painter.paint(Role::Error, &format!("- {r}")));
                }
                for r in &c.added {
                    let _ = writeln!(s, "      {}", painter.paint(Role::Ok, &format!("+ {r}")));
                }
            }
        }
    }
    write_left_alone(s, &p.left_alone, painter);
}

/// Writes one line per Service whose API object is invalid and whose rules the plan leaves as
/// they are.
pub(super) fn write_left_alone(s: &mut String, left_alone: &[NotChecked], painter: Painter) {
    for n in left_alone {
        let shown = shown(&n.service);
        let _ = writeln!(
            s,
            "{} Service {shown} ({}): the API state's object is invalid",
            painter.paint(Role::Dim, "left as they are:"),
            n.counts()
        );
    }
}

/// Writes one `refusal: …` line per refusal.
pub(super) fn write_refusals(s: &mut String, refused: &[String], painter: Painter) {
    for r in refused {
        let _ = writeln!(s, "{}: {r}", painter.paint(Role::Error, "refusal"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::host::HostError;
    use std::path::PathBuf;

    fn apply_error(rollback: Option<&str>) -> anyhow::Error {
        apply_error_after(rollback, 1)
    }

    fn apply_error_after(rollback: Option<&str>, attempts: u32) -> anyhow::Error {
        anyhow::Error::from(RepairError::Apply {
            table: "nat".into(),
            source: Box::new(HostError::Failed {
                program: "iptables-restore".into(),
                code: 2,
                stderr: "bad rule".into(),
            }),
            backup: PathBuf::from("/b/node-ipv4-1.rules"),
            rollback: match rollback {
                None => Ok(crate::apply::transaction::RolledBack {
                    attempts,
                    notes: Vec::new(),
                }),
                Some(e) => Err(e.to_string()),
            },
        })
        .context("repairing node n1")
    }

    #[test]
    fn failure_documents_say_whether_the_node_was_restored() {
        let doc = failure_doc(&apply_error(None));
        assert_eq!(doc["outcome"], "rolled_back");
        assert_eq!(doc["backup"], "/b/node-ipv4-1.rules");
        assert_eq!(doc["rollback_error"], serde_json::Value::Null);
        let error = doc["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("repairing node n1: applying table nat failed")
                && error.ends_with("bad rule"),
            "{error}"
        );
        // The first table's restore failed as a whole: nothing to put back.
        let doc = failure_doc(&apply_error_after(None, 0));
        assert_eq!(doc["outcome"], "failed");
        assert_eq!(doc["backup"], "/b/node-ipv4-1.rules");
        let doc = failure_doc(&apply_error(Some("lock busy")));
        assert_eq!(doc["outcome"], "rollback_failed");
        assert_eq!(doc["rollback_error"], "lock busy");
        let doc = failure_doc(&anyhow::anyhow!("no such state file"));
        assert_eq!(doc["outcome"], "failed");
        assert_eq!(doc["backup"], serde_json::Value::Null);
        assert_eq!(doc["applied"], false);
    }
}
