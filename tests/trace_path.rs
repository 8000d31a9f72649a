//! Path view (`trace svc/NAME`): golden renderings on the example cluster (testdata/cluster) and a
//! node dump with known divergences (testdata/trace/node-1.iptables, see make-node-dump.sh).

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
    graph::from_text(
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
fn web_divergences_are_marked() {
    let v = view("svc/web", Some("http"));
    assert_eq!(v.ports.len(), 1);
    let port = &v.ports[0];
    assert_eq!(port.port, Some(80));
    let entry = &port.entries[0];
    assert_eq!(entry.display, "10.96.100.10:80/tcp");
    assert_eq!(entry.counters.map(|c| c.packets), Some(42));
    let b = &entry.branches[0];
    assert_eq!(b.when, "any source");
    let by_dest = |d: &str| {
        b.endpoints
            .iter()
            .find(|e| e.destination.as_deref() == Some(d))
            .unwrap_or_else(|| panic!("no endpoint {d}: {:#?}", b.endpoints))
    };
    let ok = by_dest("10.244.1.10:8080");
    assert!(ok.divergence.is_none(), "{ok:?}");
    assert!((ok.share - 1.0 / 3.0).abs() < 1e-6);
    let pod = ok.pod.as_ref().expect("pod");
    assert!(
        pod.name.as_deref().is_some_and(|n| n.starts_with("shop/")),
        "{pod:?}"
    );
    let wrong = by_dest("10.244.2.10:8080");
    assert_eq!(
        wrong.divergence.as_ref().map(|d| d.kind),
        Some(DivergenceKind::WrongShare)
    );
    let missing = by_dest("10.244.1.11:8080");
    assert_eq!(
        missing.divergence.as_ref().map(|d| d.kind),
        Some(DivergenceKind::MissingEndpoint)
    );
    assert_eq!(missing.share, 0.0);
    assert!(
        entry
            .masquerade
            .iter()
            .any(|m| m.condition.as_deref() == Some("! -s 10.244.0.0/16"))
    );
    // the unreferenced SEP chain is reported for the port
    assert!(
        port.divergences
            .iter()
            .any(|d| d.kind == DivergenceKind::Anomaly)
    );
}

#[test]
fn stale_endpoint_is_marked() {
    let v = view("svc/search", None);
    let eps = &v.ports[0].entries[0].branches[0].endpoints;
    let stale = eps
        .iter()
        .find(|e| e.destination.as_deref() == Some("10.244.3.7:9200"))
        .expect("stale endpoint");
    assert_eq!(
        stale.divergence.as_ref().map(|d| d.kind),
        Some(DivergenceKind::StaleEndpoint)
    );
    assert!(stale.pod.is_none());
}

#[test]
fn clean_services_have_no_divergences() {
    for svc in [
        "svc/cart",
        "svc/frontend",
        "svc/checkout",
        "svc/legacy-gateway",
    ] {
        let v = view(svc, None);
        assert_eq!(
            v.divergence_count,
            0,
            "{svc}: {}",
            trace_path::tree(&v, Painter::plain())
        );
    }
}

#[test]
fn without_api_state_no_pods_and_no_divergences() {
    let g = graph_with(None);
    let sel = ServiceSelector::parse("shop/web", None, None).expect("selector");
    let v = path::build(&g, &sel, None).expect("view");
    assert!(!v.compared_with_api);
    assert_eq!(v.ports.len(), 2);
    // anomalies of the dump still show
    assert_eq!(v.divergence_count, 1);
    assert!(
        v.ports
            .iter()
            .flat_map(|p| &p.entries)
            .flat_map(|e| &e.branches)
            .flat_map(|b| &b.endpoints)
            .all(|e| e.pod.is_none())
    );
}

#[test]
fn selector_errors() {
    assert!(matches!(
        ServiceSelector::parse("svc/", None, None),
        Err(PathError::BadSelector(_))
    ));
    let g = graph_with(None);
    let sel = ServiceSelector::parse("svc/nope", Some("shop"), None).expect("selector");
    let err = path::build(&g, &sel, None).expect_err("not found");
    assert!(err.to_string().contains("shop/nope not found"), "{err}");
    let sel = ServiceSelector::parse("svc/web", Some("shop"), Some("9999")).expect("selector");
    let err = path::build(&g, &sel, None).expect_err("no port");
    assert!(matches!(err, PathError::PortNotFound { .. }), "{err}");
    let sel = ServiceSelector::parse("svc/web", Some("shop"), Some("443")).expect("selector");
    assert_eq!(
        path::build(&g, &sel, None).expect("by number").ports[0].port_name,
        "https"
    );
}

#[test]
fn tree_is_coloured_only_when_asked() {
    let v = view("svc/web", None);
    assert!(!trace_path::tree(&v, Painter::plain()).contains('\u{1b}'));
    assert!(trace_path::tree(&v, Painter::forced()).contains('\u{1b}'));
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
