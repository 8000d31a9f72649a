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
            .spawn()?;
        let pipe = child.stdin.take();
        let feed = async move {
            if let (Some(input), Some(mut pipe)) = (stdin, pipe) {
                // A failing command may close stdin early; its exit status reports the real error.
                let _ = pipe.write_all(input).await;
            }
        };
        // Feed and drain at the same time: a command may print before it has read everything.
        let ((), output) = tokio::join!(feed, child.wait_with_output());
        output
    };
    let output = match tokio::time::timeout(timeout, work).await {
        Err(_) => return Err(RunError::Timeout(timeout)),
        Ok(Err(e)) => return Err(io_error(e)),
        Ok(Ok(o)) => o,
    };
    Ok(CommandOutput {
        exit_code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
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
    let out = child.wait_with_output()?;
    Ok(CommandOutput {
        exit_code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// The pid of a kube-proxy process (`/proc/*/comm`) running in the network namespace whose
/// rules a repair or resync writes: the named one (`ip netns` name, `/run/netns/NAME`), else
/// this process's own. Two writers of the same chains undo each other's work; a kube-proxy of
/// another namespace writes other rules. When a namespace cannot be told (no such name, a
/// process whose namespace is unreadable) the process counts as writing the same rules.
pub fn kube_proxy_pid(netns: Option<&str>) -> Option<u32> {
    let target = match netns {
        Some(name) => netns_id(&std::path::Path::new("/run/netns").join(name)),
        None => netns_id(std::path::Path::new("/proc/self/ns/net")),
    };
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.filter_map(Result::ok).find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        if comm.trim() != "kube-proxy" {
            return None;
        }
        let same = match (target, netns_id(&e.path().join("ns/net"))) {
            (Some(t), Some(p)) => t == p,
            _ => true,
        };
        same.then_some(pid)
    })
}

/// The identity of a network namespace file (device and inode of its nsfs entry).
fn netns_id(path: &std::path::Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    Some((m.dev(), m.ino()))
}
