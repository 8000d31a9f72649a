//! Running `nft` on this host (optionally inside a named network namespace): listing kube-proxy's
//! tables, checking and applying `nft -f` transactions (input on stdin, argv vectors, never shell
//! strings). [`NftHost`] is what the repair transaction needs; [`LocalNft`] implements it through
//! [`crate::apply::host::run_local`].

use crate::apply::host::{HostError, run_local, shell_word};
use kproxy_parsers::nft::Family;
use std::path::Path;

/// The nftables side of a node, as a repair reads and writes it.
pub trait NftHost {
    /// `nft [-j] list table FAMILY kube-proxy`; `None` when the node has no such table.
    fn list_table(&self, family: Family, json: bool) -> Result<Option<String>, HostError>;
    /// `nft -c -f -`: checks a transaction without changing anything.
    fn check(&self, script: &str) -> Result<(), HostError>;
    /// `nft -f -`: applies a transaction (all of it or nothing).
    fn apply(&self, script: &str) -> Result<(), HostError>;
    /// Whether the kernel releases a chain from a deleted map element within the same
    /// transaction (Linux 6.2 and later).
    fn same_transaction_delete(&self) -> bool;
    /// The command line that applies the transaction in `file` by hand where this host's
    /// commands run: what to tell a user who must finish a rollback.
    fn by_hand(&self, file: &Path) -> String;
}

/// `[ip netns exec NAME] nft -f FILE`.
pub fn nft_command_line(netns: Option<&str>, file: &Path) -> String {
    let line = format!("nft -f {}", shell_word(&file.display().to_string()));
    match netns {
        Some(ns) => format!("ip netns exec {} {line}", shell_word(ns)),
        None => line,
    }
}

/// `nft` on this host.
#[derive(Debug, Clone, Default)]
pub struct LocalNft {
    /// Run inside this network namespace (`ip netns exec NAME …`).
    pub netns: Option<String>,
}

impl LocalNft {
    fn nft(&self, args: &[&str], stdin: Option<&str>) -> Result<String, HostError> {
        run_local(self.netns.as_deref(), "nft", args, stdin)
    }

    /// The names of the tables this host has, as `FAMILY NAME` (`nft list tables`).
    pub fn tables(&self) -> Result<Vec<String>, HostError> {
        Ok(self
            .nft(&["list", "tables"], None)?
            .lines()
            .filter_map(|l| l.trim().strip_prefix("table "))
            .map(str::to_string)
            .collect())
    }
}

/// True when `stderr` says the listed object does not exist.
fn is_absent(e: &HostError) -> bool {
    matches!(e, HostError::Failed { stderr, .. } if stderr.contains("No such file or directory"))
}

impl NftHost for LocalNft {
    fn list_table(&self, family: Family, json: bool) -> Result<Option<String>, HostError> {
        let fam = family.keyword();
        let args: &[&str] = if json {
            &["-j", "list", "table", fam, "kube-proxy"]
        } else {
            &["list", "table", fam, "kube-proxy"]
        };
        match self.nft(args, None) {
            Ok(text) => Ok(Some(text)),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn check(&self, script: &str) -> Result<(), HostError> {
        self.nft(&["-c", "-f", "-"], Some(script)).map(|_| ())
    }

    fn apply(&self, script: &str) -> Result<(), HostError> {
        self.nft(&["-f", "-"], Some(script)).map(|_| ())
    }

    fn by_hand(&self, file: &Path) -> String {
        nft_command_line(self.netns.as_deref(), file)
    }

    fn same_transaction_delete(&self) -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        kernel_at_least(&release, (6, 2))
    }
}

/// Whether a kernel release string (`6.18.44-fc`, `5.15.0-91-generic`) is at least `min`.
pub fn kernel_at_least(release: &str, min: (u32, u32)) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), Some(minor)) => (major, minor) >= min,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases() {
        assert!(kernel_at_least("6.18.44-fc-v1147\n", (6, 2)));
        assert!(kernel_at_least("6.2.0", (6, 2)));
        assert!(!kernel_at_least("6.1.0-13-amd64", (6, 2)));
        assert!(!kernel_at_least("5.15.0-91-generic", (6, 2)));
        assert!(!kernel_at_least("", (6, 2)));
    }
}
