//! The `exec` collector: run the dump commands in a pod through the API's exec subresource
//! (websocket, `v5.channel.k8s.io`/`v4.channel.k8s.io`), argv only, with a per-command timeout.

use super::{CollectError, CommandOutput, CommandRunner, NodeSnapshot, RunError};
use crate::kube_client::{ApiCall, ApiError, Connection};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams};
use std::time::Duration;
use tokio::io::AsyncReadExt;

/// Default namespace searched for the kube-proxy pod.
pub const PROXY_NAMESPACE: &str = "kube-system";
/// Default label selector of kube-proxy pods (kubeadm, kops, kind, most distributions).
pub const DEFAULT_PROXY_SELECTOR: &str = "k8s-app=kube-proxy";

/// Runs commands in one container of one pod.
#[derive(Debug, Clone)]
pub struct PodExec {
    /// The connection.
    pub conn: Connection,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Container name (None: the pod's only/default container).
    pub container: Option<String>,
}

impl CommandRunner for PodExec {
    fn location(&self) -> String {
        format!("pod {}/{}", self.namespace, self.pod)
    }

    async fn run(&self, argv: &[&str], timeout: Duration) -> Result<CommandOutput, RunError> {
        match tokio::time::timeout(timeout, self.exec(argv)).await {
            Ok(r) => r,
            Err(_) => Err(RunError::Timeout(timeout)),
        }
    }
}

impl PodExec {
    async fn exec(&self, argv: &[&str]) -> Result<CommandOutput, RunError> {
        let api = Api::<Pod>::namespaced(self.conn.client.clone(), &self.namespace);
        let mut params = AttachParams::default()
            .stdin(false)
            .stdout(true)
            .stderr(true);
        if let Some(c) = &self.container {
            params = params.container(c.clone());
        }
        let command = argv.join(" ");
        let mut process = api
            .exec(&self.pod, argv.iter().copied(), &params)
            .await
            .map_err(|e| {
                CollectError::from(ApiError::classify(
                    e,
                    ApiCall::new("create", "pods/exec")
                        .in_namespace(&self.namespace)
                        .named(&self.pod),
                    &self.conn.server,
                ))
            })?;
        let exec_error = |detail: String| {
            RunError::Fatal(CollectError::Exec {
                command: command.clone(),
                location: self.location(),
                detail,
            })
        };
        let mut stdout = process
            .stdout()
            .ok_or_else(|| exec_error("no stdout stream".into()))?;
        let mut stderr = process
            .stderr()
            .ok_or_else(|| exec_error("no stderr stream".into()))?;
        let status = process
            .take_status()
            .ok_or_else(|| exec_error("no status stream".into()))?;
        let mut out = Vec::new();
        let mut err = Vec::new();
        let (r_out, r_err, status) = tokio::join!(
            stdout.read_to_end(&mut out),
            stderr.read_to_end(&mut err),
            status
        );
        r_out.map_err(|e| exec_error(format!("reading stdout: {e}")))?;
        r_err.map_err(|e| exec_error(format!("reading stderr: {e}")))?;
        if let Err(e) = process.join().await {
            return Err(exec_error(e.to_string()));
        }
        let stdout =
            String::from_utf8(out).map_err(|_| exec_error("stdout is not UTF-8 text".into()))?;
        let stderr = String::from_utf8_lossy(&err).into_owned();
        let exit_code = match status {
            None => 0,
            Some(s) if s.status.as_deref() == Some("Success") => 0,
            Some(s) => match exit_code_of(&s) {
                Some(code) => code,
                None if is_missing_binary(s.message.as_deref().unwrap_or_default()) => {
                    return Err(RunError::Missing {
                        program: argv.first().copied().unwrap_or_default().to_string(),
                    });
                }
                None => {
                    return Err(exec_error(
                        s.message
                            .unwrap_or_else(|| "exec failed without a message".into()),
                    ));
                }
            },
        };
        Ok(CommandOutput {
            exit_code,
            stdout,
            stderr,
        })
    }
}

/// The exit code of a `NonZeroExitCode` status (`details.causes[].reason == "ExitCode"`).
fn exit_code_of(s: &Status) -> Option<i32> {
    s.details
        .as_ref()?
        .causes
        .as_ref()?
        .iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .and_then(|c| c.message.as_deref()?.parse().ok())
}

/// How container runtimes report an argv[0] that does not exist.
fn is_missing_binary(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    m.contains("executable file not found")
        || m.contains("no such file or directory")
        || m.contains("not found in $path")
}

/// Finds the kube-proxy pod on `node` (a Running one first) and the container to exec into.
pub async fn find_proxy_pod(
    conn: &Connection,
    namespace: &str,
    selector: &str,
    node: &str,
) -> Result<PodExec, CollectError> {
    let pods = crate::state::api::list_pods_on_node(conn, namespace, selector, node).await?;
    let running = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Running")
    };
    let pod = pods
        .iter()
        .find(|p| running(p))
        .or_else(|| pods.first())
        .ok_or_else(|| CollectError::NoProxyPod {
            node: node.to_string(),
            namespace: namespace.to_string(),
            selector: selector.to_string(),
        })?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let containers = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default();
    let container = containers
        .iter()
        .find(|c| c.name == "kube-proxy")
        .or_else(|| containers.first())
        .map(|c| c.name.clone());
    Ok(PodExec {
        conn: conn.clone(),
        namespace: namespace.to_string(),
        pod: name,
        container,
    })
}

/// The `exec` collector: find the kube-proxy pod on `node` and collect through it.
pub async fn collect(
    conn: &Connection,
    namespace: &str,
    selector: &str,
    node: &str,
    timeout: Duration,
) -> Result<NodeSnapshot, CollectError> {
    let runner = find_proxy_pod(conn, namespace, selector, node).await?;
    let label = format!("exec ({}/{})", runner.namespace, runner.pod);
    super::collect_with(&runner, &label, timeout).await
}
