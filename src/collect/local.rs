//! The `local` collector: run the dump commands on this host (as root, usually through
//! `kubectl kproxy verify --collector local` on the node itself).

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
        let Some((program, args)) = argv.split_first() else {
            return Err(RunError::Missing {
                program: String::new(),
            });
        };
        let child = tokio::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = match tokio::time::timeout(timeout, child).await {
            Err(_) => return Err(RunError::Timeout(timeout)),
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(RunError::Missing {
                    program: (*program).to_string(),
                });
            }
            Ok(Err(e)) => {
                return Err(RunError::Fatal(CollectError::Io {
                    path: (*program).to_string(),
                    source: e,
                }));
            }
            Ok(Ok(o)) => o,
        };
        Ok(CommandOutput {
            exit_code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        })
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
