//! `resync --local --watch` with real netfilter (both backends) against the fake apiserver's
//! watch: the node namespace's rules follow added endpoints, deleted services and added services
//! within 2 s (a deletion during an apiserver outage after the re-list), real client connections
//! follow the rules, SIGTERM/SIGINT exit 0 leaving the rules in place; and the command refuses to start next to a running kube-proxy unless `--force`.
//! After each sync it clears the conntrack entries that still DNAT to an endpoint the API no
//! longer has, and only those.

use crate::support::fake_apiserver::FakeApiServer;
use crate::support::netns::{Backend, Netns, Pod, Probe, Topology, addr, require_root_and_tools};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Serialises the tests of this file: the refusal test runs a process named `kube-proxy`, which
/// would make the watch test's resync refuse to start.
pub(crate) static KUBE_PROXY_NAME: Mutex<()> = Mutex::new(());

const WEB: &str = "10.96.100.10:80";
const WEB_SVC: &str = "KUBE-SVC-67NZLRHBNDSAWJRO";
const API: &str = "10.96.100.77:80";
/// How long the rules may lag behind an API change (the acceptance bound).
const FOLLOW_BOUND: Duration = Duration::from_secs(2);
/// After a `410 Expired` the watcher re-lists after kube-rs's default backoff (0.8–1.6 s, as
/// client-go's reflector), then the coalescing window passes.
const RELIST_BOUND: Duration = Duration::from_secs(4);

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/cluster")
}

/// The example cluster's objects, with shop/web's slice cut down to web-a (10.244.1.10).
fn cluster_objects() -> Vec<Value> {
    let text = std::fs::read_to_string(data().join("state.json")).expect("state.json");
    let list: Value = serde_json::from_str(&text).expect("state.json is JSON");
    let mut items = list["items"].as_array().cloned().expect("items");
    for o in &mut items {
        if o["kind"] == "EndpointSlice" && o["metadata"]["name"] == "web-b8d4f" {
            let first = o["endpoints"][0].clone();
            o["endpoints"] = json!([first]);
        }
    }
    items
}

fn web_slice(api: &FakeApiServer) -> Value {
    api.object("EndpointSlice", Some("shop"), "web-b8d4f")
        .expect("web slice")
}

/// The service shop/api (10.96.100.77:80 → 9090) and its slice with pod `api` (10.244.1.20).
fn api_service() -> [Value; 2] {
    [
        json!({"apiVersion": "v1", "kind": "Service",
               "metadata": {"name": "api", "namespace": "shop", "uid": "0a000000-0000-4000-8000-000000000050"},
               "spec": {"type": "ClusterIP", "clusterIP": "10.96.100.77", "clusterIPs": ["10.96.100.77"],
                        "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                        "ports": [{"name": "http", "port": 80, "targetPort": 9090, "protocol": "TCP"}],
                        "sessionAffinity": "None", "internalTrafficPolicy": "Cluster"}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": "api-x1y2z", "namespace": "shop",
                            "labels": {"kubernetes.io/service-name": "api",
                                       "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
               "addressType": "IPv4",
               "endpoints": [{"addresses": ["10.244.1.20"], "nodeName": "node-1", "zone": "zone-a",
                              "conditions": {"ready": true, "serving": true, "terminating": false}}],
               "ports": [{"name": "http", "port": 9090, "protocol": "TCP"}]}),
    ]
}

/// A child `resync` that is killed (if still running) when dropped; stderr goes to a file.
pub(crate) struct Resync {
    child: Child,
    log: PathBuf,
}

impl Resync {
    pub(crate) fn spawn(dir: &Path, kubeconfig: &Path, args: &[&str]) -> Resync {
        let log = dir.join(format!("resync-{}.log", args.join("-").replace('/', "_")));
        let stderr = std::fs::File::create(&log).expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
            .args(["resync", "--local", "--watch"])
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", dir)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn kubectl-kproxy resync");
        Resync { child, log }
    }

    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn signal(&self, signal: rustix::process::Signal) {
        let pid = i32::try_from(self.child.id())
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .expect("child pid");
        rustix::process::kill_process(pid, signal).expect("signal the child");
    }

    /// Waits up to `limit` for the exit status.
    fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Resync {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls the node's rules until `ok` holds; returns how long that took, or panics after `limit`.
fn follow(
    node: &Netns,
    backend: Backend,
    since: Instant,
    limit: Duration,
    what: &str,
    resync: &Resync,
    ok: impl Fn(&str) -> bool,
) -> Duration {
    loop {
        let save = node.save(backend, false).expect("iptables-save");
        if ok(&save) {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < limit,
            "{backend} {what}: rules did not follow within {limit:?}\nrules:\n{save}\nresync stderr:\n{}",
            resync.stderr()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn topology(backend: Backend) -> Topology {
    Topology::builder(&format!("resync-{backend}"))
        .node_addrs(&["192.168.77.2/24"])
        .client_addrs(&["192.168.77.3/24"])
        .pod(Pod::new("web-a", "10.244.1.10").tcp(8080))
        .pod(Pod::new("web-b", "10.244.1.11").tcp(8080))
        .pod(Pod::new("api", "10.244.1.20").tcp(9090))
        .build()
        .expect("topology")
}

#[test]
fn resync_watch_follows_the_api_on_real_netfilter() {
    let mut tools = vec!["ip"];
    tools.extend(Backend::Nft.tools());
    tools.extend(Backend::Legacy.tools());
    if !require_root_and_tools(&tools) {
        return;
    }
    let _serial = KUBE_PROXY_NAME.lock().unwrap_or_else(|e| e.into_inner());
    let probe = Probe::default().timeout(Duration::from_millis(800));
    for backend in Backend::ALL {
        let api = FakeApiServer::start();
        api.add_objects(cluster_objects());
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = api.write_kubeconfig(dir.path());
        let topo = topology(backend);
        let node = topo.node();
        let config = data().join("config.yaml");
        let mut resync = Resync::spawn(
            dir.path(),
            &kubeconfig,
            &[
                "--netns",
                node.name(),
                "--backend",
                backend.name(),
                "--node",
                "node-1",
                "--nfacct",
                "none",
                "--min-sync-period",
                "200ms",
                "--config",
                config.to_str().expect("utf-8 path"),
            ],
        );

        // First sync: the web service exists with web-a only.
        let started = Instant::now();
        let first = follow(
            node,
            backend,
            started,
            Duration::from_secs(30),
            "first sync",
            &resync,
            |s| s.contains(WEB_SVC) && s.contains("10.244.1.10:8080"),
        );
        let web = topo
            .client()
            .connect_many(&probe, addr(WEB), 12)
            .expect("probe web");
        assert_eq!(web.ok(), 12, "{backend}: web after first sync: {web:?}");
        assert_eq!(web.count("web-a"), 12, "{backend}: {web:?}");

        // Event 1: an endpoint is added to shop/web's slice.
        let mut slice = web_slice(&api);
        let mut second = slice["endpoints"][0].clone();
        second["addresses"] = json!(["10.244.1.11"]);
        slice["endpoints"]
            .as_array_mut()
            .expect("endpoints")
            .push(second);
        let t = Instant::now();
        api.update_object(slice);
        let added = follow(
            node,
            backend,
            t,
            FOLLOW_BOUND,
            "endpoint added",
            &resync,
            |s| s.contains("10.244.1.11:8080"),
        );
        let web = topo
            .client()
            .connect_many(&probe, addr(WEB), 24)
            .expect("probe web");
        assert_eq!(web.ok(), 24, "{backend}: web after endpoint added: {web:?}");
        assert!(
            web.count("web-b") > 0 && web.count("web-a") > 0,
            "{backend}: both endpoints must answer: {web:?}"
        );

        // Event 2: the service shop/web is deleted (its slice stays, as during a real deletion).
        let t = Instant::now();
        assert!(api.delete_object("Service", Some("shop"), "web"));
        let deleted = follow(
            node,
            backend,
            t,
            FOLLOW_BOUND,
            "service deleted",
            &resync,
            |s| !s.contains("10.96.100.10/32") && !s.contains(WEB_SVC),
        );
        let web = topo
            .client()
            .connect_many(
                &Probe::default().timeout(Duration::from_millis(300)),
                addr(WEB),
                3,
            )
            .expect("probe web");
        assert_eq!(
            web.ok(),
            0,
            "{backend}: the deleted service is still DNATed: {web:?}"
        );

        // Event 3: a service is added (with its slice).
        let t = Instant::now();
        api.add_objects(api_service());
        let svc_added = follow(
            node,
            backend,
            t,
            FOLLOW_BOUND,
            "service added",
            &resync,
            |s| s.contains("10.96.100.77/32") && s.contains("10.244.1.20:9090"),
        );
        let reached = topo
            .client()
            .connect_many(&probe, addr(API), 6)
            .expect("probe api");
        assert_eq!(
            reached.count("api"),
            6,
            "{backend}: new service: {reached:?}"
        );

        // Event 4: during an apiserver outage with compaction, shop/api is deleted: the watches
        // resume with 410 Expired and re-list, and the deletion must still reach the rules.
        let t = Instant::now();
        api.outage(|api| assert!(api.delete_object("Service", Some("shop"), "api")));
        let relisted = follow(
            node,
            backend,
            t,
            RELIST_BOUND,
            "service deleted during an outage (re-list)",
            &resync,
            |s| !s.contains("10.96.100.77/32"),
        );
        let gone = topo
            .client()
            .connect_many(
                &Probe::default().timeout(Duration::from_millis(300)),
                addr(API),
                3,
            )
            .expect("probe api");
        assert_eq!(gone.ok(), 0, "{backend}: deleted during outage: {gone:?}");
        assert!(
            api.requests()
                .iter()
                .filter(|r| r.contains("/services?") && !r.contains("watch"))
                .count()
                >= 2,
            "{backend}: services were not re-listed: {:?}",
            api.requests()
        );

        // SIGTERM (nft) / SIGINT (legacy): a clean, prompt exit that leaves the rules in place.
        let before = node.save(backend, false).expect("save");
        let signal = match backend {
            Backend::Nft => rustix::process::Signal::TERM,
            Backend::Legacy => rustix::process::Signal::INT,
        };
        let t = Instant::now();
        resync.signal(signal);
        let status = resync.wait_exit(Duration::from_secs(5));
        let exit = t.elapsed();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "{backend}: {signal:?} must exit 0 within 5 s: {status:?}\n{}",
            resync.stderr()
        );
        let after = node.save(backend, false).expect("save");
        assert!(
            after.contains("10.96.100.11/32") && after.contains(":KUBE-SERVICES"),
            "{backend}: rules gone after SIGTERM:\n{after}"
        );
        let rules = |s: &str| {
            s.lines()
                .filter(|l| l.starts_with("-A "))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            rules(&after),
            rules(&before),
            "{backend}: SIGTERM changed rules"
        );
        let log = resync.stderr();
        let syncs = log.lines().filter(|l| l.contains(" sync: ")).count();
        assert!(
            log.contains("shutting down"),
            "{backend}: no shutdown line:\n{log}"
        );
        println!(
            "{backend}: first sync {first:?}; endpoint added → rules {added:?}; service deleted → rules {deleted:?}; \
             service added → rules {svc_added:?}; \
             deleted during outage → rules {relisted:?}; {signal:?} → exit {exit:?}; {syncs} syncs"
        );
    }
}

#[test]
fn resync_refuses_to_start_next_to_kube_proxy_unless_forced() {
    let _serial = KUBE_PROXY_NAME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(fake) = crate::support::repair::fake_kube_proxy("resync", dir.path()) else {
        return;
    };
    let Ok(mut kube_proxy) = Command::new(&fake).arg("60").spawn() else {
        crate::support::skip(
            "resync",
            &format!("cannot run a copy of sleep from {}", dir.path().display()),
        );
        return;
    };
    let api = FakeApiServer::start();
    let kubeconfig = api.write_kubeconfig(dir.path());

    let mut refused = Resync::spawn(dir.path(), &kubeconfig, &["--backend", "legacy"]);
    let status = refused.wait_exit(Duration::from_secs(20));
    let stderr = refused.stderr();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "{stderr}");
    assert!(
        stderr.contains("kube-proxy process is running")
            && stderr.contains(&format!("pid {}", kube_proxy.id()))
            && stderr.contains("--force"),
        "{stderr}"
    );

    // --force gets past the check: it runs (its syncs fail: the namespace does not exist) until
    // SIGTERM, which ends it cleanly.
    let mut forced = Resync::spawn(
        dir.path(),
        &kubeconfig,
        &[
            "--backend",
            "legacy",
            "--force",
            "--netns",
            "kproxy-no-such-ns",
        ],
    );
    let start = Instant::now();
    while !forced.stderr().contains("sync") && start.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    forced.signal(rustix::process::Signal::TERM);
    let status = forced.wait_exit(Duration::from_secs(5));
    let stderr = forced.stderr();
    drop(forced);
    let _ = kube_proxy.kill();
    let _ = kube_proxy.wait();
    assert!(
        !stderr.contains("kube-proxy process is running") && stderr.contains("sync failed"),
        "{stderr}"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{stderr}");
}

/// `resync --local --watch` clears stale flows after each sync, as kube-proxy does: a UDP client
/// keeps one source port (one conntrack entry) to a service's cluster IP; its endpoint leaves the
/// API during the watch; resync rewrites the rules and deletes exactly the entries that still
/// DNAT to it — every other entry of the table survives — and the client's next datagram reaches
/// the remaining endpoint.
#[test]
fn resync_watch_clears_stale_udp_flows_after_a_sync() {
    use crate::conntrack_e2e::{
        DNS, NODE_IP, ask, ask_many, client_socket, flows, key, listing, other, pod_ip, service,
        through_dns_to, topology,
    };
    use std::collections::BTreeSet;
    use std::net::SocketAddr;
    let mut tools = vec!["ip", "conntrack"];
    tools.extend(Backend::Nft.tools());
    if !require_root_and_tools(&tools) {
        return;
    }
    let _serial = KUBE_PROXY_NAME.lock().unwrap_or_else(|e| e.into_inner());
    let api = FakeApiServer::start();
    let mut objects: Vec<Value> = Vec::new();
    objects.extend(service(
        "udp-dns",
        "10.96.50.10",
        53,
        5353,
        "UDP",
        &["10.244.1.10", "10.244.1.11"],
    ));
    objects.extend(service(
        "web",
        "10.96.50.20",
        80,
        8080,
        "TCP",
        &["10.244.1.20", "10.244.1.21"],
    ));
    objects.push(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
        "spec": {"podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]},
    }));
    api.add_objects(objects);
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    let topo = topology("resync-ct");
    let node = topo.node();
    let resync = Resync::spawn(
        dir.path(),
        &kubeconfig,
        &[
            "--netns",
            node.name(),
            "--backend",
            "nft",
            "--node",
            "node-1",
            "--node-ip",
            NODE_IP,
            "--nfacct",
            "none",
            "--min-sync-period",
            "200ms",
        ],
    );
    follow(
        node,
        Backend::Nft,
        Instant::now(),
        Duration::from_secs(30),
        "first sync",
        &resync,
        |s| s.contains("10.244.1.10:5353") && s.contains("10.244.1.11:5353"),
    );

    // The client under test: one source port, one entry, one endpoint.
    let dns = addr(DNS);
    let sock = client_socket(topo.client(), 40001);
    let first = ask_many(&sock, dns, 5);
    let stale = first[0].clone().expect("the service answers");
    assert!(
        first.iter().all(|s| s.as_deref() == Some(stale.as_str())),
        "one entry, one endpoint: {first:?}"
    );
    let (stale_ip, keep) = (pod_ip(&stale), other(&stale));
    // Other entries: more clients of the service, a flow straight to the other pod.
    let others: Vec<_> = (40002..40010)
        .map(|p| client_socket(topo.client(), p))
        .collect();
    for s in &others {
        assert!(ask(s, dns).is_some(), "other clients get answers");
    }
    let direct = client_socket(topo.client(), 40100);
    assert_eq!(
        ask(
            &direct,
            SocketAddr::new(pod_ip(keep).parse().unwrap(), 5353)
        )
        .as_deref(),
        Some(keep)
    );
    // A sync with nothing stale deletes nothing.
    let (before_text, _) = listing(node, dir.path(), "before.txt");
    let before = flows(&before_text);
    let to_stale: BTreeSet<String> = through_dns_to(&before, stale_ip)
        .into_iter()
        .map(key)
        .collect();
    assert!(!to_stale.is_empty());
    assert!(
        !resync.stderr().contains("conntrack:"),
        "{}",
        resync.stderr()
    );

    // The endpoint leaves the API.
    let mut slice = api
        .object("EndpointSlice", Some("e2e"), "udp-dns-1")
        .expect("dns slice");
    slice["endpoints"]
        .as_array_mut()
        .expect("endpoints")
        .retain(|e| e["addresses"][0] != stale_ip);
    let t = Instant::now();
    api.update_object(slice);
    let rules = follow(
        node,
        Backend::Nft,
        t,
        // Generous: the whole suite runs in parallel on two cores.
        Duration::from_secs(20),
        "endpoint removed",
        &resync,
        |s| !s.contains(&format!("{stale_ip}:5353")),
    );
    // The entries through the service to the gone endpoint are deleted after the sync.
    let cleared = loop {
        let (text, _) = listing(node, dir.path(), "after.txt");
        if through_dns_to(&flows(&text), stale_ip).is_empty() {
            break (text, t.elapsed());
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "stale entries not cleared:\n{text}\nresync stderr:\n{}",
            resync.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let (after_text, took) = cleared;
    let after: BTreeSet<String> = flows(&after_text).iter().map(key).collect();
    for f in &before {
        let k = key(f);
        assert_eq!(
            after.contains(&k),
            !to_stale.contains(&k),
            "{k}: only the stale entries go\nbefore:\n{before_text}\nafter:\n{after_text}"
        );
    }
    let command = format!(
        "conntrack -D -f ipv4 -p udp --orig-dst 10.96.50.10 --orig-port-dst 53 --reply-src {stale_ip} --reply-port-src 5353"
    );
    // The deletion is logged after the flows are gone: the line may still be on its way.
    let t = Instant::now();
    let line = loop {
        let log = resync.stderr();
        if let Some(line) = log
            .split_inclusive('\n')
            .find(|l| l.contains("conntrack: KP601") && l.ends_with('\n'))
        {
            break line.trim_end().to_string();
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "no deletion logged:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        line.contains(&format!(
            "e2e/udp-dns:p udp 10.96.50.10:53 → {stale_ip}:5353: deleted {}, listed again: 0 left ({command})",
            to_stale.len()
        )),
        "{line}"
    );
    // The client's next datagram reaches the remaining endpoint.
    assert_eq!(ask(&sock, dns).as_deref(), Some(keep));
    println!(
        "resync: endpoint removed → rules {rules:?}, {} stale entries deleted {took:?} after the change",
        to_stale.len()
    );
    drop(others);
    drop(direct);
}
