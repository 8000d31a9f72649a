//! Graph level: per service port the API implies, does the service graph rebuilt from the dump do
//! what kube-proxy's rules must do — independent of the kube-proxy version that wrote them (KP1xx,
//! KP2xx, KP3xx, KP4xx).
//!
//! Every finding records what it explains ([`Explained`]) so the rule level does not report the
//! same drift again as missing or extra rules.

use super::expected::{ExpectedEndpoints, ExpectedPort, Verdict};
use crate::compare::catalogue::{self as cat, Check};
use crate::compare::finding::{Finding, listed};
use crate::graph::{
    AnomalyKind, ChainKind, EntryKind, MasqueradeReason, ServiceGraph, ServicePort, VerdictReason,
};
use crate::parsers::iptables::NameHash;
use crate::state::ip::Cidr;
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

/// Chains and service ports the graph-level findings already explain.
#[derive(Debug, Clone, Default)]
pub struct Explained {
    /// Chain names (nat and filter) whose differences are explained.
    pub chains: HashSet<String>,
    /// Service port names (`ns/name:port`) whose rules' differences are explained.
    pub services: HashSet<String>,
    /// Service port names not checked: their path holds rules this build does not know
    /// (KP406), so nothing is concluded of them — neither here nor at the rule level.
    pub unchecked: HashSet<String>,
}

/// What the graph level needs besides the expected ports and the graph.
#[derive(Debug, Clone, Default)]
pub struct GraphContext {
    /// `iptables.masqueradeAll`.
    pub masquerade_all: bool,
    /// The local-traffic detector's not-local condition (`10.0.0.0/8`, `cbr0`), `None` = no-op.
    pub local_detector: Option<String>,
    /// Large-cluster mode: unreferenced chains are expected for a while.
    pub large_cluster: bool,
    /// The dump has rules the userspace could not decode: draw no endpoint conclusions.
    pub unreadable: bool,
}

/// Share tolerance: iptables stores probabilities as `round(p·2^31)`; products of a few such
/// rounded values stay well within 1e-4 of the exact share.
const SHARE_TOLERANCE: f64 = 1e-4;

struct Comparison<'a> {
    out: Vec<Finding>,
    explained: Explained,
    context: &'a GraphContext,
}

impl<'a> Comparison<'a> {
    fn new(context: &'a GraphContext) -> Self {
        Comparison {
            out: Vec::new(),
            explained: Explained::default(),
            context,
        }
    }

    fn push(
        &mut self,
        check: Check,
        e: &ExpectedPort,
        chain: &str,
        message: String,
    ) -> &mut Finding {
        self.explained.services.insert(e.name.to_string());
        // A shared chain (KUBE-SERVICES, KUBE-NODEPORTS, …) holds every Service's rules: a
        // finding of this port there explains this port's rules (by its name, above), not the
        // other Services' in it. Their findings do not depend on this port's, so a verify of
        // some Services finds for them what the whole verify finds (`super::scope`).
        let bare = bare_chain(chain);
        if crate::graph::ownership::service_chain(bare).is_some() {
            self.explained.chains.insert(bare.to_string());
        }
        self.out.push(
            check
                .finding(message)
                .service(e.name)
                .chain(chain.to_string()),
        );
        let last = self.out.len() - 1;
        &mut self.out[last]
    }
}

/// `nat KUBE-SERVICES` → `KUBE-SERVICES`.
fn bare_chain(chain: &str) -> &str {
    chain.rsplit(' ').next().unwrap_or(chain)
}

fn set(f: &mut Finding, expected: impl Into<String>, actual: impl Into<String>) {
    f.expected = Some(expected.into());
    f.actual = Some(actual.into());
}

fn parse_addr(text: Option<&str>) -> Option<IpAddr> {
    text.and_then(|t| t.parse().ok())
}

/// A CIDR as compared: the block normalised to its network (`10.0.0.1` ≡ `10.0.0.1/32`, sloppy
/// IPv4 read as kube-proxy reads it), or the text as written when it is not one.
fn cidr_key(text: &str) -> Result<Cidr, &str> {
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, p.parse::<u8>().ok()),
        None => (text, None),
    };
    let Some(ip) = crate::state::ip::parse_ip_sloppy(addr) else {
        return Err(text);
    };
    let host = if ip.is_ipv4() { 32 } else { 128 };
    Cidr::new(ip, prefix.unwrap_or(host)).ok_or(text)
}

/// [`cidr_key`] as text (for messages and sorting).
fn canonical_cidr(text: &str) -> String {
    match cidr_key(text) {
        Ok(c) => c.to_string(),
        Err(t) => t.to_string(),
    }
}

fn ip_port(ip: &IpAddr, port: u16) -> String {
    crate::state::ip::join_host_port(ip, i32::from(port))
}

/// Compares every expected service port with the graph; returns the findings and what they explain.
pub fn compare(
    expected: &[ExpectedPort],
    graph: &ServiceGraph,
    context: &GraphContext,
) -> (Vec<Finding>, Explained) {
    compare_split(expected, graph, context, PORTS_PER_TASK)
}

/// [`compare`], with the per-port checks run in parallel over runs of `per_task` ports.
fn compare_split(
    expected: &[ExpectedPort],
    graph: &ServiceGraph,
    context: &GraphContext,
    per_task: usize,
) -> (Vec<Finding>, Explained) {
    let mut comparison = Comparison::new(context);
    let by_hash: HashMap<&str, &ServicePort, NameHash> = graph
        .service_ports
        .iter()
        .filter_map(|p| p.hash.as_deref().map(|h| (h, p)))
        .collect();

    if skeleton_only(expected, graph) {
        let n = expected.iter().filter(|e| e.has_endpoints).count();
        comparison.out.push(
            cat::SKELETON_ONLY
                .finding(format!(
                    "kube-proxy's chains exist but no service port is programmed ({n} with endpoints expected)"
                ))
                .chain("nat KUBE-SERVICES")
                .expected(format!("{n} service ports with KUBE-SVC/KUBE-SEP chains"))
                .actual("none"),
        );
        for e in expected {
            comparison.explained.services.insert(e.name.to_string());
        }
        comparison.explained.chains.insert("KUBE-SERVICES".into());
        comparison.explained.chains.insert("KUBE-NODEPORTS".into());
        comparison
            .explained
            .chains
            .insert("KUBE-EXTERNAL-SERVICES".into());
        comparison
            .explained
            .chains
            .insert("KUBE-PROXY-FIREWALL".into());
        for e in expected {
            for c in port_chains(e) {
                comparison.explained.chains.insert(c);
            }
        }
        return (comparison.out, comparison.explained);
    }

    // Runs of ports are compared in parallel; joined in order, their findings are those of one
    // pass.
    let parts: Vec<_> = expected
        .par_chunks(per_task.max(1))
        .map(|part| {
            let mut comparison = Comparison::new(context);
            let matched = compare_ports(&mut comparison, part, &by_hash);
            (comparison.out, comparison.explained, matched)
        })
        .collect();
    let mut matched: HashSet<&str, NameHash> =
        HashSet::with_capacity_and_hasher(expected.len(), NameHash::default());
    for (mut out, explained, found) in parts {
        comparison.out.append(&mut out);
        comparison.explained.chains.extend(explained.chains);
        comparison.explained.services.extend(explained.services);
        comparison.explained.unchecked.extend(explained.unchecked);
        matched.extend(found);
    }
    stale_ports(&mut comparison, graph, &matched);
    anomalies(&mut comparison, graph, expected);
    (comparison.out, comparison.explained)
}

/// KP406: a port whose path holds rules this build does not know. It is named, and every chain
/// of its path is explained, so that neither this level nor the rule level concludes anything
/// from what could not be read.
fn unknown_layout(comparison: &mut Comparison<'_>, e: &ExpectedPort, a: &ServicePort) {
    let chain = a
        .unknown_layout
        .first()
        .map_or_else(String::new, |u| u.name.clone());
    let f = comparison.push(
        cat::UNKNOWN_RULES,
        e,
        &chain,
        format!(
            "on this service port's path: {}; the port is not checked",
            crate::graph::unknown_layout_message(&a.unknown_layout)
        ),
    );
    set(
        f,
        "rules kube-proxy's releases write",
        format!(
            "{} rule(s) this build does not know",
            a.unknown_layout.len()
        ),
    );
    for c in a
        .chains
        .iter()
        .map(|c| c.name.clone())
        .chain(a.endpoints.iter().map(|p| p.chain.to_string()))
        .chain(a.unknown_layout.iter().map(|u| u.name.clone()))
    {
        comparison.explained.chains.insert(c);
    }
    comparison.explained.unchecked.insert(e.name.to_string());
}

/// How many expected service ports one parallel task of [`compare`] checks.
const PORTS_PER_TASK: usize = 1024;

/// The per-port checks of `expected` against the graph's ports (by chain hash); returns the
/// hashes that were found.
fn compare_ports<'e>(
    comparison: &mut Comparison<'_>,
    expected: &'e [ExpectedPort],
    by_hash: &HashMap<&str, &ServicePort, NameHash>,
) -> HashSet<&'e str, NameHash> {
    let mut matched: HashSet<&str, NameHash> =
        HashSet::with_capacity_and_hasher(expected.len(), NameHash::default());
    for e in expected {
        let actual = by_hash.get(e.hash).copied();
        if let Some(a) = actual {
            matched.insert(e.hash);
            if !a.unknown_layout.is_empty() {
                unknown_layout(comparison, e, a);
                continue;
            }
            entries(comparison, e, a);
            if e.has_endpoints {
                endpoints(comparison, e, a);
                masquerade(comparison, e, a);
                affinity(comparison, e, a);
            } else {
                // No endpoints: everything nat holds for it is explained by the entry findings.
                for c in a
                    .chains
                    .iter()
                    .map(|c| c.name.clone())
                    .chain(a.endpoints.iter().map(|p| p.chain.to_string()))
                {
                    if a.entries
                        .iter()
                        .any(|en| en.kind != EntryKind::HealthCheckNodePort)
                    {
                        comparison.explained.chains.insert(c);
                    }
                }
            }
            firewall(comparison, e, a);
        } else {
            missing_port(comparison, e);
        }
    }
    matched
}

fn port_chains(e: &ExpectedPort) -> Vec<String> {
    let mut v = vec![e.svc_chain(), e.svl_chain(), e.ext_chain(), e.fw_chain()];
    v.extend(e.reachable.iter().map(|r| r.chain.to_string()));
    v
}

/// kube-proxy's skeleton is there but not one service port with endpoints is programmed.
fn skeleton_only(expected: &[ExpectedPort], graph: &ServiceGraph) -> bool {
    let want = expected.iter().filter(|e| e.has_endpoints).count();
    want >= 2
        && graph.masquerade_mark.is_some()
        && !graph.service_ports.iter().any(|p| {
            !p.endpoints.is_empty()
                || p.entries
                    .iter()
                    .any(|e| e.kind != EntryKind::HealthCheckNodePort)
        })
}

/// No chain, entry or verdict at all for an expected service port.
fn missing_port(comparison: &mut Comparison<'_>, e: &ExpectedPort) {
    let empty = ServicePort {
        name: Some(e.name.to_string()),
        name_source: crate::graph::NameSource::Unknown,
        protocol: Some(e.protocol.to_string()),
        hash: Some(e.hash.to_string()),
        chains: Vec::new(),
        entries: Vec::new(),
        endpoints: Vec::new(),
        masquerade: Vec::new(),
        affinity: None,
        firewall: None,
        verdicts: Vec::new(),
        edges: Vec::new(),
        unknown_layout: Vec::new(),
    };
    entries(comparison, e, &empty);
}

/// An expected entry point or verdict.
struct Want {
    kind: EntryKind,
    addr: Option<IpAddr>,
    port: u16,
    /// nat target chain, or the filter verdict.
    target: WantTarget,
}

enum WantTarget {
    /// The chains that lead where the entry must go (the first is the one to name).
    Chain(Vec<String>),
    Verdict(&'static str, Verdict),
    Accept,
}

fn wants(e: &ExpectedPort) -> Vec<Want> {
    let mut v = Vec::new();
    let (p, cip) = (e.port, Some(e.cluster_ip));
    match e.internal_verdict() {
        None => v.push(Want {
            kind: EntryKind::ClusterIp,
            addr: cip,
            port: p,
            target: WantTarget::Chain(vec![e.internal_chain()]),
        }),
        Some(vd) => v.push(Want {
            kind: EntryKind::ClusterIp,
            addr: cip,
            port: p,
            target: WantTarget::Verdict("KUBE-SERVICES", vd),
        }),
    }
    let ext = e.external_verdict();
    for x in e.external_ips {
        if e.has_endpoints {
            v.push(Want {
                kind: EntryKind::ExternalIp,
                addr: Some(*x),
                port: p,
                target: WantTarget::Chain(e.external_targets(false)),
            });
        }
        if let Some(vd) = ext {
            v.push(Want {
                kind: EntryKind::ExternalIp,
                addr: Some(*x),
                port: p,
                target: WantTarget::Verdict("KUBE-EXTERNAL-SERVICES", vd),
            });
        }
    }
    for l in e.lb_ips {
        if e.has_endpoints {
            v.push(Want {
                kind: EntryKind::LoadBalancerIp,
                addr: Some(*l),
                port: p,
                target: WantTarget::Chain(e.external_targets(true)),
            });
        }
        if let Some(vd) = ext {
            v.push(Want {
                kind: EntryKind::LoadBalancerIp,
                addr: Some(*l),
                port: p,
                target: WantTarget::Verdict("KUBE-EXTERNAL-SERVICES", vd),
            });
        }
    }
    if let Some(np) = e.node_port {
        if e.has_endpoints {
            v.push(Want {
                kind: EntryKind::NodePort,
                addr: None,
                port: np,
                target: WantTarget::Chain(e.external_targets(false)),
            });
        }
        if let Some(vd) = ext {
            v.push(Want {
                kind: EntryKind::NodePort,
                addr: None,
                port: np,
                target: WantTarget::Verdict("KUBE-EXTERNAL-SERVICES", vd),
            });
        }
    }
    if let Some(h) = e.health_check_node_port {
        v.push(Want {
            kind: EntryKind::HealthCheckNodePort,
            addr: None,
            port: h,
            target: WantTarget::Accept,
        });
    }
    v
}

fn missing_check(kind: EntryKind) -> Check {
    match kind {
        EntryKind::ClusterIp => cat::CLUSTER_IP_MISSING,
        EntryKind::ExternalIp => cat::EXTERNAL_IP_MISSING,
        EntryKind::LoadBalancerIp => cat::LB_IP_MISSING,
        EntryKind::NodePort => cat::NODEPORT_MISSING,
        EntryKind::HealthCheckNodePort => cat::HEALTH_CHECK_MISSING,
    }
}

fn dest_text(addr: Option<IpAddr>, port: u16, proto: &str) -> String {
    match addr {
        Some(a) => format!("{}/{proto}", ip_port(&a, port)),
        None => format!(":{port}/{proto}"),
    }
}

fn entries(comparison: &mut Comparison<'_>, e: &ExpectedPort, a: &ServicePort) {
    let wants = wants(e);
    // Entries and verdicts of the dump that some expectation accounts for.
    let mut used_entries = vec![false; a.entries.len()];
    let mut used_verdicts = vec![false; a.verdicts.len()];
    for w in &wants {
        let dest = dest_text(w.addr, w.port, e.protocol);
        match &w.target {
            t @ (WantTarget::Chain(_) | WantTarget::Accept) => {
                let accept = ["ACCEPT".to_string()];
                let targets: &[String] = match t {
                    WantTarget::Chain(c) => c,
                    _ => &accept,
                };
                let chain = targets.first().map_or("ACCEPT", String::as_str);
                let found: Vec<usize> = a
                    .entries
                    .iter()
                    .enumerate()
                    .filter(|(_, en)| {
                        en.kind == w.kind
                            && en.port == Some(w.port)
                            && match w.addr {
                                Some(ip) => parse_addr(en.address.as_deref()) == Some(ip),
                                None => true,
                            }
                    })
                    .map(|(i, _)| i)
                    .collect();
                for &i in &found {
                    used_entries[i] = true;
                }
                let table_chain = entry_chain(w.kind);
                if found.is_empty() {
                    let f = comparison.push(
                        missing_check(w.kind),
                        e,
                        table_chain,
                        format!("{} {dest} has no rule: traffic to it is not load-balanced on this node", w.kind.label()),
                    );
                    set(f, format!("{dest} -j {chain}"), "no rule");
                    // The chain it should lead to may now be unreferenced: same cause.
                    comparison.explained.chains.insert(chain.to_string());
                } else if let Some(bad) = found
                    .iter()
                    .filter_map(|&i| a.entries.get(i))
                    .find(|en| !targets.contains(&en.target))
                {
                    let f = comparison.push(
                        cat::ENTRY_WRONG_TARGET,
                        e,
                        table_chain,
                        format!(
                            "{} {dest} jumps to {} instead of {chain}",
                            w.kind.label(),
                            bad.target
                        ),
                    );
                    set(f, format!("-j {chain}"), format!("-j {}", bad.target));
                    comparison.explained.chains.insert(bad.target.clone());
                }
            }
            WantTarget::Verdict(chain, vd) => {
                let found: Vec<usize> = a
                    .verdicts
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| {
                        v.table == "filter"
                            && v.chain == *chain
                            && v.port == Some(w.port)
                            && match w.addr {
                                Some(ip) => parse_addr(v.address.as_deref()) == Some(ip),
                                None => v.address.is_none(),
                            }
                    })
                    .map(|(i, _)| i)
                    .collect();
                let right = found
                    .iter()
                    .any(|&i| a.verdicts.get(i).is_some_and(|v| v.verdict == vd.as_str()));
                if !right && *vd == Verdict::Drop && drops_in_nat(a) {
                    // Before 1.25 the Local policy chain drops through kubelet's KUBE-MARK-DROP.
                    continue;
                }
                if right {
                    for &i in &found {
                        if a.verdicts.get(i).is_some_and(|v| v.verdict == vd.as_str()) {
                            used_verdicts[i] = true;
                        }
                    }
                } else {
                    let why = if e.has_endpoints {
                        "has no local endpoints"
                    } else {
                        "has no endpoints"
                    };
                    let f = comparison.push(
                        cat::REJECT_MISSING,
                        e,
                        &format!("filter {chain}"),
                        format!(
                            "{} {dest} {why} but is not {}",
                            w.kind.label(),
                            match vd.as_str() {
                                "DROP" => "dropped",
                                "REJECT" => "rejected",
                                other => other,
                            }
                        ),
                    );
                    set(f, format!("{dest} -j {}", vd.as_str()), "no rule");
                }
            }
        }
    }
    // Entries the API does not account for.
    for (i, en) in a.entries.iter().enumerate() {
        if used_entries.get(i).copied().unwrap_or(true) {
            continue;
        }
        let dropped_in_nat = drops_in_nat(a)
            && (en.target == e.svl_chain() || en.target == e.xlb_chain())
            && wants.iter().any(|w| {
                w.kind == en.kind && matches!(w.target, WantTarget::Verdict(_, Verdict::Drop))
            });
        if dropped_in_nat {
            continue;
        }
        let dest = en.display();
        let chain = format!("{} {}", en.table, en.chain);
        let served_wanted = wants
            .iter()
            .any(|w| w.kind == en.kind && matches!(w.target, WantTarget::Chain(_)));
        if !e.has_endpoints
            || (!served_wanted
                && en.kind != EntryKind::HealthCheckNodePort
                && is_verdict_only(&wants, en.kind))
        {
            let f = comparison.push(
                cat::ENTRY_WITHOUT_ENDPOINTS,
                e,
                &chain,
                format!(
                    "{} {dest} forwards to {} although the service port has no usable endpoints",
                    en.kind.label(),
                    en.target
                ),
            );
            set(f, "REJECT/DROP (no endpoints)", format!("-j {}", en.target));
            comparison.explained.chains.insert(en.target.clone());
        } else {
            let f = comparison.push(
                cat::ENTRY_STALE,
                e,
                &chain,
                format!(
                    "{} {dest} is not an address/port of the Service",
                    en.kind.label()
                ),
            );
            set(f, "no such entry", format!("{dest} -j {}", en.target));
        }
    }
    // Verdicts the API does not account for.
    for (i, v) in a.verdicts.iter().enumerate() {
        if used_verdicts.get(i).copied().unwrap_or(true)
            || !matches!(
                v.reason,
                VerdictReason::NoEndpoints | VerdictReason::NoLocalEndpoints | VerdictReason::Other
            )
            || v.table != "filter"
        {
            continue;
        }
        let dest = match &v.address {
            Some(a) => format!("{a}:{}", v.port.map(|p| p.to_string()).unwrap_or_default()),
            None => format!(":{}", v.port.map(|p| p.to_string()).unwrap_or_default()),
        };
        let n = e
            .cluster_endpoints
            .len()
            .max(e.local_endpoints.len())
            .max(e.reachable.len());
        let f = comparison.push(
            cat::REJECT_WITH_ENDPOINTS,
            e,
            &format!("{} {}", v.table, v.chain),
            format!(
                "{} for {dest} although the service port has {n} usable endpoint(s)",
                v.verdict
            ),
        );
        set(
            f,
            "traffic forwarded to the endpoints",
            format!("{dest} -j {}", v.verdict),
        );
    }
}

/// Whether the port's Local policy chain drops through kubelet's `KUBE-MARK-DROP` ("has no
/// local endpoints", kube-proxy before 1.25) rather than in the filter table.
fn drops_in_nat(a: &ServicePort) -> bool {
    a.verdicts.iter().any(|v| {
        v.table == "nat"
            && v.verdict == "KUBE-MARK-DROP"
            && v.reason == VerdictReason::NoLocalEndpoints
    })
}

fn is_verdict_only(wants: &[Want], kind: EntryKind) -> bool {
    wants
        .iter()
        .any(|w| w.kind == kind && matches!(w.target, WantTarget::Verdict(..)))
}

fn entry_chain(kind: EntryKind) -> &'static str {
    match kind {
        EntryKind::NodePort => "nat KUBE-NODEPORTS",
        EntryKind::HealthCheckNodePort => "filter KUBE-NODEPORTS",
        _ => "nat KUBE-SERVICES",
    }
}

fn endpoints(comparison: &mut Comparison<'_>, e: &ExpectedPort, a: &ServicePort) {
    if comparison.context.unreadable {
        return;
    }
    let local_names = [e.svl_chain(), format!("KUBE-XLB-{}", e.hash)];
    let cluster_names = [e.svc_chain()];
    let policies: [(&[String], ExpectedEndpoints, bool); 2] = [
        (&cluster_names, e.cluster_endpoints, false),
        (&local_names, e.local_endpoints, true),
    ];
    for (names, want, local) in policies {
        let picked: Vec<&crate::graph::Endpoint> = a
            .endpoints
            .iter()
            .filter(|ep| ep.shares.iter().any(|s| names.iter().any(|n| n == s.via)))
            .collect();
        let chain = names.first().cloned().unwrap_or_default();
        if want.is_empty() && picked.is_empty() {
            continue;
        }
        let mut matched_actual: HashSet<&str, NameHash> =
            HashSet::with_capacity_and_hasher(want.len(), NameHash::default());
        let mut all_found = true;
        for w in want.iter() {
            let hit = picked.iter().find(|ep| ep.chain == w.chain).or_else(|| {
                picked
                    .iter()
                    .find(|ep| ep.ip == Some(w.ip) && ep.port == Some(w.port))
            });
            match hit {
                Some(ep) => {
                    matched_actual.insert(ep.chain);
                    if ep.destination.is_none() {
                        all_found = false;
                        let f = comparison.push(
                            cat::ENDPOINT_CHAIN_BROKEN,
                            e,
                            ep.chain,
                            format!(
                                "endpoint {} is picked by {chain} but {} does not DNAT",
                                w.endpoint, ep.chain
                            ),
                        );
                        set(
                            f,
                            format!("-j DNAT --to-destination {}", w.endpoint),
                            "no DNAT rule",
                        );
                    } else if ep.ip != Some(w.ip) || ep.port != Some(w.port) {
                        all_found = false;
                        let got = ep.destination.unwrap_or_default();
                        let check = if ep.ip == Some(w.ip) {
                            cat::WRONG_TARGET_PORT
                        } else {
                            cat::ENDPOINT_EXTRA
                        };
                        let f = comparison.push(
                            check,
                            e,
                            ep.chain,
                            format!("{} DNATs to {got} instead of {}", ep.chain, w.endpoint),
                        );
                        set(f, w.endpoint, got);
                    } else if !ep.hairpin_masquerade {
                        let f = comparison.push(
                            cat::MASQ_MISSING,
                            e,
                            ep.chain,
                            format!(
                                "endpoint {} does not masquerade its own (hairpin) traffic",
                                w.endpoint
                            ),
                        );
                        set(f, format!("-s {} -j KUBE-MARK-MASQ", w.ip), "no such rule");
                    }
                }
                None => {
                    all_found = false;
                    let f = comparison.push(
                        cat::ENDPOINT_MISSING,
                        e,
                        &chain,
                        format!(
                            "{} endpoint {} is not reached from {chain}",
                            if local { "local ready" } else { "ready" },
                            w.endpoint
                        ),
                    );
                    set(
                        f,
                        format!("{chain} -> {} ({})", w.chain, w.endpoint),
                        if picked.is_empty() {
                            "no endpoints".to_string()
                        } else {
                            listed(picked.iter().map(|p| p.destination.unwrap_or(p.chain)))
                        },
                    );
                    comparison.explained.chains.insert(w.chain.to_string());
                }
            }
        }
        let mut extra = false;
        for ep in &picked {
            if matched_actual.contains(ep.chain) {
                continue;
            }
            extra = true;
            let dest = ep.destination.unwrap_or("?");
            let same_ip = want.iter().find(|w| Some(w.ip) == ep.ip);
            let elsewhere = local
                .then(|| {
                    e.cluster_endpoints
                        .iter()
                        .chain(e.reachable.iter())
                        .find(|w| Some(w.ip) == ep.ip && !w.is_local)
                })
                .flatten();
            let (check, msg) = if let Some(w) = same_ip {
                (
                    cat::WRONG_TARGET_PORT,
                    format!(
                        "{} DNATs to {dest} but the endpoint's port is {}",
                        ep.chain, w.port
                    ),
                )
            } else if let Some(w) = elsewhere {
                (
                    cat::NOT_LOCAL_ENDPOINT,
                    format!(
                        "{chain} forwards to {dest}, which runs on {}",
                        w.node_name.unwrap_or("another node")
                    ),
                )
            } else {
                (
                    cat::ENDPOINT_EXTRA,
                    format!(
                        "{chain} forwards to {dest}, which the API does not list as a usable endpoint"
                    ),
                )
            };
            let f = comparison.push(check, e, ep.chain, msg);
            set(f, listed(want.iter().map(|w| w.endpoint)), dest);
            comparison.explained.chains.insert(chain.clone());
        }
        if all_found && !extra && !want.is_empty() {
            shares(comparison, e, &picked, names, &chain, want.len());
        }
    }
}

fn shares(
    comparison: &mut Comparison<'_>,
    e: &ExpectedPort,
    picked: &[&crate::graph::Endpoint],
    names: &[String],
    chain: &str,
    n: usize,
) {
    let target = 1.0 / n as f64;
    let got: Vec<(String, f64)> = picked
        .iter()
        .map(|ep| {
            let s: f64 = ep
                .shares
                .iter()
                .filter(|s| names.iter().any(|n| n == s.via))
                .map(|s| s.share)
                .sum();
            (ep.destination.unwrap_or(ep.chain).to_string(), s)
        })
        .collect();
    if got
        .iter()
        .all(|(_, s)| (s - target).abs() <= SHARE_TOLERANCE)
    {
        return;
    }
    let f = comparison.push(
        cat::UNEQUAL_SHARES,
        e,
        chain,
        format!("{chain} does not split new connections equally over its {n} endpoints"),
    );
    set(
        f,
        format!("{} each", crate::graph::percent(target)),
        got.iter()
            .map(|(d, s)| format!("{d} {}", crate::graph::percent(*s)))
            .collect::<Vec<_>>()
            .join(", "),
    );
}

fn masquerade(comparison: &mut Comparison<'_>, e: &ExpectedPort, a: &ServicePort) {
    let internal = e.internal_chain();
    let in_chain = |names: &[&str], reason: MasqueradeReason| {
        a.masquerade
            .iter()
            .find(|m| m.reason == reason && names.contains(&m.chain))
    };
    if e.has_internal_endpoints
        && (comparison.context.masquerade_all || comparison.context.local_detector.is_some())
    {
        let names = [internal.as_str(), "KUBE-SERVICES"];
        if comparison.context.masquerade_all {
            if in_chain(&names, MasqueradeReason::AllSources).is_none() {
                let f = comparison.push(
                    cat::MASQ_MISSING,
                    e,
                    &internal,
                    format!("cluster IP traffic is not masqueraded in {internal} (masqueradeAll)"),
                );
                set(
                    f,
                    format!("-d {} --dport {} -j KUBE-MARK-MASQ", e.cluster_ip, e.port),
                    "no such rule",
                );
            }
        } else if let Some(det) = &comparison.context.local_detector {
            match in_chain(&names, MasqueradeReason::OffClusterSource) {
                None => {
                    let f = comparison.push(
                        cat::MASQ_MISSING,
                        e,
                        &internal,
                        format!("off-cluster clients of the cluster IP are not masqueraded in {internal}"),
                    );
                    set(
                        f,
                        format!(
                            "-d {} --dport {} {} -j KUBE-MARK-MASQ",
                            e.cluster_ip,
                            e.port,
                            not_local(det)
                        ),
                        "no such rule",
                    );
                }
                Some(m) => {
                    let cond = m.condition.clone().unwrap_or_default();
                    if !condition_matches(&cond, det) {
                        let f = comparison.push(
                            cat::LOCAL_DETECT_MISMATCH,
                            e,
                            m.chain,
                            format!("pod traffic is detected with `{cond}`, the configuration says `{}`", not_local(det)),
                        );
                        set(f, not_local(det), cond);
                    }
                }
            }
        }
    }
    if e.uses_ext {
        let ext = e.ext_chain();
        let (reason, what) = if e.external_local {
            (
                MasqueradeReason::LocalSource,
                "node-local clients of external destinations",
            )
        } else {
            (
                MasqueradeReason::ExternalDestination,
                "traffic to external destinations",
            )
        };
        let ok = a.masquerade.iter().any(|m| {
            m.reason == reason
                && (m.chain == ext
                    || (reason == MasqueradeReason::ExternalDestination
                        && !m.chain.starts_with("KUBE-SEP-")))
        });
        if !ok {
            let f = comparison.push(
                cat::MASQ_MISSING,
                e,
                &ext,
                format!("{what} are not masqueraded in {ext}"),
            );
            set(f, format!("-A {ext} … -j KUBE-MARK-MASQ"), "no such rule");
        }
    }
    if !comparison.context.masquerade_all
        && let Some(m) = a
            .masquerade
            .iter()
            .find(|m| m.reason == MasqueradeReason::AllSources)
    {
        let f = comparison.push(
            cat::MASQ_EXTRA,
            e,
            m.chain,
            format!(
                "{} masquerades every source although masqueradeAll is off",
                m.chain
            ),
        );
        set(f, "masquerade only off-cluster sources", "all sources");
    }
}

fn not_local(det: &str) -> String {
    if det.contains('/') {
        format!("! -s {det}")
    } else {
        format!("! -i {det}")
    }
}

fn condition_matches(cond: &str, det: &str) -> bool {
    let got = cond
        .trim_start_matches('!')
        .trim()
        .trim_start_matches("-s")
        .trim_start_matches("-i")
        .trim();
    if det.contains('/') {
        cidr_key(got) == cidr_key(det)
    } else {
        got == det
    }
}

fn affinity(comparison: &mut Comparison<'_>, e: &ExpectedPort, a: &ServicePort) {
    let chain = e.internal_chain();
    match (e.affinity_seconds, &a.affinity) {
        (Some(t), None) => {
            let f = comparison.push(
                cat::AFFINITY_MISSING,
                e,
                &chain,
                format!("sessionAffinity ClientIP ({t}s) has no -m recent rules in {chain}"),
            );
            set(
                f,
                format!("-m recent --rcheck --seconds {t} --reap"),
                "no affinity rules",
            );
        }
        (Some(t), Some(af)) => {
            if af.timeout_seconds != Some(t) {
                let f = comparison.push(
                    cat::AFFINITY_TIMEOUT,
                    e,
                    &chain,
                    "session affinity timeout differs from sessionAffinityConfig".to_string(),
                );
                set(
                    f,
                    format!("{t}s"),
                    af.timeout_seconds
                        .map(|s| format!("{s}s"))
                        .unwrap_or_else(|| "none".into()),
                );
            }
            if !comparison.context.unreadable {
                for ep in &a.endpoints {
                    let wanted = e.reachable.iter().any(|w| w.chain == ep.chain);
                    if wanted && ep.destination.is_some() && !ep.affinity_set {
                        let f = comparison.push(
                            cat::AFFINITY_MISSING,
                            e,
                            ep.chain,
                            format!("{} does not record clients (-m recent --set)", ep.chain),
                        );
                        set(
                            f,
                            format!("-m recent --name {} --set", ep.chain),
                            "no such match",
                        );
                    }
                }
            }
        }
        (None, Some(af)) => {
            let c = af.chains.first().cloned().unwrap_or(chain);
            let f = comparison.push(
                cat::AFFINITY_EXTRA,
                e,
                &c,
                "session affinity rules although the Service has sessionAffinity None".to_string(),
            );
            set(
                f,
                "none",
                af.timeout_seconds
                    .map(|s| format!("{s}s"))
                    .unwrap_or_default(),
            );
        }
        (None, None) => {}
    }
}

fn firewall(comparison: &mut Comparison<'_>, e: &ExpectedPort, a: &ServicePort) {
    let fw = e.fw_chain();
    match (&a.firewall, e.uses_fw) {
        (None, true) => {
            let f = comparison.push(
                cat::FIREWALL_MISMATCH,
                e,
                &fw,
                format!("loadBalancerSourceRanges are not enforced: no {fw}"),
            );
            set(f, e.firewall_sources.join(", "), "no firewall chain");
        }
        (Some(af), true) => {
            let mut want: Vec<String> = e
                .firewall_sources
                .iter()
                .map(|s| canonical_cidr(s))
                .collect();
            let mut got: Vec<String> = af.source_ranges.iter().map(|s| canonical_cidr(s)).collect();
            want.sort();
            want.dedup();
            got.sort();
            got.dedup();
            if want != got {
                let f = comparison.push(
                    cat::FIREWALL_MISMATCH,
                    e,
                    &af.chain,
                    format!(
                        "{} allows other sources than loadBalancerSourceRanges",
                        af.chain
                    ),
                );
                set(f, want.join(", "), got.join(", "));
            }
        }
        (Some(af), false) if e.has_endpoints => {
            let f = comparison.push(
                cat::FIREWALL_MISMATCH,
                e,
                &af.chain,
                format!(
                    "{} filters sources although the Service has no loadBalancerSourceRanges",
                    af.chain
                ),
            );
            set(f, "no source-range firewall", af.source_ranges.join(", "));
        }
        _ => {}
    }
    // The filter drop of traffic the FW chain did not accept.
    if e.uses_fw {
        for l in e.lb_ips {
            let present = a.verdicts.iter().any(|v| {
                v.reason == VerdictReason::SourceRange
                    && parse_addr(v.address.as_deref()) == Some(*l)
                    && v.port == Some(e.port)
            }) || a.verdicts.iter().any(|v| {
                // Old releases close every firewall chain with KUBE-MARK-DROP, with or
                // without ranges (a fall-through then).
                v.table == "nat"
                    && matches!(
                        v.reason,
                        VerdictReason::SourceRange | VerdictReason::FallThrough
                    )
            });
            if !present {
                let f = comparison.push(
                    cat::FIREWALL_MISMATCH,
                    e,
                    "filter KUBE-PROXY-FIREWALL",
                    format!(
                        "traffic to {} from outside loadBalancerSourceRanges is not dropped",
                        ip_port(l, e.port)
                    ),
                );
                set(
                    f,
                    format!("-d {l} --dport {} -j DROP", e.port),
                    "no such rule",
                );
            }
        }
    }
}

/// Service ports in the dump the API does not have (KP401).
fn stale_ports(
    comparison: &mut Comparison<'_>,
    graph: &ServiceGraph,
    matched: &HashSet<&str, NameHash>,
) {
    for p in &graph.service_ports {
        if p.hash.as_deref().is_some_and(|h| matched.contains(h)) {
            continue;
        }
        if p.entries.is_empty() && p.verdicts.is_empty() {
            continue; // only unreferenced chains: reported as orphans
        }
        let name = p.display_name();
        let mut what: Vec<String> = p
            .entries
            .iter()
            .map(|en| format!("{} {}", en.kind.label(), en.display()))
            .collect();
        what.extend(
            p.verdicts
                .iter()
                .map(|v| format!("{} in {}", v.verdict, v.chain)),
        );
        let chain = p
            .chains
            .iter()
            .find(|c| c.kind == ChainKind::Svc)
            .or_else(|| p.chains.first())
            .map(|c| c.name.clone())
            .or_else(|| {
                p.verdicts
                    .first()
                    .map(|v| format!("{} {}", v.table, v.chain))
            })
            .unwrap_or_default();
        comparison.explained.services.insert(name.clone());
        for c in p
            .chains
            .iter()
            .map(|c| c.name.clone())
            .chain(p.endpoints.iter().map(|e| e.chain.to_string()))
        {
            comparison.explained.chains.insert(c);
        }
        comparison.out.push(
            cat::STALE_SERVICE
                .finding(format!(
                    "{name} ({}) has rules on this node but no such service port in the API",
                    p.protocol.as_deref().unwrap_or("?")
                ))
                .service(name)
                .chain(chain)
                .expected("no rules")
                .actual(what.join("; ")),
        );
    }
}

/// Structural anomalies of the graph → KP402/KP403/KP404/KP405.
fn anomalies(comparison: &mut Comparison<'_>, graph: &ServiceGraph, expected: &[ExpectedPort]) {
    let mut dups: BTreeMap<(String, String), (usize, Option<String>)> = BTreeMap::new();
    // The endpoint chains kube-proxy writes: 1.22 writes one per endpoint, ready or not, and
    // only affinity rules reference the unready ones. Made when first needed.
    let mut written: Option<HashSet<&str, NameHash>> = None;
    for an in &graph.anomalies {
        let chain = an.chain.clone().unwrap_or_default();
        match an.kind {
            AnomalyKind::UndeclaredJump => {
                comparison.out.push(
                    cat::DANGLING_JUMP
                        .finding(format!("{} {chain}: {}", an.table, an.message))
                        .chain(format!("{} {chain}", an.table))
                        .expected("every jump target declared")
                        .actual(an.message.clone()),
                );
            }
            AnomalyKind::UnreferencedChain => {
                if crate::graph::ownership::service_chain(&chain).is_none() {
                    continue; // fixed chains: the base-jump check reports them
                }
                // A rule this build does not know on the port's path may be what reaches it.
                if an
                    .service
                    .as_ref()
                    .is_some_and(|s| comparison.explained.unchecked.contains(s))
                {
                    continue;
                }
                if comparison.explained.chains.contains(&chain) {
                    continue;
                }
                let written = written.get_or_insert_with(|| {
                    expected
                        .iter()
                        .flat_map(|e| e.reachable.iter().map(|r| r.chain))
                        .collect()
                });
                if written.contains(chain.as_str()) {
                    continue;
                }
                comparison.explained.chains.insert(chain.clone());
                let check = if comparison.context.large_cluster {
                    cat::STALE_CHAIN_LARGE_CLUSTER
                } else {
                    cat::ORPHAN_CHAIN
                };
                let mut f = check
                    .finding(format!("{chain} is not referenced by any rule"))
                    .chain(chain.clone())
                    .expected("referenced, or deleted")
                    .actual("unreferenced");
                if let Some(s) = &an.service {
                    f = f.service(s.clone());
                }
                comparison.out.push(f);
            }
            AnomalyKind::DuplicateRule => {
                let d = dups
                    .entry((an.table.clone(), chain))
                    .or_insert((1, an.service.clone()));
                d.0 += 1;
            }
            _ => {}
        }
    }
    for ((table, chain), (n, service)) in dups {
        // In a shared chain the copies are one Service's rules among the others': the rule
        // level names the extra copy by its Service, and the others' findings stay theirs.
        if crate::graph::ownership::service_chain(&chain).is_some() {
            comparison.explained.chains.insert(chain.clone());
        }
        let mut f = cat::DUPLICATE_RULES
            .finding(format!("{table} {chain}: a rule appears {n} times"))
            .chain(format!("{table} {chain}"))
            .expected("1 copy")
            .actual(format!("{n} copies"));
        if let Some(s) = service {
            f = f.service(s);
        }
        comparison.out.push(f);
    }
}

#[cfg(test)]
mod tests {
    use super::{GraphContext, canonical_cidr, compare_split, condition_matches};

    /// Split into parallel tasks of one port each, the per-port checks find exactly what one
    /// pass finds, in the same order (a drifted dump of the testdata cluster).
    #[test]
    fn split_compare_finds_what_one_pass_finds() {
        let (plan, _) = crate::compare::fixture::cluster_decisions();
        let expected = super::super::expected::expected_ports(&plan);
        let dump = crate::compare::fixture::drifted_dump();
        let rules =
            crate::model::Ruleset::parse(&dump, &kproxy_parsers::iptables::ParseOptions::strict())
                .expect("dump");
        let graph = crate::graph::iptables::build_ruleset(
            &rules,
            &crate::graph::iptables::DumpSummary::default(),
            &crate::graph::GraphOptions::default(),
        );
        let context = GraphContext::default();
        let (one, one_explained) = compare_split(&expected, &graph, &context, usize::MAX);
        assert!(!one.is_empty(), "the drifted dump has graph-level findings");
        assert!(expected.len() >= 2, "several tasks");
        let (split, split_explained) = compare_split(&expected, &graph, &context, 1);
        assert_eq!(split, one);
        assert_eq!(split_explained.chains, one_explained.chains);
        assert_eq!(split_explained.services, one_explained.services);
    }

    #[test]
    fn detector_conditions_compare_as_blocks() {
        assert!(condition_matches("! -s 10.244.0.0/16", "10.244.0.0/16"));
        assert!(condition_matches("! -s 10.244.7.9/16", "10.244.0.0/16"));
        assert!(condition_matches("-s 10.0.0.1", "10.0.0.1/32"));
        assert!(condition_matches("! -s fd00:0::/48", "fd00::/48"));
        assert!(!condition_matches("! -s 10.245.0.0/16", "10.244.0.0/16"));
        assert!(!condition_matches("! -s 10.244.0.0/17", "10.244.0.0/16"));
        assert!(!condition_matches("! -s 10.244.0.0/16", "fd00::/48"));
        // Interface detectors compare as written.
        assert!(condition_matches("! -i cbr0", "cbr0"));
        assert!(!condition_matches("! -i cbr1", "cbr0"));
    }

    #[test]
    fn canonical_cidr_text() {
        assert_eq!(canonical_cidr("10.0.0.5/24"), "10.0.0.0/24");
        assert_eq!(canonical_cidr("10.0.0.5"), "10.0.0.5/32");
        assert_eq!(canonical_cidr("fd00::1"), "fd00::1/128");
        assert_eq!(canonical_cidr("10.0.0.1/40"), "10.0.0.1/40");
        assert_eq!(canonical_cidr("not-a-cidr"), "not-a-cidr");
    }
}
