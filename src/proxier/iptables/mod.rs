//! The iptables proxier: the `iptables-restore` input kube-proxy writes on a full sync
//! (`proxier.go` `syncProxyRules`), for one IP family, from Services, EndpointSlices, the
//! configuration and the node facts.
//!
//! Two layers:
//! * [`expected_service_ports`] — per service port, the facts kube-proxy decides on (service port
//!   info, endpoints with their conditions, the cluster/local/reachable categorisation, chain
//!   names, which chains and filter rules exist). `verify` and `trace` use it to explain rules.
//! * [`render`] — the rules themselves, in kube-proxy's emission order, as a [`Rendered`].
//!
//! kube-proxy iterates services in Go map order; here service ports are emitted sorted by
//! (namespace, name, port name, protocol), so the output is deterministic. Stale-chain deletion
//! (`-X`) needs the node's current chains and is not part of a render.

mod early;

use super::endpoints::{
    CategorizeInput, CategorizeRules, Categorized, EarlyRules, Endpoint, EndpointDetail,
    categorize_early, categorize_with, endpoints_map_with,
};
use super::hashing::{EndpointChain, port_proto_hash};
use super::service_port::{
    ServicePortInfo, ServicePortName, ignored_by_labels, service_label, service_ports_of_release,
};
use super::version::KubeProxyVersion;
use crate::state::config::{DetectLocalMode, ProxyConfig};
use crate::state::ip::{Cidr, IpFamily};
use crate::state::node::NodeFacts;
use crate::state::{ClusterState, Warning};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::net::IpAddr;

/// kube-proxy switches to large-cluster mode above this many endpoints.
pub const LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

/// The comment of the nat KUBE-SERVICES → KUBE-NODEPORTS tail rule.
pub const NODEPORTS_TAIL_COMMENT: &str =
    "kubernetes service nodeports; NOTE: this must be the last rule in this chain";

/// Render options beyond the state, configuration and node facts.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions {
    /// Also declare the built-in chains (ACCEPT policy), KUBE-PROXY-CANARY (filter, nat, mangle)
    /// and KUBE-FIREWALL, and add the jump rules kube-proxy ensures in built-in chains, so the
    /// output restores on its own into a fresh network namespace.
    pub with_base_jumps: bool,
}

/// How pod traffic is recognised (kube-proxy's LocalTrafficDetector) for one family.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum LocalDetector {
    /// Not implemented for this family (no input): no masquerade rule, no pod short-circuit.
    NoOp,
    /// Source CIDR (`-s <cidr>` / `! -s <cidr>`).
    Cidr(String),
    /// Input interface (`-i <name>` / `! -i <name>`; a prefix ends in `+`).
    Interface(String),
}

impl LocalDetector {
    /// The detector kube-proxy builds for `family` from the configuration and node facts.
    pub fn new(config: &ProxyConfig, facts: &NodeFacts) -> LocalDetector {
        let family = facts.family;
        match config.detect_local_mode {
            DetectLocalMode::ClusterCIDR => config
                .cluster_cidrs
                .iter()
                .filter_map(|c| Cidr::parse_sloppy(c.trim()))
                .find(|c| c.family() == family)
                .map(|c| LocalDetector::Cidr(c.to_string()))
                .unwrap_or(LocalDetector::NoOp),
            DetectLocalMode::NodeCIDR => facts
                .pod_cidrs
                .iter()
                .find(|c| c.family() == family)
                .map(|c| LocalDetector::Cidr(c.to_string()))
                .unwrap_or(LocalDetector::NoOp),
            DetectLocalMode::BridgeInterface if !config.bridge_interface.is_empty() => {
                LocalDetector::Interface(config.bridge_interface.clone())
            }
            DetectLocalMode::InterfaceNamePrefix if !config.interface_name_prefix.is_empty() => {
                LocalDetector::Interface(format!("{}+", config.interface_name_prefix))
            }
            _ => LocalDetector::NoOp,
        }
    }

    /// Whether the detector matches anything.
    pub fn is_implemented(&self) -> bool {
        !matches!(self, LocalDetector::NoOp)
    }

    fn if_local(&self) -> [&str; 2] {
        match self {
            LocalDetector::NoOp => ["", ""],
            LocalDetector::Cidr(c) => ["-s", c],
            LocalDetector::Interface(i) => ["-i", i],
        }
    }
}

/// The per-service chain names of one service port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainNames {
    /// `KUBE-SVC-…` (Cluster policy).
    pub svc: String,
    /// `KUBE-SVL-…` (Local policy).
    pub svl: String,
    /// `KUBE-EXT-…` (external destinations).
    pub ext: String,
    /// `KUBE-FW-…` (loadBalancerSourceRanges).
    pub fw: String,
}

impl ChainNames {
    /// The chain names of service port `spn` (`ns/name[:port]`) with lower-case `proto`.
    pub fn new(spn: &str, proto: &str) -> ChainNames {
        let h = port_proto_hash(spn, proto);
        ChainNames {
            svc: format!("KUBE-SVC-{h}"),
            svl: format!("KUBE-SVL-{h}"),
            ext: format!("KUBE-EXT-{h}"),
            fw: format!("KUBE-FW-{h}"),
        }
    }
}

/// Everything kube-proxy decides for one service port (spec §5.1–5.2).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServicePortPlan {
    /// The service port.
    pub info: ServicePortInfo,
    /// All its endpoints of this family, sorted by endpoint string.
    pub endpoints: Vec<Endpoint>,
    /// `KUBE-SEP-…` of each endpoint (parallel to `endpoints`).
    pub endpoint_chains: Vec<EndpointChain>,
    /// Cluster/local/reachable endpoint sets (indexes into `endpoints`).
    pub categorized: Categorized,
    /// The per-service chain names.
    pub chains: ChainNames,
    /// The SVC chain exists (cluster endpoints, cluster policy used).
    pub uses_cluster_policy_chain: bool,
    /// The SVL chain exists.
    pub uses_local_policy_chain: bool,
    /// Cluster-IP traffic is DNATed (else filtered with REJECT/DROP).
    pub has_internal_endpoints: bool,
    /// External traffic reaches endpoints (else REJECT/DROP in KUBE-EXTERNAL-SERVICES).
    pub has_external_endpoints: bool,
    /// The EXT chain exists.
    pub uses_external_chain: bool,
    /// The FW chain exists.
    pub uses_fw_chain: bool,
    /// A loadBalancerSourceRange contains the primary node IP (FW accepts the LB IPs as sources).
    pub allow_from_node: bool,
    /// Whether cluster-IP traffic is masqueraded: `all` (masqueradeAll), `non-local`
    /// (detector), or `none`.
    pub cluster_ip_masquerade: &'static str,
}

impl ServicePortPlan {
    /// The chain cluster-IP traffic jumps to (SVC, or SVL for iTP=Local).
    pub fn internal_chain(&self) -> &str {
        if self.info.internal_policy_local {
            &self.chains.svl
        } else {
            &self.chains.svc
        }
    }

    /// The chain EXT ends in (SVC, or SVL for eTP=Local).
    pub fn external_policy_chain(&self) -> &str {
        if self.info.external_policy_local {
            &self.chains.svl
        } else {
            &self.chains.svc
        }
    }

    /// The endpoints with Cluster policy.
    pub fn cluster_endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.categorized
            .cluster
            .iter()
            .filter_map(|&i| self.endpoints.get(i as usize))
    }

    /// The endpoints with Local policy.
    pub fn local_endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.categorized
            .local
            .iter()
            .filter_map(|&i| self.endpoints.get(i as usize))
    }

    /// `KUBE-XLB-…`: the `externalTrafficPolicy: Local` chain of releases before 1.24 (the
    /// hash of the other per-service chains).
    pub fn xlb_chain(&self) -> String {
        let hash = self.chains.svc.trim_start_matches("KUBE-SVC-");
        format!("KUBE-XLB-{hash}")
    }
}

/// The decisions for all service ports of one family, plus node-wide facts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServicePlan {
    /// The family.
    pub family: IpFamily,
    /// Per service port, sorted by (namespace, name, port, protocol).
    pub ports: Vec<ServicePortPlan>,
    /// Σ endpoints of service ports that exist (decides large-cluster mode).
    pub total_endpoints: usize,
    /// More than 1000 endpoints: SVC→SEP and SEP rules carry no comments.
    pub large_cluster_mode: bool,
    /// localhostNodePorts in effect (config, IPv4, and nodePortAddresses includes loopback).
    pub localhost_node_ports: bool,
    /// The local-traffic detector.
    pub local_detector: LocalDetector,
    /// nodePortAddresses "match all" for this family.
    pub node_ports_match_all: bool,
    /// When not matching all: the node addresses NodePorts are reachable on.
    pub node_port_ips: Vec<IpAddr>,
    /// Things kube-proxy would skip or log.
    pub warnings: Vec<Warning>,
}

impl ServicePlan {
    /// About how many nat chains the render writes: each endpoint's, two per service port, and
    /// the fixed ones (an estimate to size tables by, never a count to rely on).
    pub fn nat_chains_estimate(&self) -> usize {
        let per_port: usize = self.ports.iter().map(|p| p.endpoint_chains.len() + 2).sum();
        per_port + 16
    }
}

struct NodePortAddresses {
    match_all: bool,
    contains_ipv4_loopback: bool,
    cidrs: Vec<Cidr>,
}

fn node_port_addresses(
    config: &ProxyConfig,
    facts: &NodeFacts,
    warnings: &mut Vec<Warning>,
) -> NodePortAddresses {
    let mut strings: Vec<Cidr> = Vec::new();
    for s in &config.node_port_addresses {
        let s = s.trim();
        if s == "primary" {
            // Expanded at start-up to the primary node IP of each family (loopback skipped).
            for fam in [IpFamily::V4, IpFamily::V6] {
                let mut f = facts.clone();
                f.family = fam;
                let ip = f.primary_ip();
                if !ip.is_loopback() {
                    let prefix = if fam == IpFamily::V4 { 32 } else { 128 };
                    strings.push(Cidr { addr: ip, prefix });
                }
            }
            continue;
        }
        match Cidr::parse_sloppy(s) {
            Some(c) => strings.push(c),
            None => warnings.push(Warning::new(
                "config nodePortAddresses",
                format!("{s:?} is not a CIDR; ignored"),
            )),
        }
    }
    let mut of_family: Vec<Cidr> = strings
        .into_iter()
        .filter(|c| c.family() == facts.family)
        .collect();
    if of_family.is_empty() {
        of_family.push(Cidr {
            addr: match facts.family {
                IpFamily::V4 => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
                IpFamily::V6 => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
            },
            prefix: 0,
        });
    }
    let mut npa = NodePortAddresses {
        match_all: false,
        contains_ipv4_loopback: false,
        cidrs: Vec::new(),
    };
    let lo_start = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 0));
    for c in of_family {
        if c.family() == IpFamily::V4 && (c.addr.is_loopback() || c.contains(&lo_start)) {
            npa.contains_ipv4_loopback = true;
        }
        if c.is_zero() {
            npa.cidrs = vec![c];
            npa.match_all = true;
            break;
        }
        npa.cidrs.push(c);
    }
    npa
}

/// Computes kube-proxy's decisions for every service port of `facts.family`.
pub fn expected_service_ports(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
) -> ServicePlan {
    plan_with(state, config, facts, EndpointDetail::Full)
}

/// [`expected_service_ports`] with a choice of endpoint detail ([`EndpointDetail::Lean`] is what
/// [`render`] uses: same decisions, no informational copies).
pub fn plan_with(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    detail: EndpointDetail,
) -> ServicePlan {
    let (mut plan, work, planner) = prepare(state, config, facts, detail);
    plan.ports = work
        .into_iter()
        .map(|(info, endpoints)| planner.plan(info, endpoints))
        .collect();
    plan
}

/// Plans the service ports of `facts.family` one at a time, in render order, handing each to
/// `each` together with the node-wide plan (whose `ports` stays empty), which is returned. Other
/// proxiers (nftables) build on it: the service ports, endpoints and decisions are shared; the
/// `KUBE-SEP-` names are not, so each port's `endpoint_chains` is left empty.
pub fn plan_each(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    detail: EndpointDetail,
    each: &mut dyn FnMut(&ServicePlan, ServicePortPlan),
) -> ServicePlan {
    let (plan, work, planner) = prepare(state, config, facts, detail);
    for (info, endpoints) in work {
        each(&plan, planner.plan_without_endpoint_chains(info, endpoints));
    }
    plan
}

/// Decides per service port (spec §5.1–5.2) from node-wide facts.
struct PortPlanner<'f> {
    node_name: &'f str,
    zone: &'f str,
    node_hints_enabled: bool,
    primary: IpAddr,
    masq: &'static str,
    /// The release whose decisions these are.
    version: KubeProxyVersion,
    /// Serving terminating endpoints stand in for ready ones (`ProxyTerminatingEndpoints`).
    terminating_fallback: bool,
}

/// Service ports with their endpoints, plus the node-wide part of the plan (`ports` empty).
type Prepared<'f> = (
    ServicePlan,
    Vec<(ServicePortInfo, Vec<Endpoint>)>,
    PortPlanner<'f>,
);

fn prepare<'f>(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &'f NodeFacts,
    detail: EndpointDetail,
) -> Prepared<'f> {
    let family = facts.family;
    let version = facts.kube_proxy_version;
    let mut warnings = Vec::new();
    let mut services: Vec<(&str, &str, &k8s_openapi::api::core::v1::Service)> = state
        .services
        .iter()
        .filter(|svc| !ignored_by_labels(&svc.metadata))
        .map(|svc| {
            (
                svc.metadata.namespace.as_deref().unwrap_or(""),
                svc.metadata.name.as_deref().unwrap_or(""),
                svc,
            )
        })
        .collect();
    services.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1))); // stable: the first copy stays first
    let mut infos: Vec<ServicePortInfo> = Vec::with_capacity(services.len());
    let mut prev: Option<(&str, &str)> = None;
    for (ns, name, svc) in services {
        if prev == Some((ns, name)) {
            warnings.push(Warning::new(
                service_label(svc),
                "appears more than once; the first copy is used",
            ));
            continue;
        }
        prev = Some((ns, name));
        let mut ports = service_ports_of_release(svc, family, version, config, &mut warnings);
        ports.sort_by(|a, b| a.name.cmp(&b.name));
        infos.append(&mut ports);
    }

    let mut eps_map = endpoints_map_with(
        &state.endpoint_slices,
        family,
        &facts.node_name,
        detail,
        &mut warnings,
    );
    let known: HashSet<&ServicePortName> = infos.iter().map(|i| &i.name).collect();
    let known_services: HashSet<(&str, &str)> = infos
        .iter()
        .map(|i| (i.name.namespace.as_str(), i.name.name.as_str()))
        .collect();
    let mut orphan: Vec<(&ServicePortName, &Vec<Endpoint>)> = eps_map
        .iter()
        .filter(|(k, _)| {
            !known.contains(k) && known_services.contains(&(k.namespace.as_str(), k.name.as_str()))
        })
        .collect();
    orphan.sort_by(|a, b| a.0.cmp(b.0));
    for (spn, eps) in orphan {
        let mut slices: Vec<&str> = eps.iter().map(|e| &*e.slice).collect();
        slices.sort_unstable();
        slices.dedup();
        for s in slices {
            warnings.push(Warning::new(
                format!("EndpointSlice {}/{s}", spn.namespace),
                format!(
                    "port {:?}/{} matches no port of Service {}/{}; its endpoints are ignored",
                    spn.port,
                    spn.protocol.as_k8s(),
                    spn.namespace,
                    spn.name
                ),
            ));
        }
    }
    drop(known);
    drop(known_services);

    let total_endpoints: usize = infos
        .iter()
        .filter_map(|i| eps_map.get(&i.name))
        .map(|eps| {
            if version.counts_only_ready_endpoints() {
                eps.iter().filter(|e| e.ready).count()
            } else {
                eps.len()
            }
        })
        .sum();
    let npa = node_port_addresses(config, facts, &mut warnings);
    // Before the option existed (1.26) NodePorts were always open on IPv4 localhost.
    let localhost_node_ports = (config.localhost_node_ports
        || !version.has_localhost_nodeports_option())
        && family == IpFamily::V4
        && npa.contains_ipv4_loopback;
    let local_detector = LocalDetector::new(config, facts);
    let node_port_ips = if npa.match_all {
        Vec::new()
    } else {
        let mut ips = Vec::new();
        for ip in facts.local_addresses() {
            if npa.cidrs.iter().any(|c| c.contains(&ip)) && !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        ips
    };
    let primary = facts.primary_ip();
    let zone = facts.zone.as_deref().unwrap_or("");
    let work: Vec<(ServicePortInfo, Vec<Endpoint>)> = infos
        .into_iter()
        .map(|info| {
            let eps = eps_map.remove(&info.name).unwrap_or_default();
            (info, eps)
        })
        .collect();
    drop(eps_map);
    let node_hints_enabled = version.uses_node_hints(config);
    let masq = if config.masquerade_all {
        "all"
    } else if local_detector.is_implemented() {
        "non-local"
    } else {
        "none"
    };

    let plan = ServicePlan {
        family,
        ports: Vec::new(),
        total_endpoints,
        large_cluster_mode: total_endpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD,
        localhost_node_ports,
        local_detector,
        node_ports_match_all: npa.match_all,
        node_port_ips,
        warnings,
    };
    let planner = PortPlanner {
        node_name: &facts.node_name,
        zone,
        node_hints_enabled,
        primary,
        masq,
        version,
        terminating_fallback: version.falls_back_to_terminating(config),
    };
    (plan, work, planner)
}

impl PortPlanner<'_> {
    fn plan(&self, info: ServicePortInfo, endpoints: Vec<Endpoint>) -> ServicePortPlan {
        if !self.version.uses_ext_chains() {
            return self.plan_early(info, endpoints);
        }
        let proto = info.name.protocol.lower();
        let mut plan = self.plan_without_endpoint_chains(info, endpoints);
        plan.endpoint_chains = plan
            .endpoints
            .iter()
            .map(|e| EndpointChain::of(&plan.info.name_string, proto, &e.endpoint))
            .collect();
        plan
    }

    fn plan_without_endpoint_chains(
        &self,
        info: ServicePortInfo,
        endpoints: Vec<Endpoint>,
    ) -> ServicePortPlan {
        let proto = info.name.protocol.lower();
        let categorized = categorize_with(
            &endpoints,
            &CategorizeInput {
                uses_cluster: info.uses_cluster_endpoints(),
                uses_local: info.uses_local_endpoints(),
                node_name: self.node_name,
                zone: self.zone,
                node_hints_enabled: self.node_hints_enabled,
            },
            CategorizeRules {
                topology_hints: info.topology_hints_allowed,
                terminating_fallback: self.terminating_fallback,
            },
        );
        let chains = ChainNames::new(&info.name_string, proto);
        let has_endpoints = categorized.has_any;
        let uses_cluster_policy_chain =
            !categorized.cluster.is_empty() && info.uses_cluster_endpoints();
        // 1.24 also declares the Local policy chain when it has no endpoint (it then drops).
        let uses_local_policy_chain = info.uses_local_endpoints()
            && (!categorized.local.is_empty()
                || (!self.version.drops_in_filter_table() && categorized.has_any));
        let no_local = categorized.local.is_empty();
        let has_internal_endpoints = if info.internal_policy_local {
            has_endpoints && !no_local
        } else {
            has_endpoints
        };
        let has_external_endpoints = if info.external_policy_local {
            has_endpoints && !no_local
        } else {
            has_endpoints
        };
        let uses_external_chain = has_endpoints && info.externally_accessible();
        let uses_fw_chain = has_endpoints
            && !info.load_balancer_vips.is_empty()
            && !info.load_balancer_source_ranges.is_empty();
        let allow_from_node = info
            .load_balancer_source_ranges
            .iter()
            .any(|c| c.contains(&self.primary));
        ServicePortPlan {
            info,
            endpoints,
            endpoint_chains: Vec::new(),
            categorized,
            chains,
            uses_cluster_policy_chain,
            uses_local_policy_chain,
            has_internal_endpoints,
            has_external_endpoints,
            uses_external_chain,
            uses_fw_chain,
            allow_from_node,
            cluster_ip_masquerade: self.masq,
        }
    }

    /// [`PortPlanner::plan`] for a release before 1.24: the `KUBE-SVC-…` chain serves every
    /// destination, `KUBE-XLB-…` (in [`ChainNames`]' `svl` slot's place, see
    /// [`ServicePortPlan::xlb_chain`]) the external ones of an `externalTrafficPolicy: Local`
    /// service, and `internalTrafficPolicy: Local` narrows the endpoints instead of choosing a
    /// chain (so it is cleared from `info` once applied).
    fn plan_early(&self, mut info: ServicePortInfo, endpoints: Vec<Endpoint>) -> ServicePortPlan {
        let proto = info.name.protocol.lower();
        let endpoint_chains: Vec<EndpointChain> = endpoints
            .iter()
            .map(|e| EndpointChain::of(&info.name_string, proto, &e.endpoint))
            .collect();
        let categorized = categorize_early(
            &endpoints,
            &CategorizeInput {
                uses_cluster: true,
                uses_local: info.external_policy_local,
                node_name: self.node_name,
                zone: self.zone,
                node_hints_enabled: false,
            },
            EarlyRules {
                internal_local: info.internal_policy_local,
                terminating_fallback: self.terminating_fallback,
                minor: self.version.minor(),
            },
        );
        info.internal_policy_local = false;
        if !self.version.opens_health_check_ports() {
            // 1.20 serves the health check without a filter rule for it.
            info.health_check_node_port = 0;
        }
        let chains = ChainNames::new(&info.name_string, proto);
        let has_endpoints = categorized.has_any;
        let has_external_endpoints =
            has_endpoints && (!info.external_policy_local || !categorized.local.is_empty());
        let uses_fw_chain = has_endpoints && !info.load_balancer_vips.is_empty();
        let allow_from_node = info
            .load_balancer_source_ranges
            .iter()
            .any(|c| c.contains(&self.primary));
        ServicePortPlan {
            uses_cluster_policy_chain: has_endpoints,
            uses_local_policy_chain: info.external_policy_local,
            has_internal_endpoints: has_endpoints,
            has_external_endpoints,
            uses_external_chain: false,
            uses_fw_chain,
            allow_from_node,
            cluster_ip_masquerade: self.masq,
            info,
            endpoints,
            endpoint_chains,
            categorized,
            chains,
        }
    }
}

/// Text stored as a list of chunks of whole lines, so a large render never reallocates (and
/// never holds more than one chunk of spare capacity).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct TextBuf {
    /// Full chunks, in order.
    done: Vec<String>,
    /// The chunk being filled (after `done`).
    current: String,
}

/// A chunk's size: 256 KiB. A streamed render (verify) holds one partial chunk per table and kind
/// at a time, so this is what it costs on top of its reader.
const CHUNK: usize = 256 << 10;
const MAX_LINE: usize = 8 << 10;

impl TextBuf {
    /// The buffer to append the next whole line to.
    fn line(&mut self) -> &mut String {
        if self.current.len() + MAX_LINE > self.current.capacity() {
            if self.current.capacity() < CHUNK {
                let more = self.current.capacity().max(MAX_LINE);
                self.current.reserve(more);
            } else {
                let full = std::mem::replace(&mut self.current, String::with_capacity(CHUNK));
                self.done.push(full);
            }
        }
        &mut self.current
    }

    fn chunks(&self) -> impl Iterator<Item = &str> {
        self.done
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(self.current.as_str()))
    }

    fn lines(&self) -> impl Iterator<Item = &str> {
        self.chunks().flat_map(str::lines)
    }

    fn len(&self) -> usize {
        self.chunks().map(str::len).sum()
    }

    fn prepend(&mut self, text: String) {
        self.done.insert(0, text);
    }
}

/// One table of a render: chain declarations and rule lines, as restore text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RenderedTable {
    /// `filter`, `nat` or `mangle`.
    pub name: &'static str,
    chain_lines: TextBuf,
    rule_lines: TextBuf,
}

impl RenderedTable {
    fn new(name: &'static str) -> RenderedTable {
        RenderedTable {
            name,
            chain_lines: TextBuf::default(),
            rule_lines: TextBuf::default(),
        }
    }

    fn chain(&mut self, name: &str) {
        let b = self.chain_lines.line();
        b.push(':');
        b.push_str(name);
        b.push_str(" - [0:0]\n");
    }

    /// The declared chains as `(name, policy)`; policy is `-` for user chains.
    pub fn chains(&self) -> impl Iterator<Item = (&str, &str)> {
        self.chain_lines.lines().map(|l| {
            let mut w = l.trim_start_matches(':').split(' ');
            (w.next().unwrap_or(""), w.next().unwrap_or("-"))
        })
    }

    /// The rule lines (`-A CHAIN …`), in emission order.
    pub fn rules(&self) -> impl Iterator<Item = &str> {
        self.rule_lines.lines()
    }

    /// The rules of one chain (full `-A` lines), in order.
    pub fn chain_rules<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.rules().filter(move |r| rule_chain(r) == chain)
    }

    /// Bytes of restore text this table contributes (without `*name`/`COMMIT`).
    pub fn text_len(&self) -> usize {
        self.chain_lines.len() + self.rule_lines.len()
    }
}

/// The chain a `-A CHAIN …` line appends to.
pub fn rule_chain(line: &str) -> &str {
    line.split(' ').nth(1).unwrap_or("")
}

/// Splits a rule into words; a double-quoted word (kube-proxy's multi-word comments) is one word
/// without its quotes.
pub fn rule_words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line.trim();
    while !rest.is_empty() {
        if let Some(q) = rest.strip_prefix('"') {
            let end = q.find('"').unwrap_or(q.len());
            out.push(q[..end].to_string());
            rest = q.get(end + 1..).unwrap_or("").trim_start();
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            out.push(rest[..end].to_string());
            rest = rest[end..].trim_start();
        }
    }
    out
}

/// The output of a render.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The family rendered.
    pub family: IpFamily,
    /// Whether large-cluster mode was on.
    pub large_cluster_mode: bool,
    /// The tables, in output order (filter, nat, then mangle with base jumps).
    pub tables: Vec<RenderedTable>,
    /// Objects skipped or oddities kube-proxy would log.
    pub warnings: Vec<Warning>,
}

impl Rendered {
    /// The table named `name`.
    pub fn table(&self, name: &str) -> Option<&RenderedTable> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Writes the `iptables-restore` input.
    pub fn write_restore(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        for t in &self.tables {
            writeln!(w, "*{}", t.name)?;
            for c in t.chain_lines.chunks().chain(t.rule_lines.chunks()) {
                w.write_all(c.as_bytes())?;
            }
            writeln!(w, "COMMIT")?;
        }
        Ok(())
    }

    /// The `iptables-restore` input as one string.
    pub fn to_restore_text(&self) -> String {
        let cap = self.tables.iter().map(|t| t.text_len() + 16).sum();
        let mut s = String::with_capacity(cap);
        for t in &self.tables {
            s.push('*');
            s.push_str(t.name);
            s.push('\n');
            for c in t.chain_lines.chunks().chain(t.rule_lines.chunks()) {
                s.push_str(c);
            }
            s.push_str("COMMIT\n");
        }
        s
    }

    /// The structured form used by `-o json`.
    pub fn to_json_value(&self) -> RenderedJson<'_> {
        RenderedJson {
            family: self.family,
            large_cluster_mode: self.large_cluster_mode,
            tables: self
                .tables
                .iter()
                .map(|t| TableJson {
                    name: t.name,
                    chains: t
                        .chains()
                        .map(|(name, policy)| ChainJson { name, policy })
                        .collect(),
                    rules: t
                        .rules()
                        .map(|line| {
                            let words = rule_words(line);
                            RuleJson {
                                chain: rule_chain(line),
                                args: words.into_iter().skip(2).collect(),
                                line,
                            }
                        })
                        .collect(),
                })
                .collect(),
            warnings: &self.warnings,
        }
    }
}

/// `-o json` document.
#[derive(Debug, Serialize)]
pub struct RenderedJson<'a> {
    /// `IPv4` / `IPv6`.
    pub family: IpFamily,
    /// Large-cluster mode on.
    pub large_cluster_mode: bool,
    /// Tables in output order.
    pub tables: Vec<TableJson<'a>>,
    /// Warnings.
    pub warnings: &'a [Warning],
}

/// One table in `-o json`.
#[derive(Debug, Serialize)]
pub struct TableJson<'a> {
    /// Table name.
    pub name: &'a str,
    /// Declared chains.
    pub chains: Vec<ChainJson<'a>>,
    /// Rules in emission order.
    pub rules: Vec<RuleJson<'a>>,
}

/// One chain declaration in `-o json`.
#[derive(Debug, Serialize)]
pub struct ChainJson<'a> {
    /// Chain name.
    pub name: &'a str,
    /// `-` or the built-in policy.
    pub policy: &'a str,
}

/// One rule in `-o json`.
#[derive(Debug, Serialize)]
pub struct RuleJson<'a> {
    /// The chain appended to.
    pub chain: &'a str,
    /// The words after `-A CHAIN` (quotes removed).
    pub args: Vec<String>,
    /// The restore line.
    pub line: &'a str,
}

/// Builds rule lines word by word into a table's buffer.
struct Line<'t> {
    buf: &'t mut String,
}

impl<'t> Line<'t> {
    fn start(text: &'t mut TextBuf, chain: &str) -> Line<'t> {
        let buf = text.line();
        buf.push_str("-A ");
        buf.push_str(chain);
        Line { buf }
    }
    fn w(self, word: &str) -> Self {
        self.buf.push(' ');
        self.buf.push_str(word);
        self
    }
    fn ws(mut self, words: &[&str]) -> Self {
        for word in words {
            self = self.w(word);
        }
        self
    }
    fn num(self, n: i32) -> Self {
        self.buf.push(' ');
        crate::state::ip::push_int(self.buf, i64::from(n));
        self
    }
    /// `-m comment --comment "<parts…>"`.
    fn comment_q(self, parts: &[&str]) -> Self {
        self.buf.push_str(" -m comment --comment \"");
        for p in parts {
            self.buf.push_str(p);
        }
        self.buf.push('"');
        self
    }
    /// `-m comment --comment <word>` (unquoted).
    fn comment(self, word: &str) -> Self {
        self.buf.push_str(" -m comment --comment ");
        self.buf.push_str(word);
        self
    }
    fn end(self) {
        self.buf.push('\n');
    }
}

fn ip_text(ip: &IpAddr, scratch: &mut String) -> usize {
    let start = scratch.len();
    let _ = write!(scratch, "{ip}");
    start
}

/// Renders the restore input kube-proxy writes on a full sync (filter and nat), plus the base
/// chains and jumps when asked. Service ports are planned and emitted one at a time, so the
/// working memory stays close to the size of the output.
pub fn render(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    opts: RenderOptions,
) -> Rendered {
    let (plan, work, planner) = prepare(state, config, facts, EndpointDetail::Lean);
    let mut em = Emitter::new(&plan, facts);
    for (info, endpoints) in work {
        em.port(&planner.plan(info, endpoints));
    }
    em.finish(opts, plan.warnings)
}

/// Renders an already computed [`ServicePlan`].
pub fn render_plan(plan: &ServicePlan, facts: &NodeFacts, opts: RenderOptions) -> Rendered {
    let mut em = Emitter::new(plan, facts);
    for p in &plan.ports {
        em.port(p);
    }
    em.finish(opts, plan.warnings.clone())
}

/// Whole lines of one table, as [`render_plan_chunks`] hands them out.
#[derive(Debug, Clone, Copy)]
pub struct RenderChunk<'c> {
    /// `filter` or `nat`.
    pub table: &'static str,
    /// Chain declarations (`:NAME - [0:0]`) when true, rules (`-A …`) when false.
    pub declarations: bool,
    /// The lines, each ending in a newline.
    pub text: &'c str,
}

/// What a render says besides its lines.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderSummary {
    /// The family rendered.
    pub family: IpFamily,
    /// Whether large-cluster mode was on.
    pub large_cluster_mode: bool,
    /// Objects skipped or oddities kube-proxy would log.
    pub warnings: Vec<Warning>,
}

/// Renders `plan` as [`render_plan`] does (without base jumps), handing the text to `sink` in
/// chunks of whole lines (256 KiB each) as it is written and keeping none of it: readers that
/// look at each rule once (verify) never hold a large render's text whole. Within one table and
/// kind, chunks come in render order.
pub fn render_plan_chunks(
    plan: &ServicePlan,
    facts: &NodeFacts,
    sink: &mut dyn FnMut(RenderChunk<'_>),
) -> RenderSummary {
    let mut em = Emitter::new(plan, facts);
    for p in &plan.ports {
        em.port(p);
        em.drain(sink);
    }
    let rendered = em.finish(RenderOptions::default(), plan.warnings.clone());
    for t in &rendered.tables {
        for (declarations, buf) in [(true, &t.chain_lines), (false, &t.rule_lines)] {
            for text in buf.chunks().filter(|c| !c.is_empty()) {
                sink(RenderChunk {
                    table: t.name,
                    declarations,
                    text,
                });
            }
        }
    }
    RenderSummary {
        family: rendered.family,
        large_cluster_mode: rendered.large_cluster_mode,
        warnings: rendered.warnings,
    }
}

/// Writes the rules of one render into the filter and nat buffers.
struct Emitter {
    filter: RenderedTable,
    nat: RenderedTable,
    /// The release whose rules are written.
    version: KubeProxyVersion,
    family: IpFamily,
    is_v6: bool,
    mm: String,
    large: bool,
    nfacct_localhost: bool,
    nfacct_ct_state_invalid: bool,
    tcp_be_liberal: bool,
    kube_firewall: bool,
    localhost_node_ports: bool,
    match_all: bool,
    node_port_ips: Vec<IpAddr>,
    detector: LocalDetector,
    probabilities: Vec<String>,
    scratch: String,
}

impl Emitter {
    /// Hands the full chunks written so far to `sink` and forgets them.
    fn drain(&mut self, sink: &mut dyn FnMut(RenderChunk<'_>)) {
        for t in [&mut self.filter, &mut self.nat] {
            let name = t.name;
            for (declarations, buf) in [(true, &mut t.chain_lines), (false, &mut t.rule_lines)] {
                for text in buf.done.drain(..) {
                    sink(RenderChunk {
                        table: name,
                        declarations,
                        text: &text,
                    });
                }
            }
        }
    }

    /// Chain lines and the rules written before the services.
    fn new(plan: &ServicePlan, facts: &NodeFacts) -> Emitter {
        let is_v6 = plan.family == IpFamily::V6;
        let version = facts.kube_proxy_version;
        let mark = facts.masquerade_mark.as_str();
        let mut filter = RenderedTable::new("filter");
        let mut nat = RenderedTable::new("nat");

        for c in [
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-NODEPORTS",
            "KUBE-PROXY-FIREWALL",
        ] {
            let written = match c {
                "KUBE-NODEPORTS" => version.opens_health_check_ports(),
                "KUBE-PROXY-FIREWALL" => version.drops_in_filter_table(),
                _ => true,
            };
            if written {
                filter.chain(c);
            }
        }
        for c in [
            "KUBE-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
        ] {
            nat.chain(c);
        }
        let mm = format!("{mark}/{mark}");
        Line::start(&mut nat.rule_lines, "KUBE-POSTROUTING")
            .ws(&["-m", "mark", "!", "--mark", &mm, "-j", "RETURN"])
            .end();
        Line::start(&mut nat.rule_lines, "KUBE-POSTROUTING")
            .ws(&["-j", "MARK", "--xor-mark", mark])
            .end();
        let l = Line::start(&mut nat.rule_lines, "KUBE-POSTROUTING")
            .comment_q(&["kubernetes service traffic requiring SNAT"])
            .ws(&["-j", "MASQUERADE"]);
        if facts.random_fully {
            l.w("--random-fully").end();
        } else {
            l.end();
        }
        Line::start(&mut nat.rule_lines, "KUBE-MARK-MASQ")
            .ws(&["-j", "MARK", "--or-mark", mark])
            .end();
        let kube_firewall = !is_v6 && plan.localhost_node_ports && version.writes_kube_firewall();
        if kube_firewall {
            filter.chain("KUBE-FIREWALL");
            Line::start(&mut filter.rule_lines, "KUBE-FIREWALL")
                .comment_q(&["block incoming localnet connections"])
                .ws(&[
                    "-d",
                    "127.0.0.0/8",
                    "!",
                    "-s",
                    "127.0.0.0/8",
                    "-m",
                    "conntrack",
                    "!",
                    "--ctstate",
                    "RELATED,ESTABLISHED,DNAT",
                    "-j",
                    "DROP",
                ])
                .end();
        }
        Emitter {
            filter,
            nat,
            family: plan.family,
            is_v6,
            mm,
            large: plan.large_cluster_mode,
            nfacct_localhost: plan.localhost_node_ports
                && !is_v6
                && facts.nfacct_localhost_nodeports
                && version.counts_with_nfacct(),
            nfacct_ct_state_invalid: facts.nfacct_ct_state_invalid && version.counts_with_nfacct(),
            tcp_be_liberal: facts.tcp_be_liberal && version.drops_invalid_conditionally(),
            version,
            kube_firewall,
            localhost_node_ports: plan.localhost_node_ports,
            match_all: plan.node_ports_match_all,
            node_port_ips: plan.node_port_ips.clone(),
            detector: plan.local_detector.clone(),
            probabilities: Vec::new(),
            scratch: String::with_capacity(64),
        }
    }

    /// The rules of one service port.
    fn port(&mut self, p: &ServicePortPlan) {
        if !self.version.uses_ext_chains() {
            self.early_port(p);
            return;
        }
        let info = &p.info;
        let spn = info.name_string.as_str();
        let proto = info.name.protocol.lower();
        self.scratch.clear();
        let cip_at = ip_text(&info.cluster_ip, &mut self.scratch);
        let port_at = self.scratch.len();
        let _ = write!(self.scratch, "{}", info.port);
        let end = self.scratch.len();
        let cip = self.scratch[cip_at..port_at].to_string();
        let port = self.scratch[port_at..end].to_string();
        let has_endpoints = p.categorized.has_any;
        let (int_target, int_comment, ext_target, ext_comment) = if !has_endpoints {
            ("REJECT", " has no endpoints", "REJECT", " has no endpoints")
        } else {
            (
                if p.has_internal_endpoints { "" } else { "DROP" },
                " has no local endpoints",
                if p.has_external_endpoints { "" } else { "DROP" },
                " has no local endpoints",
            )
        };
        let ext_ips: Vec<String> = info.external_ips.iter().map(|i| i.to_string()).collect();
        let lb_ips: Vec<String> = info
            .load_balancer_vips
            .iter()
            .map(|i| i.to_string())
            .collect();
        let lb_target = if p.uses_fw_chain {
            &p.chains.fw
        } else {
            &p.chains.ext
        };
        // 1.24 sends a destination on whenever the service has endpoints: an empty Local policy
        // chain then drops (through kubelet's KUBE-MARK-DROP), not the filter table.
        let drops = self.version.drops_in_filter_table();
        let serves_internal = p.has_internal_endpoints || (!drops && has_endpoints);
        let serves_external = p.has_external_endpoints || (!drops && has_endpoints);

        // 1. cluster IP
        if serves_internal {
            Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                .comment_q(&[spn, " cluster IP"])
                .ws(&[
                    "-m",
                    proto,
                    "-p",
                    proto,
                    "-d",
                    &cip,
                    "--dport",
                    &port,
                    "-j",
                    p.internal_chain(),
                ])
                .end();
        } else {
            Line::start(&mut self.filter.rule_lines, "KUBE-SERVICES")
                .comment_q(&[spn, int_comment])
                .ws(&[
                    "-m", proto, "-p", proto, "-d", &cip, "--dport", &port, "-j", int_target,
                ])
                .end();
        }
        // 2. external IPs
        for x in &ext_ips {
            if has_endpoints {
                Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                    .comment_q(&[spn, " external IP"])
                    .ws(&[
                        "-m",
                        proto,
                        "-p",
                        proto,
                        "-d",
                        x,
                        "--dport",
                        &port,
                        "-j",
                        &p.chains.ext,
                    ])
                    .end();
            }
            if !serves_external {
                Line::start(&mut self.filter.rule_lines, "KUBE-EXTERNAL-SERVICES")
                    .comment_q(&[spn, ext_comment])
                    .ws(&[
                        "-m", proto, "-p", proto, "-d", x, "--dport", &port, "-j", ext_target,
                    ])
                    .end();
            }
        }
        // 3. load-balancer ingress
        for l in &lb_ips {
            if has_endpoints {
                Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                    .comment_q(&[spn, " loadbalancer IP"])
                    .ws(&[
                        "-m", proto, "-p", proto, "-d", l, "--dport", &port, "-j", lb_target,
                    ])
                    .end();
            }
            if p.uses_fw_chain && drops {
                Line::start(&mut self.filter.rule_lines, "KUBE-PROXY-FIREWALL")
                    .comment_q(&[spn, " traffic not accepted by ", &p.chains.fw])
                    .ws(&[
                        "-m", proto, "-p", proto, "-d", l, "--dport", &port, "-j", "DROP",
                    ])
                    .end();
            }
        }
        if !serves_external {
            for l in &lb_ips {
                Line::start(&mut self.filter.rule_lines, "KUBE-EXTERNAL-SERVICES")
                    .comment_q(&[spn, ext_comment])
                    .ws(&[
                        "-m", proto, "-p", proto, "-d", l, "--dport", &port, "-j", ext_target,
                    ])
                    .end();
            }
        }
        // 5. node port
        if info.node_port != 0 {
            if has_endpoints {
                if self.nfacct_localhost {
                    Line::start(&mut self.nat.rule_lines, "KUBE-NODEPORTS")
                        .comment(spn)
                        .ws(&["-m", proto, "-p", proto, "-d", "127.0.0.0/8", "--dport"])
                        .num(info.node_port)
                        .ws(&[
                            "-m",
                            "nfacct",
                            "--nfacct-name",
                            crate::state::node::NFACCT_LOCALHOST_NODEPORTS,
                            "-j",
                            &p.chains.ext,
                        ])
                        .end();
                }
                Line::start(&mut self.nat.rule_lines, "KUBE-NODEPORTS")
                    .comment(spn)
                    .ws(&["-m", proto, "-p", proto, "--dport"])
                    .num(info.node_port)
                    .ws(&["-j", &p.chains.ext])
                    .end();
            }
            if !serves_external {
                Line::start(&mut self.filter.rule_lines, "KUBE-EXTERNAL-SERVICES")
                    .comment_q(&[spn, ext_comment])
                    .ws(&[
                        "-m",
                        "addrtype",
                        "--dst-type",
                        "LOCAL",
                        "-m",
                        proto,
                        "-p",
                        proto,
                        "--dport",
                    ])
                    .num(info.node_port)
                    .ws(&["-j", ext_target])
                    .end();
            }
        }
        // 6. health check node port
        if info.health_check_node_port != 0 {
            Line::start(&mut self.filter.rule_lines, "KUBE-NODEPORTS")
                .comment_q(&[spn, " health check node port"])
                .ws(&["-m", "tcp", "-p", "tcp", "--dport"])
                .num(info.health_check_node_port)
                .ws(&["-j", "ACCEPT"])
                .end();
        }

        // Per-service chains.
        if serves_internal {
            fn base<'b>(
                buf: &'b mut TextBuf,
                chain: &str,
                spn: &str,
                proto: &str,
                cip: &str,
                port: &str,
            ) -> Line<'b> {
                Line::start(buf, chain)
                    .comment_q(&[spn, " cluster IP"])
                    .ws(&["-m", proto, "-p", proto, "-d", cip, "--dport", port])
            }
            if p.cluster_ip_masquerade == "all" {
                base(
                    &mut self.nat.rule_lines,
                    p.internal_chain(),
                    spn,
                    proto,
                    &cip,
                    &port,
                )
                .ws(&["-j", "KUBE-MARK-MASQ"])
                .end();
            } else if self.detector.is_implemented() {
                let [flag, value] = self.detector.if_local();
                base(
                    &mut self.nat.rule_lines,
                    p.internal_chain(),
                    spn,
                    proto,
                    &cip,
                    &port,
                )
                .ws(&["!", flag, value, "-j", "KUBE-MARK-MASQ"])
                .end();
            }
        }
        if p.uses_external_chain {
            let ext = p.chains.ext.as_str();
            self.nat.chain(ext);
            if !info.external_policy_local {
                Line::start(&mut self.nat.rule_lines, ext)
                    .comment_q(&["masquerade traffic for ", spn, " external destinations"])
                    .ws(&["-j", "KUBE-MARK-MASQ"])
                    .end();
            } else {
                if self.detector.is_implemented() {
                    let [flag, value] = self.detector.if_local();
                    Line::start(&mut self.nat.rule_lines, ext)
                        .comment_q(&["pod traffic for ", spn, " external destinations"])
                        .ws(&[flag, value, "-j", &p.chains.svc])
                        .end();
                }
                Line::start(&mut self.nat.rule_lines, ext)
                    .comment_q(&[
                        "masquerade LOCAL traffic for ",
                        spn,
                        " external destinations",
                    ])
                    .ws(&[
                        "-m",
                        "addrtype",
                        "--src-type",
                        "LOCAL",
                        "-j",
                        "KUBE-MARK-MASQ",
                    ])
                    .end();
                Line::start(&mut self.nat.rule_lines, ext)
                    .comment_q(&["route LOCAL traffic for ", spn, " external destinations"])
                    .ws(&["-m", "addrtype", "--src-type", "LOCAL", "-j", &p.chains.svc])
                    .end();
            }
            if serves_external {
                Line::start(&mut self.nat.rule_lines, ext)
                    .ws(&["-j", p.external_policy_chain()])
                    .end();
            }
        }
        if p.uses_fw_chain && !drops {
            // 1.24 writes the firewall rules once per load-balancer IP, each set ending in a
            // drop mark.
            let fw = p.chains.fw.as_str();
            self.nat.chain(fw);
            for l in &lb_ips {
                let allowed = info
                    .load_balancer_source_ranges
                    .iter()
                    .map(|c| c.to_string());
                let from_node = p.allow_from_node.then(|| l.clone());
                for source in allowed.chain(from_node) {
                    Line::start(&mut self.nat.rule_lines, fw)
                        .comment_q(&[spn, " loadbalancer IP"])
                        .ws(&["-s", &source, "-j", &p.chains.ext])
                        .end();
                }
                Line::start(&mut self.nat.rule_lines, fw)
                    .comment_q(&[spn, " loadbalancer IP"])
                    .ws(&["-j", "KUBE-MARK-DROP"])
                    .end();
            }
        } else if p.uses_fw_chain {
            let fw = p.chains.fw.as_str();
            self.nat.chain(fw);
            for c in &info.load_balancer_source_ranges {
                let c = c.to_string();
                Line::start(&mut self.nat.rule_lines, fw)
                    .comment_q(&[spn, " loadbalancer IP"])
                    .ws(&["-s", &c, "-j", &p.chains.ext])
                    .end();
            }
            if p.allow_from_node {
                for l in &lb_ips {
                    Line::start(&mut self.nat.rule_lines, fw)
                        .comment_q(&[spn, " loadbalancer IP"])
                        .ws(&["-s", l, "-j", &p.chains.ext])
                        .end();
                }
            }
            if self.version.writes_kube_firewall() {
                Line::start(&mut self.nat.rule_lines, fw)
                    .comment_q(&[
                        "other traffic to ",
                        spn,
                        " will be dropped by KUBE-PROXY-FIREWALL",
                    ])
                    .end();
            }
        }
        if p.uses_cluster_policy_chain {
            self.nat.chain(&p.chains.svc);
            write_service_to_endpoint_rules(
                &mut self.nat.rule_lines,
                p,
                &p.chains.svc,
                &p.categorized.cluster,
                self.large,
                &mut self.probabilities,
            );
        }
        if p.uses_local_policy_chain {
            self.nat.chain(&p.chains.svl);
            write_service_to_endpoint_rules(
                &mut self.nat.rule_lines,
                p,
                &p.chains.svl,
                &p.categorized.local,
                self.large,
                &mut self.probabilities,
            );
            if p.categorized.local.is_empty() {
                // Only 1.24 writes a Local policy chain without endpoints.
                Line::start(&mut self.nat.rule_lines, &p.chains.svl)
                    .comment_q(&[spn, " has no local endpoints"])
                    .ws(&["-j", "KUBE-MARK-DROP"])
                    .end();
            }
        }
        self.endpoint_chains(p);
    }

    /// The `KUBE-SEP-…` chain of every endpoint the service's rules can reach.
    fn endpoint_chains(&mut self, p: &ServicePortPlan) {
        let info = &p.info;
        let spn = info.name_string.as_str();
        let proto = info.name.protocol.lower();
        for &i in &p.categorized.reachable {
            let (Some(ep), Some(sep)) = (
                p.endpoints.get(i as usize),
                p.endpoint_chains.get(i as usize),
            ) else {
                continue;
            };
            self.nat.chain(sep);
            self.scratch.clear();
            crate::state::ip::push_ip(&mut self.scratch, &ep.ip);
            if !self.version.bare_addresses() {
                self.scratch.push_str(host_prefix(&ep.ip));
            }
            let mut l = Line::start(&mut self.nat.rule_lines, sep);
            if !self.large {
                l = l.comment(spn);
            }
            l.ws(&["-s", &self.scratch, "-j", "KUBE-MARK-MASQ"]).end();
            let mut l = Line::start(&mut self.nat.rule_lines, sep);
            if !self.large {
                l = l.comment(spn);
            }
            if info.session_affinity_seconds.is_some() {
                l = l.ws(&["-m", "recent", "--name", sep, "--set"]);
            }
            l.ws(&[
                "-m",
                proto,
                "-p",
                proto,
                "-j",
                "DNAT",
                "--to-destination",
                &ep.endpoint,
            ])
            .end();
        }
    }

    /// The tail rule(s), KUBE-FORWARD, and the base jumps when asked.
    fn finish(mut self, opts: RenderOptions, warnings: Vec<Warning>) -> Rendered {
        // The KUBE-SERVICES → KUBE-NODEPORTS tail rule(s).
        if self.match_all {
            let l = Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                .comment_q(&[NODEPORTS_TAIL_COMMENT])
                .ws(&["-m", "addrtype", "--dst-type", "LOCAL"]);
            let l = if self.is_v6 && self.version.has_localhost_nodeports_option() {
                l.ws(&["!", "-d", "::1/128"])
            } else if self.is_v6 {
                l
            } else if !self.localhost_node_ports {
                l.ws(&["!", "-d", "127.0.0.0/8"])
            } else {
                l
            };
            l.ws(&["-j", "KUBE-NODEPORTS"]).end();
        } else {
            for ip in &self.node_port_ips {
                if ip.is_loopback()
                    && (self.is_v6 || !self.localhost_node_ports)
                    && self.version.has_localhost_nodeports_option()
                {
                    continue;
                }
                let ip = ip.to_string();
                Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                    .comment_q(&[NODEPORTS_TAIL_COMMENT])
                    .ws(&["-d", &ip, "-j", "KUBE-NODEPORTS"])
                    .end();
            }
        }

        // KUBE-FORWARD.
        if !self.tcp_be_liberal {
            let l = Line::start(&mut self.filter.rule_lines, "KUBE-FORWARD").ws(&[
                "-m",
                "conntrack",
                "--ctstate",
                "INVALID",
            ]);
            let l = if self.nfacct_ct_state_invalid {
                l.ws(&[
                    "-m",
                    "nfacct",
                    "--nfacct-name",
                    crate::state::node::NFACCT_CT_STATE_INVALID,
                ])
            } else {
                l
            };
            l.ws(&["-j", "DROP"]).end();
        }
        Line::start(&mut self.filter.rule_lines, "KUBE-FORWARD")
            .comment_q(&["kubernetes forwarding rules"])
            .ws(&["-m", "mark", "--mark", &self.mm, "-j", "ACCEPT"])
            .end();
        let conntrack_comments: &[&str] = if self.version.one_forward_conntrack_rule() {
            &["kubernetes forwarding conntrack rule"]
        } else {
            &[
                "kubernetes forwarding conntrack pod source rule",
                "kubernetes forwarding conntrack pod destination rule",
            ]
        };
        for comment in conntrack_comments {
            Line::start(&mut self.filter.rule_lines, "KUBE-FORWARD")
                .comment_q(&[comment])
                .ws(&[
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "RELATED,ESTABLISHED",
                    "-j",
                    "ACCEPT",
                ])
                .end();
        }

        let mut tables = vec![self.filter, self.nat];
        if opts.with_base_jumps {
            add_base_jumps(&mut tables, self.kube_firewall, self.version);
        }
        Rendered {
            family: self.family,
            large_cluster_mode: self.large,
            tables,
            warnings,
        }
    }
}

fn probability(cache: &mut Vec<String>, n: usize) -> &str {
    while cache.len() <= n {
        let k = cache.len();
        cache.push(if k == 0 {
            String::new()
        } else {
            format!("{:.10}", 1.0 / k as f64)
        });
    }
    cache.get(n).map(String::as_str).unwrap_or("")
}

/// `/32` or `/128`: the host prefix releases before 1.23 wrote after addresses.
fn host_prefix(ip: &IpAddr) -> &'static str {
    if ip.is_ipv6() { "/128" } else { "/32" }
}

/// How a release comments the rules that jump from a service chain to its endpoint chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BalancingComments {
    /// `"<svc> -> <ip:port>"`, left out in large-cluster mode (1.24 and later).
    Arrow,
    /// `<svc>`, left out in large-cluster mode (before 1.24; 1.23's `KUBE-XLB-…`).
    Name,
    /// `<svc>` on affinity rules and `"Balancing rule N for <svc>"` on the others, always
    /// (`KUBE-XLB-…` before 1.23).
    Numbered,
}

fn write_service_to_endpoint_rules(
    out: &mut TextBuf,
    p: &ServicePortPlan,
    chain: &str,
    eps: &[u32],
    large: bool,
    probabilities: &mut Vec<String>,
) {
    write_balancing_rules(
        out,
        p,
        chain,
        (eps, eps),
        (BalancingComments::Arrow, large),
        probabilities,
    );
}

/// The rules of `chain` that pick an endpoint: affinity rules for `sticky` (the endpoints the
/// affinity lists cover), then one probability rule per endpoint of `eps`.
fn write_balancing_rules(
    out: &mut TextBuf,
    p: &ServicePortPlan,
    chain: &str,
    (sticky_eps, eps): (&[u32], &[u32]),
    (comments, large): (BalancingComments, bool),
    probabilities: &mut Vec<String>,
) {
    let spn = p.info.name_string.as_str();
    let commented = comments == BalancingComments::Numbered || !large;
    if let Some(sticky) = p.info.session_affinity_seconds {
        for &i in sticky_eps {
            let (Some(ep), Some(sep)) = (
                p.endpoints.get(i as usize),
                p.endpoint_chains.get(i as usize),
            ) else {
                continue;
            };
            let mut l = Line::start(out, chain);
            if commented {
                l = match comments {
                    BalancingComments::Arrow => l.comment_q(&[spn, " -> ", &ep.endpoint]),
                    BalancingComments::Name | BalancingComments::Numbered => l.comment(spn),
                };
            }
            l.ws(&["-m", "recent", "--name", sep, "--rcheck", "--seconds"])
                .num(sticky)
                .ws(&["--reap", "-j", sep])
                .end();
        }
    }
    let n = eps.len();
    for (k, &i) in eps.iter().enumerate() {
        let (Some(ep), Some(sep)) = (
            p.endpoints.get(i as usize),
            p.endpoint_chains.get(i as usize),
        ) else {
            continue;
        };
        let mut l = Line::start(out, chain);
        if commented {
            l = match comments {
                BalancingComments::Arrow => l.comment_q(&[spn, " -> ", &ep.endpoint]),
                BalancingComments::Name => l.comment(spn),
                BalancingComments::Numbered => {
                    let rule = k.to_string();
                    l.comment_q(&["Balancing rule ", &rule, " for ", spn])
                }
            };
        }
        if k + 1 < n {
            l = l.ws(&[
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                probability(probabilities, n - k),
            ]);
        }
        l.ws(&["-j", sep]).end();
    }
}

/// The jump rules kube-proxy ensures in built-in chains (spec §3.2), in final top-of-chain order
/// on a fresh node: `(table, chain, extra args, comment, target)`.
pub const BASE_JUMPS: &[(&str, &str, &str, &str, &str)] = &[
    ("filter", "INPUT", "", "", "KUBE-FIREWALL"),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW",
        "kubernetes load balancer firewall",
        "KUBE-PROXY-FIREWALL",
    ),
    (
        "filter",
        "INPUT",
        "",
        "kubernetes health check service ports",
        "KUBE-NODEPORTS",
    ),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW",
        "kubernetes externally-visible service portals",
        "KUBE-EXTERNAL-SERVICES",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW",
        "kubernetes load balancer firewall",
        "KUBE-PROXY-FIREWALL",
    ),
    (
        "filter",
        "FORWARD",
        "",
        "kubernetes forwarding rules",
        "KUBE-FORWARD",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW",
        "kubernetes service portals",
        "KUBE-SERVICES",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW",
        "kubernetes externally-visible service portals",
        "KUBE-EXTERNAL-SERVICES",
    ),
    ("filter", "OUTPUT", "", "", "KUBE-FIREWALL"),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW",
        "kubernetes load balancer firewall",
        "KUBE-PROXY-FIREWALL",
    ),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW",
        "kubernetes service portals",
        "KUBE-SERVICES",
    ),
    (
        "nat",
        "PREROUTING",
        "",
        "kubernetes service portals",
        "KUBE-SERVICES",
    ),
    (
        "nat",
        "OUTPUT",
        "",
        "kubernetes service portals",
        "KUBE-SERVICES",
    ),
    (
        "nat",
        "POSTROUTING",
        "",
        "kubernetes postrouting rules",
        "KUBE-POSTROUTING",
    ),
];

const BUILTIN_CHAINS: &[(&str, &[&str])] = &[
    ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
    ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
    (
        "mangle",
        &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    ),
];

/// The release from which kube-proxy ensures a base jump to `target`.
fn base_jump_since(target: &str) -> KubeProxyVersion {
    let minor = match target {
        "KUBE-NODEPORTS" => 21,
        "KUBE-PROXY-FIREWALL" => 25,
        "KUBE-FIREWALL" => 27,
        _ => return KubeProxyVersion::OLDEST,
    };
    KubeProxyVersion::of_minor(minor).unwrap_or(KubeProxyVersion::OLDEST)
}

fn add_base_jumps(
    tables: &mut Vec<RenderedTable>,
    kube_firewall_declared: bool,
    version: KubeProxyVersion,
) {
    tables.push(RenderedTable::new("mangle"));
    for t in tables.iter_mut() {
        let mut chains = String::new();
        let mut rules = TextBuf::default();
        for (table, builtins) in BUILTIN_CHAINS {
            if *table == t.name {
                for b in *builtins {
                    let _ = writeln!(chains, ":{b} ACCEPT [0:0]");
                }
            }
        }
        chains.push_str(":KUBE-PROXY-CANARY - [0:0]\n");
        if t.name == "filter" && !kube_firewall_declared && version.writes_kube_firewall() {
            chains.push_str(":KUBE-FIREWALL - [0:0]\n");
        }
        if t.name == "nat" && !version.drops_in_filter_table() {
            // Ensured (empty) by kube-proxy for its drop jumps; kubelet fills it.
            chains.push_str(":KUBE-MARK-DROP - [0:0]\n");
        }
        for (table, chain, extra, comment, target) in BASE_JUMPS {
            if *table != t.name || version < base_jump_since(target) {
                continue;
            }
            let mut l = Line::start(&mut rules, chain);
            if !extra.is_empty() {
                l = l.w(extra);
            }
            if !comment.is_empty() {
                l = l.comment_q(&[comment]);
            }
            l.ws(&["-j", target]).end();
        }
        t.chain_lines.prepend(chains);
        t.rule_lines.prepend(rules.current);
    }
}

/// Service ports by name, for lookups.
pub fn plans_by_name(plan: &ServicePlan) -> HashMap<&str, &ServicePortPlan> {
    plan.ports
        .iter()
        .map(|p| (p.info.name_string.as_str(), p))
        .collect()
}
