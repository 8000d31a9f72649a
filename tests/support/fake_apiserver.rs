//! An in-process fake kube-apiserver for tests: plain HTTP/1.1 on 127.0.0.1 (hyper 1), run in
//! its own thread with its own tokio runtime, so that the CLI binary can be spawned against it.
//!
//! What it serves, from JSON objects it was given (e.g. a recorded `kubectl get -o json` List):
//! - list (with `labelSelector`, `fieldSelector`, `limit`/`continue` pagination) and watch
//!   (`watch=true`: one `ADDED` event per object, then the stream ends) of Services,
//!   EndpointSlices, Nodes, Pods, ConfigMaps and Namespaces, cluster-wide and per namespace;
//! - get and delete by name, create of Pods (phase set to Running);
//! - pod exec over the websocket channel protocol (`v5.channel.k8s.io`, `v4.channel.k8s.io`):
//!   stdout on channel 1, stderr on 2 and the exit `Status` on channel 3, answered by an
//!   [`ExecHandler`];
//! - failures on demand ([`Fault`]: any status for requests whose path contains a string),
//!   401 for a bearer token other than [`TOKEN`].
//!
//! Every request is logged ([`FakeApiServer::requests`]); exec concurrency is measured
//! ([`FakeApiServer::max_concurrent_execs`]).

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
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
}

#[derive(Default)]
struct State {
    objects: Mutex<Vec<Value>>,
    faults: Mutex<Vec<Fault>>,
    exec: Mutex<Option<ExecHandler>>,
    exec_delay: Mutex<Duration>,
    log: Mutex<Vec<String>>,
    execs: Mutex<Vec<ExecRequest>>,
    deleted: Mutex<Vec<String>>,
    created: Mutex<Vec<String>>,
    max_page: Mutex<Option<usize>>,
    inflight: AtomicUsize,
    max_inflight: AtomicUsize,
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

    /// Adds objects (each with `kind`, `metadata.name`, optional `metadata.namespace`).
    pub fn add_objects(&self, objects: impl IntoIterator<Item = Value>) {
        self.state.objects.lock().unwrap().extend(objects);
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

    /// Delays every exec answer (to make concurrency observable).
    pub fn set_exec_delay(&self, d: Duration) {
        *self.state.exec_delay.lock().unwrap() = d;
    }

    /// Caps every list page at `n` items (forces `continue` pagination).
    pub fn set_max_page(&self, n: usize) {
        *self.state.max_page.lock().unwrap() = Some(n);
    }

    /// Injects a failure.
    pub fn fail(&self, method: Option<&'static str>, path_contains: &str, status: u16) {
        self.state.faults.lock().unwrap().push(Fault {
            method,
            path_contains: path_contains.to_string(),
            status,
        });
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

type Resp = Response<Full<Bytes>>;

fn json_response(code: u16, body: &Value) -> Resp {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
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
    if auth != format!("Bearer {TOKEN}") {
        return error_response(401, "", "");
    }
    let full = format!("{path}?{query}");
    let fault = st
        .faults
        .lock()
        .unwrap()
        .iter()
        .find(|f| f.method.is_none_or(|m| m == method) && full.contains(&f.path_contains))
        .cloned();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    // Normalise to (namespace, resource, name, subresource).
    let rest: &[&str] = match segs.as_slice() {
        ["api", "v1", rest @ ..] => rest,
        ["apis", "discovery.k8s.io", "v1", rest @ ..] => rest,
        _ => return error_response(404, &path, "get"),
    };
    let (namespace, resource, name, sub) = match rest {
        ["namespaces"] => (None, "namespaces", None, None),
        ["namespaces", ns, res] => (Some(*ns), *res, None, None),
        ["namespaces", ns, res, name] => (Some(*ns), *res, Some(*name), None),
        ["namespaces", ns, res, name, sub] => (Some(*ns), *res, Some(*name), Some(*sub)),
        [res] => (None, *res, None, None),
        [res, name] => (None, *res, Some(*name), None),
        _ => return error_response(404, &path, "get"),
    };
    let verb = match (method.as_str(), name, sub) {
        ("GET", _, Some("exec")) => "create",
        ("GET", None, _) => "list",
        ("GET", Some(_), _) => "get",
        ("POST", _, _) => "create",
        ("DELETE", _, _) => "delete",
        _ => "get",
    };
    if let Some(f) = fault {
        return error_response(f.status, resource, verb);
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
        };
        return exec_upgrade(st, req, exec);
    }

    let in_scope = |o: &Value| {
        o.get("kind").and_then(Value::as_str) == Some(kind)
            && namespace.is_none_or(|ns| {
                o.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
            })
    };
    match (method.as_str(), name) {
        ("GET", None) => {
            let objects = st.objects.lock().unwrap().clone();
            let mut items: Vec<Value> = if kind == "Namespace" {
                namespace_objects(&objects)
            } else {
                objects.into_iter().filter(|o| in_scope(o)).collect()
            };
            if let Some(ls) = param("labelSelector") {
                items.retain(|o| labels_match(o, &ls));
            }
            if let Some(fs) = param("fieldSelector") {
                items.retain(|o| fields_match(o, &fs));
            }
            items.sort_by_key(|o| {
                (
                    as_text(o.pointer("/metadata/namespace")),
                    as_text(o.pointer("/metadata/name")),
                )
            });
            if param("watch").as_deref() == Some("true") || param("watch").as_deref() == Some("1") {
                let mut body = String::new();
                for o in items {
                    body.push_str(&json!({"type": "ADDED", "object": o}).to_string());
                    body.push('\n');
                }
                return Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .expect("response");
            }
            let start: usize = param("continue")
                .and_then(|c| c.strip_prefix("offset-").and_then(|n| n.parse().ok()))
                .unwrap_or(0);
            let mut limit = param("limit")
                .and_then(|l| l.parse::<usize>().ok())
                .filter(|l| *l > 0)
                .unwrap_or(usize::MAX);
            if let Some(cap) = *st.max_page.lock().unwrap() {
                limit = limit.min(cap);
            }
            let end = start.saturating_add(limit).min(items.len());
            let page: Vec<Value> = items
                .get(start..end)
                .map(<[Value]>::to_vec)
                .unwrap_or_default();
            let mut metadata = json!({"resourceVersion": "1"});
            if end < items.len() {
                metadata["continue"] = json!(format!("offset-{end}"));
                metadata["remainingItemCount"] = json!(items.len() - end);
            }
            let api_version = if kind == "EndpointSlice" {
                "discovery.k8s.io/v1"
            } else {
                "v1"
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
                Some(o) => json_response(200, o),
                None => json_response(
                    404,
                    &status_body(404, "NotFound", &format!("{resource} \"{n}\" not found")),
                ),
            }
        }
        ("DELETE", Some(n)) => {
            let mut objects = st.objects.lock().unwrap();
            let before = objects.len();
            let mut removed = None;
            objects.retain(|o| {
                let hit =
                    in_scope(o) && o.pointer("/metadata/name").and_then(Value::as_str) == Some(n);
                if hit {
                    removed = Some(o.clone());
                }
                !hit
            });
            st.deleted
                .lock()
                .unwrap()
                .push(format!("{}/{n}", namespace.unwrap_or_default()));
            match removed {
                Some(o) if objects.len() < before => json_response(200, &o),
                _ => json_response(
                    404,
                    &status_body(404, "NotFound", &format!("{resource} \"{n}\" not found")),
                ),
            }
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
            st.objects.lock().unwrap().push(obj.clone());
            json_response(201, &obj)
        }
        _ => error_response(405, resource, verb),
    }
}

fn exec_upgrade(st: Arc<State>, req: Request<Incoming>, exec: ExecRequest) -> Resp {
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
    let protocol = ["v5.channel.k8s.io", "v4.channel.k8s.io"]
        .into_iter()
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
    st.execs.lock().unwrap().push(exec.clone());
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
        let reply = match &handler {
            Some(h) => h(&exec),
            None => ExecReply::Missing,
        };
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
            }
            ExecReply::Missing => {
                let program = exec.command.first().cloned().unwrap_or_default();
                let msg = format!(
                    "OCI runtime exec failed: exec failed: unable to start container process: exec: \"{program}\": executable file not found in $PATH: unknown"
                );
                let status = json!({"metadata": {}, "status": "Failure", "message": msg,
                                    "reason": "InternalError",
                                    "details": {"causes": [{"message": msg}]}, "code": 500});
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
                let _ = ws.send(frame(3, status.to_string().as_bytes())).await;
            }
        }
        let _ = ws.close(None).await;
        st.inflight.fetch_sub(1, Ordering::SeqCst);
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-accept", accept)
        .header("sec-websocket-protocol", protocol)
        .body(Full::new(Bytes::new()))
        .expect("response")
}
