//! What kube-proxy's nftables proxier decides, before any text: node-wide facts (mark, detector,
//! NodePort addresses, service CIDRs) and, per service port, the endpoints, chain and set names
//! and the flags `syncProxyRules` computes (`usesClusterPolicyChain`, `hasInternalEndpoints`, …).
//!
//! The service ports, endpoints and their categorisation are the shared ones of every proxier
//! ([`crate::proxier::iptables::decide_each`], built on `service_port` and `endpoints`); only what
//! differs in nftables mode is decided here.

use super::names::{self, ChainNames};
use super::objects::TableFamily;
use crate::proxier::endpoints::{Categorized, Endpoint, EndpointDetail};
use crate::proxier::iptables::{self, ServiceDecisions, ServicePortDecisions};
use crate::proxier::service_port::{Protocol, ServicePortInfo};
use crate::state::config::{DetectLocalMode, ProxyConfig};
use crate::state::ip::{Cidr, IpFamily};
use crate::state::node::NodeFacts;
use crate::state::version::KubeProxyVersion;
use crate::state::{ClusterState, Warning};
use serde::Serialize;
use std::net::IpAddr;

/// How pod traffic is recognised, as nftables rule text (`localdetector.go` `IfLocalNFT` /
/// `IfNotLocalNFT`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum LocalDetector {
    /// No detector for this family: no masquerade rule for cluster IPs, no pod short-circuit.
    NoOp,
    /// Source CIDR: `ip saddr C` / `ip saddr != C`.
    Cidr {
        /// `ip` or `ip6`.
        family: TableFamily,
        /// The CIDR.
        cidr: String,
    },
    /// Input interface name (`detectLocal.bridgeInterface`) or prefix
    /// (`detectLocal.interfaceNamePrefix`, written `P*`): `iifname X` / `iifname != X`.
    /// kube-proxy wrote `iif` until kubernetes#134024, which nft rejects for names that do not
    /// exist yet and for wildcards; the fixed form is what kube-proxy writes now.
    Interface(String),
}

impl LocalDetector {
    /// The detector for the configuration's `detectLocalMode` (the same choice as the iptables
    /// proxier's, written for nftables).
    pub fn new(config: &ProxyConfig, iptables_form: &iptables::LocalDetector) -> LocalDetector {
        match iptables_form {
            iptables::LocalDetector::NoOp => LocalDetector::NoOp,
            iptables::LocalDetector::Cidr(c) => LocalDetector::Cidr {
                family: if c.contains(':') {
                    TableFamily::Ip6
                } else {
                    TableFamily::Ip
                },
                cidr: c.clone(),
            },
            iptables::LocalDetector::Interface(name) => {
                if config.detect_local_mode == DetectLocalMode::InterfaceNamePrefix {
                    LocalDetector::Interface(format!("{}*", config.interface_name_prefix))
                } else {
                    LocalDetector::Interface(name.clone())
                }
            }
        }
    }

    /// Whether the detector matches anything (`IsImplemented`).
    pub fn is_implemented(&self) -> bool {
        !matches!(self, LocalDetector::NoOp)
    }

    /// Appends the match for traffic from a local pod (`IfLocalNFT`).
    pub fn push_if_local(&self, out: &mut String) {
        self.push(out, false);
    }

    /// Appends the match for traffic not from a local pod (`IfNotLocalNFT`).
    pub fn push_if_not_local(&self, out: &mut String) {
        self.push(out, true);
    }

    fn push(&self, out: &mut String, negate: bool) {
        let value = match self {
            LocalDetector::NoOp => return,
            LocalDetector::Cidr { family, cidr } => {
                out.push_str(family.as_str());
                out.push_str(" saddr ");
                cidr
            }
            LocalDetector::Interface(name) => {
                out.push_str("iifname ");
                name
            }
        };
        if negate {
            out.push_str("!= ");
        }
        out.push_str(value);
    }
}

/// Node-wide facts of one family's table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeDecisions {
    /// The IP family.
    pub family: IpFamily,
    /// `ip` or `ip6`.
    pub table_family: TableFamily,
    /// The masquerade mark as written in rules (`0x00004000`).
    pub masquerade_mark: String,
    /// `masqueradeAll`: every cluster-IP connection is masqueraded.
    pub masquerade_all: bool,
    /// The local-traffic detector.
    pub local_detector: LocalDetector,
    /// nodePortAddresses matches every address of the family (no `nodeport-ips` set).
    pub node_ports_match_all: bool,
    /// Otherwise: the `nodeport-ips` elements (loopback addresses are never added).
    pub node_port_ips: Vec<IpAddr>,
    /// The family's ServiceCIDRs: traffic to unallocated cluster IPs in them is dropped.
    pub service_cidrs: Vec<String>,
    /// The primary node IP (`allowFromNode` of loadBalancerSourceRanges).
    pub node_ip: IpAddr,
    /// The kube-proxy release whose table is written.
    pub version: KubeProxyVersion,
    /// The release's layout choices ([`Layout`]).
    pub layout: Layout,
}

/// What the release (and its feature gates) change in the table's shape
/// (`crate::proxier::version` switches, read once per render).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// 1.36: inline marks, `hairpin-connections`, service chains DNAT through a `numgen` map,
    /// endpoint chains only for ClientIP affinity.
    pub dnats_in_service_chains: bool,
    /// 1.37: one endpoint: `dnat to IP:PORT`.
    pub dnats_single_endpoint_directly: bool,
    /// 1.37: element comments cut to 128 bytes.
    pub truncates_element_comments: bool,
    /// `KubeProxyNFTablesLocalhostNodePorts` on: the protocols whose localhost NodePorts are
    /// rejected, in kube-proxy's order (TCP, UDP, SCTP; TCP not when the localhost NodePort
    /// proxy runs); empty when the gate is off.
    pub localhost_rejected: Vec<Protocol>,
}

impl Layout {
    /// The layout of `version` under `config`'s gates; `explicit_loopback`: nodePortAddresses
    /// name a loopback range of this family without matching everything, so kube-proxy runs its
    /// userspace localhost NodePort proxy (`useLocalhostNodePortProxy`).
    pub fn new(version: KubeProxyVersion, config: &ProxyConfig, explicit_loopback: bool) -> Layout {
        let localhost_rejected = if !version.rejects_localhost_nodeports(config) {
            Vec::new()
        } else if explicit_loopback {
            vec![Protocol::Udp, Protocol::Sctp]
        } else {
            vec![Protocol::Tcp, Protocol::Udp, Protocol::Sctp]
        };
        Layout {
            dnats_in_service_chains: version.dnats_in_service_chains(),
            dnats_single_endpoint_directly: version.dnats_single_endpoint_directly(),
            truncates_element_comments: version.truncates_element_comments(),
            localhost_rejected,
        }
    }
}

impl NodeDecisions {
    fn new(
        decisions: &ServiceDecisions,
        config: &ProxyConfig,
        facts: &NodeFacts,
        service_cidrs: Vec<String>,
    ) -> NodeDecisions {
        NodeDecisions {
            family: decisions.family,
            table_family: match decisions.family {
                IpFamily::V4 => TableFamily::Ip,
                IpFamily::V6 => TableFamily::Ip6,
            },
            masquerade_mark: facts.masquerade_mark.clone(),
            masquerade_all: config.masquerade_all,
            local_detector: LocalDetector::new(config, &decisions.local_detector),
            node_ports_match_all: decisions.node_ports_match_all,
            node_port_ips: decisions
                .node_port_ips
                .iter()
                .filter(|ip| !ip.is_loopback())
                .copied()
                .collect(),
            service_cidrs,
            node_ip: facts.primary_ip(),
            version: facts.kube_proxy_version,
            layout: Layout::new(
                facts.kube_proxy_version,
                &config.with_feature_gates(&facts.feature_gates),
                decisions.node_ports_explicit_loopback,
            ),
        }
    }
}

/// Where traffic with no endpoint to go to ends (`internalTrafficFilterVerdict` /
/// `externalTrafficFilterVerdict`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum FilterVerdict {
    /// No endpoints at all: `goto reject-chain`.
    Reject,
    /// No endpoints for this traffic policy (Local without local endpoints): `drop`.
    Drop,
}

impl FilterVerdict {
    /// The map value text.
    pub fn as_str(self) -> &'static str {
        match self {
            FilterVerdict::Reject => "goto reject-chain",
            FilterVerdict::Drop => "drop",
        }
    }
}

/// Everything `syncProxyRules` decides for one service port.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PortDecisions {
    /// The service port.
    pub info: ServicePortInfo,
    /// All its endpoints of this family, sorted by `ip:port`.
    pub endpoints: Vec<Endpoint>,
    /// Cluster / local / locally reachable endpoints (indexes into `endpoints`).
    pub categorized: Categorized,
    /// Per endpoint (parallel to `endpoints`): the base of its `endpoint-` chain and
    /// `affinity-` set, for the locally reachable ones.
    pub endpoint_bases: Vec<Option<String>>,
    /// The service port's chain names.
    pub chains: ChainNames,
    /// The service has usable endpoints anywhere (`hasEndpoints`).
    pub has_endpoints: bool,
    /// The `service-` chain exists.
    pub uses_cluster_policy_chain: bool,
    /// The `local-` chain exists.
    pub uses_local_policy_chain: bool,
    /// Cluster-IP traffic has endpoints to go to.
    pub has_internal_endpoints: bool,
    /// External traffic has endpoints to go to.
    pub has_external_endpoints: bool,
    /// The `external-` chain exists.
    pub uses_external_traffic_chain: bool,
    /// The `firewall-` chain exists (LoadBalancer IPs with source ranges, endpoints or not).
    pub uses_fw_chain: bool,
    /// A source range holds the node IP: the LoadBalancer IPs are allowed sources too.
    pub allow_from_node: bool,
    /// Verdict for cluster-IP traffic without endpoints.
    pub internal_filter_verdict: Option<FilterVerdict>,
    /// Verdict for external traffic without endpoints.
    pub external_filter_verdict: Option<FilterVerdict>,
}

impl PortDecisions {
    /// Decides for one service port from the shared decisions (`syncProxyRules`, per service port).
    pub fn new(shared: ServicePortDecisions, node: &NodeDecisions) -> PortDecisions {
        let ServicePortDecisions {
            info,
            endpoints,
            categorized,
            ..
        } = shared;
        let mut endpoint_bases: Vec<Option<String>> = vec![None; endpoints.len()];
        for &i in &categorized.reachable {
            if let (Some(slot), Some(e)) = (
                endpoint_bases.get_mut(i as usize),
                endpoints.get(i as usize),
            ) {
                *slot = Some(names::endpoint_chain_name_base(&info.name, &e.endpoint));
            }
        }
        let chains = ChainNames::new(&info.name);
        let has_endpoints = categorized.has_any;
        let uses_cluster_policy_chain =
            !categorized.cluster.is_empty() && info.uses_cluster_endpoints();
        let uses_local_policy_chain = !categorized.local.is_empty() && info.uses_local_endpoints();
        let has_internal_endpoints =
            has_endpoints && !(info.internal_policy_local && categorized.local.is_empty());
        let has_external_endpoints =
            has_endpoints && !(info.external_policy_local && categorized.local.is_empty());
        let uses_external_traffic_chain = has_endpoints && info.externally_accessible();
        let (internal_filter_verdict, external_filter_verdict) = if !has_endpoints {
            (Some(FilterVerdict::Reject), Some(FilterVerdict::Reject))
        } else {
            (
                (!has_internal_endpoints).then_some(FilterVerdict::Drop),
                (!has_external_endpoints).then_some(FilterVerdict::Drop),
            )
        };
        let uses_fw_chain =
            !info.load_balancer_vips.is_empty() && !info.load_balancer_source_ranges.is_empty();
        let allow_from_node = info
            .load_balancer_source_ranges
            .iter()
            .any(|c| c.contains(&node.node_ip));
        PortDecisions {
            info,
            endpoints,
            categorized,
            endpoint_bases,
            chains,
            has_endpoints,
            uses_cluster_policy_chain,
            uses_local_policy_chain,
            has_internal_endpoints,
            has_external_endpoints,
            uses_external_traffic_chain,
            uses_fw_chain,
            allow_from_node,
            internal_filter_verdict,
            external_filter_verdict,
        }
    }

    /// The chain cluster-IP traffic goes to (`internalTrafficChain`).
    pub fn internal_traffic_chain(&self) -> &str {
        if self.info.internal_policy_local {
            &self.chains.local_policy
        } else {
            &self.chains.cluster_policy
        }
    }

    /// The chain the `external-` chain ends in (`externalPolicyChain`).
    pub fn external_policy_chain(&self) -> &str {
        if self.info.external_policy_local {
            &self.chains.local_policy
        } else {
            &self.chains.cluster_policy
        }
    }

    /// The `endpoint-`/`affinity-` base of endpoint `i` (a locally reachable one).
    pub fn endpoint_base(&self, i: u32) -> &str {
        self.endpoint_bases
            .get(i as usize)
            .and_then(|b| b.as_deref())
            .unwrap_or("")
    }
}

/// Everything kube-proxy decides for one family's table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TableDecisions {
    /// Node-wide facts.
    pub node: NodeDecisions,
    /// Per service port, sorted by (namespace, name, port name, protocol).
    pub ports: Vec<PortDecisions>,
    /// Objects skipped and oddities kube-proxy would log.
    pub warnings: Vec<Warning>,
}

/// The family's ServiceCIDRs as kube-proxy's `OnServiceCIDRsChanged` keeps them: every CIDR of
/// every ServiceCIDR object once, this family's only, as written. kube-proxy's list comes from
/// a Go set (no order); here it is sorted, so renders are stable.
pub fn service_cidrs(
    state: &ClusterState,
    family: IpFamily,
    warnings: &mut Vec<Warning>,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for sc in &state.service_cidrs {
        let label = || {
            format!(
                "ServiceCIDR {}",
                sc.metadata.name.as_deref().unwrap_or_default()
            )
        };
        for c in sc
            .spec
            .as_ref()
            .and_then(|s| s.cidrs.as_deref())
            .unwrap_or(&[])
        {
            match Cidr::parse_sloppy(c) {
                Some(cidr) if cidr.family() == family => out.push(c.clone()),
                Some(_) => {}
                None => warnings.push(Warning::new(
                    label(),
                    format!("spec.cidrs entry {c:?} is not a CIDR; ignored"),
                )),
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Decides for the table one service port at a time, in render order: `each` gets the node-wide
/// decisions and each port's. Returns the node-wide decisions and the warnings.
///
/// `config` is the configuration as kube-proxy reads it in nftables mode
/// ([`ProxyConfig::for_nftables`]); `facts.masquerade_mark` the mark to write.
pub fn decide_each(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    detail: EndpointDetail,
    each: &mut dyn FnMut(&NodeDecisions, PortDecisions),
) -> (NodeDecisions, Vec<Warning>) {
    let mut warnings = Vec::new();
    let cidrs = service_cidrs(state, facts.family, &mut warnings);
    let mut node: Option<NodeDecisions> = None;
    let mut cidrs = Some(cidrs);
    let shared = iptables::decide_each(state, config, facts, detail, &mut |decisions, port| {
        let node = node.get_or_insert_with(|| {
            NodeDecisions::new(decisions, config, facts, cidrs.take().unwrap_or_default())
        });
        let port = PortDecisions::new(port, node);
        each(node, port);
    });
    let node = node.unwrap_or_else(|| {
        NodeDecisions::new(&shared, config, facts, cidrs.take().unwrap_or_default())
    });
    let mut all = shared.warnings;
    all.append(&mut warnings);
    if !node.version.models_nftables_layout() {
        all.push(Warning::new(
            "kube-proxy version",
            format!(
                "kube-proxy {}'s nftables table is laid out otherwise than this build models (1.34 and later, with the filter-*-pre-dnat base chains): written as 1.35's",
                node.version
            ),
        ));
    }
    (node, all)
}

/// All the decisions, every service port held (for explaining rules; the render streams instead).
pub fn decide(state: &ClusterState, config: &ProxyConfig, facts: &NodeFacts) -> TableDecisions {
    let mut ports = Vec::new();
    let (node, warnings) = decide_each(state, config, facts, EndpointDetail::Full, &mut |_, p| {
        ports.push(p)
    });
    TableDecisions {
        node,
        ports,
        warnings,
    }
}
