//! Node facts: what kube-proxy learns about its node at start-up (name, IPs, zone, pod CIDRs) and
//! from the kernel (iptables `--random-fully`, nfacct counters, `nf_conntrack_tcp_be_liberal`).
//! Built from the command-line flags, the Node object and the configuration.

use super::config::ProxyConfig;
use super::ip::{Cidr, IpFamily, parse_ip_sloppy};
use super::{ClusterState, Warning};
use crate::state::version::KubeProxyVersion;
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The nfacct counter kube-proxy counts INVALID drops with.
pub const NFACCT_CT_STATE_INVALID: &str = "ct_state_invalid_dropped_pkts";
/// The nfacct counter kube-proxy counts accepted localhost NodePort packets with.
pub const NFACCT_LOCALHOST_NODEPORTS: &str = "localhost_nps_accepted_pkts";
/// The Node label holding the node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// Everything about the node that shapes the rules, for one IP family.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NodeFacts {
    /// The node name (trimmed, lower-cased), as matched against `endpoints[].nodeName`.
    pub node_name: String,
    /// The IP family being rendered.
    pub family: IpFamily,
    /// The node's IPs (both families; the first of each family is that family's primary).
    pub node_ips: Vec<IpAddr>,
    /// The node's zone (`topology.kubernetes.io/zone`), for topology hints.
    pub zone: Option<String>,
    /// The Node's `spec.podCIDRs` (NodeCIDR local-traffic detection).
    pub pod_cidrs: Vec<Cidr>,
    /// Whether iptables supports `--random-fully`.
    pub random_fully: bool,
    /// Whether the `ct_state_invalid_dropped_pkts` nfacct counter exists.
    pub nfacct_ct_state_invalid: bool,
    /// Whether the `localhost_nps_accepted_pkts` nfacct counter exists.
    pub nfacct_localhost_nodeports: bool,
    /// Whether the two above are known (`--nfacct`), not kube-proxy's defaults: only then is a
    /// rule's nfacct match compared.
    pub nfacct_known: bool,
    /// Whether `nf_conntrack_tcp_be_liberal` is set (no INVALID drop rule then).
    pub tcp_be_liberal: bool,
    /// The masquerade mark text used in rules (`0x00004000` by default).
    pub masquerade_mark: String,
    /// `bindAddress` when it is a specific address (it overrides the primary node IP).
    pub bind_address: Option<IpAddr>,
    /// The kube-proxy release whose rules are rendered ([`KubeProxyVersion::DEFAULT`] unless
    /// told).
    pub kube_proxy_version: KubeProxyVersion,
    /// Feature gates given on the command line (`--feature-gates`): they override the
    /// configuration's `featureGates` ([`ProxyConfig::with_feature_gates`]).
    pub feature_gates: std::collections::BTreeMap<String, bool>,
}

impl NodeFacts {
    /// Facts for a node named `node_name`, with kube-proxy's defaults for everything else.
    pub fn new(node_name: &str, family: IpFamily) -> NodeFacts {
        NodeFacts {
            node_name: node_name.trim().to_lowercase(),
            family,
            node_ips: Vec::new(),
            zone: None,
            pod_cidrs: Vec::new(),
            random_fully: true,
            nfacct_ct_state_invalid: true,
            nfacct_localhost_nodeports: true,
            nfacct_known: false,
            tcp_be_liberal: false,
            masquerade_mark: ProxyConfig::default().masquerade_mark(),
            bind_address: None,
            kube_proxy_version: KubeProxyVersion::DEFAULT,
            feature_gates: std::collections::BTreeMap::new(),
        }
    }

    /// The primary node IP of the rendered family (bindAddress if specific, else the first node IP
    /// of the family, else the loopback address, as kube-proxy falls back).
    pub fn primary_ip(&self) -> IpAddr {
        if let Some(b) = self.bind_address
            && IpFamily::of(&b) == self.family
        {
            return b;
        }
        self.node_ips
            .iter()
            .find(|ip| IpFamily::of(ip) == self.family)
            .copied()
            .unwrap_or(match self.family {
                IpFamily::V4 => IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpFamily::V6 => IpAddr::V6(Ipv6Addr::LOCALHOST),
            })
    }

    /// The node's interface addresses as kube-proxy sees them for `nodePortAddresses`: the node IPs
    /// plus the loopback addresses every Linux node has.
    pub fn local_addresses(&self) -> Vec<IpAddr> {
        let mut v = self.node_ips.clone();
        for lo in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ] {
            if !v.contains(&lo) {
                v.push(lo);
            }
        }
        v
    }
}

/// What the caller knows of the node (from flags, a bundle, a test): [`build`] completes it from
/// the state's Node object and the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInputs {
    /// The node's name (default: the config's hostnameOverride, else the state's only Node).
    pub node: Option<String>,
    /// The node's IPs (default: the Node object's addresses).
    pub node_ips: Vec<IpAddr>,
    /// The family to render; `None` picks the cluster's ([`cluster_family`]).
    pub family: Option<IpFamily>,
    /// Whether the node's iptables supports `--random-fully`.
    pub random_fully: bool,
    /// The nfacct counters present; `None` means both of kube-proxy's.
    pub nfacct: Option<Vec<String>>,
    /// Whether `net.netfilter.nf_conntrack_tcp_be_liberal` is set.
    pub tcp_be_liberal: bool,
    /// The masquerade mark text to use instead of the configuration's.
    pub masquerade_mark: Option<String>,
    /// The node is deliberately not one of the state's Nodes (its facts come from
    /// [`NodeInputs::node_ips`]): no "not found" error.
    pub not_in_state: bool,
    /// The kube-proxy release whose rules to expect; `None` means [`KubeProxyVersion::DEFAULT`].
    pub kube_proxy_version: Option<KubeProxyVersion>,
    /// Feature gates that override the configuration's (`--feature-gates`).
    pub feature_gates: std::collections::BTreeMap<String, bool>,
}

impl Default for NodeInputs {
    /// Nothing known: kube-proxy's defaults (`--random-fully` supported, both nfacct counters).
    fn default() -> Self {
        NodeInputs {
            node: None,
            node_ips: Vec::new(),
            family: None,
            random_fully: true,
            nfacct: None,
            tcp_be_liberal: false,
            masquerade_mark: None,
            not_in_state: false,
            kube_proxy_version: None,
            feature_gates: std::collections::BTreeMap::new(),
        }
    }
}

/// Why node facts could not be determined.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// No node name from `--node`, `hostnameOverride` or a single Node object.
    #[error(
        "cannot tell which node to render for: pass --node NAME (or set hostnameOverride in the config)"
    )]
    NoNodeName,
    /// The node is not one of the state's Nodes: facts made up for it would be wrong.
    #[error(
        "node {name:?} not found in the state; it has: {known} (a node the state does not list needs --node-ip and --node-not-in-state)"
    )]
    UnknownNode {
        /// The name asked for.
        name: String,
        /// The state's node names, comma-separated.
        known: String,
    },
}

/// The addresses of a Node object, kube-proxy's preference: InternalIP first, then ExternalIP.
pub fn node_addresses(node: &Node) -> Vec<IpAddr> {
    let addrs = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.as_slice())
        .unwrap_or(&[]);
    let mut out = Vec::new();
    for kind in ["InternalIP", "ExternalIP"] {
        for a in addrs.iter().filter(|a| a.type_ == kind) {
            if let Some(ip) = parse_ip_sloppy(&a.address)
                && !out.contains(&ip)
            {
                out.push(ip);
            }
        }
    }
    out
}

/// Builds the node facts from what the caller knows, the state's Node object and the
/// configuration. A node the state does not list (when it lists any) is an error unless
/// [`NodeInputs::not_in_state`] says so.
pub fn build(
    args: &NodeInputs,
    state: &ClusterState,
    config: &ProxyConfig,
) -> Result<(NodeFacts, Vec<Warning>), NodeError> {
    let mut warnings = Vec::new();
    let family = args.family.unwrap_or_else(|| cluster_family(state));
    let name = match args
        .node
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty())
    {
        Some(n) => n.to_lowercase(),
        None if !config.hostname_override.is_empty() => config.hostname_override.clone(),
        None => match state.nodes.as_slice() {
            [only] => super::load::node_key(only).trim().to_lowercase(),
            _ => return Err(NodeError::NoNodeName),
        },
    };
    let mut facts = NodeFacts::new(&name, family);
    let node = state
        .nodes
        .iter()
        .find(|n| super::load::node_key(n).trim().eq_ignore_ascii_case(&name));
    if node.is_none() && !state.nodes.is_empty() && !args.not_in_state {
        let known: Vec<String> = state
            .nodes
            .iter()
            .map(|n| super::load::node_key(n).trim().to_string())
            .collect();
        return Err(NodeError::UnknownNode {
            name,
            known: known.join(", "),
        });
    }

    if args.node_ips.is_empty() {
        match node {
            Some(n) => facts.node_ips = node_addresses(n),
            None => tracing::info!(
                "Node {name} is not in the state and no --node-ip was given: \
                 loadBalancerSourceRanges and nodePortAddresses see no node address"
            ),
        }
    } else {
        for &ip in &args.node_ips {
            if !facts.node_ips.contains(&ip) {
                facts.node_ips.push(ip);
            }
        }
    }
    if let Some(n) = node {
        facts.zone = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(ZONE_LABEL))
            .cloned();
        let cidrs = n
            .spec
            .as_ref()
            .and_then(|s| {
                s.pod_cidrs
                    .clone()
                    .or_else(|| s.pod_cidr.clone().map(|c| vec![c]))
            })
            .unwrap_or_default();
        for c in cidrs {
            match Cidr::parse_sloppy(c.trim()) {
                Some(c) => facts.pod_cidrs.push(c),
                None => warnings.push(Warning::new(
                    format!("Node {name}"),
                    format!("spec.podCIDRs entry {c:?} is not a CIDR; ignored"),
                )),
            }
        }
    }
    facts.bind_address =
        parse_ip_sloppy(config.bind_address.trim()).filter(|ip| !ip.is_unspecified());
    facts.random_fully = args.random_fully;
    if let Some(v) = args.kube_proxy_version {
        facts.kube_proxy_version = v;
    }
    facts.feature_gates = args.feature_gates.clone();
    facts.tcp_be_liberal = args.tcp_be_liberal || config.tcp_be_liberal;
    facts.masquerade_mark = match &args.masquerade_mark {
        Some(m) => m.clone(),
        None => config.masquerade_mark(),
    };
    facts.nfacct_known = args.nfacct.is_some();
    if let Some(counters) = &args.nfacct {
        facts.nfacct_ct_state_invalid = false;
        facts.nfacct_localhost_nodeports = false;
        for c in counters {
            match c.as_str() {
                NFACCT_CT_STATE_INVALID => facts.nfacct_ct_state_invalid = true,
                NFACCT_LOCALHOST_NODEPORTS => facts.nfacct_localhost_nodeports = true,
                other => warnings.push(Warning::new(
                    "--nfacct",
                    format!("{other:?} is not a counter kube-proxy uses; ignored"),
                )),
            }
        }
    }
    Ok((facts, warnings))
}

/// The family of the cluster's Service cluster IPs when every Service with a cluster IP has one
/// family only (a single-stack IPv6 cluster renders IPv6 without being told); IPv4 otherwise.
pub fn cluster_family(state: &ClusterState) -> IpFamily {
    let mut v4 = false;
    let mut v6 = false;
    for s in &state.services {
        let Some(spec) = &s.spec else { continue };
        let ips = spec
            .cluster_ips
            .iter()
            .flatten()
            .chain(spec.cluster_ip.iter())
            .filter_map(|ip| super::ip::parse_ip_sloppy(ip));
        for ip in ips {
            match IpFamily::of(&ip) {
                IpFamily::V4 => v4 = true,
                IpFamily::V6 => v6 = true,
            }
        }
    }
    if v6 && !v4 {
        IpFamily::V6
    } else {
        IpFamily::V4
    }
}
