//! The repair plan: what to create, rewrite, flush and delete so that a node's kube-proxy chains
//! equal the expected ones, and the `iptables-restore --noflush` input that does exactly that.
//!
//! The plan touches only chains kube-proxy owns ([`crate::graph::ownership`]); in built-in chains it
//! only inserts the jump rules kube-proxy ensures (`-I CHAIN 1 …`) and never removes anything.
//! Stale chains are deleted only when they are per-service chains (kube-proxy's own garbage
//! collection rule: `proxier.go` `syncProxyRules`, "Delete chains no longer in use") and no rule outside the rewritten chains still jumps to them.

use crate::graph::ownership::{is_kube_proxy_chain, service_chain};
use crate::model::{Chain, Fingerprint, RuleEntry, Ruleset, TableRules};
use kproxy_parsers::iptables::{Family, Match, Module};
use serde::Serialize;
use std::collections::HashSet;
use std::fmt::Write as _;

/// Chains whose rule order kube-proxy does not define (service iteration order is random): they
/// compare as multisets. In nat `KUBE-SERVICES` the nodeport tail rule(s) must still come last.
const UNORDERED_CHAINS: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-PROXY-FIREWALL",
];

/// Chains shared with kubelet: written when expected, never deleted.
const SHARED_CHAINS: &[&str] = &["KUBE-FIREWALL", "KUBE-MARK-DROP", "KUBE-PROXY-CANARY"];

/// Built-in chains, in which only jump rules are ever inserted.
const BUILTIN: &[&str] = &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// What happens to one chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChainAction {
    /// The chain is missing: create it with its rules.
    Create,
    /// The chain exists with other rules: flush and refill it.
    Rewrite,
    /// A stale per-service chain: flush and delete it.
    Delete,
    /// A stale chain that cannot be deleted because a rule outside kube-proxy's chains jumps to it.
    KeepReferenced,
    /// Jump rules missing from a built-in chain: insert them at the top.
    InsertJumps,
}

/// The change to one chain.
#[derive(Debug, Clone, Serialize)]
pub struct ChainChange {
    /// Chain name.
    pub chain: String,
    /// What to do.
    pub action: ChainAction,
    /// Rules the chain has now (canonical text).
    pub rules_before: usize,
    /// Rules it will have.
    pub rules_after: usize,
    /// Canonical rules that will be added (for the diff display).
    pub added: Vec<String>,
    /// Canonical rules that will be removed.
    pub removed: Vec<String>,
    /// Restore lines for this chain's new content (`-A …` or `-I CHAIN 1 …`), in order.
    #[serde(skip)]
    restore_rules: Vec<String>,
    /// The canonical rules the chain holds once this change is applied (created or rewritten
    /// chains; empty for the others): what a rollback compares the chain with.
    #[serde(skip)]
    written: Vec<String>,
    /// Why a referenced stale chain is kept (the rules that jump to it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl ChainChange {
    /// The rule specifications this change inserts at the top of a built-in chain
    /// ([`ChainAction::InsertJumps`]; none for other actions), as the render wrote them.
    pub fn inserted_rules(&self) -> impl Iterator<Item = &str> {
        let head = format!("-I {} 1", self.chain);
        self.restore_rules.iter().filter_map(move |l| {
            l.strip_prefix(&head)
                .map(|rest| rest.strip_prefix(' ').unwrap_or(rest))
        })
    }

    /// The restore lines of this change's new content (`-A CHAIN …` or `-I CHAIN 1 …`).
    pub fn restore_lines(&self) -> &[String] {
        &self.restore_rules
    }

    /// Whether `chain` (as the node holds it now) still holds exactly what this change wrote
    /// into it (a created or rewritten chain), compared canonically as the planner compares
    /// rules: in order, except in the chains whose order kube-proxy does not define.
    pub fn still_written(&self, chain: &Chain<'_>, family: Family) -> bool {
        let mut now = canon_list(&chain.rules, family);
        if now.len() != self.written.len() {
            return false;
        }
        if !UNORDERED_CHAINS.contains(&self.chain.as_str()) {
            return now == self.written;
        }
        let mut written = self.written.clone();
        written.sort_unstable();
        now.sort_unstable();
        now == written
    }
}

/// The plan for one table.
#[derive(Debug, Clone, Serialize)]
pub struct TablePlan {
    /// Table name.
    pub table: String,
    /// The family of the table's rules (how their canonical forms were written).
    #[serde(skip)]
    pub family: Family,
    /// Chain changes, in restore order.
    pub changes: Vec<ChainChange>,
}

impl TablePlan {
    /// Whether applying this table changes anything.
    pub fn is_empty(&self) -> bool {
        self.changes
            .iter()
            .all(|c| c.action == ChainAction::KeepReferenced)
    }

    /// The `iptables-restore --noflush` input for this table (empty when nothing changes).
    ///
    /// Layout as kube-proxy writes it: `*table`, a `:CHAIN - [0:0]` line per created, rewritten
    /// or deleted chain (which creates or flushes it), the rules, the `-X` deletions, `COMMIT`.
    pub fn restore_input(&self) -> String {
        if self.is_empty() {
            return String::new();
        }
        let mut s = format!("*{}\n", self.table);
        for c in &self.changes {
            if matches!(
                c.action,
                ChainAction::Create | ChainAction::Rewrite | ChainAction::Delete
            ) {
                let _ = writeln!(s, ":{} - [0:0]", c.chain);
            }
        }
        for c in &self.changes {
            for r in &c.restore_rules {
                s.push_str(r);
                s.push('\n');
            }
        }
        for c in &self.changes {
            if c.action == ChainAction::Delete {
                let _ = writeln!(s, "-X {}", c.chain);
            }
        }
        s.push_str("COMMIT\n");
        s
    }
}

/// A whole repair plan (every table that kube-proxy writes).
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    /// Per-table plans, in restore order (filter before nat: nat rules never jump to filter chains,
    /// so either order is safe; filter first matches kube-proxy's payload).
    pub tables: Vec<TablePlan>,
    /// Whether this is a full rewrite (`--full`).
    pub full: bool,
    /// The Services whose API object was left out as invalid, and what of theirs the node
    /// holds: left as they are ([`crate::compare::iptables::scope::keep_left_out`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_alone: Vec<crate::compare::left_out::NotChecked>,
}

impl Plan {
    /// Whether applying the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.tables.iter().all(TablePlan::is_empty)
    }

    /// Counts of changes by action.
    pub fn count(&self, action: ChainAction) -> usize {
        self.tables
            .iter()
            .flat_map(|t| &t.changes)
            .filter(|c| c.action == action)
            .count()
    }

    /// The complete restore input (all tables), as one `iptables-restore --noflush` would take it.
    pub fn restore_input(&self) -> String {
        self.tables.iter().map(TablePlan::restore_input).collect()
    }
}

/// Computes the plan that turns `current` (the node's rules) into `expected` (a render with base
/// jumps) for the tables kube-proxy writes. `full` rewrites every expected chain, as a kube-proxy
/// full sync does, instead of only those that differ.
pub fn plan(expected: &Ruleset<'_>, current: &Ruleset<'_>, full: bool) -> Plan {
    let mut tables = Vec::new();
    for et in &expected.tables {
        let ct = current.table(et.name);
        tables.push(plan_table(et, ct, full));
    }
    Plan {
        tables,
        full,
        left_alone: Vec::new(),
    }
}

fn plan_table(
    expected: &TableRules<'_>,
    current: Option<&TableRules<'_>>,
    full: bool,
) -> TablePlan {
    let mut changes = Vec::new();
    let mut rewritten: HashSet<&str> = HashSet::new();
    for ec in &expected.chains {
        if BUILTIN.contains(&ec.name) {
            continue;
        }
        let cc = current.and_then(|t| t.chain(ec.name));
        let action = match cc {
            None => Some(ChainAction::Create),
            Some(cc) if full || !chain_equal(expected.name, ec, cc, expected.family) => {
                Some(ChainAction::Rewrite)
            }
            Some(_) => None,
        };
        if let Some(action) = action {
            rewritten.insert(ec.name);
            changes.push(rewrite_change(ec, cc, action, expected.family));
        }
    }
    for ec in expected.chains.iter().filter(|c| BUILTIN.contains(&c.name)) {
        if let Some(change) =
            missing_jumps(ec, current.and_then(|t| t.chain(ec.name)), expected.family)
        {
            changes.push(change);
        }
    }
    if let Some(ct) = current {
        for cc in &ct.chains {
            if expected.chain(cc.name).is_some()
                || !is_kube_proxy_chain(ct.name, cc.name)
                || service_chain(cc.name).is_none()
                || SHARED_CHAINS.contains(&cc.name)
            {
                continue;
            }
            let holders: Vec<String> = ct
                .jumps_to(cc.name)
                .filter(|(holder, _)| {
                    !rewritten.contains(holder.name)
                        && expected.chain(holder.name).is_none()
                        && holder.name != cc.name
                })
                .map(|(holder, r)| format!("-A {} {}", holder.name, r.rule.raw))
                .collect();
            // Chains that are themselves stale may reference each other; they all go together.
            let foreign: Vec<String> = holders
                .into_iter()
                .filter(|h| {
                    let holder = h.split(' ').nth(1).unwrap_or("");
                    !(service_chain(holder).is_some() && expected.chain(holder).is_none())
                })
                .collect();
            let (action, note) = if foreign.is_empty() {
                (ChainAction::Delete, None)
            } else {
                (
                    ChainAction::KeepReferenced,
                    Some(format!("still referenced by: {}", foreign.join("; "))),
                )
            };
            changes.push(ChainChange {
                chain: cc.name.to_string(),
                action,
                rules_before: cc.rules.len(),
                rules_after: 0,
                added: Vec::new(),
                removed: canon_list(&cc.rules, ct.family),
                restore_rules: Vec::new(),
                written: Vec::new(),
                note,
            });
        }
    }
    TablePlan {
        table: expected.name.to_string(),
        family: expected.family,
        changes,
    }
}

fn canon_list(rules: &[RuleEntry<'_>], family: Family) -> Vec<String> {
    rules
        .iter()
        .map(|r| r.canonical(family).into_string())
        .collect()
}

fn rewrite_change(
    ec: &Chain<'_>,
    cc: Option<&Chain<'_>>,
    action: ChainAction,
    family: Family,
) -> ChainChange {
    let after = canon_list(&ec.rules, family);
    let before = cc.map(|c| canon_list(&c.rules, family)).unwrap_or_default();
    let (added, removed) = multiset_diff(&after, &before);
    let rules_after = after.len();
    ChainChange {
        chain: ec.name.to_string(),
        action,
        rules_before: before.len(),
        rules_after,
        added,
        removed,
        restore_rules: ec
            .rules
            .iter()
            .map(|r| restore_line("-A", ec.name, r.rule.raw))
            .collect(),
        written: after,
        note: None,
    }
}

fn restore_line(op: &str, chain: &str, raw: &str) -> String {
    if raw.is_empty() {
        format!("{op} {chain}")
    } else {
        format!("{op} {chain} {raw}")
    }
}

/// Jump rules of an expected built-in chain that the current chain lacks, inserted at the top in
/// the expected relative order.
fn missing_jumps(ec: &Chain<'_>, cc: Option<&Chain<'_>>, family: Family) -> Option<ChainChange> {
    let mut buf = String::new();
    let have: HashSet<Fingerprint> = cc
        .map(|c| {
            c.rules
                .iter()
                .map(|r| Fingerprint::of(&r.rule, family, &mut buf))
                .collect()
        })
        .unwrap_or_default();
    let missing: Vec<&RuleEntry<'_>> = ec
        .rules
        .iter()
        .filter(|r| !have.contains(&Fingerprint::of(&r.rule, family, &mut buf)))
        .collect();
    if missing.is_empty() {
        return None;
    }
    let before = cc.map_or(0, |c| c.rules.len());
    Some(ChainChange {
        chain: ec.name.to_string(),
        action: ChainAction::InsertJumps,
        rules_before: before,
        rules_after: before + missing.len(),
        added: missing
            .iter()
            .map(|r| r.canonical(family).into_string())
            .collect(),
        removed: Vec::new(),
        // Inserting each at position 1 in reverse order leaves them in the expected order.
        restore_rules: missing
            .iter()
            .rev()
            .map(|r| restore_line("-I", &format!("{} 1", ec.name), r.rule.raw))
            .collect(),
        written: Vec::new(),
        note: None,
    })
}

/// Semantic chain equality for repair: ordered canonical equality, except the chains whose order
/// kube-proxy does not define, which compare as multisets (with the nat KUBE-SERVICES nodeport
/// tail rules required to stay last).
pub fn chain_equal(table: &str, expected: &Chain<'_>, current: &Chain<'_>, family: Family) -> bool {
    if expected.rules.len() != current.rules.len() {
        return false;
    }
    if !UNORDERED_CHAINS.contains(&expected.name) {
        return expected.same_rules(current, family);
    }
    if table == "nat" && expected.name == "KUBE-SERVICES" {
        let n = expected.rules.iter().filter(|r| is_tail(r)).count();
        let b = &current.rules;
        if n > 0 && b.len() >= n && b[b.len() - n..].iter().any(|r| !is_tail(r)) {
            return false;
        }
    }
    let mut buf = String::new();
    let mut prints = |rules: &[RuleEntry<'_>]| -> Vec<Fingerprint> {
        let mut v: Vec<Fingerprint> = rules
            .iter()
            .map(|r| Fingerprint::of(&r.rule, family, &mut buf))
            .collect();
        v.sort_unstable();
        v
    };
    prints(&expected.rules) == prints(&current.rules)
}

/// The nat `KUBE-SERVICES` → `KUBE-NODEPORTS` tail rule (by its comment).
fn is_tail(r: &RuleEntry<'_>) -> bool {
    r.matches().any(|m| {
        matches!(m, Match::Module(Module::Comment(c)) if c.raw.contains("must be the last rule"))
    })
}

/// Rules in `a` not in `b` and in `b` not in `a`, as multisets, keeping `a`'s and `b`'s order.
fn multiset_diff(a: &[String], b: &[String]) -> (Vec<String>, Vec<String>) {
    let mut count: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for r in b {
        *count.entry(r).or_default() += 1;
    }
    let mut added = Vec::new();
    for r in a {
        match count.get_mut(r.as_str()) {
            Some(n) if *n > 0 => *n -= 1,
            _ => added.push(r.clone()),
        }
    }
    let mut count_a: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
    for r in a {
        *count_a.entry(r).or_default() += 1;
    }
    let mut removed = Vec::new();
    for r in b {
        match count_a.get_mut(r.as_str()) {
            Some(n) if *n > 0 => *n -= 1,
            _ => removed.push(r.clone()),
        }
    }
    (added, removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kproxy_parsers::iptables::ParseOptions;

    fn rs(text: &str) -> Ruleset<'_> {
        Ruleset::parse(text, &ParseOptions::default()).expect("test input parses")
    }

    const EXPECTED: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A KUBE-SERVICES -m comment --comment \"a/b cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SERVICES -m comment --comment \"c/d cluster IP\" -m tcp -p tcp -d 10.96.0.2 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j ACCEPT\nCOMMIT\n";

    #[test]
    fn identical_rules_need_nothing() {
        let e = rs(EXPECTED);
        let c = rs(EXPECTED);
        let p = plan(&e, &c, false);
        assert!(p.is_empty(), "{p:?}");
        assert_eq!(p.restore_input(), "");
    }

    #[test]
    fn service_order_does_not_matter_but_content_does() {
        let swapped = EXPECTED
            .replace("10.96.0.1 --dport 80", "X")
            .replace("10.96.0.2 --dport 80", "10.96.0.1 --dport 80");
        let swapped = swapped.replace('X', "10.96.0.2 --dport 80");
        let e = rs(EXPECTED);
        let c = rs(&swapped);
        // Comments moved with the addresses, so the rule multiset differs: a rewrite.
        assert!(!plan(&e, &c, false).is_empty());
        let reordered = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A KUBE-SERVICES -m comment --comment \"c/d cluster IP\" -m tcp -p tcp -d 10.96.0.2 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SERVICES -m comment --comment \"a/b cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j ACCEPT\nCOMMIT\n";
        let c = rs(reordered);
        assert!(plan(&e, &c, false).is_empty());
    }

    #[test]
    fn missing_jump_stale_chain_and_foreign_chain() {
        let current = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n:DOCKER - [0:0]\n\
-A PREROUTING -j DOCKER\n\
-A KUBE-SERVICES -m comment --comment \"a/b cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SERVICES -m comment --comment \"c/d cluster IP\" -m tcp -p tcp -d 10.96.0.2 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB\n-A KUBE-SEP-BBBBBBBBBBBBBBBB -j DNAT --to-destination 10.0.0.1:80\n\
-A DOCKER -j RETURN\nCOMMIT\n";
        let e = rs(EXPECTED);
        let c = rs(current);
        let p = plan(&e, &c, false);
        assert_eq!(p.count(ChainAction::Rewrite), 1, "{p:#?}");
        assert_eq!(p.count(ChainAction::InsertJumps), 1);
        assert_eq!(p.count(ChainAction::Delete), 1);
        let input = p.restore_input();
        assert!(
            input.contains(":KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n"),
            "{input}"
        );
        assert!(input.contains("-I PREROUTING 1 -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n"), "{input}");
        assert!(input.contains("-X KUBE-SEP-BBBBBBBBBBBBBBBB\n"), "{input}");
        assert!(!input.contains("DOCKER"), "foreign chain touched: {input}");
        assert!(
            !input.contains(":PREROUTING"),
            "built-in chain declared (would reset its policy): {input}"
        );
    }

    #[test]
    fn stale_chain_referenced_by_foreign_rule_is_kept() {
        let current = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n:CUSTOM - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A KUBE-SERVICES -m comment --comment \"a/b cluster IP\" -m tcp -p tcp -d 10.96.0.1 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SERVICES -m comment --comment \"c/d cluster IP\" -m tcp -p tcp -d 10.96.0.2 --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j ACCEPT\n-A CUSTOM -j KUBE-SEP-BBBBBBBBBBBBBBBB\nCOMMIT\n";
        let p = plan(&rs(EXPECTED), &rs(current), false);
        assert_eq!(p.count(ChainAction::KeepReferenced), 1);
        assert!(p.is_empty(), "a kept chain alone is no change");
    }
}
