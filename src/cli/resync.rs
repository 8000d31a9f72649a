//! `resync` command: stand in for a dead kube-proxy on this node — watch the API and keep the
//! node's kube-proxy chains (or, in nftables mode, its `kube-proxy` tables) in sync until
//! SIGTERM/SIGINT.

use super::common::{BackendArg, GlobalArgs, NodeFactArgs};
use crate::apply::conntrack::LocalConntrack;
use crate::apply::host::IptablesHost;
use crate::apply::nftables::host::LocalNft;
use crate::apply::resync::{ResyncError, ResyncOptions, run as run_loop};
use crate::collect::local::kube_proxy_pid;
use crate::exit::Outcome;
use crate::kube_client;
use crate::pipeline::mode::for_writing;
use crate::state::mode::ProxyMode;
use anyhow::{Context, bail};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `resync`.
#[derive(Debug, Args)]
pub struct ResyncArgs {
    /// Work on this host's rules (required: resync runs on the node).
    #[arg(long)]
    pub local: bool,
    /// Keep running, following the API's watch events (required; a one-shot sync is `repair --local --apply`).
    #[arg(long)]
    pub watch: bool,
    /// Minimum time between two syncs; changes arriving meanwhile are coalesced (e.g. 1s, 500ms).
    #[arg(long, value_name = "DURATION", default_value = "1s")]
    pub min_sync_period: String,
    /// Time between full rewrites of every chain.
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    pub sync_period: String,
    /// KubeProxyConfiguration YAML (or the kube-proxy ConfigMap), e.g. from `kubectl -n kube-system get cm kube-proxy -o yaml`.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Start even though a kube-proxy process is running on this host.
    #[arg(long)]
    pub force: bool,
    /// Which iptables userspace to use on this host.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Operate on the rules of this network namespace (`ip netns exec NAME …`).
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,
    /// Node facts, as for render.
    #[command(flatten)]
    pub facts: NodeFactArgs,
}

/// Parses `500ms`, `1s`, `2m`, `1h` (kubectl's duration syntax; `0` = zero).
fn duration(text: &str) -> anyhow::Result<Duration> {
    Ok(kube_client::parse_duration(text)
        .with_context(|| format!("bad duration {text:?}"))?
        .unwrap_or(Duration::ZERO))
}

/// Runs `resync`.
pub fn run(args: ResyncArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if !args.local || !args.watch {
        bail!(
            "resync runs on the node and follows the API: use `kubectl-kproxy resync --local --watch` (one-shot: `repair --local --apply`)"
        );
    }
    if !args.force
        && let Some(pid) = kube_proxy_pid(args.netns.as_deref())
    {
        return Err(ResyncError::KubeProxyRunning(pid).into());
    }
    let (config, warnings) = super::common::load_config(args.config.as_deref())?;
    super::common::print_warnings(&warnings);
    // nftables mode: configured, or no mode configured and kube-proxy's table on the host.
    let nft = LocalNft {
        netns: args.netns.clone(),
    };
    let decision = for_writing(config.mode, None, || nft.tables().ok());
    tracing::info!("{}", decision.note());
    let (config, nftables) = if decision.mode == ProxyMode::Nftables {
        (config.for_nftables(), Some(nft))
    } else {
        (config, None)
    };
    let host = IptablesHost {
        ipv6: args.facts.ip_family == "6",
        backend: args.backend.into(),
        netns: args.netns.clone(),
        wait: Duration::from_secs(5),
    };
    let mut fact_args = args.facts.clone();
    // The host's family is fixed for the life of the loop: `auto` means IPv4 here.
    fact_args.ip_family = if args.facts.ip_family == "6" {
        "6"
    } else {
        "4"
    }
    .into();
    let fact_config = config.clone();
    let opts = ResyncOptions {
        host,
        config,
        facts: Arc::new(move |state| {
            let (facts, _) = crate::state::node::build(&fact_args.inputs(), state, &fact_config)?;
            Ok(facts)
        }),
        min_sync_period: duration(&args.min_sync_period)?,
        sync_period: duration(&args.sync_period)?.max(Duration::from_secs(1)),
        log: Arc::new(|line| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            eprintln!("{}.{:03} {line}", now.as_secs(), now.subsec_millis());
        }),
        conntrack: Some(LocalConntrack {
            netns: args.netns.clone(),
        }),
        nftables,
    };
    let rt = super::live::runtime()?;
    rt.block_on(async {
        // Install the handlers first: a signal that arrives while connecting or waiting for the
        // initial state must stop the loop cleanly, not kill the process.
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
        };
        let conn = kube_client::connect(&global.client_options()).await?;
        run_loop(conn, opts, shutdown).await
    })?;
    Ok(Outcome::Clean)
}
