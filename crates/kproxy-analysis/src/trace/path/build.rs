//! Building the path view: the entry points of each selected service port and the branches a
//! new connection takes through its chains, as the graph has them.

use super::divergence::{compare_branch, count_divergences, missing_entries, missing_port};
use super::{
    AffinityView, Branch, Divergence, DivergenceKind, EndpointPath, EntryPath, MasqStep, PathError,
    PathView, PortPath, ServiceSelector, VerdictStep,
};
use crate::graph::{
    AnomalyKind, ChainKind, EntryKind, MasqueradeReason, ServiceGraph, ServicePort, VerdictReason,
    nftables::port_chain_kind, unknown_layout_message,
};
use crate::proxier::iptables::{ServiceDecisions, ServicePortDecisions};
use std::collections::BTreeSet;

fn port_name_of(spn: &str) -> &str {
    spn.split_once('/')
        .and_then(|(_, r)| r.split_once(':'))
        .map_or("", |(_, p)| p)
}

/// Builds the path view of the selected service from a graph and, optionally, the plan.
pub fn build(
    graph: &ServiceGraph,
    selector: &ServiceSelector,
    plan: Option<&ServiceDecisions>,
) -> Result<PathView, PathError> {
    let service = selector.service();
    let dump_ports = graph.ports_of(&selector.namespace, &selector.name);
    let plan_ports: Vec<&ServicePortDecisions> = plan
        .map(|p| {
            p.ports
                .iter()
                .filter(|decisions| {
                    decisions.info.name.namespace == selector.namespace
                        && decisions.info.name.name == selector.name
                })
                .collect()
        })
        .unwrap_or_default();
    if dump_ports.is_empty() && plan_ports.is_empty() {
        let known: BTreeSet<String> = graph
            .service_ports
            .iter()
            .filter_map(|p| p.name.as_deref())
            .map(|n| n.split(':').next().unwrap_or(n).to_string())
            .collect();
        let elsewhere: Vec<&str> = known
            .iter()
            .filter_map(|k| k.split_once('/'))
            .filter(|(_, name)| *name == selector.name)
            .map(|(ns, _)| ns)
            .collect();
        let unnamed = graph.service_ports.iter().any(|p| p.name.is_none());
        let hint = match elsewhere.as_slice() {
            [ns] => Some(format!("it exists as {ns}/{}: add -n {ns}", selector.name)),
            [] if unnamed => Some(format!(
                "the dump names some services only by their chains' hash (no comments): {} is found by the hash of its port name, so give it (--port NAME) or the API state (--state)",
                service
            )),
            [] => None,
            many => Some(format!(
                "a service {} exists in namespaces {}: choose one with -n",
                selector.name,
                many.join(", ")
            )),
        };
        return Err(PathError::NotFound {
            service,
            known: known.into_iter().take(10).collect(),
            hint,
        });
    }
    let mut ports: Vec<PortPath> = Vec::new();
    for observed in &dump_ports {
        let decisions = plan_ports.iter().copied().find(|decisions| {
            Some(decisions.info.name_string.as_str()) == observed.name.as_deref()
                && observed
                    .protocol
                    .as_deref()
                    .is_none_or(|p| p == decisions.info.name.protocol.lower())
        });
        ports.push(port_path(graph, observed, decisions, plan.is_some()));
    }
    for decisions in &plan_ports {
        let present = ports.iter().any(|p| {
            p.name == decisions.info.name_string
                && p.protocol
                    .as_deref()
                    .is_none_or(|x| x == decisions.info.name.protocol.lower())
        });
        if !present {
            ports.push(missing_port(decisions));
        }
    }
    if let Some(sel) = &selector.port {
        let all: Vec<String> = ports
            .iter()
            .map(|p| match p.port {
                Some(n) if !p.port_name.is_empty() => format!("{} ({n})", p.port_name),
                Some(n) => n.to_string(),
                None => p.port_name.clone(),
            })
            .collect();
        ports.retain(|p| &p.port_name == sel || p.port.is_some_and(|n| n.to_string() == *sel));
        if ports.is_empty() {
            return Err(PathError::PortNotFound {
                service,
                port: sel.clone(),
                ports: all,
            });
        }
    }
    ports.sort_by(|a, b| {
        (a.port, &a.port_name, &a.protocol).cmp(&(b.port, &b.port_name, &b.protocol))
    });
    let divergence_count = ports.iter().map(count_divergences).sum();
    Ok(PathView {
        service,
        source: graph.source.clone(),
        node: None,
        compared_with_api: plan.is_some(),
        ports,
        divergence_count,
        partial: graph.gaps.clone(),
    })
}

fn port_path(
    graph: &ServiceGraph,
    observed: &ServicePort,
    decisions: Option<&ServicePortDecisions>,
    compare: bool,
) -> PortPath {
    let name = observed.display_name();
    let mut entries: Vec<EntryPath> = observed
        .entries
        .iter()
        .map(|e| entry_path(observed, e, decisions))
        .collect();
    // Entry points that exist only as filter verdicts (no endpoints: REJECT; Local: DROP).
    for v in &observed.verdicts {
        if v.table != "filter" || v.reason == VerdictReason::SourceRange {
            continue;
        }
        let covered = entries.iter().any(|e| {
            e.address == v.address && e.port == v.port && e.kind != EntryKind::HealthCheckNodePort
        });
        if covered {
            continue;
        }
        let kind = match (v.chain.as_str(), &v.address) {
            ("KUBE-SERVICES", _) => EntryKind::ClusterIp,
            (_, None) => EntryKind::NodePort,
            (_, Some(a)) => {
                let is_lb = decisions.is_some_and(|decisions| {
                    decisions
                        .info
                        .load_balancer_vips
                        .iter()
                        .any(|ip| ip.to_string() == *a)
                });
                if is_lb {
                    EntryKind::LoadBalancerIp
                } else {
                    EntryKind::ExternalIp
                }
            }
        };
        let e = crate::graph::Entry {
            kind,
            address: v.address.clone(),
            port: v.port,
            protocol: observed.protocol.clone(),
            table: v.table.clone(),
            chain: v.chain.clone(),
            target: v.verdict.clone(),
            line: v.line,
            counters: v.counters,
        };
        let mut ep = entry_path(observed, &e, decisions);
        ep.line = None;
        entries.push(ep);
    }
    entries.sort_by_key(|e| (e.kind, e.line.unwrap_or(u32::MAX)));
    let mut divergences = Vec::new();
    let unknown = !observed.unknown_layout.is_empty();
    if unknown {
        divergences.push(Divergence {
            kind: DivergenceKind::UnknownLayout,
            message: unknown_layout_message(&observed.unknown_layout),
        });
    }
    for a in graph
        .anomalies
        .iter()
        .filter(|a| a.service.as_deref() == Some(name.as_str()))
        .filter(|a| a.kind != AnomalyKind::UnknownLayout)
    {
        divergences.push(Divergence {
            kind: DivergenceKind::Anomaly,
            message: format!(
                "{}{}: {}",
                a.chain.as_deref().unwrap_or(&a.table),
                a.line.map(|l| format!(" line {l}")).unwrap_or_default(),
                a.message
            ),
        });
    }
    let dump_timeout = observed.affinity.as_ref().and_then(|a| a.timeout_seconds);
    let mut affinity = observed.affinity.as_ref().map(|a| AffinityView {
        timeout_seconds: a.timeout_seconds,
        expected_timeout_seconds: None,
    });
    match decisions {
        Some(decisions) => {
            let expected = decisions.info.session_affinity_seconds;
            if expected.is_some() || affinity.is_some() {
                affinity = Some(AffinityView {
                    timeout_seconds: dump_timeout,
                    expected_timeout_seconds: expected,
                });
            }
            let has_endpoints = decisions.categorized.has_any;
            match (expected, observed.affinity.is_some()) {
                (Some(s), true) if dump_timeout.is_some_and(|d| i64::from(d) != i64::from(s)) => {
                    divergences.push(Divergence {
                        kind: DivergenceKind::Affinity,
                        message: format!(
                            "affinity timeout is {}s on the node, the API says {s}s",
                            dump_timeout.unwrap_or_default()
                        ),
                    })
                }
                (Some(s), false) if has_endpoints => divergences.push(Divergence {
                    kind: DivergenceKind::Affinity,
                    message: format!("the API sets sessionAffinity ClientIP ({s}s); the node has no affinity rules"),
                }),
                (None, true) => divergences.push(Divergence {
                    kind: DivergenceKind::Affinity,
                    message: "the node has affinity rules; the API sets no sessionAffinity".into(),
                }),
                _ => {}
            }
            divergences.extend(missing_entries(decisions, &entries));
            // What could not be read is not compared: no endpoint is called missing, stale
            // or wrongly shared from it.
            if !unknown {
                for e in &mut entries {
                    for b in &mut e.branches {
                        compare_branch(b, decisions);
                    }
                }
            }
        }
        None if compare => divergences.push(Divergence {
            kind: DivergenceKind::StaleServicePort,
            message: "the node has rules for this service port; the API has no such port".into(),
        }),
        None => {}
    }
    let port = decisions
        .and_then(|decisions| u16::try_from(decisions.info.port).ok())
        .or_else(|| {
            observed
                .entries
                .iter()
                .find(|e| e.kind == EntryKind::ClusterIp)
                .and_then(|e| e.port)
        });
    PortPath {
        port_name: port_name_of(&name).to_string(),
        name,
        port,
        protocol: observed.protocol.clone(),
        hash: observed.hash.clone(),
        in_dump: true,
        affinity,
        entries,
        divergences,
    }
}

fn entry_path(
    observed: &ServicePort,
    e: &crate::graph::Entry,
    _pp: Option<&ServicePortDecisions>,
) -> EntryPath {
    let mut branches = Vec::new();
    if port_chain_kind(&e.target).is_some() {
        walk(observed, &e.target, Vec::new(), Vec::new(), &mut branches);
    }
    let chains_on_path: BTreeSet<&str> = branches
        .iter()
        .flat_map(|b| b.chains.iter().map(String::as_str))
        .collect();
    let mut masquerade: Vec<MasqStep> = observed
        .masquerade
        .iter()
        .filter(|m| {
            m.reason != MasqueradeReason::Hairpin
                && (chains_on_path.contains(m.chain)
                    || (m.chain == e.chain && e.table == "nat")
                    // A mark the shared dispatch chain sets for the port's cluster IP (nftables
                    // since 1.36: `services` marks `ip daddr @cluster-ips`).
                    || (port_chain_kind(m.chain).is_none()
                        && e.kind == EntryKind::ClusterIp
                        && e.table == "nat"))
        })
        .map(|m| MasqStep {
            chain: m.chain.to_string(),
            reason: m.reason,
            condition: m.condition.as_deref().map(str::to_string),
            line: m.line,
            counters: m.counters,
            why: masq_why(m.reason, m.condition.as_deref()),
        })
        .collect();
    let on_branches = |m: &crate::graph::MasqueradeRule| {
        branches
            .iter()
            .flat_map(|b| &b.endpoints)
            .any(|ep| ep.chain == m.chain)
    };
    let hairpin_endpoints = branches
        .iter()
        .flat_map(|b| &b.endpoints)
        .any(|ep| ep.hairpin_masquerade);
    if let Some(h) = observed
        .masquerade
        .iter()
        .find(|m| m.reason == MasqueradeReason::Hairpin && on_branches(m))
    {
        // The endpoint chains' prefix and source match, in the mode's own words.
        let (chain, condition) = if h.chain.starts_with("KUBE-") {
            ("KUBE-SEP-*", "-s <endpoint>")
        } else {
            ("endpoint-*", "ip saddr <endpoint>")
        };
        masquerade.push(MasqStep {
            chain: chain.into(),
            reason: MasqueradeReason::Hairpin,
            condition: Some(condition.into()),
            line: h.line,
            counters: None,
            why: masq_why(MasqueradeReason::Hairpin, None),
        });
    } else if let Some(h) = observed
        .masquerade
        .iter()
        .find(|m| m.reason == MasqueradeReason::Hairpin && hairpin_endpoints && !on_branches(m))
    {
        // Masqueraded where the connection leaves (nftables since 1.36: the endpoints' own
        // connections are in the set `masquerading` looks up).
        masquerade.push(MasqStep {
            chain: h.chain.to_string(),
            reason: MasqueradeReason::Hairpin,
            condition: h.condition.as_deref().map(str::to_string),
            line: h.line,
            counters: h.counters,
            why: masq_why(MasqueradeReason::Hairpin, None),
        });
    }
    let mut verdicts: Vec<VerdictStep> = observed
        .verdicts
        .iter()
        .filter(|v| {
            let same_dest = match e.kind {
                EntryKind::NodePort => {
                    v.address.is_none() && v.port == e.port && v.table == "filter"
                }
                EntryKind::HealthCheckNodePort => false,
                _ => v.address == e.address && v.port == e.port && v.table == "filter",
            };
            same_dest || (v.table == "nat" && chains_on_path.contains(v.chain.as_str()))
        })
        .map(|v| VerdictStep {
            table: v.table.clone(),
            chain: v.chain.clone(),
            verdict: v.verdict.clone(),
            reason: v.reason,
            line: v.line,
            counters: v.counters,
            why: verdict_why(v.reason, &v.verdict),
        })
        .collect();
    if e.kind == EntryKind::HealthCheckNodePort {
        verdicts.push(VerdictStep {
            table: e.table.clone(),
            chain: e.chain.clone(),
            verdict: "ACCEPT".into(),
            reason: VerdictReason::Other,
            line: e.line,
            counters: e.counters,
            why: "health-check node port accepted for the load balancer's probes".into(),
        });
    }
    let hairpin: BTreeSet<(&str, Option<&str>)> = observed
        .endpoints
        .iter()
        .filter(|ep| ep.hairpin_masquerade)
        .map(|ep| (ep.chain, ep.destination))
        .collect();
    for b in &mut branches {
        for ep in &mut b.endpoints {
            ep.hairpin_masquerade =
                hairpin.contains(&(ep.chain.as_str(), ep.destination.as_deref()));
        }
    }
    EntryPath {
        kind: e.kind,
        display: e.display(),
        address: e.address.clone(),
        port: e.port,
        rule_chain: format!("{}/{}", e.table, e.chain),
        line: Some(e.line),
        counters: e.counters,
        target: e.target.clone(),
        branches,
        masquerade,
        verdicts,
        other_flows: Vec::new(),
    }
}

/// Follows the port's edges from `chain`, emitting one branch per policy chain reached.
fn walk(
    observed: &ServicePort,
    chain: &str,
    mut conds: Vec<String>,
    mut chains: Vec<String>,
    out: &mut Vec<Branch>,
) {
    if chains.len() > 8 || chains.iter().any(|c| c == chain) {
        return;
    }
    chains.push(chain.to_string());
    let is_policy = matches!(
        port_chain_kind(chain),
        Some(ChainKind::Svc | ChainKind::Svl | ChainKind::Xlb)
    );
    // A chain that picks endpoints, whatever its name: an endpoint has a share through it.
    let picks_endpoints = observed
        .endpoints
        .iter()
        .any(|ep| ep.shares.iter().any(|s| s.via == chain));
    if is_policy || picks_endpoints {
        let endpoints = observed
            .endpoints
            .iter()
            .filter_map(|ep| {
                let s = ep.shares.iter().find(|s| s.via == chain)?;
                Some(EndpointPath {
                    chain: ep.chain.to_string(),
                    destination: ep.destination.map(str::to_string),
                    share: s.share,
                    probability: s.probability,
                    expected_share: None,
                    line: Some(s.line),
                    counters: ep.counters.as_deref().copied(),
                    hairpin_masquerade: ep.hairpin_masquerade,
                    pod: None,
                    divergence: None,
                    live_flows: None,
                })
            })
            .collect();
        out.push(Branch {
            when: when_text(&conds),
            chains: chains.clone(),
            policy_chain: Some(chain.to_string()),
            endpoints,
        });
    }
    // Jumps to the same chain are one way on (e.g. several source ranges of a FW chain).
    let mut onward: Vec<(&str, Vec<&str>)> = Vec::new();
    for e in observed.edges.iter().filter(|e| e.from == chain) {
        // An endpoint chain (picked, DNATs to its endpoint); a chain that DNATs to the
        // endpoints it picks itself is a policy chain, the way on.
        let to_endpoint = observed
            .endpoints
            .iter()
            .any(|ep| ep.chain == e.to && ep.shares.iter().all(|s| s.via != e.to));
        if to_endpoint || matches!(port_chain_kind(e.to), Some(ChainKind::Sep) | None) {
            continue;
        }
        match onward.iter_mut().find(|(to, _)| *to == e.to) {
            Some((_, labels)) => labels.push(&e.label),
            None => onward.push((e.to, vec![&e.label])),
        }
    }
    let unconditional = onward
        .iter()
        .any(|(_, labels)| labels.iter().any(|l| l.is_empty()));
    for (to, labels) in &onward {
        let mut c = conds.clone();
        if !labels.iter().any(|l| l.is_empty()) {
            c.push(join_alternatives(labels));
        }
        walk(observed, to, c, chains.clone(), out);
    }
    if !is_policy && !picks_endpoints && !unconditional {
        // Traffic that matches none of the jumps leaves the chain without DNAT: the filter
        // table's verdicts (REJECT/DROP) decide what happens to it.
        conds.push(
            if onward.is_empty() {
                "every source"
            } else {
                "other sources"
            }
            .to_string(),
        );
        out.push(Branch {
            when: when_text(&conds),
            chains,
            policy_chain: None,
            endpoints: Vec::new(),
        });
    }
}

/// `-s A`, `-s B` → `-s A or B`; other labels joined with ` or `.
fn join_alternatives(labels: &[&str]) -> String {
    if labels.len() > 1 && labels.iter().all(|l| l.starts_with("-s ")) {
        let cidrs: Vec<&str> = labels.iter().map(|l| l.trim_start_matches("-s ")).collect();
        return format!("-s {}", cidrs.join(" or "));
    }
    labels.join(" or ")
}

fn when_text(conds: &[String]) -> String {
    if conds.is_empty() {
        return "any source".into();
    }
    let several = conds.len() > 1;
    conds
        .iter()
        .map(|c| {
            let text = match c.strip_prefix("-s ") {
                Some(cidr) => format!("source in {cidr}"),
                None => c.clone(),
            };
            if several && text.contains(" or ") {
                format!("({text})")
            } else {
                text
            }
        })
        .collect::<Vec<_>>()
        .join(" & ")
}

fn masq_why(reason: MasqueradeReason, cond: Option<&str>) -> String {
    match reason {
        MasqueradeReason::OffClusterSource => format!(
            "clients outside the pod network ({}) are masqueraded so replies return through this node",
            cond.unwrap_or("not local")
        ),
        MasqueradeReason::AllSources => "every client is masqueraded (masqueradeAll)".into(),
        MasqueradeReason::Hairpin => {
            "an endpoint reaching itself through the service is masqueraded (hairpin)".into()
        }
        MasqueradeReason::LocalSource => "connections from the node itself are masqueraded".into(),
        MasqueradeReason::ExternalDestination => {
            "external traffic is masqueraded (externalTrafficPolicy: Cluster): the client IP is not preserved".into()
        }
        MasqueradeReason::Other => format!("masqueraded when {}", cond.unwrap_or("the rule matches")),
    }
}

fn verdict_why(reason: VerdictReason, verdict: &str) -> String {
    match reason {
        VerdictReason::NoEndpoints => format!("{verdict}: the service has no endpoints"),
        VerdictReason::NoLocalEndpoints => {
            format!("{verdict}: no endpoint on this node (traffic policy Local)")
        }
        VerdictReason::SourceRange => {
            format!("{verdict}: sources outside loadBalancerSourceRanges")
        }
        VerdictReason::FallThrough => format!(
            "{verdict}: the firewall chain's closing rule; the service has no loadBalancerSourceRanges, so the rule above it takes all traffic and this one drops none"
        ),
        VerdictReason::Other => verdict.to_string(),
    }
}
