//! `graph` command: rebuild the service graph from a node's iptables dump(s).

use super::common::{DumpArgs, GlobalArgs, parse_iptables, read_iptables};
use crate::collect::files::DumpText;
use crate::exit::Outcome;
use crate::graph::{self, GraphDocument, GraphOptions, ServiceGraph};
use crate::output;
use crate::parsers::paste;
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

/// Output formats of `graph`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GraphFormat {
    /// One line per service port: entries, endpoints with shares, masquerade, anomaly count.
    Table,
    /// `table` plus chains, session affinity, source ranges and filter verdicts.
    Wide,
    /// The stable machine form (schema in docs/graph-json.md).
    Json,
    /// The JSON document as YAML.
    Yaml,
    /// Graphviz DOT (`| dot -Tsvg`).
    Dot,
}

/// Arguments of `graph`.
#[derive(Debug, Args)]
pub struct GraphArgs {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = GraphFormat::Table)]
    pub output: GraphFormat,
    /// A paste of several commands' output (`iptables -t nat -S`, `ipset list`, `ipvsadm -Ln`,
    /// with prompts between): cut into its parts, each read by its own reader (implies
    /// --lenient; `--lenient --iptables-save FILE` does the same when FILE holds several kinds).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["iptables_save", "ip6tables_save", "iptables_legacy_save", "ipvsadm"])]
    pub paste: Option<PathBuf>,

    /// A node in kube-proxy's nftables mode: `nft list ruleset`, `nft -j list ruleset` or `nft
    /// list table ip kube-proxy` output (`-` = stdin); one graph per kube-proxy table (ip, ip6).
    #[arg(long = "nft-ruleset", value_name = "FILE", conflicts_with_all = ["paste", "iptables_save", "ip6tables_save", "iptables_legacy_save", "ipvsadm"])]
    pub nft_ruleset: Option<PathBuf>,

    /// Node dumps (`-` = stdin).
    #[command(flatten)]
    pub dump: DumpArgs,
    /// IPVS dumps (`--ipvsadm` selects the IPVS graph: virtual servers → real servers).
    #[command(flatten)]
    pub ipvs: super::ipvs::IpvsArgs,
}

impl GraphArgs {
    /// The iptables inputs given, in a fixed order.
    fn iptables_inputs(&self) -> Vec<&PathBuf> {
        [
            &self.dump.iptables_save,
            &self.dump.ip6tables_save,
            &self.dump.iptables_legacy_save,
        ]
        .into_iter()
        .flatten()
        .collect()
    }
}

/// Builds the graph of one input read by [`read_iptables`].
pub fn graph_of<'a>(input: &'a DumpText, dump: &DumpArgs) -> anyhow::Result<ServiceGraph<'a>> {
    let parsed = parse_iptables(input, dump.table.as_deref(), dump.lenient)?;
    let opts = GraphOptions {
        source: Some(input.name.clone()),
        ..GraphOptions::default()
    };
    Ok(graph::from_dump(parsed, &opts))
}

/// Runs `graph`.
pub fn run(mut args: GraphArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    args.ipvs.lenient = args.dump.lenient;
    if let Some(path) = &args.nft_ruleset {
        return super::nft_graph::run(path, args.output, args.dump.lenient, global);
    }
    if let Some(path) = args.paste.clone() {
        args.dump.lenient = true;
        let input = crate::collect::files::read_dump(&path, true)?;
        input.warnings.iter().for_each(super::common::warn);
        return run_paste(input, &args, global);
    }
    if args.ipvs.given() {
        let format = match args.output {
            GraphFormat::Json => "json",
            GraphFormat::Yaml => "yaml",
            GraphFormat::Dot => "dot",
            GraphFormat::Table | GraphFormat::Wide => "table",
        };
        let text = super::ipvs::graph(&args.ipvs, format, global.no_headers)?;
        anstream::stdout().write_all(text.as_bytes())?;
        return Ok(Outcome::Clean);
    }
    let inputs = args.iptables_inputs();
    if inputs.is_empty() && (args.ipvs.ipset.is_some() || args.ipvs.ip_addr.is_some()) {
        anyhow::bail!(
            "graph: --ipset and --ip-addr go with --ipvsadm FILE (the IPVS virtual servers); pass --ipvsadm FILE too"
        );
    }
    if inputs.is_empty() {
        anyhow::bail!(
            "graph: no input given; pass --iptables-save FILE (and/or --ip6tables-save FILE; `-` = stdin), or --ipvsadm FILE for an IPVS node, or --nft-ruleset FILE for an nftables node"
        );
    }
    if inputs.iter().filter(|p| p.as_os_str() == "-").count() > 1 {
        anyhow::bail!("graph: only one input can be read from stdin (`-`)");
    }
    let lenient = args.dump.lenient;
    let texts = inputs
        .iter()
        .map(|p| read_iptables(p, args.dump.table.as_deref(), lenient))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if let [one] = texts.as_slice()
        && args.dump.lenient
        && paste::split(&as_cleaned(one)).len() > 1
    {
        let input = texts.into_iter().next().unwrap_or_default();
        return run_paste(input, &args, global);
    }
    let graphs = texts
        .iter()
        .map(|input| graph_of(input, &args.dump))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if matches!(args.output, GraphFormat::Json | GraphFormat::Yaml) {
        // Streamed: the document of a node-sized dump is large (see `output::write_json`).
        let out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        if args.output == GraphFormat::Json {
            output::graph::write_json(out, &graphs)?;
        } else {
            output::write_yaml(out, &GraphDocument::new(&graphs))?;
        }
        return Ok(Outcome::Clean);
    }
    let text = render(&graphs, args.output, global.no_headers)?;
    let mut out = anstream::stdout();
    out.write_all(text.as_bytes())?;
    Ok(Outcome::Clean)
}

/// The cleaned paste a [`DumpText`] holds (for [`paste::split`]).
fn as_cleaned(input: &DumpText) -> paste::Cleaned {
    paste::Cleaned {
        text: input.text.clone(),
        notes: Vec::new(),
        commands: input.commands.clone(),
    }
}

/// `graph --paste FILE`: each part of the paste read by its reader; iptables parts give one
/// graph per family, ipvsadm and ipset parts the IPVS graph.
fn run_paste(input: DumpText, args: &GraphArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let parts = paste::split(&as_cleaned(&input));
    if parts.is_empty() {
        anyhow::bail!(
            "{}: nothing kproxy reads was found in the paste",
            input.name
        );
    }
    let name = &input.name;
    let lines_of = |p: &paste::Part| format!("{name} lines {}-{}", p.lines.0, p.lines.1);
    let mut iptables: [Vec<(DumpText, Option<String>)>; 2] = [Vec::new(), Vec::new()];
    let mut ipvsadm: Option<(String, String)> = None;
    let mut ipset: Option<(String, String)> = None;
    let mut nft: Vec<DumpText> = Vec::new();
    // The paste's cuts that fall inside a part (or just after it).
    let cuts_of = |p: &paste::Part| -> Vec<u32> {
        input
            .cuts
            .iter()
            .copied()
            .filter(|&c| c >= p.lines.0 && c <= p.lines.1.saturating_add(1))
            .collect()
    };
    let mut ipvs_cuts: Vec<String> = Vec::new();
    for part in &parts {
        super::common::warn(format!(
            "{}: `{}` output",
            lines_of(part),
            part.command.as_deref().unwrap_or(part.kind.command())
        ));
        match part.kind {
            paste::Kind::Iptables => {
                let text = DumpText {
                    name: name.clone(),
                    text: part.text.clone(),
                    cuts: cuts_of(part),
                    ..DumpText::default()
                };
                iptables[usize::from(part.ipv6)].push((text, part.table.clone()));
            }
            paste::Kind::IptablesListing => {
                let read = crate::parsers::iptables::listing::read_listing(
                    &part.text,
                    part.table.as_deref(),
                );
                for note in &read.notes {
                    super::common::warn(format!("{}: {note}", lines_of(part)));
                }
                let text = DumpText {
                    name: name.clone(),
                    text: read.text,
                    cuts: cuts_of(part),
                    ..DumpText::default()
                };
                iptables[usize::from(part.ipv6)].push((text, Some(read.table.to_string())));
            }
            paste::Kind::Ipvsadm | paste::Kind::IpvsConnections | paste::Kind::Ipset => {
                let slot = if part.kind == paste::Kind::Ipset {
                    &mut ipset
                } else {
                    &mut ipvsadm
                };
                let slot = slot.get_or_insert_with(|| (String::new(), name.clone()));
                overlay(&mut slot.0, &part.text);
                ipvs_cuts.extend(cuts_of(part).into_iter().map(|line| {
                    format!("{name}: the paste is cut at line {line}: what was left out is missing")
                }));
            }
            paste::Kind::Nft => nft.push(DumpText {
                name: name.clone(),
                text: part.text.clone(),
                cuts: cuts_of(part),
                ..DumpText::default()
            }),
            other => super::common::warn(format!(
                "{}: `{}` output is not read by graph; left out",
                lines_of(part),
                other.command()
            )),
        }
    }
    let nft = nft
        .iter()
        .map(|t| Ok((t, super::nft_graph::ruleset_graphs(t, true)?)))
        .collect::<anyhow::Result<Vec<_>>>()?;
    // Each part parsed on its own (a `-S` part in its command's table), the tables of one family
    // then make one dump: parts keep the paste's line numbers.
    let mut graphs = Vec::new();
    // What stdout says besides the graphs: parts that hold no kube-proxy rules kproxy reads.
    let mut notes: Vec<String> = Vec::new();
    for family in iptables.iter().filter(|f| !f.is_empty()) {
        let mut merged: Option<crate::parsers::iptables::Dump<'_>> = None;
        for (text, table) in family {
            let table = args.dump.table.as_deref().or(table.as_deref());
            let dump = parse_iptables(text, table, true)?;
            match &mut merged {
                None => merged = Some(dump),
                Some(m) => {
                    m.tables.extend(dump.tables);
                    m.skipped.extend(dump.skipped);
                    m.gaps.extend(dump.gaps);
                }
            }
        }
        if let Some(dump) = merged {
            let opts = GraphOptions {
                source: Some(name.clone()),
                ..GraphOptions::default()
            };
            graphs.push(graph::from_dump(dump, &opts));
        }
    }
    let opts = GraphOptions {
        source: Some(name.clone()),
        ..GraphOptions::default()
    };
    for (text, ruleset) in &nft {
        let found = ruleset.graphs(&opts);
        if found.is_empty() {
            super::nft_graph::warn_without_kube_proxy_table(&text.name, ruleset.ruleset());
            notes.push(super::nft_graph::without_kube_proxy_table(
                ruleset.ruleset(),
            ));
        }
        graphs.extend(found);
    }
    let ipvs = match ipvsadm {
        Some(ipvsadm) => {
            let mut texts = super::common::with_warnings(|w| {
                crate::collect::ipvs_dumps::IpvsTexts::from_texts(ipvsadm, ipset, true, w)
            });
            texts.add_gaps(ipvs_cuts);
            Some(texts)
        }
        None => {
            if ipset.is_some() {
                super::common::warn(format!(
                    "{name}: the ipset output goes with ipvsadm output, which the paste does not hold; left out"
                ));
            }
            None
        }
    };
    let out = match (args.output, &ipvs) {
        // One JSON/YAML document for the whole paste.
        (GraphFormat::Json | GraphFormat::Yaml, Some(texts)) => {
            let ipvs_doc: serde_json::Value =
                serde_json::from_str(&super::ipvs::graph_of_texts(texts, "json", false)?)?;
            let doc = serde_json::json!({
                "schema": "kproxy.paste/v1",
                "iptables": GraphDocument::new(&graphs),
                "ipvs": ipvs_doc,
            });
            if args.output == GraphFormat::Json {
                output::to_json(&doc)?
            } else {
                output::to_yaml(&doc)?
            }
        }
        (format, ipvs) => {
            let mut out = String::new();
            if !graphs.is_empty() || ipvs.is_none() {
                out.push_str(&render(&graphs, format, global.no_headers)?);
            }
            if format != GraphFormat::Dot {
                for note in &notes {
                    out.push_str(&format!("note: {note}\n"));
                }
            }
            if let Some(texts) = ipvs {
                let ipvs_format = if format == GraphFormat::Dot {
                    "dot"
                } else {
                    "table"
                };
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(&super::ipvs::graph_of_texts(
                    texts,
                    ipvs_format,
                    global.no_headers,
                )?);
            }
            out
        }
    };
    super::common::write_stdout(&out)?;
    Ok(Outcome::Clean)
}

/// Lays `part` over `base` line by line (a part's lines outside it are empty).
fn overlay(base: &mut String, part: &str) {
    let mut lines: Vec<&str> = base.split('\n').collect();
    let part_lines: Vec<&str> = part.split('\n').collect();
    if lines.len() < part_lines.len() {
        lines.resize(part_lines.len(), "");
    }
    let merged: Vec<&str> = lines
        .iter()
        .zip(part_lines.iter().chain(std::iter::repeat(&"")))
        .map(|(b, p)| if p.is_empty() { *b } else { *p })
        .collect();
    *base = merged.join("\n");
}

/// Renders graphs in a format (what `graph` prints).
pub fn render(
    graphs: &[ServiceGraph<'_>],
    format: GraphFormat,
    no_headers: bool,
) -> anyhow::Result<String> {
    Ok(match format {
        GraphFormat::Json => output::to_json(&GraphDocument::new(graphs))?,
        GraphFormat::Yaml => output::to_yaml(&GraphDocument::new(graphs))?,
        GraphFormat::Dot => graphs.iter().map(crate::output::graph::dot).collect(),
        GraphFormat::Table | GraphFormat::Wide if graphs.is_empty() => {
            "No kube-proxy service ports found.\n".to_string()
        }
        GraphFormat::Table | GraphFormat::Wide => {
            let wide = format == GraphFormat::Wide;
            let mut out = String::new();
            for (i, g) in graphs.iter().enumerate() {
                if graphs.len() > 1 {
                    if i > 0 {
                        out.push('\n');
                    }
                    out.push_str(&format!(
                        "==> {} ({}) <==\n",
                        g.source.as_deref().unwrap_or("-"),
                        g.family.as_deref().unwrap_or("unknown family")
                    ));
                }
                let t = crate::output::graph::table_text_within(
                    g,
                    wide,
                    no_headers,
                    crate::output::stdout_width(),
                );
                if t.is_empty() {
                    out.push_str("No kube-proxy service ports found.\n");
                } else {
                    out.push_str(&t);
                }
            }
            out
        }
    })
}
