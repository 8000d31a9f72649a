//! Renderings of the path view ([`PathView`], `trace svc/NAME`): a tree (coloured on a
//! terminal), a table with one row per entry point and endpoint, JSON/YAML and Graphviz DOT.

use super::OutputError;
use super::color::{Painter, Role};
use super::dot::{Cluster, Digraph};
use super::table::KubeTable;
use super::tree::TreeNode;
use crate::graph::{Counters, MasqueradeReason, percent};
use crate::trace::path::{DivergenceKind, EndpointPath, EntryPath, PathView, PortPath};
use std::collections::BTreeSet;

/// Output formats of the path view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathFormat {
    /// An indented tree (coloured on a terminal).
    Tree,
    /// One row per entry point and endpoint.
    Table,
    /// The [`PathView`] as JSON.
    Json,
    /// The [`PathView`] as YAML.
    Yaml,
    /// Graphviz DOT.
    Dot,
}

/// Renders `view` in `format`; `painter` only affects the tree.
pub fn render(
    view: &PathView,
    format: PathFormat,
    painter: Painter,
    no_headers: bool,
) -> Result<String, OutputError> {
    Ok(match format {
        PathFormat::Tree => tree(view, painter),
        PathFormat::Table => table(view, no_headers),
        PathFormat::Json => super::to_json(view)?,
        PathFormat::Yaml => super::to_yaml(view)?,
        PathFormat::Dot => dot(view),
    })
}

/// The tree form of `view`.
pub fn tree(view: &PathView, p: Painter) -> String {
    let mut header = format!("service {}", p.paint(Role::Strong, &view.service));
    let mut facts = Vec::new();
    if let Some(n) = &view.node {
        facts.push(format!("node {n}"));
    }
    if let Some(s) = &view.source {
        facts.push(format!("rules from {s}"));
    }
    if view.compared_with_api {
        facts.push(if view.divergence_count == 0 {
            p.paint(Role::Ok, "matches the API")
        } else {
            p.paint(
                Role::Error,
                &format!(
                    "{} divergence{} from the API",
                    view.divergence_count,
                    if view.divergence_count == 1 { "" } else { "s" }
                ),
            )
        });
    }
    if !facts.is_empty() {
        header.push_str(&format!("  ({})", facts.join(", ")));
    }
    let mut root = TreeNode::new(header);
    if !view.partial.is_empty() {
        root.push(TreeNode::new(partial_text(view)));
    }
    for port in &view.ports {
        root.push(port_tree(port, p));
    }
    root.render()
}

/// What a view of a partial dump says of it: it shows only what the dump holds.
fn partial_text(view: &PathView) -> String {
    format!(
        "partial input: the path shows only the rules it holds ({})",
        view.partial.join("; ")
    )
}

/// The table form of `view`: one row per entry point and endpoint.
pub fn table(view: &PathView, no_headers: bool) -> String {
    let mut t = KubeTable::new([
        "port",
        "entry",
        "path",
        "endpoint",
        "share",
        "pod",
        "node",
        "state",
        "masquerade",
        "note",
    ]);
    for port in &view.ports {
        let pname = port_label(port);
        if port.entries.is_empty() {
            let note = port
                .divergences
                .first()
                .map(|d| d.message.clone())
                .unwrap_or_default();
            t.row([
                pname.clone(),
                "<none>".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                note,
            ]);
            continue;
        }
        for e in &port.entries {
            let masq: BTreeSet<&str> = e.masquerade.iter().map(|m| masq_short(m.reason)).collect();
            let masq = if masq.is_empty() {
                "<none>".to_string()
            } else {
                masq.into_iter().collect::<Vec<_>>().join(",")
            };
            let entry = format!("{} {}", e.kind.label(), e.display);
            let rows_before = t.len();
            for b in &e.branches {
                let path = if b.when == "any source" {
                    b.chains.join(" > ")
                } else {
                    format!("[{}] {}", b.when, b.chains.join(" > "))
                };
                for ep in &b.endpoints {
                    let pod = ep.pod.as_ref();
                    t.row([
                        pname.clone(),
                        entry.clone(),
                        path.clone(),
                        ep.destination.clone().unwrap_or_else(|| ep.chain.clone()),
                        match ep.live_flows {
                            Some(n) => format!(
                                "{} ({})",
                                percent(ep.share),
                                crate::trace::conntrack::flows_text(n)
                            ),
                            None => percent(ep.share),
                        },
                        pod.and_then(|p| p.name.clone())
                            .unwrap_or_else(|| "-".into()),
                        pod.and_then(|p| p.node.clone())
                            .unwrap_or_else(|| "-".into()),
                        pod.map(|p| p.state().to_string())
                            .unwrap_or_else(|| "-".into()),
                        masq.clone(),
                        ep.divergence
                            .as_ref()
                            .map(|d| d.message.clone())
                            .unwrap_or_default(),
                    ]);
                }
                if b.endpoints.is_empty() {
                    t.row([
                        pname.clone(),
                        entry.clone(),
                        path,
                        "<none>".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        masq.clone(),
                        String::new(),
                    ]);
                }
            }
            for o in &e.other_flows {
                t.row([
                    pname.clone(),
                    entry.clone(),
                    "conntrack".into(),
                    o.reply_source.clone(),
                    format!("0% ({})", crate::trace::conntrack::flows_text(o.flows)),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    o.describe(),
                ]);
            }
            for v in &e.verdicts {
                t.row([
                    pname.clone(),
                    entry.clone(),
                    format!("{}/{}", v.table, v.chain),
                    v.verdict.clone(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    v.why.clone(),
                ]);
            }
            if t.len() == rows_before {
                t.row([
                    pname.clone(),
                    entry,
                    e.target.clone(),
                    "<none>".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    masq,
                    String::new(),
                ]);
            }
        }
        for d in &port.divergences {
            t.row([
                pname.clone(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                d.message.clone(),
            ]);
        }
    }
    let mut out = t.render(no_headers);
    if !view.partial.is_empty() {
        out.push_str(&partial_text(view));
        out.push('\n');
    }
    out
}

/// Graphviz DOT: entries → chains → endpoints → pods; divergent endpoints red, missing dashed.
pub fn dot(view: &PathView) -> String {
    let mut d = Digraph::new(&view.service);
    for port in &view.ports {
        let pid = port.hash.clone().unwrap_or_else(|| port.name.clone());
        let mut c = Cluster::new(&pid, &port_label(port));
        let mut seen_nodes: BTreeSet<String> = BTreeSet::new();
        let mut seen_edges: BTreeSet<(String, String)> = BTreeSet::new();
        for (i, e) in port.entries.iter().enumerate() {
            let eid = format!("{pid}:entry:{i}");
            c.node(
                &eid,
                &[
                    ("label", &format!("{}\n{}", e.kind.label(), e.display)),
                    ("shape", "ellipse"),
                ],
            );
            let first = e.branches.first().and_then(|b| b.chains.first()).cloned();
            match first {
                Some(f) => {
                    c.edge(&eid, &f, &[]);
                }
                None => {
                    for v in &e.verdicts {
                        let vid = format!("{eid}:{}", v.verdict);
                        c.node(
                            &vid,
                            &[
                                ("label", &format!("{} {}\n{}", v.table, v.verdict, v.why)),
                                ("shape", "octagon"),
                                ("color", "red"),
                            ],
                        );
                        c.edge(&eid, &vid, &[]);
                    }
                }
            }
            for b in &e.branches {
                for ch in &b.chains {
                    if seen_nodes.insert(ch.clone()) {
                        c.node(ch, &[]);
                    }
                }
                for w in b.chains.windows(2) {
                    if let [a, z] = w
                        && seen_edges.insert((a.clone(), z.clone()))
                    {
                        let label = if b.when == "any source" {
                            String::new()
                        } else {
                            b.when.clone()
                        };
                        c.edge(a, z, &[("label", &label)]);
                    }
                }
                let Some(policy) = &b.policy_chain else {
                    continue;
                };
                for ep in &b.endpoints {
                    if seen_nodes.insert(ep.chain.clone()) {
                        let dest = ep.destination.clone().unwrap_or_default();
                        let pod = ep
                            .pod
                            .as_ref()
                            .and_then(|p| p.name.clone())
                            .unwrap_or_default();
                        let label = format!("{}\nDNAT {dest}\n{pod}", ep.chain);
                        let color = if ep.divergence.is_some() {
                            "red"
                        } else {
                            "#2ca02c"
                        };
                        let style = if ep.line.is_none() { "dashed" } else { "solid" };
                        c.node(
                            &ep.chain,
                            &[
                                ("label", label.trim_end()),
                                ("color", color),
                                ("style", style),
                            ],
                        );
                    }
                    if seen_edges.insert((policy.clone(), ep.chain.clone())) {
                        let style = if ep.line.is_none() { "dashed" } else { "solid" };
                        c.edge(
                            policy,
                            &ep.chain,
                            &[("label", &percent(ep.share)), ("style", style)],
                        );
                    }
                }
            }
        }
        d.cluster(c);
    }
    d.render()
}

fn port_label(port: &PortPath) -> String {
    let num = port
        .port
        .map(|n| n.to_string())
        .unwrap_or_else(|| "?".into());
    let proto = port.protocol.as_deref().unwrap_or("?");
    if port.port_name.is_empty() {
        format!("{num}/{proto}")
    } else {
        format!("{} {num}/{proto}", port.port_name)
    }
}

fn masq_short(r: MasqueradeReason) -> &'static str {
    match r {
        MasqueradeReason::OffClusterSource => "off-cluster",
        MasqueradeReason::AllSources => "all",
        MasqueradeReason::Hairpin => "hairpin",
        MasqueradeReason::LocalSource => "local-src",
        MasqueradeReason::ExternalDestination => "external",
        MasqueradeReason::Other => "other",
    }
}

fn counters_text(c: Option<Counters>) -> String {
    c.map(|c| format!(", {} pkts {} bytes", c.packets, c.bytes))
        .unwrap_or_default()
}

fn port_tree(port: &PortPath, p: Painter) -> TreeNode {
    let mut label = format!("port {}", p.paint(Role::Strong, &port_label(port)));
    if let Some(h) = &port.hash {
        label.push_str(&format!("  {}", p.paint(Role::Dim, &format!("hash {h}"))));
    }
    let mut node = TreeNode::new(label);
    if let Some(a) = &port.affinity {
        let node_side = a
            .timeout_seconds
            .map(|s| format!("{s}s"))
            .unwrap_or_else(|| "none".into());
        let text = match a.expected_timeout_seconds {
            Some(e) => format!("session affinity ClientIP: {node_side} on the node (API: {e}s)"),
            None => format!("session affinity ClientIP: {node_side}"),
        };
        node.push(TreeNode::new(text));
    }
    for d in &port.divergences {
        node.push(TreeNode::new(
            p.paint(Role::Error, &format!("✗ {}", d.message)),
        ));
    }
    let unknown = port
        .divergences
        .iter()
        .any(|d| d.kind == DivergenceKind::UnknownLayout);
    for e in &port.entries {
        node.push(entry_tree(e, p, unknown));
    }
    node
}

/// ` line N`; nothing for line 0, which `nft -j` input gives every rule (JSON has no lines).
fn at_line(line: u32) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(" line {line}")
    }
}

/// One entry's subtree; `unknown`: the port's path holds what this build cannot read, so what
/// no branch shows is not known to be absent.
fn entry_tree(e: &EntryPath, p: Painter, unknown: bool) -> TreeNode {
    let rule = match e.line {
        Some(l) => format!(
            "{}{}{}",
            e.rule_chain,
            at_line(l),
            counters_text(e.counters)
        ),
        None => e.rule_chain.clone(),
    };
    let label = format!(
        "{} {} → {}  {}",
        e.kind.label(),
        p.paint(Role::Addr, &e.display),
        e.target,
        p.paint(Role::Dim, &format!("[{rule}]"))
    );
    let mut node = TreeNode::new(label);
    for v in &e.verdicts {
        let role = if v.verdict == "ACCEPT" {
            Role::Ok
        } else {
            Role::Error
        };
        node.push(TreeNode::new(
            format!(
                "{} {}  {}",
                p.paint(role, &v.why),
                p.paint(
                    Role::Dim,
                    &format!(
                        "[{}/{}{}{}]",
                        v.table,
                        v.chain,
                        at_line(v.line),
                        counters_text(v.counters)
                    )
                ),
                ""
            )
            .trim_end()
            .to_string(),
        ));
    }
    for m in &e.masquerade {
        // kube-proxy's masquerading chain: KUBE-POSTROUTING (iptables), masquerading (nftables).
        let snat_chain = if m.chain.starts_with("KUBE-") {
            "KUBE-POSTROUTING"
        } else {
            "masquerading"
        };
        node.push(TreeNode::new(format!(
            "masquerade: {}  {}",
            p.paint(Role::Warn, &m.why),
            p.paint(
                Role::Dim,
                &format!("[{}{}; SNAT in {snat_chain}]", m.chain, at_line(m.line))
            )
        )));
    }
    for b in &e.branches {
        let mut bn = TreeNode::new(format!("{}: {}", b.when, b.chains.join(" → ")));
        for ep in &b.endpoints {
            bn.push(TreeNode::new(endpoint_line(ep, p)));
        }
        if unknown && b.endpoints.is_empty() {
            bn.push(TreeNode::new(p.paint(
                Role::Warn,
                "endpoints unknown: the path holds what this build does not know (above)",
            )));
        } else if b.policy_chain.is_some() && b.endpoints.is_empty() {
            bn.push(TreeNode::new(p.paint(Role::Warn, "no endpoint rules")));
        }
        if b.policy_chain.is_none() && !unknown {
            bn.push(TreeNode::new(p.paint(
                Role::Warn,
                "leaves the chain without DNAT: the filter verdicts above decide",
            )));
        }
        node.push(bn);
    }
    for o in &e.other_flows {
        node.push(TreeNode::new(
            p.paint(Role::Error, &format!("✗ {}", o.describe())),
        ));
    }
    node
}

fn endpoint_line(ep: &EndpointPath, p: Painter) -> String {
    let share = format!("{:>6}", percent(ep.share));
    let share = if ep.divergence.is_some() {
        p.paint(Role::Error, &share)
    } else {
        p.paint(Role::Ok, &share)
    };
    let dest = ep.destination.clone().unwrap_or_else(|| "?".into());
    let mut s = format!("{share}  {} → {}", ep.chain, p.paint(Role::Addr, &dest));
    if let Some(pod) = &ep.pod {
        let mut facts = Vec::new();
        if let Some(n) = &pod.node {
            facts.push(format!("node {n}"));
        }
        if let Some(z) = &pod.zone {
            facts.push(format!("zone {z}"));
        }
        facts.push(pod.state().to_string());
        if pod.local {
            facts.push("local".into());
        }
        let who = match (&pod.kind, &pod.name) {
            (Some(k), Some(n)) => format!("{} {n}", k.to_lowercase()),
            _ => "endpoint".into(),
        };
        s.push_str(&format!("  {who} ({})", facts.join(", ")));
    }
    if let Some(c) = ep.counters {
        s.push_str(&p.paint(Role::Dim, &format!("  [{} pkts]", c.packets)));
    }
    if let Some(n) = ep.live_flows {
        s.push_str(&format!("  {}", crate::trace::conntrack::flows_text(n)));
    }
    if let Some(d) = &ep.divergence {
        s.push_str(&format!(
            "  {}",
            p.paint(Role::Error, &format!("✗ {}", d.message))
        ));
    }
    s
}
