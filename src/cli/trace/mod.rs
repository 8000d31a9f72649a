//! `trace` command.
//!
//! * `trace --packet 'SRC[:SPORT]->DST:PORT/PROTO'` simulates one packet through a node's rules
//!   ([`crate::trace::sim`]): `--model kernel` (default) or `--model kube-proxy-test`.
//! * `trace svc/NAME` shows a service's path view ([`crate::trace::path`]), compared with what the
//!   API implies when `--state` is given.
//!
//! Nodes in the other modes: [`ipvs`] (`--ipvsadm`) and [`nftables`] (`--nft-ruleset`).

pub mod ipvs;
pub mod nftables;

use super::common::{DumpArgs, GlobalArgs, NodeFactArgs, StateArgs, parse_iptables, read_iptables};
use crate::collect::files::DumpText;
use crate::exit::Outcome;
use crate::graph::{self, GraphOptions};
use crate::model::Ruleset;
use crate::output::color::Painter;
use crate::output::trace_path::{self, PathFormat};
use crate::proxier::iptables::ServiceDecisions;
use crate::state::{config, load};
use crate::trace::path::{self, ServiceSelector};
use crate::trace::sim::{self, KernelInput, LocalAddrs, Origin, PacketSpec, report};
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;

/// Where the traced packet comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FromArg {
    /// A pod on this node (enters through PREROUTING).
    Pod,
    /// The node itself (enters through OUTPUT).
    Node,
    /// A host outside the node (enters through PREROUTING).
    External,
}

/// Which walk to simulate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModelArg {
    /// What netfilter does with the first packet of a new connection.
    Kernel,
    /// kube-proxy's unit-test tracer (prints `{"output", "masq"}` as its tests compare it).
    KubeProxyTest,
}

/// Output format of `trace`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TraceOutput {
    /// Human-readable (`--packet`: outcomes and paths; path view: the tree).
    Text,
    /// Path view: an indented tree.
    Tree,
    /// Path view: one row per entry point and endpoint.
    Table,
    /// JSON.
    Json,
    /// YAML (the JSON document's content).
    Yaml,
    /// Path view: Graphviz DOT.
    Dot,
}

/// Arguments of `trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {
    /// The service of the path view: svc/NAME (with -n), NAMESPACE/NAME or NAME. Not with --packet.
    #[arg(value_name = "SERVICE", conflicts_with = "packet")]
    pub service: Option<String>,
    /// Path view: only this service port (name or number).
    #[arg(hide_short_help = true, long, requires = "service")]
    pub port: Option<String>,
    /// Simulate one packet (syntax in the help text: source, destination, port, protocol).
    #[arg(
        long,
        value_name = "SRC[:SPORT]->DST:PORT/PROTO",
        help = "Simulate one packet: SRC[:SPORT]->DST:PORT[/PROTO] (IPv6 as [ADDR]:PORT; PROTO tcp|udp|sctp, default tcp)"
    )]
    pub packet: Option<String>,
    /// Where the packet comes from.
    ///
    /// Default: node if SRC is one of the node's addresses, else pod.
    #[arg(long, value_enum)]
    pub from: Option<FromArg>,
    /// A node address (repeatable).
    ///
    /// It decides `addrtype LOCAL`, routing (local vs forwarded) and the MASQUERADE
    /// source. The kernel model adds every loopback address and --node-ip; the kube-proxy-test
    /// model uses exactly this list (kube-proxy's tests pass 127.0.0.1, ::1 and the node IPs).
    #[arg(long = "local-ip", value_name = "IP")]
    pub local_ips: Vec<IpAddr>,
    /// The simulation model.
    #[arg(hide_short_help = true, long, value_enum, default_value_t = ModelArg::Kernel)]
    pub model: ModelArg,
    /// The interface the packet arrives on (evaluates `-i`; undecidable otherwise).
    #[arg(hide_short_help = true, long = "in-interface", value_name = "IFACE")]
    pub in_interface: Option<String>,
    /// The interface the packet leaves by (evaluates `-o`; undecidable otherwise).
    #[arg(hide_short_help = true, long = "out-interface", value_name = "IFACE")]
    pub out_interface: Option<String>,
    /// Output format (default: text for --packet, tree for the path view).
    #[arg(short = 'o', long = "output", value_enum)]
    pub output: Option<TraceOutput>,
    /// An nftables-mode node: `nft [-j] list ruleset|table …` output or `nft -f` lines (`-` = stdin).
    #[arg(help_heading = "Node dumps (offline)", long = "nft-ruleset", value_name = "FILE", conflicts_with_all = ["iptables_save", "ip6tables_save", "iptables_legacy_save"])]
    pub nft_ruleset: Option<PathBuf>,
    /// The node's rules.
    #[command(flatten)]
    pub dump: DumpArgs,
    /// Path view: API state to compare with (divergences are marked inline).
    #[command(flatten)]
    pub state: StateArgs,
    /// Node facts (path view with --state; `--node-ip` also counts as a local address for --packet).
    #[command(flatten)]
    pub node: NodeFactArgs,
    /// Live cluster access: without --iptables-save, the node (--node) is read through the
    /// API (or from --bundle), with the API state and kube-proxy's configuration.
    #[command(flatten)]
    pub live: super::live::LiveArgs,
    /// IPVS nodes: with `--ipvsadm FILE`, trace the IPVS virtual server (`--vs`, or --packet's destination).
    #[command(flatten)]
    pub ipvs: ipvs::IpvsTraceArgs,
    /// Path view: the node's conntrack table, for the live flows per endpoint.
    #[command(flatten)]
    pub conntrack: super::conntrack::ConntrackArgs,
}

/// Runs `trace`.
pub fn run(args: TraceArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if args.live.all_nodes {
        bail!("trace works on one node (--node NODE); --all-nodes is for verify");
    }
    // Bad --packet syntax is exit 2 with the expected form, before any I/O.
    if let Some(p) = args.packet.as_deref() {
        p.parse::<PacketSpec>()?;
    }
    if args.ipvs.dumps.given() {
        let mut ipvs = args.ipvs.clone();
        ipvs.dumps.lenient = args.dump.lenient;
        let json = args.output == Some(TraceOutput::Json);
        return ipvs::run_trace(&ipvs, args.packet.as_deref(), json);
    }
    if let Some(path) = &args.nft_ruleset {
        return nftables::run(&args, path, global);
    }
    let live = live_inputs(&args, global)?;
    match args.packet.as_deref() {
        Some(packet) => run_packet(&args, packet, live.as_ref()),
        None => run_path(&args, global, live.as_ref()),
    }
}

/// Without dump files, the inputs come from a bundle or the cluster (`--node NODE`).
fn live_inputs(
    args: &TraceArgs,
    global: &GlobalArgs,
) -> anyhow::Result<Option<super::live::ResolvedInputs>> {
    if args.dump.iptables_save.is_some() || args.dump.ip6tables_save.is_some() {
        return Ok(None);
    }
    let inputs = super::live::resolve_inputs(
        global,
        &args.live,
        &args.state,
        &args.dump,
        args.node.node.as_deref(),
    )?;
    inputs
        .snapshot
        .warnings
        .iter()
        .for_each(super::common::warn);
    Ok(Some(inputs))
}

/// The dump for a family: a file (read as `graph` reads it), or the collected dump.
fn dump_text(
    args: &TraceArgs,
    live: Option<&super::live::ResolvedInputs>,
    ipv6: bool,
) -> anyhow::Result<DumpText> {
    let Some(inputs) = live else {
        let path = dump_path(&args.dump, ipv6)?;
        return read_iptables(path, args.dump.table.as_deref(), args.dump.lenient);
    };
    let snap = &inputs.snapshot;
    let (command, text) = match (ipv6, &snap.ip6tables_save, &snap.iptables_save) {
        (true, Some(t6), _) => ("ip6tables-save", t6),
        (_, _, Some(t)) => ("iptables-save", t),
        _ => bail!(
            "no iptables-save output was collected from node {:?} ({})",
            inputs.node,
            snap.collector
        ),
    };
    Ok(DumpText {
        name: format!("{command} ({})", snap.collector),
        text: text.clone(),
        ..DumpText::default()
    })
}

/// The dump to read for a packet/family: `--ip6tables-save` for IPv6 when given, else `--iptables-save`.
fn dump_path(dump: &DumpArgs, ipv6: bool) -> anyhow::Result<&PathBuf> {
    if dump.iptables_legacy_save.is_some() {
        bail!(
            "trace: --iptables-legacy-save is not supported; trace one backend's dump with --iptables-save"
        );
    }
    match (ipv6, &dump.ip6tables_save, &dump.iptables_save) {
        (true, Some(p6), _) => Ok(p6),
        (_, _, Some(p)) => Ok(p),
        _ => bail!(
            "trace needs the node's rules: --iptables-save FILE (or --ip6tables-save FILE for IPv6)"
        ),
    }
}

fn run_packet(
    args: &TraceArgs,
    packet_text: &str,
    live: Option<&super::live::ResolvedInputs>,
) -> anyhow::Result<Outcome> {
    let packet: PacketSpec = packet_text.parse()?;
    let input = dump_text(args, live, packet.dst.is_ipv6())?;
    let mut dump = parse_iptables(&input, args.dump.table.as_deref(), args.dump.lenient)?;
    // A paste without built-in chains is walked from kube-proxy's chains, and stdout says so.
    let assumed = crate::trace::sim::iptables::partial::assumptions(&dump);
    if !assumed.restore_text.is_empty() {
        let jumps = crate::parsers::iptables::parse_dump(
            &assumed.restore_text,
            &crate::parsers::iptables::ParseOptions::strict(),
        )?;
        dump.tables.extend(jumps.tables);
    }
    let rules = Ruleset::from_dump(dump);
    let format = packet_format(args)?;
    // The walk's document or its text (each made only when printed), with what the walk
    // assumed of a partial input.
    let print = |json: &dyn Fn() -> serde_json::Value,
                 text: &dyn Fn() -> String|
     -> anyhow::Result<String> {
        Ok(
            match packet_document(format, &|| with_assumptions(json(), &assumed))? {
                Some(doc) => doc,
                None if assumed.is_empty() => text(),
                None => assumptions_text(&assumed) + &text(),
            },
        )
    };
    let out = match args.model {
        ModelArg::KubeProxyTest => {
            let local = LocalAddrs::exact(args.local_ips.clone());
            let t = sim::iptables::kptest::trace(&rules, &packet, &local)?;
            print(&|| report::test_trace_json(&t), &|| {
                report::test_trace_text(&t)
            })?
        }
        ModelArg::Kernel => {
            let input = kernel_input(args, packet);
            let d = sim::iptables::kernel::simulate(&rules, &input)?;
            print(&|| report::distribution_json(&d), &|| {
                report::distribution_text(&d)
            })?
        }
    };
    super::common::write_stdout(&out).context("writing output")?;
    Ok(Outcome::Clean)
}

/// `--packet`'s output format: text (the default), json or yaml; the path view's other formats
/// are refused.
pub(super) fn packet_format(args: &TraceArgs) -> anyhow::Result<TraceOutput> {
    let format = args.output.unwrap_or(TraceOutput::Text);
    if !matches!(
        format,
        TraceOutput::Json | TraceOutput::Yaml | TraceOutput::Text
    ) {
        bail!("trace --packet prints text, json or yaml, not {format:?}");
    }
    Ok(format)
}

/// A walk's structured document in `format`, or `None` for text: `value` is made only when
/// asked for (a long walk's JSON value is as large as its text).
pub(super) fn packet_document(
    format: TraceOutput,
    value: &dyn Fn() -> serde_json::Value,
) -> anyhow::Result<Option<String>> {
    Ok(match format {
        TraceOutput::Json => Some(crate::output::to_json(&value())?),
        TraceOutput::Yaml => Some(crate::output::to_yaml(&value())?),
        _ => None,
    })
}

/// The document of a walk with what it assumed of a partial input (`partial`: `gaps`,
/// `entry_jumps`), when it did.
fn with_assumptions(
    mut value: serde_json::Value,
    assumed: &crate::trace::sim::iptables::partial::Assumptions,
) -> serde_json::Value {
    if !assumed.is_empty()
        && let Some(map) = value.as_object_mut()
    {
        map.insert(
            "partial".to_string(),
            serde_json::json!({"gaps": assumed.gaps, "entry_jumps": assumed.entry_jumps}),
        );
    }
    value
}

/// The lines that open a walk's text when its input is partial: its outcomes hold for the
/// rules the input has, entered as the lines say.
fn assumptions_text(assumed: &crate::trace::sim::iptables::partial::Assumptions) -> String {
    let mut out = String::from(
        "partial input: the outcomes below are those of the rules it holds; rules it left out may change them\n",
    );
    for gap in &assumed.gaps {
        out.push_str(&format!("  - {gap}\n"));
    }
    if !assumed.entry_jumps.is_empty() {
        out.push_str(&format!(
            "  - it has no built-in chains: the walk enters kube-proxy's chains by the jumps kube-proxy installs ({})\n",
            assumed.entry_jumps.join(", ")
        ));
    }
    out.push('\n');
    out
}

/// What the kernel model needs besides the rules: the packet, where it comes from (default:
/// the node if its source is a node address, else a pod), the node's addresses (`--local-ip`
/// and `--node-ip`, loopback always) and the interfaces given.
pub(super) fn kernel_input(args: &TraceArgs, packet: PacketSpec) -> KernelInput {
    let mut ips = args.local_ips.clone();
    for &ip in &args.node.node_ips {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    let local = LocalAddrs::kernel(ips);
    let origin = match args.from {
        Some(FromArg::Pod) => Origin::Pod,
        Some(FromArg::Node) => Origin::Node,
        Some(FromArg::External) => Origin::External,
        None if local.contains(packet.src) => Origin::Node,
        None => Origin::Pod,
    };
    KernelInput {
        packet,
        origin,
        local,
        in_iface: args.in_interface.clone(),
        out_iface: args.out_interface.clone(),
    }
}

/// kube-proxy's plan for the API state ([`crate::pipeline::trace::plan`]), when `--state` is
/// given or the inputs were read live. Live, the node's kube-proxy image says which release's
/// decisions to explain.
pub(super) fn decisions_of(
    args: &TraceArgs,
    live: Option<&super::live::ResolvedInputs>,
) -> anyhow::Result<Option<(ServiceDecisions, String)>> {
    let loaded;
    let (state, (cfg, warnings)) = match live {
        Some(inputs) => {
            let cfg = match &inputs.config_text {
                Some((text, source)) => config::parse(text, source)
                    .with_context(|| format!("loading the kube-proxy configuration ({source})"))?,
                None => (config::ProxyConfig::default(), Vec::new()),
            };
            (&*inputs.state, cfg)
        }
        None if args.state.state.is_empty() => return Ok(None),
        None => {
            loaded = load::from_files(&args.state.state).context("loading --state")?;
            let cfg = super::common::load_config(args.state.config.as_deref())?;
            (&loaded, cfg)
        }
    };
    super::common::print_warnings(&warnings);
    // Objects the API server would reject are not in the plan the path is compared with.
    super::common::print_warnings(&state.invalid_warnings());
    let mut given = args.node.inputs();
    if let Some(inputs) = live.filter(|i| given.node.is_none() && !i.node.is_empty()) {
        given.node = Some(inputs.node.clone());
    }
    let image = live.and_then(|i| i.snapshot.kube_proxy_image.as_deref());
    let mut notes = Vec::new();
    let plan = crate::pipeline::trace::plan(state, &cfg, &given, image, &mut notes);
    super::common::print_job_notes(&notes, true);
    let plan = plan?;
    Ok(Some((plan.decisions, plan.node)))
}

fn run_path(
    args: &TraceArgs,
    global: &GlobalArgs,
    live: Option<&super::live::ResolvedInputs>,
) -> anyhow::Result<Outcome> {
    let Some(service) = args.service.as_deref() else {
        bail!(
            "trace needs a service (trace svc/NAME --iptables-save FILE) or a packet (--packet 'SRC[:SPORT]->DST:PORT/PROTO')"
        );
    };
    let selector =
        ServiceSelector::parse(service, global.namespace.as_deref(), args.port.as_deref())?;
    let plan = decisions_of(args, live)?;
    let family_v6 = plan
        .as_ref()
        .is_some_and(|(p, _)| p.family == crate::state::ip::IpFamily::V6);
    let input = dump_text(args, live, family_v6)?;
    let opts = GraphOptions {
        source: Some(input.name.clone()),
        // Without the API state, names the selector stands for find chains by their hash.
        resolver: plan
            .as_ref()
            .map_or_else(|| selector.resolver(), |(p, _)| path::resolver_for(p)),
        ..GraphOptions::default()
    };
    let dump = parse_iptables(&input, args.dump.table.as_deref(), args.dump.lenient)?;
    let graph = graph::iptables::from_dump(dump, &opts);
    let view = path::build(&graph, &selector, plan.as_ref().map(|(p, _)| p))?
        .with_node(plan.as_ref().map(|(_, n)| n.clone()));
    print_path_view(args, global, view)
}

/// Annotates (`--conntrack`) and prints a path view; exit status drift when it diverges from
/// the plan.
pub(super) fn print_path_view(
    args: &TraceArgs,
    global: &GlobalArgs,
    mut view: path::PathView,
) -> anyhow::Result<Outcome> {
    let format = match args.output.unwrap_or(TraceOutput::Tree) {
        TraceOutput::Text | TraceOutput::Tree => PathFormat::Tree,
        TraceOutput::Table => PathFormat::Table,
        TraceOutput::Json => PathFormat::Json,
        TraceOutput::Yaml => PathFormat::Yaml,
        TraceOutput::Dot => PathFormat::Dot,
    };
    super::conntrack::annotate_path(&args.conntrack, args.dump.lenient, &mut view)?;
    let out = trace_path::render(&view, format, Painter::for_stdout(), global.no_headers)?;
    let mut stdout = anstream::stdout();
    stdout.write_all(out.as_bytes()).context("writing output")?;
    if !out.ends_with('\n') {
        writeln!(stdout).context("writing output")?;
    }
    // A path this build could not read was not checked.
    Ok(if view.unknown_layout() {
        Outcome::Error
    } else if view.divergence_count > 0 {
        Outcome::Drift
    } else {
        Outcome::Clean
    })
}
