//! `graph --nft-ruleset FILE`: the service graph of a node in kube-proxy's nftables mode, and the
//! reading of `--nft-ruleset` files that `graph` and `trace` share.

use super::common::{GlobalArgs, warn};
use super::graph::{GraphFormat, render};
use crate::collect::files::DumpText;
use crate::exit::Outcome;
use crate::graph::nftables::NftGraphs;
use crate::graph::{GraphDocument, GraphOptions};
use crate::output;
use crate::parsers::nft::{self, ParseOptions};
use std::path::Path;

/// Reads an nftables ruleset file (`-` = stdin): `nft list ruleset` / `nft list table` text, `nft
/// -j` JSON or `nft -f` lines, decoded (and, with `lenient`, cleaned of what a paste wraps around
/// it) by [`crate::collect::files::read_dump`]; an empty file is an error.
pub fn read_ruleset(path: &Path, lenient: bool) -> anyhow::Result<DumpText> {
    let dump = crate::collect::files::read_dump(path, lenient)?;
    dump.warnings.iter().for_each(warn);
    if dump.text.trim().is_empty() {
        anyhow::bail!(
            "{} is empty: there is no ruleset to read (was `nft list ruleset` saved?)",
            dump.name
        );
    }
    Ok(dump)
}

/// Parses a ruleset read by [`read_ruleset`]: errors carry the file name and `line:col`; lines
/// lenient reading skipped and the parser's warnings are printed.
pub fn parse_ruleset(input: &DumpText, lenient: bool) -> anyhow::Result<nft::Ruleset<'_>> {
    let opts = if lenient {
        ParseOptions::lenient()
    } else {
        ParseOptions::strict()
    };
    let rs = nft::parse(&input.text, &opts).map_err(|e| e.in_source(input.name.clone()))?;
    let name = &input.name;
    for s in &rs.skipped {
        warn(format!("{name}:{}: skipped: {}", s.line, s.reason));
    }
    for w in &rs.warnings {
        match w.line {
            0 => warn(format!("{name}: {}", w.message)),
            line => warn(format!("{name}:{line}: {}", w.message)),
        }
    }
    Ok(rs)
}

/// What a ruleset without kube-proxy's table means, for stdout: its tables, and where kproxy
/// reads iptables-nft's rules from.
pub fn without_kube_proxy_table(rs: &nft::Ruleset<'_>) -> String {
    let tables: Vec<String> = rs
        .tables
        .iter()
        .map(|t| format!("{} {}", t.family, t.name))
        .collect();
    let mut note = format!(
        "the nft listing holds no kube-proxy table (tables: {})",
        if tables.is_empty() {
            "none".to_string()
        } else {
            tables.join(", ")
        }
    );
    if rs.tables.iter().any(|t| t.managed_by_iptables_nft) {
        note.push_str(
            ": its tables are iptables-nft's (kube-proxy in iptables mode), whose rules kproxy reads from `iptables-save` output, not from `nft list`",
        );
    }
    note
}

/// Says what a ruleset without kube-proxy's table holds instead (on stderr).
pub fn warn_without_kube_proxy_table(name: &str, rs: &nft::Ruleset<'_>) {
    warn(format!("{name}: {}", without_kube_proxy_table(rs)));
}

/// The ruleset of an input read by [`read_ruleset`] (or a part of a paste), ready to be drawn:
/// the input's cuts are its gaps.
pub fn ruleset_graphs(input: &DumpText, lenient: bool) -> anyhow::Result<NftGraphs<'_>> {
    let rs = parse_ruleset(input, lenient)?;
    let mut nft = NftGraphs::new(rs);
    for &line in &input.cuts {
        nft.add_gap(format!("the paste is cut at line {line}"));
    }
    Ok(nft)
}

/// Runs `graph --nft-ruleset FILE`.
pub fn run(
    path: &Path,
    format: GraphFormat,
    lenient: bool,
    global: &GlobalArgs,
) -> anyhow::Result<Outcome> {
    let input = read_ruleset(path, lenient)?;
    let nft = ruleset_graphs(&input, lenient)?;
    let opts = GraphOptions {
        source: Some(input.name.clone()),
        ..GraphOptions::default()
    };
    let mut graphs = nft.graphs(&opts);
    if graphs.is_empty() {
        warn_without_kube_proxy_table(&input.name, nft.ruleset());
        graphs.push(crate::graph::ServiceGraph {
            source: Some(input.name.clone()),
            ..Default::default()
        });
    }
    if graphs.iter().any(|g| !g.gaps.is_empty()) {
        warn(format!(
            "{}: the input is partial: chains whose callers may be missing are not reported as stale",
            input.name
        ));
    }
    if format == GraphFormat::Json {
        let out = std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock());
        output::write_json(out, &GraphDocument::new(&graphs))?;
    } else {
        super::common::write_stdout(&render(&graphs, format, global.no_headers)?)?;
    }
    // The process ends after this: freeing a large table's rules and graph allocation by
    // allocation is work nobody waits for.
    std::mem::forget(graphs);
    std::mem::forget(nft);
    std::mem::forget(input);
    Ok(Outcome::Clean)
}
