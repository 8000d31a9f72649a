//! Watching the API objects kube-proxy watches (Services, EndpointSlices, Nodes, ServiceCIDRs,
//! and optionally the ConfigMap holding its configuration): kube runtime watchers feeding
//! reflector stores, a notification on every change, and the last watch error while the
//! watches are broken. The resync loop (`crate::apply::resync`) syncs from it; the monitor
//! verifies from it.

use super::api::{ServiceCidrApi, service_cidr_api, service_cidr_from_beta};
use crate::kube_client::{ApiError, Connection};
use crate::state::ClusterState;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::{v1, v1beta1};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The watches of Services, EndpointSlices, Nodes and ServiceCIDRs. Deletions are seen because
/// the reflector stores drop deleted objects, and a re-list after a broken watch replaces a
/// store's content.
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
                watch("servicecidrs"),
            )),
            Some(ServiceCidrApi::V1beta1) => ServiceCidrs::V1beta1(spawn_reflector(
                Api::all(client.clone()),
                all(),
                watch("servicecidrs"),
            )),
            None => ServiceCidrs::Absent,
        };
        let config = configmap.map(|(namespace, name)| {
            let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
            let only = watcher::Config::default().fields(&format!("metadata.name={name}"));
            spawn_reflector(api, only, watch("configmaps"))
        });
        Ok(ClusterWatch {
            services: spawn_reflector(
                Api::<Service>::all(client.clone()),
                all(),
                watch("services"),
            ),
            slices: spawn_reflector(
                Api::<EndpointSlice>::all(client.clone()),
                all(),
                watch("endpointslices"),
            ),
            nodes: spawn_reflector(Api::<Node>::all(client), all(), watch("nodes")),
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

/// Where a watch reports: its name in messages, the change notification, the problems list.
struct Feed {
    what: &'static str,
    notify: Arc<Notify>,
    problems: Problems,
}

/// Spawns a reflector for `api` (watched as `config` says: a field selector) and returns its
/// store; every change (an added, updated or deleted object, a completed re-list) pokes the
/// feed's notification, and a failing watch leaves its last error in the feed's problems until
/// its next event.
fn spawn_reflector<K>(api: Api<K>, config: watcher::Config, feed: Feed) -> Store<K>
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
    let stream = reflector::reflector(writer, watcher(api, config)).default_backoff();
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
