//! The check on the real listing of `testdata/conntrack/list.txt` against the API state of
//! `testdata/conntrack/state.json` (the services the capture's rules stood for), and against
//! edits of that state: endpoints removed, services deleted, services added at addresses the
//! capture's flows went to without DNAT.

use super::*;
use crate::compare::fixture::read;
use kproxy_parsers::conntrack::{ParseOptions, parse};
use serde_json::Value;

fn state_json() -> Value {
    serde_json::from_str(&read("testdata/conntrack/state.json")).expect("state.json")
}

fn run(state: &Value, listing: &str) -> ConntrackCheck {
    let index = index(state);
    let listing = parse(listing, ParseOptions::strict()).expect("listing");
    check(&listing.flows, &index)
}

fn index(state: &Value) -> ServiceIndex {
    let state = crate::state::load::from_str(&state.to_string(), "state.json").expect("state");
    let config = crate::state::config::ProxyConfig::default();
    let args = crate::state::node::NodeInputs {
        node: Some("node-1".into()),
        ..Default::default()
    };
    let (facts, _) = crate::state::node::build(&args, &state, &config).expect("facts");
    ServiceIndex::new(&state, &config, &facts)
}

fn items(state: &mut Value) -> &mut Vec<Value> {
    state["items"].as_array_mut().unwrap()
}

/// Drops `addr` from the endpoints of slice `name`.
fn remove_endpoint(state: &mut Value, name: &str, addr: &str) {
    for item in items(state) {
        if item["metadata"]["name"] == name && item["kind"] == "EndpointSlice" {
            item["endpoints"]
                .as_array_mut()
                .unwrap()
                .retain(|e| e["addresses"][0] != addr);
        }
    }
}

fn remove_object(state: &mut Value, kind: &str, name: &str) {
    items(state).retain(|i| !(i["kind"] == kind && i["metadata"]["name"] == name));
}

fn ids(c: &ConntrackCheck) -> Vec<&'static str> {
    c.groups.iter().map(|g| g.check().id).collect()
}

#[test]
fn the_captured_table_matches_its_services() {
    let c = run(&state_json(), &read("testdata/conntrack/list.txt"));
    assert_eq!(c.groups, vec![], "{:#?}", c.groups);
    assert_eq!(c.flows, 19);
    // DNS: 6 to the cluster IP, 1 to the NodePort, 1 over IPv6; web: 2 over IPv4, 1 over IPv6;
    // 1 SCTP association.
    assert_eq!(c.service_flows, 12);
}

#[test]
fn a_removed_udp_endpoint_leaves_stale_flows_grouped_by_reply_source() {
    let listing = read("testdata/conntrack/list.txt");
    let mut state = state_json();
    remove_endpoint(&mut state, "kube-dns-v4", "10.244.1.5");
    let c = run(&state, &listing);
    assert_eq!(ids(&c), vec!["KP601"]);
    let g = &c.groups[0];
    assert_eq!(g.kind, StaleKind::StaleEndpoint);
    assert_eq!(g.service.as_deref(), Some("kube-system/kube-dns:dns"));
    assert_eq!(g.frontend, Some(Frontend::ClusterIp));
    assert_eq!((g.protocol, g.orig_port, g.reply_port), ("udp", 53, 53));
    assert_eq!(g.orig_dst.to_string(), "10.96.0.10");
    assert_eq!(g.reply_src.to_string(), "10.244.1.5");
    assert_eq!(g.serving, vec!["10.244.2.6:53"]);
    let expected_flows = listing
        .lines()
        .filter(|l| l.contains("dst=10.96.0.10 ") && l.contains("src=10.244.1.5 "))
        .count();
    assert_eq!(g.flows, expected_flows);
    assert!(g.flows >= 1);
    assert_eq!(g.packets, Some(4 * g.flows as u64));
    assert!(g.max_timeout.is_some_and(|t| t <= 30));
    assert_eq!(
        g.delete_args().join(" "),
        "-D -f ipv4 -p udp --orig-dst 10.96.0.10 --orig-port-dst 53 --reply-src 10.244.1.5 --reply-port-src 53"
    );
    let f = g.finding();
    assert_eq!((f.id, f.severity), ("KP601", Severity::Error));
    assert!(
        f.message.contains("still DNAT to 10.244.1.5:53"),
        "{}",
        f.message
    );
    assert!(
        f.hint
            .as_deref()
            .unwrap()
            .ends_with(&g.delete_args().join(" "))
    );
    assert_eq!(c.deletions().count(), 1);
}

#[test]
fn the_nodeport_flow_is_checked_on_the_node_address() {
    let mut state = state_json();
    remove_endpoint(&mut state, "kube-dns-v4", "10.244.2.6");
    let c = run(&state, &read("testdata/conntrack/list.txt"));
    let np: Vec<_> = c
        .groups
        .iter()
        .filter(|g| g.frontend == Some(Frontend::NodePort))
        .collect();
    assert_eq!(np.len(), 1);
    assert_eq!(np[0].orig_dst.to_string(), "192.168.50.1");
    assert_eq!(np[0].orig_port, 30053);
    assert_eq!(np[0].reply_src.to_string(), "10.244.2.6");
}

#[test]
fn a_port_without_endpoints_is_still_reported() {
    let mut state = state_json();
    remove_endpoint(&mut state, "kube-dns-v6", "fd00:244:1::5");
    let c = run(&state, &read("testdata/conntrack/list.txt"));
    assert_eq!(ids(&c), vec!["KP601"]);
    let g = &c.groups[0];
    assert_eq!(g.orig_dst.to_string(), "fd00:96::10");
    assert!(g.serving.is_empty());
    assert!(g.finding().message.contains("kubernetes/kubernetes#139628"));
    assert!(g.delete_args().contains(&"ipv6".to_string()));
}

#[test]
fn tcp_to_a_removed_endpoint_is_info_and_not_deleted() {
    let mut state = state_json();
    remove_endpoint(&mut state, "web-v4", "10.244.2.6");
    let c = run(&state, &read("testdata/conntrack/list.txt"));
    assert!(ids(&c).iter().all(|id| *id == "KP602"));
    // ESTABLISHED and TIME_WAIT: different clients ports, one destination and reply source.
    assert_eq!(c.groups.len(), 1, "{:#?}", c.groups);
    assert_eq!(c.groups[0].flows, 2);
    assert_eq!(c.deletions().count(), 0);
    assert_eq!(c.groups[0].finding().severity, Severity::Info);
}

#[test]
fn sctp_through_a_deleted_service_is_an_error() {
    let mut state = state_json();
    remove_object(&mut state, "Service", "assoc");
    remove_object(&mut state, "EndpointSlice", "assoc-v4");
    let c = run(&state, &read("testdata/conntrack/list.txt"));
    assert_eq!(ids(&c), vec!["KP605"]);
    let g = &c.groups[0];
    assert_eq!((g.protocol, g.service.as_deref()), ("sctp", None));
    assert_eq!(g.reply_src.to_string(), "10.244.1.5");
    assert_eq!(g.flows, 1);
    assert_eq!(g.assured, 1);
}

#[test]
fn flows_held_without_dnat_once_the_port_has_endpoints() {
    let mut state = state_json();
    // Services appear at the addresses the capture's flows went to when no rule DNATed them.
    let mut udp = items(&mut state)[0].clone();
    udp["metadata"]["name"] = "late-udp".into();
    udp["spec"]["clusterIP"] = "10.96.0.99".into();
    udp["spec"]["clusterIPs"] = serde_json::json!(["10.96.0.99"]);
    udp["spec"]["ipFamilies"] = serde_json::json!(["IPv4"]);
    udp["spec"]["type"] = "ClusterIP".into();
    udp["spec"]["ports"][0]
        .as_object_mut()
        .unwrap()
        .remove("nodePort");
    let mut udp_slice = items(&mut state)[3].clone();
    udp_slice["metadata"]["name"] = "late-udp-v4".into();
    udp_slice["metadata"]["labels"]["kubernetes.io/service-name"] = "late-udp".into();
    let mut tcp = items(&mut state)[1].clone();
    tcp["metadata"]["name"] = "late-tcp".into();
    tcp["spec"]["clusterIP"] = "10.96.0.21".into();
    tcp["spec"]["clusterIPs"] = serde_json::json!(["10.96.0.21"]);
    tcp["spec"]["ipFamilies"] = serde_json::json!(["IPv4"]);
    let mut tcp_slice = items(&mut state)[5].clone();
    tcp_slice["metadata"]["name"] = "late-tcp-v4".into();
    tcp_slice["metadata"]["labels"]["kubernetes.io/service-name"] = "late-tcp".into();
    items(&mut state).extend([udp, udp_slice, tcp, tcp_slice]);
    let c = run(&state, &read("testdata/conntrack/list.txt"));
    assert_eq!(ids(&c), vec!["KP603", "KP604"]);
    let g = &c.groups[0];
    assert_eq!(g.kind, StaleKind::NoDnat);
    assert_eq!(g.reply_src, g.orig_dst);
    assert_eq!(g.unreplied, 1);
    assert_eq!(
        g.delete_args().join(" "),
        "-D -f ipv4 -p udp --orig-dst 10.96.0.99 --orig-port-dst 53 --reply-src 10.96.0.99 --reply-port-src 53"
    );
    assert_eq!(
        c.groups[1].service.as_deref(),
        Some("default/late-tcp:http")
    );
    // Without endpoints the entry agrees with the REJECT kube-proxy installs: nothing to report.
    let mut state = state_json();
    let mut udp = items(&mut state)[0].clone();
    udp["metadata"]["name"] = "late-udp".into();
    udp["spec"]["clusterIPs"] = serde_json::json!(["10.96.0.99"]);
    udp["spec"]["clusterIP"] = "10.96.0.99".into();
    udp["spec"]["ipFamilies"] = serde_json::json!(["IPv4"]);
    items(&mut state).push(udp);
    let c = run(&state, &read("testdata/conntrack/list.txt"));
    assert_eq!(c.groups, vec![]);
}

/// `ipvsadm -Lnc` of a node with the services of `testdata/conntrack/state.json` (the layout of
/// `../shared/conformance/ipvs/formats/Lnc.constructed.txt`): every connection goes to a serving
/// endpoint, through the cluster IPs (both families), the NodePort on the node address and SCTP;
/// one persistence template points to an address no endpoint has.
const IPVS_CONNECTIONS: &str = "\
IPVS connection entries
pro expire state       source             virtual            destination
UDP 04:59  UDP         10.244.1.9:38211   10.96.0.10:53      10.244.1.5:53
UDP 04:12  UDP         10.244.1.9:38212   10.96.0.10:53      10.244.1.5:53
UDP 02:30  UDP         10.244.1.9:38213   10.96.0.10:53      10.244.2.6:53
UDP 03:10  UDP         192.168.50.7:40000 192.168.50.1:30053 10.244.2.6:53
TCP 14:58  ESTABLISHED 10.244.1.9:45678   10.96.0.20:80      10.244.2.6:8080
TCP 01:52  TIME_WAIT   10.244.1.9:45680   10.96.0.20:80      10.244.2.6:8080
TCP 179:58 NONE        10.244.3.4:0       10.96.0.20:80      10.244.9.9:8080
TCP 14:59  ESTABLISHED [fd00:244:1::9]:41234 [fd00:96::20]:80 [fd00:244:2::6]:8080
SCTP 00:03  ESTABLISHED 10.244.1.9:40000   10.96.0.30:9000    10.244.1.5:9000
";

/// The `ipvsadm -Ln` of the same node, with `rs` as the real servers of UDP 10.96.0.10:53 and
/// TCP 10.96.0.20:80.
fn ipvs_listing(dns: &[(&str, i32)], web: &[(&str, i32)]) -> String {
    let mut s = String::from(
        "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n",
    );
    s.push_str("UDP  10.96.0.10:53 rr\n");
    for (rs, w) in dns {
        s.push_str(&format!(
            "  -> {rs}:53               Masq    {w}      0          2\n"
        ));
    }
    s.push_str("TCP  10.96.0.20:80 rr\n");
    for (rs, w) in web {
        s.push_str(&format!(
            "  -> {rs}:8080             Masq    {w}      1          1\n"
        ));
    }
    s
}

fn run_ipvs(state: &Value, listing: Option<&str>) -> ConntrackCheck {
    let text = format!("{}{IPVS_CONNECTIONS}", listing.unwrap_or(""));
    let dump = kproxy_parsers::ipvsadm::parse_dump(&text).expect("ipvsadm dump");
    let services = listing.map(|_| dump.merged_services());
    check_ipvs(&dump.connections, services.as_deref(), &index(state))
}

#[test]
fn ipvs_connections_to_serving_endpoints_are_clean() {
    let c = run_ipvs(&state_json(), None);
    assert_eq!(c.groups, vec![], "{:#?}", c.groups);
    assert_eq!(c.flows, 9);
    // The template is no flow; the other eight go to service ports.
    assert_eq!(c.service_flows, 8);
}

#[test]
fn ipvs_udp_connections_to_a_removed_endpoint_are_errors_without_conntrack_deletion() {
    let mut state = state_json();
    remove_endpoint(&mut state, "kube-dns-v4", "10.244.1.5");
    let listed = [("10.244.1.5", 1), ("10.244.2.6", 1)];
    // The real server is still in the virtual server: kube-proxy did not sync.
    let c = run_ipvs(&state, Some(&ipvs_listing(&listed, &[("10.244.2.6", 1)])));
    assert_eq!(ids(&c), vec!["KP601"]);
    let g = &c.groups[0];
    assert_eq!(g.table, FlowTable::Ipvs);
    assert_eq!(g.service.as_deref(), Some("kube-system/kube-dns:dns"));
    assert_eq!((g.flows, g.max_timeout), (2, Some(299)));
    assert_eq!(g.states.get("UDP"), Some(&2));
    assert_eq!(g.lines, vec![3 + 8, 4 + 8]);
    assert_eq!(
        g.real_server,
        Some(RealServerState::Scheduled { weight: 1 })
    );
    assert_eq!(
        c.deletions().count(),
        0,
        "no conntrack -D for IPVS connections"
    );
    let f = g.finding();
    assert_eq!((f.id, f.severity), ("KP601", Severity::Error));
    assert_eq!(f.chain.as_deref(), Some("ipvs udp 10.96.0.10:53"));
    assert!(
        f.message
            .contains("2 UDP flows to 10.96.0.10:53 (cluster IP of kube-system/kube-dns:dns) still go to real server 10.244.1.5:53")
            && f.message.contains("2 UDP")
            && f.message.contains("still a real server of the virtual server (weight 1)"),
        "{}",
        f.message
    );
    let hint = f.hint.as_deref().unwrap();
    assert!(
        hint.contains("ipvsadm -d -u 10.96.0.10:53 -r 10.244.1.5:53")
            && hint.contains("expire_nodest_conn")
            && !hint.contains("conntrack -D -f"),
        "{hint}"
    );

    // kube-proxy deleted the real server (as it does for UDP at once): the next packet ends them.
    let c = run_ipvs(
        &state,
        Some(&ipvs_listing(&[("10.244.2.6", 1)], &[("10.244.2.6", 1)])),
    );
    let g = &c.groups[0];
    assert_eq!(g.real_server, Some(RealServerState::Gone));
    let f = g.finding();
    assert!(
        f.message.contains("no longer a real server"),
        "{}",
        f.message
    );
    assert!(!f.hint.as_deref().unwrap().contains("ipvsadm -d"));

    // Without an -Ln listing nothing is said about the real server.
    let c = run_ipvs(&state, None);
    assert_eq!(c.groups[0].real_server, None);
    assert!(c.groups[0].finding().hint.unwrap().contains("ipvsadm -d"));
}

#[test]
fn ipvs_tcp_connections_to_a_draining_real_server_are_info() {
    let mut state = state_json();
    remove_endpoint(&mut state, "web-v4", "10.244.2.6");
    let dns = [("10.244.1.5", 1), ("10.244.2.6", 1)];
    let c = run_ipvs(&state, Some(&ipvs_listing(&dns, &[("10.244.2.6", 0)])));
    assert_eq!(ids(&c), vec!["KP602"]);
    let g = &c.groups[0];
    // ESTABLISHED and TIME_WAIT; not the template to 10.244.9.9.
    assert_eq!(g.flows, 2);
    assert_eq!(g.real_server, Some(RealServerState::Draining));
    let f = g.finding();
    assert_eq!(f.severity, Severity::Info);
    assert!(
        f.message.contains("1 ESTABLISHED, 1 TIME_WAIT") && f.message.contains("drains it"),
        "{}",
        f.message
    );
}

#[test]
fn ipvs_sctp_through_a_deleted_service_is_an_error() {
    let mut state = state_json();
    remove_object(&mut state, "Service", "assoc");
    let c = run_ipvs(&state, None);
    assert_eq!(ids(&c), vec!["KP605"]);
    let f = c.groups[0].finding();
    assert!(
        f.message
            .contains("still go to real server 10.244.1.5:9000"),
        "{}",
        f.message
    );
}

#[test]
fn every_check_is_documented() {
    let docs = read("docs/findings.md");
    for w in CHECKS.windows(2) {
        assert!(w[0].id < w[1].id);
    }
    for c in CHECKS {
        let needle = format!("| {} | {} |", c.id, c.severity.as_str());
        assert!(docs.contains(&needle), "docs/findings.md lacks `{needle}`");
    }
}

/// A connection expired by `expire_nodest_conn` while still referenced lingers for up to a
/// minute beside the one that replaced it (same client and virtual address): only the
/// longest-lived carries the flow, so the lingering one is no finding; alone, it is one.
#[test]
fn an_expired_ipvs_connection_beside_its_replacement_is_no_finding() {
    let lingering = "UDP 00:57  UDP         10.244.1.9:38211   10.96.0.10:53      10.244.9.9:53\n";
    let text = format!("{IPVS_CONNECTIONS}{lingering}");
    let dump = kproxy_parsers::ipvsadm::parse_dump(&text).expect("ipvsadm dump");
    let c = check_ipvs(&dump.connections, None, &index(&state_json()));
    assert_eq!(c.groups, vec![], "{:#?}", c.groups);
    assert_eq!(c.flows, 10);
    let alone = format!(
        "IPVS connection entries\npro expire state       source             virtual            destination\n{lingering}"
    );
    let dump = kproxy_parsers::ipvsadm::parse_dump(&alone).expect("ipvsadm dump");
    let c = check_ipvs(&dump.connections, None, &index(&state_json()));
    assert_eq!(c.groups.len(), 1, "{:#?}", c.groups);
}
