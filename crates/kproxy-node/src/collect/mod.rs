//! Node collectors: the only place that reads a node's rules (files, local commands, pod exec,
//! debug pod, bundle).
//!
//! Every collector fills the same [`NodeSnapshot`] by running the same [`DUMP_COMMANDS`]
//! (argv vectors, never shell strings) through a [`CommandRunner`]:
//!
//! | collector   | runner |
//! |-------------|--------|
//! | `exec`      | [`exec::PodExec`]: the kube-proxy pod on the node, through the API's exec websocket |
//! | `debug-pod` | [`debug_pod`]: a short-lived privileged hostNetwork pod pinned to the node, deleted afterwards |
//! | `local`     | [`local::LocalRunner`]: this host |
//! | `files`     | [`files`]: the offline `--iptables-save …` flags (no runner) |
//!
//! [`ipvs_dumps`] reads an IPVS node's dumps given as files (`--ipvsadm`, `--ipset`, …).
//! [`bundle`] writes and reads a snapshot plus API state and configuration as one tar.gz;
//! [`api`] lists the API state and kube-proxy's configuration, [`watch`] keeps watching them;
//! [`fleet`] reads the monitor's node conditions and its agents' findings (`status`).
//! [`events`] follows the changes of the node's nf_tables rules, so that a reader can keep
//! what it read while nothing changed ([`collect_keeping`]).
//! This module and `crate::kube_client` are the only code that runs programs or calls the API.

pub mod api;
pub mod bundle;
pub mod debug_pod;
pub mod events;
pub mod exec;
pub mod files;
pub mod fleet;
pub mod ipvs_dumps;
pub mod local;
pub mod netns;
pub mod watch;

use std::time::Duration;

/// Everything read from one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSnapshot {
    /// `iptables-save` output (the default backend of the collecting image).
    pub iptables_save: Option<String>,
    /// `ip6tables-save` output.
    pub ip6tables_save: Option<String>,
    /// `iptables-legacy-save` output, when that binary exists.
    pub iptables_legacy_save: Option<String>,
    /// `iptables-nft-save` output, when that binary exists.
    pub iptables_nft_save: Option<String>,
    /// `ipset save` output.
    pub ipset_save: Option<String>,
    /// `ipvsadm -Ln --exact` output.
    pub ipvsadm: Option<String>,
    /// `conntrack -L -o extended` output, or `/proc/net/nf_conntrack` when the tool is missing.
    pub conntrack: Option<String>,
    /// `nft -j list table ip kube-proxy` output (nftables mode) when `nft` ran; empty when the
    /// node has no such table.
    pub nft_kube_proxy: Option<String>,
    /// `nft -j list table ip6 kube-proxy` output when `nft` ran; empty when the node has no
    /// such table.
    pub nft_kube_proxy6: Option<String>,
    /// Which collector produced it, e.g. `exec (kube-system/kube-proxy-x7k2p)`, `files`, `bundle`.
    pub collector: String,
    /// The image of the node's kube-proxy container, when the collector saw its pod (it tells
    /// which kube-proxy release wrote the rules).
    pub kube_proxy_image: Option<String>,
    /// Things the user should know (a binary missing in the image, …), one line each.
    pub warnings: Vec<String>,
}

/// Which field of [`NodeSnapshot`] a command fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpKind {
    /// `iptables-save`.
    IptablesSave,
    /// `ip6tables-save`.
    Ip6tablesSave,
    /// `iptables-legacy-save`.
    IptablesLegacySave,
    /// `iptables-nft-save`.
    IptablesNftSave,
    /// `ipset save`.
    IpsetSave,
    /// `ipvsadm -Ln --exact`.
    Ipvsadm,
    /// `conntrack -L -o extended` (or `cat /proc/net/nf_conntrack`).
    Conntrack,
    /// `nft -j list table ip kube-proxy`.
    NftKubeProxy,
    /// `nft -j list table ip6 kube-proxy`.
    NftKubeProxy6,
}

impl DumpKind {
    /// All kinds, in collection order.
    pub const ALL: [DumpKind; 9] = [
        DumpKind::IptablesSave,
        DumpKind::Ip6tablesSave,
        DumpKind::IptablesLegacySave,
        DumpKind::IptablesNftSave,
        DumpKind::IpsetSave,
        DumpKind::Ipvsadm,
        DumpKind::Conntrack,
        DumpKind::NftKubeProxy,
        DumpKind::NftKubeProxy6,
    ];

    /// The file name used in bundles.
    pub fn file_name(self) -> &'static str {
        match self {
            DumpKind::IptablesSave => "iptables-save.txt",
            DumpKind::Ip6tablesSave => "ip6tables-save.txt",
            DumpKind::IptablesLegacySave => "iptables-legacy-save.txt",
            DumpKind::IptablesNftSave => "iptables-nft-save.txt",
            DumpKind::IpsetSave => "ipset-save.txt",
            DumpKind::Ipvsadm => "ipvsadm.txt",
            DumpKind::Conntrack => "conntrack.txt",
            DumpKind::NftKubeProxy => "nft-ip-kube-proxy.json",
            DumpKind::NftKubeProxy6 => "nft-ip6-kube-proxy.json",
        }
    }

    /// The slot in a snapshot.
    pub fn slot(self, s: &mut NodeSnapshot) -> &mut Option<String> {
        match self {
            DumpKind::IptablesSave => &mut s.iptables_save,
            DumpKind::Ip6tablesSave => &mut s.ip6tables_save,
            DumpKind::IptablesLegacySave => &mut s.iptables_legacy_save,
            DumpKind::IptablesNftSave => &mut s.iptables_nft_save,
            DumpKind::IpsetSave => &mut s.ipset_save,
            DumpKind::Ipvsadm => &mut s.ipvsadm,
            DumpKind::Conntrack => &mut s.conntrack,
            DumpKind::NftKubeProxy => &mut s.nft_kube_proxy,
            DumpKind::NftKubeProxy6 => &mut s.nft_kube_proxy6,
        }
    }

    /// The value in a snapshot.
    pub fn get(self, s: &NodeSnapshot) -> Option<&str> {
        match self {
            DumpKind::IptablesSave => s.iptables_save.as_deref(),
            DumpKind::Ip6tablesSave => s.ip6tables_save.as_deref(),
            DumpKind::IptablesLegacySave => s.iptables_legacy_save.as_deref(),
            DumpKind::IptablesNftSave => s.iptables_nft_save.as_deref(),
            DumpKind::IpsetSave => s.ipset_save.as_deref(),
            DumpKind::Ipvsadm => s.ipvsadm.as_deref(),
            DumpKind::Conntrack => s.conntrack.as_deref(),
            DumpKind::NftKubeProxy => s.nft_kube_proxy.as_deref(),
            DumpKind::NftKubeProxy6 => s.nft_kube_proxy6.as_deref(),
        }
    }
}

/// How much a command matters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Collection fails without it.
    Required,
    /// Missing or failing: a warning in the snapshot.
    Warn,
    /// Run only when present; absence is normal.
    IfPresent,
    /// The object it lists may not exist: a command that fails because the object is absent
    /// (`No such file or directory`, as `nft list table` says of a table the node does not
    /// have) is normal; a missing binary is a warning (once per program: the commands after
    /// it that need the same program are not run).
    IfExists,
}

/// One command a collector runs on the node.
#[derive(Debug, Clone, Copy)]
pub struct DumpCommand {
    /// What it fills.
    pub kind: DumpKind,
    /// The argv (program first); never passed through a shell.
    pub argv: &'static [&'static str],
    /// How much it matters.
    pub need: Need,
}

/// The commands every runner-based collector runs, in order.
pub const DUMP_COMMANDS: &[DumpCommand] = &[
    DumpCommand {
        kind: DumpKind::IptablesSave,
        argv: &["iptables-save"],
        need: Need::Required,
    },
    DumpCommand {
        kind: DumpKind::Ip6tablesSave,
        argv: &["ip6tables-save"],
        need: Need::Warn,
    },
    DumpCommand {
        kind: DumpKind::IptablesLegacySave,
        argv: &["iptables-legacy-save"],
        need: Need::IfPresent,
    },
    DumpCommand {
        kind: DumpKind::IptablesNftSave,
        argv: &["iptables-nft-save"],
        need: Need::IfPresent,
    },
    DumpCommand {
        kind: DumpKind::IpsetSave,
        argv: &["ipset", "save"],
        need: Need::Warn,
    },
    DumpCommand {
        kind: DumpKind::Ipvsadm,
        argv: &["ipvsadm", "-Ln", "--exact"],
        need: Need::Warn,
    },
    // The connection-tracking table (flows that still go to gone endpoints, findings KP6xx):
    // the tool's extended listing, or the kernel's own when the image has no `conntrack`.
    DumpCommand {
        kind: DumpKind::Conntrack,
        argv: &["conntrack", "-L", "-o", "extended"],
        need: Need::IfPresent,
    },
    DumpCommand {
        kind: DumpKind::Conntrack,
        argv: &["cat", "/proc/net/nf_conntrack"],
        need: Need::IfPresent,
    },
    // kube-proxy's nftables-mode tables (findings KP7xx); only nodes in nftables mode have them.
    DumpCommand {
        kind: DumpKind::NftKubeProxy,
        argv: &["nft", "-j", "list", "table", "ip", "kube-proxy"],
        need: Need::IfExists,
    },
    DumpCommand {
        kind: DumpKind::NftKubeProxy6,
        argv: &["nft", "-j", "list", "table", "ip6", "kube-proxy"],
        need: Need::IfExists,
    },
];

/// What running one command produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// Exit status (0 = success; 128 + N when signal N ended it, as a shell reports it).
    pub exit_code: i32,
    /// The signal that ended the command, when the runner knows it (a local run).
    pub signal: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl CommandOutput {
    /// An output of a command that exited with `exit_code`.
    pub fn exited(exit_code: i32, stdout: String, stderr: String) -> CommandOutput {
        CommandOutput {
            exit_code,
            signal: None,
            stdout,
            stderr,
        }
    }

    /// The signal that ended the command: the runner's word, else an exit status of 129–192,
    /// which is how shells and container runtimes report one (`kubectl exec` says 139 for a
    /// SIGSEGV); none of the dump commands exits above 128 by itself.
    pub fn killed_by(&self) -> Option<i32> {
        self.signal.or_else(|| {
            (129..=192)
                .contains(&self.exit_code)
                .then(|| self.exit_code - 128)
        })
    }
}

/// The name of signal `n` (`SIGSEGV`), for messages.
pub fn signal_name(n: i32) -> String {
    let name = match n {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        15 => "SIGTERM",
        _ => return format!("signal {n}"),
    };
    format!("{name} (signal {n})")
}

/// The shell script of [`with_large_stack`]: the stack's soft limit raised to unlimited (else
/// to the hard limit, when raising that is not allowed), then the command itself.
const LARGE_STACK_SCRIPT: &str =
    "ulimit -s unlimited 2>/dev/null || ulimit -s \"$(ulimit -H -s)\"; exec \"$0\" \"$@\"";

/// `argv` run with the largest stack the node allows: `iptables-save` of iptables 1.8.x
/// recurses deeply on a ruleset of tens of thousands of chains and dies of a SIGSEGV with the
/// usual 8 MB stack, and succeeds with a larger one. A fixed script; `argv` stays argv
/// (`"$0" "$@"`), never shell text.
pub fn with_large_stack<'a>(argv: &[&'a str]) -> Vec<&'a str> {
    let mut out = vec!["sh", "-c", LARGE_STACK_SCRIPT];
    out.extend_from_slice(argv);
    out
}

/// Where the program of `argv` is: after the [`with_large_stack`] wrapper, else first.
pub fn program_index(argv: &[&str]) -> usize {
    match argv {
        ["sh", "-c", script, _, ..] if *script == LARGE_STACK_SCRIPT => 3,
        _ => 0,
    }
}

/// Why a command did not produce output.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The program does not exist where the runner runs it.
    #[error("{program}: executable not found")]
    Missing {
        /// The program.
        program: String,
    },
    /// The per-command timeout expired.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Transport or API failure (fatal for the whole collection).
    #[error(transparent)]
    Fatal(#[from] CollectError),
}

/// Something that runs an argv on a node.
pub trait CommandRunner {
    /// Where commands run, for messages: `pod kube-system/kube-proxy-x`, `this host`.
    fn location(&self) -> String;
    /// Runs `argv` (no shell) with a timeout; its stdin is empty.
    fn run(
        &self,
        argv: &[&str],
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<CommandOutput, RunError>> + Send;
    /// Runs `argv` (no shell) with a timeout, `stdin` piped to it and closed after the last
    /// byte (e.g. `iptables-restore` input). Unlike [`CommandRunner::run`], a run whose exit
    /// status cannot be known is an error, never a success.
    fn run_with_stdin(
        &self,
        argv: &[&str],
        stdin: &[u8],
        timeout: Duration,
    ) -> impl std::future::Future<Output = Result<CommandOutput, RunError>> + Send;
}

/// Errors of collectors.
#[derive(Debug, thiserror::Error)]
pub enum CollectError {
    /// An API call failed.
    #[error(transparent)]
    Api(Box<crate::kube_client::ApiError>),
    /// No kube-proxy pod runs on the node.
    #[error(
        "no kube-proxy pod on node {node:?}: no pod in namespace {namespace:?} matches label selector {selector:?} with spec.nodeName={node} (set --proxy-selector, or use --collector debug-pod)"
    )]
    NoProxyPod {
        /// Node.
        node: String,
        /// Namespace searched.
        namespace: String,
        /// Label selector used.
        selector: String,
    },
    /// A required binary is missing.
    #[error(
        "`{program}` is not installed in {location}; use a collector whose image has it (e.g. --collector debug-pod --image IMAGE)"
    )]
    BinaryMissing {
        /// The program.
        program: String,
        /// Where it was looked for.
        location: String,
    },
    /// A command did not finish in time.
    #[error("`{command}` on {location} did not finish within {timeout:?} (raise --exec-timeout)")]
    Timeout {
        /// The command line.
        command: String,
        /// Where.
        location: String,
        /// The limit.
        timeout: Duration,
    },
    /// A command was killed by a signal (also when read again with a larger stack): what it
    /// printed before is not used.
    #[error(
        "`{command}` on {location} was killed by {signal}{again}: nothing it printed is used (a dump cut short would read as rules deleted)"
    )]
    Killed {
        /// The command line.
        command: String,
        /// Where.
        location: String,
        /// The signal, named.
        signal: String,
        /// What became of the second try with an unlimited stack, when there was one
        /// (`, and by SIGSEGV (signal 11) with an unlimited stack`).
        again: String,
    },
    /// A required command exited non-zero.
    #[error("`{command}` on {location} exited with status {code}: {stderr}")]
    CommandFailed {
        /// The command line.
        command: String,
        /// Where.
        location: String,
        /// Exit status.
        code: i32,
        /// Its standard error (trimmed).
        stderr: String,
    },
    /// The output does not look like what the command prints.
    #[error(
        "`{command}` on {location} printed something that is not {what} (line {line}: {excerpt:?})"
    )]
    Garbage {
        /// The command line.
        command: String,
        /// Where.
        location: String,
        /// What was expected.
        what: &'static str,
        /// 1-based line of the first bad line.
        line: usize,
        /// The bad line, shortened.
        excerpt: String,
    },
    /// The exec stream failed.
    #[error("exec of `{command}` on {location} failed: {detail}")]
    Exec {
        /// The command line.
        command: String,
        /// Where.
        location: String,
        /// What went wrong.
        detail: String,
    },
    /// The debug pod did not start.
    #[error("debug pod {namespace}/{name} on node {node:?} did not become Running: {detail}")]
    DebugPod {
        /// Namespace.
        namespace: String,
        /// Pod name.
        name: String,
        /// Node.
        node: String,
        /// Why.
        detail: String,
    },
    /// Ctrl-C.
    #[error("interrupted")]
    Interrupted,
    /// An input file is not text a parser can read (a NUL byte).
    #[error(transparent)]
    Parse(Box<crate::parsers::ParseError>),
    /// An input could not be read, or is larger than the limit or silent longer than the wait
    /// ([`crate::parsers::input`]).
    #[error(transparent)]
    Input(#[from] crate::parsers::input::InputError),
    /// Reading an input file or bundle.
    #[error("reading {path}")]
    Io {
        /// The path.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A bundle is malformed.
    #[error("bundle {path}: {detail}")]
    Bundle {
        /// The path.
        path: String,
        /// Why.
        detail: String,
    },
}

impl CollectError {
    /// Whether trying again may succeed: the API unreachable or overloaded, or an exec stream
    /// that broke. What the node itself said (no kube-proxy pod, a missing program, a command
    /// that failed or timed out, output that is not a dump) will be said again.
    pub fn is_transient(&self) -> bool {
        match self {
            CollectError::Api(e) => e.is_transient(),
            CollectError::Exec { .. } => true,
            _ => false,
        }
    }
}

impl From<crate::kube_client::ApiError> for CollectError {
    fn from(e: crate::kube_client::ApiError) -> Self {
        CollectError::Api(Box::new(e))
    }
}

/// Reads what a command prints on one of its streams to the end, within the input size limit
/// ([`crate::parsers::input::limits`]): a command that prints more is an error naming it (`what`,
/// e.g. `` `iptables-save` on this host ``), whoever prints it, and the caller stops the command.
pub async fn read_output(
    mut stream: impl tokio::io::AsyncRead + Unpin,
    what: &str,
) -> Result<Vec<u8>, crate::parsers::input::InputError> {
    use crate::parsers::input::{Gather, InputError, limits};
    use tokio::io::AsyncReadExt;
    let mut gather = Gather::new(what, limits().max_size, 0);
    let mut chunk = vec![0u8; 1 << 16];
    loop {
        match stream.read(&mut chunk).await {
            Ok(0) => return Ok(gather.finish()),
            Ok(n) => gather.push(&chunk[..n])?,
            Err(e) => return Err(InputError::from_io(what, e)),
        }
    }
}

/// Runs [`DUMP_COMMANDS`] through `runner`, checks each output's shape, and fills a snapshot.
///
/// A missing `Warn` or `IfExists` binary, a failing `Warn` command or garbage from one becomes
/// a warning; the same for the `Required` `iptables-save` is an error; `IfPresent` commands
/// that are missing are skipped silently, `IfExists` ones that list an absent object too.
pub async fn collect_with<R: CommandRunner>(
    runner: &R,
    collector: &str,
    timeout: Duration,
) -> Result<NodeSnapshot, CollectError> {
    collect_keeping(runner, collector, timeout, &NodeSnapshot::default(), &[]).await
}

/// [`collect_with`], with the outputs of `kinds` taken from `kept` (an earlier snapshot of the
/// same node that still stands for it: [`events`] said nothing changed) instead of running
/// their commands again; the others are run.
pub async fn collect_keeping<R: CommandRunner>(
    runner: &R,
    collector: &str,
    timeout: Duration,
    kept: &NodeSnapshot,
    kinds: &[DumpKind],
) -> Result<NodeSnapshot, CollectError> {
    let location = runner.location();
    let mut snap = NodeSnapshot {
        collector: collector.to_string(),
        kube_proxy_image: kept.kube_proxy_image.clone(),
        ..NodeSnapshot::default()
    };
    for kind in kinds {
        *kind.slot(&mut snap) = kind.get(kept).map(str::to_string);
    }
    let mut missing: Vec<&str> = Vec::new();
    for cmd in DUMP_COMMANDS {
        if cmd.kind.get(&snap).is_some() {
            // An earlier command already filled this slot (the conntrack fallback).
            continue;
        }
        let line = cmd.argv.join(" ");
        let program = cmd.argv.first().copied().unwrap_or_default();
        if missing.contains(&program) {
            // Already reported (`nft` lists two tables).
            continue;
        }
        if let Some(text) = same_backend_as_main(cmd.kind, &snap) {
            *cmd.kind.slot(&mut snap) = Some(text);
            continue;
        }
        let problem: CollectError = match run_surviving_crash(runner, cmd, timeout, &mut snap).await
        {
            Ok((out, again)) if out.killed_by().is_some() => CollectError::Killed {
                command: line.clone(),
                location: location.clone(),
                signal: signal_name(out.killed_by().unwrap_or_default()),
                again,
            },
            Ok((out, _)) if out.exit_code == 0 => match check_shape(cmd.kind, &out.stdout) {
                Ok(()) => {
                    *cmd.kind.slot(&mut snap) = Some(out.stdout);
                    continue;
                }
                Err((what, line_no, excerpt)) => CollectError::Garbage {
                    command: line.clone(),
                    location: location.clone(),
                    what,
                    line: line_no,
                    excerpt,
                },
            },
            Ok((out, _)) if out.exit_code == 127 => CollectError::BinaryMissing {
                program: program.to_string(),
                location: location.clone(),
            },
            Ok((out, _)) => CollectError::CommandFailed {
                command: line.clone(),
                location: location.clone(),
                code: out.exit_code,
                stderr: shorten(out.stderr.trim(), 300),
            },
            Err(RunError::Missing { program }) => CollectError::BinaryMissing {
                program,
                location: location.clone(),
            },
            Err(RunError::Timeout(t)) => CollectError::Timeout {
                command: line.clone(),
                location: location.clone(),
                timeout: t,
            },
            Err(RunError::Fatal(e)) => return Err(e),
        };
        if matches!(problem, CollectError::BinaryMissing { .. }) {
            missing.push(program);
        }
        match (cmd.need, &problem) {
            (Need::Required, _) => return Err(problem),
            (Need::IfPresent, CollectError::BinaryMissing { .. }) => {}
            // Listed, and absent: an empty listing (kube-proxy's nftables table on a node of
            // another mode, or one whose table was deleted, which verify reports).
            (Need::IfExists, CollectError::CommandFailed { stderr, .. })
                if stderr.contains("No such file or directory") =>
            {
                *cmd.kind.slot(&mut snap) = Some(String::new());
            }
            _ => snap.warnings.push(problem.to_string()),
        }
    }
    Ok(snap)
}

/// The outputs of `snap` that [`events`] covers: those read from nf_tables — kube-proxy's
/// nftables tables, `iptables-nft-save`, and `iptables-save`/`ip6tables-save` when their header
/// says `(nf_tables)`. The others (the legacy backend, ipsets, IPVS, conntrack) change without
/// an event and must be read every time.
pub fn nf_tables_kinds(snap: &NodeSnapshot) -> Vec<DumpKind> {
    let nf_tables = |text: &str| {
        text.lines()
            .take_while(|l| l.starts_with('#'))
            .any(|l| l.starts_with("# Generated by") && l.contains("(nf_tables)"))
    };
    DumpKind::ALL
        .into_iter()
        .filter(|k| match (k, k.get(snap)) {
            (_, None) => false,
            (DumpKind::NftKubeProxy | DumpKind::NftKubeProxy6 | DumpKind::IptablesNftSave, _) => {
                true
            }
            (DumpKind::IptablesSave | DumpKind::Ip6tablesSave, Some(t)) => nf_tables(t),
            _ => false,
        })
        .collect()
}

/// The backend `iptables-save` read, from its header (`# Generated by iptables-save v1.8.9
/// (nf_tables) on …`): `nf_tables` or `legacy`; `None` without a header (no tables at all).
fn save_backend(text: &str) -> Option<&str> {
    let header = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .find(|l| l.starts_with("# Generated by iptables"))?;
    let (_, rest) = header.split_once(" (")?;
    let (backend, _) = rest.split_once(')')?;
    matches!(backend, "nf_tables" | "legacy").then_some(backend)
}

/// The text of `iptables-save` for the backend-specific save of the same backend
/// (`iptables-nft-save` when `iptables-save` read nf_tables): the same tables, and on a large
/// node the same half a minute or more of CPU to read them again.
fn same_backend_as_main(kind: DumpKind, snap: &NodeSnapshot) -> Option<String> {
    let main = snap.iptables_save.as_deref()?;
    let backend = match kind {
        DumpKind::IptablesNftSave => "nf_tables",
        DumpKind::IptablesLegacySave => "legacy",
        _ => return None,
    };
    (save_backend(main) == Some(backend)).then(|| main.to_string())
}

/// Whether `kind` is the output of an `iptables-save` (of either family or backend).
fn is_save(kind: DumpKind) -> bool {
    matches!(
        kind,
        DumpKind::IptablesSave
            | DumpKind::Ip6tablesSave
            | DumpKind::IptablesLegacySave
            | DumpKind::IptablesNftSave
    )
}

/// Runs `cmd`; an `iptables-save` killed by a signal (the stack overflow of a huge ruleset) is
/// run once more with the largest stack the node allows ([`with_large_stack`]), and the
/// snapshot says so when that reads it. Otherwise the output of the first run comes back,
/// with what became of the second one (`, and again …`) for the caller's message: a killed
/// run's output is never used.
async fn run_surviving_crash<R: CommandRunner>(
    runner: &R,
    cmd: &DumpCommand,
    timeout: Duration,
    snap: &mut NodeSnapshot,
) -> Result<(CommandOutput, String), RunError> {
    let out = runner.run(cmd.argv, timeout).await?;
    let Some(signal) = out.killed_by().filter(|_| is_save(cmd.kind)) else {
        return Ok((out, String::new()));
    };
    let again = match runner.run(&with_large_stack(cmd.argv), timeout).await {
        Ok(a) if a.exit_code == 0 => {
            snap.warnings.push(format!(
                "`{}` on {} was killed by {} with the default stack (iptables-save overflows it on a very large ruleset); read again with an unlimited stack",
                cmd.argv.join(" "),
                runner.location(),
                signal_name(signal)
            ));
            return Ok((a, String::new()));
        }
        Ok(a) => match a.killed_by() {
            Some(n) => format!(", and by {} with an unlimited stack", signal_name(n)),
            None => format!(
                ", and run with an unlimited stack it exited with status {}: {}",
                a.exit_code,
                shorten(a.stderr.trim(), 200)
            ),
        },
        Err(RunError::Fatal(e)) => return Err(RunError::Fatal(e)),
        Err(e) => format!(", and run with an unlimited stack: {e}"),
    };
    Ok((out, again))
}

/// Checks that `text` looks like the output of the command filling `kind`; on failure returns
/// (what was expected, 1-based line, excerpt). Empty output is valid (nothing configured).
pub fn check_shape(kind: DumpKind, text: &str) -> Result<(), (&'static str, usize, String)> {
    let lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
        .filter(|(_, l)| !l.trim().is_empty());
    match kind {
        DumpKind::IptablesSave
        | DumpKind::Ip6tablesSave
        | DumpKind::IptablesLegacySave
        | DumpKind::IptablesNftSave => {
            let what = "iptables-save output";
            let mut in_table = false;
            for (n, l) in lines {
                let ok = if l.starts_with('#') {
                    true
                } else if l.starts_with('*') {
                    in_table = true;
                    true
                } else {
                    in_table
                        && (l.starts_with(':')
                            || l.starts_with("-A ")
                            || l.starts_with("-I ")
                            || l.starts_with("-N ")
                            || l.starts_with("-X")
                            || l.starts_with("-F")
                            || l.starts_with("[")
                            || l == "COMMIT")
                };
                if !ok {
                    return Err((what, n, shorten(l, 80)));
                }
                if l == "COMMIT" {
                    in_table = false;
                }
            }
            Ok(())
        }
        DumpKind::IpsetSave => {
            for (n, l) in lines {
                if !(l.starts_with("create ") || l.starts_with("add ")) {
                    return Err(("`ipset save` output", n, shorten(l, 80)));
                }
            }
            Ok(())
        }
        DumpKind::Ipvsadm => match lines.into_iter().next() {
            Some((_, l)) if l.starts_with("IP Virtual Server version") => Ok(()),
            Some((n, l)) => Err(("`ipvsadm -Ln` output", n, shorten(l, 80))),
            None => Ok(()),
        },
        // `nft -j` prints one JSON object; `nft list` text starts with a table (or a warning).
        DumpKind::NftKubeProxy | DumpKind::NftKubeProxy6 => match lines.into_iter().next() {
            Some((_, l))
                if l.trim_start().starts_with('{')
                    || l.starts_with("table ")
                    || l.starts_with('#') =>
            {
                Ok(())
            }
            Some((n, l)) => Err(("`nft list` output", n, shorten(l, 80))),
            None => Ok(()),
        },
        // The first line must be a flow (or conntrack's summary line): the parser decides.
        DumpKind::Conntrack => match lines.into_iter().next() {
            Some((n, l)) => kproxy_parsers::conntrack::parse(l, Default::default())
                .map(|_| ())
                .map_err(|_| ("a conntrack listing", n, shorten(l, 80))),
            None => Ok(()),
        },
    }
}

/// Cuts `s` to at most `max` characters, marking the cut.
pub fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let cut: String = s.chars().take(max).collect();
        format!("{cut}…")
    }
}

/// Whether an nft listing (`nft list`, `nft -j list` or `nft -f` text) holds a `kube-proxy`
/// table of family `ip` or `ip6` (a look at the text, not a parse).
pub fn holds_kube_proxy_table(text: &str) -> bool {
    let t = text.trim_start();
    if t.starts_with('{') {
        // `{"table": {"family": "ip", "name": "kube-proxy", …}}`
        return t.contains("\"name\": \"kube-proxy\"") || t.contains("\"name\":\"kube-proxy\"");
    }
    t.lines().any(|l| {
        let mut w = l.split_whitespace();
        let first = w.next();
        let first = if first == Some("add") {
            w.next()
        } else {
            first
        };
        first == Some("table")
            && matches!(w.next(), Some("ip" | "ip6"))
            && w.next()
                .is_some_and(|n| n.trim_end_matches('{') == "kube-proxy")
    })
}

/// The dump of the *other* iptables backend, when the node has rules there: the
/// `iptables-legacy-save` or `iptables-nft-save` output that differs from `iptables-save`
/// (ignoring `#` comment lines) and has tables. Returns (label, text).
pub fn other_backend(s: &NodeSnapshot) -> Option<(&'static str, &str)> {
    fn body(t: &str) -> Vec<&str> {
        t.lines()
            .map(str::trim_end)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    }
    let mut main: Option<Vec<&str>> = None;
    [
        ("iptables-legacy-save", s.iptables_legacy_save.as_deref()),
        ("iptables-nft-save", s.iptables_nft_save.as_deref()),
    ]
    .into_iter()
    .filter_map(|(label, t)| Some((label, t?)))
    .find(|(_, t)| {
        let b = body(t);
        b.iter().any(|l| l.starts_with('*'))
            && *main.get_or_insert_with(|| body(s.iptables_save.as_deref().unwrap_or_default()))
                != b
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_accepts_real_iptables_save() {
        let t = "# Generated by iptables-save v1.8.7\n*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n# Completed\n";
        assert!(check_shape(DumpKind::IptablesSave, t).is_ok());
        assert!(check_shape(DumpKind::IptablesSave, "").is_ok());
    }

    #[test]
    fn shape_rejects_garbage_with_line() {
        let t = "*nat\nCOMMIT\nsh: 1: oops\n";
        let e = check_shape(DumpKind::IptablesSave, t).err();
        assert_eq!(e.map(|e| e.1), Some(3));
        assert!(check_shape(DumpKind::IpsetSave, "hello").is_err());
        assert!(check_shape(DumpKind::Ipvsadm, "nonsense").is_err());
        assert!(
            check_shape(
                DumpKind::Ipvsadm,
                "IP Virtual Server version 1.2.1 (size=4096)\n"
            )
            .is_ok()
        );
    }

    #[test]
    fn other_backend_is_the_one_that_differs() {
        let mut s = NodeSnapshot {
            iptables_save: Some("# v1.8 (nf_tables)\n*nat\n-A X -j Y\nCOMMIT\n".into()),
            iptables_nft_save: Some("# other stamp\n*nat\n-A X -j Y\nCOMMIT\n".into()),
            iptables_legacy_save: Some("# nothing\n".into()),
            ..NodeSnapshot::default()
        };
        assert_eq!(other_backend(&s), None);
        s.iptables_legacy_save = Some("*nat\n-A OLD -j Z\nCOMMIT\n".into());
        assert_eq!(other_backend(&s).map(|o| o.0), Some("iptables-legacy-save"));
    }

    #[test]
    fn kube_proxy_tables_are_seen_in_every_listing_form() {
        assert!(holds_kube_proxy_table(
            "{\"nftables\": [{\"table\": {\"family\": \"ip\", \"name\": \"kube-proxy\", \"handle\": 1}}]}"
        ));
        assert!(holds_kube_proxy_table("table ip kube-proxy {\n}\n"));
        assert!(holds_kube_proxy_table(
            "add table ip6 kube-proxy { comment \"x\" ; }\n"
        ));
        assert!(!holds_kube_proxy_table(
            "table inet kube-proxy-other {\n}\n"
        ));
    }

    /// Runs a stand-in for `iptables-save` (the other commands are missing) through the real
    /// local runner: `script` gets the argv's words after the program.
    struct SaveScript {
        script: std::path::PathBuf,
        calls: std::sync::Mutex<Vec<String>>,
    }

    impl CommandRunner for SaveScript {
        fn location(&self) -> String {
            "the test".into()
        }

        async fn run(&self, argv: &[&str], timeout: Duration) -> Result<CommandOutput, RunError> {
            if let Ok(mut c) = self.calls.lock() {
                c.push(argv.join(" "));
            }
            let at = program_index(argv);
            if argv.get(at) != Some(&"iptables-save") {
                return Err(RunError::Missing {
                    program: argv.get(at).copied().unwrap_or_default().into(),
                });
            }
            let script = self.script.to_string_lossy().into_owned();
            let mut real: Vec<&str> = argv.to_vec();
            real[at] = &script;
            local::LocalRunner.run(&real, timeout).await
        }

        async fn run_with_stdin(
            &self,
            argv: &[&str],
            _stdin: &[u8],
            timeout: Duration,
        ) -> Result<CommandOutput, RunError> {
            self.run(argv, timeout).await
        }
    }

    fn save_script(body: &str) -> (tempfile::TempDir, SaveScript) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("iptables-save");
        std::fs::write(&script, format!("#!/bin/sh\n{body}")).expect("write");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let runner = SaveScript {
            script,
            calls: Default::default(),
        };
        (dir, runner)
    }

    const DUMP: &str = "printf '*nat\\n:KUBE-SERVICES - [0:0]\\nCOMMIT\\n'\n";

    #[tokio::test]
    async fn a_save_killed_by_its_stack_is_read_again_with_an_unlimited_one() {
        // As iptables-save 1.8.9 on a huge ruleset: half a dump, then a SIGSEGV, unless the
        // stack is unlimited.
        let (_dir, runner) = save_script(&format!(
            "if [ \"$(ulimit -s)\" != unlimited ]; then printf '*nat\\n'; kill -SEGV $$; fi\n{DUMP}"
        ));
        let snap = collect_with(&runner, "test", Duration::from_secs(10))
            .await
            .expect("read again");
        assert_eq!(
            snap.iptables_save.as_deref(),
            Some("*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n")
        );
        assert!(
            snap.warnings
                .iter()
                .any(|w| w.contains("killed by SIGSEGV (signal 11)")
                    && w.contains("unlimited stack")),
            "{:?}",
            snap.warnings
        );
        let calls = runner.calls.lock().map(|c| c.clone()).unwrap_or_default();
        assert_eq!(calls[0], "iptables-save");
        assert!(
            calls[1].starts_with("sh -c ulimit -s unlimited"),
            "{calls:?}"
        );
    }

    #[tokio::test]
    async fn a_save_killed_every_time_is_an_error_never_a_dump() {
        let (_dir, runner) = save_script("printf '*nat\\nCOMMIT\\n'; kill -SEGV $$\n");
        let e = collect_with(&runner, "test", Duration::from_secs(10))
            .await
            .expect_err("no dump");
        let text = e.to_string();
        assert!(matches!(e, CollectError::Killed { .. }), "{text}");
        assert!(
            text.contains(
                "killed by SIGSEGV (signal 11), and by SIGSEGV (signal 11) with an unlimited stack"
            ),
            "{text}"
        );
        // A command that is not a save is not run again.
        let out = CommandOutput::exited(137, String::new(), String::new());
        assert_eq!(out.killed_by(), Some(9));
        assert_eq!(
            CommandOutput::exited(2, String::new(), String::new()).killed_by(),
            None
        );
    }

    #[test]
    fn only_nf_tables_outputs_are_covered_by_events() {
        let snap = NodeSnapshot {
            iptables_save: Some(
                "# Generated by iptables-save v1.8.9 (nf_tables) on Sun Dec  6 02:00:00 2026\n*nat\nCOMMIT\n".into(),
            ),
            ip6tables_save: Some(
                "# Generated by ip6tables-save v1.8.9 (legacy) on Sun Dec  6 02:00:00 2026\n*nat\nCOMMIT\n".into(),
            ),
            iptables_legacy_save: Some(String::new()),
            iptables_nft_save: Some("*nat\nCOMMIT\n".into()),
            ipset_save: Some(String::new()),
            conntrack: Some(String::new()),
            nft_kube_proxy: Some(String::new()),
            ..NodeSnapshot::default()
        };
        assert_eq!(
            nf_tables_kinds(&snap),
            [
                DumpKind::IptablesSave,
                DumpKind::IptablesNftSave,
                DumpKind::NftKubeProxy
            ]
        );
    }

    #[tokio::test]
    async fn the_backend_iptables_save_read_is_not_read_twice() {
        let (_dir, runner) = save_script(
            "echo '# Generated by iptables-save v1.8.9 (nf_tables) on Sun Dec  6 02:00:00 2026'; echo '*nat'; echo COMMIT\n",
        );
        let snap = collect_with(&runner, "test", Duration::from_secs(10))
            .await
            .expect("collect");
        assert_eq!(snap.iptables_nft_save, snap.iptables_save);
        assert!(snap.iptables_save.is_some());
        // The other backend is still run (missing here, so absent).
        assert_eq!(snap.iptables_legacy_save, None);
        let calls = runner.calls.lock().map(|c| c.clone()).unwrap_or_default();
        assert!(
            calls.iter().any(|c| c == "iptables-legacy-save"),
            "{calls:?}"
        );
        assert!(!calls.iter().any(|c| c == "iptables-nft-save"), "{calls:?}");
        assert_eq!(
            save_backend("# Generated by iptables-save v1.8.7 (legacy) on x\n*nat\n"),
            Some("legacy")
        );
        assert_eq!(
            save_backend("# Generated by iptables-save v1.8.7 on x\n*nat\n"),
            None
        );
        assert_eq!(save_backend("*nat\nCOMMIT\n"), None);
    }

    #[tokio::test]
    async fn kept_outputs_are_not_read_again() {
        let (_dir, runner) = save_script("echo '*nat'; echo COMMIT\n");
        let kept = NodeSnapshot {
            iptables_save: Some("*filter\nCOMMIT\n".into()),
            ..NodeSnapshot::default()
        };
        let snap = collect_keeping(
            &runner,
            "test",
            Duration::from_secs(10),
            &kept,
            &[DumpKind::IptablesSave],
        )
        .await
        .expect("collect");
        assert_eq!(snap.iptables_save, kept.iptables_save);
        let calls = runner.calls.lock().map(|c| c.clone()).unwrap_or_default();
        assert!(!calls.iter().any(|c| c == "iptables-save"), "{calls:?}");
        let fresh = collect_keeping(&runner, "test", Duration::from_secs(10), &kept, &[])
            .await
            .expect("collect");
        assert_eq!(fresh.iptables_save.as_deref(), Some("*nat\nCOMMIT\n"));
    }

    #[test]
    fn nft_listings_are_optional() {
        assert!(check_shape(DumpKind::NftKubeProxy, "{\"nftables\": []}\n").is_ok());
        assert!(check_shape(DumpKind::NftKubeProxy6, "table ip6 kube-proxy {\n}\n").is_ok());
        assert!(check_shape(DumpKind::NftKubeProxy, "Error: syntax error\n").is_err());
    }
}
