//! `verify` command: compare what the API says kube-proxy should have installed on a node with
//! what the node has (offline form: `--state`, `--config` and the node's dumps). The work is
//! [`verify_node`]'s: this module reads what the flags name, calls it once and prints.

use super::common::{
    DumpArgs, GlobalArgs, NodeFactArgs, StateArgs, load_config, print_job_notes, read_input,
    read_named, with_warnings,
};
use crate::collect::ipvs_dumps::IpvsTexts;
use crate::collect::{self, DumpKind, NodeSnapshot};
use crate::compare::{Report, Severity};
use crate::exit::Outcome;
use crate::output::color::{Painter, Role};
use crate::output::table::KubeTable;
use crate::pipeline::NamedText;
use crate::pipeline::mode::Given;
use crate::pipeline::verify::{NodeDumps, VerifyInputs, VerifyOptions, verify_node};
use crate::state::mode::ProxyMode;
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
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
    /// This host's rules (as --collector local).
    #[arg(long)]
    pub local: bool,
    /// node-problem-detector's plugin contract: one line of at most 80 characters on stdout,
    /// exit 0 OK, 1 drift, 2 could not tell (deploy/npd/).
    #[arg(long)]
    pub npd: bool,
}

/// Runs `verify`: reads the inputs the flags name, verifies the node with [`verify_node`]
/// and prints what it said and the report.
pub fn run(mut args: VerifyArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if args.local {
        args.live.collector = super::live::CollectorChoice::Local;
    }
    if args.npd {
        let (line, outcome) = match report(&args, global) {
            Ok(report) => super::npd::report_line(&report),
            Err(e) => super::npd::error_line(&e),
        };
        super::common::write_stdout(&format!("{line}\n"))?;
        return Ok(outcome);
    }
    if args.live.all_nodes {
        return run_all_nodes(args, global);
    }
    let report = report(&args, global)?;
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

/// Reads the inputs the flags name and verifies the node with [`verify_node`], printing on
/// stderr what it said.
fn report(args: &VerifyArgs, global: &GlobalArgs) -> anyhow::Result<Report> {
    let (dumps, inputs) = if ipvs_given(args) {
        ipvs_files(args)?
    } else {
        let resolved = match offline_nftables(args)? {
            Some(resolved) => resolved,
            None => super::live::resolve_inputs(
                global,
                &args.live,
                &args.state,
                &args.dumps,
                args.node_name.as_deref(),
            )?,
        };
        node_inputs(args, resolved)?
    };
    let mut notes = Vec::new();
    let report = verify_node(&dumps, inputs, &options(args), &mut notes);
    // The dumps (tens of megabytes on a large node) are not held while the report is written.
    drop(dumps);
    print_job_notes(&notes, true);
    Ok(report?)
}

/// Whether `--ipvsadm` was given: it selects IPVS mode and the files as the node's dumps.
fn ipvs_given(args: &VerifyArgs) -> bool {
    !args.ipvs.ipvsadm.is_empty()
}

/// How the flags ask to verify.
fn options(args: &VerifyArgs) -> VerifyOptions {
    VerifyOptions {
        lenient: args.dumps.lenient,
        group_alike: !args.all_findings,
        given: ipvs_given(args).then_some(Given {
            mode: ProxyMode::Ipvs,
            input: "--ipvsadm",
        }),
    }
}

/// The node facts the flags give, for the node named by NODE, else the one the inputs were
/// read for, else `--node`.
fn fact_inputs(args: &VerifyArgs, read_for: &str) -> crate::state::node::NodeInputs {
    let mut facts = args.facts.inputs();
    if let Some(n) = args
        .node_name
        .clone()
        .or_else(|| (!read_for.is_empty()).then(|| read_for.to_string()))
    {
        facts.node = Some(n);
    }
    facts
}

/// The dumps and the API state of `resolved`, with the files the flags name beside them
/// (`--nft-ruleset`, `--conntrack`).
fn node_inputs(
    args: &VerifyArgs,
    resolved: super::live::ResolvedInputs,
) -> anyhow::Result<(NodeDumps, VerifyInputs)> {
    let config = resolved.config()?;
    let nft_listing = match &args.nft_ruleset {
        Some(p) => {
            let dump = collect::files::read_dump(p, args.dumps.lenient)?;
            dump.warnings.iter().for_each(super::common::warn);
            if dump.text.trim().is_empty() {
                bail!(
                    "{} is empty: there is no ruleset to compare (was the command's output saved?)",
                    dump.name
                );
            }
            Some(NamedText {
                text: dump.text,
                label: dump.name,
            })
        }
        None => None,
    };
    let files = [
        (DumpKind::IptablesSave, &args.dumps.iptables_save),
        (DumpKind::Ip6tablesSave, &args.dumps.ip6tables_save),
        (
            DumpKind::IptablesLegacySave,
            &args.dumps.iptables_legacy_save,
        ),
    ]
    .into_iter()
    .filter_map(|(kind, path)| Some((kind, path.as_ref()?.display().to_string())))
    .collect();
    let dumps = NodeDumps {
        snapshot: resolved.snapshot,
        files,
        nft_listing,
        conntrack: conntrack_file(args)?,
        ip_addr: None,
    };
    let inputs = VerifyInputs {
        state: std::sync::Arc::new(resolved.state),
        config,
        facts: fact_inputs(args, &resolved.node),
        node: resolved.node,
    };
    Ok((dumps, inputs))
}

/// `--conntrack FILE`, read.
fn conntrack_file(args: &VerifyArgs) -> anyhow::Result<Option<NamedText>> {
    args.conntrack
        .conntrack
        .as_deref()
        .map(read_named)
        .transpose()
}

/// The inputs of `verify --nft-ruleset FILE --state FILE [--config FILE]` when no iptables dump
/// and no bundle is given (an nftables-mode node needs none): the state and configuration files
/// and no other dump. `None` when other inputs were given: they are resolved as usual.
fn offline_nftables(args: &VerifyArgs) -> anyhow::Result<Option<super::live::ResolvedInputs>> {
    use super::live::CollectorChoice;
    let dumps = &args.dumps;
    let has_iptables_files = dumps.iptables_save.is_some()
        || dumps.ip6tables_save.is_some()
        || dumps.iptables_legacy_save.is_some();
    if args.nft_ruleset.is_none()
        || has_iptables_files
        || args.live.bundle.is_some()
        || !matches!(
            args.live.collector,
            CollectorChoice::Auto | CollectorChoice::Files
        )
    {
        return Ok(None);
    }
    if args.state.state.is_empty() {
        bail!(
            "verify --nft-ruleset FILE compares with the API state: --state FILE (kubectl get services,endpointslices,nodes,servicecidrs -A -o json)"
        );
    }
    let state = crate::state::load::from_files(&args.state.state).context("reading --state")?;
    let config_text = match &args.state.config {
        Some(p) => Some((read_input(p)?, p.display().to_string())),
        None => None,
    };
    Ok(Some(super::live::ResolvedInputs {
        state,
        config_text,
        snapshot: NodeSnapshot {
            collector: "files".into(),
            ..NodeSnapshot::default()
        },
        node: args.node_name.clone().unwrap_or_default(),
    }))
}

/// The inputs of `verify --ipvsadm FILE… [--ipset FILE] [--ip-addr FILE] [--iptables-save
/// FILE]`: the node's IPVS dumps and the API state, from files only.
fn ipvs_files(args: &VerifyArgs) -> anyhow::Result<(NodeDumps, VerifyInputs)> {
    if args.state.state.is_empty() {
        bail!(
            "the API state is needed: --state FILE (kubectl get services,endpointslices,nodes -A -o json)"
        );
    }
    let state = crate::state::load::from_files(&args.state.state).context("reading --state")?;
    let (config, warnings) = load_config(args.state.config.as_deref())?;
    super::common::print_warnings(&warnings);
    let ipvs = &args.ipvs;
    let texts = with_warnings(|w| {
        IpvsTexts::read(
            &ipvs.ipvsadm,
            ipvs.ipset.as_deref(),
            ipvs.ip_addr.as_deref(),
            args.dumps.lenient,
            w,
        )
    })?;
    let read = |p: &Option<std::path::PathBuf>| p.as_deref().map(read_input).transpose();
    let mut files = vec![(DumpKind::Ipvsadm, texts.ipvsadm_name.clone())];
    files.extend(
        texts
            .ipset
            .as_ref()
            .map(|(_, name)| (DumpKind::IpsetSave, name.clone())),
    );
    let snapshot = NodeSnapshot {
        iptables_save: read(&args.dumps.iptables_save)?,
        ip6tables_save: read(&args.dumps.ip6tables_save)?,
        ipvsadm: Some(texts.ipvsadm),
        ipset_save: texts.ipset.map(|(text, _)| text),
        collector: "files".into(),
        ..NodeSnapshot::default()
    };
    let dumps = NodeDumps {
        snapshot,
        files,
        nft_listing: None,
        conntrack: conntrack_file(args)?,
        ip_addr: texts.ip_addr,
    };
    let inputs = VerifyInputs {
        state: std::sync::Arc::new(state),
        config,
        facts: fact_inputs(args, ""),
        node: String::new(),
    };
    Ok((dumps, inputs))
}

/// `verify --all-nodes`: one report per node, summarised by [`super::live::run_all_nodes`].
/// How each node's release was chosen is not printed: its row says what came of it.
fn run_all_nodes(args: VerifyArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let args = std::sync::Arc::new(args);
    let per_node = std::sync::Arc::clone(&args);
    super::live::run_all_nodes(global, &args.live, &args.state, move |resolved| {
        let (dumps, inputs) = node_inputs(&per_node, resolved)?;
        let mut notes = Vec::new();
        let report = verify_node(&dumps, inputs, &options(&per_node), &mut notes);
        print_job_notes(&notes, false);
        let report = report?;
        Ok(super::live::NodeSummary {
            mode: report.mode,
            service_ports_checked: report.summary.service_ports,
            errors: report.summary.errors,
            warnings: report.summary.warnings,
            outcome: report.outcome(),
        })
    })
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

/// The findings table; `--no-headers` prints only its rows (no group titles, column headers,
/// blank lines or summary), errors first, as kubectl prints rows.
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
        if !no_headers {
            out.push_str(&painter.paint(role, &format!("{title} ({})", group.len())));
            out.push('\n');
        }
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
        if !no_headers {
            out.push('\n');
        }
    }
    if no_headers {
        return out;
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
