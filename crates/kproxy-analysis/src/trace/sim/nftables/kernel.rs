//! `--model kernel` on an nftables ruleset: the first packet of a new connection walked through
//! every base chain of its family (`ip` or `ip6` tables, and `inet` tables) by hook and priority,
//! statement by statement, as nf_tables evaluates them.
//!
//! The hooks are the iptables walk's ([`super::super::walk`]): arriving traffic runs
//! prerouting, then input (local destination after DNAT) or forward and postrouting;
//! node-originated traffic runs output and postrouting, and for a local destination the loopback
//! prerouting and input, where NAT chains no longer run (the connection's NAT is set up). At
//! one hook, base chains run in priority order (equal priorities: the chain made last first, as
//! the kernel inserts a new hook before those of equal priority); a NAT chain
//! runs only while no NAT of its kind happened yet (nf_nat stops at the first mapping), so
//! kube-proxy's `nat-prerouting` and an iptables-nft `table ip nat` `PREROUTING` both see the
//! packet until one of them DNATs it.
//!
//! Verdicts: `accept` ends the base chain (the next base chain at the hook runs), `drop` and
//! `reject` end the walk, `jump`/`goto`/`return`/`continue` as in nft, the end of a base chain
//! applies its policy. `dnat`, `snat`, `masquerade`, `redirect` rewrite the packet and end the
//! base chain. `numgen random mod N` splits the walk: a vmap on it gives each verdict the share
//! of values that select it, a match on it the share that matches. Marks persist along the walk;
//! conntrack state is `new` (status `dnat`/`snat` after NAT); sets hold their listed elements
//! (a live affinity set may hold the client) plus what `update @set` added earlier on the walk.
//! What cannot be known (interfaces not given, unmodelled statements, the `xt` extensions of
//! iptables-nft tables, whose parameters nft does not show) makes the rule not match, or the
//! target act without its parameters, with a note.

use super::super::SimError;
use super::super::outcome::{Distribution, Step, StepResult, StepRule, Verdict};
use super::super::walk::{At, BranchOf, ChainEnd, Flow, KernelInput, Model, Phase, Walk};
use super::eval::{self, Missing, Packet, Val};
use crate::graph::nftables::dnat::{self, DnatPick};
use crate::graph::nftables::{is_kube_proxy_table, layout};
use crate::parsers::nft::{
    Chain, Element, Expr, Family, Nat, NatKind, Policy, Rule, Ruleset, Stmt, Table,
    Verdict as NftVerdict,
};
use std::collections::HashMap;

/// The NAT kind a NAT chain at this stage sets up (`None`: NAT chains do not run).
fn nat_at(phase: Phase) -> Option<NatKind> {
    match phase {
        Phase::Prerouting | Phase::Output => Some(NatKind::Dnat),
        Phase::Input | Phase::Postrouting => Some(NatKind::Snat),
        _ => None,
    }
}

/// A base chain attached to a hook.
#[derive(Debug, Clone, Copy)]
struct Hooked {
    priority: i32,
    chain: ChainId,
    nat: bool,
}

/// A chain: its table's and its own index in the ruleset.
#[derive(Debug, Clone, Copy)]
struct ChainId {
    table: usize,
    chain: usize,
}

/// How a branch forked off in the middle of a rule goes on.
#[derive(Debug, Clone)]
enum Resume<'d> {
    /// Apply this verdict of the rule (a numgen vmap arm), at `here`.
    Verdict(&'d NftVerdict<'d>, String),
}

/// What a branch of the nftables walk keeps besides the packet.
#[derive(Debug, Clone, Default)]
struct State<'d> {
    /// Elements `update @set` added on this walk: (table, set, value).
    added: Vec<(usize, &'d str, Val)>,
    resume: Option<Resume<'d>>,
}

/// An nftables ruleset as the walk reads it: the tables of the packet's family, and the base
/// chains of each hook in the order they run.
struct Nftables<'d> {
    rules: &'d Ruleset<'d>,
    chains: HashMap<(usize, &'d str), usize>,
    hooks: HashMap<&'static str, Vec<Hooked>>,
}

/// A branch of the nftables walk.
type Branch<'d> = BranchOf<'d, 'd, Nftables<'d>>;
/// The nftables walk in progress.
type Walker<'w, 'd> = Walk<'w, 'd, 'd, Nftables<'d>>;

/// Walks `input.packet` through every base chain of `rules` that sees it and returns every
/// outcome, as [`super::super::iptables::kernel::simulate`] does for iptables.
pub fn simulate<'d>(
    rules: &'d Ruleset<'_>,
    input: &KernelInput,
) -> Result<Distribution<'d, 'd>, SimError> {
    let rules: &'d Ruleset<'d> = rules;
    let v4 = input.packet.dst.is_ipv4();
    let tables: Vec<usize> = rules
        .tables
        .iter()
        .enumerate()
        .filter(|(_, t)| match t.family {
            Family::Ip => v4,
            Family::Ip6 => !v4,
            Family::Inet => true,
            _ => false,
        })
        .map(|(i, _)| i)
        .collect();
    let mut chains = HashMap::new();
    let mut hooks: HashMap<&'static str, Vec<Hooked>> = HashMap::new();
    for &ti in &tables {
        for (ci, c) in rules.tables[ti].chains.iter().enumerate() {
            chains.insert((ti, &*c.name), ci);
            let Some(base) = &c.base else { continue };
            let hook = match &*base.hook {
                "prerouting" => "prerouting",
                "input" => "input",
                "forward" => "forward",
                "output" => "output",
                "postrouting" => "postrouting",
                _ => continue,
            };
            hooks.entry(hook).or_default().push(Hooked {
                priority: base.priority,
                chain: ChainId {
                    table: ti,
                    chain: ci,
                },
                nat: base.kind == "nat",
            });
        }
    }
    // At equal priority the kernel runs the chain registered last first (nf_hook_entries_grow
    // inserts a hook before the first one of equal or higher priority); a listing shows tables
    // and chains in the order they were made, so: reverse listing order.
    for list in hooks.values_mut() {
        list.sort_by_key(|h| {
            (
                h.priority,
                std::cmp::Reverse(h.chain.table),
                std::cmp::Reverse(h.chain.chain),
            )
        });
    }
    let mut walk = Walk::new(input);
    if tables.is_empty() {
        walk.note(format!(
            "the ruleset has no table of the packet's family ({}, inet): nothing filters or rewrites it",
            if v4 { "ip" } else { "ip6" }
        ));
    }
    let model = Nftables {
        rules,
        chains,
        hooks,
    };
    walk.run(&model, State::default())
}

impl<'d> Model<'d, 'd> for Nftables<'d> {
    type Chain = ChainId;
    type Rule = &'d Rule<'d>;
    type State = State<'d>;

    /// The next base chain of the branch's hook that sees the packet.
    fn next_base(&self, b: &mut Branch<'d>) -> Option<ChainId> {
        let list = self.hooks.get(b.phase.hook())?;
        while let Some(h) = list.get(b.base).copied() {
            b.base += 1;
            if h.nat {
                let runs = match nat_at(b.phase) {
                    Some(NatKind::Dnat) => !b.ct.dnat,
                    Some(_) => !b.ct.snat,
                    None => false,
                };
                if !runs {
                    continue;
                }
            }
            return Some(h.chain);
        }
        None
    }

    fn rule_at(&self, f: ChainId, index: usize) -> At<&'d Rule<'d>> {
        self.chain(f).rules.get(index).map_or(At::End, At::Rule)
    }

    fn chain_end(&self, f: ChainId) -> ChainEnd<'d> {
        let chain = self.chain(f);
        let drop = chain
            .base
            .as_ref()
            .is_some_and(|base| base.policy == Some(Policy::Drop));
        ChainEnd {
            table: &self.table(f.table).name,
            chain: &chain.name,
            policy: if drop { "drop" } else { "accept" },
            drop,
            shown: !chain.rules.is_empty() || drop,
            filter: self.is_filter(f),
        }
    }

    /// Evaluates rule `number` of chain `f`, statement by statement.
    // Inlined into the walk's loop, which calls it once per rule.
    #[inline]
    fn eval(
        &self,
        w: &mut Walker<'_, 'd>,
        b: &mut Branch<'d>,
        f: ChainId,
        rule: &'d Rule<'d>,
        number: usize,
    ) -> Result<Flow<'d, 'd>, SimError> {
        let table: &'d Table<'d> = self.table(f.table);
        let chain: &'d Chain<'d> = self.chain(f);
        let here = format!("{}/{}#{number}", table.name, chain.name);
        let step = |result| Step {
            table: &table.name,
            chain: &chain.name,
            number,
            result,
            rule: Some(StepRule::Nft(rule)),
            policy: None,
        };
        let mut random: Option<f64> = None;
        let kube_proxy = is_kube_proxy_table(table);
        for (at, stmt) in rule.stmts.iter().enumerate() {
            let skip =
                |w: &mut Walker<'_, 'd>, b: &mut Branch<'d>, undecidable: Option<&'static str>| {
                    if let Some(why) = undecidable {
                        w.note(format!("`{stmt}` ({here}): {why}; taken as not matching"));
                    }
                    b.path.push(step(StepResult::Skipped { at, undecidable }));
                    Ok(Flow::Next)
                };
            if kube_proxy && !layout::known_statement(stmt) {
                // kube-proxy's own rule, in a form this build does not know: nothing past it
                // is concluded (neither "no DNAT" nor any verdict).
                w.note(format!(
                    "{here}: `{stmt}` is a statement of kube-proxy's table this build does not know (the node's kube-proxy may be newer than this build): the outcome past it is unknown"
                ));
                b.path.push(step(StepResult::Skipped {
                    at,
                    undecidable: Some(UNKNOWN_STATEMENT),
                }));
                return Ok(Flow::Done(b.finish(Verdict::Unknown, Some(here))));
            }
            match stmt {
                Stmt::Counter(_) | Stmt::NamedCounter(_) | Stmt::Log(_) => {}
                Stmt::Match { left, op, right } => {
                    if let Expr::Numgen {
                        mode,
                        modulus,
                        offset,
                    } = left
                    {
                        if mode != "random" {
                            return skip(w, b, Some("numgen inc depends on earlier packets"));
                        }
                        let hits = (0..*modulus)
                            .filter(|k| {
                                eval::compare(&Val::Num(u64::from(k + offset)), *op, right)
                                    .unwrap_or(false)
                            })
                            .count();
                        let p = hits as f64 / f64::from((*modulus).max(1));
                        if p <= 0.0 {
                            return skip(w, b, None);
                        }
                        if p < 1.0 {
                            let mut other = b.clone();
                            other.probability *= 1.0 - p;
                            other.path.push(step(StepResult::SkippedRandom(1.0 - p)));
                            w.defer(other);
                            b.probability *= p;
                            random = Some(random.unwrap_or(1.0) * p);
                        }
                        continue;
                    }
                    let packet = packet(w, b);
                    let v = match eval::value(left, &packet) {
                        Ok(v) => v,
                        Err(Missing::NotThisPacket) => return skip(w, b, None),
                        Err(Missing::Undecidable(why)) => return skip(w, b, Some(why)),
                    };
                    let holds = match right {
                        Expr::SetRef(name) => self
                            .lookup(f.table, name, &v)
                            .map(|e| e.is_some() || self.added(b, f.table, name, &v))
                            .map(|found| (*op == crate::parsers::nft::RelOp::Ne) != found),
                        _ => eval::compare(&v, *op, right),
                    };
                    match holds {
                        Ok(true) => {}
                        Ok(false) => return skip(w, b, None),
                        Err(why) => return skip(w, b, Some(why)),
                    }
                }
                Stmt::Mangle { key, value } => match key {
                    Expr::Meta(k) if k == "mark" => match eval::value(value, &packet(w, b)) {
                        Ok(Val::Num(n)) => b.mark = n as u32,
                        _ => w.note(format!("{here}: the new mark is not known; kept")),
                    },
                    _ => w.note(format!("{here}: `{stmt}` is not modelled; ignored")),
                },
                Stmt::SetUpdate { op, set, elem } => {
                    let key = match elem {
                        Expr::Set(items) => items.first().map(|e| &e.key),
                        other => Some(other),
                    };
                    match key.map(|k| eval::value(k, &packet(w, b))) {
                        Some(Ok(v)) if op == "delete" => b
                            .state
                            .added
                            .retain(|(t, s, x)| !(*t == f.table && s == set && *x == v)),
                        Some(Ok(v)) => b.state.added.push((f.table, set, v)),
                        _ => w.note(format!("{here}: `{stmt}`: the element is not known")),
                    }
                }
                Stmt::Vmap { key, map } => {
                    let elements: &'d [Element<'d>] = match map {
                        Expr::Set(items) => items,
                        Expr::SetRef(name) => match table.set(name) {
                            Some(s) => &s.elements,
                            None => return skip(w, b, Some("a map the table does not have")),
                        },
                        _ => return skip(w, b, Some("a map kproxy does not model")),
                    };
                    if let Expr::Numgen {
                        mode,
                        modulus,
                        offset,
                    } = key
                    {
                        if mode != "random" {
                            return skip(w, b, Some("numgen inc depends on earlier packets"));
                        }
                        return self.numgen_vmap(
                            w, b, f, rule, number, elements, *modulus, *offset, random,
                        );
                    }
                    let v = match eval::value(key, &packet(w, b)) {
                        Ok(v) => v,
                        Err(Missing::NotThisPacket) => return skip(w, b, None),
                        Err(Missing::Undecidable(why)) => return skip(w, b, Some(why)),
                    };
                    let verdict = match eval::find(&v, elements) {
                        Ok(Some(Element {
                            value: Some(Expr::Verdict(v)),
                            ..
                        })) => v,
                        Ok(_) => return skip(w, b, None),
                        Err(why) => return skip(w, b, Some(why)),
                    };
                    b.path.push(step(matched(random)));
                    return self.verdict(w, b, verdict, here);
                }
                Stmt::Verdict(v) => {
                    b.path.push(step(matched(random)));
                    return self.verdict(w, b, v, here);
                }
                // nft refuses a port above 65535 (`Value … exceeds valid range`): such a rule
                // was never loaded, and read on it would keep the packet's port.
                Stmt::Nat(nat) if matches!(nat.port, Some(Expr::Number(p)) if u16::try_from(p).is_err()) =>
                {
                    return skip(
                        w,
                        b,
                        Some("its port is above 65535, which nft refuses to load"),
                    );
                }
                Stmt::Nat(nat) => {
                    if matches!(nat.addr, Some(Expr::Map { .. }))
                        && let Some(Ok(pick)) = dnat::dnat_pick(stmt, table)
                    {
                        return Ok(self.numgen_dnat(w, b, f, rule, number, &pick, random));
                    }
                    b.path.push(step(matched(random)));
                    self.nat(w, b, nat, &here);
                    b.stack.clear();
                    return Ok(Flow::Next);
                }
                Stmt::Reject(_) => {
                    b.path.push(step(matched(random)));
                    return Ok(Flow::Done(b.finish(Verdict::Reject, Some(here))));
                }
                Stmt::Xt { kind, name } if kind == "target" => {
                    b.path.push(step(matched(random)));
                    return self.xt_target(w, b, name, here);
                }
                Stmt::Xt { name, .. } => {
                    let why = "an iptables-nft extension whose parameters nft does not show (read this table with iptables-save)";
                    w.note(format!("{here}: xt match {name}: {why}"));
                    return skip(w, b, Some("an iptables-nft match nft does not show"));
                }
                Stmt::Verbatim(_) => {
                    return skip(w, b, Some("a statement kproxy does not model"));
                }
            }
        }
        b.path.push(step(matched(random)));
        Ok(Flow::Next)
    }

    fn resume(&self, w: &mut Walker<'_, 'd>, b: &mut Branch<'d>) -> Result<Flow<'d, 'd>, SimError> {
        match b.state.resume.take() {
            Some(Resume::Verdict(v, here)) => self.verdict(w, b, v, here),
            None => Ok(Flow::Next),
        }
    }
}

/// The packet as the rules see it now.
fn packet<'s, 'd>(w: &'s Walker<'_, 'd>, b: &Branch<'d>) -> Packet<'s> {
    let (in_iface, out_iface) = w.interfaces(b);
    Packet {
        src: b.src,
        sport: w.input.packet.sport,
        dst: b.dst,
        dport: b.dport,
        proto: w.input.packet.proto,
        mark: b.mark,
        ct_dnat: b.ct.dnat,
        ct_snat: b.ct.snat,
        in_iface,
        out_iface,
        local: &w.input.local,
    }
}

impl<'d> Nftables<'d> {
    fn table(&self, ti: usize) -> &'d Table<'d> {
        &self.rules.tables[ti]
    }

    fn chain(&self, f: ChainId) -> &'d Chain<'d> {
        &self.rules.tables[f.table].chains[f.chain]
    }

    fn is_filter(&self, base: ChainId) -> bool {
        self.chain(base)
            .base
            .as_ref()
            .is_some_and(|b| b.kind == "filter")
    }

    /// The element of named set `name` in table `ti` that holds `v`.
    fn lookup(
        &self,
        ti: usize,
        name: &str,
        v: &Val,
    ) -> Result<Option<&'d Element<'d>>, &'static str> {
        let Some(set) = self.table(ti).set(name) else {
            return Err("a set the table does not have");
        };
        eval::find(v, &set.elements)
    }

    /// Whether `update @name` added `v` earlier on this walk.
    fn added(&self, b: &Branch<'d>, ti: usize, name: &str, v: &Val) -> bool {
        b.state
            .added
            .iter()
            .any(|(t, s, x)| *t == ti && *s == name && x == v)
    }

    /// `numgen random mod N [offset M] vmap { … }`: one branch per verdict, with the share of
    /// the N values that select it; values without an element leave the rule unmatched.
    #[allow(clippy::too_many_arguments)]
    fn numgen_vmap(
        &self,
        w: &mut Walker<'_, 'd>,
        b: &mut Branch<'d>,
        f: ChainId,
        rule: &'d Rule<'d>,
        number: usize,
        elements: &'d [Element<'d>],
        modulus: u32,
        offset: u32,
        random: Option<f64>,
    ) -> Result<Flow<'d, 'd>, SimError> {
        let table: &'d Table<'d> = self.table(f.table);
        let chain: &'d Chain<'d> = self.chain(f);
        let here = format!("{}/{}#{number}", table.name, chain.name);
        // (the verdict of the value's element, or None for no element; number of values).
        // Elements with the same verdict (several keys to one endpoint) are one branch.
        let mut arms: Vec<(Option<&'d NftVerdict<'d>>, u32)> = Vec::new();
        for k in 0..modulus {
            let v = Val::Num(u64::from(k) + u64::from(offset));
            let hit = elements
                .iter()
                .find(|e| eval::matches_const(&v, &e.key).unwrap_or(false))
                .and_then(|e| match &e.value {
                    Some(Expr::Verdict(v)) => Some(v),
                    _ => None,
                });
            match arms.iter_mut().find(|(e, _)| *e == hit) {
                Some((_, n)) => *n += 1,
                None => arms.push((hit, 1)),
            }
        }
        let n = f64::from(modulus.max(1));
        let base = b.clone();
        let mut first: Option<(f64, Option<&'d NftVerdict<'d>>)> = None;
        for (verdict, count) in arms {
            let p = f64::from(count) / n;
            if first.is_none() {
                first = Some((p, verdict));
                continue;
            }
            let mut other = base.clone();
            other.probability *= p;
            let whole = random.unwrap_or(1.0) * p;
            let step = Step {
                table: &table.name,
                chain: &chain.name,
                number,
                result: match verdict {
                    Some(_) => StepResult::MatchedRandom(whole),
                    None => StepResult::SkippedRandom(whole),
                },
                rule: Some(StepRule::Nft(rule)),
                policy: None,
            };
            other.path.push(step);
            other.state.resume = verdict.map(|v| Resume::Verdict(v, here.clone()));
            w.defer(other);
        }
        let Some((p, verdict)) = first else {
            return Ok(Flow::Next);
        };
        b.probability *= p;
        let whole = random.unwrap_or(1.0) * p;
        b.path.push(Step {
            table: &table.name,
            chain: &chain.name,
            number,
            result: match verdict {
                Some(_) if whole < 1.0 => StepResult::MatchedRandom(whole),
                Some(_) => StepResult::Matched,
                None => StepResult::SkippedRandom(whole),
            },
            rule: Some(StepRule::Nft(rule)),
            policy: None,
        });
        match verdict {
            Some(v) => self.verdict(w, b, v, here),
            None => Ok(Flow::Next),
        }
    }

    /// `dnat … to numgen random mod N map { k : ADDR . PORT , … }`: one branch per destination,
    /// with the share of the N values that pick it (each DNATed, which ends the base chain);
    /// values without a map entry leave the rule unmatched (the lookup fails).
    #[allow(clippy::too_many_arguments)]
    fn numgen_dnat(
        &self,
        w: &mut Walker<'_, 'd>,
        b: &mut Branch<'d>,
        f: ChainId,
        rule: &'d Rule<'d>,
        number: usize,
        pick: &DnatPick,
        random: Option<f64>,
    ) -> Flow<'d, 'd> {
        let table: &'d Table<'d> = self.table(f.table);
        let chain: &'d Chain<'d> = self.chain(f);
        let step = |result| Step {
            table: &table.name,
            chain: &chain.name,
            number,
            result,
            rule: Some(StepRule::Nft(rule)),
            policy: None,
        };
        let base = b.clone();
        let mut first = true;
        for (target, keys) in &pick.arms {
            let p = pick.share(*keys);
            let whole = random.unwrap_or(1.0) * p;
            let result = if whole < 1.0 {
                StepResult::MatchedRandom(whole)
            } else {
                StepResult::Matched
            };
            let mut arm = if first { b.clone() } else { base.clone() };
            arm.probability = base.probability * p;
            arm.path.push(step(result));
            arm.dnat_to(target.ip, target.port);
            arm.stack.clear();
            if first {
                *b = arm;
                first = false;
            } else {
                w.defer(arm);
            }
        }
        if !pick.missing.is_empty() {
            let p = pick.share(u32::try_from(pick.missing.len()).unwrap_or(u32::MAX));
            let mut other = base.clone();
            other.probability = base.probability * p;
            other
                .path
                .push(step(StepResult::SkippedRandom(random.unwrap_or(1.0) * p)));
            if first {
                *b = other;
            } else {
                w.defer(other);
            }
        }
        Flow::Next
    }

    /// Applies a verdict at `here` (`table/chain#n`).
    fn verdict(
        &self,
        w: &mut Walker<'_, 'd>,
        b: &mut Branch<'d>,
        v: &'d NftVerdict<'d>,
        here: String,
    ) -> Result<Flow<'d, 'd>, SimError> {
        let Some(&top) = b.stack.last() else {
            return Ok(Flow::Next);
        };
        let base = b.stack[0].chain;
        let top = top.chain;
        match v {
            NftVerdict::Accept => b.accept(here, self.is_filter(base)),
            NftVerdict::Drop => {
                return Ok(Flow::Done(b.finish(Verdict::Drop, Some(here))));
            }
            NftVerdict::Continue => {}
            NftVerdict::Return => b.leave(),
            NftVerdict::Jump(target) | NftVerdict::Goto(target) => {
                let table: &'d Table<'d> = self.table(top.table);
                let Some(&ci) = self.chains.get(&(top.table, &**target)) else {
                    w.note(format!(
                        "{here} goes to {target}, which table {} does not have; ignored",
                        table.name
                    ));
                    return Ok(Flow::Next);
                };
                if is_kube_proxy_table(table) && !layout::known_chain(target) {
                    w.note(format!(
                        "{here} goes to {target}, a chain of kube-proxy's table this build does not know (the node's kube-proxy may be newer than this build): the outcome past it is unknown"
                    ));
                    return Ok(Flow::Done(b.finish(Verdict::Unknown, Some(here))));
                }
                let chain = ChainId {
                    table: top.table,
                    chain: ci,
                };
                let name: &'d str = &table.chains[ci].name;
                b.enter(chain, &table.name, name, matches!(v, NftVerdict::Goto(_)))?;
            }
        }
        Ok(Flow::Next)
    }

    /// Applies a NAT statement (which ends the base chain).
    fn nat(&self, w: &mut Walker<'_, 'd>, b: &mut Branch<'d>, nat: &Nat<'d>, here: &str) {
        match nat.kind {
            NatKind::Dnat => {
                let packet = packet(w, b);
                let (addr, port) = match &nat.addr {
                    Some(Expr::Addr(a)) => (Some(*a), None),
                    Some(Expr::Map { key, map }) => match self.map_value(b, key, map, &packet) {
                        Some(Val::Ip(a)) => (Some(a), None),
                        Some(Val::Tuple(t)) => match t.as_slice() {
                            [Val::Ip(a), Val::Num(p)] => match u16::try_from(*p) {
                                Ok(p) => (Some(*a), Some(p)),
                                Err(_) => {
                                    w.note(format!(
                                        "{here}: the map gives port {p}, above 65535, which nft refuses to load; not applied"
                                    ));
                                    return;
                                }
                            },
                            _ => (None, None),
                        },
                        _ => (None, None),
                    },
                    _ => (None, None),
                };
                let port = match &nat.port {
                    Some(Expr::Number(p)) => u16::try_from(*p).ok(),
                    _ => port,
                };
                if addr.is_none() {
                    w.note(format!(
                        "{here}: the DNAT address is not known; the destination is kept"
                    ));
                }
                let dst = addr.unwrap_or(b.dst);
                b.dnat_to(dst, port);
            }
            NatKind::Snat => {
                match &nat.addr {
                    Some(Expr::Addr(a)) => {
                        b.src = *a;
                        b.snat = Some(*a);
                    }
                    _ => w.note(format!("{here}: the SNAT address is not known")),
                }
                b.ct.snat = true;
            }
            NatKind::Masquerade => {
                w.masquerade(b, here, "masquerade");
            }
            NatKind::Redirect => {
                b.dst = w.redirect_address(b.dst);
                if let Some(Expr::Number(p)) = &nat.port {
                    b.dport = u16::try_from(*p).unwrap_or(b.dport);
                }
                b.dnat = Some((b.dst, b.dport));
                b.ct.dnat = true;
            }
        }
    }

    /// The value `key map { … }` / `key map @m` gives the packet.
    fn map_value(
        &self,
        b: &Branch<'d>,
        key: &Expr<'d>,
        map: &Expr<'d>,
        packet: &Packet<'_>,
    ) -> Option<Val> {
        let k = eval::value(key, packet).ok()?;
        let elements: &[Element<'d>] = match map {
            Expr::Set(items) => items,
            Expr::SetRef(name) => {
                let top = b.stack.last()?.chain;
                &self.table(top.table).set(name)?.elements
            }
            _ => return None,
        };
        let e = eval::find(&k, elements).ok()??;
        eval::value(e.value.as_ref()?, packet).ok()
    }

    /// An iptables-nft `xt target NAME`: what it does, without the parameters nft hides.
    fn xt_target(
        &self,
        w: &mut Walker<'_, 'd>,
        b: &mut Branch<'d>,
        name: &str,
        here: String,
    ) -> Result<Flow<'d, 'd>, SimError> {
        let hidden = "nft does not show its parameters; read this table with iptables-save";
        match name {
            "ACCEPT" => return self.verdict(w, b, &NftVerdict::Accept, here),
            "DROP" => {
                return Ok(Flow::Done(b.finish(Verdict::Drop, Some(here))));
            }
            "REJECT" => {
                return Ok(Flow::Done(b.finish(Verdict::Reject, Some(here))));
            }
            "RETURN" => return self.verdict(w, b, &NftVerdict::Return, here),
            "DNAT" | "REDIRECT" => {
                w.note(format!(
                    "{here}: xt target {name}: the new destination is not known ({hidden})"
                ));
                b.ct.dnat = true;
                b.stack.clear();
            }
            "MASQUERADE" => {
                w.masquerade(b, &here, "masquerade");
                b.stack.clear();
            }
            "SNAT" => {
                w.note(format!(
                    "{here}: xt target SNAT: the new source is not known ({hidden})"
                ));
                b.ct.snat = true;
                b.stack.clear();
            }
            other => w.note(format!(
                "{here}: xt target {other}: not modelled ({hidden}); the walk goes on"
            )),
        }
        Ok(Flow::Next)
    }
}

/// Why a walk stops at a statement of kube-proxy's this build does not know.
const UNKNOWN_STATEMENT: &str = "a statement of kube-proxy's table this build does not know";

fn matched(random: Option<f64>) -> StepResult {
    match random {
        Some(p) => StepResult::MatchedRandom(p),
        None => StepResult::Matched,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::nft::{ParseOptions, parse};
    use crate::trace::sim::{LocalAddrs, Origin, PacketSpec, Route};

    fn run(
        text: &'static str,
        packet: &str,
        origin: Origin,
    ) -> Result<Distribution<'static, 'static>, SimError> {
        let rs: &'static Ruleset<'static> =
            Box::leak(Box::new(parse(text, &ParseOptions::strict()).unwrap()));
        let input = KernelInput {
            packet: packet.parse::<PacketSpec>().unwrap(),
            origin,
            local: LocalAddrs::kernel(vec!["192.168.1.2".parse().unwrap()]),
            in_iface: None,
            out_iface: None,
        };
        let input: &'static KernelInput = Box::leak(Box::new(input));
        simulate(rs, input)
    }

    #[test]
    fn a_dnat_to_a_port_nft_refuses_is_not_applied_and_said() {
        let d = run(
            "table ip t {\n chain pre {\n  type nat hook prerouting priority dstnat; policy accept;\n  ip daddr 10.96.0.1 tcp dport 80 dnat to 10.244.0.5:70000\n  ip daddr 10.96.0.1 tcp dport 80 dnat to 10.244.0.6:8080\n }\n}\n",
            "10.1.1.1->10.96.0.1:80/tcp",
            Origin::External,
        )
        .unwrap();
        assert_eq!(
            rows(&d),
            [(1.0, Some("10.244.0.6:8080".into()), Verdict::Accept, false)]
        );
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("dnat to 10.244.0.5:70000") && n.contains("above 65535")),
            "{:?}",
            d.notes
        );
    }

    /// (probability, DNAT, verdict, masquerade) per outcome.
    fn rows(d: &Distribution<'_, '_>) -> Vec<(f64, Option<String>, Verdict, bool)> {
        d.outcomes
            .iter()
            .map(|o| {
                (
                    o.probability,
                    o.dnat.map(|(ip, p)| format!("{ip}:{p}")),
                    o.verdict,
                    o.masquerade,
                )
            })
            .collect()
    }

    /// A kube-proxy-shaped table with one service of three endpoints (one numgen value left
    /// out, so its share leaks), the masquerade mark, and an iptables-nft `table ip nat` that
    /// DNATs one address first.
    const RULESET: &str = r#"table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.10 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80, 10.96.0.99 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80 }
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}
	chain filter-forward {
		type filter hook forward priority filter; policy accept;
		ip daddr 10.244.3.3 drop
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
	chain mark-for-masquerade {
		meta mark set meta mark | 0x00004000
	}
	chain masquerading {
		meta mark & 0x00004000 == 0x00000000 return
		meta mark set meta mark ^ 0x00004000
		masquerade fully-random
	}
	chain service-ULMVA6XW-ns1/svc1/tcp/p80 {
		ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		numgen random mod 4 vmap { 0 : goto endpoint-AAAAAAAA-ns1/svc1/tcp/p80__10.244.1.1/8080, 1 : goto endpoint-AAAAAAAA-ns1/svc1/tcp/p80__10.244.1.1/8080, 2 : goto endpoint-BBBBBBBB-ns1/svc1/tcp/p80__10.244.3.3/8080 }
	}
	chain endpoint-AAAAAAAA-ns1/svc1/tcp/p80__10.244.1.1/8080 {
		meta l4proto tcp dnat to 10.244.1.1:8080
	}
	chain endpoint-BBBBBBBB-ns1/svc1/tcp/p80__10.244.3.3/8080 {
		meta l4proto tcp dnat to 10.244.3.3:8080
	}
}
# Warning: table ip nat is managed by iptables-nft, do not touch!
table ip nat {
	chain PREROUTING {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr 10.96.0.99 tcp dport 80 counter packets 0 bytes 0 jump HOSTPORT
	}
	chain HOSTPORT {
		ip protocol tcp counter packets 0 bytes 0 dnat to 10.244.9.9:8080
	}
}
"#;

    #[test]
    fn numgen_splits_marks_masquerade_and_forward_drops() {
        let d = run(RULESET, "192.168.1.9->10.96.0.10:80/tcp", Origin::External).unwrap();
        assert_eq!(
            rows(&d),
            [
                (
                    0.5,
                    Some("10.244.1.1:8080".to_string()),
                    Verdict::Accept,
                    true
                ),
                (
                    0.25,
                    Some("10.244.3.3:8080".to_string()),
                    Verdict::Drop,
                    false
                ),
                // No DNAT, but marked: forwarded and masqueraded like any marked packet.
                (0.25, None, Verdict::Accept, true),
            ]
        );
        // Masqueraded to the node address on the way out; the mark is cleared.
        assert_eq!(d.outcomes[0].snat, Some("192.168.1.2".parse().unwrap()));
        assert_eq!(d.outcomes[0].mark, 0);
        // From inside the pod network: not marked, not masqueraded.
        let d = run(RULESET, "10.244.5.5->10.96.0.10:80/tcp", Origin::Pod).unwrap();
        assert!(d.outcomes.iter().all(|o| !o.masquerade));
    }

    /// kube-proxy 1.36's layout: the service chain DNATs through a numgen map; the endpoint
    /// reaching itself is masqueraded by the `hairpin-connections` lookup in postrouting.
    const G4: &str = r#"table ip kube-proxy {
	set cluster-ips {
		type ipv4_addr
		elements = { 10.96.0.10 }
	}
	set hairpin-connections {
		type ipv4_addr . ipv4_addr . inet_proto . inet_service
		elements = { 10.244.1.1 . 10.244.1.1 . tcp . 8080 }
	}
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.10 . tcp . 80 : goto service-ULMVA6XW-ns1/svc1/tcp/p80, 10.96.0.11 . tcp . 80 : goto service-42NFTM6N-ns2/svc2/tcp/p80 }
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		jump masquerading
	}
	chain services {
		ip daddr @cluster-ips ip saddr != 10.244.0.0/16 meta mark set meta mark | 0x00004000
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
	chain masquerading {
		meta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random
		ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
	}
	chain service-ULMVA6XW-ns1/svc1/tcp/p80 {
		meta l4proto tcp dnat ip to numgen random mod 4 map { 0 : 10.244.1.1 . 8080, 1-2 : 10.244.2.2 . 8080 }
	}
	chain service-42NFTM6N-ns2/svc2/tcp/p80 {
		meta l4proto tcp ct mark set 0x1 dnat to 10.244.3.3:8080
	}
}
"#;

    #[test]
    fn numgen_dnat_maps_hairpin_and_unknown_statements() {
        let d = run(G4, "192.168.1.9->10.96.0.10:80/tcp", Origin::External).unwrap();
        assert_eq!(
            rows(&d),
            [
                (
                    0.25,
                    Some("10.244.1.1:8080".to_string()),
                    Verdict::Accept,
                    true
                ),
                (
                    0.5,
                    Some("10.244.2.2:8080".to_string()),
                    Verdict::Accept,
                    true
                ),
                // Value 3 has no map entry: the rule does not match, no DNAT (still marked).
                (0.25, None, Verdict::Accept, true),
            ]
        );
        // The pod reaching itself through its service: masqueraded by the hairpin lookup only.
        let d = run(G4, "10.244.1.1->10.96.0.10:80/tcp", Origin::Pod).unwrap();
        let masq: Vec<(Option<String>, bool)> = rows(&d).into_iter().map(|r| (r.1, r.3)).collect();
        assert_eq!(
            masq,
            [
                (Some("10.244.1.1:8080".to_string()), true),
                (Some("10.244.2.2:8080".to_string()), false),
                (None, false),
            ]
        );
        // A statement of kube-proxy's table this build does not know: unknown, never "no DNAT".
        let d = run(G4, "192.168.1.9->10.96.0.11:80/tcp", Origin::External).unwrap();
        assert_eq!(d.outcomes.len(), 1);
        assert_eq!(d.outcomes[0].verdict, Verdict::Unknown);
        assert_eq!(
            d.outcomes[0].decided_by.as_deref(),
            Some("kube-proxy/service-42NFTM6N-ns2/svc2/tcp/p80#1")
        );
        assert!(
            d.notes
                .iter()
                .any(|n| n.contains("`ct mark set 1`") && n.contains("may be newer")),
            "{:?}",
            d.notes
        );
    }

    #[test]
    fn a_nat_chain_that_dnats_first_ends_nat_at_the_hook() {
        // The iptables-nft chain is made (listed) after kube-proxy's at the same priority, so it
        // runs first: it DNATs, kube-proxy's nat-prerouting does not run.
        let d = run(RULESET, "192.168.1.9->10.96.0.99:80/tcp", Origin::External).unwrap();
        assert_eq!(
            rows(&d),
            [(
                1.0,
                Some("10.244.9.9:8080".to_string()),
                Verdict::Accept,
                false
            )]
        );
        assert!(
            d.outcomes[0]
                .path
                .iter()
                .all(|s| s.chain != "nat-prerouting"),
            "{:?}",
            d.outcomes[0].path
        );
    }

    #[test]
    fn priorities_order_base_chains_across_tables_and_policies_apply() {
        let text = r#"table inet late {
	chain fwd {
		type filter hook forward priority 10; policy drop;
		tcp dport 80 accept
	}
}
table ip early {
	chain fwd {
		type filter hook forward priority -10; policy accept;
		ip saddr 192.168.1.66 reject
	}
}
"#;
        let d = run(text, "192.168.1.66->10.0.0.1:80/tcp", Origin::External).unwrap();
        assert_eq!(d.outcomes[0].verdict, Verdict::Reject);
        assert_eq!(d.outcomes[0].decided_by.as_deref(), Some("early/fwd#1"));
        let d = run(text, "192.168.1.9->10.0.0.1:81/tcp", Origin::External).unwrap();
        assert_eq!(d.outcomes[0].verdict, Verdict::Drop);
        assert_eq!(
            d.outcomes[0].decided_by.as_deref(),
            Some("late/fwd policy drop")
        );
        let d = run(text, "192.168.1.9->10.0.0.1:80/tcp", Origin::External).unwrap();
        assert_eq!(d.outcomes[0].verdict, Verdict::Accept);
        assert_eq!(d.outcomes[0].route, Some(Route::Forward));
    }

    #[test]
    fn goto_return_and_loops() {
        let text = r#"table ip t {
	chain out {
		type filter hook output priority 0; policy accept;
		goto a
		drop
	}
	chain a {
		return
	}
}
"#;
        // `goto` from the base chain: when `a` returns, the base chain's policy applies (the
        // `drop` after the goto is never reached).
        let d = run(text, "192.168.1.2->10.0.0.1:80/tcp", Origin::Node).unwrap();
        assert_eq!(d.outcomes[0].verdict, Verdict::Accept);
        let looped = r#"table ip t {
	chain out {
		type filter hook output priority 0; policy accept;
		jump a
	}
	chain a {
		goto b
	}
	chain b {
		goto a
	}
}
"#;
        let e = run(looped, "192.168.1.2->10.0.0.1:80/tcp", Origin::Node).unwrap_err();
        assert!(matches!(e, SimError::Loop { .. }), "{e}");
    }

    #[test]
    fn xt_targets_and_unknown_interfaces_are_noted() {
        let text = r#"table ip nat {
	chain PREROUTING {
		type nat hook prerouting priority dstnat; policy accept;
		iifname "eth9" drop
		ip protocol tcp counter packets 0 bytes 0 xt target "DNAT"
	}
}
"#;
        let d = run(text, "192.168.1.9->10.96.0.10:80/tcp", Origin::External).unwrap();
        assert_eq!(d.outcomes[0].verdict, Verdict::Accept);
        let notes = d.notes.join("\n");
        assert!(notes.contains("input interface is not given"), "{notes}");
        assert!(notes.contains("xt target DNAT"), "{notes}");
    }
}
