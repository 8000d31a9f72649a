//! The IPVS graph of a node: virtual servers → real servers with weights and counters, plus the
//! ipsets that mention each virtual server (built from `ipvsadm` and `ipset` dumps; no API state).
//!
//! [`build`] merges every listing in the capture (`-Ln`, `-Sn`, `--stats`, `--rate`, `-Lnc`), so
//! attributes, byte/packet counters and connection entries end up on the same virtual server.

use kproxy_parsers::ipset::{IpSet, Member};
use kproxy_parsers::ipvsadm::{Counter, IpvsDump, ServiceKey, SocketText, Stats};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

/// The schema identifier of the JSON/YAML form.
pub const SCHEMA: &str = "kproxy.ipvs-graph/v1";

/// Byte/packet counters in plain numbers (a `lower_bound` flag when ipvsadm printed K/M/G suffixes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct GraphStats {
    /// Connections (or CPS for rates).
    pub conns: u64,
    /// Packets in.
    pub in_pkts: u64,
    /// Packets out.
    pub out_pkts: u64,
    /// Bytes in.
    pub in_bytes: u64,
    /// Bytes out.
    pub out_bytes: u64,
    /// True when any value is a lower bound (printed without `--exact`).
    pub lower_bound: bool,
}

impl From<Stats> for GraphStats {
    fn from(s: Stats) -> Self {
        let all: [Counter; 5] = [s.conns, s.in_pkts, s.out_pkts, s.in_bytes, s.out_bytes];
        GraphStats {
            conns: s.conns.value,
            in_pkts: s.in_pkts.value,
            out_pkts: s.out_pkts.value,
            in_bytes: s.in_bytes.value,
            out_bytes: s.out_bytes.value,
            lower_bound: all.iter().any(|c| !c.exact),
        }
    }
}

/// A real server in the graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphRs {
    /// Address.
    pub address: IpAddr,
    /// Port.
    pub port: u16,
    /// Forwarding method (`Masq`, `Local`, `Route`, `Tunnel`), when known.
    pub forward: Option<&'static str>,
    /// Weight, when known.
    pub weight: Option<i32>,
    /// ActiveConn, when known.
    pub active_conns: Option<u64>,
    /// InActConn, when known.
    pub inactive_conns: Option<u64>,
    /// Rows of the connection table (`-Lnc`) to this real server through this virtual server.
    pub connection_entries: Option<u64>,
    /// `--stats` counters.
    pub stats: Option<GraphStats>,
}

/// A virtual server in the graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphVs {
    /// `TCP`, `UDP`, `SCTP`, `FWM`.
    pub protocol: &'static str,
    /// Address (`None` for a firewall-mark service).
    pub address: Option<IpAddr>,
    /// Port (`None` for a firewall-mark service).
    pub port: Option<u16>,
    /// Firewall mark.
    pub fwmark: Option<u32>,
    /// Scheduler, when the dump shows it.
    pub scheduler: Option<String>,
    /// Scheduler flags.
    pub flags: Vec<String>,
    /// Persistence timeout.
    pub persistent_timeout_s: Option<u32>,
    /// `--stats` counters.
    pub stats: Option<GraphStats>,
    /// Real servers in dump order.
    pub real_servers: Vec<GraphRs>,
    /// kube-proxy ipsets that hold this virtual server (`ip,proto:port`, node port, or the address).
    pub ipsets: Vec<String>,
}

impl GraphVs {
    /// `TCP 10.96.0.1:443` / `FWM 100`.
    pub fn label(&self) -> String {
        match (self.address, self.port, self.fwmark) {
            (Some(a), Some(p), _) => format!("{} {}", self.protocol, SocketText(a, p)),
            (_, _, Some(m)) => format!("FWM {m}"),
            _ => self.protocol.to_string(),
        }
    }
}

/// One ipset in the graph.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GraphSet {
    /// Set type.
    #[serde(rename = "type")]
    pub set_type: String,
    /// Members (canonical text).
    pub entries: Vec<String>,
}

/// The IPVS graph of one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IpvsGraph {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    /// Virtual servers, sorted by key.
    pub virtual_servers: Vec<GraphVs>,
    /// ipsets by name (empty when no ipset dump was given).
    pub ipsets: BTreeMap<String, GraphSet>,
    /// Rows of the connection table, when one was captured.
    pub connection_entries: Option<usize>,
    /// Persistence templates among them (client port 0).
    pub persistence_templates: Option<usize>,
    /// Lines of the capture that were skipped: prompts, and under `--lenient` lines no reader
    /// could read (see [`IpvsGraph::gaps`] for what that leaves out).
    pub skipped_lines: Vec<usize>,
    /// Why the capture is not all of what the commands printed (a `...` cut, a cut ipset
    /// listing, unreadable lines), in words; empty for a whole capture. The graph shows only
    /// what the capture holds: what these name is unknown, not absent.
    pub gaps: Vec<String>,
    /// Connection-table rows (`-Lnc`) to virtual addresses the capture lists no virtual
    /// server for (all of them when it holds only a connection listing), per virtual address
    /// and destination.
    pub connections_without_virtual_server: Vec<ConnectionGroup>,
}

/// Connection-table rows of one protocol, virtual address and destination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConnectionGroup {
    /// `TCP`, `UDP`, `SCTP`, …
    pub protocol: String,
    /// The virtual address and port (`ADDR:PORT`, IPv6 as `[ADDR]:PORT`).
    pub virtual_address: String,
    /// The destination (real server) address and port.
    pub destination: String,
    /// Rows, persistence templates included.
    pub entries: usize,
}

fn set_mentions(set: &IpSet<'_>, proto: &str, addr: IpAddr, port: u16) -> bool {
    set.entries.iter().any(|e| match &e.member {
        Member::Ip(a) => *a == addr,
        Member::IpPort(a, p, pt) => *a == addr && p == proto && *pt == port,
        Member::IpPortIp(a, p, pt, _) | Member::IpPortNet(a, p, pt, _, _) => {
            *a == addr && p == proto && *pt == port
        }
        Member::Port(p) => {
            *p == port
                && (set
                    .name
                    .ends_with(&format!("-{}", proto.to_ascii_uppercase()))
                    || set.name.contains("HEALTH"))
        }
        _ => false,
    })
}

/// Builds the graph from a parsed ipvsadm capture and (optionally) parsed ipsets.
pub fn build(dump: &IpvsDump<'_>, ipsets: Option<&[IpSet<'_>]>) -> IpvsGraph {
    let mut conn: BTreeMap<(IpAddr, u16, IpAddr, u16), u64> = BTreeMap::new();
    for c in &dump.connections {
        *conn
            .entry((c.virtual_addr.0, c.virtual_addr.1, c.dest.0, c.dest.1))
            .or_insert(0) += 1;
    }
    let mut vss = Vec::new();
    for s in dump.merged_services() {
        let (protocol, address, port, fwmark) = match s.key {
            ServiceKey::Inet {
                protocol,
                addr,
                port,
            } => (protocol.as_str(), Some(addr), Some(port), None),
            ServiceKey::Fwmark { mark, .. } => ("FWM", None, None, Some(mark)),
        };
        let real_servers = s
            .real_servers
            .iter()
            .map(|r| GraphRs {
                address: r.addr,
                port: r.port,
                forward: r.forward.map(|f| f.as_str()),
                weight: r.weight,
                active_conns: r.active_conns,
                inactive_conns: r.inactive_conns,
                connection_entries: match (dump.has_connection_table, address, port) {
                    (true, Some(a), Some(p)) => {
                        Some(conn.get(&(a, p, r.addr, r.port)).copied().unwrap_or(0))
                    }
                    _ => None,
                },
                stats: r.stats.map(GraphStats::from),
            })
            .collect();
        let mut in_sets = Vec::new();
        if let (Some(sets), Some(a), Some(p)) = (ipsets, address, port) {
            let lower = protocol.to_ascii_lowercase();
            for set in sets {
                if set_mentions(set, &lower, a, p) {
                    in_sets.push(set.name.to_string());
                }
            }
        }
        vss.push(GraphVs {
            protocol,
            address,
            port,
            fwmark,
            scheduler: s.scheduler.map(str::to_string),
            flags: s.sched_flags.iter().map(|f| f.to_string()).collect(),
            persistent_timeout_s: s.persistent,
            stats: s.stats.map(GraphStats::from),
            real_servers,
            ipsets: in_sets,
        });
    }
    let ipsets = ipsets
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s.name.to_string(),
                GraphSet {
                    set_type: s.set_type.to_string(),
                    entries: s.entries.iter().map(|e| e.member.to_string()).collect(),
                },
            )
        })
        .collect();
    let connections_without_virtual_server = unlisted_connections(dump, &vss);
    IpvsGraph {
        schema: SCHEMA,
        virtual_servers: vss,
        ipsets,
        connection_entries: dump.has_connection_table.then_some(dump.connections.len()),
        persistence_templates: dump
            .has_connection_table
            .then(|| dump.connections.iter().filter(|c| c.is_template()).count()),
        skipped_lines: dump.skipped.iter().map(|s| s.line).collect(),
        gaps: Vec::new(),
        connections_without_virtual_server,
    }
}

/// The connection rows whose virtual address and port no listed virtual server has.
fn unlisted_connections(dump: &IpvsDump<'_>, vss: &[GraphVs]) -> Vec<ConnectionGroup> {
    type Socket = (IpAddr, u16);
    let mut groups: BTreeMap<(&str, Socket, Socket), usize> = BTreeMap::new();
    for c in &dump.connections {
        let listed = vss.iter().any(|v| {
            v.address == Some(c.virtual_addr.0)
                && v.port == Some(c.virtual_addr.1)
                && v.protocol.eq_ignore_ascii_case(c.protocol)
        });
        if !listed {
            *groups
                .entry((c.protocol, c.virtual_addr, c.dest))
                .or_insert(0) += 1;
        }
    }
    groups
        .into_iter()
        .map(
            |((protocol, (va, vp), (da, dp)), entries)| ConnectionGroup {
                protocol: protocol.to_ascii_uppercase(),
                virtual_address: SocketText(va, vp).to_string(),
                destination: SocketText(da, dp).to_string(),
                entries,
            },
        )
        .collect()
}

/// `-` for `None`, else the value.
pub fn opt_text<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn opt<T: std::fmt::Display>(v: Option<T>) -> String {
    opt_text(v)
}

/// The table form: one row per real server (a virtual server without real servers gets one
/// row); then the connection rows to virtual addresses the capture lists no virtual server for,
/// and what the capture lacks. Empty when the capture holds none of these.
pub fn table(g: &IpvsGraph, no_headers: bool) -> String {
    let mut out = servers_table(g, no_headers);
    if let (true, true, Some(rows)) = (
        g.virtual_servers.is_empty(),
        g.connections_without_virtual_server.is_empty(),
        g.connection_entries,
    ) {
        let _ = writeln!(
            out,
            "No IPVS virtual servers: the input holds an `ipvsadm -Lnc` connection table ({rows} rows) and no listing of virtual servers (`ipvsadm -Ln` prints one)."
        );
    }
    if !g.connections_without_virtual_server.is_empty() {
        if !out.is_empty() {
            out.push('\n');
        }
        let total: usize = g
            .connections_without_virtual_server
            .iter()
            .map(|c| c.entries)
            .sum();
        let _ = writeln!(
            out,
            "{total} connection-table row(s) (`ipvsadm -Lnc`) to virtual addresses the input lists no virtual server for (`ipvsadm -Ln` lists them):"
        );
        let mut rows = Vec::new();
        if !no_headers {
            rows.push(["PROTOCOL", "VIRTUAL", "DESTINATION", "ENTRIES"].map(String::from));
        }
        for c in &g.connections_without_virtual_server {
            rows.push([
                c.protocol.clone(),
                c.virtual_address.clone(),
                c.destination.clone(),
                c.entries.to_string(),
            ]);
        }
        out.push_str(&aligned(&rows));
    }
    if !out.is_empty() && !g.gaps.is_empty() {
        out.push_str("\npartial input: the graph shows only what it holds:\n");
        for gap in &g.gaps {
            let _ = writeln!(out, "  - {gap}");
        }
    }
    out
}

/// Rows padded to their columns' widths, three blanks apart; the last column unpadded.
fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, (c, w)) in r.iter().zip(widths.iter()).enumerate() {
            if i + 1 == r.len() {
                line.push_str(c);
            } else {
                let _ = write!(line, "{c:<w$}   ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// The virtual servers and their real servers, one row per real server.
fn servers_table(g: &IpvsGraph, no_headers: bool) -> String {
    let mut rows: Vec<[String; 9]> = Vec::new();
    if !no_headers {
        rows.push(
            [
                "VIRTUAL SERVER",
                "SCHED",
                "PERSIST",
                "REAL SERVER",
                "FWD",
                "WEIGHT",
                "ACTIVE",
                "INACTIVE",
                "IPSETS",
            ]
            .map(String::from),
        );
    }
    for vs in &g.virtual_servers {
        let sched = match (&vs.scheduler, vs.flags.is_empty()) {
            (Some(s), true) => s.clone(),
            (Some(s), false) => format!("{s}({})", vs.flags.join(",")),
            (None, _) => "-".into(),
        };
        let head = [
            vs.label(),
            sched,
            opt(vs.persistent_timeout_s),
            String::new(),
        ];
        let sets = if vs.ipsets.is_empty() {
            "-".to_string()
        } else {
            vs.ipsets.join(",")
        };
        if vs.real_servers.is_empty() {
            rows.push([
                head[0].clone(),
                head[1].clone(),
                head[2].clone(),
                "(none)".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                "-".into(),
                sets,
            ]);
            continue;
        }
        for (i, r) in vs.real_servers.iter().enumerate() {
            let (active, inactive) = match (
                r.active_conns,
                r.inactive_conns,
                r.connection_entries,
                r.stats,
            ) {
                (Some(a), Some(b), _, _) => (a.to_string(), b.to_string()),
                (_, _, Some(c), _) => (format!("{c} conn"), "-".into()),
                (_, _, _, Some(s)) => (format!("{} total", s.conns), "-".into()),
                _ => ("-".into(), "-".into()),
            };
            let first = i == 0;
            rows.push([
                if first {
                    head[0].clone()
                } else {
                    String::new()
                },
                if first {
                    head[1].clone()
                } else {
                    String::new()
                },
                if first {
                    head[2].clone()
                } else {
                    String::new()
                },
                SocketText(r.address, r.port).to_string(),
                r.forward.unwrap_or("-").to_string(),
                opt(r.weight),
                active,
                inactive,
                if first { sets.clone() } else { String::new() },
            ]);
        }
    }
    if g.virtual_servers.is_empty() {
        return String::new();
    }
    aligned(&rows)
}

/// Graphviz DOT: virtual servers → real servers, edges labelled with weights.
pub fn dot(g: &IpvsGraph) -> String {
    let mut o = String::from(
        "digraph ipvs {\n  rankdir=LR;\n  node [shape=box, fontname=\"monospace\"];\n",
    );
    for (i, vs) in g.virtual_servers.iter().enumerate() {
        let sched = vs.scheduler.clone().unwrap_or_default();
        let _ = writeln!(
            o,
            "  vs{i} [label=\"{}\\n{}\", style=bold];",
            vs.label(),
            sched
        );
        for r in &vs.real_servers {
            let id =
                format!("rs_{}", SocketText(r.address, r.port)).replace(['.', ':', '[', ']'], "_");
            let _ = writeln!(
                o,
                "  {id} [label=\"{}\", shape=ellipse];",
                SocketText(r.address, r.port)
            );
            let style = if r.weight == Some(0) {
                ", style=dashed, color=red"
            } else {
                ""
            };
            let _ = writeln!(o, "  vs{i} -> {id} [label=\"w={}\"{style}];", opt(r.weight));
        }
    }
    o.push_str("}\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use kproxy_parsers::{ipset, ipvsadm};

    #[test]
    fn merges_listing_stats_and_connections() {
        let t = "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\nTCP  10.96.0.1:443 rr\n  -> 172.18.0.2:6443              Masq    1      3          0\nIP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n  -> RemoteAddress:Port\nTCP  10.96.0.1:443                      12       40       30     4000     3000\n  -> 172.18.0.2:6443                    12       40       30     4000     3000\nIPVS connection entries\npro expire state       source             virtual            destination\nTCP 14:58  ESTABLISHED 10.244.1.9:45678   10.96.0.1:443      172.18.0.2:6443\n";
        let d = ipvsadm::parse_dump(t).unwrap();
        let sets = ipset::parse_ipset("create KUBE-CLUSTER-IP hash:ip,port family inet\nadd KUBE-CLUSTER-IP 10.96.0.1,tcp:443\n").unwrap();
        let g = build(&d, Some(&sets));
        assert_eq!(g.virtual_servers.len(), 1);
        let vs = &g.virtual_servers[0];
        assert_eq!(vs.scheduler.as_deref(), Some("rr"));
        assert_eq!(vs.stats.map(|s| s.conns), Some(12));
        assert_eq!(vs.real_servers[0].connection_entries, Some(1));
        assert_eq!(vs.ipsets, vec!["KUBE-CLUSTER-IP"]);
        assert!(table(&g, false).contains("172.18.0.2:6443"));
        assert!(dot(&g).contains("w=1"));
    }
}
