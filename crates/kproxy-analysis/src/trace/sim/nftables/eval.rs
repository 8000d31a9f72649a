//! Expressions of an nftables rule evaluated against the packet as it is at that point of the
//! walk: header fields, meta and conntrack keys, FIB lookups, bitwise arithmetic on the mark,
//! concatenations, and their comparison with constants, anonymous sets and set elements.

use super::super::engine::LocalAddrs;
use super::super::packet::Protocol;
use crate::parsers::nft::{BinOp, Element, Expr, RelOp};
use std::net::IpAddr;

/// A value of the packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Val {
    /// An address.
    Ip(IpAddr),
    /// A number: a port, a protocol, a mark.
    Num(u64),
    /// A symbol: a FIB address type, an interface name, the packet's family.
    Sym(String),
    /// Flags that are set: conntrack state and status.
    Flags(Vec<&'static str>),
    /// A concatenation.
    Tuple(Vec<Val>),
}

/// Why a value cannot be had.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Missing {
    /// The expression does not apply to this packet (an `ip` field of an IPv6 packet, `tcp
    /// dport` of a UDP packet): the match fails, as nft's implicit dependency does.
    NotThisPacket,
    /// The model cannot know it.
    Undecidable(&'static str),
}

/// The packet as a rule sees it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Packet<'s> {
    pub src: IpAddr,
    pub sport: Option<u16>,
    pub dst: IpAddr,
    pub dport: u16,
    pub proto: Protocol,
    pub mark: u32,
    pub ct_dnat: bool,
    pub ct_snat: bool,
    pub in_iface: Option<&'s str>,
    pub out_iface: Option<&'s str>,
    pub local: &'s LocalAddrs,
}

/// The number nft gives a symbol in a numeric position (protocols, ether types).
fn symbol_number(s: &str) -> Option<u64> {
    Some(match s {
        "icmp" => 1,
        "tcp" => 6,
        "udp" => 17,
        "icmpv6" => 58,
        "sctp" => 132,
        "ip" => 0x0800,
        "ip6" => 0x86dd,
        _ => return None,
    })
}

/// The value of `e` for packet `p`.
pub(super) fn value(e: &Expr<'_>, p: &Packet<'_>) -> Result<Val, Missing> {
    let v4 = p.dst.is_ipv4();
    let port = |field: &str| -> Result<Val, Missing> {
        match field {
            "dport" => Ok(Val::Num(u64::from(p.dport))),
            "sport" => p
                .sport
                .map(|s| Val::Num(u64::from(s)))
                .ok_or(Missing::Undecidable(
                    "the source port is not given (SRC:SPORT in --packet)",
                )),
            _ => Err(Missing::Undecidable(
                "a transport header field kproxy does not model",
            )),
        }
    };
    match e {
        Expr::Payload { protocol, field } => match (&**protocol, &**field) {
            ("ip", _) if !v4 => Err(Missing::NotThisPacket),
            ("ip6", _) if v4 => Err(Missing::NotThisPacket),
            ("ip" | "ip6", "saddr") => Ok(Val::Ip(p.src)),
            ("ip" | "ip6", "daddr") => Ok(Val::Ip(p.dst)),
            ("ip", "protocol") | ("ip6", "nexthdr") => Ok(Val::Num(u64::from(p.proto.number()))),
            ("th", f) => port(f),
            (proto @ ("tcp" | "udp" | "sctp"), f) => {
                if proto == p.proto.name() {
                    port(f)
                } else {
                    Err(Missing::NotThisPacket)
                }
            }
            ("udplite" | "icmp" | "icmpv6" | "dccp", _) => Err(Missing::NotThisPacket),
            _ => Err(Missing::Undecidable("a header field kproxy does not model")),
        },
        Expr::Meta(key) => match &**key {
            "l4proto" => Ok(Val::Num(u64::from(p.proto.number()))),
            "protocol" => Ok(Val::Num(if v4 { 0x0800 } else { 0x86dd })),
            "nfproto" => Ok(Val::Sym(if v4 { "ipv4" } else { "ipv6" }.to_string())),
            "mark" => Ok(Val::Num(u64::from(p.mark))),
            "iif" | "iifname" => {
                p.in_iface
                    .map(|i| Val::Sym(i.to_string()))
                    .ok_or(Missing::Undecidable(
                        "the input interface is not given (--in-interface)",
                    ))
            }
            "oif" | "oifname" => {
                p.out_iface
                    .map(|i| Val::Sym(i.to_string()))
                    .ok_or(Missing::Undecidable(
                        "the output interface is not given (--out-interface)",
                    ))
            }
            _ => Err(Missing::Undecidable("a meta key kproxy does not model")),
        },
        Expr::Ct { dir: None, key } => match &**key {
            "state" => Ok(Val::Flags(vec!["new"])),
            "status" => {
                let mut f = Vec::new();
                if p.ct_dnat {
                    f.push("dnat");
                }
                if p.ct_snat {
                    f.push("snat");
                }
                Ok(Val::Flags(f))
            }
            "direction" => Ok(Val::Sym("original".to_string())),
            "mark" => Ok(Val::Num(0)),
            _ => Err(Missing::Undecidable(
                "a conntrack key kproxy does not model",
            )),
        },
        Expr::Fib { flags, result } if result == "type" => {
            let addr = if flags.iter().any(|f| f == "daddr") {
                p.dst
            } else if flags.iter().any(|f| f == "saddr") {
                p.src
            } else {
                return Err(Missing::Undecidable("a FIB lookup kproxy does not model"));
            };
            let kind = if p.local.contains(addr) {
                "local"
            } else if addr.is_multicast() {
                "multicast"
            } else {
                "unicast"
            };
            Ok(Val::Sym(kind.to_string()))
        }
        Expr::Binary { op, left, right } => {
            let (Val::Num(a), Val::Num(b)) = (value(left, p)?, value(right, p)?) else {
                return Err(Missing::Undecidable(
                    "bitwise arithmetic on a value that is not a number",
                ));
            };
            Ok(Val::Num(match op {
                BinOp::And => a & b,
                BinOp::Or => a | b,
                BinOp::Xor => a ^ b,
                BinOp::Lshift => a.checked_shl(u32::try_from(b).unwrap_or(64)).unwrap_or(0),
                BinOp::Rshift => a.checked_shr(u32::try_from(b).unwrap_or(64)).unwrap_or(0),
            }))
        }
        Expr::Concat(parts) => parts
            .iter()
            .map(|x| value(x, p))
            .collect::<Result<Vec<_>, _>>()
            .map(Val::Tuple),
        Expr::Number(n) => Ok(Val::Num(*n)),
        Expr::Addr(a) => Ok(Val::Ip(*a)),
        Expr::Symbol(s) => Ok(match symbol_number(s) {
            Some(n) => Val::Num(n),
            None => Val::Sym(s.to_string()),
        }),
        _ => Err(Missing::Undecidable("an expression kproxy does not model")),
    }
}

/// True when `net/len` contains `ip`.
pub(super) fn prefix_contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    super::kptest::prefix_contains(net, len, ip)
}

/// Whether `v` equals (or lies in) the constant `c`: an address, prefix, range, number,
/// symbol, flag list, anonymous set or concatenation of them.
pub(super) fn matches_const(v: &Val, c: &Expr<'_>) -> Result<bool, &'static str> {
    Ok(match (v, c) {
        (_, Expr::Set(elements)) => {
            for e in elements {
                if matches_const(v, &e.key)? {
                    return Ok(true);
                }
            }
            false
        }
        (Val::Ip(a), Expr::Addr(b)) => a == b,
        (Val::Ip(a), Expr::Prefix(net, len)) => prefix_contains(*net, *len, *a),
        (Val::Ip(a), Expr::Range(lo, hi)) => match (&**lo, &**hi) {
            (Expr::Addr(lo), Expr::Addr(hi)) => lo.is_ipv4() == a.is_ipv4() && lo <= a && a <= hi,
            _ => false,
        },
        (Val::Num(n), Expr::Number(m)) => n == m,
        (Val::Num(n), Expr::Range(lo, hi)) => match (&**lo, &**hi) {
            (Expr::Number(lo), Expr::Number(hi)) => lo <= n && n <= hi,
            _ => false,
        },
        (Val::Num(n), Expr::Symbol(s)) => match symbol_number(s) {
            Some(m) => *n == m,
            None => return Err("a symbolic constant kproxy does not know"),
        },
        (Val::Sym(a), Expr::Symbol(b)) => a == b,
        (Val::Flags(set), Expr::Symbol(b)) => set.iter().any(|f| f == b),
        (Val::Flags(set), Expr::List(items)) => items
            .iter()
            .any(|i| matches!(i, Expr::Symbol(s) if set.iter().any(|f| f == s))),
        (_, Expr::List(items)) => {
            for i in items {
                if matches_const(v, i)? {
                    return Ok(true);
                }
            }
            false
        }
        (Val::Tuple(vs), Expr::Concat(cs)) => {
            if vs.len() != cs.len() {
                return Ok(false);
            }
            for (v, c) in vs.iter().zip(cs) {
                if !matches_const(v, c)? {
                    return Ok(false);
                }
            }
            true
        }
        (Val::Ip(_), Expr::Number(_) | Expr::Symbol(_))
        | (Val::Num(_), Expr::Addr(_) | Expr::Prefix(..))
        | (Val::Sym(_), Expr::Number(_) | Expr::Addr(_) | Expr::Prefix(..)) => false,
        _ => return Err("a comparison of values of different kinds"),
    })
}

/// The first element of `elements` whose key holds `v`.
pub(super) fn find<'e, 'a>(
    v: &Val,
    elements: &'e [Element<'a>],
) -> Result<Option<&'e Element<'a>>, &'static str> {
    for e in elements {
        if matches_const(v, &e.key)? {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// `v OP c` for the ordering relations (numbers only); equality goes through [`matches_const`].
pub(super) fn compare(v: &Val, op: RelOp, c: &Expr<'_>) -> Result<bool, &'static str> {
    match op {
        RelOp::Eq => matches_const(v, c),
        RelOp::Ne => matches_const(v, c).map(|m| !m),
        _ => match (v, c) {
            (Val::Num(a), Expr::Number(b)) => Ok(match op {
                RelOp::Lt => a < b,
                RelOp::Gt => a > b,
                RelOp::Le => a <= b,
                _ => a >= b,
            }),
            _ => Err("an ordering of values that are not numbers"),
        },
    }
}
