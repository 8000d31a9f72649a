//! `monitor` command: the node agent. Parses the flags, wires the library's loop
//! ([`crate::monitor`]) to its parts — the API's watches or `--state` files, the local collector
//! (in `--netns` when given), `verify` ([`crate::pipeline::verify::verify_node`]), the
//! Events and node condition, `repair --local --apply` — and serves the endpoints until
//! SIGTERM/SIGINT.

use super::common::{GlobalArgs, NodeFactArgs, StateArgs};
use crate::exit::Outcome;
use crate::monitor::agent::{self, LogFormat, Parts, Repairer, Verified, Verifier, VerifyInputs};
use crate::monitor::sources::{ApiSource, ApiView, FileSource, LocalReader, WatchSource};
use crate::monitor::status::Shared;
use crate::state::duration;
use anyhow::{Context, anyhow, bail};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// When the monitor repairs the node itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RepairWhen {
    /// Never (the default): report only.
    Never,
    /// When drift has lasted past the grace period and kube-proxy's /healthz does not answer
    /// healthy: `repair --local --apply` (backup, atomic, verified, rolled back on failure).
    WhenKubeProxyDown,
}

/// Log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormatArg {
    /// `TIME node=N state=S previous=P message`.
    Text,
    /// One JSON object per line.
    Json,
}

/// The iptables backend whose rules are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadBackend {
    /// What the host's `iptables-save` points to.
    Auto,
    /// `iptables-nft-save`.
    Nft,
    /// `iptables-legacy-save`.
    Legacy,
}

/// Arguments of `monitor`.
#[derive(Debug, Args)]
pub struct MonitorArgs {
    /// Serve /metrics, /healthz, /readyz and /findings on this address (`:PORT` = all addresses).
    #[arg(long, value_name = "ADDR", default_value = ":9847")]
    pub listen: String,
    /// Time between two verifies when nothing changes (e.g. 60s, 1m).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub interval: Duration,
    /// How long a difference may last before it is drift [default: kube-proxy's minSyncPeriod +
    /// syncPeriod + 5s].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub grace: Option<Duration>,
    /// Wait after an API change before verifying (changes arriving meanwhile are taken together).
    #[arg(hide_short_help = true, long, value_name = "DURATION", default_value = "200ms", value_parser = parse_duration)]
    pub debounce: Duration,
    /// Time between verifies while differences are pending or an API change is not matched yet.
    #[arg(hide_short_help = true, long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub recheck: Duration,
    /// Set the node condition KubeProxyRulesInSync (needs the API).
    #[arg(long, value_name = "BOOL", default_value = "true", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub node_condition: bool,
    /// The least time between two Events of one reason.
    #[arg(hide_short_help = true, long, value_name = "DURATION", default_value = "1m", value_parser = parse_duration)]
    pub event_interval: Duration,
    /// Repair the node itself (off by default).
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = RepairWhen::Never)]
    pub repair: RepairWhen,
    /// Where repairs keep their backups.
    #[arg(hide_short_help = true, long, value_name = "DIR")]
    pub backup_dir: Option<PathBuf>,
    /// Log line format.
    #[arg(long, value_enum, value_name = "FORMAT", default_value_t = LogFormatArg::Text)]
    pub log_format: LogFormatArg,
    /// Read the rules of this network namespace (`ip netns exec NAME …`).
    #[arg(hide_short_help = true, long, value_name = "NAME")]
    pub netns: Option<String>,
    /// The iptables backend whose rules are read.
    #[arg(hide_short_help = true, long, value_enum, default_value_t = ReadBackend::Auto)]
    pub backend: ReadBackend,
    /// The longest time what was read from nf_tables (iptables-nft, nftables mode) is kept while
    /// its change events say nothing changed; then the node is read whole again. Each whole
    /// read of a large node costs seconds to a minute of CPU (docs/monitor.md).
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = parse_duration)]
    pub full_read_interval: Duration,
    /// Timeout of each command that reads the node (e.g. 30s), as `verify`'s --exec-timeout.
    #[arg(hide_short_help = true, long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub exec_timeout: Duration,
    /// The ConfigMap holding kube-proxy's configuration in `config.conf` (watched when no
    /// --config is given and the API is used).
    #[arg(hide_short_help = true, long, value_name = "NS/NAME", default_value = super::live::DEFAULT_PROXY_CONFIGMAP)]
    pub proxy_configmap: String,
    /// API state and configuration files instead of the API (re-read when they change).
    #[command(flatten)]
    pub state: StateArgs,
    /// Node facts, as for verify.
    #[command(flatten)]
    pub facts: NodeFactArgs,
}

/// A duration as kube-proxy's configuration writes one (`500ms`, `1s`, `1m`, `1h2m`).
fn parse_duration(text: &str) -> Result<Duration, String> {
    duration::parse(text).map_err(|e| e.to_string())
}

/// `:PORT` or `HOST:PORT`.
fn listen_address(text: &str) -> anyhow::Result<std::net::SocketAddr> {
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_string()
    };
    full.parse()
        .with_context(|| format!("--listen {text:?}: expected HOST:PORT or :PORT"))
}

/// Runs `monitor`.
pub fn run(args: MonitorArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if args.interval.is_zero() || args.recheck.is_zero() {
        bail!("--interval and --recheck must be longer than 0");
    }
    let listen = listen_address(&args.listen)?;
    let (config, warnings) = super::common::load_config(args.state.config.as_deref())?;
    super::common::print_warnings(&warnings);
    let rt = super::live::runtime()?;
    rt.block_on(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            tokio::select! {
                _ = int.recv() => {}
                _ = term.recv() => {}
            }
            let _ = stop_tx.send(true);
        });
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                let _ = rx.wait_for(|s| *s).await;
            }
        };
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let api = args.state.state.is_empty();
        let conn = if api {
            let mut options = global.client_options();
            // kube's own retry of a 503 or 504 goes on for minutes without a word, while the
            // watches keep their old content: the monitor would say "in sync" from stale
            // state. A few quick retries, then the watch reports the error.
            options.retry = crate::kube_client::Retry::Bounded {
                retries: 3,
                first: Duration::from_millis(200),
                longest: Duration::from_secs(2),
            };
            Some(crate::kube_client::connect(&options).await?)
        } else {
            None
        };
        let (source, config) = match &conn {
            None => (
                Box::new(FileSource::new(
                    args.state.state.clone(),
                    args.state.config.clone(),
                    Duration::from_millis(250),
                )) as Box<dyn ApiSource>,
                config,
            ),
            Some(conn) => watch_source(&args, conn, config, stopped()).await?,
        };
        let node = node_name(&args, &config);
        let (grace, how) = match args.grace {
            Some(g) => (g, "--grace".to_string()),
            None => crate::monitor::grace::from_config(&config),
        };
        eprintln!(
            "monitor: node {node}, listening on {listen}, interval {}, grace {} ({how})",
            duration::format(args.interval),
            duration::format(grace)
        );
        let metrics = crate::monitor::metrics::Metrics::new(grace);
        // A verify older than this no longer speaks for the node: two intervals, the reads'
        // time limit and the grace.
        let stale_after = args.interval * 2 + args.exec_timeout + grace;
        let shared = Arc::new(Shared::new(metrics, stale_after));
        let server = tokio::spawn(crate::monitor::server::serve(
            listener,
            Arc::clone(&shared),
            stopped(),
        ));
        let publisher = conn.as_ref().map(|c| {
            Box::new(crate::publish::NodePublisher::new(
                c.clone(),
                &node,
                std::env::var("POD_NAME").ok(),
            )) as Box<dyn agent::Publisher>
        });
        let repairer = (args.repair == RepairWhen::WhenKubeProxyDown).then(|| {
            let mut facts = args.facts.clone();
            facts.node = Some(node.clone());
            Arc::new(CliRepairer {
                args: repair_template(&args),
                global: global.clone(),
                facts,
            }) as Arc<dyn Repairer>
        });
        let opts = agent::Options {
            node: node.clone(),
            interval: args.interval,
            debounce: args.debounce,
            recheck: args.recheck,
            grace,
            grace_fixed: args.grace.is_some(),
            event_interval: args.event_interval,
            condition: args.node_condition,
            condition_heartbeat: crate::fleet::condition::HEARTBEAT,
            repair: repairer.is_some(),
            healthz_address: config.healthz_bind_address.clone(),
            log: match args.log_format {
                LogFormatArg::Text => LogFormat::Text,
                LogFormatArg::Json => LogFormat::Json,
            },
            version: env!("CARGO_PKG_VERSION").to_string(),
        };
        let parts = Parts {
            source,
            reader: Box::new(LocalReader::new(
                crate::collect::netns::HostRunner {
                    netns: args.netns.clone(),
                    backend: match args.backend {
                        ReadBackend::Auto => None,
                        ReadBackend::Nft => Some("nft"),
                        ReadBackend::Legacy => Some("legacy"),
                    },
                },
                args.exec_timeout,
                args.full_read_interval,
            )),
            verifier: Arc::new(CliVerifier::new(&args)?),
            publisher,
            repairer,
        };
        agent::run(opts, parts, shared, stopped()).await;
        let _ = server.await;
        Ok::<_, anyhow::Error>(())
    })?;
    Ok(Outcome::Clean)
}

/// The API's watches, once they have delivered their initial lists, and the configuration
/// (`--config`, else the watched ConfigMap's, else kube-proxy's defaults).
async fn watch_source(
    args: &MonitorArgs,
    conn: &crate::kube_client::Connection,
    file_config: crate::state::config::ProxyConfig,
    stopped: impl std::future::Future<Output = ()>,
) -> anyhow::Result<(Box<dyn ApiSource>, crate::state::config::ProxyConfig)> {
    let configmap = match &args.state.config {
        Some(_) => None,
        None => Some(
            args.proxy_configmap
                .split_once('/')
                .ok_or_else(|| anyhow!("--proxy-configmap: expected NAMESPACE/NAME"))?,
        ),
    };
    let watch = crate::collect::watch::ClusterWatch::start_with_config(conn, configmap)
        .await
        .context("starting the API watches")?;
    eprintln!("monitor: waiting for the API watches' initial lists");
    tokio::select! {
        () = watch.ready() => {}
        () = stopped => bail!("interrupted"),
    }
    let config = match (args.state.config.is_some(), watch.config_text()) {
        (false, Some(text)) => {
            let name = format!("configmap {}", args.proxy_configmap);
            let (c, warnings) = crate::state::config::parse(&text, &name)
                .with_context(|| format!("reading kube-proxy's configuration ({name})"))?;
            super::common::print_warnings(&warnings);
            c
        }
        _ => file_config,
    };
    Ok((
        Box::new(WatchSource {
            watch,
            config_file: args.state.config.clone(),
            configmap: Some(args.proxy_configmap.clone()),
        }),
        config,
    ))
}

/// The node verified: `--node`, else the configuration's hostnameOverride, else this host's
/// name (as kube-proxy decides its own).
fn node_name(args: &MonitorArgs, config: &crate::state::config::ProxyConfig) -> String {
    args.facts
        .node
        .clone()
        .or_else(|| {
            (!config.hostname_override.is_empty()).then(|| config.hostname_override.clone())
        })
        .or_else(crate::collect::local::hostname)
        .unwrap_or_default()
}

/// `verify`'s library call ([`crate::pipeline::verify::verify_node`]) with the monitor's node
/// facts; what it says is printed once, not at every verify.
struct CliVerifier {
    facts: super::common::NodeFactArgs,
    /// The warnings already printed.
    warned: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl CliVerifier {
    fn new(args: &MonitorArgs) -> anyhow::Result<CliVerifier> {
        Ok(CliVerifier {
            facts: args.facts.clone(),
            warned: Default::default(),
        })
    }

    /// Prints `warning` unless it was printed before.
    fn warn_once(&self, warning: String) {
        if let Ok(mut warned) = self.warned.lock()
            && warned.insert(warning.clone())
        {
            super::common::warn(warning);
        }
    }
}

impl Verifier for CliVerifier {
    fn verify(&self, mut inputs: VerifyInputs) -> Result<Verified, String> {
        use crate::pipeline::Note;
        use crate::pipeline::verify::{NodeDumps, VerifyOptions, verify_node};
        for w in std::mem::take(&mut inputs.snapshot.warnings) {
            self.warn_once(w);
        }
        let config = match &inputs.config_text {
            Some((text, source)) => {
                let (config, warnings) = crate::state::config::parse(text, source)
                    .map_err(|e| format!("reading the kube-proxy configuration ({source}): {e}"))?;
                warnings.iter().for_each(|w| self.warn_once(w.to_string()));
                config
            }
            None => crate::state::config::ProxyConfig::default(),
        };
        let mut facts = self.facts.inputs();
        if facts.node.is_none() && !inputs.node.is_empty() {
            facts.node = Some(inputs.node.clone());
        }
        let dumps = NodeDumps {
            snapshot: inputs.snapshot,
            ..Default::default()
        };
        let job = crate::pipeline::verify::VerifyInputs {
            state: std::sync::Arc::new(inputs.state),
            config,
            facts,
            node: inputs.node,
        };
        let options = VerifyOptions {
            group_alike: true,
            ..Default::default()
        };
        let mut notes = Vec::new();
        let report = verify_node(&dumps, job, &options, &mut notes);
        let mut release = None;
        for note in notes {
            match note {
                Note::Warning(w) => self.warn_once(w),
                Note::Release(v) => release = Some(v.to_string()),
                Note::Choice(_) | Note::Skipped(_) | Note::Mode(_) => {}
            }
        }
        let report = report.map_err(|e| {
            let mut text = e.to_string();
            let mut cause = std::error::Error::source(&e);
            while let Some(c) = cause {
                text.push_str(&format!(": {c}"));
                cause = c.source();
            }
            text
        })?;
        Ok(Verified {
            report,
            kube_proxy_version: release,
        })
    }
}

/// `repair --local --apply -o json` with the monitor's namespace, backend and facts (the state
/// and configuration are filled in per repair).
fn repair_template(args: &MonitorArgs) -> Vec<String> {
    let mut argv: Vec<String> = [
        "kubectl-kproxy",
        "repair",
        "--local",
        "--apply",
        "-o",
        "json",
    ]
    .map(String::from)
    .to_vec();
    if let Some(ns) = &args.netns {
        argv.extend(["--netns".into(), ns.clone()]);
    }
    match args.backend {
        ReadBackend::Auto => {}
        ReadBackend::Nft => argv.extend(["--backend".into(), "nft".into()]),
        ReadBackend::Legacy => argv.extend(["--backend".into(), "legacy".into()]),
    }
    if let Some(dir) = &args.backup_dir {
        argv.extend(["--backup-dir".into(), dir.display().to_string()]);
    }
    argv
}

/// `repair --local --apply` of the API state the monitor verified with.
struct CliRepairer {
    args: Vec<String>,
    global: GlobalArgs,
    /// The monitor's node facts, its node named.
    facts: NodeFactArgs,
}

impl CliRepairer {
    /// Writes the API state and configuration where the repair reads them (0600 files in a
    /// directory of this process under the temporary directory).
    fn inputs(&self, view: &ApiView) -> Result<(PathBuf, Option<PathBuf>), String> {
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir().join(format!("kproxy-monitor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let write = |name: &str, text: &str| -> Result<PathBuf, String> {
            let p = dir.join(name);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&p)
                .map_err(|e| format!("{}: {e}", p.display()))?;
            std::io::Write::write_all(&mut f, text.as_bytes())
                .map_err(|e| format!("{}: {e}", p.display()))?;
            Ok(p)
        };
        let list = state_list(&view.state).map_err(|e| e.to_string())?;
        let state = write("state.json", &list.to_string())?;
        let config = match &view.config_text {
            Some((text, _)) => Some(write("config.yaml", text)?),
            None => None,
        };
        Ok((state, config))
    }
}

impl Repairer for CliRepairer {
    fn repair(&self, view: &ApiView) -> Result<String, String> {
        let (state, config) = self.inputs(view)?;
        let mut argv = self.args.clone();
        argv.extend(["--state".into(), state.display().to_string()]);
        if let Some(c) = config {
            argv.extend(["--config".into(), c.display().to_string()]);
        }
        let cli = <super::Cli as clap::Parser>::try_parse_from(&argv).map_err(|e| e.to_string())?;
        let super::Command::Repair(mut repair) = cli.command else {
            return Err("not a repair command line".into());
        };
        repair.facts = self.facts.clone();
        match super::repair::run(repair, &self.global) {
            Ok(Outcome::Clean) => Ok("repair --local --apply: applied and verified".into()),
            Ok(other) => Err(format!("repair --local --apply ended with {other:?}")),
            Err(e) => Err(super::common::error_text(&e)),
        }
    }
}

/// `state` as the `List` the repair it runs reads: every object, with those loading left out
/// as invalid as they were given, so that the repair leaves them out again and keeps their
/// Services' rules as they are.
fn state_list(s: &crate::state::ClusterState) -> serde_json::Result<serde_json::Value> {
    let items: Vec<serde_json::Value> = s
        .services
        .iter()
        .map(serde_json::to_value)
        .chain(s.endpoint_slices.iter().map(serde_json::to_value))
        .chain(s.nodes.iter().map(serde_json::to_value))
        .chain(s.service_cidrs.iter().map(serde_json::to_value))
        .chain(s.invalid.iter().map(|o| Ok(o.object.clone())))
        .collect::<Result<_, _>>()?;
    Ok(serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_repairs_state_keeps_the_objects_left_out() {
        let service = |name: &str, label: &str| {
            serde_json::json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"namespace": "shop", "name": name, "labels": {label: "x"}},
                "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]}})
        };
        let doc = serde_json::json!({"apiVersion": "v1", "kind": "List",
            "items": [service("web", "bad label!"), service("api", "app")]});
        let state = crate::state::load::from_str(&doc.to_string(), "state").expect("state");
        assert_eq!(state.invalid.len(), 1);
        let list = state_list(&state).expect("list");
        let again = crate::state::load::from_str(&list.to_string(), "list").expect("again");
        assert_eq!(again.invalid, state.invalid);
        assert_eq!(again.services.len(), state.services.len());
    }
}
