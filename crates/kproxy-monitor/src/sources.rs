//! Where the monitor's inputs come from, as replaceable parts: the API state and kube-proxy's
//! configuration ([`ApiSource`]: the API's watches, or files re-read when they change) and the
//! node's rules ([`NodeReader`]: the local collector, in a network namespace when asked).

use kproxy_core::state::ClusterState;
use kproxy_node::collect::NodeSnapshot;
use kproxy_node::collect::netns::HostRunner;
use kproxy_node::collect::watch::ClusterWatch;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

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

/// The API state and configuration, and their changes.
pub trait ApiSource: Send + Sync {
    /// What the API says now; an error when that cannot be trusted now (a broken watch, a file
    /// that does not read), which fails the verify instead of comparing with stale state.
    fn current(&self) -> Result<ApiView, String>;
    /// Completes at the next change (at once when one happened since the last call).
    fn changed(&self) -> BoxFuture<'_, ()>;
}

/// Reads the node's rules.
pub trait NodeReader: Send + Sync {
    /// One read of everything the node's mode needs.
    fn read(&self) -> BoxFuture<'_, Result<NodeSnapshot, String>>;
}

/// The local collector ([`kproxy_node::collect::netns`]), each command limited to `timeout`.
pub struct LocalReader {
    /// Where the commands run.
    pub runner: HostRunner,
    /// The limit of each command.
    pub timeout: Duration,
}

impl NodeReader for LocalReader {
    fn read(&self) -> BoxFuture<'_, Result<NodeSnapshot, String>> {
        Box::pin(async move {
            kproxy_node::collect::netns::collect(&self.runner, self.timeout)
                .await
                .map_err(|e| e.to_string())
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
