//! `verify` command: compare what the API says kube-proxy should have installed on a node with
//! what the node has (offline form: `--state`, `--config` and the node's dumps).

use super::common::{DumpArgs, GlobalArgs, NodeFactArgs, StateArgs, read_input};
use crate::compare::{
    DumpText, NodePlans, ReleaseCheck, Report, Severity, VerifyInput, WriterRelease,
};
use crate::exit::Outcome;
use crate::output::color::{Painter, Role};
use crate::output::table::KubeTable;
use crate::state::ip::IpFamily;
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use kproxy_parsers::iptables::ParseOptions;
use std::path::PathBuf;

/// Output formats of `verify`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum VerifyFormat {
    /// Findings grouped by severity, then a summary line.
    Table,
    /// As `table`, with expected, actual and hint columns.
    Wide,
    /// `{node, mode, summary, findings}` as JSON.
    Json,
    /// The same as YAML.
    Yaml,
}

/// Arguments of `verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The node to verify (default: --node, the config's hostnameOverride, or the only Node in the state).
    #[arg(value_name = "NODE")]
    pub node_name: Option<String>,
    /// The node's nftables ruleset: `nft list ruleset`, `nft -j list ruleset` or `nft list table
    /// ip kube-proxy` output (text or JSON). On an nftables-mode node it is what is verified;
    /// on an iptables-mode node its kube-proxy table is a leftover.
    #[arg(long = "nft-ruleset", value_name = "FILE")]
    pub nft_ruleset: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = VerifyFormat::Table)]
    pub output: VerifyFormat,
    /// List every finding: without it, many findings of one cause (mass drift) are one finding
    /// with their count and a few examples.
    #[arg(long = "all-findings")]
    pub all_findings: bool,
    /// API state and configuration.
    #[command(flatten)]
    pub state: StateArgs,
    /// The node's dumps.
    #[command(flatten)]
    pub dumps: DumpArgs,
    /// Node facts, as for render.
    #[command(flatten)]
    pub facts: NodeFactArgs,
    /// Live cluster access (collector, bundle, --all-nodes).
    #[command(flatten)]
    pub live: super::live::LiveArgs,
    /// IPVS dumps (`--ipvsadm` selects IPVS-mode verification).
    #[command(flatten)]
    pub ipvs: super::ipvs::IpvsArgs,
    /// The node's conntrack table (findings KP6xx).
    #[command(flatten)]
    pub conntrack: super::conntrack::ConntrackArgs,
}

/// Runs `verify`.
pub fn run(mut args: VerifyArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    args.ipvs.lenient = args.dumps.lenient;
    if args.live.all_nodes {
        return run_all_nodes(args, global);
    }
    let report = if args.ipvs.given() {
        super::ipvs::verify(
            &args.ipvs,
            &args.state,
            &args.facts,
            &args.dumps,
            args.node_name.as_deref(),
            &args.conntrack,
        )?
    } else {
        build_report(&args, global)?
    };
    let report = if args.all_findings {
        report
    } else {
        report.group_alike()
    };
    if matches!(args.output, VerifyFormat::Json | VerifyFormat::Yaml) {
        // Streamed: with --all-findings, the report of mass drift is large.
        let out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        if args.output == VerifyFormat::Json {
            crate::output::write_json(out, &report)?;
        } else {
            crate::output::write_yaml(out, &report)?;
        }
        return Ok(report.outcome());
    }
    let text = format_report(
        &report,
        args.output,
        global.no_headers,
        Painter::for_stdout(),
    )?;
    super::common::write_stdout(&text)?;
    Ok(report.outcome())
}

/// Reads the inputs named by the flags (offline files, a bundle or the live cluster, see
/// [`super::live::resolve_inputs`]) and verifies the node.
pub fn build_report(args: &VerifyArgs, global: &GlobalArgs) -> anyhow::Result<Report> {
    if let Some(inputs) = super::verify_nftables::offline_inputs(args)? {
        return report_with_notes(args, inputs, true);
    }
    let inputs = super::live::resolve_inputs(
        global,
        &args.live,
        &args.state,
        &args.dumps,
        args.node_name.as_deref(),
    )?;
    report_with_notes(args, inputs, true)
}

/// `verify --all-nodes`: one report per node, summarised by [`super::live::run_all_nodes`].
fn run_all_nodes(args: VerifyArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let args = std::sync::Arc::new(args);
    let per_node = std::sync::Arc::clone(&args);
    super::live::run_all_nodes(global, &args.live, &args.state, move |inputs| {
        let report = report_from_inputs(&per_node, inputs)?;
        Ok(super::live::NodeSummary {
            mode: report.mode,
            service_ports_checked: report.summary.service_ports,
            errors: report.summary.errors,
            warnings: report.summary.warnings,
            outcome: report.outcome(),
        })
    })
}

/// Verifies the node described by `inputs` (flags other than the inputs come from `args`). The
/// API state is freed once kube-proxy's plan is computed from it, on a thread of its own while
/// the dumps are parsed.
pub fn report_from_inputs(
    args: &VerifyArgs,
    inputs: super::live::ResolvedInputs,
) -> anyhow::Result<Report> {
    report_with_notes(args, inputs, false)
}

/// [`report_from_inputs`]; with `notes`, what decided the kube-proxy release is printed on
/// stderr too (it is always a finding when inferred).
fn report_with_notes(
    args: &VerifyArgs,
    inputs: super::live::ResolvedInputs,
    notes: bool,
) -> anyhow::Result<Report> {
    if let Some(report) = super::verify_nftables::verify_if_nftables(args, &inputs)? {
        return Ok(report);
    }
    let super::live::ResolvedInputs {
        state,
        config_text,
        snapshot,
        node: node_name,
    } = inputs;
    let snap = &snapshot;
    let Some(main_text) = snap
        .iptables_save
        .as_deref()
        .or(snap.ip6tables_save.as_deref())
    else {
        bail!(
            "verify needs the node's rules: --iptables-save FILE (and --ip6tables-save FILE for IPv6)"
        );
    };
    for w in &snap.warnings {
        super::common::warn(w);
    }
    if main_text.trim().is_empty() {
        bail!(
            "the node's rules are empty: there are no rules to compare (was the command's output saved?)"
        );
    }
    let ipvs_node = mentions_ipvs_chains(main_text)
        && crate::compare::ipvs::detect_mode(None, Some(main_text))
            == crate::compare::ipvs::DetectedMode::Ipvs;
    if ipvs_node && snap.ipvsadm.is_none() {
        bail!(
            "the node's rules are kube-proxy's IPVS mode (KUBE-IPVS-FILTER, KUBE-CLUSTER-IP set rules): verify it with --ipvsadm FILE (ipvsadm -Ln or -Sn) [--ipset FILE] [--ip-addr FILE] and this --iptables-save, or with a collector whose image has ipvsadm (--collector debug-pod)"
        );
    }
    let config = match &config_text {
        Some((text, source)) => {
            let (c, warnings) = crate::state::config::parse(text, source)
                .with_context(|| format!("reading the kube-proxy configuration ({source})"))?;
            for w in warnings {
                super::common::warn(w);
            }
            c
        }
        None => crate::state::config::ProxyConfig::default(),
    };
    let mut fact_args = args.facts.clone();
    if let Some(n) = args
        .node_name
        .clone()
        .or_else(|| (!node_name.is_empty()).then(|| node_name.clone()))
    {
        fact_args.node = Some(n);
    }
    // The kube-proxy release to compare with: the flag, the pod's image, else the rules' own.
    let release = (!ipvs_node).then(|| {
        let texts = [
            snap.iptables_save.as_deref(),
            snap.ip6tables_save.as_deref(),
        ];
        crate::compare::version::choose_release(
            args.facts.kube_proxy_version,
            snap.kube_proxy_image.as_deref(),
            crate::compare::version::infer(texts.into_iter().flatten()).given_invalid_counter(
                super::common::says_counter(
                    &args.facts,
                    crate::state::node::NFACCT_CT_STATE_INVALID,
                ),
            ),
            "verifying",
        )
    });
    if let Some(r) = &release {
        fact_args.kube_proxy_version = Some(r.version);
        if notes {
            super::common::print_notes(&r.notes);
        }
    }
    let (facts, warnings) =
        crate::state::node::build(&fact_args.inputs(), &state, &config).context("node facts")?;
    for w in warnings {
        super::common::warn(w);
    }
    let conntrack = super::conntrack::verify_findings(
        &args.conntrack,
        snap.conntrack.as_deref(),
        &snap.collector,
        args.dumps.lenient,
        (&state, &config, &facts),
    )?;
    if ipvs_node && let Some(ipvsadm) = snap.ipvsadm.as_deref() {
        // An IPVS node read through a collector or a bundle: the same check as `--ipvsadm FILE`.
        let proxy_inputs = crate::state::ProxyInputs {
            state,
            config,
            facts,
        };
        let dumps = super::ipvs::IpvsNodeDumps {
            ipvsadm: (ipvsadm, format!("ipvsadm ({})", snap.collector)),
            ipset: snap
                .ipset_save
                .as_deref()
                .map(|t| (t, format!("ipset save ({})", snap.collector))),
            ip_addr: None,
            iptables_save: snap.iptables_save.as_deref(),
            ip6tables_save: snap.ip6tables_save.as_deref(),
        };
        return super::ipvs::verify_texts(
            &proxy_inputs,
            &dumps,
            args.facts.masquerade_mark.clone(),
        )
        .map(|r| super::conntrack::with_findings(r, conntrack));
    }
    // Labels: the file names offline, the command and collector otherwise.
    let label = |path: &Option<PathBuf>, command: &str| match path {
        Some(p) => p.display().to_string(),
        None => format!("{command} ({})", snap.collector),
    };
    let main_family = if snap.iptables_save.is_some() {
        facts.family
    } else {
        IpFamily::V6
    };
    let mut texts: Vec<(String, &str, IpFamily)> = Vec::new();
    if snap.iptables_save.is_some() {
        texts.push((
            label(&args.dumps.iptables_save, "iptables-save"),
            main_text,
            main_family,
        ));
        if let Some(t) = snap.ip6tables_save.as_deref() {
            texts.push((
                label(&args.dumps.ip6tables_save, "ip6tables-save"),
                t,
                IpFamily::V6,
            ));
        }
    } else {
        texts.push((
            label(&args.dumps.ip6tables_save, "ip6tables-save"),
            main_text,
            main_family,
        ));
    }
    let legacy = crate::collect::other_backend(snap).map(|(command, t)| {
        let path = if command == "iptables-legacy-save" {
            &args.dumps.iptables_legacy_save
        } else {
            &None
        };
        (label(path, command), t)
    });
    let nft = match &args.nft_ruleset {
        Some(p) => Some(read_input(p)?),
        None => None,
    };
    let node = if facts.node_name.is_empty() {
        node_name.as_str()
    } else {
        facts.node_name.as_str()
    };
    let dumps: Vec<DumpText> = texts
        .iter()
        .map(|(l, t, f)| DumpText {
            label: l,
            text: t,
            family: *f,
        })
        .collect();
    // Planned on a thread of its own while the dumps are parsed; the state goes with it (and
    // with the plans of the release that wrote the rules, when that is another).
    let state = std::sync::Arc::new(state);
    let writer = release.as_ref().and_then(|r| r.writer).map(|w| {
        let mut facts = facts.clone();
        facts.kube_proxy_version = w;
        WriterRelease {
            plans: NodePlans::start(std::sync::Arc::clone(&state), &config, &facts, &dumps),
            facts,
        }
    });
    let plans = NodePlans::start(state, &config, &facts, &dumps);
    let input = VerifyInput {
        node,
        plans,
        config: &config,
        facts: &facts,
        dumps,
        legacy: legacy.as_ref().map(|(l, t)| DumpText {
            label: l,
            text: t,
            family: main_family,
        }),
        nft_ruleset: nft.as_deref(),
        parse: if args.dumps.lenient {
            ParseOptions::lenient()
        } else {
            ParseOptions::strict()
        },
        group_alike: !args.all_findings,
    };
    let check = match release {
        Some(r) => ReleaseCheck {
            inferred: r.source == crate::compare::version::ReleaseSource::Inferred,
            inference: Some(r.inference),
            writer,
        },
        None => ReleaseCheck::default(),
    };
    let report = crate::compare::verify_release(&input, &check)?;
    let mut conntrack = conntrack;
    conntrack.extend(super::verify_nftables::foreign_tables(
        args,
        snap,
        report.mode,
    ));
    Ok(super::conntrack::with_findings(report, conntrack))
}

/// Whether the dump text names a chain only kube-proxy's IPVS mode writes: without one,
/// [`crate::compare::ipvs::detect_mode`] cannot say IPVS, and its full canonicalisation of a big
/// dump is skipped.
fn mentions_ipvs_chains(text: &str) -> bool {
    ["KUBE-IPVS-FILTER", "KUBE-CLUSTER-IP", "KUBE-LOOP-BACK"]
        .iter()
        .any(|m| text.contains(m))
}

/// Renders a report in `format`.
pub fn format_report(
    report: &Report,
    format: VerifyFormat,
    no_headers: bool,
    painter: Painter,
) -> anyhow::Result<String> {
    Ok(match format {
        VerifyFormat::Json => crate::output::to_json(report)?,
        VerifyFormat::Yaml => crate::output::to_yaml(report)?,
        VerifyFormat::Table | VerifyFormat::Wide => {
            table(report, format == VerifyFormat::Wide, no_headers, painter)
        }
    })
}

fn table(report: &Report, wide: bool, no_headers: bool, painter: Painter) -> String {
    let mut out = String::new();
    for sev in [Severity::Error, Severity::Warning, Severity::Info] {
        let group: Vec<_> = report
            .findings
            .iter()
            .filter(|f| f.severity == sev)
            .collect();
        if group.is_empty() {
            continue;
        }
        let role = match sev {
            Severity::Error => Role::Error,
            Severity::Warning => Role::Warn,
            Severity::Info => Role::Dim,
        };
        let title = match sev {
            Severity::Error => "ERRORS",
            Severity::Warning => "WARNINGS",
            Severity::Info => "INFO",
        };
        out.push_str(&painter.paint(role, &format!("{title} ({})", group.len())));
        out.push('\n');
        let mut headers = vec!["id", "service", "chain", "message"];
        if wide {
            headers.extend(["expected", "actual", "hint"]);
        }
        let mut t = KubeTable::new(headers);
        for f in group {
            let mut row = vec![
                f.id.to_string(),
                f.service.clone().unwrap_or_else(|| "-".into()),
                f.chain.clone().unwrap_or_else(|| "-".into()),
                f.message.clone(),
            ];
            if wide {
                row.push(f.expected.clone().unwrap_or_default());
                row.push(f.actual.clone().unwrap_or_default());
                row.push(f.hint.clone().unwrap_or_default());
            }
            t.row(row);
        }
        out.push_str(&t.render(no_headers));
        out.push('\n');
    }
    let summary = report.summary_line();
    let role = if report.summary.errors > 0 {
        Role::Error
    } else if report.summary.warnings > 0 {
        Role::Warn
    } else {
        Role::Ok
    };
    out.push_str(&painter.paint(role, &summary));
    out.push('\n');
    if let Some(n) = report.findings_truncated {
        out.push_str(&format!(
            "{} more findings are shown grouped by cause (--all-findings lists each)\n",
            crate::compare::report::thousands(n)
        ));
    }
    out
}
