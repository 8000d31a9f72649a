//! The canonical printer: rules, expressions and whole rulesets in the knftables command form
//! kube-proxy writes (`add rule ip kube-proxy CHAIN ip daddr . meta l4proto . th dport vmap
//! @service-ips`).
//!
//! Choices, all accepted back by nft and by [`super::parse`]:
//! * bitwise operators as words, operands in hex (`mark and 0x4000 == 0`, `mark set mark or
//!   0x4000`); `==` is written only after a bitwise expression, as kube-proxy does;
//! * `mark`, `iif`, `iifname`, `oif`, `oifname` bare, other meta keys as `meta KEY`;
//! * anonymous sets and maps as `{ a , b }` / `{ 0 : goto A , 1 : goto B }`;
//! * symbols bare when they would read back as the same symbol, else in double quotes;
//! * timeouts in seconds (`10800s`), priorities as numbers;
//! * a whole ruleset in the order knftables' `Fake.Dump()` uses: each table, then its chains,
//!   sets and maps (each group by name), rules (chains by name), elements (sets, then maps, by
//!   name). That order loads with `nft -f`.

use std::fmt::{self, Display, Formatter, Write};

use super::ast::{
    BaseChain, Chain, Element, Expr, Family, Log, Nat, Policy, RelOp, Rule, Ruleset, Set, SetFlags,
    SetType, Stmt, Table, Verdict,
};
use super::expr::{is_keyword, is_operator_word};
use super::lexer::is_word_char;
use super::values::{classify, format_duration};

/// Meta keys printed without `meta` (as kube-proxy writes them).
const BARE_PRINTED_META: &[&str] = &["mark", "iif", "iifname", "oif", "oifname"];

/// Where an expression is printed: where only constants are read (right of a match, set
/// elements), or where any expression is (a `set` value, a bitwise operand on the left).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ctx {
    /// A constant position.
    Constant,
    /// Any expression.
    Any,
}

/// True when `s` reads back as the bare symbol `s` in context `ctx`.
fn is_bare_symbol(s: &str, ctx: Ctx) -> bool {
    is_word(s)
        && !s.starts_with('@')
        && !is_operator_word(s)
        && (ctx == Ctx::Constant || !is_keyword(s))
        && matches!(classify(s), Expr::Symbol(_))
}

/// True when `s` is one bare word of the lexer.
fn is_word(s: &str) -> bool {
    !s.is_empty() && s.chars().all(is_word_char)
}

/// Writes a quoted string.
fn quoted(f: &mut Formatter<'_>, s: &str) -> fmt::Result {
    write!(f, "\"{s}\"")
}

/// A name (table, chain, set, object): bare when it is one word, else quoted.
struct Name<'s>(&'s str);

impl Display for Name<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        if is_word(self.0) {
            f.write_str(self.0)
        } else {
            quoted(f, self.0)
        }
    }
}

impl Display for Verdict<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Accept => f.write_str("accept"),
            Verdict::Drop => f.write_str("drop"),
            Verdict::Return => f.write_str("return"),
            Verdict::Continue => f.write_str("continue"),
            Verdict::Jump(c) => write!(f, "jump {}", Name(c)),
            Verdict::Goto(c) => write!(f, "goto {}", Name(c)),
        }
    }
}

/// Writes an operand of a bitwise operator: numbers in hex, lower-precedence operations in
/// parentheses.
fn operand(f: &mut Formatter<'_>, e: &Expr<'_>, parent: u8, right: bool, ctx: Ctx) -> fmt::Result {
    match e {
        Expr::Number(n) => write!(f, "{n:#x}"),
        Expr::Concat(_) | Expr::List(_) | Expr::Map { .. } => {
            f.write_char('(')?;
            write_expr(f, e, ctx)?;
            f.write_char(')')
        }
        Expr::Binary { op, .. }
            if op.precedence() < parent || (right && op.precedence() == parent) =>
        {
            f.write_char('(')?;
            write_expr(f, e, ctx)?;
            f.write_char(')')
        }
        _ => write_expr(f, e, ctx),
    }
}

impl Display for Expr<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write_expr(f, self, Ctx::Any)
    }
}

/// An expression in a constant position (right of a match).
struct Constant<'e, 'a>(&'e Expr<'a>);

impl Display for Constant<'_, '_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write_expr(f, self.0, Ctx::Constant)
    }
}

/// Writes `e` as it is read back in context `ctx`.
fn write_expr(f: &mut Formatter<'_>, e: &Expr<'_>, ctx: Ctx) -> fmt::Result {
    match e {
        Expr::Payload { protocol, field } => write!(f, "{protocol} {field}"),
        Expr::Meta(key) if BARE_PRINTED_META.contains(&&**key) => f.write_str(key),
        Expr::Meta(key) => write!(f, "meta {key}"),
        Expr::Ct { dir, key } => match dir {
            Some(d) => write!(f, "ct {d} {key}"),
            None => write!(f, "ct {key}"),
        },
        Expr::Fib { flags, result } => {
            f.write_str("fib ")?;
            for (i, flag) in flags.iter().enumerate() {
                if i > 0 {
                    f.write_str(" . ")?;
                }
                f.write_str(flag)?;
            }
            write!(f, " {result}")
        }
        Expr::Numgen {
            mode,
            modulus,
            offset,
        } => {
            write!(f, "numgen {mode} mod {modulus}")?;
            if *offset != 0 {
                write!(f, " offset {offset}")?;
            }
            Ok(())
        }
        Expr::Concat(parts) => {
            for (i, p) in parts.iter().enumerate() {
                if i > 0 {
                    f.write_str(" . ")?;
                }
                if matches!(p, Expr::Concat(_) | Expr::List(_)) {
                    f.write_char('(')?;
                    write_expr(f, p, ctx)?;
                    f.write_char(')')?;
                } else {
                    write_expr(f, p, ctx)?;
                }
            }
            Ok(())
        }
        Expr::Binary { op, left, right } => {
            operand(f, left, op.precedence(), false, ctx)?;
            write!(f, " {} ", op.word())?;
            operand(f, right, op.precedence(), true, ctx)
        }
        Expr::Map { key, map } => {
            write_expr(f, key, ctx)?;
            f.write_str(" map ")?;
            write_expr(f, map, Ctx::Constant)
        }
        Expr::Number(n) => write!(f, "{n}"),
        Expr::Addr(a) => write!(f, "{a}"),
        Expr::Prefix(a, len) => write!(f, "{a}/{len}"),
        Expr::Range(lo, hi) => {
            write_expr(f, lo, Ctx::Constant)?;
            f.write_char('-')?;
            write_expr(f, hi, Ctx::Constant)
        }
        Expr::Symbol(s) if is_bare_symbol(s, ctx) => f.write_str(s),
        Expr::Symbol(s) => quoted(f, s),
        Expr::List(items) => {
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    f.write_char(',')?;
                }
                write_expr(f, item, ctx)?;
            }
            Ok(())
        }
        Expr::SetRef(s) => write!(f, "@{s}"),
        Expr::Set(elements) => {
            f.write_str("{ ")?;
            for (i, e) in elements.iter().enumerate() {
                if i > 0 {
                    f.write_str(" , ")?;
                }
                write!(f, "{e}")?;
            }
            f.write_str(" }")
        }
        Expr::Verdict(v) => write!(f, "{v}"),
    }
}

impl Display for Element<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}", Constant(&self.key))?;
        if let Some(t) = self.timeout {
            write!(f, " timeout {}", format_duration(t))?;
        }
        if let Some(t) = self.expires {
            write!(f, " expires {}", format_duration(t))?;
        }
        if let Some(c) = self.counter {
            write!(f, " counter packets {} bytes {}", c.packets, c.bytes)?;
        }
        if let Some(c) = &self.comment {
            f.write_str(" comment ")?;
            quoted(f, c)?;
        }
        if let Some(v) = &self.value {
            write!(f, " : {}", Constant(v))?;
        }
        Ok(())
    }
}

impl Display for Nat<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.keyword())?;
        if let Some(fam) = self.family {
            write!(f, " {fam}")?;
        }
        let v6 = |e: &Expr<'_>| match e {
            Expr::Addr(a) | Expr::Prefix(a, _) => a.is_ipv6(),
            Expr::Range(lo, _) => matches!(**lo, Expr::Addr(a) if a.is_ipv6()),
            _ => false,
        };
        match (&self.addr, &self.port) {
            (Some(a), Some(p)) if v6(a) => write!(f, " to [{a}]:{p}")?,
            (Some(a), Some(p)) => write!(f, " to {a}:{p}")?,
            (Some(a), None) => write!(f, " to {a}")?,
            (None, Some(p)) => write!(f, " to :{p}")?,
            (None, None) => {}
        }
        if !self.flags.is_empty() {
            write!(f, " {}", self.flags.join(","))?;
        }
        Ok(())
    }
}

impl Display for Log<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        f.write_str("log")?;
        if let Some(p) = &self.prefix {
            f.write_str(" prefix ")?;
            quoted(f, p)?;
        }
        if let Some(l) = &self.level {
            write!(f, " level {l}")?;
        }
        if let Some(g) = self.group {
            write!(f, " group {g}")?;
        }
        if let Some(s) = self.snaplen {
            write!(f, " snaplen {s}")?;
        }
        if let Some(q) = self.queue_threshold {
            write!(f, " queue-threshold {q}")?;
        }
        Ok(())
    }
}

impl Display for Stmt<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            Stmt::Match { left, op, right } => {
                let right = Constant(right);
                match (op, left) {
                    (RelOp::Eq, Expr::Binary { .. }) => write!(f, "{left} == {right}"),
                    (RelOp::Eq, _) => write!(f, "{left} {right}"),
                    _ => write!(f, "{left} {} {right}", op.symbol()),
                }
            }
            Stmt::Vmap { key, map } => write!(f, "{key} vmap {}", Constant(map)),
            Stmt::Verdict(v) => write!(f, "{v}"),
            Stmt::Counter(None) => f.write_str("counter"),
            Stmt::Counter(Some(c)) => write!(f, "counter packets {} bytes {}", c.packets, c.bytes),
            Stmt::NamedCounter(name) => {
                f.write_str("counter name ")?;
                quoted(f, name)
            }
            Stmt::Mangle { key, value } => write!(f, "{key} set {value}"),
            Stmt::Nat(n) => write!(f, "{n}"),
            Stmt::Reject(None) => f.write_str("reject"),
            Stmt::Reject(Some(w)) => match &w.code {
                Some(code) => write!(f, "reject with {} {code}", w.kind),
                None => write!(f, "reject with {}", w.kind),
            },
            Stmt::SetUpdate { op, set, elem } => write!(f, "{op} @{set} {{ {elem} }}"),
            Stmt::Log(l) => write!(f, "{l}"),
            Stmt::Xt { kind, name } => {
                write!(f, "xt {kind} ")?;
                quoted(f, name)
            }
            Stmt::Verbatim(text) => f.write_str(text),
        }
    }
}

impl Display for Rule<'_> {
    /// The rule body: statements, then `comment "…"`.
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        for (i, s) in self.stmts.iter().enumerate() {
            if i > 0 {
                f.write_char(' ')?;
            }
            write!(f, "{s}")?;
        }
        if let Some(c) = &self.comment {
            f.write_str(" comment ")?;
            quoted(f, c)?;
        }
        Ok(())
    }
}

impl Display for SetType<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            SetType::Named(names) => f.write_str(&names.join(" . ")),
            SetType::Typeof(e) => write!(f, "{e}"),
        }
    }
}

impl Display for SetFlags<'_> {
    /// `constant,dynamic,interval,timeout` and other flags, in nft's order.
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let known = [
            (self.constant, "constant"),
            (self.dynamic, "dynamic"),
            (self.interval, "interval"),
            (self.timeout, "timeout"),
        ];
        let all = known
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, n)| *n)
            .chain(self.other.iter().map(|o| &**o));
        for (i, flag) in all.enumerate() {
            if i > 0 {
                f.write_char(',')?;
            }
            f.write_str(flag)?;
        }
        Ok(())
    }
}

/// `{ type filter hook input priority 0 ; policy accept ; }`, without the braces.
fn base_chain(f: &mut Formatter<'_>, b: &BaseChain<'_>) -> fmt::Result {
    write!(f, " type {} hook {}", b.kind, b.hook)?;
    if let Some(d) = &b.device {
        f.write_str(" device ")?;
        quoted(f, d)?;
    }
    write!(f, " priority {} ;", b.priority)?;
    match b.policy {
        Some(Policy::Accept) => f.write_str(" policy accept ;"),
        Some(Policy::Drop) => f.write_str(" policy drop ;"),
        None => Ok(()),
    }
}

/// One chain's `add chain` line (without newline).
fn chain_line(f: &mut Formatter<'_>, family: Family, table: &str, c: &Chain<'_>) -> fmt::Result {
    write!(f, "add chain {family} {} {}", Name(table), Name(&c.name))?;
    if c.base.is_none() && c.comment.is_none() {
        return Ok(());
    }
    f.write_str(" {")?;
    if let Some(b) = &c.base {
        base_chain(f, b)?;
    }
    if let Some(cm) = &c.comment {
        f.write_str(" comment ")?;
        quoted(f, cm)?;
        f.write_str(" ;")?;
    }
    f.write_str(" }")
}

/// One set's `add set|map` line (without newline).
fn set_line(f: &mut Formatter<'_>, family: Family, table: &str, s: &Set<'_>) -> fmt::Result {
    let kw = if s.is_map { "map" } else { "set" };
    write!(f, "add {kw} {family} {} {}", Name(table), Name(&s.name))?;
    let mut body = String::new();
    let has_key = !matches!(&s.key, SetType::Named(names) if names.is_empty());
    if has_key {
        let ty = if matches!(s.key, SetType::Typeof(_)) {
            "typeof"
        } else {
            "type"
        };
        write!(body, " {ty} {}", s.key)?;
        if let Some(d) = &s.data {
            write!(body, " : {d}")?;
        }
        body.push_str(" ;");
    }
    if !s.flags.is_empty() {
        write!(body, " flags {} ;", s.flags)?;
    }
    if let Some(t) = s.timeout {
        write!(body, " timeout {} ;", format_duration(t))?;
    }
    if let Some(t) = s.gc_interval {
        write!(body, " gc-interval {} ;", format_duration(t))?;
    }
    if let Some(n) = s.size {
        write!(body, " size {n} ;")?;
    }
    if let Some(p) = &s.policy {
        write!(body, " policy {p} ;")?;
    }
    if s.auto_merge {
        body.push_str(" auto-merge ;");
    }
    if s.counter {
        body.push_str(" counter ;");
    }
    if let Some(c) = &s.comment {
        write!(body, " comment \"{c}\" ;")?;
    }
    if body.is_empty() {
        // A set that input only used (`add element` without `add set`) has no declaration.
        Ok(())
    } else {
        write!(f, " {{{body} }}")
    }
}

impl Table<'_> {
    /// Writes the table as `nft -f` command lines, one per line, in knftables' dump order.
    pub fn write_commands(&self, out: &mut impl Write) -> fmt::Result {
        write!(out, "{}", Commands(self))
    }
}

/// Displays a table as command lines.
struct Commands<'t, 'a>(&'t Table<'a>);

impl Display for Commands<'_, '_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let t = self.0;
        let (fam, tn) = (t.family, &*t.name);
        write!(f, "add table {fam} {}", Name(tn))?;
        if t.comment.is_some() || !t.flags.is_empty() {
            f.write_str(" {")?;
            if let Some(c) = &t.comment {
                f.write_str(" comment ")?;
                quoted(f, c)?;
                f.write_str(" ;")?;
            }
            if !t.flags.is_empty() {
                write!(f, " flags {} ;", t.flags.join(","))?;
            }
            f.write_str(" }")?;
        }
        f.write_char('\n')?;
        let mut chains: Vec<&Chain<'_>> = t.chains.iter().collect();
        chains.sort_by(|a, b| a.name.cmp(&b.name));
        let mut sets: Vec<&Set<'_>> = t.sets.iter().collect();
        // Sets first, then maps, each by name.
        sets.sort_by(|a, b| (a.is_map, &a.name).cmp(&(b.is_map, &b.name)));
        for c in &chains {
            chain_line(f, fam, tn, c)?;
            f.write_char('\n')?;
        }
        for s in &sets {
            set_line(f, fam, tn, s)?;
            f.write_char('\n')?;
        }
        for o in &t.objects {
            writeln!(
                f,
                "add {} {fam} {} {} {{ {} }}",
                o.kind,
                Name(tn),
                Name(&o.name),
                o.body
            )?;
        }
        for c in &chains {
            for r in &c.rules {
                writeln!(f, "add rule {fam} {} {} {r}", Name(tn), Name(&c.name))?;
            }
        }
        for s in &sets {
            for e in &s.elements {
                writeln!(
                    f,
                    "add element {fam} {} {} {{ {e} }}",
                    Name(tn),
                    Name(&s.name)
                )?;
            }
        }
        Ok(())
    }
}

impl Display for Ruleset<'_> {
    /// Every table as `nft -f` command lines (see the module doc for the order).
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        for t in &self.tables {
            write!(f, "{}", Commands(t))?;
        }
        Ok(())
    }
}
