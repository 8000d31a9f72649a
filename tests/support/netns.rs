//! Real-netfilter test harness: throw-away network namespaces, the real `iptables-restore` /
//! `iptables-save` binaries of both backends (nf_tables and legacy), and real TCP/UDP traffic
//! between namespaces.
//!
//! # Safety rules (enforced by construction)
//! - Every namespace is created by the test ([`Netns::new`]) and deleted when its handle drops,
//!   also when the test panics. Nothing is ever connected to the host namespace, so no packet can
//!   leave the namespaces of the test, whatever the rules under test do.
//! - Addresses (10.x, 192.168.x, fd00::/8 …) exist only inside these namespaces.
//! - Names are `kpt-<prefix>-<pid>-<n>`, unique per process, so tests run in parallel. Namespaces
//!   left behind by a process that died (e.g. `kill -9`) are swept the first time a later test
//!   process creates one.
//!
//! # How traffic is made
//! There are no helper processes: the harness runs a closure on a fresh thread that first joins
//! the namespace with `setns(2)` ([`Netns::in_ns`]). Sockets created on that thread live in that
//! namespace. Echo servers ([`Topology`]) are such threads; every TCP connection and UDP datagram
//! gets one reply line `kproxy-echo <server-name> <peer-addr> <local-addr>` (see [`Reply`]).
//!
//! # Example
//! ```ignore
//! use crate::support::netns::{addr, require_root_and_tools, Backend, Pod, Topology};
//! if !require_root_and_tools(&Backend::Nft.tools()) {
//!     return;
//! }
//! let topo = Topology::builder("dnat")
//!     .pod(Pod::new("pod-a", "10.244.1.5").tcp(8080))
//!     .build()
//!     .expect("topology");
//! topo.node()
//!     .restore(Backend::Nft, "*nat\n-A PREROUTING -d 172.30.0.10/32 -p tcp --dport 80 \
//!                             -j DNAT --to-destination 10.244.1.5:8080\nCOMMIT\n", true)
//!     .expect("restore");
//! let reply = topo.client().connect(addr("172.30.0.10:80")).expect("connect");
//! assert_eq!(reply.server, "pod-a");
//! assert_eq!(reply.peer.ip(), topo.client_ip());
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{
    IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, UdpSocket,
};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// Tools every namespace test needs; [`require_root_and_tools`] always checks them.
pub const NETNS_TOOLS: &[&str] = &["ip", "sysctl"];

/// Default timeout of one probe (TCP connect + reply, or UDP request + reply).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where `ip netns` keeps its namespace handles.
const NETNS_DIR: &str = "/run/netns";

/// Every namespace name made by this harness starts with this.
const NAME_PREFIX: &str = "kpt-";

/// Gateway address of every pod (IPv4); the node answers ARP for it by proxy-ARP (Calico's
/// routed model).
const POD_GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// Gateway address the node answers on every pod link (IPv6, link-local).
const POD_GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// How often server threads look at their stop flag.
const SERVER_POLL: Duration = Duration::from_millis(50);

/// Errors of the harness.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What the harness was doing.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A command ran but exited unsuccessfully.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// Its standard error (or standard output when stderr was empty), trimmed.
        stderr: String,
    },
    /// The test asked for something impossible (bad address, duplicate name, …).
    #[error("invalid harness input: {0}")]
    Invalid(String),
}

/// Result of harness operations.
pub type Result<T, E = HarnessError> = std::result::Result<T, E>;

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> HarnessError {
    let what = what.into();
    move |source| HarnessError::Io { what, source }
}

// ---------------------------------------------------------------------------------------------
// Tools and privileges
// ---------------------------------------------------------------------------------------------

/// `PATH` for spawned commands: the caller's `PATH` plus the sbin directories, where the
/// netfilter tools live on Debian even when the caller's `PATH` lacks them.
pub fn tool_path() -> String {
    let mut path = std::env::var("PATH").unwrap_or_default();
    for dir in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        if !path.split(':').any(|d| d == dir) {
            if !path.is_empty() {
                path.push(':');
            }
            path.push_str(dir);
        }
    }
    path
}

/// The full path of an executable found on [`tool_path`], if any.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    tool_path()
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// True when the test may run: the process is root and every tool in `tools` (plus
/// [`NETNS_TOOLS`]) is installed. Otherwise reports the skip ([`super::skip`]: a failure under
/// `KPROXY_REQUIRE_ALL`) and returns false; the caller then returns early.
///
/// ```ignore
/// if !require_root_and_tools(&Backend::Legacy.tools()) { return; }
/// ```
pub fn require_root_and_tools(tools: &[&str]) -> bool {
    DECLARED.with(|d| {
        d.borrow_mut()
            .extend(NETNS_TOOLS.iter().chain(tools).map(|t| t.to_string()));
    });
    if !rustix::process::geteuid().is_root() {
        super::skip(
            "real-netfilter test",
            "not root (real netfilter tests need root for `ip netns` and iptables)",
        );
        return false;
    }
    let missing: Vec<&str> = NETNS_TOOLS
        .iter()
        .chain(tools)
        .copied()
        .filter(|t| find_tool(t).is_none())
        .collect();
    if !missing.is_empty() {
        super::skip(
            "real-netfilter test",
            &format!("missing tools: {} (see .ci/run)", missing.join(", ")),
        );
        return false;
    }
    true
}

std::thread_local! {
    /// The tools this test thread declared with [`require_root_and_tools`]: a namespace runs
    /// only those, so a test cannot exec a tool the machine may lack without skipping first.
    static DECLARED: std::cell::RefCell<std::collections::BTreeSet<String>> =
        const { std::cell::RefCell::new(std::collections::BTreeSet::new()) };
}

/// Programs of every system (coreutils) that a test may run without declaring them.
const ALWAYS_THERE: &[&str] = &["sleep", "sh", "true", "cat"];

/// A command with the harness environment (`PATH` with sbin, `LC_ALL=C`).
fn command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("PATH", tool_path()).env("LC_ALL", "C");
    cmd
}

/// Renders a command line for error messages.
fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` to completion, feeding `stdin` (from a separate thread, so large inputs cannot
/// deadlock against a full stdout pipe). Fails only when the command cannot be started.
fn output_of(mut cmd: Command, stdin: Option<&str>) -> Result<Output> {
    let line = show(&cmd);
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(io_err(format!("cannot start `{line}`")))?;
    let writer = match (stdin, child.stdin.take()) {
        (Some(text), Some(mut pipe)) => {
            let text = text.to_owned();
            Some(std::thread::spawn(move || pipe.write_all(text.as_bytes())))
        }
        _ => None,
    };
    let output = child
        .wait_with_output()
        .map_err(io_err(format!("waiting for `{line}`")))?;
    if let Some(w) = writer {
        // A broken pipe means the command exited early; its status tells why.
        let _ = w.join();
    }
    Ok(output)
}

/// Runs `cmd` and returns its stdout; a non-zero exit is an error carrying stderr.
fn checked(cmd: Command, stdin: Option<&str>) -> Result<String> {
    let line = show(&cmd);
    let out = output_of(cmd, stdin)?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let mut stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    if stderr.is_empty() {
        stderr = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    }
    Err(HarnessError::Command {
        command: line,
        status: out.status.to_string(),
        stderr,
    })
}

/// Runs a command in the host namespace (only `ip netns …` / `ip -n …` management commands).
fn host(args: &[&str], stdin: Option<&str>) -> Result<String> {
    let (program, rest) = args
        .split_first()
        .ok_or_else(|| HarnessError::Invalid("empty command".into()))?;
    let mut cmd = command(program);
    cmd.args(rest);
    checked(cmd, stdin)
}

// ---------------------------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------------------------

/// IP family of an iptables invocation (`iptables*` vs `ip6tables*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv4: `iptables`, `iptables-restore`, `iptables-save`.
    V4,
    /// IPv6: `ip6tables`, `ip6tables-restore`, `ip6tables-save`.
    V6,
}

/// Which iptables implementation writes the kernel rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// iptables-nft (`xtables-nft-multi`): rules live in nf_tables tables `ip filter`, `ip nat` …
    Nft,
    /// iptables-legacy (`xtables-legacy-multi`): the old x_tables kernel interface.
    Legacy,
}

impl Backend {
    /// Both backends, for tests that run once per backend.
    pub const ALL: [Backend; 2] = [Backend::Nft, Backend::Legacy];

    /// `nft` or `legacy` (used in file names such as `x.nft.save`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Nft => "nft",
            Backend::Legacy => "legacy",
        }
    }

    /// The multi-call binary: `xtables-nft-multi` or `xtables-legacy-multi`.
    pub fn multi(self) -> &'static str {
        match self {
            Backend::Nft => "xtables-nft-multi",
            Backend::Legacy => "xtables-legacy-multi",
        }
    }

    /// `iptables-nft`, `ip6tables-legacy`, …
    pub fn iptables(self, family: Family) -> &'static str {
        match (self, family) {
            (Backend::Nft, Family::V4) => "iptables-nft",
            (Backend::Nft, Family::V6) => "ip6tables-nft",
            (Backend::Legacy, Family::V4) => "iptables-legacy",
            (Backend::Legacy, Family::V6) => "ip6tables-legacy",
        }
    }

    /// `iptables-nft-restore`, `ip6tables-legacy-restore`, …
    pub fn restore(self, family: Family) -> &'static str {
        match (self, family) {
            (Backend::Nft, Family::V4) => "iptables-nft-restore",
            (Backend::Nft, Family::V6) => "ip6tables-nft-restore",
            (Backend::Legacy, Family::V4) => "iptables-legacy-restore",
            (Backend::Legacy, Family::V6) => "ip6tables-legacy-restore",
        }
    }

    /// `iptables-nft-save`, `ip6tables-legacy-save`, …
    pub fn save(self, family: Family) -> &'static str {
        match (self, family) {
            (Backend::Nft, Family::V4) => "iptables-nft-save",
            (Backend::Nft, Family::V6) => "ip6tables-nft-save",
            (Backend::Legacy, Family::V4) => "iptables-legacy-save",
            (Backend::Legacy, Family::V6) => "ip6tables-legacy-save",
        }
    }

    /// Every binary of this backend, for [`require_root_and_tools`].
    pub fn tools(self) -> [&'static str; 7] {
        [
            self.multi(),
            self.iptables(Family::V4),
            self.iptables(Family::V6),
            self.restore(Family::V4),
            self.restore(Family::V6),
            self.save(Family::V4),
            self.save(Family::V6),
        ]
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

// ---------------------------------------------------------------------------------------------
// Namespaces
// ---------------------------------------------------------------------------------------------

static COUNTER: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();

/// Lower-case letters, digits and dashes only, at most 24 characters.
fn sanitize(prefix: &str) -> String {
    let s: String = prefix
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(24)
        .collect();
    if s.is_empty() { "t".into() } else { s }
}

/// The pid encoded in a harness namespace name `kpt-<prefix>-<pid>-<n>`.
fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(NAME_PREFIX)?;
    let mut parts = rest.rsplit('-');
    parts.next()?.parse::<u32>().ok()?;
    parts.next()?.parse().ok()
}

/// Deletes namespaces of earlier harness processes that no longer exist.
fn sweep_stale() {
    let Ok(entries) = std::fs::read_dir(NETNS_DIR) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = owner_pid(&name) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            kill_pids_in(&name);
            let _ = host(&["ip", "netns", "del", &name], None);
        }
    }
}

/// Kills every process whose network namespace is `name` (never this process).
fn kill_pids_in(name: &str) {
    let Ok(pids) = host(&["ip", "netns", "pids", name], None) else {
        return;
    };
    for pid in pids
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
    {
        if u32::try_from(pid).ok() == Some(std::process::id()) {
            continue;
        }
        if let Some(pid) = rustix::process::Pid::from_raw(pid) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// A network namespace owned by the test. Deleted (after killing its processes) on drop.
pub struct Netns {
    name: String,
    children: Mutex<Vec<Child>>,
    /// The tools the creating test declared (see [`require_root_and_tools`]).
    declared: std::collections::BTreeSet<String>,
}

impl fmt::Debug for Netns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Netns").field("name", &self.name).finish()
    }
}

impl Netns {
    /// Creates `kpt-<prefix>-<pid>-<n>` with `ip netns add` and brings its `lo` up.
    pub fn new(prefix: &str) -> Result<Netns> {
        SWEEP.call_once(sweep_stale);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!(
            "{NAME_PREFIX}{}-{}-{n}",
            sanitize(prefix),
            std::process::id()
        );
        host(&["ip", "netns", "add", &name], None)?;
        let ns = Netns {
            name,
            children: Mutex::new(Vec::new()),
            declared: DECLARED.with(|d| d.borrow().clone()),
        };
        ns.ip_batch("link set lo up\n")?;
        Ok(ns)
    }

    /// The namespace's name (as `ip netns list` shows it).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The namespace's handle file (`/run/netns/<name>`).
    pub fn path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// A `Command` running `args` inside the namespace (`ip netns exec <name> args…`), with the
    /// harness `PATH`. For callers that need full control (env, cwd, …).
    ///
    /// Panics when the program is a tool the test did not pass to [`require_root_and_tools`]:
    /// on a machine without it the test would fail instead of skipping.
    pub fn command(&self, args: &[&str]) -> Command {
        if let Some(program) = args.first()
            && !program.contains('/')
            && !ALWAYS_THERE.contains(program)
            && !self.declared.contains(*program)
        {
            panic!(
                "this test runs `{program}` in a namespace without require_root_and_tools(&[\"{program}\", …]): on a machine without it, it would fail instead of skipping"
            );
        }
        let mut cmd = command("ip");
        cmd.args(["netns", "exec", &self.name]).args(args);
        cmd
    }

    /// Runs `args` inside the namespace and returns its raw output, whatever the exit status.
    /// Errors only when the command cannot be started.
    pub fn exec(&self, args: &[&str]) -> Result<Output> {
        output_of(self.command(args), None)
    }

    /// Runs `args` inside the namespace; returns stdout, or an error with stderr on failure.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        checked(self.command(args), None)
    }

    /// Like [`Netns::run`], feeding `stdin` to the command.
    pub fn run_stdin(&self, args: &[&str], stdin: &str) -> Result<String> {
        checked(self.command(args), Some(stdin))
    }

    /// Starts `args` inside the namespace in the background (stdio discarded) and returns its
    /// pid. It is killed when the namespace drops.
    pub fn spawn(&self, args: &[&str]) -> Result<u32> {
        let mut cmd = self.command(args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let line = show(&cmd);
        let child = cmd
            .spawn()
            .map_err(io_err(format!("cannot start `{line}`")))?;
        let pid = child.id();
        self.children
            .lock()
            .map_err(|_| HarnessError::Invalid("child list poisoned".into()))?
            .push(child);
        Ok(pid)
    }

    /// Runs an `ip -batch` script inside the namespace (one `ip` sub-command per line, without
    /// the leading `ip`), e.g. `"link set lo up\naddr add 10.0.0.1/24 dev eth0\n"`.
    pub fn ip_batch(&self, script: &str) -> Result<()> {
        host(&["ip", "-n", &self.name, "-batch", "-"], Some(script)).map(|_| ())
    }

    /// Sets sysctls inside the namespace, e.g. `&[("net.ipv4.ip_forward", "1")]`.
    pub fn sysctl(&self, settings: &[(&str, &str)]) -> Result<()> {
        if settings.is_empty() {
            return Ok(());
        }
        let pairs: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut args = vec!["sysctl", "-q", "-w"];
        args.extend(pairs.iter().map(String::as_str));
        self.run(&args).map(|_| ())
    }

    /// Runs `f` on a new thread that has joined this namespace (`setns(2)`), and returns its
    /// result. Sockets `f` creates live in the namespace; the calling thread is unaffected.
    /// A panic in `f` is propagated.
    pub fn in_ns<T, F>(&self, f: F) -> Result<T>
    where
        T: Send,
        F: FnOnce() -> T + Send,
    {
        let handle = self.open()?;
        let joined = std::thread::scope(|s| {
            s.spawn(move || {
                move_into_link_name_space(handle.as_fd(), Some(LinkNameSpaceType::Network))
                    .map(|()| f())
            })
            .join()
        });
        match joined {
            Ok(r) => r.map_err(|e| HarnessError::Io {
                what: format!("setns into {}", self.name),
                source: e.into(),
            }),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Like [`Netns::in_ns`] for a long-running `'static` closure; returns once the thread has
    /// joined the namespace.
    fn spawn_in_ns<F>(&self, f: F) -> Result<JoinHandle<()>>
    where
        F: FnOnce() + Send + 'static,
    {
        let handle = self.open()?;
        let (tx, rx) = mpsc::channel::<io::Result<()>>();
        let thread = std::thread::spawn(move || {
            match move_into_link_name_space(handle.as_fd(), Some(LinkNameSpaceType::Network)) {
                Ok(()) => {
                    drop(handle);
                    let _ = tx.send(Ok(()));
                    f();
                }
                Err(e) => {
                    let _ = tx.send(Err(e.into()));
                }
            }
        });
        match rx.recv() {
            Ok(Ok(())) => Ok(thread),
            Ok(Err(e)) => Err(io_err(format!("setns into {}", self.name))(e)),
            Err(_) => Err(HarnessError::Invalid("namespace thread died".into())),
        }
    }

    fn open(&self) -> Result<File> {
        File::open(self.path()).map_err(io_err(format!("open {}", self.path().display())))
    }

    // ---- iptables ---------------------------------------------------------------------------

    /// `iptables-restore [--noflush]` (IPv4) with the given backend inside the namespace.
    pub fn restore(&self, backend: Backend, rules: &str, noflush: bool) -> Result<()> {
        self.restore_family(backend, Family::V4, rules, noflush)
    }

    /// `ip6tables-restore [--noflush]` with the given backend inside the namespace.
    pub fn restore6(&self, backend: Backend, rules: &str, noflush: bool) -> Result<()> {
        self.restore_family(backend, Family::V6, rules, noflush)
    }

    /// `ip[6]tables-restore -w [--noflush]` (`-w`: the legacy xtables lock is host-wide, so
    /// parallel tests wait for it instead of failing).
    pub fn restore_family(
        &self,
        backend: Backend,
        family: Family,
        rules: &str,
        noflush: bool,
    ) -> Result<()> {
        let mut args = vec![backend.restore(family), "-w"];
        if noflush {
            args.push("--noflush");
        }
        self.run_stdin(&args, rules).map(|_| ())
    }

    /// Creates (`nfacct add`) every nfacct counter that `rules` names with `--nfacct-name`, as
    /// kube-proxy does before it restores rules using them; without them the restore fails.
    /// Counters that exist already are kept.
    pub fn add_nfacct_counters(&self, rules: &str) -> Result<()> {
        let mut names: Vec<&str> = rules
            .split("--nfacct-name ")
            .skip(1)
            .filter_map(|rest| rest.split_whitespace().next())
            .collect();
        names.sort_unstable();
        names.dedup();
        let existing = if names.is_empty() {
            String::new()
        } else {
            self.run(&["nfacct", "list"])?
        };
        for name in names {
            if !existing.contains(&format!("}} = {name};")) {
                self.run(&["nfacct", "add", name])?;
            }
        }
        Ok(())
    }

    /// `ip[6]tables-restore --test`: parses and checks `rules` against the kernel without
    /// committing them.
    pub fn restore_test(&self, backend: Backend, family: Family, rules: &str) -> Result<()> {
        self.run_stdin(&[backend.restore(family), "-w", "--test"], rules)
            .map(|_| ())
    }

    /// `iptables-save [-c]` (IPv4) with the given backend.
    pub fn save(&self, backend: Backend, counters: bool) -> Result<String> {
        self.save_family(backend, Family::V4, counters)
    }

    /// `ip6tables-save [-c]` with the given backend.
    pub fn save6(&self, backend: Backend, counters: bool) -> Result<String> {
        self.save_family(backend, Family::V6, counters)
    }

    /// `ip[6]tables-save [-c]`.
    pub fn save_family(&self, backend: Backend, family: Family, counters: bool) -> Result<String> {
        let mut args = vec![backend.save(family)];
        if counters {
            args.push("-c");
        }
        self.run(&args)
    }

    /// `iptables -w <args>` (IPv4), e.g. `&["-t", "nat", "-S"]`; returns stdout.
    pub fn iptables(&self, backend: Backend, args: &[&str]) -> Result<String> {
        self.iptables_family(backend, Family::V4, args)
    }

    /// `ip6tables -w <args>`; returns stdout.
    pub fn ip6tables(&self, backend: Backend, args: &[&str]) -> Result<String> {
        self.iptables_family(backend, Family::V6, args)
    }

    /// `ip[6]tables -w <args>`; returns stdout.
    pub fn iptables_family(
        &self,
        backend: Backend,
        family: Family,
        args: &[&str],
    ) -> Result<String> {
        let mut all = vec![backend.iptables(family), "-w"];
        all.extend_from_slice(args);
        self.run(&all)
    }

    // ---- nftables ---------------------------------------------------------------------------

    /// `nft -f -` inside the namespace: `script` loads as one transaction or not at all.
    pub fn nft_load(&self, script: &str) -> Result<()> {
        self.run_stdin(&["nft", "-f", "-"], script).map(|_| ())
    }

    /// `nft <args>` inside the namespace, e.g. `&["list", "ruleset"]`; returns stdout.
    pub fn nft(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["nft"];
        all.extend_from_slice(args);
        self.run(&all)
    }

    // ---- traffic ----------------------------------------------------------------------------

    /// TCP connect from this namespace to `dst` and read the echo server's reply, with
    /// [`DEFAULT_TIMEOUT`]. Errors keep their kind: `ConnectionRefused` (REJECT / no listener),
    /// `TimedOut` (DROP / black hole), `HostUnreachable`, `NetworkUnreachable`, ….
    pub fn connect(&self, dst: SocketAddr) -> io::Result<Reply> {
        self.connect_with(&Probe::default(), dst)
    }

    /// TCP connect with a chosen source address and/or timeout (see [`Probe`]).
    pub fn connect_with(&self, probe: &Probe, dst: SocketAddr) -> io::Result<Reply> {
        let probe = probe.clone();
        self.in_ns(move || tcp_probe(&probe, dst))
            .map_err(into_io)?
    }

    /// Makes `n` TCP connections to `dst` from this namespace, one after another on one thread,
    /// and counts which server answered. Stops early at the first time-out (each would cost the
    /// whole timeout); [`Tally::attempted`] says how many were tried.
    pub fn connect_many(&self, probe: &Probe, dst: SocketAddr, n: usize) -> Result<Tally> {
        let probe = probe.clone();
        self.in_ns(move || many(n, || tcp_probe(&probe, dst)))
    }

    /// Sends one UDP datagram from this namespace to `dst` and waits for the echo reply
    /// ([`DEFAULT_TIMEOUT`]). An ICMP port-unreachable shows as `ConnectionRefused`, silence as
    /// `TimedOut`. For UDP, [`Reply::local`] has the server's bound (wildcard) address.
    pub fn udp(&self, dst: SocketAddr) -> io::Result<Reply> {
        self.udp_with(&Probe::default(), dst)
    }

    /// UDP request with a chosen source address and/or timeout.
    pub fn udp_with(&self, probe: &Probe, dst: SocketAddr) -> io::Result<Reply> {
        let probe = probe.clone();
        self.in_ns(move || udp_probe(&probe, dst))
            .map_err(into_io)?
    }

    /// `n` UDP requests (each from a fresh socket, so a new source port and conntrack entry),
    /// counted like [`Netns::connect_many`].
    pub fn udp_many(&self, probe: &Probe, dst: SocketAddr, n: usize) -> Result<Tally> {
        let probe = probe.clone();
        self.in_ns(move || many(n, || udp_probe(&probe, dst)))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Ok(mut children) = self.children.lock() {
            for child in children.iter_mut() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        kill_pids_in(&self.name);
        if let Err(e) = host(&["ip", "netns", "del", &self.name], None) {
            eprintln!(
                "warning: could not delete network namespace {}: {e}",
                self.name
            );
        }
    }
}

fn into_io(e: HarnessError) -> io::Error {
    match e {
        HarnessError::Io { source, .. } => source,
        other => io::Error::other(other.to_string()),
    }
}

// ---------------------------------------------------------------------------------------------
// Probes
// ---------------------------------------------------------------------------------------------

/// The echo server's answer to one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Name of the server that answered (the pod name, or `node`).
    pub server: String,
    /// The client address the server saw (after any SNAT/masquerade).
    pub peer: SocketAddr,
    /// The server's own address of the connection (after any DNAT). For UDP, the bound address.
    pub local: SocketAddr,
}

impl Reply {
    /// Parses `kproxy-echo <server> <peer> <local>`.
    fn parse(line: &str) -> io::Result<Reply> {
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("bad echo reply {line:?}"),
            )
        };
        let mut words = line.split_whitespace();
        if words.next() != Some("kproxy-echo") {
            return Err(bad());
        }
        let server = words.next().ok_or_else(bad)?.to_owned();
        let peer = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        let local = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        Ok(Reply {
            server,
            peer,
            local,
        })
    }

    fn line(server: &str, peer: SocketAddr, local: SocketAddr) -> String {
        format!(
            "kproxy-echo {server} {} {}\n",
            canonical(peer),
            canonical(local)
        )
    }
}

/// Maps `::ffff:a.b.c.d` (a v4 peer on a dual-stack socket) back to `a.b.c.d`.
fn canonical(a: SocketAddr) -> SocketAddr {
    SocketAddr::new(a.ip().to_canonical(), a.port())
}

/// Options of a probe: source address and timeout.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Bind the client socket to this address first (it must exist in the namespace).
    pub src: Option<IpAddr>,
    /// Time allowed for connect + reply.
    pub timeout: Duration,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            src: None,
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Probe {
    /// A probe from `src`.
    pub fn from(src: IpAddr) -> Probe {
        Probe {
            src: Some(src),
            ..Probe::default()
        }
    }

    /// The same probe with another timeout.
    pub fn timeout(mut self, timeout: Duration) -> Probe {
        self.timeout = timeout;
        self
    }
}

/// Counts of many probes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Probes made (less than asked when a time-out stopped the run).
    pub attempted: usize,
    /// Answers per server name.
    pub servers: BTreeMap<String, usize>,
    /// Answers per client address the servers saw (shows masquerading).
    pub peers: BTreeMap<IpAddr, usize>,
    /// Failures per error kind (`ConnectionRefused`, `TimedOut`, …).
    pub errors: BTreeMap<String, usize>,
}

impl Tally {
    /// Number of successful probes.
    pub fn ok(&self) -> usize {
        self.servers.values().sum()
    }

    /// Answers from `server` (0 when it never answered).
    pub fn count(&self, server: &str) -> usize {
        self.servers.get(server).copied().unwrap_or(0)
    }
}

fn many(n: usize, mut probe: impl FnMut() -> io::Result<Reply>) -> Tally {
    let mut t = Tally::default();
    for _ in 0..n {
        t.attempted += 1;
        match probe() {
            Ok(r) => {
                *t.servers.entry(r.server).or_default() += 1;
                *t.peers.entry(r.peer.ip()).or_default() += 1;
            }
            Err(e) => {
                *t.errors.entry(format!("{:?}", e.kind())).or_default() += 1;
                if e.kind() == io::ErrorKind::TimedOut {
                    break;
                }
            }
        }
    }
    t
}

fn timed_out(what: &str, dst: SocketAddr) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("{what} {dst}: timed out"))
}

fn remaining(deadline: Instant) -> Option<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
}

/// Non-blocking connect (so that it can be bound to a source address first and bounded by a
/// deadline), then one reply line.
fn tcp_probe(probe: &Probe, dst: SocketAddr) -> io::Result<Reply> {
    let deadline = Instant::now() + probe.timeout;
    let family = if dst.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    if let Some(src) = probe.src {
        rustix::net::bind(&fd, &SocketAddr::new(src, 0))?;
    }
    match rustix::net::connect(&fd, &dst) {
        Ok(()) => {}
        Err(e) if e == rustix::io::Errno::INPROGRESS => loop {
            let left = remaining(deadline).ok_or_else(|| timed_out("connect", dst))?;
            let ts = Timespec::try_from(left).map_err(|_| timed_out("connect", dst))?;
            let mut fds = [PollFd::new(&fd, PollFlags::OUT)];
            match poll(&mut fds, Some(&ts)) {
                Ok(0) => return Err(timed_out("connect", dst)),
                Ok(_) => {
                    rustix::net::sockopt::socket_error(&fd)??;
                    break;
                }
                Err(e) if e == rustix::io::Errno::INTR => continue,
                Err(e) => return Err(e.into()),
            }
        },
        Err(e) => return Err(e.into()),
    }
    let stream = TcpStream::from(fd);
    stream.set_nonblocking(false)?;
    let left = remaining(deadline).ok_or_else(|| timed_out("reply from", dst))?;
    stream.set_read_timeout(Some(left))?;
    let mut line = String::new();
    match BufReader::new(&stream).read_line(&mut line) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(timed_out("reply from", dst));
        }
        Err(e) => return Err(e),
    }
    let _ = stream.shutdown(Shutdown::Both);
    Reply::parse(&line)
}

fn udp_probe(probe: &Probe, dst: SocketAddr) -> io::Result<Reply> {
    let src = probe.src.unwrap_or(if dst.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    });
    let sock = UdpSocket::bind(SocketAddr::new(src, 0))?;
    sock.connect(dst)?;
    sock.set_read_timeout(Some(probe.timeout))?;
    sock.send(b"ping\n")?;
    let mut buf = [0u8; 512];
    let n = match sock.recv(&mut buf) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            return Err(timed_out("udp reply from", dst));
        }
        Err(e) => return Err(e),
    };
    Reply::parse(&String::from_utf8_lossy(buf.get(..n).unwrap_or_default()))
}

// ---------------------------------------------------------------------------------------------
// Echo servers
// ---------------------------------------------------------------------------------------------

/// Transport protocol of an echo server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// TCP: one reply line per connection, then close.
    Tcp,
    /// UDP: one reply datagram per datagram.
    Udp,
}

/// A server thread inside a namespace; stopped and joined on drop.
#[derive(Debug)]
pub struct EchoServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EchoServer {
    /// Starts a server called `name` on `port` of every address of `ns` (`[::]` when `dual_stack`,
    /// else `0.0.0.0`). Returns once it is listening.
    pub fn start(
        ns: &Netns,
        name: &str,
        proto: Proto,
        port: u16,
        dual_stack: bool,
    ) -> Result<EchoServer> {
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(HarnessError::Invalid(format!("server name {name:?}")));
        }
        let bind = SocketAddr::new(
            if dual_stack {
                IpAddr::V6(Ipv6Addr::UNSPECIFIED)
            } else {
                IpAddr::V4(Ipv4Addr::UNSPECIFIED)
            },
            port,
        );
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<io::Result<()>>();
        let flag = Arc::clone(&stop);
        let name = name.to_owned();
        let thread = ns.spawn_in_ns(move || {
            let result = match proto {
                Proto::Tcp => TcpListener::bind(bind).map(Listener::Tcp),
                Proto::Udp => UdpSocket::bind(bind).map(Listener::Udp),
            };
            match result {
                Ok(listener) => {
                    let _ = ready_tx.send(Ok(()));
                    listener.serve(&name, &flag);
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            }
        })?;
        let server = EchoServer {
            stop,
            thread: Some(thread),
        };
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(server),
            Ok(Err(e)) => Err(io_err(format!(
                "echo server {proto:?} {bind} in {}",
                ns.name()
            ))(e)),
            Err(_) => Err(HarnessError::Invalid("echo server thread died".into())),
        }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

enum Listener {
    Tcp(TcpListener),
    Udp(UdpSocket),
}

impl Listener {
    fn serve(self, name: &str, stop: &AtomicBool) {
        match self {
            Listener::Tcp(l) => serve_tcp(&l, name, stop),
            Listener::Udp(s) => serve_udp(&s, name, stop),
        }
    }
}

fn serve_tcp(listener: &TcpListener, name: &str, stop: &AtomicBool) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(tick) = Timespec::try_from(SERVER_POLL) else {
        return;
    };
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        match poll(&mut fds, Some(&tick)) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(e) if e == rustix::io::Errno::INTR => continue,
            Err(_) => return,
        }
        // Drain every pending connection.
        while let Ok((mut stream, peer)) = listener.accept() {
            let local = stream.local_addr().unwrap_or(peer);
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = stream.write_all(Reply::line(name, peer, local).as_bytes());
            let _ = stream.shutdown(Shutdown::Write);
        }
    }
}

fn serve_udp(sock: &UdpSocket, name: &str, stop: &AtomicBool) {
    if sock.set_read_timeout(Some(SERVER_POLL)).is_err() {
        return;
    }
    let local = sock
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let mut buf = [0u8; 512];
    while !stop.load(Ordering::Relaxed) {
        if let Ok((_, peer)) = sock.recv_from(&mut buf) {
            let _ = sock.send_to(Reply::line(name, peer, local).as_bytes(), peer);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Topology
// ---------------------------------------------------------------------------------------------

/// An address with prefix length, parsed from `"192.168.77.2/24"` or `"10.244.1.5"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Cidr {
    ip: IpAddr,
    len: u8,
}

impl Cidr {
    fn parse(s: &str, default_v4: u8, default_v6: u8) -> Result<Cidr> {
        let bad = || HarnessError::Invalid(format!("address {s:?}"));
        let (ip, len) = match s.split_once('/') {
            Some((ip, len)) => (ip, Some(len.parse::<u8>().map_err(|_| bad())?)),
            None => (s, None),
        };
        let ip: IpAddr = ip.parse().map_err(|_| bad())?;
        let len = len.unwrap_or(if ip.is_ipv4() { default_v4 } else { default_v6 });
        if len > if ip.is_ipv4() { 32 } else { 128 } {
            return Err(bad());
        }
        Ok(Cidr { ip, len })
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ip, self.len)
    }
}

/// A backend ("pod") of a [`Topology`]: its own namespace, addresses and echo ports.
#[derive(Debug, Clone)]
pub struct Pod {
    name: String,
    ips: Vec<String>,
    tcp: Vec<u16>,
    udp: Vec<u16>,
}

impl Pod {
    /// A pod called `name` (also the server name in replies) with address `ip` (IPv4 or IPv6).
    pub fn new(name: &str, ip: &str) -> Pod {
        Pod {
            name: name.to_owned(),
            ips: vec![ip.to_owned()],
            tcp: Vec::new(),
            udp: Vec::new(),
        }
    }

    /// Adds another address (e.g. the IPv6 one of a dual-stack pod).
    pub fn ip(mut self, ip: &str) -> Pod {
        self.ips.push(ip.to_owned());
        self
    }

    /// Runs a TCP echo server on `port`.
    pub fn tcp(mut self, port: u16) -> Pod {
        self.tcp.push(port);
        self
    }

    /// Runs a UDP echo server on `port`.
    pub fn udp(mut self, port: u16) -> Pod {
        self.udp.push(port);
        self
    }
}

/// Builder of a [`Topology`]; see [`Topology::builder`].
#[derive(Debug, Clone)]
pub struct TopologyBuilder {
    prefix: String,
    node_addrs: Vec<String>,
    client_addrs: Vec<String>,
    pods: Vec<Pod>,
    node_tcp: Vec<u16>,
    node_udp: Vec<u16>,
    route_localnet: bool,
    client_routes: Vec<String>,
}

impl TopologyBuilder {
    /// Replaces the node's addresses on its client-facing `eth0` (default `192.168.77.2/24`).
    /// Bare addresses get /24 (IPv4) or /64 (IPv6).
    pub fn node_addrs(mut self, addrs: &[&str]) -> Self {
        self.node_addrs = addrs.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Replaces the client's addresses on its `eth0` (default `192.168.77.3/24`). The client
    /// routes everything else to the node's first address of each family.
    pub fn client_addrs(mut self, addrs: &[&str]) -> Self {
        self.client_addrs = addrs.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    /// Routes `addr` (`"192.168.77.100"` or a CIDR) from the client via the node, for
    /// addresses inside the client's own subnet that the node should receive anyway, such as
    /// LoadBalancer ingress IPs or external IPs (a load balancer or router does that for real).
    pub fn client_route_via_node(mut self, addr: &str) -> Self {
        self.client_routes.push(addr.to_owned());
        self
    }

    /// Adds a pod.
    pub fn pod(mut self, pod: Pod) -> Self {
        self.pods.push(pod);
        self
    }

    /// Runs echo servers named `node` in the node namespace itself (host-network endpoints).
    pub fn serve_on_node(mut self, tcp: &[u16], udp: &[u16]) -> Self {
        self.node_tcp.extend_from_slice(tcp);
        self.node_udp.extend_from_slice(udp);
        self
    }

    /// Sets `net.ipv4.conf.all.route_localnet` in the node (default on, as kube-proxy sets it
    /// for localhost NodePorts).
    pub fn route_localnet(mut self, on: bool) -> Self {
        self.route_localnet = on;
        self
    }

    /// Creates the namespaces, links, addresses, routes and echo servers.
    pub fn build(self) -> Result<Topology> {
        let node_addrs = parse_all(&self.node_addrs, 24, 64)?;
        let client_addrs = parse_all(&self.client_addrs, 24, 64)?;
        let node_v4 = first_v4(&node_addrs);
        let node_v6 = first_v6(&node_addrs);
        let mut names = std::collections::BTreeSet::new();
        for p in &self.pods {
            if p.name == "node" || !names.insert(p.name.clone()) {
                return Err(HarnessError::Invalid(format!(
                    "duplicate or reserved pod name {:?}",
                    p.name
                )));
            }
        }

        let no_dad = [
            ("net.ipv6.conf.all.accept_dad", "0"),
            ("net.ipv6.conf.default.accept_dad", "0"),
        ];
        let node = Netns::new(&format!("{}-node", self.prefix))?;
        let client = Netns::new(&format!("{}-client", self.prefix))?;
        let localnet = if self.route_localnet { "1" } else { "0" };
        node.sysctl(&[
            no_dad[0],
            no_dad[1],
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv6.conf.all.forwarding", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            ("net.ipv4.conf.all.route_localnet", localnet),
        ])?;
        client.sysctl(&no_dad)?;

        // Node <-> client link: eth0 on both sides.
        let mut node_script = format!(
            "link add eth0 type veth peer name eth0 netns {}\n",
            client.name()
        );
        for a in &node_addrs {
            node_script += &format!("addr add {a} dev eth0{}\n", nodad(a));
        }
        node_script += "link set eth0 up\n";
        // Default route into a black hole, like a real node's uplink: OUTPUT DNAT needs a route
        // for virtual IPs, and whatever no rule redirects is dropped inside the node (the
        // uplink is a veth whose peer stays down, so it transmits nothing).
        node_script += "link add uplink type veth peer name uplink-peer\nlink set uplink up\n";
        node_script += "route add 0.0.0.0/0 dev uplink\nroute add ::/0 dev uplink\n";
        let mut client_script = String::new();
        for a in &client_addrs {
            client_script += &format!("addr add {a} dev eth0{}\n", nodad(a));
        }
        client_script += "link set eth0 up\n";
        if let Some(gw) = node_v4 {
            client_script += &format!("route add default via {gw} dev eth0\n");
        }
        if let Some(gw) = node_v6 {
            client_script += &format!("route add default via {gw} dev eth0\n");
        }
        for route in parse_all(&self.client_routes, 32, 128)? {
            let gw = if route.ip.is_ipv4() { node_v4 } else { node_v6 };
            let gw = gw.ok_or_else(|| {
                HarnessError::Invalid(format!("no node address of the family of {route}"))
            })?;
            client_script += &format!("route add {route} via {gw} dev eth0\n");
        }

        // Pods: routed veths (Calico style), node side answers the gateway addresses.
        let mut pods = Vec::new();
        let mut pod_scripts = Vec::new();
        for (i, pod) in self.pods.iter().enumerate() {
            let ips = parse_all(&pod.ips, 32, 128)?
                .into_iter()
                .map(|c| Cidr {
                    ip: c.ip,
                    len: if c.ip.is_ipv4() { 32 } else { 128 },
                })
                .collect::<Vec<_>>();
            let ns = Netns::new(&format!("{}-{}", self.prefix, pod.name))?;
            ns.sysctl(&no_dad)?;
            let dev = format!("p{i}");
            node_script += &format!(
                "link add {dev} type veth peer name eth0 netns {}\n",
                ns.name()
            );
            node_script += &format!("addr add {POD_GATEWAY_V6}/64 dev {dev} nodad\n");
            node_script += &format!("link set {dev} up\n");
            let mut script = String::new();
            for c in &ips {
                script += &format!("addr add {c} dev eth0{}\n", nodad(c));
                let src = match c.ip {
                    IpAddr::V4(_) => node_v4.map(|s| format!(" src {s}")),
                    IpAddr::V6(_) => node_v6.map(|s| format!(" src {s}")),
                };
                node_script += &format!("route add {c} dev {dev}{}\n", src.unwrap_or_default());
            }
            script += "link set eth0 up\n";
            script += &format!("route add {POD_GATEWAY_V4} dev eth0 scope link\n");
            script += &format!("route add default via {POD_GATEWAY_V4} dev eth0\n");
            script += &format!("route add default via {POD_GATEWAY_V6} dev eth0\n");
            pod_scripts.push(script);
            pods.push((pod.clone(), ips, ns));
        }

        node.ip_batch(&node_script)?;
        // The node answers ARP for the pods' gateway 169.254.1.1 without owning it (so that
        // MASQUERADE picks the node IP, not a link address), at once (proxy_delay 0: the
        // default delays proxy replies by up to 0.8 s).
        let proxy_arp: Vec<(String, &str)> = (0..pods.len())
            .flat_map(|i| {
                [
                    (format!("net.ipv4.conf.p{i}.proxy_arp"), "1"),
                    (format!("net.ipv4.neigh.p{i}.proxy_delay"), "0"),
                ]
            })
            .collect();
        node.sysctl(
            &proxy_arp
                .iter()
                .map(|(k, v)| (k.as_str(), *v))
                .collect::<Vec<_>>(),
        )?;
        client.ip_batch(&client_script)?;
        for ((_, _, ns), script) in pods.iter().zip(&pod_scripts) {
            ns.ip_batch(script)?;
        }

        let mut servers = Vec::new();
        for (pod, ips, ns) in &pods {
            let dual = ips.iter().any(|c| c.ip.is_ipv6());
            for &port in &pod.tcp {
                servers.push(EchoServer::start(ns, &pod.name, Proto::Tcp, port, dual)?);
            }
            for &port in &pod.udp {
                servers.push(EchoServer::start(ns, &pod.name, Proto::Udp, port, dual)?);
            }
        }
        for &port in &self.node_tcp {
            servers.push(EchoServer::start(&node, "node", Proto::Tcp, port, true)?);
        }
        for &port in &self.node_udp {
            servers.push(EchoServer::start(&node, "node", Proto::Udp, port, true)?);
        }

        Ok(Topology {
            servers,
            pods: pods
                .into_iter()
                .map(|(p, ips, ns)| (p.name, ips.into_iter().map(|c| c.ip).collect(), ns))
                .collect(),
            client,
            node,
            node_addrs: node_addrs.iter().map(|c| c.ip).collect(),
            client_addrs: client_addrs.iter().map(|c| c.ip).collect(),
        })
    }
}

fn parse_all(addrs: &[String], v4: u8, v6: u8) -> Result<Vec<Cidr>> {
    addrs.iter().map(|a| Cidr::parse(a, v4, v6)).collect()
}

fn first_v4(addrs: &[Cidr]) -> Option<IpAddr> {
    addrs.iter().map(|c| c.ip).find(IpAddr::is_ipv4)
}

fn first_v6(addrs: &[Cidr]) -> Option<IpAddr> {
    addrs.iter().map(|c| c.ip).find(IpAddr::is_ipv6)
}

fn nodad(c: &Cidr) -> &'static str {
    if c.ip.is_ipv6() { " nodad" } else { "" }
}

/// A small "cluster" in namespaces:
///
/// ```text
///   client ns                 node ns (rules under test)                 pod ns (one per pod)
///   eth0 192.168.77.3/24 ──── eth0 192.168.77.2/24
///   default via node                p0 (proxy_arp, fe80::1) ───────────── eth0 10.244.1.5/32
///                                   route 10.244.1.5/32 dev p0 src        default via 169.254.1.1
///                                     192.168.77.2                        (v6: via fe80::1)
///                                   uplink (veth, peer down): default     echo servers
///                                     route into a black hole
///                                   ip_forward=1, route_localnet=1
/// ```
///
/// Pods are routed (no bridge, so no br_netfilter surprises); the node forwards between client
/// and pods, so PREROUTING/FORWARD/POSTROUTING see client traffic and OUTPUT sees node traffic.
/// Dropping the topology stops the servers and deletes every namespace.
#[derive(Debug)]
pub struct Topology {
    // Field order is drop order: servers stop before their namespaces go.
    servers: Vec<EchoServer>,
    pods: Vec<(String, Vec<IpAddr>, Netns)>,
    client: Netns,
    node: Netns,
    node_addrs: Vec<IpAddr>,
    client_addrs: Vec<IpAddr>,
}

impl Topology {
    /// Starts a topology; `prefix` appears in the namespace names. Defaults: node
    /// `192.168.77.2/24`, client `192.168.77.3/24`, no pods, route_localnet on.
    pub fn builder(prefix: &str) -> TopologyBuilder {
        TopologyBuilder {
            prefix: sanitize(prefix),
            node_addrs: vec!["192.168.77.2/24".into()],
            client_addrs: vec!["192.168.77.3/24".into()],
            pods: Vec::new(),
            node_tcp: Vec::new(),
            node_udp: Vec::new(),
            route_localnet: true,
            client_routes: Vec::new(),
        }
    }

    /// The node namespace (load rules here; probes from it take the OUTPUT path).
    pub fn node(&self) -> &Netns {
        &self.node
    }

    /// The client namespace (probes from it take PREROUTING → FORWARD/INPUT on the node).
    pub fn client(&self) -> &Netns {
        &self.client
    }

    /// A pod's namespace by name.
    pub fn pod(&self, name: &str) -> Option<&Netns> {
        self.pods
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, ns)| ns)
    }

    /// A pod's addresses by name.
    pub fn pod_ips(&self, name: &str) -> &[IpAddr] {
        self.pods
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, ips, _)| ips.as_slice())
            .unwrap_or_default()
    }

    /// Pod names in creation order.
    pub fn pod_names(&self) -> Vec<&str> {
        self.pods.iter().map(|(n, _, _)| n.as_str()).collect()
    }

    /// The node's addresses on `eth0`.
    pub fn node_addrs(&self) -> &[IpAddr] {
        &self.node_addrs
    }

    /// The client's addresses on `eth0`.
    pub fn client_addrs(&self) -> &[IpAddr] {
        &self.client_addrs
    }

    /// The node's first address (default 192.168.77.2).
    pub fn node_ip(&self) -> IpAddr {
        self.node_addrs
            .first()
            .copied()
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }

    /// The client's first address (default 192.168.77.3).
    pub fn client_ip(&self) -> IpAddr {
        self.client_addrs
            .first()
            .copied()
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED))
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Signal every server first, then join them: each notices within one poll interval.
        for server in &self.servers {
            server.stop.store(true, Ordering::Relaxed);
        }
        self.servers.clear();
    }
}

/// Parses `"ip:port"` / `"[v6]:port"`; panics with the bad text (test helper).
pub fn addr(s: &str) -> SocketAddr {
    match s.parse() {
        Ok(a) => a,
        Err(e) => panic!("bad socket address {s:?}: {e}"),
    }
}

/// Parses an IP address; panics with the bad text (test helper).
pub fn ip(s: &str) -> IpAddr {
    match s.parse() {
        Ok(a) => a,
        Err(e) => panic!("bad IP address {s:?}: {e}"),
    }
}
