//! The `local` collector: run the dump commands on this host (as root, usually through
//! `kubectl kproxy verify --collector local` on the node itself). Also what the repair and
//! resync code needs of this host: running one tool to its end ([`run_blocking`]) and whether
//! kube-proxy runs here ([`kube_proxy_pid`]).

use super::{CollectError, CommandOutput, CommandRunner, NodeSnapshot, RunError};
use std::time::Duration;

/// Runs commands on this host, argv only, killed on timeout.
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalRunner;

impl CommandRunner for LocalRunner {
    fn location(&self) -> String {
        "this host".to_string()
    }

    async fn run(&self, argv: &[&str], timeout: Duration) -> Result<CommandOutput, RunError> {
        run_local(argv, None, timeout).await
    }

    async fn run_with_stdin(
        &self,
        argv: &[&str],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<CommandOutput, RunError> {
        run_local(argv, Some(stdin), timeout).await
    }
}

/// Runs `argv` on this host, feeding `stdin` (closed after it) when given.
async fn run_local(
    argv: &[&str],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<CommandOutput, RunError> {
    use tokio::io::AsyncWriteExt;
    let Some((program, args)) = argv.split_first() else {
        return Err(RunError::Missing {
            program: String::new(),
        });
    };
    let io_error = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::NotFound {
            RunError::Missing {
                program: (*program).to_string(),
            }
        } else {
            RunError::Fatal(CollectError::Io {
                path: (*program).to_string(),
                source: e,
            })
        }
    };
    let what = |stream: &str| format!("the {stream} of `{}` on this host", argv.join(" "));
    let (out_name, err_name) = (what("output"), what("error output"));
    let work = async {
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(if stdin.is_some() {
                std::process::Stdio::piped()
            } else {
                std::process::Stdio::null()
            })
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(io_error)?;
        let pipe = child.stdin.take();
        let feed = async move {
            if let (Some(input), Some(mut pipe)) = (stdin, pipe) {
                // A failing command may close stdin early; its exit status reports the real error.
                let _ = pipe.write_all(input).await;
            }
            Ok::<(), RunError>(())
        };
        let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
        // Feed and drain at the same time: a command may print before it has read everything.
        // A stream past the size limit ends the run (the child is killed when dropped).
        let ((), out, err, status) = tokio::try_join!(
            feed,
            drain(stdout, &out_name),
            drain(stderr, &err_name),
            async { child.wait().await.map_err(io_error) }
        )?;
        Ok::<_, RunError>((status, out, err))
    };
    let (status, stdout, stderr) = match tokio::time::timeout(timeout, work).await {
        Err(_) => return Err(RunError::Timeout(timeout)),
        Ok(r) => r?,
    };
    Ok(CommandOutput {
        exit_code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// What a child printed on one stream ([`super::read_output`]).
async fn drain(
    stream: Option<impl tokio::io::AsyncRead + Unpin>,
    name: &str,
) -> Result<Vec<u8>, RunError> {
    match stream {
        Some(s) => super::read_output(s, name)
            .await
            .map_err(|e| RunError::Fatal(e.into())),
        None => Ok(Vec::new()),
    }
}

/// The `local` collector.
pub async fn collect(timeout: Duration) -> Result<NodeSnapshot, CollectError> {
    super::collect_with(&LocalRunner, "local", timeout).await
}

/// This host's name (what kube-proxy uses as node name without hostnameOverride).
pub fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_lowercase())
        .filter(|s| !s.is_empty())
}

/// Runs `program args…` on this host to its end — inside the network namespace `netns` when
/// given (`ip netns exec NAME …`) — with `stdin` piped to it when given: its exit code (-1 when
/// killed by a signal), stdout and stderr, whatever the exit status. An error only when it could
/// not be started or waited for.
pub fn run_blocking(
    netns: Option<&str>,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> std::io::Result<CommandOutput> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, program]);
            c
        }
        None => Command::new(program),
    };
    cmd.args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A failing restore may close stdin early; its exit status reports the real error.
        let _ = pipe.write_all(input.as_bytes());
    }
    // Both streams drained at once. Standard output within the input size limit: past it the
    // command is stopped and the run is an error. Error output is only shown, so only the
    // limit's worth of it is kept and the rest read away (a thread that stopped reading would
    // leave the command blocked on it).
    use crate::parsers::input::{limits, read_all};
    use std::io::Read;
    let limit = limits().max_size;
    let what = |stream: &str| format!("the {stream} of `{program}` on this host");
    let errors = child.stderr.take().map(|mut s| {
        let name = what("error output");
        std::thread::spawn(move || {
            let kept = read_all(&mut (&mut s).take(limit), &name, limit, 0);
            let _ = std::io::copy(&mut s, &mut std::io::sink());
            kept.unwrap_or_default()
        })
    });
    let stdout = match child.stdout.take() {
        Some(mut s) => read_all(&mut s, &what("output"), limit, 0),
        None => Ok(Vec::new()),
    };
    let stdout = match stdout {
        Ok(out) => out,
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::io::Error::other(e));
        }
    };
    let stderr = errors.and_then(|t| t.join().ok()).unwrap_or_default();
    let status = child.wait()?;
    Ok(CommandOutput {
        exit_code: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

/// The pid of a running kube-proxy process on this host, if any (`/proc/*/comm`).
pub fn kube_proxy_pid() -> Option<u32> {
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.filter_map(Result::ok).find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == "kube-proxy").then_some(pid)
    })
}
