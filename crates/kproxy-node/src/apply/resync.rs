//! The resync loop: an emergency stand-in for a dead kube-proxy on one node. It watches Services,
//! EndpointSlices and Nodes ([`ClusterWatch`]), coalesces changes,
//! and syncs the node's rules: a partial sync (only the chains that differ) after changes, at most
//! once per `min_sync_period`, and a full rewrite every `sync_period`. One log line per sync.
//! The rules are the iptables chains (`iptables-restore --noflush`), or on an nftables-mode node
//! kube-proxy's `table ip|ip6 kube-proxy` (one `nft -f` transaction per family).
//!
//! After each successful sync the stale conntrack flows are cleared, as kube-proxy's
//! `CleanStaleEntries` (`pkg/proxy/conntrack/cleanup.go`) does after its syncs: the table is listed
//! afresh, checked against the state just synced ([`crate::compare::conntrack`]) and its stale
//! UDP/SCTP groups of the loop's family deleted by the exact filters of `repair`'s conntrack step
//! ([`super::conntrack::apply`]).

use super::allow::{Proxier, check_plan};
use super::conntrack::{self as ct, ConntrackHost, ConntrackRepair, LocalConntrack};
use super::iptables::host::{IptablesHost, RulesHost};
use super::iptables::plan::{ChainAction, plan};
use super::nftables::host::LocalNft;
use super::nftables::repair::{Target, sync as nft_sync};
use crate::collect::watch::ClusterWatch;
use crate::compare::conntrack::{ServiceIndex, check};
use crate::kube_client::Connection;
use crate::model::Ruleset;
use crate::proxier::iptables::{RenderOptions, render};
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::node::NodeFacts;
use kproxy_parsers::iptables::ParseOptions;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Errors that stop the loop.
#[derive(Debug, thiserror::Error)]
pub enum ResyncError {
    /// A kube-proxy process runs on this host.
    #[error(
        "a kube-proxy process is running on this host (pid {0}); two writers of the same chains fight each other — stop it first or pass --force"
    )]
    KubeProxyRunning(u32),
    /// The watches never delivered an initial state.
    #[error("the API watches did not deliver an initial state within {0:?}")]
    NotReady(Duration),
    /// A sync's plan named objects that are not kube-proxy's; nothing was written.
    #[error("refusing to write a plan that is not kube-proxy's: {}", .0.join("; "))]
    NotKubeProxys(Vec<String>),
    /// The node's kube-proxy chains hold rules this build does not know.
    #[error("refusing to sync: {0}")]
    UnknownLayout(String),
}

/// Builds the node facts from the current state (node IPs may change while the loop runs).
pub type NodeFactsBuilder = Arc<dyn Fn(&ClusterState) -> anyhow::Result<NodeFacts> + Send + Sync>;

/// How the loop syncs.
#[derive(Clone)]
pub struct ResyncOptions {
    /// Where the rules go.
    pub host: IptablesHost,
    /// kube-proxy's configuration.
    pub config: ProxyConfig,
    /// Builds the node facts from the current state (node IPs may change).
    pub facts: NodeFactsBuilder,
    /// Minimum time between two syncs (coalescing window).
    pub min_sync_period: Duration,
    /// Time between full rewrites.
    pub sync_period: Duration,
    /// Receives one line per sync (and per failure); the CLI prints them on stderr.
    pub log: Arc<dyn Fn(&str) + Send + Sync>,
    /// Where stale conntrack flows are cleared after each sync (`None`: they are not).
    pub conntrack: Option<LocalConntrack>,
    /// An nftables-mode node: each sync makes `table ip|ip6 kube-proxy` what kube-proxy's
    /// nftables proxier writes, one `nft -f` transaction per family ([`sync_nftables`]);
    /// `config` is then the configuration as that proxier reads it. `None`: iptables.
    pub nftables: Option<LocalNft>,
}

/// What one sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncStats {
    /// Whether every chain was rewritten.
    pub full: bool,
    /// Chains created, rewritten or deleted.
    pub chains_written: usize,
    /// Rules written.
    pub rules_written: usize,
    /// The conntrack step after the rules.
    pub flows: FlowCleanup,
}

/// The conntrack step of one sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowCleanup {
    /// Not configured.
    Off,
    /// The table was listed and its stale groups deleted (the plan, run).
    Cleared(ConntrackRepair),
    /// The table could not be listed or cleared; the rules were synced all the same.
    Failed(String),
}

/// One sync: render, read the node, plan, write (iptables-restore, or nft -f on an nftables
/// node), then clear stale conntrack flows. Returns what was written.
pub fn sync_once(
    state: &ClusterState,
    opts: &ResyncOptions,
    full: bool,
) -> anyhow::Result<SyncStats> {
    let facts = (opts.facts)(state)?;
    let (chains_written, rules_written) = match &opts.nftables {
        Some(host) => sync_nftables(host, state, opts, &facts, full)?,
        None => sync_iptables(state, opts, &facts, full)?,
    };
    let flows = match &opts.conntrack {
        None => FlowCleanup::Off,
        Some(host) => match clear_stale_flows(host, state, opts, &facts) {
            Ok(plan) => FlowCleanup::Cleared(plan),
            Err(e) => FlowCleanup::Failed(format!("{e:#}")),
        },
    };
    Ok(SyncStats {
        full,
        chains_written,
        rules_written,
        flows,
    })
}

/// The rules of one sync on an iptables-mode node: render, read the node, plan, restore.
/// Returns (chains written, rules written).
fn sync_iptables(
    state: &ClusterState,
    opts: &ResyncOptions,
    facts: &NodeFacts,
    full: bool,
) -> anyhow::Result<(usize, usize)> {
    // The rules of a Service whose object is invalid are left as they are: not rendered, kept
    // from the node.
    let left_out = crate::compare::left_out::services(state);
    let expected_text = render(
        &crate::compare::left_out::judged_state(state, &left_out),
        &opts.config,
        facts,
        RenderOptions {
            with_base_jumps: true,
        },
    )
    .to_restore_text();
    let saved = opts.host.save(false)?;
    let (expected_text, _) =
        crate::compare::iptables::scope::keep_left_out(&expected_text, &saved, &left_out);
    let expected = Ruleset::parse(&expected_text, &ParseOptions::default())?;
    let current = Ruleset::parse(&saved, &ParseOptions::default())?;
    if let Some(why) = crate::apply::guard::unknown_refusal(&current) {
        return Err(ResyncError::UnknownLayout(why).into());
    }
    let p = plan(&expected, &current, full);
    // Whatever the render asked for, only kube-proxy's chains and jumps are written.
    let refused = check_plan(&p, Proxier::Iptables);
    if !refused.is_empty() {
        return Err(ResyncError::NotKubeProxys(refused).into());
    }
    let changes = p.tables.iter().flat_map(|t| &t.changes);
    let chains_written = changes
        .clone()
        .filter(|c| !matches!(c.action, ChainAction::KeepReferenced))
        .count();
    let rules_written = changes
        .map(|c| {
            if c.action == ChainAction::Delete {
                0
            } else {
                c.rules_after
            }
        })
        .sum();
    for t in &p.tables {
        let input = t.restore_input();
        if !input.is_empty() {
            opts.host.restore_noflush(&input)?;
        }
    }
    Ok((chains_written, rules_written))
}

/// The tables of one sync on an nftables-mode node: both families rendered, the node's tables
/// listed, and what differs applied, one `nft -f` transaction per family (the other family only
/// when the node has its table, as `repair` does). Returns (chains, sets and maps written;
/// rules and elements written).
fn sync_nftables(
    host: &LocalNft,
    state: &ClusterState,
    opts: &ResyncOptions,
    facts: &NodeFacts,
    full: bool,
) -> anyhow::Result<(usize, usize)> {
    let targets = Target::both(state, &opts.config, facts);
    let plan = nft_sync(host, &targets, full)?;
    Ok(script_counts(&plan.script()))
}

/// (chains, sets and maps written; rules added) of an `nft -f` transaction: the objects its
/// commands name (`add rule ip kube-proxy NAME …`, `flush chain …`, `delete element …`) and
/// its `add rule` lines.
fn script_counts(script: &str) -> (usize, usize) {
    let mut objects = std::collections::HashSet::new();
    let mut rules = 0;
    for line in script.lines().filter(|l| !l.starts_with('#')) {
        let mut words = line.split_whitespace();
        let (verb, kind) = (words.next(), words.next());
        if kind == Some("rule") && verb == Some("add") {
            rules += 1;
        }
        // `VERB KIND FAMILY kube-proxy NAME …`; a table command names no object.
        let (family, name) = (words.next(), words.nth(1));
        if kind != Some("table")
            && let Some(name) = name
        {
            objects.insert((family, name));
        }
    }
    (objects.len(), rules)
}

/// Lists `host`'s conntrack table, checks it against `state` and deletes the stale UDP/SCTP
/// groups of the loop's family (the other family's rules are not this loop's, as kube-proxy's
/// cleanup is per family).
fn clear_stale_flows(
    host: &LocalConntrack,
    state: &ClusterState,
    opts: &ResyncOptions,
    facts: &NodeFacts,
) -> anyhow::Result<ConntrackRepair> {
    let text = ct::list(host)?;
    let listing =
        kproxy_parsers::conntrack::parse(&text, kproxy_parsers::conntrack::ParseOptions::strict())
            .map_err(|e| e.in_source(format!("conntrack {}", ct::LIST_ARGS.join(" "))))?;
    let mut stale = check(
        &listing.flows,
        &ServiceIndex::new(state, &opts.config, facts),
    );
    stale
        .groups
        .retain(|g| g.orig_dst.is_ipv6() == opts.host.ipv6);
    let mut plan = ConntrackRepair::plan(
        format!(
            "conntrack {} on {}",
            ct::LIST_ARGS.join(" "),
            host.location()
        ),
        &stale,
    );
    if !plan.is_empty() {
        ct::apply(host, &mut plan, &stale)?;
    }
    Ok(plan)
}

/// The log lines of a sync's conntrack step: one per deletion, or the failure (`last_failure`
/// keeps a failure that repeats from being logged at every sync).
fn flow_lines(flows: &FlowCleanup, last_failure: &mut Option<String>) -> Vec<String> {
    match flows {
        FlowCleanup::Off => Vec::new(),
        FlowCleanup::Failed(e) => {
            if last_failure.as_deref() == Some(e) {
                return Vec::new();
            }
            *last_failure = Some(e.clone());
            vec![format!("conntrack: stale flows not cleared: {e}")]
        }
        FlowCleanup::Cleared(plan) => {
            *last_failure = None;
            plan.deletions
                .iter()
                .map(|d| {
                    format!(
                        "conntrack: {} {}{} → {}: deleted {}, listed again: {} left ({})",
                        d.id,
                        d.service
                            .as_deref()
                            .map(|s| format!("{s} "))
                            .unwrap_or_default(),
                        d.destination,
                        d.reply_source,
                        d.deleted.unwrap_or(0),
                        d.remaining.unwrap_or(0),
                        d.command
                    )
                })
                .collect()
        }
    }
}

/// Runs the loop until `shutdown` completes (also while waiting for the initial state; a sync in
/// progress is finished first, so that the node is never left half-written). Every change the
/// watch sees (add, update, delete, re-list) triggers a sync.
pub async fn run(
    conn: Connection,
    opts: ResyncOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let watch = ClusterWatch::start(&conn).await?;
    let ready_timeout = Duration::from_secs(60);
    tokio::select! {
        _ = &mut shutdown => {
            (opts.log)("shutting down before the first sync");
            return Ok(());
        }
        ready = tokio::time::timeout(ready_timeout, watch.ready()) => {
            ready.map_err(|_| ResyncError::NotReady(ready_timeout))?;
        }
    }
    let mut last_full = Instant::now();
    let mut full = true;
    let mut conntrack_failure = None;
    // A failure that repeats on every retry (a table this build does not know) is said once.
    let mut last_failure: Option<String> = None;
    // Objects the API server would reject are left out of every sync: each is said once.
    let mut left_out = std::collections::HashSet::new();
    loop {
        let state = watch.state();
        for w in state.invalid_warnings() {
            let line = format!("left out: {w}");
            if left_out.insert(line.clone()) {
                (opts.log)(&line);
            }
        }
        let started = Instant::now();
        let sync_opts = opts.clone();
        let result =
            tokio::task::spawn_blocking(move || sync_once(&state, &sync_opts, full)).await?;
        match result {
            Ok(s) => {
                (opts.log)(&format!(
                    "sync: {} in {:.1} ms, {} chains written, {} rules",
                    if s.full { "full" } else { "partial" },
                    started.elapsed().as_secs_f64() * 1000.0,
                    s.chains_written,
                    s.rules_written
                ));
                for line in flow_lines(&s.flows, &mut conntrack_failure) {
                    (opts.log)(&line);
                }
                if s.full {
                    last_full = Instant::now();
                }
                full = false;
                last_failure = None;
            }
            Err(e) => {
                // As kube-proxy: a failed sync makes the next one full.
                let message = format!("sync failed: {e:#}");
                if last_failure.as_deref() != Some(message.as_str()) {
                    (opts.log)(&message);
                    last_failure = Some(message);
                }
                full = true;
            }
        }
        let next_allowed = started + opts.min_sync_period;
        let next_full = last_full + opts.sync_period;
        tokio::select! {
            _ = &mut shutdown => {
                (opts.log)("shutting down");
                return Ok(());
            }
            _ = watch.changed() => {}
            _ = tokio::time::sleep_until(next_full.into()) => { full = true; }
        }
        // Coalesce: wait out the rest of the minimum period, absorbing further events.
        let now = Instant::now();
        if next_allowed > now {
            tokio::select! {
                _ = &mut shutdown => {
                    (opts.log)("shutting down");
                    return Ok(());
                }
                _ = tokio::time::sleep(next_allowed - now) => {}
            }
        }
        if Instant::now() >= next_full {
            full = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nft_transactions_are_counted_by_object() {
        let script = "# kubectl-kproxy repair: table ip kube-proxy\n\
            add table ip kube-proxy { comment \"rules for kube-proxy\" ; }\n\
            flush chain ip kube-proxy masquerading\n\
            add rule ip kube-proxy masquerading masquerade fully-random\n\
            add rule ip kube-proxy masquerading mark set mark xor 0x4000\n\
            delete element ip kube-proxy service-ips { 10.96.0.1 . tcp . 443 }\n\
            add chain ip6 kube-proxy masquerading\n";
        assert_eq!(script_counts(script), (3, 2));
        assert_eq!(script_counts(""), (0, 0));
    }

    #[test]
    fn a_repeated_conntrack_failure_is_logged_once() {
        let mut last = None;
        let failed = FlowCleanup::Failed("running conntrack on this host: not found".into());
        assert_eq!(flow_lines(&failed, &mut last).len(), 1);
        assert!(flow_lines(&failed, &mut last).is_empty());
        let cleared = FlowCleanup::Cleared(ConntrackRepair::plan("listing", &Default::default()));
        assert!(flow_lines(&cleared, &mut last).is_empty());
        assert_eq!(
            flow_lines(&failed, &mut last).len(),
            1,
            "again after a success"
        );
        assert!(flow_lines(&FlowCleanup::Off, &mut last).is_empty());
    }
}
