//! Parse errors shared by every grammar in this crate: position, what was expected, what was found.

use std::fmt;

/// A parse error at a position in the input. Never exposes nom types.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ParseError {
    /// Name of the input (file path or `<stdin>`), set by the caller with [`ParseError::in_source`].
    pub source_name: Option<String>,
    /// 1-based line number.
    pub line: u32,
    /// 1-based column (in characters).
    pub col: u32,
    /// What the grammar expected at that point.
    pub expected: String,
    /// What was found instead (a short excerpt, or `end of line`/`end of input`).
    pub found: String,
    /// The whole offending line, for context.
    pub line_text: String,
}

impl ParseError {
    /// Attaches the input's name (used as the `file` in `file:line:col`).
    pub fn in_source(mut self, name: impl Into<String>) -> Self {
        self.source_name = Some(name.into());
        self
    }
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let src = self.source_name.as_deref().unwrap_or("<input>");
        write!(
            f,
            "{src}:{}:{}: expected {}, found {}\n  {}\n  {}^",
            self.line,
            self.col,
            self.expected,
            visible(&self.found),
            visible(&self.line_text),
            " ".repeat(self.col.saturating_sub(1) as usize)
        )
    }
}

/// `text` with control characters (a NUL byte, an escape) written as escapes, so that a message
/// never quotes text that looks valid but is not.
fn visible(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(|c| c.is_control() && c != '\t') {
        return std::borrow::Cow::Borrowed(text);
    }
    text.chars()
        .map(|c| match c {
            '\0' => "\\0".to_string(),
            '\t' => "\t".to_string(),
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect::<String>()
        .into()
}
