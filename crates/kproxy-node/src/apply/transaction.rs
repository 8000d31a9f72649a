//! What the repair transaction of every mode shares: its options, how hard a rollback tries
//! ([`RollbackPolicy`]) and what it did, the rotation of old backups, and the test-only pause
//! before a rollback.

use crate::apply::backup::rotate;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What a repair of iptables or nftables rules does (IPVS has its own, without `full`).
#[derive(Debug, Clone)]
pub struct RepairOptions {
    /// Rewrite every expected chain (a kube-proxy full sync) instead of only the differing ones.
    pub full: bool,
    /// Change the node (otherwise only plan).
    pub apply: bool,
    /// Where backups go.
    pub backup_dir: PathBuf,
    /// How many backups of the node to keep (older ones are removed; 0 keeps all).
    pub keep_backups: usize,
    /// Node name (for the backups' names).
    pub node: String,
    /// The rollback's xtables lock wait (iptables; nft takes no lock) and retries.
    pub rollback: RollbackPolicy,
    /// Test only: end the last table's input with an invalid rule or command, so that it fails
    /// after the earlier ones were applied (proves the rollback).
    pub inject_fault: bool,
    /// Test only: before rolling back, create this file and wait (at most a minute) until it
    /// is removed, so that a test can hold the xtables lock during the rollback.
    pub pause_before_rollback: Option<PathBuf>,
    /// The Services whose API object was left out as invalid
    /// ([`crate::compare::left_out::services`]): their rules on the node are left as they are.
    pub left_out: Vec<crate::compare::left_out::LeftOutService>,
}

/// How hard a rollback tries before it gives up and tells how to finish it by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RollbackPolicy {
    /// Attempts in all (at least one is made).
    pub attempts: u32,
    /// The xtables lock wait of each attempt (`iptables-restore -w`).
    pub lock_wait: Duration,
    /// The pause after the first failed attempt, doubled after each further one.
    pub backoff: Duration,
}

impl Default for RollbackPolicy {
    fn default() -> Self {
        RollbackPolicy {
            attempts: 3,
            lock_wait: Duration::from_secs(10),
            backoff: Duration::from_secs(1),
        }
    }
}

impl RollbackPolicy {
    /// The policy with `lock_wait` as the wait of each attempt.
    pub fn waiting(lock_wait: Duration) -> Self {
        RollbackPolicy {
            lock_wait,
            ..RollbackPolicy::default()
        }
    }

    /// Runs `attempt` until it succeeds or the attempts are spent, pausing between attempts.
    /// Returns the attempts made and the last error.
    pub fn run<E>(&self, mut attempt: impl FnMut() -> Result<(), E>) -> (u32, Result<(), E>) {
        let attempts = self.attempts.max(1);
        let mut pause = self.backoff;
        let mut made = 0;
        loop {
            made += 1;
            let result = attempt();
            if result.is_ok() || made >= attempts {
                return (made, result);
            }
            std::thread::sleep(pause);
            pause = pause.saturating_mul(2);
        }
    }
}

/// What a rollback did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RolledBack {
    /// Attempts made (0: there was nothing to undo).
    pub attempts: u32,
    /// What was left as it is now, and why.
    pub notes: Vec<String>,
}

/// What a rollback came to: what it did, or why it failed and how to finish it by hand.
pub type RollbackOutcome = Result<RolledBack, String>;

/// How a failed repair's message tells what the rollback did.
pub fn rollback_text(rollback: &RollbackOutcome, backup: &Path) -> String {
    match rollback {
        Ok(r) if r.attempts == 0 && r.notes.is_empty() => format!(
            "nothing had been changed; the backup is {}",
            backup.display()
        ),
        Ok(r) if r.attempts == 0 => format!(
            "nothing was put back from the backup {}; {}",
            backup.display(),
            r.notes.join("; ")
        ),
        Ok(r) => {
            let mut s = format!(
                "what the repair changed was restored from the backup {}",
                backup.display()
            );
            if r.attempts > 1 {
                s.push_str(&format!(" (after {} attempts)", r.attempts));
            }
            for n in &r.notes {
                s.push_str("; ");
                s.push_str(n);
            }
            s
        }
        Err(e) => format!(
            "PUTTING BACK WHAT THE REPAIR CHANGED FAILED TOO: {e}; the backup is {}",
            backup.display()
        ),
    }
}

/// Old backups removed after a new one was written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rotation {
    /// What was removed, oldest first.
    pub removed: Vec<PathBuf>,
    /// Why removing failed, when it did (the repair goes on: the new backup is written).
    pub error: Option<String>,
}

impl Rotation {
    /// Rotates the backups of `node` in `dir`, keeping `keep`.
    pub fn run(dir: &Path, node: &str, keep: usize) -> Rotation {
        match rotate(dir, node, keep) {
            Ok(removed) => Rotation {
                removed,
                error: None,
            },
            Err(e) => Rotation {
                removed: Vec::new(),
                error: Some(format!("removing old backups in {}: {e}", dir.display())),
            },
        }
    }
}

/// Test only: announces the rollback by creating `file` and waits, at most a minute, until
/// it is removed ([`RepairOptions::pause_before_rollback`]).
pub fn pause_before_rollback(file: Option<&Path>) {
    let Some(file) = file else { return };
    if std::fs::write(file, "rolling back\n").is_err() {
        return;
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while file.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_pause_and_stop() {
        let policy = RollbackPolicy {
            attempts: 3,
            lock_wait: Duration::from_secs(1),
            backoff: Duration::from_millis(1),
        };
        let mut calls = 0;
        let (made, r) = policy.run(|| {
            calls += 1;
            if calls < 2 { Err("busy") } else { Ok(()) }
        });
        assert_eq!((made, r), (2, Ok(())));
        let (made, r) = policy.run(|| Err::<(), _>("busy"));
        assert_eq!((made, r), (3, Err("busy")));
        let once = RollbackPolicy {
            attempts: 0,
            ..policy
        };
        assert_eq!(once.run(|| Err::<(), _>("x")).0, 1);
    }
}
