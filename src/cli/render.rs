//! `render` command: what kube-proxy writes on a full sync: the iptables-restore input, the IPVS
//! state, or the nftables table.

use super::common::{GlobalArgs, NodeFactArgs, StateArgs};
use crate::exit::Outcome;
use crate::proxier::iptables::{RenderOptions, render};
use crate::state::mode::ProxyMode;
use crate::state::{config, load, node};
use anyhow::Context;
use clap::{Args, ValueEnum};
use std::io::Write;

/// `--mode`: a [`ProxyMode`] by its name, each listed in `--help` with what it is.
fn mode_parser() -> impl clap::builder::TypedValueParser<Value = ProxyMode> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(ProxyMode::ALL.map(|m| {
        PossibleValue::new(m.name()).help(match m {
            ProxyMode::Iptables => "kube-proxy's iptables mode",
            ProxyMode::Ipvs => "kube-proxy's IPVS mode",
            ProxyMode::Nftables => "kube-proxy's nftables mode",
        })
    }))
    .try_map(|name| name.parse::<ProxyMode>())
}

/// Output format of `render`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RenderFormat {
    /// iptables-restore input (nftables: `nft -f` input; IPVS: `ipvsadm -Sn`).
    Text,
    /// The same rules as structured data.
    Json,
}

/// Arguments of `render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// Proxier mode to emulate.
    #[arg(long, value_parser = mode_parser(), default_value = "iptables")]
    pub mode: ProxyMode,
    /// Also emit the built-in chains and the jump rules kube-proxy ensures in them, so the output
    /// restores on its own into a fresh network namespace.
    #[arg(long)]
    pub with_base_jumps: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    pub output: RenderFormat,

    /// API state and kube-proxy configuration.
    #[command(flatten)]
    pub state: StateArgs,
    /// Node facts.
    #[command(flatten)]
    pub node: NodeFactArgs,
}

/// Runs `render`.
pub fn run(args: RenderArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if args.state.state.is_empty() {
        anyhow::bail!(
            "render needs --state FILE (kubectl get services,endpointslices,nodes -A -o json)"
        );
    }
    let state = load::from_files(&args.state.state).context("loading --state")?;
    let (mut cfg, mut warnings) = super::common::load_config(args.state.config.as_deref())?;
    if let (_, Some(configured)) = crate::pipeline::mode::asked(args.mode, cfg.mode) {
        warnings.push(crate::state::Warning::new(
            "--config",
            format!(
                "the configuration says mode \"{configured}\"; rendering {} as --mode asks",
                args.mode
            ),
        ));
    }
    if args.mode == ProxyMode::Nftables {
        // Read the configuration as kube-proxy does in nftables mode, whatever its `mode` says.
        cfg = cfg.for_nftables();
        // The releases' nftables layouts differ: a release nobody named is said, not assumed.
        if args.node.kube_proxy_version.is_none() {
            super::common::print_notes(&[format!(
                "rendering the nftables rules of kube-proxy {} (no --kube-proxy-version given; 1.36 and later lay them out otherwise)",
                crate::state::version::KubeProxyVersion::DEFAULT
            )]);
        }
    }
    let (facts, mut node_warnings) = node::build(&args.node.inputs(), &state, &cfg)?;
    warnings.append(&mut node_warnings);
    match args.mode {
        ProxyMode::Ipvs => return render_ipvs(&args, &state, &cfg, &facts, warnings),
        ProxyMode::Nftables => return render_nftables(&args, &state, &cfg, &facts, warnings),
        ProxyMode::Iptables => {}
    }
    let rendered = render(
        &state,
        &cfg,
        &facts,
        RenderOptions {
            with_base_jumps: args.with_base_jumps,
        },
    );
    warnings.extend(rendered.warnings.iter().cloned());
    super::common::print_warnings(&warnings);
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    match args.output {
        RenderFormat::Text => rendered.write_restore(&mut out).context("writing output")?,
        RenderFormat::Json => {
            let mut doc = rendered.to_json_value();
            doc.warnings = &warnings;
            serde_json::to_writer_pretty(&mut out, &doc).context("writing output")?;
            writeln!(out).context("writing output")?;
        }
    }
    out.flush().context("writing output")?;
    Ok(Outcome::Clean)
}

/// `render --mode ipvs`: JSON (virtual servers, ipsets, kube-ipvs0 addresses, iptables) or the
/// `ipvsadm -Sn` form.
fn render_ipvs(
    args: &RenderArgs,
    state: &crate::state::ClusterState,
    cfg: &config::ProxyConfig,
    facts: &node::NodeFacts,
    mut warnings: Vec<crate::state::Warning>,
) -> anyhow::Result<Outcome> {
    use crate::proxier::ipvs;
    let opts = ipvs::IpvsOptions {
        random_fully: facts.random_fully,
        mark: args.node.masquerade_mark.clone(),
    };
    let rendered = ipvs::render(
        state,
        cfg,
        &ipvs::IpvsNode::from_facts(facts),
        facts.family,
        &opts,
    );
    warnings.extend(rendered.warnings.iter().cloned());
    super::common::print_warnings(&warnings);
    let mut out = std::io::stdout().lock();
    match args.output {
        RenderFormat::Text => out
            .write_all(rendered.to_ipvsadm_save().as_bytes())
            .context("writing output")?,
        RenderFormat::Json => {
            serde_json::to_writer_pretty(&mut out, &rendered).context("writing output")?;
            writeln!(out).context("writing output")?;
        }
    }
    out.flush().context("writing output")?;
    Ok(Outcome::Clean)
}

/// `render --mode nftables`: the `kube-proxy` table as `add …` lines (`nft -f` input), or their
/// JSON form.
fn render_nftables(
    args: &RenderArgs,
    state: &crate::state::ClusterState,
    cfg: &config::ProxyConfig,
    facts: &node::NodeFacts,
    mut warnings: Vec<crate::state::Warning>,
) -> anyhow::Result<Outcome> {
    use crate::proxier::nftables;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::with_capacity(1 << 16, stdout.lock());
    match args.output {
        RenderFormat::Text => {
            // Written as rendered; warnings (known only at the end) follow on stderr.
            let mut sink =
                nftables::objects::TextSink::new(nftables::table_family(facts.family), &mut out);
            let summary = nftables::render_into(state, cfg, facts, &mut sink);
            sink.finish().context("writing output")?;
            warnings.extend(summary.warnings);
            super::common::print_warnings(&warnings);
        }
        RenderFormat::Json => {
            let mut doc = nftables::render_json(state, cfg, facts);
            warnings.append(&mut doc.warnings);
            super::common::print_warnings(&warnings);
            doc.warnings = warnings;
            serde_json::to_writer_pretty(&mut out, &doc).context("writing output")?;
            writeln!(out).context("writing output")?;
        }
    }
    out.flush().context("writing output")?;
    Ok(Outcome::Clean)
}
