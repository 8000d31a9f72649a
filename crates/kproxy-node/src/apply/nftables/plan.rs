//! The repair plan of one family's `kube-proxy` table: the `nft -f` transaction that changes only
//! what differs from the render ([`crate::compare::nftables::diff`]), and a description of each
//! change for the dry run. Only `table ip kube-proxy` / `table ip6 kube-proxy` is named, never
//! another table.
//!
//! The transaction, in the order `nft -f` needs:
//! 1. `flush chain` of every chain whose rules are rewritten or that goes away (which also drops
//!    the references its rules hold);
//! 2. `delete element` of elements that are not kube-proxy's or lead elsewhere;
//! 3. `delete set|map` of sets declared differently or not kube-proxy's, `delete chain` of chains
//!    hooked differently or not kube-proxy's, and of named objects that are not kube-proxy's;
//! 4. `add chain`, `add set|map` (the render's own lines);
//! 5. `add rule` (the render's own lines, in order);
//! 6. `add element`.
//!
//! kube-proxy deletes a chain that a map element led to only in a later transaction, because
//! kernels before 6.2 notice only a moment later that the chain is unreferenced
//! (`pkg/proxy/nftables/proxier.go`, stale chains): on those kernels such a chain is flushed
//! here and deleted by a later repair; a flushed chain that nothing refers to is no drift.

use crate::compare::nftables::diff::{ChainDiff, SetDiff, TableDiff, target};
use kproxy_parsers::nft::{Chain, Element, Expr, Family, Rule, Stmt, Table};
use serde::Serialize;
use std::collections::{BTreeSet, HashMap};
use std::fmt::Write as _;

/// What happens to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Added (it is missing).
    Create,
    /// Flushed and refilled with the expected rules.
    Rewrite,
    /// Deleted and added again (hooked or declared differently).
    Recreate,
    /// Deleted (not kube-proxy's, or stale).
    Delete,
    /// Flushed and left empty (deleted by a later repair, see the module doc).
    Flush,
    /// Some of its elements added, deleted or replaced.
    Elements,
}

impl Action {
    /// The word of the text plan.
    pub fn word(self) -> &'static str {
        match self {
            Action::Create => "create",
            Action::Rewrite => "rewrite",
            Action::Recreate => "recreate",
            Action::Delete => "delete",
            Action::Flush => "flush",
            Action::Elements => "elements",
        }
    }
}

/// One change of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    /// `table`, `chain`, `set`, `map`, or a named object's kind (`counter`, …).
    pub object: String,
    /// Its name.
    pub name: String,
    /// What happens to it.
    pub action: Action,
    /// Rules or elements that go (as nft lists them).
    pub removed: Vec<String>,
    /// Rules or elements that come.
    pub added: Vec<String>,
    /// The rules a created, rewritten or recreated chain holds once the change is applied, as
    /// nft lists them; for a created table, everything it holds ([`table_contents`]); empty
    /// for other changes: what a rollback compares the object with.
    #[serde(skip)]
    pub written: Vec<String>,
    /// Why, when it is not obvious.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The plan of one family.
#[derive(Debug, Clone, Serialize)]
pub struct FamilyPlan {
    /// `ip` or `ip6`.
    pub family: String,
    /// The table: `table ip kube-proxy`.
    pub table: String,
    /// The changes, tables first, then chains, sets and maps by name.
    pub changes: Vec<Change>,
    /// The `nft -f` transaction ("" when nothing changes).
    #[serde(skip)]
    pub script: String,
}

impl FamilyPlan {
    /// True when nothing changes.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }
}

/// The plan of a node: one transaction per family.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NftPlan {
    /// Per family (`ip` first).
    pub families: Vec<FamilyPlan>,
    /// Every expected chain was rewritten (`--full`).
    pub full: bool,
    /// The Services whose API object was left out as invalid, and what of theirs the node's
    /// tables hold: left as they are.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_alone: Vec<crate::compare::left_out::NotChecked>,
}

impl NftPlan {
    /// True when nothing changes.
    pub fn is_empty(&self) -> bool {
        self.families.iter().all(FamilyPlan::is_empty)
    }

    /// Every family's transaction, one after the other.
    pub fn script(&self) -> String {
        self.families.iter().map(|f| f.script.as_str()).collect()
    }

    /// How many changes of `action`.
    pub fn count(&self, action: Action) -> usize {
        self.families
            .iter()
            .flat_map(|f| &f.changes)
            .filter(|c| c.action == action)
            .count()
    }
}

/// The render's own lines, by object: what the transaction adds is exactly what kube-proxy
/// writes (knftables' text).
#[derive(Debug, Default)]
struct RenderLines<'r> {
    chains: HashMap<&'r str, &'r str>,
    sets: HashMap<&'r str, &'r str>,
    rules: HashMap<&'r str, Vec<&'r str>>,
}

impl<'r> RenderLines<'r> {
    /// Indexes the `add chain|set|map` lines of `text`, and the `add rule` lines of the chains
    /// in `rule_chains`.
    fn index(text: &'r str, rule_chains: &BTreeSet<&str>) -> RenderLines<'r> {
        let mut out = RenderLines::default();
        for line in text.lines() {
            let mut w = line.splitn(6, ' ');
            let (Some("add"), Some(kind), Some(_family), Some(_table), Some(name)) =
                (w.next(), w.next(), w.next(), w.next(), w.next())
            else {
                continue;
            };
            match kind {
                "chain" => {
                    out.chains.insert(name, line);
                }
                "set" | "map" => {
                    out.sets.insert(name, line);
                }
                "rule" if rule_chains.contains(name) => {
                    out.rules.entry(name).or_default().push(line);
                }
                _ => {}
            }
        }
        out
    }
}

/// A name as nft reads it: bare when it is made of the characters kube-proxy's names use,
/// else quoted.
pub(super) fn name(n: &str) -> String {
    let bare = n.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c));
    if bare {
        n.to_string()
    } else {
        format!("\"{}\"", n.replace('"', ""))
    }
}

/// An element as `add element` writes it (key, comment, value).
fn element_text(e: &Element<'_>) -> String {
    e.to_string()
}

/// An element's key alone (what `delete element` names).
fn key_text(e: &Element<'_>) -> String {
    Element::key(e.key.clone()).to_string()
}

/// The chains and sets one chain's rules refer to.
pub(super) fn rule_refs<'t>(c: &'t Chain<'_>) -> (Vec<&'t str>, Vec<&'t str>) {
    let mut chains = Vec::new();
    let mut sets = Vec::new();
    let expr = |e: &'t Expr<'_>, sets: &mut Vec<&'t str>, chains: &mut Vec<&'t str>| match e {
        Expr::SetRef(s) => sets.push(s.as_ref()),
        Expr::Set(elements) => {
            for el in elements {
                if let Some(Expr::Verdict(v)) = &el.value {
                    chains.extend(target(v));
                }
            }
        }
        _ => {}
    };
    for r in &c.rules {
        for s in &r.stmts {
            match s {
                Stmt::Verdict(v) => chains.extend(target(v)),
                Stmt::Match { right, .. } => expr(right, &mut sets, &mut chains),
                Stmt::Vmap { map, .. } => expr(map, &mut sets, &mut chains),
                Stmt::SetUpdate { set, .. } => sets.push(set.as_ref()),
                _ => {}
            }
        }
    }
    (chains, sets)
}

/// Expected rules the node lacks and the node's rules kube-proxy would not write.
fn unmatched(expected: &[Rule<'_>], actual: &[Rule<'_>]) -> (Vec<String>, Vec<String>) {
    let mut used = vec![false; actual.len()];
    let mut added = Vec::new();
    for e in expected {
        match (0..actual.len()).find(|&i| !used[i] && actual[i] == *e) {
            Some(i) => used[i] = true,
            None => added.push(e.to_string()),
        }
    }
    let removed = actual
        .iter()
        .zip(&used)
        .filter(|(_, u)| !**u)
        .map(|(a, _)| a.to_string())
        .collect();
    (added, removed)
}

/// What the plan needs besides the diff.
#[derive(Debug, Clone, Copy)]
pub struct PlanContext<'r> {
    /// The render's `add …` lines of this family.
    pub render: &'r str,
    /// The kernel drops a chain's references from map elements within the transaction that
    /// deletes the elements (Linux 6.2 and later), so such a chain can go in the same one.
    pub same_transaction_delete: bool,
    /// Rewrite every expected chain, as a kube-proxy full sync does.
    pub full: bool,
}

/// Plans one family from its diff. `expected` and `actual` are the normalised tables the diff
/// was made of.
pub fn plan_family(
    d: &TableDiff<'_, '_, '_>,
    expected: &Table<'_>,
    actual: Option<&Table<'_>>,
    cx: &PlanContext<'_>,
) -> FamilyPlan {
    let family = d.family;
    let table = format!("table {family} kube-proxy");
    let mut plan = FamilyPlan {
        family: family.to_string(),
        table: table.clone(),
        changes: Vec::new(),
        script: String::new(),
    };
    let Some(actual) = actual else {
        plan.changes.push(Change {
            object: "table".into(),
            name: format!("{family} kube-proxy"),
            action: Action::Create,
            removed: Vec::new(),
            added: Vec::new(),
            written: table_contents(expected),
            note: Some(format!(
                "{} chains, {} sets and maps, {} rules, {} elements",
                expected.chains.len(),
                expected.sets.len(),
                expected.chains.iter().map(|c| c.rules.len()).sum::<usize>(),
                expected
                    .sets
                    .iter()
                    .map(|s| s.elements.len())
                    .sum::<usize>()
            )),
        });
        plan.script = format!("# kubectl-kproxy repair: {table} (created)\n{}", cx.render);
        return plan;
    };
    Builder::new(family, expected, actual, cx).build(d, plan)
}

/// Everything a table holds, one line per object and per rule or element, in the form a
/// rollback compares (rules in their chain's order, elements sorted): what a created table's
/// change records as written ([`Change::written`]).
pub fn table_contents(t: &Table<'_>) -> Vec<String> {
    let mut out = Vec::new();
    for c in &t.chains {
        out.push(format!("chain {}", c.name));
        out.extend(
            c.rules
                .iter()
                .enumerate()
                .map(|(i, r)| format!("chain {} rule {i}: {r}", c.name)),
        );
    }
    for x in &t.sets {
        let kind = if x.is_map { "map" } else { "set" };
        out.push(format!("{kind} {}", x.name));
        let mut elements: Vec<String> = x
            .elements
            .iter()
            .map(|e| format!("{kind} {} element: {e}", x.name))
            .collect();
        elements.sort_unstable();
        out.extend(elements);
    }
    out.extend(t.objects.iter().map(|o| format!("{} {}", o.kind, o.name)));
    out.sort_unstable();
    out
}

/// Assembles one family's transaction.
struct Builder<'p, 'e, 'a, 'r> {
    family: Family,
    expected: &'p Table<'e>,
    actual: &'p Table<'a>,
    cx: &'p PlanContext<'r>,
    /// Expected chains flushed and refilled.
    rewrite: BTreeSet<&'p str>,
    /// Expected chains deleted and added again with their hook.
    recreate: BTreeSet<&'p str>,
    /// Missing chains.
    create: BTreeSet<&'p str>,
    /// Chains that go: flushed, then deleted unless `keep_flushed`.
    stale: BTreeSet<&'p str>,
    /// Stale chains only flushed (a map element led to them; kernels before 6.2).
    keep_flushed: BTreeSet<&'p str>,
    /// Sets and maps deleted and added again (with all expected elements).
    recreate_sets: BTreeSet<&'p str>,
    /// Missing sets and maps.
    create_sets: BTreeSet<&'p str>,
    /// Sets and maps that go.
    stale_sets: BTreeSet<&'p str>,
}

impl<'p, 'e, 'a, 'r> Builder<'p, 'e, 'a, 'r> {
    fn new(
        family: Family,
        expected: &'p Table<'e>,
        actual: &'p Table<'a>,
        cx: &'p PlanContext<'r>,
    ) -> Self {
        Builder {
            family,
            expected,
            actual,
            cx,
            rewrite: BTreeSet::new(),
            recreate: BTreeSet::new(),
            create: BTreeSet::new(),
            stale: BTreeSet::new(),
            keep_flushed: BTreeSet::new(),
            recreate_sets: BTreeSet::new(),
            create_sets: BTreeSet::new(),
            stale_sets: BTreeSet::new(),
        }
    }

    fn head(&self, verb: &str, object: &str, n: &str) -> String {
        format!("{verb} {object} {} kube-proxy {}", self.family, name(n))
    }

    fn build(mut self, d: &'p TableDiff<'p, 'e, 'a>, mut plan: FamilyPlan) -> FamilyPlan {
        for c in &d.chains {
            match c {
                ChainDiff::Missing { expected } => {
                    self.create.insert(&expected.name);
                }
                ChainDiff::Hook { expected, .. } => {
                    self.recreate.insert(&expected.name);
                }
                ChainDiff::Rules { expected, .. } => {
                    self.rewrite.insert(&expected.name);
                }
                ChainDiff::Extra {
                    actual,
                    from_element,
                } => {
                    self.stale.insert(&actual.name);
                    if *from_element && !self.cx.same_transaction_delete {
                        self.keep_flushed.insert(&actual.name);
                    }
                }
            }
        }
        if self.cx.full {
            for c in &self.expected.chains {
                if !self.create.contains(c.name.as_ref())
                    && !self.recreate.contains(c.name.as_ref())
                {
                    self.rewrite.insert(&c.name);
                }
            }
        }
        for s in &d.sets {
            match s {
                SetDiff::Missing { expected } => {
                    self.create_sets.insert(&expected.name);
                }
                SetDiff::Declaration { expected, .. } => {
                    self.recreate_sets.insert(&expected.name);
                }
                SetDiff::Extra { actual } => {
                    self.stale_sets.insert(&actual.name);
                }
                SetDiff::Elements { .. } => {}
            }
        }
        self.release_references();
        self.changes(d, &mut plan.changes);
        plan.script = self.script(d);
        plan
    }

    /// Chains and sets that are deleted must be unreferenced when they go: every chain whose
    /// rules refer to one is flushed too (and refilled when it is kube-proxy's).
    fn release_references(&mut self) {
        let deleted_chains: BTreeSet<&str> = self
            .recreate
            .iter()
            .chain(self.stale.difference(&self.keep_flushed))
            .copied()
            .collect();
        let deleted_sets: BTreeSet<&str> = self
            .recreate_sets
            .iter()
            .chain(&self.stale_sets)
            .copied()
            .collect();
        if deleted_chains.is_empty() && deleted_sets.is_empty() {
            return;
        }
        let expected_names: BTreeSet<&str> = self
            .expected
            .chains
            .iter()
            .map(|c| c.name.as_ref())
            .collect();
        for c in &self.actual.chains {
            let n: &str = &c.name;
            if self.rewrite.contains(n) || self.recreate.contains(n) || self.stale.contains(n) {
                continue;
            }
            let (chains, sets) = rule_refs(c);
            let holds = chains.iter().any(|x| deleted_chains.contains(x))
                || sets.iter().any(|x| deleted_sets.contains(x));
            if holds {
                if expected_names.contains(n) {
                    self.rewrite.insert(n);
                } else {
                    self.stale.insert(n);
                }
            }
        }
    }

    /// The description of every change.
    fn changes(&self, d: &TableDiff<'_, '_, '_>, out: &mut Vec<Change>) {
        let rules = |c: Option<&Chain<'_>>| -> Vec<String> {
            c.map(|c| c.rules.iter().map(ToString::to_string).collect())
                .unwrap_or_default()
        };
        let chain_change = |n: &str, action: Action, note: Option<String>| {
            let e = self.expected.chains.iter().find(|c| c.name == n);
            let a = self.actual.chains.iter().find(|c| c.name == n);
            let (added, removed) = match action {
                Action::Rewrite => match (e, a) {
                    (Some(e), Some(a)) => unmatched(&e.rules, &a.rules),
                    _ => (rules(e), rules(a)),
                },
                Action::Create => (rules(e), Vec::new()),
                Action::Recreate => (rules(e), rules(a)),
                _ => (Vec::new(), rules(a)),
            };
            let written = match action {
                Action::Create | Action::Rewrite | Action::Recreate => rules(e),
                _ => Vec::new(),
            };
            Change {
                object: "chain".into(),
                name: n.to_string(),
                action,
                removed,
                added,
                written,
                note,
            }
        };
        let mut chains: Vec<Change> = Vec::new();
        for n in &self.create {
            chains.push(chain_change(n, Action::Create, None));
        }
        for n in &self.recreate {
            chains.push(chain_change(
                n,
                Action::Recreate,
                Some("hooked differently: deleted and added with kube-proxy's type, hook and priority".into()),
            ));
        }
        for n in &self.rewrite {
            chains.push(chain_change(n, Action::Rewrite, None));
        }
        for n in &self.stale {
            if self.keep_flushed.contains(n) {
                chains.push(chain_change(
                    n,
                    Action::Flush,
                    Some("a map element led to it: deleted by a later repair (kernels before 6.2 release it late)".into()),
                ));
            } else {
                chains.push(chain_change(n, Action::Delete, None));
            }
        }
        chains.sort_by(|x, y| x.name.cmp(&y.name));
        out.extend(chains);
        for s in &d.sets {
            let object = |is_map: bool| if is_map { "map" } else { "set" };
            let elements = |set: &kproxy_parsers::nft::Set<'_>| -> Vec<String> {
                set.elements.iter().map(element_text).collect()
            };
            let change = match s {
                SetDiff::Missing { expected } => Change {
                    object: object(expected.is_map).into(),
                    name: expected.name.to_string(),
                    action: Action::Create,
                    removed: Vec::new(),
                    added: elements(expected),
                    written: Vec::new(),
                    note: None,
                },
                SetDiff::Declaration { expected, actual } => Change {
                    object: object(expected.is_map).into(),
                    name: expected.name.to_string(),
                    action: Action::Recreate,
                    removed: elements(actual),
                    added: elements(expected),
                    written: Vec::new(),
                    note: Some(
                        "declared differently: deleted and added as kube-proxy declares it".into(),
                    ),
                },
                SetDiff::Extra { actual } => Change {
                    object: object(actual.is_map).into(),
                    name: actual.name.to_string(),
                    action: Action::Delete,
                    removed: Vec::new(),
                    added: Vec::new(),
                    written: Vec::new(),
                    note: None,
                },
                SetDiff::Elements {
                    expected,
                    missing,
                    extra,
                    changed,
                    ..
                } => Change {
                    object: object(expected.is_map).into(),
                    name: expected.name.to_string(),
                    action: Action::Elements,
                    removed: extra
                        .iter()
                        .map(|e| element_text(e))
                        .chain(changed.iter().map(|(_, a)| element_text(a)))
                        .collect(),
                    added: missing
                        .iter()
                        .map(|e| element_text(e))
                        .chain(changed.iter().map(|(e, _)| element_text(e)))
                        .collect(),
                    written: Vec::new(),
                    note: None,
                },
            };
            out.push(change);
        }
        for o in &d.missing_objects {
            out.push(Change {
                object: o.kind.to_string(),
                name: o.name.to_string(),
                action: Action::Create,
                removed: Vec::new(),
                added: Vec::new(),
                written: Vec::new(),
                note: None,
            });
        }
        for o in &d.extra_objects {
            out.push(Change {
                object: o.kind.to_string(),
                name: o.name.to_string(),
                action: Action::Delete,
                removed: Vec::new(),
                added: Vec::new(),
                written: Vec::new(),
                note: None,
            });
        }
    }

    /// The transaction text.
    fn script(&self, d: &TableDiff<'_, '_, '_>) -> String {
        let mut s = String::new();
        let table = format!("table {} kube-proxy", self.family);
        let _ = writeln!(s, "# kubectl-kproxy repair: {table}");
        // 1. Flushes.
        for n in self.rewrite.iter().chain(&self.recreate).chain(&self.stale) {
            let _ = writeln!(s, "{}", self.head("flush", "chain", n));
        }
        // 2. Element deletions (not in sets that are made again).
        for set in &d.sets {
            if let SetDiff::Elements {
                actual,
                extra,
                changed,
                ..
            } = set
            {
                let head = self.head("delete", "element", &actual.name);
                for e in extra.iter().copied().chain(changed.iter().map(|(_, a)| *a)) {
                    let _ = writeln!(s, "{head} {{ {} }}", key_text(e));
                }
            }
        }
        // 3. Deletions.
        for set in self.recreate_sets.iter().chain(&self.stale_sets) {
            let kind = match self.actual.set(set) {
                Some(x) if x.is_map => "map",
                _ => "set",
            };
            let _ = writeln!(s, "{}", self.head("delete", kind, set));
        }
        for n in self
            .recreate
            .iter()
            .chain(self.stale.difference(&self.keep_flushed))
        {
            let _ = writeln!(s, "{}", self.head("delete", "chain", n));
        }
        for o in &d.extra_objects {
            let _ = writeln!(s, "{}", self.head("delete", &o.kind, &o.name));
        }
        // 4. Named objects before the rules that name them (`counter name "…"`).
        for o in &d.missing_objects {
            let _ = writeln!(s, "{}", self.head("add", &o.kind, &o.name));
        }
        // 5.–6. The render's lines for what is added.
        let refill: BTreeSet<&str> = self
            .rewrite
            .iter()
            .chain(&self.recreate)
            .chain(&self.create)
            .copied()
            .collect();
        let lines = RenderLines::index(self.cx.render, &refill);
        for n in self.create.iter().chain(&self.recreate) {
            if let Some(l) = lines.chains.get(n) {
                let _ = writeln!(s, "{l}");
            }
        }
        for n in self.create_sets.iter().chain(&self.recreate_sets) {
            if let Some(l) = lines.sets.get(n) {
                let _ = writeln!(s, "{l}");
            }
        }
        for n in &refill {
            for l in lines.rules.get(n).map(Vec::as_slice).unwrap_or_default() {
                let _ = writeln!(s, "{l}");
            }
        }
        // 7. Elements.
        for n in self.create_sets.iter().chain(&self.recreate_sets) {
            if let Some(set) = self.expected.set(n) {
                let head = self.head("add", "element", n);
                for e in &set.elements {
                    let _ = writeln!(s, "{head} {{ {} }}", element_text(e));
                }
            }
        }
        for set in &d.sets {
            if let SetDiff::Elements {
                expected,
                missing,
                changed,
                ..
            } = set
            {
                let head = self.head("add", "element", &expected.name);
                for e in missing
                    .iter()
                    .copied()
                    .chain(changed.iter().map(|(e, _)| *e))
                {
                    let _ = writeln!(s, "{head} {{ {} }}", element_text(e));
                }
            }
        }
        s
    }
}
