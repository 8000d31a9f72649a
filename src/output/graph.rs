//! Human renderings of a [`ServiceGraph`]: kubectl-like tables (default and wide) and Graphviz DOT.
//! The machine forms are the serde derives (JSON/YAML via [`crate::output`]).

use super::dot::{Cluster, Digraph};
use super::table::KubeTable;
use crate::graph::{
    AnomalyKind, ChainKind, Entry, EntryKind, GraphDocument, MasqueradeReason, ServiceGraph,
    ServicePort, VerdictReason, percent,
};
use rayon::prelude::*;
use std::collections::BTreeSet;

fn entry_short(e: &Entry) -> String {
    let kind = match e.kind {
        EntryKind::ClusterIp => "cluster",
        EntryKind::ExternalIp => "external",
        EntryKind::LoadBalancerIp => "lb",
        EntryKind::NodePort => "nodeport",
        EntryKind::HealthCheckNodePort => "healthcheck",
    };
    let addr = e.address.as_deref().unwrap_or("");
    let port = e.port.map(|p| p.to_string()).unwrap_or_else(|| "*".into());
    if addr.contains(':') && !addr.contains('/') {
        format!("{kind} [{addr}]:{port}")
    } else {
        format!("{kind} {addr}:{port}")
    }
}

fn entries_cell(p: &ServicePort) -> String {
    let mut seen = BTreeSet::new();
    let list: Vec<String> = p
        .entries
        .iter()
        .map(entry_short)
        .filter(|s| seen.insert(s.clone()))
        .collect();
    if list.is_empty() {
        "<none>".into()
    } else {
        list.join(", ")
    }
}

fn endpoints_cell(p: &ServicePort) -> String {
    if !p.unknown_layout.is_empty() {
        // What was read may be incomplete: no endpoint list is shown as if it were.
        return format!(
            "<unknown layout> ({} object(s) this build does not know)",
            p.unknown_layout.len()
        );
    }
    if p.endpoints.is_empty() {
        let v: BTreeSet<&str> = p.verdicts.iter().map(|v| v.verdict.as_str()).collect();
        return if v.is_empty() {
            "<none>".into()
        } else {
            format!("<none> ({})", v.into_iter().collect::<Vec<_>>().join(","))
        };
    }
    p.endpoints
        .iter()
        .map(|e| {
            let dest = e.destination.unwrap_or(e.chain);
            let shares: Vec<String> = e
                .shares
                .iter()
                .filter(|s| s.share > 0.0 || s.probability.is_some())
                .map(|s| percent(s.share))
                .collect();
            if shares.is_empty() {
                format!("{dest} (unused)")
            } else {
                format!("{dest} {}", shares.join("/"))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn masquerade_cell(p: &ServicePort) -> String {
    let reasons: BTreeSet<&str> = p
        .masquerade
        .iter()
        .map(|m| match m.reason {
            MasqueradeReason::OffClusterSource => "off-cluster",
            MasqueradeReason::AllSources => "all",
            MasqueradeReason::Hairpin => "hairpin",
            MasqueradeReason::LocalSource => "local-src",
            MasqueradeReason::ExternalDestination => "external",
            MasqueradeReason::Other => "other",
        })
        .collect();
    if reasons.is_empty() {
        "<none>".into()
    } else {
        reasons.into_iter().collect::<Vec<_>>().join(",")
    }
}

fn anomaly_count(g: &ServiceGraph, p: &ServicePort) -> usize {
    let name = p.display_name();
    g.anomalies
        .iter()
        .filter(|a| a.service.as_deref() == Some(name.as_str()))
        .count()
}

/// The service-port table (`-o table`, or `-o wide` with chains, affinity, firewall and verdicts).
pub fn service_table(g: &ServiceGraph, wide: bool) -> KubeTable {
    let mut headers = vec![
        "service-port",
        "protocol",
        "entries",
        "endpoints",
        "masquerade",
        "anomalies",
    ];
    if wide {
        headers.extend(["chains", "affinity", "firewall", "verdicts"]);
    }
    let mut t = KubeTable::new(headers);
    // Entries, endpoints and masquerade reasons stack on a narrow terminal.
    t.lists(&[2, 3, 4]);
    // Rows are made on every core: a large node has tens of thousands.
    let rows: Vec<Vec<String>> = g
        .service_ports
        .par_iter()
        .map(|p| service_row(g, p, wide))
        .collect();
    for row in rows {
        t.row(row);
    }
    t
}

/// One row of [`service_table`].
fn service_row(g: &ServiceGraph, p: &ServicePort, wide: bool) -> Vec<String> {
    let mut row = vec![
        p.display_name(),
        p.protocol.clone().unwrap_or_else(|| "?".into()),
        entries_cell(p),
        endpoints_cell(p),
        masquerade_cell(p),
        anomaly_count(g, p).to_string(),
    ];
    if wide {
        let chains: Vec<&str> = p.chains.iter().map(|c| c.name.as_str()).collect();
        row.push(if chains.is_empty() {
            "<none>".into()
        } else {
            chains.join(",")
        });
        row.push(match &p.affinity {
            Some(a) => format!(
                "ClientIP/{}",
                a.timeout_seconds
                    .map(|s| format!("{s}s"))
                    .unwrap_or_else(|| "?".into())
            ),
            None => "<none>".into(),
        });
        row.push(match &p.firewall {
            Some(f) if f.source_ranges.is_empty() => "<no ranges>".into(),
            Some(f) => f.source_ranges.join(","),
            None => "<none>".into(),
        });
        let verdicts: Vec<String> = p
            .verdicts
            .iter()
            .map(|v| {
                let why = match v.reason {
                    VerdictReason::NoEndpoints => "no-endpoints",
                    VerdictReason::NoLocalEndpoints => "no-local-endpoints",
                    VerdictReason::SourceRange => "source-range",
                    VerdictReason::FallThrough => "fall-through",
                    VerdictReason::Other => "other",
                };
                format!(
                    "{} {}:{} ({why})",
                    v.verdict,
                    v.address.as_deref().unwrap_or(""),
                    v.port.map(|p| p.to_string()).unwrap_or_else(|| "*".into())
                )
            })
            .collect();
        row.push(if verdicts.is_empty() {
            "<none>".into()
        } else {
            verdicts.join(", ")
        });
    }
    row
}

/// The anomaly table.
pub fn anomaly_table(g: &ServiceGraph) -> KubeTable {
    let mut t = KubeTable::new(["anomaly", "table", "chain", "line", "service", "message"]);
    for a in &g.anomalies {
        let kind = serde_json::to_value(a.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        t.row([
            kind,
            a.table.clone(),
            a.chain.clone().unwrap_or_else(|| "-".into()),
            a.line.map(|l| l.to_string()).unwrap_or_else(|| "-".into()),
            a.service.clone().unwrap_or_else(|| "-".into()),
            a.message.clone(),
        ]);
    }
    t
}

/// The whole `-o table|wide` text of a graph: the service table, then (if any) the anomalies.
pub fn table_text(g: &ServiceGraph, wide: bool, no_headers: bool) -> String {
    table_text_within(g, wide, no_headers, None)
}

/// [`table_text`] for a terminal `width` columns wide: lists stack within their cells when the
/// service table is wider, and a line says so when it is still wider.
pub fn table_text_within(
    g: &ServiceGraph,
    wide: bool,
    no_headers: bool,
    width: Option<usize>,
) -> String {
    let mut out = service_table(g, wide).render_within(no_headers, width);
    let widest = out.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    if let Some(w) = width.filter(|&w| widest > w) {
        out.push_str(&format!(
            "(the table is {widest} columns wide, the terminal {w}: `| less -S` scrolls it; -o json has every field)\n"
        ));
    }
    let anomalies = anomaly_table(g);
    if !anomalies.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&anomalies.render(no_headers));
    }
    if !g.gaps.is_empty() {
        // What the input lacks is said where the answer is read, not only on stderr.
        out.push_str("\npartial input: the graph shows only the rules it holds, and no chain is called stale or empty for what it lacks:\n");
        for gap in &g.gaps {
            out.push_str(&format!("  - {gap}\n"));
        }
    }
    out
}

fn chain_color(kind: ChainKind) -> &'static str {
    match kind {
        ChainKind::Svc | ChainKind::Svl | ChainKind::Xlb => "#1f77b4",
        ChainKind::Ext | ChainKind::Fw => "#9467bd",
        ChainKind::Sep => "#2ca02c",
        ChainKind::Fixed => "black",
    }
}

/// Graphviz DOT of a graph: one cluster per service port; entries → chains → endpoints → DNAT.
pub fn dot(g: &ServiceGraph) -> String {
    let name = g.source.as_deref().unwrap_or("kproxy");
    let mut d = Digraph::new(name);
    for p in &g.service_ports {
        let id = p.hash.clone().unwrap_or_else(|| p.display_name());
        let title = match &p.protocol {
            Some(pr) => format!("{} ({pr})", p.display_name()),
            None => p.display_name(),
        };
        let mut c = Cluster::new(&id, &title);
        for (i, e) in p.entries.iter().enumerate() {
            let eid = format!("entry:{id}:{i}");
            c.node(
                &eid,
                &[
                    ("label", &format!("{}\n{}", e.kind.label(), e.display())),
                    ("shape", "ellipse"),
                ],
            );
            c.edge(&eid, &e.target, &[]);
        }
        for ch in &p.chains {
            c.node(&ch.name, &[("color", chain_color(ch.kind))]);
        }
        for ep in &p.endpoints {
            c.node(ep.chain, &[("color", chain_color(ChainKind::Sep))]);
            if let Some(dest) = &ep.destination {
                let did = format!("dnat:{}", ep.chain);
                c.node(
                    &did,
                    &[("label", &format!("DNAT {dest}")), ("shape", "note")],
                );
                c.edge(ep.chain, &did, &[]);
            }
        }
        for e in &p.edges {
            let mut label = e.label.clone();
            if let Some(s) = p
                .endpoints
                .iter()
                .find(|ep| ep.chain == e.to)
                .and_then(|ep| {
                    ep.shares
                        .iter()
                        .find(|s| s.via == e.from && s.line == e.line)
                })
            {
                label = if label.is_empty() {
                    percent(s.share).into()
                } else {
                    format!("{label}\n{}", percent(s.share)).into()
                };
            }
            let style = if e.label == "affinity" {
                "dashed"
            } else {
                "solid"
            };
            c.edge(e.from, e.to, &[("label", &label), ("style", style)]);
        }
        for (i, v) in p.verdicts.iter().enumerate() {
            let vid = format!("verdict:{id}:{i}");
            c.node(
                &vid,
                &[
                    (
                        "label",
                        &format!(
                            "{} {} {}:{}",
                            v.table,
                            v.verdict,
                            v.address.as_deref().unwrap_or(""),
                            v.port.map(|p| p.to_string()).unwrap_or_else(|| "*".into())
                        ),
                    ),
                    ("shape", "octagon"),
                    ("color", "red"),
                ],
            );
        }
        d.cluster(c);
    }
    for a in g
        .anomalies
        .iter()
        .filter(|a| a.kind == AnomalyKind::UndeclaredJump)
    {
        if let Some(ch) = &a.chain {
            d.node(ch, &[("color", "orange")]);
        }
    }
    d.render()
}

/// `graph -o json` of `graphs`, byte for byte as [`super::write_json`] writes their
/// [`GraphDocument`], with the service ports (nearly all of a large node's document) written
/// in parallel, a run at a time; then flushed.
pub fn write_json<W: std::io::Write>(
    mut out: W,
    graphs: &[ServiceGraph<'_>],
) -> Result<(), super::OutputError> {
    // The document without its service ports, whose empty lists mark where they go.
    let shells: Vec<ServiceGraph<'_>> = graphs.iter().map(without_ports).collect();
    let text = serde_json::to_string_pretty(&GraphDocument::new(&shells))?;
    const EMPTY: &str = "\"service_ports\": []";
    let mut rest = text.as_str();
    for g in graphs {
        // A string value never holds `"service_ports": []`: its quotes would be escaped.
        let Some(at) = rest.find(EMPTY) else {
            break;
        };
        let indent = at - rest[..at].rfind('\n').map_or(0, |i| i + 1);
        // Up to and with `[`.
        out.write_all(&rest.as_bytes()[..at + EMPTY.len() - 1])?;
        write_ports(&mut out, &g.service_ports, indent)?;
        rest = &rest[at + EMPTY.len()..];
    }
    out.write_all(rest.as_bytes())?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// A copy of `g` without its service ports.
fn without_ports<'a>(g: &ServiceGraph<'a>) -> ServiceGraph<'a> {
    // Every field named: a new one is not forgotten here.
    ServiceGraph {
        source: g.source.clone(),
        family: g.family.clone(),
        backend: g.backend.clone(),
        masquerade_mark: g.masquerade_mark.clone(),
        service_ports: Vec::new(),
        anomalies: g.anomalies.clone(),
        skipped_lines: g.skipped_lines.clone(),
        gaps: g.gaps.clone(),
    }
}

/// The elements of a service-port list whose key is indented by `indent` spaces and whose `[`
/// is written, then its `]`, as serde_json's pretty printer writes them.
fn write_ports<W: std::io::Write>(
    out: &mut W,
    ports: &[ServicePort<'_>],
    indent: usize,
) -> Result<(), super::OutputError> {
    use rayon::prelude::*;
    /// Service ports written at a time: enough for every core, few enough to hold.
    const RUN: usize = 512;
    let inner = format!("\n{}", " ".repeat(indent + 2));
    for (run, ports) in ports.chunks(RUN).enumerate() {
        let texts: Vec<Result<String, serde_json::Error>> = ports
            .par_iter()
            .map(|p| serde_json::to_string_pretty(p).map(|t| t.replace('\n', &inner)))
            .collect();
        for (i, text) in texts.into_iter().enumerate() {
            out.write_all(if run == 0 && i == 0 { b"" } else { b"," })?;
            out.write_all(inner.as_bytes())?;
            out.write_all(text?.as_bytes())?;
        }
    }
    if !ports.is_empty() {
        write!(out, "\n{}", " ".repeat(indent))?;
    }
    out.write_all(b"]")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{GraphOptions, from_dump};
    use crate::parsers::iptables::{ParseOptions, parse_dump};

    #[test]
    fn json_written_in_parallel_is_the_documents_json() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testdata/dumps/cluster.nft.save"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let dump = parse_dump(&text, &ParseOptions::strict()).unwrap_or_else(|e| panic!("{e}"));
        let mut big = from_dump(dump, &GraphOptions::default());
        assert!(!big.service_ports.is_empty());
        // More ports than one parallel run, a graph without any, and a source that names the key.
        let one = big.service_ports.clone();
        while big.service_ports.len() <= 1100 {
            big.service_ports.extend(one.iter().cloned());
        }
        let empty = ServiceGraph {
            source: Some("\"service_ports\": []".into()),
            ..ServiceGraph::default()
        };
        for graphs in [vec![big.clone(), empty.clone()], vec![empty, big]] {
            let mut parallel = Vec::new();
            write_json(&mut parallel, &graphs).unwrap_or_else(|e| panic!("{e}"));
            let mut serial = Vec::new();
            crate::output::write_json(&mut serial, &GraphDocument::new(&graphs))
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(parallel == serial, "the parallel writer's bytes differ");
        }
    }
}
