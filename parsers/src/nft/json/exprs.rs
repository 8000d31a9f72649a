//! Statements, expressions and set elements of nft JSON, deserialised straight into the tree.
//!
//! ```text
//! stmt    = { "match": { "op": OP, "left": expr, "right": expr } } | { "vmap": { "key", "data" } }
//!         | { "mangle": { "key", "value" } } | { "counter": null | { "packets", "bytes" } | NAME }
//!         | { "reject": null | { "type", "expr" } } | { "dnat"|"snat"|"masquerade"|"redirect": … }
//!         | { "log": … } | { "set": { "op", "elem", "set" } } | { "xt": { "type", "name" } }
//!         | { "accept"|"drop"|"return"|"continue": null } | { "jump"|"goto": { "target" } }
//! expr    = STRING | NUMBER | BOOL | [ expr, … ] | { "payload"|"meta"|"ct"|"fib"|"numgen"|"concat"
//!         | "set"|"prefix"|"range"|"map"|"&"|"|"|"^"|"<<"|">>"|VERDICT: … }
//! element = expr | { "elem": { "val": expr, "timeout", "expires", "comment", "counter" } }
//!         | [ element, expr ]                                   ; a map's key and data
//! ```
//!
//! A statement is taken as raw text first, so one that does not fit (an unknown statement, or an
//! unknown expression inside) is kept as that text.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::{Fam, Seconds, StrList};
use crate::nft::ast::{
    BinOp, Counter, Element, Expr, Log, Nat, NatKind, RejectWith, RelOp, Stmt, Verdict,
};
use crate::nft::values::classify;

/// The `elem` member: a list of elements, or one.
#[derive(Default)]
pub(super) struct Elements<'a>(pub(super) Vec<Element<'a>>);

impl<'de: 'a, 'a> Deserialize<'de> for Elements<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ElementsVisitor(PhantomData))
    }
}

/// Reads a list of elements (or one element that is not a list).
struct ElementsVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ElementsVisitor<'a> {
    type Value = Elements<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("set elements")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1024));
        while let Some(e) = seq.next_element::<ElementDe<'a>>()? {
            out.push(e.0);
        }
        out.shrink_to_fit();
        Ok(Elements(out))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        ElementVisitor(PhantomData)
            .visit_map(map)
            .map(|e| Elements(vec![e.0]))
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Elements(vec![Element::key(constant(Cow::Borrowed(v)))]))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Elements(vec![Element::key(constant(Cow::Owned(
            v.to_string(),
        )))]))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Elements(vec![Element::key(Expr::Number(v))]))
    }
}

/// One element: a value, `{"elem": {"val": …, "comment": …, …}}`, or a map's `[key, data]`.
struct ElementDe<'a>(Element<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for ElementDe<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ElementVisitor(PhantomData))
    }
}

/// `{"elem": …}`'s body.
#[derive(Deserialize)]
struct ElemBody<'a> {
    #[serde(borrow)]
    val: ExprDe<'a>,
    timeout: Option<Seconds>,
    expires: Option<Seconds>,
    #[serde(borrow)]
    comment: Option<Cow<'a, str>>,
    counter: Option<CounterDe>,
}

/// Reads one element.
struct ElementVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ElementVisitor<'a> {
    type Value = ElementDe<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a set element")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let key: ElementDe<'a> = seq
            .next_element()?
            .ok_or_else(|| de::Error::custom("a [key, data] pair"))?;
        let data: ExprDe<'a> = seq
            .next_element()?
            .ok_or_else(|| de::Error::custom("a [key, data] pair"))?;
        if seq.next_element::<IgnoredAny>()?.is_some() {
            return Err(de::Error::custom("a [key, data] pair"));
        }
        let mut e = key.0;
        e.value = Some(data.0);
        Ok(ElementDe(e))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let key = map
            .next_key::<Cow<'de, str>>()?
            .ok_or_else(|| de::Error::custom("an element"))?;
        let e = if key == "elem" {
            let body: ElemBody<'a> = map.next_value()?;
            Element {
                key: body.val.0,
                value: None,
                comment: body.comment,
                timeout: body.timeout.map(|s| s.0),
                expires: body.expires.map(|s| s.0),
                counter: body.counter.map(|c| c.0.unwrap_or_default()),
            }
        } else {
            Element::key(expr_member(&key, &mut map)?)
        };
        end_of_object(&mut map)?;
        Ok(ElementDe(e))
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        ExprVisitor(PhantomData)
            .visit_borrowed_str(v)
            .map(|e| ElementDe(Element::key(e.0)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        ExprVisitor(PhantomData)
            .visit_str(v)
            .map(|e| ElementDe(Element::key(e.0)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(ElementDe(Element::key(Expr::Number(v))))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        ExprVisitor(PhantomData)
            .visit_i64(v)
            .map(|e| ElementDe(Element::key(e.0)))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        ExprVisitor(PhantomData)
            .visit_bool(v)
            .map(|e| ElementDe(Element::key(e.0)))
    }
}

/// Requires that an object has no member left.
pub(super) fn end_of_object<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
    if map.next_key::<IgnoredAny>()?.is_some() {
        return Err(de::Error::custom("an object with one member"));
    }
    Ok(())
}

/// A string constant: `@set`, or a word as the text forms read it.
fn constant(s: Cow<'_, str>) -> Expr<'_> {
    match s {
        Cow::Borrowed(b) => match b.strip_prefix('@') {
            Some(name) => Expr::SetRef(Cow::Borrowed(name)),
            None => classify(b),
        },
        Cow::Owned(o) => {
            if let Some(name) = o.strip_prefix('@') {
                return Expr::SetRef(Cow::Owned(name.to_string()));
            }
            let owned = match classify(&o) {
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
            owned.unwrap_or(Expr::Symbol(Cow::Owned(o)))
        }
    }
}

/// An expression.
pub(super) struct ExprDe<'a>(pub(super) Expr<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for ExprDe<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ExprVisitor(PhantomData))
    }
}

/// Reads an expression.
struct ExprVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ExprVisitor<'a> {
    type Value = ExprDe<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an nft expression")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(ExprDe(constant(Cow::Borrowed(v))))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(ExprDe(constant(Cow::Owned(v.to_string()))))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(ExprDe(Expr::Number(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(ExprDe(match u64::try_from(v) {
            Ok(n) => Expr::Number(n),
            Err(_) => Expr::Symbol(Cow::Owned(v.to_string())),
        }))
    }

    /// `exists` / `missing` (fib, exthdr).
    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(ExprDe(Expr::Symbol(Cow::Borrowed(if v {
            "exists"
        } else {
            "missing"
        }))))
    }

    /// A flag list (`["established", "related"]`).
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(e) = seq.next_element::<ExprDe<'a>>()? {
            items.push(e.0);
        }
        Ok(ExprDe(Expr::List(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let key = map
            .next_key::<Cow<'de, str>>()?
            .ok_or_else(|| de::Error::custom("an expression object"))?;
        let e = expr_member(&key, &mut map)?;
        end_of_object(&mut map)?;
        Ok(ExprDe(e))
    }
}

/// `payload`.
#[derive(Deserialize)]
struct PayloadDe<'a> {
    #[serde(borrow)]
    protocol: Cow<'a, str>,
    #[serde(borrow)]
    field: Cow<'a, str>,
}

/// `meta`.
#[derive(Deserialize)]
struct MetaDe<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
}

/// `ct`.
#[derive(Deserialize)]
struct CtDe<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow)]
    dir: Option<Cow<'a, str>>,
}

/// `fib`.
#[derive(Deserialize)]
struct FibDe<'a> {
    #[serde(borrow)]
    result: Cow<'a, str>,
    #[serde(borrow, default)]
    flags: StrList<'a>,
}

/// `numgen`.
#[derive(Deserialize)]
struct NumgenDe<'a> {
    #[serde(borrow)]
    mode: Cow<'a, str>,
    #[serde(rename = "mod")]
    modulus: u32,
    #[serde(default)]
    offset: u32,
}

/// `prefix`.
#[derive(Deserialize)]
struct PrefixDe<'a> {
    #[serde(borrow)]
    addr: Cow<'a, str>,
    len: u8,
}

/// `map` (the expression).
#[derive(Deserialize)]
struct MapDe<'a> {
    #[serde(borrow)]
    key: ExprDe<'a>,
    #[serde(borrow)]
    data: ExprDe<'a>,
}

/// `jump` / `goto`.
#[derive(Deserialize)]
struct TargetDe<'a> {
    #[serde(borrow)]
    target: Cow<'a, str>,
}

/// The expression `{key: …}` whose key has been read.
fn expr_member<'de: 'a, 'a, A: MapAccess<'de>>(
    key: &str,
    map: &mut A,
) -> Result<Expr<'a>, A::Error> {
    let binop = |op| {
        move |(l, r): (ExprDe<'a>, ExprDe<'a>)| Expr::Binary {
            op,
            left: Box::new(l.0),
            right: Box::new(r.0),
        }
    };
    Ok(match key {
        "payload" => {
            let p: PayloadDe<'a> = map.next_value()?;
            Expr::Payload {
                protocol: p.protocol,
                field: p.field,
            }
        }
        "meta" => Expr::Meta(map.next_value::<MetaDe<'a>>()?.key),
        "ct" => {
            let c: CtDe<'a> = map.next_value()?;
            Expr::Ct {
                dir: c.dir,
                key: c.key,
            }
        }
        "fib" => {
            let f: FibDe<'a> = map.next_value()?;
            Expr::Fib {
                flags: f.flags.0,
                result: f.result,
            }
        }
        "numgen" => {
            let n: NumgenDe<'a> = map.next_value()?;
            Expr::Numgen {
                mode: n.mode,
                modulus: n.modulus,
                offset: n.offset,
            }
        }
        "concat" => Expr::Concat(
            map.next_value::<Vec<ExprDe<'a>>>()?
                .into_iter()
                .map(|e| e.0)
                .collect(),
        ),
        "set" => Expr::Set(map.next_value::<Elements<'a>>()?.0),
        "prefix" => {
            let p: PrefixDe<'a> = map.next_value()?;
            let addr = p
                .addr
                .parse()
                .map_err(|_| de::Error::custom("a prefix address"))?;
            Expr::Prefix(addr, p.len)
        }
        "range" => {
            let (lo, hi): (ExprDe<'a>, ExprDe<'a>) = map.next_value()?;
            Expr::Range(Box::new(lo.0), Box::new(hi.0))
        }
        "map" => {
            let m: MapDe<'a> = map.next_value()?;
            Expr::Map {
                key: Box::new(m.key.0),
                map: Box::new(m.data.0),
            }
        }
        "&" => binop(BinOp::And)(map.next_value()?),
        "|" => binop(BinOp::Or)(map.next_value()?),
        "^" => binop(BinOp::Xor)(map.next_value()?),
        "<<" => binop(BinOp::Lshift)(map.next_value()?),
        ">>" => binop(BinOp::Rshift)(map.next_value()?),
        _ => Expr::Verdict(verdict_member(key, map)?),
    })
}

/// The verdict `{key: …}` whose key has been read.
fn verdict_member<'de: 'a, 'a, A: MapAccess<'de>>(
    key: &str,
    map: &mut A,
) -> Result<Verdict<'a>, A::Error> {
    Ok(match key {
        "accept" | "drop" | "return" | "continue" => {
            map.next_value::<IgnoredAny>()?;
            match key {
                "accept" => Verdict::Accept,
                "drop" => Verdict::Drop,
                "return" => Verdict::Return,
                _ => Verdict::Continue,
            }
        }
        "jump" => Verdict::Jump(map.next_value::<TargetDe<'a>>()?.target),
        "goto" => Verdict::Goto(map.next_value::<TargetDe<'a>>()?.target),
        _ => return Err(de::Error::custom(format!("an expression, not `{key}`"))),
    })
}

/// An element's `counter`: `null` or `{"packets": P, "bytes": B}` (a named counter's string
/// is an error).
pub(super) struct CounterDe(pub(super) Option<Counter>);

/// The `counter` statement: a named counter's name, or an element's values.
#[derive(Deserialize)]
#[serde(untagged)]
enum CounterStmtDe<'a> {
    /// `{"counter": "NAME"}`: `counter name "NAME"`.
    Named(#[serde(borrow)] Cow<'a, str>),
    /// `{"counter": null}` / `{"counter": {"packets": P, "bytes": B}}`.
    Anonymous(CounterDe),
}

impl<'de> Deserialize<'de> for CounterDe {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Values {
            #[serde(default)]
            packets: u64,
            #[serde(default)]
            bytes: u64,
        }
        let v: Option<Values> = Deserialize::deserialize(d)?;
        Ok(CounterDe(v.map(|v| Counter {
            packets: v.packets,
            bytes: v.bytes,
        })))
    }
}

/// A statement, read from its raw JSON; kept as that text when it is not modelled.
pub(super) struct StmtSlot<'a>(pub(super) Stmt<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for StmtSlot<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw: &'de RawValue = Deserialize::deserialize(d)?;
        let text = raw.get();
        Ok(StmtSlot(match serde_json::from_str::<StmtDe<'a>>(text) {
            Ok(s) => s.0,
            Err(_) => Stmt::Verbatim(Cow::Borrowed(text)),
        }))
    }
}

/// `match`.
#[derive(Deserialize)]
struct MatchDe<'a> {
    #[serde(borrow)]
    op: Option<Cow<'a, str>>,
    #[serde(borrow)]
    left: ExprDe<'a>,
    #[serde(borrow)]
    right: ExprDe<'a>,
}

/// `vmap`.
#[derive(Deserialize)]
struct VmapDe<'a> {
    #[serde(borrow)]
    key: ExprDe<'a>,
    #[serde(borrow)]
    data: ExprDe<'a>,
}

/// `mangle`.
#[derive(Deserialize)]
struct MangleDe<'a> {
    #[serde(borrow)]
    key: ExprDe<'a>,
    #[serde(borrow)]
    value: ExprDe<'a>,
}

/// `reject`.
#[derive(Deserialize)]
struct RejectDe<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    expr: Option<Cow<'a, str>>,
}

/// `dnat`, `snat`, `masquerade`, `redirect`.
#[derive(Deserialize)]
struct NatDe<'a> {
    #[serde(borrow)]
    addr: Option<ExprDe<'a>>,
    #[serde(borrow)]
    port: Option<ExprDe<'a>>,
    family: Option<Fam>,
    #[serde(borrow, default)]
    flags: StrList<'a>,
}

/// `log`.
#[derive(Deserialize)]
struct LogDe<'a> {
    #[serde(borrow)]
    prefix: Option<Cow<'a, str>>,
    #[serde(borrow)]
    level: Option<Cow<'a, str>>,
    group: Option<u32>,
    snaplen: Option<u32>,
    #[serde(rename = "queue-threshold")]
    queue_threshold: Option<u32>,
    flags: Option<IgnoredAny>,
}

/// `set` (the statement: `update @set { … }`).
#[derive(Deserialize)]
struct SetStmtDe<'a> {
    #[serde(borrow)]
    op: Cow<'a, str>,
    #[serde(borrow)]
    elem: ExprDe<'a>,
    #[serde(borrow)]
    set: Cow<'a, str>,
}

/// `xt`.
#[derive(Deserialize)]
struct XtDe<'a> {
    #[serde(borrow, rename = "type")]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    name: Cow<'a, str>,
}

/// A modelled statement.
struct StmtDe<'a>(Stmt<'a>);

impl<'de: 'a, 'a> Deserialize<'de> for StmtDe<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(StmtVisitor(PhantomData))
    }
}

/// Reads a statement object.
struct StmtVisitor<'a>(PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for StmtVisitor<'a> {
    type Value = StmtDe<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an nft statement")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let key = map
            .next_key::<Cow<'de, str>>()?
            .ok_or_else(|| de::Error::custom("a statement object"))?;
        let s = match &*key {
            "match" => {
                let m: MatchDe<'a> = map.next_value()?;
                let op = match m.op.as_deref() {
                    None | Some("==" | "in") => RelOp::Eq,
                    Some("!=") => RelOp::Ne,
                    Some("<") => RelOp::Lt,
                    Some(">") => RelOp::Gt,
                    Some("<=") => RelOp::Le,
                    Some(">=") => RelOp::Ge,
                    Some(_) => return Err(de::Error::custom("a relation")),
                };
                Stmt::Match {
                    left: m.left.0,
                    op,
                    right: m.right.0,
                }
            }
            "vmap" => {
                let v: VmapDe<'a> = map.next_value()?;
                Stmt::Vmap {
                    key: v.key.0,
                    map: v.data.0,
                }
            }
            "mangle" => {
                let m: MangleDe<'a> = map.next_value()?;
                Stmt::Mangle {
                    key: m.key.0,
                    value: m.value.0,
                }
            }
            "counter" => match map.next_value::<CounterStmtDe<'a>>()? {
                CounterStmtDe::Named(name) => Stmt::NamedCounter(name),
                CounterStmtDe::Anonymous(c) => Stmt::Counter(c.0),
            },
            "reject" => {
                Stmt::Reject(
                    map.next_value::<Option<RejectDe<'a>>>()?
                        .map(|r| RejectWith {
                            kind: r.kind,
                            code: r.expr,
                        }),
                )
            }
            "masquerade" | "snat" | "dnat" | "redirect" => {
                let kind = match &*key {
                    "masquerade" => NatKind::Masquerade,
                    "snat" => NatKind::Snat,
                    "dnat" => NatKind::Dnat,
                    _ => NatKind::Redirect,
                };
                let n: Option<NatDe<'a>> = map.next_value()?;
                Stmt::Nat(match n {
                    None => Nat {
                        kind,
                        family: None,
                        addr: None,
                        port: None,
                        flags: Vec::new(),
                    },
                    Some(n) => Nat {
                        kind,
                        family: n.family.map(|f| f.0),
                        addr: n.addr.map(|a| a.0),
                        port: n.port.map(|p| p.0),
                        flags: n.flags.0,
                    },
                })
            }
            "log" => {
                let l: Option<LogDe<'a>> = map.next_value()?;
                let l = l.unwrap_or(LogDe {
                    prefix: None,
                    level: None,
                    group: None,
                    snaplen: None,
                    queue_threshold: None,
                    flags: None,
                });
                if l.flags.is_some() {
                    return Err(de::Error::custom("a log statement without flags"));
                }
                Stmt::Log(Log {
                    prefix: l.prefix,
                    level: l.level,
                    group: l.group,
                    snaplen: l.snaplen,
                    queue_threshold: l.queue_threshold,
                })
            }
            "set" => {
                let s: SetStmtDe<'a> = map.next_value()?;
                let set = match s.set {
                    Cow::Borrowed(b) => Cow::Borrowed(b.strip_prefix('@').unwrap_or(b)),
                    Cow::Owned(o) => Cow::Owned(o.strip_prefix('@').unwrap_or(&o).to_string()),
                };
                Stmt::SetUpdate {
                    op: s.op,
                    set,
                    elem: s.elem.0,
                }
            }
            "xt" => {
                let x: XtDe<'a> = map.next_value()?;
                Stmt::Xt {
                    kind: x.kind,
                    name: x.name,
                }
            }
            other => Stmt::Verdict(verdict_member(other, &mut map)?),
        };
        end_of_object(&mut map)?;
        Ok(StmtDe(s))
    }
}
