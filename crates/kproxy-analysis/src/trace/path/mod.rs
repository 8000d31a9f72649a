//! The path view of a service (`trace svc/NAME`): for each port and each entry point (cluster IP,
//! NodePorts, external IPs, load-balancer IPs, health-check port) the chains a new connection
//! passes, each endpoint with its share of new connections and the pod behind it, the DNAT target,
//! where and why masquerade happens, session affinity, the filter-table verdicts (REJECT when no
//! endpoints, source-range DROP) and the rule counters when the dump has them.
//!
//! Built from a [`ServiceGraph`](crate::graph::ServiceGraph) (what the node has) and, optionally, kube-proxy's decisions for the
//! API state ([`ServiceDecisions`], what the node should have): divergences — missing or stale
//! endpoints, wrong shares, missing entry points — are marked inline.
//!
//! ```text
//! graph::iptables::build ──▶ ServiceGraph ─┐
//!                                 ├─ path::build(graph, selector, Some(plan)) ─▶ PathView ─▶ tree|table|json|dot
//! proxier::expected_service_ports ▶ ServiceDecisions ┘
//! ```
//!
//! Callers: `cli/trace/mod.rs` parses the dump with [`crate::graph::iptables::build`] (passing
//! [`resolver_for`]`(plan)` so comment-less dumps get names), computes the plan, then calls
//! [`build`], then renders the view with `crate::output::trace_path` (presentation lives there,
//! above this layer).
//!
//! The view's types are here; [`build`] (`build.rs`) walks the graph, and `divergence.rs` sets it
//! against the plan.

mod build;
mod divergence;

pub use build::build;

use crate::graph::{Counters, EntryKind, MasqueradeReason, NameResolver, VerdictReason};
use crate::proxier::endpoints::Endpoint as DecidedEndpoint;
use crate::proxier::iptables::ServiceDecisions;
use serde::Serialize;

/// Which service (and optionally which port) to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSelector {
    /// Namespace.
    pub namespace: String,
    /// Service name.
    pub name: String,
    /// A port name or number; `None` = all ports.
    pub port: Option<String>,
}

impl ServiceSelector {
    /// Parses `svc/NAME`, `service/NAME`, `services/NAME` or `NAME` (also `NS/NAME` when no `-n`
    /// is given), with the namespace (default `default`) and an optional port name or number.
    pub fn parse(
        arg: &str,
        namespace: Option<&str>,
        port: Option<&str>,
    ) -> Result<Self, PathError> {
        let rest = ["svc/", "service/", "services/"]
            .iter()
            .find_map(|p| arg.strip_prefix(p))
            .unwrap_or(arg);
        let (ns, name) = match (rest.split_once('/'), namespace) {
            (Some((ns, name)), None) => (ns.to_string(), name.to_string()),
            (Some(_), Some(_)) => return Err(PathError::BadSelector(arg.to_string())),
            (None, ns) => (ns.unwrap_or("default").to_string(), rest.to_string()),
        };
        if name.is_empty() || ns.is_empty() || name.contains('/') {
            return Err(PathError::BadSelector(arg.to_string()));
        }
        Ok(ServiceSelector {
            namespace: ns,
            name,
            port: port.map(str::to_string),
        })
    }

    /// `ns/name`.
    pub fn service(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The service port names the selector can stand for without API state, to find the
    /// service's chains by their hash in a dump without comments (`proxier.go`
    /// `servicePortChainName`: the hash of `ns/name[:port]` and the protocol): `ns/name` (an
    /// unnamed port), `ns/name:PORT` for a `--port` name, and `default/kubernetes:https`, the
    /// API server's port in every cluster.
    pub fn resolver(&self) -> NameResolver {
        let service = self.service();
        let mut names = vec![service.clone()];
        match &self.port {
            Some(p) if !p.chars().all(|c| c.is_ascii_digit()) => {
                names.push(format!("{service}:{p}"))
            }
            None if service == "default/kubernetes" => names.push(format!("{service}:https")),
            _ => {}
        }
        let mut resolver = NameResolver::new();
        for name in &names {
            for proto in ["tcp", "udp", "sctp"] {
                resolver.add(name, proto);
            }
        }
        resolver
    }
}

/// Why a path view could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The selector is not `svc/NAME`.
    #[error("expected svc/NAME (with -n NAMESPACE) or NAMESPACE/NAME, found `{0}`")]
    BadSelector(String),
    /// Neither the dump nor the API state knows the service.
    #[error("service {service} not found in the dump{}{}", if known.is_empty() { String::new() } else { format!(" (services with rules: {})", known.join(", ")) }, hint.as_deref().map(|h| format!("; {h}")).unwrap_or_default())]
    NotFound {
        /// `ns/name`.
        service: String,
        /// Some services the dump does have.
        known: Vec<String>,
        /// What to try: the namespace that has a service of that name, or how to find one
        /// by its chains' hash in a dump without comments.
        hint: Option<String>,
    },
    /// The service has no port matching the selector.
    #[error("service {service} has no port `{port}` (ports: {})", ports.join(", "))]
    PortNotFound {
        /// `ns/name`.
        service: String,
        /// The selector.
        port: String,
        /// Ports the service has.
        ports: Vec<String>,
    },
}

/// A name resolver for every service port of the plan, so dumps without comments get names.
pub fn resolver_for(plan: &ServiceDecisions) -> NameResolver {
    NameResolver::from_ports(
        plan.ports
            .iter()
            .map(|p| (p.info.name_string.clone(), p.info.name.protocol.lower())),
    )
}

/// Kinds of divergence from what the API implies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DivergenceKind {
    /// The API has a usable endpoint the node's rules do not route to.
    MissingEndpoint,
    /// The node routes to an endpoint the API says is gone, not ready or not local.
    StaleEndpoint,
    /// The endpoint's share differs from the even split kube-proxy writes.
    WrongShare,
    /// The API implies an entry point (cluster IP, NodePort, …) the node lacks.
    MissingEntry,
    /// The API has the service port but the node has no rules for it.
    MissingServicePort,
    /// The node has rules for a service port the API does not have.
    StaleServicePort,
    /// Session affinity differs.
    Affinity,
    /// A graph anomaly in one of the port's chains.
    Anomaly,
    /// The port's path holds what this build does not know (a newer kube-proxy's layout):
    /// nothing is concluded of its endpoints, shares or reachability.
    UnknownLayout,
}

/// A divergence, with a one-line explanation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// Kind.
    pub kind: DivergenceKind,
    /// Explanation.
    pub message: String,
}

/// The pod (or other object) behind an endpoint, from the EndpointSlice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PodRef {
    /// `targetRef.kind` (usually `Pod`), when set.
    pub kind: Option<String>,
    /// `targetRef` namespace/name, when set.
    pub name: Option<String>,
    /// `nodeName`.
    pub node: Option<String>,
    /// `zone`.
    pub zone: Option<String>,
    /// `conditions.ready`.
    pub ready: bool,
    /// `conditions.serving`.
    pub serving: bool,
    /// `conditions.terminating`.
    pub terminating: bool,
    /// On this node.
    pub local: bool,
}

impl PodRef {
    fn from_decision(e: &DecidedEndpoint) -> Self {
        PodRef {
            kind: e.target_ref().map(|t| t.kind.clone()),
            name: e
                .target_ref()
                .map(|t| format!("{}/{}", t.namespace, t.name)),
            node: e.node_name().map(str::to_string),
            zone: e.zone().map(str::to_string),
            ready: e.ready,
            serving: e.serving,
            terminating: e.terminating,
            local: e.is_local,
        }
    }

    /// `ready`, `terminating`, `serving-terminating`, `not-ready`.
    pub fn state(&self) -> &'static str {
        match (self.ready, self.serving, self.terminating) {
            (true, _, _) => "ready",
            (false, true, true) => "serving-terminating",
            (false, _, true) => "terminating",
            _ => "not-ready",
        }
    }
}

/// One endpoint on a branch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndpointPath {
    /// `KUBE-SEP-…` (for a missing endpoint: the chain kube-proxy would create).
    pub chain: String,
    /// DNAT destination (`10.244.1.10:8080`).
    pub destination: Option<String>,
    /// Share of new connections entering the branch's policy chain (0 for missing endpoints).
    pub share: f64,
    /// The rule's conditional probability, when written.
    pub probability: Option<f64>,
    /// The share the API implies (1/n of the usable endpoints), when the plan is known.
    pub expected_share: Option<f64>,
    /// Line of the picking rule (None for missing endpoints).
    pub line: Option<u32>,
    /// Counters of the DNAT rule, when dumped.
    pub counters: Option<Counters>,
    /// The endpoint masquerades its own traffic to the service (hairpin).
    pub hairpin_masquerade: bool,
    /// The pod behind it, when the API state is known.
    pub pod: Option<PodRef>,
    /// What is wrong with it, if anything.
    pub divergence: Option<Divergence>,
    /// Flows of the node's conntrack table through this entry that reply from this endpoint
    /// (with `--conntrack`; see [`crate::trace::conntrack`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub live_flows: Option<usize>,
}

/// One way through the chains, for the traffic matching `when`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Branch {
    /// The traffic that takes this branch (`any source`, `pod source`, `LOCAL source`,
    /// `source in 203.0.113.0/24`).
    pub when: String,
    /// Chains passed, in order, starting with the entry rule's target.
    pub chains: Vec<String>,
    /// The chain that picks the endpoint (`KUBE-SVC/SVL/XLB-…`), if reached.
    pub policy_chain: Option<String>,
    /// Endpoints picked by the policy chain.
    pub endpoints: Vec<EndpointPath>,
}

/// A masquerade decision on the path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MasqStep {
    /// Chain of the marking rule.
    pub chain: String,
    /// Why it fires.
    pub reason: MasqueradeReason,
    /// The condition as written.
    pub condition: Option<String>,
    /// Line of the marking rule.
    pub line: u32,
    /// Counters, when dumped.
    pub counters: Option<Counters>,
    /// Explanation.
    pub why: String,
}

/// A filter-table (or old nat `KUBE-MARK-DROP`) verdict on the path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerdictStep {
    /// Table.
    pub table: String,
    /// Chain.
    pub chain: String,
    /// `REJECT`, `DROP`, `KUBE-MARK-DROP`, `ACCEPT` (health check).
    pub verdict: String,
    /// Why.
    pub reason: VerdictReason,
    /// Line.
    pub line: u32,
    /// Counters, when dumped.
    pub counters: Option<Counters>,
    /// Explanation.
    pub why: String,
}

/// One entry point and everything behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EntryPath {
    /// Kind of entry.
    pub kind: EntryKind,
    /// `10.96.0.10:53/udp`, `:30080/tcp`.
    pub display: String,
    /// Destination address matched.
    pub address: Option<String>,
    /// Destination port.
    pub port: Option<u16>,
    /// `table/chain` of the entry rule.
    pub rule_chain: String,
    /// Line of the entry rule (None when the entry exists only as a filter verdict).
    pub line: Option<u32>,
    /// Counters of the entry rule.
    pub counters: Option<Counters>,
    /// The entry rule's target.
    pub target: String,
    /// Ways through the chains.
    pub branches: Vec<Branch>,
    /// Masquerade decisions on the way.
    pub masquerade: Vec<MasqStep>,
    /// Filter verdicts for this entry.
    pub verdicts: Vec<VerdictStep>,
    /// Flows of the node's conntrack table through this entry that reply from somewhere no
    /// branch picks (with `--conntrack`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub other_flows: Vec<crate::trace::conntrack::OtherFlows>,
}

/// Session affinity of a port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AffinityView {
    /// Timeout in the node's rules (`--seconds`), if any affinity rule exists.
    pub timeout_seconds: Option<u32>,
    /// Timeout the API sets, when known.
    pub expected_timeout_seconds: Option<i32>,
}

/// One service port.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortPath {
    /// `ns/name[:port]`.
    pub name: String,
    /// The port name (`""` when unnamed).
    pub port_name: String,
    /// The service port number, when known.
    pub port: Option<u16>,
    /// Protocol.
    pub protocol: Option<String>,
    /// Chain hash.
    pub hash: Option<String>,
    /// Whether the dump has rules for it.
    pub in_dump: bool,
    /// Session affinity, if the node or the API has it.
    pub affinity: Option<AffinityView>,
    /// Entry points.
    pub entries: Vec<EntryPath>,
    /// Port-level divergences (missing entries, missing service port, anomalies).
    pub divergences: Vec<Divergence>,
}

/// The path view of one service on one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PathView {
    /// `ns/name`.
    pub service: String,
    /// The dump it was built from.
    pub source: Option<String>,
    /// The node name, when the plan is known.
    pub node: Option<String>,
    /// Whether divergences were computed (API state given).
    pub compared_with_api: bool,
    /// Ports.
    pub ports: Vec<PortPath>,
    /// Number of divergences in the whole view.
    pub divergence_count: usize,
    /// Why the dump is not all of the node's rules (a cut or filtered paste), in words: the
    /// view shows only what it holds. Absent for a whole dump.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub partial: Vec<String>,
}

impl PathView {
    /// Whether a port's path holds what this build does not know: the view could not be
    /// checked there.
    pub fn unknown_layout(&self) -> bool {
        self.ports.iter().any(|p| {
            p.divergences
                .iter()
                .any(|d| d.kind == DivergenceKind::UnknownLayout)
        })
    }

    /// Returns the view with the node name shown in the header set (the plan does not carry it).
    pub fn with_node(mut self, node: Option<String>) -> Self {
        self.node = node;
        self
    }
}
