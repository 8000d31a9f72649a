//! Rule statements, expressions and element lists, parsed from the tokens of one statement.
//!
//! Syntax (nft(8), as far as kube-proxy, iptables-nft and common CNIs write it):
//!
//! ```text
//! rule      = { stmt } [ "comment" STRING ]
//! stmt      = verdict | "counter" [ "packets" N "bytes" N | "name" NAME ] | log | nat | reject | xt
//!           | ( "add" | "update" | "delete" ) "@" SET "{" expr "}"
//!           | expr "vmap" map | expr "set" expr | expr [ relop ] rhs
//! verdict   = "accept" | "drop" | "return" | "continue" | ( "jump" | "goto" ) CHAIN
//! nat       = ( "dnat" | "snat" ) [ ( "ip" | "ip6" ) [ "addr" "." "port" ] ] [ "to" target ] [ flags ]
//!           | ( "masquerade" | "redirect" ) [ "to" ":" PORT ] [ flags ]
//! target    = ADDR[:PORT] | "[" ADDR6 "]" ":" PORT | expr          ; `numgen … map { 0 : A . P }`
//! reject    = "reject" [ "with" ( ( "icmp" | "icmpv6" | "icmpx" ) [ "type" ] CODE | "tcp" "reset" ) ]
//! xt        = "xt" ( "match" | "target" | "watcher" ) NAME
//! expr      = binary { "." binary }                         ; concatenation
//! binary    = unary { binop unary }                         ; shifts > and > xor > or
//! unary     = primary [ "map" map ]
//! primary   = "meta" KEY | META-KEY | "ct" [ DIR ] [ "ip" | "ip6" ] KEY
//!           | "fib" FLAG { "." FLAG } RESULT | "numgen" MODE "mod" N [ "offset" N ]
//!           | PROTOCOL FIELD | "(" expr ")" | CONSTANT | "@" SET | set
//! rhs       = expr { "," expr }                              ; constants only; "," = flag list
//! set       = "{" [ element { "," element } [ "," ] ] "}"
//! element   = expr { "timeout" T | "expires" T | "comment" STRING | counter } [ ":" ( verdict | expr ) ]
//! ```
//!
//! A rule never fails to parse: from the first statement that does not fit this grammar, the
//! rest of the rule is one [`Stmt::Verbatim`]. Nesting (`{`, `(`) deeper than [`MAX_DEPTH`] is
//! such a misfit too, so hostile input cannot exhaust the stack.

use std::borrow::Cow;

use super::ast::{
    BinOp, Counter, Element, Expr, Family, Log, Nat, NatKind, RejectWith, RelOp, Stmt, Verdict,
};
use super::lexer::{Kind, Token};
use super::values::{classify, duration, number};
use crate::iptables::lexer::Fail;

/// Deepest nesting of sets and parentheses inside one statement.
pub(crate) const MAX_DEPTH: u32 = 32;

/// Protocols whose header fields are written `PROTOCOL FIELD`.
const PAYLOAD_PROTOCOLS: &[&str] = &[
    "ip", "ip6", "th", "tcp", "udp", "udplite", "sctp", "dccp", "icmp", "icmpv6", "igmp", "ether",
    "vlan", "arp", "ah", "esp", "comp", "gre",
];

/// Meta keys nft accepts without the `meta` keyword (and prints so: `iifname`, `mark` is
/// printed `meta mark`).
const BARE_META_KEYS: &[&str] = &[
    "mark",
    "iif",
    "iifname",
    "iiftype",
    "oif",
    "oifname",
    "oiftype",
    "skuid",
    "skgid",
    "nftrace",
    "rtclassid",
    "pkttype",
    "cpu",
    "iifgroup",
    "oifgroup",
    "cgroup",
    "ibrname",
    "obrname",
    "ibriport",
    "obriport",
    "sdif",
    "sdifname",
];

/// Words that are operators or statement keywords, never a header field.
const RESERVED: &[&str] = &[
    "vmap", "map", "set", "and", "or", "xor", "lshift", "rshift", "eq", "ne", "lt", "gt", "le",
    "ge", "comment", "accept", "drop", "return", "continue", "jump", "goto", "counter", "to",
    "option", "chunk",
];

/// True for a meta key nft accepts bare.
pub(crate) fn is_bare_meta_key(key: &str) -> bool {
    BARE_META_KEYS.contains(&key)
}

/// True for a word that means something else than a symbol where a constant stands (an
/// operator, an element option, a verdict, `vmap`/`set` after a match's left side).
pub(crate) fn is_operator_word(word: &str) -> bool {
    relop(word).is_some()
        || binop(word).is_some()
        || is_verdict_word(word)
        || matches!(
            word,
            "." | ":"
                | "-"
                | "+"
                | "="
                | "comment"
                | "timeout"
                | "expires"
                | "counter"
                | "vmap"
                | "set"
                | "map"
        )
}

/// True for a word that starts a packet expression where any expression may stand
/// (`meta`, `ct`, `fib`, `numgen`, a protocol, a bare meta key).
pub(crate) fn is_keyword(word: &str) -> bool {
    matches!(word, "meta" | "ct" | "fib" | "numgen")
        || PAYLOAD_PROTOCOLS.contains(&word)
        || is_bare_meta_key(word)
}

/// The relation a word names (`==`, `!=`, `<`, … and their word forms).
fn relop(word: &str) -> Option<RelOp> {
    Some(match word {
        "==" | "eq" => RelOp::Eq,
        "!=" | "ne" => RelOp::Ne,
        "<" | "lt" => RelOp::Lt,
        ">" | "gt" => RelOp::Gt,
        "<=" | "le" => RelOp::Le,
        ">=" | "ge" => RelOp::Ge,
        _ => return None,
    })
}

/// The bitwise operator a word names (`&`/`and`, `|`/`or`, `^`/`xor`, `<<`/`lshift`, `>>`/`rshift`).
fn binop(word: &str) -> Option<BinOp> {
    Some(match word {
        "&" | "and" => BinOp::And,
        "|" | "or" => BinOp::Or,
        "^" | "xor" => BinOp::Xor,
        "<<" | "lshift" => BinOp::Lshift,
        ">>" | "rshift" => BinOp::Rshift,
        _ => return None,
    })
}

/// The verdict keyword of a word, for words that are a whole verdict or start one.
fn is_verdict_word(word: &str) -> bool {
    matches!(
        word,
        "accept" | "drop" | "return" | "continue" | "jump" | "goto"
    )
}

/// Which expressions a position accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// A packet expression (left of a match, a map key): no constant may start it.
    Lhs,
    /// Anything (the value of `set`, a bitwise operand).
    Value,
    /// A constant, set or set reference (right of a match, a set element).
    Rhs,
}

/// A position in the tokens of one statement.
pub(crate) struct Cursor<'t, 'a> {
    toks: &'t [Token<'a>],
    pos: usize,
    src: &'a str,
    depth: u32,
}

/// Result of the grammar functions.
type PResult<T> = Result<T, Fail>;

impl<'t, 'a> Cursor<'t, 'a> {
    /// A cursor at the first of `toks`, which were read from `src`.
    pub(crate) fn new(toks: &'t [Token<'a>], src: &'a str) -> Self {
        Cursor {
            toks,
            pos: 0,
            src,
            depth: 0,
        }
    }

    /// The next token.
    pub(crate) fn peek(&self) -> Option<&Token<'a>> {
        self.toks.get(self.pos)
    }

    /// The token `n` places after the next one.
    pub(crate) fn peek_at(&self, n: usize) -> Option<&Token<'a>> {
        self.toks.get(self.pos + n)
    }

    /// The next token if it is a bare word.
    pub(crate) fn peek_word(&self) -> Option<&'a str> {
        self.peek().and_then(Token::word)
    }

    /// Takes the next token.
    pub(crate) fn bump(&mut self) -> Option<Token<'a>> {
        let t = self.toks.get(self.pos).copied();
        if t.is_some() {
            self.pos += 1;
        }
        t
    }

    /// True when every token has been taken.
    pub(crate) fn at_end(&self) -> bool {
        self.pos >= self.toks.len()
    }

    /// Index of the next token.
    pub(crate) fn index(&self) -> usize {
        self.pos
    }

    /// Takes the next token if it is the word `w`.
    pub(crate) fn eat(&mut self, w: &str) -> bool {
        if self.peek().is_some_and(|t| t.is(w)) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// Takes the next token if it is of `kind`.
    pub(crate) fn eat_kind(&mut self, kind: Kind) -> bool {
        if self.peek().is_some_and(|t| t.kind == kind) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// A failure at the next token (or just past the last one).
    pub(crate) fn fail(&self, expected: &'static str) -> Fail {
        match self.peek() {
            Some(t) => Fail::new(t.start, expected, t.raw),
            None => Fail::new(self.toks.last().map_or(0, Token::end), expected, ""),
        }
    }

    /// A failure at the token just taken.
    pub(crate) fn fail_back(&self, expected: &'static str) -> Fail {
        match self.pos.checked_sub(1).and_then(|i| self.toks.get(i)) {
            Some(t) => Fail::new(t.start, expected, t.raw),
            None => self.fail(expected),
        }
    }

    /// A failure at token `from`, showing the tokens from there to the last one taken.
    pub(crate) fn fail_span(&self, from: usize, expected: &'static str) -> Fail {
        match (
            self.toks.get(from),
            self.pos.checked_sub(1).and_then(|i| self.toks.get(i)),
        ) {
            (Some(a), Some(b)) if b.end() >= a.start => {
                Fail::new(a.start, expected, &self.src[a.start..b.end()])
            }
            _ => self.fail(expected),
        }
    }

    /// Takes a bare word.
    pub(crate) fn word(&mut self, expected: &'static str) -> PResult<&'a str> {
        match self.peek_word() {
            Some(w) => {
                self.pos += 1;
                Ok(w)
            }
            None => Err(self.fail(expected)),
        }
    }

    /// Takes a name or free text: a bare word or a string's content.
    pub(crate) fn text(&mut self, expected: &'static str) -> PResult<&'a str> {
        match self.peek().and_then(Token::text) {
            Some(s) => {
                self.pos += 1;
                Ok(s)
            }
            None => Err(self.fail(expected)),
        }
    }

    /// Takes an unsigned number.
    pub(crate) fn number(&mut self, expected: &'static str) -> PResult<u64> {
        match self.peek_word().and_then(number) {
            Some(n) => {
                self.pos += 1;
                Ok(n)
            }
            None => Err(self.fail(expected)),
        }
    }

    /// Takes an unsigned 32-bit number.
    fn number32(&mut self, expected: &'static str) -> PResult<u32> {
        match self
            .peek_word()
            .and_then(number)
            .and_then(|n| u32::try_from(n).ok())
        {
            Some(n) => {
                self.pos += 1;
                Ok(n)
            }
            None => Err(self.fail(expected)),
        }
    }

    /// Takes a time value.
    pub(crate) fn duration(&mut self) -> PResult<std::time::Duration> {
        match self.peek_word().and_then(duration) {
            Some(d) => {
                self.pos += 1;
                Ok(d)
            }
            None => Err(self.fail("a time value (`3h`, `10800s`)")),
        }
    }

    /// The tokens not taken yet.
    pub(crate) fn rest(&self) -> &'t [Token<'a>] {
        self.toks.get(self.pos..).unwrap_or_default()
    }

    /// Goes back (or forward) to token `index`.
    pub(crate) fn reset(&mut self, index: usize) {
        self.pos = index.min(self.toks.len());
    }

    /// Takes `n` tokens.
    pub(crate) fn skip(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.toks.len());
    }

    /// The input the tokens were read from.
    pub(crate) fn src(&self) -> &'a str {
        self.src
    }

    /// Requires that nothing is left.
    pub(crate) fn end(&self, expected: &'static str) -> PResult<()> {
        if self.at_end() {
            Ok(())
        } else {
            Err(self.fail(expected))
        }
    }

    /// The input text from token `from` to the last token, as written.
    pub(crate) fn text_from(&self, from: usize) -> &'a str {
        match (self.toks.get(from), self.toks.last()) {
            (Some(a), Some(b)) => &self.src[a.start..b.end()],
            _ => "",
        }
    }

    /// Runs `f` one nesting level deeper, failing beyond [`MAX_DEPTH`].
    fn nested<T>(&mut self, f: impl FnOnce(&mut Self) -> PResult<T>) -> PResult<T> {
        if self.depth >= MAX_DEPTH {
            return Err(self.fail("less deeply nested sets and parentheses"));
        }
        self.depth += 1;
        let r = f(self);
        self.depth -= 1;
        r
    }
}

/// The statements and comment of one rule (the tokens after the chain name, or a listing line
/// without its `# handle` comment).
pub(crate) fn rule_body<'a>(
    toks: &[Token<'a>],
    src: &'a str,
) -> (Vec<Stmt<'a>>, Option<Cow<'a, str>>) {
    let (toks, comment) = match toks {
        [rest @ .., c, s] if c.is("comment") && s.kind == Kind::Str => {
            (rest, s.text().map(Cow::Borrowed))
        }
        _ => (toks, None),
    };
    let mut c = Cursor::new(toks, src);
    let mut stmts = Vec::with_capacity(4);
    while !c.at_end() {
        let from = c.index();
        match stmt(&mut c) {
            Ok(s) => stmts.push(s),
            Err(_) => {
                stmts.push(Stmt::Verbatim(Cow::Borrowed(c.text_from(from))));
                break;
            }
        }
    }
    // A whole table holds hundreds of thousands of rules: keep no spare statement slots.
    stmts.shrink_to_fit();
    (stmts, comment)
}

/// One statement.
fn stmt<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Stmt<'a>> {
    let Some(w) = c.peek_word() else {
        return expr_stmt(c);
    };
    match w {
        _ if is_verdict_word(w) => Ok(Stmt::Verdict(verdict(c)?)),
        "counter" => {
            c.bump();
            if c.eat("name") {
                return Ok(Stmt::NamedCounter(Cow::Borrowed(c.text("a counter name")?)));
            }
            Ok(Stmt::Counter(counter_values(c)?))
        }
        "log" => log(c),
        "dnat" | "snat" | "masquerade" | "redirect" => nat(c),
        "reject" => reject(c),
        "xt" => {
            c.bump();
            let kind = c.word("`match`, `target` or `watcher`")?;
            if !matches!(kind, "match" | "target" | "watcher") {
                return Err(c.fail_back("`match`, `target` or `watcher`"));
            }
            let name = c.text("an extension name")?;
            Ok(Stmt::Xt {
                kind: Cow::Borrowed(kind),
                name: Cow::Borrowed(name),
            })
        }
        "add" | "update" | "delete"
            if c.peek_at(1)
                .and_then(Token::word)
                .is_some_and(|n| n.starts_with('@')) =>
        {
            set_update(c)
        }
        _ => expr_stmt(c),
    }
}

/// `counter` values after the keyword: nothing, or `packets P bytes B`.
fn counter_values(c: &mut Cursor<'_, '_>) -> PResult<Option<Counter>> {
    if c.peek_word() == Some("name") {
        // An element's counter is its own, never a named one.
        return Err(c.fail("an anonymous counter"));
    }
    if !c.eat("packets") {
        return Ok(None);
    }
    let packets = c.number("a packet count")?;
    if !c.eat("bytes") {
        return Err(c.fail("`bytes`"));
    }
    let bytes = c.number("a byte count")?;
    Ok(Some(Counter { packets, bytes }))
}

/// `verdict`
fn verdict<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Verdict<'a>> {
    let w = c.word("a verdict")?;
    Ok(match w {
        "accept" => Verdict::Accept,
        "drop" => Verdict::Drop,
        "return" => Verdict::Return,
        "continue" => Verdict::Continue,
        "jump" => Verdict::Jump(Cow::Borrowed(c.text("a chain name")?)),
        "goto" => Verdict::Goto(Cow::Borrowed(c.text("a chain name")?)),
        _ => return Err(c.fail_back("a verdict")),
    })
}

/// `log [prefix "…"] [level L] [group N] [snaplen N] [queue-threshold N]`
fn log<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Stmt<'a>> {
    c.bump();
    let mut l = Log::default();
    loop {
        match c.peek_word() {
            Some("prefix") => {
                c.bump();
                l.prefix = Some(Cow::Borrowed(c.text("a log prefix")?));
            }
            Some("level") => {
                c.bump();
                l.level = Some(Cow::Borrowed(c.word("a log level")?));
            }
            Some("group") => {
                c.bump();
                l.group = Some(c.number32("a log group")?);
            }
            Some("snaplen") => {
                c.bump();
                l.snaplen = Some(c.number32("a snap length")?);
            }
            Some("queue-threshold") => {
                c.bump();
                l.queue_threshold = Some(c.number32("a queue threshold")?);
            }
            Some("flags") => return Err(c.fail("a log option other than `flags`")),
            _ => return Ok(Stmt::Log(l)),
        }
    }
}

/// True for a NAT flag word.
fn is_nat_flag(w: &str) -> bool {
    matches!(w, "random" | "fully-random" | "persistent" | "netmap")
}

/// `nat`
fn nat<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Stmt<'a>> {
    let kind = match c.word("a NAT statement")? {
        "dnat" => NatKind::Dnat,
        "snat" => NatKind::Snat,
        "masquerade" => NatKind::Masquerade,
        _ => NatKind::Redirect,
    };
    let mut n = Nat {
        kind,
        family: None,
        addr: None,
        port: None,
        flags: Vec::new(),
    };
    if matches!(kind, NatKind::Dnat | NatKind::Snat)
        && let Some(f) = c.peek_word().and_then(Family::from_keyword)
    {
        // `dnat ip to …`, and kube-proxy's `dnat ip addr . port to … map { … }` (since 1.36):
        // `addr . port` says the map's values are address and port, which nft reads from the
        // map's data type anyway and never lists, so it is not kept.
        let addr_port = ["addr", ".", "port", "to"]
            .iter()
            .enumerate()
            .all(|(i, w)| c.peek_at(i + 1).is_some_and(|t| t.is(w)));
        if addr_port {
            c.skip(4);
            n.family = Some(f);
        } else if c.peek_at(1).is_some_and(|t| t.is("to")) {
            c.bump();
            n.family = Some(f);
        }
    }
    if c.eat("to") {
        let expression = c.peek_word().is_some_and(is_keyword)
            || c.peek().is_some_and(|t| t.kind == Kind::LParen);
        if matches!(kind, NatKind::Dnat | NatKind::Snat) && expression {
            // `dnat ip to ip daddr map { … }`: the address is looked up.
            let addr = expr(c, Mode::Value)?;
            if !starts_with_packet_expr(&addr) {
                return Err(c.fail_back("an address expression"));
            }
            n.addr = Some(addr);
        } else {
            nat_target(c, &mut n)?;
        }
    }
    while let Some(w) = c.peek_word().filter(|w| is_nat_flag(w)) {
        c.bump();
        n.flags.push(Cow::Borrowed(w));
        if c.peek().is_some_and(|t| t.kind == Kind::Comma)
            && c.peek_at(1).and_then(Token::word).is_some_and(is_nat_flag)
        {
            c.bump();
        }
    }
    Ok(Stmt::Nat(n))
}

/// True when the leftmost operand of `e` is a packet expression (`ip daddr`, `meta mark`, …),
/// so that `e` reads back as an expression where an address may stand too.
fn starts_with_packet_expr(e: &Expr<'_>) -> bool {
    match e {
        Expr::Payload { .. }
        | Expr::Meta(_)
        | Expr::Ct { .. }
        | Expr::Fib { .. }
        | Expr::Numgen { .. } => true,
        Expr::Map { key: first, .. } | Expr::Binary { left: first, .. } => {
            starts_with_packet_expr(first)
        }
        Expr::Concat(parts) => parts.first().is_some_and(starts_with_packet_expr),
        _ => false,
    }
}

/// `ADDR[:PORT]`, `[ADDR6]:PORT` or `:PORT` after `to`, into `n`.
fn nat_target<'a>(c: &mut Cursor<'_, 'a>, n: &mut Nat<'a>) -> PResult<()> {
    let target = c.word("an address or `:PORT`")?;
    let (addr, port) = split_nat_target(target)
        .ok_or_else(|| c.fail_back("`ADDR[:PORT]`, `[ADDR6]:PORT` or `:PORT`"))?;
    if !addr.is_empty() {
        let a = classify(addr);
        if !matches!(n.kind, NatKind::Dnat | NatKind::Snat)
            || !matches!(a, Expr::Addr(_) | Expr::Prefix(..) | Expr::Range(..))
        {
            return Err(c.fail_back("an address"));
        }
        n.addr = Some(a);
    }
    if let Some(p) = port {
        match classify(p) {
            e @ (Expr::Number(_) | Expr::Range(..)) => n.port = Some(e),
            _ => return Err(c.fail_back("a port")),
        }
    }
    Ok(())
}

/// Splits a NAT target into address text and port text: `10.0.0.1:80`, `[fd00::1]:80`,
/// `fd00::1`, `:8080`, `10.0.0.1-10.0.0.9`.
fn split_nat_target(t: &str) -> Option<(&str, Option<&str>)> {
    if let Some(inner) = t.strip_prefix('[') {
        let (addr, after) = inner.split_once(']')?;
        return match after {
            "" => Some((addr, None)),
            _ => Some((addr, Some(after.strip_prefix(':')?))),
        };
    }
    if let Some(port) = t.strip_prefix(':') {
        return Some(("", Some(port)));
    }
    match t.matches(':').count() {
        0 => Some((t, None)),
        1 => {
            let (a, p) = t.split_once(':')?;
            Some((a, Some(p)))
        }
        // An IPv6 address without brackets has no port.
        _ => Some((t, None)),
    }
}

/// `reject`
fn reject<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Stmt<'a>> {
    c.bump();
    if !c.eat("with") {
        return Ok(Stmt::Reject(None));
    }
    let kind = c.word("`icmp`, `icmpv6`, `icmpx` or `tcp`")?;
    match kind {
        "icmp" | "icmpv6" | "icmpx" => {
            c.eat("type");
            let code = c.word("an ICMP code")?;
            Ok(Stmt::Reject(Some(RejectWith {
                kind: Cow::Borrowed(kind),
                code: Some(Cow::Borrowed(code)),
            })))
        }
        "tcp" if c.eat("reset") => Ok(Stmt::Reject(Some(RejectWith {
            kind: Cow::Borrowed("tcp reset"),
            code: None,
        }))),
        _ => Err(c.fail_back("`icmp`, `icmpv6`, `icmpx` or `tcp reset`")),
    }
}

/// `( "add" | "update" | "delete" ) "@" SET "{" expr "}"`
fn set_update<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Stmt<'a>> {
    let op = c.word("`add`, `update` or `delete`")?;
    let set = c.word("`@SET`")?;
    let set = set.strip_prefix('@').unwrap_or(set);
    if !c.eat_kind(Kind::Open) {
        return Err(c.fail("`{`"));
    }
    let elem = c.nested(|c| expr(c, Mode::Lhs))?;
    if !c.eat_kind(Kind::Close) {
        return Err(c.fail("`}`"));
    }
    Ok(Stmt::SetUpdate {
        op: Cow::Borrowed(op),
        set: Cow::Borrowed(set),
        elem,
    })
}

/// `expr "vmap" map | expr "set" expr | expr [ relop ] rhs`
fn expr_stmt<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Stmt<'a>> {
    let left = expr(c, Mode::Lhs)?;
    match c.peek_word() {
        Some("vmap") => {
            c.bump();
            let map = map_operand(c)?;
            Ok(Stmt::Vmap { key: left, map })
        }
        Some("set") => {
            c.bump();
            let value = expr(c, Mode::Value)?;
            Ok(Stmt::Mangle { key: left, value })
        }
        w => {
            let op = match w.and_then(relop) {
                Some(op) => {
                    c.bump();
                    op
                }
                None => RelOp::Eq,
            };
            if c.at_end() {
                return Err(c.fail("a value to match"));
            }
            let right = rhs(c)?;
            Ok(Stmt::Match { left, op, right })
        }
    }
}

/// The map of a `vmap`/`map` lookup: `@name` or an anonymous `{ … }`.
fn map_operand<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Expr<'a>> {
    match c.peek().copied() {
        Some(t) if t.kind == Kind::Open => c.nested(|c| Ok(Expr::Set(elements(c)?))),
        Some(t) if t.raw.len() > 1 && t.raw.starts_with('@') && t.kind == Kind::Word => {
            c.bump();
            Ok(Expr::SetRef(Cow::Borrowed(&t.raw[1..])))
        }
        _ => Err(c.fail("`@MAP` or `{ … }`")),
    }
}

/// `rhs = expr { "," expr }`
fn rhs<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Expr<'a>> {
    let first = expr(c, Mode::Rhs)?;
    if !c.peek().is_some_and(|t| t.kind == Kind::Comma) {
        return Ok(first);
    }
    let mut items = vec![first];
    while c.eat_kind(Kind::Comma) {
        items.push(expr(c, Mode::Rhs)?);
    }
    Ok(Expr::List(items))
}

/// `expr = binary { "." binary }`
fn expr<'a>(c: &mut Cursor<'_, 'a>, mode: Mode) -> PResult<Expr<'a>> {
    let first = binary(c, mode, 0)?;
    if c.peek_word() != Some(".") {
        return Ok(first);
    }
    let mut parts = vec![first];
    while c.eat(".") {
        parts.push(binary(c, mode, 0)?);
    }
    Ok(Expr::Concat(parts))
}

/// `binary = unary { binop unary }`, by precedence climbing (left-associative).
fn binary<'a>(c: &mut Cursor<'_, 'a>, mode: Mode, min_prec: u8) -> PResult<Expr<'a>> {
    let mut left = unary(c, mode)?;
    let operand = if mode == Mode::Rhs {
        Mode::Rhs
    } else {
        Mode::Value
    };
    while let Some(op) = c.peek_word().and_then(binop) {
        if op.precedence() < min_prec {
            break;
        }
        c.bump();
        let right = binary(c, operand, op.precedence() + 1)?;
        left = Expr::Binary {
            op,
            left: Box::new(left),
            right: Box::new(right),
        };
    }
    Ok(left)
}

/// `unary = primary [ "map" map ]`
fn unary<'a>(c: &mut Cursor<'_, 'a>, mode: Mode) -> PResult<Expr<'a>> {
    let e = primary(c, mode)?;
    if mode != Mode::Rhs && c.eat("map") {
        let map = map_operand(c)?;
        return Ok(Expr::Map {
            key: Box::new(e),
            map: Box::new(map),
        });
    }
    Ok(e)
}

/// `primary`
fn primary<'a>(c: &mut Cursor<'_, 'a>, mode: Mode) -> PResult<Expr<'a>> {
    let Some(t) = c.peek().copied() else {
        return Err(c.fail("an expression"));
    };
    match t.kind {
        Kind::Open if mode != Mode::Lhs => c.nested(|c| Ok(Expr::Set(elements(c)?))),
        Kind::LParen => c.nested(|c| {
            c.bump();
            // The group stands where it is: a packet expression on the left stays one.
            let e = expr(c, mode)?;
            if !c.eat_kind(Kind::RParen) {
                return Err(c.fail("`)`"));
            }
            Ok(e)
        }),
        Kind::Str if mode != Mode::Lhs => {
            c.bump();
            Ok(Expr::Symbol(Cow::Borrowed(t.text().unwrap_or_default())))
        }
        Kind::Word => {
            if mode != Mode::Rhs
                && let Some(e) = keyword_expr(c)?
            {
                return Ok(e);
            }
            let w = t.raw;
            if mode == Mode::Lhs {
                return Err(c.fail("a packet expression (`ip daddr`, `meta l4proto`, …)"));
            }
            if matches!(w, "." | ":") || relop(w).is_some() || binop(w).is_some() {
                return Err(c.fail("a value"));
            }
            c.bump();
            if let Some(name) = w.strip_prefix('@').filter(|n| !n.is_empty()) {
                return Ok(Expr::SetRef(Cow::Borrowed(name)));
            }
            Ok(classify(w))
        }
        _ => Err(c.fail("an expression")),
    }
}

/// True for a word that can be a header field name (`saddr`, `dport`, `protocol`).
fn is_field(w: &str) -> bool {
    w.as_bytes().first().is_some_and(u8::is_ascii_lowercase)
        && w.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !RESERVED.contains(&w)
}

/// A packet expression introduced by a keyword, if the next tokens are one.
fn keyword_expr<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Option<Expr<'a>>> {
    let Some(w) = c.peek_word() else {
        return Ok(None);
    };
    let next = c.peek_at(1).and_then(Token::word);
    let e = match w {
        "meta" => {
            c.bump();
            Expr::Meta(Cow::Borrowed(c.word("a meta key")?))
        }
        _ if is_bare_meta_key(w) => {
            c.bump();
            Expr::Meta(Cow::Borrowed(w))
        }
        "ct" => {
            c.bump();
            let dir = match c.peek_word() {
                Some(d @ ("original" | "reply")) => {
                    c.bump();
                    Some(Cow::Borrowed(d))
                }
                _ => None,
            };
            let key = c.word("a conntrack key")?;
            let key = if matches!(key, "ip" | "ip6") {
                let field = c.word("an address field")?;
                Cow::Owned(format!("{key} {field}"))
            } else {
                Cow::Borrowed(key)
            };
            Expr::Ct { dir, key }
        }
        "fib" => {
            c.bump();
            let mut flags = vec![Cow::Borrowed(c.word("a fib input (`saddr`, `daddr`, …)")?)];
            while c.eat(".") {
                flags.push(Cow::Borrowed(c.word("a fib input")?));
            }
            let result = c.word("a fib result (`type`, `oif`, `oifname`)")?;
            if !matches!(result, "type" | "oif" | "oifname") {
                return Err(c.fail_back("a fib result"));
            }
            Expr::Fib {
                flags,
                result: Cow::Borrowed(result),
            }
        }
        "numgen" => {
            c.bump();
            let mode = c.word("`random` or `inc`")?;
            if !c.eat("mod") {
                return Err(c.fail("`mod`"));
            }
            let modulus = c.number32("a modulus")?;
            let offset = if c.eat("offset") {
                c.number32("an offset")?
            } else {
                0
            };
            Expr::Numgen {
                mode: Cow::Borrowed(mode),
                modulus,
                offset,
            }
        }
        _ if PAYLOAD_PROTOCOLS.contains(&w) && next.is_some_and(is_field) => {
            c.bump();
            let field = c.word("a header field")?;
            Expr::Payload {
                protocol: Cow::Borrowed(w),
                field: Cow::Borrowed(field),
            }
        }
        _ => return Ok(None),
    };
    Ok(Some(e))
}

/// `set = "{" [ element { "," element } [ "," ] ] "}"` (newlines were dropped when the tokens
/// were collected).
pub(crate) fn elements<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Vec<Element<'a>>> {
    if !c.eat_kind(Kind::Open) {
        return Err(c.fail("`{`"));
    }
    let mut out = Vec::new();
    loop {
        if c.eat_kind(Kind::Close) {
            break;
        }
        out.push(element(c)?);
        if c.eat_kind(Kind::Comma) {
            continue;
        }
        if c.eat_kind(Kind::Close) {
            break;
        }
        return Err(c.fail("`,` or `}`"));
    }
    // Sets of every service's rules stay alive with the table: no spare slots.
    out.shrink_to_fit();
    Ok(out)
}

/// `element`
fn element<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Element<'a>> {
    let mut e = Element::key(expr(c, Mode::Rhs)?);
    loop {
        match c.peek_word() {
            Some("timeout") => {
                c.bump();
                e.timeout = Some(c.duration()?);
            }
            Some("expires") => {
                c.bump();
                e.expires = Some(c.duration()?);
            }
            Some("comment") => {
                c.bump();
                e.comment = Some(Cow::Borrowed(c.text("a comment")?));
            }
            Some("counter") => {
                c.bump();
                e.counter = Some(counter_values(c)?.unwrap_or_default());
            }
            _ => break,
        }
    }
    if c.eat(":") {
        e.value = Some(match c.peek_word() {
            Some(w) if is_verdict_word(w) => Expr::Verdict(verdict(c)?),
            _ => expr(c, Mode::Rhs)?,
        });
    }
    Ok(e)
}

/// A type expression of `typeof`: packet expressions joined by `.`.
pub(crate) fn typeof_expr<'a>(c: &mut Cursor<'_, 'a>) -> PResult<Expr<'a>> {
    expr(c, Mode::Lhs)
}
