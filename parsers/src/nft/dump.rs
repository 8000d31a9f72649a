//! `nft -f` command lines: the knftables form kube-proxy sends (and its tests compare) and
//! `-v=9` logs show.
//!
//! ```text
//! command = "flush" "ruleset"
//!         | VERB "table" [ FAMILY ] NAME [ "{" table-attr { ";" table-attr } "}" ]
//!         | VERB "chain" [ FAMILY ] TABLE ( NAME | "handle" N ) [ "{" chain-attr { ";" chain-attr } "}" ]
//!         | VERB ( "set" | "map" ) [ FAMILY ] TABLE NAME [ "{" set-attr { ";" set-attr } "}" ]
//!         | VERB "rule" [ FAMILY ] TABLE CHAIN [ ( "position" | "handle" | "index" ) N ] [ rule ]
//!         | VERB "element" [ FAMILY ] TABLE SET set
//!         | VERB OBJECT-KIND [ FAMILY ] TABLE NAME [ "{" … "}" ]
//! VERB    = "add" | "create" | "insert" | "replace" | "delete" | "destroy" | "flush" | "reset"
//! ```
//!
//! Commands apply in order to the ruleset being built: `add` creates (or adds to) an object,
//! `flush` empties it, `delete` removes it, `insert` puts a rule first (or before `position N`),
//! `replace` swaps the rule with `handle N`. Using an object that no command created (kube-proxy's
//! test dumps are not in loadable order) creates it, with a warning.

use std::borrow::Cow;
use std::collections::HashSet;

use super::ast::{Family, Object, Rule};
use super::build::Builder;
use super::decl::{chain_attr, object_body, set_attr, table_attr};
use super::expr::{Cursor, elements, rule_body};
use super::lexer::{Kind, Token};
use crate::iptables::lexer::Fail;

/// Result of the grammar functions.
type PResult<T> = Result<T, Fail>;

/// Where `add`/`insert` put a rule.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// At the end (`add`) or the start (`insert`).
    Default,
    /// Relative to the rule with this handle (`position N` / `handle N`).
    Handle(u64),
    /// Relative to the rule at this index (`index N`).
    Index(u64),
}

/// Applies one command line (`toks` holds the whole line, verb first).
pub(crate) fn command<'a>(b: &mut Builder<'a>, toks: &[Token<'a>], src: &'a str) -> PResult<()> {
    let mut c = Cursor::new(toks, src);
    let line = toks.first().map_or(0, |t| t.line);
    let verb = c.word("a command")?;
    let object = c.word("`table`, `chain`, `set`, `map`, `rule`, `element` or `ruleset`")?;
    match object {
        "ruleset" => {
            c.end("end of line")?;
            if verb == "flush" {
                b.clear();
            }
            Ok(())
        }
        "table" => table_cmd(b, &mut c, verb, line),
        "chain" => chain_cmd(b, &mut c, verb, line),
        "set" | "map" => set_cmd(b, &mut c, verb, object == "map", line),
        "rule" => rule_cmd(b, &mut c, verb, line),
        "element" => element_cmd(b, &mut c, verb, line),
        "counter" | "quota" | "limit" | "ct" | "flowtable" | "secmark" | "synproxy" | "tunnel" => {
            object_cmd(b, &mut c, verb, object, line)
        }
        _ => Err(c.fail_back(
            "`table`, `chain`, `set`, `map`, `rule`, `element`, `ruleset` or an object kind",
        )),
    }
}

/// `[ FAMILY ]` before a table name.
fn family(c: &mut Cursor<'_, '_>) -> Family {
    match c.peek_word().and_then(Family::from_keyword) {
        Some(f) => {
            c.bump();
            f
        }
        None => Family::Ip,
    }
}

/// The `;`-separated parts of a `{ … }` body, each as its own cursor.
fn body_parts<'t, 'a>(c: &mut Cursor<'t, 'a>) -> PResult<Vec<Cursor<'t, 'a>>> {
    let toks = c.rest();
    let src = c.src();
    if toks.first().map(|t| t.kind) != Some(Kind::Open) {
        return Err(c.fail("`{`"));
    }
    let mut depth = 0u32;
    let mut parts = Vec::new();
    let mut from = 1;
    for (i, t) in toks.iter().enumerate() {
        match t.kind {
            Kind::Open => depth += 1,
            Kind::Close => {
                depth -= 1;
                if depth == 0 {
                    if from < i {
                        parts.push(Cursor::new(&toks[from..i], src));
                    }
                    c.skip(i + 1);
                    return Ok(parts);
                }
            }
            Kind::Semi if depth == 1 => {
                if from < i {
                    parts.push(Cursor::new(&toks[from..i], src));
                }
                from = i + 1;
            }
            _ => {}
        }
    }
    Err(c.fail("a `}` closing the `{`"))
}

/// `VERB "table" [ FAMILY ] NAME [ "{" … "}" ]`
fn table_cmd<'a>(
    b: &mut Builder<'a>,
    c: &mut Cursor<'_, 'a>,
    verb: &str,
    line: u32,
) -> PResult<()> {
    let fam = family(c);
    let name = c.text("a table name")?;
    match verb {
        "add" | "create" => {
            let t = b.table(fam, Cow::Borrowed(name), line);
            if !c.at_end() {
                for mut part in body_parts(c)? {
                    table_attr(&mut part, b.table_mut(t))?;
                }
            }
        }
        "delete" | "destroy" => match b.find_table(fam, name) {
            Some(t) => b.delete_table(t),
            None if verb == "delete" => {
                b.warn(
                    line,
                    format!("delete of table {fam} {name}, which does not exist"),
                );
            }
            None => {}
        },
        "flush" => {
            if let Some(t) = b.find_table(fam, name) {
                let table = b.table_mut(t);
                table.chains.iter_mut().for_each(|ch| ch.rules.clear());
                table.sets.iter_mut().for_each(|s| s.elements.clear());
            }
        }
        "reset" => {}
        _ => return Err(c.fail_back("`add`, `create`, `delete`, `destroy` or `flush`")),
    }
    c.end("end of line")
}

/// `VERB "chain" [ FAMILY ] TABLE ( NAME | "handle" N ) [ "{" … "}" ]`
fn chain_cmd<'a>(
    b: &mut Builder<'a>,
    c: &mut Cursor<'_, 'a>,
    verb: &str,
    line: u32,
) -> PResult<()> {
    let fam = family(c);
    let table = c.text("a table name")?;
    let t = b.table_for_use(fam, table, line);
    if c.peek_word() == Some("handle") && matches!(verb, "delete" | "destroy") {
        c.bump();
        let h = c.number("a chain handle")?;
        if let Some(ci) = b.rs.tables[t]
            .chains
            .iter()
            .position(|ch| ch.handle == Some(h))
        {
            b.delete_chain(t, ci);
        }
        return c.end("end of line");
    }
    let name = c.text("a chain name")?;
    match verb {
        "add" | "create" => {
            let ci = b.chain(t, Cow::Borrowed(name), line);
            if !c.at_end() {
                for mut part in body_parts(c)? {
                    if !chain_attr(&mut part, fam, b.chain_mut(t, ci))? {
                        return Err(
                            part.fail("a chain attribute (`type …`, `policy …`, `comment …`)")
                        );
                    }
                }
            }
        }
        "delete" | "destroy" => match b.find_chain(t, name) {
            Some(ci) => b.delete_chain(t, ci),
            None if verb == "delete" => {
                b.warn(
                    line,
                    format!("delete of chain {name}, which does not exist"),
                );
            }
            None => {}
        },
        "flush" => {
            if let Some(ci) = b.find_chain(t, name) {
                b.chain_mut(t, ci).rules.clear();
            }
        }
        "reset" => {}
        _ => return Err(c.fail_back("`add`, `create`, `delete`, `destroy` or `flush`")),
    }
    c.end("end of line")
}

/// `VERB ( "set" | "map" ) [ FAMILY ] TABLE NAME [ "{" … "}" ]`
fn set_cmd<'a>(
    b: &mut Builder<'a>,
    c: &mut Cursor<'_, 'a>,
    verb: &str,
    is_map: bool,
    line: u32,
) -> PResult<()> {
    let fam = family(c);
    let table = c.text("a table name")?;
    let t = b.table_for_use(fam, table, line);
    let name = c.text("a set name")?;
    match verb {
        "add" | "create" => {
            let si = b.set(t, Cow::Borrowed(name), is_map, line);
            b.set_mut(t, si).is_map |= is_map;
            if !c.at_end() {
                for mut part in body_parts(c)? {
                    set_attr(&mut part, b.set_mut(t, si))?;
                }
            }
        }
        "delete" | "destroy" => match b.find_set(t, name) {
            Some(si) => b.delete_set(t, si),
            None if verb == "delete" => {
                b.warn(line, format!("delete of set {name}, which does not exist"));
            }
            None => {}
        },
        "flush" => {
            if let Some(si) = b.find_set(t, name) {
                b.set_mut(t, si).elements.clear();
            }
        }
        "reset" => {}
        _ => return Err(c.fail_back("`add`, `create`, `delete`, `destroy` or `flush`")),
    }
    c.end("end of line")
}

/// `VERB "rule" [ FAMILY ] TABLE CHAIN [ ( "position" | "handle" | "index" ) N ] [ rule ]`
fn rule_cmd<'a>(b: &mut Builder<'a>, c: &mut Cursor<'_, 'a>, verb: &str, line: u32) -> PResult<()> {
    let fam = family(c);
    let table = c.text("a table name")?;
    let t = b.table_for_use(fam, table, line);
    let chain = c.text("a chain name")?;
    let ci = b.chain_for_use(t, chain, line);
    let mut place = Place::Default;
    if let Some(kw @ ("position" | "handle" | "index")) = c.peek_word()
        && c.peek_at(1)
            .and_then(Token::word)
            .is_some_and(|w| w.bytes().all(|b| b.is_ascii_digit()))
    {
        c.bump();
        let n = c.number("a number")?;
        place = if kw == "index" {
            Place::Index(n)
        } else {
            Place::Handle(n)
        };
    }
    let rules = &mut b.chain_mut(t, ci).rules;
    let at_handle = |h: u64| rules.iter().position(|r| r.handle == Some(h));
    match verb {
        "add" | "insert" | "create" | "replace" => {
            let (stmts, comment) = rule_body(c.rest(), c.src());
            if stmts.is_empty() {
                return Err(c.fail("a rule"));
            }
            let rule = Rule {
                stmts,
                comment,
                handle: None,
                line,
            };
            let found = match place {
                Place::Default => None,
                Place::Handle(h) => at_handle(h),
                Place::Index(i) => usize::try_from(i).ok().filter(|&i| i < rules.len()),
            };
            match (verb, found) {
                ("replace", Some(i)) => rules[i] = rule,
                ("replace", None) => return Err(c.fail("`handle N` of an existing rule")),
                ("insert", Some(i)) => rules.insert(i, rule),
                ("insert", None) => rules.insert(0, rule),
                (_, Some(i)) => rules.insert(i + 1, rule),
                (_, None) => rules.push(rule),
            }
            Ok(())
        }
        "delete" | "destroy" => {
            let Place::Handle(h) = place else {
                return Err(c.fail("`handle N`"));
            };
            if let Some(i) = at_handle(h) {
                rules.remove(i);
            }
            c.end("end of line")
        }
        "reset" => Ok(()),
        _ => Err(c.fail("`add`, `insert`, `replace` or `delete`")),
    }
}

/// `VERB "element" [ FAMILY ] TABLE SET set`
fn element_cmd<'a>(
    b: &mut Builder<'a>,
    c: &mut Cursor<'_, 'a>,
    verb: &str,
    line: u32,
) -> PResult<()> {
    let fam = family(c);
    let table = c.text("a table name")?;
    let t = b.table_for_use(fam, table, line);
    let name = c.text("a set name")?;
    let si = b.set_for_use(t, name, line);
    let elems = elements(c)?;
    c.end("end of line")?;
    let set = b.set_mut(t, si);
    match verb {
        "add" | "create" => {
            // Keys added twice are merged when the ruleset is finished (`Builder::finish`).
            set.elements.extend(elems);
        }
        "delete" | "destroy" => {
            let gone: HashSet<_> = elems.iter().map(|e| &e.key).collect();
            set.elements.retain(|e| !gone.contains(&e.key));
        }
        "reset" => {}
        _ => return Err(c.fail("`add`, `create`, `delete` or `destroy`")),
    }
    Ok(())
}

/// `VERB OBJECT-KIND [ FAMILY ] TABLE NAME [ "{" … "}" ]`, kept as written.
fn object_cmd<'a>(
    b: &mut Builder<'a>,
    c: &mut Cursor<'_, 'a>,
    verb: &str,
    kind: &'a str,
    line: u32,
) -> PResult<()> {
    let kind = if kind == "ct" {
        // `ct helper`, `ct timeout`, `ct expectation`.
        let sub = c.word("`helper`, `timeout` or `expectation`")?;
        Cow::Owned(format!("ct {sub}"))
    } else {
        Cow::Borrowed(kind)
    };
    let fam = family(c);
    let table = c.text("a table name")?;
    let t = b.table_for_use(fam, table, line);
    let name = c.text("an object name")?;
    let rest = c.rest();
    let body = match rest {
        [open, inner @ .., close] if open.kind == Kind::Open && close.kind == Kind::Close => inner,
        _ => rest,
    };
    let body = object_body(body);
    let objects = &mut b.table_mut(t).objects;
    objects.retain(|o| !(o.kind == kind && o.name == name));
    if matches!(verb, "add" | "create") {
        objects.push(Object {
            kind,
            name: Cow::Borrowed(name),
            body: Cow::Owned(body),
            line,
        });
    }
    Ok(())
}
