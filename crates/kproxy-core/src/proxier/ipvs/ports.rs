//! The service ports and endpoint sets the IPVS proxier works from, built on the mode-independent
//! [`crate::proxier::service_port`] and [`crate::proxier::endpoints`] modules.

use crate::proxier::endpoints::{self, CategorizeInput, Categorized, Endpoint};
use crate::proxier::service_port::{self, ServicePortInfo};
use crate::state::ip::IpFamily;
use crate::state::{ClusterState, Warning};
use kproxy_parsers::ipvsadm::Protocol;

/// One service port with its endpoints and their categorisation.
#[derive(Debug, Clone)]
pub struct PortView {
    /// The service port.
    pub info: ServicePortInfo,
    /// All endpoints of the port (any condition), sorted by `ip:port`.
    pub endpoints: Vec<Endpoint>,
    /// kube-proxy's `CategorizeEndpoints` result (indices into `endpoints`).
    pub categorized: Categorized,
}

impl PortView {
    /// The protocol in ipvsadm's terms.
    pub fn protocol(&self) -> Protocol {
        match self.info.name.protocol {
            service_port::Protocol::Tcp => Protocol::Tcp,
            service_port::Protocol::Udp => Protocol::Udp,
            service_port::Protocol::Sctp => Protocol::Sctp,
        }
    }

    /// The endpoints backing a virtual server (`pkg/proxy/ipvs/proxier.go` `syncEndpoint`): with a Local policy the local
    /// endpoints, falling back to the cluster endpoints when there is none (PR #97081).
    pub fn backends(&self, local_policy: bool) -> Vec<&Endpoint> {
        let c = &self.categorized;
        let idx = if local_policy && !c.local.is_empty() {
            &c.local
        } else {
            &c.cluster
        };
        idx.iter()
            .filter_map(|i| self.endpoints.get(*i as usize))
            .collect()
    }
}

/// Node facts the categorisation needs.
#[derive(Debug, Clone, Copy)]
pub struct NodeView<'a> {
    /// Node name.
    pub name: &'a str,
    /// Node zone ("" when unknown).
    pub zone: &'a str,
    /// Feature gate `PreferSameTrafficDistribution`.
    pub node_hints_enabled: bool,
    /// Feature gate `AllowServiceExternalIPs` (1.36; off: `spec.externalIPs` get nothing).
    pub allows_external_ips: bool,
}

/// Every service port of `family`, sorted by service port name, with its endpoints.
pub fn service_ports(
    state: &ClusterState,
    family: IpFamily,
    node: NodeView<'_>,
    warnings: &mut Vec<Warning>,
) -> Vec<PortView> {
    let eps = endpoints::endpoints_map(&state.endpoint_slices, family, node.name, warnings);
    let mut out = Vec::new();
    for svc in state
        .services
        .iter()
        .filter(|s| !service_port::ignored_by_labels(&s.metadata))
    {
        for mut info in service_port::service_ports(svc, family, warnings) {
            if !node.allows_external_ips {
                info.external_ips.clear();
            }
            let endpoints = eps.get(&info.name).cloned().unwrap_or_default();
            let categorized = endpoints::categorize(
                &endpoints,
                &CategorizeInput {
                    uses_cluster: info.uses_cluster_endpoints(),
                    uses_local: info.uses_local_endpoints(),
                    node_name: node.name,
                    zone: node.zone,
                    node_hints_enabled: node.node_hints_enabled,
                },
            );
            out.push(PortView {
                info,
                endpoints,
                categorized,
            });
        }
    }
    out.sort_by(|a, b| a.info.name.cmp(&b.info.name));
    out
}
