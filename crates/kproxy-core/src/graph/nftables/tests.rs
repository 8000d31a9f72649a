use super::*;
use crate::parsers::nft::{ParseOptions, parse};

/// Two services in kube-proxy's knftables form: ns2/svc2 (eTP=Local, local endpoint, external
/// IP, NodePort) and ns5/svc5 (LB with source range, affinity), plus ns6/svc6 without endpoints.
const TABLE: &str = r#"add table ip kube-proxy { comment "rules for kube-proxy" ; }
add set ip kube-proxy cluster-ips { type ipv4_addr ; comment "Active ClusterIPs" ; }
add map ip kube-proxy firewall-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }
add map ip kube-proxy no-endpoint-nodeports { type inet_proto . inet_service : verdict ; }
add map ip kube-proxy no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; }
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy reject-chain
add chain ip kube-proxy services
add rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 ip daddr 172.30.0.42 ip saddr != 10.0.0.0/8 jump mark-for-masquerade
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 numgen random mod 2 vmap { 0 : goto endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 , 1 : goto endpoint-AAAAAAAA-ns2/svc2/tcp/p80__10.180.0.9/80 }
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local jump mark-for-masquerade comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add chain ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 ip saddr 10.180.0.2 jump mark-for-masquerade
add rule ip kube-proxy endpoint-SGOXE6O3-ns2/svc2/tcp/p80__10.180.0.2/80 meta l4proto tcp dnat to 10.180.0.2:80
add chain ip kube-proxy endpoint-QUMIRAWD-ns2/svc2/tcp/p80__10.180.0.7/80
add rule ip kube-proxy endpoint-QUMIRAWD-ns2/svc2/tcp/p80__10.180.0.7/80 meta l4proto tcp dnat to 10.180.0.7:80
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.22 . tcp . 80 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy no-endpoint-services { 192.168.99.22 . tcp . 80 comment "ns2/svc2:p80" : drop }
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip daddr 172.30.0.45 jump mark-for-masquerade
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 jump mark-for-masquerade
add rule ip kube-proxy external-HVFWP5L3-ns5/svc5/tcp/p80 goto service-HVFWP5L3-ns5/svc5/tcp/p80
add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 ip saddr 10.180.0.3 jump mark-for-masquerade
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
add chain ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy firewall-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr != { 203.0.113.0/25 } drop
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy service-ips { 5.6.7.8 . tcp . 80 : goto external-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy firewall-ips { 5.6.7.8 . tcp . 80 : goto firewall-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy cluster-ips { 172.30.0.46 }
add element ip kube-proxy no-endpoint-services { 172.30.0.46 . tcp . 80 comment "ns6/svc6:p80" : goto reject-chain }
"#;

fn graph_of(text: &str) -> (NftGraphs<'_>, GraphOptions) {
    let rs = parse(text, &ParseOptions::strict()).unwrap();
    (NftGraphs::new(rs), GraphOptions::default())
}

#[test]
fn entries_endpoints_masquerade_and_verdicts() {
    let (g, opts) = graph_of(TABLE);
    let graphs = g.graphs(&opts);
    assert_eq!(graphs.len(), 1);
    let g = &graphs[0];
    assert_eq!(g.family.as_deref(), Some("ipv4"));
    assert_eq!(g.masquerade_mark.as_deref(), Some("0x4000"));
    let names: Vec<_> = g.service_ports.iter().map(|p| p.display_name()).collect();
    assert_eq!(names, ["ns2/svc2:p80", "ns5/svc5:p80", "ns6/svc6:p80"]);

    let svc2 = &g.service_ports[0];
    assert_eq!(svc2.name_source, NameSource::ChainName);
    assert_eq!(svc2.hash.as_deref(), Some("42NFTM6N"));
    let entries: Vec<_> = svc2
        .entries
        .iter()
        .map(|e| (e.kind, e.display(), e.target.as_str()))
        .collect();
    assert_eq!(
        entries,
        [
            (
                EntryKind::ClusterIp,
                "172.30.0.42:80/tcp".to_string(),
                "service-42NFTM6N-ns2/svc2/tcp/p80"
            ),
            (
                EntryKind::ExternalIp,
                "192.168.99.22:80/tcp".to_string(),
                "external-42NFTM6N-ns2/svc2/tcp/p80"
            ),
            (
                EntryKind::NodePort,
                ":3001/tcp".to_string(),
                "external-42NFTM6N-ns2/svc2/tcp/p80"
            ),
        ]
    );
    // 10.180.0.2 picked with 1/2; the vmap's other arm names a chain the table lacks (still an
    // endpoint, without a destination, as a cut paste may lack it); the 10.180.0.7 chain is
    // picked by nothing.
    let eps: Vec<_> = svc2
        .endpoints
        .iter()
        .map(|e| (e.destination, e.max_share(), e.hairpin_masquerade))
        .collect();
    assert_eq!(
        eps,
        [
            (Some("10.180.0.2:80"), 0.5, true),
            (None, 0.5, false),
            (Some("10.180.0.7:80"), 0.0, false)
        ]
    );
    let reasons: Vec<_> = svc2.masquerade.iter().map(|m| m.reason).collect();
    assert_eq!(
        reasons,
        [
            MasqueradeReason::OffClusterSource,
            MasqueradeReason::LocalSource,
            MasqueradeReason::Hairpin
        ]
    );
    let labels: Vec<_> = svc2
        .edges
        .iter()
        .filter(|e| e.from.starts_with("external-"))
        .map(|e| e.label.as_ref())
        .collect();
    assert_eq!(labels, ["pod source", "LOCAL source"]);
    assert_eq!(svc2.verdicts.len(), 1);
    assert_eq!(svc2.verdicts[0].reason, VerdictReason::NoLocalEndpoints);

    let svc5 = &g.service_ports[1];
    assert_eq!(svc5.entries[1].kind, EntryKind::LoadBalancerIp);
    assert_eq!(svc5.masquerade[0].reason, MasqueradeReason::AllSources);
    let aff = svc5.affinity.as_ref().unwrap();
    assert_eq!(aff.timeout_seconds, Some(10800));
    assert!(svc5.endpoints[0].affinity_set);
    assert_eq!(
        svc5.firewall.as_ref().unwrap().source_ranges,
        ["203.0.113.0/25"]
    );
    assert!(
        svc5.verdicts
            .iter()
            .any(|v| v.reason == VerdictReason::SourceRange
                && v.address.as_deref() == Some("5.6.7.8"))
    );

    let svc6 = &g.service_ports[2];
    assert!(svc6.chains.is_empty());
    assert_eq!(
        svc6.hash.as_deref(),
        Some(hash_of("ns6/svc6/tcp/p80").as_str())
    );
    assert_eq!(svc6.entries[0].kind, EntryKind::ClusterIp);
    assert_eq!(svc6.verdicts[0].verdict, "REJECT");

    let kinds: Vec<_> = g
        .anomalies
        .iter()
        .map(|a| (a.kind, a.chain.as_deref().unwrap_or("")))
        .collect();
    assert!(
        kinds.contains(&(
            AnomalyKind::UndeclaredJump,
            "service-42NFTM6N-ns2/svc2/tcp/p80"
        )),
        "{kinds:?}"
    );
    assert!(kinds.contains(&(
        AnomalyKind::UnreferencedChain,
        "endpoint-QUMIRAWD-ns2/svc2/tcp/p80__10.180.0.7/80"
    )));
    assert!(kinds.contains(&(AnomalyKind::ClusterIpNotInSet, "cluster-ips")));
    assert!(kinds.contains(&(
        AnomalyKind::NameMismatch,
        "endpoint-QUMIRAWD-ns2/svc2/tcp/p80__10.180.0.7/80"
    )));
}

#[test]
fn numgen_gaps_loops_and_unreachable_rules_are_anomalies() {
    let text = r#"add table ip kube-proxy
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 3 vmap { 0 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 , 7 : goto endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 }
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80
add rule ip kube-proxy endpoint-5OJB2KTY-ns1/svc1/tcp/p80__10.180.0.1/80 meta l4proto tcp dnat to 10.180.0.1:80
add chain ip kube-proxy a
add chain ip kube-proxy b
add rule ip kube-proxy a jump b
add rule ip kube-proxy b goto a
add rule ip kube-proxy b drop
"#;
    let (g, opts) = graph_of(text);
    let graphs = g.graphs(&opts);
    let g = &graphs[0];
    let p = &g.service_ports[0];
    assert!((p.endpoints[0].max_share() - 1.0 / 3.0).abs() < 1e-9);
    let kinds: Vec<_> = g.anomalies.iter().map(|a| a.kind).collect();
    for k in [
        AnomalyKind::UnreferencedChain,
        AnomalyKind::DuplicateRule,
        AnomalyKind::UnreachableRule,
        AnomalyKind::ProbabilityLeak,
        AnomalyKind::JumpLoop,
    ] {
        assert!(kinds.contains(&k), "{k:?} in {kinds:?}");
    }
    let leak = g
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::ProbabilityLeak)
        .unwrap();
    assert!(leak.message.contains("values 1, 2"), "{}", leak.message);
    assert!(
        leak.message.contains("keys 7 are never drawn"),
        "{}",
        leak.message
    );
}

#[test]
fn ipv6_tables_give_a_second_graph() {
    let text = r#"add table ip kube-proxy
add table ip6 kube-proxy
add chain ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 }
add rule ip6 kube-proxy endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80 meta l4proto tcp dnat to [fd00:10:180::1]:80
add table inet other
"#;
    let (g, opts) = graph_of(text);
    let graphs = g.graphs(&opts);
    assert_eq!(graphs.len(), 2);
    assert_eq!(graphs[1].family.as_deref(), Some("ipv6"));
    let ep = &graphs[1].service_ports[0].endpoints[0];
    assert_eq!(ep.destination, Some("[fd00:10:180::1]:80"));
    assert_eq!(ep.port, Some(80));
}
