//! The `local` collector pointed elsewhere on this host: the dump commands run inside a network
//! namespace (`ip netns exec NAME …`, for tests and for agents that watch a namespace), and
//! `iptables-save`/`ip6tables-save` as the chosen iptables backend (`iptables-legacy-save`,
//! `iptables-nft-save`) when the node's rules are in one the default links do not point to.

use super::local::LocalRunner;
use super::{CollectError, CommandOutput, CommandRunner, NodeSnapshot, RunError};
use std::time::Duration;

/// Where and how the local dump commands run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostRunner {
    /// The network namespace to run in (`None`: this process's own).
    pub netns: Option<String>,
    /// The iptables backend `iptables-save` stands for: `nft`, `legacy`, or `None` for what
    /// the host's `iptables-save` link points to.
    pub backend: Option<&'static str>,
}

impl HostRunner {
    /// The argv as it is run: the backend's save command, inside the namespace.
    pub(super) fn argv<'a>(&'a self, argv: &[&'a str]) -> Vec<&'a str> {
        let mut out: Vec<&str> = Vec::with_capacity(argv.len() + 4);
        if let Some(ns) = &self.netns {
            out.extend(["ip", "netns", "exec", ns.as_str()]);
        }
        let program = super::program_index(argv);
        for (i, word) in argv.iter().enumerate() {
            out.push(match (i == program, *word, self.backend) {
                (true, "iptables-save", Some("nft")) => "iptables-nft-save",
                (true, "iptables-save", Some("legacy")) => "iptables-legacy-save",
                (true, "ip6tables-save", Some("nft")) => "ip6tables-nft-save",
                (true, "ip6tables-save", Some("legacy")) => "ip6tables-legacy-save",
                (_, w, _) => w,
            });
        }
        out
    }
}

/// `ip netns exec` reports a program it cannot start as its own failure (status 1); that is a
/// missing program, as a shell's 127 is.
fn missing_in_netns(argv: &[&str], out: &CommandOutput) -> Option<String> {
    let program = argv.first()?;
    (out.exit_code != 0
        && out
            .stderr
            .contains(&format!("exec of \"{program}\" failed"))
        && out.stderr.contains("No such file or directory"))
    .then(|| (*program).to_string())
}

impl HostRunner {
    /// `out` of `argv`, or the program missing when `ip netns exec` could not start it.
    fn checked(&self, argv: &[&str], out: CommandOutput) -> Result<CommandOutput, RunError> {
        let full = self.argv(argv);
        let program = match &self.netns {
            Some(_) => full.get(4..).and_then(|run| missing_in_netns(run, &out)),
            None => None,
        };
        match program {
            Some(program) => Err(RunError::Missing { program }),
            None => Ok(out),
        }
    }
}

impl CommandRunner for HostRunner {
    fn location(&self) -> String {
        match &self.netns {
            Some(ns) => format!("network namespace {ns}"),
            None => "this host".to_string(),
        }
    }

    async fn run(&self, argv: &[&str], timeout: Duration) -> Result<CommandOutput, RunError> {
        let full = self.argv(argv);
        let out = LocalRunner.run(&full, timeout).await?;
        self.checked(argv, out)
    }

    async fn run_with_stdin(
        &self,
        argv: &[&str],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<CommandOutput, RunError> {
        let full = self.argv(argv);
        let out = LocalRunner.run_with_stdin(&full, stdin, timeout).await?;
        self.checked(argv, out)
    }
}

impl HostRunner {
    /// The collector's name in reports: `local`, `local, netns NAME`.
    fn collector(&self) -> String {
        match &self.netns {
            Some(ns) => format!("local, netns {ns}"),
            None => "local".to_string(),
        }
    }
}

/// The `local` collector run through `runner`.
pub async fn collect(runner: &HostRunner, timeout: Duration) -> Result<NodeSnapshot, CollectError> {
    super::collect_with(runner, &runner.collector(), timeout).await
}

/// [`collect`], keeping the outputs of `kinds` from `kept` ([`super::collect_keeping`]).
pub async fn collect_keeping(
    runner: &HostRunner,
    timeout: Duration,
    kept: &NodeSnapshot,
    kinds: &[super::DumpKind],
) -> Result<NodeSnapshot, CollectError> {
    super::collect_keeping(runner, &runner.collector(), timeout, kept, kinds).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argv_goes_into_the_namespace_with_the_backend() {
        let r = HostRunner {
            netns: Some("kpt-x".into()),
            backend: Some("legacy"),
        };
        assert_eq!(
            r.argv(&["iptables-save"]),
            ["ip", "netns", "exec", "kpt-x", "iptables-legacy-save"]
        );
        assert_eq!(
            r.argv(&["nft", "-j", "list", "table", "ip", "kube-proxy"]),
            [
                "ip",
                "netns",
                "exec",
                "kpt-x",
                "nft",
                "-j",
                "list",
                "table",
                "ip",
                "kube-proxy"
            ]
        );
        assert_eq!(
            HostRunner::default().argv(&["ipset", "save"]),
            ["ipset", "save"]
        );
        // The save command run again with a large stack is the backend's too.
        let wrapped = r.argv(&super::super::with_large_stack(&["iptables-save"]));
        assert_eq!(wrapped[..6], ["ip", "netns", "exec", "kpt-x", "sh", "-c"]);
        assert_eq!(wrapped.last(), Some(&"iptables-legacy-save"));
    }

    #[test]
    fn a_program_ip_cannot_start_is_missing() {
        let out = CommandOutput::exited(
            1,
            String::new(),
            "exec of \"ipvsadm\" failed: No such file or directory\n".into(),
        );
        assert_eq!(
            missing_in_netns(&["ipvsadm"], &out).as_deref(),
            Some("ipvsadm")
        );
        let failed = CommandOutput {
            stderr: "ipvsadm: permission denied".into(),
            ..out
        };
        assert_eq!(missing_in_netns(&["ipvsadm"], &failed), None);
        // Outside a namespace the output is the program's own, whatever it says.
        let direct = HostRunner::default().checked(&["ipset", "save"], failed.clone());
        assert_eq!(direct.ok(), Some(failed));
    }
}
