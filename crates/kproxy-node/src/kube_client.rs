//! The only place that builds Kubernetes API clients (from kubectl-style flags).
//!
//! Resolution order, as kubectl does it:
//! 1. `--kubeconfig PATH` (or `KUBECONFIG`, which clap maps onto the same flag; a
//!    `:`-separated list is merged like kubectl merges it);
//! 2. `~/.kube/config`;
//! 3. the in-cluster service account (when `KUBERNETES_SERVICE_HOST` is set).
//!
//! `--context`, `--cluster` and `--user` select inside the kubeconfig; `--request-timeout`
//! bounds connect, read and write of every request, and connecting (TCP and the TLS
//! handshake) takes at most [`HANDSHAKE_TIMEOUT`] whatever it says. API failures are turned into
//! [`ApiError`], which names the verb and resource that failed so that a 403 says which
//! RBAC rule is missing.
//!
//! Proxies (`proxy-url`, `HTTPS_PROXY`, `NO_PROXY`), exec credential plugins and the `oidc`
//! auth-provider are kube's, enabled by its features in Cargo.toml (docs/live.md).

use kube::config::{KubeConfigOptions, Kubeconfig};
use std::path::PathBuf;
use std::sync::Once;
use std::time::Duration;

/// Errors building a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `--request-timeout` did not parse.
    #[error("invalid --request-timeout {0:?}: expected a duration such as 500ms, 30s, 1m, 1h or 0")]
    Timeout(String),
    /// A kubeconfig file could not be read.
    #[error("cannot read kubeconfig {}: {detail}", path.display())]
    ReadKubeconfig {
        /// The file.
        path: PathBuf,
        /// Why (the innermost cause).
        detail: String,
    },
    /// No kubeconfig and not in a cluster.
    #[error(
        "no kubeconfig found (pass --kubeconfig, set KUBECONFIG or create ~/.kube/config) and not running inside a cluster: {0}"
    )]
    NoConfig(String),
    /// The kubeconfig does not yield a usable configuration (context, cluster or user).
    #[error("cannot use the kubeconfig{}: {}", selection_suffix(.0), .1)]
    Select(String, String),
    /// In-cluster configuration failed.
    #[error("loading the in-cluster configuration")]
    InCluster(#[source] kube::config::InClusterError),
    /// A [`Retry::Bounded`] whose waits are not a valid backoff.
    #[error("invalid retry policy: {0}")]
    Retry(String),
    /// The client could not be built (TLS material, proxy, …).
    #[error("building the API client for {server}")]
    Build {
        /// The API server URL.
        server: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

fn selection_suffix(s: &str) -> String {
    if s.is_empty() {
        String::new()
    } else {
        format!(" ({s})")
    }
}

/// A connected client plus what error messages need to know about it.
#[derive(Clone)]
pub struct Connection {
    /// The kube client.
    pub client: kube::Client,
    /// The API server URL, for messages.
    pub server: String,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("server", &self.server)
            .finish()
    }
}

/// Installs rustls' `ring` CryptoProvider as the process default, once.
///
/// rustls panics at the first TLS use when it cannot tell which provider to use (both
/// `ring` and `aws-lc-rs` compiled in); installing one explicitly makes that impossible.
pub fn install_crypto_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // Err means another provider was installed first, which is fine too.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// How long connecting to the API server (TCP and the TLS handshake) may take, also with
/// `--request-timeout 0` (no request timeout): a server that accepts and never answers fails
/// then, as with kubectl, whose transport bounds the handshake to the same 10 s (client-go
/// `transport.go`, `TLSHandshakeTimeout` of `utilnet.SetTransportDefaults`).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Parses a kubectl `--request-timeout` value: `0` (none), a plain number of seconds, or a
/// number with a unit `ms`, `s`, `m`, `h` (also combined, e.g. `1m30s`).
pub fn parse_duration(text: &str) -> Result<Option<Duration>, ClientError> {
    let t = text.trim();
    if let Ok(secs) = t.parse::<u64>() {
        return Ok((secs > 0).then(|| Duration::from_secs(secs)));
    }
    crate::state::duration::parse(t)
        .map(|d| (!d.is_zero()).then_some(d))
        .map_err(|_| ClientError::Timeout(text.to_string()))
}

/// How to reach the API server, as kubectl's global flags say it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientOptions {
    /// `--kubeconfig` (a `:`-separated list is merged); `None`: `$KUBECONFIG`, `~/.kube/config`,
    /// then the in-cluster service account.
    pub kubeconfig: Option<PathBuf>,
    /// `--context`.
    pub context: Option<String>,
    /// `--cluster`.
    pub cluster: Option<String>,
    /// `--user`.
    pub user: Option<String>,
    /// `--request-timeout` as kubectl spells it (`0`, `30s`, `1m`; see [`parse_duration`]).
    pub request_timeout: String,
    /// How requests the API server answers 429, 503 or 504 are retried.
    pub retry: Retry,
}

/// How the client retries a request the API server answers 429, 503 or 504 (overloaded,
/// unavailable, a gateway's time-out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Retry {
    /// kube's own policy (`kube::client::retry::RetryPolicy::server_retry`): up to 15 retries,
    /// the waits doubling up to 1000 s, a `Retry-After` honoured. The caller sees nothing
    /// meanwhile: a one-shot command waits, and a watch keeps its old content without an error.
    #[default]
    Kube,
    /// At most `retries` retries, the waits doubling from `first` up to `longest` (plus
    /// jitter; a `Retry-After` is not followed), then the answer reaches the caller as an error.
    /// For a watcher that must say when its content may be stale (the monitor).
    Bounded {
        /// Retries after the first answer.
        retries: u32,
        /// The first wait.
        first: Duration,
        /// The longest wait.
        longest: Duration,
    },
}

/// Builds a client (see the module docs for the resolution order).
pub async fn connect(global: &ClientOptions) -> Result<Connection, ClientError> {
    connect_with(global, true).await
}

/// [`connect`], without kube's own retries of 429, 503 and 504 (up to 15, backing off for up to
/// minutes, and silent meanwhile): for fan-outs that bound each request themselves and must see
/// its answer, such as the 503 of a pod proxy whose pod does not answer.
pub async fn connect_without_retries(global: &ClientOptions) -> Result<Connection, ClientError> {
    connect_with(global, false).await
}

async fn connect_with(global: &ClientOptions, retry: bool) -> Result<Connection, ClientError> {
    install_crypto_provider();
    let timeout = parse_duration(&global.request_timeout)?;
    let options = KubeConfigOptions {
        context: global.context.clone(),
        cluster: global.cluster.clone(),
        user: global.user.clone(),
    };
    let selection = [
        global.context.as_ref().map(|c| format!("context {c:?}")),
        global.cluster.as_ref().map(|c| format!("cluster {c:?}")),
        global.user.as_ref().map(|c| format!("user {c:?}")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>()
    .join(", ");
    let mut config = match &global.kubeconfig {
        Some(paths) => {
            let kubeconfig = read_kubeconfigs(paths)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| ClientError::Select(selection, innermost(&e)))?
        }
        None => match Kubeconfig::read() {
            Ok(kubeconfig) => kube::Config::from_custom_kubeconfig(kubeconfig, &options)
                .await
                .map_err(|e| ClientError::Select(selection, innermost(&e)))?,
            Err(e) => {
                if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
                    kube::Config::incluster().map_err(ClientError::InCluster)?
                } else {
                    return Err(ClientError::NoConfig(innermost(&e)));
                }
            }
        },
    };
    config.default_retry = retry;
    // kube wraps its TLS connector in this connect timeout: it bounds the handshake too.
    config.connect_timeout = Some(timeout.map_or(HANDSHAKE_TIMEOUT, |t| t.min(HANDSHAKE_TIMEOUT)));
    if let Some(t) = timeout {
        config.read_timeout = Some(t);
        config.write_timeout = Some(t);
    }
    let server = config.cluster_url.to_string();
    let build_error = |source| ClientError::Build {
        server: server.clone(),
        source,
    };
    let client = match global.retry {
        Retry::Kube => kube::Client::try_from(config).map_err(build_error)?,
        Retry::Bounded {
            retries,
            first,
            longest,
        } => {
            use kube::client::retry::RetryPolicy;
            config.default_retry = false;
            let policy = RetryPolicy::new(first, longest, retries, false)
                .map_err(|e| ClientError::Retry(e.to_string()))?;
            // A retry sends the request again through the service below it, which must be
            // cloneable: kube's stack is one boxed service, shared through a buffer.
            kube::client::ClientBuilder::try_from(config)
                .map_err(build_error)?
                .with_layer(&tower::buffer::BufferLayer::new(1024))
                .with_layer(&tower::retry::RetryLayer::new(policy))
                .build()
        }
    };
    Ok(Connection { client, server })
}

/// Reads one kubeconfig, or a `:`-separated list merged in order (first wins, as kubectl).
fn read_kubeconfigs(paths: &std::path::Path) -> Result<Kubeconfig, ClientError> {
    let mut merged: Option<Kubeconfig> = None;
    let list: Vec<PathBuf> = std::env::split_paths(paths.as_os_str())
        .filter(|p| !p.as_os_str().is_empty())
        .collect();
    let several = list.len() > 1;
    for path in list {
        // As kubectl: in a list, files that do not exist are skipped.
        if several && !path.exists() {
            continue;
        }
        let read = Kubeconfig::read_from(&path).map_err(|e| ClientError::ReadKubeconfig {
            path: path.clone(),
            detail: innermost(&e),
        })?;
        merged = Some(match merged {
            None => read,
            Some(m) => m.merge(read).map_err(|e| ClientError::ReadKubeconfig {
                path: path.clone(),
                detail: innermost(&e),
            })?,
        });
    }
    merged.ok_or_else(|| ClientError::ReadKubeconfig {
        path: paths.to_path_buf(),
        detail: "no file in the list exists".into(),
    })
}

/// What an API call was doing, for error messages: `list services (all namespaces)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiCall {
    /// The RBAC verb: get, list, create, delete, watch.
    pub verb: &'static str,
    /// The RBAC resource (with subresource): `services`, `endpointslices.discovery.k8s.io`, `pods/exec`.
    pub resource: &'static str,
    /// The namespace, or None at cluster scope / all namespaces.
    pub namespace: Option<String>,
    /// The object name, for get/create/delete.
    pub name: Option<String>,
}

impl ApiCall {
    /// A call without namespace or name.
    pub fn new(verb: &'static str, resource: &'static str) -> Self {
        ApiCall {
            verb,
            resource,
            namespace: None,
            name: None,
        }
    }

    /// Sets the namespace.
    pub fn in_namespace(mut self, ns: &str) -> Self {
        self.namespace = Some(ns.to_string());
        self
    }

    /// Sets the object name.
    pub fn named(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }
}

impl std::fmt::Display for ApiCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(n) = &self.name {
            write!(f, " {n:?}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns:?}"),
            None if self.verb == "list" || self.verb == "watch" => {
                write!(f, " (all namespaces / cluster scope)")
            }
            None => Ok(()),
        }
    }
}

/// A failed API call, classified so that the message says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// Connection refused, DNS, TLS or timeout: nothing answered.
    #[error("cannot reach the API server at {server} (while trying to {call}): {detail}")]
    Unreachable {
        /// API server URL.
        server: String,
        /// The call.
        call: ApiCall,
        /// The innermost cause.
        detail: String,
    },
    /// 401.
    #[error(
        "unauthorized (401) to {call}: the API server at {server} rejected the kubeconfig's credentials"
    )]
    Unauthorized {
        /// API server URL.
        server: String,
        /// The call.
        call: ApiCall,
    },
    /// 403: an RBAC rule is missing.
    #[error(
        "forbidden (403): not allowed to {call}; grant verb {:?} on resource {:?} (see deploy/rbac.yaml): {message}",
        call.verb,
        call.resource
    )]
    Forbidden {
        /// The call.
        call: ApiCall,
        /// The server's message.
        message: String,
    },
    /// 404.
    #[error("not found (404) when trying to {call}: {message}")]
    NotFound {
        /// The call.
        call: ApiCall,
        /// The server's message.
        message: String,
    },
    /// Any other status from the API server.
    #[error("the API server answered {code} to {call}: {message}")]
    Status {
        /// HTTP status code.
        code: u16,
        /// The call.
        call: ApiCall,
        /// The server's message.
        message: String,
    },
    /// Anything else (bad response body, …).
    #[error("failed to {call}: {detail}")]
    Other {
        /// The call.
        call: ApiCall,
        /// The innermost cause.
        detail: String,
    },
}

impl ApiError {
    /// Classifies a kube error raised by `call` against `server`.
    pub fn classify(err: kube::Error, call: ApiCall, server: &str) -> Self {
        use kube::Error as E;
        let status_error = |code: u16, message: String, call: ApiCall| match code {
            401 => ApiError::Unauthorized {
                server: server.to_string(),
                call,
            },
            403 => ApiError::Forbidden { call, message },
            404 => ApiError::NotFound { call, message },
            _ => ApiError::Status {
                code,
                call,
                message,
            },
        };
        match err {
            E::Api(status) => status_error(status.code, status.message.clone(), call),
            E::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(code)) => {
                status_error(
                    code.as_u16(),
                    format!("websocket upgrade refused with {code}"),
                    call,
                )
            }
            E::HyperError(_) | E::Service(_) => {
                let mut detail = innermost(&err);
                if detail.contains("deadline has elapsed") {
                    detail = format!(
                        "no answer in time (connecting and the TLS handshake may take {}s, each request --request-timeout)",
                        HANDSHAKE_TIMEOUT.as_secs()
                    );
                }
                ApiError::Unreachable {
                    server: server.to_string(),
                    call,
                    detail,
                }
            }
            other => ApiError::Other {
                call,
                detail: innermost(&other),
            },
        }
    }

    /// Whether trying again may succeed: nothing answered, the server was overloaded (429) or
    /// failed (5xx), or the answer broke off.
    pub fn is_transient(&self) -> bool {
        match self {
            ApiError::Unreachable { .. } | ApiError::Other { .. } => true,
            ApiError::Status { code, .. } => *code == 429 || *code >= 500,
            _ => false,
        }
    }

    /// The HTTP status, when the server answered one.
    pub fn status_code(&self) -> Option<u16> {
        match self {
            ApiError::Unauthorized { .. } => Some(401),
            ApiError::Forbidden { .. } => Some(403),
            ApiError::NotFound { .. } => Some(404),
            ApiError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// The Display text of the deepest source of an error (the useful part of a hyper chain).
fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last: &(dyn std::error::Error + 'static) = err;
    let mut texts = vec![err.to_string()];
    while let Some(next) = last.source() {
        texts.push(next.to_string());
        last = next;
    }
    // Prefer the deepest non-empty text; keep "timed out" visible when a middle layer says it.
    let deepest = texts
        .iter()
        .rev()
        .find(|t| !t.trim().is_empty())
        .cloned()
        .unwrap_or_default();
    if texts.iter().any(|t| t.contains("timed out")) && !deepest.contains("timed out") {
        format!("request timed out ({deepest})")
    } else {
        deepest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_like_kubectl() {
        assert_eq!(parse_duration("0").ok(), Some(None));
        assert_eq!(
            parse_duration("30").ok(),
            Some(Some(Duration::from_secs(30)))
        );
        assert_eq!(
            parse_duration("1m30s").ok(),
            Some(Some(Duration::from_secs(90)))
        );
        assert_eq!(
            parse_duration("250ms").ok(),
            Some(Some(Duration::from_millis(250)))
        );
        assert!(parse_duration("5x").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s").is_err());
    }

    #[test]
    fn api_call_names_verb_resource_scope() {
        let c = ApiCall::new("create", "pods/exec")
            .in_namespace("kube-system")
            .named("kube-proxy-abc");
        assert_eq!(
            c.to_string(),
            "create pods/exec \"kube-proxy-abc\" in namespace \"kube-system\""
        );
        assert_eq!(
            ApiCall::new("list", "services").to_string(),
            "list services (all namespaces / cluster scope)"
        );
    }
}
