//! The live form of [`ClusterState`]: Services, EndpointSlices, Nodes and ServiceCIDRs listed
//! through the API (paginated, all namespaces, as kube-proxy's informers see them), and the
//! text of kube-proxy's configuration from its ConfigMap.

use crate::kube_client::{ApiCall, ApiError, Connection};
use crate::state::ClusterState;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;

/// Page size of list calls (`limit`); the server hands back a `continue` token per page.
pub const PAGE_SIZE: u32 = 500;

/// The key of the kube-proxy ConfigMap that holds the KubeProxyConfiguration.
pub const CONFIG_KEY: &str = "config.conf";

/// Errors fetching state from the API.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The API call failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// The ConfigMap exists but has no `config.conf`.
    #[error("ConfigMap {namespace}/{name} has no key {key:?} (keys: {keys})")]
    MissingKey {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The key looked for.
        key: String,
        /// The keys present.
        keys: String,
    },
}

/// Lists every object matching `params`, following `continue` tokens page by page.
pub async fn list_all<K>(
    api: &Api<K>,
    params: &ListParams,
    call: ApiCall,
    server: &str,
) -> Result<Vec<K>, ApiError>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = params.clone();
    if params.limit.is_none() {
        params.limit = Some(PAGE_SIZE);
    }
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| ApiError::classify(e, call.clone(), server))?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => return Ok(out),
        }
    }
}

/// Lists Services and EndpointSlices in all namespaces and all Nodes.
pub async fn fetch_cluster_state(conn: &Connection) -> Result<ClusterState, ApiError> {
    let lp = ListParams::default();
    let services_api = Api::<Service>::all(conn.client.clone());
    let slices_api = Api::<EndpointSlice>::all(conn.client.clone());
    let services = list_all(
        &services_api,
        &lp,
        ApiCall::new("list", "services"),
        &conn.server,
    );
    let slices = list_all(
        &slices_api,
        &lp,
        ApiCall::new("list", "endpointslices.discovery.k8s.io"),
        &conn.server,
    );
    let nodes = list_nodes(conn, None);
    let cidrs = list_service_cidrs(conn);
    let (services, endpoint_slices, nodes, service_cidrs) =
        futures::try_join!(services, slices, nodes, cidrs)?;
    let mut state = ClusterState {
        services,
        endpoint_slices,
        nodes,
        service_cidrs,
        invalid: Vec::new(),
    };
    // What an API endpoint serves is checked as a file is: it may not be a real API server.
    crate::state::validate::leave_out_invalid(&mut state);
    Ok(state)
}

/// The version of `servicecidrs.networking.k8s.io` that kube-proxy reads, as the API server
/// serves it: `v1` from Kubernetes 1.33 (where the API server always makes the default
/// ServiceCIDR), `v1beta1` on 1.31–1.32 (where kube-proxy reads it with the
/// MultiCIDRServiceAllocator gate, `cmd/kube-proxy/app/server.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceCidrApi {
    /// `networking.k8s.io/v1`.
    V1,
    /// `networking.k8s.io/v1beta1`.
    V1beta1,
}

/// The resource in messages and RBAC.
const SERVICE_CIDRS: &str = "servicecidrs.networking.k8s.io";

/// Which version of ServiceCIDRs the API server serves: `v1`, else `v1beta1`, else `None`
/// (a 404 for both: a server from before ServiceCIDRs, whose clusters have none).
pub async fn service_cidr_api(conn: &Connection) -> Result<Option<ServiceCidrApi>, ApiError> {
    use k8s_openapi::api::networking::{v1, v1beta1};
    let one = ListParams::default().limit(1);
    let call = || ApiCall::new("list", SERVICE_CIDRS);
    let classify = |e| ApiError::classify(e, call(), &conn.server);
    match Api::<v1::ServiceCIDR>::all(conn.client.clone())
        .list(&one)
        .await
    {
        Ok(_) => return Ok(Some(ServiceCidrApi::V1)),
        Err(e) => match classify(e) {
            ApiError::NotFound { .. } => {}
            other => return Err(other),
        },
    }
    match Api::<v1beta1::ServiceCIDR>::all(conn.client.clone())
        .list(&one)
        .await
    {
        Ok(_) => Ok(Some(ServiceCidrApi::V1beta1)),
        Err(e) => match classify(e) {
            ApiError::NotFound { .. } => Ok(None),
            other => Err(other),
        },
    }
}

/// Lists the ServiceCIDRs in the version the API server serves ([`service_cidr_api`]); none on
/// a server without them. Any other failure is an error: without them the render would lack
/// kube-proxy's rule dropping traffic to unallocated cluster IPs, and verify, repair and
/// resync would take that rule of kube-proxy's for drift.
pub async fn list_service_cidrs(
    conn: &Connection,
) -> Result<Vec<k8s_openapi::api::networking::v1::ServiceCIDR>, ApiError> {
    use k8s_openapi::api::networking::{v1, v1beta1};
    let lp = ListParams::default();
    let call = ApiCall::new("list", SERVICE_CIDRS);
    match service_cidr_api(conn).await? {
        Some(ServiceCidrApi::V1) => {
            list_all(
                &Api::<v1::ServiceCIDR>::all(conn.client.clone()),
                &lp,
                call,
                &conn.server,
            )
            .await
        }
        Some(ServiceCidrApi::V1beta1) => Ok(list_all(
            &Api::<v1beta1::ServiceCIDR>::all(conn.client.clone()),
            &lp,
            call,
            &conn.server,
        )
        .await?
        .into_iter()
        .map(service_cidr_from_beta)
        .collect()),
        None => Ok(Vec::new()),
    }
}

/// A `v1beta1` ServiceCIDR as the `v1` one it stands for (the same fields).
pub fn service_cidr_from_beta(
    beta: k8s_openapi::api::networking::v1beta1::ServiceCIDR,
) -> k8s_openapi::api::networking::v1::ServiceCIDR {
    use k8s_openapi::api::networking::v1;
    v1::ServiceCIDR {
        metadata: beta.metadata,
        spec: beta.spec.map(|s| v1::ServiceCIDRSpec { cidrs: s.cidrs }),
        status: beta.status.map(|s| v1::ServiceCIDRStatus {
            conditions: s.conditions,
        }),
    }
}

/// Lists Nodes, optionally filtered by a label selector (`-l`).
pub async fn list_nodes(conn: &Connection, selector: Option<&str>) -> Result<Vec<Node>, ApiError> {
    let mut lp = ListParams::default();
    if let Some(s) = selector {
        lp = lp.labels(s);
    }
    list_all(
        &Api::<Node>::all(conn.client.clone()),
        &lp,
        ApiCall::new("list", "nodes"),
        &conn.server,
    )
    .await
}

/// Lists the names of all namespaces (for shell completion).
pub async fn list_namespace_names(conn: &Connection) -> Result<Vec<String>, ApiError> {
    let items = list_all(
        &Api::<Namespace>::all(conn.client.clone()),
        &ListParams::default(),
        ApiCall::new("list", "namespaces"),
        &conn.server,
    )
    .await?;
    Ok(items.into_iter().filter_map(|n| n.metadata.name).collect())
}

/// Lists the names of the Services of one namespace (for shell completion).
pub async fn list_service_names(
    conn: &Connection,
    namespace: &str,
) -> Result<Vec<String>, ApiError> {
    let items = list_all(
        &Api::<Service>::namespaced(conn.client.clone(), namespace),
        &ListParams::default(),
        ApiCall::new("list", "services").in_namespace(namespace),
        &conn.server,
    )
    .await?;
    Ok(items.into_iter().filter_map(|s| s.metadata.name).collect())
}

/// Lists pods of `namespace` matching a label selector and running on `node`.
pub async fn list_pods_on_node(
    conn: &Connection,
    namespace: &str,
    label_selector: &str,
    node: &str,
) -> Result<Vec<Pod>, ApiError> {
    let lp = ListParams::default()
        .labels(label_selector)
        .fields(&format!("spec.nodeName={node}"));
    list_all(
        &Api::<Pod>::namespaced(conn.client.clone(), namespace),
        &lp,
        ApiCall::new("list", "pods").in_namespace(namespace),
        &conn.server,
    )
    .await
}

/// The image of a kube-proxy pod's kube-proxy container (the one named `kube-proxy`, else the
/// first).
pub fn kube_proxy_image(pod: &Pod) -> Option<String> {
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice())?;
    containers
        .iter()
        .find(|c| c.name == "kube-proxy")
        .or_else(|| containers.first())
        .and_then(|c| c.image.clone())
}

/// The image of the kube-proxy pod on `node` (pods of `namespace` matching `label_selector`, a
/// Running one first), `None` when no such pod runs there (k3s and RKE2 run kube-proxy inside
/// their own process).
pub async fn kube_proxy_image_on_node(
    conn: &Connection,
    namespace: &str,
    label_selector: &str,
    node: &str,
) -> Result<Option<String>, ApiError> {
    let pods = list_pods_on_node(conn, namespace, label_selector, node).await?;
    Ok(pick_proxy_pod(&pods).and_then(kube_proxy_image))
}

/// The pod to read among a node's kube-proxy pods: a Running one, else the first.
pub fn pick_proxy_pod(pods: &[Pod]) -> Option<&Pod> {
    let running = |p: &&Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Running")
    };
    pods.iter().find(running).or_else(|| pods.first())
}

/// Fetches the `config.conf` text of kube-proxy's ConfigMap `namespace/name`.
pub async fn fetch_proxy_config(
    conn: &Connection,
    namespace: &str,
    name: &str,
) -> Result<String, FetchError> {
    let api = Api::<ConfigMap>::namespaced(conn.client.clone(), namespace);
    let cm = api.get(name).await.map_err(|e| {
        ApiError::classify(
            e,
            ApiCall::new("get", "configmaps")
                .in_namespace(namespace)
                .named(name),
            &conn.server,
        )
    })?;
    let data = cm.data.unwrap_or_default();
    match data.get(CONFIG_KEY) {
        Some(text) => Ok(text.clone()),
        None => Err(FetchError::MissingKey {
            namespace: namespace.to_string(),
            name: name.to_string(),
            key: CONFIG_KEY.to_string(),
            keys: data.keys().cloned().collect::<Vec<_>>().join(", "),
        }),
    }
}
