//! Running `iptables-save` / `iptables-restore` on this host (optionally inside a named network
//! namespace), for one IP family and backend. Commands are argv vectors, never shell strings, and
//! the restore input goes through stdin.

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
        let fam = if self.ipv6 { "ip6tables" } else { "iptables" };
        match self.backend {
            Backend::Auto => format!("{fam}-{tool}"),
            Backend::Nft => format!("{fam}-nft-{tool}"),
            Backend::Legacy => format!("{fam}-legacy-{tool}"),
        }
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

    /// The `-w` argument: the lock wait in whole seconds (at least 1).
    fn wait_arg(&self) -> String {
        self.wait.as_secs().max(1).to_string()
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
        let program = self.program("restore");
        let mut cmd = self.command(&program);
        cmd.args(["-w", &self.wait_arg(), "--noflush"]);
        run(cmd, &program, Some(input)).map(|_| ())
    }

    /// `iptables-restore -w N --counters` of a whole `iptables-save` output: every table in it is
    /// replaced exactly (used to roll back to a backup).
    pub fn restore_exact(&self, saved: &str) -> Result<(), HostError> {
        let program = self.program("restore");
        let mut cmd = self.command(&program);
        cmd.args(["-w", &self.wait_arg(), "--counters"]);
        run(cmd, &program, Some(saved)).map(|_| ())
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
