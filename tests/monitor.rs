//! `monitor` on the real kernel: the acceptance runs of issue #35 in fresh network namespaces
//! whose rules `render` wrote (iptables with both backends, nftables): `kproxy_node_in_sync 1`;
//! one KUBE-SEP rule (one endpoint chain's rule) deleted with `iptables` (`nft`) makes it 0 and
//! `kproxy_findings{severity="error",…}` > 0 within interval + grace; `repair --local --apply`
//! brings it back to 1; `promtool check metrics` accepts `/metrics`, and a real Prometheus
//! scraping the monitor sees the same through PromQL. Also: a change applied within the grace is
//! no drift and one programming-latency observation; bad inputs (tools missing, a read that
//! times out, a torn state file) count as failed runs, `/readyz` says why, and the agent keeps
//! running without ever saying "in sync" from them.

use crate::support::netns::{Backend, Netns, require_root_and_tools};
use crate::support::repair::{cluster_file, config_in_mode};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a state may take to show, beyond interval + grace (a verify of the example node
/// takes ~0.1 s; the machine is shared with parallel builds and tests).
const SLACK: Duration = Duration::from_secs(8);

/// A free loopback port.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One HTTP/1.0 GET on loopback: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// The value of the sample `series` (name and labels as printed, e.g.
/// `kproxy_verify_runs_total{result="failed"}`) in metrics text; a bare name also matches
/// the first series of that name whose labels include none given.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == series).then(|| value.parse().ok())?
        })
}

/// The sum of every series of `name` whose labels contain `label` (e.g. `severity="error"`).
pub fn sum_of(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// A running `monitor`, killed when dropped; its stderr goes to a file shown on failure.
pub struct Monitor {
    child: Child,
    /// The port of its endpoints.
    pub port: u16,
    log: PathBuf,
}

impl Monitor {
    /// Starts `kubectl-kproxy monitor ARGS --listen 127.0.0.1:PORT`.
    pub fn start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Monitor {
        let port = free_port();
        let log = dir.join(format!("monitor-{port}.log"));
        let mut cmd = crate::support::kproxy();
        cmd.arg("monitor")
            .args(args)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("start monitor");
        Monitor { child, port, log }
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/metrics` now ("" while it does not answer).
    pub fn metrics(&self) -> String {
        http_get(self.port, "/metrics")
            .map(|(_, b)| b)
            .unwrap_or_default()
    }

    /// Polls `/metrics` until `ok` holds of it; panics with the log after `within`.
    pub fn wait(&self, what: &str, within: Duration, ok: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let m = self.metrics();
            if ok(&m) {
                return m;
            }
            assert!(
                start.elapsed() < within,
                "{what}: not within {within:?}\n--- metrics ---\n{m}\n--- log ---\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Whether the process still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kubectl-kproxy ARGS…`, which must exit 0: its stdout.
fn kproxy_ok(args: &[&str]) -> String {
    let o = crate::support::kproxy()
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run kubectl-kproxy");
    assert!(
        o.status.success(),
        "kubectl-kproxy {}: {}\n{}",
        args.join(" "),
        String::from_utf8_lossy(&o.stderr),
        String::from_utf8_lossy(&o.stdout)
    );
    String::from_utf8(o.stdout).expect("utf-8")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `render` of `state` for node-1 in `mode`, one family (`4`, `6`).
fn render(state: &Path, config: &Path, mode: &str, family: &str) -> String {
    let mut args = vec![
        "render",
        "--state",
        path_str(state),
        "--config",
        path_str(config),
        "--node",
        "node-1",
        "--mode",
        mode,
        "--ip-family",
        family,
        "--nfacct",
        "none",
    ];
    if mode == "iptables" {
        args.push("--with-base-jumps");
    }
    kproxy_ok(&args)
}

/// The stand-in kube-proxy: writes `state`'s rules into the namespace (both families; iptables
/// mode with `backend`, else nftables mode).
pub fn program(ns: &Netns, backend: Option<Backend>, state: &Path, config: &Path) {
    match backend {
        Some(b) => {
            let mode = "iptables";
            ns.restore(b, &render(state, config, mode, "4"), false)
                .expect("restore v4");
            ns.restore6(b, &render(state, config, mode, "6"), false)
                .expect("restore v6");
        }
        None => {
            ns.nft_load(&render(state, config, "nftables", "4"))
                .expect("load ip table");
            ns.nft_load(&render(state, config, "nftables", "6"))
                .expect("load ip6 table");
        }
    }
}

/// The monitor's arguments for node-1 of `state` in namespace `ns`.
fn monitor_args<'a>(
    ns: &'a Netns,
    state: &'a Path,
    config: &'a Path,
    backend: Option<Backend>,
    grace: &'a str,
) -> Vec<&'a str> {
    let mut args = vec![
        "--state",
        path_str(state),
        "--config",
        path_str(config),
        "--node",
        "node-1",
        "--interval",
        "1s",
        "--grace",
        grace,
        "--netns",
        ns.name(),
        "--nfacct",
        "none",
    ];
    if let Some(b) = backend {
        args.extend(["--backend", b.name()]);
    }
    args
}

fn in_sync(m: &str) -> Option<f64> {
    sample(m, "kproxy_node_in_sync")
}

/// Drift seen by a verify that ran (not a failed one, which also makes `in_sync` 0).
pub fn drifted(m: &str) -> bool {
    in_sync(m) == Some(0.0)
        && sample(m, "kproxy_verify_failing") == Some(0.0)
        && sample(m, "kproxy_drifted_service_ports").is_some_and(|n| n >= 1.0)
}

/// Deletes one rule of a KUBE-SEP chain (its DNAT) with `iptables`, or flushes one endpoint
/// chain with `nft`: one endpoint of shop/web is no longer reached.
fn make_drift(ns: &Netns, backend: Option<Backend>) {
    match backend {
        Some(b) => {
            let nat = ns.iptables(b, &["-t", "nat", "-S"]).expect("list nat");
            let sep = nat
                .lines()
                .find(|l| {
                    l.starts_with("-A KUBE-SEP-")
                        && l.contains("DNAT")
                        && l.contains("shop/web:http")
                })
                .and_then(|l| l.split_whitespace().nth(1))
                .expect("a KUBE-SEP DNAT rule of shop/web")
                .to_string();
            let rules = ns
                .iptables(b, &["-t", "nat", "-S", &sep])
                .expect("list chain");
            let n = rules
                .lines()
                .filter(|l| l.starts_with("-A "))
                .position(|l| l.contains("DNAT"))
                .expect("DNAT rule")
                + 1;
            ns.iptables(b, &["-t", "nat", "-D", &sep, &n.to_string()])
                .expect("delete the rule");
        }
        None => {
            let listing = ns
                .nft(&["list", "table", "ip", "kube-proxy"])
                .expect("list");
            let chain = listing
                .lines()
                .filter_map(|l| l.trim().strip_prefix("chain "))
                .map(|l| l.trim_end_matches(" {").to_string())
                .find(|c| c.starts_with("endpoint-") && c.contains("shop/web/"))
                .expect("an endpoint chain of shop/web");
            ns.nft_load(&format!("flush chain ip kube-proxy {chain}\n"))
                .expect("drift");
        }
    }
}

/// `repair --local --apply` of node-1 in the namespace.
fn repair(ns: &Netns, backend: Option<Backend>, state: &Path, config: &Path, backups: &Path) {
    let mut args = vec![
        "repair",
        "--local",
        "--apply",
        "--netns",
        ns.name(),
        "--state",
        path_str(state),
        "--config",
        path_str(config),
        "--node",
        "node-1",
        "--nfacct",
        "none",
        "--backup-dir",
        path_str(backups),
    ];
    if let Some(b) = backend {
        args.extend(["--backend", b.name()]);
    }
    kproxy_ok(&args);
}

/// `promtool check metrics` of `text`: (success, its output).
fn promtool_check_metrics(text: &str) -> (bool, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let o = child.wait_with_output().expect("promtool");
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// A real Prometheus scraping `targets` every second, on a free loopback port with its own
/// configuration and storage; stopped when dropped.
pub struct Prometheus {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts it; `None` (after `skip`) when `prometheus` is not installed.
    pub fn start(test: &str, targets: &[u16]) -> Option<Prometheus> {
        let Some(bin) = crate::support::netns::find_tool("prometheus") else {
            crate::support::skip(
                test,
                "prometheus is not installed (Debian package prometheus)",
            );
            return None;
        };
        let dir = tempfile::tempdir().expect("tempdir");
        let port = free_port();
        let list: Vec<String> = targets.iter().map(|p| format!("'127.0.0.1:{p}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: kproxy\n    static_configs:\n      - targets: [{}]\n",
            list.join(", ")
        );
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(&cfg, config).expect("write prometheus.yml");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("log")).expect("log"))
            .spawn()
            .expect("start prometheus");
        Some(Prometheus {
            child,
            port,
            _dir: dir,
        })
    }

    /// The value of an instant PromQL query with one result, if it has one.
    pub fn query(&self, promql: &str) -> Option<f64> {
        let encoded: String = promql
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-' | b'.' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let (status, body) = http_get(self.port, &format!("/api/v1/query?query={encoded}"))?;
        if status != 200 {
            return None;
        }
        let v: Value = serde_json::from_str(&body).ok()?;
        v["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }

    /// Polls `promql` until its value satisfies `ok`; panics after `within`.
    pub fn wait(&self, promql: &str, within: Duration, ok: impl Fn(f64) -> bool) -> f64 {
        let start = Instant::now();
        loop {
            if let Some(v) = self.query(promql).filter(|v| ok(*v)) {
                return v;
            }
            assert!(
                start.elapsed() < within,
                "PromQL {promql}: not as expected within {within:?} (last {:?})",
                self.query(promql)
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A node of the example cluster: a namespace whose rules `render` wrote for node-1, and the
/// configuration, in iptables mode with `backend` or else nftables mode.
struct Node {
    dir: tempfile::TempDir,
    config: PathBuf,
    state: PathBuf,
    ns: Netns,
    mode: &'static str,
}

/// [`Node`] in a namespace named after `prefix`; `None` when the mode's tools (and `extra`)
/// are not here.
fn node_in_mode(prefix: &str, backend: Option<Backend>, extra: &[&'static str]) -> Option<Node> {
    let mut tools = vec!["ip"];
    match backend {
        Some(b) => tools.extend(b.tools()),
        None => tools.push("nft"),
    }
    tools.extend(extra);
    if !require_root_and_tools(&tools) {
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let mode = if backend.is_some() {
        "iptables"
    } else {
        "nftables"
    };
    let config = config_in_mode(dir.path(), mode);
    let state = cluster_file("state.json");
    let ns = Netns::new(prefix).expect("netns");
    program(&ns, backend, &state, &config);
    Some(Node {
        dir,
        config,
        state,
        ns,
        mode,
    })
}

/// The acceptance run in one namespace: in sync, a rule deleted, drift within interval +
/// grace, repaired, in sync again; with the endpoints' checks along the way. With
/// `prometheus`, a real Prometheus sees the same through PromQL.
fn acceptance(backend: Option<Backend>, prometheus: bool) {
    let test = match backend {
        Some(b) => format!("monitor acceptance ({})", b.name()),
        None => "monitor acceptance (nftables)".to_string(),
    };
    let Some(Node {
        dir,
        config,
        state,
        ns,
        mode,
    }) = node_in_mode("mon", backend, &["promtool"])
    else {
        return;
    };
    let args = monitor_args(&ns, &state, &config, backend, "2s");
    let mut mon = Monitor::start(dir.path(), &args, &[]);
    let prom = if prometheus {
        Prometheus::start(&test, &[mon.port])
    } else {
        None
    };

    let m = mon.wait("in sync at start", SLACK, |m| in_sync(m) == Some(1.0));
    let (ok, out) = promtool_check_metrics(&m);
    assert!(ok, "promtool check metrics: {out}\n{m}");
    assert_eq!(sample(&m, "kproxy_verify_failing"), Some(0.0), "{m}");
    assert!(
        m.contains(&format!(
            "kproxy_build_info{{version=\"{}\",mode=\"{mode}\"",
            env!("CARGO_PKG_VERSION")
        )),
        "{m}"
    );
    assert_eq!(http_get(mon.port, "/readyz").map(|r| r.0), Some(200));
    assert_eq!(http_get(mon.port, "/healthz").map(|r| r.0), Some(200));
    if let Some(p) = &prom {
        p.wait("kproxy_node_in_sync", Duration::from_secs(30), |v| v == 1.0);
    }

    let deleted = Instant::now();
    make_drift(&ns, backend);
    let m = mon.wait(
        "drift after the rule was deleted",
        Duration::from_secs(1 + 2) + SLACK,
        |m| drifted(m) && sum_of(m, "kproxy_findings", "severity=\"error\"") > 0.0,
    );
    let took = deleted.elapsed();
    assert!(
        sample(&m, "kproxy_drifted_service_ports").unwrap_or(0.0) >= 1.0,
        "{m}"
    );
    // Not before the grace: the difference was pending first.
    assert!(
        took >= Duration::from_secs(2),
        "drift after {took:?}, inside the grace"
    );
    let (status, body) = http_get(mon.port, "/findings").expect("/findings");
    assert_eq!(status, 200, "{body}");
    let doc: Value = serde_json::from_str(&body).expect("/findings is JSON");
    assert_eq!(doc["state"], "drift", "{doc:#}");
    assert_eq!(doc["mode"], mode, "{doc:#}");
    let drifted: Vec<&Value> = doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["severity"] == "error")
        .collect();
    assert!(!drifted.is_empty(), "{doc:#}");
    for f in &drifted {
        assert_eq!(f["pending"], false, "{f}");
        assert!(f["since"].as_str().is_some_and(|s| s.ends_with('Z')), "{f}");
        assert!(f["id"].as_str().is_some() && f["message"].as_str().is_some());
    }
    assert!(
        drifted.iter().any(|f| f["service"] == "shop/web:http"),
        "{doc:#}"
    );
    if let Some(p) = &prom {
        p.wait("kproxy_node_in_sync", Duration::from_secs(30), |v| v == 0.0);
        p.wait(
            "sum(kproxy_findings{severity=\"error\"})",
            Duration::from_secs(30),
            |v| v > 0.0,
        );
    }

    repair(&ns, backend, &state, &config, dir.path());
    mon.wait("in sync after the repair", SLACK, |m| {
        in_sync(m) == Some(1.0) && sum_of(m, "kproxy_findings", "severity=\"error\"") == 0.0
    });
    if let Some(p) = &prom {
        p.wait("kproxy_node_in_sync", Duration::from_secs(30), |v| v == 1.0);
    }
    let log = mon.log();
    assert!(log.contains("state=drift previous=pending"), "{log}");
    assert!(log.contains("state=in_sync previous=drift"), "{log}");
    assert!(mon.running(), "the monitor stopped:\n{log}");
}

#[test]
fn acceptance_iptables_nft_backend_with_prometheus() {
    acceptance(Some(Backend::Nft), true);
}

#[test]
fn acceptance_iptables_legacy_backend() {
    acceptance(Some(Backend::Legacy), false);
}

#[test]
fn acceptance_nftables_mode() {
    acceptance(None, false);
}

/// Samples `kproxy_node_in_sync` for `span` and runs `apply` (the stand-in kube-proxy) once
/// `after` has passed: the lowest value seen after a verify that ran.
pub fn lowest_in_sync_while(
    mon: &Monitor,
    span: Duration,
    after: Duration,
    mut apply: impl FnMut(),
) -> f64 {
    let start = Instant::now();
    let mut lowest = 1.0_f64;
    let mut applied = false;
    while start.elapsed() < span {
        if !applied && start.elapsed() >= after {
            apply();
            applied = true;
        }
        // A verify that failed (a state file renamed while it was read) says nothing of drift.
        let m = mon.metrics();
        if let Some(v) = in_sync(&m).filter(|_| sample(&m, "kproxy_verify_failing") == Some(0.0)) {
            lowest = lowest.min(v);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    lowest
}

/// The example cluster's state as a file of its own (tests change it), its configuration in
/// iptables mode, and a namespace whose rules `render` wrote with the nf_tables backend.
struct FileSetup {
    dir: tempfile::TempDir,
    config: PathBuf,
    original: String,
    state: PathBuf,
    ns: Netns,
}

fn file_setup(prefix: &str) -> Option<FileSetup> {
    if !require_root_and_tools(&Backend::Nft.tools()) {
        return None;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config_in_mode(dir.path(), "iptables");
    let original = std::fs::read_to_string(cluster_file("state.json")).expect("state.json");
    let state = dir.path().join("state.json");
    std::fs::write(&state, &original).expect("write state");
    let ns = Netns::new(prefix).expect("netns");
    program(&ns, Some(Backend::Nft), &state, &config);
    Some(FileSetup {
        dir,
        config,
        original,
        state,
        ns,
    })
}

/// Writes `text` to `path` the way tools replace files: a new file renamed over the old.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, path).expect("rename");
}

/// The example state with one more endpoint (10.244.1.12) in shop/web's slice.
fn state_with_new_endpoint(original: &str, ip: &str) -> String {
    let mut v: Value = serde_json::from_str(original).expect("state.json is JSON");
    let slice = v["items"]
        .as_array_mut()
        .expect("items")
        .iter_mut()
        .find(|o| o["kind"] == "EndpointSlice" && o["metadata"]["name"] == "web-b8d4f")
        .expect("web slice");
    let mut e = slice["endpoints"][0].clone();
    e["addresses"] = serde_json::json!([ip]);
    e["targetRef"]["name"] = serde_json::json!(format!("web-{ip}"));
    slice["endpoints"]
        .as_array_mut()
        .expect("endpoints")
        .push(e);
    serde_json::to_string_pretty(&v).expect("json")
}

/// kube-proxy's lag is not drift: a state change the stand-in applies within the grace leaves
/// the node in sync and is one programming-latency observation; the same kind of change left
/// unapplied becomes drift after the grace.
#[test]
fn lag_within_the_grace_is_latency_not_drift() {
    let Some(f) = file_setup("monlag") else {
        return;
    };
    let backend = Backend::Nft;
    let (ns, state, config) = (&f.ns, &f.state, &f.config);
    let args = monitor_args(ns, state, config, Some(backend), "6s");
    let mon = Monitor::start(f.dir.path(), &args, &[]);
    mon.wait("in sync at start", SLACK, |m| in_sync(m) == Some(1.0));

    // The API changes; the stand-in kube-proxy programs it 1.5 s later.
    replace_file(state, &state_with_new_endpoint(&f.original, "10.244.1.12"));
    let lowest = lowest_in_sync_while(
        &mon,
        Duration::from_secs(5),
        Duration::from_millis(1500),
        || program(ns, Some(backend), state, config),
    );
    let m = mon.wait("one latency observation", SLACK, |m| {
        sample(m, "kproxy_programming_latency_seconds_count") == Some(1.0)
    });
    assert_eq!(
        lowest, 1.0,
        "a change inside the grace was reported as drift:\n{m}"
    );
    let sum = sample(&m, "kproxy_programming_latency_seconds_sum").expect("latency sum");
    assert!(
        (1.0..5.0).contains(&sum),
        "latency {sum} s for a change applied 1.5 s after it was made\n{}",
        mon.log()
    );
    assert_eq!(in_sync(&m), Some(1.0), "{m}");

    // The same change with the stand-in stopped: drift once the grace has passed.
    replace_file(
        state,
        &state_with_new_endpoint(
            &std::fs::read_to_string(state).expect("state"),
            "10.244.1.13",
        ),
    );
    let changed = Instant::now();
    let m = mon.wait(
        "drift without the stand-in",
        Duration::from_secs(6) + SLACK,
        drifted,
    );
    assert!(
        changed.elapsed() >= Duration::from_secs(6),
        "drift inside the grace:\n{m}"
    );
    assert_eq!(
        sample(&m, "kproxy_programming_latency_seconds_count"),
        Some(1.0),
        "{m}"
    );
}

/// Bad inputs fail runs, say why on /readyz, never say "in sync", and the agent lives on.
#[test]
fn bad_inputs_fail_runs_and_say_why() {
    let Some(f) = file_setup("monbad") else {
        return;
    };
    let backend = Backend::Nft;
    let (dir, ns, state, config, original) = (&f.dir, &f.ns, &f.state, &f.config, &f.original);
    let failed = |m: &str| sample(m, "kproxy_verify_runs_total{result=\"failed\"}").unwrap_or(0.0);
    let not_ready = |port: u16| {
        let (status, body) = http_get(port, "/readyz").expect("/readyz");
        assert_eq!(status, 503, "{body}");
        body
    };

    // The node's tools missing: `ip` finds no iptables-save (PATH holds only `ip`).
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).expect("bin");
    let ip = crate::support::netns::find_tool("ip").expect("ip");
    std::os::unix::fs::symlink(ip, bin.join("ip")).expect("symlink ip");
    // Runs that keep failing for `why`: counted, not in sync, said on /readyz, still running.
    let fails = |args: &[&str], env: &[(&str, &str)], why: &str| {
        let mut mon = Monitor::start(dir.path(), args, env);
        let m = mon.wait(why, SLACK, |m| failed(m) >= 2.0);
        assert_eq!(in_sync(&m), Some(0.0), "{m}");
        assert_eq!(sample(&m, "kproxy_verify_failing"), Some(1.0), "{m}");
        let said = not_ready(mon.port);
        assert!(said.contains(why), "{said}");
        assert!(mon.running(), "{}", mon.log());
    };
    let args = monitor_args(ns, state, config, Some(backend), "2s");
    fails(&args, &[("PATH", path_str(&bin))], "iptables-nft-save");

    // A read that times out.
    let mut args = monitor_args(ns, state, config, Some(backend), "2s");
    args.extend(["--exec-timeout", "1ns"]);
    fails(&args, &[], "did not finish within");

    // A torn state file (what a reader sees of a file rewritten in place mid-read): failed runs
    // until it is whole again, then in sync; never "in sync" from the last good state. Logged
    // as JSON lines, one per change of state.
    let mut args = monitor_args(ns, state, config, Some(backend), "2s");
    args.extend(["--log-format", "json"]);
    let mut mon = Monitor::start(dir.path(), &args, &[]);
    mon.wait("in sync at start", SLACK, |m| in_sync(m) == Some(1.0));
    std::fs::write(state, &original[..original.len() / 2]).expect("tear the state");
    let m = mon.wait("failed runs on a torn state", SLACK, |m| {
        failed(m) >= 1.0 && in_sync(m) == Some(0.0)
    });
    assert_eq!(sample(&m, "kproxy_verify_failing"), Some(1.0), "{m}");
    let why = not_ready(mon.port);
    assert!(why.contains("state"), "{why}");
    let (_, findings) = http_get(mon.port, "/findings").expect("/findings");
    let doc: Value = serde_json::from_str(&findings).expect("JSON");
    assert!(
        doc["stale"].as_str().is_some(),
        "the last report is marked stale: {doc:#}"
    );
    replace_file(state, original);
    mon.wait("in sync once the state is whole", SLACK, |m| {
        in_sync(m) == Some(1.0)
    });
    assert!(mon.running(), "{}", mon.log());
    let states: Vec<(String, String)> = mon
        .log()
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str::<Value>(l).expect("a JSON log line"))
        .filter(|v| v["state"].is_string())
        .map(|v| {
            assert_eq!(v["node"], "node-1", "{v}");
            assert!(v["time"].as_str().is_some_and(|t| t.ends_with('Z')), "{v}");
            (
                v["previous"].as_str().unwrap_or_default().to_string(),
                v["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let pairs: Vec<(&str, &str)> = states
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("unknown", "in_sync"),
            ("in_sync", "failed"),
            ("failed", "in_sync")
        ],
        "{}",
        mon.log()
    );
}

/// Without `--grace` the grace follows kube-proxy's configuration as it changes: 36 s from
/// the example's periods at start, 8 s once the configuration says `syncPeriod: 2s`, and a
/// difference older than the new grace is drift.
#[test]
fn the_grace_follows_the_configuration() {
    let Some(f) = file_setup("mongrace") else {
        return;
    };
    let backend = Backend::Nft;
    let (ns, state, config) = (&f.ns, &f.state, &f.config);
    let mut args = monitor_args(ns, state, config, Some(backend), "-");
    let at = args.iter().position(|a| *a == "--grace").expect("--grace");
    args.drain(at..at + 2);
    let mon = Monitor::start(f.dir.path(), &args, &[]);
    mon.wait("in sync, grace 36s", SLACK, |m| {
        in_sync(m) == Some(1.0) && sample(m, "kproxy_grace_seconds") == Some(36.0)
    });
    // A difference the old grace would keep pending for 36 s.
    replace_file(state, &state_with_new_endpoint(&f.original, "10.244.1.12"));
    mon.wait("pending", SLACK, |m| {
        sample(m, "kproxy_pending_service_ports").is_some_and(|n| n >= 1.0)
    });
    let text = std::fs::read_to_string(config).expect("config");
    assert!(text.contains("  syncPeriod: 30s\n"), "{text}");
    replace_file(
        config,
        &text.replace("  syncPeriod: 30s\n", "  syncPeriod: 2s\n"),
    );
    let changed = Instant::now();
    let m = mon.wait("grace 8s", SLACK, |m| {
        sample(m, "kproxy_grace_seconds") == Some(8.0)
    });
    assert!(
        mon.log()
            .contains("grace 8s (minSyncPeriod 1s + syncPeriod 2s + 5s margin), was 36s"),
        "{}\n{m}",
        mon.log()
    );
    let m = mon.wait(
        "drift under the new grace",
        Duration::from_secs(8) + SLACK,
        drifted,
    );
    assert!(
        changed.elapsed() < Duration::from_secs(30),
        "drift only after the old grace:\n{m}"
    );
}

/// `kproxy_node_reads_total{read=KIND}` (0 when absent).
fn reads(m: &str, kind: &str) -> f64 {
    sample(m, &format!("kproxy_node_reads_total{{read=\"{kind}\"}}")).unwrap_or(0.0)
}

/// The node's nf_tables change events: while nothing changes, what was read from nf_tables is
/// kept verify after verify (no whole read); a rule deleted is an event, the next read is
/// whole, and the drift is seen within the grace — which kept reads alone would never show.
fn rule_events(backend: Option<Backend>) {
    let Some(Node {
        dir,
        config,
        state,
        ns,
        ..
    }) = node_in_mode("monev", backend, &["nft"])
    else {
        return;
    };
    let args = monitor_args(&ns, &state, &config, backend, "2s");
    let mon = Monitor::start(dir.path(), &args, &[]);
    mon.wait("in sync", SLACK, |m| in_sync(m) == Some(1.0));
    let m = mon.wait("kept reads while nothing changes", SLACK, |m| {
        reads(m, "kept") >= 2.0
    });
    let (whole, kept) = (reads(&m, "whole"), reads(&m, "kept"));
    std::thread::sleep(Duration::from_secs(3));
    let m = mon.metrics();
    assert_eq!(
        reads(&m, "whole"),
        whole,
        "a whole read with nothing changed:\n{m}"
    );
    assert!(reads(&m, "kept") >= kept + 2.0, "{m}");
    assert_eq!(in_sync(&m), Some(1.0), "{m}");

    make_drift(&ns, backend);
    let m = mon.wait(
        "drift seen through the rules' change events",
        Duration::from_secs(1 + 2) + SLACK,
        drifted,
    );
    assert!(reads(&m, "whole") > whole, "{m}");
    assert!(
        sample(&m, "kproxy_rule_changes_total").is_some_and(|n| n >= 1.0),
        "{m}"
    );
}

#[test]
fn rule_events_iptables_nft_backend() {
    rule_events(Some(Backend::Nft));
}

#[test]
fn rule_events_nftables_mode() {
    rule_events(None);
}
