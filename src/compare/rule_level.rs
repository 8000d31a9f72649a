//! Rule level (KP9xx): per chain kube-proxy writes, the difference between `render` and the dump
//! under canonical rule equality (spec §16–§17) — missing, extra, changed and reordered rules —
//! reported only where the graph level has not already explained it.
//!
//! What legitimately varies is never reported: service order in the service-keyed chains
//! (compared as multisets), `--random-fully` (iptables version), `-m nfacct` matches and the
//! localhost NodePort rule that depends on them (kernel support), the INVALID drop rule (sysctl),
//! and mark formatting (canonical form).

use super::catalogue as cat;
use super::finding::Finding;
use super::graph_level::Explained;
use crate::graph::names::{NameResolver, parse_comment};
use crate::graph::ownership::service_chain;
use crate::model::{RuleEntry, Ruleset};
use kproxy_parsers::iptables::{Family, Match, Module, Target};
use std::borrow::Cow;
use std::collections::HashMap;

/// Chains whose rules kube-proxy writes in an order that matters.
fn is_ordered(table: &str, chain: &str) -> bool {
    !matches!(
        (table, chain),
        ("nat", "KUBE-SERVICES")
            | ("nat", "KUBE-NODEPORTS")
            | ("filter", "KUBE-SERVICES")
            | ("filter", "KUBE-NODEPORTS")
            | ("filter", "KUBE-EXTERNAL-SERVICES")
            | ("filter", "KUBE-PROXY-FIREWALL")
    )
}

/// Chains of the render that are not kube-proxy's restore payload (base jumps, canaries).
fn skipped_chain(chain: &str) -> bool {
    crate::model::BUILTIN_CHAINS.contains(&chain) || chain == "KUBE-PROXY-CANARY"
}

/// A rule's comparison key: the canonical text without what legitimately varies; `None` for rules
/// that are optional (present or not depending on kernel features). Borrows the canonical text
/// when nothing is dropped from it (the common case: no allocation per rule).
fn key<'r>(table: &str, chain: &str, r: &'r RuleEntry<'_>, family: Family) -> Option<Cow<'r, str>> {
    let has_nfacct = r
        .matches()
        .any(|m| matches!(m, Match::Module(Module::Nfacct(_))));
    if table == "nat" && chain == "KUBE-NODEPORTS" && has_nfacct {
        return None; // localhost NodePort rule: only with the nfacct counter
    }
    if table == "filter" && chain == "KUBE-FORWARD" && matches!(r.target(), Some(Target::Drop)) {
        let invalid = r.matches().any(|m| {
            matches!(m, Match::Module(Module::Conntrack { ctstate: Some(s), .. }) if s.value.contains("INVALID"))
        });
        if invalid {
            return None; // INVALID drop: depends on nf_conntrack_tcp_be_liberal
        }
    }
    let canonical = r.canonical(family).into_string();
    let canonical = canonical.as_str();
    let masquerade = matches!(r.target(), Some(Target::Masquerade { .. }));
    // Splitting on ' ' and joining again is the identity, so without the words dropped below the
    // key is the canonical text itself.
    let drops_nfacct = canonical.contains("-m nfacct");
    let drops_random_fully = masquerade && canonical.contains("--random-fully");
    if !drops_nfacct && !drops_random_fully {
        return Some(Cow::Owned(canonical.to_string()));
    }
    let words: Vec<&str> = canonical.split(' ').collect();
    let mut kept: Vec<&str> = Vec::with_capacity(words.len());
    let mut i = 0;
    while let Some(w) = words.get(i) {
        if *w == "-m" && words.get(i + 1) == Some(&"nfacct") {
            // `-m nfacct --nfacct-name [ ]NAME` (iptables-save prints two spaces before NAME).
            i += 3;
            while words.get(i) == Some(&"") {
                i += 1;
            }
            i += 1;
            continue;
        }
        if *w == "--random-fully" && masquerade {
            i += 1;
            continue;
        }
        kept.push(w);
        i += 1;
    }
    Some(Cow::Owned(kept.join(" ")))
}

/// The service port a rule belongs to: its comment, its own chain's hash, or its jump target's hash.
fn owner(r: &RuleEntry<'_>, chain: &str, names: &NameResolver) -> Option<String> {
    let comment = r.matches().find_map(|m| match m {
        Match::Module(Module::Comment(c)) => Some(c.value()),
        _ => None,
    });
    if let Some(c) = comment.as_deref().and_then(parse_comment) {
        return Some(c.name.to_string());
    }
    let by_hash = |c: &str| {
        service_chain(c)
            .and_then(|(_, h)| names.resolve(h))
            .map(|(n, _)| n.to_string())
    };
    by_hash(chain).or_else(|| match r.target() {
        Some(Target::Jump(t) | Target::Goto(t)) => by_hash(t),
        _ => None,
    })
}

fn explained(r: &RuleEntry<'_>, chain: &str, names: &NameResolver, ex: &Explained) -> bool {
    if ex.chains.contains(chain) {
        return true;
    }
    if let Some(Target::Jump(t) | Target::Goto(t)) = r.target()
        && ex.chains.contains(t)
    {
        return true;
    }
    owner(r, chain, names).is_some_and(|s| ex.services.contains(&s))
}

fn rule_line(chain: &str, r: &RuleEntry<'_>, family: Family) -> String {
    format!("-A {chain} {}", r.canonical(family))
}

/// Compares every chain of `expected` (the render) with `actual` (the dump).
pub fn compare(
    expected: &Ruleset<'_>,
    actual: &Ruleset<'_>,
    names: &NameResolver,
    ex: &Explained,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for et in &expected.tables {
        let at = actual.table(et.name);
        for ec in &et.chains {
            if skipped_chain(ec.name) {
                continue;
            }
            let table_chain = format!("{} {}", et.name, ec.name);
            let Some(ac) = at.and_then(|t| t.chain(ec.name)) else {
                if at.is_none() || ex.chains.contains(ec.name) {
                    continue; // table missing is KP011; explained chains are reported already
                }
                let svc = service_chain(ec.name)
                    .and_then(|(_, h)| names.resolve(h))
                    .map(|(n, _)| n.to_string());
                if svc.as_ref().is_some_and(|s| ex.services.contains(s)) {
                    continue;
                }
                let mut f = cat::CHAIN_MISSING
                    .finding(format!(
                        "{table_chain} is missing ({} rule(s) expected)",
                        ec.rules.len()
                    ))
                    .chain(table_chain.clone())
                    .expected(format!(":{} with {} rule(s)", ec.name, ec.rules.len()))
                    .actual("no such chain");
                if let Some(s) = svc {
                    f = f.service(s);
                }
                out.push(f);
                continue;
            };
            let want: Vec<(Option<Cow<'_, str>>, &RuleEntry<'_>)> = ec
                .rules
                .iter()
                .map(|r| (key(et.name, ec.name, r, expected.family), r))
                .collect();
            let got: Vec<(Option<Cow<'_, str>>, &RuleEntry<'_>)> = ac
                .rules
                .iter()
                .map(|r| (key(et.name, ec.name, r, actual.family), r))
                .collect();
            // The common case: the very same keys in the same order — nothing missing or extra.
            let same =
                want.len() == got.len() && want.iter().zip(&got).all(|((w, _), (g, _))| w == g);
            if same {
                // Same order: only the unordered chains' NodePort-tail check can still report.
                if !is_ordered(et.name, ec.name) && !ex.chains.contains(ec.name) {
                    order(et.name, ec.name, &want, &got, &table_chain, &mut out);
                }
                continue;
            }
            let mut counts: HashMap<&str, isize> = HashMap::new();
            for (k, _) in &want {
                if let Some(k) = k {
                    *counts.entry(k.as_ref()).or_default() += 1;
                }
            }
            for (k, _) in &got {
                if let Some(k) = k {
                    *counts.entry(k.as_ref()).or_default() -= 1;
                }
            }
            let mut missing: Vec<&RuleEntry<'_>> = Vec::new();
            let mut budget = counts.clone();
            for (k, r) in &want {
                if let Some(k) = k
                    && let Some(n) = budget.get_mut(k.as_ref())
                    && *n > 0
                {
                    *n -= 1;
                    missing.push(r);
                }
            }
            let mut extra: Vec<&RuleEntry<'_>> = Vec::new();
            let mut budget = counts;
            for (k, r) in &got {
                if let Some(k) = k
                    && let Some(n) = budget.get_mut(k.as_ref())
                    && *n < 0
                {
                    *n += 1;
                    extra.push(r);
                }
            }
            missing.retain(|r| !explained(r, ec.name, names, ex));
            extra.retain(|r| !explained(r, ec.name, names, ex));
            // Pairs of one missing and one extra rule of the same owner: a changed rule.
            let mut changed: Vec<(&RuleEntry<'_>, &RuleEntry<'_>)> = Vec::new();
            if is_ordered(et.name, ec.name) && missing.len() == extra.len() {
                changed = missing.iter().copied().zip(extra.iter().copied()).collect();
                missing.clear();
                extra.clear();
            }
            for (w, g) in changed {
                let mut f = cat::RULE_CHANGED
                    .finding(format!(
                        "a rule of {table_chain} differs from what kube-proxy writes"
                    ))
                    .chain(table_chain.clone())
                    .expected(rule_line(ec.name, w, expected.family))
                    .actual(rule_line(ec.name, g, actual.family));
                if let Some(s) = owner(w, ec.name, names) {
                    f = f.service(s);
                }
                out.push(f);
            }
            for r in missing {
                let mut f = cat::RULE_MISSING
                    .finding(format!("{table_chain} lacks a rule kube-proxy writes"))
                    .chain(table_chain.clone())
                    .expected(rule_line(ec.name, r, expected.family))
                    .actual("no such rule");
                if let Some(s) = owner(r, ec.name, names) {
                    f = f.service(s);
                }
                out.push(f);
            }
            for r in extra {
                let mut f = cat::RULE_EXTRA
                    .finding(format!(
                        "{table_chain} holds a rule kube-proxy does not write"
                    ))
                    .chain(table_chain.clone())
                    .expected("no such rule")
                    .actual(rule_line(ec.name, r, actual.family));
                if let Some(s) = owner(r, ec.name, names) {
                    f = f.service(s);
                }
                out.push(f);
            }
            if ex.chains.contains(ec.name) {
                continue;
            }
            order(et.name, ec.name, &want, &got, &table_chain, &mut out);
        }
    }
    out
}

/// KP904: same rules, different order (ordered chains), or the nodeport tail rule not last.
fn order(
    table: &str,
    chain: &str,
    want: &[(Option<Cow<'_, str>>, &RuleEntry<'_>)],
    got: &[(Option<Cow<'_, str>>, &RuleEntry<'_>)],
    table_chain: &str,
    out: &mut Vec<Finding>,
) {
    let w: Vec<&str> = want.iter().filter_map(|(k, _)| k.as_deref()).collect();
    let g: Vec<&str> = got.iter().filter_map(|(k, _)| k.as_deref()).collect();
    if is_ordered(table, chain) {
        let mut ws = w.clone();
        let mut gs = g.clone();
        ws.sort_unstable();
        gs.sort_unstable();
        if ws == gs && w != g {
            out.push(
                cat::RULE_ORDER
                    .finding(format!(
                        "{table_chain} holds kube-proxy's rules in another order"
                    ))
                    .chain(table_chain.to_string())
                    .expected(w.join(" | "))
                    .actual(g.join(" | ")),
            );
        }
        return;
    }
    if table == "nat" && chain == "KUBE-SERVICES" {
        let tail = |k: &&str| k.contains(crate::proxier::iptables::NODEPORTS_TAIL_COMMENT);
        let last_non_tail = g.iter().rposition(|k| !tail(k));
        let first_tail = g.iter().position(tail);
        if let (Some(l), Some(t)) = (last_non_tail, first_tail)
            && t < l
        {
            out.push(
                cat::RULE_ORDER
                    .finding("nat KUBE-SERVICES: the NodePort rule is not the last rule; later service rules are shadowed for local addresses".to_string())
                    .chain(table_chain.to_string())
                    .expected("the KUBE-NODEPORTS jump last")
                    .actual(format!("at position {} of {}", t + 1, g.len())),
            );
        }
    }
}
