//! Attributes of tables, chains, sets and maps, shared by the listing form (one attribute per
//! line or `;`) and command input (`{ type … ; flags … ; }`).
//!
//! ```text
//! table-attr = "comment" STRING | "flags" WORD { "," WORD }
//! chain-attr = "type" TYPE "hook" HOOK [ "device" NAME ] "priority" PRIORITY
//!            | "policy" ( "accept" | "drop" ) | "comment" STRING | "devices" …
//! set-attr   = "type" TYPE { "." TYPE } [ ":" TYPE { "." TYPE } ]
//!            | "typeof" expr [ ":" expr ] | "flags" WORD { "," WORD }
//!            | "timeout" TIME | "gc-interval" TIME | "size" N | "policy" WORD
//!            | "auto-merge" | "counter" | "comment" STRING | "elements" "=" set
//! PRIORITY   = INT | NAME [ ( "+" | "-" ) INT ]
//! ```

use std::borrow::Cow;

use super::ast::{BaseChain, Chain, Family, Policy, Set, SetType, Table};
use super::expr::{Cursor, elements, typeof_expr};
use super::lexer::{Kind, Token};
use super::values::priority;
use crate::iptables::lexer::Fail;

/// Result of the grammar functions.
type PResult<T> = Result<T, Fail>;

/// `table-attr`, applied to `table`.
pub(crate) fn table_attr<'a>(c: &mut Cursor<'_, 'a>, table: &mut Table<'a>) -> PResult<()> {
    match c.peek_word() {
        Some("comment") => {
            c.bump();
            table.comment = Some(Cow::Borrowed(c.text("a comment string")?));
        }
        Some("flags") => {
            c.bump();
            table.flags = word_list(c, "a table flag")?;
        }
        _ => return Err(c.fail("a table attribute (`comment`, `flags`)")),
    }
    c.end("end of the table attribute")
}

/// `WORD { "," WORD }`
fn word_list<'a>(c: &mut Cursor<'_, 'a>, expected: &'static str) -> PResult<Vec<Cow<'a, str>>> {
    let mut out = vec![Cow::Borrowed(c.word(expected)?)];
    while c.eat_kind(Kind::Comma) {
        out.push(Cow::Borrowed(c.word(expected)?));
    }
    Ok(out)
}

/// `chain-attr`, applied to `chain`. `Ok(false)` when the tokens are no chain attribute (in a
/// listing: a rule).
pub(crate) fn chain_attr<'a>(
    c: &mut Cursor<'_, 'a>,
    family: Family,
    chain: &mut Chain<'a>,
) -> PResult<bool> {
    match c.peek_word() {
        Some("type") => {
            c.bump();
            let kind = c.word("a chain type (`filter`, `nat`, `route`)")?;
            if !c.eat("hook") {
                return Err(c.fail("`hook`"));
            }
            let hook = c.word("a hook name")?;
            let device = if c.eat("device") {
                Some(Cow::Borrowed(c.text("a device name")?))
            } else {
                None
            };
            if !c.eat("priority") {
                return Err(c.fail("`priority`"));
            }
            let start = c.index();
            let mut words = Vec::with_capacity(3);
            while let Some(w) = c.peek_word() {
                c.bump();
                words.push(w);
            }
            c.end("end of the chain type")?;
            let Some(priority) = priority(family, &words) else {
                return Err(c.fail_span(start, "a priority (`-110`, `filter`, `dstnat - 10`)"));
            };
            let policy = chain.base.as_ref().and_then(|b| b.policy);
            chain.base = Some(BaseChain {
                kind: Cow::Borrowed(kind),
                hook: Cow::Borrowed(hook),
                priority,
                device,
                policy,
            });
        }
        Some("policy") => {
            c.bump();
            let p = match c.word("`accept` or `drop`")? {
                "accept" => Policy::Accept,
                "drop" => Policy::Drop,
                _ => return Err(c.fail_back("`accept` or `drop`")),
            };
            match chain.base.as_mut() {
                Some(b) => b.policy = Some(p),
                None => return Err(c.fail_back("`type … hook … priority …` before `policy`")),
            }
        }
        Some("comment") if c.peek_at(1).is_some_and(|t| t.text().is_some()) => {
            c.bump();
            chain.comment = Some(Cow::Borrowed(c.text("a comment string")?));
        }
        Some("devices") => {
            // `devices = { … }` of netdev chains: which devices is not modelled.
            while c.bump().is_some() {}
        }
        _ => return Ok(false),
    }
    c.end("end of the chain attribute")?;
    Ok(true)
}

/// `TYPE { "." TYPE }`
fn type_names<'a>(c: &mut Cursor<'_, 'a>) -> PResult<SetType<'a>> {
    let mut names = vec![Cow::Borrowed(c.word("a data type (`ipv4_addr`, …)")?)];
    while c.eat(".") {
        names.push(Cow::Borrowed(c.word("a data type")?));
    }
    Ok(SetType::Named(names))
}

/// `set-attr`, applied to `set`.
pub(crate) fn set_attr<'a>(c: &mut Cursor<'_, 'a>, set: &mut Set<'a>) -> PResult<()> {
    let Some(w) = c.peek_word() else {
        return Err(c.fail("a set attribute"));
    };
    c.bump();
    match w {
        "type" => {
            set.key = type_names(c)?;
            if c.eat(":") {
                c.eat("interval");
                set.data = Some(type_names(c)?);
                set.is_map = true;
            }
        }
        "typeof" => {
            set.key = SetType::Typeof(typeof_expr(c)?);
            if c.eat(":") {
                c.eat("interval");
                // `typeof meta mark : verdict`: the data may be a type name.
                let at = c.index();
                set.data = Some(match typeof_expr(c) {
                    Ok(e) => SetType::Typeof(e),
                    Err(_) => {
                        c.reset(at);
                        type_names(c)?
                    }
                });
                set.is_map = true;
            }
        }
        "flags" => {
            for f in word_list(c, "a set flag")? {
                match &*f {
                    "constant" => set.flags.constant = true,
                    "interval" => set.flags.interval = true,
                    "timeout" => set.flags.timeout = true,
                    "dynamic" => set.flags.dynamic = true,
                    _ => set.flags.other.push(f),
                }
            }
        }
        "timeout" => set.timeout = Some(c.duration()?),
        "gc-interval" => set.gc_interval = Some(c.duration()?),
        "size" => set.size = Some(c.number("a size")?),
        "policy" => set.policy = Some(Cow::Borrowed(c.word("`performance` or `memory`")?)),
        "auto-merge" => set.auto_merge = true,
        "counter" => set.counter = true,
        "comment" => set.comment = Some(Cow::Borrowed(c.text("a comment string")?)),
        "elements" => {
            if !c.eat("=") {
                return Err(c.fail("`=`"));
            }
            let elems = elements(c)?;
            set.elements.extend(elems);
        }
        _ => {
            return Err(c.fail_back(
                "a set attribute (`type`, `typeof`, `flags`, `timeout`, `size`, `comment`, `elements = { … }`)",
            ));
        }
    }
    c.end("end of the set attribute")
}

/// The body of a named object other than a chain, set or map (`counter`, `ct helper`, …), as
/// one canonical line: its tokens separated by single blanks, line ends as ` ; `, comments
/// dropped. Listings and command input of one object give the same text.
pub(crate) fn object_body(toks: &[Token<'_>]) -> String {
    let mut out = String::new();
    let mut pending_semi = false;
    for t in toks {
        match t.kind {
            Kind::Comment => {}
            Kind::Newline | Kind::Semi => pending_semi = !out.is_empty(),
            _ => {
                if !out.is_empty() {
                    out.push_str(if pending_semi { " ; " } else { " " });
                }
                pending_semi = false;
                out.push_str(t.raw);
            }
        }
    }
    out
}
