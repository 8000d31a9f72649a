//! Watching the API objects kube-proxy watches (Services, EndpointSlices, Nodes, ServiceCIDRs,
//! and optionally the ConfigMap holding its configuration): kube runtime watchers feeding
//! reflector stores, a notification on every change, and the last watch error while the
//! watches are broken. The resync loop (`crate::apply::resync`) syncs from it; the monitor
//! verifies from it.

use super::api::{ServiceCidrApi, service_cidr_api, service_cidr_from_beta};
use crate::kube_client::{ApiError, Connection};
use crate::state::ClusterState;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeSpec, NodeStatus, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::{v1, v1beta1};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The watches of Services, EndpointSlices, Nodes and ServiceCIDRs. Deletions are seen because
/// the reflector stores drop deleted objects, and a re-list after a broken watch replaces a
/// store's content. The stores keep what kube-proxy reads of each object ([`lean_meta`],
/// [`lean_node`]).
pub struct ClusterWatch {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    nodes: Store<Node>,
    service_cidrs: ServiceCidrs,
    config: Option<Store<ConfigMap>>,
    changed: Arc<Notify>,
    problems: Problems,
}

/// The last error of each watch that is failing now (cleared by its next event).
type Problems = Arc<Mutex<Vec<(&'static str, String)>>>;

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
        ClusterWatch::start_with_config(conn, None).await
    }

    /// As [`ClusterWatch::start`], and a watch of the ConfigMap `(namespace, name)` holding
    /// kube-proxy's configuration when given.
    pub async fn start_with_config(
        conn: &Connection,
        configmap: Option<(&str, &str)>,
    ) -> Result<ClusterWatch, ApiError> {
        let client = conn.client.clone();
        let changed = Arc::new(Notify::new());
        let problems = Problems::default();
        let watch = |what| Feed {
            what,
            notify: changed.clone(),
            problems: problems.clone(),
        };
        let all = watcher::Config::default;
        let service_cidrs = match service_cidr_api(conn).await? {
            Some(ServiceCidrApi::V1) => ServiceCidrs::V1(spawn_reflector(
                Api::all(client.clone()),
                all(),
                lean_meta,
                watch("servicecidrs"),
            )),
            Some(ServiceCidrApi::V1beta1) => ServiceCidrs::V1beta1(spawn_reflector(
                Api::all(client.clone()),
                all(),
                lean_meta,
                watch("servicecidrs"),
            )),
            None => ServiceCidrs::Absent,
        };
        let config = configmap.map(|(namespace, name)| {
            let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
            let only = watcher::Config::default().fields(&format!("metadata.name={name}"));
            spawn_reflector(api, only, lean_meta, watch("configmaps"))
        });
        Ok(ClusterWatch {
            services: spawn_reflector(
                Api::<Service>::all(client.clone()),
                all(),
                lean_meta,
                watch("services"),
            ),
            slices: spawn_reflector(
                Api::<EndpointSlice>::all(client.clone()),
                all(),
                lean_meta,
                watch("endpointslices"),
            ),
            nodes: spawn_reflector(Api::<Node>::all(client), all(), lean_node, watch("nodes")),
            service_cidrs,
            config,
            changed,
            problems,
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
        if let Some(c) = &self.config {
            let _ = c.wait_until_ready().await;
        }
    }

    /// The watched ConfigMap's `config.conf` (kube-proxy's configuration), when the ConfigMap is
    /// watched and exists with that key.
    pub fn config_text(&self) -> Option<String> {
        let store = self.config.as_ref()?;
        let maps = store.state();
        maps.first()?.data.as_ref()?.get("config.conf").cloned()
    }

    /// What is wrong with the watches now: the last error of each that failed and has not
    /// delivered an event since (`services: …`), empty while they all work. The stores keep
    /// their last content meanwhile, so this says when that content may be stale.
    pub fn problems(&self) -> Vec<String> {
        let problems = self.problems.lock().map(|p| p.clone()).unwrap_or_default();
        problems
            .into_iter()
            .map(|(what, e)| format!("watch of {what}: {e}"))
            .collect()
    }

    /// The objects the watches hold now, less those the API server would reject
    /// ([`crate::state::validate`]).
    pub fn state(&self) -> ClusterState {
        let mut state = ClusterState {
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
            invalid: Vec::new(),
        };
        crate::state::validate::leave_out_invalid(&mut state);
        state
    }

    /// A number that changes when what kube-proxy reads for `node` changes, without copying the
    /// stores: each Service's, EndpointSlice's and ServiceCIDR's name and resourceVersion (its whole content
    /// when it has none), and that node's labels, pod CIDRs and addresses (kube-proxy reads
    /// nothing else of Nodes; other nodes' heartbeats change nothing here). The order the stores
    /// list their objects in does not count.
    pub fn fingerprint(&self, node: &str) -> u64 {
        use std::hash::{DefaultHasher, Hash, Hasher};
        fn of<K: kube::Resource + serde::Serialize + Clone>(store: &Store<K>) -> u64
        where
            K::DynamicType: std::hash::Hash + Eq + Clone,
        {
            store.state().iter().fold(0u64, |sum, o| {
                let mut h = DefaultHasher::new();
                let meta = o.meta();
                (&meta.namespace, &meta.name).hash(&mut h);
                match &meta.resource_version {
                    Some(rv) => rv.hash(&mut h),
                    None => serde_json::to_string(&**o).unwrap_or_default().hash(&mut h),
                }
                sum.wrapping_add(h.finish())
            })
        }
        let mut h = DefaultHasher::new();
        of(&self.services).hash(&mut h);
        of(&self.slices).hash(&mut h);
        match &self.service_cidrs {
            ServiceCidrs::V1(store) => of(store).hash(&mut h),
            ServiceCidrs::V1beta1(store) => of(store).hash(&mut h),
            ServiceCidrs::Absent => {}
        }
        for n in self.nodes.state() {
            if n.metadata.name.as_deref() == Some(node) {
                let own = (
                    &n.metadata.labels,
                    n.spec.as_ref().map(|s| (&s.pod_cidr, &s.pod_cidrs)),
                    n.status.as_ref().map(|s| &s.addresses),
                );
                serde_json::to_string(&own).unwrap_or_default().hash(&mut h);
            }
        }
        self.config_text().hash(&mut h);
        h.finish()
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

/// Drops what no reader of the watched state uses from an object before the store keeps it:
/// the server's field-management records and `kubectl apply`'s copy of the object (each as
/// large as the rest of it). Other annotations stay: kube-proxy reads some (topology mode).
fn lean_meta<K: kube::Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(a) = meta.annotations.as_mut() {
        a.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
}

/// [`lean_meta`], and of a Node only what kube-proxy reads of it (its `NodeManager` and
/// topology code): labels, `spec.podCIDR(s)` and `status.addresses`. The rest of a Node (its
/// images, conditions, capacity, heartbeats) is most of its size, and a cluster has thousands.
fn lean_node(node: &mut Node) {
    lean_meta(node);
    node.metadata.annotations = None;
    node.spec = node.spec.take().map(|s| NodeSpec {
        pod_cidr: s.pod_cidr,
        pod_cidrs: s.pod_cidrs,
        ..NodeSpec::default()
    });
    node.status = node.status.take().map(|s| NodeStatus {
        addresses: s.addresses,
        ..NodeStatus::default()
    });
}

/// Where a watch reports: its name in messages, the change notification, the problems list.
struct Feed {
    what: &'static str,
    notify: Arc<Notify>,
    problems: Problems,
}

/// Spawns a reflector for `api` (watched as `config` says: a field selector) and returns its
/// store, keeping each object as `lean` leaves it; every change (an added, updated or deleted
/// object, a completed re-list) pokes the feed's notification, and a failing watch leaves its
/// last error in the feed's problems until its next event.
fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    lean: fn(&mut K),
    feed: Feed,
) -> Store<K>
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
    let Feed {
        what,
        notify,
        problems,
    } = feed;
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(writer, watcher(api, config).modify(lean)).default_backoff();
    let set_problem = move |problem: Option<String>| {
        if let Ok(mut p) = problems.lock() {
            p.retain(|(w, _)| *w != what);
            if let Some(e) = problem {
                p.push((what, e));
            }
        }
    };
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            // A 410 Expired is the watch's ordinary way to say "re-list": the re-list follows
            // at once, so it is no problem of the watch.
            let problem = match &ev {
                Err(watcher::Error::WatchError(status)) if status.code == 410 => None,
                Err(e) => Some(e.to_string()),
                Ok(_) => None,
            };
            set_problem(problem);
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerImage, NodeAddress};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    #[test]
    fn a_node_keeps_what_kube_proxy_reads() {
        let mut n = Node::default();
        n.metadata.name = Some("node-1".into());
        n.metadata.labels = Some([("topology.kubernetes.io/zone".into(), "a".into())].into());
        n.metadata.annotations = Some([("node.alpha.kubernetes.io/ttl".into(), "0".into())].into());
        n.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        n.spec = Some(NodeSpec {
            pod_cidrs: Some(vec!["10.244.1.0/24".into()]),
            provider_id: Some("aws:///i-1".into()),
            ..NodeSpec::default()
        });
        n.status = Some(NodeStatus {
            addresses: Some(vec![NodeAddress {
                type_: "InternalIP".into(),
                address: "192.168.77.2".into(),
            }]),
            images: Some(vec![ContainerImage::default()]),
            ..NodeStatus::default()
        });
        lean_node(&mut n);
        let v = serde_json::to_value(&n).unwrap_or_default();
        assert_eq!(
            v,
            serde_json::json!({
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": "node-1", "labels": {"topology.kubernetes.io/zone": "a"}},
                "spec": {"podCIDRs": ["10.244.1.0/24"]},
                "status": {"addresses": [{"type": "InternalIP", "address": "192.168.77.2"}]},
            })
        );

        let mut svc = Service::default();
        svc.metadata.annotations = Some(
            [
                (
                    "kubectl.kubernetes.io/last-applied-configuration".into(),
                    "{}".into(),
                ),
                ("service.kubernetes.io/topology-mode".into(), "Auto".into()),
            ]
            .into(),
        );
        svc.metadata.managed_fields = Some(vec![ManagedFieldsEntry::default()]);
        lean_meta(&mut svc);
        assert_eq!(svc.metadata.managed_fields, None);
        assert_eq!(
            svc.metadata
                .annotations
                .map(|a| a.into_keys().collect::<Vec<_>>()),
            Some(vec!["service.kubernetes.io/topology-mode".to_string()])
        );
    }
}
