//! `nft -j list ruleset|table …` JSON (libnftables-json(5), schema version 1), mapped into the
//! same tree as the text forms.
//!
//! ```text
//! document = { "nftables": [ item, … ] }
//! item     = { "metainfo": {…} } | { "table"|"chain"|"set"|"map"|"rule"|"element": {…} }
//!          | { "counter"|"quota"|"ct helper"|…: {…} }                 ; kept as JSON text
//!          | { "add"|"create"|"insert"|"replace"|"delete"|"destroy"|"flush": { OBJECT: {…} } }
//! ```
//!
//! Items are converted one at a time while the array is read, so memory holds one item's JSON
//! tree beside the ruleset. Strings borrow from the input unless they hold escapes. A statement
//! whose JSON is not modelled becomes [`Stmt::Verbatim`] holding its compact JSON; an expression
//! inside it that is not modelled makes the whole statement verbatim. JSON syntax errors and
//! objects without a required field are errors with the line and column serde_json reports.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::ParseOptions;
use super::ast::{
    BaseChain, BinOp, Counter, Element, Expr, Family, InputForm, Log, Nat, NatKind, Object, Policy,
    RejectWith, RelOp, Rule, Ruleset, SetType, Stmt, Verdict,
};
use super::build::Builder;
use super::values::{classify, standard_priority};
use crate::error::ParseError;
use crate::iptables::SkippedLine;

/// A JSON value whose strings borrow from the input when they hold no escapes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum JValue<'a> {
    /// `null`.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// A non-negative integer.
    UInt(u64),
    /// A negative integer.
    Int(i64),
    /// A number with a fraction or exponent.
    Float(f64),
    /// A string.
    Str(Cow<'a, str>),
    /// An array.
    Array(Vec<JValue<'a>>),
    /// An object, members in input order.
    Object(Vec<(Cow<'a, str>, JValue<'a>)>),
}

impl<'de> de::Deserialize<'de> for JValue<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JValueVisitor)
    }
}

/// Builds [`JValue`]s.
struct JValueVisitor;

impl<'de> Visitor<'de> for JValueVisitor {
    type Value = JValue<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(JValue::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(JValue::Null)
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(JValue::Bool(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(JValue::UInt(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(v).map_or(JValue::Int(v), JValue::UInt))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(JValue::Float(v))
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(JValue::Str(Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(JValue::Str(Cow::Owned(v.to_string())))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(JValue::Str(Cow::Owned(v)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(v) = seq.next_element()? {
            out.push(v);
        }
        Ok(JValue::Array(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0).min(16));
        while let Some(k) = map.next_key::<Cow<'de, str>>()? {
            out.push((k, map.next_value()?));
        }
        Ok(JValue::Object(out))
    }
}

impl<'a> JValue<'a> {
    /// The member `key` of an object.
    fn get(&self, key: &str) -> Option<&JValue<'a>> {
        match self {
            JValue::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The only member of a one-member object.
    fn single(&self) -> Option<(&str, &JValue<'a>)> {
        match self {
            JValue::Object(members) if members.len() == 1 => {
                members.first().map(|(k, v)| (&**k, v))
            }
            _ => None,
        }
    }

    /// The string, if this is one.
    fn str(&self) -> Option<&Cow<'a, str>> {
        match self {
            JValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The non-negative integer, if this is one.
    fn uint(&self) -> Option<u64> {
        match self {
            JValue::UInt(n) => Some(*n),
            _ => None,
        }
    }

    /// Compact JSON text of the value.
    fn to_json(&self) -> String {
        let mut out = String::new();
        self.write_json(&mut out);
        out
    }

    /// Appends compact JSON text of the value.
    fn write_json(&self, out: &mut String) {
        match self {
            JValue::Null => out.push_str("null"),
            JValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            JValue::UInt(n) => out.push_str(&n.to_string()),
            JValue::Int(n) => out.push_str(&n.to_string()),
            JValue::Float(n) => out.push_str(&n.to_string()),
            JValue::Str(s) => write_json_str(s, out),
            JValue::Array(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    v.write_json(out);
                }
                out.push(']');
            }
            JValue::Object(members) => {
                out.push('{');
                for (i, (k, v)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    write_json_str(k, out);
                    out.push_str(": ");
                    v.write_json(out);
                }
                out.push('}');
            }
        }
    }
}

/// Appends `s` as a JSON string literal.
fn write_json_str(s: &str, out: &mut String) {
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Parses a JSON document (`nft -j list …` output, or `nft -j -f` command input).
pub(crate) fn parse_json<'a>(src: &'a str, opts: &ParseOptions) -> Result<Ruleset<'a>, ParseError> {
    let mut b = Builder::default();
    let mut de = serde_json::Deserializer::from_str(src);
    let seed = DocSeed {
        b: &mut b,
        lenient: opts.lenient,
    };
    let result = seed.deserialize(&mut de).and_then(|()| de.end());
    if let Err(e) = result {
        return Err(json_error(src, &e));
    }
    let mut rs = b.finish();
    rs.form = InputForm::Json;
    Ok(rs)
}

/// A [`ParseError`] from a serde_json error.
fn json_error(src: &str, e: &serde_json::Error) -> ParseError {
    let line = u32::try_from(e.line()).unwrap_or(u32::MAX);
    let col = u32::try_from(e.column()).unwrap_or(u32::MAX);
    let line_text = src
        .lines()
        .nth(e.line().saturating_sub(1))
        .unwrap_or_default();
    let msg = e.to_string();
    // serde_json appends " at line L column C"; the position is reported separately.
    let msg = msg
        .rfind(" at line ")
        .map_or(msg.as_str(), |i| &msg[..i])
        .to_string();
    let short: String = line_text.chars().take(200).collect();
    ParseError {
        source_name: None,
        line,
        col,
        expected: format!("nft JSON ({msg})"),
        found: if e.is_eof() {
            "end of input".to_string()
        } else {
            "something else".to_string()
        },
        line_text: short,
    }
}

/// Reads the top-level object and its `nftables` array.
struct DocSeed<'b, 'a> {
    b: &'b mut Builder<'a>,
    lenient: bool,
}

impl<'de> DeserializeSeed<'de> for DocSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for DocSeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object with an `nftables` array")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = false;
        while let Some(k) = map.next_key::<Cow<'de, str>>()? {
            if k == "nftables" {
                map.next_value_seed(ItemsSeed {
                    b: &mut *self.b,
                    lenient: self.lenient,
                })?;
                seen = true;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        if seen {
            Ok(())
        } else {
            Err(de::Error::missing_field("nftables"))
        }
    }
}

/// Reads the `nftables` array, applying each item as it is read.
struct ItemsSeed<'b, 'a> {
    b: &'b mut Builder<'a>,
    lenient: bool,
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_, 'de> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_, 'de> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of nftables objects")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while let Some(item) = seq.next_element::<JValue<'de>>()? {
            if let Err(msg) = apply_item(self.b, &item) {
                if !self.lenient {
                    return Err(de::Error::custom(msg));
                }
                let text = item.to_json();
                self.b.rs.skipped.push(SkippedLine {
                    line: 0,
                    text: "",
                    reason: format!("{msg}: {}", text.chars().take(200).collect::<String>()),
                });
            }
        }
        Ok(())
    }
}

/// Result of converting one JSON item; the error says what was wrong.
type JResult<T> = Result<T, String>;

/// A required string member.
fn req_str<'a>(obj: &JValue<'a>, key: &str, what: &str) -> JResult<Cow<'a, str>> {
    obj.get(key)
        .and_then(JValue::str)
        .cloned()
        .ok_or_else(|| format!("{what} without a string `{key}`"))
}

/// The `family` member.
fn family_of(obj: &JValue<'_>, what: &str) -> JResult<Family> {
    let f = req_str(obj, "family", what)?;
    Family::from_keyword(&f).ok_or_else(|| format!("{what} with unknown family `{f}`"))
}

/// An optional string member.
fn opt_str<'a>(obj: &JValue<'a>, key: &str) -> Option<Cow<'a, str>> {
    obj.get(key).and_then(JValue::str).cloned()
}

/// A string or a list of strings (flags).
fn str_list<'a>(v: Option<&JValue<'a>>) -> Vec<Cow<'a, str>> {
    match v {
        Some(JValue::Str(s)) => vec![s.clone()],
        Some(JValue::Array(items)) => items.iter().filter_map(JValue::str).cloned().collect(),
        _ => Vec::new(),
    }
}

/// Applies one item of the `nftables` array.
fn apply_item<'a>(b: &mut Builder<'a>, item: &JValue<'a>) -> JResult<()> {
    let Some((kind, body)) = item.single() else {
        return Err("an nftables item that is not a one-member object".to_string());
    };
    match kind {
        "metainfo" => {
            b.rs.nft_version = opt_str(body, "version");
            Ok(())
        }
        "add" | "create" | "insert" | "replace" | "delete" | "destroy" | "flush" | "reset" => {
            let Some((object, spec)) = body.single() else {
                return Err(format!("`{kind}` without one object"));
            };
            apply_object(b, kind, object, spec)
        }
        _ => apply_object(b, "add", kind, body),
    }
}

/// Applies `verb` to one object (`add` for listing items).
fn apply_object<'a>(b: &mut Builder<'a>, verb: &str, kind: &str, o: &JValue<'a>) -> JResult<()> {
    if kind == "ruleset" {
        if verb == "flush" {
            b.clear();
        }
        return Ok(());
    }
    let family = family_of(o, kind)?;
    match kind {
        "table" => {
            let name = req_str(o, "name", "table")?;
            match verb {
                "delete" | "destroy" => {
                    if let Some(t) = b.find_table(family, &name) {
                        b.delete_table(t);
                    }
                }
                "flush" => {
                    if let Some(t) = b.find_table(family, &name) {
                        let table = b.table_mut(t);
                        table.chains.iter_mut().for_each(|c| c.rules.clear());
                        table.sets.iter_mut().for_each(|s| s.elements.clear());
                    }
                }
                _ => {
                    let t = b.table(family, name, 0);
                    let table = b.table_mut(t);
                    table.handle = o.get("handle").and_then(JValue::uint).or(table.handle);
                    table.comment = opt_str(o, "comment").or(table.comment.take());
                    let flags = str_list(o.get("flags"));
                    if !flags.is_empty() {
                        table.flags = flags;
                    }
                }
            }
            Ok(())
        }
        "chain" => {
            let t = table_of(b, family, o, "chain")?;
            let name = req_str(o, "name", "chain")?;
            match verb {
                "delete" | "destroy" => {
                    if let Some(c) = b.find_chain(t, &name) {
                        b.delete_chain(t, c);
                    }
                }
                "flush" => {
                    if let Some(c) = b.find_chain(t, &name) {
                        b.chain_mut(t, c).rules.clear();
                    }
                }
                _ => {
                    let c = b.chain(t, name, 0);
                    let chain = b.chain_mut(t, c);
                    chain.handle = o.get("handle").and_then(JValue::uint).or(chain.handle);
                    chain.comment = opt_str(o, "comment").or(chain.comment.take());
                    if let Some(base) = base_chain(family, o)? {
                        chain.base = Some(base);
                    }
                }
            }
            Ok(())
        }
        "set" | "map" => {
            let t = table_of(b, family, o, kind)?;
            let name = req_str(o, "name", kind)?;
            match verb {
                "delete" | "destroy" => {
                    if let Some(s) = b.find_set(t, &name) {
                        b.delete_set(t, s);
                    }
                }
                "flush" => {
                    if let Some(s) = b.find_set(t, &name) {
                        b.set_mut(t, s).elements.clear();
                    }
                }
                _ => {
                    let s = b.set(t, name, kind == "map", 0);
                    fill_set(b.set_mut(t, s), kind == "map", o)?;
                }
            }
            Ok(())
        }
        "rule" => {
            let t = table_of(b, family, o, "rule")?;
            let chain = req_str(o, "chain", "rule")?;
            let c = match b.find_chain(t, &chain) {
                Some(c) => c,
                None => b.chain(t, chain, 0),
            };
            let handle = o.get("handle").and_then(JValue::uint);
            let rules = &mut b.chain_mut(t, c).rules;
            let at_handle = |h: u64| rules.iter().position(|r| r.handle == Some(h));
            match verb {
                "delete" | "destroy" => {
                    if let Some(i) = handle.and_then(at_handle) {
                        rules.remove(i);
                    }
                    return Ok(());
                }
                "flush" | "reset" => return Ok(()),
                _ => {}
            }
            let Some(JValue::Array(exprs)) = o.get("expr") else {
                return Err("rule without an `expr` array".to_string());
            };
            let rule = Rule {
                stmts: exprs.iter().map(stmt).collect(),
                comment: opt_str(o, "comment"),
                handle,
                line: 0,
            };
            let position = o.get("position").and_then(JValue::uint);
            match (verb, position.or(handle).and_then(at_handle)) {
                ("replace", Some(i)) => rules[i] = rule,
                ("insert", Some(i)) => rules.insert(i, rule),
                ("insert", None) => rules.insert(0, rule),
                ("add" | "create", Some(i)) if position.is_some() => rules.insert(i + 1, rule),
                _ => rules.push(rule),
            }
            Ok(())
        }
        "element" => {
            let t = table_of(b, family, o, "element")?;
            let name = req_str(o, "name", "element")?;
            let s = match b.find_set(t, &name) {
                Some(s) => s,
                None => b.set(t, name, false, 0),
            };
            let elems = elements(o.get("elem"))?;
            let set = b.set_mut(t, s);
            match verb {
                "delete" | "destroy" => {
                    set.elements
                        .retain(|e| !elems.iter().any(|gone| gone.key == e.key));
                }
                "flush" | "reset" => {}
                _ => {
                    set.elements.extend(elems);
                }
            }
            Ok(())
        }
        _ => {
            let t = table_of(b, family, o, kind)?;
            let name = req_str(o, "name", kind)?;
            let objects = &mut b.table_mut(t).objects;
            objects.retain(|x| !(x.kind == kind && x.name == name));
            if !matches!(verb, "delete" | "destroy") {
                objects.push(Object {
                    kind: Cow::Owned(kind.to_string()),
                    name,
                    body: Cow::Owned(o.to_json()),
                    line: 0,
                });
            }
            Ok(())
        }
    }
}

/// The table an object names (created if the document did not list it first).
fn table_of<'a>(b: &mut Builder<'a>, family: Family, o: &JValue<'a>, what: &str) -> JResult<usize> {
    let name = req_str(o, "table", what)?;
    Ok(match b.find_table(family, &name) {
        Some(t) => t,
        None => b.table(family, name, 0),
    })
}

/// The hook attachment of a chain object, if it has one.
fn base_chain<'a>(family: Family, o: &JValue<'a>) -> JResult<Option<BaseChain<'a>>> {
    let (Some(kind), Some(hook)) = (opt_str(o, "type"), opt_str(o, "hook")) else {
        return Ok(None);
    };
    let priority = match o.get("prio") {
        Some(JValue::UInt(n)) => i32::try_from(*n).ok(),
        Some(JValue::Int(n)) => i32::try_from(*n).ok(),
        Some(JValue::Str(s)) => standard_priority(family, s),
        _ => None,
    }
    .ok_or_else(|| "base chain without a numeric `prio`".to_string())?;
    let policy = match opt_str(o, "policy").as_deref() {
        Some("accept") => Some(Policy::Accept),
        Some("drop") => Some(Policy::Drop),
        _ => None,
    };
    Ok(Some(BaseChain {
        kind,
        hook,
        priority,
        device: opt_str(o, "dev"),
        policy,
    }))
}

/// A set's `type`/`map` member: a name, a list of names, or `{"typeof": expr}`.
fn set_type<'a>(v: &JValue<'a>) -> JResult<SetType<'a>> {
    match v {
        JValue::Str(s) => Ok(SetType::Named(vec![s.clone()])),
        JValue::Array(items) => Ok(SetType::Named(
            items.iter().filter_map(JValue::str).cloned().collect(),
        )),
        _ => match v.get("typeof").and_then(|e| expr(e, 0)) {
            Some(e) => Ok(SetType::Typeof(e)),
            None => Err("a set type that is not a name, list or `typeof`".to_string()),
        },
    }
}

/// Seconds of a JSON time member.
fn seconds(v: Option<&JValue<'_>>) -> Option<Duration> {
    match v? {
        JValue::UInt(n) => Some(Duration::from_secs(*n)),
        JValue::Float(f) if *f >= 0.0 && f.is_finite() => Some(Duration::from_secs_f64(*f)),
        _ => None,
    }
}

/// Fills a set from its JSON object.
fn fill_set<'a>(set: &mut super::ast::Set<'a>, is_map: bool, o: &JValue<'a>) -> JResult<()> {
    set.is_map |= is_map;
    set.handle = o.get("handle").and_then(JValue::uint).or(set.handle);
    if let Some(t) = o.get("type") {
        set.key = set_type(t)?;
    }
    if let Some(d) = o.get("map") {
        set.data = Some(set_type(d)?);
    }
    for f in str_list(o.get("flags")) {
        match &*f {
            "constant" => set.flags.constant = true,
            "interval" => set.flags.interval = true,
            "timeout" => set.flags.timeout = true,
            "dynamic" => set.flags.dynamic = true,
            _ => set.flags.other.push(f),
        }
    }
    set.timeout = seconds(o.get("timeout")).or(set.timeout);
    set.gc_interval = seconds(o.get("gc-interval")).or(set.gc_interval);
    set.size = o.get("size").and_then(JValue::uint).or(set.size);
    set.policy = opt_str(o, "policy").or(set.policy.take());
    set.comment = opt_str(o, "comment").or(set.comment.take());
    if let Some(JValue::Array(stmts)) = o.get("stmt") {
        set.counter |= stmts.iter().any(|s| s.get("counter").is_some());
    }
    set.elements.extend(elements(o.get("elem"))?);
    Ok(())
}

/// The elements of an `elem` member.
fn elements<'a>(v: Option<&JValue<'a>>) -> JResult<Vec<Element<'a>>> {
    match v {
        None => Ok(Vec::new()),
        Some(JValue::Array(items)) => items
            .iter()
            .map(|e| {
                element(e, 0).ok_or_else(|| format!("an element not understood: {}", e.to_json()))
            })
            .collect(),
        Some(other) => element(other, 0)
            .map(|e| vec![e])
            .ok_or_else(|| format!("an element not understood: {}", other.to_json())),
    }
}

/// One element: a value, `{"elem": {"val": …, "comment": …, …}}`, or a map's `[key, data]`.
fn element<'a>(v: &JValue<'a>, depth: u32) -> Option<Element<'a>> {
    if let JValue::Array(pair) = v
        && let [key, data] = pair.as_slice()
    {
        let mut e = element(key, depth + 1)?;
        e.value = Some(expr(data, depth + 1)?);
        return Some(e);
    }
    if let Some(inner) = v.get("elem") {
        let mut e = Element::key(expr(inner.get("val")?, depth + 1)?);
        e.comment = opt_str(inner, "comment");
        e.timeout = seconds(inner.get("timeout"));
        e.expires = seconds(inner.get("expires"));
        if let Some(c) = inner.get("counter") {
            e.counter = Some(counter(c)?.unwrap_or_default());
        }
        return Some(e);
    }
    Some(Element::key(expr(v, depth + 1)?))
}

/// A string constant: `@set`, or a word as the text forms read it.
fn constant<'a>(s: &Cow<'a, str>) -> Expr<'a> {
    if let Some(name) = s.strip_prefix('@') {
        return Expr::SetRef(match s {
            Cow::Borrowed(b) => Cow::Borrowed(&b[1..]),
            Cow::Owned(_) => Cow::Owned(name.to_string()),
        });
    }
    match s {
        Cow::Borrowed(b) => classify(b),
        Cow::Owned(o) => {
            let owned = match classify(o) {
                Expr::Number(n) => Some(Expr::Number(n)),
                Expr::Addr(a) => Some(Expr::Addr(a)),
                Expr::Prefix(a, l) => Some(Expr::Prefix(a, l)),
                Expr::Range(lo, hi) => match (*lo, *hi) {
                    (Expr::Number(a), Expr::Number(b)) => Some(Expr::Range(
                        Box::new(Expr::Number(a)),
                        Box::new(Expr::Number(b)),
                    )),
                    (Expr::Addr(a), Expr::Addr(b)) => Some(Expr::Range(
                        Box::new(Expr::Addr(a)),
                        Box::new(Expr::Addr(b)),
                    )),
                    _ => None,
                },
                _ => None,
            };
            owned.unwrap_or_else(|| Expr::Symbol(Cow::Owned(o.clone())))
        }
    }
}

/// A verdict object (`{"goto": {"target": …}}`, `{"drop": null}`).
fn verdict<'a>(kind: &str, body: &JValue<'a>) -> Option<Verdict<'a>> {
    Some(match kind {
        "accept" => Verdict::Accept,
        "drop" => Verdict::Drop,
        "return" => Verdict::Return,
        "continue" => Verdict::Continue,
        "jump" => Verdict::Jump(opt_str(body, "target")?),
        "goto" => Verdict::Goto(opt_str(body, "target")?),
        _ => return None,
    })
}

/// `{"counter": null}` / `{"packets": P, "bytes": B}`.
fn counter(v: &JValue<'_>) -> Option<Option<Counter>> {
    match v {
        JValue::Null => Some(None),
        JValue::Object(_) => Some(Some(Counter {
            packets: v.get("packets").and_then(JValue::uint).unwrap_or(0),
            bytes: v.get("bytes").and_then(JValue::uint).unwrap_or(0),
        })),
        _ => None,
    }
}

/// An expression; `None` when it is not modelled (or nested deeper than the text forms allow).
fn expr<'a>(v: &JValue<'a>, depth: u32) -> Option<Expr<'a>> {
    if depth > super::expr::MAX_DEPTH {
        return None;
    }
    let d = depth + 1;
    match v {
        JValue::Str(s) => return Some(constant(s)),
        JValue::UInt(n) => return Some(Expr::Number(*n)),
        JValue::Int(n) => return Some(Expr::Symbol(Cow::Owned(n.to_string()))),
        JValue::Bool(b) => {
            return Some(Expr::Symbol(Cow::Borrowed(if *b {
                "exists"
            } else {
                "missing"
            })));
        }
        JValue::Array(items) => {
            return items
                .iter()
                .map(|i| expr(i, d))
                .collect::<Option<_>>()
                .map(Expr::List);
        }
        JValue::Null | JValue::Float(_) => return None,
        JValue::Object(_) => {}
    }
    let (kind, body) = v.single()?;
    let operands = |body: &JValue<'a>| -> Option<(Expr<'a>, Expr<'a>)> {
        match body {
            JValue::Array(items) => match items.as_slice() {
                [a, b] => Some((expr(a, d)?, expr(b, d)?)),
                _ => None,
            },
            _ => None,
        }
    };
    Some(match kind {
        "payload" => Expr::Payload {
            protocol: opt_str(body, "protocol")?,
            field: opt_str(body, "field")?,
        },
        "meta" => Expr::Meta(opt_str(body, "key")?),
        "ct" => Expr::Ct {
            dir: opt_str(body, "dir"),
            key: opt_str(body, "key")?,
        },
        "fib" => Expr::Fib {
            flags: str_list(body.get("flags")),
            result: opt_str(body, "result")?,
        },
        "numgen" => Expr::Numgen {
            mode: opt_str(body, "mode")?,
            modulus: u32::try_from(body.get("mod")?.uint()?).ok()?,
            offset: match body.get("offset") {
                Some(o) => u32::try_from(o.uint()?).ok()?,
                None => 0,
            },
        },
        "concat" => match body {
            JValue::Array(items) => {
                Expr::Concat(items.iter().map(|i| expr(i, d)).collect::<Option<_>>()?)
            }
            _ => return None,
        },
        "set" => match body {
            JValue::Array(items) => {
                Expr::Set(items.iter().map(|i| element(i, d)).collect::<Option<_>>()?)
            }
            other => Expr::Set(vec![element(other, d)?]),
        },
        "prefix" => {
            let addr = opt_str(body, "addr")?.parse().ok()?;
            let len = u8::try_from(body.get("len")?.uint()?).ok()?;
            Expr::Prefix(addr, len)
        }
        "range" => {
            let (lo, hi) = operands(body)?;
            Expr::Range(Box::new(lo), Box::new(hi))
        }
        "map" => Expr::Map {
            key: Box::new(expr(body.get("key")?, d)?),
            map: Box::new(expr(body.get("data")?, d)?),
        },
        "&" | "|" | "^" | "<<" | ">>" => {
            let op = match kind {
                "&" => BinOp::And,
                "|" => BinOp::Or,
                "^" => BinOp::Xor,
                "<<" => BinOp::Lshift,
                _ => BinOp::Rshift,
            };
            let (left, right) = operands(body)?;
            Expr::Binary {
                op,
                left: Box::new(left),
                right: Box::new(right),
            }
        }
        _ => Expr::Verdict(verdict(kind, body)?),
    })
}

/// One statement; what is not modelled is kept as its JSON text.
fn stmt<'a>(v: &JValue<'a>) -> Stmt<'a> {
    known_stmt(v).unwrap_or_else(|| Stmt::Verbatim(Cow::Owned(v.to_json())))
}

/// A modelled statement, if `v` is one.
fn known_stmt<'a>(v: &JValue<'a>) -> Option<Stmt<'a>> {
    let (kind, body) = v.single()?;
    Some(match kind {
        "match" => {
            let op = match opt_str(body, "op").as_deref() {
                None | Some("==" | "in") => RelOp::Eq,
                Some("!=") => RelOp::Ne,
                Some("<") => RelOp::Lt,
                Some(">") => RelOp::Gt,
                Some("<=") => RelOp::Le,
                Some(">=") => RelOp::Ge,
                Some(_) => return None,
            };
            Stmt::Match {
                left: expr(body.get("left")?, 0)?,
                op,
                right: expr(body.get("right")?, 0)?,
            }
        }
        "vmap" => Stmt::Vmap {
            key: expr(body.get("key")?, 0)?,
            map: expr(body.get("data")?, 0)?,
        },
        "mangle" => Stmt::Mangle {
            key: expr(body.get("key")?, 0)?,
            value: expr(body.get("value")?, 0)?,
        },
        "counter" => Stmt::Counter(counter(body)?),
        "reject" => match body {
            JValue::Null => Stmt::Reject(None),
            _ => {
                let kind = opt_str(body, "type")?;
                let code = opt_str(body, "expr");
                Stmt::Reject(Some(RejectWith { kind, code }))
            }
        },
        "masquerade" | "snat" | "dnat" | "redirect" => {
            let kind = match kind {
                "masquerade" => NatKind::Masquerade,
                "snat" => NatKind::Snat,
                "dnat" => NatKind::Dnat,
                _ => NatKind::Redirect,
            };
            let mut n = Nat {
                kind,
                family: None,
                addr: None,
                port: None,
                flags: Vec::new(),
            };
            if !matches!(body, JValue::Null) {
                n.family = match opt_str(body, "family") {
                    Some(f) => Some(Family::from_keyword(&f)?),
                    None => None,
                };
                n.addr = match body.get("addr") {
                    Some(a) => Some(expr(a, 0)?),
                    None => None,
                };
                n.port = match body.get("port") {
                    Some(p) => Some(expr(p, 0)?),
                    None => None,
                };
                n.flags = str_list(body.get("flags"));
            }
            Stmt::Nat(n)
        }
        "log" => {
            if body.get("flags").is_some() {
                return None;
            }
            let num = |k: &str| match body.get(k) {
                Some(v) => v.uint().and_then(|n| u32::try_from(n).ok()).map(Some),
                None => Some(None),
            };
            Stmt::Log(Log {
                prefix: opt_str(body, "prefix"),
                level: opt_str(body, "level"),
                group: num("group")?,
                snaplen: num("snaplen")?,
                queue_threshold: num("queue-threshold")?,
            })
        }
        "set" => {
            let set = opt_str(body, "set")?;
            let set = match set {
                Cow::Borrowed(s) => Cow::Borrowed(s.strip_prefix('@').unwrap_or(s)),
                Cow::Owned(s) => Cow::Owned(s.strip_prefix('@').unwrap_or(&s).to_string()),
            };
            Stmt::SetUpdate {
                op: opt_str(body, "op")?,
                set,
                elem: expr(body.get("elem")?, 0)?,
            }
        }
        "xt" => Stmt::Xt {
            kind: opt_str(body, "type")?,
            name: opt_str(body, "name")?,
        },
        _ => Stmt::Verdict(verdict(kind, body)?),
    })
}
