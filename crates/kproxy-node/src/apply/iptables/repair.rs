//! The repair transaction: read the node's rules, plan, check the plan against kube-proxy's
//! allow-list ([`crate::apply::allow`]) and with `iptables-restore --test`, back up (and rotate old
//! backups), apply table by table with `iptables-restore --noflush`, read back and re-plan; on
//! any failure put back only the chains the repair changed ([`super::rollback`]). One
//! implementation for every [`RulesHost`]: this host, or a node reached through the API.

use super::host::RulesHost;
use super::plan::{Plan, TablePlan, plan};
use super::rollback::roll_back;
use crate::apply::allow::{Proxier, check_plan};
use crate::apply::backup::{rollback_file, write_backup};
use crate::apply::guard::{GuardInput, InputConditions, refusals, unless_forced};
use crate::apply::host::HostError;
use crate::apply::transaction::{
    RepairOptions, RollbackOutcome, Rotation, pause_before_rollback, rollback_text,
};
use crate::compare::iptables::scope::keep_left_out;
use crate::model::Ruleset;
use crate::proxier::iptables::{RenderOptions, expected_service_ports, render};
use crate::state::ProxyInputs;
use kproxy_parsers::ParseError;
use kproxy_parsers::iptables::ParseOptions;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Errors of a repair. Every variant says whether the node was restored. Each message holds the
/// error it wraps (shown once: not repeated as a source).
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// Reading the node's rules failed; nothing was changed.
    #[error("reading the node's rules: {0}")]
    Read(HostError),
    /// The node's rules could not be parsed; nothing was changed.
    #[error("parsing the node's rules: {0}")]
    Parse(ParseError),
    /// The expected rules could not be parsed (a bug in render); nothing was changed.
    #[error("parsing the expected rules: {0}")]
    Expected(ParseError),
    /// `iptables-restore --test` rejected the plan's input; nothing was changed.
    #[error("checking the plan with iptables-restore --test (nothing was changed): {0}")]
    Check(HostError),
    /// The backup could not be written; nothing was changed.
    #[error("writing the backup to {dir} (nothing was changed): {error}")]
    Backup {
        /// Backup directory.
        dir: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// Applying failed; what the repair changed was put back (or that failed too, see
    /// `rollback`).
    #[error("applying table {table} failed ({})", rollback_text(rollback, backup))]
    Apply {
        /// The table whose restore failed.
        table: String,
        /// The restore error.
        #[source]
        source: Box<HostError>,
        /// The backup file.
        backup: PathBuf,
        /// The rollback.
        rollback: RollbackOutcome,
    },
    /// The rules could not be read back after applying; what the repair changed was put back
    /// (or that failed too, see `rollback`).
    #[error(
        "reading the rules back after applying failed ({error}); {}",
        rollback_text(rollback, backup)
    )]
    ReadBack {
        /// Why reading or parsing them failed.
        error: String,
        /// The backup file.
        backup: PathBuf,
        /// The rollback.
        rollback: RollbackOutcome,
    },
    /// The rules read back after applying still differ from the expected ones; what the
    /// repair changed was put back (or that failed too, see `rollback`).
    #[error(
        "after applying, {remaining} chain(s) still differ from the expected rules; {}",
        rollback_text(rollback, backup)
    )]
    Verify {
        /// Chains that still differ.
        remaining: usize,
        /// The backup file.
        backup: PathBuf,
        /// The rollback.
        rollback: RollbackOutcome,
    },
}

impl RepairError {
    /// The backup and the rollback, when the node was changed.
    pub fn rolled_back(&self) -> Option<(&Path, &RollbackOutcome)> {
        match self {
            RepairError::Apply {
                backup, rollback, ..
            }
            | RepairError::ReadBack {
                backup, rollback, ..
            }
            | RepairError::Verify {
                backup, rollback, ..
            } => Some((backup.as_path(), rollback)),
            _ => None,
        }
    }
}

/// The result of a repair.
#[derive(Debug)]
pub struct RepairReport {
    /// The plan computed from the node's rules before any change.
    pub plan: Plan,
    /// The backup file, when something was applied.
    pub backup: Option<PathBuf>,
    /// Old backups removed to keep the newest `keep_backups` (and why removing failed).
    pub rotation: Rotation,
    /// Whether the plan was applied (and verified).
    pub applied: bool,
    /// Size of the restore input sent.
    pub restore_bytes: usize,
    /// Time spent in the `iptables-restore --noflush` calls.
    pub restore_time: Duration,
    /// Time spent reading the rules back and re-planning (the verification).
    pub verify_time: Duration,
}

/// The rules kube-proxy would install for `inputs` (a render with base jumps, as
/// `iptables-restore` text) and the guard's view of them, with what it knows of the inputs.
pub fn expected_and_guard(inputs: &ProxyInputs, facts: InputConditions) -> (String, GuardInput) {
    // A Service whose object (or one of whose slices) is invalid is not rendered: its rules on
    // the node are kept as they are ([`RepairOptions::left_out`]).
    let left_out = crate::compare::left_out::services(&inputs.state);
    let state = &*crate::compare::left_out::judged_state(&inputs.state, &left_out);
    let rendered = render(
        state,
        &inputs.config,
        &inputs.facts,
        RenderOptions {
            with_base_jumps: true,
        },
    );
    let service_ports = expected_service_ports(state, &inputs.config, &inputs.facts);
    let guard = GuardInput {
        expected_service_ports: service_ports.ports.len(),
        expected_endpoints: service_ports.total_endpoints,
        facts,
    };
    (rendered.to_restore_text(), guard)
}

/// [`repair`] vetoed by the guard's refusals, unless `force`.
pub fn guarded_repair(
    host: &impl RulesHost,
    expected_text: &str,
    guard: &GuardInput,
    opts: &RepairOptions,
    force: bool,
) -> Result<(RepairReport, Vec<String>), RepairError> {
    repair(host, expected_text, opts, |current, _| {
        unless_forced(force, || refusals(guard, current))
    })
}

/// Plans (and with `opts.apply`, applies) the change from the host's current rules to `expected_text`
/// (a render with base jumps). `before_apply` sees the parsed current rules and the plan and may
/// veto by returning refusals (the safety guard); a veto returns the report unapplied.
pub fn repair(
    host: &impl RulesHost,
    expected_text: &str,
    opts: &RepairOptions,
    before_apply: impl FnOnce(&Ruleset<'_>, &Plan) -> Vec<String>,
) -> Result<(RepairReport, Vec<String>), RepairError> {
    let saved = host.save(true).map_err(RepairError::Read)?;
    let (expected_text, left_alone) = keep_left_out(expected_text, &saved, &opts.left_out);
    let expected =
        Ruleset::parse(&expected_text, &ParseOptions::default()).map_err(RepairError::Expected)?;
    let current = Ruleset::parse(&saved, &ParseOptions::default()).map_err(RepairError::Parse)?;
    let mut the_plan = plan(&expected, &current, opts.full);
    the_plan.left_alone = left_alone;
    let mut refusals = before_apply(&current, &the_plan);
    // Whatever the render asked for, only kube-proxy's objects are written (not even --force
    // lifts this).
    refusals.extend(check_plan(&the_plan, Proxier::Iptables));
    let mut report = RepairReport {
        restore_bytes: the_plan.restore_input().len(),
        plan: the_plan,
        backup: None,
        rotation: Rotation::default(),
        applied: false,
        restore_time: Duration::ZERO,
        verify_time: Duration::ZERO,
    };
    if !opts.apply || report.plan.is_empty() || !refusals.is_empty() {
        return Ok((report, refusals));
    }
    // A plan the node's iptables rejects (or a host that cannot run restore at all) is found
    // before anything changes.
    host.restore_test(&report.plan.restore_input())
        .map_err(RepairError::Check)?;
    let tables: Vec<&TablePlan> = report
        .plan
        .tables
        .iter()
        .filter(|t| !t.is_empty())
        .collect();
    let backup =
        write_backup(&opts.backup_dir, &opts.node, host.ipv6(), &saved).map_err(|error| {
            RepairError::Backup {
                dir: opts.backup_dir.clone(),
                error,
            }
        })?;
    let rotation = Rotation::run(&opts.backup_dir, &opts.node, opts.keep_backups);
    let undo = |applied: &[&TablePlan]| -> RollbackOutcome {
        pause_before_rollback(opts.pause_before_rollback.as_deref());
        let file = rollback_file(&backup, "iptables");
        roll_back(host, &saved, applied, &opts.rollback, &file)
    };
    let started = Instant::now();
    let last = tables.len().saturating_sub(1);
    for (i, t) in tables.iter().enumerate() {
        let mut input = t.restore_input();
        if opts.inject_fault && i == last {
            inject_invalid_rule(&mut input);
        }
        if let Err(source) = host.restore_noflush(&input) {
            // Each table's restore is atomic: the failed one changed nothing.
            let rollback = undo(&tables[..i]);
            return Err(RepairError::Apply {
                table: t.table.clone(),
                source: Box::new(source),
                backup,
                rollback,
            });
        }
    }
    report.restore_time = started.elapsed();
    let verify_started = Instant::now();
    let after = host.save(false).map_err(|e| e.to_string());
    let after_rs = after
        .as_deref()
        .map_err(Clone::clone)
        .and_then(|text| Ruleset::parse(text, &ParseOptions::default()).map_err(|e| e.to_string()));
    let after_rs = match after_rs {
        Ok(rs) => rs,
        Err(error) => {
            let rollback = undo(&tables);
            return Err(RepairError::ReadBack {
                error,
                backup,
                rollback,
            });
        }
    };
    let again = plan(&expected, &after_rs, false);
    report.verify_time = verify_started.elapsed();
    if !again.is_empty() {
        let remaining = again.tables.iter().map(|t| t.changes.len()).sum();
        let rollback = undo(&tables);
        return Err(RepairError::Verify {
            remaining,
            backup,
            rollback,
        });
    }
    report.backup = Some(backup);
    report.rotation = rotation;
    report.applied = true;
    Ok((report, refusals))
}

/// Appends a rule iptables-restore rejects just before the final `COMMIT`.
fn inject_invalid_rule(input: &mut String) {
    if let Some(pos) = input.rfind("COMMIT\n") {
        input.insert_str(pos, "-A KUBE-SERVICES -m kproxy-injected-fault -j ACCEPT\n");
    }
}
