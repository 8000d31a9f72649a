//! Mass drift stays readable: a node whose every `KUBE-SEP` rule carries a comment this
//! kube-proxy release does not write (large-cluster mode leaves them out) gives one finding for
//! the cause, with the count and examples; `--all-findings` lists each rule. The exit status says
//! drift either way.

use crate::support::kproxy;
use std::path::{Path, PathBuf};
use std::process::Output;

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p)
}

/// Services × endpoints: more than 1,000 endpoints, so kube-proxy runs in large-cluster mode and
/// writes no comment on endpoint chains' rules.
const SERVICES: usize = 120;
const ENDPOINTS: usize = 10;

/// A state, kube-proxy's rules for it, and the same rules with a comment on every `KUBE-SEP` rule.
struct Node {
    dir: PathBuf,
}

impl Node {
    /// The node's files, or `None` after a skip when python3 or bash is missing.
    fn make() -> Option<Node> {
        for t in ["python3", "bash"] {
            crate::support::tool("mass_drift", t)?;
        }
        let dir = std::env::temp_dir().join(format!("kproxy-mass-drift-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let state = std::process::Command::new("python3")
            .arg(repo("testdata/gen-scale-state.py"))
            .args([SERVICES.to_string(), ENDPOINTS.to_string()])
            .output()
            .expect("python3 runs gen-scale-state.py");
        assert!(state.status.success(), "{state:?}");
        std::fs::write(dir.join("state.json"), &state.stdout).expect("state.json");
        std::fs::write(
            dir.join("config.yaml"),
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: iptables\nhostnameOverride: node-1\nclusterCIDR: 10.64.0.0/10\ndetectLocalMode: ClusterCIDR\n",
        )
        .expect("config.yaml");
        let node = Node { dir };
        let render = node.run(&["render", "--with-base-jumps", "--nfacct", "none"]);
        assert!(render.status.success(), "{render:?}");
        std::fs::write(node.dir.join("clean.save"), &render.stdout).expect("clean.save");
        let comments = std::process::Command::new(repo("testdata/make-sep-comment-dump.sh"))
            .arg(node.dir.join("clean.save"))
            .arg(node.dir.join("comments.save"))
            .output()
            .expect("make-sep-comment-dump.sh runs");
        assert!(comments.status.success(), "{comments:?}");
        Some(node)
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The binary with `args` and this node's state and configuration.
    fn run(&self, args: &[&str]) -> Output {
        kproxy()
            .args(args)
            .args(["--state", &self.path("state.json")])
            .args(["--config", &self.path("config.yaml")])
            .output()
            .expect("kubectl-kproxy runs")
    }

    fn verify(&self, dump: &str, extra: &[&str]) -> (Option<i32>, serde_json::Value) {
        let dump = self.path(dump);
        let mut args = vec![
            "verify",
            "node-1",
            "--iptables-save",
            &dump,
            "--kube-proxy-version",
            "1.35",
        ];
        args.extend(extra);
        let out = self.run(&args);
        let json = if extra.contains(&"json") {
            serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
        } else {
            serde_json::Value::String(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        (out.status.code(), json)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn findings(report: &serde_json::Value) -> &Vec<serde_json::Value> {
    report["findings"].as_array().expect("findings")
}

#[test]
fn every_sep_rule_with_a_comment_is_one_finding_with_its_count() {
    let Some(node) = Node::make() else { return };
    assert!(Path::new(&node.path("comments.save")).exists());
    let (code, clean) = node.verify("clean.save", &["-o", "json"]);
    assert_eq!(code, Some(0), "{clean}");
    assert!(clean.get("findings_truncated").is_none(), "{clean}");

    // Each endpoint chain has two rules (masquerade of its own traffic, DNAT).
    let rules = SERVICES * ENDPOINTS * 2;
    let (code, grouped) = node.verify("comments.save", &["-o", "json"]);
    assert_eq!(code, Some(1), "drift");
    let shown = findings(&grouped);
    assert!(shown.len() <= 10, "{} findings: {grouped}", shown.len());
    let group = shown
        .iter()
        .find(|f| f["group"].is_object())
        .unwrap_or_else(|| panic!("a group finding in {grouped}"));
    assert_eq!(group["id"], "KP903");
    assert_eq!(group["chain"], "nat KUBE-SEP-…");
    assert_eq!(group["group"]["count"], rules);
    assert_eq!(
        group["group"]["services"], 0,
        "endpoint rules name no service port"
    );
    assert_eq!(group["group"]["chains"], SERVICES * ENDPOINTS);
    assert_eq!(group["group"]["examples"].as_array().map(Vec::len), Some(3));
    let message = group["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with(&format!(
            "{} rules in {} nat KUBE-SEP-… chains carry `-m comment --comment \"…\"`, which this kube-proxy version does not write",
            thousands(rules),
            thousands(SERVICES * ENDPOINTS)
        )),
        "{message}"
    );
    assert_eq!(
        grouped["summary"]["warnings"], rules,
        "the summary counts each"
    );
    let truncated = grouped["findings_truncated"]
        .as_u64()
        .expect("findings_truncated");

    let (code, all) = node.verify("comments.save", &["-o", "json", "--all-findings"]);
    assert_eq!(code, Some(1), "drift");
    let each = findings(&all);
    assert_eq!(
        each.iter().filter(|f| f["id"] == "KP903").count(),
        rules,
        "one finding per rule"
    );
    assert!(all.get("findings_truncated").is_none());
    assert_eq!(each.len() as u64, shown.len() as u64 + truncated);
    assert_eq!(all["summary"], grouped["summary"]);

    let (code, table) = node.verify("comments.save", &[]);
    assert_eq!(code, Some(1));
    let table = table.as_str().unwrap_or_default();
    assert!(table.contains("WARNINGS (1)"), "{table}");
    assert!(
        table.contains(&format!(
            "{} more findings are shown grouped by cause (--all-findings lists each)",
            thousands(rules - 1)
        )),
        "{table}"
    );
}

/// `1234` → `1,234`, as the report prints counts.
fn thousands(n: usize) -> String {
    kproxy::compare::report::thousands(n)
}

/// A state of 5,000 endpoints (50 service ports × 100) verified against the rules kube-proxy
/// writes for one endpoint each: one finding per missing endpoint, folded by cause, so the
/// report stays small whatever the count (`mode`: `iptables` or `nftables`).
fn endpoints_the_dump_lacks(mode: &str, dump_flag: &str, folded_id: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = |name: &str| dir.path().join(name).display().to_string();
    for (name, endpoints) in [("state.json", "100"), ("one.json", "1")] {
        let state = std::process::Command::new("python3")
            .arg(repo("testdata/gen-scale-state.py"))
            .args(["50", endpoints])
            .output()
            .expect("python3 runs gen-scale-state.py");
        assert!(state.status.success(), "{state:?}");
        std::fs::write(path(name), &state.stdout).expect("state");
    }
    std::fs::write(
        path("config.yaml"),
        format!("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: {mode}\nhostnameOverride: node-1\nclusterCIDR: 10.64.0.0/10\n"),
    )
    .expect("config.yaml");
    let render = kproxy()
        .args(["render", "--mode", mode, "--state", &path("one.json")])
        .args(["--config", &path("config.yaml")])
        .output()
        .expect("render runs");
    assert!(render.status.success(), "{render:?}");
    std::fs::write(path("dump"), &render.stdout).expect("dump");
    let verify = |extra: &[&str]| {
        kproxy()
            .args(["verify", "node-1", "--state", &path("state.json")])
            .args(["--config", &path("config.yaml"), dump_flag, &path("dump")])
            .args(extra)
            .output()
            .expect("verify runs")
    };
    let out = verify(&["-o", "json"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let shown = findings(&report);
    let errors = report["summary"]["errors"].as_u64().unwrap_or_default();
    assert!(errors >= 4_950, "{mode}: {errors} errors");
    assert!(
        shown.len() <= 200 && out.stdout.len() < 200_000,
        "{mode}: {} findings, {} bytes shown for {errors} errors",
        shown.len(),
        out.stdout.len()
    );
    // The largest group of the ID: the endpoints of the service ports without session
    // affinity (those with it lack other rules, another cause).
    let group = shown
        .iter()
        .filter(|f| f["id"] == folded_id)
        .filter_map(|f| f["group"]["count"].as_u64())
        .max()
        .unwrap_or_else(|| panic!("{mode}: no group of {folded_id}"));
    assert!(
        group >= 4_700,
        "{mode}: the {folded_id} group holds {group}"
    );
    let table = verify(&[]);
    assert!(
        table.stdout.len() < 100_000,
        "{mode}: the table is {} bytes",
        table.stdout.len()
    );
    let all = verify(&["-o", "json", "--all-findings"]);
    let all: serde_json::Value = serde_json::from_slice(&all.stdout).expect("json");
    assert!(
        findings(&all).len() as u64 >= errors,
        "--all-findings lists each"
    );
}

#[test]
fn endpoints_the_dump_lacks_are_folded_iptables() {
    endpoints_the_dump_lacks("iptables", "--iptables-save", "KP201");
}

#[test]
fn endpoints_the_dump_lacks_are_folded_nftables() {
    endpoints_the_dump_lacks("nftables", "--nft-ruleset", "KP732");
}
