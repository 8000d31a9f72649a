//! Cluster state (Services, EndpointSlices, Nodes), KubeProxyConfiguration and node facts.
//!
//! Everything that feeds the proxier emulation is gathered here, whatever its source
//! (files given with `--state`/`--config`, a support bundle, or the live API, which
//! `crate::collect::api` lists).

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;

/// The API objects kube-proxy watches, as k8s-openapi types.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// Services (core/v1), all namespaces.
    pub services: Vec<Service>,
    /// EndpointSlices (discovery.k8s.io/v1), all namespaces.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Nodes (core/v1).
    pub nodes: Vec<Node>,
    /// ServiceCIDRs (networking.k8s.io/v1): the nftables proxier drops traffic to their
    /// unallocated addresses.
    pub service_cidrs: Vec<ServiceCIDR>,
    /// Objects the API server would have rejected, left out of the lists above when the state
    /// was loaded ([`validate::leave_out_invalid`]).
    pub invalid: Vec<validate::InvalidObject>,
}

/// The inputs of the proxier emulation: what kube-proxy reads (the API objects, its
/// configuration) and the facts of its node.
#[derive(Debug)]
pub struct ProxyInputs {
    /// Services, EndpointSlices, Nodes.
    pub state: ClusterState,
    /// kube-proxy's configuration (defaults when none is given).
    pub config: config::ProxyConfig,
    /// The node facts.
    pub facts: node::NodeFacts,
}

impl ClusterState {
    /// The warnings of the objects left out when the state was loaded, which every render
    /// starts with.
    pub fn invalid_warnings(&self) -> Vec<Warning> {
        self.invalid
            .iter()
            .map(validate::InvalidObject::warning)
            .collect()
    }

    /// Whether the state holds no object at all.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.endpoint_slices.is_empty()
            && self.nodes.is_empty()
            && self.service_cidrs.is_empty()
    }
}

pub mod config;
pub mod duration;
pub mod ip;
pub mod load;
pub mod mode;
pub mod node;
pub mod validate;
pub mod version;

/// Something kube-proxy would ignore (or log) rather than fail on: the object it concerns and why.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Warning {
    /// What the warning is about: `Service ns/name`, `EndpointSlice ns/name`, `file:field`, …
    pub object: String,
    /// What is wrong and what was done about it.
    pub message: String,
}

impl Warning {
    /// A warning about `object`.
    pub fn new(object: impl Into<String>, message: impl Into<String>) -> Warning {
        Warning {
            object: object.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for Warning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.object, self.message)
    }
}
