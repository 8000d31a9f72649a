//! What does not fit kube-proxy's shape: jumps to undeclared chains, kube-proxy chains nothing
//! jumps to, empty service chains, duplicate rules, rules after an unconditional terminating rule,
//! endpoint chains without DNAT, rules iptables could not decode.

use super::index::{BUILTIN_CHAINS, DumpIndex, TableIndex, is_unconditional, jump_target};
use super::ownership::{ChainKind, classify, service_chain};
use super::{Anomaly, AnomalyKind};
use crate::model::{Fingerprint, RuleEntry};
use crate::parsers::iptables::NameHash;
use crate::parsers::iptables::{Family, Rule, Target};
use std::collections::HashMap;

/// Fixed chains that legitimately have no jump to them.
const NEVER_REFERENCED: &[&str] = &["KUBE-PROXY-CANARY", "KUBE-MARK-DROP"];

/// All anomalies of a dump.
pub(crate) fn find(idx: &DumpIndex<'_, '_>, save_form: bool) -> Vec<Anomaly> {
    let mut out = Vec::new();
    for (table, ti) in &idx.tables {
        undeclared_jumps(table, ti, save_form, &mut out);
        unreferenced_and_empty(table, ti, &mut out);
        for &chain in &ti.names {
            let rules = ti.rules(chain);
            if classify(table, chain).is_none() && !BUILTIN_CHAINS.contains(&chain) {
                continue;
            }
            duplicates(table, chain, rules, ti.table.family, &mut out);
            unreachable(table, chain, rules, ti, &mut out);
            if let Some((ChainKind::Sep, _)) = service_chain(chain)
                && *table == "nat"
                && !rules.is_empty()
                && !rules
                    .iter()
                    .any(|r| matches!(r.target(), Some(Target::Dnat { .. })))
            {
                out.push(anomaly(
                    AnomalyKind::MissingDnat,
                    table,
                    chain,
                    None,
                    "endpoint chain without a DNAT rule".to_string(),
                ));
            }
        }
        for &chain in &ti.names {
            for r in ti.rules(chain) {
                if let Some(Target::Unreadable { reason, raw }) = &r.target() {
                    out.push(anomaly(
                        AnomalyKind::UnreadableRule,
                        table,
                        r.chain,
                        Some(r.line),
                        format!("iptables could not decode target `{raw}` ({reason}); no conclusions drawn from it"),
                    ));
                }
            }
        }
    }
    out
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

fn undeclared_jumps(table: &str, ti: &TableIndex<'_, '_>, save_form: bool, out: &mut Vec<Anomaly>) {
    // Only complete inputs can be checked: save/restore text declares every chain it uses;
    // `iptables -S` output is complete when it lists the built-in policies (`-P`).
    let complete = if save_form {
        ti.any_declared
    } else {
        BUILTIN_CHAINS.iter().any(|b| ti.is_declared(b))
    };
    if !complete {
        return;
    }
    for target in ti.table.jump_targets() {
        if ti.is_declared(target) || BUILTIN_CHAINS.contains(&target) {
            continue;
        }
        for (_, r) in ti.table.jumps_to(target) {
            out.push(anomaly(
                AnomalyKind::UndeclaredJump,
                table,
                r.chain,
                Some(r.line),
                format!("jumps to {target}, which is not declared"),
            ));
        }
    }
}

fn unreferenced_and_empty(table: &str, ti: &TableIndex<'_, '_>, out: &mut Vec<Anomaly>) {
    let full_dump = BUILTIN_CHAINS.iter().any(|b| ti.is_declared(b));
    for &chain in &ti.names {
        let Some(kind) = classify(table, chain) else {
            continue;
        };
        let referenced = ti.table.is_jump_target(chain);
        let check = match kind {
            ChainKind::Fixed => full_dump && !NEVER_REFERENCED.contains(&chain),
            _ => true,
        };
        if check && !referenced {
            out.push(anomaly(
                AnomalyKind::UnreferencedChain,
                table,
                chain,
                None,
                "nothing jumps to this chain (stale)".to_string(),
            ));
        }
        if kind != ChainKind::Fixed && ti.is_declared(chain) && ti.rules(chain).is_empty() {
            out.push(anomaly(
                AnomalyKind::EmptyServiceChain,
                table,
                chain,
                None,
                "service chain without rules".to_string(),
            ));
        }
    }
}

fn duplicates(
    table: &str,
    chain: &str,
    rules: &[RuleEntry<'_>],
    family: Family,
    out: &mut Vec<Anomaly>,
) {
    // Equal canonical forms (crate::model) are the same rule, however they were written. Equal
    // rules jump to the same chain (or to none), so the jump target sorts rules into buckets
    // first: most chains (a SEP chain's masquerade jump and DNAT, a SVC chain's jumps to distinct
    // SEP chains) then need no canonical form at all.
    let mut report = |r: &RuleEntry<'_>, first: u32| {
        out.push(anomaly(
            AnomalyKind::DuplicateRule,
            table,
            chain,
            Some(r.line),
            format!("same rule as line {first}"),
        ));
    };
    let mut buf = String::new();
    if rules.len() <= 16 {
        // Pairs of a handful of rules: cheaper than a map.
        for (i, r) in rules.iter().enumerate() {
            let target = r.jump_target();
            let mut fp = None;
            for e in &rules[..i] {
                if e.jump_target() != target {
                    continue;
                }
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
    for (i, r) in rules.iter().enumerate() {
        buckets.entry(r.jump_target()).or_default().push(i);
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

/// True when every packet reaching `r` stops there: the rule is unconditional and its target is a
/// verdict, or a jump into a chain that always ends in a verdict.
fn stops_all(r: &Rule<'_>, ti: &TableIndex<'_, '_>, depth: u8) -> bool {
    is_unconditional(r)
        && match &r.target() {
            Some(
                Target::Accept
                | Target::Drop
                | Target::Return
                | Target::Reject { .. }
                | Target::Dnat { .. }
                | Target::Snat { .. }
                | Target::Masquerade { .. },
            ) => true,
            Some(Target::Jump(c) | Target::Goto(c)) => always_ends(c, ti, depth + 1),
            _ => false,
        }
}

/// True when every packet entering `chain` ends in a verdict there (never returns to the caller):
/// no rule before the first unconditional verdict can `RETURN`, and the chain cannot run off its end.
fn always_ends(chain: &str, ti: &TableIndex<'_, '_>, depth: u8) -> bool {
    if depth > 8 {
        return false;
    }
    for r in ti.rules(chain) {
        match &r.target() {
            Some(Target::Return) => return false,
            Some(Target::Jump(_) | Target::Goto(_)) | None if !is_unconditional(r) => continue,
            _ => {}
        }
        if is_unconditional(r) {
            match &r.target() {
                Some(
                    Target::Accept
                    | Target::Drop
                    | Target::Reject { .. }
                    | Target::Dnat { .. }
                    | Target::Snat { .. }
                    | Target::Masquerade { .. },
                ) => return true,
                Some(Target::Jump(c) | Target::Goto(c)) if always_ends(c, ti, depth + 1) => {
                    return true;
                }
                _ => {}
            }
        }
    }
    false
}

fn unreachable(
    table: &str,
    chain: &str,
    rules: &[RuleEntry<'_>],
    ti: &TableIndex<'_, '_>,
    out: &mut Vec<Anomaly>,
) {
    let Some(pos) = rules.iter().position(|r| stops_all(r, ti, 0)) else {
        return;
    };
    let Some(stopper) = rules.get(pos) else {
        return;
    };
    let what = jump_target(stopper).map_or_else(
        || "an unconditional terminating rule".to_string(),
        |t| format!("the unconditional jump to {t}"),
    );
    for r in rules.iter().skip(pos + 1) {
        out.push(anomaly(
            AnomalyKind::UnreachableRule,
            table,
            chain,
            Some(r.line),
            format!("never reached: follows {what} on line {}", stopper.line),
        ));
    }
}
