//! Backups of a node's rules before any change: the full `iptables-save -c` output, written
//! atomically (temporary file + rename) with mode 0600, named after node, family and time.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The default backup directory.
pub const DEFAULT_BACKUP_DIR: &str = "/var/lib/kproxy/backups";

/// Writes `saved` to a new file in `dir` and returns its path.
pub fn write_backup(dir: &Path, node: &str, ipv6: bool, saved: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let node = if node.is_empty() { "node" } else { node };
    let safe: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!(
        "{safe}-{}-{stamp}.rules",
        if ipv6 { "ipv6" } else { "ipv4" }
    );
    let path = dir.join(&name);
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut f = open_private(&tmp)?;
        f.write_all(saved.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

#[cfg(unix)]
fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backup_is_written_whole_and_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = write_backup(dir.path(), "node/1", false, "*nat\nCOMMIT\n").expect("backup");
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "*nat\nCOMMIT\n");
        assert!(
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("node_1-ipv4-"))
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&p).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
