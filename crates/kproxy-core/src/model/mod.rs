//! The one canonical representation of rules; every comparison goes through its equality.
//!
//! A [`Ruleset`] is built from one parsed [`Dump`]: tables → chains (declaration and ordered rules),
//! indexed by name, with the effect of `-I`, `-F` and `-X` applied. Rules are equal exactly when
//! their canonical forms are — the rule as `iptables-save` would print it ([`canonical`] lists the
//! normalisations). The canonical text is made on demand ([`RuleEntry::canonical`]); comparisons
//! of whole rulesets go through its 128-bit [`Fingerprint`] instead, which needs no allocation per
//! rule. [`serialize`] prints a ruleset back as `iptables-restore` input.

pub mod canonical;
pub mod hashing;
mod name_index;
pub mod nft_names;
pub mod serialize;

use std::collections::HashMap;
use std::ops::Deref;
use std::sync::OnceLock;

use kproxy_parsers::ParseError;
use kproxy_parsers::iptables::{
    ChainCommandKind, ChainDecl, Counters, Dump, Family, NameHash, ParseOptions, Rule, RuleOp,
    parse_dump,
};

pub use canonical::{CanonicalRule, Fingerprint};
pub use name_index::NameIndex;

/// Built-in chains (of any table); never "undeclared".
pub const BUILTIN_CHAINS: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// One rule of a chain: the parsed rule (matches, target, raw text, line).
#[derive(Debug, Clone)]
pub struct RuleEntry<'a> {
    /// The parsed rule.
    pub rule: Rule<'a>,
}

impl<'a> Deref for RuleEntry<'a> {
    type Target = Rule<'a>;
    fn deref(&self) -> &Rule<'a> {
        &self.rule
    }
}

impl RuleEntry<'_> {
    /// The rule's canonical form in a ruleset of `family` (what `iptables-save` prints).
    pub fn canonical(&self, family: Family) -> CanonicalRule {
        CanonicalRule::of(&self.rule, family)
    }

    /// Whether both rules are the same rule (equal canonical forms) in a ruleset of `family`.
    pub fn same_as(&self, other: &RuleEntry<'_>, family: Family) -> bool {
        let mut buf = String::new();
        Fingerprint::of(&self.rule, family, &mut buf)
            == Fingerprint::of(&other.rule, family, &mut buf)
    }
}

/// A chain: declaration facts and its rules in effective order.
#[derive(Debug, Clone)]
pub struct Chain<'a> {
    /// Chain name.
    pub name: &'a str,
    /// Policy of a built-in chain (`ACCEPT`/`DROP`); `None` for user chains.
    pub policy: Option<&'a str>,
    /// Chain counters, when printed.
    pub counters: Option<Counters>,
    /// Line of the declaration (`:NAME`, `-N`, `-P`); `None` when the chain only appears in `-A` lines.
    pub declared_at: Option<u32>,
    /// Rules in effective order (`-I` applied, `-F` applied).
    pub rules: Vec<RuleEntry<'a>>,
}

impl<'a> Chain<'a> {
    /// Whether the chain is a built-in chain.
    pub fn is_builtin(&self) -> bool {
        BUILTIN_CHAINS.contains(&self.name)
    }

    /// Whether both chains hold the same rules in the same order (canonical equality in a
    /// ruleset of `family`).
    pub fn same_rules(&self, other: &Chain<'_>, family: Family) -> bool {
        let mut buf = String::new();
        self.rules.len() == other.rules.len()
            && self.rules.iter().zip(&other.rules).all(|(a, b)| {
                Fingerprint::of(&a.rule, family, &mut buf)
                    == Fingerprint::of(&b.rule, family, &mut buf)
            })
    }
}

/// A reference to a rule by chain and position (0-based) inside one table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RuleRef {
    /// Index of the chain in [`TableRules::chains`].
    pub chain: u32,
    /// Index of the rule in that chain.
    pub rule: u32,
}

/// The name of chain `i` of `chains` (for [`NameIndex`]).
fn chain_names<'c>(chains: &'c [Chain<'_>]) -> impl Fn(u32) -> &'c str + Copy {
    move |i| chains.get(i as usize).map_or("", |c| c.name)
}

/// Jump/goto target → the rules that jump there, as one array grouped by target chain (no
/// vector and no map entry per target: a large node has 100k of them), and each jump's target
/// resolved once, in rule order (so nothing looks a jump's target up by name again). Targets
/// that are chains of the table are found through the table's own name index; the few that are
/// not (undeclared chains) get a small map of their own.
#[derive(Debug, Default)]
struct JumpIndex<'a> {
    /// Per slot (chain index, then absent targets): where its referrers start in `refs`, with
    /// one entry more than slots.
    start: Vec<u32>,
    /// Targets that are not chains of the table → their slot (from `chains.len()` on).
    absent: HashMap<&'a str, u32, NameHash>,
    /// Referring rules, grouped by target, in chain then rule order within a group.
    refs: Vec<RuleRef>,
    /// The target slot of every jump, in chain then rule order.
    targets: Vec<u32>,
    /// Per chain: where its jumps start in `targets`, with one entry more than chains.
    targets_start: Vec<u32>,
}

impl<'a> JumpIndex<'a> {
    fn new(chains: &[Chain<'a>], index: &NameIndex) -> Self {
        // The target slot of every jump (in rule order), then a counting sort of the jumps by slot.
        let mut absent: HashMap<&'a str, u32, NameHash> = HashMap::default();
        let mut targets: Vec<u32> = Vec::new();
        let mut targets_start: Vec<u32> = Vec::with_capacity(chains.len() + 1);
        // Scratch: the rule (in its chain) of every jump.
        let mut rule_of: Vec<u32> = Vec::new();
        for c in chains {
            targets_start.push(targets.len() as u32);
            for (ri, r) in c.rules.iter().enumerate() {
                let Some(t) = r.rule.jump_target() else {
                    continue;
                };
                rule_of.push(ri as u32);
                let slot = match index.get(t, chain_names(chains)) {
                    Some(i) => i as u32,
                    None => {
                        let next = (chains.len() + absent.len()) as u32;
                        *absent.entry(t).or_insert(next)
                    }
                };
                targets.push(slot);
            }
        }
        targets_start.push(targets.len() as u32);
        let mut start = vec![0u32; chains.len() + absent.len() + 1];
        for slot in &targets {
            start[*slot as usize + 1] += 1;
        }
        for i in 1..start.len() {
            start[i] += start[i - 1];
        }
        let mut fill = start.clone();
        let mut refs = vec![RuleRef { chain: 0, rule: 0 }; targets.len()];
        for (ci, bounds) in targets_start.windows(2).enumerate() {
            let jumps = bounds[0] as usize..bounds[1] as usize;
            for (&slot, &rule) in targets[jumps.clone()].iter().zip(&rule_of[jumps]) {
                let next = &mut fill[slot as usize];
                refs[*next as usize] = RuleRef {
                    chain: ci as u32,
                    rule,
                };
                *next += 1;
            }
        }
        JumpIndex {
            start,
            absent,
            refs,
            targets,
            targets_start,
        }
    }

    fn slot(&self, target: &str, chains: &[Chain<'_>], index: &NameIndex) -> Option<usize> {
        index
            .get(target, chain_names(chains))
            .or_else(|| self.absent.get(target).map(|&s| s as usize))
    }

    fn of_slot(&self, slot: usize) -> &[RuleRef] {
        group(&self.refs, &self.start, slot)
    }

    fn of(&self, target: &str, chains: &[Chain<'_>], index: &NameIndex) -> &[RuleRef] {
        self.slot(target, chains, index)
            .map_or(&[], |s| self.of_slot(s))
    }

    /// The target slots of the jumps of chain `chain`, in rule order.
    fn targets_of(&self, chain: usize) -> &[u32] {
        group(&self.targets, &self.targets_start, chain)
    }
}

/// Group `i` of `items`, whose groups start at `starts` (one entry more than groups); empty
/// when there is no such group.
fn group<'s, T>(items: &'s [T], starts: &[u32], i: usize) -> &'s [T] {
    match (starts.get(i), starts.get(i + 1)) {
        (Some(&s), Some(&e)) => items.get(s as usize..e as usize).unwrap_or(&[]),
        _ => &[],
    }
}

/// Where a rule jumps (`-j CHAIN`) or goes (`-g CHAIN`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JumpTo<'a> {
    /// The target's name.
    pub name: &'a str,
    /// The target's index in [`TableRules::chains`]; `None` when the table has no such chain.
    pub chain: Option<usize>,
}

/// One table's chains.
#[derive(Debug)]
pub struct TableRules<'a> {
    /// Table name.
    pub name: &'a str,
    /// Chains in declaration order; chains that only appear in rules follow, in first-use order.
    pub chains: Vec<Chain<'a>>,
    /// Chains deleted with `-X` (restore input of a sync that removes stale chains).
    pub deleted: Vec<&'a str>,
    /// Whether every text block of this table ended with `COMMIT`.
    pub committed: bool,
    /// The ruleset's address family (canonical forms depend on it).
    pub family: Family,
    index: NameIndex,
    jumps: OnceLock<JumpIndex<'a>>,
}

impl<'a> TableRules<'a> {
    fn new(name: &'a str, family: Family) -> Self {
        TableRules {
            name,
            chains: Vec::new(),
            deleted: Vec::new(),
            committed: true,
            family,
            index: NameIndex::default(),
            jumps: OnceLock::new(),
        }
    }

    /// The chain `name`.
    pub fn chain(&self, name: &str) -> Option<&Chain<'a>> {
        self.index
            .get(name, chain_names(&self.chains))
            .and_then(|i| self.chains.get(i))
    }

    /// The index of chain `name` in [`TableRules::chains`].
    pub fn position(&self, name: &str) -> Option<usize> {
        self.index.get(name, chain_names(&self.chains))
    }

    /// Rules of chain `name` (empty when the chain is absent).
    pub fn rules(&self, name: &str) -> &[RuleEntry<'a>] {
        self.chain(name).map_or(&[], |c| c.rules.as_slice())
    }

    /// Jump/goto target → the rules that jump there, built on first use.
    fn jump_index(&self) -> &JumpIndex<'a> {
        self.jumps
            .get_or_init(|| JumpIndex::new(&self.chains, &self.index))
    }

    /// Jump targets that are not chains of this table (undeclared chains), in no fixed order.
    pub fn absent_jump_targets(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.jump_index().absent.keys().copied()
    }

    /// The rules of chain `chain` (an index into [`TableRules::chains`]) in order, each with
    /// where it jumps or goes to, if anywhere. The targets were resolved once for the whole table:
    /// no name is looked up.
    pub fn rules_with_jumps(
        &self,
        chain: usize,
    ) -> impl Iterator<Item = (&RuleEntry<'a>, Option<JumpTo<'a>>)> + '_ {
        let rules = self
            .chains
            .get(chain)
            .map_or(&[][..], |c| c.rules.as_slice());
        let mut slots = self.jump_index().targets_of(chain).iter();
        let n = self.chains.len();
        rules.iter().map(move |r| {
            let to = r.rule.jump_target().map(|name| JumpTo {
                name,
                chain: slots.next().map(|&s| s as usize).filter(|&s| s < n),
            });
            (r, to)
        })
    }

    /// The rules that jump (`-j`) or go (`-g`) to the chain at index `chain`, in chain then
    /// rule order.
    pub fn jumps_to_chain(
        &self,
        chain: usize,
    ) -> impl Iterator<Item = (&Chain<'a>, &RuleEntry<'a>)> + '_ {
        let refs = if chain < self.chains.len() {
            self.jump_index().of_slot(chain)
        } else {
            &[]
        };
        refs.iter().filter_map(|r| self.at(*r))
    }

    /// Whether some rule jumps or goes to chain `name`.
    pub fn is_jump_target(&self, name: &str) -> bool {
        !self
            .jump_index()
            .of(name, &self.chains, &self.index)
            .is_empty()
    }

    /// Whether some rule jumps or goes to the chain at index `chain`.
    pub fn is_jumped_to(&self, chain: usize) -> bool {
        !self.jump_index().of_slot(chain).is_empty()
    }

    /// The rules that jump (`-j`) or go (`-g`) to chain `name`, in chain then rule order.
    pub fn jumps_to(&self, name: &str) -> impl Iterator<Item = (&Chain<'a>, &RuleEntry<'a>)> + '_ {
        self.jump_index()
            .of(name, &self.chains, &self.index)
            .iter()
            .filter_map(|r| self.at(*r))
    }

    /// The canonical form of `r` (a rule of this table).
    pub fn canonical(&self, r: &RuleEntry<'_>) -> CanonicalRule {
        r.canonical(self.family)
    }

    /// The rule at `r`, with its chain.
    fn at(&self, r: RuleRef) -> Option<(&Chain<'a>, &RuleEntry<'a>)> {
        let c = self.chains.get(r.chain as usize)?;
        Some((c, c.rules.get(r.rule as usize)?))
    }

    /// The rule at `r`.
    pub fn get(&self, r: RuleRef) -> Option<&RuleEntry<'a>> {
        self.at(r).map(|(_, e)| e)
    }

    /// The index of chain `name`, creating the chain when absent.
    fn chain_index(&mut self, name: &'a str) -> usize {
        match self.index.get(name, chain_names(&self.chains)) {
            Some(i) => i,
            None => {
                self.chains.push(Chain {
                    name,
                    policy: None,
                    counters: None,
                    declared_at: None,
                    rules: Vec::new(),
                });
                self.index
                    .insert(self.chains.len() - 1, chain_names(&self.chains));
                self.chains.len() - 1
            }
        }
    }

    fn chain_mut(&mut self, name: &'a str) -> &mut Chain<'a> {
        let idx = self.chain_index(name);
        &mut self.chains[idx]
    }

    fn declare(&mut self, d: &ChainDecl<'a>) {
        let c = self.chain_mut(d.name);
        c.declared_at.get_or_insert(d.line);
        if d.policy.is_some() {
            c.policy = d.policy;
        }
        if d.counters.is_some() {
            c.counters = d.counters;
        }
    }

    fn remove_chain(&mut self, name: &'a str) {
        if let Some(i) = self.index.remove(name, chain_names(&self.chains)) {
            self.chains.remove(i);
            for v in self.index.positions_mut() {
                if *v as usize > i {
                    *v -= 1;
                }
            }
        }
        if !self.deleted.contains(&name) {
            self.deleted.push(name);
        }
    }
}

/// A whole ruleset: every table of one dump.
#[derive(Debug)]
pub struct Ruleset<'a> {
    /// Address family (decides REJECT/recent defaults in canonical forms).
    pub family: Family,
    /// Tables in input order (a table that appears twice in the input is merged).
    pub tables: Vec<TableRules<'a>>,
}

impl<'a> Ruleset<'a> {
    /// Builds the ruleset of `dump`.
    pub fn from_dump(dump: Dump<'a>) -> Self {
        let family = dump.family;
        let mut tables: Vec<TableRules<'a>> = Vec::new();
        for t in dump.tables {
            let ti = match tables.iter().position(|x| x.name == t.name) {
                Some(i) => i,
                None => {
                    tables.push(TableRules::new(t.name, family));
                    tables.len() - 1
                }
            };
            let Some(table) = tables.get_mut(ti) else {
                continue;
            };
            table.committed &= t.committed;
            table.chains.reserve(t.chains.len());
            table
                .index
                .reserve(t.chains.len(), chain_names(&table.chains));
            for d in &t.chains {
                table.declare(d);
            }
            // Apply commands in line order relative to rules.
            let mut commands = t.commands.into_iter().peekable();
            // The parser grouped the rules by chain: map its chains to ours once, and size each
            // chain's rule list exactly (most chains hold 1–3 rules; growth would double them).
            // A rule's chain is known only through that grouping (`Table::rule_chain`).
            let mut placed: Vec<usize> = Vec::with_capacity(t.rule_chains.len());
            for (name, n) in &t.rule_chains {
                let ci = table.chain_index(name);
                if let Some(c) = table.chains.get_mut(ci) {
                    c.rules.reserve_exact(*n as usize);
                }
                placed.push(ci);
            }
            let mut ids = t.rule_chain.into_iter();
            // After a command (`-X`/`-F`) chain indices may have moved: place by name from then on.
            let mut by_name = false;
            let mut last: Option<(&'a str, usize)> = None;
            // Consume the parsed rules from the back of a reversed list, handing their memory back
            // as we go: without this the dump's whole rule list and the chains' copies of it are
            // alive at once, which for a 10k-service dump is the peak of the whole build.
            let mut pending = t.rules;
            pending.reverse();
            let slack = (pending.len() / 16).max(4096);
            while let Some(rule) = pending.pop() {
                if pending.capacity() - pending.len() > slack {
                    pending.shrink_to_fit();
                }
                let Some(id) = ids.next().map(|i| i as usize) else {
                    continue;
                };
                while let Some(cmd) = commands.next_if(|c| c.line < rule.line) {
                    apply_command(table, cmd.kind, cmd.chain);
                    by_name = true;
                    last = None;
                }
                let ci = match (by_name, placed.get(id)) {
                    (false, Some(&ci)) => ci,
                    _ => {
                        let Some(&(name, _)) = t.rule_chains.get(id) else {
                            continue;
                        };
                        match last {
                            Some((last_name, i)) if last_name == name => i,
                            _ => {
                                let i = table.chain_index(name);
                                last = Some((name, i));
                                i
                            }
                        }
                    }
                };
                let op = rule.op;
                let Some(chain) = table.chains.get_mut(ci) else {
                    continue;
                };
                let entry = RuleEntry { rule };
                match op {
                    RuleOp::Append => chain.rules.push(entry),
                    RuleOp::Insert(n) => {
                        let pos = (n.get() as usize - 1).min(chain.rules.len());
                        chain.rules.insert(pos, entry);
                    }
                }
            }
            for cmd in commands {
                apply_command(table, cmd.kind, cmd.chain);
            }
        }
        Ruleset { family, tables }
    }

    /// Parses `text` and builds its ruleset.
    pub fn parse(text: &'a str, opts: &ParseOptions) -> Result<Self, ParseError> {
        Ok(Ruleset::from_dump(parse_dump(text, opts)?))
    }

    /// The table `name`.
    pub fn table(&self, name: &str) -> Option<&TableRules<'a>> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// The chain `name` of table `table`.
    pub fn chain(&self, table: &str, name: &str) -> Option<&Chain<'a>> {
        self.table(table)?.chain(name)
    }

    /// The rules of chain `name` of `table` (empty when absent).
    pub fn rules(&self, table: &str, name: &str) -> &[RuleEntry<'a>] {
        self.table(table).map_or(&[], |t| t.rules(name))
    }

    /// The rules of `table` that jump or go to chain `name`, with the chain that holds each.
    pub fn jumps_to<'s>(
        &'s self,
        table: &str,
        name: &'s str,
    ) -> Box<dyn Iterator<Item = (&'s Chain<'a>, &'s RuleEntry<'a>)> + 's> {
        match self.table(table) {
            Some(t) => Box::new(t.jumps_to(name)),
            None => Box::new(std::iter::empty()),
        }
    }

    /// Total number of rules.
    pub fn rule_count(&self) -> usize {
        self.tables
            .iter()
            .flat_map(|t| &t.chains)
            .map(|c| c.rules.len())
            .sum()
    }

    /// Semantic equality of two rulesets: same tables, same chains (by name, any order), same
    /// policies, and the same rules in the same order per chain (canonical forms in this
    /// ruleset's family). Counters are ignored.
    pub fn same_rules(&self, other: &Ruleset<'_>) -> bool {
        self.tables.len() == other.tables.len()
            && self.tables.iter().all(|t| {
                other.table(t.name).is_some_and(|o| {
                    t.chains.len() == o.chains.len()
                        && t.chains.iter().all(|c| {
                            o.chain(c.name).is_some_and(|oc| {
                                oc.policy == c.policy && c.same_rules(oc, self.family)
                            })
                        })
                })
            })
    }
}

fn apply_command<'a>(table: &mut TableRules<'a>, kind: ChainCommandKind, chain: &'a str) {
    match kind {
        ChainCommandKind::Flush if chain.is_empty() => {
            table.chains.iter_mut().for_each(|c| c.rules.clear())
        }
        ChainCommandKind::Flush => table.chain_mut(chain).rules.clear(),
        ChainCommandKind::Delete if chain.is_empty() => {
            let user: Vec<&'a str> = table
                .chains
                .iter()
                .filter(|c| !c.is_builtin())
                .map(|c| c.name)
                .collect();
            for c in user {
                table.remove_chain(c);
            }
        }
        ChainCommandKind::Delete => table.remove_chain(chain),
        ChainCommandKind::Zero => {}
    }
    table.jumps = OnceLock::new();
}
