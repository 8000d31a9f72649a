//! ServiceCIDRs in live mode (issue #38): kube-proxy's nftables mode drops traffic to the
//! unallocated cluster IPs of the ServiceCIDRs (`cluster-ips-check`: `ip daddr { CIDRs } drop
//! comment "Drop traffic to unallocated ClusterIPs"`), and the API server of every 1.33+
//! cluster has the default one. Read through the API (v1, or v1beta1 where only that is
//! served, none where the API does not exist), kept in bundles, so that a node whose table
//! kube-proxy wrote verifies clean through `kubectl kproxy` — on the real kernel, in a network
//! namespace loaded from the render.

use crate::support::fake_apiserver::{ExecReply, ExecRequest, FakeApiServer};
use crate::support::netns::{Netns, require_root_and_tools};
use crate::support::repair::cluster_file;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cluster's ServiceCIDR, as the API server makes it (`kubernetes`, from its
/// `--service-cluster-ip-range`).
fn default_service_cidr() -> Value {
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": "kubernetes"},
        "spec": {"cidrs": ["10.96.0.0/16", "fd00:10:96::/112"]},
    })
}

/// The rule kube-proxy writes for it in `table ip kube-proxy`.
const DROP_RULE: &str =
    "ip daddr { 10.96.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"";

/// `kubectl` and a directory holding the plugin (`kubectl-kproxy`, a link to the binary under
/// test), or `None` after a skip when kubectl is not installed.
fn plugin_dir(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let kubectl = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain([PathBuf::from("/usr/bin")])
        .map(|p| p.join("kubectl"))
        .find(|p| p.exists());
    let Some(kubectl) = kubectl else {
        crate::support::skip("service CIDRs", "kubectl not installed");
        return None;
    };
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_kubectl-kproxy"),
        bin.join("kubectl-kproxy"),
    )
    .expect("symlink");
    Some((kubectl, bin))
}

/// `kubectl kproxy ARGS…` through the real kubectl, against the fake cluster: (exit code, JSON
/// document or null, stderr).
fn kubectl_kproxy(
    (kubectl, bin): &(PathBuf, PathBuf),
    home: &Path,
    kubeconfig: &Path,
    args: &[&str],
) -> (Option<i32>, Value, String) {
    let path = std::env::join_paths(std::iter::once(bin.clone()).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))
    .expect("PATH");
    let o = Command::new(kubectl)
        .env("PATH", path)
        .env("HOME", home)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("NO_COLOR", "1")
        .arg("kproxy")
        .args(args)
        .output()
        .expect("kubectl kproxy");
    (
        o.status.code(),
        serde_json::from_slice(&o.stdout).unwrap_or(Value::Null),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The non-info findings of a report, as (id, chain).
fn findings(report: &Value) -> Vec<(String, String)> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["severity"] != "info")
        .map(|f| {
            (
                f["id"].as_str().unwrap_or_default().to_string(),
                f["chain"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

#[test]
fn live_nftables_verify_reads_service_cidrs_and_bundles_keep_them() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(kubectl) = plugin_dir(dir.path()) else {
        return;
    };
    // The example cluster in nftables mode, its state with the ServiceCIDR.
    let config_text = std::fs::read_to_string(cluster_file("config.yaml"))
        .expect("config")
        .replace("\nmode: iptables\n", "\nmode: nftables\n");
    assert!(config_text.contains("\nmode: nftables\n"));
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, &config_text).expect("config");
    let mut state: Value =
        serde_json::from_str(&std::fs::read_to_string(cluster_file("state.json")).expect("state"))
            .expect("state json");
    state["items"]
        .as_array_mut()
        .expect("items")
        .push(default_service_cidr());
    let state_path = dir.path().join("state.json");
    std::fs::write(&state_path, state.to_string()).expect("state");

    // The node: kube-proxy's tables as `render` writes them for that state.
    let render = |family: &str| {
        let o = crate::support::kproxy()
            .args(["render", "--mode", "nftables", "--ip-family", family])
            .arg("--state")
            .arg(&state_path)
            .arg("--config")
            .arg(&config)
            .output()
            .expect("render");
        assert!(o.status.success(), "{o:?}");
        String::from_utf8(o.stdout).expect("utf-8")
    };
    let (ip, ip6) = (render("4"), render("6"));
    assert!(
        ip.lines().any(
            |l| l.starts_with("add rule ip kube-proxy cluster-ips-check") && l.ends_with(DROP_RULE)
        ),
        "the render lacks the drop rule:\n{ip}"
    );
    let ns = Netns::new("svccidr").expect("netns");
    ns.nft_load(&ip).expect("load ip table");
    ns.nft_load(&ip6).expect("load ip6 table");
    let listing = ns
        .nft(&["list", "table", "ip", "kube-proxy"])
        .expect("list");
    // (nft lists a set of one element without its braces.)
    assert!(
        listing.contains(
            "ip daddr 10.96.0.0/16 drop comment \"Drop traffic to unallocated ClusterIPs\""
        ),
        "{listing}"
    );
    let list = |family: &str| {
        ns.nft(&["-j", "list", "table", family, "kube-proxy"])
            .expect("nft -j list table")
    };
    let tables = (list("ip"), list("ip6"));

    // The cluster: the same objects through the API, a kube-proxy pod answering with the
    // namespace's tables.
    let api = FakeApiServer::start();
    api.add_list_file(&cluster_file("state.json"));
    api.add_objects([default_service_cidr()]);
    api.add_configmap(
        "kube-system",
        "kube-proxy",
        &[("config.conf", &config_text)],
    );
    api.add_proxy_pod("node-1");
    api.on_exec(move |req: &ExecRequest| {
        let argv: Vec<&str> = req.command.iter().map(String::as_str).collect();
        match argv.as_slice() {
            ["iptables-save"] => ExecReply::ok("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"),
            ["nft", "-j", "list", "table", "ip", "kube-proxy"] => ExecReply::ok(tables.0.clone()),
            ["nft", "-j", "list", "table", "ip6", "kube-proxy"] => ExecReply::ok(tables.1.clone()),
            _ => ExecReply::Missing,
        }
    });
    let kubeconfig = api.write_kubeconfig(dir.path());
    let home = dir.path();
    let verify = |args: &[&str]| kubectl_kproxy(&kubectl, home, &kubeconfig, args);

    // Served as v1 (1.33+) or only as v1beta1 (1.31–1.32): the rule is kube-proxy's, clean.
    for versions in [&["v1"][..], &["v1beta1"][..]] {
        api.serve_service_cidrs(versions);
        let (code, report, stderr) = verify(&["verify", "node-1", "-o", "json"]);
        assert_eq!(code, Some(0), "{versions:?}: {stderr}\n{report:#}");
        assert_eq!(report["mode"], "nftables", "{report}");
        assert!(
            api.requests().iter().any(|r| r.starts_with(&format!(
                "GET /apis/networking.k8s.io/{}/servicecidrs",
                versions[0]
            ))),
            "{versions:?}: {:?}",
            api.requests()
        );
    }
    // The bundle keeps them: read back, it verifies clean too, and its state renders the rule.
    api.serve_service_cidrs(&["v1"]);
    let bundle = dir.path().join("node-1.tar.gz");
    let b = bundle.to_str().expect("utf-8");
    let (code, _, stderr) = verify(&["collect", "node-1", "-o", b]);
    assert_eq!(code, Some(0), "{stderr}");
    let read = kproxy::collect::bundle::read(&bundle).expect("bundle");
    let cidrs: Vec<Vec<String>> = read
        .state
        .service_cidrs
        .iter()
        .map(|c| {
            c.spec
                .as_ref()
                .and_then(|s| s.cidrs.clone())
                .unwrap_or_default()
        })
        .collect();
    assert_eq!(cidrs, [["10.96.0.0/16", "fd00:10:96::/112"]]);
    let (code, report, stderr) = verify(&["verify", "--bundle", b, "-o", "json"]);
    assert_eq!(code, Some(0), "{stderr}\n{report:#}");

    // A server without the API (before 1.31) has none: the same node's drop rule is then not
    // kube-proxy's, and is reported — what every live run did before ServiceCIDRs were read.
    api.serve_service_cidrs(&[]);
    let (code, report, stderr) = verify(&["verify", "node-1", "-o", "json"]);
    assert_eq!(code, Some(1), "{stderr}\n{report:#}");
    assert!(
        findings(&report)
            .iter()
            .any(|(_, chain)| chain == "cluster-ips-check"),
        "{report:#}"
    );
    // Any other failure to read them is an error, never a render without them.
    api.serve_service_cidrs(&["v1"]);
    api.fail(None, "servicecidrs", 403);
    let (code, _, stderr) = verify(&["verify", "node-1", "-o", "json"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("servicecidrs.networking.k8s.io"),
        "{stderr}"
    );
}

/// `resync --local --watch` of an nftables node watches the ServiceCIDRs: the first sync writes
/// the drop rule, a ServiceCIDR added later joins it, a deleted one leaves it.
#[test]
fn resync_watches_service_cidrs() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config_text = std::fs::read_to_string(cluster_file("config.yaml"))
        .expect("config")
        .replace("\nmode: iptables\n", "\nmode: nftables\n");
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, &config_text).expect("config");
    let ns = Netns::new("svccidr-resync").expect("netns");
    let api = FakeApiServer::start();
    api.add_list_file(&cluster_file("state.json"));
    api.add_objects([default_service_cidr()]);
    let kubeconfig = api.write_kubeconfig(dir.path());
    let log = dir.path().join("resync.log");
    let child = crate::support::kproxy_on_api(&kubeconfig, dir.path())
        .args(["resync", "--local", "--watch", "--netns", ns.name()])
        .args(["--node", "node-1", "--min-sync-period", "200ms"])
        // Another test of the suite runs a process named kube-proxy.
        .arg("--force")
        .arg("--config")
        .arg(&config)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn resync");
    let _resync = Stopped(child);
    let until = |what: &str, ok: &dyn Fn(&str) -> bool| {
        let start = std::time::Instant::now();
        loop {
            let listing = ns
                .nft(&["list", "chain", "ip", "kube-proxy", "cluster-ips-check"])
                .unwrap_or_default();
            if ok(&listing) {
                return;
            }
            if start.elapsed() > std::time::Duration::from_secs(20) {
                let log = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("{what}: not within 20 s\n{listing}\nresync log:\n{log}");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    until("the first sync", &|l| {
        l.contains("ip daddr 10.96.0.0/16 drop comment \"Drop traffic to unallocated ClusterIPs\"")
    });
    api.add_objects([json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "ServiceCIDR",
        "metadata": {"name": "extra"},
        "spec": {"cidrs": ["10.200.0.0/24"]},
    })]);
    until("the added ServiceCIDR", &|l| {
        l.contains("ip daddr { 10.96.0.0/16, 10.200.0.0/24 } drop")
    });
    assert!(api.delete_object("ServiceCIDR", None, "extra"));
    until("the deleted ServiceCIDR", &|l| {
        l.contains("ip daddr 10.96.0.0/16 drop") && !l.contains("10.200.0.0/24")
    });
}

/// A child process killed when dropped (the test passed or failed).
struct Stopped(std::process::Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
