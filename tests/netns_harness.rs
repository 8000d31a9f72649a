//! Tests of the real-netfilter harness itself (`tests/support/netns.rs`): namespaces, both
//! iptables backends, and real traffic through DNAT rules. Root only; skipped otherwise.

use crate::support::netns::{
    Backend, Family, Netns, Pod, Probe, Topology, addr, ip, require_root_and_tools,
};
use std::io::ErrorKind;
use std::path::Path;
use std::time::Duration;

const SMALL_RULESET: &str = "\
*filter
:KPT-TEST - [0:0]
-A KPT-TEST -s 10.244.0.0/16 -m comment --comment \"kproxy harness test\" -j ACCEPT
-A INPUT -j KPT-TEST
COMMIT
*nat
:KPT-NAT - [0:0]
-A KPT-NAT -p tcp -d 172.30.0.10/32 --dport 80 -j DNAT --to-destination 10.244.1.5:8080
COMMIT
";

const SMALL_RULESET_V6: &str = "\
*filter
:KPT-TEST6 - [0:0]
-A KPT-TEST6 -s fd00:10::/64 -j ACCEPT
COMMIT
";

#[test]
fn restore_and_save_with_both_backends() {
    for backend in Backend::ALL {
        if !require_root_and_tools(&backend.tools()) {
            return;
        }
        let ns = Netns::new(&format!("save-{backend}")).expect("netns");
        ns.restore(backend, SMALL_RULESET, false).expect("restore");

        let saved = ns.save(backend, false).expect("save");
        assert!(
            saved.contains("*filter") && saved.contains("*nat"),
            "{backend}: {saved}"
        );
        assert!(saved.contains(":KPT-TEST - [0:0]"), "{backend}: {saved}");
        assert!(
            saved.contains("-A KPT-TEST -s 10.244.0.0/16 -m comment --comment \"kproxy harness test\" -j ACCEPT"),
            "{backend}: {saved}"
        );
        assert!(
            saved.contains("-A KPT-NAT -d 172.30.0.10/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.1.5:8080"),
            "{backend}: {saved}"
        );

        let counted = ns.save(backend, true).expect("save -c");
        assert!(
            counted.contains("[0:0] -A KPT-TEST -s 10.244.0.0/16"),
            "{backend}: {counted}"
        );

        // --noflush adds to what is there; a plain restore of a table replaces it.
        ns.restore(backend, "*filter\n:KPT-MORE - [0:0]\nCOMMIT\n", true)
            .expect("noflush");
        let both = ns.iptables(backend, &["-S"]).expect("iptables -S");
        assert!(
            both.contains("-N KPT-TEST") && both.contains("-N KPT-MORE"),
            "{backend}: {both}"
        );
        ns.restore(backend, "*filter\n:KPT-ONLY - [0:0]\nCOMMIT\n", false)
            .expect("flush");
        let only = ns.iptables(backend, &["-S"]).expect("iptables -S");
        assert!(
            !only.contains("KPT-TEST") && only.contains("-N KPT-ONLY"),
            "{backend}: {only}"
        );

        // --test checks without committing; bad input is an error with iptables' message.
        ns.restore_test(backend, Family::V4, "*filter\n:KPT-DRY - [0:0]\nCOMMIT\n")
            .expect("--test");
        assert!(!ns.save(backend, false).expect("save").contains("KPT-DRY"));
        let err = ns
            .restore(
                backend,
                "*filter\n-A NO-SUCH-CHAIN -j ACCEPT\nCOMMIT\n",
                true,
            )
            .expect_err("bad rules must fail");
        assert!(
            err.to_string().contains(backend.restore(Family::V4)),
            "{err}"
        );

        ns.restore6(backend, SMALL_RULESET_V6, false)
            .expect("restore6");
        let saved6 = ns.save6(backend, false).expect("save6");
        assert!(
            saved6.contains("-A KPT-TEST6 -s fd00:10::/64 -j ACCEPT"),
            "{backend}: {saved6}"
        );
    }
}

#[test]
fn nft_backend_writes_nf_tables_and_legacy_does_not() {
    if !require_root_and_tools(&["nft", "iptables-nft-restore", "iptables-legacy-restore"]) {
        return;
    }
    let nft = Netns::new("nft-check").expect("netns");
    nft.restore(Backend::Nft, SMALL_RULESET, false)
        .expect("restore");
    let ruleset = nft.run(&["nft", "list", "ruleset"]).expect("nft list");
    assert!(ruleset.contains("chain KPT-TEST"), "{ruleset}");

    let legacy = Netns::new("legacy-check").expect("netns");
    legacy
        .restore(Backend::Legacy, SMALL_RULESET, false)
        .expect("restore");
    let ruleset = legacy.run(&["nft", "list", "ruleset"]).expect("nft list");
    assert!(!ruleset.contains("KPT-TEST"), "{ruleset}");
}

#[test]
fn namespaces_are_unique_and_removed_on_drop() {
    if !require_root_and_tools(&[]) {
        return;
    }
    let a = Netns::new("drop").expect("netns");
    let b = Netns::new("drop").expect("netns");
    assert_ne!(a.name(), b.name());
    let pid = a.spawn(&["sleep", "600"]).expect("spawn");
    let (path_a, path_b) = (a.path(), b.path());
    assert!(path_a.exists() && path_b.exists());
    drop(a);
    drop(b);
    assert!(!path_a.exists() && !path_b.exists());
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "child {pid} still alive"
    );

    // Also after a panic in the test body.
    let mut leaked = None;
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let c = Netns::new("panic").expect("netns");
        leaked = Some(c.path());
        panic!("test body panics");
    }));
    assert!(caught.is_err());
    let leaked = leaked.expect("namespace was created");
    assert!(!leaked.exists(), "{} left behind", leaked.display());
}

/// DNAT in the node namespace sends client traffic (PREROUTING) and node traffic (OUTPUT) to a
/// pod; without the rule the same probe fails, so the test can fail.
#[test]
fn dnat_redirects_real_connections() {
    for backend in Backend::ALL {
        if !require_root_and_tools(&backend.tools()) {
            return;
        }
        let topo = Topology::builder(&format!("dnat-{backend}"))
            .pod(Pod::new("pod-a", "10.244.1.5").tcp(8080).udp(5353))
            .pod(Pod::new("pod-b", "10.244.2.7").tcp(8080))
            .build()
            .expect("topology");
        let vip = addr("172.30.0.10:80");

        // Routing works without rules: the client reaches pods directly …
        let direct = topo
            .client()
            .connect(addr("10.244.2.7:8080"))
            .expect("direct");
        assert_eq!(direct.server, "pod-b");
        assert_eq!(direct.peer.ip(), ip("192.168.77.3"));
        // … but not the virtual IP.
        let before = topo
            .client()
            .connect_with(&Probe::default().timeout(Duration::from_millis(500)), vip)
            .expect_err("no rule yet");
        assert_ne!(before.kind(), ErrorKind::InvalidData, "{before}");

        topo.node()
            .restore(
                backend,
                "*nat\n\
                 -A PREROUTING -d 172.30.0.10/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.1.5:8080\n\
                 -A OUTPUT -d 172.30.0.10/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.1.5:8080\n\
                 -A PREROUTING -d 172.30.0.10/32 -p udp --dport 53 -j DNAT --to-destination 10.244.1.5:5353\n\
                 COMMIT\n",
                true,
            )
            .expect("restore");

        let r = topo.client().connect(vip).expect("client -> vip");
        assert_eq!(r.server, "pod-a");
        assert_eq!(r.peer.ip(), topo.client_ip(), "no SNAT expected");
        assert_eq!(r.local, addr("10.244.1.5:8080"));

        let r = topo.node().connect(vip).expect("node -> vip (OUTPUT)");
        assert_eq!(r.server, "pod-a");
        assert_eq!(r.peer.ip(), topo.node_ip());

        let r = topo.client().udp(addr("172.30.0.10:53")).expect("udp");
        assert_eq!(r.server, "pod-a");
        assert_eq!(r.peer.ip(), topo.client_ip());
    }
}

/// kube-proxy style spreading (`statistic --mode random`) over two pods plus MASQUERADE, with
/// 600 real connections.
#[test]
fn many_connections_are_spread_and_masqueraded() {
    if !require_root_and_tools(&Backend::Nft.tools()) {
        return;
    }
    let topo = Topology::builder("spread")
        .pod(Pod::new("pod-a", "10.244.1.5").tcp(8080))
        .pod(Pod::new("pod-b", "10.244.2.7").tcp(8080))
        .build()
        .expect("topology");
    topo.node()
        .restore(
            Backend::Nft,
            "*nat\n\
             :KPT-SVC - [0:0]\n\
             -A PREROUTING -d 172.30.0.10/32 -p tcp --dport 80 -j KPT-SVC\n\
             -A KPT-SVC -p tcp -m statistic --mode random --probability 0.5 -j DNAT --to-destination 10.244.1.5:8080\n\
             -A KPT-SVC -p tcp -j DNAT --to-destination 10.244.2.7:8080\n\
             -A POSTROUTING -d 10.244.0.0/16 -j MASQUERADE\n\
             COMMIT\n",
            false,
        )
        .expect("restore");
    let tally = topo
        .client()
        .connect_many(&Probe::default(), addr("172.30.0.10:80"), 600)
        .expect("probes");
    assert_eq!(tally.ok(), 600, "{tally:?}");
    assert!(
        tally.count("pod-a") > 200 && tally.count("pod-b") > 200,
        "{tally:?}"
    );
    // Masqueraded to the node's address on the pod link (the route's src).
    assert_eq!(
        tally.peers.keys().collect::<Vec<_>>(),
        vec![&ip("192.168.77.2")],
        "{tally:?}"
    );
}

#[test]
fn dual_stack_pods_source_binding_and_node_servers() {
    if !require_root_and_tools(&Backend::Legacy.tools()) {
        return;
    }
    let topo = Topology::builder("v6")
        .node_addrs(&["192.168.77.2/24", "fd00:77::2/64"])
        .client_addrs(&["192.168.77.3/24", "192.168.77.4/24", "fd00:77::3/64"])
        .pod(Pod::new("pod-a", "10.244.1.5").ip("fd00:10::5").tcp(8080))
        .serve_on_node(&[10250], &[])
        .build()
        .expect("topology");
    topo.node()
        .restore6(
            Backend::Legacy,
            "*nat\n-A PREROUTING -d fd00:30::10/128 -p tcp --dport 80 -j DNAT --to-destination [fd00:10::5]:8080\nCOMMIT\n",
            true,
        )
        .expect("restore6");
    let r = topo
        .client()
        .connect(addr("[fd00:30::10]:80"))
        .expect("v6 vip");
    assert_eq!(r.server, "pod-a");
    assert_eq!(r.peer.ip(), ip("fd00:77::3"));
    assert_eq!(r.local, addr("[fd00:10::5]:8080"));

    // Same pod over IPv4 on its dual-stack socket; source chosen by the probe.
    let r = topo
        .client()
        .connect_with(&Probe::from(ip("192.168.77.4")), addr("10.244.1.5:8080"))
        .expect("v4 from second address");
    assert_eq!(r.peer.ip(), ip("192.168.77.4"));

    let r = topo
        .client()
        .connect(addr("192.168.77.2:10250"))
        .expect("node server");
    assert_eq!(r.server, "node");

    // A port nobody listens on is refused, not timed out.
    let e = topo
        .client()
        .connect(addr("192.168.77.2:9"))
        .expect_err("closed port");
    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
}

/// Localhost NodePorts (`127.0.0.1:<nodePort>` from the node itself) work only with
/// `route_localnet`, which the topology sets by default.
#[test]
fn localhost_nodeport_needs_route_localnet() {
    if !require_root_and_tools(&Backend::Nft.tools()) {
        return;
    }
    let rules = "*nat\n\
                 -A OUTPUT -d 127.0.0.1/32 -p tcp --dport 30080 -j DNAT --to-destination 10.244.1.5:8080\n\
                 -A POSTROUTING -s 127.0.0.0/8 -j MASQUERADE\n\
                 COMMIT\n";
    let nodeport = addr("127.0.0.1:30080");
    for localnet in [true, false] {
        let topo = Topology::builder("localnet")
            .route_localnet(localnet)
            .pod(Pod::new("pod-a", "10.244.1.5").tcp(8080))
            .build()
            .expect("topology");
        topo.node()
            .restore(Backend::Nft, rules, true)
            .expect("restore");
        let probe = Probe::default().timeout(Duration::from_millis(500));
        let result = topo.node().connect_with(&probe, nodeport);
        if localnet {
            let r = result.expect("localhost nodeport");
            assert_eq!(r.server, "pod-a");
            assert_eq!(r.peer.ip(), topo.node_ip(), "masqueraded to the node IP");
        } else {
            assert!(result.is_err(), "without route_localnet: {result:?}");
        }
    }
}

/// kube-proxy's `-m nfacct` rules restore only once their counters exist.
#[test]
fn nfacct_counters_make_kube_proxy_rules_restorable() {
    if !require_root_and_tools(&["nfacct", "iptables-nft-restore"]) {
        return;
    }
    let rules = "*filter\n:KUBE-FORWARD - [0:0]\n\
                 -A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name ct_state_invalid_dropped_pkts -j DROP\n\
                 COMMIT\n";
    let ns = Netns::new("nfacct").expect("netns");
    ns.restore(Backend::Nft, rules, false)
        .expect_err("no counter yet");
    ns.add_nfacct_counters(rules).expect("add");
    ns.add_nfacct_counters(rules)
        .expect("adding again is a no-op");
    ns.restore(Backend::Nft, rules, false).expect("restore");
    let list = ns.run(&["nfacct", "list"]).expect("nfacct list");
    assert_eq!(
        list.matches("ct_state_invalid_dropped_pkts").count(),
        1,
        "{list}"
    );
}
