//! What `monitor` costs on a node of 10,000 services × 10 endpoints, as users run it (issue #35
//! item 7; figures in BENCHMARKS.md and docs/monitor.md). Ignored by default (minutes, a release
//! build, a large namespace): `sudo testdata/make-scale-dump.sh` once (for `state.json` and
//! `config.yaml`), `cargo build --release`, then
//!
//! ```sh
//! cargo test --test integration monitor_scale -- --ignored --nocapture
//! ```
//!
//! `KPROXY_SCALE_DIR` (default `target/scale`) and `KPROXY_BENCH_BIN` (default the release
//! binary) point elsewhere. The node: a namespace holding `render`'s rules of the state,
//! restored with iptables-nft; the API: the fake apiserver holding the state and kube-proxy's
//! ConfigMap; the monitor with its defaults (interval 60s, grace from the configuration, full
//! reads every 10m). Measured: time and CPU to the first verify; then, once the grace has
//! passed, CPU (the monitor and the programs it ran and waited for) and RSS at rest, and while
//! the API changes one endpoint ten times a second (the rules are not reprogrammed: no
//! stand-in kube-proxy syncs 10,000 services that fast); and one whole read of the rules.
//! [`scoped_verify_at_scale`] measures the re-verify of one Service (in-process: run it with
//! `--release`).

use crate::monitor::{http_get, sample};
use crate::support::fake_apiserver::FakeApiServer;
use crate::support::netns::{Backend, Netns, require_root_and_tools};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// CPU seconds of a process: (its own user + system, of its waited-for children).
fn cpu_of(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit_once(") ")?.1;
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|w| w.parse().unwrap_or(0.0))
        .collect();
    // Fields 14–17 of proc(5): utime, stime, cutime, cstime (after pid and comm: index 11–14).
    let tick = 100.0;
    Some(((f[11] + f[12]) / tick, (f[13] + f[14]) / tick))
}

/// The live children of `pid`.
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let text = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            out.extend(
                text.split_whitespace()
                    .filter_map(|w| w.parse::<u32>().ok()),
            );
        }
    }
    out
}

/// CPU seconds of the monitor, the programs it waited for, and its live children.
fn total_cpu(pid: u32) -> f64 {
    let (own, waited) = cpu_of(pid).unwrap_or_default();
    let live: f64 = children(pid)
        .into_iter()
        .filter_map(cpu_of)
        .map(|(o, w)| o + w)
        .sum();
    own + waited + live
}

/// `VmRSS` and `VmHWM` of a process, in MB.
fn rss_mb(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            / 1024.0
    };
    (kb("VmRSS:"), kb("VmHWM:"))
}

/// `/usr/bin/time` of `argv` in the namespace, its stack limited to `stack` (ulimit -s):
/// (exit status line, user + system seconds, max RSS MB).
fn timed_in_ns(ns: &Netns, stack: &str, argv: &str) -> (String, f64, f64) {
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "ulimit -s {stack}; /usr/bin/time -f '%x %U %S %M' ip netns exec {} {argv} > /dev/null 2>/tmp/kpm-time-$$; tail -1 /tmp/kpm-time-$$; rm -f /tmp/kpm-time-$$",
            ns.name()
        ))
        .output()
        .expect("time");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let w: Vec<&str> = text.split_whitespace().collect();
    let num = |i: usize| w.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (text.trim().to_string(), num(1) + num(2), num(3) / 1024.0)
}

#[test]
#[ignore = "minutes on a 10,000-service node: run with --ignored (see the module's docs)"]
fn monitor_cost_at_scale() {
    if !require_root_and_tools(&Backend::Nft.tools()) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = std::env::var_os("KPROXY_SCALE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/scale"));
    let bin = std::env::var_os("KPROXY_BENCH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/kubectl-kproxy"));
    let (state, config) = (dir.join("state.json"), dir.join("config.yaml"));
    assert!(
        state.is_file() && config.is_file() && bin.is_file(),
        "needs {} and {} (sudo testdata/make-scale-dump.sh) and {} (cargo build --release)",
        state.display(),
        config.display(),
        bin.display()
    );
    let t = Instant::now();
    let render = std::process::Command::new(&bin)
        .args(["render", "--with-base-jumps", "--nfacct", "none", "--state"])
        .arg(&state)
        .arg("--config")
        .arg(&config)
        .output()
        .expect("render");
    assert!(
        render.status.success(),
        "{}",
        String::from_utf8_lossy(&render.stderr)
    );
    let rules = String::from_utf8(render.stdout).expect("utf-8");
    let ns = Netns::new("monscale").expect("netns");
    ns.restore(Backend::Nft, &rules, false).expect("restore");
    drop(rules);
    println!("node: render + iptables-nft-restore in {:.1?}", t.elapsed());

    let api = FakeApiServer::start();
    let list: Value =
        serde_json::from_str(&std::fs::read_to_string(&state).expect("state")).expect("json");
    let items = list["items"].as_array().cloned().expect("items");
    let slices: Vec<(String, String)> = items
        .iter()
        .filter(|o| o["kind"] == "EndpointSlice")
        .map(|o| {
            (
                o["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
                o["metadata"]["name"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    api.add_objects(items);
    let config_text = std::fs::read_to_string(&config).expect("config");
    api.add_configmap(
        "kube-system",
        "kube-proxy",
        &[("config.conf", &config_text)],
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(tmp.path());
    let port = crate::monitor::free_port();
    let log = tmp.path().join("monitor.log");
    let started = Instant::now();
    let mut child = std::process::Command::new(&bin)
        .arg("monitor")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--node", "node-1", "--nfacct", "none", "--backend", "nft"])
        .args(["--netns", ns.name()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("start the monitor");
    let pid = child.id();
    let metrics = || http_get(port, "/metrics").map(|r| r.1).unwrap_or_default();
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    while http_get(port, "/readyz").map(|r| r.0) != Some(200) {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "not ready in 10 min:\n{}",
            log_text()
        );
        assert!(matches!(child.try_wait(), Ok(None)), "{}", log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    let m = metrics();
    println!(
        "first verify: ready after {:.1?}, CPU {:.1} s (watch lists, whole read, verify); in sync {:?}; RSS {:.0} MB (peak {:.0} MB)",
        started.elapsed(),
        total_cpu(pid),
        sample(&m, "kproxy_node_in_sync"),
        rss_mb(pid).0,
        rss_mb(pid).1
    );
    assert_eq!(
        sample(&m, "kproxy_node_in_sync"),
        Some(1.0),
        "{m}\n{}",
        log_text()
    );

    // At rest: nothing changes for two intervals, once the start's API change is older than
    // the grace (until then the monitor rechecks it: pending, not rest).
    let grace = sample(&m, "kproxy_grace_seconds").unwrap_or(36.0);
    std::thread::sleep(Duration::from_secs_f64(grace + 10.0));
    let rest = Duration::from_secs(130);
    let (c0, t0) = (total_cpu(pid), Instant::now());
    std::thread::sleep(rest);
    let (c1, secs) = (total_cpu(pid), t0.elapsed().as_secs_f64());
    let m = metrics();
    let nft_rss: f64 = children(pid).into_iter().map(|c| rss_mb(c).0).sum();
    println!(
        "at rest {secs:.0} s: CPU {:.2} s = {:.2} % of one core; RSS {:.0} MB (peak {:.0} MB), its children {nft_rss:.0} MB; reads whole {:?} kept {:?}",
        c1 - c0,
        100.0 * (c1 - c0) / secs,
        rss_mb(pid).0,
        rss_mb(pid).1,
        sample(&m, "kproxy_node_reads_total{read=\"whole\"}"),
        sample(&m, "kproxy_node_reads_total{read=\"kept\"}"),
    );

    // Ten endpoint changes a second: endpoint 0 of one slice after another becomes not ready.
    let runs = |m: &str| {
        ["clean", "drift", "failed"]
            .iter()
            .filter_map(|r| sample(m, &format!("kproxy_verify_runs_total{{result=\"{r}\"}}")))
            .sum::<f64>()
    };
    let churn = Duration::from_secs(60);
    let (c0, t0, v0) = (total_cpu(pid), Instant::now(), runs(&metrics()));
    let mut n = 0usize;
    while t0.elapsed() < churn {
        let (ns_name, name) = &slices[n % slices.len()];
        if let Some(mut s) = api.object("EndpointSlice", Some(ns_name), name) {
            s["endpoints"][0]["conditions"]["ready"] = Value::Bool(false);
            api.update_object(s);
        }
        n += 1;
        let next = t0 + Duration::from_millis(100) * u32::try_from(n).unwrap_or(u32::MAX);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let (c1, secs) = (total_cpu(pid), t0.elapsed().as_secs_f64());
    let m = metrics();
    let verifies = runs(&m) - v0;
    println!(
        "{n} endpoint changes in {secs:.0} s: CPU {:.1} s = {:.1} % of one core; {verifies} verifies, {:.2} s CPU each; RSS {:.0} MB (peak {:.0} MB); pending ports {:?}",
        c1 - c0,
        100.0 * (c1 - c0) / secs,
        (c1 - c0) / verifies.max(1.0),
        rss_mb(pid).0,
        rss_mb(pid).1,
        sample(&m, "kproxy_pending_service_ports"),
    );
    assert!(matches!(child.try_wait(), Ok(None)), "{}", log_text());
    let _ = child.kill();
    let _ = child.wait();

    // One whole read, as the full-read interval makes one.
    for stack in ["8192", "unlimited"] {
        let (status, cpu, rss) = timed_in_ns(&ns, stack, "iptables-nft-save");
        println!(
            "iptables-nft-save, stack {stack}: `{status}`, CPU {cpu:.1} s, max RSS {rss:.0} MB"
        );
    }
    let (status, cpu, rss) = timed_in_ns(&ns, "8192", "nft list table ip nat");
    println!("nft list table ip nat: `{status}`, CPU {cpu:.1} s, max RSS {rss:.0} MB");
}

/// CPU seconds of this process so far (every thread: verify runs on rayon's).
fn process_cpu() -> f64 {
    cpu_of(std::process::id()).map_or(0.0, |(own, _)| own)
}

/// The re-verify of the Services one endpoint change touches (issue #35 item 7), on the
/// 10,000-service node: its CPU against the whole verify's, and the same findings as the whole
/// verify for those Services' ports — on the clean node and after an endpoint of each Service
/// went unready in the API (the rules still hold it: drift of those ports, in large-cluster
/// mode). Needs `target/scale/scale.nft.save` (`sudo testdata/make-scale-dump.sh`); run with
/// `cargo test --release --test integration scoped_verify_at_scale -- --ignored --nocapture`.
#[test]
#[ignore = "seconds on a 10,000-service dump: run with --ignored (see the docs above)"]
fn scoped_verify_at_scale() {
    use kproxy::compare::Finding;
    use kproxy::compare::iptables::scope::{DumpIndex, ScopedVerify};
    use kproxy::compare::iptables::{DumpText, NodePlans, VerifyInput, verify};
    use kproxy::parsers::iptables::ParseOptions;
    use kproxy::state::ip::IpFamily;
    use std::collections::BTreeSet;
    let dir = std::env::var_os("KPROXY_SCALE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/scale"));
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (sudo testdata/make-scale-dump.sh)",
                dir.join(name).display()
            )
        })
    };
    let (dump, state_text, config_text) = (
        read("scale.nft.save"),
        read("state.json"),
        read("config.yaml"),
    );
    let mut state = kproxy::state::load::from_str(&state_text, "state.json").expect("state");
    let (config, _) = kproxy::state::config::parse(&config_text, "config.yaml").expect("config");
    let args = kproxy::state::node::NodeInputs {
        family: Some(IpFamily::V4),
        nfacct: Some(Vec::new()),
        ..Default::default()
    };
    let (facts, _) = kproxy::state::node::build(&args, &state, &config).expect("facts");
    // Every 997th Service: 11 of them, spread over the namespaces.
    let picked: Vec<String> = state
        .services
        .iter()
        .step_by(997)
        .map(|s| {
            format!(
                "{}/{}",
                s.metadata.namespace.as_deref().unwrap_or_default(),
                s.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    for round in ["clean", "an endpoint of each picked Service unready"] {
        let dumps = vec![DumpText {
            label: "scale.nft.save",
            text: &dump,
            family: IpFamily::V4,
        }];
        let input = VerifyInput {
            node: "node-1",
            plans: NodePlans::new(&state, &config, &facts, &dumps),
            config: &config,
            facts: &facts,
            dumps,
            legacy: None,
            nft_ruleset: None,
            parse: ParseOptions::strict(),
            group_alike: false,
        };
        let (c0, t0) = (process_cpu(), Instant::now());
        let whole = verify(&input).expect("verify").findings;
        println!(
            "{round}: whole verify {:.0?}, CPU {:.2} s, {} findings",
            t0.elapsed(),
            process_cpu() - c0,
            whole.len()
        );
        let large_cluster = input.plans.large_cluster();
        assert!(large_cluster, "10,000 × 10 endpoints is large-cluster mode");
        let (c0, t0) = (process_cpu(), Instant::now());
        let indexes: Vec<DumpIndex<'_>> =
            input.dumps.iter().map(|d| DumpIndex::new(d.text)).collect();
        println!(
            "{round}: the dump indexed by Service in {:.0?}, CPU {:.2} s (once per read)",
            t0.elapsed(),
            process_cpu() - c0
        );
        let mut cpu = Vec::new();
        for name in &picked {
            let services = BTreeSet::from([name.clone()]);
            let (c0, t0) = (process_cpu(), Instant::now());
            let scoped = ScopedVerify {
                services: &services,
                state: &state,
                large_cluster,
            }
            .findings(&input, &indexes)
            .expect("scoped verify");
            let (secs, wall) = (process_cpu() - c0, t0.elapsed());
            cpu.push(secs);
            let expected: Vec<&Finding> = whole
                .iter()
                .filter(|f| {
                    f.service
                        .as_deref()
                        .is_some_and(|p| p.split_once(':').map_or(p, |(s, _)| s) == name)
                })
                .collect();
            assert_eq!(scoped.iter().collect::<Vec<_>>(), expected, "{name}");
            if round != "clean" {
                assert!(
                    !expected.is_empty(),
                    "{name}: the unready endpoint is drift"
                );
            }
            println!(
                "  {name}: {wall:.1?} wall, CPU {:.0} ms, {} findings",
                secs * 1e3,
                scoped.len()
            );
        }
        cpu.sort_by(f64::total_cmp);
        println!(
            "{round}: scoped verify of one Service, CPU median {:.0} ms, max {:.0} ms ({} runs; CPU ticks are 10 ms)",
            cpu[cpu.len() / 2] * 1e3,
            cpu[cpu.len() - 1] * 1e3,
            cpu.len()
        );
        // The next round: endpoint 0 of each picked Service's slices not ready in the API.
        for slice in &mut state.endpoint_slices {
            let owner = format!(
                "{}/{}",
                slice.metadata.namespace.as_deref().unwrap_or_default(),
                slice
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get("kubernetes.io/service-name"))
                    .map_or("", String::as_str)
            );
            if picked.contains(&owner)
                && let Some(ep) = slice.endpoints.first_mut()
            {
                ep.conditions.get_or_insert_with(Default::default).ready = Some(false);
            }
        }
    }
}
