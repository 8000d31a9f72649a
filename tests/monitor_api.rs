//! `monitor` against the API (the in-process fake apiserver's watches) with real netfilter in a
//! network namespace: an API change the stand-in kube-proxy (the test, writing `render`'s
//! rules) applies within the grace is no drift and one programming-latency observation; the same
//! kind of change left unapplied becomes drift after the grace, with a `KubeProxyRulesDrift`
//! Event on the Node and the node condition `KubeProxyRulesInSync` False, and both clear when
//! the stand-in catches up. The API answering 503 for a while fails the runs, `/readyz` says
//! why, and the agent recovers by itself; the client's bounded retry gives up after its retries. With `--repair=when-kube-proxy-down`, drift is repaired
//! while nothing answers kube-proxy's `/healthz`, and left alone while it answers healthy.

use crate::monitor::{Monitor, http_get, sample};
use crate::support::fake_apiserver::FakeApiServer;
use crate::support::netns::{Backend, Netns, require_root_and_tools};
use crate::support::repair::cluster_file;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

const SLACK: Duration = Duration::from_secs(10);

/// The example cluster's objects.
fn cluster_objects() -> Vec<Value> {
    let text = std::fs::read_to_string(cluster_file("state.json")).expect("state.json");
    let list: Value = serde_json::from_str(&text).expect("state.json is JSON");
    list["items"].as_array().cloned().expect("items")
}

/// What the API holds now, as a `--state` file for `render`.
fn write_state(api: &FakeApiServer, objects: &[Value], path: &Path) {
    let now: Vec<Value> = objects
        .iter()
        .filter_map(|o| {
            let ns = o["metadata"]["namespace"].as_str();
            let kind = o["kind"].as_str()?;
            let name = o["metadata"]["name"].as_str()?;
            api.object(kind, ns, name)
        })
        .collect();
    std::fs::write(
        path,
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": now}))
            .expect("json"),
    )
    .expect("write state");
}

/// The stand-in kube-proxy, iptables mode with the nf_tables backend.
fn program(ns: &Netns, state: &Path, config: &Path) {
    crate::monitor::program(ns, Some(Backend::Nft), state, config);
}

/// shop/web's slice with one more ready endpoint on node-1.
pub(crate) fn add_web_endpoint(api: &FakeApiServer, ip: &str) {
    let mut slice = api
        .object("EndpointSlice", Some("shop"), "web-b8d4f")
        .expect("web slice");
    let mut e = slice["endpoints"][0].clone();
    e["addresses"] = json!([ip]);
    e["targetRef"]["name"] = json!(format!("web-{ip}"));
    slice["endpoints"]
        .as_array_mut()
        .expect("endpoints")
        .push(e);
    api.update_object(slice);
}

pub(crate) fn condition(api: &FakeApiServer) -> Option<Value> {
    let node = api.object("Node", None, "node-1")?;
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "KubeProxyRulesInSync")
        .cloned()
}

fn events_with(api: &FakeApiServer, reason: &str) -> Vec<Value> {
    api.events()
        .into_iter()
        .filter(|e| e["reason"] == reason)
        .collect()
}

/// Polls `ok` until it holds; panics with the monitor's log after `within`.
pub(crate) fn until(mon: &Monitor, what: &str, within: Duration, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(
            start.elapsed() < within,
            "{what}: not within {within:?}\n--- metrics ---\n{}\n--- log ---\n{}",
            mon.metrics(),
            mon.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub(crate) struct Setup {
    pub(crate) api: FakeApiServer,
    objects: Vec<Value>,
    ns: Netns,
    pub(crate) dir: tempfile::TempDir,
    state: std::path::PathBuf,
    config: std::path::PathBuf,
    pub(crate) kubeconfig: std::path::PathBuf,
}

/// The fake API with the example cluster and kube-proxy's ConfigMap, a namespace with its
/// rules; `None` when the test cannot run here.
pub(crate) fn setup(prefix: &str, healthz: Option<&str>) -> Option<Setup> {
    if !require_root_and_tools(&Backend::Nft.tools()) {
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mut config_text =
        std::fs::read_to_string(cluster_file("config.yaml")).expect("config.yaml");
    if let Some(addr) = healthz {
        let line = config_text
            .lines()
            .find(|l| l.starts_with("healthzBindAddress:"))
            .map(str::to_string);
        config_text = match line {
            Some(l) => config_text.replace(&l, &format!("healthzBindAddress: {addr}")),
            None => format!("{config_text}healthzBindAddress: {addr}\n"),
        };
    }
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, &config_text).expect("write config");
    let api = FakeApiServer::start();
    let objects = cluster_objects();
    api.add_objects(objects.clone());
    api.add_configmap(
        "kube-system",
        "kube-proxy",
        &[("config.conf", &config_text)],
    );
    let kubeconfig = api.write_kubeconfig(dir.path());
    let state = dir.path().join("state.json");
    write_state(&api, &objects, &state);
    let ns = Netns::new(prefix).expect("netns");
    program(&ns, &state, &config);
    Some(Setup {
        api,
        objects,
        ns,
        dir,
        state,
        config,
        kubeconfig,
    })
}

pub(crate) fn start(s: &Setup, grace: &str, extra: &[&str]) -> Monitor {
    let mut args = vec![
        "--kubeconfig",
        s.kubeconfig.to_str().expect("utf-8"),
        "--node",
        "node-1",
        "--interval",
        "1s",
        "--grace",
        grace,
        "--netns",
        s.ns.name(),
        "--backend",
        "nft",
        "--nfacct",
        "none",
    ];
    args.extend(extra);
    Monitor::start(s.dir.path(), &args, &[])
}

fn in_sync(m: &str) -> Option<f64> {
    sample(m, "kproxy_node_in_sync")
}

#[test]
fn api_changes_lag_drift_events_and_condition() {
    let Some(s) = setup("monapi", None) else {
        return;
    };
    let mut mon = start(&s, "5s", &[]);
    mon.wait("in sync at start", SLACK, |m| in_sync(m) == Some(1.0));
    until(&mon, "condition True", SLACK, || {
        condition(&s.api).is_some_and(|c| c["status"] == "True")
    });
    assert!(
        events_with(&s.api, "KubeProxyRulesDrift").is_empty(),
        "{:#?}",
        s.api.events()
    );

    // An API change the stand-in programs 1.5 s later: no drift, one latency observation.
    add_web_endpoint(&s.api, "10.244.1.12");
    write_state(&s.api, &s.objects, &s.state);
    let lowest = crate::monitor::lowest_in_sync_while(
        &mon,
        Duration::from_secs(5),
        Duration::from_millis(1500),
        || program(&s.ns, &s.state, &s.config),
    );
    let m = mon.wait("one latency observation", SLACK, |m| {
        sample(m, "kproxy_programming_latency_seconds_count") == Some(1.0)
    });
    assert_eq!(lowest, 1.0, "lag inside the grace reported as drift:\n{m}");
    let sum = sample(&m, "kproxy_programming_latency_seconds_sum").expect("sum");
    assert!((1.0..5.0).contains(&sum), "latency {sum} s\n{}", mon.log());
    assert!(events_with(&s.api, "KubeProxyRulesDrift").is_empty());

    // The same change with the stand-in stopped: drift after the grace, an Event, the
    // condition False.
    add_web_endpoint(&s.api, "10.244.1.13");
    let changed = Instant::now();
    mon.wait("drift", Duration::from_secs(5) + SLACK, |m| {
        crate::monitor::drifted(m)
    });
    assert!(
        changed.elapsed() >= Duration::from_secs(5),
        "drift inside the grace"
    );
    until(&mon, "a KubeProxyRulesDrift Event", SLACK, || {
        !events_with(&s.api, "KubeProxyRulesDrift").is_empty()
    });
    let ev = &events_with(&s.api, "KubeProxyRulesDrift")[0];
    assert_eq!(ev["type"], "Warning", "{ev:#}");
    assert_eq!(ev["regarding"]["kind"], "Node", "{ev:#}");
    assert_eq!(ev["regarding"]["name"], "node-1", "{ev:#}");
    assert!(
        ev["note"]
            .as_str()
            .is_some_and(|n| n.contains("shop/web:http")),
        "{ev:#}"
    );
    until(&mon, "condition False", SLACK, || {
        condition(&s.api).is_some_and(|c| c["status"] == "False" && c["reason"] == "RulesDrifted")
    });
    // Deduplicated: the drift lasts, one Event.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(events_with(&s.api, "KubeProxyRulesDrift").len(), 1);

    // The stand-in catches up: in sync, a KubeProxyRulesInSync Event, the condition True.
    write_state(&s.api, &s.objects, &s.state);
    program(&s.ns, &s.state, &s.config);
    mon.wait("in sync again", SLACK, |m| in_sync(m) == Some(1.0));
    until(
        &mon,
        "a KubeProxyRulesInSync Event and condition True",
        SLACK,
        || {
            !events_with(&s.api, "KubeProxyRulesInSync").is_empty()
                && condition(&s.api).is_some_and(|c| c["status"] == "True")
        },
    );
    let c = condition(&s.api).expect("condition");
    assert!(
        c["lastTransitionTime"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{c}"
    );

    // The API unreachable for a while: failed runs, /readyz says why, never in sync; then
    // the watches recover by themselves.
    let failed = |m: &str| sample(m, "kproxy_verify_runs_total{result=\"failed\"}").unwrap_or(0.0);
    // 503, as an overloaded or restarting API server answers: kube's own client would retry
    // it for minutes without a word while the watches keep their old content; the monitor's
    // bounded retry lets the failure through within seconds.
    s.api.fail(None, "/", 503);
    s.api.outage(|_| {});
    let m = mon.wait("failed runs while the API is down", SLACK, |m| {
        failed(m) >= 1.0 && in_sync(m) == Some(0.0)
    });
    assert_eq!(sample(&m, "kproxy_verify_failing"), Some(1.0), "{m}");
    let (status, why) = http_get(mon.port, "/readyz").expect("/readyz");
    assert_eq!(status, 503, "{why}");
    assert!(
        why.contains("the API state may be stale: watch of"),
        "{why}"
    );
    s.api.clear_faults();
    mon.wait(
        "in sync after the API is back",
        Duration::from_secs(40),
        |m| in_sync(m) == Some(1.0),
    );
    assert!(mon.running(), "{}", mon.log());
}

/// A loopback listener answering every request with `status` (a stand-in for kube-proxy's
/// `/healthz`); stops with the process.
fn healthz_server(status: &'static str) -> u16 {
    use std::io::{Read, Write};
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = c.read(&mut buf);
            let _ = write!(c, "HTTP/1.1 {status}\r\nContent-Length: 2\r\n\r\n{{}}");
        }
    });
    port
}

/// `--repair=when-kube-proxy-down`: left alone while kube-proxy's /healthz answers 200;
/// repaired (backed up, verified) once nothing answers it.
#[test]
fn repair_only_while_kube_proxy_is_down() {
    let port = healthz_server("200 OK");
    let healthz = format!("127.0.0.1:{port}");
    let Some(s) = setup("monrep", Some(&healthz)) else {
        return;
    };
    let backups = s.dir.path().join("backups");
    let repairing = [
        "--repair",
        "when-kube-proxy-down",
        "--backup-dir",
        backups.to_str().expect("utf-8"),
    ];
    let mon = start(&s, "2s", &repairing);
    mon.wait("in sync at start", SLACK, |m| in_sync(m) == Some(1.0));
    // Drift while kube-proxy answers healthy: reported, not repaired.
    add_web_endpoint(&s.api, "10.244.1.14");
    let m = mon.wait(
        "drift and a skipped repair",
        Duration::from_secs(2) + SLACK,
        |m| {
            crate::monitor::drifted(m)
                && sample(m, "kproxy_repairs_total{result=\"skipped\"}").unwrap_or(0.0) >= 1.0
        },
    );
    assert_eq!(
        sample(&m, "kproxy_repairs_total{result=\"applied\"}"),
        None,
        "{m}"
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        in_sync(&mon.metrics()),
        Some(0.0),
        "repaired next to a healthy kube-proxy"
    );
    assert!(mon.log().contains("not repairing"), "{}", mon.log());
    assert!(
        !backups.exists(),
        "a backup was written: nothing may have been applied"
    );
    drop(mon);

    // kube-proxy down: nothing answers its /healthz.
    let down = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let down_addr = down.local_addr().expect("addr").to_string();
    drop(down);
    let text = std::fs::read_to_string(&s.config).expect("config");
    let down_config = text.replace(&healthz, &down_addr);
    s.api.add_configmap(
        "kube-system",
        "kube-proxy",
        &[("config.conf", &down_config)],
    );
    let mut mon = start(&s, "2s", &repairing);
    let m = mon.wait(
        "repaired while kube-proxy is down",
        Duration::from_secs(4) + SLACK,
        |m| {
            sample(m, "kproxy_repairs_total{result=\"applied\"}").unwrap_or(0.0) >= 1.0
                && in_sync(m) == Some(1.0)
        },
    );
    assert_eq!(sample(&m, "kproxy_verify_failing"), Some(0.0), "{m}");
    assert!(
        std::fs::read_dir(&backups).is_ok_and(|mut d| d.next().is_some()),
        "the repair kept no backup"
    );
    assert!(mon.running(), "{}", mon.log());
}

/// `kube_client::Retry::Bounded`: a request the API answers 503 is sent `retries + 1` times and
/// then fails, within the waits' bound; kube's own policy would still be retrying.
#[test]
fn bounded_retry_gives_up_after_its_retries() {
    use kproxy::kube_client::{ClientOptions, Retry, connect};
    let api = FakeApiServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    api.fail(None, "/api/v1/services", 503);
    let options = ClientOptions {
        kubeconfig: Some(kubeconfig),
        request_timeout: "0".into(),
        retry: Retry::Bounded {
            retries: 2,
            first: Duration::from_millis(50),
            longest: Duration::from_millis(200),
        },
        ..ClientOptions::default()
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let started = Instant::now();
    let result = rt.block_on(async {
        let conn = connect(&options).await.expect("connect");
        let services: kube::Api<k8s_openapi::api::core::v1::Service> =
            kube::Api::all(conn.client.clone());
        tokio::time::timeout(
            Duration::from_secs(20),
            services.list(&kube::api::ListParams::default()),
        )
        .await
    });
    let took = started.elapsed();
    let answer = result.expect("the bounded retry gave up within 20 s");
    match answer {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 503, "{status:?}"),
        other => panic!("expected the 503 to reach the caller, got {other:?}"),
    }
    let sent = api
        .requests()
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/services"))
        .count();
    assert_eq!(sent, 3, "one request and two retries: {:?}", api.requests());
    // Two waits of at most 200 ms each, jitter included (tower's jitter at most doubles one).
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// Verifies run so far (every result).
fn verify_runs(m: &str) -> f64 {
    ["clean", "drift", "failed"]
        .iter()
        .filter_map(|r| sample(m, &format!("kproxy_verify_runs_total{{result=\"{r}\"}}")))
        .sum()
}

/// With a long interval, only what can change the node's rules makes a verify: another
/// node's status updates (heartbeats) do not; an EndpointSlice change does.
#[test]
fn only_changes_that_touch_the_node_are_verified() {
    let Some(s) = setup("monfp", None) else {
        return;
    };
    let mut args = vec![
        "--kubeconfig",
        s.kubeconfig.to_str().expect("utf-8"),
        "--node",
        "node-1",
        "--interval",
        "10m",
        "--grace",
        "5s",
        "--netns",
        s.ns.name(),
        "--backend",
        "nft",
        "--nfacct",
        "none",
    ];
    args.extend(["--node-condition", "false"]);
    let mon = Monitor::start(s.dir.path(), &args, &[]);
    let m = mon.wait("in sync", SLACK, |m| in_sync(m) == Some(1.0));
    let runs = verify_runs(&m);
    for beat in 0..5 {
        let mut node = s.api.object("Node", None, "node-2").expect("node-2");
        node["status"]["conditions"] = json!([{
            "type": "Ready", "status": "True",
            "lastHeartbeatTime": format!("2026-01-01T00:00:0{beat}Z"),
        }]);
        s.api.update_object(node);
        std::thread::sleep(Duration::from_millis(300));
    }
    std::thread::sleep(Duration::from_secs(1));
    let m = mon.metrics();
    assert_eq!(
        verify_runs(&m),
        runs,
        "another node's heartbeats made verifies:\n{m}"
    );
    add_web_endpoint(&s.api, "10.244.1.15");
    mon.wait("a verify after a slice changed", SLACK, |m| {
        verify_runs(m) > runs
    });
}
