//! Running `iptables-save` / `iptables-restore` on this host (optionally inside a named network
//! namespace), for one IP family and backend. Commands are argv vectors, never shell strings, and
//! the restore input goes through stdin. [`RulesHost`] is what the repair transaction needs of a
//! host and builds every save/restore argv once; [`IptablesHost`] implements it here,
//! [`crate::apply::remote::RemoteHost`] through the API. [`run_local`] is the one way the repair
//! code runs a tool on this host (also `ipvsadm`, `ipset`, `ip` for IPVS mode).

use crate::collect::CommandOutput;
use crate::collect::local::run_blocking;
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
        /// Its exit code (128 + N when killed by signal N).
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

/// `program args… < FILE` as one shell line, each word quoted when the shell would split or
/// expand it.
pub fn command_line(program: &str, args: &[String], stdin_file: &Path) -> String {
    let mut words = vec![shell_word(program)];
    words.extend(args.iter().map(|a| shell_word(a)));
    format!(
        "{} < {}",
        words.join(" "),
        shell_word(&stdin_file.display().to_string())
    )
}

/// `word` as the shell reads it back: bare when made of characters the shell leaves alone,
/// else in single quotes.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_./:=@%+,-".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
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

/// `[ip netns exec NAME] PROGRAM ARGS… < FILE`: how to run a tool by hand on this host, in the
/// network namespace a repair used.
pub fn local_command_line(
    netns: Option<&str>,
    program: &str,
    args: &[String],
    stdin_file: &Path,
) -> String {
    let line = command_line(program, args, stdin_file);
    match netns {
        Some(ns) => format!("ip netns exec {} {line}", shell_word(ns)),
        None => line,
    }
}

/// Runs `program args…` on this host — inside the network namespace `netns` when given
/// (`ip netns exec NAME …`) — with `stdin` piped to it when given, and returns its stdout.
/// The one way the repair code runs a tool on this host (iptables, ipvsadm, ipset, ip, nfacct,
/// conntrack).
pub fn run_local(
    netns: Option<&str>,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<String, HostError> {
    let out = run_local_output(netns, program, args, stdin)?;
    if out.exit_code != 0 {
        return Err(HostError::Failed {
            program: program.to_string(),
            code: out.exit_code,
            stderr: out.stderr.trim().to_string(),
        });
    }
    Ok(out.stdout)
}

/// [`run_local`] for tools whose exit status and stderr carry the answer (`conntrack -D` exits
/// 1 when nothing matched and prints its count on stderr): the exit code (128 + N when killed by
/// signal N), stdout and stderr, whatever the exit status. The process runs in
/// [`crate::collect::local::run_blocking`].
pub fn run_local_output(
    netns: Option<&str>,
    program: &str,
    args: &[&str],
    stdin: Option<&str>,
) -> Result<CommandOutput, HostError> {
    run_blocking(netns, program, args, stdin).map_err(|source| HostError::Spawn {
        program: program.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_tools_get_stdin_and_report_failures() {
        assert_eq!(
            run_local(None, "cat", &[], Some("*nat\nCOMMIT\n")).expect("cat runs"),
            "*nat\nCOMMIT\n"
        );
        assert!(matches!(
            run_local(None, "sh", &["-c", "echo oops >&2; exit 3"], None),
            Err(HostError::Failed { code: 3, ref stderr, .. }) if stderr == "oops"
        ));
        assert!(matches!(
            run_local(None, "kproxy-no-such-tool", &[], None),
            Err(HostError::Spawn { .. })
        ));
    }

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
