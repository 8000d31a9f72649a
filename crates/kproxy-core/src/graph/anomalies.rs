//! What does not fit kube-proxy's shape: jumps to undeclared chains, kube-proxy chains nothing
//! jumps to, empty service chains, duplicate rules, rules after an unconditional terminating rule,
//! endpoint chains without DNAT, rules iptables could not decode.
//!
//! Each chain's rules are read once into [`Step`]s (target and whether the rule is unconditional);
//! the checks then work on those.

use super::names::parse_comment;
use super::ownership::{ChainKind, classify, service_chain};
use super::{Anomaly, AnomalyKind};
use crate::model::{BUILTIN_CHAINS, Chain, Fingerprint, JumpTo, RuleEntry, Ruleset, TableRules};
use crate::parsers::iptables::NameHash;
use crate::parsers::iptables::{Family, Rule, Target, TargetKind};
use std::collections::HashMap;

/// Fixed chains that legitimately have no jump to them.
const NEVER_REFERENCED: &[&str] = &["KUBE-PROXY-CANARY", "KUBE-MARK-DROP"];

/// What a rule's target does to the packets it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect<'a> {
    /// A verdict or NAT that ends traversal (ACCEPT, DROP, REJECT, DNAT, SNAT, MASQUERADE).
    Ends,
    /// `-j RETURN`.
    Return,
    /// `-j CHAIN` / `-g CHAIN`, with the chain's index in the table when it has the chain.
    Jump(&'a str, Option<usize>),
    /// Anything else (MARK, LOG, no target, …).
    Continues,
    /// A target iptables could not decode.
    Unreadable,
}

/// One rule, as the checks see it. "Unconditional" is [`Rule::is_unconditional`]: the rule's
/// only matches are ones every packet reaching the chain satisfies in practice (comments, a plain
/// `-p`/`-m tcp` without ports, nfacct counters).
#[derive(Debug, Clone, Copy)]
struct Step<'a> {
    effect: Effect<'a>,
    dnat: bool,
    unconditional: bool,
}

impl<'a> Step<'a> {
    /// The step of `r`, which jumps to `to` (as [`TableRules::rules_with_jumps`] resolved it).
    fn of(r: &Rule<'a>, to: Option<JumpTo<'a>>) -> Step<'a> {
        let kind = r.target_kind();
        let effect = match kind {
            Some(
                TargetKind::Accept
                | TargetKind::Drop
                | TargetKind::Reject
                | TargetKind::Dnat
                | TargetKind::Snat
                | TargetKind::Masquerade,
            ) => Effect::Ends,
            Some(TargetKind::Return) => Effect::Return,
            Some(TargetKind::Jump | TargetKind::Goto) => {
                to.map_or(Effect::Continues, |t| Effect::Jump(t.name, t.chain))
            }
            Some(TargetKind::Unreadable) => Effect::Unreadable,
            _ => Effect::Continues,
        };
        Step {
            effect,
            dnat: kind == Some(TargetKind::Dnat),
            unconditional: r.is_unconditional(),
        }
    }

    fn jump(&self) -> Option<&'a str> {
        match self.effect {
            Effect::Jump(c, _) => Some(c),
            _ => None,
        }
    }
}

/// All anomalies of a dump (in no particular order: the caller sorts them).
/// `whole` says the input is all the command printed: in a cut or filtered paste, a chain whose
/// callers are missing is not stale, an empty chain or an endpoint chain without its DNAT may
/// have lost its rules to the cut, and a jump target may be declared outside it.
pub(crate) fn find(rs: &Ruleset<'_>, save_form: bool, whole: bool) -> Vec<Anomaly> {
    let mut out = Vec::new();
    let mut steps = Vec::new();
    for ti in &rs.tables {
        let table = ti.name;
        if whole {
            undeclared_jumps(ti, save_form, &mut out);
        }
        jump_loops(ti, &mut out);
        let full_dump = BUILTIN_CHAINS.iter().any(|b| is_declared(ti, b));
        for (ci, c) in ti.chains.iter().enumerate() {
            let kind = classify(table, c.name);
            if let Some(kind) = kind
                && whole
            {
                unreferenced_and_empty(ti, ci, kind, full_dump, &mut out);
            }
            if kind.is_none() && !BUILTIN_CHAINS.contains(&c.name) {
                unreadable(table, c, &mut out);
                continue;
            }
            steps.clear();
            steps.extend(ti.rules_with_jumps(ci).map(|(r, to)| Step::of(r, to)));
            duplicates(table, c, &steps, ti.family, &mut out);
            unreachable(table, c, &steps, ti, &mut out);
            // In a cut or filtered paste the DNAT rule may be in what is missing.
            if let Some((ChainKind::Sep, _)) = service_chain(c.name)
                && whole
                && table == "nat"
                && !steps.is_empty()
                && !steps.iter().any(|s| s.dnat)
            {
                // The chain's own comment names its service port when nothing else does (a
                // chain no service chain jumps to any more).
                let first = c.rules.first();
                let mut a = anomaly(
                    AnomalyKind::MissingDnat,
                    table,
                    c.name,
                    first.map(|r| r.line),
                    "endpoint chain without a DNAT rule".to_string(),
                );
                a.service = c.rules.iter().find_map(|r| {
                    let comment = r.rule.comment()?.value();
                    parse_comment(&comment).map(|sc| sc.name.to_string())
                });
                out.push(a);
            }
            if steps.iter().any(|s| s.effect == Effect::Unreadable) {
                unreadable(table, c, &mut out);
            }
        }
    }
    out
}

/// Cycles of `-j`/`-g` between chains: each strongly connected set of chains with a jump inside
/// it is one anomaly, named after its first chain.
fn jump_loops(ti: &TableRules<'_>, out: &mut Vec<Anomaly>) {
    let mut graph = petgraph::Graph::<(), ()>::with_capacity(ti.chains.len(), 0);
    let nodes: Vec<_> = ti.chains.iter().map(|_| graph.add_node(())).collect();
    let mut self_jumps = Vec::new();
    for (ci, &from) in nodes.iter().enumerate() {
        for (r, to) in ti.rules_with_jumps(ci) {
            if let Some(target) = to.and_then(|t| t.chain) {
                if target == ci {
                    self_jumps.push((ci, r.line));
                }
                graph.add_edge(from, nodes[target], ());
            }
        }
    }
    for component in petgraph::algo::tarjan_scc(&graph) {
        let mut chains: Vec<usize> = component.iter().map(|n| n.index()).collect();
        chains.sort_unstable();
        let (first, line, message) = match chains.as_slice() {
            [] => continue,
            [one] => {
                let Some(&(_, line)) = self_jumps.iter().find(|(c, _)| c == one) else {
                    continue;
                };
                let name = ti.chains[*one].name;
                (
                    *one,
                    Some(line),
                    format!(
                        "{name} jumps to itself: the kernel refuses to load such rules, and a packet walk never ends"
                    ),
                )
            }
            many => {
                let names: Vec<&str> = many.iter().map(|&c| ti.chains[c].name).collect();
                let message = format!(
                    "jump loop: {} -> {}: the kernel refuses to load such rules, and a packet walk never ends",
                    names.join(" -> "),
                    names[0]
                );
                (many[0], None, message)
            }
        };
        out.push(anomaly(
            AnomalyKind::JumpLoop,
            ti.name,
            ti.chains[first].name,
            line,
            message,
        ));
    }
}

/// Rules whose target iptables could not decode.
fn unreadable(table: &str, c: &Chain<'_>, out: &mut Vec<Anomaly>) {
    for r in &c.rules {
        if let Some(Target::Unreadable { reason, raw }) = r.target() {
            out.push(anomaly(
                AnomalyKind::UnreadableRule,
                table,
                c.name,
                Some(r.line),
                format!(
                    "iptables could not decode target `{raw}` ({reason}); no conclusions drawn from it"
                ),
            ));
        }
    }
}

fn anomaly(
    kind: AnomalyKind,
    table: &str,
    chain: &str,
    line: Option<u32>,
    message: String,
) -> Anomaly {
    Anomaly {
        kind,
        table: table.to_string(),
        chain: Some(chain.to_string()),
        line,
        service: None,
        message,
    }
}

/// Whether `chain` is declared with `:NAME` / `-N NAME` / `-P NAME`.
fn is_declared(ti: &TableRules<'_>, chain: &str) -> bool {
    ti.chain(chain).is_some_and(|c| c.declared_at.is_some())
}

fn undeclared_jumps(ti: &TableRules<'_>, save_form: bool, out: &mut Vec<Anomaly>) {
    let table = ti.name;
    // Only complete inputs can be checked: save/restore text declares every chain it uses;
    // `iptables -S` output is complete when it lists the built-in policies (`-P`).
    let complete = if save_form {
        ti.chains.iter().any(|c| c.declared_at.is_some())
    } else {
        BUILTIN_CHAINS.iter().any(|b| is_declared(ti, b))
    };
    if !complete {
        return;
    }
    let mut report = |target: &str, (c, r): (&Chain<'_>, &RuleEntry<'_>)| {
        out.push(anomaly(
            AnomalyKind::UndeclaredJump,
            table,
            c.name,
            Some(r.line),
            format!("jumps to {target}, which is not declared"),
        ));
    };
    // Chains that only appear in rules (`-A` without a declaration), then targets that are no
    // chain of the table at all.
    for (i, target) in ti.chains.iter().enumerate() {
        if target.declared_at.is_none() && !target.is_builtin() {
            ti.jumps_to_chain(i).for_each(|j| report(target.name, j));
        }
    }
    for target in ti.absent_jump_targets() {
        if !BUILTIN_CHAINS.contains(&target) {
            ti.jumps_to(target).for_each(|j| report(target, j));
        }
    }
}

fn unreferenced_and_empty(
    ti: &TableRules<'_>,
    ci: usize,
    kind: ChainKind,
    full_dump: bool,
    out: &mut Vec<Anomaly>,
) {
    let Some(c) = ti.chains.get(ci) else { return };
    let (table, chain) = (ti.name, c.name);
    let check = match kind {
        ChainKind::Fixed => full_dump && !NEVER_REFERENCED.contains(&chain),
        _ => true,
    };
    if check && !ti.is_jumped_to(ci) {
        out.push(anomaly(
            AnomalyKind::UnreferencedChain,
            table,
            chain,
            None,
            "nothing jumps to this chain (stale)".to_string(),
        ));
    }
    if kind != ChainKind::Fixed && c.declared_at.is_some() && c.rules.is_empty() {
        out.push(anomaly(
            AnomalyKind::EmptyServiceChain,
            table,
            chain,
            None,
            "service chain without rules".to_string(),
        ));
    }
}

fn duplicates(
    table: &str,
    c: &Chain<'_>,
    steps: &[Step<'_>],
    family: Family,
    out: &mut Vec<Anomaly>,
) {
    // Equal canonical forms (crate::model) are the same rule, however they were written. Equal
    // rules jump to the same chain (or to none), so the jump target sorts rules into buckets
    // first: most chains (a SEP chain's masquerade jump and DNAT, a SVC chain's jumps to distinct
    // SEP chains) then need no canonical form at all.
    let rules: &[RuleEntry<'_>] = &c.rules;
    let mut report = |r: &RuleEntry<'_>, first: u32| {
        out.push(anomaly(
            AnomalyKind::DuplicateRule,
            table,
            c.name,
            Some(r.line),
            format!("same rule as line {first}"),
        ));
    };
    let mut buf = String::new();
    if rules.len() <= 16 {
        // Pairs of a handful of rules: cheaper than a map.
        for (i, (r, s)) in rules.iter().zip(steps).enumerate() {
            let mut fp = None;
            for (e, _) in rules[..i]
                .iter()
                .zip(steps)
                .filter(|(_, t)| t.jump() == s.jump())
            {
                let mine = *fp.get_or_insert_with(|| Fingerprint::of(&r.rule, family, &mut buf));
                if Fingerprint::of(&e.rule, family, &mut buf) == mine {
                    report(r, e.line);
                    break;
                }
            }
        }
        return;
    }
    let mut buckets: HashMap<Option<&str>, Vec<usize>, NameHash> = HashMap::default();
    for (i, s) in steps.iter().enumerate() {
        buckets.entry(s.jump()).or_default().push(i);
    }
    let mut dups: Vec<(usize, u32)> = Vec::new();
    for members in buckets.values().filter(|m| m.len() > 1) {
        let mut seen: HashMap<Fingerprint, u32> = HashMap::default();
        for &i in members {
            let r = &rules[i];
            let fp = Fingerprint::of(&r.rule, family, &mut buf);
            match seen.get(&fp) {
                Some(&first) => dups.push((i, first)),
                None => {
                    seen.insert(fp, r.line);
                }
            }
        }
    }
    dups.sort_unstable();
    for (i, first) in dups {
        report(&rules[i], first);
    }
}

/// True when every packet reaching the rule stops there: the rule is unconditional and its target
/// is a verdict, or a jump into a chain that always ends in a verdict.
fn stops_all(s: &Step<'_>, ti: &TableRules<'_>) -> bool {
    s.unconditional
        && match s.effect {
            Effect::Ends | Effect::Return => true,
            Effect::Jump(_, Some(c)) => always_ends(c, ti, 1),
            _ => false,
        }
}

/// True when every packet entering chain `chain` (an index into the table's chains) ends in a
/// verdict there (never returns to the caller): no rule before the first unconditional verdict
/// can `RETURN`, and the chain cannot run off its end.
fn always_ends(chain: usize, ti: &TableRules<'_>, depth: u8) -> bool {
    if depth > 8 {
        return false;
    }
    for (r, to) in ti.rules_with_jumps(chain) {
        let s = Step::of(r, to);
        match s.effect {
            Effect::Return => return false,
            Effect::Jump(..) | Effect::Continues if !s.unconditional => continue,
            _ => {}
        }
        if s.unconditional {
            match s.effect {
                Effect::Ends => return true,
                Effect::Jump(_, Some(c)) if always_ends(c, ti, depth + 1) => return true,
                _ => {}
            }
        }
    }
    false
}

fn unreachable(
    table: &str,
    c: &Chain<'_>,
    steps: &[Step<'_>],
    ti: &TableRules<'_>,
    out: &mut Vec<Anomaly>,
) {
    let Some(pos) = steps.iter().position(|s| stops_all(s, ti)) else {
        return;
    };
    let (Some(stopper), Some(step)) = (c.rules.get(pos), steps.get(pos)) else {
        return;
    };
    let what = step.jump().map_or_else(
        || "an unconditional terminating rule".to_string(),
        |t| format!("the unconditional jump to {t}"),
    );
    for (r, s) in c.rules.iter().zip(steps).skip(pos + 1) {
        // kube-proxy closes every old firewall chain with `-j KUBE-MARK-DROP` (`proxier.go`
        // before 1.25), unreachable when the service has no source ranges: its layout, not drift.
        if s.jump() == Some("KUBE-MARK-DROP")
            && matches!(service_chain(c.name), Some((ChainKind::Fw, _)))
        {
            continue;
        }
        out.push(anomaly(
            AnomalyKind::UnreachableRule,
            table,
            c.name,
            Some(r.line),
            format!("never reached: follows {what} on line {}", stopper.line),
        ));
    }
}
