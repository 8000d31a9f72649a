//! `graph` command: rebuild the service graph from a node's iptables dump(s).

use super::common::{DumpArgs, GlobalArgs, read_input, rules_text};
use crate::exit::Outcome;
use crate::graph::{self, GraphDocument, GraphOptions, ServiceGraph};
use crate::output;
use crate::parsers::iptables::ParseOptions;
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
    /// Node dumps (`-` = stdin).
    #[command(flatten)]
    pub dump: DumpArgs,
    /// The table of `iptables -S` input, which names none (`iptables -t nat -S` → nat).
    #[arg(long, default_value = "nat", value_parser = ["nat", "filter", "mangle", "raw", "security"])]
    pub table: String,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = GraphFormat::Table)]
    pub output: GraphFormat,
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

fn source_name(path: &std::path::Path) -> String {
    if path.as_os_str() == "-" {
        "<stdin>".to_string()
    } else {
        path.display().to_string()
    }
}

/// Parses and builds the graph of one input's `text` (read from `path`); skipped lines are
/// reported on stderr.
pub fn graph_of<'a>(
    text: &'a str,
    path: &std::path::Path,
    table: &str,
    lenient: bool,
) -> anyhow::Result<ServiceGraph<'a>> {
    let name = source_name(path);
    let mut parse = ParseOptions::default().with_table(table);
    parse.lenient = lenient;
    let g = graph::from_text(text, &name, &parse, &GraphOptions::default())?;
    let mut err = anstream::stderr();
    for s in &g.skipped_lines {
        let _ = writeln!(err, "warning: {name}:{}: skipped: {}", s.line, s.reason);
    }
    Ok(g)
}

/// Runs `graph`.
pub fn run(args: GraphArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
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
    if inputs.is_empty() {
        anyhow::bail!(
            "graph: no input given; pass --iptables-save FILE (and/or --ip6tables-save FILE; `-` = stdin), or --ipvsadm FILE for an IPVS node"
        );
    }
    if inputs.iter().filter(|p| p.as_os_str() == "-").count() > 1 {
        anyhow::bail!("graph: only one input can be read from stdin (`-`)");
    }
    let lenient = args.dump.lenient;
    let texts = inputs
        .iter()
        .map(|p| {
            Ok(rules_text(
                read_input(p)?,
                &source_name(p),
                Some(&args.table),
                lenient,
            ))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let graphs = texts
        .iter()
        .zip(&inputs)
        .map(|(t, p)| graph_of(&t.text, p, t.table.unwrap_or(&args.table), lenient))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.output == GraphFormat::Json {
        // Streamed: the document of a node-sized dump is ~120 MB of text.
        let out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        output::write_json(out, &GraphDocument::new(&graphs))?;
        return Ok(Outcome::Clean);
    }
    let text = render(&graphs, args.output, global.no_headers)?;
    let mut out = anstream::stdout();
    out.write_all(text.as_bytes())?;
    Ok(Outcome::Clean)
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
        GraphFormat::Dot => graphs.iter().map(graph::render::dot).collect(),
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
                let t = graph::render::table_text(g, wide, no_headers);
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
