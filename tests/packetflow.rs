//! `trace --model kube-proxy-test` against kube-proxy's packet-flow vectors
//! (`../shared/conformance/iptables/packetflow/*.json`): every packet through the library, a
//! sample through the built binary, and every packet again on our own `render --with-base-jumps`
//! of the case's inputs (node facts from `conformance.py flags`, as the scorer derives them).

use kproxy::model::Ruleset;
use kproxy::parsers::iptables::ParseOptions;
use kproxy::trace::sim::iptables::kptest;
use kproxy::trace::sim::{LocalAddrs, PacketSpec, Protocol};
use serde_json::Value;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

fn packetflow_dir() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/iptables/packetflow");
    if p.is_dir() {
        Some(p)
    } else {
        crate::support::skip(
            "packetflow",
            &format!("{} absent; packet-flow conformance skipped", p.display()),
        );
        None
    }
}

/// Every `*.json` case file, sorted.
fn cases(dir: &Path) -> Vec<(String, Value)> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read packetflow dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let v: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let name = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, v)
        })
        .collect()
}

fn str_of<'v>(v: &'v Value, key: &str) -> &'v str {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("missing {key} in {v}"))
}

fn packet_of(p: &Value) -> PacketSpec {
    let ip = |k: &str| -> IpAddr { str_of(p, k).parse().unwrap_or_else(|e| panic!("{k}: {e}")) };
    PacketSpec {
        src: ip("source_ip"),
        sport: None,
        dst: ip("dest_ip"),
        dport: p
            .get("dest_port")
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
            .expect("dest_port"),
        proto: Protocol::from_name(str_of(p, "protocol")).expect("protocol"),
    }
}

/// The `--packet` text conformance.py builds.
fn packet_arg(p: &Value) -> String {
    let dst = str_of(p, "dest_ip");
    let dst = if dst.contains(':') {
        format!("[{dst}]")
    } else {
        dst.to_string()
    };
    format!(
        "{}->{dst}:{}/{}",
        str_of(p, "source_ip"),
        p.get("dest_port").and_then(Value::as_u64).unwrap_or(0),
        str_of(p, "protocol").to_ascii_lowercase()
    )
}

fn local_ips(case: &Value) -> Vec<IpAddr> {
    case.get("tracer_local_ips")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|s| s.parse().expect("local ip"))
                .collect()
        })
        .unwrap_or_default()
}

/// Traces every packet of `case` on `ruleset`; returns (correct, total, failure lines).
fn score(name: &str, case: &Value, ruleset: &str) -> (usize, usize, Vec<String>) {
    let rules =
        Ruleset::parse(ruleset, &ParseOptions::strict()).unwrap_or_else(|e| panic!("{name}: {e}"));
    let local = LocalAddrs::exact(local_ips(case));
    let packets = case
        .get("packets")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut fails = Vec::new();
    let mut ok = 0;
    for p in &packets {
        let want = (
            str_of(p, "expected_output"),
            p.get("masq").and_then(Value::as_bool).unwrap_or(false),
        );
        match kptest::trace(&rules, &packet_of(p), &local) {
            Ok(t) if (t.output.as_str(), t.masq) == want => ok += 1,
            Ok(t) => fails.push(format!(
                "{name} / {}: got ({:?}, masq={}) want ({:?}, masq={}); matched {}",
                str_of(p, "name"),
                t.output,
                t.masq,
                want.0,
                want.1,
                t.matched.join(" ")
            )),
            Err(e) => fails.push(format!("{name} / {}: {e}", str_of(p, "name"))),
        }
    }
    (ok, packets.len(), fails)
}

#[test]
fn every_packet_through_the_library() {
    let Some(dir) = packetflow_dir() else { return };
    let (mut ok, mut total, mut fails) = (0, 0, Vec::new());
    for (name, case) in cases(&dir) {
        let (o, t, mut f) = score(&name, &case, str_of(&case, "ruleset"));
        ok += o;
        total += t;
        fails.append(&mut f);
    }
    for f in &fails {
        println!("  FAIL {f}");
    }
    println!("packetflow: {ok}/{total} packets correct");
    assert!(total > 0, "no packets found");
    assert_eq!(ok, total, "packet-flow failures:\n{}", fails.join("\n"));
}

#[test]
fn sample_through_the_binary() {
    let Some(dir) = packetflow_dir() else { return };
    let all = cases(&dir);
    let picks = [
        "internal-external-masquerade-base",
        "node-ports-ipv6-localhost-nodeports-disabled",
        "no-endpoints-reject",
    ];
    let tmp = tempfile::tempdir().expect("tempdir");
    let mut checked = 0;
    for (name, case) in all.iter().filter(|(n, _)| picks.contains(&n.as_str())) {
        let rules = tmp.path().join(format!("{name}.rules"));
        std::fs::write(&rules, str_of(case, "ruleset")).expect("write rules");
        for p in case
            .get("packets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .take(4)
        {
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"));
            cmd.arg("trace").arg("--iptables-save").arg(&rules);
            cmd.args([
                "--packet",
                &packet_arg(p),
                "--model",
                "kube-proxy-test",
                "-o",
                "json",
            ]);
            for ip in local_ips(case) {
                cmd.args(["--local-ip", &ip.to_string()]);
            }
            let out = cmd.output().expect("run kubectl-kproxy");
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let got: Value = serde_json::from_slice(&out.stdout).expect("json output");
            assert_eq!(
                got.as_object().map(|o| o.len()),
                Some(2),
                "exactly output and masq: {got}"
            );
            assert_eq!(
                got["output"],
                p["expected_output"],
                "{name} / {}",
                str_of(p, "name")
            );
            assert_eq!(got["masq"], p["masq"], "{name} / {}", str_of(p, "name"));
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} packets checked");
}

#[test]
fn bad_packet_syntax_exits_2_with_the_expected_form() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let rules = tmp.path().join("r.rules");
    std::fs::write(&rules, "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n").expect("write");
    for bad in [
        "10.0.0.1 10.96.0.1:80",
        "10.0.0.1->10.96.0.1",
        "10.0.0.1->10.96.0.1:80/icmp",
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
            .arg("trace")
            .arg("--iptables-save")
            .arg(&rules)
            .args(["--packet", bad])
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("SRC[:SPORT]->DST:PORT"), "{bad}: {err}");
    }
}

/// The node-fact flags conformance.py derives from a case.yaml (`conformance.py flags`).
fn harness_flags(case_yaml: &Path) -> Option<Vec<String>> {
    let tool =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/tools/conformance.py");
    let out = Command::new("python3")
        .arg(&tool)
        .arg("flags")
        .arg(case_yaml)
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .filter(|l| !l.is_empty())
            .collect()
    })
}

#[test]
fn every_packet_on_our_own_render() {
    let Some(dir) = packetflow_dir() else { return };
    let (mut ok, mut total, mut fails, mut rendered) = (0, 0, Vec::new(), 0);
    for (name, case) in cases(&dir) {
        let Some(inputs) = case.get("inputs").and_then(Value::as_str) else {
            continue;
        };
        let inputs = dir.join(inputs);
        let Some(flags) = harness_flags(&inputs.join("case.yaml")) else {
            crate::support::skip(
                "packetflow",
                "python3 or conformance.py unavailable; own-render packet-flow skipped",
            );
            return;
        };
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
            .arg("render")
            .arg("--state")
            .arg(inputs.join("state.json"))
            .arg("--config")
            .arg(inputs.join("config.yaml"))
            .arg("--with-base-jumps")
            .args(&flags)
            .output()
            .expect("run render");
        assert!(
            out.status.success(),
            "{name}: render failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ruleset = String::from_utf8(out.stdout).expect("utf-8 render");
        let (o, t, mut f) = score(&name, &case, &ruleset);
        ok += o;
        total += t;
        rendered += 1;
        fails.append(&mut f);
    }
    for f in &fails {
        println!("  FAIL {f}");
    }
    println!("packetflow (own render, {rendered} cases): {ok}/{total} packets correct");
    assert_eq!(
        ok,
        total,
        "packet-flow failures on our render:\n{}",
        fails.join("\n")
    );
}
