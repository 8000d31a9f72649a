//! The resync loop: an emergency stand-in for a dead kube-proxy on one node. It watches Services,
//! EndpointSlices and Nodes ([`ClusterWatch`]), coalesces changes, and syncs the node's rules: a
//! partial sync (only the chains that differ) after changes, at most once per
//! `min_sync_period`, and a full rewrite every `sync_period`. One log line per sync.

use super::host::{IptablesHost, RulesHost};
use super::plan::{ChainAction, plan};
use crate::collect::watch::ClusterWatch;
use crate::model::Ruleset;
use crate::proxier::iptables::{RenderOptions, render};
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::node::NodeFacts;
use kproxy_parsers::iptables::ParseOptions;
use kube::Client;
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
}

/// What one sync did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncStats {
    /// Whether every chain was rewritten.
    pub full: bool,
    /// Chains created, rewritten or deleted.
    pub chains_written: usize,
    /// Rules written.
    pub rules_written: usize,
}

/// One sync: render, read the node, plan, restore. Returns what was written.
pub fn sync_once(
    state: &ClusterState,
    opts: &ResyncOptions,
    full: bool,
) -> anyhow::Result<SyncStats> {
    let facts = (opts.facts)(state)?;
    let expected_text = render(
        state,
        &opts.config,
        &facts,
        RenderOptions {
            with_base_jumps: true,
        },
    )
    .to_restore_text();
    let expected = Ruleset::parse(&expected_text, &ParseOptions::default())?;
    let saved = opts.host.save(false)?;
    let current = Ruleset::parse(&saved, &ParseOptions::default())?;
    let p = plan(&expected, &current, full);
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
    Ok(SyncStats {
        full,
        chains_written,
        rules_written,
    })
}

/// Runs the loop until `shutdown` completes (also while waiting for the initial state; a sync in
/// progress is finished first, so that the node is never left half-written). Every change the
/// watch sees (add, update, delete, re-list) triggers a sync.
pub async fn run(
    client: Client,
    opts: ResyncOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    let watch = ClusterWatch::start(client);
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
    loop {
        let state = watch.state();
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
                if s.full {
                    last_full = Instant::now();
                }
                full = false;
            }
            Err(e) => {
                // As kube-proxy: a failed sync makes the next one full.
                (opts.log)(&format!("sync failed: {e:#}"));
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
