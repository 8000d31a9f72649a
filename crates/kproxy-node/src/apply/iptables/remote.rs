//! A node's rules reached through the API: [`RemoteHost`] runs `iptables-save` and
//! `iptables-restore -w N …` (argv only, the restore input on stdin) through a
//! [`CommandRunner`] — the kube-proxy pod (`exec`) or a debug pod — so that the one repair
//! transaction of [`super::repair`] works on remote nodes too.
//!
//! Which userspace to run is read from the node's dumps ([`detect_backend`]): the rules must be
//! changed with the backend that holds kube-proxy's rules, which is not always the default
//! `iptables-save` of the pod's image.

use super::host::{Backend, RulesHost, tool_name};
use crate::apply::host::{HostError, command_line, shell_word};
use crate::collect::{CommandOutput, CommandRunner, NodeSnapshot, RunError};
use std::path::Path;
use std::time::Duration;

/// Runs the iptables tools of one family and backend on a node through a [`CommandRunner`].
///
/// The repair transaction is synchronous; each command blocks on `runtime` (call it from a
/// thread that is not inside that runtime, e.g. the CLI's main thread).
#[derive(Debug)]
pub struct RemoteHost<'a, R> {
    /// Runs the commands (exec into a pod).
    pub runner: &'a R,
    /// The runtime the runner's futures run on.
    pub runtime: tokio::runtime::Handle,
    /// True for IPv6 (`ip6tables-*`).
    pub ipv6: bool,
    /// Which userspace.
    pub backend: Backend,
    /// Seconds to wait for the xtables lock (`-w`).
    pub wait: Duration,
    /// Limit of each command.
    pub timeout: Duration,
}

impl<R: CommandRunner> RulesHost for RemoteHost<'_, R> {
    fn ipv6(&self) -> bool {
        self.ipv6
    }

    fn lock_wait(&self) -> Duration {
        self.wait
    }

    /// Runs the tool, with `stdin` when given, and returns its stdout; a non-zero exit is
    /// [`HostError::Failed`], anything else that goes wrong [`HostError::Remote`].
    fn run_tool(
        &self,
        tool: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, HostError> {
        let program = tool_name(self.ipv6, self.backend, tool);
        let mut argv = vec![program.as_str()];
        argv.extend_from_slice(args);
        let result: Result<CommandOutput, RunError> = self.runtime.block_on(async {
            match stdin {
                Some(input) => {
                    self.runner
                        .run_with_stdin(&argv, input.as_bytes(), self.timeout)
                        .await
                }
                None => self.runner.run(&argv, self.timeout).await,
            }
        });
        let out = self.ran(&program, result)?;
        if out.exit_code != 0 {
            return Err(HostError::Failed {
                program: format!("{program} on {}", self.runner.location()),
                code: out.exit_code,
                stderr: out.stderr.trim().to_string(),
            });
        }
        Ok(out.stdout)
    }

    /// `kubectl exec -i -n NAMESPACE POD -- PROGRAM ARGS… < FILE` (FILE on this machine, where
    /// the backup is).
    fn by_hand(&self, tool: &str, args: &[String], stdin_file: &Path) -> String {
        let program = tool_name(self.ipv6, self.backend, tool);
        let line = command_line(&program, args, stdin_file);
        let location = self.runner.location();
        match location
            .strip_prefix("pod ")
            .and_then(|p| p.split_once('/'))
        {
            Some((ns, pod)) => format!(
                "kubectl exec -i -n {} {} -- {line}",
                shell_word(ns),
                shell_word(pod)
            ),
            None => format!("{line} (in {location})"),
        }
    }
}

impl<R: CommandRunner> crate::apply::conntrack::ConntrackHost for RemoteHost<'_, R> {
    fn location(&self) -> String {
        self.runner.location()
    }

    /// Runs `conntrack args…` in the pod; its exit status and outputs, whatever the status (a
    /// missing binary, a timeout or a transport failure is [`HostError::Remote`]).
    fn conntrack(&self, args: &[&str]) -> Result<CommandOutput, HostError> {
        let mut argv = vec!["conntrack"];
        argv.extend_from_slice(args);
        let result = self
            .runtime
            .block_on(async { self.runner.run(&argv, self.timeout).await });
        self.ran("conntrack", result)
    }
}

impl<R: CommandRunner> RemoteHost<'_, R> {
    /// A remote run's outputs whatever its exit status, except a program the pod's image lacks
    /// (exit 127), a timeout or a transport failure: those are [`HostError::Remote`].
    fn ran(
        &self,
        program: &str,
        result: Result<CommandOutput, RunError>,
    ) -> Result<CommandOutput, HostError> {
        let remote = |detail: String| HostError::Remote {
            program: program.to_string(),
            location: self.runner.location(),
            detail,
        };
        match result {
            Ok(out) if out.exit_code == 127 => Err(remote(not_installed())),
            Ok(out) => Ok(out),
            Err(RunError::Missing { .. }) => Err(remote(not_installed())),
            Err(RunError::Timeout(t)) => Err(remote(format!(
                "did not finish within {t:?} (raise --exec-timeout)"
            ))),
            Err(RunError::Fatal(e)) => Err(remote(e.to_string())),
        }
    }
}

fn not_installed() -> String {
    "not installed in the pod's image (use --collector debug-pod --image IMAGE with an image that has it)"
        .to_string()
}

/// Whether an `iptables-save` output holds kube-proxy's iptables-mode rules (its own chains,
/// not the `KUBE-FIREWALL`/`KUBE-KUBELET-CANARY` chains kubelet makes).
pub fn has_proxy_rules(save: &str) -> bool {
    save.lines().any(|l| {
        [
            ":KUBE-SERVICES ",
            ":KUBE-PROXY-CANARY ",
            ":KUBE-SVC-",
            ":KUBE-SEP-",
        ]
        .iter()
        .any(|p| l.starts_with(p))
    })
}

/// Whether an `iptables-save` output has the chains kubelet makes in the backend it uses
/// (`KUBE-IPTABLES-HINT`, `KUBE-KUBELET-CANARY`).
fn has_kubelet_hint(save: &str) -> bool {
    save.lines()
        .any(|l| l.starts_with(":KUBE-IPTABLES-HINT ") || l.starts_with(":KUBE-KUBELET-CANARY "))
}

/// The number of rules in an `iptables-save` output.
fn rule_count(save: &str) -> usize {
    save.lines().filter(|l| l.starts_with("-A ")).count()
}

/// The backend whose rules a repair should change, from the node's dumps, and a warning when
/// the choice is doubtful. It follows the choice kube-proxy's image makes (its
/// `iptables-wrapper`): the backend that has kube-proxy's rules — the pod's default
/// `iptables-save` first —, else the one with kubelet's hint chains, else the one with more
/// rules, else the pod's default. IPv6 always uses the default (the snapshot has no
/// per-backend IPv6 dumps).
pub fn detect_backend(snap: &NodeSnapshot, ipv6: bool) -> (Backend, Option<String>) {
    if ipv6 {
        return (Backend::Auto, None);
    }
    let dumps = |test: fn(&str) -> bool| {
        let has = |t: &Option<String>| t.as_deref().is_some_and(test);
        (
            has(&snap.iptables_save),
            has(&snap.iptables_legacy_save),
            has(&snap.iptables_nft_save),
        )
    };
    let both = "kube-proxy's chains exist in both the legacy and the nft iptables backend";
    match dumps(has_proxy_rules) {
        (true, true, true) => {
            return (
                Backend::Auto,
                Some(format!(
                    "{both}: repairing the one `iptables-save` shows; the other is left alone (--backend chooses)"
                )),
            );
        }
        (true, _, _) => return (Backend::Auto, None),
        (false, true, true) => {
            return (
                Backend::Legacy,
                Some(format!(
                    "{both} but not in what `iptables-save` shows: repairing legacy (--backend chooses)"
                )),
            );
        }
        (false, true, false) => return (Backend::Legacy, None),
        (false, false, true) => return (Backend::Nft, None),
        (false, false, false) => {}
    }
    match dumps(has_kubelet_hint) {
        (true, _, _) => return (Backend::Auto, None),
        (false, true, false) => return (Backend::Legacy, None),
        (false, false, true) => return (Backend::Nft, None),
        _ => {}
    }
    let count = |t: &Option<String>| t.as_deref().map_or(0, rule_count);
    let (default, legacy, nft) = (
        count(&snap.iptables_save),
        count(&snap.iptables_legacy_save),
        count(&snap.iptables_nft_save),
    );
    if legacy > nft && legacy > default {
        (Backend::Legacy, None)
    } else if nft > legacy && nft > default {
        (Backend::Nft, None)
    } else {
        (Backend::Auto, None)
    }
}

/// The `nfacct` setting of the node facts when the user gave none: kube-proxy uses its counters
/// only where they exist, and the only view of them through a pod is the node's rules, so the
/// counters its rules reference count as present (`none` when none is referenced).
pub fn nfacct_from_rules(save: &str) -> String {
    let present: Vec<&str> = [
        crate::state::node::NFACCT_CT_STATE_INVALID,
        crate::state::node::NFACCT_LOCALHOST_NODEPORTS,
    ]
    .into_iter()
    .filter(|name| {
        save.lines().any(|l| {
            l.split_whitespace()
                .collect::<Vec<_>>()
                .windows(2)
                .any(|w| w.first() == Some(&"--nfacct-name") && w.get(1) == Some(name))
        })
    })
    .collect();
    if present.is_empty() {
        "none".to_string()
    } else {
        present.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBE: &str = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAA - [0:0]\nCOMMIT\n";
    const KUBELET_ONLY: &str =
        "*filter\n:KUBE-FIREWALL - [0:0]\n:KUBE-KUBELET-CANARY - [0:0]\nCOMMIT\n";

    #[test]
    fn backend_is_where_kube_proxy_rules_are() {
        let mut s = NodeSnapshot {
            iptables_save: Some(KUBELET_ONLY.into()),
            iptables_nft_save: Some(KUBELET_ONLY.into()),
            iptables_legacy_save: Some(KUBE.into()),
            ..NodeSnapshot::default()
        };
        assert_eq!(detect_backend(&s, false), (Backend::Legacy, None));
        assert_eq!(detect_backend(&s, true), (Backend::Auto, None));
        s.iptables_legacy_save = Some(String::new());
        s.iptables_nft_save = Some(KUBE.into());
        assert_eq!(detect_backend(&s, false), (Backend::Nft, None));
        s.iptables_save = Some(KUBE.into());
        assert_eq!(detect_backend(&s, false), (Backend::Auto, None));
        s.iptables_legacy_save = Some(KUBE.into());
        assert!(detect_backend(&s, false).1.is_some());
        let empty = NodeSnapshot::default();
        assert_eq!(detect_backend(&empty, false), (Backend::Auto, None));
    }

    #[test]
    fn without_kube_proxy_rules_kubelet_hint_then_rule_count_decide() {
        let foreign = "*filter\n:DOCKER-USER - [0:0]\n-A FORWARD -j DOCKER-USER\nCOMMIT\n";
        let mut s = NodeSnapshot {
            iptables_save: Some(String::new()),
            iptables_nft_save: Some(String::new()),
            iptables_legacy_save: Some(foreign.into()),
            ..NodeSnapshot::default()
        };
        assert_eq!(detect_backend(&s, false).0, Backend::Legacy);
        s.iptables_nft_save = Some(KUBELET_ONLY.into());
        assert_eq!(detect_backend(&s, false).0, Backend::Nft);
        s.iptables_save = Some(KUBELET_ONLY.into());
        assert_eq!(detect_backend(&s, false).0, Backend::Auto);
    }

    #[test]
    fn nfacct_counters_referenced_by_the_rules() {
        assert_eq!(nfacct_from_rules(KUBE), "none");
        let rules = "-A KUBE-FORWARD -m conntrack --ctstate INVALID -m nfacct --nfacct-name  ct_state_invalid_dropped_pkts -j DROP\n";
        assert_eq!(nfacct_from_rules(rules), "ct_state_invalid_dropped_pkts");
    }
}
