//! nft text: `nft [-a] list ruleset|table …` listings and `nft -f` command input, which share
//! one grammar at the top level.
//!
//! ```text
//! input     = { newline | ";" | comment | table-blk | command | define }
//! table-blk = "table" [ FAMILY ] NAME "{" [ handle ] { newline | ";" | table-attr
//!             | "chain" NAME "{" [ handle ] { chain-attr | rule } "}"
//!             | ( "set" | "map" ) NAME "{" [ handle ] { set-attr } "}"
//!             | OBJECT-KIND NAME "{" … "}" } "}"
//! rule      = stmts [ handle ]                     ; one line (or up to ";")
//! handle    = "# handle" N
//! command   = ( "add" | "create" | "insert" | "replace" | "delete" | "destroy" | "flush" ) …
//! define    = "define" …                          ; ignored, with a warning
//! ```
//!
//! Statements end at a newline or `;` outside braces, so element lists wrap across lines.
//! A `# Warning: XT target DNAT not found` comment continues its rule on the next line (that is
//! how nft prints an `xt target "DNAT"` it cannot decode), and `# Warning: table ip nat is managed
//! by iptables-nft, do not touch!` marks the next table.

use std::borrow::Cow;

use super::ParseOptions;
use super::ast::{Family, InputForm, Object, Rule, Ruleset};
use super::build::Builder;
use super::decl::{chain_attr, object_body, set_attr, table_attr};
use super::dump::command;
use super::expr::{Cursor, rule_body};
use super::lexer::{Kind, Lexer, Token, locate};
use crate::error::ParseError;
use crate::iptables::SkippedLine;
use crate::iptables::lexer::Fail;

/// Result of the grammar functions.
type PResult<T> = Result<T, Fail>;

/// Verbs of `nft -f` commands.
const VERBS: &[&str] = &[
    "add", "create", "insert", "replace", "delete", "destroy", "flush", "reset",
];

/// Keywords of named objects other than chains, sets and maps.
const OBJECT_KINDS: &[&str] = &[
    "counter",
    "quota",
    "limit",
    "ct",
    "flowtable",
    "secmark",
    "synproxy",
    "tunnel",
];

/// The parser over one text input.
struct TextParser<'a, 'o> {
    src: &'a str,
    lex: Lexer<'a>,
    peeked: Option<Token<'a>>,
    opts: &'o ParseOptions,
    b: Builder<'a>,
    /// Tokens of the statement being read (reused).
    toks: Vec<Token<'a>>,
    /// The last comment said the next table is iptables-nft's.
    iptables_nft_next: bool,
    /// A command line was seen (the input is command input).
    saw_command: bool,
    /// Brace depth of the last token taken.
    depth: u32,
    /// The last token taken ended a line (or nothing was taken yet).
    at_line_start: bool,
}

/// Parses nft text (a listing, command input, or a mix).
pub(crate) fn parse_text<'a>(src: &'a str, opts: &ParseOptions) -> Result<Ruleset<'a>, ParseError> {
    let mut p = TextParser {
        src,
        lex: Lexer::new(src),
        peeked: None,
        opts,
        b: Builder::default(),
        toks: Vec::with_capacity(64),
        iptables_nft_next: false,
        saw_command: false,
        depth: 0,
        at_line_start: true,
    };
    p.run().map_err(|f| to_error(src, f))?;
    let form = if p.saw_command {
        InputForm::Commands
    } else {
        InputForm::Listing
    };
    let mut rs = p.b.finish();
    rs.form = form;
    Ok(rs)
}

/// A [`ParseError`] for a failure at a byte offset of `src`.
pub(crate) fn to_error(src: &str, f: Fail) -> ParseError {
    let f = f.into_inner();
    let (line, col, text) = locate(src, f.at);
    ParseError {
        source_name: None,
        line,
        col,
        expected: f.expected.into_owned(),
        found: f.found,
        line_text: text.to_string(),
    }
}

/// The `N` of a `# handle N` comment.
pub(crate) fn handle_of(comment: &str) -> Option<u64> {
    let rest = comment
        .strip_prefix('#')?
        .trim_start()
        .strip_prefix("handle")?;
    rest.trim().parse().ok()
}

impl<'a> TextParser<'a, '_> {
    /// The next token, without taking it.
    fn peek(&mut self) -> PResult<Option<Token<'a>>> {
        if self.peeked.is_none() {
            self.peeked = self.lex.next_token()?;
        }
        Ok(self.peeked)
    }

    /// Takes the next token.
    fn next(&mut self) -> PResult<Option<Token<'a>>> {
        let t = match self.peeked.take() {
            Some(t) => Some(t),
            None => self.lex.next_token()?,
        };
        if let Some(t) = t {
            match t.kind {
                Kind::Open => self.depth += 1,
                Kind::Close => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
            self.at_line_start = t.kind == Kind::Newline;
        }
        Ok(t)
    }

    /// Takes the next token, which must be a bare word or string.
    fn name(&mut self, expected: &'static str) -> PResult<(Cow<'a, str>, Token<'a>)> {
        match self.next()? {
            Some(t) if t.text().is_some() => Ok((Cow::Borrowed(t.text().unwrap_or_default()), t)),
            Some(t) => Err(Fail::new(t.start, expected, t.raw)),
            None => Err(Fail::new(self.src.len(), expected, "")),
        }
    }

    /// Takes `{` and an optional `# handle N` after it.
    fn open_block(&mut self) -> PResult<Option<u64>> {
        match self.next()? {
            Some(t) if t.kind == Kind::Open => {}
            Some(t) => return Err(Fail::new(t.start, "`{`", t.raw)),
            None => return Err(Fail::new(self.src.len(), "`{`", "")),
        }
        if let Some(t) = self.peek()?
            && t.kind == Kind::Comment
            && let Some(h) = handle_of(t.raw)
        {
            self.next()?;
            return Ok(Some(h));
        }
        Ok(None)
    }

    /// Deals with a failed item: strict mode gives the error back; lenient mode records the line
    /// and skips to the end of the item (the next line end at brace depth `depth`, or the `}`
    /// that closes that depth, which is left for the block to take).
    fn recover(&mut self, f: Fail, depth: u32) -> PResult<()> {
        if !self.opts.lenient {
            return Err(f);
        }
        let (line, _, text) = locate(self.src, f.at);
        self.b.rs.skipped.push(SkippedLine {
            line,
            text,
            reason: format!("expected {}, found {}", f.expected, f.found),
        });
        if self.at_line_start && self.depth <= depth {
            return Ok(());
        }
        loop {
            let t = match self.peek() {
                Ok(Some(t)) => t,
                Ok(None) => return Ok(()),
                // An unterminated string: the lexer already stands past it.
                Err(_) => {
                    self.peeked = None;
                    continue;
                }
            };
            if t.kind == Kind::Close && self.depth <= depth {
                return Ok(());
            }
            self.next()?;
            if t.kind == Kind::Newline && self.depth <= depth {
                return Ok(());
            }
        }
    }

    /// The whole input.
    fn run(&mut self) -> PResult<()> {
        loop {
            let t = match self.next() {
                Ok(Some(t)) => t,
                Ok(None) => return Ok(()),
                Err(f) => {
                    self.recover(f, 0)?;
                    continue;
                }
            };
            let r = match t.kind {
                Kind::Newline | Kind::Semi => Ok(()),
                Kind::Comment => {
                    if t.raw.contains("is managed by iptables-nft") {
                        self.iptables_nft_next = true;
                    }
                    Ok(())
                }
                Kind::Word if t.raw == "table" => self.table_block(t),
                Kind::Word if VERBS.contains(&t.raw) => {
                    self.saw_command = true;
                    self.command_line(t)
                }
                Kind::Word if matches!(t.raw, "define" | "redefine" | "undefine" | "include") => {
                    self.b.warn(t.line, format!("`{}` ignored", t.raw));
                    self.statement(None).map(|_| ())
                }
                _ => Err(Fail::new(
                    t.start,
                    "`table`, a command (`add`, `flush`, `delete`, …) or a comment",
                    t.raw,
                )),
            };
            if let Err(f) = r {
                self.recover(f, 0)?;
            }
        }
    }

    /// Collects the tokens of one statement into `self.toks` (starting with `first`, if given):
    /// up to a newline or `;` outside braces (taken) or a `}` that closes the enclosing block
    /// (left). Newlines inside braces are dropped; `# handle N` gives the handle.
    fn statement(&mut self, first: Option<Token<'a>>) -> PResult<Option<u64>> {
        self.toks.clear();
        let mut depth = 0u32;
        let mut handle = None;
        let mut continued = false;
        let mut opened_at = 0usize;
        if let Some(t) = first {
            self.toks.push(t);
        }
        loop {
            let Some(t) = self.peek()? else {
                if depth > 0 {
                    return Err(Fail::new(
                        opened_at,
                        "a `}` closing this `{`",
                        "end of input",
                    ));
                }
                return Ok(handle);
            };
            match t.kind {
                Kind::Newline if depth == 0 && continued => {
                    continued = false;
                    self.next()?;
                }
                Kind::Newline | Kind::Semi if depth == 0 => {
                    self.next()?;
                    return Ok(handle);
                }
                Kind::Newline => {
                    self.next()?;
                }
                Kind::Close if depth == 0 => return Ok(handle),
                Kind::Comment => {
                    self.next()?;
                    if let Some(h) = handle_of(t.raw) {
                        handle = Some(h);
                    } else if depth == 0 && t.raw.starts_with("# Warning: XT") {
                        continued = true;
                    }
                }
                _ => {
                    if t.kind == Kind::Open {
                        if depth == 0 {
                            opened_at = t.start;
                        }
                        depth += 1;
                    } else if t.kind == Kind::Close {
                        depth -= 1;
                    }
                    self.next()?;
                    self.toks.push(t);
                }
            }
        }
    }

    /// A command line: `add rule ip kube-proxy services …`.
    fn command_line(&mut self, verb: Token<'a>) -> PResult<()> {
        self.statement(Some(verb))?;
        let toks = std::mem::take(&mut self.toks);
        let r = command(&mut self.b, &toks, self.src);
        self.toks = toks;
        r
    }

    /// Reads `[FAMILY] NAME` of a table.
    fn family_and_name(&mut self) -> PResult<(Family, Cow<'a, str>)> {
        let (first, t) = self.name("a family or table name")?;
        if t.kind == Kind::Word
            && let Some(f) = Family::from_keyword(&first)
        {
            let (name, _) = self.name("a table name")?;
            return Ok((f, name));
        }
        Ok((Family::Ip, first))
    }

    /// The error for a block that the input ends inside; `header` is the block's first token.
    fn unterminated(&mut self, header: Token<'a>) -> PResult<()> {
        let (line, _, text) = locate(self.src, header.start);
        let what = text.split('{').next().unwrap_or_default().trim();
        if self.opts.lenient {
            self.b.warn(
                line,
                format!("unterminated block `{what}` opened at line {line}"),
            );
            Ok(())
        } else {
            Err(Fail::new(
                self.src.len(),
                format!("`}}` closing `{what}` (unterminated block opened at line {line})"),
                "",
            ))
        }
    }

    /// `table [FAMILY] NAME { … }` (the `table` word already taken).
    fn table_block(&mut self, kw: Token<'a>) -> PResult<()> {
        let (family, name) = self.family_and_name()?;
        let handle = self.open_block()?;
        let depth = self.depth;
        let t = self.b.table(family, name, kw.line);
        {
            let table = self.b.table_mut(t);
            table.handle = handle.or(table.handle);
            if std::mem::take(&mut self.iptables_nft_next) {
                table.managed_by_iptables_nft = true;
            }
        }
        loop {
            let tok = match self.next() {
                Ok(Some(tok)) => tok,
                Ok(None) => return self.unterminated(kw),
                Err(f) => {
                    self.recover(f, depth)?;
                    continue;
                }
            };
            let r = match tok.kind {
                Kind::Close => return Ok(()),
                Kind::Newline | Kind::Semi | Kind::Comment => Ok(()),
                Kind::Word => match tok.raw {
                    "chain" => self.chain_block(t, family),
                    "set" | "map" => self.set_block(t, tok.raw == "map"),
                    "comment" | "flags" => self.table_attr_line(t, tok),
                    w if OBJECT_KINDS.contains(&w) => self.object_block(t, tok),
                    _ => Err(Fail::new(
                        tok.start,
                        "`chain`, `set`, `map`, an object, `comment`, `flags` or `}`",
                        tok.raw,
                    )),
                },
                _ => Err(Fail::new(
                    tok.start,
                    "`chain`, `set`, `map`, an object, `comment`, `flags` or `}`",
                    tok.raw,
                )),
            };
            if let Err(f) = r {
                self.recover(f, depth)?;
            }
        }
    }

    /// `comment "…"` / `flags …` inside a table block.
    fn table_attr_line(&mut self, t: usize, kw: Token<'a>) -> PResult<()> {
        self.statement(Some(kw))?;
        let mut c = Cursor::new(&self.toks, self.src);
        table_attr(&mut c, &mut self.b.rs.tables[t])
    }

    /// `chain NAME { … }` (the `chain` word already taken).
    fn chain_block(&mut self, t: usize, family: Family) -> PResult<()> {
        let (name, name_tok) = self.name("a chain name")?;
        let handle = self.open_block()?;
        let depth = self.depth;
        let ci = self.b.chain(t, name, name_tok.line);
        {
            let chain = self.b.chain_mut(t, ci);
            chain.handle = handle.or(chain.handle);
        }
        loop {
            let tok = match self.peek() {
                Ok(Some(tok)) => tok,
                Ok(None) => return self.unterminated(name_tok),
                Err(f) => {
                    self.recover(f, depth)?;
                    continue;
                }
            };
            match tok.kind {
                Kind::Close => {
                    self.next()?;
                    return Ok(());
                }
                Kind::Newline | Kind::Semi | Kind::Comment => {
                    self.next()?;
                    continue;
                }
                _ => {}
            }
            let r = self.statement(None).and_then(|handle| {
                if self.toks.is_empty() {
                    return Ok(());
                }
                let mut c = Cursor::new(&self.toks, self.src);
                let chain = &mut self.b.rs.tables[t].chains[ci];
                if chain_attr(&mut c, family, chain)? {
                    return Ok(());
                }
                // No statement starts so; in command input these words place a rule.
                if let Some(t) = self
                    .toks
                    .first()
                    .filter(|t| matches!(t.word(), Some("position" | "handle" | "index")))
                {
                    return Err(Fail::new(t.start, "a statement", t.raw));
                }
                let line = self.toks[0].line;
                let (stmts, comment) = rule_body(&self.toks, self.src);
                chain.rules.push(Rule {
                    stmts,
                    comment,
                    handle,
                    line,
                });
                Ok(())
            });
            if let Err(f) = r {
                self.recover(f, depth)?;
            }
        }
    }

    /// `set NAME { … }` / `map NAME { … }` (the keyword already taken).
    fn set_block(&mut self, t: usize, is_map: bool) -> PResult<()> {
        let (name, name_tok) = self.name("a set name")?;
        let handle = self.open_block()?;
        let depth = self.depth;
        let si = self.b.set(t, name, is_map, name_tok.line);
        {
            let set = self.b.set_mut(t, si);
            set.handle = handle.or(set.handle);
            set.is_map |= is_map;
        }
        loop {
            let tok = match self.peek() {
                Ok(Some(tok)) => tok,
                Ok(None) => return self.unterminated(name_tok),
                Err(f) => {
                    self.recover(f, depth)?;
                    continue;
                }
            };
            match tok.kind {
                Kind::Close => {
                    self.next()?;
                    return Ok(());
                }
                Kind::Newline | Kind::Semi | Kind::Comment => {
                    self.next()?;
                    continue;
                }
                _ => {}
            }
            let r = self.statement(None).and_then(|_| {
                let mut c = Cursor::new(&self.toks, self.src);
                set_attr(&mut c, &mut self.b.rs.tables[t].sets[si])
            });
            if let Err(f) = r {
                self.recover(f, depth)?;
            }
        }
    }

    /// `counter NAME { … }`, `ct helper NAME { … }`, … kept as written (the first keyword taken).
    fn object_block(&mut self, t: usize, kw: Token<'a>) -> PResult<()> {
        let mut kind = kw.raw.to_string();
        if kw.raw == "ct" {
            // `ct helper`, `ct timeout`, `ct expectation`.
            match self.next()? {
                Some(tok) if matches!(tok.raw, "helper" | "timeout" | "expectation") => {
                    kind = format!("ct {}", tok.raw);
                }
                Some(tok) => {
                    return Err(Fail::new(
                        tok.start,
                        "`helper`, `timeout` or `expectation`",
                        tok.raw,
                    ));
                }
                None => return Err(Fail::new(self.src.len(), "an object kind", "")),
            }
        }
        let (name, _) = self.name("an object name")?;
        match self.peek()? {
            Some(tok) if tok.kind == Kind::Open => {}
            Some(tok) => return Err(Fail::new(tok.start, "`{`", tok.raw)),
            None => return Err(Fail::new(self.src.len(), "`{`", "")),
        }
        self.open_block()?;
        let depth = self.depth;
        let mut body = Vec::new();
        loop {
            let Some(tok) = self.next()? else {
                return self.unterminated(kw);
            };
            if self.depth < depth {
                break;
            }
            body.push(tok);
        }
        // A second declaration of an object replaces the first (as in command input).
        let objects = &mut self.b.table_mut(t).objects;
        objects.retain(|o| !(o.kind == kind && o.name == name));
        objects.push(Object {
            kind: Cow::Owned(kind),
            name,
            body: Cow::Owned(object_body(&body)),
            line: kw.line,
        });
        Ok(())
    }
}
