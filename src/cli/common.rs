//! Flag groups shared by several commands, defined once.

use clap::Args;
use std::path::PathBuf;

/// Flags accepted by every command (kubectl's global flags; kubectl rejects them before a plugin name).
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, env = "KUBECONFIG", hide_env_values = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig cluster to use.
    #[arg(long, global = true)]
    pub cluster: Option<String>,
    /// The kubeconfig user to use.
    #[arg(long, global = true)]
    pub user: Option<String>,
    /// Namespace (default: the context's namespace).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// All namespaces.
    #[arg(short = 'A', long, global = true)]
    pub all_namespaces: bool,
    /// Timeout of a single API request, e.g. 30s, 1m (0 = none).
    #[arg(long, global = true, default_value = "0")]
    pub request_timeout: String,
    /// Omit table headers.
    #[arg(long, global = true)]
    pub no_headers: bool,
    /// Log verbosity (0-9, as kubectl's -v).
    #[arg(short = 'v', long = "v", global = true, default_value_t = 0)]
    pub verbosity: u8,
}

/// The node facts kube-proxy learns at start-up, as flags (shared by render, verify, trace, repair).
#[derive(Debug, Clone, Default, Args)]
pub struct NodeFactArgs {
    /// Node name (default: the config's hostnameOverride).
    #[arg(long)]
    pub node: Option<String>,
    /// A node IP (repeatable; the first of each family is the primary; default: the Node object's addresses).
    #[arg(long = "node-ip", value_name = "IP")]
    pub node_ips: Vec<String>,
    /// IP family to render: 4, 6, or auto (the family of the cluster's service IPs when they
    /// are all of one family, else 4).
    #[arg(long = "ip-family", value_parser = ["auto", "4", "6"], default_value = "auto")]
    pub ip_family: String,
    /// Whether the node's iptables supports --random-fully.
    #[arg(long = "random-fully", default_value = "true", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub random_fully: bool,
    /// The nfacct counters present (comma-separated) or `none` (default: both of kube-proxy's).
    #[arg(long, value_name = "COUNTERS|none")]
    pub nfacct: Option<String>,
    /// Whether net.netfilter.nf_conntrack_tcp_be_liberal is set on the node.
    #[arg(long = "tcp-be-liberal", default_value = "false", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub tcp_be_liberal: bool,
    /// Override the masquerade mark text (default: as kube-proxy formats masqueradeBit).
    #[arg(long = "masquerade-mark", value_name = "STR")]
    pub masquerade_mark: Option<String>,
    /// The kube-proxy release whose rules to expect, 1.20 … 1.35, e.g. `1.28`, `v1.28.4` or
    /// `registry.k8s.io/kube-proxy:v1.28.4` (default: the node's kube-proxy image when read
    /// through the API, else inferred from the dump (verify, repair), else the newest).
    #[arg(long = "kube-proxy-version", value_name = "X.Y", value_parser = crate::proxier::version::KubeProxyVersion::parse)]
    pub kube_proxy_version: Option<crate::proxier::version::KubeProxyVersion>,
}

/// API state and kube-proxy configuration inputs (offline form).
#[derive(Debug, Clone, Default, Args)]
pub struct StateArgs {
    /// `kubectl get services,endpointslices,nodes -A -o json|yaml` output (repeatable; `-` = stdin).
    #[arg(long = "state", value_name = "FILE")]
    pub state: Vec<PathBuf>,
    /// KubeProxyConfiguration YAML, or the kube-proxy ConfigMap holding one in `config.conf`.
    #[arg(long = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Node dump inputs (offline form).
#[derive(Debug, Clone, Default, Args)]
pub struct DumpArgs {
    /// `iptables-save` output (`-` = stdin).
    #[arg(long = "iptables-save", value_name = "FILE")]
    pub iptables_save: Option<PathBuf>,
    /// `ip6tables-save` output.
    #[arg(long = "ip6tables-save", value_name = "FILE")]
    pub ip6tables_save: Option<PathBuf>,
    /// `iptables-legacy-save` output (the other backend).
    #[arg(long = "iptables-legacy-save", value_name = "FILE")]
    pub iptables_legacy_save: Option<PathBuf>,
    /// Skip lines that are not rules (shell prompts, pasted tables), one warning each.
    #[arg(long)]
    pub lenient: bool,
}

/// Sets up `tracing` on stderr from `-v`.
pub fn init_logging(verbosity: u8) {
    let level = match verbosity {
        // kube-client logs every failed request at ERROR; kproxy reports them itself (once).
        0 => "warn,kube_client=off",
        1..=3 => "info",
        4..=5 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("KPROXY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}

/// Prints an error with its cause chain to stderr, kubectl style.
pub fn print_error(e: &anyhow::Error) {
    use std::io::Write;
    let mut err = anstream::stderr();
    let _ = write!(err, "error: {e}");
    for cause in e.chain().skip(1) {
        let _ = write!(err, ": {cause}");
    }
    let _ = writeln!(err);
}

/// Reads a file, or stdin for `-`, with the path in the error.
pub fn read_input(path: &std::path::Path) -> anyhow::Result<String> {
    use anyhow::Context;
    if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).context("reading stdin")?;
        Ok(s)
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }
}

/// The inputs of the proxier emulation, loaded from the offline flags.
#[derive(Debug)]
pub struct ProxyInputs {
    /// Services, EndpointSlices, Nodes.
    pub state: crate::state::ClusterState,
    /// kube-proxy's configuration (defaults when `--config` is absent).
    pub config: crate::state::config::ProxyConfig,
    /// The node facts.
    pub facts: crate::state::node::NodeFacts,
}

/// Loads `--state`, `--config` and the node facts (with `node` overriding `--node`), logging the
/// warnings (skipped objects, unknown config fields) on stderr. The one loader every command uses.
pub fn load_proxy_inputs(
    state: &StateArgs,
    facts: &NodeFactArgs,
    node: Option<&str>,
) -> anyhow::Result<ProxyInputs> {
    use anyhow::Context;
    if state.state.is_empty() {
        anyhow::bail!(
            "the API state is needed: --state FILE (kubectl get services,endpointslices,nodes -A -o json)"
        );
    }
    let cluster = crate::state::load::from_files(&state.state).context("reading --state")?;
    let (config, warnings) = load_config(state.config.as_deref())?;
    print_warnings(&warnings);
    let mut fact_args = facts.clone();
    if let Some(n) = node {
        fact_args.node = Some(n.to_string());
    }
    let (facts, warnings) =
        crate::state::node::build(&fact_args, &cluster, &config).context("node facts")?;
    for w in warnings {
        tracing::warn!("{w}");
    }
    Ok(ProxyInputs {
        state: cluster,
        config,
        facts,
    })
}

/// Loads `--config` (a KubeProxyConfiguration, or the kube-proxy ConfigMap holding one; `-` =
/// stdin); kube-proxy's defaults when no file is given. Returns the configuration and its warnings
/// (unknown fields). The one config loader of every command.
pub fn load_config(
    path: Option<&std::path::Path>,
) -> anyhow::Result<(
    crate::state::config::ProxyConfig,
    Vec<crate::state::Warning>,
)> {
    use anyhow::Context;
    let Some(path) = path else {
        return Ok((crate::state::config::ProxyConfig::default(), Vec::new()));
    };
    let (text, name) = crate::state::load::read_source(path).context("loading --config")?;
    crate::state::config::parse(&text, &name).context("loading --config")
}

/// Whether `--nfacct` says the node has the nfacct counter `name`.
pub fn says_counter(facts: &NodeFactArgs, name: &str) -> bool {
    facts
        .nfacct
        .as_deref()
        .is_some_and(|list| list.split(',').any(|c| c.trim() == name))
}

/// Prints notes on stderr as `note: …`, one per line.
pub fn print_notes(notes: &[String]) {
    use std::io::Write;
    let mut err = anstream::stderr();
    for n in notes {
        let _ = writeln!(err, "note: {n}");
    }
}

/// Prints warnings on stderr as `warning: …`, one per line.
pub fn print_warnings(warnings: &[crate::state::Warning]) {
    use std::io::Write;
    let mut err = anstream::stderr();
    for w in warnings {
        let _ = writeln!(err, "warning: {w}");
    }
}
