//! Tokens of nft text (listings and `nft -f` command input alike).
//!
//! Syntax (nft's scanner, as far as listings and knftables output use it):
//!
//! ```text
//! input   = { blank | token }
//! token   = newline | "{" | "}" | "(" | ")" | ";" | "," | "|" | "&" | "^" | string | comment
//!         | word
//! string  = '"' { any char except '"' and newline } '"'      ; no escapes, as in nft
//! comment = "#" { any char except newline }                  ; "# handle 12", "# Warning: …"
//! word    = 1*( any char except blank, newline, '{', '}', '(', ')', ';', ',', '"', '#', '|',
//!               '&', '^' )
//! blank   = " " | "\t" | "\r" | "\v" | "\f"
//! ```
//!
//! Words keep `.`, `/`, `:`, `-`, `@`, `[`, `]` and `*` inside them, so chain names such as
//! `endpoint-2CRNCTTE-ns1/svc1/tcp/p80__fd00.10.180..2.1/80`, addresses, prefixes, ranges and
//! `[fd00::1]:80` are one word each; a concatenation dot, a map colon and operators are words of
//! their own because nft (and knftables) always writes them between blanks. The bitwise
//! operators `|`, `&` and `^` are words of their own even without blanks (`(syn|ack)`).

use nom::bytes::complete::{take_till, take_while, take_while1};
use nom::{IResult, Parser};

use crate::iptables::lexer::Fail;

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A bare word.
    Word,
    /// A double-quoted string (`raw` includes the quotes).
    Str,
    /// `{`.
    Open,
    /// `}`.
    Close,
    /// `(`.
    LParen,
    /// `)`.
    RParen,
    /// `;`.
    Semi,
    /// `,`.
    Comma,
    /// End of a line.
    Newline,
    /// `# …` up to the end of the line (`raw` starts with `#`).
    Comment,
}

/// One token and where it stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token<'a> {
    /// What it is.
    pub kind: Kind,
    /// The token as written (strings with their quotes).
    pub raw: &'a str,
    /// Byte offset of the token in the input.
    pub start: usize,
    /// 1-based line of the token.
    pub line: u32,
}

impl<'a> Token<'a> {
    /// Byte offset just past the token.
    pub(crate) fn end(&self) -> usize {
        self.start + self.raw.len()
    }

    /// The bare word, if this is one.
    pub(crate) fn word(&self) -> Option<&'a str> {
        (self.kind == Kind::Word).then_some(self.raw)
    }

    /// True when this is the bare word `w`.
    pub(crate) fn is(&self, w: &str) -> bool {
        self.kind == Kind::Word && self.raw == w
    }

    /// A string's content (without quotes), or a bare word: what a name or comment may be.
    pub(crate) fn text(&self) -> Option<&'a str> {
        match self.kind {
            Kind::Word => Some(self.raw),
            Kind::Str => Some(&self.raw[1..self.raw.len() - 1]),
            _ => None,
        }
    }
}

/// Splits nft text into tokens on demand.
#[derive(Debug, Clone)]
pub(crate) struct Lexer<'a> {
    src: &'a str,
    pos: usize,
    line: u32,
}

/// True for a blank byte.
fn is_blank(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | 0x0b | 0x0c)
}

/// True for a byte that continues a bare word. Every byte of a multi-byte UTF-8 character does,
/// so words end only at ASCII bytes and slicing the text there is safe.
fn is_word_byte(b: u8) -> bool {
    !is_blank(b)
        && !matches!(
            b,
            b'\n' | b'{' | b'}' | b'(' | b')' | b';' | b',' | b'"' | b'#' | b'|' | b'&' | b'^'
        )
}

/// True for a character that continues a bare word.
pub(crate) fn is_word_char(c: char) -> bool {
    !c.is_ascii() || is_word_byte(c as u8)
}

/// `blank*`
fn blanks(i: &[u8]) -> IResult<&[u8], &[u8]> {
    take_while(is_blank).parse(i)
}

/// `word`
fn word(i: &[u8]) -> IResult<&[u8], &[u8]> {
    take_while1(is_word_byte).parse(i)
}

/// `comment` (from the `#`; the newline is left for the next token).
fn comment(i: &[u8]) -> IResult<&[u8], &[u8]> {
    take_till(|b| b == b'\n').parse(i)
}

/// The content of a string after its opening quote, up to the closing quote or the line end.
fn string_body(i: &[u8]) -> IResult<&[u8], &[u8]> {
    take_till(|b| b == b'"' || b == b'\n').parse(i)
}

impl<'a> Lexer<'a> {
    /// A lexer at the start of `src`.
    pub(crate) fn new(src: &'a str) -> Self {
        Lexer {
            src,
            pos: 0,
            line: 1,
        }
    }

    /// The next token, `None` at the end of the input. An unterminated string is an error; the
    /// lexer then stands at the end of that line, so reading can go on with the next one.
    pub(crate) fn next_token(&mut self) -> Result<Option<Token<'a>>, Fail> {
        let rest = &self.src.as_bytes()[self.pos..];
        let after = blanks(rest).map_or(rest, |(r, _)| r);
        let start = self.src.len() - after.len();
        self.pos = start;
        let line = self.line;
        let Some(&c) = after.first() else {
            return Ok(None);
        };
        let (kind, len) = match c {
            b'\n' => {
                self.line += 1;
                (Kind::Newline, 1)
            }
            b'{' => (Kind::Open, 1),
            b'}' => (Kind::Close, 1),
            b'(' => (Kind::LParen, 1),
            b')' => (Kind::RParen, 1),
            b';' => (Kind::Semi, 1),
            b',' => (Kind::Comma, 1),
            b'|' | b'&' | b'^' => (Kind::Word, 1),
            b'"' => {
                let (r, body) = string_body(&after[1..]).unwrap_or((&[], &after[1..]));
                if r.first() != Some(&b'"') {
                    self.pos = start + 1 + body.len();
                    return Err(Fail::new(start, "a closing `\"`", "end of line"));
                }
                (Kind::Str, body.len() + 2)
            }
            b'#' => (
                Kind::Comment,
                comment(after).map_or(after.len(), |(_, text)| text.len()),
            ),
            _ => (Kind::Word, word(after).map_or(1, |(_, w)| w.len())),
        };
        self.pos = start + len;
        Ok(Some(Token {
            kind,
            raw: &self.src[start..start + len],
            start,
            line,
        }))
    }
}

/// The 1-based line, 1-based column (in characters) and text of the line at byte `at` of `src`.
pub(crate) fn locate(src: &str, at: usize) -> (u32, u32, &str) {
    let at = at.min(src.len());
    let at = (0..=at)
        .rev()
        .find(|&i| src.is_char_boundary(i))
        .unwrap_or(0);
    let before = &src[..at];
    let line_start = memchr::memrchr(b'\n', before.as_bytes()).map_or(0, |i| i + 1);
    let line_end = memchr::memchr(b'\n', &src.as_bytes()[at..]).map_or(src.len(), |i| at + i);
    let line = memchr::memchr_iter(b'\n', before.as_bytes()).count() + 1;
    let col = src[line_start..at].chars().count() + 1;
    let text = src[line_start..line_end].trim_end_matches('\r');
    (
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(col).unwrap_or(u32::MAX),
        text,
    )
}
