//! The path view of a service (`trace svc/NAME`): for each port and each entry point (cluster IP,
//! NodePorts, external IPs, load-balancer IPs, health-check port) the chains a new connection
//! passes, each endpoint with its share of new connections and the pod behind it, the DNAT target,
//! where and why masquerade happens, session affinity, the filter-table verdicts (REJECT when no
//! endpoints, source-range DROP) and the rule counters when the dump has them.
//!
//! Built from a [`ServiceGraph`] (what the node has) and, optionally, kube-proxy's decisions for the
//! API state ([`ServicePlan`], what the node should have): divergences — missing or stale
//! endpoints, wrong shares, missing entry points — are marked inline.
//!
//! ```text
//! graph::build ──▶ ServiceGraph ─┐
//!                                 ├─ path::build(graph, selector, Some(plan)) ─▶ PathView ─▶ tree|table|json|dot
//! proxier::expected_service_ports ▶ ServicePlan ┘
//! ```
//!
//! Callers: `cli/trace.rs` parses the dump with [`crate::graph::build`] (passing
//! [`resolver_for`]`(plan)` so comment-less dumps get names), computes the plan, then calls
//! [`build`] and [`PathView::render`].

use crate::graph::{
    ChainKind, Counters, EntryKind, MasqueradeReason, NameResolver, ServiceGraph, ServicePort,
    VerdictReason, nftables::port_chain_kind,
};
use crate::output::color::{Painter, Role};
use crate::output::dot::{Cluster, Digraph};
use crate::output::table::KubeTable;
use crate::output::tree::TreeNode;
use crate::output::{OutputError, percent};
use crate::proxier::endpoints::Endpoint as PlanEndpoint;
use crate::proxier::hashing::EndpointChain;
use crate::proxier::iptables::{ServicePlan, ServicePortPlan};
use serde::Serialize;
use std::collections::BTreeSet;

/// Shares closer than this are considered equal (dumps print probabilities with rounding).
const SHARE_TOLERANCE: f64 = 0.005;

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
}

/// Why a path view could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The selector is not `svc/NAME`.
    #[error("expected svc/NAME (with -n NAMESPACE) or NAMESPACE/NAME, found `{0}`")]
    BadSelector(String),
    /// Neither the dump nor the API state knows the service.
    #[error("service {service} not found in the dump{}", if known.is_empty() { String::new() } else { format!(" (services with rules: {})", known.join(", ")) })]
    NotFound {
        /// `ns/name`.
        service: String,
        /// Some services the dump does have.
        known: Vec<String>,
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
pub fn resolver_for(plan: &ServicePlan) -> NameResolver {
    NameResolver::from_ports(
        plan.ports
            .iter()
            .map(|p| (p.info.name_string.clone(), p.info.name.protocol.lower())),
    )
}

/// Output formats of the path view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PathFormat {
    /// An indented tree (coloured on a terminal).
    Tree,
    /// One row per entry point and endpoint.
    Table,
    /// The [`PathView`] as JSON.
    Json,
    /// The [`PathView`] as YAML.
    Yaml,
    /// Graphviz DOT.
    Dot,
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
    fn from_plan(e: &PlanEndpoint) -> Self {
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
}

fn port_name_of(spn: &str) -> &str {
    spn.split_once('/')
        .and_then(|(_, r)| r.split_once(':'))
        .map_or("", |(_, p)| p)
}

/// Builds the path view of the selected service from a graph and, optionally, the plan.
pub fn build(
    graph: &ServiceGraph,
    selector: &ServiceSelector,
    plan: Option<&ServicePlan>,
) -> Result<PathView, PathError> {
    let service = selector.service();
    let dump_ports = graph.ports_of(&selector.namespace, &selector.name);
    let plan_ports: Vec<&ServicePortPlan> = plan
        .map(|p| {
            p.ports
                .iter()
                .filter(|pp| {
                    pp.info.name.namespace == selector.namespace
                        && pp.info.name.name == selector.name
                })
                .collect()
        })
        .unwrap_or_default();
    if dump_ports.is_empty() && plan_ports.is_empty() {
        let known: BTreeSet<String> = graph
            .service_ports
            .iter()
            .filter_map(|p| p.name.as_deref())
            .map(|n| n.split(':').next().unwrap_or(n).to_string())
            .collect();
        return Err(PathError::NotFound {
            service,
            known: known.into_iter().take(10).collect(),
        });
    }
    let mut ports: Vec<PortPath> = Vec::new();
    for dp in &dump_ports {
        let pp = plan_ports.iter().copied().find(|pp| {
            Some(pp.info.name_string.as_str()) == dp.name.as_deref()
                && dp
                    .protocol
                    .as_deref()
                    .is_none_or(|p| p == pp.info.name.protocol.lower())
        });
        ports.push(port_path(graph, dp, pp, plan.is_some()));
    }
    for pp in &plan_ports {
        let present = ports.iter().any(|p| {
            p.name == pp.info.name_string
                && p.protocol
                    .as_deref()
                    .is_none_or(|x| x == pp.info.name.protocol.lower())
        });
        if !present {
            ports.push(missing_port(pp));
        }
    }
    if let Some(sel) = &selector.port {
        let all: Vec<String> = ports
            .iter()
            .map(|p| match p.port {
                Some(n) if !p.port_name.is_empty() => format!("{} ({n})", p.port_name),
                Some(n) => n.to_string(),
                None => p.port_name.clone(),
            })
            .collect();
        ports.retain(|p| &p.port_name == sel || p.port.is_some_and(|n| n.to_string() == *sel));
        if ports.is_empty() {
            return Err(PathError::PortNotFound {
                service,
                port: sel.clone(),
                ports: all,
            });
        }
    }
    ports.sort_by(|a, b| {
        (a.port, &a.port_name, &a.protocol).cmp(&(b.port, &b.port_name, &b.protocol))
    });
    let divergence_count = ports.iter().map(count_divergences).sum();
    Ok(PathView {
        service,
        source: graph.source.clone(),
        node: None,
        compared_with_api: plan.is_some(),
        ports,
        divergence_count,
    })
}

impl PathView {
    /// Returns the view with the node name shown in the header set (the plan does not carry it).
    pub fn with_node(mut self, node: Option<String>) -> Self {
        self.node = node;
        self
    }
}

fn count_divergences(p: &PortPath) -> usize {
    p.divergences.len()
        + p.entries
            .iter()
            .flat_map(|e| &e.branches)
            .flat_map(|b| &b.endpoints)
            .filter(|e| e.divergence.is_some())
            .count()
}

fn missing_port(pp: &ServicePortPlan) -> PortPath {
    PortPath {
        name: pp.info.name_string.clone(),
        port_name: pp.info.name.port.clone(),
        port: u16::try_from(pp.info.port).ok(),
        protocol: Some(pp.info.name.protocol.lower().to_string()),
        hash: None,
        in_dump: false,
        affinity: pp.info.session_affinity_seconds.map(|s| AffinityView {
            timeout_seconds: None,
            expected_timeout_seconds: Some(s),
        }),
        entries: Vec::new(),
        divergences: vec![Divergence {
            kind: DivergenceKind::MissingServicePort,
            message: "the API has this service port but the node has no rules for it (kube-proxy not synced, or rules flushed)".into(),
        }],
    }
}

fn port_path(
    graph: &ServiceGraph,
    dp: &ServicePort,
    pp: Option<&ServicePortPlan>,
    compare: bool,
) -> PortPath {
    let name = dp.display_name();
    let mut entries: Vec<EntryPath> = dp.entries.iter().map(|e| entry_path(dp, e, pp)).collect();
    // Entry points that exist only as filter verdicts (no endpoints: REJECT; Local: DROP).
    for v in &dp.verdicts {
        if v.table != "filter" || v.reason == VerdictReason::SourceRange {
            continue;
        }
        let covered = entries.iter().any(|e| {
            e.address == v.address && e.port == v.port && e.kind != EntryKind::HealthCheckNodePort
        });
        if covered {
            continue;
        }
        let kind = match (v.chain.as_str(), &v.address) {
            ("KUBE-SERVICES", _) => EntryKind::ClusterIp,
            (_, None) => EntryKind::NodePort,
            (_, Some(a)) => {
                let is_lb = pp.is_some_and(|pp| {
                    pp.info
                        .load_balancer_vips
                        .iter()
                        .any(|ip| ip.to_string() == *a)
                });
                if is_lb {
                    EntryKind::LoadBalancerIp
                } else {
                    EntryKind::ExternalIp
                }
            }
        };
        let e = crate::graph::Entry {
            kind,
            address: v.address.clone(),
            port: v.port,
            protocol: dp.protocol.clone(),
            table: v.table.clone(),
            chain: v.chain.clone(),
            target: v.verdict.clone(),
            line: v.line,
            counters: v.counters,
        };
        let mut ep = entry_path(dp, &e, pp);
        ep.line = None;
        entries.push(ep);
    }
    entries.sort_by_key(|e| (e.kind, e.line.unwrap_or(u32::MAX)));
    let mut divergences = Vec::new();
    for a in graph
        .anomalies
        .iter()
        .filter(|a| a.service.as_deref() == Some(name.as_str()))
    {
        divergences.push(Divergence {
            kind: DivergenceKind::Anomaly,
            message: format!(
                "{}{}: {}",
                a.chain.as_deref().unwrap_or(&a.table),
                a.line.map(|l| format!(" line {l}")).unwrap_or_default(),
                a.message
            ),
        });
    }
    let dump_timeout = dp.affinity.as_ref().and_then(|a| a.timeout_seconds);
    let mut affinity = dp.affinity.as_ref().map(|a| AffinityView {
        timeout_seconds: a.timeout_seconds,
        expected_timeout_seconds: None,
    });
    match pp {
        Some(pp) => {
            let expected = pp.info.session_affinity_seconds;
            if expected.is_some() || affinity.is_some() {
                affinity = Some(AffinityView {
                    timeout_seconds: dump_timeout,
                    expected_timeout_seconds: expected,
                });
            }
            let has_endpoints = pp.categorized.has_any;
            match (expected, dp.affinity.is_some()) {
                (Some(s), true) if dump_timeout.is_some_and(|d| i64::from(d) != i64::from(s)) => {
                    divergences.push(Divergence {
                        kind: DivergenceKind::Affinity,
                        message: format!(
                            "affinity timeout is {}s on the node, the API says {s}s",
                            dump_timeout.unwrap_or_default()
                        ),
                    })
                }
                (Some(s), false) if has_endpoints => divergences.push(Divergence {
                    kind: DivergenceKind::Affinity,
                    message: format!("the API sets sessionAffinity ClientIP ({s}s); the node has no affinity rules"),
                }),
                (None, true) => divergences.push(Divergence {
                    kind: DivergenceKind::Affinity,
                    message: "the node has affinity rules; the API sets no sessionAffinity".into(),
                }),
                _ => {}
            }
            divergences.extend(missing_entries(pp, &entries));
            for e in &mut entries {
                for b in &mut e.branches {
                    compare_branch(b, pp);
                }
            }
        }
        None if compare => divergences.push(Divergence {
            kind: DivergenceKind::StaleServicePort,
            message: "the node has rules for this service port; the API has no such port".into(),
        }),
        None => {}
    }
    let port = pp
        .and_then(|pp| u16::try_from(pp.info.port).ok())
        .or_else(|| {
            dp.entries
                .iter()
                .find(|e| e.kind == EntryKind::ClusterIp)
                .and_then(|e| e.port)
        });
    PortPath {
        port_name: port_name_of(&name).to_string(),
        name,
        port,
        protocol: dp.protocol.clone(),
        hash: dp.hash.clone(),
        in_dump: true,
        affinity,
        entries,
        divergences,
    }
}

fn missing_entries(pp: &ServicePortPlan, entries: &[EntryPath]) -> Vec<Divergence> {
    let info = &pp.info;
    let port = u16::try_from(info.port).ok();
    let mut want: Vec<(EntryKind, Option<String>, Option<u16>)> = vec![(
        EntryKind::ClusterIp,
        Some(info.cluster_ip.to_string()),
        port,
    )];
    if info.node_port != 0 {
        want.push((
            EntryKind::NodePort,
            None,
            u16::try_from(info.node_port).ok(),
        ));
    }
    for ip in &info.external_ips {
        want.push((EntryKind::ExternalIp, Some(ip.to_string()), port));
    }
    for ip in &info.load_balancer_vips {
        want.push((EntryKind::LoadBalancerIp, Some(ip.to_string()), port));
    }
    want.into_iter()
        .filter(|(kind, addr, p)| {
            !entries
                .iter()
                .any(|e| e.kind == *kind && e.port == *p && (addr.is_none() || e.address == *addr))
        })
        .map(|(kind, addr, p)| Divergence {
            kind: DivergenceKind::MissingEntry,
            message: format!(
                "the API implies a {} entry {}:{} the node has no rule for",
                kind.label(),
                addr.unwrap_or_default(),
                p.map(|p| p.to_string()).unwrap_or_default()
            ),
        })
        .collect()
}

/// The endpoints the API says `policy_chain` must pick.
fn expected_set<'p>(
    pp: &'p ServicePortPlan,
    policy_chain: &str,
) -> Vec<(&'p PlanEndpoint, &'p str)> {
    let local = matches!(
        port_chain_kind(policy_chain),
        Some(ChainKind::Svl | ChainKind::Xlb)
    );
    let idx = if local {
        &pp.categorized.local
    } else {
        &pp.categorized.cluster
    };
    idx.iter()
        .filter_map(|&i| {
            let e = pp.endpoints.get(i as usize)?;
            let c = pp
                .endpoint_chains
                .get(i as usize)
                .map_or("", EndpointChain::as_str);
            Some((e, c))
        })
        .collect()
}

fn find_plan_endpoint<'p>(pp: &'p ServicePortPlan, ep: &EndpointPath) -> Option<&'p PlanEndpoint> {
    pp.endpoints
        .iter()
        .zip(
            pp.endpoint_chains
                .iter()
                .map(Some)
                .chain(std::iter::repeat(None)),
        )
        .find(|(e, c)| {
            ep.destination.as_deref() == Some(e.endpoint.as_str())
                || c.is_some_and(|c| c.as_str() == ep.chain)
        })
        .map(|(e, _)| e)
}

fn compare_branch(b: &mut Branch, pp: &ServicePortPlan) {
    let Some(policy) = b.policy_chain.clone() else {
        return;
    };
    let expected = expected_set(pp, &policy);
    let n = expected.len();
    let even = (n > 0).then(|| 1.0 / n as f64);
    for ep in &mut b.endpoints {
        let plan_ep = find_plan_endpoint(pp, ep);
        ep.pod = plan_ep.map(PodRef::from_plan);
        let in_set =
            plan_ep.is_some_and(|pe| expected.iter().any(|(e, _)| e.endpoint == pe.endpoint));
        if in_set {
            ep.expected_share = even;
            if let Some(want) = even
                && (ep.share - want).abs() > SHARE_TOLERANCE
            {
                ep.divergence = Some(Divergence {
                    kind: DivergenceKind::WrongShare,
                    message: format!(
                        "gets {} of new connections; the API implies {} ({n} endpoints)",
                        percent(ep.share),
                        percent(want)
                    ),
                });
            }
        } else {
            ep.expected_share = Some(0.0);
            let why = match plan_ep {
                None => "not in any EndpointSlice of the service".to_string(),
                Some(pe) if !(pe.ready || pe.serving && pe.terminating) => format!(
                    "the endpoint is {} in the API",
                    PodRef::from_plan(pe).state()
                ),
                Some(pe) if !pe.is_local && local_chain(&policy) => {
                    "the endpoint is not on this node, but this chain serves node-local endpoints only".into()
                }
                Some(_) => "kube-proxy would not pick it for this chain (topology or fallback rules)".into(),
            };
            ep.divergence = Some(Divergence {
                kind: DivergenceKind::StaleEndpoint,
                message: format!("stale: {why}"),
            });
        }
    }
    for (pe, chain) in expected {
        let present = b
            .endpoints
            .iter()
            .any(|ep| ep.destination.as_deref() == Some(pe.endpoint.as_str()) || ep.chain == chain);
        if !present {
            b.endpoints.push(EndpointPath {
                chain: chain.to_string(),
                destination: Some(pe.endpoint.clone()),
                share: 0.0,
                probability: None,
                expected_share: even,
                line: None,
                counters: None,
                hairpin_masquerade: false,
                pod: Some(PodRef::from_plan(pe)),
                live_flows: None,
                divergence: Some(Divergence {
                    kind: DivergenceKind::MissingEndpoint,
                    message: format!(
                        "missing: the API has this {} endpoint but {policy} does not route to it",
                        PodRef::from_plan(pe).state()
                    ),
                }),
            });
        }
    }
}

fn local_chain(chain: &str) -> bool {
    matches!(
        port_chain_kind(chain),
        Some(ChainKind::Svl | ChainKind::Xlb)
    )
}

fn entry_path(
    dp: &ServicePort,
    e: &crate::graph::Entry,
    _pp: Option<&ServicePortPlan>,
) -> EntryPath {
    let mut branches = Vec::new();
    if port_chain_kind(&e.target).is_some() {
        walk(dp, &e.target, Vec::new(), Vec::new(), &mut branches);
    }
    let chains_on_path: BTreeSet<&str> = branches
        .iter()
        .flat_map(|b| b.chains.iter().map(String::as_str))
        .collect();
    let mut masquerade: Vec<MasqStep> = dp
        .masquerade
        .iter()
        .filter(|m| {
            m.reason != MasqueradeReason::Hairpin
                && (chains_on_path.contains(m.chain) || (m.chain == e.chain && e.table == "nat"))
        })
        .map(|m| MasqStep {
            chain: m.chain.to_string(),
            reason: m.reason,
            condition: m.condition.as_deref().map(str::to_string),
            line: m.line,
            counters: m.counters,
            why: masq_why(m.reason, m.condition.as_deref()),
        })
        .collect();
    if let Some(h) = dp.masquerade.iter().find(|m| {
        m.reason == MasqueradeReason::Hairpin
            && branches
                .iter()
                .flat_map(|b| &b.endpoints)
                .any(|ep| ep.chain == m.chain)
    }) {
        // The endpoint chains' prefix and source match, in the mode's own words.
        let (chain, condition) = if h.chain.starts_with("KUBE-") {
            ("KUBE-SEP-*", "-s <endpoint>")
        } else {
            ("endpoint-*", "ip saddr <endpoint>")
        };
        masquerade.push(MasqStep {
            chain: chain.into(),
            reason: MasqueradeReason::Hairpin,
            condition: Some(condition.into()),
            line: h.line,
            counters: None,
            why: masq_why(MasqueradeReason::Hairpin, None),
        });
    }
    let mut verdicts: Vec<VerdictStep> = dp
        .verdicts
        .iter()
        .filter(|v| {
            let same_dest = match e.kind {
                EntryKind::NodePort => {
                    v.address.is_none() && v.port == e.port && v.table == "filter"
                }
                EntryKind::HealthCheckNodePort => false,
                _ => v.address == e.address && v.port == e.port && v.table == "filter",
            };
            same_dest || (v.table == "nat" && chains_on_path.contains(v.chain.as_str()))
        })
        .map(|v| VerdictStep {
            table: v.table.clone(),
            chain: v.chain.clone(),
            verdict: v.verdict.clone(),
            reason: v.reason,
            line: v.line,
            counters: v.counters,
            why: verdict_why(v.reason, &v.verdict),
        })
        .collect();
    if e.kind == EntryKind::HealthCheckNodePort {
        verdicts.push(VerdictStep {
            table: e.table.clone(),
            chain: e.chain.clone(),
            verdict: "ACCEPT".into(),
            reason: VerdictReason::Other,
            line: e.line,
            counters: e.counters,
            why: "health-check node port accepted for the load balancer's probes".into(),
        });
    }
    let hairpin: BTreeSet<&str> = dp
        .endpoints
        .iter()
        .filter(|ep| ep.hairpin_masquerade)
        .map(|ep| ep.chain)
        .collect();
    for b in &mut branches {
        for ep in &mut b.endpoints {
            ep.hairpin_masquerade = hairpin.contains(ep.chain.as_str());
        }
    }
    EntryPath {
        kind: e.kind,
        display: e.display(),
        address: e.address.clone(),
        port: e.port,
        rule_chain: format!("{}/{}", e.table, e.chain),
        line: Some(e.line),
        counters: e.counters,
        target: e.target.clone(),
        branches,
        masquerade,
        verdicts,
        other_flows: Vec::new(),
    }
}

/// Follows the port's edges from `chain`, emitting one branch per policy chain reached.
fn walk(
    dp: &ServicePort,
    chain: &str,
    mut conds: Vec<String>,
    mut chains: Vec<String>,
    out: &mut Vec<Branch>,
) {
    if chains.len() > 8 || chains.iter().any(|c| c == chain) {
        return;
    }
    chains.push(chain.to_string());
    let is_policy = matches!(
        port_chain_kind(chain),
        Some(ChainKind::Svc | ChainKind::Svl | ChainKind::Xlb)
    );
    let picks_endpoints = dp
        .edges
        .iter()
        .any(|e| e.from == chain && matches!(port_chain_kind(e.to), Some(ChainKind::Sep)));
    if is_policy || picks_endpoints {
        let endpoints = dp
            .endpoints
            .iter()
            .filter_map(|ep| {
                let s = ep.shares.iter().find(|s| s.via == chain)?;
                Some(EndpointPath {
                    chain: ep.chain.to_string(),
                    destination: ep.destination.map(str::to_string),
                    share: s.share,
                    probability: s.probability,
                    expected_share: None,
                    line: Some(s.line),
                    counters: ep.counters.as_deref().copied(),
                    hairpin_masquerade: ep.hairpin_masquerade,
                    pod: None,
                    divergence: None,
                    live_flows: None,
                })
            })
            .collect();
        out.push(Branch {
            when: when_text(&conds),
            chains: chains.clone(),
            policy_chain: Some(chain.to_string()),
            endpoints,
        });
    }
    // Jumps to the same chain are one way on (e.g. several source ranges of a FW chain).
    let mut onward: Vec<(&str, Vec<&str>)> = Vec::new();
    for e in dp.edges.iter().filter(|e| e.from == chain) {
        if matches!(port_chain_kind(e.to), Some(ChainKind::Sep) | None) {
            continue;
        }
        match onward.iter_mut().find(|(to, _)| *to == e.to) {
            Some((_, labels)) => labels.push(&e.label),
            None => onward.push((e.to, vec![&e.label])),
        }
    }
    let unconditional = onward
        .iter()
        .any(|(_, labels)| labels.iter().any(|l| l.is_empty()));
    for (to, labels) in &onward {
        let mut c = conds.clone();
        if !labels.iter().any(|l| l.is_empty()) {
            c.push(join_alternatives(labels));
        }
        walk(dp, to, c, chains.clone(), out);
    }
    if !is_policy && !picks_endpoints && !unconditional {
        // Traffic that matches none of the jumps leaves the chain without DNAT: the filter
        // table's verdicts (REJECT/DROP) decide what happens to it.
        conds.push(
            if onward.is_empty() {
                "every source"
            } else {
                "other sources"
            }
            .to_string(),
        );
        out.push(Branch {
            when: when_text(&conds),
            chains,
            policy_chain: None,
            endpoints: Vec::new(),
        });
    }
}

/// `-s A`, `-s B` → `-s A or B`; other labels joined with ` or `.
fn join_alternatives(labels: &[&str]) -> String {
    if labels.len() > 1 && labels.iter().all(|l| l.starts_with("-s ")) {
        let cidrs: Vec<&str> = labels.iter().map(|l| l.trim_start_matches("-s ")).collect();
        return format!("-s {}", cidrs.join(" or "));
    }
    labels.join(" or ")
}

fn when_text(conds: &[String]) -> String {
    if conds.is_empty() {
        return "any source".into();
    }
    let several = conds.len() > 1;
    conds
        .iter()
        .map(|c| {
            let text = match c.strip_prefix("-s ") {
                Some(cidr) => format!("source in {cidr}"),
                None => c.clone(),
            };
            if several && text.contains(" or ") {
                format!("({text})")
            } else {
                text
            }
        })
        .collect::<Vec<_>>()
        .join(" & ")
}

fn masq_why(reason: MasqueradeReason, cond: Option<&str>) -> String {
    match reason {
        MasqueradeReason::OffClusterSource => format!(
            "clients outside the pod network ({}) are masqueraded so replies return through this node",
            cond.unwrap_or("not local")
        ),
        MasqueradeReason::AllSources => "every client is masqueraded (masqueradeAll)".into(),
        MasqueradeReason::Hairpin => {
            "an endpoint reaching itself through the service is masqueraded (hairpin)".into()
        }
        MasqueradeReason::LocalSource => "connections from the node itself are masqueraded".into(),
        MasqueradeReason::ExternalDestination => {
            "external traffic is masqueraded (externalTrafficPolicy: Cluster): the client IP is not preserved".into()
        }
        MasqueradeReason::Other => format!("masqueraded when {}", cond.unwrap_or("the rule matches")),
    }
}

fn verdict_why(reason: VerdictReason, verdict: &str) -> String {
    match reason {
        VerdictReason::NoEndpoints => format!("{verdict}: the service has no endpoints"),
        VerdictReason::NoLocalEndpoints => {
            format!("{verdict}: no endpoint on this node (traffic policy Local)")
        }
        VerdictReason::SourceRange => {
            format!("{verdict}: sources outside loadBalancerSourceRanges")
        }
        VerdictReason::Other => verdict.to_string(),
    }
}

// ───────────────────────────── renderers ─────────────────────────────

impl PathView {
    /// Renders the view in `format`; `painter` only affects the tree.
    pub fn render(
        &self,
        format: PathFormat,
        painter: Painter,
        no_headers: bool,
    ) -> Result<String, OutputError> {
        Ok(match format {
            PathFormat::Tree => self.tree(painter),
            PathFormat::Table => self.table(no_headers),
            PathFormat::Json => crate::output::to_json(self)?,
            PathFormat::Yaml => crate::output::to_yaml(self)?,
            PathFormat::Dot => self.dot(),
        })
    }

    /// The tree form.
    pub fn tree(&self, p: Painter) -> String {
        let mut header = format!("service {}", p.paint(Role::Strong, &self.service));
        let mut facts = Vec::new();
        if let Some(n) = &self.node {
            facts.push(format!("node {n}"));
        }
        if let Some(s) = &self.source {
            facts.push(format!("rules from {s}"));
        }
        if self.compared_with_api {
            facts.push(if self.divergence_count == 0 {
                p.paint(Role::Ok, "matches the API")
            } else {
                p.paint(
                    Role::Error,
                    &format!(
                        "{} divergence{} from the API",
                        self.divergence_count,
                        if self.divergence_count == 1 { "" } else { "s" }
                    ),
                )
            });
        }
        if !facts.is_empty() {
            header.push_str(&format!("  ({})", facts.join(", ")));
        }
        let mut root = TreeNode::new(header);
        for port in &self.ports {
            root.push(port_tree(port, p));
        }
        root.render()
    }

    /// The table form: one row per entry point and endpoint.
    pub fn table(&self, no_headers: bool) -> String {
        let mut t = KubeTable::new([
            "port",
            "entry",
            "path",
            "endpoint",
            "share",
            "pod",
            "node",
            "state",
            "masquerade",
            "note",
        ]);
        for port in &self.ports {
            let pname = port_label(port);
            if port.entries.is_empty() {
                let note = port
                    .divergences
                    .first()
                    .map(|d| d.message.clone())
                    .unwrap_or_default();
                t.row([
                    pname.clone(),
                    "<none>".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    note,
                ]);
                continue;
            }
            for e in &port.entries {
                let masq: BTreeSet<&str> =
                    e.masquerade.iter().map(|m| masq_short(m.reason)).collect();
                let masq = if masq.is_empty() {
                    "<none>".to_string()
                } else {
                    masq.into_iter().collect::<Vec<_>>().join(",")
                };
                let entry = format!("{} {}", e.kind.label(), e.display);
                let rows_before = t.len();
                for b in &e.branches {
                    let path = if b.when == "any source" {
                        b.chains.join(" > ")
                    } else {
                        format!("[{}] {}", b.when, b.chains.join(" > "))
                    };
                    for ep in &b.endpoints {
                        let pod = ep.pod.as_ref();
                        t.row([
                            pname.clone(),
                            entry.clone(),
                            path.clone(),
                            ep.destination.clone().unwrap_or_else(|| ep.chain.clone()),
                            match ep.live_flows {
                                Some(n) => format!(
                                    "{} ({})",
                                    percent(ep.share),
                                    crate::trace::conntrack::flows_text(n)
                                ),
                                None => percent(ep.share),
                            },
                            pod.and_then(|p| p.name.clone())
                                .unwrap_or_else(|| "-".into()),
                            pod.and_then(|p| p.node.clone())
                                .unwrap_or_else(|| "-".into()),
                            pod.map(|p| p.state().to_string())
                                .unwrap_or_else(|| "-".into()),
                            masq.clone(),
                            ep.divergence
                                .as_ref()
                                .map(|d| d.message.clone())
                                .unwrap_or_default(),
                        ]);
                    }
                    if b.endpoints.is_empty() {
                        t.row([
                            pname.clone(),
                            entry.clone(),
                            path,
                            "<none>".into(),
                            "-".into(),
                            "-".into(),
                            "-".into(),
                            "-".into(),
                            masq.clone(),
                            String::new(),
                        ]);
                    }
                }
                for o in &e.other_flows {
                    t.row([
                        pname.clone(),
                        entry.clone(),
                        "conntrack".into(),
                        o.reply_source.clone(),
                        format!("0% ({})", crate::trace::conntrack::flows_text(o.flows)),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        o.describe(),
                    ]);
                }
                for v in &e.verdicts {
                    t.row([
                        pname.clone(),
                        entry.clone(),
                        format!("{}/{}", v.table, v.chain),
                        v.verdict.clone(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        v.why.clone(),
                    ]);
                }
                if t.len() == rows_before {
                    t.row([
                        pname.clone(),
                        entry,
                        e.target.clone(),
                        "<none>".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        "-".into(),
                        masq,
                        String::new(),
                    ]);
                }
            }
            for d in &port.divergences {
                t.row([
                    pname.clone(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    "-".into(),
                    d.message.clone(),
                ]);
            }
        }
        t.render(no_headers)
    }

    /// Graphviz DOT: entries → chains → endpoints → pods; divergent endpoints red, missing dashed.
    pub fn dot(&self) -> String {
        let mut d = Digraph::new(&self.service);
        for port in &self.ports {
            let pid = port.hash.clone().unwrap_or_else(|| port.name.clone());
            let mut c = Cluster::new(&pid, &port_label(port));
            let mut seen_nodes: BTreeSet<String> = BTreeSet::new();
            let mut seen_edges: BTreeSet<(String, String)> = BTreeSet::new();
            for (i, e) in port.entries.iter().enumerate() {
                let eid = format!("{pid}:entry:{i}");
                c.node(
                    &eid,
                    &[
                        ("label", &format!("{}\n{}", e.kind.label(), e.display)),
                        ("shape", "ellipse"),
                    ],
                );
                let first = e.branches.first().and_then(|b| b.chains.first()).cloned();
                match first {
                    Some(f) => {
                        c.edge(&eid, &f, &[]);
                    }
                    None => {
                        for v in &e.verdicts {
                            let vid = format!("{eid}:{}", v.verdict);
                            c.node(
                                &vid,
                                &[
                                    ("label", &format!("{} {}\n{}", v.table, v.verdict, v.why)),
                                    ("shape", "octagon"),
                                    ("color", "red"),
                                ],
                            );
                            c.edge(&eid, &vid, &[]);
                        }
                    }
                }
                for b in &e.branches {
                    for ch in &b.chains {
                        if seen_nodes.insert(ch.clone()) {
                            c.node(ch, &[]);
                        }
                    }
                    for w in b.chains.windows(2) {
                        if let [a, z] = w
                            && seen_edges.insert((a.clone(), z.clone()))
                        {
                            let label = if b.when == "any source" {
                                String::new()
                            } else {
                                b.when.clone()
                            };
                            c.edge(a, z, &[("label", &label)]);
                        }
                    }
                    let Some(policy) = &b.policy_chain else {
                        continue;
                    };
                    for ep in &b.endpoints {
                        if seen_nodes.insert(ep.chain.clone()) {
                            let dest = ep.destination.clone().unwrap_or_default();
                            let pod = ep
                                .pod
                                .as_ref()
                                .and_then(|p| p.name.clone())
                                .unwrap_or_default();
                            let label = format!("{}\nDNAT {dest}\n{pod}", ep.chain);
                            let color = if ep.divergence.is_some() {
                                "red"
                            } else {
                                "#2ca02c"
                            };
                            let style = if ep.line.is_none() { "dashed" } else { "solid" };
                            c.node(
                                &ep.chain,
                                &[
                                    ("label", label.trim_end()),
                                    ("color", color),
                                    ("style", style),
                                ],
                            );
                        }
                        if seen_edges.insert((policy.clone(), ep.chain.clone())) {
                            let style = if ep.line.is_none() { "dashed" } else { "solid" };
                            c.edge(
                                policy,
                                &ep.chain,
                                &[("label", &percent(ep.share)), ("style", style)],
                            );
                        }
                    }
                }
            }
            d.cluster(c);
        }
        d.render()
    }
}

fn port_label(port: &PortPath) -> String {
    let num = port
        .port
        .map(|n| n.to_string())
        .unwrap_or_else(|| "?".into());
    let proto = port.protocol.as_deref().unwrap_or("?");
    if port.port_name.is_empty() {
        format!("{num}/{proto}")
    } else {
        format!("{} {num}/{proto}", port.port_name)
    }
}

fn masq_short(r: MasqueradeReason) -> &'static str {
    match r {
        MasqueradeReason::OffClusterSource => "off-cluster",
        MasqueradeReason::AllSources => "all",
        MasqueradeReason::Hairpin => "hairpin",
        MasqueradeReason::LocalSource => "local-src",
        MasqueradeReason::ExternalDestination => "external",
        MasqueradeReason::Other => "other",
    }
}

fn counters_text(c: Option<Counters>) -> String {
    c.map(|c| format!(", {} pkts {} bytes", c.packets, c.bytes))
        .unwrap_or_default()
}

fn port_tree(port: &PortPath, p: Painter) -> TreeNode {
    let mut label = format!("port {}", p.paint(Role::Strong, &port_label(port)));
    if let Some(h) = &port.hash {
        label.push_str(&format!("  {}", p.paint(Role::Dim, &format!("hash {h}"))));
    }
    let mut node = TreeNode::new(label);
    if let Some(a) = &port.affinity {
        let node_side = a
            .timeout_seconds
            .map(|s| format!("{s}s"))
            .unwrap_or_else(|| "none".into());
        let text = match a.expected_timeout_seconds {
            Some(e) => format!("session affinity ClientIP: {node_side} on the node (API: {e}s)"),
            None => format!("session affinity ClientIP: {node_side}"),
        };
        node.push(TreeNode::new(text));
    }
    for d in &port.divergences {
        node.push(TreeNode::new(
            p.paint(Role::Error, &format!("✗ {}", d.message)),
        ));
    }
    for e in &port.entries {
        node.push(entry_tree(e, p));
    }
    node
}

fn entry_tree(e: &EntryPath, p: Painter) -> TreeNode {
    let rule = match e.line {
        Some(l) => format!("{} line {l}{}", e.rule_chain, counters_text(e.counters)),
        None => e.rule_chain.clone(),
    };
    let label = format!(
        "{} {} → {}  {}",
        e.kind.label(),
        p.paint(Role::Addr, &e.display),
        e.target,
        p.paint(Role::Dim, &format!("[{rule}]"))
    );
    let mut node = TreeNode::new(label);
    for v in &e.verdicts {
        let role = if v.verdict == "ACCEPT" {
            Role::Ok
        } else {
            Role::Error
        };
        node.push(TreeNode::new(
            format!(
                "{} {}  {}",
                p.paint(role, &v.why),
                p.paint(
                    Role::Dim,
                    &format!(
                        "[{}/{} line {}{}]",
                        v.table,
                        v.chain,
                        v.line,
                        counters_text(v.counters)
                    )
                ),
                ""
            )
            .trim_end()
            .to_string(),
        ));
    }
    for m in &e.masquerade {
        // kube-proxy's masquerading chain: KUBE-POSTROUTING (iptables), masquerading (nftables).
        let snat_chain = if m.chain.starts_with("KUBE-") {
            "KUBE-POSTROUTING"
        } else {
            "masquerading"
        };
        node.push(TreeNode::new(format!(
            "masquerade: {}  {}",
            p.paint(Role::Warn, &m.why),
            p.paint(
                Role::Dim,
                &format!("[{} line {}; SNAT in {snat_chain}]", m.chain, m.line)
            )
        )));
    }
    for b in &e.branches {
        let mut bn = TreeNode::new(format!("{}: {}", b.when, b.chains.join(" → ")));
        for ep in &b.endpoints {
            bn.push(TreeNode::new(endpoint_line(ep, p)));
        }
        if b.policy_chain.is_some() && b.endpoints.is_empty() {
            bn.push(TreeNode::new(p.paint(Role::Warn, "no endpoint rules")));
        }
        if b.policy_chain.is_none() {
            bn.push(TreeNode::new(p.paint(
                Role::Warn,
                "leaves the chain without DNAT: the filter verdicts above decide",
            )));
        }
        node.push(bn);
    }
    for o in &e.other_flows {
        node.push(TreeNode::new(
            p.paint(Role::Error, &format!("✗ {}", o.describe())),
        ));
    }
    node
}

fn endpoint_line(ep: &EndpointPath, p: Painter) -> String {
    let share = format!("{:>6}", percent(ep.share));
    let share = if ep.divergence.is_some() {
        p.paint(Role::Error, &share)
    } else {
        p.paint(Role::Ok, &share)
    };
    let dest = ep.destination.clone().unwrap_or_else(|| "?".into());
    let mut s = format!("{share}  {} → {}", ep.chain, p.paint(Role::Addr, &dest));
    if let Some(pod) = &ep.pod {
        let mut facts = Vec::new();
        if let Some(n) = &pod.node {
            facts.push(format!("node {n}"));
        }
        if let Some(z) = &pod.zone {
            facts.push(format!("zone {z}"));
        }
        facts.push(pod.state().to_string());
        if pod.local {
            facts.push("local".into());
        }
        let who = match (&pod.kind, &pod.name) {
            (Some(k), Some(n)) => format!("{} {n}", k.to_lowercase()),
            _ => "endpoint".into(),
        };
        s.push_str(&format!("  {who} ({})", facts.join(", ")));
    }
    if let Some(c) = ep.counters {
        s.push_str(&p.paint(Role::Dim, &format!("  [{} pkts]", c.packets)));
    }
    if let Some(n) = ep.live_flows {
        s.push_str(&format!("  {}", crate::trace::conntrack::flows_text(n)));
    }
    if let Some(d) = &ep.divergence {
        s.push_str(&format!(
            "  {}",
            p.paint(Role::Error, &format!("✗ {}", d.message))
        ));
    }
    s
}
