//! Live cluster access for the commands that need API state and node dumps (`verify`,
//! `trace`, `collect`): the [`LiveArgs`] flag group, [`resolve_inputs`] which supplies the
//! same inputs as the offline flags from a cluster or a bundle, and [`run_all_nodes`] for
//! `--all-nodes` fan-outs.
//!
//! # Where each input comes from
//!
//! | input | first that applies |
//! |-------|--------------------|
//! | everything | `--bundle FILE` (a later `--config FILE` still overrides the bundle's configuration) |
//! | API state | `--state FILE…`, else the API (Services, EndpointSlices in all namespaces, Nodes; paginated) |
//! | configuration | `--config FILE`, else the ConfigMap `--proxy-configmap NS/NAME` (`config.conf`) when the API is used; a missing default ConfigMap is a warning |
//! | node dumps | `--collector`: `auto` = `files` when `--iptables-save` is given, else `exec` |
//!
//! The API is contacted only when `--state` is absent or the collector is `exec`/`debug-pod`,
//! so fully offline runs never need a kubeconfig.

use super::common::{DumpArgs, GlobalArgs, StateArgs};
use crate::collect::files::DumpFiles;
use crate::collect::{self, DumpKind, NodeSnapshot};
use crate::exit::Outcome;
use crate::kube_client::{self, ApiError, Connection};
use crate::state::ClusterState;
use anyhow::{Context, anyhow, bail};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How node dumps are obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CollectorChoice {
    /// `files` when `--iptables-save` is given, else `exec`.
    Auto,
    /// Exec into the kube-proxy pod on the node.
    Exec,
    /// A short-lived privileged hostNetwork pod on the node (`--image`).
    DebugPod,
    /// Run the commands on this host.
    Local,
    /// The offline `--iptables-save`/`--ip6tables-save`/… flags.
    Files,
}

/// Flags for reading a live cluster or a bundle (flattened into verify, trace and collect).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Live cluster")]
pub struct LiveArgs {
    /// How to read the node's rules.
    #[arg(long, value_enum, default_value_t = CollectorChoice::Auto)]
    pub collector: CollectorChoice,
    /// Label selector of kube-proxy pods (namespace kube-system) for `--collector exec`.
    #[arg(hide_short_help = true, long, value_name = "SELECTOR", default_value = collect::exec::DEFAULT_PROXY_SELECTOR)]
    pub proxy_selector: String,
    /// Image of the debug pod; it must have iptables, ip6tables, ipset and ipvsadm.
    #[arg(hide_short_help = true, long, value_name = "IMAGE", default_value = collect::debug_pod::DEFAULT_IMAGE)]
    pub image: String,
    /// The ConfigMap holding kube-proxy's configuration in `config.conf`.
    #[arg(hide_short_help = true, long, value_name = "NS/NAME", default_value = DEFAULT_PROXY_CONFIGMAP)]
    pub proxy_configmap: String,
    /// Read everything (dumps, API state, configuration) from a `kubectl kproxy collect` bundle.
    #[arg(long, value_name = "FILE.tar.gz")]
    pub bundle: Option<PathBuf>,
    /// Run on every node (or those matching -l), in parallel.
    #[arg(long)]
    pub all_nodes: bool,
    /// Node label selector for --all-nodes, e.g. `node-role.kubernetes.io/worker=`.
    #[arg(hide_short_help = true, short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// How many nodes --all-nodes works on at once.
    #[arg(hide_short_help = true, long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub parallel: u16,
    /// Timeout of each command run on a node (e.g. 30s, 2m).
    #[arg(
        hide_short_help = true,
        long,
        value_name = "DURATION",
        default_value = "30s"
    )]
    pub exec_timeout: String,
}

/// The default `--proxy-configmap`.
pub const DEFAULT_PROXY_CONFIGMAP: &str = "kube-system/kube-proxy";

impl Default for LiveArgs {
    fn default() -> Self {
        LiveArgs {
            collector: CollectorChoice::Auto,
            proxy_selector: collect::exec::DEFAULT_PROXY_SELECTOR.into(),
            image: collect::debug_pod::DEFAULT_IMAGE.into(),
            proxy_configmap: DEFAULT_PROXY_CONFIGMAP.into(),
            bundle: None,
            all_nodes: false,
            selector: None,
            parallel: 8,
            exec_timeout: "30s".into(),
        }
    }
}

/// Everything a command needs about one node, whatever the source.
#[derive(Debug, Clone)]
pub struct ResolvedInputs {
    /// Services, EndpointSlices, Nodes.
    pub state: ClusterState,
    /// KubeProxyConfiguration text (YAML, or a ConfigMap holding it in `config.conf`) and its
    /// source for messages (`configmap kube-system/kube-proxy`, a path, a bundle). None: not
    /// available; kube-proxy's defaults apply, and the mode is the one the dumps show.
    pub config_text: Option<(String, String)>,
    /// The node's dumps; `snapshot.collector` says how they were read, `snapshot.warnings`
    /// lists problems worth showing (also non-fatal problems finding the configuration).
    pub snapshot: NodeSnapshot,
    /// The node name ("" when offline files were given without a node name).
    pub node: String,
}

impl ResolvedInputs {
    /// kube-proxy's configuration the inputs carry (its defaults when they carry none), its
    /// warnings printed.
    pub fn config(&self) -> anyhow::Result<crate::state::config::ProxyConfig> {
        let Some((text, source)) = &self.config_text else {
            return Ok(crate::state::config::ProxyConfig::default());
        };
        let (config, warnings) = crate::state::config::parse(text, source)
            .with_context(|| format!("reading the kube-proxy configuration ({source})"))?;
        super::common::print_warnings(&warnings);
        Ok(config)
    }
}

/// One row of the `--all-nodes` summary, returned by the per-node closure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSummary {
    /// Proxy mode verified.
    pub mode: crate::state::mode::ProxyMode,
    /// Service ports checked.
    pub service_ports_checked: usize,
    /// Error findings.
    pub errors: usize,
    /// Warning findings.
    pub warnings: usize,
    /// The node's exit outcome.
    pub outcome: Outcome,
}

/// A tokio runtime for one command (2 worker threads, timers and I/O enabled).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// Supplies the inputs of `verify`/`trace` for `node` from, in order: `--bundle`, the
/// offline flags, the live cluster (see the module docs for the exact rules).
///
/// `node` is the positional NODE of the command: required for `exec` and `debug-pod`,
/// defaults to this host's name for `local`, optional for `files`. Errors are complete
/// one-line messages (the caller prints them and exits 2): API server unreachable,
/// 401/403 naming the verb and resource, no kube-proxy pod on the node, a binary missing
/// in the image, a command timing out, or output that is not what the command prints.
pub fn resolve_inputs(
    global: &GlobalArgs,
    live: &LiveArgs,
    state: &StateArgs,
    dumps: &DumpArgs,
    node: Option<&str>,
) -> anyhow::Result<ResolvedInputs> {
    if let Some(path) = &live.bundle {
        return from_bundle(path, state, node);
    }
    let collector = effective_collector(live.collector, dumps)?;
    let node = match (collector, node) {
        (_, Some(n)) => n.to_string(),
        (CollectorChoice::Exec | CollectorChoice::DebugPod, None) => bail!(
            "which node? name one to read it through the API (--collector {}; `kubectl get nodes` lists them), or give --bundle FILE or the offline --iptables-save FILE",
            collector_name(collector)
        ),
        (CollectorChoice::Local, None) => collect::local::hostname().unwrap_or_default(),
        _ => String::new(),
    };
    let exec_timeout = exec_timeout(live)?;
    let rt = runtime()?;
    // Dump files are read while the API state loads: both are tens of megabytes on a large
    // node.
    let files = matches!(collector, CollectorChoice::Files | CollectorChoice::Auto);
    let (shared, read) = rayon::join(
        || rt.block_on(load_shared(global, live, state, collector)),
        || files.then(|| collect::files::collect(&dump_files(dumps))),
    );
    let shared = shared?;
    check_node_known(&shared, &node)?;
    let snapshot = match read {
        Some(read) => read?,
        None => rt.block_on(collect_node(
            &shared,
            live,
            dumps,
            collector,
            &node,
            exec_timeout,
        ))?,
    };
    Ok(shared.into_inputs(node, snapshot))
}

/// The API state and configuration of a live run, without the node's dumps, and the
/// connection: for commands that run their own commands on the node (remote `repair`).
#[derive(Debug, Clone)]
pub struct LiveState {
    /// The API connection.
    pub conn: Connection,
    /// Services, EndpointSlices, Nodes (`--state` files when given, else the API).
    pub state: ClusterState,
    /// As [`ResolvedInputs::config_text`].
    pub config_text: Option<(String, String)>,
    /// Non-fatal problems finding the configuration, one line each.
    pub warnings: Vec<String>,
}

/// Loads the API state and configuration for `node` exactly as [`resolve_inputs`] does for
/// the `exec` and `debug-pod` collectors (`--state`/`--config` override the API), and checks
/// that the node exists. Call it inside the runtime that will use the connection.
pub async fn load_live_state(
    global: &GlobalArgs,
    live: &LiveArgs,
    state: &StateArgs,
    node: &str,
) -> anyhow::Result<LiveState> {
    let shared = load_shared(global, live, state, CollectorChoice::Exec).await?;
    check_node_known(&shared, node)?;
    let conn = shared
        .conn
        .ok_or_else(|| anyhow!("reading a node through the API needs API access"))?;
    Ok(LiveState {
        conn,
        state: shared.state,
        config_text: shared.config,
        warnings: shared.warnings,
    })
}

/// Runs `per_node` on every node (or those matching `-l`), `--parallel` at a time, draws a
/// progress bar on stderr when it is a terminal, prints the summary table to stdout, and
/// returns the worst outcome. API state and configuration are read once and shared; each
/// node's dumps are collected with `--collector` (`auto` = `exec`; `files` and `local` are
/// refused). `per_node` must not print: it returns the node's [`NodeSummary`]; an error
/// from it or from collection makes that node's row an error (outcome 2).
pub fn run_all_nodes<F>(
    global: &GlobalArgs,
    live: &LiveArgs,
    state: &StateArgs,
    per_node: F,
) -> anyhow::Result<Outcome>
where
    F: Fn(ResolvedInputs) -> anyhow::Result<NodeSummary> + Send + Sync + 'static,
{
    if live.bundle.is_some() {
        bail!("--all-nodes reads the cluster; it cannot be combined with --bundle");
    }
    let collector = match live.collector {
        CollectorChoice::Auto | CollectorChoice::Exec => CollectorChoice::Exec,
        CollectorChoice::DebugPod => CollectorChoice::DebugPod,
        other => bail!(
            "--all-nodes needs --collector exec or debug-pod, not {}",
            collector_name(other)
        ),
    };
    let exec_timeout = exec_timeout(live)?;
    let per_node = Arc::new(per_node);
    let rt = runtime()?;
    let rows = rt.block_on(async {
        let shared = Arc::new(load_shared(global, live, state, collector).await?);
        let conn = shared
            .conn
            .clone()
            .ok_or_else(|| anyhow!("--all-nodes needs API access"))?;
        let nodes = crate::collect::api::list_nodes(&conn, live.selector.as_deref()).await?;
        let mut names: Vec<String> = nodes.into_iter().filter_map(|n| n.metadata.name).collect();
        names.sort();
        if names.is_empty() {
            bail!(
                "no nodes{}",
                live.selector
                    .as_ref()
                    .map(|s| format!(" match label selector {s:?}"))
                    .unwrap_or_default()
            );
        }
        let bar = progress_bar(names.len() as u64);
        let dumps = DumpArgs::default();
        let tasks = names.into_iter().map(|node| {
            let shared = Arc::clone(&shared);
            let per_node = Arc::clone(&per_node);
            let bar = bar.clone();
            let dumps = dumps.clone();
            async move {
                let snap =
                    collect_node(&shared, live, &dumps, collector, &node, exec_timeout).await;
                let row = match snap {
                    Err(e) => Row::failed(&node, "-", &e),
                    Ok(snapshot) => {
                        let used = snapshot.collector.clone();
                        let inputs = shared.inputs_for(node.clone(), snapshot);
                        let f = Arc::clone(&per_node);
                        match tokio::task::spawn_blocking(move || f(inputs)).await {
                            Ok(Ok(summary)) => Row {
                                node: node.clone(),
                                collector: used,
                                summary: Some(summary),
                                error: None,
                            },
                            Ok(Err(e)) => Row::failed(&node, &used, &e),
                            Err(e) => Row::failed(&node, &used, &anyhow!("worker panicked: {e}")),
                        }
                    }
                };
                bar.inc(1);
                row
            }
        });
        use futures::StreamExt;
        let mut rows: Vec<Row> = futures::stream::iter(tasks)
            .buffer_unordered(usize::from(live.parallel))
            .collect()
            .await;
        bar.finish_and_clear();
        rows.sort_by(|a, b| a.node.cmp(&b.node));
        anyhow::Ok(rows)
    })?;
    print_summary(&rows, global.no_headers);
    Ok(rows
        .iter()
        .map(Row::outcome)
        .max()
        .unwrap_or(Outcome::Clean))
}

/// One node's result in an `--all-nodes` run.
struct Row {
    node: String,
    collector: String,
    summary: Option<NodeSummary>,
    error: Option<String>,
}

impl Row {
    fn failed(node: &str, collector: &str, e: &anyhow::Error) -> Row {
        let mut text = e.to_string();
        for cause in e.chain().skip(1) {
            text.push_str(": ");
            text.push_str(&cause.to_string());
        }
        Row {
            node: node.to_string(),
            collector: collector.to_string(),
            summary: None,
            error: Some(text),
        }
    }

    fn outcome(&self) -> Outcome {
        self.summary
            .as_ref()
            .map(|s| s.outcome)
            .unwrap_or(Outcome::Error)
    }
}

fn print_summary(rows: &[Row], no_headers: bool) {
    use std::io::Write;
    let mut table = crate::output::table::KubeTable::new([
        "NODE",
        "MODE",
        "SERVICE-PORTS",
        "ERRORS",
        "WARNINGS",
        "COLLECTOR",
        "RESULT",
    ]);
    for r in rows {
        let (mode, ports, errors, warnings) = match &r.summary {
            Some(s) => (
                s.mode.to_string(),
                s.service_ports_checked.to_string(),
                s.errors.to_string(),
                s.warnings.to_string(),
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let result = match (&r.summary, &r.error) {
            (_, Some(e)) => format!("error: {e}"),
            (Some(s), None) => match s.outcome {
                Outcome::Clean => "ok".to_string(),
                Outcome::Drift => "drift".to_string(),
                Outcome::Error => "error".to_string(),
            },
            (None, None) => "error".to_string(),
        };
        table.row([
            r.node.clone(),
            mode,
            ports,
            errors,
            warnings,
            r.collector.clone(),
            result,
        ]);
    }
    let mut out = anstream::stdout();
    let _ = write!(out, "{}", table.render(no_headers));
}

fn progress_bar(len: u64) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{spinner} nodes {pos}/{len} [{bar:30}] {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// State, configuration and connection shared by all nodes of one run.
struct Shared {
    conn: Option<Connection>,
    state: ClusterState,
    config: Option<(String, String)>,
    state_from_api: bool,
    warnings: Vec<String>,
}

impl Shared {
    fn inputs_for(&self, node: String, mut snapshot: NodeSnapshot) -> ResolvedInputs {
        snapshot
            .warnings
            .splice(0..0, self.warnings.iter().cloned());
        ResolvedInputs {
            state: self.state.clone(),
            config_text: self.config.clone(),
            snapshot,
            node,
        }
    }

    /// [`Shared::inputs_for`] for the last (or only) node: moves the state instead of copying it.
    fn into_inputs(self, node: String, mut snapshot: NodeSnapshot) -> ResolvedInputs {
        snapshot.warnings.splice(0..0, self.warnings);
        ResolvedInputs {
            state: self.state,
            config_text: self.config,
            snapshot,
            node,
        }
    }
}

fn collector_name(c: CollectorChoice) -> &'static str {
    match c {
        CollectorChoice::Auto => "auto",
        CollectorChoice::Exec => "exec",
        CollectorChoice::DebugPod => "debug-pod",
        CollectorChoice::Local => "local",
        CollectorChoice::Files => "files",
    }
}

fn dump_files(dumps: &DumpArgs) -> DumpFiles {
    let files = [
        (DumpKind::IptablesSave, &dumps.iptables_save),
        (DumpKind::Ip6tablesSave, &dumps.ip6tables_save),
        (DumpKind::IptablesLegacySave, &dumps.iptables_legacy_save),
    ]
    .into_iter()
    .filter_map(|(k, p)| p.clone().map(|p| (k, p)))
    .collect();
    DumpFiles {
        files,
        lenient: dumps.lenient,
    }
}

fn effective_collector(
    choice: CollectorChoice,
    dumps: &DumpArgs,
) -> anyhow::Result<CollectorChoice> {
    let has_files = !dump_files(dumps).is_empty();
    Ok(match choice {
        CollectorChoice::Auto if has_files => CollectorChoice::Files,
        CollectorChoice::Auto => CollectorChoice::Exec,
        CollectorChoice::Files if !has_files => {
            bail!(
                "--collector files needs --iptables-save FILE (and optionally --ip6tables-save, --iptables-legacy-save)"
            )
        }
        other if other != CollectorChoice::Files && has_files => bail!(
            "--iptables-save and friends are the `files` collector; they cannot be combined with --collector {}",
            collector_name(other)
        ),
        other => other,
    })
}

fn exec_timeout(live: &LiveArgs) -> anyhow::Result<Duration> {
    let t = kube_client::parse_duration(&live.exec_timeout).map_err(|_| {
        anyhow!(
            "invalid --exec-timeout {:?}: expected e.g. 30s, 2m",
            live.exec_timeout
        )
    })?;
    t.ok_or_else(|| anyhow!("--exec-timeout must be more than 0"))
}

fn split_ns_name(text: &str) -> anyhow::Result<(&str, &str)> {
    match text.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => bail!("--proxy-configmap must be NAMESPACE/NAME, got {text:?}"),
    }
}

async fn load_shared(
    global: &GlobalArgs,
    live: &LiveArgs,
    state: &StateArgs,
    collector: CollectorChoice,
) -> anyhow::Result<Shared> {
    let need_api = state.state.is_empty()
        || matches!(collector, CollectorChoice::Exec | CollectorChoice::DebugPod);
    let conn = if need_api {
        Some(kube_client::connect(&global.client_options()).await?)
    } else {
        None
    };
    let mut warnings = Vec::new();
    let (cluster, state_from_api) = match (&conn, state.state.is_empty()) {
        (Some(c), true) => (crate::collect::api::fetch_cluster_state(c).await?, true),
        _ => (crate::state::load::from_files(&state.state)?, false),
    };
    let config = match (&state.config, &conn) {
        (Some(path), _) => Some((super::common::read_input(path)?, path.display().to_string())),
        (None, Some(c)) => {
            let (ns, name) = split_ns_name(&live.proxy_configmap)?;
            match crate::collect::api::fetch_proxy_config(c, ns, name).await {
                Ok(text) => Some((text, format!("configmap {ns}/{name}"))),
                Err(crate::collect::api::FetchError::Api(ApiError::NotFound { .. }))
                    if live.proxy_configmap == DEFAULT_PROXY_CONFIGMAP =>
                {
                    warnings.push(format!(
                        "ConfigMap {ns}/{name} not found: using kube-proxy's defaults and the mode seen in the dumps (pass --config FILE or --proxy-configmap NS/NAME)"
                    ));
                    None
                }
                Err(e) => return Err(e.into()),
            }
        }
        (None, None) => None,
    };
    Ok(Shared {
        conn,
        state: cluster,
        config,
        state_from_api,
        warnings,
    })
}

fn check_node_known(shared: &Shared, node: &str) -> anyhow::Result<()> {
    if !shared.state_from_api || node.is_empty() || shared.conn.is_none() {
        return Ok(());
    }
    let names: Vec<&str> = shared
        .state
        .nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    if names.contains(&node) {
        return Ok(());
    }
    let mut shown: Vec<&str> = names.iter().copied().take(10).collect();
    shown.sort();
    bail!(
        "node {node:?} not found in the cluster (nodes: {}{})",
        shown.join(", "),
        if names.len() > 10 { ", …" } else { "" }
    )
}

async fn collect_node(
    shared: &Shared,
    live: &LiveArgs,
    dumps: &DumpArgs,
    collector: CollectorChoice,
    node: &str,
    exec_timeout: Duration,
) -> anyhow::Result<NodeSnapshot> {
    let conn = || {
        shared.conn.as_ref().ok_or_else(|| {
            anyhow!(
                "the {} collector needs API access",
                collector_name(collector)
            )
        })
    };
    let snap = match collector {
        CollectorChoice::Files | CollectorChoice::Auto => {
            collect::files::collect(&dump_files(dumps))?
        }
        CollectorChoice::Local => collect::local::collect(exec_timeout).await?,
        CollectorChoice::Exec => {
            collect::exec::collect(
                conn()?,
                collect::exec::PROXY_NAMESPACE,
                &live.proxy_selector,
                node,
                exec_timeout,
            )
            .await?
        }
        CollectorChoice::DebugPod => {
            let mut snap =
                collect::debug_pod::collect(conn()?, node, &live.image, exec_timeout).await?;
            snap.kube_proxy_image = proxy_image(conn()?, live, node, &mut snap.warnings).await;
            snap
        }
    };
    Ok(snap)
}

/// The image of the kube-proxy pod on `node`, for the debug-pod collector (which does not run
/// in it); a missing pod or a failed lookup is a warning: the rules then tell the release.
async fn proxy_image(
    conn: &Connection,
    live: &LiveArgs,
    node: &str,
    warnings: &mut Vec<String>,
) -> Option<String> {
    let ns = collect::exec::PROXY_NAMESPACE;
    match crate::collect::api::kube_proxy_image_on_node(conn, ns, &live.proxy_selector, node).await
    {
        Ok(Some(image)) => Some(image),
        Ok(None) => {
            warnings.push(format!(
                "no kube-proxy pod on node {node:?} matches {:?} in {ns} (k3s and RKE2 run kube-proxy inside their own process): its release is inferred from the rules unless --kube-proxy-version is given",
                live.proxy_selector
            ));
            None
        }
        Err(e) => {
            warnings.push(format!(
                "could not read the kube-proxy pod's image: {e}; its release is inferred from the rules unless --kube-proxy-version is given"
            ));
            None
        }
    }
}

fn from_bundle(
    path: &std::path::Path,
    state: &StateArgs,
    node: Option<&str>,
) -> anyhow::Result<ResolvedInputs> {
    let bundle = collect::bundle::read(path)?;
    if let Some(n) = node
        && !bundle.node.is_empty()
        && n != bundle.node
    {
        bail!(
            "bundle {} holds node {:?}, not {n:?}",
            path.display(),
            bundle.node
        );
    }
    let config = match &state.config {
        Some(p) => Some((super::common::read_input(p)?, p.display().to_string())),
        None => bundle.config,
    };
    let cluster = if state.state.is_empty() {
        bundle.state
    } else {
        crate::state::load::from_files(&state.state)?
    };
    Ok(ResolvedInputs {
        state: cluster,
        config_text: config,
        snapshot: bundle.snapshot,
        node: bundle.node,
    })
}
