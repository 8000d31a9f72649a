//! The nftables repair transaction: list the node's `kube-proxy` tables (`nft -j`), plan each
//! family against the render, check the plan against kube-proxy's allow-list
//! ([`crate::apply::allow::check_nft_script`]) and with `nft -c -f`, back up (`nft list table`
//! and `nft -j list table`, mode 0600; old backups rotated), apply one `nft -f` transaction per
//! family, read back and compare again; on any failure put back only the objects the repair
//! changed, in the families it applied ([`super::rollback`]; a table the node did not have is
//! removed).

use super::host::NftHost;
use super::plan::{FamilyPlan, NftPlan, PlanContext, plan_family};
use super::rollback::rollback_script;
use crate::apply::allow::check_nft_script;
use crate::apply::backup::{new_backup_dir, rollback_file, write_private};
use crate::apply::host::HostError;
use crate::apply::transaction::{
    RepairOptions, RollbackOutcome, RollbackPolicy, RolledBack, Rotation, pause_before_rollback,
    rollback_text,
};
use crate::compare::left_out::{LeftOutService, tally};
use crate::compare::nftables::diff::diff;
use crate::compare::nftables::expected::ExpectedTable;
use crate::compare::nftables::left_alone;
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
    #[error("writing the backup to {dir} (nothing was changed): {error}")]
    Backup {
        /// Backup directory.
        dir: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// Applying failed; what the repair changed was put back (or that failed too, see
    /// `rollback`).
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
        /// The rollback.
        rollback: RollbackOutcome,
    },
    /// The tables read back after applying still differ (or could not be read back: then
    /// `remaining` is `None`); what the repair changed was put back.
    #[error(
        "after applying, {}; {}",
        remaining.map_or("the tables could not be read back".to_string(), |n| format!("{n} object(s) still differ from the expected table")),
        rollback_text(rollback, backup)
    )]
    Verify {
        /// Chains, sets and maps that still differ.
        remaining: Option<usize>,
        /// The backup directory.
        backup: PathBuf,
        /// The rollback.
        rollback: RollbackOutcome,
    },
    /// A sync's plan named objects that are not kube-proxy's; nothing was applied.
    #[error("refusing to apply a plan that is not kube-proxy's: {}", .0.join("; "))]
    NotKubeProxys(Vec<String>),
    /// The node's tables hold what this build does not know; a sync changes nothing.
    #[error("refusing to sync: {0}")]
    UnknownLayout(String),
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
    /// The backup and the rollback, when the node was changed.
    pub fn rolled_back(&self) -> Option<(&Path, &RollbackOutcome)> {
        match self {
            NftRepairError::Apply {
                backup, rollback, ..
            }
            | NftRepairError::Verify {
                backup, rollback, ..
            } => Some((backup.as_path(), rollback)),
            _ => None,
        }
    }
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
    /// The Services whose API object was left out as invalid: what of theirs the node's
    /// table holds is left as it is ([`crate::compare::nftables::left_alone`]).
    pub left_out: Vec<LeftOutService>,
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
        let left_out = crate::compare::left_out::services(state);
        let state = &*crate::compare::left_out::judged_state(state, &left_out);
        [
            Target {
                expected: ExpectedTable::build(state, config, facts),
                required: true,
                left_out: left_out.clone(),
            },
            Target {
                expected: ExpectedTable::build(state, config, &other),
                required: false,
                left_out,
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
    /// Old backups removed to keep the newest `keep_backups`.
    pub rotation: Rotation,
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// `service-…` and `local-…` chains (all families).
    pub service_chains: usize,
    /// `endpoint-…` chains.
    pub endpoint_chains: usize,
    /// What this build does not know in the tables (`table ip kube-proxy: chain X`).
    pub unknown: Vec<String>,
}

impl NodeCounts {
    fn add(&mut self, t: &Table<'_>) {
        self.unknown.extend(
            crate::graph::nftables::layout::unknown_objects(t)
                .iter()
                .map(|u| format!("table {} kube-proxy: {}", t.family, u.describe())),
        );
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
/// mode, a state older than `--max-age`, a live kube-proxy writing the same tables, and tables
/// that hold what this build does not know (a kube-proxy newer than this build: a repair planned
/// from an older release's rules would rewrite its layout).
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
    out.extend(facts.writer_refusal());
    out.extend(unknown_refusal(node));
    out
}

/// The refusal when the node's tables hold what this build does not know.
fn unknown_refusal(node: &NodeCounts) -> Option<String> {
    if node.unknown.is_empty() {
        return None;
    }
    const SHOWN: usize = 3;
    let mut list: Vec<&str> = node
        .unknown
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect();
    let more = node.unknown.len().saturating_sub(SHOWN);
    let more = format!("and {more} more");
    if node.unknown.len() > SHOWN {
        list.push(&more);
    }
    Some(format!(
        "the node's kube-proxy tables hold what this build does not know ({}): the node's kube-proxy may be newer than this build, and a repair planned from the rules this build knows would rewrite them",
        list.join(", ")
    ))
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
        left_alone: Vec::new(),
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
        let kept = actual
            .filter(|_| !target.left_out.is_empty())
            .map(|t| left_alone::without(t, &target.left_out));
        let actual = match &kept {
            Some((rest, left)) => {
                for n in left {
                    tally(&mut plan.left_alone, n.clone());
                }
                Some(rest)
            }
            None => actual,
        };
        let d = diff(expected, actual);
        remaining += d.chains.len()
            + d.sets.len()
            + d.extra_objects.len()
            + d.missing_objects.len()
            + usize::from(d.table_missing);
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

/// The refusals of a plan whose transactions name anything but the families'
/// `kube-proxy` tables.
fn plan_refusals(plan: &NftPlan) -> Vec<String> {
    plan.families
        .iter()
        .flat_map(|f| check_nft_script(&f.family, &f.script))
        .collect()
}

/// Plans (and with `opts.apply`, applies) the change from the node's `kube-proxy` tables to
/// the renders of `targets`. `before_apply` sees the plan and what the node's tables hold and
/// may veto by returning refusals (the safety guard); a veto returns the report unapplied.
pub fn repair(
    host: &impl NftHost,
    targets: &[Target],
    opts: &RepairOptions,
    before_apply: impl FnOnce(&NftPlan, &NodeCounts) -> Vec<String>,
) -> Result<(NftRepairReport, Vec<String>), NftRepairError> {
    let same_tx = host.same_transaction_delete();
    let reads = read(host, targets)?;
    let (plan, _, counts) = plan_all(targets, &reads, opts.full, same_tx)?;
    let mut refusals = before_apply(&plan, &counts);
    // Whatever the render asked for, only kube-proxy's tables are written (not even --force
    // lifts this).
    refusals.extend(plan_refusals(&plan));
    let mut report = NftRepairReport {
        nft_bytes: plan.script().len(),
        plan,
        backup: None,
        rotation: Rotation::default(),
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
    // The backup: each family's table as text (what a rollback puts back) and as JSON.
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
    let mut before: Vec<(Family, Option<String>)> = Vec::new();
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
        before.push((r.family, text));
    }
    let rotation = Rotation::run(&opts.backup_dir, &opts.node, opts.keep_backups);
    let families: Vec<&FamilyPlan> = report
        .plan
        .families
        .iter()
        .filter(|f| !f.is_empty())
        .collect();
    let undo = |applied: &[&FamilyPlan]| -> RollbackOutcome {
        pause_before_rollback(opts.pause_before_rollback.as_deref());
        roll_back(host, &before, applied, &opts.rollback, &dir, same_tx)
    };
    let started = Instant::now();
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
            // One family's transaction is atomic: the failed one changed nothing.
            let rollback = undo(&families[..i]);
            return Err(NftRepairError::Apply {
                family: f.family.clone(),
                error: Box::new(source),
                backup: dir,
                rollback,
            });
        }
    }
    report.apply_time = started.elapsed();
    let verify_started = Instant::now();
    let again = read(host, targets)
        .and_then(|after| plan_all(targets, &after, false, same_tx))
        .map(|(again, remaining, _)| (again.is_empty(), remaining));
    report.verify_time = verify_started.elapsed();
    match again {
        Ok((true, _)) => {}
        Ok((false, remaining)) => {
            let rollback = undo(&families);
            return Err(NftRepairError::Verify {
                remaining: Some(remaining),
                backup: dir,
                rollback,
            });
        }
        Err(_) => {
            let rollback = undo(&families);
            return Err(NftRepairError::Verify {
                remaining: None,
                backup: dir,
                rollback,
            });
        }
    }
    report.backup = Some(dir);
    report.rotation = rotation;
    report.applied = true;
    Ok((report, refusals))
}

/// Puts back what the transactions of `applied` changed, family by family, as `before` (each
/// family's backup listing) shows it, each transaction retried as `policy` says. The
/// transaction of each family is written beside the backup in `dir` before it is run.
fn roll_back(
    host: &impl NftHost,
    before: &[(Family, Option<String>)],
    applied: &[&FamilyPlan],
    policy: &RollbackPolicy,
    dir: &Path,
    same_tx: bool,
) -> RollbackOutcome {
    let mut done = RolledBack::default();
    let mut errors = Vec::new();
    for f in applied {
        let Some((family, listing)) = before.iter().find(|(fam, _)| fam.to_string() == f.family)
        else {
            continue;
        };
        let file = rollback_file(dir, &format!("{family}-kube-proxy"));
        let mut written = Ok(());
        let mut notes = Vec::new();
        let mut nothing = false;
        let (attempts, result) = policy.run(|| {
            let now = host.list_table(*family, false).ok();
            let (script, n) = rollback_script(
                *family,
                listing.as_deref(),
                now.as_ref().map(|n| n.as_deref()),
                f,
                same_tx,
            );
            notes = n;
            if script.is_empty() {
                nothing = true;
                return Ok(());
            }
            let refused = check_nft_script(&f.family, &script);
            if !refused.is_empty() {
                return Err(refused.join("; "));
            }
            written = write_private(&file, &script)
                .map_err(|e| format!("writing {}: {e}", file.display()));
            host.apply(&script).map_err(|e| e.to_string())
        });
        done.notes.extend(notes);
        match result {
            Ok(()) if nothing => {}
            Ok(()) => done.attempts = done.attempts.max(attempts),
            Err(e) => errors.push(match written {
                Ok(()) => format!(
                    "table {family} kube-proxy: {e} (after {attempts} attempt(s)); the rollback transaction (only the objects this repair changed) is in {}; finish the rollback by hand: {}",
                    file.display(),
                    host.by_hand(&file)
                ),
                Err(w) => format!(
                    "table {family} kube-proxy: {e} (after {attempts} attempt(s)); the rollback transaction could not be written either ({w})"
                ),
            }),
        }
    }
    if errors.is_empty() {
        Ok(done)
    } else {
        Err(errors.join("; "))
    }
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
    let (plan, _, counts) = plan_all(targets, &reads, full, host.same_transaction_delete())?;
    if let Some(why) = unknown_refusal(&counts) {
        return Err(NftRepairError::UnknownLayout(why));
    }
    let refused = plan_refusals(&plan);
    if !refused.is_empty() {
        return Err(NftRepairError::NotKubeProxys(refused));
    }
    for f in plan.families.iter().filter(|f| !f.is_empty()) {
        host.apply(&f.script)
            .map_err(|source| NftRepairError::Sync {
                family: f.family.clone(),
                error: Box::new(source),
            })?;
    }
    Ok(plan)
}
