//! Output formatting shared by all commands: tables, json/yaml, dot, trees; colour policy in one place.
//!
//! Every command renders through these helpers so that `-o` values, table looks and colour decisions
//! are the same everywhere:
//!
//! * [`table::KubeTable`]: kubectl-like borderless tables (UPPERCASE headers, `--no-headers`);
//! * [`to_json`] / [`write_json`] / [`to_yaml`]: the machine forms (serde_json pretty, serde-saphyr);
//! * [`dot::Digraph`]: a small Graphviz DOT writer with correct escaping;
//! * [`tree::TreeNode`]: an indented tree printer (`├──`/`└──`);
//! * [`color`]: the one place that decides whether output is coloured, and the palette.

pub mod color;
pub mod dot;
pub mod graph;
pub mod table;
pub mod trace_path;
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
    /// Writing the output failed (a closed pipe, a full disk).
    #[error("writing output")]
    Io(#[from] std::io::Error),
}

/// The width of the terminal stdout writes to, or `None` when it writes to a pipe or a file
/// (tables are then never cut).
pub fn stdout_width() -> Option<usize> {
    terminal_size::terminal_size_of(std::io::stdout()).map(|(w, _)| usize::from(w.0))
}

/// Pretty-printed JSON with a trailing newline (the stable machine form of every command).
pub fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String, OutputError> {
    let mut s = serde_json::to_string_pretty(value)?;
    s.push('\n');
    Ok(s)
}

/// [`to_json`] written as it is produced (for documents of a node-sized dump, which would
/// otherwise be held whole: `graph -o json` of a large node runs to a hundred megabytes and
/// more, BENCHMARKS.md), then flushed.
pub fn write_json<W: std::io::Write, T: Serialize + ?Sized>(
    mut out: W,
    value: &T,
) -> Result<(), OutputError> {
    serde_json::to_writer_pretty(&mut out, value).map_err(|e| {
        if e.is_io() {
            OutputError::Io(e.into()) // the writer's own error, unwrapped
        } else {
            OutputError::Json(e)
        }
    })?;
    out.write_all(b"\n")?;
    out.flush()?;
    Ok(())
}

/// [`to_yaml`] written as it is produced (see [`write_json`]), then flushed.
pub fn write_yaml<W: std::io::Write, T: Serialize>(
    mut out: W,
    value: &T,
) -> Result<(), OutputError> {
    /// The writer as serde-saphyr's `fmt::Write` target: keeps the writer's own error (so a
    /// closed pipe stays an I/O error) and whether the document ended with a newline.
    struct Sink<'w, W: std::io::Write> {
        out: &'w mut W,
        error: Option<std::io::Error>,
        ends_with_newline: bool,
    }
    impl<W: std::io::Write> std::fmt::Write for Sink<'_, W> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            if s.is_empty() {
                return Ok(());
            }
            self.ends_with_newline = s.ends_with('\n');
            self.out.write_all(s.as_bytes()).map_err(|e| {
                self.error = Some(e);
                std::fmt::Error
            })
        }
    }
    let mut sink = Sink {
        out: &mut out,
        error: None,
        ends_with_newline: false,
    };
    if let Err(e) = serde_saphyr::to_fmt_writer(&mut sink, value) {
        return Err(match sink.error.take() {
            Some(io) => OutputError::Io(io),
            None => OutputError::Yaml(e),
        });
    }
    if !sink.ends_with_newline {
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(())
}

/// YAML (serde-saphyr), ending with a newline.
pub fn to_yaml<T: Serialize>(value: &T) -> Result<String, OutputError> {
    let mut s = serde_saphyr::to_string(value)?;
    if !s.ends_with('\n') {
        s.push('\n');
    }
    Ok(s)
}
