//! The API reads of `kubectl kproxy status`: every node's monitor condition (one paginated
//! `list nodes`), the monitor's agent pods (one `list pods` by label selector), and an agent's
//! `/findings` through the API server's pod proxy.
//!
//! Lists keep only what `status` reads of each object, page by page: a Node carries its images
//! and the kubelet's conditions (kilobytes each), which 5,000 of would hold tens of megabytes for
//! nothing. What an agent answers is untrusted: its size is bounded, its names are checked
//! before they go into a path, and a document that is not the monitor's is an error, not an
//! empty report.

use crate::compare::Severity;
use crate::fleet::{ConditionView, FindingKey, NodeState, Rollup, classify, condition};
use crate::kube_client::{ApiCall, ApiError, Connection};
use kube::api::{GetParams, ListParams};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// The most an agent's `/findings` may send: a mass-drift report is grouped by cause, so a real
/// one is a small fraction of this.
pub const MAX_FINDINGS_BYTES: usize = 8 << 20;

/// The port the monitor listens on unless its pod names another (`deploy/monitor/`).
pub const DEFAULT_AGENT_PORT: u16 = 9847;

/// One node and its condition of the type asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeCondition {
    /// The node's name.
    pub name: String,
    /// Its condition, when it has one.
    pub condition: Option<ConditionView>,
}

/// One agent pod, as `status` needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The node it runs on (`spec.nodeName`).
    pub node: Option<String>,
    /// `status.phase`.
    pub phase: Option<String>,
    /// Its `Ready` condition is `True`.
    pub ready: bool,
    /// Being deleted (`metadata.deletionTimestamp` set).
    pub deleting: bool,
    /// The container port with the name asked for, when one has it.
    pub port: Option<u16>,
}

/// One finding of an agent's `/findings`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentFinding {
    /// Catalogue ID.
    pub id: String,
    /// Severity; `None` when the agent wrote a word this build does not know.
    pub severity: Option<Severity>,
    /// Service port.
    pub service: Option<String>,
    /// Chain.
    pub chain: Option<String>,
    /// Message.
    pub message: String,
    /// Still inside the grace period.
    pub pending: bool,
    /// Past the grace period.
    pub drift: bool,
}

/// An agent's `/findings`, as `status` reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentReport {
    /// The node the report is about.
    pub node: Option<String>,
    /// The node's state (`in_sync`, `pending`, `drift`, `failed`, `unknown`).
    pub state: Option<String>,
    /// Why the report no longer speaks for the node, when it does not.
    pub stale: Option<String>,
    /// When its verify ran (RFC 3339).
    pub verified_at: Option<String>,
    /// Its findings.
    pub findings: Vec<AgentFinding>,
}

/// Why an agent's findings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FindingsError {
    /// The API server refused or failed the proxy request itself.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The agent (or the proxy on its behalf) answered another status than 200.
    #[error("{what} answered {code}: {text}")]
    Status {
        /// The request, for the message.
        what: String,
        /// HTTP status.
        code: u16,
        /// The first line of the answer.
        text: String,
    },
    /// No answer within the time allowed.
    #[error("{what}: no answer within {}", crate::state::duration::format(*.timeout))]
    Timeout {
        /// The request, for the message.
        what: String,
        /// The time allowed.
        timeout: Duration,
    },
    /// The answer is longer than [`MAX_FINDINGS_BYTES`].
    #[error("{what}: the answer is longer than {limit} bytes")]
    TooLarge {
        /// The request, for the message.
        what: String,
        /// The limit.
        limit: usize,
    },
    /// The answer is not the monitor's `/findings` document.
    #[error("{what}: the answer is not the monitor's /findings document: {detail}")]
    NotFindings {
        /// The request, for the message.
        what: String,
        /// Why.
        detail: String,
    },
    /// A name that cannot be part of an API path (the pod list held something odd).
    #[error("pod {0} cannot be reached through the API's proxy: not a valid name")]
    BadName(String),
}

/// The most names of any kind that a name may be (a DNS subdomain, RFC 1123).
const NAME_MAX: usize = 253;

/// Whether `s` is a DNS subdomain (RFC 1123), what namespace and pod names are: lower-case
/// letters, digits, `-` and `.`, starting and ending with a letter or digit.
fn is_dns_subdomain(s: &str) -> bool {
    let edge = |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    !s.is_empty()
        && s.len() <= NAME_MAX
        && edge(s.as_bytes().first())
        && edge(s.as_bytes().last())
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

#[derive(Deserialize)]
struct Page<T> {
    #[serde(default)]
    metadata: PageMeta,
    // An absent `items` reads as None without a `default` (which would ask `T: Default`).
    items: Option<Vec<T>>,
}

#[derive(Deserialize, Default)]
struct PageMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}

/// Lists `path` page by page (as kubectl: [`super::api::PAGE_SIZE`] objects a page, following
/// `continue` tokens), handing each object to `each` as its page arrives.
async fn list_each<T: DeserializeOwned>(
    conn: &Connection,
    path: &str,
    params: ListParams,
    call: ApiCall,
    mut each: impl FnMut(T),
) -> Result<(), ApiError> {
    let mut params = params.limit(super::api::PAGE_SIZE);
    let request = kube::core::Request::new(path);
    loop {
        let req = request.list(&params).map_err(|e| {
            ApiError::classify(kube::Error::BuildRequest(e), call.clone(), &conn.server)
        })?;
        let page: Page<T> = conn
            .client
            .request(req)
            .await
            .map_err(|e| ApiError::classify(e, call.clone(), &conn.server))?;
        page.items.into_iter().flatten().for_each(&mut each);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => return Ok(()),
        }
    }
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(rename = "deletionTimestamp", default)]
    deletion_timestamp: Option<String>,
}

#[derive(Deserialize)]
struct RawNode {
    metadata: Meta,
    #[serde(default)]
    status: Option<RawNodeStatus>,
}

#[derive(Deserialize)]
struct RawNodeStatus {
    #[serde(default)]
    conditions: Option<Vec<RawCondition>>,
}

#[derive(Deserialize)]
struct RawCondition {
    #[serde(rename = "type", default)]
    type_: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(rename = "lastTransitionTime", default)]
    last_transition_time: Option<String>,
    #[serde(rename = "lastHeartbeatTime", default)]
    last_heartbeat_time: Option<String>,
}

/// An RFC 3339 time as the API writes it; `None` when it is not one.
fn parse_time(text: Option<&str>) -> Option<SystemTime> {
    let ts: k8s_openapi::jiff::Timestamp = text?.parse().ok()?;
    Some(SystemTime::from(ts))
}

impl RawCondition {
    fn view(self) -> ConditionView {
        ConditionView {
            last_transition: parse_time(self.last_transition_time.as_deref()),
            heartbeat: parse_time(self.last_heartbeat_time.as_deref()),
            status: self.status,
            reason: self.reason.unwrap_or_default(),
            message: self.message.unwrap_or_default(),
        }
    }
}

/// Every node (those `selector` matches, when given) with its condition of `condition_type`,
/// sorted by name. Nodes without a name (which the API never serves) are left out.
pub async fn list_node_conditions(
    conn: &Connection,
    selector: Option<&str>,
    condition_type: &str,
) -> Result<Vec<NodeCondition>, ApiError> {
    let mut params = ListParams::default();
    if let Some(s) = selector {
        params = params.labels(s);
    }
    let mut nodes = Vec::new();
    list_each(
        conn,
        "/api/v1/nodes",
        params,
        ApiCall::new("list", "nodes"),
        |n: RawNode| {
            let Some(name) = n.metadata.name.filter(|n| !n.is_empty()) else {
                return;
            };
            let condition = n
                .status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .find(|c| c.type_ == condition_type)
                .map(RawCondition::view);
            nodes.push(NodeCondition { name, condition });
        },
    )
    .await?;
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(nodes)
}

/// The names of every node (those `selector` matches, when given), sorted; nothing else of
/// each Node is kept.
pub async fn list_node_names(
    conn: &Connection,
    selector: Option<&str>,
) -> Result<Vec<String>, ApiError> {
    let mut params = ListParams::default();
    if let Some(s) = selector {
        params = params.labels(s);
    }
    let mut names = Vec::new();
    list_each(
        conn,
        "/api/v1/nodes",
        params,
        ApiCall::new("list", "nodes"),
        |n: NamedObject| names.extend(n.metadata.name.filter(|n| !n.is_empty())),
    )
    .await?;
    names.sort();
    Ok(names)
}

#[derive(Deserialize)]
struct NamedObject {
    metadata: Meta,
}

#[derive(Deserialize)]
struct RawPod {
    metadata: Meta,
    #[serde(default)]
    spec: Option<RawPodSpec>,
    #[serde(default)]
    status: Option<RawPodStatus>,
}

#[derive(Deserialize)]
struct RawPodSpec {
    #[serde(rename = "nodeName", default)]
    node_name: Option<String>,
    #[serde(default)]
    containers: Vec<RawContainer>,
}

#[derive(Deserialize)]
struct RawContainer {
    #[serde(default)]
    ports: Option<Vec<RawPort>>,
}

#[derive(Deserialize)]
struct RawPort {
    #[serde(default)]
    name: Option<String>,
    #[serde(rename = "containerPort", default)]
    container_port: i64,
}

#[derive(Deserialize)]
struct RawPodStatus {
    #[serde(default)]
    phase: Option<String>,
    #[serde(default)]
    conditions: Option<Vec<RawCondition>>,
}

/// The pods of `namespace` that `selector` matches, with the container port named
/// `port_name` of each.
pub async fn list_agent_pods(
    conn: &Connection,
    namespace: &str,
    selector: &str,
    port_name: &str,
) -> Result<Vec<AgentPod>, ApiError> {
    let path = format!("/api/v1/namespaces/{namespace}/pods");
    let mut pods = Vec::new();
    list_each(
        conn,
        &path,
        ListParams::default().labels(selector),
        ApiCall::new("list", "pods").in_namespace(namespace),
        |p: RawPod| {
            let Some(name) = p.metadata.name else {
                return;
            };
            let port = p
                .spec
                .as_ref()
                .into_iter()
                .flat_map(|s| &s.containers)
                .flat_map(|c| c.ports.iter().flatten())
                .find(|port| port.name.as_deref() == Some(port_name))
                .and_then(|port| u16::try_from(port.container_port).ok())
                .filter(|p| *p > 0);
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            pods.push(AgentPod {
                namespace: p
                    .metadata
                    .namespace
                    .unwrap_or_else(|| namespace.to_string()),
                name,
                node: p.spec.and_then(|s| s.node_name),
                phase: p.status.and_then(|s| s.phase),
                ready,
                deleting: p.metadata.deletion_timestamp.is_some(),
                port,
            });
        },
    )
    .await?;
    Ok(pods)
}

#[derive(Deserialize)]
struct RawReport {
    #[serde(default)]
    node: Option<String>,
    #[serde(default)]
    state: Option<String>,
    #[serde(default)]
    stale: Option<String>,
    #[serde(default)]
    verified_at: Option<String>,
    findings: Vec<RawFinding>,
}

#[derive(Deserialize)]
struct RawFinding {
    id: String,
    severity: String,
    #[serde(default)]
    service: Option<String>,
    #[serde(default)]
    chain: Option<String>,
    message: String,
    #[serde(default)]
    pending: bool,
    #[serde(default)]
    drift: bool,
}

fn severity(word: &str) -> Option<Severity> {
    match word {
        "error" => Some(Severity::Error),
        "warning" => Some(Severity::Warning),
        "info" => Some(Severity::Info),
        _ => None,
    }
}

/// Reads an agent's `/findings` document.
pub fn parse_report(text: &[u8]) -> Result<AgentReport, String> {
    let raw: RawReport = serde_json::from_slice(text).map_err(|e| e.to_string())?;
    Ok(AgentReport {
        node: raw.node,
        state: raw.state,
        stale: raw.stale,
        verified_at: raw.verified_at,
        findings: raw
            .findings
            .into_iter()
            .map(|f| AgentFinding {
                severity: severity(&f.severity),
                id: f.id,
                service: f.service,
                chain: f.chain,
                message: f.message,
                pending: f.pending,
                drift: f.drift,
            })
            .collect(),
    })
}

/// The first line of an answer, shortened, for a message.
fn first_line(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    // An API server's Status says what went wrong in its message.
    if let Ok(status) = serde_json::from_str::<serde_json::Value>(&text)
        && let Some(message) = status.get("message").and_then(|m| m.as_str())
    {
        return super::shorten(message.lines().next().unwrap_or_default(), 200);
    }
    super::shorten(text.lines().next().unwrap_or_default().trim(), 200)
}

/// `pod`'s `/findings` on `port`, through the API server's pod proxy
/// (`/api/v1/namespaces/NS/pods/NAME:PORT/proxy/findings`), within `timeout`, at most
/// [`MAX_FINDINGS_BYTES`] of it.
pub async fn fetch_findings(
    conn: &Connection,
    pod: &AgentPod,
    port: u16,
    timeout: Duration,
) -> Result<AgentReport, FindingsError> {
    if !is_dns_subdomain(&pod.namespace) || !is_dns_subdomain(&pod.name) {
        return Err(FindingsError::BadName(format!(
            "{:?}/{:?}",
            pod.namespace, pod.name
        )));
    }
    let what = format!("/findings of pod {}/{}:{port}", pod.namespace, pod.name);
    let call = ApiCall::new("get", "pods/proxy")
        .in_namespace(&pod.namespace)
        .named(&pod.name);
    let request = kube::core::Request::new(format!(
        "/api/v1/namespaces/{}/pods/{}:{port}/proxy",
        pod.namespace, pod.name
    ));
    let req = request
        .get("findings", &GetParams::default())
        .map_err(|e| {
            ApiError::classify(kube::Error::BuildRequest(e), call.clone(), &conn.server)
        })?;
    let exchange = async {
        let res = conn
            .client
            .send(req.map(kube::client::Body::from))
            .await
            .map_err(|e| ApiError::classify(e, call.clone(), &conn.server))?;
        let code = res.status().as_u16();
        let body = read_bounded(res.into_body(), MAX_FINDINGS_BYTES)
            .await
            .map_err(|e| match e {
                None => FindingsError::TooLarge {
                    what: what.clone(),
                    limit: MAX_FINDINGS_BYTES,
                },
                Some(e) => ApiError::classify(e, call.clone(), &conn.server).into(),
            })?;
        match code {
            200 => parse_report(&body).map_err(|detail| FindingsError::NotFindings {
                what: what.clone(),
                detail,
            }),
            401 => Err(ApiError::Unauthorized {
                server: conn.server.clone(),
                call: call.clone(),
            }
            .into()),
            403 => Err(ApiError::Forbidden {
                call: call.clone(),
                message: first_line(&body),
            }
            .into()),
            code => Err(FindingsError::Status {
                what: what.clone(),
                code,
                text: first_line(&body),
            }),
        }
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(FindingsError::Timeout {
            what: what.clone(),
            timeout,
        }),
    }
}

/// The whole body, or `Err(None)` once it is longer than `limit` (what came so far is dropped).
async fn read_bounded(
    mut body: kube::client::Body,
    limit: usize,
) -> Result<Vec<u8>, Option<kube::Error>> {
    use http_body_util::BodyExt;
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Some)?;
        if let Ok(data) = frame.into_data() {
            if out.len() + data.len() > limit {
                return Err(None);
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// What `status` asks of the cluster.
#[derive(Debug, Clone)]
pub struct StatusQuery {
    /// Node label selector (`-l`).
    pub selector: Option<String>,
    /// Where the agents run.
    pub agent_namespace: String,
    /// The agent pods' labels.
    pub agent_selector: String,
    /// The name of the agent container's port that serves `/findings`.
    pub agent_port_name: String,
    /// The port to use whatever the pod says.
    pub agent_port: Option<u16>,
    /// A condition whose heartbeat is older than this no longer speaks for its node.
    pub stale_after: Duration,
    /// How many agents are asked at once.
    pub max_concurrency: usize,
    /// The longest one agent's answer may take.
    pub agent_timeout: Duration,
}

/// The port name of the monitor's container (`deploy/monitor/daemonset.yaml`).
pub const AGENT_PORT_NAME: &str = "metrics";

/// One node as `status` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// The node's name.
    pub name: String,
    /// What its condition says ([`crate::fleet::classify`]).
    pub state: NodeState,
    /// Why the condition is not taken at its word, or what is known of a missing agent.
    pub detail: Option<String>,
    /// The condition.
    pub condition: Option<ConditionView>,
    /// The agent pod on the node, when one runs there.
    pub agent: Option<AgentPod>,
    /// What its agent's `/findings` said (drifted nodes only).
    pub findings: Option<NodeFindings>,
}

/// What a drifted node's agent said, counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeFindings {
    /// Differences past the grace period.
    pub drifted: usize,
    /// Differences inside it.
    pub pending: usize,
    /// Findings whose severity this build does not know (left out of the roll-up).
    pub unknown_severity: usize,
    /// The agent's state now (its report may be newer than the condition).
    pub state: Option<String>,
    /// Why the agent's report no longer speaks for the node, when it does not.
    pub stale: Option<String>,
    /// When the report's verify ran.
    pub verified_at: Option<String>,
    /// Why the findings could not be read (then the counts are 0).
    pub error: Option<String>,
}

/// The fleet as `status` sees it: every node (sorted by name), and what could not be read
/// beside the nodes.
#[derive(Debug, Clone, Default)]
pub struct Fleet {
    /// The nodes.
    pub nodes: Vec<NodeStatus>,
    /// Problems that leave the nodes' states as they are (the agent pods could not be listed).
    pub warnings: Vec<String>,
    /// Why the agent pods could not be listed, when they could not (then no node's findings
    /// can be fetched).
    pub agents_unlisted: Option<String>,
}

impl Fleet {
    /// The indexes of the drifted nodes, whose findings `status` fetches.
    pub fn drifted(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].state == NodeState::Drift)
            .collect()
    }
}

/// Reads every node's condition and the agent pods (two list calls, at once) and says what
/// each node's condition comes to at `now`. The agent pods failing to list is a warning: the
/// conditions still tell the states.
pub async fn read_fleet(
    conn: &Connection,
    query: &StatusQuery,
    now: SystemTime,
) -> Result<Fleet, ApiError> {
    let nodes = list_node_conditions(conn, query.selector.as_deref(), condition::TYPE);
    let pods = list_agent_pods(
        conn,
        &query.agent_namespace,
        &query.agent_selector,
        &query.agent_port_name,
    );
    let (nodes, pods) = futures::join!(nodes, pods);
    let nodes = nodes?;
    let mut warnings = Vec::new();
    let mut agents_unlisted = None;
    let pods = pods.unwrap_or_else(|e| {
        warnings.push(format!(
            "could not list the agent pods ({e}): no node's findings can be fetched"
        ));
        agents_unlisted = Some(e.to_string());
        Vec::new()
    });
    let mut by_node: HashMap<&str, Vec<&AgentPod>> = HashMap::new();
    for p in &pods {
        if let Some(n) = p.node.as_deref() {
            by_node.entry(n).or_default().push(p);
        }
    }
    let nodes = nodes
        .into_iter()
        .map(|n| {
            let (state, mut detail) = classify(n.condition.as_ref(), now, query.stale_after);
            let agent = by_node
                .get(n.name.as_str())
                .and_then(|p| best_pod(p))
                .cloned();
            if state == NodeState::AgentMissing {
                let seen = match &agent {
                    None => format!(
                        "no agent pod ({} in {})",
                        query.agent_selector, query.agent_namespace
                    ),
                    Some(p) => format!(
                        "agent pod {}/{} is {}{}",
                        p.namespace,
                        p.name,
                        p.phase.as_deref().unwrap_or("of no phase"),
                        if p.ready { "" } else { ", not ready" }
                    ),
                };
                detail = Some(match detail {
                    Some(d) => format!("{d}; {seen}"),
                    None => seen,
                });
            }
            NodeStatus {
                name: n.name,
                state,
                detail,
                condition: n.condition,
                agent,
                findings: None,
            }
        })
        .collect();
    Ok(Fleet {
        nodes,
        warnings,
        agents_unlisted,
    })
}

/// The pod to ask among a node's agent pods: one not being deleted first, then a ready one,
/// then a running one.
fn best_pod<'a>(pods: &[&'a AgentPod]) -> Option<&'a AgentPod> {
    pods.iter()
        .max_by_key(|p| {
            (
                !p.deleting,
                p.ready,
                p.phase.as_deref() == Some("Running"),
                std::cmp::Reverse(p.name.as_str()),
            )
        })
        .copied()
}

/// Fetches the findings of the nodes at `which` (their agents' `/findings`,
/// `query.max_concurrency` at a time, each within `query.agent_timeout`), counts them into each
/// node, and hands the differences past the grace period to `rollup`; `done` is called once per
/// node. A node without an agent pod, or
/// whose agent does not answer, gets the reason in [`NodeFindings::error`].
pub async fn fetch_findings_of(
    conn: &Connection,
    fleet: &mut Fleet,
    which: &[usize],
    query: &StatusQuery,
    rollup: &mut Rollup,
    done: impl Fn(),
) {
    use futures::StreamExt;
    let asks: Vec<(usize, Option<AgentPod>)> = which
        .iter()
        .filter_map(|&i| Some((i, fleet.nodes.get(i)?.agent.clone())))
        .collect();
    let no_pod = match &fleet.agents_unlisted {
        Some(e) => format!("the agent pods could not be listed: {e}"),
        None => format!(
            "no agent pod on the node ({} in {})",
            query.agent_selector, query.agent_namespace
        ),
    };
    let mut answers = futures::stream::iter(asks)
        .map(|(i, pod)| async move {
            let Some(pod) = pod else {
                return (i, None);
            };
            let port = query.agent_port.or(pod.port).unwrap_or(DEFAULT_AGENT_PORT);
            (
                i,
                Some(fetch_findings(conn, &pod, port, query.agent_timeout).await),
            )
        })
        .buffer_unordered(query.max_concurrency.max(1));
    while let Some((i, answer)) = answers.next().await {
        done();
        let Some(node) = fleet.nodes.get_mut(i) else {
            continue;
        };
        node.findings = Some(match answer {
            None => NodeFindings {
                error: Some(no_pod.clone()),
                ..NodeFindings::default()
            },
            Some(Err(e)) => NodeFindings {
                error: Some(e.to_string()),
                ..NodeFindings::default()
            },
            Some(Ok(report)) => count_into(&node.name, report, rollup),
        });
    }
}

/// Counts an agent's report and rolls up its drifted differences.
fn count_into(node: &str, report: AgentReport, rollup: &mut Rollup) -> NodeFindings {
    let mut counted = NodeFindings {
        state: report.state,
        stale: report.stale,
        verified_at: report.verified_at,
        ..NodeFindings::default()
    };
    let mut keys = Vec::new();
    for f in report.findings {
        let Some(severity) = f.severity else {
            counted.unknown_severity += 1;
            continue;
        };
        if severity == Severity::Info {
            continue;
        }
        if f.drift {
            counted.drifted += 1;
            keys.push(FindingKey {
                severity,
                id: f.id,
                service: f.service,
                chain: f.chain,
                message: f.message,
            });
        } else if f.pending {
            counted.pending += 1;
        }
    }
    rollup.add(node, keys);
    counted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_dns_names_go_into_a_path() {
        assert!(is_dns_subdomain("kproxy-monitor-x7k2p"));
        assert!(is_dns_subdomain("kube-system"));
        assert!(!is_dns_subdomain(""));
        assert!(!is_dns_subdomain("a/b"));
        assert!(!is_dns_subdomain("pod?x=1"));
        assert!(!is_dns_subdomain("-a"));
        assert!(!is_dns_subdomain("A"));
        assert!(!is_dns_subdomain(&"a".repeat(254)));
    }

    #[test]
    fn reads_the_monitors_document_and_refuses_others() {
        let doc = br#"{"node": "n1", "mode": "iptables", "state": "drift", "stale": null,
            "verified_at": "2026-01-01T00:00:00Z", "summary": {},
            "findings": [{"id": "KP201", "severity": "error", "service": "a/b:c", "chain": null,
              "message": "m", "expected": null, "actual": null, "hint": null,
              "since": "2026-01-01T00:00:00Z", "pending": false, "drift": true},
             {"id": "KP999", "severity": "dire", "message": "n"}]}"#;
        let r = parse_report(doc).expect("report");
        assert_eq!(r.state.as_deref(), Some("drift"));
        assert_eq!(r.findings.len(), 2);
        assert_eq!(r.findings[0].severity, Some(Severity::Error));
        assert!(r.findings[0].drift && !r.findings[0].pending);
        assert_eq!(r.findings[1].severity, None);
        assert!(parse_report(b"{}").is_err(), "no findings list");
        assert!(parse_report(b"<html>").is_err());
    }

    #[test]
    fn times_parse_as_the_api_writes_them() {
        assert!(parse_time(Some("2026-03-01T12:00:00Z")).is_some());
        assert!(parse_time(Some("yesterday")).is_none());
        assert!(parse_time(None).is_none());
    }
}
