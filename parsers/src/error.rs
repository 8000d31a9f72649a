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

/// Characters of the offending line shown on each side of the column, and at most of what was
/// found: a message quotes a window of a long line (a dump written as one line, a binary file),
/// never the whole of it.
const CONTEXT: usize = 60;

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let src = self.source_name.as_deref().unwrap_or("<input>");
        let (shown, caret) = excerpt(&self.line_text, self.col.saturating_sub(1) as usize);
        write!(
            f,
            "{src}:{}:{}: expected {}, found {}\n  {shown}\n  {}^",
            self.line,
            self.col,
            self.expected,
            visible(&shorten(&self.found, 2 * CONTEXT)),
            " ".repeat(caret)
        )
    }
}

/// At most `max` characters of `text`, `…` marking a cut.
fn shorten(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => std::borrow::Cow::Borrowed(text),
        Some((end, _)) => format!("{}…", &text[..end]).into(),
    }
}

/// The part of `line` around the 0-based character column `col` ([`CONTEXT`] characters each
/// side, `…` where it is cut), made [`visible`], and where the caret goes under it.
fn excerpt(line: &str, col: usize) -> (String, usize) {
    let start = col.saturating_sub(CONTEXT);
    let from = byte_at_in(line, start);
    let at = from + byte_at_in(&line[from..], col - start);
    let to = at + byte_at_in(&line[at..], CONTEXT);
    let cut_before = if start > 0 { "…" } else { "" };
    let cut_after = if to < line.len() { "…" } else { "" };
    let before = visible(&line[from..at]);
    let caret = cut_before.chars().count() + before.chars().count();
    let shown = format!("{cut_before}{before}{}{cut_after}", visible(&line[at..to]));
    (shown, caret)
}

/// The byte offset of character `n` of `text` (its length when shorter).
fn byte_at_in(text: &str, n: usize) -> usize {
    text.char_indices().nth(n).map_or(text.len(), |(i, _)| i)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn error(line_text: String, col: u32, found: String) -> ParseError {
        ParseError {
            source_name: Some("dump".into()),
            line: 3,
            col,
            expected: "a rule".into(),
            found,
            line_text,
        }
    }

    #[test]
    fn a_short_line_is_shown_whole_with_the_caret_under_the_column() {
        let e = error("-A X -j ?".into(), 9, "`?`".into());
        assert_eq!(
            e.to_string(),
            "dump:3:9: expected a rule, found `?`\n  -A X -j ?\n          ^"
        );
    }

    #[test]
    fn a_long_line_is_cut_around_the_column() {
        // A 2 MB line (a binary file, a dump joined into one line): a window of it, the caret
        // still under the column.
        let mut line = "a".repeat(1 << 20);
        line.push('?');
        line.push_str(&"b".repeat(1 << 20));
        let col = (1 << 20) + 1;
        let e = error(line.clone(), col, format!("`{}`", "c".repeat(1 << 20)));
        let text = e.to_string();
        assert!(text.len() < 600, "{} bytes", text.len());
        let lines: Vec<&str> = text.lines().collect();
        let shown = lines[1].strip_prefix("  ").unwrap_or_default();
        let caret = lines[2].len() - "  ^".len();
        assert_eq!(shown.chars().nth(caret), Some('?'), "{text}");
        assert!(shown.starts_with('…') && shown.ends_with('…'), "{shown}");
        assert_eq!(shown.chars().count(), 2 * CONTEXT + 2, "{shown}");
        assert!(lines[0].ends_with("c…"), "{}", lines[0]);
        assert!(lines[0].starts_with(&format!("dump:3:{col}: ")));
        // Near the start: no cut before.
        let e = error(line, 2, "`a`".into());
        let text = e.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[2], "   ^");
        assert!(lines[1].starts_with("  aa") && lines[1].ends_with('…'));
    }

    #[test]
    fn control_characters_before_the_column_move_the_caret() {
        let e = error("\0\0-A ?".into(), 6, "`?`".into());
        let text = e.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "  \\0\\0-A ?");
        assert_eq!(lines[2].find('^'), lines[1].find('?'));
    }
}
