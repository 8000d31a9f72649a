//! Words of an iptables rule line, split the way `iptables-restore` splits them.
//!
//! Syntax (iptables-restore's `add_param_to_argv`, as far as real dumps use it):
//!
//! ```text
//! line   = { blank } [ word { blank+ word } ] { blank }
//! word   = quoted | bare
//! quoted = '"' { char-except-quote-or-backslash | '\' any-char } '"'
//! bare   = 1*( any char except blank )
//! blank  = ' ' | '\t'
//! ```
//!
//! A quoted word without backslashes stays a borrowed slice; only escapes (`\"`, `\\`, `\'`)
//! allocate. Runs of blanks are one separator, so iptables' `--nfacct-name  NAME` (two spaces)
//! yields no empty word.

use std::borrow::Cow;

use nom::character::complete::{anychar, char};
use nom::{IResult, Parser};

use super::ast::Text;

/// A failure inside one line (boxed: results on the hot path stay two words wide).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fail(Box<FailAt>);

/// What a [`Fail`] says: byte offset in the line, what was expected, what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FailAt {
    /// 0-based byte offset in the line.
    pub at: usize,
    /// What the grammar expected.
    pub expected: Cow<'static, str>,
    /// What was found (already formatted: `` `word` `` or `end of line`).
    pub found: String,
}

impl std::ops::Deref for Fail {
    type Target = FailAt;
    fn deref(&self) -> &FailAt {
        &self.0
    }
}

impl std::ops::DerefMut for Fail {
    fn deref_mut(&mut self) -> &mut FailAt {
        &mut self.0
    }
}

impl Fail {
    /// What it says, unboxed.
    pub(crate) fn into_inner(self) -> FailAt {
        *self.0
    }

    /// A failure at byte `at` where the word `found` stood (empty = end of line).
    #[cold]
    pub(crate) fn new(at: usize, expected: impl Into<Cow<'static, str>>, found: &str) -> Self {
        Fail(Box::new(FailAt {
            at,
            expected: expected.into(),
            found: describe(found),
        }))
    }
}

/// How a found word is shown in an error: `` `word` ``, or `end of line`.
pub(crate) fn describe(found: &str) -> String {
    if found.is_empty() {
        "end of line".to_string()
    } else {
        let short: String = found.chars().take(40).collect();
        if short.len() < found.len() {
            format!("`{short}…`")
        } else {
            format!("`{short}`")
        }
    }
}

/// One word of a rule line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tok<'a> {
    /// The word's text: a bare word, or a quoted word's content (escapes still in place when
    /// `escaped`; [`Tok::value`] resolves them).
    pub text: &'a str,
    /// 0-based byte offset of the word in the line.
    pub start: usize,
    /// 0-based byte offset just past the word.
    pub end: usize,
    /// True when the word was written in double quotes.
    pub quoted: bool,
    /// True when the quoted content holds backslash escapes.
    pub escaped: bool,
}

impl<'a> Tok<'a> {
    /// True for an option name (`-s`, `--dport`): unquoted, starts with `-` and a letter or `-`.
    pub(crate) fn is_option(&self) -> bool {
        if self.quoted {
            return false;
        }
        let b = self.text.as_bytes();
        b.len() >= 2 && b[0] == b'-' && (b[1] == b'-' || b[1].is_ascii_alphabetic())
    }

    /// True for the negation word `!`.
    pub(crate) fn is_bang(&self) -> bool {
        !self.quoted && self.text == "!"
    }

    /// The word unquoted and unescaped (borrowed unless it had escapes).
    pub(crate) fn value(&self) -> Cow<'a, str> {
        if self.escaped {
            Cow::Owned(unescape(self.text))
        } else {
            Cow::Borrowed(self.text)
        }
    }

    /// The word as free text (`comment` values): the content between the quotes, or the bare word.
    pub(crate) fn text_view(&self) -> Text<'a> {
        Text {
            raw: self.text,
            escaped: self.escaped,
        }
    }

    /// The word as a slice of the input, for names and single-word values. Quoted words with
    /// escapes cannot be borrowed; quoted words that are empty or hold blanks are no name (they
    /// could not be printed back as the one bare word `iptables-save` prints).
    #[inline]
    pub(crate) fn borrowed(&self) -> Result<&'a str, Fail> {
        if !self.quoted {
            return Ok(self.text);
        }
        self.borrowed_quoted()
    }

    /// [`Tok::borrowed`] for quoted words.
    fn borrowed_quoted(&self) -> Result<&'a str, Fail> {
        let s = self.text;
        if self.escaped {
            Err(Fail::new(
                self.start,
                "a name without escapes",
                &unescape(s),
            ))
        } else if s.is_empty() || s.contains(is_blank) {
            Err(Fail::new(
                self.start,
                "a name (not empty, without blanks)",
                &format!("\"{s}\""),
            ))
        } else {
            Ok(s)
        }
    }
}

/// The index of the first byte at or after `from` that is `a` or `b` (`bytes.len()` when none),
/// eight bytes at a time: words and lines are short, so a word-wide scan beats a call into a
/// vectorised search per word.
#[inline]
pub(crate) fn find2(bytes: &[u8], from: usize, a: u8, b: u8) -> usize {
    const LO: u64 = 0x0101_0101_0101_0101;
    const HI: u64 = 0x8080_8080_8080_8080;
    let (ra, rb) = (LO * u64::from(a), LO * u64::from(b));
    let mut i = from;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        let x = u64::from_le_bytes(w);
        let (xa, xb) = (x ^ ra, x ^ rb);
        // The lowest set bit marks the first byte equal to `a` or `b` (borrows only reach higher
        // bytes).
        let hit = (xa.wrapping_sub(LO) & !xa | xb.wrapping_sub(LO) & !xb) & HI;
        if hit != 0 {
            return i + (hit.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while let Some(&c) = bytes.get(i) {
        if c == a || c == b {
            return i;
        }
        i += 1;
    }
    bytes.len().max(from)
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

/// `bare = 1*( any char except blank )` — the word up to the next blank (words are short: a
/// byte loop beats a vectorised search here).
#[inline]
fn bare(i: &str) -> IResult<&str, &str> {
    let n = i
        .as_bytes()
        .iter()
        .position(|&b| b == b' ' || b == b'\t')
        .unwrap_or(i.len());
    if n == 0 {
        return Err(nom::Err::Error(nom::error::Error::new(
            i,
            nom::error::ErrorKind::TakeTill1,
        )));
    }
    Ok((&i[n..], &i[..n]))
}

/// `quoted = '"' { char-except-quote-or-backslash | '\' any-char } '"'`
///
/// Returns the unescaped content, borrowed when there is no backslash.
fn quoted(i: &str) -> IResult<&str, Cow<'_, str>> {
    let (body, _) = char('"').parse(i)?;
    let bytes = body.as_bytes();
    let mut owned: Option<String> = None;
    let mut pos = 0;
    loop {
        let Some(n) = memchr::memchr2(b'"', b'\\', &bytes[pos..]) else {
            return Err(nom::Err::Error(nom::error::Error::new(
                &body[pos..],
                nom::error::ErrorKind::Char,
            )));
        };
        let stop = pos + n;
        if let Some(o) = owned.as_mut() {
            o.push_str(&body[pos..stop]);
        }
        if bytes[stop] == b'"' {
            let text = match owned {
                Some(o) => Cow::Owned(o),
                None => Cow::Borrowed(&body[..stop]),
            };
            return Ok((&body[stop + 1..], text));
        }
        // A backslash: keep the next character literally.
        let (rest, c) = anychar(&body[stop + 1..])?;
        owned
            .get_or_insert_with(|| body[..stop].to_string())
            .push(c);
        pos = body.len() - rest.len();
    }
}

/// The most words one rule line may have. `iptables-restore` itself reads at most 255
/// (`MAX_ARGC` in iptables' `xshared.c`: "Parser cannot handle more arguments"); a rule added
/// word by word with `iptables -A` can have a few more, so the limit is generous. It bounds
/// what one line costs to parse: a word becomes a few hundred bytes of parsed rule, and a
/// hostile line of millions of words would otherwise take gigabytes.
pub(crate) const MAX_RULE_WORDS: usize = 4096;

/// Splits `line[from..]` into words (see the module doc for the grammar), appending to `out`.
/// More than [`MAX_RULE_WORDS`] words is an error at the first word over the limit.
pub(crate) fn tokenize<'a>(line: &'a str, from: usize, out: &mut Vec<Tok<'a>>) -> Result<(), Fail> {
    let bytes = line.as_bytes();
    let mut pos = from.min(line.len());
    let limit = out.len() + MAX_RULE_WORDS;
    loop {
        while pos < bytes.len() && (bytes[pos] == b' ' || bytes[pos] == b'\t') {
            pos += 1;
        }
        if pos >= bytes.len() {
            return Ok(());
        }
        if out.len() == limit {
            let next = line
                .get(pos..find2(bytes, pos, b' ', b'\t'))
                .unwrap_or_default();
            return Err(Fail::new(
                pos,
                format!(
                    "at most {MAX_RULE_WORDS} words in one rule (iptables-restore reads at most 255)"
                ),
                next,
            ));
        }
        if bytes[pos] != b'"' {
            // A bare word: up to the next blank (ASCII, so both ends are char boundaries).
            let start = pos;
            pos = find2(bytes, pos, b' ', b'\t');
            let word = line.get(start..pos).unwrap_or_default();
            out.push(Tok {
                text: word,
                start,
                end: pos,
                quoted: false,
                escaped: false,
            });
            continue;
        }
        let rest = &line[pos..];
        let (r, text) = match quoted(rest) {
            Ok(found) => found,
            Err(_) => return Err(Fail::new(line.len(), "a closing `\"`", "")),
        };
        let end = line.len() - r.len();
        if !r.is_empty() && !r.starts_with(is_blank) {
            return Err(Fail::new(end, "a blank after the quoted word", r));
        }
        out.push(Tok {
            // The content between the quotes, as written.
            text: line.get(pos + 1..end - 1).unwrap_or_default(),
            start: pos,
            end,
            quoted: true,
            escaped: matches!(text, Cow::Owned(_)),
        });
        pos = end;
    }
}

/// Resolves the backslash escapes of a quoted word's content (`\"` → `"`, `\\` → `\`): a
/// backslash keeps the next character literally, as in [`quoted`].
pub(crate) fn unescape(content: &str) -> String {
    let mut out = String::with_capacity(content.len());
    let mut chars = content.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(next) = chars.next() {
                out.push(next);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The words of `text` (already tokenized once, so well formed), unquoted and unescaped, without
/// collecting them.
pub(crate) fn words(text: &str) -> impl Iterator<Item = Cow<'_, str>> + '_ {
    let mut rest = text;
    std::iter::from_fn(move || {
        rest = rest.trim_start_matches(is_blank);
        if rest.is_empty() {
            return None;
        }
        let (r, w) = if rest.starts_with('"') {
            quoted(rest).ok()?
        } else {
            let (r, w) = bare(rest).ok()?;
            (r, Cow::Borrowed(w))
        };
        rest = r;
        Some(w)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Vec<String> {
        let mut v = Vec::new();
        tokenize(line, 0, &mut v).unwrap();
        v.into_iter().map(|t| t.value().into_owned()).collect()
    }

    #[test]
    fn bare_words_and_runs_of_blanks() {
        assert_eq!(
            words("  -m nfacct --nfacct-name  x\t"),
            ["-m", "nfacct", "--nfacct-name", "x"]
        );
        assert!(words("   ").is_empty());
    }

    #[test]
    fn quoted_words_borrow_without_escapes() {
        let mut v = Vec::new();
        tokenize(r#"--comment "a b" x"#, 0, &mut v).unwrap();
        assert!(matches!(v[1].value(), Cow::Borrowed("a b")));
        assert!(v[1].quoted);
        assert_eq!((v[1].start, v[1].end), (10, 15));
    }

    #[test]
    fn escapes_are_unescaped() {
        assert_eq!(words(r#""pod\'s \"x\" \\""#), [r#"pod's "x" \"#]);
        assert_eq!(words(r#""""#), [""]);
    }

    #[test]
    fn unterminated_quote_is_an_error() {
        let mut v = Vec::new();
        let e = tokenize(r#"--comment "abc"#, 0, &mut v).unwrap_err();
        assert_eq!(e.at, 14);
        assert!(e.expected.contains('"'));
    }

    #[test]
    fn quote_glued_to_a_word_is_an_error() {
        let mut v = Vec::new();
        let e = tokenize(r#""a"b"#, 0, &mut v).unwrap_err();
        assert_eq!(e.at, 3);
    }

    #[test]
    fn words_iterate_like_the_tokenizer() {
        let text = r#"a  "b c" "d\"e" \x"#;
        let got: Vec<String> = super::words(text).map(Cow::into_owned).collect();
        assert_eq!(got, words(text));
        assert_eq!(super::unescape(r#"pod\'s \"x\" \\"#), r#"pod's "x" \"#);
    }

    #[test]
    fn find2_finds_the_first_of_two_bytes() {
        let text = b"KUBE-SEP-ABCDEFGHIJKLMNOP -m\tcomment xx";
        for from in 0..text.len() + 2 {
            let want = text
                .iter()
                .enumerate()
                .skip(from)
                .find(|(_, c)| **c == b' ' || **c == b'\t')
                .map_or(text.len().max(from), |(i, _)| i);
            assert_eq!(find2(text, from, b' ', b'\t'), want, "from {from}");
        }
        // Bytes with the high bit set and borrows across bytes do not confuse it.
        assert_eq!(find2("ééé\u{2020} x".as_bytes(), 0, b' ', b'\t'), 9);
        assert_eq!(find2(&[0x21, 0x1f, 0x20], 0, b' ', b'\t'), 2);
        assert_eq!(find2(b"", 0, b' ', b'\t'), 0);
    }

    #[test]
    fn option_detection() {
        let mut v = Vec::new();
        tokenize(r#"-s --dport ! -1 "-x" 80"#, 0, &mut v).unwrap();
        let f: Vec<bool> = v.iter().map(Tok::is_option).collect();
        assert_eq!(f, [true, true, false, false, false, false]);
        assert!(v[2].is_bang());
    }

    #[test]
    fn a_line_of_more_words_than_any_rule_is_an_error_where_the_limit_is_passed() {
        let line = "-s x ".repeat(MAX_RULE_WORDS / 2);
        let mut v = Vec::new();
        tokenize(&line, 0, &mut v).unwrap();
        assert_eq!(v.len(), MAX_RULE_WORDS);
        let over = format!("{line}-j ACCEPT");
        let mut v = Vec::new();
        let e = tokenize(&over, 0, &mut v).unwrap_err();
        assert_eq!(e.at, line.len());
        assert_eq!(e.found, "`-j`");
        assert!(e.expected.contains("at most 4096 words"), "{e:?}");
    }
}
