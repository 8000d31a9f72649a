//! End to end with real netfilter: `kubectl-kproxy render --with-base-jumps` of the example
//! cluster (`testdata/cluster/`) is restored into the node namespace of a harness topology whose
//! pods have the cluster's endpoint addresses, and real connections check what kube-proxy's rules
//! promise: load balancing, masquerading, NodePorts, REJECT without endpoints, externalTraffic-
//! Policy Local (no SNAT, only local endpoints, DROP without them), loadBalancerSourceRanges,
//! ClientIP affinity, internalTrafficPolicy Local, external IPs, localhost NodePorts, UDP and
//! IPv6. Run for both iptables backends.

use crate::support::netns::{
    Backend, Pod, Probe, Reply, Topology, addr, ip, require_root_and_tools,
};
use std::collections::BTreeSet;
use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn render(family: &str) -> String {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/cluster");
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .arg("render")
        .arg("--state")
        .arg(data.join("state.json"))
        .arg("--config")
        .arg(data.join("config.yaml"))
        .args(["--with-base-jumps", "--ip-family", family])
        .output()
        .expect("run kubectl-kproxy");
    assert!(
        out.status.success(),
        "render failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 rules")
}

fn topology(backend: Backend) -> Topology {
    let web = |name: &str, ip: &str| Pod::new(name, ip).tcp(8080).tcp(8443);
    Topology::builder(&format!("cluster-{backend}"))
        .node_addrs(&["192.168.77.2/24", "fd00:77::2/64"])
        .client_addrs(&["192.168.77.3/24", "192.168.77.20/24", "fd00:77::3/64"])
        .pod(Pod::new("coredns-a", "10.244.1.3").tcp(53).udp(53))
        .pod(Pod::new("coredns-b", "10.244.2.3").tcp(53).udp(53))
        .pod(web("web-a", "10.244.1.10"))
        .pod(web("web-b", "10.244.1.11"))
        .pod(web("web-c", "10.244.2.10"))
        .pod(web("web-terminating", "10.244.2.11"))
        .pod(Pod::new("frontend-a", "10.244.1.20").tcp(8443))
        .pod(Pod::new("frontend-b", "10.244.2.20").tcp(8443))
        .pod(Pod::new("checkout", "10.244.2.30").tcp(8080))
        .pod(Pod::new("gateway", "10.244.1.40").tcp(8080))
        .pod(Pod::new("cart-a", "10.244.1.50").tcp(8080))
        .pod(Pod::new("cart-b", "10.244.2.50").tcp(8080))
        .pod(
            Pod::new("search-a", "10.244.1.60")
                .ip("fd00:10:244:1::60")
                .tcp(9200),
        )
        .pod(
            Pod::new("search-b", "10.244.2.60")
                .ip("fd00:10:244:2::60")
                .tcp(9200),
        )
        // LoadBalancer and external IPs are in the client's subnet: route them to the node, as
        // a load balancer or router would.
        .client_route_via_node("192.168.77.50")
        .client_route_via_node("192.168.77.100")
        .client_route_via_node("192.168.77.101")
        .serve_on_node(&[6443, 9100], &[])
        .build()
        .expect("topology")
}

fn servers(t: &crate::support::netns::Tally) -> BTreeSet<&str> {
    t.servers.keys().map(String::as_str).collect()
}

fn set<'a>(names: &[&'a str]) -> BTreeSet<&'a str> {
    names.iter().copied().collect()
}

fn expect_blocked(result: io::Result<Reply>, what: &str) {
    match result {
        Ok(r) => panic!("{what}: expected no answer, got {r:?}"),
        Err(e) => assert_eq!(e.kind(), ErrorKind::TimedOut, "{what}: {e}"),
    }
}

#[test]
fn example_cluster_rules_carry_real_traffic() {
    let mut tools = vec!["nfacct"];
    tools.extend(Backend::Nft.tools());
    tools.extend(Backend::Legacy.tools());
    if !require_root_and_tools(&tools) {
        return;
    }
    let rules4 = render("4");
    let rules6 = render("6");
    let quick = Probe::default().timeout(Duration::from_millis(700));
    let many = |t: &Topology, probe: &Probe, dst: SocketAddr, n: usize| {
        t.client().connect_many(probe, dst, n).expect("probes")
    };

    for backend in Backend::ALL {
        let topo = topology(backend);
        let node = topo.node();
        node.add_nfacct_counters(&rules4).expect("nfacct counters");
        node.restore(backend, &rules4, false)
            .expect("restore rendered IPv4 rules");
        node.restore6(backend, &rules6, false)
            .expect("restore rendered IPv6 rules");
        let client_ip = ip("192.168.77.3");
        let node_ip = ip("192.168.77.2");

        // ClusterIP, named target ports, terminating endpoint unused, masqueraded client.
        let t = many(&topo, &Probe::default(), addr("10.96.100.10:80"), 90);
        assert_eq!(t.ok(), 90, "{backend} web: {t:?}");
        assert_eq!(
            servers(&t),
            set(&["web-a", "web-b", "web-c"]),
            "{backend} web: {t:?}"
        );
        assert_eq!(
            t.peers.keys().copied().collect::<Vec<_>>(),
            [node_ip],
            "{backend} web: masquerade"
        );
        let r = topo
            .client()
            .connect(addr("10.96.100.10:443"))
            .expect("web https");
        assert_eq!(r.local.port(), 8443, "{backend}: targetPort https -> 8443");

        // NodePort on the node IP and on localhost (OUTPUT path, route_localnet).
        let t = many(&topo, &Probe::default(), addr("192.168.77.2:30080"), 30);
        assert_eq!(t.ok(), 30, "{backend} nodeport: {t:?}");
        assert!(
            servers(&t).is_subset(&set(&["web-a", "web-c"])),
            "{backend} nodeport: {t:?}"
        );
        let r = node
            .connect(addr("127.0.0.1:30080"))
            .expect("localhost nodeport");
        assert!(
            ["web-a", "web-c"].contains(&r.server.as_str()),
            "{backend}: {r:?}"
        );

        // No endpoints: REJECT.
        let e = topo
            .client()
            .connect(addr("10.96.100.50:80"))
            .expect_err("reports has no endpoints");
        assert_eq!(
            e.kind(),
            ErrorKind::ConnectionRefused,
            "{backend} reports: {e}"
        );

        // DNS over UDP and TCP.
        let t = topo
            .client()
            .udp_many(&Probe::default(), addr("10.96.0.10:53"), 30)
            .expect("udp probes");
        assert_eq!(t.ok(), 30, "{backend} dns/udp: {t:?}");
        assert!(
            servers(&t).is_subset(&set(&["coredns-a", "coredns-b"])),
            "{backend}: {t:?}"
        );
        let r = topo
            .client()
            .connect(addr("10.96.0.10:53"))
            .expect("dns/tcp");
        assert!(r.server.starts_with("coredns-"), "{backend}: {r:?}");

        // LoadBalancer, ETP Local with a local endpoint: only node-1's pod, client IP kept;
        // a source outside loadBalancerSourceRanges is dropped.
        let t = many(
            &topo,
            &Probe::from(client_ip),
            addr("192.168.77.100:443"),
            20,
        );
        assert_eq!(
            servers(&t),
            set(&["frontend-a"]),
            "{backend} frontend: {t:?}"
        );
        assert_eq!(
            t.peers.keys().copied().collect::<Vec<_>>(),
            [client_ip],
            "{backend}: no SNAT"
        );
        expect_blocked(
            topo.client().connect_with(
                &Probe::from(ip("192.168.77.20")).timeout(quick.timeout),
                addr("192.168.77.100:443"),
            ),
            "frontend from outside loadBalancerSourceRanges",
        );

        // ... and on its NodePort.
        let t = many(
            &topo,
            &Probe::from(client_ip),
            addr("192.168.77.2:30443"),
            20,
        );
        assert_eq!(
            servers(&t),
            set(&["frontend-a"]),
            "{backend} frontend nodeport: {t:?}"
        );

        // LoadBalancer, ETP Local without local endpoints: dropped.
        expect_blocked(
            topo.client()
                .connect_with(&quick, addr("192.168.77.101:80")),
            "checkout",
        );

        // External IP.
        let r = topo
            .client()
            .connect(addr("192.168.77.50:8080"))
            .expect("external IP");
        assert_eq!(r.server, "gateway", "{backend}");

        // ClientIP session affinity: one backend for one client.
        let t = many(&topo, &Probe::default(), addr("10.96.100.40:80"), 20);
        assert_eq!(t.ok(), 20, "{backend} cart: {t:?}");
        assert_eq!(servers(&t).len(), 1, "{backend} cart affinity: {t:?}");

        // internalTrafficPolicy Local from the node: the node's own (host-network) endpoint.
        let t = node
            .connect_many(&Probe::default(), addr("10.96.200.10:9100"), 10)
            .expect("probes");
        assert_eq!(
            servers(&t),
            set(&["node"]),
            "{backend} node-exporter: {t:?}"
        );

        // default/kubernetes -> the API server on the node network.
        let r = topo
            .client()
            .connect(addr("10.96.0.1:443"))
            .expect("kubernetes");
        assert_eq!(
            (r.server.as_str(), r.local.port()),
            ("node", 6443),
            "{backend}"
        );

        // A pod reaching its own service: hairpin traffic that lands on the pod itself is
        // masqueraded to the node, traffic to other pods keeps the pod's address.
        let web_a = topo.pod("web-a").expect("pod web-a");
        let mut landed = BTreeSet::new();
        for _ in 0..40 {
            let r = web_a
                .connect(addr("10.96.100.10:80"))
                .expect("pod -> own service");
            let want = if r.server == "web-a" {
                node_ip
            } else {
                ip("10.244.1.10")
            };
            assert_eq!(r.peer.ip(), want, "{backend} hairpin: {r:?}");
            landed.insert(r.server);
        }
        assert!(
            landed.contains("web-a") && landed.len() > 1,
            "{backend}: {landed:?}"
        );

        // Dual-stack service over IPv6.
        let t = many(&topo, &Probe::default(), addr("[fd00:96::60]:80"), 30);
        assert_eq!(t.ok(), 30, "{backend} search/v6: {t:?}");
        assert!(
            servers(&t).is_subset(&set(&["search-a", "search-b"])),
            "{backend}: {t:?}"
        );
    }
}
