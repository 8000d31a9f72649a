//! What kube-proxy decides per service port before writing a rule: the service port's facts,
//! its endpoints and their categorisation, chain names, and which chains and filter rules exist
//! (`proxier.go` `syncProxyRules`, the part before the rules are written).

use super::LARGE_CLUSTER_ENDPOINTS_THRESHOLD;
use crate::model::hashing::{EndpointChain, port_proto_hash};
use crate::proxier::endpoints::{
    CategorizeInput, CategorizeRules, Categorized, EarlyRules, Endpoint, EndpointDetail,
    categorize_early, categorize_with, endpoints_map_with,
};
use crate::proxier::service_port::{
    ServicePortInfo, ServicePortName, ignored_by_labels, service_label, service_ports_of_release,
};
use crate::state::config::{DetectLocalMode, ProxyConfig};
use crate::state::ip::{Cidr, IpFamily};
use crate::state::node::NodeFacts;
use crate::state::version::KubeProxyVersion;
use crate::state::{ClusterState, Warning};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

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

    pub(super) fn if_local(&self) -> [&str; 2] {
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

/// Everything kube-proxy decides for one service port (`proxier.go` `syncProxyRules`, before it
/// writes the port's rules).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServicePortDecisions {
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

impl ServicePortDecisions {
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
pub struct ServiceDecisions {
    /// The family.
    pub family: IpFamily,
    /// Per service port, sorted by (namespace, name, port, protocol).
    pub ports: Vec<ServicePortDecisions>,
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
    /// nodePortAddresses name a loopback range of this family without matching everything
    /// (`ContainsExplicitLoopback`: kube-proxy 1.37's nftables userspace localhost NodePorts).
    pub node_ports_explicit_loopback: bool,
    /// Things kube-proxy would skip or log.
    pub warnings: Vec<Warning>,
}

impl ServiceDecisions {
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
        if let Some(cidrs) = crate::state::config::node_port_keyword_cidrs(s) {
            if facts.kube_proxy_version.expands_node_port_keywords() {
                strings.extend(cidrs.iter().filter_map(|c| Cidr::parse_sloppy(c)));
            } else {
                warnings.push(Warning::new(
                    "config nodePortAddresses",
                    format!(
                        "{s:?} is a keyword of kube-proxy 1.37 and later; kube-proxy {} rejects this configuration (ignored here)",
                        facts.kube_proxy_version
                    ),
                ));
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
) -> ServiceDecisions {
    decide_with(state, config, facts, EndpointDetail::Full)
}

/// [`expected_service_ports`] with a choice of endpoint detail ([`EndpointDetail::Lean`] is what
/// [`super::render`] uses: same decisions, no informational copies).
pub fn decide_with(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    detail: EndpointDetail,
) -> ServiceDecisions {
    let (mut decisions, work, decider) = prepare(state, config, facts, detail);
    decisions.ports = work
        .into_iter()
        .map(|(info, endpoints)| decider.decide(info, endpoints))
        .collect();
    decisions
}

/// Decides for the service ports of `facts.family` one at a time, in render order, handing each
/// to `each` together with the node-wide decisions (whose `ports` stays empty), which are
/// returned. Other
/// proxiers (nftables) build on it: the service ports, endpoints and decisions are shared; the
/// `KUBE-SEP-` names are not, so each port's `endpoint_chains` is left empty.
pub fn decide_each(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    detail: EndpointDetail,
    each: &mut dyn FnMut(&ServiceDecisions, ServicePortDecisions),
) -> ServiceDecisions {
    let (decisions, work, decider) = prepare(state, config, facts, detail);
    for (info, endpoints) in work {
        each(
            &decisions,
            decider.decide_without_endpoint_chains(info, endpoints),
        );
    }
    decisions
}

/// Decides per service port (as `syncProxyRules`) from node-wide facts.
pub(super) struct PortDecider<'f> {
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

/// Service ports with their endpoints, plus the node-wide decisions (`ports` empty).
pub(super) type Prepared<'f> = (
    ServiceDecisions,
    Vec<(ServicePortInfo, Vec<Endpoint>)>,
    PortDecider<'f>,
);

pub(super) fn prepare<'f>(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &'f NodeFacts,
    detail: EndpointDetail,
) -> Prepared<'f> {
    // `--feature-gates` wins over the configuration's `featureGates`, as on kube-proxy.
    let gated = config.with_feature_gates(&facts.feature_gates);
    let config: &ProxyConfig = &gated;
    let family = facts.family;
    let version = facts.kube_proxy_version;
    let mut warnings = state.invalid_warnings();
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

    let decisions = ServiceDecisions {
        family,
        ports: Vec::new(),
        total_endpoints,
        large_cluster_mode: total_endpoints > LARGE_CLUSTER_ENDPOINTS_THRESHOLD,
        localhost_node_ports,
        local_detector,
        node_ports_match_all: npa.match_all,
        node_port_ips,
        node_ports_explicit_loopback: !npa.match_all
            && npa.cidrs.iter().any(|c| c.addr.is_loopback()),
        warnings,
    };
    let decider = PortDecider {
        node_name: &facts.node_name,
        zone,
        node_hints_enabled,
        primary,
        masq,
        version,
        terminating_fallback: version.falls_back_to_terminating(config),
    };
    (decisions, work, decider)
}

impl PortDecider<'_> {
    pub(super) fn decide(
        &self,
        info: ServicePortInfo,
        endpoints: Vec<Endpoint>,
    ) -> ServicePortDecisions {
        if !self.version.uses_ext_chains() {
            return self.decide_early(info, endpoints);
        }
        let proto = info.name.protocol.lower();
        let mut decisions = self.decide_without_endpoint_chains(info, endpoints);
        decisions.endpoint_chains = decisions
            .endpoints
            .iter()
            .map(|e| EndpointChain::of(&decisions.info.name_string, proto, &e.endpoint))
            .collect();
        decisions
    }

    fn decide_without_endpoint_chains(
        &self,
        info: ServicePortInfo,
        endpoints: Vec<Endpoint>,
    ) -> ServicePortDecisions {
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
        ServicePortDecisions {
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

    /// [`PortDecider::decide`] for a release before 1.24: the `KUBE-SVC-…` chain serves every
    /// destination, `KUBE-XLB-…` (in [`ChainNames`]' `svl` slot's place, see
    /// [`ServicePortDecisions::xlb_chain`]) the external ones of an `externalTrafficPolicy: Local`
    /// service, and `internalTrafficPolicy: Local` narrows the endpoints instead of choosing a
    /// chain (so it is cleared from `info` once applied).
    fn decide_early(
        &self,
        mut info: ServicePortInfo,
        endpoints: Vec<Endpoint>,
    ) -> ServicePortDecisions {
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
        ServicePortDecisions {
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

/// Service ports by name, for lookups.
pub fn decisions_by_name(decisions: &ServiceDecisions) -> HashMap<&str, &ServicePortDecisions> {
    decisions
        .ports
        .iter()
        .map(|p| (p.info.name_string.as_str(), p))
        .collect()
}
