//! Flag groups shared by several commands, defined once.

use crate::apply::iptables::host::Backend;
use crate::collect::ipvs_dumps::IpvsTexts;
use clap::Args;
use std::path::PathBuf;

/// Flags accepted by every command (kubectl's global flags; kubectl rejects them before a plugin name).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Kubernetes connection")]
pub struct GlobalArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, env = "KUBECONFIG", hide_env_values = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// The kubeconfig cluster to use.
    #[arg(hide_short_help = true, long, global = true)]
    pub cluster: Option<String>,
    /// The kubeconfig user to use.
    #[arg(hide_short_help = true, long, global = true)]
    pub user: Option<String>,
    /// Namespace (default: the context's namespace).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// All namespaces.
    #[arg(hide_short_help = true, short = 'A', long, global = true)]
    pub all_namespaces: bool,
    /// Timeout of a single API request, e.g. 30s, 1m (0 = none).
    #[arg(hide_short_help = true, long, global = true, default_value = "0", value_parser = parse_request_timeout)]
    pub request_timeout: String,
    /// Omit table headers.
    #[arg(hide_short_help = true, long, global = true)]
    pub no_headers: bool,
    /// Log verbosity (0-9, as kubectl's -v).
    #[arg(
        hide_short_help = true,
        short = 'v',
        long = "v",
        global = true,
        default_value_t = 0
    )]
    pub verbosity: u8,
}

impl GlobalArgs {
    /// How to reach the API server, as the client takes it.
    pub fn client_options(&self) -> crate::kube_client::ClientOptions {
        crate::kube_client::ClientOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
            cluster: self.cluster.clone(),
            user: self.user.clone(),
            request_timeout: self.request_timeout.clone(),
            ..Default::default()
        }
    }
}

/// Limits on every input a command reads: files, stdin, FIFOs, bundles, and what the
/// collectors' commands print on the node ([`crate::parsers::input`]).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Input limits")]
pub struct InputArgs {
    /// The most one input may hold (a file, stdin, a bundle unpacked, a command's output).
    #[arg(
        hide_short_help = true,
        long,
        global = true,
        value_name = "SIZE",
        default_value = "1Gi",
        value_parser = crate::parsers::input::parse_size
    )]
    pub max_input_size: u64,
    /// The longest wait for the next bytes of stdin, a FIFO or a pipe (0 = no limit).
    #[arg(
        hide_short_help = true,
        long,
        global = true,
        value_name = "DURATION",
        default_value = "2m",
        value_parser = parse_read_timeout
    )]
    pub read_timeout: ReadTimeout,
}

/// `--read-timeout`: a wait, or none.
#[derive(Debug, Clone, Copy)]
pub struct ReadTimeout(pub Option<std::time::Duration>);

/// `--read-timeout`: read as `--request-timeout` is (`0`, seconds, or `500ms`, `30s`, `1m`).
fn parse_read_timeout(s: &str) -> Result<ReadTimeout, String> {
    crate::kube_client::parse_duration(s)
        .map(ReadTimeout)
        .map_err(|_| format!("{s:?} is not a duration such as 500ms, 30s, 5m or 0"))
}

impl InputArgs {
    /// The limits, as the readers take them.
    pub fn limits(&self) -> crate::parsers::input::Limits {
        crate::parsers::input::Limits {
            max_size: self.max_input_size,
            idle: self.read_timeout.0,
        }
    }
}

/// The node facts kube-proxy learns at start-up, as flags (shared by render, verify, trace, repair).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Node facts")]
pub struct NodeFactArgs {
    /// Node name (default: the config's hostnameOverride).
    #[arg(long)]
    pub node: Option<String>,
    /// A node IP (repeatable; the first of each family is the primary; default: the Node object's addresses).
    #[arg(long = "node-ip", value_name = "IP", value_parser = parse_node_ip)]
    pub node_ips: Vec<std::net::IpAddr>,
    /// IP family to render: 4, 6, or auto (the family of the cluster's service IPs when they
    /// are all of one family, else 4).
    #[arg(hide_short_help = true, long = "ip-family", value_parser = ["auto", "4", "6"], default_value = "auto")]
    pub ip_family: String,
    /// Whether the node's iptables supports --random-fully.
    #[arg(hide_short_help = true, long = "random-fully", default_value = "true", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub random_fully: bool,
    /// The nfacct counters present (comma-separated) or `none` (default: both of kube-proxy's).
    #[arg(hide_short_help = true, long, value_name = "COUNTERS|none")]
    pub nfacct: Option<String>,
    /// Whether net.netfilter.nf_conntrack_tcp_be_liberal is set on the node.
    #[arg(hide_short_help = true, long = "tcp-be-liberal", default_value = "false", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub tcp_be_liberal: bool,
    /// Override the masquerade mark (hex such as 0x00004000, or decimal; default: as kube-proxy
    /// formats masqueradeBit).
    #[arg(hide_short_help = true, long = "masquerade-mark", value_name = "MARK", value_parser = parse_mark)]
    pub masquerade_mark: Option<String>,
    /// The kube-proxy release whose rules to expect, 1.20 … 1.38 (`1.28`, `v1.36.2`, an image);
    /// default: the kube-proxy pod's image, else inferred from the dump (verify, repair), else
    /// 1.35. A newer release is refused.
    #[arg(hide_short_help = true, long = "kube-proxy-version", value_name = "X.Y", value_parser = crate::state::version::KubeProxyVersion::parse)]
    pub kube_proxy_version: Option<crate::state::version::KubeProxyVersion>,
    /// Feature gates, as kube-proxy's --feature-gates (`Name=true,Name=false`); they win over
    /// the configuration's featureGates (those that change rules: docs/versions.md).
    #[arg(hide_short_help = true, long = "feature-gates", value_name = "NAME=BOOL,…", value_parser = crate::state::config::parse_feature_gates)]
    pub feature_gates: Option<std::collections::BTreeMap<String, bool>>,
    /// The node is not one of the state's Nodes: its facts come from --node-ip (without this,
    /// a node the state does not list is an error).
    #[arg(
        hide_short_help = true,
        long = "node-not-in-state",
        requires = "node_ips"
    )]
    pub node_not_in_state: bool,
}

impl NodeFactArgs {
    /// The node facts the flags give, as the domain takes them.
    pub fn inputs(&self) -> crate::state::node::NodeInputs {
        use crate::state::ip::IpFamily;
        crate::state::node::NodeInputs {
            node: self.node.clone(),
            node_ips: self.node_ips.clone(),
            family: match self.ip_family.as_str() {
                "4" => Some(IpFamily::V4),
                "6" => Some(IpFamily::V6),
                _ => None,
            },
            random_fully: self.random_fully,
            nfacct: self.nfacct.as_deref().map(|list| {
                list.split(',')
                    .map(str::trim)
                    .filter(|c| !c.is_empty() && *c != "none")
                    .map(str::to_string)
                    .collect()
            }),
            tcp_be_liberal: self.tcp_be_liberal,
            masquerade_mark: self.masquerade_mark.clone(),
            not_in_state: self.node_not_in_state,
            kube_proxy_version: self.kube_proxy_version,
            feature_gates: self.feature_gates.clone().unwrap_or_default(),
        }
    }
}

/// `--request-timeout`: checked as kubectl checks it (`0`, seconds, or `500ms`, `30s`, `1m`,
/// `1h`), kept as text for the client.
fn parse_request_timeout(s: &str) -> Result<String, String> {
    crate::kube_client::parse_duration(s)
        .map(|_| s.to_string())
        .map_err(|e| e.to_string())
}

/// `--node-ip`: an IPv4 or IPv6 address (leading zeros allowed, as kube-proxy reads node IPs).
fn parse_node_ip(s: &str) -> Result<std::net::IpAddr, String> {
    crate::state::ip::parse_ip_sloppy(s.trim()).ok_or_else(|| format!("{s:?} is not an IP address"))
}

/// `--masquerade-mark`: a 32-bit mark, `0x` hex or decimal, kept as written (rules print it so).
fn parse_mark(s: &str) -> Result<String, String> {
    let t = s.trim();
    let value = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => t.parse::<u32>().ok(),
    };
    match value {
        Some(v) if v != 0 => Ok(t.to_string()),
        _ => Err(format!(
            "{s:?} is not a mark: a non-zero 32-bit value, hex (0x00004000) or decimal (16384)"
        )),
    }
}

/// API state and kube-proxy configuration inputs (offline form).
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "API state (offline)")]
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
#[command(next_help_heading = "Node dumps (offline)")]
pub struct DumpArgs {
    /// `iptables-save` output (`-` = stdin).
    #[arg(long = "iptables-save", value_name = "FILE")]
    pub iptables_save: Option<PathBuf>,
    /// `ip6tables-save` output.
    #[arg(hide_short_help = true, long = "ip6tables-save", value_name = "FILE")]
    pub ip6tables_save: Option<PathBuf>,
    /// `iptables-legacy-save` output (the other backend).
    #[arg(
        hide_short_help = true,
        long = "iptables-legacy-save",
        value_name = "FILE"
    )]
    pub iptables_legacy_save: Option<PathBuf>,
    /// Read pastes and partial inputs, with a warning for each thing done.
    ///
    /// Strips prompts, fences, log and diff prefixes, JSON escapes; skips lines that are not
    /// rules; reads cut inputs (marked) and `iptables -L` listings (docs/testing.md).
    #[arg(long)]
    pub lenient: bool,
    /// The table of `iptables -S` input, which names none (default: inferred from its chains,
    /// e.g. `-P PREROUTING` or DNAT rules → nat).
    #[arg(hide_short_help = true, long, value_parser = ["nat", "filter", "mangle", "raw", "security"])]
    pub table: Option<String>,
}

/// Reads one iptables input file for `graph` and `trace` (see
/// [`crate::collect::files::read_dump`]), prints what reading it did, and refuses an empty one.
/// Under `--lenient`, an `iptables -L` listing is read back into `iptables -S` text of its table
/// (`table` when given, else inferred), with warnings that say how it is lossy.
pub fn read_iptables(
    path: &std::path::Path,
    table: Option<&str>,
    lenient: bool,
) -> anyhow::Result<crate::collect::files::DumpText> {
    use crate::parsers::iptables::listing;
    let mut dump = crate::collect::files::read_dump(path, lenient)?;
    dump.warnings.iter().for_each(warn);
    if dump.text.trim().is_empty() {
        anyhow::bail!(
            "{} is empty: there are no rules to read (was the command's output saved?)",
            dump.name
        );
    }
    if lenient && listing::looks_like_listing(&dump.text).is_some() {
        let read = listing::read_listing(&dump.text, table);
        for note in &read.notes {
            warn(format!("{}: {note}", dump.name));
        }
        dump.text = read.text;
        dump.table = Some(read.table.to_string());
    }
    Ok(dump)
}

/// Parses an iptables input read by [`read_iptables`] (or collected from a node), the one way
/// `graph` and `trace` read rules: the table of `-S` text is `table`, else the one its paste's
/// command named (`iptables -t nat -S`), else inferred; skipped lines, the inferred table and
/// signs of a cut or filtered input are printed as warnings.
pub fn parse_iptables<'a>(
    input: &'a crate::collect::files::DumpText,
    table: Option<&str>,
    lenient: bool,
) -> anyhow::Result<crate::parsers::iptables::Dump<'a>> {
    use crate::parsers::iptables::{ParseOptions, parse_dump};
    let mut opts = if lenient {
        ParseOptions::lenient()
    } else {
        ParseOptions::strict()
    };
    let named = table
        .or(input.table.as_deref())
        .or_else(|| input.commands.iter().find_map(|c| c.table()));
    if let Some(t) = named {
        opts = opts.with_table(t);
    }
    let mut dump = parse_dump(&input.text, &opts).map_err(|e| e.in_source(input.name.clone()))?;
    dump.gaps.extend(
        input
            .cuts
            .iter()
            .map(|&line| crate::parsers::iptables::Gap::Cut { line }),
    );
    let name = &input.name;
    for s in &dump.skipped {
        warn(format!("{name}:{}: skipped: {}", s.line, s.reason));
    }
    if let Some(t) = dump.inferred_table {
        warn(format!(
            "{name}: no table named (`iptables -S` text): read as table {t}, inferred from its chains (--table to choose)"
        ));
    }
    for gap in &dump.gaps {
        warn(format!("{name}: {gap}"));
    }
    if !dump.gaps.is_empty() {
        warn(format!(
            "{name}: the input is partial: chains whose callers may be missing are not reported as stale"
        ));
    }
    Ok(dump)
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
        .with_ansi(crate::output::color::stderr_enabled())
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}

/// Prints one warning on stderr as `warning: …`: the one form of every command's warnings
/// (coloured only on a terminal, never with `NO_COLOR`).
pub fn warn(message: impl std::fmt::Display) {
    use crate::output::color::{Painter, Role};
    use std::io::Write;
    let label = Painter::for_stderr().paint(Role::Warn, "warning");
    let _ = writeln!(std::io::stderr().lock(), "{label}: {message}");
}

/// Prints an error with its cause chain to stderr, kubectl style.
pub fn print_error(e: &anyhow::Error) {
    use crate::output::color::{Painter, Role};
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let label = Painter::for_stderr().paint(Role::Error, "error");
    let _ = writeln!(err, "{label}: {}", error_text(e));
}

/// An error and its causes as one line. Many library errors already name their cause in
/// their own message (`reading F: No such file…` with the I/O error as its source too): a
/// cause the line already says is not said again.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// Writes a command's whole output to stdout. A reader that went away (`| head`) is not an
/// error: the command's exit status still says what it found.
pub fn write_stdout(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Reads a file, or stdin for `-`, within the input limits (`--max-input-size`,
/// `--read-timeout`), with the path in the error.
pub fn read_input(path: &std::path::Path) -> anyhow::Result<String> {
    Ok(crate::parsers::input::read_text(path)?.0)
}

/// Runs a library call that collects warnings, prints them (also when the call failed, they
/// came before) and returns its result.
pub fn with_warnings<T>(call: impl FnOnce(&mut Vec<String>) -> T) -> T {
    let mut warnings = Vec::new();
    let result = call(&mut warnings);
    warnings.iter().for_each(warn);
    result
}

/// Reads a file, or stdin for `-`, as a text named by its path.
pub fn read_named(path: &std::path::Path) -> anyhow::Result<crate::pipeline::NamedText> {
    Ok(crate::pipeline::NamedText {
        text: read_input(path)?,
        label: path.display().to_string(),
    })
}

/// Loads `--state`, `--config` and the node facts (with `node` overriding `--node`), logging the
/// warnings (skipped objects, unknown config fields) on stderr. The one loader every command uses.
pub fn load_proxy_inputs(
    state: &StateArgs,
    facts: &NodeFactArgs,
    node: Option<&str>,
) -> anyhow::Result<crate::state::ProxyInputs> {
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
        crate::state::node::build(&fact_args.inputs(), &cluster, &config).context("node facts")?;
    warnings.iter().for_each(warn);
    Ok(crate::state::ProxyInputs {
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

/// Prints notes on stderr as `note: …`, one per line.
pub fn print_notes(notes: &[String]) {
    use std::io::Write;
    let mut err = anstream::stderr();
    for n in notes {
        let _ = writeln!(err, "note: {n}");
    }
}

/// Prints what a library job said along the way, in order: warnings and notes on stderr, the
/// lines skipped under `--lenient` and the mode decided in the log (`-v` shows the mode).
/// `choices`: print how the kube-proxy release was chosen (off for a fan-out over nodes, whose
/// rows say what came of it).
pub fn print_job_notes(notes: &[crate::pipeline::Note], choices: bool) {
    use crate::pipeline::Note;
    for note in notes {
        match note {
            Note::Warning(w) => warn(w),
            Note::Choice(c) if choices => print_notes(std::slice::from_ref(c)),
            Note::Choice(_) => {}
            Note::Skipped(line) => tracing::warn!("{line}"),
            Note::Mode(decision) => tracing::info!("{}", decision.note()),
            Note::Release(_) => {}
        }
    }
}

/// Prints warnings on stderr as `warning: …`, one per line.
pub fn print_warnings(warnings: &[crate::state::Warning]) {
    warnings.iter().for_each(warn);
}

/// Prints each distinct warning once, in order: the renders of two families (or two passes)
/// repeat the warnings of the state they share.
pub fn print_warnings_once<'w>(warnings: impl IntoIterator<Item = &'w crate::state::Warning>) {
    let mut seen = std::collections::HashSet::new();
    warnings
        .into_iter()
        .filter(|w| seen.insert(*w))
        .for_each(warn);
}

/// `--backend`: which iptables userspace to run ([`Backend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendArg {
    /// Whatever `iptables-save`/`iptables-restore` point to on this host.
    Auto,
    /// `iptables-nft-*`.
    Nft,
    /// `iptables-legacy-*`.
    Legacy,
}

impl From<BackendArg> for Backend {
    fn from(b: BackendArg) -> Backend {
        match b {
            BackendArg::Auto => Backend::Auto,
            BackendArg::Nft => Backend::Nft,
            BackendArg::Legacy => Backend::Legacy,
        }
    }
}

/// IPVS-mode dump flags.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "IPVS dumps (offline)")]
pub struct IpvsArgs {
    /// `ipvsadm -Ln` / `-Sn` / `-Ln --stats` / `-Lnc` output (repeatable; files may concatenate several).
    #[arg(long = "ipvsadm", value_name = "FILE")]
    pub ipvsadm: Vec<PathBuf>,
    /// `ipset save` or `ipset list` output.
    #[arg(hide_short_help = true, long = "ipset", value_name = "FILE")]
    pub ipset: Option<PathBuf>,
    /// `ip addr` / `ip -o addr` output covering `kube-ipvs0` (its addresses are compared).
    #[arg(hide_short_help = true, long = "ip-addr", value_name = "FILE")]
    pub ip_addr: Option<PathBuf>,
    /// Read pastes (the command's `--lenient`, set by the command).
    #[arg(skip)]
    pub lenient: bool,
}

impl IpvsArgs {
    /// True when any IPVS dump was given (selects the IPVS code path).
    pub fn given(&self) -> bool {
        !self.ipvsadm.is_empty()
    }
}

impl IpvsArgs {
    /// Reads the dumps the flags name ([`IpvsTexts::read`]), printing what reading them did.
    pub fn read(&self) -> anyhow::Result<IpvsTexts> {
        Ok(with_warnings(|w| {
            IpvsTexts::read(
                &self.ipvsadm,
                self.ipset.as_deref(),
                self.ip_addr.as_deref(),
                self.lenient,
                w,
            )
        })?)
    }
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[test]
    fn error_text_says_each_cause_once() {
        let io = || std::io::Error::other("No such file or directory (os error 2)");
        let said_twice = anyhow::Error::new(io())
            .context("reading /x: No such file or directory (os error 2)")
            .context("loading --state");
        assert_eq!(
            error_text(&said_twice),
            "loading --state: reading /x: No such file or directory (os error 2)"
        );
        let new_cause = anyhow::Error::new(io()).context("reading /x");
        assert_eq!(
            error_text(&new_cause),
            "reading /x: No such file or directory (os error 2)"
        );
    }
}
