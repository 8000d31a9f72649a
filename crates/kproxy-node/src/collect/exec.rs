//! The `exec` collector: run the dump commands in a pod through the API's exec subresource
//! (websocket, `v5.channel.k8s.io`/`v4.channel.k8s.io`), argv only, with a per-command timeout.
//!
//! [`PodExec`] also runs commands that read stdin (remote repair's `iptables-restore`): the
//! input goes on channel 0 and its end is signalled with `v5.channel.k8s.io`'s close frame.
//! `v4.channel.k8s.io` has no such signal (the client must close the whole websocket, losing
//! the exit status), so there such a run is an error rather than a guess.

use super::{CollectError, CommandOutput, CommandRunner, NodeSnapshot, RunError};
use crate::kube_client::{ApiCall, ApiError, Connection};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{Api, AttachParams};
use std::time::Duration;
use tokio::io::AsyncWriteExt;

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
        match tokio::time::timeout(timeout, self.exec(argv, None)).await {
            Ok(r) => r,
            Err(_) => Err(RunError::Timeout(timeout)),
        }
    }

    async fn run_with_stdin(
        &self,
        argv: &[&str],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<CommandOutput, RunError> {
        match tokio::time::timeout(timeout, self.exec(argv, Some(stdin))).await {
            Ok(r) => r,
            Err(_) => Err(RunError::Timeout(timeout)),
        }
    }
}

/// Why a run with stdin has no exit status: with `v4.channel.k8s.io` the client can only
/// end stdin by closing the whole websocket, after which the server cannot report the status.
const NO_STATUS_WITH_STDIN: &str = "the exec stream ended without the command's exit status; \
     the API server cannot be told that stdin ended (it does not speak v5.channel.k8s.io), \
     so commands that read stdin cannot be run through it";

impl PodExec {
    /// Execs `argv`; with `stdin`, the bytes are sent on channel 0 and stdin is closed after
    /// them (a `v5.channel.k8s.io` close signal).
    async fn exec(&self, argv: &[&str], stdin: Option<&[u8]>) -> Result<CommandOutput, RunError> {
        let api = Api::<Pod>::namespaced(self.conn.client.clone(), &self.namespace);
        let mut params = AttachParams::default()
            .stdin(stdin.is_some())
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
        let writer = match stdin {
            Some(_) => Some(
                process
                    .stdin()
                    .ok_or_else(|| exec_error("no stdin stream".into()))?,
            ),
            None => None,
        };
        let feed = async move {
            match (stdin, writer) {
                (Some(input), Some(mut w)) => {
                    w.write_all(input).await?;
                    // End of stdin: kube-rs sends the close signal for channel 0.
                    w.shutdown().await
                }
                _ => Ok(()),
            }
        };
        // Each stream within the input size limit: past it the exec ends (the process is
        // dropped, closing the stream) and the run is an error.
        let names = (
            format!("the output of `{command}` in {}", self.location()),
            format!("the error output of `{command}` in {}", self.location()),
        );
        let reading = async {
            tokio::try_join!(
                super::read_output(&mut stdout, &names.0),
                super::read_output(&mut stderr, &names.1)
            )
        };
        let (reading_done, fed, status, stream) = {
            tokio::pin!(feed, reading, status);
            // Feed stdin and read until the status comes (or the stream task ends without one,
            // dropping its sender); then stop feeding: a command that failed early stops
            // reading, and nothing would drain the rest.
            let mut fed = None;
            let mut read = None;
            let status = loop {
                tokio::select! {
                    r = &mut feed, if fed.is_none() => fed = Some(r),
                    r = &mut reading, if read.is_none() => match r {
                        Err(e) => return Err(RunError::Fatal(e.into())),
                        Ok(r) => read = Some(Ok(r)),
                    },
                    s = &mut status => break s,
                }
            };
            // The stream task has ended, so joining it cannot end stdin early; when it failed
            // (connection lost) the readers never see their end, so do not wait for them.
            let stream = process.join().await;
            let read = match (read, &stream) {
                (Some(r), _) => Some(r),
                (None, Ok(())) => Some(reading.await),
                (None, Err(_)) => None,
            };
            (read, fed, status, stream)
        };
        let no_status = |detail: String| match stdin {
            Some(_) => exec_error(format!("{NO_STATUS_WITH_STDIN} ({detail})")),
            None => exec_error(detail),
        };
        if let Err(e) = stream {
            return Err(no_status(e.to_string()));
        }
        let (out, err) = match reading_done {
            Some(read) => read.map_err(|e| RunError::Fatal(e.into()))?,
            None => (Vec::new(), Vec::new()),
        };
        if stdin.is_some() && status.is_none() {
            let detail = match fed {
                Some(Err(e)) => format!("writing stdin: {e}"),
                _ => NO_STATUS_WITH_STDIN.to_string(),
            };
            return Err(exec_error(detail));
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
        Ok(CommandOutput::exited(exit_code, stdout, stderr))
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

/// [`find_proxy_pod`], with the image of its kube-proxy container.
pub async fn find_proxy_pod_and_image(
    conn: &Connection,
    namespace: &str,
    selector: &str,
    node: &str,
) -> Result<(PodExec, Option<String>), CollectError> {
    let pods = crate::collect::api::list_pods_on_node(conn, namespace, selector, node).await?;
    let pod =
        crate::collect::api::pick_proxy_pod(&pods).ok_or_else(|| CollectError::NoProxyPod {
            node: node.to_string(),
            namespace: namespace.to_string(),
            selector: selector.to_string(),
        })?;
    Ok((
        pod_exec(conn, namespace, pod),
        crate::collect::api::kube_proxy_image(pod),
    ))
}

/// Finds the kube-proxy pod on `node` (a Running one first) and the container to exec into.
pub async fn find_proxy_pod(
    conn: &Connection,
    namespace: &str,
    selector: &str,
    node: &str,
) -> Result<PodExec, CollectError> {
    Ok(find_proxy_pod_and_image(conn, namespace, selector, node)
        .await?
        .0)
}

/// How to exec into `pod`'s kube-proxy container.
fn pod_exec(conn: &Connection, namespace: &str, pod: &Pod) -> PodExec {
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
    PodExec {
        conn: conn.clone(),
        namespace: namespace.to_string(),
        pod: name,
        container,
    }
}

/// The `exec` collector: find the kube-proxy pod on `node` and collect through it.
pub async fn collect(
    conn: &Connection,
    namespace: &str,
    selector: &str,
    node: &str,
    timeout: Duration,
) -> Result<NodeSnapshot, CollectError> {
    let (runner, image) = find_proxy_pod_and_image(conn, namespace, selector, node).await?;
    let label = format!("exec ({}/{})", runner.namespace, runner.pod);
    let mut snap = super::collect_with(&runner, &label, timeout).await?;
    snap.kube_proxy_image = image;
    Ok(snap)
}
