//! The fleet at a glance (issue 36), against the in-process fake API server: `status` over
//! 5,000 nodes (their monitor conditions, the agent pods by label, the drifted nodes'
//! `/findings` through the pod proxy, some of which hang or refuse), its exit codes, output
//! forms, colours and hostile answers; `verify --all-nodes` over many nodes with small dumps read
//! through exec (retries, per-node timeouts, Ctrl-C); and `kubectl kproxy status` through the
//! real `kubectl`.
//!
//! `FLEET_NODES` sets the node count of `verify_all_nodes_at_scale` (default 200 in the suite;
//! `scripts/bench-fleet.sh` runs it with 1,000 against the release binary).

use crate::support::fake_apiserver::{
    self as fake, ExecReply, ExecRequest, FakeApiServer, ProxyReply, ProxyRequest,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

/// The binary under test: `KPROXY_BENCH_BIN` (scripts/bench-fleet.sh: the release build), else
/// this build's.
fn bin() -> PathBuf {
    std::env::var_os("KPROXY_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_kubectl-kproxy")))
}

/// Runs `c`; with `FLEET_TIME=FILE` (scripts/bench-fleet.sh) under `/usr/bin/time -v`, whose
/// report goes to FILE.
fn timed(c: &mut std::process::Command) -> Output {
    let Some(report) = std::env::var_os("FLEET_TIME") else {
        return c.output().expect("kubectl-kproxy");
    };
    let mut t = std::process::Command::new("/usr/bin/time");
    t.arg("-v").arg("-o").arg(report).arg(c.get_program());
    t.args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => t.env(k, v),
            None => t.env_remove(k),
        };
    }
    t.output().expect("/usr/bin/time")
}

/// RFC 3339 text of the time `secs` seconds ago.
fn ago(secs: i64) -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(secs))
        .expect("a time")
        .to_string()
}

/// What a node of a fake fleet is like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// True/RulesMatchAPI, fresh, agent running.
    InSync,
    /// True/RulesPending.
    Pending,
    /// False/RulesDrifted; its agent answers `/findings` with the findings of `variant`.
    Drift(u8),
    /// Drifted, and its agent never answers.
    DriftHangs,
    /// Drifted, and nothing listens on its agent's port.
    DriftRefuses,
    /// Drifted, and no agent pod runs on it (anymore).
    DriftNoPod,
    /// Unknown/VerifyFailed.
    Failed,
    /// No condition; an agent pod that is not ready.
    MissingNotReady,
    /// No condition, no agent pod.
    MissingNoPod,
    /// A condition whose heartbeat is 20 minutes old (it still says True).
    Stale,
}

/// Findings a drifted node's agent reports: every variant has the shared KP201; 1 adds KP005;
/// 2 adds a pending KP202 (not drift: not rolled up).
fn findings_of(variant: u8) -> Vec<Value> {
    let f = |id: &str, service: Option<&str>, chain: Option<&str>, message: &str, drift: bool| {
        json!({"id": id, "severity": "error", "service": service, "chain": chain,
               "message": message, "expected": null, "actual": null, "hint": null,
               "since": ago(3600), "pending": !drift, "drift": drift})
    };
    let mut list = vec![f(
        "KP201",
        Some("shop/web:http"),
        Some("KUBE-SVC-67NZLRHBNDSAWJRO"),
        "ready endpoint 10.244.2.10:8080 is not reached from KUBE-SVC-67NZLRHBNDSAWJRO",
        true,
    )];
    if variant == 1 {
        list.push(f(
            "KP005",
            None,
            Some("nat OUTPUT"),
            "nat OUTPUT does not jump to KUBE-SERVICES: traffic from the node itself is not load-balanced",
            true,
        ));
    }
    if variant == 2 {
        list.push(f(
            "KP202",
            Some("shop/cart:http"),
            Some("KUBE-SEP-4SVGLX2C3GCBZZ72"),
            "KUBE-SVC-I5LIAMPLWKMBJ54B forwards to 10.244.1.99:8080, which the API does not list as a usable endpoint",
            false,
        ));
    }
    list
}

/// The monitor's `/findings` document for a drifted node.
fn findings_document(node: &str, variant: u8) -> Value {
    let findings = findings_of(variant);
    let drifted = findings.iter().filter(|f| f["drift"] == true).count();
    json!({"node": node, "mode": "iptables",
           "summary": {"service_ports": 14, "errors": findings.len(), "warnings": 0, "info": 0, "unchecked": 0},
           "findings": findings, "state": "drift", "verified_at": ago(20), "grace_seconds": 36,
           "pending": findings.len() - drifted, "drifted": drifted, "stale": null})
}

/// A fake API server, a directory for the run and a kubeconfig pointing at the server.
struct Fake {
    api: FakeApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

fn name(i: usize) -> String {
    format!("node-{i:04}")
}

/// A fake cluster of nodes of the given kinds (`node-NNNN`), their conditions and agent pods,
/// and agents that answer `/findings` as their kind says.
fn fleet_of(kinds: &[Kind]) -> Fake {
    let api = FakeApiServer::start();
    let mut objects = Vec::with_capacity(kinds.len() * 2);
    for (i, kind) in kinds.iter().enumerate() {
        let node = name(i);
        let fresh = ago(60);
        let condition = match kind {
            Kind::InSync => Some(fake::monitor_condition(
                "True",
                "RulesMatchAPI",
                "0 error(s), 0 warning(s); 0 drifted and 0 pending service port(s), grace 36s",
                &ago(86_400),
                &fresh,
            )),
            Kind::Pending => Some(fake::monitor_condition(
                "True",
                "RulesPending",
                "1 error(s), 0 warning(s); 0 drifted and 1 pending service port(s), grace 36s: KP201 shop/web:http (pending)",
                &ago(86_400),
                &fresh,
            )),
            Kind::Drift(_) | Kind::DriftHangs | Kind::DriftRefuses | Kind::DriftNoPod => {
                Some(fake::monitor_condition(
                    "False",
                    "RulesDrifted",
                    "1 error(s), 0 warning(s); 1 drifted and 0 pending service port(s), grace 36s: KP201 shop/web:http",
                    &ago(7200),
                    &fresh,
                ))
            }
            Kind::Failed => Some(fake::monitor_condition(
                "Unknown",
                "VerifyFailed",
                "kproxy could not verify the node: iptables-nft-save: executable not found",
                &ago(600),
                &fresh,
            )),
            Kind::Stale => Some(fake::monitor_condition(
                "True",
                "RulesMatchAPI",
                "0 error(s), 0 warning(s)",
                &ago(86_400),
                &ago(1200),
            )),
            Kind::MissingNotReady | Kind::MissingNoPod => None,
        };
        objects.push(fake::node_object(
            &node,
            &format!("10.{}.{}.{}", 1 + i / 65_536, (i / 256) % 256, i % 256),
            condition,
        ));
        match kind {
            Kind::MissingNoPod | Kind::DriftNoPod => {}
            Kind::MissingNotReady => {
                let mut pod = fake::agent_pod_object(&node);
                pod["status"] = json!({"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]});
                objects.push(pod);
            }
            _ => objects.push(fake::agent_pod_object(&node)),
        }
    }
    api.load_objects(objects);
    let by_pod: BTreeMap<String, Kind> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| (format!("kproxy-monitor-{}", name(i)), *k))
        .collect();
    api.on_proxy(move |req: &ProxyRequest| {
        assert_eq!(req.path, "/findings", "{req:?}");
        assert_eq!(req.port, "9847", "{req:?}");
        let node = req.pod.trim_start_matches("kproxy-monitor-");
        match by_pod.get(&req.pod) {
            Some(Kind::Drift(v)) => ProxyReply::json(&findings_document(node, *v)),
            Some(Kind::DriftHangs) => ProxyReply::Hang,
            Some(Kind::DriftRefuses) => ProxyReply::Refused,
            // Only drifted nodes are asked.
            other => ProxyReply::text(500, &format!("unexpected /findings of {node}: {other:?}")),
        }
    });
    Fake::around(api)
}

impl Fake {
    fn around(api: FakeApiServer) -> Fake {
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = api.write_kubeconfig(dir.path());
        Fake {
            api,
            dir,
            kubeconfig,
        }
    }

    /// `kubectl-kproxy verify --all-nodes ARGS …`.
    fn all_nodes(&self, args: &[&str]) -> std::process::Command {
        self.command(&[&["verify", "--all-nodes"], args].concat())
    }

    /// `kubectl-kproxy ARGS --kubeconfig …` with a clean environment.
    fn command(&self, args: &[&str]) -> std::process::Command {
        let mut c = std::process::Command::new(bin());
        c.args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path())
            .env("NO_COLOR", "1");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("kubectl-kproxy")
    }

    /// Requests the fake saw whose line contains `needle`.
    fn requests_with(&self, needle: &str) -> Vec<String> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r.contains(needle))
            .collect()
    }
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The 5,000-node fleet of the scale test: kind by index.
fn big_fleet() -> Vec<Kind> {
    let mut kinds = vec![Kind::InSync; 5000];
    let special: &[(usize, Kind)] = &[
        (10, Kind::Drift(1)),
        (1010, Kind::Drift(1)),
        (2010, Kind::Drift(1)),
        (3010, Kind::Drift(0)),
        (3020, Kind::Drift(2)),
        (4010, Kind::Drift(0)),
        (4999, Kind::Drift(0)),
        (80, Kind::DriftHangs),
        (2080, Kind::DriftHangs),
        (100, Kind::DriftRefuses),
        (110, Kind::DriftNoPod),
        (200, Kind::Pending),
        (201, Kind::Pending),
        (2202, Kind::Pending),
        (300, Kind::Failed),
        (3301, Kind::Failed),
        (400, Kind::MissingNotReady),
        (401, Kind::MissingNoPod),
        (4402, Kind::MissingNoPod),
        (500, Kind::Stale),
        (1501, Kind::Stale),
    ];
    for (i, k) in special {
        kinds[*i] = *k;
    }
    kinds
}

/// 5,000 nodes: one paginated `list nodes`, one `list pods` by the DaemonSet's labels, the
/// drifted nodes' agents asked (and no other), the ones that hang or refuse said, identical
/// findings rolled up, every state counted, exit 2 naming the nodes nothing can be said of.
#[test]
fn status_over_five_thousand_nodes() {
    let kinds = big_fleet();
    let f = fleet_of(&kinds);
    let started = Instant::now();
    let out = timed(&mut f.command(&["status", "-o", "json", "--max-concurrency", "4"]));
    let took = started.elapsed();
    eprintln!("status over 5,000 nodes: {took:?}");
    let (_, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "could not tell for some\n{stderr}"
    );
    let doc = json_of(&out);
    assert_eq!(doc["nodes_total"], 5000);
    let summary = &doc["summary"];
    for (state, n) in [
        ("drift", 11),
        ("pending", 3),
        ("failed", 2),
        ("agent_missing", 3),
        ("agent_stale", 2),
        ("unknown", 0),
        ("not_checked", 0),
        ("in_sync", 5000 - 21),
    ] {
        assert_eq!(summary[state], n, "{state}: {summary}");
    }
    let unsure: BTreeSet<&str> = doc["could_not_tell"]
        .as_array()
        .expect("could_not_tell")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let expected: BTreeSet<String> = [300, 3301, 400, 401, 4402, 500, 1501]
        .iter()
        .map(|i| name(*i))
        .collect();
    assert_eq!(
        unsure,
        expected.iter().map(String::as_str).collect::<BTreeSet<_>>()
    );

    // Rolled up: KP201 on the 7 nodes whose agents answered, KP005 on the 3 of variant 1; the
    // pending KP202 is not drift.
    let findings = doc["findings"].as_array().expect("findings");
    assert_eq!(findings.len(), 2, "{findings:#?}");
    assert_eq!(findings[0]["id"], "KP201", "on most nodes first");
    assert_eq!(findings[0]["nodes"], 7);
    assert_eq!(findings[0]["service"], "shop/web:http");
    assert_eq!(
        findings[0]["example_nodes"],
        json!(["node-0010", "node-1010", "node-2010"])
    );
    assert_eq!(findings[1]["id"], "KP005");
    assert_eq!(findings[1]["nodes"], 3);
    assert_eq!(
        findings[1]["example_nodes"],
        json!(["node-0010", "node-1010", "node-2010"])
    );

    let node = |i: usize| -> &Value {
        doc["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|n| n["name"] == name(i))
            .expect("node")
    };
    assert_eq!(node(3020)["findings"]["drifted"], 1);
    assert_eq!(node(3020)["findings"]["pending"], 1);
    let error = |i: usize| {
        node(i)["findings"]["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(error(80).contains("no answer within 3s"), "{}", error(80));
    assert!(
        error(2080).contains("no answer within 3s"),
        "{}",
        error(2080)
    );
    assert!(
        error(100).contains("503") && error(100).contains("connection refused"),
        "{}",
        error(100)
    );
    assert!(error(110).contains("no agent pod"), "{}", error(110));
    assert!(node(10)["findings"]["error"].is_null());
    assert_eq!(node(400)["state"], "agent_missing");
    assert!(
        node(400)["detail"]
            .as_str()
            .is_some_and(|d| d.contains("is Pending, not ready")),
        "{}",
        node(400)
    );
    assert!(
        node(500)["detail"]
            .as_str()
            .is_some_and(|d| d.starts_with("last heartbeat 20m")),
        "{}",
        node(500)
    );
    assert_eq!(node(200)["state"], "pending");
    assert_eq!(node(0)["state"], "in_sync");
    assert!(node(0)["findings"].is_null(), "in-sync nodes are not asked");

    // One paginated list of nodes (500 a page), one list of agent pods, and only the drifted
    // nodes' agents asked, never more than --max-concurrency at once.
    let node_lists = f.requests_with("GET /api/v1/nodes?");
    assert_eq!(node_lists.len(), 10, "{node_lists:#?}");
    assert!(node_lists.iter().all(|r| r.contains("limit=500")));
    let pod_lists = f.requests_with("GET /api/v1/namespaces/kube-system/pods?");
    assert!(
        pod_lists.len() == 10
            && pod_lists
                .iter()
                .all(|r| r.contains("labelSelector=app.kubernetes.io%2Fname%3Dkproxy-monitor")),
        "{pod_lists:#?}"
    );
    let asked: BTreeSet<String> = f
        .requests_with("/proxy/findings")
        .iter()
        .filter_map(|r| {
            r.split("/pods/kproxy-monitor-")
                .nth(1)
                .and_then(|t| t.split(':').next())
                .map(str::to_string)
        })
        .collect();
    let drifted_with_pods: BTreeSet<String> =
        [10, 1010, 2010, 3010, 3020, 4010, 4999, 80, 2080, 100]
            .iter()
            .map(|i| name(*i))
            .collect();
    assert_eq!(asked, drifted_with_pods);
    assert!(f.api.max_concurrent_proxies() <= 4);
    // Generous for a debug build on a busy machine; BENCHMARKS.md has the release figures.
    assert!(took < Duration::from_secs(30), "{took:?}");
}

/// The table: drifted nodes first with their findings rolled up, then the nodes nothing can be
/// said of (why), then pending; in-sync nodes only counted (listed with -o wide).
#[test]
fn status_table_shows_drift_first() {
    let kinds = [
        Kind::InSync,
        Kind::Drift(1),
        Kind::Drift(0),
        Kind::Pending,
        Kind::MissingNoPod,
        Kind::Stale,
        Kind::InSync,
    ];
    let f = fleet_of(&kinds);
    let out = f.run(&["status"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    let pos = |needle: &str| {
        stdout
            .find(needle)
            .unwrap_or_else(|| panic!("{needle:?} not in\n{stdout}"))
    };
    assert!(pos("DRIFT (2)") < pos("FINDINGS ON DRIFTED NODES (2 distinct)"));
    assert!(pos("FINDINGS ON DRIFTED NODES") < pos("COULD NOT TELL (2)"));
    assert!(pos("COULD NOT TELL (2)") < pos("PENDING (1)"));
    assert!(
        !stdout.contains("IN SYNC ("),
        "in sync only counted\n{stdout}"
    );
    let kp201 = stdout
        .lines()
        .find(|l| l.starts_with("KP201"))
        .expect("KP201 row");
    assert!(
        kp201.contains(" 2 ") && kp201.contains("node-0001, node-0002"),
        "{kp201}"
    );
    assert!(stdout.contains("no agent pod (app.kubernetes.io/name=kproxy-monitor in kube-system)"));
    assert!(
        stdout.contains("it last said True RulesMatchAPI"),
        "{stdout}"
    );
    assert!(
        stdout
            .trim_end()
            .ends_with("7 nodes: 2 drift, 1 agent stale, 1 agent missing, 1 pending, 2 in sync"),
        "{stdout}"
    );
    let wide = f.run(&["status", "-o", "wide"]);
    let (stdout, _) = text(&wide);
    assert!(stdout.contains("IN SYNC (2)"), "{stdout}");
    assert!(
        stdout.contains("kube-system/kproxy-monitor-node-0000"),
        "{stdout}"
    );
    assert!(stdout.contains("HEARTBEAT"), "{stdout}");
    let yaml = f.run(&[
        "status",
        "-o",
        "yaml",
        "-l",
        "kubernetes.io/hostname=node-0003",
    ]);
    let (stdout, _) = text(&yaml);
    assert_eq!(yaml.status.code(), Some(0), "{stdout}");
    assert!(stdout.contains("nodes_total: 1"), "{stdout}");
    assert!(stdout.contains("state: pending"), "{stdout}");
}

/// Exit 0 when every node is in sync or pending, 1 with drift, 2 when something cannot be told
/// (which wins over drift).
#[test]
fn status_exit_codes() {
    for (kinds, code) in [
        (vec![Kind::InSync, Kind::InSync], 0),
        (vec![Kind::InSync, Kind::Pending], 0),
        (vec![Kind::InSync, Kind::Drift(0)], 1),
        (vec![Kind::Drift(0), Kind::Failed], 2),
        (vec![Kind::InSync, Kind::MissingNoPod], 2),
        (vec![Kind::InSync, Kind::Stale], 2),
    ] {
        let f = fleet_of(&kinds);
        let out = f.run(&["status", "--no-headers"]);
        let (stdout, stderr) = text(&out);
        assert_eq!(
            out.status.code(),
            Some(code),
            "{kinds:?}\n{stdout}\n{stderr}"
        );
    }
    // --stale-after moves the line: 20 minutes is fresh under 30m.
    let f = fleet_of(&[Kind::Stale]);
    assert_eq!(
        f.run(&["status", "--stale-after", "30m"]).status.code(),
        Some(0)
    );
    // No nodes, and a bad flag, are errors.
    let f = fleet_of(&[Kind::InSync]);
    let out = f.run(&["status", "-l", "nothing=here"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("no nodes match label selector"));
    let out = f.run(&["status", "--agent-timeout", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).1.contains("invalid --agent-timeout"));
}

/// What an agent answers is untrusted: too long, not the monitor's document, control
/// characters meant for the terminal, a 403 from the API server.
#[test]
fn status_reads_agents_defensively() {
    let f = fleet_of(&[Kind::Drift(0), Kind::Drift(0), Kind::Drift(0), Kind::InSync]);
    f.api.on_proxy(|req: &ProxyRequest| match req.pod.as_str() {
        "kproxy-monitor-node-0000" => ProxyReply::text(200, &"x".repeat(9 << 20)),
        "kproxy-monitor-node-0001" => ProxyReply::text(200, "<html>not json</html>"),
        _ => {
            let mut doc = findings_document("node-0002", 0);
            doc["findings"][0]["message"] = json!("evil \u{1b}[2J message");
            ProxyReply::json(&doc)
        }
    });
    let out = f.run(&["status", "-o", "wide"]);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(stdout.contains("longer than 8388608 bytes"), "{stdout}");
    assert!(
        stdout.contains("not the monitor's /findings document"),
        "{stdout}"
    );
    assert!(!stdout.contains('\u{1b}'), "no escape reaches the terminal");
    assert!(stdout.contains(r"evil \u{1b}[2J message"), "{stdout}");
    // The same in JSON keeps the text as it came (JSON escapes it).
    let doc = json_of(&f.run(&["status", "-o", "json"]));
    assert_eq!(doc["findings"][0]["message"], "evil \u{1b}[2J message");

    f.api.fail(Some("GET"), "/proxy/", 403);
    let out = f.run(&["status", "-o", "json"]);
    let doc = json_of(&out);
    let err = doc["nodes"][2]["findings"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        err.contains("forbidden (403)") && err.contains("\"pods/proxy\""),
        "{err}"
    );

    // The agent pods not listed: the conditions still tell the states, and each drifted
    // node says why its findings are missing.
    f.api
        .fail(Some("GET"), "/namespaces/kube-system/pods?", 403);
    let out = f.run(&["status", "-o", "json"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("could not list the agent pods (forbidden (403)"),
        "{stderr}"
    );
    let doc = json_of(&out);
    let err = doc["nodes"][0]["findings"]["error"]
        .as_str()
        .unwrap_or_default();
    assert!(
        err.starts_with("the agent pods could not be listed: forbidden (403)"),
        "{err}"
    );
    assert_eq!(doc["warnings"].as_array().map(Vec::len), Some(1));
}

/// Colours and the progress indicator only on a terminal, never with NO_COLOR; piped output
/// is plain.
#[test]
fn status_colours_only_on_a_terminal() {
    if crate::live::which("script").is_none() {
        crate::support::skip("fleet", "util-linux `script` not installed");
        return;
    }
    let f = fleet_of(&[Kind::InSync, Kind::Drift(0)]);
    let plain = f.run(&["status"]);
    assert!(!text(&plain).0.contains('\u{1b}'));
    let bin = env!("CARGO_BIN_EXE_kubectl-kproxy");
    let cmd = format!("{bin} status --kubeconfig {}", f.kubeconfig.display());
    let on_tty = |no_color: Option<&str>| {
        let mut c = std::process::Command::new("script");
        c.args(["-qec", &cmd, "/dev/null"])
            .env("HOME", f.dir.path())
            .env_remove("KUBECONFIG")
            .env_remove("NO_COLOR");
        if let Some(v) = no_color {
            c.env("NO_COLOR", v);
        }
        let out = c.output().expect("script");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let coloured = on_tty(None);
    assert!(coloured.contains("\u{1b}["), "{coloured:?}");
    assert!(coloured.contains("DRIFT (1)"));
    let uncoloured = on_tty(Some("1"));
    assert!(uncoloured.contains("DRIFT (1)"));
    assert!(!uncoloured.contains("\u{1b}[3"), "{uncoloured:?}");
}

/// `kubectl kproxy status` through the real kubectl, with a kubeconfig pointing at the fake.
#[test]
fn kubectl_kproxy_status() {
    let Some(kubectl) = crate::live::which("kubectl") else {
        crate::support::skip("fleet", "kubectl not installed");
        return;
    };
    let f = fleet_of(&[Kind::InSync, Kind::Drift(1), Kind::Pending]);
    let bin_dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_kubectl-kproxy"),
        bin_dir.path().join("kubectl-kproxy"),
    )
    .expect("symlink");
    let path = format!(
        "{}:{}",
        bin_dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(kubectl)
        .args(["kproxy", "status", "--kubeconfig"])
        .arg(&f.kubeconfig)
        .env("PATH", path)
        .env("HOME", f.dir.path())
        .env_remove("KUBECONFIG")
        .output()
        .expect("kubectl");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("DRIFT (1)") && stdout.contains("KP005"),
        "{stdout}"
    );
    assert!(
        stdout.contains("3 nodes: 1 drift, 1 pending, 1 in sync"),
        "{stdout}"
    );
}

// ---------------------------------------------------------------------------------------------
// verify --all-nodes

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// What `render` writes for `node` of the state file.
fn render(state: &Path, node: &str) -> String {
    let out = crate::support::kproxy()
        .args([
            "render",
            "--with-base-jumps",
            "--kube-proxy-version",
            "1.33",
            "--config",
        ])
        .arg(repo("testdata/cluster/config.yaml"))
        .arg("--state")
        .arg(state)
        .args(["--node", node])
        .output()
        .expect("render");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// The example cluster (testdata/cluster) plus `n` nodes of our own with a kube-proxy pod each,
/// whose `iptables-save` is what kube-proxy 1.33 writes on any of them (they have no local
/// endpoint, so all render alike); the `drifted` ones lack one rule of shop/web.
fn verify_fleet(n: usize, drifted: &[usize]) -> Fake {
    let f = Fake::around(FakeApiServer::start());
    let text = std::fs::read_to_string(repo("testdata/cluster/state.json")).expect("state.json");
    let cluster: Value = serde_json::from_str(&text).expect("JSON");
    let mut items = cluster["items"].as_array().cloned().expect("items");
    let nodes: Vec<Value> = (0..n)
        .map(|i| fake::node_object(&name(i), &format!("10.9.{}.{}", i / 250, 1 + i % 250), None))
        .collect();
    items.extend(nodes.iter().cloned());
    let state = f.dir.path().join("state.json");
    std::fs::write(
        &state,
        serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items}))
            .expect("JSON"),
    )
    .expect("write state");
    let rules = render(&state, &name(0));
    assert_eq!(rules, render(&state, &name(n - 1)), "nodes render alike");
    let drift_line = rules
        .lines()
        .find(|l| l.starts_with("-A KUBE-SVC-") && l.contains("shop/web:http -> 10.244.2.10"))
        .expect("a rule of shop/web")
        .to_string();
    let drifted_rules = rules.replace(&format!("{drift_line}\n"), "");
    let api = &f.api;
    api.load_objects(cluster["items"].as_array().cloned().expect("items"));
    let mut objects = nodes;
    for i in 0..n {
        let node = name(i);
        objects.push(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("kube-proxy-{node}"), "namespace": "kube-system",
                         "labels": {"k8s-app": "kube-proxy"}},
            "spec": {"nodeName": node, "containers": [{"name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.33.0"}]},
            "status": {"phase": "Running"},
        }));
    }
    api.load_objects(objects);
    api.add_configmap(
        "kube-system",
        "kube-proxy",
        &[(
            "config.conf",
            &std::fs::read_to_string(repo("testdata/cluster/config.yaml")).expect("config"),
        )],
    );
    let drifted: BTreeSet<String> = drifted
        .iter()
        .map(|i| format!("kube-proxy-{}", name(*i)))
        .collect();
    api.on_exec(
        move |req: &ExecRequest| match req.command.first().map(String::as_str) {
            Some("iptables-save") if drifted.contains(&req.pod) => {
                ExecReply::ok(drifted_rules.clone())
            }
            Some("iptables-save") => ExecReply::ok(rules.clone()),
            Some("ipset") => ExecReply::ok(""),
            _ => ExecReply::Missing,
        },
    );
    f
}

/// `verify --all-nodes` over `FLEET_NODES` nodes (default 200): the state read once, every node
/// through its kube-proxy pod, the drifted ones' identical findings rolled up, a node whose pod
/// list fails once read on the second attempt, a node with no kube-proxy pod failed (exit 2).
#[test]
fn verify_all_nodes_at_scale() {
    let n: usize = std::env::var("FLEET_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let drifted = [3, n / 2, n - 1];
    let f = verify_fleet(n, &drifted);
    f.api.delete_object(
        "Pod",
        Some("kube-system"),
        &format!("kube-proxy-{}", name(7)),
    );
    // 500: kube's client retries 503 itself, and never says so.
    f.api
        .fail_times(Some("GET"), &format!("spec.nodeName%3D{}", name(5)), 500, 1);
    let started = Instant::now();
    let out = timed(&mut f.all_nodes(&["-o", "json"]));
    let took = started.elapsed();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let doc = json_of(&out);
    // The example cluster's own nodes (node-1, node-2) have no kube-proxy pod here.
    let total = n + 2;
    assert_eq!(doc["nodes_total"], total);
    assert_eq!(doc["summary"]["drift"], drifted.len());
    assert_eq!(doc["summary"]["failed"], 3, "{}", doc["could_not_tell"]);
    assert_eq!(doc["summary"]["in_sync"], total - drifted.len() - 3);
    assert_eq!(doc["interrupted"], false);
    let findings = doc["findings"].as_array().expect("findings");
    assert_eq!(findings.len(), 1, "{findings:#?}");
    assert_eq!(findings[0]["id"], "KP201");
    assert_eq!(findings[0]["nodes"], drifted.len());
    let node = |name: &str| -> Value {
        doc["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .expect("node")
    };
    let retried = node(&name(5));
    assert_eq!(retried["state"], "in_sync", "{retried}");
    assert_eq!(retried["attempts"], 2, "{retried}");
    let broken = node(&name(7));
    assert_eq!(broken["state"], "failed");
    assert_eq!(broken["attempts"], 1, "a missing pod is not retried");
    assert!(
        broken["error"]
            .as_str()
            .is_some_and(|e| e.contains("no kube-proxy pod")),
        "{broken}"
    );
    assert!(f.api.max_concurrent_execs() <= 8, "the default concurrency");
    // The API state is read once, not per node.
    assert_eq!(
        f.api
            .requests()
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/services?"))
            .count(),
        1
    );
    eprintln!("verify --all-nodes over {total} nodes: {took:?}");
}

/// A node whose reads hang is given up after --node-timeout, tried --retries more times, and
/// failed; the others are verified meanwhile.
#[test]
fn verify_all_nodes_node_timeout_and_retries() {
    let f = verify_fleet(6, &[]);
    let hang = format!("kube-proxy-{}", name(2));
    let rules = render(&f.dir.path().join("state.json"), &name(0));
    f.api.on_exec(
        move |req: &ExecRequest| match req.command.first().map(String::as_str) {
            _ if req.pod == hang => ExecReply::Hang,
            Some("iptables-save") => ExecReply::ok(rules.clone()),
            Some("ipset") => ExecReply::ok(""),
            _ => ExecReply::Missing,
        },
    );
    // The example cluster's nodes (which have a zone, and no kube-proxy pod here) left out.
    let out = f.run(&[
        "verify",
        "--all-nodes",
        "-o",
        "json",
        "--node-timeout",
        "1s",
        "--retries",
        "1",
        "-l",
        "!topology.kubernetes.io/zone",
    ]);
    let doc = json_of(&out);
    assert_eq!(out.status.code(), Some(2));
    let rows = doc["nodes"].as_array().expect("nodes");
    let hung = rows.iter().find(|r| r["name"] == name(2)).expect("row");
    assert_eq!(hung["state"], "failed");
    assert_eq!(hung["attempts"], 2, "{hung}");
    assert!(
        hung["error"]
            .as_str()
            .is_some_and(|e| e.contains("--node-timeout 1s")),
        "{hung}"
    );
    assert_eq!(doc["summary"]["in_sync"], 5, "{doc:#}");
    assert_eq!(doc["nodes_total"], 6);
}

/// Ctrl-C stops the run: what was verified is printed, the rest as not checked, exit 2.
#[test]
fn verify_all_nodes_ctrl_c_prints_what_was_verified() {
    let f = verify_fleet(40, &[1]);
    f.api.set_exec_delay(Duration::from_millis(150));
    let child = f
        .all_nodes(&["--parallel", "2"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let started = Instant::now();
    while f.api.execs().len() < 30 && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stderr.contains("interrupted: "), "{stderr}");
    assert!(stdout.contains("NOT CHECKED ("), "{stdout}");
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("42 nodes: ") && last.contains(" not checked"),
        "{last}"
    );
    assert!(started.elapsed() < Duration::from_secs(60));
}

// ---------------------------------------------------------------------------------------------
// The monitor's contract, end to end

/// A real monitor (API mode, real netfilter in a namespace) and `status` reading what it
/// published: in sync, then an API change left unprogrammed is pending inside the grace (the
/// condition True with reason RulesPending: exit 0), then drift past it (False: exit 1) with the
/// findings the monitor serves on `/findings`, fetched through the pod proxy and rolled up.
#[test]
fn status_reads_what_the_monitor_publishes() {
    use crate::monitor_api::{add_web_endpoint, condition, setup, start, until};
    let Some(s) = setup("fleetmon", None) else {
        return;
    };
    let mon = start(&s, "8s", &[]);
    until(&mon, "condition True", Duration::from_secs(15), || {
        condition(&s.api).is_some_and(|c| c["status"] == "True")
    });
    s.api.add_objects([fake::agent_pod_object("node-1")]);
    let port = mon.port;
    s.api.on_proxy(
        move |req: &ProxyRequest| match crate::monitor::http_get(port, &req.path) {
            Some((status, body)) => ProxyReply::Answer {
                status,
                content_type: "application/json",
                body,
            },
            None => ProxyReply::Refused,
        },
    );
    let status = || {
        let out = crate::support::kproxy()
            .args([
                "status",
                "-o",
                "json",
                "-l",
                "kubernetes.io/hostname=node-1",
            ])
            .arg("--kubeconfig")
            .arg(&s.kubeconfig)
            .env_remove("KUBECONFIG")
            .env("HOME", s.dir.path())
            .output()
            .expect("status");
        (out.status.code(), json_of(&out))
    };
    let (code, doc) = status();
    assert_eq!(code, Some(0), "{doc:#}");
    assert_eq!(doc["nodes"][0]["state"], "in_sync", "{doc:#}");

    add_web_endpoint(&s.api, "10.244.1.13");
    until(
        &mon,
        "condition RulesPending",
        Duration::from_secs(8),
        || {
            condition(&s.api)
                .is_some_and(|c| c["status"] == "True" && c["reason"] == "RulesPending")
        },
    );
    let (code, doc) = status();
    assert_eq!(code, Some(0), "pending is no drift\n{doc:#}");
    assert_eq!(doc["nodes"][0]["state"], "pending", "{doc:#}");

    until(&mon, "condition False", Duration::from_secs(25), || {
        condition(&s.api).is_some_and(|c| c["status"] == "False" && c["reason"] == "RulesDrifted")
    });
    let (code, doc) = status();
    assert_eq!(code, Some(1), "{doc:#}\n{}", mon.log());
    let node = &doc["nodes"][0];
    assert_eq!(node["state"], "drift", "{doc:#}");
    assert!(node["findings"]["error"].is_null(), "{doc:#}");
    assert!(node["findings"]["drifted"].as_u64() >= Some(1), "{doc:#}");
    let findings = doc["findings"].as_array().expect("findings");
    assert!(
        findings
            .iter()
            .any(|f| f["service"] == "shop/web:http" && f["example_nodes"] == json!(["node-1"])),
        "{doc:#}"
    );
}
