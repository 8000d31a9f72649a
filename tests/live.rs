//! Live cluster access (issue 7) against the in-process fake apiserver: collectors, bundles,
//! failure messages, completion, `--all-nodes` fan-out, and the real `kubectl` binary.

use crate::support::fake_apiserver::{ExecReply, ExecRequest, FakeApiServer};
use assert_cmd::Command;
use kproxy::kube_client::ClientOptions;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The conformance case the live tests serve (read from `../shared`, never copied).
fn shared_case() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/conformance/iptables/render/overall-iptables-rules")
}

/// A fixture file: the conformance case's state, config and restore text (as `iptables-save.txt`),
/// and `testdata/live/ip6tables-save.txt`.
fn testdata(name: &str) -> PathBuf {
    match name {
        "state.json" | "config.yaml" => shared_case().join(name),
        "iptables-save.txt" => shared_case().join("expected.iptables"),
        _ => Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/live")
            .join(name),
    }
}

/// Whether the shared conformance case is present (prints a notice when it is not).
fn have_shared() -> bool {
    let ok = shared_case().is_dir();
    if !ok {
        crate::support::skip("live", &format!("{} is absent", shared_case().display()));
    }
    ok
}

fn read(name: &str) -> String {
    std::fs::read_to_string(testdata(name)).expect("testdata")
}

/// A fake cluster: the `overall-iptables-rules` API state, kube-proxy's ConfigMap, a
/// kube-proxy pod on `test-node` whose image has iptables-save, ip6tables-save and ipset but
/// no ipvsadm and no legacy/nft variants.
struct Cluster {
    api: FakeApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

fn standard_exec(req: &ExecRequest) -> ExecReply {
    match req.command.first().map(String::as_str) {
        Some("iptables-save") => ExecReply::ok(read("iptables-save.txt")),
        Some("ip6tables-save") => ExecReply::ok(read("ip6tables-save.txt")),
        Some("ipset") => ExecReply::ok(""),
        _ => ExecReply::Missing,
    }
}

impl Cluster {
    fn new() -> Cluster {
        let api = FakeApiServer::start();
        api.add_list_file(&testdata("state.json"));
        api.add_configmap(
            "kube-system",
            "kube-proxy",
            &[("config.conf", &read("config.yaml"))],
        );
        api.add_proxy_pod("test-node");
        api.on_exec(standard_exec);
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = api.write_kubeconfig(dir.path());
        Cluster {
            api,
            dir,
            kubeconfig,
        }
    }

    /// The binary with a clean environment (no KUBECONFIG, HOME in the tempdir).
    fn kproxy(&self) -> Command {
        let mut c = Command::cargo_bin("kubectl-kproxy").expect("binary");
        c.env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", self.dir.path())
            .env("NO_COLOR", "1")
            .timeout(Duration::from_secs(60));
        c
    }

    fn bundle_path(&self) -> PathBuf {
        self.dir.path().join("bundle.tar.gz")
    }

    /// Runs `collect test-node` with extra args, returning (exit code, stdout, stderr).
    fn collect(&self, extra: &[&str]) -> (i32, String, String) {
        let out = self
            .kproxy()
            .arg("collect")
            .args(extra)
            .arg("-o")
            .arg(self.bundle_path())
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .output()
            .expect("run");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

fn client_for(kubeconfig: &Path) -> ClientOptions {
    ClientOptions {
        kubeconfig: Some(kubeconfig.to_path_buf()),
        request_timeout: "0".into(),
        ..ClientOptions::default()
    }
}

#[test]
fn collect_exec_writes_a_bundle_that_reads_back() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.set_max_page(2);
    let (code, stdout, stderr) = c.collect(&["test-node"]);
    assert_eq!(code, 0, "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stderr.contains("ipvsadm"),
        "missing ipvsadm is a warning: {stderr}"
    );
    assert_eq!(
        stderr.matches("`nft` is not installed").count(),
        1,
        "missing nft is one warning: {stderr}"
    );

    let b = kproxy::collect::bundle::read(&c.bundle_path()).expect("bundle");
    assert_eq!(b.node, "test-node");
    assert_eq!(
        b.snapshot.iptables_save.as_deref(),
        Some(read("iptables-save.txt").as_str())
    );
    assert!(b.snapshot.ip6tables_save.is_some());
    assert_eq!(b.snapshot.ipset_save.as_deref(), Some(""));
    assert_eq!(b.snapshot.ipvsadm, None);
    assert_eq!(b.snapshot.iptables_legacy_save, None);
    assert!(
        b.snapshot
            .collector
            .contains("exec (kube-system/kube-proxy-test-node)"),
        "{}",
        b.snapshot.collector
    );
    assert_eq!(
        (
            b.state.services.len(),
            b.state.endpoint_slices.len(),
            b.state.nodes.len()
        ),
        (6, 5, 1)
    );
    let (config, source) = b.config.expect("config");
    assert_eq!(config, read("config.yaml"));
    assert!(
        source.contains("configmap kube-system/kube-proxy"),
        "{source}"
    );

    // Paginated lists: 6 services in pages of 2 need two continue tokens.
    let reqs = c.api.requests();
    let service_pages: Vec<&String> = reqs
        .iter()
        .filter(|r| r.starts_with("GET /api/v1/services"))
        .collect();
    assert_eq!(service_pages.len(), 3, "{service_pages:?}");
    assert!(
        service_pages
            .iter()
            .any(|r| r.contains("continue=offset-4"))
    );
    // The kube-proxy pod was found by label and node field selector.
    assert!(
        reqs.iter()
            .any(|r| r.contains("/namespaces/kube-system/pods?")
                && r.contains("labelSelector=k8s-app%3Dkube-proxy")
                && r.contains("fieldSelector=spec.nodeName%3Dtest-node")),
        "{reqs:?}"
    );
    // argv only, into the kube-proxy container.
    let execs = c.api.execs();
    let argvs: Vec<Vec<String>> = execs.iter().map(|e| e.command.clone()).collect();
    assert_eq!(
        argvs,
        vec![
            vec!["iptables-save".to_string()],
            vec!["ip6tables-save".to_string()],
            vec!["iptables-legacy-save".to_string()],
            vec!["iptables-nft-save".to_string()],
            vec!["ipset".to_string(), "save".to_string()],
            vec![
                "ipvsadm".to_string(),
                "-Ln".to_string(),
                "--exact".to_string()
            ],
            // The conntrack table: the tool, then the kernel's file (both missing here).
            ["conntrack", "-L", "-o", "extended"]
                .map(String::from)
                .to_vec(),
            ["cat", "/proc/net/nf_conntrack"].map(String::from).to_vec(),
            // kube-proxy's nftables table (nft missing here: the ip6 table is not asked for).
            ["nft", "-j", "list", "table", "ip", "kube-proxy"]
                .map(String::from)
                .to_vec(),
        ]
    );
    assert!(
        execs.iter().all(
            |e| e.pod == "kube-proxy-test-node" && e.container.as_deref() == Some("kube-proxy")
        )
    );
}

#[test]
fn bundle_round_trips_through_collect_files() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_eq!(code, 0, "{stderr}");
    // Re-collect from the bundle's own content by hand (offline files), compare.
    let first = kproxy::collect::bundle::read(&c.bundle_path()).expect("bundle");
    let second_path = c.dir.path().join("second.tar.gz");
    let before = c.api.requests().len();
    let out = c
        .kproxy()
        .args(["collect", "test-node", "--collector", "files"])
        .arg("--iptables-save")
        .arg(testdata("iptables-save.txt"))
        .arg("--state")
        .arg(testdata("state.json"))
        .arg("--config")
        .arg(testdata("config.yaml"))
        .arg("-o")
        .arg(&second_path)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = kproxy::collect::bundle::read(&second_path).expect("bundle");
    assert_eq!(first.snapshot.iptables_save, second.snapshot.iptables_save);
    assert_eq!(first.state.services, second.state.services);
    assert_eq!(first.state.endpoint_slices, second.state.endpoint_slices);
    assert_eq!(first.config.map(|c| c.0), second.config.map(|c| c.0));
    assert_eq!(
        before,
        c.api.requests().len(),
        "offline collection does not contact the API"
    );
}

#[test]
fn debug_pod_is_created_on_the_node_and_deleted() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.on_exec(|req| match req.command.first().map(String::as_str) {
        Some("iptables-save") => ExecReply::ok(read("iptables-save.txt")),
        Some("ipvsadm") => ExecReply::ok("IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n"),
        _ => ExecReply::ok(""),
    });
    let (code, _, stderr) = c.collect(&[
        "test-node",
        "--collector",
        "debug-pod",
        "--image",
        "example/tools:1",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let created = c.api.created_pods();
    assert_eq!(created.len(), 1, "{created:?}");
    assert!(
        created[0].starts_with("kube-system/kproxy-debug-test-node-"),
        "{created:?}"
    );
    assert_eq!(c.api.deleted_pods(), created, "the debug pod is deleted");
    assert!(
        c.api
            .execs()
            .iter()
            .all(|e| format!("{}/{}", e.namespace, e.pod) == created[0]
                && e.container.as_deref() == Some("kproxy"))
    );
    let b = kproxy::collect::bundle::read(&c.bundle_path()).expect("bundle");
    assert!(b.snapshot.ipvsadm.is_some());
    assert!(b.snapshot.collector.contains("example/tools:1"));
}

#[test]
fn debug_pod_is_deleted_when_collection_fails() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.on_exec(|_| ExecReply::Missing);
    let (code, _, stderr) = c.collect(&["test-node", "--collector", "debug-pod"]);
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("`iptables-save` is not installed"),
        "{stderr}"
    );
    assert_eq!(c.api.created_pods().len(), 1);
    assert_eq!(c.api.deleted_pods(), c.api.created_pods());
}

/// Asserts exit 2 and exactly one `error: …` line containing every `needle`.
fn assert_one_error(code: i32, stderr: &str, needles: &[&str]) {
    assert_eq!(code, 2, "exit code; stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one message: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for n in needles {
        assert!(lines[0].contains(n), "{n:?} not in {stderr}");
    }
}

#[test]
fn failure_apiserver_down() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let text = std::fs::read_to_string(&c.kubeconfig)
        .expect("kubeconfig")
        .replace(&c.api.url(), &format!("http://127.0.0.1:{port}"));
    std::fs::write(&c.kubeconfig, text).expect("write");
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_one_error(
        code,
        &stderr,
        &["cannot reach the API server", &format!("127.0.0.1:{port}")],
    );
}

#[test]
fn failure_forbidden_names_verb_and_resource() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.fail(Some("GET"), "/endpointslices", 403);
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_one_error(
        code,
        &stderr,
        &[
            "forbidden (403)",
            "list endpointslices.discovery.k8s.io",
            "deploy/rbac.yaml",
        ],
    );

    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.fail(None, "/exec", 403);
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_one_error(
        code,
        &stderr,
        &["forbidden (403)", "create pods/exec", "kube-system"],
    );
}

#[test]
fn failure_unauthorized() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let (code, _, stderr) = c.collect(&["test-node", "--context", "fake-bad-token"]);
    assert_one_error(code, &stderr, &["unauthorized (401)", "list"]);
}

#[test]
fn failure_server_error() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.fail(None, "/configmaps/kube-proxy", 500);
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_one_error(code, &stderr, &["500", "get configmaps \"kube-proxy\""]);
}

#[test]
fn missing_configmap_is_a_warning_but_a_named_one_is_an_error() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let (code, _, stderr) = c.collect(&["test-node", "--proxy-configmap", "kube-system/nope"]);
    assert_one_error(code, &stderr, &["not found (404)", "configmaps \"nope\""]);

    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.fail(None, "/configmaps/kube-proxy", 404);
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stderr.contains("ConfigMap kube-system/kube-proxy not found"),
        "{stderr}"
    );
}

#[test]
fn failure_no_proxy_pod_and_unknown_node() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.add_node("lonely", "192.168.0.9");
    let (code, _, stderr) = c.collect(&["lonely"]);
    assert_one_error(
        code,
        &stderr,
        &[
            "no kube-proxy pod on node \"lonely\"",
            "k8s-app=kube-proxy",
            "--collector debug-pod",
        ],
    );
    let (code, _, stderr) = c.collect(&["ghost"]);
    assert_one_error(code, &stderr, &["node \"ghost\" not found", "test-node"]);
}

#[test]
fn failure_binary_missing_in_pod() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.on_exec(|_| ExecReply::Missing);
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_one_error(
        code,
        &stderr,
        &["`iptables-save` is not installed in pod kube-system/kube-proxy-test-node"],
    );
}

#[test]
fn failure_exec_timeout() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.on_exec(|_| ExecReply::Hang);
    let started = std::time::Instant::now();
    let (code, _, stderr) = c.collect(&["test-node", "--exec-timeout", "1s"]);
    assert_one_error(
        code,
        &stderr,
        &[
            "`iptables-save` on pod kube-system/kube-proxy-test-node did not finish within 1s",
            "--exec-timeout",
        ],
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn failure_garbage_output() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api
        .on_exec(|_| ExecReply::ok("sh: iptables-save: permission denied\n"));
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_one_error(
        code,
        &stderr,
        &[
            "printed something that is not iptables-save output",
            "line 1",
        ],
    );

    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.on_exec(|_| ExecReply::Output {
        stdout: String::new(),
        stderr: "iptables v1.8: can't initialize".into(),
        exit_code: 3,
    });
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_one_error(code, &stderr, &["exited with status 3", "can't initialize"]);
}

/// `verify --all-nodes --parallel N` reads every node, never more than N at a time (exactly one
/// with `--parallel 1`), prints one row per node and exits with the worst row's outcome.
#[test]
fn all_nodes_fan_out_honours_parallel() {
    if !have_shared() {
        return;
    }
    let api = FakeApiServer::start();
    for i in 0..50 {
        let node = format!("node-{i:02}");
        api.add_node(&node, &format!("10.1.0.{}", i + 1));
        api.add_proxy_pod(&node);
    }
    api.on_exec(standard_exec);
    api.set_exec_delay(Duration::from_millis(20));
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    for parallel in [1u16, 4] {
        let out = Command::cargo_bin("kubectl-kproxy")
            .expect("binary")
            .env_remove("KUBECONFIG")
            .env("HOME", dir.path())
            .env("NO_COLOR", "1")
            .timeout(Duration::from_secs(120))
            .args(["verify", "--all-nodes", "--no-headers", "--parallel"])
            .arg(parallel.to_string())
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .expect("verify --all-nodes");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let rows: Vec<&str> = stdout.lines().collect();
        assert_eq!(rows.len(), 50, "one row per node\n{stdout}");
        let worst = rows
            .iter()
            .map(|r| {
                if r.ends_with(" ok") {
                    0
                } else if r.ends_with(" drift") {
                    1
                } else {
                    2
                }
            })
            .max();
        assert_eq!(out.status.code(), worst, "worst row wins\n{stdout}");
        let max = api.max_concurrent_execs();
        assert!(
            max <= usize::from(parallel),
            "parallel {parallel}: {max} execs at once"
        );
        if parallel == 1 {
            assert_eq!(max, 1);
        } else {
            assert!(max >= 2, "parallel {parallel}: only {max} at once");
        }
    }
}

#[test]
fn watch_and_label_selectors_work_on_the_fake() {
    use futures::StreamExt;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, ListParams, WatchEvent, WatchParams};
    let api = FakeApiServer::start();
    api.add_node("a", "10.0.0.1");
    api.add_node("b", "10.0.0.2");
    let dir = tempfile::tempdir().expect("tempdir");
    let client = client_for(&api.write_kubeconfig(dir.path()));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let conn = kproxy::kube_client::connect(&client)
            .await
            .expect("connect");
        let nodes: Api<Node> = Api::all(conn.client.clone());
        let events: Vec<_> = nodes
            .watch(&WatchParams::default(), "0")
            .await
            .expect("watch")
            .collect()
            .await;
        let added = events
            .iter()
            .filter(|e| matches!(e, Ok(WatchEvent::Added(_))))
            .count();
        assert_eq!(added, 2);
        let only_b = nodes
            .list(&ListParams::default().labels("kubernetes.io/hostname=b"))
            .await
            .expect("list");
        assert_eq!(only_b.items.len(), 1);
    });
}

#[test]
fn cobra_completion_lists_nodes_namespaces_services() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let run = |words: &[&str]| {
        let out = c
            .kproxy()
            .arg("__complete")
            .args(words)
            .env("KUBECONFIG", &c.kubeconfig)
            .output()
            .expect("run");
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(run(&["verify", ""]), "test-node\n:4\n");
    assert_eq!(run(&["collect", "te"]), "test-node\n:4\n");
    let ns = run(&["verify", "-n", ""]);
    assert!(
        ns.contains("ns1\n") && ns.contains("kube-system\n") && ns.ends_with(":4\n"),
        "{ns}"
    );
    assert_eq!(run(&["trace", "-n", "ns2", "svc/"]), "svc/svc2\n:4\n");
    assert_eq!(run(&["trace", "svc/svc1", "--node", ""]), "test-node\n:4\n");
    assert_eq!(run(&["--context", ""]), "fake\nfake-bad-token\n:4\n");
    assert!(run(&[""]).contains("verify\n"));
}

#[test]
fn static_completion_scripts() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    for shell in ["bash", "zsh", "fish"] {
        let out = c
            .kproxy()
            .args(["completion", shell])
            .output()
            .expect("run");
        assert!(out.status.success());
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("kubectl-kproxy"),
            "{shell}"
        );
    }
}

/// A directory holding `kubectl-kproxy` (symlink to the built binary) and the shipped
/// `kubectl_complete-kproxy`, for PATH.
fn plugin_dir(c: &Cluster) -> Option<PathBuf> {
    if !Path::new("/usr/bin/kubectl").exists() && which("kubectl").is_none() {
        crate::support::skip("live", "kubectl not installed: skipping");
        return None;
    }
    let bin = assert_cmd::cargo::cargo_bin("kubectl-kproxy");
    let dir = c.dir.path().join("bin");
    std::fs::create_dir_all(&dir).expect("mkdir");
    std::os::unix::fs::symlink(&bin, dir.join("kubectl-kproxy")).expect("symlink");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kubectl_complete-kproxy");
    crate::support::install_executable(&script, &dir.join("kubectl_complete-kproxy"));
    Some(dir)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|p| p.join(name))
        .find(|p| p.exists())
}

fn kubectl(c: &Cluster, dir: &Path) -> std::process::Command {
    let path = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    let mut k =
        std::process::Command::new(which("kubectl").unwrap_or_else(|| "/usr/bin/kubectl".into()));
    k.env("PATH", path)
        .env("HOME", c.dir.path())
        .env("KUBECONFIG", &c.kubeconfig)
        .env("NO_COLOR", "1");
    k
}

#[test]
fn kubectl_sees_runs_and_completes_the_plugin() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let Some(dir) = plugin_dir(&c) else { return };
    let out = kubectl(&c, &dir)
        .args(["plugin", "list"])
        .output()
        .expect("kubectl");
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains(&dir.join("kubectl-kproxy").display().to_string()),
        "{listed}"
    );

    let out = kubectl(&c, &dir)
        .args(["kproxy", "--help"])
        .output()
        .expect("kubectl");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("Usage: kubectl kproxy"), "{help}");

    let bundle = c.bundle_path();
    let out = kubectl(&c, &dir)
        .args(["kproxy", "collect", "test-node", "-o"])
        .arg(&bundle)
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let b = kproxy::collect::bundle::read(&bundle).expect("bundle");
    assert_eq!(
        b.snapshot.iptables_save.as_deref(),
        Some(read("iptables-save.txt").as_str())
    );

    // Failures keep exit 2 through kubectl.
    let out = kubectl(&c, &dir)
        .args(["kproxy", "collect", "ghost", "-o"])
        .arg(&bundle)
        .output()
        .expect("kubectl");
    assert_eq!(out.status.code(), Some(2));

    // kubectl's plugin completion protocol (kubectl >= 1.26) runs kubectl_complete-kproxy.
    let out = kubectl(&c, &dir)
        .args(["__complete", "kproxy", "verify", ""])
        .output()
        .expect("kubectl");
    let comp = String::from_utf8_lossy(&out.stdout);
    assert!(comp.lines().any(|l| l == "test-node"), "{comp}");
    assert!(comp.lines().any(|l| l.starts_with(":4")), "{comp}");
}

/// The JSON report on stdout, with the names of the dump sources (file paths offline,
/// `ip6tables-save (exec (…))` live) replaced by `<dump>` so that findings compare.
fn json_of(out: &std::process::Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let text = regex::Regex::new(
        r#"(/[^" ]*/testdata/live/[a-z0-9-]+\.txt|/[^" ]*/overall-iptables-rules/expected\.iptables|ip6?tables-save \((exec|bundle) [^"]*?\)+):"#,
    )
    .expect("regex")
    .replace_all(&text, "<dump>:");
    serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn kubectl_verify_live_and_bundle_match_offline() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let Some(dir) = plugin_dir(&c) else { return };
    // Live (and from the bundle, which records it) the kube-proxy pod's image
    // (registry.k8s.io/kube-proxy:v1.33.0) says which release to verify with; offline the flag.
    let offline = c
        .kproxy()
        .args([
            "verify",
            "test-node",
            "-o",
            "json",
            "--kube-proxy-version",
            "1.33",
        ])
        .arg("--state")
        .arg(testdata("state.json"))
        .arg("--config")
        .arg(testdata("config.yaml"))
        .arg("--iptables-save")
        .arg(testdata("iptables-save.txt"))
        .arg("--ip6tables-save")
        .arg(testdata("ip6tables-save.txt"))
        .output()
        .expect("offline verify");
    let live = kubectl(&c, &dir)
        .args([
            "kproxy",
            "verify",
            "test-node",
            "-o",
            "json",
            "--kubeconfig",
        ])
        .arg(&c.kubeconfig)
        .output()
        .expect("kubectl kproxy verify");
    let offline_json = json_of(&offline);
    assert!(
        offline_json["findings"]
            .as_array()
            .is_some_and(|f| !f.is_empty()),
        "the fixture has findings to compare: {offline_json}"
    );
    assert_eq!(
        live.status.code(),
        offline.status.code(),
        "{}",
        String::from_utf8_lossy(&live.stderr)
    );
    assert_eq!(json_of(&live), offline_json);

    // The same through a bundle.
    let (code, _, stderr) = c.collect(&["test-node"]);
    assert_eq!(code, 0, "{stderr}");
    let from_bundle = kubectl(&c, &dir)
        .args(["kproxy", "verify", "-o", "json", "--bundle"])
        .arg(c.bundle_path())
        .output()
        .expect("verify --bundle");
    assert_eq!(from_bundle.status.code(), offline.status.code());
    assert_eq!(json_of(&from_bundle), offline_json);
}

#[test]
fn kubectl_verify_all_nodes_over_fifty_nodes() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let Some(dir) = plugin_dir(&c) else { return };
    for i in 0..49 {
        let node = format!("node-{i:02}");
        c.api.add_node(&node, &format!("192.168.7.{}", i + 1));
        c.api.add_proxy_pod(&node);
    }
    c.api.add_node("node-broken", "192.168.7.200"); // 50th: no kube-proxy pod
    c.api.set_exec_delay(Duration::from_millis(10));
    let out = kubectl(&c, &dir)
        .args([
            "kproxy",
            "verify",
            "--all-nodes",
            "--parallel",
            "3",
            "--kubeconfig",
        ])
        .arg(&c.kubeconfig)
        .output()
        .expect("kubectl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "worst exit code wins\n{stdout}\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("NODE") && lines[0].contains("COLLECTOR"),
        "{stdout}"
    );
    assert_eq!(
        lines.len(),
        1 + 51,
        "header + 50 fake nodes + test-node\n{stdout}"
    );
    let broken = lines
        .iter()
        .find(|l| l.starts_with("node-broken"))
        .expect("row");
    assert!(broken.contains("no kube-proxy pod"), "{broken}");
    let ok_rows = lines
        .iter()
        .filter(|l| l.contains("iptables") && l.ends_with("drift"))
        .count();
    assert_eq!(ok_rows, 50, "{stdout}");
    let max = c.api.max_concurrent_execs();
    assert!(
        (2..=3).contains(&max),
        "--parallel 3 gave {max} concurrent execs"
    );
    assert!(
        !stderr.contains('\u{1b}'),
        "no progress bar when stderr is not a terminal: {stderr}"
    );

    // -l narrows the nodes.
    let out = kubectl(&c, &dir)
        .args([
            "kproxy",
            "verify",
            "--all-nodes",
            "-l",
            "kubernetes.io/hostname=node-03",
            "--no-headers",
        ])
        .output()
        .expect("kubectl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.starts_with("node-03 "), "{stdout}");
}

/// Every API call the plugin makes (as the fake apiserver logged them across a run of each
/// collector) is allowed by `deploy/rbac.yaml`.
#[test]
fn rbac_manifest_covers_the_calls_made() {
    use k8s_openapi::api::rbac::v1::PolicyRule;
    let text =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/rbac.yaml"))
            .expect("deploy/rbac.yaml");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    // (namespace or None for cluster roles, rules)
    let mut roles: Vec<(String, Option<String>, Vec<PolicyRule>)> = Vec::new();
    let mut bound: Vec<String> = Vec::new();
    for d in &docs {
        match d["kind"].as_str() {
            Some("ClusterRole") | Some("Role") => {
                let rules: Vec<PolicyRule> =
                    serde_json::from_value(d["rules"].clone()).expect("rules");
                roles.push((
                    d["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    d["metadata"]["namespace"].as_str().map(str::to_string),
                    rules,
                ));
            }
            Some("ClusterRoleBinding") | Some("RoleBinding") => bound.push(
                d["roleRef"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            ),
            other => panic!("unexpected kind {other:?}"),
        }
    }
    let allowed =
        |verb: &str, group: &str, resource: &str, ns: Option<&str>, name: Option<&str>| {
            roles.iter().any(|(_, role_ns, rules)| {
                (role_ns.is_none() || role_ns.as_deref() == ns)
                    && rules.iter().any(|r| {
                        r.verbs.iter().any(|v| v == verb)
                            && r.api_groups.iter().flatten().any(|g| g == group)
                            && r.resources.iter().flatten().any(|x| x == resource)
                            && r.resource_names.as_ref().is_none_or(|names| {
                                name.is_some_and(|n| names.iter().any(|x| x == n))
                            })
                    })
            })
        };
    // Drive every collector against the fake and map each logged request to an RBAC check.
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    assert_eq!(c.collect(&["test-node"]).0, 0);
    assert_eq!(c.collect(&["test-node", "--collector", "debug-pod"]).0, 0);
    let mut checked = 0;
    for line in c.api.requests() {
        let (method, rest) = line.split_once(' ').expect("METHOD path");
        let path = rest.split('?').next().unwrap_or_default();
        let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        let (group, rest) = match segs.as_slice() {
            ["api", "v1", rest @ ..] => ("", rest),
            ["apis", g, _v, rest @ ..] => (*g, rest),
            _ => panic!("{line}"),
        };
        let (ns, resource, name, sub) = match rest {
            ["namespaces", ns, r] => (Some(*ns), *r, None, None),
            ["namespaces", ns, r, n] => (Some(*ns), *r, Some(*n), None),
            ["namespaces", ns, r, n, s] => (Some(*ns), *r, Some(*n), Some(*s)),
            [r] => (None, *r, None, None),
            [r, n] => (None, *r, Some(*n), None),
            _ => panic!("{line}"),
        };
        let (verb, resource) = match (method, name, sub) {
            (_, _, Some(s)) => ("create", format!("{resource}/{s}")),
            ("GET", None, _) => ("list", resource.to_string()),
            ("GET", Some(_), _) => ("get", resource.to_string()),
            ("POST", _, _) => ("create", resource.to_string()),
            ("DELETE", _, _) => ("delete", resource.to_string()),
            _ => panic!("{line}"),
        };
        assert!(
            allowed(verb, group, &resource, ns, name),
            "deploy/rbac.yaml does not allow {line} ({verb} {resource})"
        );
        checked += 1;
    }
    assert!(checked >= 10, "{checked}");
    for (name, _, _) in &roles {
        assert!(
            bound.contains(name) || name == "kproxy-debug-pod",
            "role {name} has no example binding"
        );
    }
}

#[test]
fn kubeconfig_list_in_env_is_merged_and_missing_files_skipped() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let missing = c.dir.path().join("missing");
    let list = std::env::join_paths([missing.as_path(), c.kubeconfig.as_path()]).expect("join");
    let out = c
        .kproxy()
        .env("KUBECONFIG", list)
        .args(["collect", "test-node", "-o"])
        .arg(c.bundle_path())
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ctrl_c_deletes_the_debug_pod() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.on_exec(|_| ExecReply::Hang);
    let child = std::process::Command::new(assert_cmd::cargo::cargo_bin("kubectl-kproxy"))
        .args([
            "collect",
            "test-node",
            "--collector",
            "debug-pod",
            "--exec-timeout",
            "50s",
            "-o",
        ])
        .arg(c.bundle_path())
        .arg("--kubeconfig")
        .arg(&c.kubeconfig)
        .env("HOME", c.dir.path())
        .env_remove("KUBECONFIG")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let started = std::time::Instant::now();
    while c.api.execs().is_empty() && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        c.api.created_pods().len(),
        1,
        "the pod was created and exec started"
    );
    let pid =
        rustix::process::Pid::from_raw(i32::try_from(child.id()).expect("pid")).expect("a pid");
    rustix::process::kill_process(pid, rustix::process::Signal::INT).expect("SIGINT");
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert_eq!(
        c.api.deleted_pods(),
        c.api.created_pods(),
        "deleted after Ctrl-C"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

/// With stderr on a terminal (a pty from util-linux `script`), `--all-nodes` draws a progress
/// bar there; stdout still gets the table.
#[test]
fn all_nodes_progress_bar_only_on_a_terminal() {
    if which("script").is_none() {
        crate::support::skip("live", "util-linux `script` not installed: skipping");
        return;
    }
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    for i in 0..20 {
        let node = format!("node-{i:02}");
        c.api.add_node(&node, &format!("192.168.8.{}", i + 1));
        c.api.add_proxy_pod(&node);
    }
    c.api.set_exec_delay(Duration::from_millis(40));
    let bin = assert_cmd::cargo::cargo_bin("kubectl-kproxy");
    let cmd = format!(
        "{} verify --all-nodes --parallel 2 --kubeconfig {} > {}",
        bin.display(),
        c.kubeconfig.display(),
        c.dir.path().join("table.txt").display()
    );
    let out = std::process::Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .env("HOME", c.dir.path())
        .env_remove("KUBECONFIG")
        .output()
        .expect("script");
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(
        tty.contains("nodes ") && tty.contains("/21"),
        "progress bar on the terminal: {tty:?}"
    );
    let table = std::fs::read_to_string(c.dir.path().join("table.txt")).expect("table");
    assert_eq!(table.lines().count(), 22, "{table}");
    assert!(
        !table.contains("nodes "),
        "no progress bar in stdout: {table}"
    );
}

#[test]
fn kubectl_trace_live_matches_offline() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    let Some(dir) = plugin_dir(&c) else { return };
    let path = testdata("iptables-save.txt");
    let shown = path.display().to_string();
    let offline = c
        .kproxy()
        .args([
            "trace",
            "svc/svc1",
            "-n",
            "ns1",
            "--node",
            "test-node",
            "--state",
        ])
        .arg(testdata("state.json"))
        .arg("--config")
        .arg(testdata("config.yaml"))
        .arg("--iptables-save")
        .arg(&path)
        .output()
        .expect("offline trace");
    let live = kubectl(&c, &dir)
        .args([
            "kproxy",
            "trace",
            "svc/svc1",
            "-n",
            "ns1",
            "--node",
            "test-node",
        ])
        .output()
        .expect("kubectl kproxy trace");
    let offline_text = String::from_utf8_lossy(&offline.stdout).replace(&shown, "<dump>");
    let live_text = String::from_utf8_lossy(&live.stdout).replace(
        "iptables-save (exec (kube-system/kube-proxy-test-node))",
        "<dump>",
    );
    assert_eq!(
        offline.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&offline.stderr)
    );
    assert!(offline_text.contains("KUBE-SVC-"), "{offline_text}");
    assert_eq!(
        live.status.code(),
        offline.status.code(),
        "{}",
        String::from_utf8_lossy(&live.stderr)
    );
    assert_eq!(live_text, offline_text);

    // --packet through the cluster.
    let packet = ["--packet", "10.0.0.2->172.30.0.41:80/tcp", "-o", "json"];
    let offline = c
        .kproxy()
        .arg("trace")
        .args(packet)
        .arg("--iptables-save")
        .arg(&path)
        .output()
        .expect("run");
    let live = kubectl(&c, &dir)
        .args(["kproxy", "trace"])
        .args(packet)
        .args(["--node", "test-node"])
        .output()
        .expect("run");
    assert!(offline.status.success());
    assert_eq!(
        live.status.code(),
        offline.status.code(),
        "{}",
        String::from_utf8_lossy(&live.stderr)
    );
    assert_eq!(live.stdout, offline.stdout);
}

#[test]
fn failure_request_timeout() {
    if !have_shared() {
        return;
    }
    let c = Cluster::new();
    c.api.slow_down("/api/v1/nodes", Duration::from_secs(20));
    let started = std::time::Instant::now();
    let (code, _, stderr) = c.collect(&["test-node", "--request-timeout", "1s"]);
    assert_one_error(code, &stderr, &["list nodes", "timed out"]);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

/// An IPVS-mode node read live: the collector's `ipvsadm -Ln --exact`, `ipset save` and
/// `iptables-save` (real dumps from the IPVS VM, `testdata/ipvs/`) go through the same IPVS check
/// as `verify --ipvsadm FILE`: clean on the installed state, a removed real server is drift.
#[test]
fn ipvs_node_is_verified_live() {
    let case = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/conformance/ipvs/load-balancer-source-ranges");
    if !case.is_dir() {
        crate::support::skip("live", &format!("{} is absent", case.display()));
        return;
    }
    let dumps =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/ipvs/load-balancer-source-ranges");
    for (dir, want) in [(dumps.clone(), 0), (dumps.join("drift-rs-removed"), 1)] {
        let api = FakeApiServer::start();
        api.add_list_file(&case.join("state.json"));
        let config = std::fs::read_to_string(case.join("config.yaml")).expect("config");
        api.add_configmap("kube-system", "kube-proxy", &[("config.conf", &config)]);
        api.add_proxy_pod("test-node");
        let d = dir.clone();
        let shared_ipvs = case.clone();
        api.on_exec(move |req| {
            let file = match req.command.first().map(String::as_str) {
                Some("iptables-save") => "iptables-save.txt",
                Some("ipvsadm") => "ipvsadm-Ln.txt",
                Some("ipset") => "ipset-save.txt",
                _ => return ExecReply::Missing,
            };
            // `ipvsadm -Ln` identical to the case's expected.ipvsadm is read from ../shared.
            let path = match d.join(file) {
                p if p.exists() => p,
                _ => shared_ipvs.join("expected.ipvsadm"),
            };
            ExecReply::ok(std::fs::read_to_string(path).unwrap_or_default())
        });
        let tmp = tempfile::tempdir().expect("tempdir");
        let kubeconfig = api.write_kubeconfig(tmp.path());
        let out = Command::cargo_bin("kubectl-kproxy")
            .expect("binary")
            .env_remove("KUBECONFIG")
            .env("HOME", tmp.path())
            .args(["verify", "test-node", "-o", "json", "--kubeconfig"])
            .arg(&kubeconfig)
            .timeout(Duration::from_secs(60))
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(want),
            "{}: {stderr}\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stdout)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json report");
        assert_eq!(report["mode"], "ipvs", "{report}");
        if want == 1 {
            let ids: Vec<&str> = report["findings"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["id"].as_str())
                .collect();
            assert!(ids.iter().all(|i| i.starts_with("KP5")), "{ids:?}");
            assert!(!ids.is_empty());
        }
    }
}
