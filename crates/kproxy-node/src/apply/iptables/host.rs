//! Running `iptables-save` / `iptables-restore` for one IP family and backend. [`RulesHost`] is
//! what the repair transaction needs of a node's rules and builds every save/restore argv once;
//! [`IptablesHost`] implements it on this host (optionally inside a named network namespace),
//! [`super::remote::RemoteHost`] through the API.

use crate::apply::host::{HostError, local_command_line, run_local};
use std::path::Path;
use std::time::Duration;

/// Which iptables userspace to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Whatever `iptables-save`/`iptables-restore` point to on this host.
    Auto,
    /// `iptables-nft-*`.
    Nft,
    /// `iptables-legacy-*`.
    Legacy,
}

/// The rules of one IP family of one node, as a repair reads and writes them: this host
/// ([`IptablesHost`]) or a node reached through the API ([`crate::apply::iptables::remote::RemoteHost`]).
/// Inputs are `iptables-restore` text sent on stdin, never shell strings.
///
/// An implementation says how to run one tool ([`RulesHost::run_tool`]); the argv of every
/// save and restore is built here, once.
pub trait RulesHost {
    /// True for IPv6 (`ip6tables-*`).
    fn ipv6(&self) -> bool;
    /// How long to wait for the xtables lock (`iptables-restore -w`).
    fn lock_wait(&self) -> Duration;
    /// Runs the family's and backend's `tool` (`save`, `restore`, see [`tool_name`]) with `args`,
    /// `stdin` piped to it when given, and returns its stdout.
    fn run_tool(&self, tool: &str, args: &[&str], stdin: Option<&str>)
    -> Result<String, HostError>;

    /// `iptables-save` of every table (`counters` adds `-c`).
    fn save(&self, counters: bool) -> Result<String, HostError> {
        let args: &[&str] = if counters { &["-c"] } else { &[] };
        self.run_tool("save", args, None)
    }
    /// `iptables-restore -w N --test --noflush` of `input`: checks it without changing anything.
    fn restore_test(&self, input: &str) -> Result<(), HostError> {
        self.restore(restore_args::TEST, input)
    }
    /// `iptables-restore -w N --noflush` of `input` (only the chains it declares are flushed).
    fn restore_noflush(&self, input: &str) -> Result<(), HostError> {
        self.restore(restore_args::NOFLUSH, input)
    }
    /// `iptables-restore -w N MODE…` of `input` (`mode` is one of [`restore_args`]).
    fn restore(&self, mode: &[&str], input: &str) -> Result<(), HostError> {
        self.restore_waiting(self.lock_wait(), mode, input)
    }
    /// [`RulesHost::restore`] with another xtables lock wait (a rollback has its own).
    fn restore_waiting(&self, wait: Duration, mode: &[&str], input: &str) -> Result<(), HostError> {
        let args = restore_argv(wait, mode);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run_tool("restore", &args, Some(input)).map(|_| ())
    }
    /// The command line that runs the family's and backend's `tool` with `args` by hand where
    /// this host's commands run, its stdin read from `stdin_file`: what to tell a user who
    /// must finish a rollback.
    fn by_hand(&self, tool: &str, args: &[String], stdin_file: &Path) -> String;
}

/// The arguments of `iptables-restore -w N MODE…`.
pub fn restore_argv(wait: Duration, mode: &[&str]) -> Vec<String> {
    let mut args = vec!["-w".to_string(), lock_wait_arg(wait)];
    args.extend(mode.iter().map(|m| m.to_string()));
    args
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
    /// `--noflush --counters`: put back chains from a backup, with their rules' counters
    /// (a rollback: only the chains its input declares are flushed).
    pub const ROLLBACK: &[&str] = &["--noflush", "--counters"];
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
    /// The names of the nfacct objects that exist (`nfacct list`), or `None` when the `nfacct` tool
    /// is missing or fails (then kube-proxy's counters are treated as unavailable).
    pub fn nfacct_objects(&self) -> Option<Vec<String>> {
        let out = run_local(self.netns.as_deref(), "nfacct", &["list"], None).ok()?;
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
}

impl RulesHost for IptablesHost {
    fn ipv6(&self) -> bool {
        self.ipv6
    }

    fn lock_wait(&self) -> Duration {
        self.wait
    }

    fn run_tool(
        &self,
        tool: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, HostError> {
        let program = tool_name(self.ipv6, self.backend, tool);
        run_local(self.netns.as_deref(), &program, args, stdin)
    }

    /// `[ip netns exec NAME] PROGRAM ARGS… < FILE`.
    fn by_hand(&self, tool: &str, args: &[String], stdin_file: &Path) -> String {
        let program = tool_name(self.ipv6, self.backend, tool);
        local_command_line(self.netns.as_deref(), &program, args, stdin_file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::host::shell_word;

    #[test]
    fn commands_by_hand_are_quoted_for_the_shell() {
        let args = restore_argv(Duration::from_secs(10), restore_args::ROLLBACK);
        assert_eq!(
            local_command_line(
                Some("kpt-a"),
                "iptables-legacy-restore",
                &args,
                Path::new("/var/lib/kproxy/backups/n-ipv4-1.rollback")
            ),
            "ip netns exec kpt-a iptables-legacy-restore -w 10 --noflush --counters < /var/lib/kproxy/backups/n-ipv4-1.rollback"
        );
        assert_eq!(
            local_command_line(None, "nft", &["-f".into()], Path::new("/tmp/a b/it's")),
            "nft -f < '/tmp/a b/it'\\''s'"
        );
        assert_eq!(shell_word(""), "''");
        assert_eq!(shell_word("$(x)"), "'$(x)'");
    }
}
