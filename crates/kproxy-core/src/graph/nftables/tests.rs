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

/// kube-proxy 1.36's layout (DNAT straight through a numgen map, inline masquerade marks, the
/// cluster-IP masquerade in `services`, the `hairpin-connections` set; endpoint chains only for
/// ClientIP affinity) and 1.37's single-endpoint `dnat to`, with no `endpoint-` chain to name the
/// endpoints: they come from the DNAT statements.
const G4: &str = r#"add table ip kube-proxy
add set ip kube-proxy cluster-ips { type ipv4_addr ; }
add set ip kube-proxy hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; }
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }
add map ip kube-proxy service-nodeports { type inet_proto . inet_service : verdict ; }
add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }
add chain ip kube-proxy masquerading
add chain ip kube-proxy services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random
add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
add rule ip kube-proxy services ip daddr @cluster-ips ip saddr != 10.0.0.0/8 mark set mark or 0x4000 comment "masquerade clusterIP traffic from outside cluster"
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add chain ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 meta l4proto tcp dnat ip addr . port to numgen random mod 3 map { 0 : 10.180.0.4 . 80 , 1-2 : 10.180.0.5 . 8080 }
add chain ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 mark set mark or 0x4000 comment "masquerade"
add rule ip kube-proxy external-LAUZTJTB-ns4/svc4/tcp/p80 goto service-LAUZTJTB-ns4/svc4/tcp/p80
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 meta l4proto tcp dnat to 10.180.0.2:80
add chain ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 ip saddr 10.0.0.0/8 goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit pod traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local mark set mark or 0x4000 comment "masquerade local traffic"
add rule ip kube-proxy external-42NFTM6N-ns2/svc2/tcp/p80 fib saddr type local goto service-42NFTM6N-ns2/svc2/tcp/p80 comment "short-circuit local traffic"
add set ip kube-proxy affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add chain ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy service-HVFWP5L3-ns5/svc5/tcp/p80 numgen random mod 1 vmap { 0 : goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 }
add chain ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }
add rule ip kube-proxy endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 meta l4proto tcp dnat to 10.180.0.3:80
add element ip kube-proxy cluster-ips { 172.30.0.44 }
add element ip kube-proxy cluster-ips { 172.30.0.42 }
add element ip kube-proxy cluster-ips { 172.30.0.45 }
add element ip kube-proxy service-ips { 172.30.0.44 . tcp . 80 : goto service-LAUZTJTB-ns4/svc4/tcp/p80 }
add element ip kube-proxy service-ips { 192.168.99.33 . tcp . 80 : goto external-LAUZTJTB-ns4/svc4/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-nodeports { tcp . 3001 : goto external-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.45 . tcp . 80 : goto service-HVFWP5L3-ns5/svc5/tcp/p80 }
add element ip kube-proxy hairpin-connections { 10.180.0.5 . 10.180.0.5 . tcp . 8080 }
add element ip kube-proxy hairpin-connections { 10.180.0.3 . 10.180.0.3 . tcp . 80 }
"#;

#[test]
fn endpoints_come_from_the_dnat_statements() {
    let (g, opts) = graph_of(G4);
    let graphs = g.graphs(&opts);
    let g = &graphs[0];
    assert!(g.anomalies.is_empty(), "{:#?}", g.anomalies);
    assert_eq!(g.masquerade_mark.as_deref(), Some("0x4000"));
    let port = |name: &str| {
        g.service_ports
            .iter()
            .find(|p| p.display_name() == name)
            .unwrap_or_else(|| panic!("{name}"))
    };
    let eps = |name: &str| -> Vec<(String, Option<&str>, f64, bool)> {
        port(name)
            .endpoints
            .iter()
            .map(|e| {
                (
                    e.chain.to_string(),
                    e.destination,
                    e.max_share(),
                    e.hairpin_masquerade,
                )
            })
            .collect()
    };
    let svc4 = "service-LAUZTJTB-ns4/svc4/tcp/p80".to_string();
    // A key range picks one destination for two of the three numgen values.
    assert_eq!(
        eps("ns4/svc4:p80"),
        [
            (svc4.clone(), Some("10.180.0.4:80"), 1.0 / 3.0, false),
            (svc4.clone(), Some("10.180.0.5:8080"), 2.0 / 3.0, true),
        ]
    );
    let e = &port("ns4/svc4:p80").endpoints[1];
    assert_eq!(
        (e.ip, e.port),
        (Some("10.180.0.5".parse().expect("ip")), Some(8080))
    );
    assert_eq!(
        eps("ns2/svc2:p80"),
        [(
            "service-42NFTM6N-ns2/svc2/tcp/p80".to_string(),
            Some("10.180.0.2:80"),
            1.0,
            false
        )]
    );
    assert_eq!(
        eps("ns5/svc5:p80"),
        [(
            "endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80".to_string(),
            Some("10.180.0.3:80"),
            1.0,
            true
        )]
    );
    assert!(port("ns5/svc5:p80").endpoints[0].affinity_set);
    let reasons = |name: &str| -> Vec<(MasqueradeReason, &str)> {
        port(name)
            .masquerade
            .iter()
            .map(|m| (m.reason, m.chain))
            .collect()
    };
    assert_eq!(
        reasons("ns4/svc4:p80"),
        [
            (
                MasqueradeReason::ExternalDestination,
                "external-LAUZTJTB-ns4/svc4/tcp/p80"
            ),
            (MasqueradeReason::Hairpin, "masquerading"),
            (MasqueradeReason::OffClusterSource, "services"),
        ]
    );
    assert_eq!(
        reasons("ns2/svc2:p80"),
        [
            (
                MasqueradeReason::LocalSource,
                "external-42NFTM6N-ns2/svc2/tcp/p80"
            ),
            (MasqueradeReason::OffClusterSource, "services"),
        ]
    );
    // The external chain's ways on are labelled by their source conditions.
    let labels: Vec<&str> = port("ns2/svc2:p80")
        .edges
        .iter()
        .map(|e| e.label.as_ref())
        .collect();
    assert_eq!(labels, ["pod source", "LOCAL source"]);
}

#[test]
fn ipv6_dnat_maps_and_leaks() {
    let text = r#"add table ip6 kube-proxy
add chain ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add rule ip6 kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat ip6 addr . port to numgen random mod 4 map { 0 : fd00:10:180::1 . 80 , 1 : fd00:10:180::2 . 80 , 2 : fd00:10:180::1 . 80 }
"#;
    let (g, opts) = graph_of(text);
    let graphs = g.graphs(&opts);
    let p = &graphs[0].service_ports[0];
    let eps: Vec<(Option<&str>, f64)> = p
        .endpoints
        .iter()
        .map(|e| (e.destination, e.max_share()))
        .collect();
    assert_eq!(
        eps,
        [
            (Some("[fd00:10:180::1]:80"), 0.5),
            (Some("[fd00:10:180::2]:80"), 0.25)
        ]
    );
    let leak = graphs[0]
        .anomalies
        .iter()
        .find(|a| a.kind == AnomalyKind::ProbabilityLeak)
        .expect("leak");
    assert!(
        leak.message.contains("value 3 has no destination"),
        "{}",
        leak.message
    );
}

/// A table with a chain and a statement form invented for the test: the ports whose path
/// holds them are of unknown layout, not "without endpoints".
#[test]
fn what_this_build_does_not_know_is_said() {
    let text = r#"add table ip kube-proxy
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; }
add chain ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80
add chain ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80
add chain ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80
add chain ip kube-proxy endpoint-pool-v9
add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 meta l4proto tcp dnat to jhash ip saddr mod 2 map { 0 : 10.180.0.1 . 80 , 1 : 10.180.0.9 . 80 }
add rule ip kube-proxy service-42NFTM6N-ns2/svc2/tcp/p80 goto endpoint-pool-v9
add rule ip kube-proxy endpoint-pool-v9 meta l4proto tcp dnat to 10.180.0.2:80
add rule ip kube-proxy service-4AT6LBPK-ns3/svc3/tcp/p80 meta l4proto tcp dnat to 10.180.0.3:80
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
add element ip kube-proxy service-ips { 172.30.0.43 . tcp . 80 : goto service-4AT6LBPK-ns3/svc3/tcp/p80 }
"#;
    let (g, opts) = graph_of(text);
    let graphs = g.graphs(&opts);
    let g = &graphs[0];
    let unknown: Vec<(String, Vec<String>)> = g
        .service_ports
        .iter()
        .map(|p| {
            (
                p.display_name(),
                p.unknown_layout
                    .iter()
                    .map(crate::graph::UnknownObject::describe)
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        unknown,
        [
            (
                "ns1/svc1:p80".to_string(),
                vec![
                    "statement `dnat to jhash ip saddr mod 2 map { 0 : 10.180.0.1 . 80 , 1 : 10.180.0.9 . 80 }` in chain service-ULMVA6XW-ns1/svc1/tcp/p80 (line 7)".to_string()
                ]
            ),
            (
                "ns2/svc2:p80".to_string(),
                vec!["chain endpoint-pool-v9 (line 6)".to_string()]
            ),
            ("ns3/svc3:p80".to_string(), vec![]),
        ]
    );
    let about: Vec<(Option<&str>, bool)> = g
        .anomalies
        .iter()
        .filter(|a| a.kind == AnomalyKind::UnknownLayout)
        .map(|a| {
            (
                a.service.as_deref(),
                a.message.contains("may be newer than this build"),
            )
        })
        .collect();
    assert_eq!(
        about,
        [(Some("ns2/svc2:p80"), true), (Some("ns1/svc1:p80"), true)]
    );
    // The known port is read as ever.
    assert_eq!(
        g.service_ports[2].endpoints[0].destination,
        Some("10.180.0.3:80")
    );
}
