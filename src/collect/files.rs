//! The `files` collector: the offline `--iptables-save FILE …` flags.

use super::{CollectError, DumpKind, NodeSnapshot};
use std::path::PathBuf;

/// Paths of dump files, one per [`DumpKind`] (all optional; `-` reads stdin).
#[derive(Debug, Clone, Default)]
pub struct DumpFiles {
    /// (kind, path) pairs.
    pub files: Vec<(DumpKind, PathBuf)>,
}

impl DumpFiles {
    /// True when no file was given.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// Reads the given files into a snapshot (no shape check: the parsers report bad lines with
/// file:line:col, and `--lenient` applies).
pub fn collect(files: &DumpFiles) -> Result<NodeSnapshot, CollectError> {
    let mut snap = NodeSnapshot {
        collector: "files".to_string(),
        ..NodeSnapshot::default()
    };
    for (kind, path) in &files.files {
        let text = if path.as_os_str() == "-" {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|source| {
                CollectError::Io {
                    path: "stdin".into(),
                    source,
                }
            })?;
            s
        } else {
            std::fs::read_to_string(path).map_err(|source| CollectError::Io {
                path: path.display().to_string(),
                source,
            })?
        };
        *kind.slot(&mut snap) = Some(text);
    }
    Ok(snap)
}
