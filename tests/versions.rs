//! kube-proxy releases 1.20 … 1.35 (issue 28), against real netfilter and the fake apiserver.
//!
//! * Real kernel: for each release golden of `../shared/conformance/versions` (1.20, 1.24,
//!   1.28), the release's render restored into a network namespace and saved back verifies clean
//!   with that release, verifies clean without the flag (the release is inferred from the rules
//!   and said, KP907), and is one KP906 finding — not one per rule — when verified with the
//!   newest release.
//! * Live: the kube-proxy pod's image tag chooses the release; a renamed image asks for the flag
//!   and leaves the choice to the rules; a bundle records the image.

use crate::support::fake_apiserver::{ExecReply, FakeApiServer};
use crate::support::netns::{Backend, Family, Netns, require_root_and_tools};
use assert_cmd::Command;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn versions_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/versions")
}

/// The version cases (`v1.20`, …) with their `kube_proxy_version`, or none (with a notice)
/// when `../shared` is absent.
fn cases() -> Vec<(PathBuf, String)> {
    // `conformance.py flags` turns a case into flags.
    if crate::support::tool("versions", "python3").is_none() {
        return Vec::new();
    }
    let root = versions_dir();
    let Ok(entries) = std::fs::read_dir(&root) else {
        crate::support::skip(
            "versions",
            &format!("{} absent; version cases skipped", root.display()),
        );
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, String)> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("case.yaml").is_file())
        .map(|p| {
            let text = std::fs::read_to_string(p.join("case.yaml")).expect("case.yaml");
            let version = text
                .lines()
                .find_map(|l| l.strip_prefix("kube_proxy_version:"))
                .map(|v| v.trim().trim_matches('\'').to_string())
                .unwrap_or_else(|| panic!("{}: no kube_proxy_version", p.display()));
            (p, version)
        })
        .collect();
    out.sort();
    assert!(out.len() >= 3, "v1.20, v1.24, v1.28 at least");
    out
}

/// The node-fact flags of a case (`conformance.py flags`), without its version and with no
/// nfacct counters (the namespaces have none).
fn case_flags(case: &Path) -> Vec<String> {
    let tools = versions_dir().join("../tools/conformance.py");
    let out = std::process::Command::new("python3")
        .arg(&tools)
        .arg("flags")
        .arg(case.join("case.yaml"))
        .output()
        .expect("python3 conformance.py flags");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let words: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let mut flags = Vec::new();
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        if w == "--kube-proxy-version" || w == "--nfacct" {
            it.next();
            continue;
        }
        flags.push(w);
    }
    flags.extend(["--nfacct".to_string(), "none".to_string()]);
    flags
}

fn kproxy(cmd: &str, case: &Path, flags: &[String]) -> Command {
    let mut c = Command::cargo_bin("kubectl-kproxy").expect("binary");
    c.arg(cmd)
        .arg("--state")
        .arg(case.join("state.json"))
        .arg("--config")
        .arg(case.join("config.yaml"))
        .args(flags)
        .env("NO_COLOR", "1")
        .timeout(Duration::from_secs(120));
    c
}

/// `verify -o json` of `dump`: (exit code, the report, stderr).
fn verify_json(case: &Path, flags: &[String], dump: &Path, extra: &[&str]) -> (i32, Value, String) {
    let out = kproxy("verify", case, flags)
        .arg("--iptables-save")
        .arg(dump)
        .args(["-o", "json"])
        .args(extra)
        .output()
        .expect("verify");
    let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (
        out.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn findings(report: &Value, keep: impl Fn(&Value) -> bool) -> Vec<&Value> {
    report["findings"]
        .as_array()
        .map(|a| a.iter().filter(|f| keep(f)).collect())
        .unwrap_or_default()
}

fn ids(report: &Value) -> Vec<&str> {
    findings(report, |_| true)
        .iter()
        .filter_map(|f| f["id"].as_str())
        .collect()
}

/// The kube-proxy nfacct counters (1.31 and later count with them when the node has them).
const COUNTERS: &str = "ct_state_invalid_dropped_pkts,localhost_nps_accepted_pkts";

#[test]
fn each_release_restored_in_the_kernel_verifies_as_its_own_and_as_another_for_the_newest() {
    let mut tools = Backend::Nft.tools().to_vec();
    tools.push("nfacct");
    if !require_root_and_tools(&tools) {
        return;
    }
    for (case, version) in cases() {
        let flags = case_flags(&case);
        let render = kproxy("render", &case, &flags)
            .args(["--with-base-jumps", "--kube-proxy-version", &version])
            .output()
            .expect("render");
        assert!(
            render.status.success(),
            "{}",
            String::from_utf8_lossy(&render.stderr)
        );
        let rules = String::from_utf8_lossy(&render.stdout).into_owned();
        let ns = Netns::new("versions").expect("netns");
        ns.restore_family(Backend::Nft, Family::V4, &rules, false)
            .unwrap_or_else(|e| panic!("{}: restore: {e}", case.display()));
        let save = ns
            .save_family(Backend::Nft, Family::V4, true)
            .expect("save");
        let dump = tempfile::NamedTempFile::new().expect("tmp");
        std::fs::write(dump.path(), &save).expect("write");
        let name = case.display();

        // With its own release: nothing at all.
        let (code, own, stderr) = verify_json(
            &case,
            &flags,
            dump.path(),
            &["--kube-proxy-version", &version],
        );
        assert_eq!(
            (code, ids(&own)),
            (0, vec![]),
            "{name} as {version}: {own:#}\n{stderr}"
        );

        // Without the flag: the rules say which release, and the choice is said.
        let (code, inferred, stderr) = verify_json(&case, &flags, dump.path(), &[]);
        let noisy = findings(&inferred, |f| f["severity"] != "info");
        assert!(
            code == 0 && noisy.is_empty(),
            "{name} inferred: {inferred:#}\n{stderr}"
        );
        let said = findings(&inferred, |f| f["id"] == "KP907");
        let message = said
            .first()
            .and_then(|f| f["message"].as_str())
            .unwrap_or("");
        assert!(
            message.starts_with("rules look written by kube-proxy 1."),
            "{name}: {message}"
        );
        let (lo, hi) = range_of(message);
        let minor = minor_of(&version);
        assert!(
            lo <= minor && minor <= hi,
            "{name}: {version} outside {message}"
        );
        assert!(
            stderr.contains("note: rules look written by kube-proxy"),
            "{name}: no note on stderr: {stderr}"
        );

        // With the newest: on this node without nfacct counters 1.27 … 1.35 write the same
        // rules; older releases' are one finding that says so, whatever the number of rules.
        let (code, newest, stderr) = verify_json(
            &case,
            &flags,
            dump.path(),
            &["--kube-proxy-version", "1.35"],
        );
        if minor >= 27 {
            assert_eq!(
                (code, ids(&newest)),
                (0, vec![]),
                "{name} as 1.35: {newest:#}"
            );
        } else {
            let exact = (minor, minor);
            assert_one_other_release(&name.to_string(), exact, code, &newest, &stderr);
        }

        // The node has kube-proxy's nfacct counters: still the release's own rules, the
        // release they point to (counted drops are 1.31's), and every release before 1.31 is
        // another than the newest.
        for counter in COUNTERS.split(',') {
            ns.run(&["nfacct", "add", counter]).expect("nfacct add");
        }
        let mut counted = flags.clone();
        counted.truncate(counted.len() - 2);
        counted.extend(["--nfacct".to_string(), COUNTERS.to_string()]);
        let own_version = ["--kube-proxy-version", version.as_str()];
        let (code, own, stderr) = verify_json(&case, &counted, dump.path(), &own_version);
        assert_eq!(
            (code, ids(&own)),
            (0, vec![]),
            "{name} as {version} with counters: {own:#}\n{stderr}"
        );
        let (code, inferred, stderr) = verify_json(&case, &counted, dump.path(), &[]);
        let said = findings(&inferred, |f| f["id"] == "KP907");
        let message = said
            .first()
            .and_then(|f| f["message"].as_str())
            .unwrap_or("");
        let (lo, hi) = range_of(message);
        assert!(
            code == 0 && lo <= minor && minor <= hi && hi <= 30,
            "{name} with counters: {inferred:#}\n{stderr}"
        );
        let newest_version = ["--kube-proxy-version", "1.35"];
        let (code, newest, stderr) = verify_json(&case, &counted, dump.path(), &newest_version);
        assert_one_other_release(&name.to_string(), (lo, hi), code, &newest, &stderr);
    }
}

/// One KP906 finding (and nothing else) saying the rules are those of a release in
/// `lo ..= hi` (what the rules tell), not 1.35's.
fn assert_one_other_release(
    name: &str,
    (lo, hi): (u32, u32),
    code: i32,
    report: &Value,
    stderr: &str,
) {
    let grouped = findings(report, |_| true);
    assert_eq!(grouped.len(), 1, "{name} as 1.35: {report:#}\n{stderr}");
    assert_eq!(grouped[0]["id"], "KP906", "{name}: {report:#}");
    let text = grouped[0]["message"].as_str().unwrap_or("");
    let writer = text
        .split("differ the way rules of kube-proxy ")
        .nth(1)
        .and_then(|t| t.split(' ').next())
        .map(minor_of)
        .unwrap_or(0);
    assert!(
        lo <= writer
            && writer <= hi
            && text.contains(" differ from 1.35: rules written by another"),
        "{name}: {text}"
    );
    let n: usize = text
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(n >= 2, "{name}: {text}");
    assert_eq!(code, 1, "{name}: a warning");
    assert!(stderr.contains("(KP906)"), "{name}: {stderr}");
}

/// `(lo, hi)` minor numbers of "… kube-proxy 1.A–1.B; …" or "… kube-proxy 1.A; …".
fn range_of(message: &str) -> (u32, u32) {
    let range = message
        .split("kube-proxy ")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .unwrap_or("");
    let mut ends = range.split('–').map(minor_of);
    let lo = ends.next().unwrap_or(0);
    (lo, ends.next().unwrap_or(lo))
}

fn minor_of(v: &str) -> u32 {
    v.trim().trim_start_matches("1.").parse().unwrap_or(0)
}

/// A fake cluster serving the v1.24 golden case, its kube-proxy pod running `image`, and the
/// 1.24 render as the node's rules.
struct Live {
    api: FakeApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    case: PathBuf,
}

impl Live {
    fn new(image: &str) -> Option<Live> {
        let (case, _) = cases().into_iter().find(|(_, v)| v == "1.24")?;
        let flags = case_flags(&case);
        let render = kproxy("render", &case, &flags)
            .args(["--kube-proxy-version", "1.24", "--with-base-jumps"])
            .output()
            .expect("render");
        let rules = String::from_utf8_lossy(&render.stdout).into_owned();
        let api = FakeApiServer::start();
        api.add_list_file(&case.join("state.json"));
        let config = std::fs::read_to_string(case.join("config.yaml")).expect("config");
        api.add_configmap("kube-system", "kube-proxy", &[("config.conf", &config)]);
        api.add_objects([json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "kube-proxy-abcde", "namespace": "kube-system",
                         "labels": {"k8s-app": "kube-proxy"}},
            "spec": {"nodeName": "test-hostname",
                     "containers": [{"name": "kube-proxy", "image": image}]},
            "status": {"phase": "Running"},
        })]);
        api.on_exec(move |req| match req.command.first().map(String::as_str) {
            Some("iptables-save") => ExecReply::ok(rules.clone()),
            Some("ipset") => ExecReply::ok(""),
            _ => ExecReply::Missing,
        });
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = api.write_kubeconfig(dir.path());
        Some(Live {
            api,
            dir,
            kubeconfig,
            case,
        })
    }

    /// `verify test-hostname -o json` through the API (or `args` instead of the node).
    fn verify(&self, args: &[&str]) -> (i32, Value, String) {
        let flags: Vec<String> = case_flags(&self.case)
            .into_iter()
            .skip_while(|f| f != "--ip-family")
            .collect();
        let out = Command::cargo_bin("kubectl-kproxy")
            .expect("binary")
            .arg("verify")
            .args(args)
            .args(&flags)
            .args(["-o", "json", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .env_remove("KUBECONFIG")
            .env("HOME", self.dir.path())
            .timeout(Duration::from_secs(60))
            .output()
            .expect("verify");
        let json: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}\nstderr: {}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        });
        (
            out.status.code().unwrap_or(-1),
            json,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

#[test]
fn the_pods_image_chooses_the_release_and_bundles_record_it() {
    let Some(live) = Live::new("registry.k8s.io/kube-proxy:v1.24.17") else {
        return;
    };
    let (code, report, stderr) = live.verify(&["test-hostname"]);
    assert_eq!((code, ids(&report)), (0, vec![]), "{report:#}\n{stderr}");
    assert!(!stderr.contains("note:"), "the image decided: {stderr}");
    assert!(
        live.api.requests().iter().any(|r| r.contains("/pods")),
        "the pod was read"
    );

    // collect records the image; verify --bundle chooses the same release offline.
    let bundle = live.dir.path().join("node.tar.gz");
    let out = Command::cargo_bin("kubectl-kproxy")
        .expect("binary")
        .args(["collect", "test-hostname", "-o"])
        .arg(&bundle)
        .arg("--kubeconfig")
        .arg(&live.kubeconfig)
        .env("HOME", live.dir.path())
        .timeout(Duration::from_secs(60))
        .output()
        .expect("collect");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (code, from_bundle, stderr) = live.verify(&["--bundle", bundle.to_str().expect("utf-8")]);
    assert_eq!(
        (code, ids(&from_bundle)),
        (0, vec![]),
        "{from_bundle:#}\n{stderr}"
    );
}

#[test]
fn an_image_of_a_newer_release_than_the_rules_is_one_finding() {
    let Some(live) = Live::new("registry.k8s.io/kube-proxy:v1.35.0") else {
        return;
    };
    let (code, report, stderr) = live.verify(&["test-hostname"]);
    assert_eq!(ids(&report), vec!["KP906"], "{report:#}\n{stderr}");
    assert_eq!(code, 1);
    assert!(
        stderr.contains("rules look written by kube-proxy 1.24, not 1.35 as the kube-proxy pod's image registry.k8s.io/kube-proxy:v1.35.0 says"),
        "{stderr}"
    );
}

#[test]
fn a_renamed_image_asks_for_the_flag_and_the_rules_decide() {
    let Some(live) = Live::new("rancher/hardened-kubernetes:v1.24.17-rke2r1-build20240000") else {
        return;
    };
    let (code, report, stderr) = live.verify(&["test-hostname"]);
    assert!(
        stderr.contains("is not kube-proxy's own image")
            && stderr.contains("pass --kube-proxy-version X.Y"),
        "{stderr}"
    );
    assert_eq!((code, ids(&report)), (0, vec!["KP907"]), "{report:#}");
    let message = report["findings"][0]["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("rules look written by kube-proxy 1.24; verifying with 1.24"),
        "{message}"
    );
    // The flag wins over both.
    let (code, report, _) = live.verify(&["test-hostname", "--kube-proxy-version", "1.24"]);
    assert_eq!((code, ids(&report)), (0, vec![]), "{report:#}");
}

/// `repair` writes the node's release: without the flag the 1.24 rules of a 1.24 node need
/// nothing, and the plan says which release it used; with 1.35 it would rewrite them.
#[test]
fn repair_keeps_the_release_that_wrote_the_rules() {
    let Some((case, _)) = cases().into_iter().find(|(_, v)| v == "1.24") else {
        return;
    };
    let flags = case_flags(&case);
    let render = kproxy("render", &case, &flags)
        .args(["--kube-proxy-version", "1.24", "--with-base-jumps"])
        .output()
        .expect("render");
    let dump = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(dump.path(), &render.stdout).expect("write");
    let plan = |extra: &[&str]| {
        let out = kproxy("repair", &case, &flags)
            .arg("--iptables-save")
            .arg(dump.path())
            .args(["-o", "json"])
            .args(extra)
            .output()
            .expect("repair");
        let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
        (doc, String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (doc, stderr) = plan(&[]);
    assert_eq!(doc["kube_proxy_version"], "1.24", "{doc:#}");
    assert_eq!(doc["kube_proxy_version_from"], "rules", "{doc:#}");
    assert_eq!(doc["outcome"], "nothing_to_do", "{doc:#}");
    assert!(
        stderr.contains("note: rules look written by kube-proxy 1.24; repairing with 1.24"),
        "{stderr}"
    );
    let (doc, _) = plan(&["--kube-proxy-version", "1.35"]);
    assert_eq!(
        (&doc["kube_proxy_version"], &doc["kube_proxy_version_from"]),
        (&json!("1.35"), &json!("flag"))
    );
    assert_eq!(doc["outcome"], "dry_run", "{doc:#}");
}

/// Every release's render of the v1.28 golden state (ClusterIP, NodePort and external IP
/// services, load balancers with and without source ranges, both external traffic policies, a
/// health check node port, a service without endpoints) restores into a namespace and verifies
/// clean as that release's rules.
#[test]
fn every_release_restores_and_verifies_clean_as_itself() {
    if !require_root_and_tools(&Backend::Nft.tools()) {
        return;
    }
    let Some((case, _)) = cases().into_iter().find(|(_, v)| v == "1.28") else {
        return;
    };
    let flags = case_flags(&case);
    for minor in 20..=35 {
        let version = format!("1.{minor}");
        let render = kproxy("render", &case, &flags)
            .args(["--with-base-jumps", "--kube-proxy-version", &version])
            .output()
            .expect("render");
        assert!(
            render.status.success(),
            "{version}: {}",
            String::from_utf8_lossy(&render.stderr)
        );
        let ns = Netns::new("releases").expect("netns");
        ns.restore_family(
            Backend::Nft,
            Family::V4,
            &String::from_utf8_lossy(&render.stdout),
            false,
        )
        .unwrap_or_else(|e| panic!("{version}: restore: {e}"));
        let save = ns
            .save_family(Backend::Nft, Family::V4, false)
            .expect("save");
        let dump = tempfile::NamedTempFile::new().expect("tmp");
        std::fs::write(dump.path(), &save).expect("write");
        let (code, report, stderr) = verify_json(
            &case,
            &flags,
            dump.path(),
            &["--kube-proxy-version", &version],
        );
        assert_eq!(
            (code, ids(&report)),
            (0, vec![]),
            "{version}: {report:#}\n{stderr}"
        );
    }
}
