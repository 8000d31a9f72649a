//! What this build knows of the layouts kube-proxy's nftables proxier writes, in every release
//! up to the newest it knows: the names of its fixed chains, sets and maps, the patterns of its
//! per-service ones, and the statement forms of its rules. Anything else in `table ip|ip6
//! kube-proxy` is an [`UnknownObject`]: written by a kube-proxy newer than this build, or by
//! another program. The graph, trace, verify and repair draw no conclusion from what they could
//! not read: they name these objects instead.
//!
//! Statement forms are those the graph and the packet model both evaluate (the kernel model
//! evaluates more, but a DNAT to a value looked up by the packet's own fields, for one, has no
//! share a graph can show): matches on addresses, ports, protocols, marks, interfaces,
//! conntrack state and status and `fib … type`; verdicts and verdict maps; `numgen random`;
//! `mark set mark or|xor|and M`; DNAT to an address or through a `numgen random` map of
//! addresses (and ports); `masquerade`; `reject`; `update @set`; counters and `log`.

use super::names::parse_object_name;
use crate::graph::{UnknownKind, UnknownObject};
use crate::model::nft_names as kp;
use crate::parsers::nft::{BinOp, Expr, NatKind, Stmt, Table};

/// The fixed chains of every release this build knows.
const FIXED_CHAINS: &[&str] = &[
    kp::FILTER_PREROUTING_PRE_DNAT,
    kp::FILTER_OUTPUT_PRE_DNAT,
    kp::FILTER_INPUT,
    kp::FILTER_FORWARD,
    kp::FILTER_OUTPUT,
    kp::NAT_PREROUTING,
    kp::NAT_OUTPUT,
    kp::NAT_POSTROUTING,
    kp::SERVICES_CHAIN,
    kp::SERVICE_ENDPOINTS_CHECK_CHAIN,
    kp::NODEPORT_ENDPOINTS_CHECK_CHAIN,
    kp::REJECT_CHAIN,
    kp::CLUSTER_IPS_CHECK_CHAIN,
    kp::FIREWALL_CHECK_CHAIN,
    kp::MARK_MASQ_CHAIN,
    kp::MASQUERADING_CHAIN,
    // The chains of the earlier nftables layouts (the 1.29 alpha's `endpoints-check`,
    // `forward` and `firewall-allow-check`; later `filter-prerouting` at dstnat - 10 and
    // `filter-output-post-dnat` at dstnat + 10), still on nodes that never resynced.
    "filter-prerouting",
    "filter-output-post-dnat",
    "endpoints-check",
    "forward",
    "firewall-allow-check",
];

/// The fixed sets and maps of every release this build knows.
const FIXED_SETS: &[&str] = &[
    kp::CLUSTER_IPS_SET,
    kp::NODEPORT_IPS_SET,
    kp::HAIRPIN_CONNECTIONS_SET,
    kp::SERVICE_IPS_MAP,
    kp::SERVICE_NODEPORTS_MAP,
    kp::NO_ENDPOINT_SERVICES_MAP,
    kp::NO_ENDPOINT_NODEPORTS_MAP,
    kp::FIREWALL_IPS_MAP,
    kp::LOCALHOST_NODEPORT_REJECT_MAP,
    // The 1.29 alpha's firewall sets.
    "firewall",
    "firewall-allow",
];

/// Whether `name` is one of kube-proxy's fixed chains (shared by every service port) in a
/// release this build knows.
pub fn fixed_chain(name: &str) -> bool {
    FIXED_CHAINS.contains(&name)
        || name
            .strip_prefix(kp::LOCALHOST_NODEPORT_REJECT_PREFIX)
            .is_some_and(|p| matches!(p, "tcp" | "udp" | "sctp"))
}

/// Whether kube-proxy names a chain `name` in a release this build knows.
pub fn known_chain(name: &str) -> bool {
    fixed_chain(name) || parse_object_name(name).is_some()
}

/// Whether kube-proxy names a set or map `name` in a release this build knows.
pub fn known_set(name: &str) -> bool {
    FIXED_SETS.contains(&name)
        || name.strip_prefix(kp::AFFINITY_PREFIX).is_some_and(|rest| {
            // An affinity set is named as its endpoint's chain is.
            parse_object_name(&format!("{}{rest}", kp::ENDPOINT_PREFIX))
                .is_some_and(|o| o.kind == crate::graph::ChainKind::Sep)
        })
}

/// Whether a named object of `kind` (`counter`, `quota`, …) is one this build knows: only
/// counters, which count and decide nothing.
pub fn known_object(kind: &str) -> bool {
    kind == "counter"
}

/// Whether the graph and the packet model both read `stmt`.
pub fn known_statement(stmt: &Stmt<'_>) -> bool {
    match stmt {
        Stmt::Counter(_) | Stmt::NamedCounter(_) | Stmt::Log(_) | Stmt::Verdict(_) => true,
        Stmt::Reject(_) => true,
        Stmt::Match { left, right, .. } => {
            (packet_expr(left) || matches!(left, Expr::Numgen { mode, .. } if mode == "random"))
                && constant(right)
        }
        Stmt::Vmap { key, map } => {
            (packet_expr(key) || matches!(key, Expr::Numgen { mode, .. } if mode == "random"))
                && matches!(map, Expr::Set(_) | Expr::SetRef(_))
        }
        Stmt::Mangle { key, value } => {
            matches!(key, Expr::Meta(k) if k == "mark")
                && match value {
                    Expr::Number(_) => true,
                    Expr::Binary { op, left, right } => {
                        matches!(op, BinOp::Or | BinOp::Xor | BinOp::And)
                            && matches!(&**left, Expr::Meta(k) if k == "mark")
                            && matches!(**right, Expr::Number(_))
                    }
                    _ => false,
                }
        }
        Stmt::Nat(n) => match n.kind {
            NatKind::Masquerade => n.addr.is_none(),
            NatKind::Dnat => {
                let port = n.port.as_ref().is_none_or(|p| matches!(p, Expr::Number(_)));
                let addr = match &n.addr {
                    Some(Expr::Addr(_)) => true,
                    Some(Expr::Map { key, map }) => {
                        matches!(&**key, Expr::Numgen { mode, .. } if mode == "random")
                            && match &**map {
                                Expr::Set(items) => items.iter().all(|e| {
                                    matches!(&e.value, Some(Expr::Addr(_)) | Some(Expr::Concat(_)))
                                }),
                                Expr::SetRef(_) => true,
                                _ => false,
                            }
                    }
                    _ => false,
                };
                port && addr
            }
            NatKind::Snat | NatKind::Redirect => false,
        },
        Stmt::SetUpdate { op, elem, .. } => {
            matches!(&**op, "add" | "update") && (packet_expr(elem) || set_of_packet_exprs(elem))
        }
        Stmt::Xt { .. } | Stmt::Verbatim(_) => false,
    }
}

/// `{ ip saddr }` as the element of `update @set { … }`.
fn set_of_packet_exprs(e: &Expr<'_>) -> bool {
    matches!(e, Expr::Set(items) if items.iter().all(|i| packet_expr(&i.key)))
}

/// A packet expression the packet model evaluates.
fn packet_expr(e: &Expr<'_>) -> bool {
    match e {
        Expr::Payload { protocol, field } => match &**protocol {
            "ip" => matches!(&**field, "saddr" | "daddr" | "protocol"),
            "ip6" => matches!(&**field, "saddr" | "daddr" | "nexthdr"),
            "th" | "tcp" | "udp" | "sctp" => matches!(&**field, "dport" | "sport"),
            _ => false,
        },
        Expr::Meta(k) => matches!(
            &**k,
            "l4proto" | "protocol" | "nfproto" | "mark" | "iif" | "iifname" | "oif" | "oifname"
        ),
        Expr::Ct { dir: None, key } => matches!(&**key, "state" | "status" | "direction" | "mark"),
        Expr::Fib { flags, result } => {
            result == "type" && flags.iter().any(|f| f == "saddr" || f == "daddr")
        }
        Expr::Binary { left, right, .. } => packet_expr(left) && matches!(**right, Expr::Number(_)),
        Expr::Concat(parts) => !parts.is_empty() && parts.iter().all(packet_expr),
        _ => false,
    }
}

/// A constant, set or set reference on the right of a match.
fn constant(e: &Expr<'_>) -> bool {
    match e {
        Expr::Number(_)
        | Expr::Addr(_)
        | Expr::Prefix(..)
        | Expr::Symbol(_)
        | Expr::SetRef(_)
        | Expr::Set(_) => true,
        Expr::Range(lo, hi) => constant(lo) && constant(hi),
        Expr::List(items) | Expr::Concat(items) => items.iter().all(constant),
        _ => false,
    }
}

/// Every object of kube-proxy's `table` this build does not know: chains, sets and maps not
/// named as kube-proxy names them, named objects other than counters, and the statements of
/// known chains it cannot read (an unknown chain is one object, its statements are not listed).
pub fn unknown_objects(table: &Table<'_>) -> Vec<UnknownObject> {
    let mut out = Vec::new();
    for c in &table.chains {
        if !known_chain(&c.name) {
            out.push(UnknownObject {
                kind: UnknownKind::Chain,
                name: c.name.to_string(),
                line: (c.line > 0).then_some(c.line),
                text: None,
            });
            continue;
        }
        for r in &c.rules {
            for s in r.stmts.iter().filter(|s| !known_statement(s)) {
                out.push(UnknownObject {
                    kind: UnknownKind::Statement,
                    name: c.name.to_string(),
                    line: (r.line > 0).then_some(r.line),
                    text: Some(s.to_string()),
                });
            }
        }
    }
    for s in table.sets.iter().filter(|s| !known_set(&s.name)) {
        out.push(UnknownObject {
            kind: if s.is_map {
                UnknownKind::Map
            } else {
                UnknownKind::Set
            },
            name: s.name.to_string(),
            line: (s.line > 0).then_some(s.line),
            text: None,
        });
    }
    for o in table.objects.iter().filter(|o| !known_object(&o.kind)) {
        out.push(UnknownObject {
            kind: UnknownKind::Object,
            name: format!("{} {}", o.kind, o.name),
            line: (o.line > 0).then_some(o.line),
            text: None,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::nft::{ParseOptions, parse, parse_rule};

    #[test]
    fn kube_proxys_forms_are_known_and_others_are_not() {
        for text in [
            "ip daddr . meta l4proto . th dport vmap @service-ips",
            "ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or 0x4000 comment \"x\"",
            "mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random",
            "ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random",
            "meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.4 . 80 , 1 : 10.180.0.5 . 80 }",
            "meta l4proto tcp dnat to 10.180.0.3:80",
            "numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }",
            "update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }",
            "ip saddr @affinity-X goto endpoint-X",
            "fib saddr type local jump mark-for-masquerade",
            "ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @localhost-nodeport-reject-ports",
            "counter name \"c\" reject",
            "ct state new jump firewall-check",
            "ip saddr != { 203.0.113.0/25 } drop",
        ] {
            let r = parse_rule(text).expect("rule");
            assert!(r.stmts.iter().all(known_statement), "{text}: {r:?}");
        }
        for text in [
            "meta l4proto tcp dnat to jhash ip saddr mod 2 map { 0 : 10.0.0.1 . 80 }",
            "meta l4proto tcp dnat to ip saddr map @endpoints",
            "dnat to numgen inc mod 2 map { 0 : 10.0.0.1 . 80 , 1 : 10.0.0.2 . 80 }",
            "ct mark set 0x1",
            "redirect to :8080",
            "limit rate 10/second accept",
            "meta priority set 0x1",
        ] {
            let r = parse_rule(text).expect("rule");
            assert!(!r.stmts.iter().all(known_statement), "{text}: {r:?}");
        }
    }

    #[test]
    fn unknown_chains_sets_and_objects_are_listed() {
        let rs = parse(
            "add table ip kube-proxy
add chain ip kube-proxy services
add chain ip kube-proxy endpoints-v2
add chain ip kube-proxy localhost-nodeport-reject-tcp
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; }
add map ip kube-proxy lb-1-endpoints { type integer : ipv4_addr ; }
add counter ip kube-proxy c1
add quota ip kube-proxy q1 { 25 mbytes }
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services ip daddr 10.0.0.1 ct mark set 0x1
add rule ip kube-proxy endpoints-v2 notrack
",
            &ParseOptions::strict(),
        )
        .expect("parses");
        let got: Vec<String> = unknown_objects(&rs.tables[0])
            .iter()
            .map(UnknownObject::describe)
            .collect();
        assert_eq!(
            got,
            [
                "statement `ct mark set 1` in chain services (line 10)",
                "chain endpoints-v2 (line 3)",
                "map lb-1-endpoints (line 6)",
                "quota q1 (line 8)",
            ]
        );
    }
}
