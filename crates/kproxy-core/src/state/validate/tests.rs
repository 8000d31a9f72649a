use super::*;
use serde_json::json;

fn state(items: serde_json::Value) -> ClusterState {
    let text = json!({"kind": "List", "items": items}).to_string();
    crate::state::load::from_str(&text, "state.json").unwrap_or_else(|e| panic!("{e}"))
}

fn service(ns: &str, name: &str, ports: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": ns, "name": name},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "ports": ports}})
}

fn slice(ns: &str, name: &str, port: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": ns, "name": name,
            "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.5"], "nodeName": "node-1"}],
        "ports": [{"name": "http", "protocol": "TCP", "port": port}]})
}

#[test]
fn the_testdata_cluster_is_valid() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let text = std::fs::read_to_string(root.join("testdata/cluster/state.json"))
        .unwrap_or_else(|e| panic!("{e}"));
    let s = crate::state::load::from_str(&text, "state.json").unwrap_or_else(|e| panic!("{e}"));
    assert!(s.invalid.is_empty(), "{:?}", s.invalid);
    assert!(!s.services.is_empty() && !s.endpoint_slices.is_empty());
}

/// The injections: each Service is left out alone, named with its field, and no message
/// carries the line break or the quote.
#[test]
fn injected_names_leave_out_their_object_only() {
    let injections = [
        "x\n-A INPUT -s 6.6.6.6/32 -j ACCEPT",
        "x\n:MYCHAIN - [0:0]",
        "x\" } ; add element ip kube-proxy y { 1 } ; #",
        "COMMIT\n*filter",
    ];
    let mut items = vec![service("ok", "web", json!([{"name": "http", "port": 80}]))];
    for (i, name) in injections.iter().enumerate() {
        items.push(service(
            "bad",
            &format!("svc{i}"),
            json!([{"name": name, "port": 80, "protocol": "TCP"}]),
        ));
    }
    let s = state(json!(items));
    assert_eq!(s.services.len(), 1);
    assert_eq!(s.invalid.len(), injections.len());
    for bad in &s.invalid {
        assert_eq!(bad.kind, "Service");
        assert_eq!(bad.problems[0].field, "spec.ports[0].name");
        let w = bad.warning().to_string();
        // The value is shown quoted with its quotes and line breaks escaped.
        assert!(!w.contains('\n') && !w.contains("x\" }"), "{w}");
        assert!(w.starts_with("Service bad/svc"), "{w}");
        assert!(w.contains("RFC 1123 label"), "{w}");
        assert_eq!(
            bad.service().as_deref(),
            Some(&*format!("bad/{}", bad.name))
        );
    }
}

#[test]
fn ports_out_of_range_are_invalid() {
    let s = state(json!([
        service("a", "p1", json!([{"port": 99999}])),
        service("a", "p2", json!([{"port": -1}])),
        // kube-proxy's own tests use port 0; no rule fails on it.
        service("a", "zero", json!([{"port": 0}])),
        service("a", "p3", json!([{"port": 80, "targetPort": 0}])),
        service("a", "p4", json!([{"port": 80, "targetPort": "Not_A_Name"}])),
        service("a", "p5", json!([{"port": 80, "nodePort": 70000}])),
        // The API server refuses a nodePort on a ClusterIP Service; kube-proxy's tests use one.
        service("a", "p6", json!([{"port": 80, "nodePort": 30080}])),
        service("a", "ok", json!([{"port": 80, "targetPort": "http-alt"}])),
        slice("a", "s1", json!(-1)),
        slice("a", "s2", json!(99999)),
        slice("a", "s0", json!(0)),
        slice("a", "s3", json!(8080)),
    ]));
    let fields: Vec<(String, &str)> = s
        .invalid
        .iter()
        .map(|o| (o.label(), o.problems[0].field.as_str()))
        .collect();
    assert_eq!(
        fields,
        [
            ("Service a/p1".to_string(), "spec.ports[0].port"),
            ("Service a/p2".into(), "spec.ports[0].port"),
            ("Service a/p3".into(), "spec.ports[0].targetPort"),
            ("Service a/p4".into(), "spec.ports[0].targetPort"),
            ("Service a/p5".into(), "spec.ports[0].nodePort"),
            ("EndpointSlice a/s1".into(), "ports[0].port"),
            ("EndpointSlice a/s2".into(), "ports[0].port"),
        ]
    );
    let kept: Vec<&str> = s
        .endpoint_slices
        .iter()
        .filter_map(|e| e.metadata.name.as_deref())
        .collect();
    // Port 0 is kube-proxy's to skip (with the proxier's warning), as it does.
    assert_eq!(kept, ["s0", "s3"]);
    assert_eq!(s.services.len(), 3);
}

#[test]
fn service_rules() {
    let mut two = service("a", "two", json!([{"port": 80}, {"name": "b", "port": 81}]));
    let dup = service(
        "a",
        "dup",
        json!([{"name": "p", "port": 80}, {"name": "p", "port": 81}]),
    );
    let mut affinity = service("a", "aff", json!([{"port": 80}]));
    affinity["spec"]["sessionAffinity"] = json!("ClientIP");
    affinity["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 0}});
    let mut policy = service("a", "pol", json!([{"port": 80}]));
    policy["spec"]["externalTrafficPolicy"] = json!("Nearest");
    let mut proto = service("a", "proto", json!([{"port": 80, "protocol": "ICMP"}]));
    proto["metadata"]["labels"] = json!({"app": "x y"});
    let upper = service("a", "Web", json!([{"port": 80}]));
    let no_ns =
        json!({"kind": "Service", "metadata": {"name": "x"}, "spec": {"clusterIP": "10.0.0.1"}});
    two["spec"]["ipFamilies"] = json!(["IPv4"]);
    let s = state(json!([two, dup, affinity, policy, proto, upper, no_ns]));
    let got: Vec<(String, String)> = s
        .invalid
        .iter()
        .map(|o| (o.name.clone(), o.summary()))
        .collect();
    let expect = [
        ("two", "spec.ports[0].name \"\": must be given"),
        ("dup", "spec.ports[1].name \"p\": must be unique"),
        (
            "aff",
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds 0: must be between 1 and 86400, inclusive",
        ),
        (
            "pol",
            "spec.externalTrafficPolicy \"Nearest\": must be Cluster or Local",
        ),
        (
            "proto",
            "metadata.labels[\"app\"] \"x y\": must be a label value",
        ),
        (
            "Web",
            "metadata.name \"Web\": must be a lowercase RFC 1123 label",
        ),
        ("x", "metadata.namespace \"\": must be given"),
    ];
    assert_eq!(got.len(), expect.len(), "{got:#?}");
    for ((name, summary), (want_name, want)) in got.iter().zip(expect) {
        assert_eq!(name, want_name);
        assert!(summary.starts_with(want), "{summary}");
    }
    // Two problems: the label and the protocol.
    assert!(
        got[4].1.ends_with("(and 1 more invalid field)"),
        "{}",
        got[4].1
    );
}

#[test]
fn endpoint_slice_rules() {
    let mut host = slice("a", "host", json!(80));
    host["endpoints"][0]["hostname"] = json!("a.b");
    let mut node = slice("a", "node", json!(80));
    node["endpoints"][0]["nodeName"] = json!("node 1");
    let mut zones = slice("a", "zones", json!(80));
    zones["endpoints"][0]["hints"] = json!({"forZones": [{"name": "z"}, {"name": "z"}]});
    let mut empty = slice("a", "empty", json!(80));
    empty["endpoints"][0]["addresses"] = json!([]);
    let mut kind = slice("a", "kind", json!(80));
    kind["addressType"] = json!("MAC");
    let mut fine = slice("a", "fine.with.dots", json!(80));
    fine["endpoints"][0]["hints"] =
        json!({"forZones": [{"name": "zone-a"}], "forNodes": [{"name": "node-1"}]});
    fine["endpoints"][0]["zone"] = json!("any zone text");
    let s = state(json!([host, node, zones, empty, kind, fine]));
    let got: Vec<(&str, &str)> = s
        .invalid
        .iter()
        .map(|o| (o.name.as_str(), o.problems[0].field.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("host", "endpoints[0].hostname"),
            ("node", "endpoints[0].nodeName"),
            ("zones", "endpoints[0].hints.forZones[1].name"),
            ("empty", "endpoints[0].addresses"),
            ("kind", "addressType"),
        ]
    );
    assert_eq!(s.endpoint_slices.len(), 1);
}

#[test]
fn nodes_and_long_values() {
    let long = "n".repeat(300);
    let s = state(json!([
        {"kind": "Node", "metadata": {"name": long}},
        {"kind": "Node", "metadata": {"name": "node\u{0}1"}},
        {"kind": "Node", "metadata": {"name": "node-1.example.com"}},
    ]));
    assert_eq!(s.nodes.len(), 1);
    let labels: Vec<String> = s.invalid.iter().map(InvalidObject::label).collect();
    assert_eq!(labels[1], "Node \"node\\01\"");
    assert!(labels[0].ends_with("… (300 bytes)"), "{}", labels[0]);
    assert!(labels[0].len() < 100, "{}", labels[0]);
}

#[test]
fn files_merge_their_invalid_objects() {
    let dir = std::env::temp_dir().join(format!("kproxy-validate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let a = dir.join("a.json");
    let b = dir.join("b.json");
    let write = |p: &std::path::Path, v: serde_json::Value| {
        std::fs::write(p, v.to_string()).unwrap_or_else(|e| panic!("{e}"))
    };
    write(&a, service("a", "bad name", json!([{"port": 80}])));
    write(&b, service("a", "good", json!([{"port": 80}])));
    let s = crate::state::load::from_files(&[a, b]).unwrap_or_else(|e| panic!("{e}"));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!((s.services.len(), s.invalid.len()), (1, 1));
    assert_eq!(s.invalid[0].label(), "Service a/\"bad name\"");
}
