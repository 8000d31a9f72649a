//! Backups of a node's rules before any change: the full `iptables-save -c` output (plus the
//! empty tables a rollback restores, see [`rollback_input`]), written
//! atomically (temporary file + rename) with mode 0600, named after node, family and time; the
//! same writer serves multi-file backups (IPVS mode) in a directory named after node and time.

use std::io::Write;
use std::path::{Path, PathBuf};

/// The default backup directory.
pub const DEFAULT_BACKUP_DIR: &str = "/var/lib/kproxy/backups";

/// Writes `saved` to a new file `DIR/NODE-FAMILY-STAMP.rules` and returns its path.
pub fn write_backup(dir: &Path, node: &str, ipv6: bool, saved: &str) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let family = if ipv6 { "ipv6" } else { "ipv4" };
    let path = dir.join(format!("{}-{family}-{}.rules", file_safe(node), stamp()));
    write_private(&path, saved)?;
    Ok(path)
}

/// The rollback input for `saved` (an `iptables-save` output) after a change to `touched`
/// tables: `saved` itself, plus `*TABLE` + `COMMIT` for each touched table `saved` does not
/// hold. Restored exactly (without `--noflush`), such an empty table loses every rule and user
/// chain the change created in it: it goes back to what it was, no rules.
pub fn rollback_input<'a>(saved: &str, touched: impl IntoIterator<Item = &'a str>) -> String {
    let present: Vec<&str> = saved
        .lines()
        .filter_map(|l| l.trim_end().strip_prefix('*'))
        .collect();
    let mut out = saved.to_string();
    let mut absent: Vec<&str> = Vec::new();
    for t in touched {
        if !present.contains(&t) && !absent.contains(&t) {
            absent.push(t);
        }
    }
    if absent.is_empty() {
        return out;
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str("# kubectl-kproxy: tables absent before the repair; restoring empties them\n");
    for t in absent {
        out.push_str(&format!("*{t}\nCOMMIT\n"));
    }
    out
}

/// Makes a new directory `DIR/NODE-KIND-STAMP/` for a backup of several files and returns it.
pub fn new_backup_dir(dir: &Path, node: &str, kind: &str) -> std::io::Result<PathBuf> {
    let sub = dir.join(format!("{}-{kind}-{}", file_safe(node), stamp()));
    std::fs::create_dir_all(&sub)?;
    Ok(sub)
}

/// Writes `text` to the new file `path` (mode 0600) atomically: a temporary file `.NAME.tmp`
/// next to it, synced, then renamed.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    {
        let mut f = open_private(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)
}

/// Milliseconds since the Unix epoch, for backup names.
fn stamp() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default()
}

/// The node name as a file name part: letters, digits, `-` and `.` kept, anything else `_`;
/// `node` when empty.
fn file_safe(node: &str) -> String {
    let node = if node.is_empty() { "node" } else { node };
    node.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
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

    #[test]
    fn rollback_input_empties_tables_the_backup_lacks() {
        let saved = "# Generated\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n";
        let r = rollback_input(saved, ["nat", "filter", "nat", "mangle"]);
        assert!(r.starts_with(saved), "{r}");
        let tail: Vec<&str> = r
            .strip_prefix(saved)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect();
        assert_eq!(tail, ["*nat", "COMMIT", "*mangle", "COMMIT"]);
        assert_eq!(rollback_input(saved, ["filter"]), saved);
        assert_eq!(rollback_input("", ["nat"]).lines().last(), Some("COMMIT"));
        assert!(rollback_input("", ["nat"]).contains("*nat\nCOMMIT\n"));
    }

    #[test]
    fn multi_file_backups_go_in_a_new_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sub = new_backup_dir(dir.path(), "", "ipvs").expect("backup dir");
        assert!(
            sub.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("node-ipvs-"))
        );
        write_private(
            &sub.join("ipset-save.txt"),
            "create S hash:ip
",
        )
        .expect("write");
        let names: Vec<_> = std::fs::read_dir(&sub)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names, ["ipset-save.txt"], "no temporary file is left");
    }
}
