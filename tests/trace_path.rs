//! Path view (`trace svc/NAME`).
//!
//! What the view says is tested on kube-proxy's own output: the rules its TestOverallIPTablesRules
//! expects (`../shared/conformance/iptables/render/overall-iptables-rules`, read at test time) and
//! the API state they were made from, as they are (every service matches the API) and with drift
//! cut into kube-proxy's text or its state (missing, stale and mis-shared endpoints, a missing
//! service port).
//!
//! How the view is rendered (tree, table, JSON, DOT) is pinned by snapshots of a drifted dump of
//! the example cluster (`testdata/trace/node-1.iptables`, written by make-node-dump.sh from our
//! own render): they guard the output, not kube-proxy's behaviour.

use kproxy::graph::{self, GraphOptions};
use kproxy::output::color::Painter;
use kproxy::output::trace_path::{self, PathFormat};
use kproxy::parsers::iptables::ParseOptions;
use kproxy::proxier::iptables::{ServiceDecisions, expected_service_ports};
use kproxy::state::node::NodeInputs;
use kproxy::trace::path::{self, DivergenceKind, PathError, PathView, ServiceSelector};
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn plan() -> (ServiceDecisions, String) {
    let state = kproxy::state::load::from_files(&[root().join("testdata/cluster/state.json")])
        .expect("state");
    let text =
        std::fs::read_to_string(root().join("testdata/cluster/config.yaml")).expect("config");
    let (config, _) = kproxy::state::config::parse(&text, "config.yaml").expect("config parses");
    let args = NodeInputs {
        family: Some(kproxy::state::ip::IpFamily::V4),
        ..NodeInputs::default()
    };
    let (facts, _) = kproxy::state::node::build(&args, &state, &config).expect("facts");
    (
        expected_service_ports(&state, &config, &facts),
        facts.node_name,
    )
}

/// The graph of the trace fixture (the text is leaked: the graph borrows it for the test).
fn graph_with(plan: Option<&ServiceDecisions>) -> graph::ServiceGraph<'static> {
    let text =
        std::fs::read_to_string(root().join("testdata/trace/node-1.iptables")).expect("dump");
    let text: &'static str = Box::leak(text.into_boxed_str());
    let resolver = plan.map(path::resolver_for).unwrap_or_default();
    graph::iptables::from_text(
        text,
        "node-1.iptables",
        &ParseOptions::default(),
        &GraphOptions {
            resolver,
            ..GraphOptions::default()
        },
    )
    .expect("dump parses")
}

fn view(svc: &str, port: Option<&str>) -> PathView {
    let (plan, node) = plan();
    let g = graph_with(Some(&plan));
    let sel = ServiceSelector::parse(svc, Some("shop"), port).expect("selector");
    path::build(&g, &sel, Some(&plan))
        .expect("view")
        .with_node(Some(node))
}

#[test]
fn golden_web_tree() {
    insta::assert_snapshot!(trace_path::tree(&view("svc/web", None), Painter::plain()));
}

#[test]
fn golden_web_table() {
    insta::assert_snapshot!(trace_path::table(&view("svc/web", None), false));
}

#[test]
fn golden_web_json() {
    let v = view("svc/web", None);
    insta::assert_snapshot!(
        trace_path::render(&v, PathFormat::Json, Painter::plain(), false).expect("json")
    );
}

#[test]
fn golden_web_dot() {
    insta::assert_snapshot!(trace_path::dot(&view("svc/web", None)));
}

#[test]
fn golden_frontend_tree() {
    // LoadBalancer with source ranges, externalTrafficPolicy Local, health-check port
    insta::assert_snapshot!(trace_path::tree(
        &view("svc/frontend", None),
        Painter::plain()
    ));
}

#[test]
fn golden_checkout_tree() {
    // externalTrafficPolicy Local without a local endpoint: external traffic DROPped
    insta::assert_snapshot!(trace_path::tree(
        &view("svc/checkout", None),
        Painter::plain()
    ));
}

#[test]
fn golden_cart_and_reports_tree() {
    // session affinity; a service without endpoints (REJECT)
    let cart = trace_path::tree(&view("svc/cart", None), Painter::plain());
    let reports = trace_path::tree(&view("svc/reports", None), Painter::plain());
    insta::assert_snapshot!(format!("{cart}\n{reports}"));
}

/// kube-proxy's rules for TestOverallIPTablesRules, the API state and configuration they were
/// made from, and the node facts of the case.
struct Golden {
    dump: String,
    state: serde_json::Value,
    config: kproxy::state::config::ProxyConfig,
    inputs: NodeInputs,
}

fn golden() -> Option<Golden> {
    let dir = crate::support::shared(
        "trace_path",
        "conformance/iptables/render/overall-iptables-rules",
    )?;
    let read =
        |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("{f}: {e}"));
    let (config, _) =
        kproxy::state::config::parse(&read("config.yaml"), "config.yaml").expect("config parses");
    Some(Golden {
        dump: read("expected.iptables"),
        state: serde_json::from_str(&read("state.json")).expect("state.json"),
        config,
        inputs: crate::render::harness_args(&crate::render::yaml(&dir.join("case.yaml"))),
    })
}

impl Golden {
    /// kube-proxy's decisions for the (possibly edited) state, and the node name.
    fn decisions(&self) -> (ServiceDecisions, String) {
        let state = kproxy::state::load::from_str(&self.state.to_string(), "state.json")
            .expect("state loads");
        let (facts, _) =
            kproxy::state::node::build(&self.inputs, &state, &self.config).expect("node facts");
        (
            expected_service_ports(&state, &self.config, &facts),
            facts.node_name,
        )
    }

    /// The view of `service` over `dump` (kube-proxy's text, or an edit of it), set against the
    /// state unless `compare` is false.
    fn view(&self, dump: &str, service: &str, compare: bool) -> PathView {
        let (decisions, node) = self.decisions();
        let decisions = compare.then_some(decisions);
        let text: &'static str = Box::leak(dump.to_string().into_boxed_str());
        let graph = graph::iptables::from_text(
            text,
            "expected.iptables",
            &ParseOptions::default(),
            &GraphOptions {
                resolver: decisions
                    .as_ref()
                    .map(path::resolver_for)
                    .unwrap_or_default(),
                ..GraphOptions::default()
            },
        )
        .expect("kube-proxy's rules parse");
        let selector = ServiceSelector::parse(service, None, None).expect("selector");
        path::build(&graph, &selector, decisions.as_ref())
            .expect("view")
            .with_node(compare.then_some(node))
    }
}

/// kube-proxy's text without the lines that contain `needle`.
fn without(dump: &str, needle: &str) -> String {
    let kept: Vec<&str> = dump.lines().filter(|l| !l.contains(needle)).collect();
    kept.join("\n") + "\n"
}

fn endpoints(v: &PathView) -> Vec<&path::EndpointPath> {
    v.ports
        .iter()
        .flat_map(|p| &p.entries)
        .flat_map(|e| &e.branches)
        .flat_map(|b| &b.endpoints)
        .collect()
}

fn endpoint<'v>(v: &'v PathView, destination: &str) -> &'v path::EndpointPath {
    endpoints(v)
        .into_iter()
        .find(|e| e.destination.as_deref() == Some(destination))
        .unwrap_or_else(|| {
            panic!(
                "no endpoint {destination}: {}",
                trace_path::tree(v, Painter::plain())
            )
        })
}

#[test]
fn kube_proxys_own_rules_match_the_api() {
    let Some(g) = golden() else { return };
    for service in [
        "ns1/svc1", "ns2/svc2", "ns3/svc3", "ns4/svc4", "ns5/svc5", "ns6/svc6",
    ] {
        let v = g.view(&g.dump, service, true);
        assert!(v.compared_with_api);
        assert_eq!(
            v.divergence_count,
            0,
            "{service}: {}",
            trace_path::tree(&v, Painter::plain())
        );
    }
}

#[test]
fn entries_shares_and_verdicts_of_kube_proxys_rules() {
    use kproxy::graph::{EntryKind, VerdictReason};
    let Some(g) = golden() else { return };
    // ns1/svc1: one endpoint takes every new connection; off-cluster clients are masqueraded.
    let v = g.view(&g.dump, "ns1/svc1", true);
    let entry = &v.ports[0].entries[0];
    assert_eq!(entry.display, "172.30.0.41:80/tcp");
    assert!(
        entry
            .masquerade
            .iter()
            .any(|m| m.condition.as_deref() == Some("! -s 10.0.0.0/8"))
    );
    let one = endpoint(&v, "10.180.0.1:80");
    assert_eq!(one.share, 1.0);
    assert_eq!(one.expected_share, Some(1.0));
    assert!(one.pod.is_some());
    // ns4/svc4: two endpoints, half each (`--probability 0.5000000000`, then the last rule).
    let v = g.view(&g.dump, "ns4/svc4", true);
    for d in ["10.180.0.4:80", "10.180.0.5:80"] {
        assert!((endpoint(&v, d).share - 0.5).abs() < 1e-9, "{d}");
    }
    // ns6/svc6: no endpoints, so the filter table rejects.
    let v = g.view(&g.dump, "ns6/svc6", true);
    let verdicts: Vec<_> = v.ports[0]
        .entries
        .iter()
        .flat_map(|e| &e.verdicts)
        .collect();
    assert!(
        verdicts
            .iter()
            .any(|x| x.verdict == "REJECT" && x.reason == VerdictReason::NoEndpoints),
        "{}",
        trace_path::tree(&v, Painter::plain())
    );
    // ns2/svc2: externalTrafficPolicy Local without a local endpoint: external destinations
    // are dropped, the health-check node port accepted.
    let v = g.view(&g.dump, "ns2/svc2", true);
    let entries = &v.ports[0].entries;
    for kind in [
        EntryKind::ExternalIp,
        EntryKind::LoadBalancerIp,
        EntryKind::NodePort,
    ] {
        let e = entries
            .iter()
            .find(|e| e.kind == kind)
            .unwrap_or_else(|| panic!("no {kind:?} entry"));
        assert!(
            e.verdicts
                .iter()
                .any(|x| x.verdict == "DROP" && x.reason == VerdictReason::NoLocalEndpoints),
            "{kind:?}"
        );
    }
    assert!(
        entries
            .iter()
            .any(|e| e.kind == EntryKind::HealthCheckNodePort)
    );
    // ns5/svc5: the load balancer admits 203.0.113.0/25 only; ClientIP affinity of 10800 s.
    let v = g.view(&g.dump, "ns5/svc5", true);
    let lb = v.ports[0]
        .entries
        .iter()
        .find(|e| e.kind == EntryKind::LoadBalancerIp)
        .expect("LB entry");
    assert!(
        lb.branches
            .iter()
            .any(|b| b.when == "source in 203.0.113.0/25"),
        "{:?}",
        lb.branches
    );
    let affinity = v.ports[0].affinity.as_ref().expect("affinity");
    assert_eq!(affinity.timeout_seconds, Some(10800));
    assert_eq!(affinity.expected_timeout_seconds, Some(10800));
}

#[test]
fn an_endpoint_the_rules_lost_is_missing() {
    let Some(g) = golden() else { return };
    // The jump to 10.180.0.5's chain is gone; the chain itself is left unreferenced.
    let dump = without(&g.dump, "\"ns4/svc4:p80 -> 10.180.0.5:80\"");
    let v = g.view(&dump, "ns4/svc4", true);
    let missing = endpoint(&v, "10.180.0.5:80");
    assert_eq!(
        missing.divergence.as_ref().map(|d| d.kind),
        Some(DivergenceKind::MissingEndpoint)
    );
    assert_eq!(missing.share, 0.0);
    assert!(endpoint(&v, "10.180.0.4:80").divergence.is_none());
    assert!(
        v.ports[0]
            .divergences
            .iter()
            .any(|d| d.kind == DivergenceKind::Anomaly),
        "the unreferenced endpoint chain is reported"
    );
}

#[test]
fn shares_the_api_does_not_imply_are_wrong() {
    let Some(g) = golden() else { return };
    let dump = g
        .dump
        .replace("--probability 0.5000000000", "--probability 0.2000000000");
    let v = g.view(&dump, "ns4/svc4", true);
    for (d, share) in [("10.180.0.4:80", 0.2), ("10.180.0.5:80", 0.8)] {
        let e = endpoint(&v, d);
        assert!((e.share - share).abs() < 1e-9, "{d}: {}", e.share);
        assert_eq!(e.expected_share, Some(0.5));
        assert_eq!(
            e.divergence.as_ref().map(|x| x.kind),
            Some(DivergenceKind::WrongShare),
            "{d}"
        );
    }
}

#[test]
fn an_endpoint_the_api_dropped_is_stale() {
    let Some(mut g) = golden() else { return };
    // The API loses 10.180.0.5; the node's rules still pick it.
    let items = g.state["items"].as_array_mut().expect("items");
    let slice = items
        .iter_mut()
        .find(|i| i["metadata"]["name"] == "svc4-1")
        .expect("svc4's EndpointSlice");
    slice["endpoints"]
        .as_array_mut()
        .expect("endpoints")
        .retain(|e| e["addresses"][0] != "10.180.0.5");
    let v = g.view(&g.dump, "ns4/svc4", true);
    let stale = endpoint(&v, "10.180.0.5:80");
    assert_eq!(
        stale.divergence.as_ref().map(|d| d.kind),
        Some(DivergenceKind::StaleEndpoint)
    );
    assert!(stale.pod.is_none());
    let kept = endpoint(&v, "10.180.0.4:80");
    assert_eq!(kept.expected_share, Some(1.0));
    assert_eq!(
        kept.divergence.as_ref().map(|d| d.kind),
        Some(DivergenceKind::WrongShare)
    );
}

#[test]
fn a_service_port_without_rules_is_missing() {
    let Some(g) = golden() else { return };
    let dump = without(&without(&g.dump, "ns3/svc3"), "X27LE4BHSL4DOUIK");
    let v = g.view(&dump, "ns3/svc3", true);
    assert_eq!(v.ports.len(), 1);
    assert!(!v.ports[0].in_dump);
    assert_eq!(
        v.ports[0]
            .divergences
            .iter()
            .map(|d| d.kind)
            .collect::<Vec<_>>(),
        [DivergenceKind::MissingServicePort]
    );
}

#[test]
fn without_api_state_no_pods_and_no_divergences() {
    let Some(g) = golden() else { return };
    let v = g.view(&g.dump, "ns4/svc4", false);
    assert!(!v.compared_with_api);
    assert_eq!(v.divergence_count, 0);
    let eps = endpoints(&v);
    // The cluster IP and the external IP each lead to both endpoints.
    let destinations: std::collections::BTreeSet<_> = eps
        .iter()
        .filter_map(|e| e.destination.as_deref())
        .collect();
    assert_eq!(
        destinations.into_iter().collect::<Vec<_>>(),
        ["10.180.0.4:80", "10.180.0.5:80"]
    );
    assert!(
        eps.iter()
            .all(|e| e.pod.is_none() && e.expected_share.is_none())
    );
}

#[test]
fn selector_errors() {
    assert!(matches!(
        ServiceSelector::parse("svc/", None, None),
        Err(PathError::BadSelector(_))
    ));
    let Some(g) = golden() else { return };
    let text: &'static str = Box::leak(g.dump.clone().into_boxed_str());
    let graph = graph::iptables::from_text(
        text,
        "expected.iptables",
        &ParseOptions::default(),
        &GraphOptions::default(),
    )
    .expect("parses");
    let sel = ServiceSelector::parse("svc/nope", Some("ns1"), None).expect("selector");
    let err = path::build(&graph, &sel, None).expect_err("not found");
    assert!(err.to_string().contains("ns1/nope not found"), "{err}");
    let sel = ServiceSelector::parse("svc/svc1", Some("ns1"), Some("9999")).expect("selector");
    let err = path::build(&graph, &sel, None).expect_err("no port");
    assert!(matches!(err, PathError::PortNotFound { .. }), "{err}");
    let sel = ServiceSelector::parse("svc/svc1", Some("ns1"), Some("80")).expect("selector");
    assert_eq!(
        path::build(&graph, &sel, None).expect("by number").ports[0].port_name,
        "p80"
    );
}

#[test]
fn tree_is_coloured_only_when_asked() {
    let Some(g) = golden() else { return };
    let v = g.view(&g.dump, "ns2/svc2", true);
    assert!(!trace_path::tree(&v, Painter::plain()).contains('\u{1b}'));
    assert!(trace_path::tree(&v, Painter::forced()).contains('\u{1b}'));
}
