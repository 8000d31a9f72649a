//! Node-wide checks on one parsed dump (KP0xx): the jumps from the built-in chains, the canary, the
//! masquerade mark, foreign rules ahead of kube-proxy's jumps, other proxy modes' leftovers and rules
//! the userspace could not decode. (Duplicates, dangling jumps and unreferenced chains come from the
//! service graph's anomalies.)
//!
//! These checks read the parser's AST directly: they concern chains and rules that `render` never
//! writes (built-in chains, canaries, other agents' rules), so they do not go through the service graph.

use super::catalogue as cat;
use super::finding::Finding;
use crate::state::mode::ProxyMode;
use kproxy_parsers::iptables::{
    Dump, MarkOp, MarkValue, Match, Module, Neg, Rule, Table, Target, TargetKind,
};
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// One jump kube-proxy ensures in a built-in chain at every full sync (`proxier.go`
/// `iptablesJumpChains`), in the order
/// kube-proxy ensures them (each is prepended, so the resulting top-of-chain order is the reverse).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseJump {
    /// Table (`filter`, `nat`).
    pub table: &'static str,
    /// Built-in chain.
    pub chain: &'static str,
    /// Matches before the comment, as iptables words (`-m conntrack --ctstate NEW`).
    pub extra: Vec<&'static str>,
    /// The comment (`""` = none).
    pub comment: &'static str,
    /// The kube-proxy chain jumped to.
    pub target: &'static str,
    /// Present in every kube-proxy version that has an iptables mode with this layout; the others
    /// (health-check, load-balancer firewall, KUBE-FIREWALL) are only required when the target chain
    /// exists in the dump (older versions do not write them).
    pub essential: bool,
}

/// Jumps that older kube-proxy versions do not write; required only when their target chain exists.
const OPTIONAL_TARGETS: &[&str] = &["KUBE-NODEPORTS", "KUBE-PROXY-FIREWALL", "KUBE-FIREWALL"];

/// The jumps kube-proxy ensures: the proxier's own table
/// ([`crate::proxier::iptables::BASE_JUMPS`]), with which of them every version writes.
pub static BASE_JUMPS: std::sync::LazyLock<Vec<BaseJump>> = std::sync::LazyLock::new(|| {
    crate::proxier::iptables::BASE_JUMPS
        .iter()
        .map(|&(table, chain, extra, comment, target)| BaseJump {
            table,
            chain,
            extra: extra.split_whitespace().collect(),
            comment,
            target,
            essential: !OPTIONAL_TARGETS.contains(&target),
        })
        .collect()
});

/// The tables in which kube-proxy keeps its `KUBE-PROXY-CANARY` chain (`proxier.go` `NewProxier`,
/// the canary it monitors).
pub const CANARY_TABLES: &[&str] = &["mangle", "nat", "filter"];

/// The canary chain's name.
pub const CANARY_CHAIN: &str = "KUBE-PROXY-CANARY";

/// Chains only kube-proxy's IPVS mode writes (`pkg/proxy/ipvs/proxier.go`).
const IPVS_CHAINS: &[&str] = &[
    "KUBE-LOAD-BALANCER",
    "KUBE-NODE-PORT",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// Addresses and ports of the Services, used to decide whether a foreign rule matches service traffic.
#[derive(Debug, Clone, Default)]
pub struct ServiceAddresses {
    /// Service IPs (cluster, external, load balancer) → the first service port using them.
    pub ips: HashMap<IpAddr, String>,
    /// (protocol, port) of service ports and node ports → the first service port using them.
    pub ports: HashMap<(String, u16), String>,
}

/// What the node-wide checks need besides the dump.
#[derive(Debug, Clone)]
pub struct NodeContext<'x> {
    /// The masquerade mark bit value (`1 << masqueradeBit`).
    pub mark: u32,
    /// The configured proxy mode (kube-proxy's default when none is configured).
    pub mode: ProxyMode,
    /// Service addresses and ports.
    pub services: &'x ServiceAddresses,
    /// Large-cluster mode (> 1000 endpoints): stale chains are expected for a while.
    pub large_cluster: bool,
    /// A label for the dump in messages (`iptables-save`, `iptables-legacy-save`).
    pub label: &'x str,
}

fn table<'d, 'a>(dump: &'d Dump<'a>, name: &str) -> Option<&'d Table<'a>> {
    dump.tables.iter().find(|t| t.name == name)
}

fn has_chain(t: &Table<'_>, chain: &str) -> bool {
    t.chains.iter().any(|c| c.name == chain) || t.rule_chains.iter().any(|(c, _)| *c == chain)
}

fn jump_target<'a>(r: &Rule<'a>) -> Option<&'a str> {
    match r.target() {
        Some(Target::Jump(c)) | Some(Target::Goto(c)) => Some(c),
        _ => None,
    }
}

/// Quotes a rule the way `iptables-save` prints it.
pub fn rule_text(chain: &str, r: &Rule<'_>) -> String {
    format!("-A {chain} {}", r.raw)
}

/// True when the dump has any kube-proxy iptables-mode chain with rules (service chains, or rules
/// in nat `KUBE-SERVICES`).
pub fn has_kube_proxy_rules(dump: &Dump<'_>) -> bool {
    dump.tables.iter().any(|t| {
        t.rule_chains.iter().any(|&(chain, _)| {
            crate::graph::ownership::service_chain(chain).is_some()
                || (t.name == "nat" && (chain == "KUBE-SERVICES" || chain == "KUBE-NODEPORTS"))
        })
    })
}

/// All node-wide checks on one dump.
pub fn check(dump: &Dump<'_>, context: &NodeContext<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(skipped_lines(dump, context));
    out.extend(userspace_skew(dump, context));
    out.extend(tables_present(dump, context));
    out.extend(foreign_mode(dump, context));
    out.extend(base_jumps(dump, context));
    out.extend(canary(dump));
    out.extend(mark(dump, context));
    out.extend(mark_conflicts(dump, context));
    out.extend(shadowing(dump, context));
    out
}

/// KP013: lines skipped in lenient mode.
pub fn skipped_lines(dump: &Dump<'_>, context: &NodeContext<'_>) -> Vec<Finding> {
    let Some(first) = dump.skipped.first() else {
        return Vec::new();
    };
    vec![
        cat::LINES_SKIPPED
            .finding(format!(
                "{}: {} line(s) skipped, first at line {}: {}",
                context.label,
                dump.skipped.len(),
                first.line,
                first.reason
            ))
            .actual(first.text.to_string()),
    ]
}

/// True when the dump holds rules the iptables userspace could not decode.
pub fn is_unreadable(dump: &Dump<'_>) -> bool {
    dump.tables.iter().any(|t| {
        t.rules
            .iter()
            .any(|r| matches!(r.target(), Some(Target::Unreadable { .. })))
    })
}

/// KP001: targets the userspace printed as garbage (`[unsupported revision]`, empty or `0.0.0.0:0`
/// DNAT destinations). One finding per dump.
pub fn userspace_skew(dump: &Dump<'_>, context: &NodeContext<'_>) -> Vec<Finding> {
    let mut count = 0usize;
    let mut first: Option<(&Rule<'_>, &str, &str, &str)> = None;
    for t in &dump.tables {
        // The target kind is read without decoding the target.
        for (chain, r) in t
            .rules_with_chain()
            .filter(|(_, r)| r.target_kind() == Some(TargetKind::Unreadable))
        {
            if let Some(Target::Unreadable { reason, .. }) = &r.target() {
                count += 1;
                if first.is_none() {
                    first = Some((r, t.name, chain, reason));
                }
            }
        }
    }
    let Some((r, tname, chain, reason)) = first else {
        return Vec::new();
    };
    let version = dump.version.unwrap_or("unknown version");
    vec![
        cat::USERSPACE_SKEW
            .finding(format!(
                "{}: {count} rule(s) cannot be read by this iptables ({version}): {reason}; endpoint checks are skipped",
                context.label
            ))
            .chain(format!("{tname} {chain}"))
            .expected("rules this iptables-save can print")
            .actual(rule_text(chain, r)),
    ]
}

/// KP011: the nat or filter table is missing.
pub fn tables_present(dump: &Dump<'_>, context: &NodeContext<'_>) -> Vec<Finding> {
    ["nat", "filter"]
        .iter()
        .filter(|n| table(dump, n).is_none())
        .map(|n| {
            cat::TABLE_MISSING
                .finding(format!(
                    "{}: no {n} table; checks of that table are skipped",
                    context.label
                ))
                .chain(n.to_string())
                .expected(format!("*{n}"))
                .actual("absent")
        })
        .collect()
}

/// KP004: chains, ipset matches or tables of a proxy mode other than the configured one.
pub fn foreign_mode(dump: &Dump<'_>, context: &NodeContext<'_>) -> Vec<Finding> {
    if context.mode != ProxyMode::Iptables {
        // Other modes' leftovers of iptables mode are the IPVS/nftables checks' business.
        return Vec::new();
    }
    let mut out = Vec::new();
    for t in &dump.tables {
        let mut chains: Vec<&str> = t
            .chains
            .iter()
            .map(|c| c.name)
            .filter(|n| IPVS_CHAINS.contains(n))
            .collect();
        chains.dedup();
        // Only rules whose text names the set module can match a set: the others are not decoded.
        let set_module = memchr::memmem::Finder::new("set");
        let sets: HashSet<&str> = t
            .rules
            .iter()
            .filter(|r| set_module.find(r.raw.as_bytes()).is_some())
            .flat_map(|r| r.matches())
            .filter_map(|m| match m {
                Match::Module(Module::Set { name, .. }) if name.starts_with("KUBE-") => Some(name),
                _ => None,
            })
            .collect();
        if chains.is_empty() && sets.is_empty() {
            continue;
        }
        let mut sets: Vec<&str> = sets.into_iter().collect();
        sets.sort_unstable();
        let mut what = Vec::new();
        if !chains.is_empty() {
            what.push(format!("chains {}", chains.join(", ")));
        }
        if !sets.is_empty() {
            what.push(format!("ipset matches {}", sets.join(", ")));
        }
        out.push(
            cat::FOREIGN_MODE
                .finding(format!(
                    "{}: {} table holds IPVS-mode rules although kube-proxy runs in iptables mode",
                    context.label, t.name
                ))
                .chain(t.name.to_string())
                .expected("no IPVS-mode chains or KUBE-* ipset matches")
                .actual(what.join("; ")),
        );
    }
    out
}

/// KP004 for an `nft list ruleset` text: a `kube-proxy` table under iptables mode.
pub fn foreign_nft_tables(nft_ruleset: &str, mode: ProxyMode) -> Vec<Finding> {
    if mode != ProxyMode::Iptables {
        return Vec::new();
    }
    nft_ruleset
        .lines()
        .map(str::trim)
        .filter(|l| {
            let mut w = l.split_whitespace();
            w.next() == Some("table")
                && matches!(w.next(), Some("ip" | "ip6" | "inet"))
                && w.next() == Some("kube-proxy")
        })
        .map(|l| {
            let name = l.trim_end_matches('{').trim().to_string();
            cat::FOREIGN_MODE
                .finding(format!("nftables-mode table `{name}` present although kube-proxy runs in iptables mode"))
                .chain(name)
                .expected("no nftables kube-proxy table")
                .actual("present")
                .hint("delete it (nft delete table ip kube-proxy) once no kube-proxy runs in nftables mode")
        })
        .collect()
}

/// The index of the first rule of `chain` in `t` jumping to `target`, counting only that chain's rules.
fn jump_position(t: &Table<'_>, chain: &str, target: &str) -> Option<usize> {
    t.rules_of(chain)
        .position(|r| jump_target(r) == Some(target))
}

/// KP005: the jumps of [`BASE_JUMPS`].
pub fn base_jumps(dump: &Dump<'_>, context: &NodeContext<'_>) -> Vec<Finding> {
    if context.mode != ProxyMode::Iptables {
        return Vec::new();
    }
    let mut out = Vec::new();
    for j in BASE_JUMPS.iter() {
        let Some(t) = table(dump, j.table) else {
            continue;
        };
        if !j.essential && !has_chain(t, j.target) {
            continue;
        }
        if jump_position(t, j.chain, j.target).is_some() {
            continue;
        }
        let mut expected = format!("-A {}", j.chain);
        for w in &j.extra {
            expected.push(' ');
            expected.push_str(w);
        }
        if !j.comment.is_empty() {
            expected.push_str(&format!(" -m comment --comment \"{}\"", j.comment));
        }
        expected.push_str(&format!(" -j {}", j.target));
        out.push(
            cat::BASE_JUMP_MISSING
                .finding(format!(
                    "{} {} does not jump to {}{}",
                    j.table,
                    j.chain,
                    j.target,
                    base_jump_effect(j)
                ))
                .chain(format!("{} {}", j.table, j.chain))
                .expected(expected)
                .actual("no such rule"),
        );
    }
    out
}

fn base_jump_effect(j: &BaseJump) -> &'static str {
    match (j.table, j.chain, j.target) {
        ("nat", "PREROUTING", _) => ": traffic from pods and outside is not load-balanced",
        ("nat", "OUTPUT", _) => ": traffic from the node itself is not load-balanced",
        ("nat", "POSTROUTING", _) => ": nothing is masqueraded",
        ("filter", _, "KUBE-FORWARD") => {
            ": marked and established service traffic may be dropped by FORWARD"
        }
        ("filter", _, "KUBE-EXTERNAL-SERVICES") | ("filter", _, "KUBE-SERVICES") => {
            ": services without endpoints are not rejected"
        }
        ("filter", _, "KUBE-PROXY-FIREWALL") => ": loadBalancerSourceRanges are not enforced",
        ("filter", _, "KUBE-NODEPORTS") => ": health check node ports are not opened",
        ("filter", _, "KUBE-FIREWALL") => ": localhost connections are not protected",
        _ => "",
    }
}

/// KP006: `KUBE-PROXY-CANARY` missing from mangle, nat or filter.
pub fn canary(dump: &Dump<'_>) -> Vec<Finding> {
    let missing: Vec<&str> = CANARY_TABLES
        .iter()
        .copied()
        .filter(|n| table(dump, n).is_none_or(|t| !has_chain(t, CANARY_CHAIN)))
        .collect();
    if missing.is_empty() || !has_kube_proxy_rules(dump) && missing.len() == CANARY_TABLES.len() {
        // No canary anywhere and no kube-proxy rules: not a kube-proxy node (or IPVS/nftables mode
        // leftovers only); other findings say so.
        return Vec::new();
    }
    vec![
        cat::CANARY_MISSING
            .finding(format!(
                "{CANARY_CHAIN} missing in {}: the tables were flushed since kube-proxy last checked",
                missing.join(", ")
            ))
            .chain(CANARY_CHAIN)
            .expected(format!("{CANARY_CHAIN} in {}", CANARY_TABLES.join(", ")))
            .actual(format!("missing in {}", missing.join(", "))),
    ]
}

/// The bits a MARK target changes.
fn mark_bits_changed(op: &MarkOp) -> u32 {
    match *op {
        MarkOp::SetXmark { value, mask } => value | mask,
        MarkOp::SetMark { value, mask } => value | mask,
        MarkOp::Or(v) | MarkOp::Xor(v) => v,
        MarkOp::And(v) => !v,
    }
}

fn mark_op_text(op: &MarkOp) -> String {
    match *op {
        MarkOp::SetXmark { value, mask } => format!("--set-xmark {value:#x}/{mask:#x}"),
        MarkOp::SetMark { value, mask } => format!("--set-mark {value:#x}/{mask:#x}"),
        MarkOp::Or(v) => format!("--or-mark {v:#x}"),
        MarkOp::Xor(v) => format!("--xor-mark {v:#x}"),
        MarkOp::And(v) => format!("--and-mark {v:#x}"),
    }
}

fn mark_match_text(m: &Neg<MarkValue>) -> String {
    let neg = if m.negated { "! " } else { "" };
    match m.value.mask {
        Some(mask) => format!("{neg}--mark {:#x}/{mask:#x}", m.value.value),
        None => format!("{neg}--mark {:#x}", m.value.value),
    }
}

/// KP007 (mark differs from masqueradeBit) and KP308 (no MARK in KUBE-MARK-MASQ / no MASQUERADE in
/// KUBE-POSTROUTING).
pub fn mark(dump: &Dump<'_>, context: &NodeContext<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    let m = context.mark;
    let expected_text = format!("{m:#x}");
    if let Some(nat) = table(dump, "nat") {
        if !has_kube_proxy_rules(dump) && !has_chain(nat, "KUBE-MARK-MASQ") {
            return out;
        }
        // KUBE-MARK-MASQ: one MARK rule setting exactly the bit.
        let masq: Vec<&Rule<'_>> = nat.rules_of("KUBE-MARK-MASQ").collect();
        let mut saw_mark = false;
        for r in &masq {
            if let Some(Target::Mark(op)) = &r.target() {
                saw_mark = true;
                let ok = match *op {
                    MarkOp::Or(v) => v == m,
                    MarkOp::SetXmark { value, mask } | MarkOp::SetMark { value, mask } => {
                        value == m && mask == m
                    }
                    _ => false,
                };
                if !ok {
                    out.push(
                        cat::MARK_MISMATCH
                            .finding(format!(
                                "KUBE-MARK-MASQ sets {} but masqueradeBit means {expected_text}",
                                mark_op_text(op)
                            ))
                            .chain("nat KUBE-MARK-MASQ")
                            .expected(format!("-j MARK --set-xmark {m:#x}/{m:#x}"))
                            .actual(rule_text("KUBE-MARK-MASQ", r)),
                    );
                }
            }
        }
        if !saw_mark {
            out.push(
                cat::MASQ_MACHINERY
                    .finding(
                        "KUBE-MARK-MASQ does not mark packets: no service traffic is masqueraded",
                    )
                    .chain("nat KUBE-MARK-MASQ")
                    .expected(format!(
                        "-A KUBE-MARK-MASQ -j MARK --set-xmark {m:#x}/{m:#x}"
                    ))
                    .actual(if masq.is_empty() {
                        "empty or missing chain".into()
                    } else {
                        rule_text("KUBE-MARK-MASQ", masq[0])
                    }),
            );
        }
        let post: Vec<&Rule<'_>> = nat.rules_of("KUBE-POSTROUTING").collect();
        if !post
            .iter()
            .any(|r| matches!(r.target(), Some(Target::Masquerade { .. })))
        {
            out.push(
                cat::MASQ_MACHINERY
                    .finding("KUBE-POSTROUTING does not MASQUERADE: marked service traffic keeps its source address")
                    .chain("nat KUBE-POSTROUTING")
                    .expected("-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE")
                    .actual(if post.is_empty() { "empty or missing chain".into() } else { format!("{} rule(s), none MASQUERADE", post.len()) }),
            );
        }
        out.extend(mark_matches_in(&post, "nat", "KUBE-POSTROUTING", m));
    }
    if let Some(filter) = table(dump, "filter") {
        let fwd: Vec<&Rule<'_>> = filter.rules_of("KUBE-FORWARD").collect();
        out.extend(mark_matches_in(&fwd, "filter", "KUBE-FORWARD", m));
    }
    out
}

/// KP007 for `-m mark` matches and MARK targets in KUBE-POSTROUTING / KUBE-FORWARD.
fn mark_matches_in(rules: &[&Rule<'_>], table: &str, chain: &str, m: u32) -> Vec<Finding> {
    let mut out = Vec::new();
    for r in rules {
        let mut bad: Option<String> = None;
        for mt in r.matches() {
            if let Match::Module(Module::Mark(v)) = mt
                && !(v.value.value == m && v.value.mask == Some(m))
            {
                bad = Some(mark_match_text(&v));
            }
        }
        if let Some(Target::Mark(op)) = &r.target() {
            let v = match *op {
                MarkOp::Xor(v) | MarkOp::Or(v) => v,
                MarkOp::SetXmark { value, .. } | MarkOp::SetMark { value, .. } => value,
                MarkOp::And(v) => !v,
            };
            if v != m {
                bad = Some(mark_op_text(op));
            }
        }
        if let Some(b) = bad {
            out.push(
                cat::MARK_MISMATCH
                    .finding(format!(
                        "{table} {chain} uses {b} but masqueradeBit means {m:#x}"
                    ))
                    .chain(format!("{table} {chain}"))
                    .expected(format!("{m:#x}/{m:#x}"))
                    .actual(rule_text(chain, r)),
            );
        }
    }
    out
}

/// KP010: a rule outside kube-proxy's masquerade chains that changes kube-proxy's mark bit.
pub fn mark_conflicts(dump: &Dump<'_>, context: &NodeContext<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for t in &dump.tables {
        for (chain, r) in t.rules_with_chain() {
            if matches!(chain, "KUBE-MARK-MASQ" | "KUBE-POSTROUTING")
                || r.target_kind() != Some(TargetKind::Mark)
            {
                continue;
            }
            if let Some(Target::Mark(op)) = &r.target()
                && mark_bits_changed(op) & context.mark != 0
            {
                out.push(
                    cat::MARK_CONFLICT
                        .finding(format!(
                            "{} {} changes bit {:#x} that kube-proxy uses to mark traffic for masquerading",
                            t.name, chain, context.mark
                        ))
                        .chain(format!("{} {chain}", t.name))
                        .expected(format!("no other rule touches {:#x}", context.mark))
                        .actual(rule_text(chain, r)),
                );
            }
        }
    }
    out
}

/// Whether a foreign terminal rule could match service traffic; `Some(service)` names the service
/// port it matches when the rule is narrowed to one (`Some("")` = matches traffic in general).
fn shadowed_service(r: &Rule<'_>, services: &ServiceAddresses) -> Option<String> {
    let mut hit = String::new();
    let mut proto: Option<&str> = None;
    for m in r.matches() {
        match m {
            Match::Source(s) if !s.negated => return None,
            Match::Destination(d) if !d.negated => {
                let a = &d.value;
                let svc = services
                    .ips
                    .iter()
                    .find(|(ip, _)| prefix_contains(a.addr, a.prefix, ip))?;
                hit = svc.1.clone();
            }
            Match::Protocol(p) if !p.negated => {
                if !matches!(p.value, "tcp" | "udp" | "sctp" | "all") {
                    return None;
                }
                proto = Some(p.value);
            }
            Match::InInterface(i) if !i.negated && i.value == "lo" => return None,
            Match::Module(Module::Ports {
                proto: mp,
                dport,
                sport,
                ..
            }) => {
                if sport.as_ref().is_some_and(|s| !s.negated) {
                    return None;
                }
                if let Some(d) = dport
                    && !d.negated
                {
                    let p = proto.unwrap_or(mp);
                    let svc = services.ports.iter().find(|((sp, port), _)| {
                        sp == p && d.value.first <= *port && *port <= d.value.last
                    })?;
                    hit = svc.1.clone();
                }
            }
            Match::Module(Module::Conntrack {
                ctstate: Some(st), ..
            })
            | Match::Module(Module::State(st)) => {
                if st.negated || !st.value.contains("NEW") {
                    return None;
                }
            }
            Match::Module(Module::Conntrack { .. })
            | Match::Module(Module::Comment(_))
            | Match::Module(Module::Addrtype { .. })
            | Match::Source(_)
            | Match::Destination(_)
            | Match::InInterface(_)
            | Match::OutInterface(_)
            | Match::Protocol(_) => {}
            // Anything else (marks, sets, limits, fragments, physdev…) narrows the rule in ways we
            // cannot relate to service traffic: do not guess.
            _ => return None,
        }
    }
    Some(hit)
}

fn prefix_contains(net: IpAddr, prefix: u8, ip: &IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(i)) => {
            let p = u32::from(prefix.min(32));
            let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
            u32::from(n) & mask == u32::from(*i) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(i)) => {
            let p = u32::from(prefix.min(128));
            let mask = if p == 0 { 0 } else { u128::MAX << (128 - p) };
            u128::from(n) & mask == u128::from(*i) & mask
        }
        _ => false,
    }
}

/// KP008: terminal foreign rules ahead of kube-proxy's jumps in the built-in chains.
pub fn shadowing(dump: &Dump<'_>, context: &NodeContext<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut seen: HashSet<(&str, &str)> = HashSet::new();
    for j in BASE_JUMPS.iter() {
        if !seen.insert((j.table, j.chain)) {
            continue;
        }
        let Some(t) = table(dump, j.table) else {
            continue;
        };
        // The last kube-proxy jump of this built-in chain: a foreign rule ahead of any of them
        // shadows at least that one.
        let targets: Vec<&str> = BASE_JUMPS
            .iter()
            .filter(|b| b.table == j.table && b.chain == j.chain)
            .map(|b| b.target)
            .collect();
        let rules: Vec<&Rule<'_>> = t.rules_of(j.chain).collect();
        let Some(last) = rules
            .iter()
            .rposition(|r| jump_target(r).is_some_and(|c| targets.contains(&c)))
        else {
            continue;
        };
        for (i, r) in rules.iter().enumerate().take(last) {
            let terminal = matches!(
                (&r.target(), j.table),
                (Some(Target::Drop | Target::Reject { .. }), _)
                    | (Some(Target::Accept | Target::Return), "nat")
            );
            if !terminal {
                continue;
            }
            let Some(service) = shadowed_service(r, context.services) else {
                continue;
            };
            let shadowed: Vec<&str> = rules[i + 1..=last]
                .iter()
                .filter_map(|r| jump_target(r))
                .filter(|c| targets.contains(c))
                .collect();
            let mut f = cat::SHADOWING_RULE
                .finding(format!(
                    "{} {} rule {} ({}) comes before the jump(s) to {}: that traffic never reaches kube-proxy's rules",
                    j.table,
                    j.chain,
                    i + 1,
                    r.raw,
                    shadowed.join(", ")
                ))
                .chain(format!("{} {}", j.table, j.chain))
                .expected(format!("kube-proxy's jumps ({}) first", shadowed.join(", ")))
                .actual(rule_text(j.chain, r));
            if !service.is_empty() {
                f = f.service(service);
            }
            out.push(f);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kproxy_parsers::iptables::{ParseOptions, parse_dump};

    const BASE: &str = "*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-EXTERNAL-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n-A INPUT -m conntrack --ctstate NEW -j KUBE-EXTERNAL-SERVICES\n-A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES\n-A FORWARD -m conntrack --ctstate NEW -j KUBE-EXTERNAL-SERVICES\n-A FORWARD -j KUBE-FORWARD\n-A OUTPUT -m conntrack --ctstate NEW -j KUBE-SERVICES\n-A KUBE-FORWARD -m mark --mark 0x4000/0x4000 -j ACCEPT\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-PROXY-CANARY - [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-SVC-XPGD46QRK7WJZT7O - [0:0]\n-A PREROUTING -j KUBE-SERVICES\n-A OUTPUT -j KUBE-SERVICES\n-A POSTROUTING -j KUBE-POSTROUTING\n-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n-A KUBE-POSTROUTING -j MASQUERADE\n-A KUBE-SERVICES -d 172.30.0.41/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-XPGD46QRK7WJZT7O\n-A KUBE-SVC-XPGD46QRK7WJZT7O -j DNAT --to-destination 10.0.0.1:80\nCOMMIT\n";

    fn ids(text: &str) -> Vec<&'static str> {
        let dump = parse_dump(text, &ParseOptions::strict()).unwrap_or_else(|e| panic!("{e}"));
        let mut services = ServiceAddresses::default();
        services.ips.insert(
            "172.30.0.41".parse().unwrap_or_else(|_| panic!("ip")),
            "ns1/svc1:p80".into(),
        );
        services
            .ports
            .insert(("tcp".into(), 80), "ns1/svc1:p80".into());
        let context = NodeContext {
            mark: 0x4000,
            mode: ProxyMode::Iptables,
            services: &services,
            large_cluster: false,
            label: "t",
        };
        check(&dump, &context).iter().map(|f| f.id).collect()
    }

    #[test]
    fn healthy_node_is_clean() {
        assert_eq!(ids(BASE), Vec::<&str>::new());
    }

    #[test]
    fn missing_jump_and_canary() {
        assert_eq!(
            ids(&BASE.replace("-A PREROUTING -j KUBE-SERVICES\n", "")),
            ["KP005"]
        );
        assert_eq!(
            ids(&BASE.replace("*mangle\n:KUBE-PROXY-CANARY - [0:0]\nCOMMIT\n", "")),
            ["KP006"]
        );
    }

    #[test]
    fn mark_mismatch_and_conflict() {
        let t = BASE.replace(
            "-j MARK --set-xmark 0x4000/0x4000",
            "-j MARK --set-xmark 0x8000/0x8000",
        );
        assert_eq!(ids(&t), ["KP007"]);
        let t = BASE.replace(
            "-A FORWARD -j KUBE-FORWARD\n",
            "-A FORWARD -j KUBE-FORWARD\n-A FORWARD -j MARK --set-xmark 0x0/0xffff\n",
        );
        assert_eq!(ids(&t), ["KP010"]);
        let t = BASE.replace("-A KUBE-POSTROUTING -j MASQUERADE\n", "");
        assert_eq!(ids(&t), ["KP308"]);
    }

    #[test]
    fn shadowing_only_for_rules_that_match_service_traffic() {
        let broad = BASE.replace("-A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES\n", "-A FORWARD -j REJECT --reject-with icmp-host-prohibited\n-A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES\n");
        assert_eq!(ids(&broad), ["KP008"]);
        let port = BASE.replace("-A OUTPUT -m conntrack --ctstate NEW -j KUBE-SERVICES\n", "-A OUTPUT -p tcp -m tcp --dport 80 -j DROP\n-A OUTPUT -m conntrack --ctstate NEW -j KUBE-SERVICES\n");
        assert_eq!(ids(&port), ["KP008"]);
        for narrow in [
            "-p tcp -m tcp --dport 22 -j DROP",
            "-s 203.0.113.9/32 -j DROP",
            "-m conntrack --ctstate INVALID -j DROP",
            "-p icmp -j REJECT",
            "-i lo -j ACCEPT",
        ] {
            let t = BASE.replace(
                "-A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES\n",
                &format!(
                    "-A FORWARD {narrow}\n-A FORWARD -m conntrack --ctstate NEW -j KUBE-SERVICES\n"
                ),
            );
            assert_eq!(ids(&t), Vec::<&str>::new(), "{narrow}");
        }
        let nat = BASE.replace(
            "-A PREROUTING -j KUBE-SERVICES\n",
            "-A PREROUTING -j ACCEPT\n-A PREROUTING -j KUBE-SERVICES\n",
        );
        assert_eq!(ids(&nat), ["KP008"]);
    }

    #[test]
    fn ipvs_leftovers_and_nft_table() {
        let t = BASE.replace(
            ":KUBE-MARK-MASQ - [0:0]\n",
            ":KUBE-MARK-MASQ - [0:0]\n:KUBE-LOAD-BALANCER - [0:0]\n",
        );
        assert_eq!(ids(&t), ["KP004"]);
        let f = foreign_nft_tables(
            "table ip filter {\n}\ntable ip kube-proxy {\n\tcomment \"x\"\n}\n",
            ProxyMode::Iptables,
        );
        assert_eq!(f.len(), 1);
        assert!(foreign_nft_tables("table ip kube-proxy {\n}\n", ProxyMode::Nftables).is_empty());
    }

    #[test]
    fn unreadable_targets_are_reported_once() {
        let t = BASE.replace(
            "-j DNAT --to-destination 10.0.0.1:80",
            "-p tcp -m tcp -j DNAT [unsupported revision]",
        );
        let dump = parse_dump(&t, &ParseOptions::strict()).unwrap_or_else(|e| panic!("{e}"));
        assert!(is_unreadable(&dump));
        assert_eq!(ids(&t), ["KP001"]);
    }
}
