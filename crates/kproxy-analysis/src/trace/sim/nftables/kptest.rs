//! `--model kube-proxy-test` on an nftables ruleset: the walk of kube-proxy's nftables unit-test
//! tracer (`nftablesTracer` in `pkg/proxy/nftables/helpers_test.go`), on the typed rules.
//!
//! The tracer recognises the statements kube-proxy writes, one after the other, and nothing
//! else: `ip daddr`/`ip saddr` against an address, a prefix or an anonymous set (a positive set
//! must hold the address in *every* member, as the tracer tests it), `ip daddr @set` and the
//! concatenated lookups `ip daddr . meta l4proto . th dport [. ip saddr] @set` / `meta l4proto .
//! th dport @set` (set keys compared exactly), `fib daddr|saddr type local` (membership in the
//! node IPs, no loopback), `tcp|udp|sctp dport N`, the `vmap @map` dispatches (the element's
//! verdict replaces the rest of the rule), `jump mark-for-masquerade` (sets `masq`, the chain is
//! not entered), `jump`/`goto`, `drop`, `reject`, `return`, `meta l4proto P dnat to X` (records
//! X, the protocol is not checked) and `numgen random mod N vmap { … }` (every listed chain is
//! walked, all their outputs kept). kube-proxy 1.36's forms are read alike (the tracer of that
//! release was not found in public sources, so this is inferred from the 1.35 tracer): `meta
//! l4proto P dnat … to numgen random mod N map { k : A . P , … }` records every destination in
//! map order, `mark set mark or M` sets `masq` as the jump did, and after `nat-prerouting` a
//! packet one of whose destinations is its own source is `masq` when a `masquerading` rule's
//! set (`hairpin-connections`) holds the connection. A leading `ct state new` always holds, comments are not
//! part of a rule, counters are skipped; any other statement abandons the rule, as the test's
//! "unmatched rule" does. The packet runs through `filter-prerouting-pre-dnat` (a drop there
//! ends it), `nat-prerouting`, then — destination replaced by the first output's host, port
//! unchanged — `filter-forward` and `filter-input`. An unknown chain ends the walk.

use super::super::SimError;
use super::super::engine::LocalAddrs;
use super::super::outcome::TestTrace;
use super::super::packet::PacketSpec;
use super::super::walk::{MAX_DEPTH, MAX_STEPS};
use super::table_for;
use crate::graph::nftables::{dnat, key_parts, protocol_of};
use crate::parsers::nft::{Element, Expr, RelOp, Ruleset, Stmt, Table, Verdict};
use crate::proxier::nftables::names as kp;
use std::net::IpAddr;

/// The chains the tracer runs, in order (the destination is rewritten after the second).
pub const TRACER_CHAINS: [&str; 4] = [
    kp::FILTER_PREROUTING_PRE_DNAT,
    kp::NAT_PREROUTING,
    kp::FILTER_FORWARD,
    kp::FILTER_INPUT,
];

/// The tracer's result, and what it would have reported as test errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftTestTrace {
    /// `output` and `masq`, as kube-proxy's tests compare them.
    pub trace: TestTrace,
    /// The test errors the tracer would log (`unknown chain`, `unmatched rule`), deduplicated.
    pub errors: Vec<String>,
}

struct Walk<'r, 'a> {
    table: Option<&'r Table<'a>>,
    local: &'r LocalAddrs,
    packet: PacketSpec,
    dst: Option<IpAddr>,
    outputs: Vec<String>,
    masq: bool,
    matched: Vec<String>,
    errors: Vec<String>,
    steps: usize,
}

/// What one statement did.
enum Step<'r, 'a> {
    /// A condition held: go on with the next statement.
    Holds,
    /// A condition failed (or the statement is not the tracer's): next rule.
    Abandon,
    /// The rule's remaining text is replaced by a verdict (a vmap element).
    Replace(&'r Verdict<'a>),
    /// The chain is done: `true` when terminated.
    Return(bool),
}

impl<'r, 'a> Walk<'r, 'a> {
    fn error(&mut self, e: String) {
        if !self.errors.contains(&e) {
            self.errors.push(e);
        }
    }

    /// 1.36's hairpin masquerade (`masquerading` masquerades DNATed connections whose `saddr .
    /// daddr . proto . dport` is in `hairpin-connections`; the tracer does not run
    /// `nat-postrouting`, so the lookup is made here): the packet is `masq` when one of its
    /// destinations is its own source and the set holds that connection, as the 1.35 tracer
    /// set `masq` for the hairpin rule of any endpoint it walked.
    fn hairpin(&mut self) {
        let Some(table) = self.table else { return };
        let rules = dnat::hairpin_rules(table);
        let proto = self.packet.proto.name();
        let src = self.packet.src;
        let hit = self.outputs.iter().any(|o| {
            let port = o.rsplit_once(':').and_then(|(_, p)| p.parse::<u16>().ok());
            match (host_of(o), port) {
                (Some(ip), Some(port)) => {
                    ip == src
                        && rules
                            .iter()
                            .any(|h| dnat::set_holds_hairpin(table, h.set, ip, proto, port))
                }
                _ => false,
            }
        });
        self.masq |= hit;
    }

    /// `addressMatches`: the address against an IP or a CIDR.
    fn address_matches(ip: Option<IpAddr>, want: bool, rule: &Expr<'_>) -> Option<bool> {
        let ip = ip?;
        let hit = match rule {
            Expr::Addr(a) => *a == ip,
            Expr::Prefix(net, len) => prefix_contains(*net, *len, ip),
            _ => return None,
        };
        Some(hit == want)
    }

    /// `addressMatchesSet`: every member's result must equal `want`.
    fn address_matches_set(ip: Option<IpAddr>, want: bool, set: &[Element<'_>]) -> Option<bool> {
        for e in set {
            let hit = Self::address_matches(ip, true, &e.key)?;
            if hit != want {
                return Some(false);
            }
        }
        Some(true)
    }

    fn set_elements(&mut self, name: &str) -> &'r [Element<'a>] {
        match self.table.and_then(|t| t.set(name)) {
            Some(s) => &s.elements,
            None => {
                self.error(format!("unknown set or map {name:?}"));
                &[]
            }
        }
    }

    /// The first element whose leading key parts are `dest . proto . port` (and whose fourth,
    /// when `source` is asked for, contains the source).
    fn find_element(
        &self,
        elements: &'r [Element<'a>],
        with_dest: bool,
        with_source: bool,
    ) -> Option<&'r Element<'a>> {
        let proto = self.packet.proto.name();
        elements.iter().find(|e| {
            let parts = key_parts(&e.key);
            let mut parts = parts.iter();
            if with_dest {
                match (parts.next(), self.dst) {
                    (Some(Expr::Addr(a)), Some(d)) if *a == d => {}
                    _ => return false,
                }
            }
            let proto_ok = parts.next().and_then(protocol_of) == Some(proto);
            let port_ok =
                matches!(parts.next(), Some(Expr::Number(p)) if *p == u64::from(self.packet.dport));
            let source_ok = !with_source
                || parts.next().is_some_and(|k| {
                    Self::address_matches(Some(self.packet.src), true, k) == Some(true)
                });
            proto_ok && port_ok && source_ok
        })
    }

    fn statement(
        &mut self,
        stmts: &'r [Stmt<'a>],
        i: usize,
        at: &str,
        depth: usize,
    ) -> Result<Step<'r, 'a>, SimError> {
        let last = i + 1 == stmts.len();
        let holds = |b: Option<bool>| match b {
            Some(true) => Step::Holds,
            _ => Step::Abandon,
        };
        Ok(match &stmts[i] {
            Stmt::Counter(_) => Step::Holds,
            Stmt::Match { left, op, right } => {
                let eq = match op {
                    RelOp::Eq => true,
                    RelOp::Ne => false,
                    _ => return Ok(self.unmatched(at, stmts)),
                };
                match (left, right) {
                    (Expr::Payload { protocol, field }, _)
                        if is_ip(protocol) && matches!(&**field, "daddr" | "saddr") =>
                    {
                        let ip = if field == "daddr" {
                            self.dst
                        } else {
                            Some(self.packet.src)
                        };
                        match right {
                            Expr::SetRef(set) if eq && field == "daddr" => {
                                let elements = self.set_elements(set);
                                let hit = elements.iter().any(|e| {
                                    matches!(key_parts(&e.key).first(), Some(Expr::Addr(a)) if Some(*a) == self.dst)
                                });
                                holds(Some(hit))
                            }
                            Expr::Set(items) => holds(Self::address_matches_set(ip, eq, items)),
                            Expr::Addr(_) | Expr::Prefix(..) => {
                                holds(Self::address_matches(ip, eq, right))
                            }
                            _ => {
                                // The tracer reads `@set` as an address it cannot parse: a test
                                // error, and the rule does not match.
                                self.error(format!("bad IP/CIDR in kube-proxy output: {right}"));
                                Step::Abandon
                            }
                        }
                    }
                    (Expr::Concat(parts), Expr::SetRef(set)) if eq => {
                        let shape = concat_shape(parts);
                        let (with_dest, with_source) = match shape {
                            Some(s) => s,
                            None => return Ok(self.unmatched(at, stmts)),
                        };
                        let elements = self.set_elements(set);
                        holds(Some(
                            self.find_element(elements, with_dest, with_source)
                                .is_some(),
                        ))
                    }
                    (Expr::Fib { flags, result }, Expr::Symbol(t))
                        if eq && result == "type" && t == "local" && flags.len() == 1 =>
                    {
                        let ip = match &*flags[0] {
                            "daddr" => self.dst,
                            "saddr" => Some(self.packet.src),
                            _ => return Ok(self.unmatched(at, stmts)),
                        };
                        holds(Some(ip.is_some_and(|ip| self.local.contains(ip))))
                    }
                    (Expr::Payload { protocol, field }, Expr::Number(port))
                        if eq
                            && field == "dport"
                            && matches!(&**protocol, "tcp" | "udp" | "sctp") =>
                    {
                        holds(Some(
                            protocol == self.packet.proto.name()
                                && *port == u64::from(self.packet.dport),
                        ))
                    }
                    (Expr::Meta(key), proto)
                        if eq
                            && key == "l4proto"
                            && protocol_of(proto).is_some()
                            && i + 2 == stmts.len()
                            && matches!(&stmts[i + 1], Stmt::Nat(_)) =>
                    {
                        // `meta l4proto P dnat to X`: X is recorded, P is not checked. 1.36's
                        // `dnat … to numgen … map { k : A . P , … }` records every destination,
                        // as the tracer walks every arm of a numgen vmap.
                        match self
                            .table
                            .and_then(|t| dnat::dnat_pick(&stmts[i + 1], t))
                            .and_then(Result::ok)
                        {
                            Some(pick) if !pick.arms.is_empty() => {
                                self.matched.push(at.to_string());
                                self.outputs.extend(pick.arms.iter().map(|(t, _)| t.text()));
                                Step::Return(true)
                            }
                            _ => self.unmatched(at, stmts),
                        }
                    }
                    _ => self.unmatched(at, stmts),
                }
            }
            Stmt::Vmap { key, map } if last => match (key, map) {
                (Expr::Concat(parts), Expr::SetRef(name)) => {
                    let Some((with_dest, false)) = concat_shape(parts) else {
                        return Ok(self.unmatched(at, stmts));
                    };
                    let elements = self.set_elements(name);
                    match self.find_element(elements, with_dest, false).and_then(|e| {
                        match &e.value {
                            Some(Expr::Verdict(v)) => Some(v),
                            _ => None,
                        }
                    }) {
                        Some(v) => Step::Replace(v),
                        None => Step::Abandon,
                    }
                }
                (Expr::Numgen { mode, .. }, Expr::Set(arms)) if mode == "random" => {
                    for arm in arms {
                        if let Some(Expr::Verdict(Verdict::Goto(target))) = &arm.value {
                            self.matched.push(at.to_string());
                            // Every endpoint is walked; their results are not used.
                            self.run(target, depth + 1)?;
                        }
                    }
                    Step::Return(true)
                }
                _ => self.unmatched(at, stmts),
            },
            // 1.36's inline mark (`mark set mark or 0x4000`), the tracer's `jump
            // mark-for-masquerade`: the packet is marked, the rule goes on.
            s @ Stmt::Mangle { .. } if dnat::sets_mark(s, None) => {
                self.matched.push(at.to_string());
                self.masq = true;
                Step::Holds
            }
            Stmt::Verdict(v) if last => return self.verdict(v, at, depth),
            Stmt::Reject(_) if last => {
                self.matched.push(at.to_string());
                self.outputs.push("REJECT".to_string());
                Step::Return(true)
            }
            _ => self.unmatched(at, stmts),
        })
    }

    fn unmatched<'x>(&mut self, at: &str, stmts: &[Stmt<'_>]) -> Step<'x, 'a> {
        let text: Vec<String> = stmts.iter().map(ToString::to_string).collect();
        self.error(format!("unmatched rule ({at}): {}", text.join(" ")));
        Step::Abandon
    }

    fn verdict(
        &mut self,
        v: &Verdict<'_>,
        at: &str,
        depth: usize,
    ) -> Result<Step<'r, 'a>, SimError> {
        Ok(match v {
            Verdict::Jump(c) if c == kp::MARK_MASQ_CHAIN => {
                self.matched.push(at.to_string());
                self.masq = true;
                Step::Holds
            }
            Verdict::Jump(c) | Verdict::Goto(c) => {
                self.matched.push(at.to_string());
                if self.run(c, depth + 1)? {
                    Step::Return(true)
                } else if matches!(v, Verdict::Goto(_)) {
                    Step::Return(false)
                } else {
                    Step::Holds
                }
            }
            Verdict::Drop => {
                self.matched.push(at.to_string());
                self.outputs.push("DROP".to_string());
                Step::Return(true)
            }
            Verdict::Return => {
                self.matched.push(at.to_string());
                Step::Return(false)
            }
            _ => {
                self.error(format!("unmatched verdict ({at}): {v}"));
                Step::Abandon
            }
        })
    }

    /// `runChain`: true when a terminal statement ended the chain.
    fn run(&mut self, chain: &str, depth: usize) -> Result<bool, SimError> {
        if depth > MAX_DEPTH {
            return Err(SimError::TooDeep {
                chain: format!("{}/{chain}", kp::TABLE),
                depth: MAX_DEPTH,
            });
        }
        let Some(ch) = self.table.and_then(|t| t.chain(chain)) else {
            self.error(format!("unknown chain {chain:?}"));
            return Ok(true);
        };
        for (n, rule) in ch.rules.iter().enumerate() {
            let label = format!("{}/{chain}#{}", kp::TABLE, n + 1);
            let stmts = rule.stmts.as_slice();
            // A leading `ct state new` always holds (only new connections are traced).
            let start = usize::from(matches!(
                stmts.first(),
                Some(Stmt::Match { left: Expr::Ct { dir: None, key }, op: RelOp::Eq, right: Expr::Symbol(s) })
                    if key == "state" && s == "new"
            ));
            let mut i = start;
            while i < stmts.len() {
                self.steps += 1;
                if self.steps > MAX_STEPS {
                    return Err(SimError::TooManySteps { limit: MAX_STEPS });
                }
                match self.statement(stmts, i, &label, depth)? {
                    Step::Holds => i += 1,
                    Step::Abandon => break,
                    Step::Return(t) => return Ok(t),
                    Step::Replace(v) => match self.verdict(v, &label, depth)? {
                        Step::Return(t) => return Ok(t),
                        _ => break,
                    },
                }
            }
        }
        Ok(false)
    }
}

fn is_ip(protocol: &str) -> bool {
    matches!(protocol, "ip" | "ip6")
}

/// Which of the tracer's concatenations `parts` is: `(with destination, with source)` for
/// `ip daddr . meta l4proto . th dport [. ip saddr]`, `(false, false)` for `meta l4proto . th
/// dport`.
fn concat_shape(parts: &[Expr<'_>]) -> Option<(bool, bool)> {
    let is = |e: &Expr<'_>, want: &str| match e {
        Expr::Payload { protocol, field } => match want {
            "daddr" | "saddr" => is_ip(protocol) && field == want,
            _ => protocol == "th" && field == "dport",
        },
        Expr::Meta(k) => want == "l4proto" && k == "l4proto",
        _ => false,
    };
    match parts {
        [d, p, t] if is(d, "daddr") && is(p, "l4proto") && is(t, "dport") => Some((true, false)),
        [d, p, t, s] if is(d, "daddr") && is(p, "l4proto") && is(t, "dport") && is(s, "saddr") => {
            Some((true, true))
        }
        [p, t] if is(p, "l4proto") && is(t, "dport") => Some((false, false)),
        _ => None,
    }
}

/// True when `net/len` contains `ip`.
pub(super) fn prefix_contains(net: IpAddr, len: u8, ip: IpAddr) -> bool {
    match (net, ip) {
        (IpAddr::V4(n), IpAddr::V4(a)) => {
            let len = u32::from(len.min(32));
            let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
            u32::from(n) & mask == u32::from(a) & mask
        }
        (IpAddr::V6(n), IpAddr::V6(a)) => {
            let len = u32::from(len.min(128));
            let mask = if len == 0 {
                0
            } else {
                u128::MAX << (128 - len)
            };
            u128::from(n) & mask == u128::from(a) & mask
        }
        _ => false,
    }
}

/// Traces one packet as kube-proxy's nftables tests do, in the `kube-proxy` table of the
/// packet's family. `local` is the tracer's node IP list (exact membership, no loopback).
pub fn trace(
    rules: &Ruleset<'_>,
    packet: &PacketSpec,
    local: &LocalAddrs,
) -> Result<NftTestTrace, SimError> {
    let mut walk = Walk {
        table: table_for(rules, packet.dst),
        local,
        packet: *packet,
        dst: Some(packet.dst),
        outputs: Vec::new(),
        masq: false,
        matched: Vec::new(),
        errors: Vec::new(),
        steps: 0,
    };
    let [pre, nat, forward, input] = TRACER_CHAINS;
    if !walk.run(pre, 0)? {
        walk.run(nat, 0)?;
        if let Some(first) = walk.outputs.first().cloned() {
            walk.dst = host_of(&first);
            if walk.dst.is_none() {
                walk.error(format!("failed to parse host port {first:?}"));
            }
        }
        walk.hairpin();
        if !walk.run(forward, 0)? {
            walk.run(input, 0)?;
        }
    }
    Ok(NftTestTrace {
        trace: TestTrace {
            output: walk.outputs.join(", "),
            masq: walk.masq,
            matched: walk.matched,
        },
        errors: walk.errors,
    })
}

/// Go's `net.SplitHostPort` host of `ip:port` / `[ip6]:port`, parsed.
fn host_of(hostport: &str) -> Option<IpAddr> {
    let host = match hostport.strip_prefix('[') {
        Some(rest) => rest.split_once("]:")?.0,
        None => hostport.rsplit_once(':')?.0,
    };
    host.parse().ok()
}
