//! The repair transaction: read the node's rules, plan, check the plan with
//! `iptables-restore --test`, back up, apply table by table with `iptables-restore --noflush`,
//! read back and re-plan; on any failure restore the backup exactly (the tables the node did
//! not have before come back empty). One implementation for every
//! [`RulesHost`]: this host, or a node reached through the API.

use super::backup::{rollback_input, write_backup};
use super::guard::{GuardInput, InputConditions, refusals, unless_forced};
use super::host::{HostError, RulesHost};
use super::plan::{Plan, plan};
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
    #[error("writing the backup to {dir}: {error}")]
    Backup {
        /// Backup directory.
        dir: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// Applying failed; the backup was restored (or restoring it failed too, see `rollback`).
    #[error("applying table {table} failed ({})", rollback_text(rollback, backup))]
    Apply {
        /// The table whose restore failed.
        table: String,
        /// The restore error.
        #[source]
        source: Box<HostError>,
        /// The backup file.
        backup: PathBuf,
        /// `None` if the backup was restored, else why restoring it failed.
        rollback: Option<String>,
    },
    /// The rules read back after applying still differ from the expected ones; the backup was restored.
    #[error(
        "after applying, {remaining} chain(s) still differ from the expected rules; {}",
        rollback_text(rollback, backup)
    )]
    Verify {
        /// Chains that still differ.
        remaining: usize,
        /// The backup file.
        backup: PathBuf,
        /// `None` if the backup was restored, else why restoring it failed.
        rollback: Option<String>,
    },
}

fn rollback_text(rollback: &Option<String>, backup: &Path) -> String {
    match rollback {
        None => format!(
            "the node's rules were restored from the backup {}",
            backup.display()
        ),
        Some(e) => format!(
            "RESTORING THE BACKUP FAILED TOO ({e}); restore it by hand: iptables-restore < {}",
            backup.display()
        ),
    }
}

/// What to do.
#[derive(Debug, Clone)]
pub struct RepairOptions {
    /// Rewrite every expected chain (a kube-proxy full sync) instead of only the differing ones.
    pub full: bool,
    /// Change the node (otherwise only plan).
    pub apply: bool,
    /// Where backups go.
    pub backup_dir: PathBuf,
    /// Node name (for the backup file name).
    pub node: String,
    /// Test only: append an invalid rule to the last table's restore input, so that restore fails
    /// after earlier tables were applied (proves the rollback).
    pub inject_fault: bool,
}

/// The result of a repair.
#[derive(Debug)]
pub struct RepairReport {
    /// The plan computed from the node's rules before any change.
    pub plan: Plan,
    /// The backup file, when something was applied.
    pub backup: Option<PathBuf>,
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
    let rendered = render(
        &inputs.state,
        &inputs.config,
        &inputs.facts,
        RenderOptions {
            with_base_jumps: true,
        },
    );
    let service_ports = expected_service_ports(&inputs.state, &inputs.config, &inputs.facts);
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
    let expected =
        Ruleset::parse(expected_text, &ParseOptions::default()).map_err(RepairError::Expected)?;
    let saved = host.save(true).map_err(RepairError::Read)?;
    let current = Ruleset::parse(&saved, &ParseOptions::default()).map_err(RepairError::Parse)?;
    let the_plan = plan(&expected, &current, opts.full);
    let refusals = before_apply(&current, &the_plan);
    let mut report = RepairReport {
        restore_bytes: the_plan.restore_input().len(),
        plan: the_plan,
        backup: None,
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
    let tables: Vec<_> = report
        .plan
        .tables
        .iter()
        .filter(|t| !t.is_empty())
        .collect();
    // What a rollback restores exactly: the save, and the tables it lacks as empty tables (a
    // change creates them; restoring the save alone would leave them behind).
    let restore_point = rollback_input(&saved, tables.iter().map(|t| t.table.as_str()));
    let backup = write_backup(&opts.backup_dir, &opts.node, host.ipv6(), &restore_point).map_err(
        |error| RepairError::Backup {
            dir: opts.backup_dir.clone(),
            error,
        },
    )?;
    report.backup = Some(backup.clone());
    let started = Instant::now();
    let last = tables.len().saturating_sub(1);
    for (i, t) in tables.iter().enumerate() {
        let mut input = t.restore_input();
        if opts.inject_fault && i == last {
            inject_invalid_rule(&mut input);
        }
        if let Err(source) = host.restore_noflush(&input) {
            let rollback = host
                .restore_exact(&restore_point)
                .err()
                .map(|e| e.to_string());
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
    let after = host.save(false).map_err(RepairError::Read)?;
    let after_rs = Ruleset::parse(&after, &ParseOptions::default()).map_err(RepairError::Parse)?;
    let again = plan(&expected, &after_rs, false);
    report.verify_time = verify_started.elapsed();
    if !again.is_empty() {
        let remaining = again.tables.iter().map(|t| t.changes.len()).sum();
        let rollback = host
            .restore_exact(&restore_point)
            .err()
            .map(|e| e.to_string());
        return Err(RepairError::Verify {
            remaining,
            backup,
            rollback,
        });
    }
    report.applied = true;
    Ok((report, refusals))
}

/// Appends a rule iptables-restore rejects just before the final `COMMIT`.
fn inject_invalid_rule(input: &mut String) {
    if let Some(pos) = input.rfind("COMMIT\n") {
        input.insert_str(pos, "-A KUBE-SERVICES -m kproxy-injected-fault -j ACCEPT\n");
    }
}
