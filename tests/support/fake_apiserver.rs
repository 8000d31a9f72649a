//! An in-process fake kube-apiserver for tests: plain HTTP/1.1 on 127.0.0.1 (hyper 1), run in
//! its own thread with its own tokio runtime, so that the CLI binary can be spawned against it.
//!
//! What it serves, from JSON objects it was given (e.g. a recorded `kubectl get -o json` List):
//! - list (with `labelSelector`, `fieldSelector`, `limit`/`continue` pagination) and watch
//!   of Services, EndpointSlices, Nodes, Pods, ConfigMaps and Namespaces, cluster-wide and per
//!   namespace, and of ServiceCIDRs (`networking.k8s.io`, in the versions
//!   [`FakeApiServer::serve_service_cidrs`] names: `v1` unless told, 404 for the others). Objects get their `metadata.resourceVersion` from one global counter, bumped
//!   by every change ([`FakeApiServer::add_objects`], [`FakeApiServer::update_object`],
//!   [`FakeApiServer::delete_object`], HTTP create/delete); a list carries the current counter.
//!   `watch=true&resourceVersion=RV` streams the `ADDED`/`MODIFIED`/`DELETED` events newer than
//!   RV as JSON lines and keeps the connection open, pushing later events, until
//!   `timeoutSeconds` (default 290) passes or the server stops — enough for kube-rs's
//!   `watcher`. [`FakeApiServer::outage`] ends every watch and compacts the history (resuming
//!   watches get `410 Expired` as an `ERROR` event and must re-list). Watch events always carry a resourceVersion; list/get show one only on objects
//!   that were given with one (recorded files without them round-trip unchanged). No bookmarks are sent (allowed even when `allowWatchBookmarks` is asked for).
//!   A watch without a resourceVersion (or `0`) gets one `ADDED` per current object and then
//!   ends at once (a snapshot, as if its timeout had passed);
//! - get and delete by name, create of Pods (phase set to Running);
//! - pod exec over the websocket channel protocol (`v5.channel.k8s.io`, `v4.channel.k8s.io`):
//!   stdout on channel 1, stderr on 2 and the exit `Status` on channel 3, answered by an
//!   [`ExecHandler`] (run on a blocking thread, so it may run real commands). With `stdin=true`
//!   the fake first reads channel 0 until the client ends stdin — v5: the close signal
//!   `[255, 0]`; v4 has none, so a client closes the whole websocket, and then (as with a real
//!   API server) the command still runs but its output and status are lost —
//!   and hands the bytes to the handler in [`ExecRequest::stdin`].
//!   [`FakeApiServer::only_exec_protocol`] makes the fake speak one protocol version;
//! - Events (`events.k8s.io/v1`): create and merge-patch, kept apart from the watched objects
//!   ([`FakeApiServer::events`]), as kube-rs's event recorder makes them;
//! - `PATCH nodes/NAME/status` with a strategic-merge patch of `status.conditions` (merged by
//!   `type`, as the API server does): the Node changes, and watches see `MODIFIED`;
//! - the pod proxy (`GET /api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH`), answered by a
//!   [`ProxyHandler`] ([`FakeApiServer::on_proxy`]; 404 for a pod it does not hold, 503 when no
//!   handler or [`ProxyReply::Refused`]), with its concurrency measured
//!   ([`FakeApiServer::max_concurrent_proxies`]);
//! - thousands of objects cheaply ([`FakeApiServer::load_objects`]: no watch events; lists
//!   copy only the page they serve); [`node_object`], [`monitor_condition`] and
//!   [`agent_pod_object`] build the monitor's view of a node;
//! - failures on demand ([`Fault`]: any status for requests whose path contains a string;
//!   [`FakeApiServer::clear_faults`] ends them), 401 for a bearer token other than [`TOKEN`].
//!
//! Every request is logged ([`FakeApiServer::requests`]); exec concurrency is measured
//! ([`FakeApiServer::max_concurrent_execs`]).

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_tungstenite::tungstenite::protocol::{Message, Role};

/// The bearer token the fake accepts (written into [`FakeApiServer::write_kubeconfig`]).
pub const TOKEN: &str = "fake-token";

/// One exec call as the fake saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container query parameter.
    pub container: Option<String>,
    /// argv.
    pub command: Vec<String>,
    /// What the client sent on stdin (channel 0) until it closed it, when it asked for stdin
    /// (`stdin=true`); None otherwise.
    pub stdin: Option<Vec<u8>>,
}

/// How the fake answers an exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecReply {
    /// The command ran: output and exit status.
    Output {
        /// Channel 1.
        stdout: String,
        /// Channel 2.
        stderr: String,
        /// Exit status (non-zero → `NonZeroExitCode` status).
        exit_code: i32,
    },
    /// argv[0] does not exist in the container (the runtime's "executable file not found").
    Missing,
    /// The command never finishes (until the client goes away, or 60 s).
    Hang,
}

impl ExecReply {
    /// Successful output.
    pub fn ok(stdout: impl Into<String>) -> Self {
        ExecReply::Output {
            stdout: stdout.into(),
            stderr: String::new(),
            exit_code: 0,
        }
    }
}

/// Answers exec calls.
pub type ExecHandler = Arc<dyn Fn(&ExecRequest) -> ExecReply + Send + Sync>;

/// One request through the API server's pod proxy
/// (`/api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH`), as the fake saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyRequest {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// The port after the name (empty when none was given).
    pub port: String,
    /// The path after `proxy/`, with its leading `/`.
    pub path: String,
}

/// How the pod behind the proxy answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyReply {
    /// An answer: status, content type and body, passed through as the API server does.
    Answer {
        /// HTTP status.
        status: u16,
        /// Content type.
        content_type: &'static str,
        /// Body.
        body: String,
    },
    /// Nothing comes (the pod hangs): the request is held for two minutes.
    Hang,
    /// Nothing listens: the API server answers 503 for the pod.
    Refused,
}

impl ProxyReply {
    /// 200 with a JSON body.
    pub fn json(value: &Value) -> ProxyReply {
        ProxyReply::Answer {
            status: 200,
            content_type: "application/json",
            body: value.to_string(),
        }
    }

    /// `status` with a text body.
    pub fn text(status: u16, body: &str) -> ProxyReply {
        ProxyReply::Answer {
            status,
            content_type: "text/plain; charset=utf-8",
            body: body.to_string(),
        }
    }
}

/// Answers pod proxy requests.
pub type ProxyHandler = Arc<dyn Fn(&ProxyRequest) -> ProxyReply + Send + Sync>;

/// The labels of the monitor's pods (`deploy/monitor/daemonset.yaml`).
pub const AGENT_LABEL: (&str, &str) = ("app.kubernetes.io/name", "kproxy-monitor");

/// A Node with an InternalIP and, when given, the monitor's condition (see
/// [`monitor_condition`]).
pub fn node_object(name: &str, ip: &str, condition: Option<Value>) -> Value {
    let mut node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"addresses": [
            {"type": "InternalIP", "address": ip},
            {"type": "Hostname", "address": name}
        ],
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "kubelet is posting ready status",
             "lastHeartbeatTime": "2026-01-01T00:00:00Z",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ]},
    });
    if let Some(c) = condition
        && let Some(list) = node["status"]["conditions"].as_array_mut()
    {
        list.push(c);
    }
    node
}

/// The monitor's `KubeProxyRulesInSync` condition as the agent patches it; times are RFC 3339.
pub fn monitor_condition(
    status: &str,
    reason: &str,
    message: &str,
    transition: &str,
    heartbeat: &str,
) -> Value {
    json!({"type": "KubeProxyRulesInSync", "status": status, "reason": reason,
           "message": message, "lastTransitionTime": transition,
           "lastHeartbeatTime": heartbeat})
}

/// A Running, ready monitor pod on `node` (kube-system, the DaemonSet's labels, port `metrics`
/// 9847), named `kproxy-monitor-NODE`.
pub fn agent_pod_object(node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("kproxy-monitor-{node}"), "namespace": "kube-system",
            "labels": {AGENT_LABEL.0: AGENT_LABEL.1}
        },
        "spec": {"nodeName": node, "hostNetwork": true, "containers": [{
            "name": "monitor", "image": "ghcr.io/kproxy/kubectl-kproxy:0.1.0",
            "ports": [{"name": "metrics", "containerPort": 9847, "protocol": "TCP"}]
        }]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

/// An injected failure: requests whose method matches (None = any) and whose path+query
/// contains `path_contains` get `status`.
#[derive(Debug, Clone)]
pub struct Fault {
    /// HTTP method, or None for any.
    pub method: Option<&'static str>,
    /// Substring of the path and query.
    pub path_contains: String,
    /// Status code to answer.
    pub status: u16,
    /// How many more requests fail (None: until [`FakeApiServer::clear_faults`]).
    pub times: Option<usize>,
}

/// One change, as a watch reports it.
struct WatchRecord {
    rv: u64,
    kind: &'static str,
    object: Value,
}

#[derive(Default)]
struct State {
    objects: Mutex<Vec<Value>>,
    /// The last resourceVersion handed out.
    rv: AtomicU64,
    /// Every change so far, in resourceVersion order (never compacted: no 410 Gone).
    events: Mutex<Vec<WatchRecord>>,
    /// Woken after every change.
    changed: tokio::sync::Notify,
    /// Bumped by [`FakeApiServer::outage`]: open watches of an older generation end.
    generation: AtomicU64,
    /// Watches from a resourceVersion below this get `410 Expired` (etcd compaction).
    compacted: AtomicU64,
    /// Held for writing during an outage: new watches wait for it to end.
    outage: tokio::sync::RwLock<()>,
    faults: Mutex<Vec<Fault>>,
    exec: Mutex<Option<ExecHandler>>,
    proxy: Mutex<Option<ProxyHandler>>,
    proxy_inflight: AtomicUsize,
    proxy_max_inflight: AtomicUsize,
    exec_delay: Mutex<Duration>,
    /// The only exec protocol offered, when set (see [`FakeApiServer::only_exec_protocol`]).
    exec_protocol: Mutex<Option<&'static str>>,
    log: Mutex<Vec<String>>,
    execs: Mutex<Vec<ExecRequest>>,
    deleted: Mutex<Vec<String>>,
    created: Mutex<Vec<String>>,
    max_page: Mutex<Option<usize>>,
    slow: Mutex<Option<(String, Duration)>>,
    inflight: AtomicUsize,
    max_inflight: AtomicUsize,
    /// Bearer tokens accepted besides [`TOKEN`] (see [`FakeApiServer::accept_token`]).
    tokens: Mutex<Vec<String>>,
    /// Events created (and patched in place), in creation order.
    api_events: Mutex<Vec<Value>>,
    /// The versions of `networking.k8s.io` ServiceCIDRs served; `None`: `v1` only.
    service_cidr_versions: Mutex<Option<Vec<&'static str>>>,
}

/// `(kind, namespace, name)` of an object.
fn identity(o: &Value) -> (String, String, String) {
    (
        as_text(o.get("kind")),
        as_text(o.pointer("/metadata/namespace")),
        as_text(o.pointer("/metadata/name")),
    )
}

impl State {
    /// Takes the next resourceVersion and records the event, whose object always carries it;
    /// `object` itself is stamped only when it came with a `metadata.resourceVersion` (objects
    /// given without one are served without one by list/get, so that recorded files round-trip
    /// unchanged). `objects` must be locked by the caller, so that the store and the event log
    /// change together.
    fn record(&self, kind: &'static str, object: &mut Value) {
        let mut events = self.events.lock().unwrap();
        let rv = self.rv.fetch_add(1, Ordering::SeqCst) + 1;
        let stamp = |o: &mut Value| {
            if let Some(meta) = o.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.insert("resourceVersion".into(), json!(rv.to_string()));
            }
        };
        let mut event = object.clone();
        stamp(&mut event);
        if object.pointer("/metadata/resourceVersion").is_some() {
            stamp(object);
        }
        events.push(WatchRecord {
            rv,
            kind,
            object: event,
        });
        drop(events);
        self.changed.notify_waiters();
    }

    /// Adds `object`, or replaces the one with the same kind, namespace and name.
    fn upsert(&self, mut object: Value) {
        let mut objects = self.objects.lock().unwrap();
        let id = identity(&object);
        match objects.iter_mut().find(|o| identity(o) == id) {
            Some(slot) => {
                self.record("MODIFIED", &mut object);
                *slot = object;
            }
            None => {
                self.record("ADDED", &mut object);
                objects.push(object);
            }
        }
    }

    /// [`State::upsert`] of each object, with the store indexed once (a node-sized state of
    /// tens of thousands of objects is added in one pass, not one scan per object).
    fn upsert_many(&self, new: impl IntoIterator<Item = Value>) {
        let mut objects = self.objects.lock().unwrap();
        let mut index: std::collections::HashMap<(String, String, String), usize> = objects
            .iter()
            .enumerate()
            .map(|(i, o)| (identity(o), i))
            .collect();
        for mut object in new {
            match index.get(&identity(&object)) {
                Some(&i) => {
                    self.record("MODIFIED", &mut object);
                    objects[i] = object;
                }
                None => {
                    self.record("ADDED", &mut object);
                    index.insert(identity(&object), objects.len());
                    objects.push(object);
                }
            }
        }
    }

    /// Removes the objects `hit` selects, recording a `DELETED` event for each; returns them.
    fn remove(&self, hit: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut objects = self.objects.lock().unwrap();
        let (gone, kept): (Vec<Value>, Vec<Value>) = objects.drain(..).partition(|o| hit(o));
        *objects = kept;
        gone.into_iter()
            .map(|mut o| {
                self.record("DELETED", &mut o);
                o
            })
            .collect()
    }
}

/// A running fake apiserver; stops when dropped.
pub struct FakeApiServer {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<State>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FakeApiServer {
    /// Starts a server with no objects on an ephemeral port of 127.0.0.1.
    pub fn start() -> FakeApiServer {
        let state = Arc::new(State::default());
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let st = Arc::clone(&state);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .expect("fake apiserver runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind 127.0.0.1:0");
                addr_tx
                    .send(listener.local_addr().expect("local addr"))
                    .expect("send addr");
                let mut stop_rx = stop_rx;
                loop {
                    tokio::select! {
                        _ = &mut stop_rx => break,
                        accepted = listener.accept() => {
                            let Ok((stream, _)) = accepted else { continue };
                            let st = Arc::clone(&st);
                            tokio::spawn(async move {
                                let svc = hyper::service::service_fn(move |req| {
                                    let st = Arc::clone(&st);
                                    async move { Ok::<_, std::convert::Infallible>(handle(st, req).await) }
                                });
                                let _ = hyper::server::conn::http1::Builder::new()
                                    .serve_connection(TokioIo::new(stream), svc)
                                    .with_upgrades()
                                    .await;
                            });
                        }
                    }
                }
            });
            rt.shutdown_timeout(Duration::from_millis(100));
        });
        let addr = addr_rx.recv().expect("fake apiserver address");
        FakeApiServer {
            addr,
            state,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }

    /// The server URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds objects (each with `kind`, `metadata.name`, optional `metadata.namespace`); an
    /// object with the same kind, namespace and name is replaced (a `MODIFIED` event).
    pub fn add_objects(&self, objects: impl IntoIterator<Item = Value>) {
        self.state.upsert_many(objects);
    }

    /// Adds many objects at once, cheaply: no object of the same name is looked for and no
    /// watch hears of them (list and get serve them). For stores of thousands of objects.
    pub fn load_objects(&self, objects: impl IntoIterator<Item = Value>) {
        self.state.objects.lock().unwrap().extend(objects);
    }

    /// Replaces the object with the same kind, namespace and name (or adds it): watches see
    /// `MODIFIED` (or `ADDED`).
    pub fn update_object(&self, object: Value) {
        self.state.upsert(object);
    }

    /// Deletes an object (`namespace` None for cluster-scoped kinds); watches see `DELETED`.
    /// Returns whether it existed.
    pub fn delete_object(&self, kind: &str, namespace: Option<&str>, name: &str) -> bool {
        let id = (
            kind.to_string(),
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
        );
        !self.state.remove(|o| identity(o) == id).is_empty()
    }

    /// Simulates an apiserver outage with compaction: every open watch ends, `changes` are
    /// made while no watch can start, and then the history is compacted, so that watchers
    /// resuming from their last resourceVersion get `410 Expired` and must re-list to see them.
    /// Call it from a test thread, not from async code (it blocks).
    pub fn outage(&self, changes: impl FnOnce(&FakeApiServer)) {
        let guard = self.state.outage.blocking_write();
        self.state.generation.fetch_add(1, Ordering::SeqCst);
        self.state.changed.notify_waiters();
        changes(self);
        let rv = self.state.rv.load(Ordering::SeqCst);
        self.state.compacted.store(rv, Ordering::SeqCst);
        drop(guard);
    }

    /// The object with this kind, namespace and name, as the server holds it now.
    pub fn object(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let id = (
            kind.to_string(),
            namespace.unwrap_or_default().to_string(),
            name.to_string(),
        );
        let objects = self.state.objects.lock().unwrap();
        objects.iter().find(|o| identity(o) == id).cloned()
    }

    /// Adds the `items` of a `List` JSON file (e.g. `kubectl get … -o json` output).
    pub fn add_list_file(&self, path: &Path) {
        let text = std::fs::read_to_string(path).expect("read list file");
        let list: Value = serde_json::from_str(&text).expect("list JSON");
        let items = list["items"].as_array().cloned().unwrap_or_default();
        self.add_objects(items);
    }

    /// Adds a ConfigMap.
    pub fn add_configmap(&self, namespace: &str, name: &str, data: &[(&str, &str)]) {
        let data: serde_json::Map<String, Value> = data
            .iter()
            .map(|(k, v)| (k.to_string(), Value::String(v.to_string())))
            .collect();
        self.add_objects([json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": data,
        })]);
    }

    /// Adds a Node with an InternalIP.
    pub fn add_node(&self, name: &str, ip: &str) {
        self.add_objects([json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"addresses": [
                {"type": "InternalIP", "address": ip},
                {"type": "Hostname", "address": name}
            ]},
        })]);
    }

    /// Adds a Running kube-proxy pod (`k8s-app=kube-proxy`, kube-system) on `node`.
    pub fn add_proxy_pod(&self, node: &str) {
        self.add_objects([json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": format!("kube-proxy-{node}"), "namespace": "kube-system",
                "labels": {"k8s-app": "kube-proxy"}
            },
            "spec": {"nodeName": node, "containers": [{"name": "kube-proxy", "image": "registry.k8s.io/kube-proxy:v1.33.0"}]},
            "status": {"phase": "Running"},
        })]);
    }

    /// Sets how exec calls are answered.
    pub fn on_exec(&self, handler: impl Fn(&ExecRequest) -> ExecReply + Send + Sync + 'static) {
        *self.state.exec.lock().unwrap() = Some(Arc::new(handler));
    }

    /// Sets how pods answer through the pod proxy (without a handler, nothing listens: 503).
    pub fn on_proxy(&self, handler: impl Fn(&ProxyRequest) -> ProxyReply + Send + Sync + 'static) {
        *self.state.proxy.lock().unwrap() = Some(Arc::new(handler));
    }

    /// The largest number of pod proxy requests that were open at the same time.
    pub fn max_concurrent_proxies(&self) -> usize {
        self.state.proxy_max_inflight.load(Ordering::SeqCst)
    }

    /// Speaks only this exec protocol (`v4.channel.k8s.io` or `v5.channel.k8s.io`), as an API
    /// server of that generation would.
    pub fn only_exec_protocol(&self, protocol: &'static str) {
        *self.state.exec_protocol.lock().unwrap() = Some(protocol);
    }

    /// Delays every exec answer (to make concurrency observable).
    pub fn set_exec_delay(&self, d: Duration) {
        *self.state.exec_delay.lock().unwrap() = d;
    }

    /// Serves ServiceCIDRs (`networking.k8s.io`) in these versions only, as an API server of
    /// that release would: `["v1"]` (1.33+, the default), `["v1beta1"]` (1.31–1.32 with the
    /// beta API on), `[]` (older: 404). Objects given as ServiceCIDRs are served in the
    /// version asked for.
    pub fn serve_service_cidrs(&self, versions: &[&'static str]) {
        *self.state.service_cidr_versions.lock().unwrap() = Some(versions.to_vec());
    }

    /// Caps every list page at `n` items (forces `continue` pagination).
    pub fn set_max_page(&self, n: usize) {
        *self.state.max_page.lock().unwrap() = Some(n);
    }

    /// Delays answers to requests whose path contains `path_contains` (request timeouts).
    pub fn slow_down(&self, path_contains: &str, delay: Duration) {
        *self.state.slow.lock().unwrap() = Some((path_contains.to_string(), delay));
    }

    /// Injects a failure.
    pub fn fail(&self, method: Option<&'static str>, path_contains: &str, status: u16) {
        self.state.faults.lock().unwrap().push(Fault {
            method,
            path_contains: path_contains.to_string(),
            status,
            times: None,
        });
    }

    /// Injects a failure for the next `times` matching requests only.
    pub fn fail_times(
        &self,
        method: Option<&'static str>,
        path_contains: &str,
        status: u16,
        times: usize,
    ) {
        self.state.faults.lock().unwrap().push(Fault {
            method,
            path_contains: path_contains.to_string(),
            status,
            times: Some(times),
        });
    }

    /// Ends every failure [`FakeApiServer::fail`] injected.
    pub fn clear_faults(&self) {
        self.state.faults.lock().unwrap().clear();
    }

    /// The Events created so far (`events.k8s.io/v1` objects, patches applied).
    pub fn events(&self) -> Vec<Value> {
        self.state.api_events.lock().unwrap().clone()
    }

    /// `METHOD path?query` of every request so far.
    pub fn requests(&self) -> Vec<String> {
        self.state.log.lock().unwrap().clone()
    }

    /// Every exec so far.
    pub fn execs(&self) -> Vec<ExecRequest> {
        self.state.execs.lock().unwrap().clone()
    }

    /// `namespace/name` of pods created / deleted so far.
    pub fn created_pods(&self) -> Vec<String> {
        self.state.created.lock().unwrap().clone()
    }

    /// See [`FakeApiServer::created_pods`].
    pub fn deleted_pods(&self) -> Vec<String> {
        self.state.deleted.lock().unwrap().clone()
    }

    /// The largest number of exec sessions that were open at the same time.
    pub fn max_concurrent_execs(&self) -> usize {
        self.state.max_inflight.load(Ordering::SeqCst)
    }

    /// Accepts `token` as a bearer token too (e.g. an OIDC id-token, which must be a JWT).
    pub fn accept_token(&self, token: &str) {
        self.state.tokens.lock().unwrap().push(token.to_string());
    }

    /// Writes a kubeconfig pointing at this server into `dir`; contexts `fake` (current,
    /// namespace `default`) and `fake-bad-token` (a token the server answers 401 to).
    pub fn write_kubeconfig(&self, dir: &Path) -> PathBuf {
        let path = dir.join("kubeconfig");
        let text = format!(
            "apiVersion: v1
kind: Config
current-context: fake
clusters:
- name: fake
  cluster:
    server: {url}
contexts:
- name: fake
  context:
    cluster: fake
    user: tester
    namespace: default
- name: fake-bad-token
  context:
    cluster: fake
    user: intruder
users:
- name: tester
  user:
    token: {TOKEN}
- name: intruder
  user:
    token: wrong
",
            url = self.url()
        );
        std::fs::write(&path, text).expect("write kubeconfig");
        path
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

type Resp = Response<BoxBody<Bytes, std::convert::Infallible>>;

fn full_body(bytes: impl Into<Bytes>) -> BoxBody<Bytes, std::convert::Infallible> {
    Full::new(bytes.into()).boxed()
}

fn json_response(code: u16, body: &Value) -> Resp {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full_body(body.to_string()))
        .expect("response")
}

fn status_body(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn error_response(code: u16, resource: &str, verb: &str) -> Resp {
    let (reason, message) = match code {
        401 => ("Unauthorized", "Unauthorized".to_string()),
        403 => (
            "Forbidden",
            format!(
                "{resource} is forbidden: User \"tester\" cannot {verb} resource \"{resource}\""
            ),
        ),
        404 => ("NotFound", format!("{resource} not found")),
        500 => (
            "InternalError",
            "Internal error occurred: injected".to_string(),
        ),
        _ => ("Unknown", format!("injected status {code}")),
    };
    json_response(code, &status_body(code, reason, message.as_str()))
}

/// Percent-decodes a query component (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'+', _) => out.push(b' '),
            (b'%', Some(v)) => {
                out.push(v);
                i += 2;
            }
            _ => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn kind_of(resource: &str) -> Option<&'static str> {
    Some(match resource {
        "services" => "Service",
        "endpointslices" => "EndpointSlice",
        "nodes" => "Node",
        "pods" => "Pod",
        "configmaps" => "ConfigMap",
        "namespaces" => "Namespace",
        "servicecidrs" => "ServiceCIDR",
        _ => return None,
    })
}

fn lookup<'a>(obj: &'a Value, dotted: &str) -> Option<&'a Value> {
    dotted.split('.').try_fold(obj, |v, k| v.get(k))
}

fn as_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Equality-based label selector terms: `k=v`, `k==v`, `k!=v`, `k`, `!k`.
fn labels_match(obj: &Value, selector: &str) -> bool {
    let labels = obj.pointer("/metadata/labels");
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                get(k.trim()) != Some(v.trim())
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                get(k.trim()) == Some(v.trim())
            } else if let Some(k) = term.strip_prefix('!') {
                get(k).is_none()
            } else {
                get(term).is_some()
            }
        })
}

/// Field selector terms `path=value` / `path!=value` on dotted paths.
fn fields_match(obj: &Value, selector: &str) -> bool {
    selector
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            if let Some((k, v)) = term.split_once("!=") {
                as_text(lookup(obj, k)) != v
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                as_text(lookup(obj, k)) == v
            } else {
                false
            }
        })
}

fn namespace_objects(objects: &[Value]) -> Vec<Value> {
    let mut names: BTreeSet<String> = objects
        .iter()
        .filter_map(|o| o.pointer("/metadata/namespace").and_then(Value::as_str))
        .map(str::to_string)
        .collect();
    names.insert("default".into());
    names.insert("kube-system".into());
    names
        .into_iter()
        .map(|n| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}}))
        .collect()
}

async fn handle(st: Arc<State>, req: Request<Incoming>) -> Resp {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    st.log.lock().unwrap().push(if query.is_empty() {
        format!("{method} {path}")
    } else {
        format!("{method} {path}?{query}")
    });
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|h| h.to_str().ok())
        .unwrap_or("")
        .to_string();
    let accepted = auth == format!("Bearer {TOKEN}")
        || st
            .tokens
            .lock()
            .unwrap()
            .iter()
            .any(|t| auth == format!("Bearer {t}"));
    if !accepted {
        return error_response(401, "", "");
    }
    let full = format!("{path}?{query}");
    let slow = st.slow.lock().unwrap().clone();
    if let Some((_, delay)) = slow.filter(|(n, _)| full.contains(n.as_str())) {
        tokio::time::sleep(delay).await;
    }
    let fault = {
        let mut faults = st.faults.lock().unwrap();
        let hit = faults.iter().position(|f| {
            f.method.is_none_or(|m| m == method)
                && full.contains(&f.path_contains)
                && f.times != Some(0)
        });
        hit.map(|i| {
            if let Some(n) = faults[i].times.as_mut() {
                *n -= 1;
            }
            faults[i].clone()
        })
    };
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    if let [
        "api",
        "v1",
        "namespaces",
        ns,
        "pods",
        target,
        "proxy",
        rest @ ..,
    ] = segs.as_slice()
    {
        if let Some(f) = fault {
            return error_response(f.status, "pods/proxy", "get");
        }
        let (pod, port) = target.rsplit_once(':').unwrap_or((target, ""));
        let request = ProxyRequest {
            namespace: ns.to_string(),
            pod: pod.to_string(),
            port: port.to_string(),
            path: format!("/{}", rest.join("/")),
        };
        return proxy_request(&st, &method, request).await;
    }
    // Normalise to (namespace, resource, name, subresource).
    // The group version objects are served in, when it is not their own (ServiceCIDRs).
    let mut served_as: Option<String> = None;
    let rest: &[&str] = match segs.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", "discovery.k8s.io", "v1", rest @ ..] => rest,
        ["apis", "events.k8s.io", "v1", rest @ ..] => rest,
        ["apis", "networking.k8s.io", version, rest @ ..]
            if st
                .service_cidr_versions
                .lock()
                .unwrap()
                .as_deref()
                .unwrap_or(&["v1"])
                .contains(version)
                && rest.first() == Some(&"servicecidrs") =>
        {
            served_as = Some(format!("networking.k8s.io/{version}"));
            rest
        }
        _ => return error_response(404, &path, "get"),
    };
    let (namespace, resource, name, sub) = match rest {
        ["namespaces"] => (None, "namespaces", None, None),
        ["namespaces", ns, res] => (Some(*ns), *res, None, None),
        ["namespaces", ns, res, name] => (Some(*ns), *res, Some(*name), None),
        ["namespaces", ns, res, name, sub] => (Some(*ns), *res, Some(*name), Some(*sub)),
        [res] => (None, *res, None, None),
        [res, name] => (None, *res, Some(*name), None),
        [res, name, sub] => (None, *res, Some(*name), Some(*sub)),
        _ => return error_response(404, &path, "get"),
    };
    let verb = match (method.as_str(), name, sub) {
        ("GET", _, Some("exec")) => "create",
        ("GET", None, _) => "list",
        ("GET", Some(_), _) => "get",
        ("POST", _, _) => "create",
        ("DELETE", _, _) => "delete",
        ("PATCH", _, _) => "patch",
        _ => "get",
    };
    if let Some(f) = fault {
        return error_response(f.status, resource, verb);
    }
    if resource == "events" {
        return event_request(&st, req, &method, namespace, name).await;
    }
    let Some(kind) = kind_of(resource) else {
        return error_response(404, resource, verb);
    };
    let params = query_pairs(&query);
    let param = |k: &str| {
        params
            .iter()
            .find(|(pk, _)| pk == k)
            .map(|(_, v)| v.clone())
    };

    if sub == Some("exec") {
        let command: Vec<String> = params
            .iter()
            .filter(|(k, _)| k == "command")
            .map(|(_, v)| v.clone())
            .collect();
        let exec = ExecRequest {
            namespace: namespace.unwrap_or_default().to_string(),
            pod: name.unwrap_or_default().to_string(),
            container: param("container"),
            command,
            stdin: None,
        };
        let wants_stdin = matches!(param("stdin").as_deref(), Some("true" | "1"));
        return exec_upgrade(st, req, exec, wants_stdin);
    }

    let in_scope = |o: &Value| {
        o.get("kind").and_then(Value::as_str) == Some(kind)
            && namespace.is_none_or(|ns| {
                o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
            })
    };
    match (method.as_str(), name) {
        ("GET", None) => {
            // Matched by reference and cloned only when served: a list of thousands of nodes
            // costs one page's copies, not the whole store's.
            // The store's lock is held only here, never across an await.
            let (items, total, end, watching) = {
                let objects = st.objects.lock().unwrap();
                let namespaces;
                let store: &[Value] = if kind == "Namespace" {
                    namespaces = namespace_objects(&objects);
                    &namespaces
                } else {
                    &objects
                };
                let labels = param("labelSelector");
                let fields = param("fieldSelector");
                let mut matched: Vec<&Value> = store
                    .iter()
                    .filter(|o| kind == "Namespace" || in_scope(o))
                    .filter(|o| labels.as_deref().is_none_or(|ls| labels_match(o, ls)))
                    .filter(|o| fields.as_deref().is_none_or(|fs| fields_match(o, fs)))
                    .collect();
                matched.sort_by_cached_key(|o| {
                    (
                        as_text(o.pointer("/metadata/namespace")),
                        as_text(o.pointer("/metadata/name")),
                    )
                });
                let watching = param("watch").as_deref() == Some("true")
                    || param("watch").as_deref() == Some("1");
                let start: usize = param("continue")
                    .and_then(|c| c.strip_prefix("offset-").and_then(|n| n.parse().ok()))
                    .unwrap_or(0);
                let mut limit = param("limit")
                    .and_then(|l| l.parse::<usize>().ok())
                    .filter(|l| *l > 0 && !watching)
                    .unwrap_or(usize::MAX);
                if let Some(cap) = *st.max_page.lock().unwrap()
                    && !watching
                {
                    limit = limit.min(cap);
                }
                let total = matched.len();
                let end = start.saturating_add(limit).min(total);
                let items: Vec<Value> = matched
                    .get(start..end)
                    .unwrap_or_default()
                    .iter()
                    .map(|o| {
                        let mut o = (*o).clone();
                        in_version(&mut o, served_as.as_deref());
                        o
                    })
                    .collect();
                (items, total, end, watching)
            };
            if watching {
                let since = param("resourceVersion")
                    .and_then(|rv| rv.parse::<u64>().ok())
                    .filter(|rv| *rv > 0);
                if let Some(since) = since {
                    let timeout = param("timeoutSeconds")
                        .and_then(|t| t.parse::<u64>().ok())
                        .unwrap_or(290);
                    let filter = WatchFilter {
                        kind,
                        api_version: served_as.clone(),
                        namespace: namespace.map(str::to_string),
                        labels: param("labelSelector"),
                        fields: param("fieldSelector"),
                    };
                    let no_outage = st.outage.read().await;
                    let generation = st.generation.load(Ordering::SeqCst);
                    let expired = since < st.compacted.load(Ordering::SeqCst);
                    drop(no_outage);
                    if expired {
                        let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "reason": "Expired", "code": 410,
                            "message": format!("too old resource version: {since}")});
                        let line = format!("{}\n", json!({"type": "ERROR", "object": status}));
                        return Response::builder()
                            .status(200)
                            .header("content-type", "application/json")
                            .body(full_body(line))
                            .expect("response");
                    }
                    let timeout = Duration::from_secs(timeout);
                    return watch_stream(st, filter, since, generation, timeout);
                }
                let mut body = String::new();
                for o in items {
                    body.push_str(&json!({"type": "ADDED", "object": o}).to_string());
                    body.push('\n');
                }
                return Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(full_body(body))
                    .expect("response");
            }
            let page = items;
            let mut metadata = json!({"resourceVersion": st.rv.load(Ordering::SeqCst).to_string()});
            if end < total {
                metadata["continue"] = json!(format!("offset-{end}"));
                metadata["remainingItemCount"] = json!(total - end);
            }
            let api_version = match (&served_as, kind) {
                (Some(v), _) => v.as_str(),
                (None, "EndpointSlice") => "discovery.k8s.io/v1",
                (None, _) => "v1",
            };
            json_response(
                200,
                &json!({"apiVersion": api_version, "kind": format!("{kind}List"),
                        "metadata": metadata, "items": page}),
            )
        }
        ("GET", Some(n)) => {
            let objects = st.objects.lock().unwrap();
            match objects.iter().find(|o| {
                in_scope(o) && o.pointer("/metadata/name").and_then(Value::as_str) == Some(n)
            }) {
                Some(o) => {
                    let mut o = o.clone();
                    in_version(&mut o, served_as.as_deref());
                    json_response(200, &o)
                }
                None => json_response(
                    404,
                    &status_body(404, "NotFound", &format!("{resource} \"{n}\" not found")),
                ),
            }
        }
        ("DELETE", Some(n)) => {
            let removed = st
                .remove(|o| {
                    in_scope(o) && o.pointer("/metadata/name").and_then(Value::as_str) == Some(n)
                })
                .pop();
            st.deleted
                .lock()
                .unwrap()
                .push(format!("{}/{n}", namespace.unwrap_or_default()));
            match removed {
                Some(o) => json_response(200, &o),
                _ => json_response(
                    404,
                    &status_body(404, "NotFound", &format!("{resource} \"{n}\" not found")),
                ),
            }
        }
        ("PATCH", Some(n)) if kind == "Node" && sub == Some("status") => {
            let Some(patch) = read_json(req).await else {
                return error_response(400, resource, verb);
            };
            let Some(mut node) = st
                .objects
                .lock()
                .unwrap()
                .iter()
                .find(|o| {
                    in_scope(o) && o.pointer("/metadata/name").and_then(Value::as_str) == Some(n)
                })
                .cloned()
            else {
                return json_response(
                    404,
                    &status_body(404, "NotFound", &format!("nodes \"{n}\" not found")),
                );
            };
            merge_conditions(&mut node, &patch);
            st.upsert(node.clone());
            json_response(200, &node)
        }
        ("POST", None) if kind == "Pod" => {
            let body = match http_body_util::BodyExt::collect(req.into_body()).await {
                Ok(b) => b.to_bytes(),
                Err(_) => return error_response(400, resource, verb),
            };
            let Ok(mut obj) = serde_json::from_slice::<Value>(&body) else {
                return error_response(400, resource, verb);
            };
            obj["metadata"]["namespace"] = json!(namespace.unwrap_or("default"));
            obj["metadata"]["uid"] = json!("00000000-0000-0000-0000-000000000001");
            obj["status"] = json!({"phase": "Running"});
            st.created.lock().unwrap().push(format!(
                "{}/{}",
                namespace.unwrap_or("default"),
                as_text(obj.pointer("/metadata/name"))
            ));
            st.upsert(obj.clone());
            let stored = st
                .objects
                .lock()
                .unwrap()
                .iter()
                .find(|o| identity(o) == identity(&obj))
                .cloned()
                .unwrap_or(obj);
            json_response(201, &stored)
        }
        _ => error_response(405, resource, verb),
    }
}

/// A request through the pod proxy: 404 for a pod that does not exist, else the pod's answer
/// (503 when nothing listens), as the API server passes it through.
async fn proxy_request(st: &State, method: &str, req: ProxyRequest) -> Resp {
    if method != "GET" {
        return error_response(405, "pods/proxy", "create");
    }
    let exists = st.objects.lock().unwrap().iter().any(|o| {
        o.get("kind").and_then(Value::as_str) == Some("Pod")
            && o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(&req.namespace)
            && o.pointer("/metadata/name").and_then(Value::as_str) == Some(&req.pod)
    });
    if !exists {
        return json_response(
            404,
            &status_body(404, "NotFound", &format!("pods \"{}\" not found", req.pod)),
        );
    }
    let handler = st.proxy.lock().unwrap().clone();
    /// Counts a request as open until it is answered or its connection goes away.
    struct Open<'a>(&'a AtomicUsize);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let now = st.proxy_inflight.fetch_add(1, Ordering::SeqCst) + 1;
    let _open = Open(&st.proxy_inflight);
    st.proxy_max_inflight.fetch_max(now, Ordering::SeqCst);
    // On a blocking thread, as exec handlers: a handler may forward to a real server.
    let reply = match handler {
        Some(h) => {
            let asked = req.clone();
            tokio::task::spawn_blocking(move || h(&asked))
                .await
                .unwrap_or(ProxyReply::Refused)
        }
        None => ProxyReply::Refused,
    };
    match reply {
        ProxyReply::Answer {
            status,
            content_type,
            body,
        } => Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(full_body(body))
            .expect("response"),
        ProxyReply::Refused => json_response(
            503,
            &status_body(
                503,
                "ServiceUnavailable",
                &format!(
                    "error trying to reach service: dial tcp 10.0.0.1:{}: connect: connection refused",
                    req.port
                ),
            ),
        ),
        ProxyReply::Hang => {
            tokio::time::sleep(Duration::from_secs(120)).await;
            error_response(504, "pods/proxy", "get")
        }
    }
}

/// The body of a request as JSON.
async fn read_json(req: Request<Incoming>) -> Option<Value> {
    let body = http_body_util::BodyExt::collect(req.into_body())
        .await
        .ok()?;
    serde_json::from_slice(&body.to_bytes()).ok()
}

/// A strategic-merge patch of a Node's status: `status.conditions` merge by `type` (the patch
/// key of NodeCondition); other status fields are replaced.
fn merge_conditions(node: &mut Value, patch: &Value) {
    let Some(status) = patch.get("status").and_then(Value::as_object) else {
        return;
    };
    if node.get("status").is_none_or(|s| !s.is_object()) {
        node["status"] = json!({});
    }
    for (k, v) in status {
        if k != "conditions" {
            node["status"][k] = v.clone();
            continue;
        }
        if !node["status"]["conditions"].is_array() {
            node["status"]["conditions"] = json!([]);
        }
        for c in v.as_array().into_iter().flatten() {
            let list = node["status"]["conditions"].as_array_mut().expect("array");
            match list.iter_mut().find(|o| o["type"] == c["type"]) {
                Some(slot) => {
                    if let (Some(slot), Some(new)) = (slot.as_object_mut(), c.as_object()) {
                        for (ck, cv) in new {
                            slot.insert(ck.clone(), cv.clone());
                        }
                    }
                }
                None => list.push(c.clone()),
            }
        }
    }
}

/// `events.k8s.io/v1` Events: create (POST) and merge-patch (PATCH) by name.
async fn event_request(
    st: &State,
    req: Request<Incoming>,
    method: &str,
    namespace: Option<&str>,
    name: Option<&str>,
) -> Resp {
    match (method, name) {
        ("POST", None) => {
            let Some(mut ev) = read_json(req).await else {
                return error_response(400, "events", "create");
            };
            ev["metadata"]["namespace"] = json!(namespace.unwrap_or("default"));
            st.api_events.lock().unwrap().push(ev.clone());
            json_response(201, &ev)
        }
        ("PATCH", Some(n)) => {
            let Some(patch) = read_json(req).await else {
                return error_response(400, "events", "patch");
            };
            let mut events = st.api_events.lock().unwrap();
            match events
                .iter_mut()
                .find(|e| e.pointer("/metadata/name").and_then(Value::as_str) == Some(n))
            {
                Some(ev) => {
                    if let (Some(ev), Some(p)) = (ev.as_object_mut(), patch.as_object()) {
                        for (k, v) in p {
                            ev.insert(k.clone(), v.clone());
                        }
                    }
                    json_response(200, ev)
                }
                None => json_response(
                    404,
                    &status_body(404, "NotFound", &format!("events \"{n}\" not found")),
                ),
            }
        }
        _ => error_response(405, "events", "get"),
    }
}

/// `o` as served in `api_version`, when given (a ServiceCIDR asked for as `v1beta1`).
fn in_version(o: &mut Value, api_version: Option<&str>) {
    if let Some(v) = api_version {
        o["apiVersion"] = json!(v);
    }
}

/// Which events a watch wants.
struct WatchFilter {
    kind: &'static str,
    /// The version its objects are served in, when not their own.
    api_version: Option<String>,
    namespace: Option<String>,
    labels: Option<String>,
    fields: Option<String>,
}

impl WatchFilter {
    fn wants(&self, o: &Value) -> bool {
        o.get("kind").and_then(Value::as_str) == Some(self.kind)
            && self.namespace.as_deref().is_none_or(|ns| {
                o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
            })
            && self.labels.as_deref().is_none_or(|s| labels_match(o, s))
            && self.fields.as_deref().is_none_or(|s| fields_match(o, s))
    }
}

/// A watch from `since`: the events after it, then every later one as it happens, until
/// `timeout` passes, the client goes away, an outage ends watches of `generation` or the server
/// stops.
fn watch_stream(
    st: Arc<State>,
    filter: WatchFilter,
    since: u64,
    generation: u64,
    timeout: Duration,
) -> Resp {
    type Chunk = Result<Frame<Bytes>, std::convert::Infallible>;
    let (tx, rx) = futures::channel::mpsc::unbounded::<Chunk>();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut seen = since;
        loop {
            let notified = st.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let lines: Vec<String> = {
                let events = st.events.lock().unwrap();
                if st.generation.load(Ordering::SeqCst) != generation {
                    return;
                }
                let fresh: Vec<&WatchRecord> = events.iter().filter(|e| e.rv > seen).collect();
                seen = fresh.last().map_or(seen, |e| e.rv);
                fresh
                    .into_iter()
                    .filter(|e| filter.wants(&e.object))
                    .map(|e| {
                        let mut object = e.object.clone();
                        in_version(&mut object, filter.api_version.as_deref());
                        format!("{}\n", json!({"type": e.kind, "object": object}))
                    })
                    .collect()
            };
            for line in lines {
                if tx
                    .unbounded_send(Ok(Frame::data(Bytes::from(line))))
                    .is_err()
                {
                    return;
                }
            }
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(deadline) => return,
                // Notice a client that went away even when nothing changes.
                _ = tokio::time::sleep(Duration::from_millis(500)) => {
                    if tx.is_closed() {
                        return;
                    }
                }
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(rx)))
        .expect("response")
}

/// Reads stdin (channel 0) until the client ends it. Returns the bytes and whether the
/// connection can still carry the answer (false when the client closed the websocket, the
/// only way to end stdin with v4).
async fn read_stdin<S>(ws: &mut S, v5: bool) -> (Vec<u8>, bool)
where
    S: futures::Stream<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin,
{
    let mut input = Vec::new();
    let read = async {
        while let Some(msg) = ws.next().await {
            match msg {
                Ok(Message::Binary(b)) => match b.first() {
                    Some(0) => input.extend_from_slice(b.get(1..).unwrap_or_default()),
                    Some(255) if v5 && b.get(1) == Some(&0) => return true,
                    _ => {}
                },
                Ok(Message::Close(_)) | Err(_) => return false,
                Ok(_) => {}
            }
        }
        false
    };
    let open = tokio::time::timeout(Duration::from_secs(60), read)
        .await
        .unwrap_or(false);
    (input, open)
}

fn exec_upgrade(
    st: Arc<State>,
    req: Request<Incoming>,
    mut exec: ExecRequest,
    wants_stdin: bool,
) -> Resp {
    let header = |n: &str| {
        req.headers()
            .get(n)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    if !header("upgrade").eq_ignore_ascii_case("websocket") {
        return json_response(
            400,
            &status_body(400, "BadRequest", "exec needs a websocket upgrade"),
        );
    }
    let offered = header("sec-websocket-protocol");
    let only = *st.exec_protocol.lock().unwrap();
    let protocol = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
        .into_iter()
        .filter(|p| only.is_none_or(|o| o == *p))
        .find(|p| offered.split(',').any(|o| o.trim() == *p));
    let Some(protocol) = protocol else {
        return json_response(
            400,
            &status_body(400, "BadRequest", "no supported channel protocol offered"),
        );
    };
    let accept = tokio_tungstenite::tungstenite::handshake::derive_accept_key(
        header("sec-websocket-key").as_bytes(),
    );
    let handler = st.exec.lock().unwrap().clone();
    let delay = *st.exec_delay.lock().unwrap();
    if !wants_stdin {
        st.execs.lock().unwrap().push(exec.clone());
    }
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(req).await else {
            return;
        };
        let now = st.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        st.max_inflight.fetch_max(now, Ordering::SeqCst);
        let mut ws = tokio_tungstenite::WebSocketStream::from_raw_socket(
            TokioIo::new(upgraded),
            Role::Server,
            None,
        )
        .await;
        let mut connected = true;
        if wants_stdin {
            let (input, open) = read_stdin(&mut ws, protocol == "v5.channel.k8s.io").await;
            exec.stdin = Some(input);
            connected = open;
            st.execs.lock().unwrap().push(exec.clone());
        }
        let reply = match handler {
            Some(h) => {
                let request = exec.clone();
                tokio::task::spawn_blocking(move || h(&request))
                    .await
                    .unwrap_or(ExecReply::Missing)
            }
            None => ExecReply::Missing,
        };
        if !connected {
            // The client closed the websocket to end stdin (v4): the command ran, but there is
            // nobody to tell. Finish the closing handshake the client started.
            st.inflight.fetch_sub(1, Ordering::SeqCst);
            let _ = ws.close(None).await;
            return;
        }
        tokio::time::sleep(delay).await;
        let frame = |ch: u8, data: &[u8]| {
            let mut v = Vec::with_capacity(data.len() + 1);
            v.push(ch);
            v.extend_from_slice(data);
            Message::binary(v)
        };
        match reply {
            ExecReply::Hang => {
                let _ = tokio::time::timeout(Duration::from_secs(60), async {
                    while let Some(Ok(_)) = ws.next().await {}
                })
                .await;
                st.inflight.fetch_sub(1, Ordering::SeqCst);
            }
            ExecReply::Missing => {
                let program = exec.command.first().cloned().unwrap_or_default();
                let msg = format!(
                    "OCI runtime exec failed: exec failed: unable to start container process: exec: \"{program}\": executable file not found in $PATH: unknown"
                );
                let status = json!({"metadata": {}, "status": "Failure", "message": msg,
                                    "reason": "InternalError",
                                    "details": {"causes": [{"message": msg}]}, "code": 500});
                // The session is over for the client once it reads the status: count it
                // as finished before sending, so that the gauge never overlaps sessions.
                st.inflight.fetch_sub(1, Ordering::SeqCst);
                let _ = ws.send(frame(3, status.to_string().as_bytes())).await;
            }
            ExecReply::Output {
                stdout,
                stderr,
                exit_code,
            } => {
                for chunk in stdout.as_bytes().chunks(16 * 1024) {
                    if ws.send(frame(1, chunk)).await.is_err() {
                        break;
                    }
                }
                if !stderr.is_empty() {
                    let _ = ws.send(frame(2, stderr.as_bytes())).await;
                }
                let status = if exit_code == 0 {
                    json!({"metadata": {}, "status": "Success"})
                } else {
                    json!({"metadata": {}, "status": "Failure",
                           "message": format!("command terminated with non-zero exit code: error executing command {:?}, exit code {exit_code}", exec.command),
                           "reason": "NonZeroExitCode",
                           "details": {"causes": [{"reason": "ExitCode", "message": exit_code.to_string()}]}})
                };
                // The session is over for the client once it reads the status: count it
                // as finished before sending, so that the gauge never overlaps sessions.
                st.inflight.fetch_sub(1, Ordering::SeqCst);
                let _ = ws.send(frame(3, status.to_string().as_bytes())).await;
            }
        }
        let _ = ws.close(None).await;
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", accept)
        .header("sec-websocket-protocol", protocol)
        .body(full_body(Bytes::new()))
        .expect("response")
}
