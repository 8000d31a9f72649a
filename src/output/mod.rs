//! Output formatting shared by all commands: tables, json/yaml, dot, trees; colour policy in one place.
//!
//! Every command renders through these helpers so that `-o` values, table looks and colour decisions
//! are the same everywhere:
//!
//! * [`table::KubeTable`]: kubectl-like borderless tables (UPPERCASE headers, `--no-headers`);
//! * [`to_json`] / [`to_yaml`]: the machine forms (serde_json pretty, serde-saphyr);
//! * [`dot::Digraph`]: a small Graphviz DOT writer with correct escaping;
//! * [`tree::TreeNode`]: an indented tree printer (`├──`/`└──`);
//! * [`color`]: the one place that decides whether output is coloured, and the palette.

pub mod color;
pub mod dot;
pub mod table;
pub mod tree;

use serde::Serialize;

/// Errors while serialising output.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// JSON serialisation failed.
    #[error("serialising JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// YAML serialisation failed.
    #[error("serialising YAML: {0}")]
    Yaml(#[from] serde_saphyr::SerializeError),
}

/// Pretty-printed JSON with a trailing newline (the stable machine form of every command).
pub fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String, OutputError> {
    let mut s = serde_json::to_string_pretty(value)?;
    s.push('\n');
    Ok(s)
}

/// YAML (serde-saphyr), ending with a newline.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, OutputError> {
    let mut s = serde_saphyr::to_string(value)?;
    if !s.ends_with('\n') {
        s.push('\n');
    }
    Ok(s)
}

/// Formats a share of new connections (0.0–1.0) as a percentage with one decimal: `33.3%`.
pub fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}
