//! `nft -j list ruleset|table …` JSON (libnftables-json(5), schema version 1), read into the
//! same tree as the text forms.
//!
//! ```text
//! document = { "nftables": [ item, … ] }
//! item     = { "metainfo": {…} } | { "table"|"chain"|"set"|"map"|"rule"|"element": {…} }
//!          | { "counter"|"quota"|"ct helper"|…: {…} }                 ; kept as JSON text
//!          | { "add"|"create"|"insert"|"replace"|"delete"|"destroy"|"flush": { OBJECT: {…} } }
//! ```
//!
//! Strict reading deserialises the items straight into the tree as the array is read — no
//! intermediate JSON value is built — and an error carries the line and column where serde_json
//! stood. Lenient reading first splits the array into the items' raw texts, so that an item that
//! does not fit is skipped (with its own line) and the others kept. A rule's statement that is
//! not modelled, or holds an expression that is not, becomes
//! [`Stmt::Verbatim`](crate::nft::Stmt::Verbatim) holding the statement's JSON text as written
//! (see `exprs.rs`). Strings borrow from the input unless they hold escapes. serde_json's
//! recursion limit (128) bounds nesting.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

mod exprs;

use exprs::{Elements, ExprDe, StmtSlot, end_of_object};

use super::ParseOptions;
use super::ast::{BaseChain, Family, InputForm, Object, Policy, Rule, Ruleset, Set, SetType};
use super::build::Builder;
use super::lexer::locate;
use super::values::standard_priority;
use crate::error::ParseError;
use crate::iptables::SkippedLine;

/// The top-level object, its items as raw JSON (lenient reading: each item on its own).
#[derive(Deserialize)]
struct RawDoc<'a> {
    /// The items, each as raw JSON.
    #[serde(borrow)]
    nftables: Vec<&'a RawValue>,
}

/// Parses a JSON document (`nft -j list …` output, or `nft -j -f` command input).
///
/// Strict reading deserialises the document in one pass, applying each item as it is read.
/// Lenient reading (and only it) first splits the array into the items' texts, so an item that
/// does not fit can be skipped and the others kept.
pub(crate) fn parse_json<'a>(src: &'a str, opts: &ParseOptions) -> Result<Ruleset<'a>, ParseError> {
    let mut b = Builder::default();
    if opts.lenient {
        let doc: RawDoc<'a> = read(src).map_err(|f| json_error(src, &f))?;
        for raw in doc.nftables {
            let text = raw.get();
            if let Err(f) = apply_item(&mut b, text) {
                let (line, _, line_text) = locate(src, offset_of(src, text));
                b.rs.skipped.push(SkippedLine {
                    line,
                    text: line_text,
                    reason: message(&f.err),
                });
            }
        }
    } else {
        let mut de = serde_json::Deserializer::from_str(src);
        let result = DocSeed { b: &mut b }
            .deserialize(&mut de)
            .and_then(|()| de.end());
        if let Err(err) = result {
            return Err(json_error(src, &JsonFail { err, part: src }));
        }
    }
    let mut rs = b.finish();
    rs.form = InputForm::Json;
    Ok(rs)
}

/// Reads the top-level object and applies the items of its `nftables` array as they are read.
struct DocSeed<'b, 'a> {
    b: &'b mut Builder<'a>,
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
                map.next_value_seed(ItemsSeed { b: &mut *self.b })?;
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
        while let Some(item) = seq.next_element::<Item<'de>>()? {
            let (verb, item) = match item {
                Item::Command(verb, inner) => (verb, *inner),
                other => (Cow::Borrowed("add"), other),
            };
            apply_object(self.b, &verb, item).map_err(de::Error::custom)?;
        }
        Ok(())
    }
}

/// A serde_json error and the slice of the input it was reading (its positions are relative to
/// that slice).
struct JsonFail<'a> {
    err: serde_json::Error,
    part: &'a str,
}

/// Deserialises `part`, remembering the slice for the error position.
fn read<'a, T: Deserialize<'a>>(part: &'a str) -> Result<T, JsonFail<'a>> {
    serde_json::from_str(part).map_err(|err| JsonFail { err, part })
}

/// Byte offset of `part` (a slice of `src`) in `src`.
fn offset_of(src: &str, part: &str) -> usize {
    (part.as_ptr() as usize)
        .saturating_sub(src.as_ptr() as usize)
        .min(src.len())
}

/// serde_json's message without its " at line L column C" tail.
fn message(e: &serde_json::Error) -> String {
    let msg = e.to_string();
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg,
    }
}

/// A [`ParseError`] for an error serde_json reported while reading a slice of `src`.
fn json_error(src: &str, f: &JsonFail<'_>) -> ParseError {
    // serde_json counts lines and columns (1-based) within the slice it read.
    let (part, e) = (f.part, &f.err);
    let line_start = match e.line() {
        0 | 1 => 0,
        n => part
            .match_indices('\n')
            .nth(n - 2)
            .map_or(part.len(), |(i, _)| i + 1),
    };
    let col_bytes = part[line_start..]
        .char_indices()
        .nth(e.column().saturating_sub(1))
        .map_or(part.len() - line_start, |(i, _)| i);
    let at = offset_of(src, part) + line_start + col_bytes;
    let (line, col, text) = locate(src, at);
    let found = if e.is_eof() {
        "end of input".to_string()
    } else {
        let word: String = src[at..]
            .chars()
            .take_while(|c| !c.is_whitespace() && !matches!(c, ',' | ':'))
            .take(40)
            .collect();
        if word.is_empty() {
            "end of the value".to_string()
        } else {
            format!("`{word}`")
        }
    };
    ParseError {
        source_name: None,
        line,
        col,
        expected: format!("nft JSON ({})", message(e)),
        found,
        line_text: text.chars().take(200).collect(),
    }
}

/// The key of a one-member object (its value is skipped): a set's `stmt` entries.
struct KeyOnly<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for KeyOnly<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = KeyOnly<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object with one member")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let Some((k, _)) = map.next_entry::<Cow<'de, str>, IgnoredAny>()? else {
                    return Err(de::Error::custom("an empty object"));
                };
                end_of_object(&mut map)?;
                Ok(KeyOnly(k))
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// `metainfo`.
#[derive(Deserialize)]
struct Meta<'a> {
    #[serde(borrow)]
    version: Option<Cow<'a, str>>,
}

/// One item of the `nftables` array, read by its key.
enum Item<'a> {
    /// `metainfo`: the nft version.
    Meta(Option<Cow<'a, str>>),
    /// `table`.
    Table(JTable<'a>),
    /// `chain`.
    Chain(JChain<'a>),
    /// `set` (false) or `map` (true).
    Set(JSet<'a>, bool),
    /// `rule`.
    Rule(JRule<'a>),
    /// `element`.
    Elements(JElements<'a>),
    /// `ruleset` (in `flush`).
    Ruleset,
    /// Another named object: its kind, name and JSON text.
    Object(Cow<'a, str>, JObject<'a>, &'a str),
    /// `{"add": {…}}` and the other commands.
    Command(Cow<'a, str>, Box<Item<'a>>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Item<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Item<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an nftables object with one member")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let key = map
                    .next_key::<Cow<'de, str>>()?
                    .ok_or_else(|| de::Error::custom("an nftables object"))?;
                let item = match &*key {
                    "metainfo" => Item::Meta(map.next_value::<Meta<'a>>()?.version),
                    "table" => Item::Table(map.next_value()?),
                    "chain" => Item::Chain(map.next_value()?),
                    "set" => Item::Set(map.next_value()?, false),
                    "map" => Item::Set(map.next_value()?, true),
                    "rule" => Item::Rule(map.next_value()?),
                    "element" => Item::Elements(map.next_value()?),
                    "ruleset" => {
                        map.next_value::<IgnoredAny>()?;
                        Item::Ruleset
                    }
                    "add" | "create" | "insert" | "replace" | "delete" | "destroy" | "flush"
                    | "reset" => Item::Command(key, Box::new(map.next_value()?)),
                    _ => {
                        let raw: &'de RawValue = map.next_value()?;
                        let j: JObject<'a> =
                            serde_json::from_str(raw.get()).map_err(de::Error::custom)?;
                        Item::Object(key, j, raw.get())
                    }
                };
                end_of_object(&mut map)?;
                Ok(item)
            }
        }
        d.deserialize_map(V(PhantomData))
    }
}

/// Applies one item of the `nftables` array (`text` is its JSON).
fn apply_item<'a>(b: &mut Builder<'a>, text: &'a str) -> Result<(), JsonFail<'a>> {
    let item: Item<'a> = read(text)?;
    let (verb, item) = match item {
        Item::Command(verb, inner) => (verb, *inner),
        other => (Cow::Borrowed("add"), other),
    };
    apply_object(b, &verb, item).map_err(|msg| JsonFail {
        err: de::Error::custom(msg),
        part: text,
    })
}

/// A string or a list of strings (`"flags": "fully-random"` / `["constant", "interval"]`).
#[derive(Default)]
struct StrList<'a>(Vec<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for StrList<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = StrList<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(StrList(vec![Cow::Borrowed(v)]))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(StrList(vec![Cow::Owned(v.to_string())]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(s) = seq.next_element::<Cow<'de, str>>()? {
                    out.push(s);
                }
                Ok(StrList(out))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A family name.
struct Fam(Family);

impl<'de> Deserialize<'de> for Fam {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = Cow::<'de, str>::deserialize(d)?;
        Family::from_keyword(&s)
            .map(Fam)
            .ok_or_else(|| de::Error::custom(format!("unknown family `{s}`")))
    }
}

/// A time in seconds (integer or fraction).
struct Seconds(Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let f = f64::deserialize(d)?;
        if (0.0..1e15).contains(&f) {
            Ok(Seconds(Duration::from_secs_f64(f)))
        } else {
            Err(de::Error::custom("a time in seconds"))
        }
    }
}

/// `table`.
#[derive(Deserialize)]
struct JTable<'a> {
    family: Fam,
    #[serde(borrow)]
    name: Cow<'a, str>,
    handle: Option<u64>,
    #[serde(borrow)]
    comment: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    flags: StrList<'a>,
}

/// A chain priority: a number or a standard name.
enum Prio<'a> {
    Number(i64),
    Name(Cow<'a, str>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Prio<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Prio<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a priority")
            }
            fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
                Ok(Prio::Number(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                i64::try_from(v)
                    .map(Prio::Number)
                    .map_err(|_| E::custom("a priority"))
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Prio::Name(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Prio::Name(Cow::Owned(v.to_string())))
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// `chain`.
#[derive(Deserialize)]
struct JChain<'a> {
    family: Fam,
    #[serde(borrow)]
    table: Cow<'a, str>,
    #[serde(borrow)]
    name: Cow<'a, str>,
    handle: Option<u64>,
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    hook: Option<Cow<'a, str>>,
    #[serde(borrow)]
    prio: Option<Prio<'a>>,
    #[serde(borrow)]
    policy: Option<Cow<'a, str>>,
    #[serde(borrow)]
    dev: Option<Cow<'a, str>>,
    #[serde(borrow)]
    comment: Option<Cow<'a, str>>,
}

/// A set's `type`/`map`: a name, a list of names, or `{"typeof": expr}`.
struct JSetType<'a>(SetType<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for JSetType<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = JSetType<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a type name, a list of them, or {\"typeof\": …}")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(JSetType(SetType::Named(vec![Cow::Borrowed(v)])))
            }
            fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                Ok(JSetType(SetType::Named(vec![Cow::Owned(v.to_string())])))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                let list = StrList::deserialize(de::value::SeqAccessDeserializer::new(seq))?;
                Ok(JSetType(SetType::Named(list.0)))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                match map.next_key::<Cow<'de, str>>()?.as_deref() {
                    Some("typeof") => {
                        let e: ExprDe<'a> = map.next_value()?;
                        Ok(JSetType(SetType::Typeof(e.0)))
                    }
                    _ => Err(de::Error::custom("a set type")),
                }
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// `set` / `map`.
#[derive(Deserialize)]
struct JSet<'a> {
    family: Fam,
    #[serde(borrow)]
    table: Cow<'a, str>,
    #[serde(borrow)]
    name: Cow<'a, str>,
    handle: Option<u64>,
    #[serde(borrow, rename = "type")]
    key: Option<JSetType<'a>>,
    #[serde(borrow)]
    map: Option<JSetType<'a>>,
    #[serde(borrow, default)]
    flags: StrList<'a>,
    timeout: Option<Seconds>,
    #[serde(rename = "gc-interval")]
    gc_interval: Option<Seconds>,
    size: Option<u64>,
    #[serde(borrow)]
    policy: Option<Cow<'a, str>>,
    #[serde(borrow)]
    comment: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    elem: Elements<'a>,
    #[serde(borrow, default)]
    stmt: Vec<KeyOnly<'a>>,
}

/// `rule`.
#[derive(Deserialize)]
struct JRule<'a> {
    family: Fam,
    #[serde(borrow)]
    table: Cow<'a, str>,
    #[serde(borrow)]
    chain: Cow<'a, str>,
    handle: Option<u64>,
    position: Option<u64>,
    #[serde(borrow, default)]
    expr: Vec<StmtSlot<'a>>,
    #[serde(borrow)]
    comment: Option<Cow<'a, str>>,
}

/// `element` (in commands).
#[derive(Deserialize)]
struct JElements<'a> {
    family: Fam,
    #[serde(borrow)]
    table: Cow<'a, str>,
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow, default)]
    elem: Elements<'a>,
}

/// Any other named object (`counter`, `quota`, `ct helper`, …).
#[derive(Deserialize)]
struct JObject<'a> {
    family: Fam,
    #[serde(borrow)]
    table: Cow<'a, str>,
    #[serde(borrow)]
    name: Cow<'a, str>,
}

/// The table an object names (created if the document did not list it first).
fn table_of<'a>(b: &mut Builder<'a>, family: Family, name: Cow<'a, str>) -> usize {
    match b.find_table(family, &name) {
        Some(t) => t,
        None => b.table(family, name, 0),
    }
}

/// Applies `verb` to one object (`add` for listing items); an error says what is wrong.
fn apply_object<'a>(b: &mut Builder<'a>, verb: &str, item: Item<'a>) -> Result<(), &'static str> {
    let deleting = matches!(verb, "delete" | "destroy");
    match item {
        Item::Meta(version) => b.rs.nft_version = version,
        Item::Command(..) => return Err("a command inside a command"),
        Item::Ruleset => {
            if verb == "flush" {
                b.clear();
            }
        }
        Item::Table(j) => match (verb, b.find_table(j.family.0, &j.name)) {
            (_, Some(t)) if deleting => b.delete_table(t),
            ("flush", Some(t)) => {
                let table = b.table_mut(t);
                table.chains.iter_mut().for_each(|c| c.rules.clear());
                table.sets.iter_mut().for_each(|s| s.elements.clear());
            }
            _ if deleting || verb == "flush" => {}
            _ => {
                let t = b.table(j.family.0, j.name, 0);
                let table = b.table_mut(t);
                table.handle = j.handle.or(table.handle);
                table.comment = j.comment.or(table.comment.take());
                if !j.flags.0.is_empty() {
                    table.flags = j.flags.0;
                }
            }
        },
        Item::Chain(j) => {
            let t = table_of(b, j.family.0, j.table);
            match (verb, b.find_chain(t, &j.name)) {
                (_, Some(c)) if deleting => b.delete_chain(t, c),
                ("flush", Some(c)) => b.chain_mut(t, c).rules.clear(),
                _ if deleting || verb == "flush" => {}
                _ => {
                    let base = match (j.kind, j.hook) {
                        (Some(kind), Some(hook)) => {
                            let priority = match &j.prio {
                                Some(Prio::Number(n)) => i32::try_from(*n).ok(),
                                Some(Prio::Name(s)) => standard_priority(j.family.0, s),
                                None => None,
                            }
                            .ok_or("base chain without a numeric `prio`")?;
                            let policy = match j.policy.as_deref() {
                                Some("accept") => Some(Policy::Accept),
                                Some("drop") => Some(Policy::Drop),
                                _ => None,
                            };
                            Some(BaseChain {
                                kind,
                                hook,
                                priority,
                                device: j.dev,
                                policy,
                            })
                        }
                        _ => None,
                    };
                    let c = b.chain(t, j.name, 0);
                    let chain = b.chain_mut(t, c);
                    chain.handle = j.handle.or(chain.handle);
                    chain.comment = j.comment.or(chain.comment.take());
                    if base.is_some() {
                        chain.base = base;
                    }
                }
            }
        }
        Item::Set(j, is_map) => {
            let t = table_of(b, j.family.0, j.table);
            match (verb, b.find_set(t, &j.name)) {
                (_, Some(s)) if deleting => b.delete_set(t, s),
                ("flush", Some(s)) => b.set_mut(t, s).elements.clear(),
                _ if deleting || verb == "flush" => {}
                _ => {
                    let s = b.set(t, j.name, is_map, 0);
                    fill_set(b.set_mut(t, s), is_map, j.handle, j.key, j.map);
                    let set = b.set_mut(t, s);
                    for f in j.flags.0 {
                        match &*f {
                            "constant" => set.flags.constant = true,
                            "interval" => set.flags.interval = true,
                            "timeout" => set.flags.timeout = true,
                            "dynamic" => set.flags.dynamic = true,
                            _ => set.flags.other.push(f),
                        }
                    }
                    set.timeout = j.timeout.map(|s| s.0).or(set.timeout);
                    set.gc_interval = j.gc_interval.map(|s| s.0).or(set.gc_interval);
                    set.size = j.size.or(set.size);
                    set.policy = j.policy.or(set.policy.take());
                    set.comment = j.comment.or(set.comment.take());
                    set.counter |= j.stmt.iter().any(|s| s.0 == "counter");
                    set.elements.extend(j.elem.0);
                }
            }
        }
        Item::Rule(j) => {
            let t = table_of(b, j.family.0, j.table);
            let c = match b.find_chain(t, &j.chain) {
                Some(c) => c,
                None => b.chain(t, j.chain, 0),
            };
            let rules = &mut b.chain_mut(t, c).rules;
            let at_handle = |h: u64| rules.iter().position(|r| r.handle == Some(h));
            if deleting {
                if let Some(i) = j.handle.and_then(at_handle) {
                    rules.remove(i);
                }
                return Ok(());
            }
            if matches!(verb, "flush" | "reset") {
                return Ok(());
            }
            let found = j.position.or(j.handle).and_then(at_handle);
            let rule = Rule {
                stmts: {
                    let mut stmts: Vec<_> = j.expr.into_iter().map(|s| s.0).collect();
                    stmts.shrink_to_fit();
                    stmts
                },
                comment: j.comment,
                handle: j.handle,
                line: 0,
            };
            match (verb, found) {
                ("replace", Some(i)) => rules[i] = rule,
                ("insert", Some(i)) => rules.insert(i, rule),
                ("insert", None) => rules.insert(0, rule),
                ("add" | "create", Some(i)) if j.position.is_some() => rules.insert(i + 1, rule),
                _ => rules.push(rule),
            }
        }
        Item::Elements(j) => {
            let t = table_of(b, j.family.0, j.table);
            let s = match b.find_set(t, &j.name) {
                Some(s) => s,
                None => b.set(t, j.name, false, 0),
            };
            let set = b.set_mut(t, s);
            if deleting {
                set.elements
                    .retain(|e| !j.elem.0.iter().any(|gone| gone.key == e.key));
            } else if !matches!(verb, "flush" | "reset") {
                set.elements.extend(j.elem.0);
            }
        }
        Item::Object(kind, j, raw) => {
            let t = table_of(b, j.family.0, j.table);
            let objects = &mut b.table_mut(t).objects;
            objects.retain(|x| !(x.kind == kind && x.name == j.name));
            if !deleting {
                objects.push(Object {
                    kind,
                    name: j.name,
                    body: Cow::Borrowed(raw),
                    line: 0,
                });
            }
        }
    }
    Ok(())
}

/// Fills a set's declaration.
fn fill_set<'a>(
    set: &mut Set<'a>,
    is_map: bool,
    handle: Option<u64>,
    key: Option<JSetType<'a>>,
    data: Option<JSetType<'a>>,
) {
    set.is_map |= is_map;
    set.handle = handle.or(set.handle);
    if let Some(k) = key {
        set.key = k.0;
    }
    if let Some(d) = data {
        set.data = Some(d.0);
    }
}
