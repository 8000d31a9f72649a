//! The nftables repair transaction: list the node's `kube-proxy` tables (`nft -j`), plan each
//! family against the render, check the plan (`nft -c -f`), back up (`nft list table` and `nft -j
//! list table`, mode 0600), apply one `nft -f` transaction per family, read back and compare
//! again; on any failure put every family's table back as the backup shows it (the tables the
//! node did not have are removed).

use super::host::NftHost;
use super::plan::{NftPlan, PlanContext, plan_family, rollback_script};
use crate::apply::backup::{new_backup_dir, write_private};
use crate::apply::host::HostError;
use crate::compare::nftables::diff::diff;
use crate::compare::nftables::expected::ExpectedTable;
use crate::compare::nftables::{
    NftText, NftVerifyError, kube_proxy_table, parse_expected, parse_listings,
};
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::ip::IpFamily;
use crate::state::node::NodeFacts;
use kproxy_parsers::nft::{Family, Ruleset, Table};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Errors of an nftables repair. Every variant says whether the node was restored.
#[derive(Debug, thiserror::Error)]
pub enum NftRepairError {
    /// Reading the node's tables failed; nothing was changed.
    #[error("reading the node's nftables tables: {0}")]
    Read(HostError),
    /// A listing (or the render) could not be parsed; nothing was changed.
    #[error("{0}")]
    Parse(NftVerifyError),
    /// `nft -c` rejected the plan; nothing was changed.
    #[error("checking the plan with nft -c (nothing was changed): {0}")]
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
    #[error(
        "applying table {family} kube-proxy failed: {error}; {}",
        rollback_text(rollback, backup)
    )]
    Apply {
        /// The family whose transaction failed.
        family: String,
        /// The nft error.
        error: Box<HostError>,
        /// The backup directory.
        backup: PathBuf,
        /// `None` if the backup was restored, else why restoring it failed.
        rollback: Option<String>,
    },
    /// The tables read back after applying still differ; the backup was restored.
    #[error(
        "after applying, {remaining} object(s) still differ from the expected table; {}",
        rollback_text(rollback, backup)
    )]
    Verify {
        /// Chains, sets and maps that still differ.
        remaining: usize,
        /// The backup directory.
        backup: PathBuf,
        /// `None` if the backup was restored, else why restoring it failed.
        rollback: Option<String>,
    },
    /// A sync's transaction failed; `nft -f` applies all of it or nothing, so that family's
    /// table is as it was (families synced before it keep their change).
    #[error("syncing table {family} kube-proxy failed (its transaction changed nothing): {error}")]
    Sync {
        /// The family whose transaction failed.
        family: String,
        /// The nft error.
        error: Box<HostError>,
    },
}

impl NftRepairError {
    /// The backup and the rollback result, when the node was changed.
    pub fn rolled_back(&self) -> Option<(&Path, Option<&str>)> {
        match self {
            NftRepairError::Apply {
                backup, rollback, ..
            }
            | NftRepairError::Verify {
                backup, rollback, ..
            } => Some((backup.as_path(), rollback.as_deref())),
            _ => None,
        }
    }
}

fn rollback_text(rollback: &Option<String>, backup: &Path) -> String {
    match rollback {
        None => format!(
            "the node's kube-proxy tables were restored from the backup {}",
            backup.display()
        ),
        Some(e) => format!(
            "RESTORING THE BACKUP FAILED TOO ({e}); restore it by hand: nft -f {}/FAMILY-kube-proxy.nft (after nft delete table FAMILY kube-proxy)",
            backup.display()
        ),
    }
}

/// What to do.
#[derive(Debug, Clone)]
pub struct NftRepairOptions {
    /// Rewrite every expected chain (a kube-proxy full sync).
    pub full: bool,
    /// Change the node (otherwise only plan).
    pub apply: bool,
    /// Where backups go.
    pub backup_dir: PathBuf,
    /// Node name (for the backup directory's name).
    pub node: String,
    /// Test only: end the last family's transaction with an invalid command, so that it fails
    /// after the earlier ones were applied (proves the rollback).
    pub inject_fault: bool,
}

/// One family to repair: its render, and whether it is repaired even when the node has no
/// table of it (the main family; the other one only when the node has its table, or is meant
/// to: see the CLI).
#[derive(Debug)]
pub struct Target {
    /// The render.
    pub expected: ExpectedTable,
    /// Create the table when the node lacks it.
    pub required: bool,
}

impl Target {
    /// The node's two families: `facts.family` (created when the node lacks it) and the other
    /// one (only when the node has its table: kube-proxy writes it on dual-stack nodes).
    /// `config` is the configuration as kube-proxy reads it in nftables mode.
    pub fn both(state: &ClusterState, config: &ProxyConfig, facts: &NodeFacts) -> [Target; 2] {
        let mut other = facts.clone();
        other.family = match facts.family {
            IpFamily::V4 => IpFamily::V6,
            IpFamily::V6 => IpFamily::V4,
        };
        [
            Target {
                expected: ExpectedTable::build(state, config, facts),
                required: true,
            },
            Target {
                expected: ExpectedTable::build(state, config, &other),
                required: false,
            },
        ]
    }
}

/// The result of a repair.
#[derive(Debug)]
pub struct NftRepairReport {
    /// The plan computed from the node's tables before any change.
    pub plan: NftPlan,
    /// The backup directory, when something was applied.
    pub backup: Option<PathBuf>,
    /// Whether the plan was applied (and verified).
    pub applied: bool,
    /// Size of the `nft -f` input sent.
    pub nft_bytes: usize,
    /// Time spent in the `nft -f` calls.
    pub apply_time: Duration,
    /// Time spent reading the tables back and comparing them (the verification).
    pub verify_time: Duration,
}

/// What the node's tables hold, for the guard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// `service-…` and `local-…` chains (all families).
    pub service_chains: usize,
    /// `endpoint-…` chains.
    pub endpoint_chains: usize,
}

impl NodeCounts {
    fn add(&mut self, t: &Table<'_>) {
        use crate::proxier::nftables::names::{ENDPOINT_PREFIX, LOCAL_PREFIX, SERVICE_PREFIX};
        for c in &t.chains {
            let per_service = crate::proxier::nftables::names::is_service_chain_name(&c.name);
            if per_service
                && (c.name.starts_with(SERVICE_PREFIX) || c.name.starts_with(LOCAL_PREFIX))
            {
                self.service_chains += 1;
            } else if per_service && c.name.starts_with(ENDPOINT_PREFIX) {
                self.endpoint_chains += 1;
            }
        }
    }
}

/// Reasons not to apply, one sentence each: an API state that implies nothing on a node that
/// has plenty (a truncated state file would wipe the node's services), another configured
/// mode, a state older than `--max-age`.
pub fn refusals(
    facts: &crate::apply::guard::InputConditions,
    expected_service_ports: usize,
    expected_endpoints: usize,
    node: &NodeCounts,
    _plan: &NftPlan,
) -> Vec<String> {
    let mut out = Vec::new();
    if expected_service_ports == 0 && node.service_chains >= 3 {
        out.push(format!(
            "the API state has no service ports for this node but the node has {} service chains: is the state file complete?",
            node.service_chains
        ));
    } else if expected_endpoints == 0 && node.endpoint_chains >= 3 {
        out.push(format!(
            "the API state has no endpoints but the node has {} endpoint chains: are EndpointSlices missing from the state?",
            node.endpoint_chains
        ));
    }
    out.extend(facts.mode_refusal(
        crate::state::mode::ProxyMode::Nftables,
        "nftables-mode tables",
    ));
    out.extend(facts.age_refusal());
    out
}

/// One family as read from the node.
struct Read {
    family: Family,
    /// `nft -j list table` output, `None` when absent.
    json: Option<String>,
}

/// Lists the node's tables of the targets' families (skipping optional families the node
/// lacks).
fn read(host: &impl NftHost, targets: &[Target]) -> Result<Vec<(usize, Read)>, NftRepairError> {
    let mut out = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let family = t.expected.nft_family();
        let json = host
            .list_table(family, true)
            .map_err(NftRepairError::Read)?;
        if json.is_none() && !t.required {
            continue;
        }
        out.push((i, Read { family, json }));
    }
    Ok(out)
}

/// Plans every family read.
fn plan_all(
    targets: &[Target],
    reads: &[(usize, Read)],
    full: bool,
    same_transaction_delete: bool,
) -> Result<(NftPlan, usize, NodeCounts), NftRepairError> {
    let mut plan = NftPlan {
        families: Vec::new(),
        full,
    };
    let mut remaining = 0usize;
    let mut counts = NodeCounts::default();
    for (i, r) in reads {
        let target = &targets[*i];
        let expected_rs = parse_expected(&target.expected).map_err(NftRepairError::Parse)?;
        let Some(expected) = expected_rs.table(r.family, crate::proxier::nftables::names::TABLE)
        else {
            continue;
        };
        let label = format!("nft -j list table {} kube-proxy", r.family);
        let listings: Vec<NftText<'_>> = r
            .json
            .as_deref()
            .map(|text| NftText {
                label: &label,
                text,
            })
            .into_iter()
            .collect();
        let actual_rs: Vec<Ruleset<'_>> =
            parse_listings(&listings, false).map_err(NftRepairError::Parse)?;
        let actual: Option<&Table<'_>> = kube_proxy_table(&actual_rs, r.family);
        if let Some(t) = actual {
            counts.add(t);
        }
        let d = diff(expected, actual);
        remaining +=
            d.chains.len() + d.sets.len() + d.extra_objects.len() + usize::from(d.table_missing);
        let cx = PlanContext {
            render: &target.expected.text,
            same_transaction_delete,
            full,
        };
        let mut fp = plan_family(&d, expected, actual, &cx);
        if fp.is_empty() {
            fp.script.clear();
        }
        plan.families.push(fp);
    }
    Ok((plan, remaining, counts))
}

/// Plans (and with `opts.apply`, applies) the change from the node's `kube-proxy` tables to
/// the renders of `targets`. `before_apply` sees the plan and what the node's tables hold and
/// may veto by returning refusals (the safety guard); a veto returns the report unapplied.
pub fn repair(
    host: &impl NftHost,
    targets: &[Target],
    opts: &NftRepairOptions,
    before_apply: impl FnOnce(&NftPlan, &NodeCounts) -> Vec<String>,
) -> Result<(NftRepairReport, Vec<String>), NftRepairError> {
    let same_tx = host.same_transaction_delete();
    let reads = read(host, targets)?;
    let (plan, _, counts) = plan_all(targets, &reads, opts.full, same_tx)?;
    let refusals = before_apply(&plan, &counts);
    let mut report = NftRepairReport {
        nft_bytes: plan.script().len(),
        plan,
        backup: None,
        applied: false,
        apply_time: Duration::ZERO,
        verify_time: Duration::ZERO,
    };
    if !opts.apply || report.plan.is_empty() || !refusals.is_empty() {
        return Ok((report, refusals));
    }
    for f in report.plan.families.iter().filter(|f| !f.is_empty()) {
        host.check(&f.script).map_err(NftRepairError::Check)?;
    }
    // The backup: each family's table as text (what a rollback loads) and as JSON.
    let dir = new_backup_dir(&opts.backup_dir, &opts.node, "nftables").map_err(|error| {
        NftRepairError::Backup {
            dir: opts.backup_dir.clone(),
            error,
        }
    })?;
    let backup_error = |error| NftRepairError::Backup {
        dir: dir.clone(),
        error,
    };
    let mut restore: Vec<(Family, Option<String>)> = Vec::new();
    for (_, r) in &reads {
        let text = host
            .list_table(r.family, false)
            .map_err(NftRepairError::Read)?;
        if let (Some(text), Some(json)) = (&text, &r.json) {
            write_private(&dir.join(format!("{}-kube-proxy.nft", r.family)), text)
                .map_err(backup_error)?;
            write_private(&dir.join(format!("{}-kube-proxy.json", r.family)), json)
                .map_err(backup_error)?;
        }
        restore.push((r.family, text));
    }
    report.backup = Some(dir.clone());
    let roll_back = || -> Option<String> {
        let errors: Vec<String> = restore
            .iter()
            .filter_map(|(family, text)| {
                host.apply(&rollback_script(*family, text.as_deref()))
                    .err()
                    .map(|e| format!("table {family} kube-proxy: {e}"))
            })
            .collect();
        (!errors.is_empty()).then(|| errors.join("; "))
    };
    let started = Instant::now();
    let families: Vec<_> = report
        .plan
        .families
        .iter()
        .filter(|f| !f.is_empty())
        .collect();
    let last = families.len().saturating_sub(1);
    for (i, f) in families.iter().enumerate() {
        let mut script = f.script.clone();
        if opts.inject_fault && i == last {
            script.push_str(&format!(
                "add rule {} kube-proxy services kproxy-injected-fault\n",
                f.family
            ));
        }
        if let Err(source) = host.apply(&script) {
            return Err(NftRepairError::Apply {
                family: f.family.clone(),
                error: Box::new(source),
                backup: dir,
                rollback: roll_back(),
            });
        }
    }
    report.apply_time = started.elapsed();
    let verify_started = Instant::now();
    let after = read(host, targets)?;
    let (again, remaining, _) = plan_all(targets, &after, false, same_tx)?;
    report.verify_time = verify_started.elapsed();
    if !again.is_empty() {
        return Err(NftRepairError::Verify {
            remaining,
            backup: dir,
            rollback: roll_back(),
        });
    }
    report.applied = true;
    Ok((report, refusals))
}

/// One sync of `resync` on an nftables-mode node, as kube-proxy's nftables proxier syncs: list
/// the node's tables, plan each family against `targets` and apply its transaction with `nft
/// -f` (atomic per family). No check, backup or read-back: kube-proxy takes none, and the next
/// sync plans from what the node then has. Returns the plan applied.
pub fn sync(
    host: &impl NftHost,
    targets: &[Target],
    full: bool,
) -> Result<NftPlan, NftRepairError> {
    let reads = read(host, targets)?;
    let (plan, _, _) = plan_all(targets, &reads, full, host.same_transaction_delete())?;
    for f in plan.families.iter().filter(|f| !f.is_empty()) {
        host.apply(&f.script)
            .map_err(|source| NftRepairError::Sync {
                family: f.family.clone(),
                error: Box::new(source),
            })?;
    }
    Ok(plan)
}
