//! What does not fit kube-proxy's shape in its nftables table, besides what the builder sees on
//! its way (missing DNAT, numgen leaks, name hashes, cluster IPs missing from `cluster-ips`):
//! jumps and map verdicts to chains the table does not have, per-service chains nothing refers
//! to or without rules, duplicate rules, rules after a rule that always ends the chain, and jump
//! cycles.

use super::names::ObjectName;
use super::verdict_chain;
use crate::graph::{Anomaly, AnomalyKind};
use crate::parsers::nft::{Chain, Expr, Rule, Stmt, Table, Verdict};
use std::collections::HashMap;

/// Calls `found` with each chain a rule can send a packet to: its jump/goto and the verdicts of
/// its vmaps (an anonymous map's own, or every element of a named map).
pub(super) fn rule_targets<'t>(
    table: &'t Table<'_>,
    rule: &'t Rule<'_>,
    found: &mut dyn FnMut(&'t str),
) {
    for s in &rule.stmts {
        let elements: &[crate::parsers::nft::Element<'_>] = match s {
            Stmt::Verdict(v) => {
                if let Some(target) = verdict_chain(v) {
                    found(target);
                }
                continue;
            }
            Stmt::Vmap {
                map: Expr::Set(set),
                ..
            } => set,
            Stmt::Vmap {
                map: Expr::SetRef(name),
                ..
            } => match table.set(name) {
                Some(set) => &set.elements,
                None => continue,
            },
            _ => continue,
        };
        for e in elements {
            if let Some(Expr::Verdict(v)) = &e.value
                && let Some(target) = verdict_chain(v)
            {
                found(target);
            }
        }
    }
}

/// Anomalies of `table` (unsorted). `object` is each chain's per-service name, `service_of` the
/// service port of each per-service chain, `whole` whether the input is all of the listing.
pub(crate) fn find(
    table: &Table<'_>,
    label: &str,
    object: &[Option<ObjectName<'_>>],
    service_of: &HashMap<usize, String>,
    whole: bool,
) -> Vec<Anomaly> {
    let mut out = Vec::new();
    let index: HashMap<&str, usize> = table
        .chains
        .iter()
        .enumerate()
        .map(|(i, c)| (&*c.name, i))
        .collect();
    let service_of_name = |name: &str| -> Option<String> {
        let o = super::names::parse_object_name(name)?;
        // Any chain of the same service port names it.
        object
            .iter()
            .enumerate()
            .find(|(_, x)| x.is_some_and(|x| x.service_part() == o.service_part()))
            .and_then(|(ci, _)| service_of.get(&ci).cloned())
            .or_else(|| o.service_port().map(|s| s.display()))
    };
    let push = |out: &mut Vec<Anomaly>,
                kind: AnomalyKind,
                chain: &str,
                line: u32,
                service: Option<String>,
                message: String| {
        out.push(Anomaly {
            kind,
            table: label.to_string(),
            chain: Some(chain.to_string()),
            line: (line > 0).then_some(line),
            service,
            message,
        });
    };
    let mut referenced = vec![0u32; table.chains.len()];
    let mut jumps: Vec<Vec<usize>> = vec![Vec::new(); table.chains.len()];
    for (ci, chain) in table.chains.iter().enumerate() {
        for rule in &chain.rules {
            rule_targets(table, rule, &mut |target| match index.get(target) {
                Some(&ti) => {
                    referenced[ti] += 1;
                    jumps[ci].push(ti);
                }
                None if whole => push(
                    &mut out,
                    AnomalyKind::UndeclaredJump,
                    &chain.name,
                    rule.line,
                    service_of.get(&ci).cloned(),
                    format!("goes to chain {target}, which the table does not have"),
                ),
                None => {}
            });
        }
    }
    for set in &table.sets {
        for el in &set.elements {
            let Some(Expr::Verdict(v)) = &el.value else {
                continue;
            };
            let Some(target) = verdict_chain(v) else {
                continue;
            };
            match index.get(target) {
                Some(&ti) => referenced[ti] += 1,
                None if whole => push(
                    &mut out,
                    AnomalyKind::UndeclaredJump,
                    &set.name,
                    set.line,
                    service_of_name(target),
                    format!(
                        "{} element `{}` goes to chain {target}, which the table does not have",
                        set.name, el.key
                    ),
                ),
                None => {}
            }
        }
    }
    for (ci, chain) in table.chains.iter().enumerate() {
        let service = || service_of.get(&ci).cloned();
        if object[ci].is_some() {
            if whole && referenced[ci] == 0 {
                push(
                    &mut out,
                    AnomalyKind::UnreferencedChain,
                    &chain.name,
                    chain.line,
                    service(),
                    "nothing jumps to this chain and no map points to it (stale)".to_string(),
                );
            }
            if chain.rules.is_empty() {
                push(
                    &mut out,
                    AnomalyKind::EmptyServiceChain,
                    &chain.name,
                    chain.line,
                    service(),
                    "service chain without rules (kube-proxy flushes a stale chain and deletes it on a later sync)"
                        .to_string(),
                );
            }
        }
        duplicates(chain, &mut |line, first| {
            push(
                &mut out,
                AnomalyKind::DuplicateRule,
                &chain.name,
                line,
                service(),
                format!("same rule as line {first}"),
            )
        });
        if let Some((ends, after)) = unreachable(chain) {
            push(
                &mut out,
                AnomalyKind::UnreachableRule,
                &chain.name,
                after.line,
                service(),
                format!(
                    "never reached: the rule at line {} always ends the chain",
                    ends.line
                ),
            );
        }
    }
    for cycle in cycles(&jumps) {
        let first = cycle[0];
        let names: Vec<&str> = cycle.iter().map(|&c| &*table.chains[c].name).collect();
        push(
            &mut out,
            AnomalyKind::JumpLoop,
            &table.chains[first].name,
            table.chains[first].line,
            service_of.get(&first).cloned(),
            format!(
                "chains jump to each other in a cycle: {}",
                names.join(" → ")
            ),
        );
    }
    out
}

/// Rules equal statement for statement (and comment) to an earlier rule of the chain: calls
/// `report(line, first_line)` for each.
fn duplicates(chain: &Chain<'_>, report: &mut dyn FnMut(u32, u32)) {
    // kube-proxy's chains hold a few rules each (and there are 100,000s of them): compared pair
    // by pair, without hashing every statement.
    if chain.rules.len() <= 16 {
        for (i, rule) in chain.rules.iter().enumerate() {
            if let Some(first) = chain.rules[..i]
                .iter()
                .find(|r| r.stmts == rule.stmts && r.comment == rule.comment)
            {
                report(rule.line, first.line);
            }
        }
        return;
    }
    let mut seen: HashMap<(&[Stmt<'_>], Option<&str>), u32> = HashMap::new();
    for rule in &chain.rules {
        let key = (rule.stmts.as_slice(), rule.comment.as_deref());
        match seen.get(&key) {
            Some(&first) => report(rule.line, first),
            None => {
                seen.insert(key, rule.line);
            }
        }
    }
}

/// The first rule that always ends the chain and the rule after it, if any follows.
fn unreachable<'c, 'a>(chain: &'c Chain<'a>) -> Option<(&'c Rule<'a>, &'c Rule<'a>)> {
    let i = chain.rules.iter().position(always_ends)?;
    Some((&chain.rules[i], chain.rules.get(i + 1)?))
}

/// True when every packet reaching `rule` leaves the chain there: no condition, and a verdict
/// that is not `continue`/`jump`, a NAT, a reject, or a numgen vmap every drawn value of which
/// has a verdict.
fn always_ends(rule: &Rule<'_>) -> bool {
    let conditional = rule.stmts.iter().any(|s| {
        matches!(s, Stmt::Match { .. } | Stmt::Verbatim(_) | Stmt::Xt { .. })
            || matches!(s, Stmt::Vmap { key, .. } if !matches!(key, Expr::Numgen { .. }))
    });
    if conditional {
        return false;
    }
    match rule.stmts.last() {
        Some(Stmt::Verdict(v)) => !matches!(v, Verdict::Continue | Verdict::Jump(_)),
        Some(Stmt::Nat(_) | Stmt::Reject(_)) => true,
        Some(Stmt::Vmap { .. }) => super::numgen_pick(rule).is_some_and(|p| {
            (0..u64::from(p.modulus)).all(|k| {
                p.arms
                    .iter()
                    .any(|(keys, _)| keys.contains(&(k + u64::from(p.offset))))
            })
        }),
        _ => false,
    }
}

/// Strongly connected sets of chains with a jump inside them (a chain jumping to itself
/// included), each as its chain indexes in order.
fn cycles(jumps: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let mut graph = petgraph::Graph::<(), ()>::with_capacity(jumps.len(), 0);
    let nodes: Vec<_> = (0..jumps.len()).map(|_| graph.add_node(())).collect();
    for (from, targets) in jumps.iter().enumerate() {
        for &to in targets {
            graph.add_edge(nodes[from], nodes[to], ());
        }
    }
    let mut out = Vec::new();
    for scc in petgraph::algo::tarjan_scc(&graph) {
        let mut members: Vec<usize> = scc.iter().map(|n| n.index()).collect();
        members.sort_unstable();
        let looped = members.len() > 1 || members.first().is_some_and(|&c| jumps[c].contains(&c));
        if looped {
            out.push(members);
        }
    }
    out.sort();
    out
}
