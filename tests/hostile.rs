//! Hostile input: rulesets with loops must end with a "loop" error (bounded time and memory),
//! `graph` reports the loops, and a reader that closes stdout early is not an error.
//! Inputs are the constructed rulesets of `../shared/conformance/hostile/`.

use crate::support::{kproxy, shared};
use std::io::Read;
use std::process::Stdio;

const LOOPS: &[&str] = &[
    "self-goto",
    "goto-cycle",
    "jump-then-self-goto",
    "self-jump",
    "svc-sep-2cycle",
];

#[test]
fn trace_packet_through_a_loop_ends_with_a_loop_error() {
    let Some(dir) = shared("hostile loops", "conformance/hostile") else {
        return;
    };
    for name in LOOPS {
        for model in ["kernel", "kube-proxy-test"] {
            let file = dir.join(format!("{name}.txt"));
            let started = std::time::Instant::now();
            let out = kproxy()
                .args([
                    "trace",
                    "--packet",
                    "10.0.0.1->10.96.7.7:80/tcp",
                    "--model",
                    model,
                ])
                .arg("--iptables-save")
                .arg(&file)
                .output()
                .expect("run");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "{name} {model}: took {:?}",
                started.elapsed()
            );
            assert!(!stderr.contains("panicked"), "{name} {model}: {stderr}");
            // kube-proxy's test tracer does not follow `-g`: a goto-only loop is no loop to it.
            let goto_only = name.contains("goto");
            if model == "kernel" || !goto_only {
                assert_eq!(out.status.code(), Some(2), "{name} {model}: {stderr}");
                assert!(stderr.contains("loop"), "{name} {model}: {stderr}");
            } else {
                assert!(out.status.code().is_some_and(|c| c <= 2), "{name} {model}");
            }
        }
    }
}

#[test]
fn goto_then_return_resumes_after_the_jump_into_the_first_chain() {
    let Some(dir) = shared("goto semantics", "conformance/hostile") else {
        return;
    };
    let out = kproxy()
        .args([
            "trace",
            "--packet",
            "10.0.0.1->10.96.7.7:80/tcp",
            "-o",
            "json",
        ])
        .arg("--iptables-save")
        .arg(dir.join("goto-semantics.txt"))
        .output()
        .expect("run");
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let text = doc.to_string();
    assert!(text.contains("1.1.1.1"), "{text}");
    assert!(!text.contains("2.2.2.2"), "{text}");
}

#[test]
fn graph_reports_each_loop_as_an_anomaly() {
    let Some(dir) = shared("graph loops", "conformance/hostile") else {
        return;
    };
    let expected: &[(&str, &[&str])] = &[
        ("self-goto", &["A"]),
        ("goto-cycle", &["A"]),
        ("jump-then-self-goto", &["A"]),
        (
            "self-jump",
            &["SELF", "KUBE-SERVICES", "KUBE-SVC-DS2HIXNWPY73LQNI"],
        ),
        ("svc-sep-2cycle", &["KUBE-SVC-DS2HIXNWPY73LQNI"]),
    ];
    for (name, chains) in expected {
        let out = kproxy()
            .args(["graph", "-o", "json", "--iptables-save"])
            .arg(dir.join(format!("{name}.txt")))
            .output()
            .expect("run");
        assert!(out.status.success(), "{name}");
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        let mut loops: Vec<String> = doc["graphs"][0]["anomalies"]
            .as_array()
            .expect("anomalies")
            .iter()
            .filter(|a| a["kind"] == "jump-loop")
            .map(|a| {
                assert!(
                    a["message"].as_str().unwrap_or("").contains("loop")
                        || a["message"].as_str().unwrap_or("").contains("itself")
                );
                a["chain"].as_str().unwrap_or("").to_string()
            })
            .collect();
        loops.sort();
        let mut want: Vec<String> = chains.iter().map(|c| c.to_string()).collect();
        want.sort();
        assert_eq!(loops, want, "{name}");
    }
}

/// Runs the binary with its stdout's read end closed at once: every write fails with EPIPE.
fn with_stdout_closed(args: &[&str]) -> (Option<i32>, String) {
    let mut child = kproxy()
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read");
    (child.wait().expect("wait").code(), stderr)
}

#[test]
fn closing_stdout_early_is_not_an_error() {
    let dump = "testdata/dumps/cluster.nft-c.save";
    let drifted = "testdata/dumps/drifted.nft-c.save";
    let state = [
        "--state",
        "testdata/cluster/state.json",
        "--config",
        "testdata/cluster/config.yaml",
    ];
    let mut runs: Vec<Vec<&str>> = Vec::new();
    for o in ["json", "yaml", "table", "wide", "dot"] {
        runs.push(vec!["graph", "--iptables-save", dump, "-o", o]);
    }
    for o in ["json", "yaml", "table"] {
        let mut v = vec!["verify", "node-1", "--iptables-save", drifted, "-o", o];
        v.extend(state);
        runs.push(v);
        let mut t = vec![
            "trace",
            "svc/web",
            "-n",
            "shop",
            "--iptables-save",
            dump,
            "-o",
            o,
        ];
        t.extend(state);
        runs.push(t);
    }
    let mut r = vec!["render", "--node", "node-1"];
    r.extend(state);
    runs.push(r);
    let mut p = vec!["repair", "--node", "node-1", "--iptables-save", drifted];
    p.extend(state);
    runs.push(p);
    runs.push(vec![
        "trace",
        "--iptables-save",
        dump,
        "--packet",
        "10.244.1.10->10.96.100.10:80/tcp",
    ]);
    for shell in ["bash", "zsh", "fish"] {
        runs.push(vec!["completion", shell]);
    }
    runs.push(vec!["--help"]);
    for args in runs {
        let (code, stderr) = with_stdout_closed(&args);
        // Notes (the inferred kube-proxy release) may be printed; nothing else.
        let unexpected = stderr.lines().any(|l| !l.starts_with("note: "));
        assert!(
            matches!(code, Some(0..=2)) && !unexpected,
            "{args:?}: exit {code:?}, stderr: {stderr}"
        );
    }
}
