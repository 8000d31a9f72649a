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
    Ok(output_of(status, &stdout, &stderr))
}

/// A finished process's output; killed by signal N, its status is 128 + N as a shell says.
fn output_of(status: std::process::ExitStatus, stdout: &[u8], stderr: &[u8]) -> CommandOutput {
    use std::os::unix::process::ExitStatusExt;
    let signal = status.signal();
    CommandOutput {
        exit_code: status
            .code()
            .or_else(|| signal.map(|n| 128 + n))
            .unwrap_or(-1),
        signal,
        stdout: String::from_utf8_lossy(stdout).into_owned(),
        stderr: String::from_utf8_lossy(stderr).into_owned(),
    }
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
/// given (`ip netns exec NAME …`) — with `stdin` piped to it when given: its exit code (128 + N
/// when killed by signal N) and signal, stdout and stderr, whatever the exit status. An error only when it could
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
    Ok(output_of(status, &stdout, &stderr))
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

/// What kube-proxy's health endpoint said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyHealth {
    /// `/healthz` answered 200.
    Healthy,
    /// It answered with another status (kube-proxy answers 503 while its syncs are stale).
    Unhealthy(String),
    /// Nothing answered (no kube-proxy listening, or it did not answer in time).
    Unreachable(String),
}

/// Asks kube-proxy's `/healthz` on this host (its `healthzBindAddress`, e.g. `0.0.0.0:10256`;
/// an unspecified address is asked on loopback) whether it is healthy, as the kubelet's probe
/// of the kube-proxy pod does.
pub async fn kube_proxy_health(bind_address: &str, timeout: Duration) -> ProxyHealth {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(addr) = healthz_target(bind_address) else {
        return ProxyHealth::Unreachable(format!(
            "healthzBindAddress {bind_address:?} is not host:port"
        ));
    };
    let ask = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request =
            format!("GET /healthz HTTP/1.0\r\nHost: {addr}\r\nUser-Agent: kubectl-kproxy\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut head = Vec::new();
        // The status line is all that is needed; the body is a small JSON document.
        stream.take(4096).read_to_end(&mut head).await?;
        Ok::<_, std::io::Error>(head)
    };
    match tokio::time::timeout(timeout, ask).await {
        Err(_) => ProxyHealth::Unreachable(format!("{addr}: no answer within {timeout:?}")),
        Ok(Err(e)) => ProxyHealth::Unreachable(format!("{addr}: {e}")),
        Ok(Ok(head)) => {
            let text = String::from_utf8_lossy(&head);
            let status = text.lines().next().unwrap_or_default().trim().to_string();
            if status.split_whitespace().nth(1) == Some("200") {
                ProxyHealth::Healthy
            } else {
                ProxyHealth::Unhealthy(format!("{addr}/healthz: {status:?}"))
            }
        }
    }
}

/// Where to ask for `bind_address`'s health: its port on loopback when the address is
/// unspecified (`0.0.0.0`, `::`, empty), else the address itself.
fn healthz_target(bind_address: &str) -> Option<std::net::SocketAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let (host, port) = bind_address.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let ip: IpAddr = if host.is_empty() {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    } else {
        host.parse().ok()?
    };
    let ip = match ip {
        IpAddr::V4(v) if v.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v) if v.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        other => other,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthz_is_asked_on_loopback_for_unspecified_addresses() {
        let t = |s: &str| healthz_target(s).map(|a| a.to_string());
        assert_eq!(t("0.0.0.0:10256").as_deref(), Some("127.0.0.1:10256"));
        assert_eq!(t("[::]:10256").as_deref(), Some("[::1]:10256"));
        assert_eq!(t(":10256").as_deref(), Some("127.0.0.1:10256"));
        assert_eq!(t("10.0.0.5:10256").as_deref(), Some("10.0.0.5:10256"));
        assert_eq!(t("10256"), None);
    }

    #[tokio::test]
    async fn nothing_listening_is_unreachable() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        drop(l);
        assert!(matches!(
            kube_proxy_health(&addr, Duration::from_secs(2)).await,
            ProxyHealth::Unreachable(_)
        ));
    }
}
