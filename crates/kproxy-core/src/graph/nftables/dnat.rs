//! What the statements of kube-proxy's table mean for a new connection, read from the
//! statements themselves rather than from chain names: where a DNAT sends it and with which
//! share, which mark asks `masquerading` to masquerade and which rules set it, and which
//! connections are masqueraded as hairpin.
//!
//! kube-proxy has written its DNATs in three forms (`pkg/proxy/nftables/proxier.go`,
//! `syncProxyRules`): `dnat to ADDR:PORT` in one chain per endpoint, picked by a `numgen random
//! mod N vmap { i : goto endpoint-… }` (up to 1.35, and for ClientIP affinity after); `dnat ip
//! addr . port to numgen random mod N map { i : ADDR . PORT }` straight in the service chain
//! (1.36, listed by nft as `dnat ip to numgen … map { … }`); and `dnat to ADDR:PORT` straight in
//! the service chain when it has one endpoint (1.37). Each value of the numgen picks one map
//! entry, so an entry's share is the number of its keys over N.

use super::port_of;
use crate::parsers::nft::{BinOp, Element, Expr, NatKind, Rule, Stmt, Table, Verdict};
use std::collections::HashSet;
use std::net::IpAddr;

/// A DNAT statement's target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DnatTarget {
    /// The new destination address.
    pub ip: IpAddr,
    /// The new destination port, when written.
    pub port: Option<u16>,
}

impl DnatTarget {
    /// `ip:port`, `[ip6]:port`, or the address alone.
    pub fn text(&self) -> String {
        match (self.ip, self.port) {
            (IpAddr::V6(a), Some(p)) => format!("[{a}]:{p}"),
            (ip, Some(p)) => format!("{ip}:{p}"),
            (ip, None) => ip.to_string(),
        }
    }
}

/// The `dnat to ADDR[:PORT]` of a rule, if it has one with a plain address.
pub fn dnat_of(rule: &Rule<'_>) -> Option<DnatTarget> {
    rule.stmts.iter().find_map(dnat_target)
}

/// The target of a `dnat to ADDR[:PORT]` statement with a plain address.
pub fn dnat_target(stmt: &Stmt<'_>) -> Option<DnatTarget> {
    match stmt {
        Stmt::Nat(n) if n.kind == NatKind::Dnat => {
            let ip = match n.addr.as_ref()? {
                Expr::Addr(a) => *a,
                _ => return None,
            };
            Some(DnatTarget {
                ip,
                port: n.port.as_ref().and_then(port_of),
            })
        }
        _ => None,
    }
}

/// Where one DNAT statement sends the connections that reach it.
#[derive(Debug, Clone, PartialEq)]
pub struct DnatPick {
    /// N of `numgen random mod N` (1 for a plain `dnat to`).
    pub modulus: u32,
    /// Each destination with the number of numgen values that pick it, in map order.
    pub arms: Vec<(DnatTarget, u32)>,
    /// Numgen values no map entry holds: those connections are not DNATed here.
    pub missing: Vec<u64>,
}

impl DnatPick {
    /// The share of the connections reaching the statement that `keys` values get.
    pub fn share(&self, keys: u32) -> f64 {
        f64::from(keys) / f64::from(self.modulus.max(1))
    }
}

/// What a DNAT statement does: `None` for a statement that is no DNAT; `Some(Err(()))` for a
/// DNAT whose destination this build cannot tell (a map keyed by something else than `numgen
/// random`, a map value that is no `ADDR` or `ADDR . PORT`, a map the table lacks).
pub fn dnat_pick(stmt: &Stmt<'_>, table: &Table<'_>) -> Option<Result<DnatPick, ()>> {
    let Stmt::Nat(n) = stmt else { return None };
    if n.kind != NatKind::Dnat {
        return None;
    }
    let fixed_port = n.port.as_ref().map(port_of);
    Some(match (n.addr.as_ref(), fixed_port) {
        (_, Some(None)) => Err(()),
        (Some(Expr::Addr(ip)), port) => Ok(DnatPick {
            modulus: 1,
            arms: vec![(
                DnatTarget {
                    ip: *ip,
                    port: port.flatten(),
                },
                1,
            )],
            missing: Vec::new(),
        }),
        (Some(Expr::Map { key, map }), port) => numgen_map(key, map, port.flatten(), table),
        _ => Err(()),
    })
}

/// `numgen random mod N [offset M] map { k : ADDR [. PORT] , … }` (or a named map).
fn numgen_map(
    key: &Expr<'_>,
    map: &Expr<'_>,
    port: Option<u16>,
    table: &Table<'_>,
) -> Result<DnatPick, ()> {
    let Expr::Numgen {
        mode,
        modulus,
        offset,
    } = key
    else {
        return Err(());
    };
    if mode != "random" || *modulus == 0 {
        return Err(());
    }
    let elements: &[Element<'_>] = match map {
        Expr::Set(items) => items,
        Expr::SetRef(name) => &table.set(name).ok_or(())?.elements,
        _ => return Err(()),
    };
    let mut arms: Vec<(DnatTarget, u32)> = Vec::new();
    let mut missing = Vec::new();
    for k in 0..*modulus {
        let value = u64::from(k) + u64::from(*offset);
        let Some(e) = elements.iter().find(|e| key_holds(&e.key, value)) else {
            missing.push(value);
            continue;
        };
        let target = match e.value.as_ref().ok_or(())? {
            Expr::Addr(ip) => DnatTarget { ip: *ip, port },
            Expr::Concat(parts) => match parts.as_slice() {
                [Expr::Addr(ip), p] => DnatTarget {
                    ip: *ip,
                    port: Some(port_of(p).ok_or(())?),
                },
                _ => return Err(()),
            },
            _ => return Err(()),
        };
        match arms.iter_mut().find(|(t, _)| *t == target) {
            Some((_, n)) => *n += 1,
            None => arms.push((target, 1)),
        }
    }
    Ok(DnatPick {
        modulus: *modulus,
        arms,
        missing,
    })
}

/// Whether a numgen map key (a number or a range of numbers) holds `value`.
fn key_holds(key: &Expr<'_>, value: u64) -> bool {
    match key {
        Expr::Number(k) => *k == value,
        Expr::Range(lo, hi) => {
            matches!((&**lo, &**hi), (Expr::Number(lo), Expr::Number(hi)) if (*lo..=*hi).contains(&value))
        }
        _ => false,
    }
}

/// `meta mark & M` in a rule: the mark bits it tests, with the relation to 0 (`Some(true)` for
/// `!= 0`, `Some(false)` for `== 0`).
fn mark_test(rule: &Rule<'_>) -> Option<(u64, bool)> {
    rule.stmts.iter().find_map(|s| match s {
        Stmt::Match {
            left:
                Expr::Binary {
                    op: BinOp::And,
                    left,
                    right,
                },
            op,
            right: Expr::Number(0),
        } if matches!(&**left, Expr::Meta(k) if k == "mark") => match **right {
            Expr::Number(m) => Some((m, *op == crate::parsers::nft::RelOp::Ne)),
            _ => None,
        },
        _ => None,
    })
}

fn masquerades(rule: &Rule<'_>) -> bool {
    rule.stmts
        .iter()
        .any(|s| matches!(s, Stmt::Nat(n) if n.kind == NatKind::Masquerade))
}

/// The mark that makes kube-proxy's table masquerade a connection: the bits a masquerading rule
/// tests (`mark and M != 0 … masquerade`, 1.36 on), or that a chain tests before it masquerades
/// (`mark and M == 0 return` then `masquerade`, up to 1.35); without such a rule (a partial
/// listing), the bits a chain that only sets a mark sets (`mark-for-masquerade`).
pub fn masquerade_mark(table: &Table<'_>) -> Option<u64> {
    let tested = table.chains.iter().find_map(|c| {
        c.rules
            .iter()
            .enumerate()
            .find_map(|(i, r)| match mark_test(r) {
                Some((m, true)) if masquerades(r) => Some(m),
                Some((m, false))
                    if r.verdict() == Some(&Verdict::Return)
                        && c.rules[i + 1..].iter().any(masquerades) =>
                {
                    Some(m)
                }
                _ => None,
            })
    });
    tested.or_else(|| {
        let chain = mark_chains(table, None).first().copied()?;
        table.chain(chain)?.rules.iter().find_map(|r| {
            r.stmts.iter().find_map(|s| match s {
                Stmt::Mangle {
                    value: Expr::Binary { right, .. },
                    ..
                } => match **right {
                    Expr::Number(m) => Some(m),
                    _ => None,
                },
                _ => None,
            })
        })
    })
}

/// Whether `stmt` sets the bits of `mark` in the packet mark (`mark set mark or M`).
pub fn sets_mark(stmt: &Stmt<'_>, mark: Option<u64>) -> bool {
    match stmt {
        Stmt::Mangle {
            key: Expr::Meta(k),
            value:
                Expr::Binary {
                    op: BinOp::Or,
                    left,
                    right,
                },
        } if k == "mark" && matches!(&**left, Expr::Meta(k) if k == "mark") => match **right {
            Expr::Number(m) => mark.is_none_or(|want| m & want == want),
            _ => false,
        },
        _ => false,
    }
}

/// Chains whose every rule only sets the masquerade mark (up to 1.35, `mark-for-masquerade`):
/// a jump to one marks the packet.
pub fn mark_chains<'t>(table: &'t Table<'_>, mark: Option<u64>) -> Vec<&'t str> {
    table
        .chains
        .iter()
        .filter(|c| {
            c.base.is_none()
                && !c.rules.is_empty()
                && c.rules.iter().all(|r| {
                    r.stmts.iter().any(|s| sets_mark(s, mark))
                        && r.stmts
                            .iter()
                            .all(|s| sets_mark(s, mark) || matches!(s, Stmt::Counter(_)))
                })
        })
        .map(|c| &*c.name)
        .collect()
}

/// Whether `rule` marks the packet for masquerade: it sets the mark itself, or jumps to a
/// chain of `mark_chains`.
pub fn marks_for_masquerade(rule: &Rule<'_>, mark: Option<u64>, mark_chains: &[&str]) -> bool {
    rule.stmts.iter().any(|s| match s {
        Stmt::Verdict(Verdict::Jump(c)) => mark_chains.contains(&&**c),
        s => sets_mark(s, mark),
    })
}

/// A rule that masquerades connections DNATed to an endpoint that is their own source: `ct
/// status dnat ip saddr . ip daddr . meta l4proto . th dport @SET masquerade` (1.36 on). The
/// set holds one `EP . EP . PROTO . PORT` element per local endpoint.
#[derive(Debug, Clone, Copy)]
pub struct HairpinRule<'t> {
    /// The chain that holds the rule.
    pub chain: &'t str,
    /// The rule.
    pub rule: &'t Rule<'t>,
    /// The set it looks the connection up in.
    pub set: &'t str,
}

/// Every hairpin-masquerade rule of `table`.
pub fn hairpin_rules<'t>(table: &'t Table<'t>) -> Vec<HairpinRule<'t>> {
    let mut out = Vec::new();
    for c in &table.chains {
        for r in &c.rules {
            if !masquerades(r) {
                continue;
            }
            let set = r.stmts.iter().find_map(|s| match s {
                Stmt::Match {
                    left: Expr::Concat(parts),
                    op: crate::parsers::nft::RelOp::Eq,
                    right: Expr::SetRef(set),
                } if is_connection_key(parts) => Some(&**set),
                _ => None,
            });
            if let Some(set) = set {
                out.push(HairpinRule {
                    chain: &c.name,
                    rule: r,
                    set,
                });
            }
        }
    }
    out
}

/// `ip saddr . ip daddr . meta l4proto . th dport` (or `ip6`).
fn is_connection_key(parts: &[Expr<'_>]) -> bool {
    let address = |e: &Expr<'_>, want: &str| matches!(e, Expr::Payload { protocol, field } if matches!(&**protocol, "ip" | "ip6") && field == want);
    matches!(parts, [s, d, Expr::Meta(l4), Expr::Payload { protocol, field }]
        if address(s, "saddr") && address(d, "daddr") && l4 == "l4proto" && protocol == "th" && field == "dport")
}

/// The connections of endpoints to themselves a hairpin set holds: `(ip, protocol, port)` of
/// each `IP . IP . PROTO . PORT` element (a set of a large node has one per local endpoint, so
/// it is read once, not per endpoint).
pub fn hairpin_members(table: &Table<'_>, set: &str) -> HashSet<(IpAddr, &'static str, u16)> {
    let Some(set) = table.set(set) else {
        return HashSet::new();
    };
    set.elements
        .iter()
        .filter_map(|e| match super::key_parts(&e.key) {
            [Expr::Addr(s), Expr::Addr(d), proto, p] if s == d => {
                Some((*s, super::protocol_of(proto)?, port_of(p)?))
            }
            _ => None,
        })
        .collect()
}

/// Whether `set` holds `ip . ip . protocol . port`: a connection of the endpoint to itself.
pub fn set_holds_hairpin(
    table: &Table<'_>,
    set: &str,
    ip: IpAddr,
    protocol: &str,
    port: u16,
) -> bool {
    let protocol = super::protocol_of(&Expr::Symbol(protocol.into()));
    protocol.is_some_and(|proto| hairpin_members(table, set).contains(&(ip, proto, port)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::nft::{ParseOptions, parse};

    fn table(text: &str) -> crate::parsers::nft::Ruleset<'_> {
        parse(text, &ParseOptions::strict()).expect("parses")
    }

    #[test]
    fn numgen_maps_give_each_destination_its_share() {
        let rs = table(
            "add table ip t
add map ip t eps { type integer : ipv4_addr . inet_service ; }
add chain ip t a
add rule ip t a meta l4proto tcp dnat ip addr . port to numgen random mod 4 map { 0 : 10.0.0.1 . 80 , 1-2 : 10.0.0.2 . 81 }
add rule ip t a dnat to numgen random mod 2 map @eps
add rule ip t a dnat to 10.0.0.9:8080
add rule ip t a dnat to jhash ip saddr mod 2 map { 0 : 10.0.0.1 . 80 }
add rule ip t a dnat to ip saddr map { 10.1.0.0/16 : 10.0.0.1 . 80 }
add element ip t eps { 0 : 10.0.0.7 . 70 , 1 : 10.0.0.8 . 80 }
",
        );
        let t = &rs.tables[0];
        let rules = &t.chain("a").expect("a").rules;
        let pick = |i: usize| rules[i].stmts.iter().find_map(|s| dnat_pick(s, t));
        let p = pick(0).expect("dnat").expect("read");
        assert_eq!(p.modulus, 4);
        let arms: Vec<(String, u32)> = p.arms.iter().map(|(t, k)| (t.text(), *k)).collect();
        assert_eq!(arms, [("10.0.0.1:80".into(), 1), ("10.0.0.2:81".into(), 2)]);
        assert_eq!(p.missing, [3]);
        assert_eq!(p.share(2), 0.5);
        let p = pick(1).expect("dnat").expect("named map read");
        assert_eq!(p.arms.len(), 2);
        let p = pick(2).expect("dnat").expect("plain");
        assert_eq!((p.modulus, p.arms[0].0.text()), (1, "10.0.0.9:8080".into()));
        // `jhash` is not modelled (verbatim), a map keyed by the source is no numgen: unknown.
        assert!(pick(3).is_none_or(|p| p.is_err()));
        assert_eq!(pick(4), Some(Err(())));
    }

    #[test]
    fn masquerade_mark_and_hairpin_from_either_layout() {
        let g3 = table(
            "add table ip t
add chain ip t mark-for-masquerade
add chain ip t masquerading
add rule ip t mark-for-masquerade mark set mark or 0x4000
add rule ip t masquerading mark and 0x4000 == 0 return
add rule ip t masquerading mark set mark xor 0x4000
add rule ip t masquerading masquerade fully-random
",
        );
        let t = &g3.tables[0];
        assert_eq!(masquerade_mark(t), Some(0x4000));
        assert_eq!(mark_chains(t, Some(0x4000)), ["mark-for-masquerade"]);
        let g4 = table(
            "add table ip t
add set ip t hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; }
add chain ip t masquerading
add rule ip t masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random
add rule ip t masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
add element ip t hairpin-connections { 10.180.0.1 . 10.180.0.1 . tcp . 80 }
",
        );
        let t = &g4.tables[0];
        assert_eq!(masquerade_mark(t), Some(0x4000));
        assert!(mark_chains(t, Some(0x4000)).is_empty());
        let h = hairpin_rules(t);
        assert_eq!((h.len(), h[0].set), (1, "hairpin-connections"));
        let ip = "10.180.0.1".parse().expect("ip");
        assert!(set_holds_hairpin(t, "hairpin-connections", ip, "tcp", 80));
        assert!(!set_holds_hairpin(t, "hairpin-connections", ip, "udp", 80));
        let inline =
            crate::parsers::nft::parse_rule("mark set mark or 0x4000 comment \"masquerade\"")
                .expect("rule");
        assert!(marks_for_masquerade(&inline, Some(0x4000), &[]));
        assert!(!marks_for_masquerade(&inline, Some(0x8000), &[]));
    }
}
