//! Running the tools a repair needs on this host (optionally inside a named network namespace):
//! [`run_local`] is the one way the repair code of every mode runs a tool here (iptables,
//! `ipvsadm`, `ipset`, `ip`, `nft`, `nfacct`, `conntrack`). Commands are argv vectors, never
//! shell strings, and input goes through stdin; [`command_line`] says how to run one by hand.

use crate::collect::CommandOutput;
use crate::collect::local::run_blocking;
use std::path::Path;

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
}
