//! `deploy/monitor/` and `deploy/npd/` hold what they claim: the Kubernetes objects read as
//! their k8s-openapi types and write back unchanged (an unknown or misspelt field would be
//! dropped, a wrong type refused); the Prometheus Operator objects use only fields of their
//! CRDs; `promtool check rules` accepts the alerts; the dashboard and the alerts name only
//! metrics the monitor exports; the DaemonSet runs as the issue asks (host network, only
//! NET_ADMIN and NET_RAW, read-only root, every taint tolerated, system-node-critical); the
//! NPD plugin config runs `verify --local --npd`, whose contract is checked too.

use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn deploy(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("deploy")
        .join(rel)
}

/// The YAML documents of a manifest file.
fn documents(rel: &str) -> Vec<Value> {
    let path = deploy(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{rel}: {e}"));
    kproxy::state::load::parse_documents(&text, rel).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Reads `doc` as `T` and writes it back: equal to the document, or the difference.
fn round_trip<T>(doc: &Value, what: &str)
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let typed: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{what}: not a valid object of its kind: {e}"));
    let back = serde_json::to_value(&typed).expect("serialise");
    assert_eq!(
        &back, doc,
        "{what}: fields the schema does not know were dropped (or a value changed)"
    );
}

/// Every Kubernetes object of `deploy/monitor/` against its schema.
#[test]
fn kubernetes_objects_match_their_schemas() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::core::v1::{Service, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let mut kinds = BTreeSet::new();
    for file in ["rbac.yaml", "daemonset.yaml"] {
        for doc in documents(&format!("monitor/{file}")) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_string();
            let what = format!("{file} {kind} {}", doc["metadata"]["name"]);
            match kind.as_str() {
                "ServiceAccount" => round_trip::<ServiceAccount>(&doc, &what),
                "ClusterRole" => round_trip::<ClusterRole>(&doc, &what),
                "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(&doc, &what),
                "Role" => round_trip::<Role>(&doc, &what),
                "RoleBinding" => round_trip::<RoleBinding>(&doc, &what),
                "DaemonSet" => round_trip::<DaemonSet>(&doc, &what),
                "Service" => round_trip::<Service>(&doc, &what),
                other => panic!("{what}: kind {other} is not checked"),
            }
            kinds.insert(kind);
        }
    }
    assert_eq!(
        kinds.into_iter().collect::<Vec<_>>(),
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "DaemonSet",
            "Role",
            "RoleBinding",
            "ServiceAccount"
        ]
    );
    // The check fails on what it must catch.
    let mut bad = documents("monitor/daemonset.yaml").remove(0);
    bad["spec"]["template"]["spec"]["hostNetwrok"] = Value::Bool(true);
    let caught = std::panic::catch_unwind(|| round_trip::<DaemonSet>(&bad, "typo"));
    assert!(caught.is_err(), "a misspelt field went unnoticed");
}

/// The DaemonSet as the issue specifies it.
#[test]
fn the_daemonset_runs_as_specified() {
    let ds = documents("monitor/daemonset.yaml").remove(0);
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert_eq!(
        pod["tolerations"],
        serde_json::json!([{"operator": "Exists"}])
    );
    assert_eq!(pod["serviceAccountName"], "kproxy-monitor");
    let containers = pod["containers"].as_array().expect("containers");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    assert_eq!(
        sc["capabilities"]["add"],
        serde_json::json!(["NET_ADMIN", "NET_RAW"])
    );
    assert!(sc.get("privileged").is_none_or(|p| p == false));
    assert_eq!(c["args"][0], "monitor");
    assert_eq!(c["ports"][0]["containerPort"], 9847);
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
}

/// The RBAC is what the monitor calls, nothing more.
#[test]
fn rbac_is_least() {
    let mut granted = BTreeSet::new();
    for doc in documents("monitor/rbac.yaml") {
        for rule in doc["rules"].as_array().into_iter().flatten() {
            for group in rule["apiGroups"].as_array().expect("apiGroups") {
                for res in rule["resources"].as_array().expect("resources") {
                    for verb in rule["verbs"].as_array().expect("verbs") {
                        granted.insert(format!(
                            "{}/{} {}",
                            group.as_str().unwrap_or_default(),
                            res.as_str().unwrap_or_default(),
                            verb.as_str().unwrap_or_default()
                        ));
                    }
                }
            }
        }
    }
    let want: BTreeSet<String> = [
        "/services list",
        "/services watch",
        "/nodes list",
        "/nodes watch",
        "discovery.k8s.io/endpointslices list",
        "discovery.k8s.io/endpointslices watch",
        "/configmaps list",
        "/configmaps watch",
        "/nodes/status patch",
        "events.k8s.io/events create",
        "events.k8s.io/events patch",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(granted, want);
}

/// The fields of an object, checked against the fields a CRD's schema has; `path` names
/// the object in messages.
fn only_known(v: &Value, known: &[&str], path: &str) {
    let map = v
        .as_object()
        .unwrap_or_else(|| panic!("{path}: expected a map"));
    for k in map.keys() {
        assert!(
            known.contains(&k.as_str()),
            "{path}.{k}: not a field of the CRD"
        );
    }
}

/// The Prometheus Operator objects use only their CRDs' fields (monitoring.coreos.com/v1).
#[test]
fn prometheus_operator_objects_use_their_crd_fields() {
    let pm = documents("monitor/podmonitor.yaml").remove(0);
    assert_eq!(pm["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pm["kind"], "PodMonitor");
    only_known(
        &pm,
        &["apiVersion", "kind", "metadata", "spec"],
        "PodMonitor",
    );
    let spec = &pm["spec"];
    only_known(
        spec,
        &[
            "selector",
            "namespaceSelector",
            "podMetricsEndpoints",
            "jobLabel",
            "podTargetLabels",
            "sampleLimit",
            "targetLimit",
            "attachMetadata",
        ],
        "PodMonitor.spec",
    );
    for ep in spec["podMetricsEndpoints"].as_array().expect("endpoints") {
        only_known(
            ep,
            &[
                "port",
                "portNumber",
                "path",
                "scheme",
                "interval",
                "scrapeTimeout",
                "honorLabels",
                "honorTimestamps",
                "relabelings",
                "metricRelabelings",
                "params",
            ],
            "PodMonitor.spec.podMetricsEndpoints[]",
        );
        assert_eq!(ep["port"], "metrics", "the DaemonSet's port name");
    }
    let ds = documents("monitor/daemonset.yaml").remove(0);
    assert_eq!(
        pm["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );

    let pr = documents("monitor/prometheusrule.yaml").remove(0);
    assert_eq!(pr["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(pr["kind"], "PrometheusRule");
    only_known(
        &pr,
        &["apiVersion", "kind", "metadata", "spec"],
        "PrometheusRule",
    );
    only_known(&pr["spec"], &["groups"], "PrometheusRule.spec");
    for g in pr["spec"]["groups"].as_array().expect("groups") {
        only_known(
            g,
            &[
                "name",
                "interval",
                "rules",
                "limit",
                "partial_response_strategy",
            ],
            "PrometheusRule.spec.groups[]",
        );
        for r in g["rules"].as_array().expect("rules") {
            only_known(
                r,
                &[
                    "alert",
                    "record",
                    "expr",
                    "for",
                    "keep_firing_for",
                    "labels",
                    "annotations",
                ],
                "PrometheusRule.spec.groups[].rules[]",
            );
        }
    }
}

/// `promtool check rules` accepts the PrometheusRule's groups, and they hold the three alerts
/// the issue asks for.
#[test]
fn promtool_accepts_the_alerts() {
    if crate::support::netns::find_tool("promtool").is_none() {
        crate::support::skip("promtool_accepts_the_alerts", "promtool is not installed");
        return;
    }
    let pr = documents("monitor/prometheusrule.yaml").remove(0);
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("rules.json");
    std::fs::write(
        &rules,
        serde_json::to_string(&serde_json::json!({"groups": pr["spec"]["groups"]})).expect("json"),
    )
    .expect("write rules");
    let o = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .expect("promtool");
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let alerts: Vec<(&str, &str, Option<&str>)> = pr["spec"]["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| {
            (
                r["alert"].as_str().unwrap_or_default(),
                r["expr"].as_str().unwrap_or_default(),
                r["for"].as_str(),
            )
        })
        .collect();
    assert!(
        alerts
            .iter()
            .any(|(_, e, f)| e.contains("kproxy_node_in_sync") && *f == Some("5m"))
    );
    assert!(
        alerts
            .iter()
            .any(|(_, e, _)| e.contains("kproxy_last_verify_timestamp_seconds > 600"))
    );
    assert!(
        alerts
            .iter()
            .any(|(_, e, _)| e.contains("histogram_quantile(0.99")
                && e.contains("kproxy_programming_latency_seconds_bucket")
                && e.ends_with("> 30"))
    );
}

/// The metric families the monitor exports, from its own registry after one verify, one
/// failed run and one repair (families with labels show once they have a series): `name` → type.
fn exported() -> std::collections::BTreeMap<String, String> {
    use kproxy::compare::{Report, catalogue};
    use kproxy::monitor::{metrics, tracker};
    use std::time::{Duration, Instant, SystemTime};
    let m = metrics::Metrics::new(Duration::from_secs(1));
    let report = Report::new(
        "n",
        kproxy::state::mode::ProxyMode::Iptables,
        1,
        vec![catalogue::ENDPOINT_MISSING.finding("x").service("a/b:c")],
    );
    let a = tracker::Tracker::new(Duration::ZERO).assess(report, Instant::now());
    m.verified(&a, Duration::from_millis(1), SystemTime::now());
    m.failed(Duration::from_millis(1));
    m.repair("applied");
    m.set_build(metrics::BuildLabels {
        version: "0".into(),
        mode: "iptables".into(),
        kube_proxy_version: "1.35".into(),
    });
    let text = metrics::prometheus_text(&m.encode());
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

/// Every `kproxy_…` series the dashboard and the alerts query is one the monitor exports.
#[test]
fn dashboard_and_alerts_name_exported_metrics() {
    let families = exported();
    for name in [
        "kproxy_node_in_sync",
        "kproxy_findings",
        "kproxy_drifted_service_ports",
        "kproxy_pending_service_ports",
        "kproxy_verify_duration_seconds",
        "kproxy_verify_runs_total",
        "kproxy_last_verify_timestamp_seconds",
        "kproxy_programming_latency_seconds",
        "kproxy_stale_conntrack_flows",
        "kproxy_build_info",
    ] {
        assert!(
            families.contains_key(name),
            "{name} is not exported: {families:?}"
        );
    }
    let known = |series: &str| {
        families.contains_key(series)
            || ["_bucket", "_sum", "_count"].iter().any(|s| {
                series
                    .strip_suffix(s)
                    .is_some_and(|b| families.get(b).is_some_and(|t| t == "histogram"))
            })
    };
    let re = regex::Regex::new(r"kproxy_[a-z_]+").expect("regex");
    let dashboard = std::fs::read_to_string(deploy("monitor/dashboard.json")).expect("dashboard");
    let dash: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert!(dash["panels"].as_array().is_some_and(|p| p.len() >= 6));
    let rules = std::fs::read_to_string(deploy("monitor/prometheusrule.yaml")).expect("rules");
    let mut seen = 0;
    for text in [&dashboard, &rules] {
        for m in re.find_iter(text) {
            let name = m.as_str();
            if name == "kproxy_monitor" || name.starts_with("kproxy_monitor") {
                continue;
            }
            seen += 1;
            assert!(known(name), "{name} is not a series the monitor exports");
        }
    }
    assert!(seen > 10, "only {seen} series named");
}

/// The NPD custom-plugin config runs `verify --local --npd` for condition KubeProxyRulesDrift,
/// and `verify --npd` keeps the contract: one line of at most 80 characters, exit 0 / 1 / 2.
#[test]
fn npd_plugin_runs_verify_npd_by_its_contract() {
    let text =
        std::fs::read_to_string(deploy("npd/kproxy-plugin-monitor.json")).expect("npd config");
    let cfg: Value = serde_json::from_str(&text).expect("the NPD config is JSON");
    assert_eq!(cfg["plugin"], "custom");
    assert!(
        cfg["pluginConfig"]["max_output_length"]
            .as_u64()
            .is_some_and(|n| n <= 80)
    );
    assert_eq!(cfg["conditions"][0]["type"], "KubeProxyRulesDrift");
    let rule = &cfg["rules"][0];
    assert_eq!(rule["condition"], "KubeProxyRulesDrift");
    assert_eq!(rule["type"], "permanent");
    assert_eq!(
        rule["args"],
        serde_json::json!(["verify", "--local", "--npd"])
    );
    assert!(Path::new(rule["path"].as_str().unwrap_or_default()).ends_with("kubectl-kproxy"));

    let cluster = |f: &str| crate::support::repair::cluster_file(f);
    let dumps = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/dumps");
    let run = |dump: &Path| {
        let o = crate::support::kproxy()
            .args(["verify", "node-1", "--npd", "--state"])
            .arg(cluster("state.json"))
            .arg("--config")
            .arg(cluster("config.yaml"))
            .arg("--iptables-save")
            .arg(dump)
            .output()
            .expect("verify --npd");
        let out = String::from_utf8(o.stdout).expect("utf-8");
        assert_eq!(out.lines().count(), 1, "one line: {out:?}");
        let line = out.trim_end_matches('\n').to_string();
        assert!(
            line.chars().count() <= 80,
            "{line:?} is longer than 80 characters"
        );
        (o.status.code(), line)
    };
    let (code, line) = run(&dumps.join("cluster.nft-c.save"));
    assert_eq!(code, Some(0), "{line}");
    assert!(line.contains("match"), "{line}");
    let (code, line) = run(&dumps.join("drifted.nft-c.save"));
    assert_eq!(code, Some(1), "{line}");
    assert!(line.starts_with("drift: 4 errors"), "{line}");
    let dir = tempfile::tempdir().expect("tempdir");
    let garbage = dir.path().join("garbage.save");
    std::fs::write(&garbage, "this is not iptables-save output\n").expect("write");
    let (code, line) = run(&garbage);
    assert_eq!(code, Some(2), "{line}");
    assert!(line.starts_with("unknown: "), "{line}");
}
