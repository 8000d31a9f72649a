//! Cluster state (Services, EndpointSlices, Nodes), KubeProxyConfiguration and node facts.
//!
//! Everything that feeds the proxier emulation is gathered here, whatever its source
//! (files given with `--state`/`--config`, a support bundle, or the live API).

use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The API objects kube-proxy watches, as k8s-openapi types.
#[derive(Debug, Clone, Default)]
pub struct ClusterState {
    /// Services (core/v1), all namespaces.
    pub services: Vec<Service>,
    /// EndpointSlices (discovery.k8s.io/v1), all namespaces.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Nodes (core/v1).
    pub nodes: Vec<Node>,
}
