//! Watching the API objects kube-proxy watches (Services, EndpointSlices, Nodes, ServiceCIDRs):
//! kube runtime watchers feeding reflector stores, and a notification on every change. The
//! resync loop (`crate::apply::resync`) syncs from it.

use super::api::{ServiceCidrApi, service_cidr_api, service_cidr_from_beta};
use crate::kube_client::{ApiError, Connection};
use crate::state::ClusterState;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::{v1, v1beta1};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::Arc;
use tokio::sync::Notify;

/// The watches of Services, EndpointSlices, Nodes and ServiceCIDRs. Deletions are seen because
/// the reflector stores drop deleted objects, and a re-list after a broken watch replaces a
/// store's content.
pub struct ClusterWatch {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    nodes: Store<Node>,
    service_cidrs: ServiceCidrs,
    changed: Arc<Notify>,
}

/// The ServiceCIDRs watched, in the version the API server serves.
enum ServiceCidrs {
    /// `networking.k8s.io/v1`.
    V1(Store<v1::ServiceCIDR>),
    /// `networking.k8s.io/v1beta1`, read as v1.
    V1beta1(Store<v1beta1::ServiceCIDR>),
    /// The server has none (no such API).
    Absent,
}

impl ClusterWatch {
    /// Starts the watches, as tasks of the current tokio runtime, after asking the API server
    /// which version of ServiceCIDRs it serves ([`service_cidr_api`]; an error when it cannot
    /// say: a render without them would lack kube-proxy's rule for unallocated cluster IPs,
    /// and the sync would delete it).
    pub async fn start(conn: &Connection) -> Result<ClusterWatch, ApiError> {
        let client = conn.client.clone();
        let changed = Arc::new(Notify::new());
        let service_cidrs = match service_cidr_api(conn).await? {
            Some(ServiceCidrApi::V1) => {
                ServiceCidrs::V1(spawn_reflector(Api::all(client.clone()), changed.clone()))
            }
            Some(ServiceCidrApi::V1beta1) => {
                ServiceCidrs::V1beta1(spawn_reflector(Api::all(client.clone()), changed.clone()))
            }
            None => ServiceCidrs::Absent,
        };
        Ok(ClusterWatch {
            services: spawn_reflector(Api::<Service>::all(client.clone()), changed.clone()),
            slices: spawn_reflector(Api::<EndpointSlice>::all(client.clone()), changed.clone()),
            nodes: spawn_reflector(Api::<Node>::all(client), changed.clone()),
            service_cidrs,
            changed,
        })
    }

    /// Completes when every watch has delivered its initial list.
    pub async fn ready(&self) {
        let _ = self.services.wait_until_ready().await;
        let _ = self.slices.wait_until_ready().await;
        let _ = self.nodes.wait_until_ready().await;
        match &self.service_cidrs {
            ServiceCidrs::V1(store) => {
                let _ = store.wait_until_ready().await;
            }
            ServiceCidrs::V1beta1(store) => {
                let _ = store.wait_until_ready().await;
            }
            ServiceCidrs::Absent => {}
        }
    }

    /// The objects the watches hold now.
    pub fn state(&self) -> ClusterState {
        ClusterState {
            services: snapshot(&self.services),
            endpoint_slices: snapshot(&self.slices),
            nodes: snapshot(&self.nodes),
            service_cidrs: match &self.service_cidrs {
                ServiceCidrs::V1(store) => snapshot(store),
                ServiceCidrs::V1beta1(store) => snapshot(store)
                    .into_iter()
                    .map(service_cidr_from_beta)
                    .collect(),
                ServiceCidrs::Absent => Vec::new(),
            },
        }
    }

    /// Completes at the next change (an added, updated or deleted object, a completed re-list),
    /// or at once when one happened since the last call.
    pub async fn changed(&self) {
        self.changed.notified().await;
    }
}

fn snapshot<K: kube::Resource + Clone>(store: &Store<K>) -> Vec<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    store.state().iter().map(|o| (**o).clone()).collect()
}

/// Spawns a reflector for `api` and returns its store; every change (an added, updated or deleted
/// object, a completed re-list) pokes `notify`.
fn spawn_reflector<K>(api: Api<K>, notify: Arc<Notify>) -> Store<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: std::hash::Hash + Eq + Clone + Default,
{
    let (reader, writer) = reflector::store();
    let stream =
        reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                // A (re-)list is only visible in the store once it is complete: poke then, not
                // per listed object (a sync in between would still see the old store and miss
                // what was deleted while the watch was down), and also when the list is empty.
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(
                    watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_),
                ) => notify.notify_one(),
                Err(e) => tracing::warn!("watch error: {e}"),
            }
        }
    });
    reader
}
