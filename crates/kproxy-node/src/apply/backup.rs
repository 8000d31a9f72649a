//! Backups of a node's rules before any change: the full `iptables-save -c` output, written
//! atomically (temporary file, fsync, rename) with mode 0600, named after node, family and
//! time; the same writer serves multi-file backups (IPVS and nftables mode) in a directory
//! named after node and time. A backup directory that is a symbolic link is refused, not
//! followed; old backups are rotated ([`rotate`]).

use std::io::Write;
use std::path::{Path, PathBuf};

/// The default backup directory.
pub const DEFAULT_BACKUP_DIR: &str = "/var/lib/kproxy/backups";

/// How many backups of a node [`rotate`] keeps by default.
pub const DEFAULT_KEEP_BACKUPS: usize = 20;

/// The kinds of backup a repair writes: one file per IP family (iptables mode), one directory
/// per IPVS or nftables repair.
const KINDS: &[&str] = &["ipv4", "ipv6", "ipvs", "nftables"];

/// Writes `saved` to a new file `DIR/NODE-FAMILY-STAMP.rules` and returns its path.
pub fn write_backup(dir: &Path, node: &str, ipv6: bool, saved: &str) -> std::io::Result<PathBuf> {
    backup_dir(dir)?;
    let family = if ipv6 { "ipv6" } else { "ipv4" };
    let path = dir.join(format!("{}-{family}-{}.rules", file_safe(node), stamp()));
    write_private(&path, saved)?;
    Ok(path)
}

/// Where the rollback input of a repair whose backup is `backup` is written: beside it, named
/// after it (`NODE-FAMILY-STAMP.rollback`), or inside a backup directory (`NAME.rollback`).
pub fn rollback_file(backup: &Path, name: &str) -> PathBuf {
    if backup.is_dir() {
        backup.join(format!("{name}.rollback"))
    } else {
        backup.with_extension("rollback")
    }
}

/// Makes a new directory `DIR/NODE-KIND-STAMP/` for a backup of several files and returns it.
pub fn new_backup_dir(dir: &Path, node: &str, kind: &str) -> std::io::Result<PathBuf> {
    backup_dir(dir)?;
    let sub = dir.join(format!("{}-{kind}-{}", file_safe(node), stamp()));
    private_dir().create(&sub)?;
    Ok(sub)
}

/// Makes sure `dir` is a directory this repair may write into: created (mode 0700) when
/// missing; refused when it is a symbolic link (a link there would send the node's rules
/// wherever it points, silently) or something else than a directory.
fn backup_dir(dir: &Path) -> std::io::Result<()> {
    use std::io::{Error, ErrorKind};
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.file_type().is_symlink() => {
            let target = std::fs::read_link(dir)
                .map(|t| t.display().to_string())
                .unwrap_or_else(|_| "?".into());
            let what = if std::fs::metadata(dir).is_ok() {
                format!(
                    "the backup directory is a symbolic link (to {target}); it is not followed: give the real directory with --backup-dir"
                )
            } else {
                format!(
                    "the backup directory is a dangling symbolic link (to {target}, which does not exist): remove the link or give another --backup-dir"
                )
            };
            Err(Error::new(ErrorKind::InvalidInput, what))
        }
        Ok(m) if !m.is_dir() => Err(Error::new(
            ErrorKind::InvalidInput,
            "the backup directory exists and is not a directory",
        )),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::NotFound => private_dir().recursive(true).create(dir),
        Err(e) => Err(e),
    }
}

/// A directory builder for mode 0700 directories.
fn private_dir() -> std::fs::DirBuilder {
    let mut b = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        b.mode(0o700);
    }
    b
}

/// Writes `text` to the new file `path` (mode 0600) atomically: a temporary file `.NAME.tmp`
/// next to it, synced, then renamed. When any step fails (a full disk) the temporary file is
/// removed: no partial file is left behind.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut f = open_private(&tmp)?;
    let written = f
        .write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path));
    drop(f);
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    // The rename itself is durable once the directory is synced.
    if let Some(parent) = path.parent()
        && let Ok(d) = std::fs::File::open(parent)
    {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Removes the oldest backups of `node` in `dir` (files and directories this module names,
/// with their rollback files) so that the newest `keep` remain; `keep` 0 keeps them all.
/// Returns what was removed, oldest first. Nothing else in `dir` is looked at.
pub fn rotate(dir: &Path, node: &str, keep: usize) -> std::io::Result<Vec<PathBuf>> {
    if keep == 0 {
        return Ok(Vec::new());
    }
    let prefix = format!("{}-", file_safe(node));
    let mut backups: std::collections::BTreeMap<(u128, String), Vec<PathBuf>> =
        std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| backup_id(n, &prefix)) else {
            continue;
        };
        backups.entry(id).or_default().push(entry.path());
    }
    let excess = backups.len().saturating_sub(keep);
    let mut removed = Vec::new();
    for (_, paths) in backups.into_iter().take(excess) {
        for p in paths {
            let is_dir = std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir());
            if is_dir {
                std::fs::remove_dir_all(&p)?;
            } else {
                std::fs::remove_file(&p)?;
            }
            removed.push(p);
        }
    }
    Ok(removed)
}

/// The (stamp, kind) of a backup entry named `PREFIX KIND-STAMP[.rules|.rollback]`.
fn backup_id(name: &str, prefix: &str) -> Option<(u128, String)> {
    let rest = name.strip_prefix(prefix)?;
    let (kind, rest) = rest.split_once('-')?;
    if !KINDS.contains(&kind) {
        return None;
    }
    let stamp = rest
        .strip_suffix(".rules")
        .or_else(|| rest.strip_suffix(".rollback"))
        .unwrap_or(rest);
    if stamp.is_empty() || !stamp.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((stamp.parse().ok()?, kind.to_string()))
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

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("read dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

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
        assert_eq!(
            rollback_file(&p, "x"),
            p.with_extension("rollback"),
            "beside a backup file"
        );
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
        write_private(&sub.join("ipset-save.txt"), "create S hash:ip\n").expect("write");
        assert_eq!(names(&sub), ["ipset-save.txt"], "no temporary file is left");
        assert_eq!(
            rollback_file(&sub, "iptables"),
            sub.join("iptables.rollback")
        );
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        // The rename fails: a directory holds the name.
        std::fs::create_dir(dir.path().join("taken")).expect("mkdir");
        let err = write_private(&dir.path().join("taken"), "data").expect_err("rename fails");
        assert!(!err.to_string().is_empty());
        assert_eq!(
            names(dir.path()),
            ["taken"],
            "the temporary file is removed"
        );
    }

    #[cfg(unix)]
    #[test]
    fn symbolic_links_as_backup_directory_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let real = dir.path().join("real");
        std::fs::create_dir(&real).expect("mkdir");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).expect("symlink");
        let e = write_backup(&link, "n", false, "x").expect_err("refused");
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        assert!(names(&real).is_empty(), "nothing written through the link");
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("gone"), &dangling).expect("symlink");
        let e = new_backup_dir(&dangling, "n", "nftables").expect_err("refused");
        assert!(e.to_string().contains("dangling symbolic link"), "{e}");
        assert!(!e.to_string().contains("File exists"), "{e}");
        let file = dir.path().join("file");
        std::fs::write(&file, "").expect("write");
        let e = write_backup(&file, "n", false, "x").expect_err("refused");
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn rotation_keeps_the_newest_backups_of_the_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        for (i, name) in [
            "n1-ipv4-100.rules",
            "n1-ipv4-100.rollback",
            "n1-ipv6-200.rules",
            "n1-nftables-300",
            "n1-ipvs-400",
            "n1-ipv4-500.rules",
            "n1-x-ipv4-50.rules",
            "n2-ipv4-10.rules",
            "n1-ipv4-notastamp.rules",
            "notes.txt",
        ]
        .iter()
        .enumerate()
        {
            if name.contains('.') {
                std::fs::write(d.join(name), i.to_string()).expect("write");
            } else {
                std::fs::create_dir(d.join(name)).expect("mkdir");
                std::fs::write(d.join(name).join("f"), "x").expect("write");
            }
        }
        let removed = rotate(d, "n1", 3).expect("rotate");
        let removed: Vec<String> = removed
            .iter()
            .map(|p| {
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        let mut sorted = removed.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            [
                "n1-ipv4-100.rollback",
                "n1-ipv4-100.rules",
                "n1-ipv6-200.rules"
            ]
        );
        assert_eq!(
            names(d),
            [
                "n1-ipv4-500.rules",
                "n1-ipv4-notastamp.rules",
                "n1-ipvs-400",
                "n1-nftables-300",
                "n1-x-ipv4-50.rules",
                "n2-ipv4-10.rules",
                "notes.txt"
            ]
        );
        assert!(rotate(d, "n1", 0).expect("keep all").is_empty());
        assert!(rotate(d, "n1", 3).expect("nothing more").is_empty());
    }
}
