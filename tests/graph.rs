//! Service graph: real-world dumps of every kube-proxy era, synthetic layouts, anomalies, the CLI.

use assert_cmd::Command;
use kproxy::graph::names::port_proto_hash;
use kproxy::graph::{
    self, AnomalyKind, ChainKind, EntryKind, GraphOptions, MasqueradeReason, NameResolver,
    NameSource, ServiceGraph, ServicePort, VerdictReason, is_kube_proxy_chain,
};
use kproxy::parsers::iptables::{ParseOptions, parse_dump};
use std::path::PathBuf;

fn real_world_dir() -> Option<PathBuf> {
    let d =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/iptables/real-world");
    if d.is_dir() {
        Some(d)
    } else {
        crate::support::skip(
            "graph",
            &format!("{} absent; skipping real-world graph tests", d.display()),
        );
        None
    }
}

/// Real samples: (file prefix, lenient needed, number of service ports).
const SAMPLES: &[(&str, bool, usize)] = &[
    ("01-", true, 6),
    ("02-", true, 14),
    ("06-", true, 5),
    ("12-", false, 7),
    ("23-", false, 3),
    ("27-", false, 1),
    ("29-", true, 1),
    ("31-", true, 6),
];

fn sample(prefix: &str) -> Option<(String, String)> {
    let dir = real_world_dir()?;
    let entry = std::fs::read_dir(&dir).ok()?.flatten().find(|e| {
        let n = e.file_name().to_string_lossy().to_string();
        n.starts_with(prefix) && n.ends_with(".txt")
    })?;
    let text = std::fs::read_to_string(entry.path()).ok()?;
    Some((entry.file_name().to_string_lossy().to_string(), text))
}

/// The graph of a real-world sample (the text is leaked: the graph borrows it for the test).
fn graph_of(prefix: &str) -> Option<ServiceGraph<'static>> {
    let (name, text) = sample(prefix)?;
    let text: &'static str = Box::leak(text.into_boxed_str());
    let lenient = SAMPLES.iter().find(|s| s.0 == prefix).is_some_and(|s| s.1);
    let mut opts = ParseOptions::default().with_table("nat");
    opts.lenient = lenient;
    Some(graph::iptables::from_text(text, &name, &opts, &GraphOptions::default()).expect("parses"))
}

fn port<'g, 'a>(g: &'g ServiceGraph<'a>, name: &str) -> &'g ServicePort<'a> {
    g.service_ports
        .iter()
        .find(|p| p.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no service port {name} in {:?}", names(g)))
}

fn names(g: &ServiceGraph) -> Vec<String> {
    g.service_ports.iter().map(|p| p.display_name()).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-4
}

#[test]
fn every_real_world_sample_builds_a_graph() {
    let Some(dir) = real_world_dir() else { return };
    let mut seen = 0;
    for (prefix, lenient, ports) in SAMPLES {
        let (name, text) = sample(prefix).expect("sample present");
        if !lenient {
            // clean dumps parse strictly
            parse_dump(&text, &ParseOptions::default().with_table("nat")).expect("strict parse");
        }
        let g = graph_of(prefix).expect("graph");
        assert_eq!(g.service_ports.len(), *ports, "{name}: {:?}", names(&g));
        for p in &g.service_ports {
            assert!(p.name.is_some(), "{name}: unnamed port {p:?}");
            assert_eq!(p.name_source, NameSource::Comment);
        }
        seen += 1;
    }
    let files = std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".txt"))
        .count();
    assert_eq!(seen, files, "a real-world sample has no entry in SAMPLES");
}

#[test]
fn kind_v1_23_full_dump() {
    let Some(g) = graph_of("01-") else { return };
    assert_eq!(g.masquerade_mark.as_deref(), Some("0x4000/0x4000"));
    assert_eq!(g.family.as_deref(), Some("ipv4"));
    let dns = port(&g, "kube-system/kube-dns:dns");
    assert_eq!(dns.protocol.as_deref(), Some("udp"));
    assert_eq!(dns.hash.as_deref(), Some("TCOU7JCQXEZGVUNU"));
    assert_eq!(dns.entries.len(), 1);
    assert_eq!(dns.entries[0].kind, EntryKind::ClusterIp);
    assert_eq!(dns.entries[0].address.as_deref(), Some("10.96.0.10"));
    assert_eq!(dns.entries[0].port, Some(53));
    let dests: Vec<_> = dns
        .endpoints
        .iter()
        .map(|e| e.destination.unwrap_or_default())
        .collect();
    assert_eq!(dests, ["10.244.0.3:53", "10.244.0.4:53"]);
    for e in &dns.endpoints {
        assert!(close(e.max_share(), 0.5), "{e:?}");
        assert!(e.hairpin_masquerade);
    }
    let off: Vec<_> = dns
        .masquerade
        .iter()
        .filter(|m| m.reason == MasqueradeReason::OffClusterSource)
        .collect();
    assert_eq!(off.len(), 1);
    assert_eq!(off[0].condition.as_deref(), Some("! -s 10.244.0.0/16"));
    // the full dump is consistent: no stale or dangling kube-proxy chains
    assert!(
        !g.anomalies.iter().any(|a| matches!(
            a.kind,
            AnomalyKind::UnreferencedChain
                | AnomalyKind::UndeclaredJump
                | AnomalyKind::EmptyServiceChain
        )),
        "{:#?}",
        g.anomalies
    );
}

#[test]
fn k3s_with_kube_router_keeps_foreign_chains_out() {
    let Some(g) = graph_of("02-") else { return };
    assert_eq!(g.backend.as_deref(), Some("nf_tables"));
    for chain in [
        "KUBE-ROUTER-INPUT",
        "KUBE-NWPLCY-DEFAULT",
        "KUBE-POD-FW-4BDGZEWEU32YM75H",
    ] {
        assert!(!is_kube_proxy_chain("filter", chain));
    }
    let traefik = port(&g, "kube-system/traefik:web");
    let kinds: Vec<_> = traefik.entries.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EntryKind::ClusterIp, EntryKind::ExternalIp]);
    assert!(traefik.chain(ChainKind::Ext).is_some());
    assert!(
        traefik
            .masquerade
            .iter()
            .any(|m| m.reason == MasqueradeReason::ExternalDestination)
    );
    let dlna = port(&g, "default/tuby-dlna:dlna-udp");
    assert_eq!(dlna.protocol.as_deref(), Some("udp"));
    assert!(
        dlna.entries
            .iter()
            .any(|e| e.kind == EntryKind::NodePort && e.port == Some(32197))
    );
    // unnamed port: comment without `:port`
    assert_eq!(
        port(&g, "default/registry").hash.as_deref(),
        Some("UHY5YTYXWYGJMWN5")
    );
}

#[test]
fn services_without_endpoints_show_filter_rejects_and_counters() {
    let Some(g) = graph_of("06-") else { return };
    let dns = port(&g, "kube-system/kube-dns:dns-tcp");
    assert!(dns.endpoints.is_empty());
    assert!(dns.chains.is_empty());
    assert_eq!(dns.verdicts.len(), 1);
    assert_eq!(dns.verdicts[0].verdict, "REJECT");
    assert_eq!(dns.verdicts[0].reason, VerdictReason::NoEndpoints);
    assert_eq!(dns.verdicts[0].address.as_deref(), Some("10.43.0.10"));
    // The hash of the comment's service port is the one kube-proxy gives it (its
    // KUBE-SVC-ERIFXISQEP7F7OF4 in every cluster: kind, EKS and k3s captures alike).
    assert_eq!(dns.hash.as_deref(), Some("ERIFXISQEP7F7OF4"));
    let api = port(&g, "default/kubernetes:https");
    assert!(api.entries[0].counters.is_some(), "-c counters are kept");
}

#[test]
fn old_gke_xlb_layout_with_affinity() {
    let Some(g) = graph_of("27-") else { return };
    let p = port(&g, "default/php-apache-svc:http");
    assert!(p.chain(ChainKind::Xlb).is_some());
    let np = p
        .entries
        .iter()
        .find(|e| e.kind == EntryKind::NodePort)
        .expect("nodeport");
    assert!(np.target.starts_with("KUBE-XLB-"));
    let aff = p.affinity.as_ref().expect("affinity");
    assert_eq!(aff.timeout_seconds, Some(10800));
    assert_eq!(aff.chains.len(), 2);
    // SVC: 4 endpoints, 1/4 each (old %0.5f probabilities, compared numerically)
    let svc = p.chain(ChainKind::Svc).expect("svc").name.clone();
    for e in &p.endpoints {
        let s = e
            .shares
            .iter()
            .find(|s| s.via == svc)
            .expect("picked by SVC");
        assert!(close(s.share, 0.25), "{e:?}");
        assert!(e.affinity_set);
    }
    // XLB: the two local endpoints, 1/2 each
    let xlb = p.chain(ChainKind::Xlb).expect("xlb").name.clone();
    let local: Vec<_> = p
        .endpoints
        .iter()
        .filter_map(|e| e.shares.iter().find(|s| s.via == xlb))
        .collect();
    assert_eq!(local.len(), 2);
    assert!(local.iter().all(|s| close(s.share, 0.5)));
    // masquerade rule in KUBE-SERVICES (pre-1.24)
    assert!(
        p.masquerade
            .iter()
            .any(|m| m.chain == "KUBE-SERVICES" && m.reason == MasqueradeReason::OffClusterSource)
    );
}

#[test]
fn s_v_listing_three_endpoints_third_each() {
    let Some(g) = graph_of("29-") else { return };
    let p = port(&g, "default/nginx-np-service");
    assert_eq!(p.endpoints.len(), 3);
    for e in &p.endpoints {
        assert!(close(e.max_share(), 1.0 / 3.0), "{e:?}");
        assert_eq!(
            e.shares[0].counters.as_deref().copied(),
            Some(kproxy::graph::Counters {
                packets: 0,
                bytes: 0
            })
        );
    }
    let probs: Vec<_> = p
        .endpoints
        .iter()
        .map(|e| e.shares[0].probability)
        .collect();
    assert!(probs[0].is_some_and(|x| close(x, 1.0 / 3.0)));
    assert!(probs[1].is_some_and(|x| close(x, 0.5)));
    assert_eq!(probs[2], None);
}

#[test]
fn eks_localhost_nodeport_and_no_detector() {
    let Some(g) = graph_of("31-") else { return };
    assert_eq!(g.masquerade_mark.as_deref(), Some("0x4000/0x4000"));
    let p = port(&g, "game-2048/service-2048");
    let nps: Vec<_> = p
        .entries
        .iter()
        .filter(|e| e.kind == EntryKind::NodePort)
        .collect();
    assert_eq!(nps.len(), 2);
    assert_eq!(nps[0].address.as_deref(), Some("127.0.0.0/8"));
    assert_eq!(nps[1].address, None);
    assert!(
        !p.masquerade
            .iter()
            .any(|m| m.reason == MasqueradeReason::OffClusterSource)
    );
}

fn build(text: &str, resolver: NameResolver) -> ServiceGraph<'_> {
    let dump = parse_dump(text, &ParseOptions::default()).expect("parses");
    graph::iptables::build(
        &dump,
        &GraphOptions {
            resolver,
            ..GraphOptions::default()
        },
    )
}

/// The chain-name hashes the graph reads comments and chains with are kube-proxy's: its own test
/// fixtures (`pkg/proxy/iptables/proxier_test.go`: ns1/svc1, ns2/svc2 and their endpoints) and
/// the chains kube-proxy writes for the services every cluster has.
#[test]
fn chain_hashes_are_kube_proxys() {
    use kproxy::model::hashing::{endpoint_chain, service_chain};
    for (service_port, protocol, chain) in [
        ("ns1/svc1:p80", "tcp", "KUBE-SVC-XPGD46QRK7WJZT7O"),
        ("ns2/svc2:p80", "tcp", "KUBE-SVC-GNZBNJ2PO5MGZ6GT"),
        (
            "default/kubernetes:https",
            "tcp",
            "KUBE-SVC-NPX46M4PTMTKRN6Y",
        ),
        (
            "kube-system/kube-dns:dns",
            "udp",
            "KUBE-SVC-TCOU7JCQXEZGVUNU",
        ),
        (
            "kube-system/kube-dns:dns-tcp",
            "tcp",
            "KUBE-SVC-ERIFXISQEP7F7OF4",
        ),
        (
            "kube-system/kube-dns:metrics",
            "tcp",
            "KUBE-SVC-JD5MR3NA4I4DYORP",
        ),
    ] {
        assert_eq!(
            service_chain(service_port, protocol),
            chain,
            "{service_port}"
        );
        assert_eq!(
            format!("KUBE-SVC-{}", port_proto_hash(service_port, protocol)),
            chain,
            "{service_port}"
        );
    }
    for (service_port, endpoint, chain) in [
        ("ns1/svc1:p80", "10.180.0.1:80", "KUBE-SEP-SXIVWICOYRO3J4NJ"),
        ("ns2/svc2:p80", "10.180.0.2:80", "KUBE-SEP-RS4RBKLTHTF2IUXJ"),
    ] {
        assert_eq!(endpoint_chain(service_port, "tcp", endpoint), chain);
    }
}

/// A modern LoadBalancer service with source ranges, three endpoints, written as restore input.
fn lb_dump() -> String {
    let h = port_proto_hash("ns/lb:p80", "tcp");
    format!(
        r#"*filter
:KUBE-PROXY-FIREWALL - [0:0]
-A KUBE-PROXY-FIREWALL -m comment --comment "ns/lb:p80 traffic not accepted by KUBE-FW-{h}" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j DROP
COMMIT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-EXT-{h} - [0:0]
:KUBE-FW-{h} - [0:0]
:KUBE-SVC-{h} - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-SEP-CCCCCCCCCCCCCCCC - [0:0]
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-SERVICES -m comment --comment "ns/lb:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 -j KUBE-SVC-{h}
-A KUBE-SERVICES -m comment --comment "ns/lb:p80 loadbalancer IP" -m tcp -p tcp -d 1.2.3.4 --dport 80 -j KUBE-FW-{h}
-A KUBE-NODEPORTS -m comment --comment ns/lb:p80 -m tcp -p tcp --dport 3001 -j KUBE-EXT-{h}
-A KUBE-EXT-{h} -m comment --comment "masquerade traffic for ns/lb:p80 external destinations" -j KUBE-MARK-MASQ
-A KUBE-EXT-{h} -j KUBE-SVC-{h}
-A KUBE-FW-{h} -m comment --comment "ns/lb:p80 loadbalancer IP" -s 203.0.113.0/25 -j KUBE-EXT-{h}
-A KUBE-FW-{h} -m comment --comment "other traffic to ns/lb:p80 will be dropped by KUBE-PROXY-FIREWALL"
-A KUBE-SVC-{h} -m comment --comment "ns/lb:p80 cluster IP" -m tcp -p tcp -d 172.30.0.42 --dport 80 ! -s 10.0.0.0/8 -j KUBE-MARK-MASQ
-A KUBE-SVC-{h} -m comment --comment "ns/lb:p80 -> 10.180.0.1:80" -m statistic --mode random --probability 0.3333333333 -j KUBE-SEP-AAAAAAAAAAAAAAAA
-A KUBE-SVC-{h} -m comment --comment "ns/lb:p80 -> 10.180.0.2:80" -m statistic --mode random --probability 0.5000000000 -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SVC-{h} -m comment --comment "ns/lb:p80 -> 10.180.0.3:80" -j KUBE-SEP-CCCCCCCCCCCCCCCC
-A KUBE-SEP-AAAAAAAAAAAAAAAA -m comment --comment ns/lb:p80 -s 10.180.0.1 -j KUBE-MARK-MASQ
-A KUBE-SEP-AAAAAAAAAAAAAAAA -m comment --comment ns/lb:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.1:80
-A KUBE-SEP-BBBBBBBBBBBBBBBB -m comment --comment ns/lb:p80 -s 10.180.0.2 -j KUBE-MARK-MASQ
-A KUBE-SEP-BBBBBBBBBBBBBBBB -m comment --comment ns/lb:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.2:80
-A KUBE-SEP-CCCCCCCCCCCCCCCC -m comment --comment ns/lb:p80 -s 10.180.0.3 -j KUBE-MARK-MASQ
-A KUBE-SEP-CCCCCCCCCCCCCCCC -m comment --comment ns/lb:p80 -m tcp -p tcp -j DNAT --to-destination 10.180.0.3:80
COMMIT
"#
    )
}

#[test]
fn load_balancer_with_source_ranges() {
    let dump = lb_dump();
    let g = build(&dump, NameResolver::new());
    assert_eq!(g.service_ports.len(), 1, "{:#?}", g.service_ports);
    let p = &g.service_ports[0];
    assert_eq!(p.name.as_deref(), Some("ns/lb:p80"));
    let kinds: Vec<_> = p.entries.iter().map(|e| e.kind).collect();
    assert_eq!(
        kinds,
        [
            EntryKind::ClusterIp,
            EntryKind::LoadBalancerIp,
            EntryKind::NodePort
        ]
    );
    let fw = p.firewall.as_ref().expect("firewall");
    assert_eq!(fw.source_ranges, ["203.0.113.0/25"]);
    assert_eq!(p.verdicts.len(), 1);
    assert_eq!(p.verdicts[0].reason, VerdictReason::SourceRange);
    let shares: Vec<f64> = p.endpoints.iter().map(|e| e.max_share()).collect();
    assert_eq!(shares.len(), 3);
    assert!(shares.iter().all(|s| close(*s, 1.0 / 3.0)), "{shares:?}");
    assert_eq!(p.endpoints[2].destination, Some("10.180.0.3:80"));
    let reasons: Vec<_> = p.masquerade.iter().map(|m| m.reason).collect();
    assert!(reasons.contains(&MasqueradeReason::OffClusterSource));
    assert!(reasons.contains(&MasqueradeReason::ExternalDestination));
    assert_eq!(
        reasons
            .iter()
            .filter(|r| **r == MasqueradeReason::Hairpin)
            .count(),
        3
    );
    assert!(g.anomalies.is_empty(), "{:#?}", g.anomalies);
}

#[test]
fn hashes_resolve_names_when_comments_are_absent() {
    let stripped: String = lb_dump()
        .lines()
        .map(|l| {
            // drop every comment match (large-cluster mode drops some; we drop all)
            let mut out = String::new();
            let mut rest = l;
            while let Some(i) = rest.find("-m comment --comment ") {
                out.push_str(&rest[..i]);
                let after = &rest[i + "-m comment --comment ".len()..];
                let end = if let Some(a) = after.strip_prefix('"') {
                    a.find('"').map(|j| j + 2).unwrap_or(after.len())
                } else {
                    after.find(' ').unwrap_or(after.len())
                };
                rest = after[end..].trim_start();
            }
            out.push_str(rest);
            out.push('\n');
            out
        })
        .collect();
    assert!(!stripped.contains("comment"));
    let g = build(&stripped, NameResolver::new());
    let p = &g.service_ports[0];
    assert_eq!(p.name, None);
    assert_eq!(p.name_source, NameSource::Unknown);
    assert!(p.display_name().starts_with("<hash:"));
    let g = build(&stripped, NameResolver::from_ports([("ns/lb:p80", "TCP")]));
    let p = &g.service_ports[0];
    assert_eq!(p.name.as_deref(), Some("ns/lb:p80"));
    assert_eq!(p.name_source, NameSource::Resolved);
    assert_eq!(p.endpoints.len(), 3);
}

#[test]
fn kube_proxy_v1_2_mark_and_masquerade_in_services() {
    let h = port_proto_hash("default/kubernetes:", "tcp");
    let text = format!(
        r#"*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-{h} - [0:0]
:KUBE-SEP-QQQQQQQQQQQQQQQQ - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -m mark --mark 0x4d415351 -j MASQUERADE
-A KUBE-SEP-QQQQQQQQQQQQQQQQ -s 10.240.0.2/32 -m comment --comment "default/kubernetes:" -j MARK --set-xmark 0x4d415351/0xffffffff
-A KUBE-SEP-QQQQQQQQQQQQQQQQ -p tcp -m comment --comment "default/kubernetes:" -m tcp -j DNAT --to-destination 10.240.0.2:443
-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp -m comment --comment "default/kubernetes: cluster IP" -m tcp --dport 443 -j MARK --set-xmark 0x4d415351/0xffffffff
-A KUBE-SERVICES -d 10.0.0.1/32 -p tcp -m comment --comment "default/kubernetes: cluster IP" -m tcp --dport 443 -j KUBE-SVC-{h}
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports; NOTE: this must be the last rule in this chain" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-SVC-{h} -m comment --comment "default/kubernetes:" -j KUBE-SEP-QQQQQQQQQQQQQQQQ
COMMIT
"#
    );
    let g = build(&text, NameResolver::new());
    assert_eq!(g.masquerade_mark.as_deref(), Some("0x4d415351"));
    let p = &g.service_ports[0];
    assert_eq!(p.name.as_deref(), Some("default/kubernetes:"));
    assert_eq!(p.entries.len(), 1);
    let reasons: Vec<_> = p.masquerade.iter().map(|m| (m.chain, m.reason)).collect();
    assert!(
        reasons.contains(&("KUBE-SERVICES", MasqueradeReason::AllSources)),
        "{reasons:?}"
    );
    assert!(
        reasons.contains(&("KUBE-SEP-QQQQQQQQQQQQQQQQ", MasqueradeReason::Hairpin)),
        "{reasons:?}"
    );
    assert!(p.endpoints[0].hairpin_masquerade);
    assert!(close(p.endpoints[0].max_share(), 1.0));
    // The 0x4d415351 rules are masquerade, not anomalies; KUBE-NODEPORTS being empty is fine.
    assert!(g.anomalies.is_empty(), "{:#?}", g.anomalies);
}

#[test]
fn anomalies_are_found() {
    let h = port_proto_hash("ns/a:p", "tcp");
    let text = format!(
        r#"*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-{h} - [0:0]
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-SVC-ZZZZZZZZZZZZZZZZ - [0:0]
:KUBE-SEP-CCCCCCCCCCCCCCCC - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d 10.0.0.5/32 -p tcp -m comment --comment "ns/a:p cluster IP" -m tcp --dport 80 -j KUBE-SVC-{h}
-A KUBE-SERVICES -d 10.0.0.5/32 -p tcp -m comment --comment "ns/a:p cluster IP" -m tcp --dport 80 -j KUBE-SVC-{h}
-A KUBE-SERVICES -d 10.0.0.6/32 -p tcp -m comment --comment "ns/b:p cluster IP" -m tcp --dport 80 -j KUBE-SVC-MISSINGMISSINGMI
-A KUBE-SVC-{h} -m comment --comment "ns/a:p -> 10.1.0.1:80" -m statistic --mode random --probability 0.2 -j KUBE-SEP-AAAAAAAAAAAAAAAA
-A KUBE-SVC-{h} -m comment --comment "ns/a:p -> 10.1.0.2:80" -m statistic --mode random --probability 0.5 -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -m comment --comment "ns/a:p" -m tcp -j DNAT --to-destination 10.1.0.1:80
-A KUBE-SEP-AAAAAAAAAAAAAAAA -s 10.1.0.1/32 -m comment --comment "ns/a:p" -j KUBE-MARK-MASQ
-A KUBE-SEP-BBBBBBBBBBBBBBBB -s 10.1.0.2/32 -m comment --comment "ns/a:p" -j KUBE-MARK-MASQ
COMMIT
"#
    );
    let g = build(&text, NameResolver::new());
    let has = |kind: AnomalyKind, chain: &str| {
        g.anomalies
            .iter()
            .any(|a| a.kind == kind && a.chain.as_deref() == Some(chain))
    };
    let svc = format!("KUBE-SVC-{h}");
    assert!(
        has(AnomalyKind::DuplicateRule, "KUBE-SERVICES"),
        "{:#?}",
        g.anomalies
    );
    assert!(has(AnomalyKind::UndeclaredJump, "KUBE-SERVICES"));
    assert!(has(
        AnomalyKind::UnreferencedChain,
        "KUBE-SVC-ZZZZZZZZZZZZZZZZ"
    ));
    assert!(has(
        AnomalyKind::EmptyServiceChain,
        "KUBE-SVC-ZZZZZZZZZZZZZZZZ"
    ));
    assert!(has(
        AnomalyKind::EmptyServiceChain,
        "KUBE-SEP-CCCCCCCCCCCCCCCC"
    ));
    assert!(has(
        AnomalyKind::UnreachableRule,
        "KUBE-SEP-AAAAAAAAAAAAAAAA"
    ));
    assert!(has(AnomalyKind::MissingDnat, "KUBE-SEP-BBBBBBBBBBBBBBBB"));
    assert!(has(AnomalyKind::ProbabilityLeak, &svc));
    // 0.2 then 0.8*0.5 = 0.4: 40% fall through
    let leak = g
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::ProbabilityLeak)
        .expect("leak");
    assert!(leak.message.starts_with("40.0%"), "{}", leak.message);
    assert_eq!(leak.service.as_deref(), Some("ns/a:p"));
    let p = g
        .service_ports
        .iter()
        .find(|p| p.name.as_deref() == Some("ns/a:p"))
        .expect("port");
    assert!(close(p.endpoints[0].max_share(), 0.2));
    assert!(close(p.endpoints[1].max_share(), 0.4));
}

fn kproxy() -> Command {
    Command::cargo_bin("kubectl-kproxy").expect("binary")
}

#[test]
fn cli_table_json_yaml_dot() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("lb.iptables");
    std::fs::write(&f, lb_dump()).expect("write");
    let out = kproxy()
        .args(["graph", "--iptables-save"])
        .arg(&f)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.starts_with("SERVICE-PORT   PROTOCOL   ENTRIES"),
        "{table}"
    );
    assert!(table.contains("10.180.0.1:80 33.3%"), "{table}");
    assert!(!table.contains('\u{1b}'), "no colour when piped");

    let out = kproxy()
        .args(["graph", "-o", "json", "--iptables-save"])
        .arg(&f)
        .output()
        .expect("run");
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["schema"], "kproxy.graph/v1");
    assert_eq!(v["graphs"][0]["service_ports"][0]["name"], "ns/lb:p80");
    assert_eq!(
        v["graphs"][0]["service_ports"][0]["entries"][1]["kind"],
        "load-balancer-ip"
    );

    let out = kproxy()
        .args(["graph", "-o", "yaml", "--iptables-save"])
        .arg(&f)
        .output()
        .expect("run");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("schema: kproxy.graph/v1"));

    let out = kproxy()
        .args(["graph", "-o", "dot", "--iptables-save", "-"])
        .write_stdin(lb_dump())
        .output()
        .expect("run");
    assert!(out.status.success());
    let dot = String::from_utf8_lossy(&out.stdout);
    assert!(dot.starts_with("digraph \"<stdin>\" {"), "{dot}");
    assert!(
        dot.contains("\"KUBE-SEP-AAAAAAAAAAAAAAAA\" -> \"dnat:KUBE-SEP-AAAAAAAAAAAAAAAA\""),
        "{dot}"
    );
}

#[test]
fn cli_parse_error_is_exit_2_with_position() {
    let dir = tempfile::tempdir().expect("tmp");
    let f = dir.path().join("bad.iptables");
    std::fs::write(
        &f,
        "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -j\nCOMMIT\n",
    )
    .expect("write");
    let out = kproxy()
        .args(["graph", "--iptables-save"])
        .arg(&f)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!("{}:3:", f.display());
    assert!(err.contains(&want) && err.contains("expected"), "{err}");
    assert!(
        err.contains("-A KUBE-SERVICES -j"),
        "the line is shown: {err}"
    );
}

#[test]
fn cli_without_input_is_exit_2() {
    let out = kproxy().args(["graph"]).output().expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--iptables-save"));
}

#[test]
fn cli_every_real_world_sample() {
    let Some(_) = real_world_dir() else { return };
    for (prefix, lenient, _) in SAMPLES {
        let (name, text) = sample(prefix).expect("sample");
        let mut cmd = kproxy();
        cmd.args(["graph", "-o", "wide", "--iptables-save", "-"]);
        if *lenient {
            cmd.arg("--lenient");
        }
        let out = cmd.write_stdin(text.clone()).output().expect("run");
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if *lenient {
            // pastes fail strictly, with a position
            let out = kproxy()
                .args(["graph", "--iptables-save", "-"])
                .write_stdin(text)
                .output()
                .expect("run");
            assert_eq!(
                out.status.code(),
                Some(2),
                "{name} is expected to need --lenient"
            );
            assert!(String::from_utf8_lossy(&out.stderr).contains("<stdin>:"));
        }
    }
}

#[test]
fn snapshot_gke_xlb_wide_table() {
    let Some(g) = graph_of("27-") else { return };
    insta::assert_snapshot!(kproxy::output::graph::table_text(&g, true, false));
}

#[test]
fn snapshot_lb_json() {
    let dump = lb_dump();
    let g = build(&dump, NameResolver::new());
    insta::assert_snapshot!(kproxy::output::to_json(&g).expect("json"));
}

/// `comparison_only` leaves out exactly the edges and the endpoint chains' hairpin rules; every
/// other fact (endpoints, shares, hairpin flags, entries, verdicts, anomalies) is the same.
#[test]
fn comparison_only_graph_is_the_full_graph_without_edges_and_hairpin_rules() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/dumps");
    let mut checked = 0;
    let mut hairpins = 0;
    for e in std::fs::read_dir(&dir).expect("testdata/dumps").flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let opts = ParseOptions::default().with_table("nat");
        let text = std::fs::read_to_string(e.path()).expect("read");
        let Ok(dump) = parse_dump(&text, &opts) else {
            continue;
        };
        let full = graph::iptables::build(&dump, &GraphOptions::default());
        let lean = graph::iptables::build(
            &dump,
            &GraphOptions {
                comparison_only: true,
                ..GraphOptions::default()
            },
        );
        assert_eq!(full.anomalies, lean.anomalies, "{name}");
        assert_eq!(full.service_ports.len(), lean.service_ports.len(), "{name}");
        for (f, l) in full.service_ports.iter().zip(&lean.service_ports) {
            assert!(l.edges.is_empty(), "{name}: {:?}", l.edges);
            assert_eq!(f.endpoints, l.endpoints, "{name}");
            assert_eq!(f.entries, l.entries, "{name}");
            assert_eq!(f.verdicts, l.verdicts, "{name}");
            assert_eq!(f.affinity, l.affinity, "{name}");
            assert_eq!(f.firewall, l.firewall, "{name}");
            let kept: Vec<_> = f
                .masquerade
                .iter()
                .filter(|m| {
                    !(m.reason == MasqueradeReason::Hairpin && m.chain.starts_with("KUBE-SEP-"))
                })
                .collect();
            hairpins += f.masquerade.len() - kept.len();
            assert_eq!(kept, l.masquerade.iter().collect::<Vec<_>>(), "{name}");
        }
        checked += 1;
    }
    assert!(checked >= 10, "only {checked} dumps in {}", dir.display());
    assert!(
        hairpins > 0,
        "no dump has a hairpin rule: the test checks nothing"
    );
}
