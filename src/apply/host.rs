//! Running `iptables-save` / `iptables-restore` on this host (optionally inside a named network
//! namespace), for one IP family and backend. Commands are argv vectors, never shell strings, and
//! the restore input goes through stdin. [`RulesHost`] is what the repair transaction needs of a
//! host; [`IptablesHost`] implements it here, [`crate::apply::remote::RemoteHost`] through the API.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

/// Which iptables userspace to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Whatever `iptables-save`/`iptables-restore` point to on this host.
    Auto,
    /// `iptables-nft-*`.
    Nft,
    /// `iptables-legacy-*`.
    Legacy,
}

/// Errors from running the iptables tools.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The program could not be started (missing binary, no permission).
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// Program name.
        program: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The program ran and failed.
    #[error("{program} failed (exit {code}): {stderr}")]
    Failed {
        /// Program name.
        program: String,
        /// Its exit code (-1 when killed by a signal).
        code: i32,
        /// What it printed on stderr.
        stderr: String,
    },
    /// The program could not be run on a remote node (API or exec stream failure, binary
    /// missing in the pod's image, timeout).
    #[error("{program} on {location}: {detail}")]
    Remote {
        /// Program name.
        program: String,
        /// Where it ran, e.g. `pod kube-system/kube-proxy-x7k2p`.
        location: String,
        /// What went wrong.
        detail: String,
    },
}

/// The rules of one IP family of one node, as a repair reads and writes them: this host
/// ([`IptablesHost`]) or a node reached through the API ([`crate::apply::remote::RemoteHost`]).
/// Inputs are `iptables-restore` text sent on stdin, never shell strings.
pub trait RulesHost {
    /// True for IPv6 (`ip6tables-*`).
    fn ipv6(&self) -> bool;
    /// `iptables-save` of every table (`counters` adds `-c`).
    fn save(&self, counters: bool) -> Result<String, HostError>;
    /// `iptables-restore -w N --test --noflush` of `input`: checks it without changing anything.
    fn restore_test(&self, input: &str) -> Result<(), HostError>;
    /// `iptables-restore -w N --noflush` of `input` (only the chains it declares are flushed).
    fn restore_noflush(&self, input: &str) -> Result<(), HostError>;
    /// `iptables-restore -w N --counters` of a whole `iptables-save` output: every table in it
    /// is replaced exactly (used to roll back to a backup).
    fn restore_exact(&self, saved: &str) -> Result<(), HostError>;
}

/// The program name of `tool` (`save`, `restore`) for a family and backend:
/// `iptables-save`, `ip6tables-nft-restore`, `iptables-legacy-save`, …
pub fn tool_name(ipv6: bool, backend: Backend, tool: &str) -> String {
    let fam = if ipv6 { "ip6tables" } else { "iptables" };
    match backend {
        Backend::Auto => format!("{fam}-{tool}"),
        Backend::Nft => format!("{fam}-nft-{tool}"),
        Backend::Legacy => format!("{fam}-legacy-{tool}"),
    }
}

/// The `-w` argument of `iptables-restore`: the xtables lock wait in whole seconds (at least 1).
pub fn lock_wait_arg(wait: Duration) -> String {
    wait.as_secs().max(1).to_string()
}

/// The `iptables-restore` arguments after the program name of each way of restoring.
pub mod restore_args {
    /// `--test --noflush`: check only.
    pub const TEST: &[&str] = &["--test", "--noflush"];
    /// `--noflush`: apply a plan.
    pub const NOFLUSH: &[&str] = &["--noflush"];
    /// `--counters`: replace whole tables from a backup.
    pub const EXACT: &[&str] = &["--counters"];
}

/// The iptables tools of one family and backend on this host.
#[derive(Debug, Clone)]
pub struct IptablesHost {
    /// True for IPv6 (`ip6tables-*`).
    pub ipv6: bool,
    /// Which userspace.
    pub backend: Backend,
    /// Run inside this network namespace (`ip netns exec NAME …`), for tests and containers.
    pub netns: Option<String>,
    /// Seconds to wait for the xtables lock (`-w`).
    pub wait: Duration,
}

impl IptablesHost {
    fn program(&self, tool: &str) -> String {
        tool_name(self.ipv6, self.backend, tool)
    }

    fn command(&self, program: &str) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        }
    }

    fn wait_arg(&self) -> String {
        lock_wait_arg(self.wait)
    }

    /// `iptables-save` of every table (`counters` adds `-c`).
    pub fn save(&self, counters: bool) -> Result<String, HostError> {
        let program = self.program("save");
        let mut cmd = self.command(&program);
        if counters {
            cmd.arg("-c");
        }
        run(cmd, &program, None)
    }

    /// The names of the nfacct objects that exist (`nfacct list`), or `None` when the `nfacct` tool
    /// is missing or fails (then kube-proxy's counters are treated as unavailable).
    pub fn nfacct_objects(&self) -> Option<Vec<String>> {
        let mut cmd = self.command("nfacct");
        cmd.arg("list");
        let out = run(cmd, "nfacct", None).ok()?;
        Some(
            out.lines()
                .filter_map(|l| {
                    l.rsplit_once('=')
                        .map(|(_, n)| n.trim().trim_end_matches(';').trim().to_string())
                })
                .filter(|n| !n.is_empty())
                .collect(),
        )
    }

    /// `iptables-restore -w N --noflush` of `input` (only the chains it declares are flushed).
    pub fn restore_noflush(&self, input: &str) -> Result<(), HostError> {
        self.restore(restore_args::NOFLUSH, input)
    }

    /// `iptables-restore -w N --counters` of a whole `iptables-save` output: every table in it is
    /// replaced exactly (used to roll back to a backup).
    pub fn restore_exact(&self, saved: &str) -> Result<(), HostError> {
        self.restore(restore_args::EXACT, saved)
    }

    fn restore(&self, args: &[&str], input: &str) -> Result<(), HostError> {
        let program = self.program("restore");
        let mut cmd = self.command(&program);
        cmd.args(["-w", &self.wait_arg()]).args(args);
        run(cmd, &program, Some(input)).map(|_| ())
    }
}

impl RulesHost for IptablesHost {
    fn ipv6(&self) -> bool {
        self.ipv6
    }

    fn save(&self, counters: bool) -> Result<String, HostError> {
        IptablesHost::save(self, counters)
    }

    fn restore_test(&self, input: &str) -> Result<(), HostError> {
        self.restore(restore_args::TEST, input)
    }

    fn restore_noflush(&self, input: &str) -> Result<(), HostError> {
        IptablesHost::restore_noflush(self, input)
    }

    fn restore_exact(&self, saved: &str) -> Result<(), HostError> {
        IptablesHost::restore_exact(self, saved)
    }
}

fn run(mut cmd: Command, program: &str, stdin: Option<&str>) -> Result<String, HostError> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let spawn_err = |source| HostError::Spawn {
        program: program.to_string(),
        source,
    };
    let mut child = cmd.spawn().map_err(spawn_err)?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A failing restore may close stdin early; its exit status reports the real error.
        let _ = pipe.write_all(input.as_bytes());
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(HostError::Failed {
            program: program.to_string(),
            code: out.status.code().unwrap_or(-1),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
