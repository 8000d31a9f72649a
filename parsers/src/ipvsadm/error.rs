//! Errors of the ipvsadm and ipset parsers: the crate-wide [`ParseError`] (line:col, expected, found).

pub use crate::error::ParseError;

/// The error type of the ipvsadm and ipset parsers (the crate-wide [`ParseError`]).
pub type IpvsParseError = ParseError;

/// Builds an error for `found` at 0-based byte column `col0` of `text` (1-based line `line`).
pub(crate) fn at(
    line: usize,
    text: &str,
    col0: usize,
    expected: impl Into<String>,
    found: &str,
) -> ParseError {
    let col_chars = text.get(..col0).map_or(col0, |p| p.chars().count());
    ParseError {
        source_name: None,
        line: u32::try_from(line).unwrap_or(u32::MAX),
        col: u32::try_from(col_chars + 1).unwrap_or(u32::MAX),
        expected: expected.into(),
        found: if found.is_empty() {
            "end of line".to_string()
        } else {
            format!("`{found}`")
        },
        line_text: text.trim_end().to_string(),
    }
}
