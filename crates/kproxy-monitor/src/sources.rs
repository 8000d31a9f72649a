//! Where the monitor's inputs come from, as replaceable parts: the API state and kube-proxy's
//! configuration ([`ApiSource`]: the API's watches, or files re-read when they change) and the
//! node's rules ([`NodeReader`]: the local collector, in a network namespace when asked).

use kproxy_core::state::ClusterState;
use kproxy_node::collect::NodeSnapshot;
use kproxy_node::collect::events::{RuleEvents, Taken};
use kproxy_node::collect::netns::HostRunner;
use kproxy_node::collect::watch::ClusterWatch;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A boxed future (the parts are used as trait objects).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The API's side of one verify.
#[derive(Debug, Clone)]
pub struct ApiView {
    /// Services, EndpointSlices, Nodes.
    pub state: ClusterState,
    /// kube-proxy's configuration text and where it came from (`None`: kube-proxy's defaults).
    pub config_text: Option<(String, String)>,
}

impl ApiView {
    /// What of the view can change the rules of `node`: the Services and EndpointSlices, that
    /// node's labels, addresses and pod CIDRs (kube-proxy reads nothing else of Nodes: its
    /// `NodeManager` watches its own Node for them), and the configuration. Other nodes'
    /// heartbeats and status updates, which arrive all the time, change nothing here.
    pub fn fingerprint(&self, node: &str) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        feed(&mut h, &self.state.services);
        feed(&mut h, &self.state.endpoint_slices);
        feed(&mut h, &self.state.service_cidrs);
        for n in &self.state.nodes {
            if n.metadata.name.as_deref() == Some(node) {
                feed(&mut h, &n.metadata.labels);
                feed(&mut h, &n.spec.as_ref().map(|s| &s.pod_cidrs));
                feed(&mut h, &n.status.as_ref().map(|s| &s.addresses));
            }
        }
        self.config_text.hash(&mut h);
        h.finish()
    }
}

/// Feeds serialised JSON into a hasher.
struct HashWriter<'a, H: std::hash::Hasher>(&'a mut H);

impl<H: std::hash::Hasher> std::io::Write for HashWriter<'_, H> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Hashes `value` as its JSON text.
fn feed<H: std::hash::Hasher>(h: &mut H, value: &impl serde::Serialize) {
    // Serialising these types into the hasher cannot fail.
    let _ = serde_json::to_writer(HashWriter(h), value);
}

/// The API state and configuration, and their changes.
pub trait ApiSource: Send + Sync {
    /// What the API says now; an error when that cannot be trusted now (a broken watch, a file
    /// that does not read), which fails the verify instead of comparing with stale state.
    fn current(&self) -> Result<ApiView, String>;
    /// Completes at the next change (at once when one happened since the last call).
    fn changed(&self) -> BoxFuture<'_, ()>;
    /// A number that changes when what can change `node`'s rules changes, made without
    /// copying the state; `None` when the source has no such way (then
    /// [`ApiView::fingerprint`] of [`ApiSource::current`] serves).
    fn fingerprint(&self, _node: &str) -> Option<u64> {
        None
    }
}

/// One read of the node.
#[derive(Debug, Clone)]
pub struct NodeRead {
    /// What the node's mode needs.
    pub snapshot: NodeSnapshot,
    /// Whether every output was read now; false when the rules' outputs were kept from an
    /// earlier read that the change events say still stands for the node.
    pub whole: bool,
    /// Changes of the watched nf_tables tables the events reported before this read.
    pub rule_changes: u64,
}

/// Reads the node's rules.
pub trait NodeReader: Send + Sync {
    /// One read of everything the node's mode needs.
    fn read(&self) -> BoxFuture<'_, Result<NodeRead, String>>;
    /// Completes when the node's rules changed (never, for a reader that cannot tell).
    fn changed(&self) -> BoxFuture<'_, ()> {
        Box::pin(std::future::pending())
    }
}

/// The local collector ([`kproxy_node::collect::netns`]), each command limited to `timeout`.
/// It follows the changes of the node's nf_tables rules ([`RuleEvents`]) and keeps what it read
/// from nf_tables while they say nothing changed, for at most `full_read`; the rest (the legacy
/// backend, ipsets, IPVS, conntrack: no events) is read every time.
pub struct LocalReader {
    /// Where the commands run.
    pub runner: HostRunner,
    /// The limit of each command.
    pub timeout: Duration,
    /// The longest time a read's nf_tables outputs are kept (`--full-read-interval`).
    pub full_read: Duration,
    events: Mutex<Option<Arc<RuleEvents>>>,
    /// The last whole read the events covered, and when it started.
    last: Mutex<Option<(NodeSnapshot, Instant)>>,
}

impl LocalReader {
    /// A reader of the node `runner` runs commands on.
    pub fn new(runner: HostRunner, timeout: Duration, full_read: Duration) -> LocalReader {
        LocalReader {
            runner,
            timeout,
            full_read,
            events: Mutex::new(None),
            last: Mutex::new(None),
        }
    }

    /// The events, subscribed again when they are not running (not yet, or the socket failed);
    /// why there are none when they cannot be started.
    fn events(&self) -> Result<Arc<RuleEvents>, String> {
        let mut slot = self
            .events
            .lock()
            .map_err(|_| "the events' state is unreadable".to_string())?;
        if let Some(e) = slot.as_ref() {
            match e.stopped() {
                None => return Ok(Arc::clone(e)),
                // Said by this read; the next one subscribes again.
                Some(why) => {
                    *slot = None;
                    return Err(why);
                }
            }
        }
        let e = Arc::new(RuleEvents::start(&self.runner)?);
        *slot = Some(Arc::clone(&e));
        Ok(e)
    }
}

impl NodeReader for LocalReader {
    fn read(&self) -> BoxFuture<'_, Result<NodeRead, String>> {
        Box::pin(async move {
            let mut no_events = None;
            let taken = match self.events() {
                Ok(e) => e.take(),
                // The events stopped or cannot start: said (a collector's warning, printed
                // once), and the node is read whole; the next read starts them again.
                Err(why) => {
                    no_events = Some(format!(
                        "no change events of the node's nf_tables rules ({why}): the whole node is read for each verify"
                    ));
                    Taken {
                        changed: true,
                        untrusted: Some(why),
                        ..Taken::default()
                    }
                }
            };
            let kept = self.last.lock().ok().and_then(|l| {
                l.as_ref()
                    .filter(|(_, at)| !taken.changed && at.elapsed() < self.full_read)
                    .map(|(s, _)| s.clone())
            });
            if let Some(kept) = kept {
                let kinds = kproxy_node::collect::nf_tables_kinds(&kept);
                let snapshot = kproxy_node::collect::netns::collect_keeping(
                    &self.runner,
                    self.timeout,
                    &kept,
                    &kinds,
                )
                .await
                .map_err(|e| e.to_string())?;
                return Ok(NodeRead {
                    snapshot,
                    whole: false,
                    rule_changes: taken.changes,
                });
            }
            let started = Instant::now();
            let mut snapshot = kproxy_node::collect::netns::collect(&self.runner, self.timeout)
                .await
                .map_err(|e| e.to_string())?;
            snapshot.warnings.extend(no_events);
            if let Ok(mut l) = self.last.lock() {
                // A read the events did not cover (they lost notifications, or were not
                // subscribed yet) is not kept: the next one reads everything again.
                *l = taken
                    .untrusted
                    .is_none()
                    .then(|| (snapshot.clone(), started));
            }
            Ok(NodeRead {
                snapshot,
                whole: true,
                rule_changes: taken.changes,
            })
        })
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        let events = self.events.lock().ok().and_then(|e| e.clone());
        // Events that stopped complete `changed` once; the next read subscribes again.
        Box::pin(async move {
            match events {
                Some(e) => e.changed().await,
                None => std::future::pending().await,
            }
        })
    }
}

/// The API's watches ([`ClusterWatch`]) and the configuration from the watched ConfigMap, or
/// from a file when one is given.
pub struct WatchSource {
    /// The watches.
    pub watch: ClusterWatch,
    /// `--config FILE` (read at each verify; it overrides the ConfigMap).
    pub config_file: Option<PathBuf>,
    /// The ConfigMap watched, for messages (`kube-system/kube-proxy`).
    pub configmap: Option<String>,
}

impl ApiSource for WatchSource {
    fn current(&self) -> Result<ApiView, String> {
        let problems = self.watch.problems();
        if !problems.is_empty() {
            return Err(format!(
                "the API state may be stale: {}",
                problems.join("; ")
            ));
        }
        let config_text = match &self.config_file {
            Some(p) => Some(read_text(p)?),
            None => self.watch.config_text().map(|t| {
                (
                    t,
                    format!(
                        "configmap {}",
                        self.configmap.as_deref().unwrap_or("kube-proxy")
                    ),
                )
            }),
        };
        Ok(ApiView {
            state: self.watch.state(),
            config_text,
        })
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.watch.changed())
    }

    /// [`ClusterWatch::fingerprint`] (no copy of the stores, which [`ApiSource::current`]
    /// makes) and the `--config` file's text.
    fn fingerprint(&self, node: &str) -> Option<u64> {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.watch.fingerprint(node).hash(&mut h);
        if let Some(p) = &self.config_file {
            read_text(p).ok()?.0.hash(&mut h);
        }
        Some(h.finish())
    }
}

fn read_text(p: &std::path::Path) -> Result<(String, String), String> {
    kproxy_core::state::load::read_source(p).map_err(|e| e.to_string())
}

/// What tells a file's versions apart: size, modification time, inode (a file replaced by a
/// rename has a new inode even within one mtime tick).
type Stamp = Option<(u64, std::time::SystemTime, u64)>;

fn stamp(p: &std::path::Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).ok()?;
    Some((m.len(), m.modified().ok()?, m.ino()))
}

/// `--state FILE…` and `--config FILE`, re-read when one of them changes (polled every
/// `poll`: no watch of the file system is needed and a file replaced by a rename is seen too).
pub struct FileSource {
    /// The state files.
    pub state: Vec<PathBuf>,
    /// The configuration file.
    pub config: Option<PathBuf>,
    /// How often the files are looked at.
    pub poll: Duration,
    seen: Mutex<Vec<Stamp>>,
}

impl FileSource {
    /// A source of these files.
    pub fn new(state: Vec<PathBuf>, config: Option<PathBuf>, poll: Duration) -> FileSource {
        let s = FileSource {
            state,
            config,
            poll,
            seen: Mutex::new(Vec::new()),
        };
        let now = s.stamps();
        if let Ok(mut seen) = s.seen.lock() {
            *seen = now;
        }
        s
    }

    fn files(&self) -> impl Iterator<Item = &PathBuf> {
        self.state.iter().chain(self.config.iter())
    }

    fn stamps(&self) -> Vec<Stamp> {
        self.files().map(|p| stamp(p)).collect()
    }
}

impl ApiSource for FileSource {
    fn current(&self) -> Result<ApiView, String> {
        let before = self.stamps();
        if let Some(p) = self.files().zip(&before).find(|(_, s)| s.is_none()) {
            return Err(format!("{}: cannot read it", p.0.display()));
        }
        let state = kproxy_core::state::load::from_files(&self.state)
            .map_err(|e| format!("reading --state: {e}"))?;
        let config_text = match &self.config {
            Some(p) => Some(read_text(p)?),
            None => None,
        };
        // A file replaced while it was read may have given a mix of two versions.
        if self.stamps() != before {
            return Err("a --state or --config file changed while it was read".into());
        }
        Ok(ApiView { state, config_text })
    }

    fn changed(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let now = self.stamps();
                if let Ok(mut seen) = self.seen.lock()
                    && *seen != now
                {
                    *seen = now;
                    return;
                }
                tokio::time::sleep(self.poll).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Node, NodeStatus, Service};

    fn node(name: &str, heartbeat_marker: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.status = Some(NodeStatus {
            phase: Some(heartbeat_marker.into()),
            ..NodeStatus::default()
        });
        n
    }

    #[test]
    fn the_fingerprint_changes_with_what_changes_the_rules() {
        let view = |other: &str, own_label: Option<&str>, svc: &str| {
            let mut own = node("node-1", "a");
            if let Some(l) = own_label {
                own.metadata.labels = Some([("zone".to_string(), l.to_string())].into());
            }
            let mut s = Service::default();
            s.metadata.name = Some(svc.into());
            ApiView {
                state: ClusterState {
                    services: vec![s],
                    nodes: vec![own, node("node-2", other)],
                    ..ClusterState::default()
                },
                config_text: None,
            }
            .fingerprint("node-1")
        };
        let base = view("x", None, "web");
        assert_eq!(base, view("y", None, "web"), "another node's status");
        assert_ne!(base, view("x", Some("zone-a"), "web"), "this node's labels");
        assert_ne!(base, view("x", None, "api"), "a service");
    }
}
