//! nftables verify on the testdata cluster: the render read back as the node's table is clean in
//! every form; each edit of it is found, named with its service port and check.

use super::*;
use crate::compare::fixture::read;
use crate::state::load;

/// The testdata cluster in nftables mode: state, configuration (as kube-proxy reads it in
/// nftables mode) and IPv4 facts.
fn cluster() -> (ClusterState, ProxyConfig, NodeFacts) {
    let state = load::from_str(&read("testdata/cluster/state.json"), "state.json").expect("state");
    let (config, _) = crate::state::config::parse(&read("testdata/cluster/config.yaml"), "config")
        .expect("config");
    let config = config.for_nftables();
    let args = crate::state::node::NodeInputs {
        family: Some(IpFamily::V4),
        ..Default::default()
    };
    let (facts, _) = crate::state::node::build(&args, &state, &config).expect("facts");
    (state, config, facts)
}

/// The render of the cluster's IPv4 table, then of its IPv6 table (the cluster is dual-stack).
fn rendered() -> String {
    let (state, config, mut facts) = cluster();
    let mut text = ExpectedTable::build(&state, &config, &facts).text;
    facts.family = IpFamily::V6;
    text.push_str(&ExpectedTable::build(&state, &config, &facts).text);
    text
}

/// Verifies `listing` as the node's whole nft ruleset.
fn verify_text(listing: &str) -> Report {
    let (state, config, facts) = cluster();
    let input = NftVerifyInput {
        node: "node-1",
        state: &state,
        config: &config,
        facts: &facts,
        listings: vec![NftText {
            label: "ruleset",
            text: listing,
        }],
        iptables: Vec::new(),
        ipvsadm: None,
        ipset: None,
        lenient: false,
    };
    verify(&input).expect("verify runs")
}

fn ids(r: &Report) -> Vec<(&'static str, Option<&str>)> {
    r.findings
        .iter()
        .map(|f| (f.id, f.service.as_deref()))
        .collect()
}

/// The render with line `old` replaced by `new`.
fn replaced(old: &str, new: &str) -> String {
    let text = rendered();
    assert!(text.lines().any(|l| l == old), "no line {old}");
    text.lines()
        .map(|l| {
            if l == old {
                format!("{new}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect()
}

/// The render without the lines `drop` says to drop, and with `add` appended.
fn edited(drop: impl Fn(&str) -> bool, add: &str) -> String {
    let mut s: String = rendered()
        .lines()
        .filter(|l| !drop(l))
        .map(|l| format!("{l}\n"))
        .collect();
    s.push_str(add);
    s
}

#[test]
fn the_render_itself_is_clean() {
    let r = verify_text(&rendered());
    assert!(r.findings.is_empty(), "{:#?}", r.findings);
    assert_eq!(r.mode, crate::state::mode::ProxyMode::Nftables);
    assert!(r.summary.service_ports >= 9, "{:?}", r.summary);
}

#[test]
fn a_missing_table_is_one_finding() {
    let r = verify_text("add table ip filter\n");
    // The IPv6 table is kube-proxy's only on dual-stack nodes: not checked, not an error.
    assert_eq!(
        ids(&r),
        [("KP701", None), ("KP012", None)],
        "{:#?}",
        r.findings
    );
    assert_eq!(r.outcome(), crate::exit::Outcome::Drift);
}

#[test]
fn a_flushed_endpoint_chain_is_named_with_its_service() {
    let text = rendered();
    let chain = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("add chain ip kube-proxy endpoint-")
                .filter(|c| c.contains("shop/legacy-gateway"))
        })
        .expect("an endpoint chain of legacy-gateway");
    let flushed = format!("endpoint-{chain}");
    let r = verify_text(&edited(
        |l| l.starts_with(&format!("add rule ip kube-proxy {flushed} ")),
        "",
    ));
    assert_eq!(
        ids(&r),
        [("KP735", Some("shop/legacy-gateway:http"))],
        "{:#?}",
        r.findings
    );
    assert!(
        r.findings[0].message.contains("flushed"),
        "{:#?}",
        r.findings
    );
}

#[test]
fn element_drift_is_named_by_key() {
    // The cluster IP of kube-dns's dns-tcp port loses its service-ips element; a stale element
    // appears for an address nobody has.
    let r = verify_text(&edited(
        |l| l.starts_with("add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 53 :"),
        "add element ip kube-proxy service-ips { 10.96.9.9 . tcp . 80 : goto services }\n",
    ));
    assert_eq!(
        ids(&r),
        [
            ("KP721", Some("kube-system/kube-dns:dns-tcp")),
            ("KP724", None)
        ],
        "{:#?}",
        r.findings
    );
    assert!(
        r.findings[0]
            .message
            .contains("cluster IP 10.96.0.10 tcp/53")
    );
}

#[test]
fn a_stale_endpoint_in_the_map_is_extra() {
    let text = rendered();
    let rule = text
        .lines()
        .find(|l| {
            l.starts_with("add rule ip kube-proxy service-")
                && l.contains("shop/legacy-gateway")
                && l.contains("numgen")
        })
        .expect("the load-balancing rule of legacy-gateway")
        .to_string();
    let stale = "endpoint-AAAAAAAA-shop/legacy-gateway/tcp/http__10.244.9.9/8080";
    let chain = rule
        .split_whitespace()
        .nth(4)
        .expect("chain name")
        .to_string();
    let n: usize = rule
        .split("mod ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("modulus");
    let new_rule = rule
        .replacen(&format!("mod {n}"), &format!("mod {}", n + 1), 1)
        .replace(" }", &format!(" , {n} : goto {stale} }}"));
    let add = format!(
        "add chain ip kube-proxy {stale}\nadd rule ip kube-proxy {stale} meta l4proto tcp dnat to 10.244.9.9:8080\n{new_rule}\n"
    );
    let r = verify_text(&edited(|l| l == rule, &add));
    let got = ids(&r);
    assert!(
        got.contains(&("KP733", Some("shop/legacy-gateway:http"))),
        "{:#?}",
        r.findings
    );
    // The rule was moved to the end of its chain by the edit: nothing else may be reported for
    // it but the order, and the stale chain itself.
    assert!(
        got.iter()
            .all(|(id, s)| ["KP733", "KP751", "KP752"].contains(id)
                && *s == Some("shop/legacy-gateway:http")),
        "{:#?}",
        r.findings
    );
    assert!(
        r.findings
            .iter()
            .any(|f| f.chain.as_deref() == Some(&*chain)),
        "{:#?}",
        r.findings
    );
}

#[test]
fn masquerading_and_base_chains_are_node_wide() {
    let header = "add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }";
    let text = replaced(
        header,
        "add chain ip kube-proxy nat-output { type nat hook output priority 0 ; }",
    );
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("add rule ip kube-proxy masquerading "))
        .map(|l| format!("{l}\n"))
        .collect();
    let r = verify_text(&text);
    let got = ids(&r);
    assert!(got.contains(&("KP704", None)), "{:#?}", r.findings);
    assert!(got.contains(&("KP702", None)), "{:#?}", r.findings);
    assert_eq!(got.len(), 2, "{:#?}", r.findings);
}

#[test]
fn cluster_ips_and_base_chain_hooks_are_checked() {
    // An active cluster IP gone from `cluster-ips`, a stray one in it.
    let text = edited(
        |l| l == "add element ip kube-proxy cluster-ips { 10.96.0.10 }",
        "add element ip kube-proxy cluster-ips { 10.96.99.99 }\n",
    );
    let r = verify_text(&text);
    assert_eq!(ids(&r), [("KP706", None)], "{:#?}", r.findings);
    let f = &r.findings[0];
    assert_eq!(f.chain.as_deref(), Some("cluster-ips"), "{f:#?}");
    let said = format!("{:?} {:?} {}", f.expected, f.actual, f.message);
    assert!(
        said.contains("10.96.0.10") && said.contains("10.96.99.99"),
        "{said}"
    );

    // A base chain on another hook, and one missing.
    let text = edited(
        |l| {
            l.starts_with("add chain ip kube-proxy filter-input ")
                || l.starts_with("add rule ip kube-proxy filter-input ")
        },
        "",
    );
    let text = text.replace(
        "add chain ip kube-proxy nat-postrouting { type nat hook postrouting priority 100 ; }",
        "add chain ip kube-proxy nat-postrouting { type nat hook input priority 100 ; }",
    );
    let r = verify_text(&text);
    let base: Vec<Option<&str>> = r
        .findings
        .iter()
        .filter(|f| f.id == "KP702")
        .map(|f| f.chain.as_deref())
        .collect();
    assert!(base.contains(&Some("filter-input")), "{:#?}", r.findings);
    assert!(base.contains(&Some("nat-postrouting")), "{:#?}", r.findings);
}

#[test]
fn affinity_and_flushed_stale_chains() {
    // A session-affinity set with another timeout; a flushed chain of a gone service (which
    // kube-proxy keeps for a while) is no finding.
    let text = rendered();
    let affinity = text
        .lines()
        .find(|l| l.starts_with("add set ip kube-proxy affinity-"))
        .expect("cart has session affinity")
        .to_string();
    let mut text = replaced(&affinity, &affinity.replace("timeout 600s", "timeout 60s"));
    text.push_str("add chain ip kube-proxy service-AAAAAAAA-shop/gone/tcp/http\n");
    let r = verify_text(&text);
    assert_eq!(
        ids(&r),
        [("KP743", Some("shop/cart:http"))],
        "{:#?}",
        r.findings
    );
}

#[test]
fn leftovers_of_other_modes() {
    let ipt = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-DROP - [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n*filter\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n";
    let f = leftovers::iptables_leftovers(&[NftText {
        label: "iptables-save",
        text: ipt,
    }]);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].id, "KP708");
    assert_eq!(f[0].actual.as_deref(), Some("nat KUBE-SERVICES"));
    let kubelet_only = "*filter\n:KUBE-FIREWALL - [0:0]\nCOMMIT\n";
    assert!(
        leftovers::iptables_leftovers(&[NftText {
            label: "x",
            text: kubelet_only
        }])
        .is_empty()
    );
    let ipvs = leftovers::ipvs_leftovers(
        Some(
            "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\nTCP  10.96.0.1:443 rr\n",
        ),
        Some("create KUBE-CLUSTER-IP hash:ip,port family inet\n"),
    );
    assert_eq!(ipvs.len(), 1);
    assert_eq!(ipvs[0].id, "KP709");
    assert!(leftovers::ipvs_leftovers(Some("IP Virtual Server version 1.2.1\n"), None).is_empty());
}

#[test]
fn checks_are_sorted_and_documented() {
    for w in CHECKS.windows(2) {
        assert!(w[0].id < w[1].id, "{} before {}", w[0].id, w[1].id);
    }
    let docs = read("docs/findings.md");
    for c in CHECKS {
        let needle = format!("| {} | {} |", c.id, c.severity.as_str());
        assert!(docs.contains(&needle), "docs/findings.md lacks `{needle}`");
    }
}

/// A chain and a statement form invented for the test: the service ports whose path holds them
/// are one KP711 each (no endpoint finding about them), the rest of the node is checked as
/// ever, and the check could not run for them (exit 2).
#[test]
fn what_this_build_does_not_know_is_not_checked() {
    let web = "service-KHN6ECMT-shop/web/tcp/http";
    let pick = rendered()
        .lines()
        .find(|l| l.starts_with(&format!("add rule ip kube-proxy {web} numgen")))
        .expect("web's numgen rule")
        .to_string();
    let invented = replaced(
        &pick,
        &format!(
            "add rule ip kube-proxy {web} meta l4proto tcp dnat to jhash ip saddr mod 3 map {{ 0 : 10.244.1.10 . 8080 , 1 : 10.244.1.11 . 8080 , 2 : 10.244.2.10 . 8080 }}"
        ),
    );
    let r = verify_text(&invented);
    assert_eq!(
        ids(&r),
        [("KP711", Some("shop/web:http"))],
        "{:#?}",
        r.findings
    );
    assert!(
        r.findings[0].message.contains("jhash") && r.findings[0].message.contains("newer"),
        "{}",
        r.findings[0].message
    );
    assert_eq!(r.summary.unchecked, 1);
    assert_eq!(r.outcome(), crate::exit::Outcome::Error);
    // An unknown chain on no port's path is said once, and checks nothing less.
    let extra = edited(
        |_| false,
        "add chain ip kube-proxy endpoint-pool-v9\nadd rule ip kube-proxy endpoint-pool-v9 meta l4proto tcp dnat to 10.244.1.20:8080\n",
    );
    let r = verify_text(&extra);
    assert_eq!(ids(&r), [("KP711", None)], "{:#?}", r.findings);
    assert_eq!(r.summary.unchecked, 0);
    assert_eq!(r.outcome(), crate::exit::Outcome::Drift);
    // In a chain every service's traffic passes: nothing is checked.
    let shared = replaced(
        "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips",
        "add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\nadd rule ip kube-proxy services ct mark set 0x1",
    );
    let r = verify_text(&shared);
    assert_eq!(ids(&r), [("KP711", None)], "{:#?}", r.findings);
    assert!(r.summary.unchecked >= 9, "{:?}", r.summary);
}
