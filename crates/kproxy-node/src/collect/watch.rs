//! Watching the API objects kube-proxy watches (Services, EndpointSlices, Nodes, and optionally
//! the ConfigMap holding its configuration): kube runtime watchers feeding reflector stores, a
//! notification on every change, and the last watch error while the watches are broken. The
//! resync loop (`crate::apply::resync`) syncs from it; the monitor verifies from it.

use crate::state::ClusterState;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

/// The watches of Services, EndpointSlices and Nodes. Deletions are seen because the reflector
/// stores drop deleted objects, and a re-list after a broken watch replaces a store's content.
pub struct ClusterWatch {
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    nodes: Store<Node>,
    config: Option<Store<ConfigMap>>,
    changed: Arc<Notify>,
    problems: Problems,
}

/// The last error of each watch that is failing now (cleared by its next event).
type Problems = Arc<Mutex<Vec<(&'static str, String)>>>;

impl ClusterWatch {
    /// Starts the watches, as tasks of the current tokio runtime.
    pub fn start(client: Client) -> ClusterWatch {
        ClusterWatch::start_with_config(client, None)
    }

    /// Starts the watches, and one of the ConfigMap `(namespace, name)` holding kube-proxy's
    /// configuration when given.
    pub fn start_with_config(client: Client, configmap: Option<(&str, &str)>) -> ClusterWatch {
        let changed = Arc::new(Notify::new());
        let problems = Problems::default();
        let config = configmap.map(|(namespace, name)| {
            let api = Api::<ConfigMap>::namespaced(client.clone(), namespace);
            let only = watcher::Config::default().fields(&format!("metadata.name={name}"));
            spawn_reflector(api, only, "configmaps", changed.clone(), problems.clone())
        });
        ClusterWatch {
            services: spawn_reflector(
                Api::<Service>::all(client.clone()),
                watcher::Config::default(),
                "services",
                changed.clone(),
                problems.clone(),
            ),
            slices: spawn_reflector(
                Api::<EndpointSlice>::all(client.clone()),
                watcher::Config::default(),
                "endpointslices",
                changed.clone(),
                problems.clone(),
            ),
            nodes: spawn_reflector(
                Api::<Node>::all(client),
                watcher::Config::default(),
                "nodes",
                changed.clone(),
                problems.clone(),
            ),
            config,
            changed,
            problems,
        }
    }

    /// Completes when every watch has delivered its initial list.
    pub async fn ready(&self) {
        let _ = self.services.wait_until_ready().await;
        let _ = self.slices.wait_until_ready().await;
        let _ = self.nodes.wait_until_ready().await;
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
            service_cidrs: Vec::new(),
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

/// Spawns a reflector for `api` (watched as `config` says: a field selector) and returns its
/// store; every change (an added, updated or deleted object, a completed re-list) pokes
/// `notify`, and a failing watch leaves its last error in `problems` until its next event.
fn spawn_reflector<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
    notify: Arc<Notify>,
    problems: Problems,
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
