//! A by-name view over a [`Ruleset`] for the graph builder: per table, the chain names sorted (so
//! the graph is deterministic) over the model's own chain and jump indexes.

use crate::model::{RuleEntry, Ruleset, TableRules};
use crate::parsers::iptables::{Match, Module, Rule};
use std::collections::BTreeMap;

pub(crate) use crate::model::BUILTIN_CHAINS;

/// One table's chains: a sorted, jump-indexed view over a [`TableRules`] (the rules are not copied).
#[derive(Debug)]
pub(crate) struct TableIndex<'d, 'a> {
    /// The table.
    pub table: &'d TableRules<'a>,
    /// Every chain name that is declared or has rules, sorted (iterate this for a stable order).
    pub names: Vec<&'a str>,
    /// Whether any chain is declared with `:NAME` / `-N NAME` / `-P NAME`.
    pub any_declared: bool,
}

impl<'d, 'a> TableIndex<'d, 'a> {
    /// Rules of `chain`, in effective order (`-I`, `-F`, `-X` applied by the model; empty when absent).
    pub fn rules(&self, chain: &str) -> &'d [RuleEntry<'a>] {
        self.table.rules(chain)
    }

    /// Whether `chain` is declared with `:NAME` / `-N NAME` / `-P NAME`.
    pub fn is_declared(&self, chain: &str) -> bool {
        self.table
            .chain(chain)
            .is_some_and(|c| c.declared_at.is_some())
    }

    /// Every rule of the table, chain by chain.
    pub fn all_rules(&self) -> impl Iterator<Item = &'d RuleEntry<'a>> + '_ {
        self.table.chains.iter().flat_map(|c| c.rules.iter())
    }
}

/// Index of every table of a ruleset.
#[derive(Debug, Default)]
pub(crate) struct DumpIndex<'d, 'a> {
    /// Tables by name.
    pub tables: BTreeMap<&'a str, TableIndex<'d, 'a>>,
}

impl<'d, 'a> DumpIndex<'d, 'a> {
    /// Indexes `rs`.
    pub fn new(rs: &'d Ruleset<'a>) -> Self {
        let mut idx = DumpIndex::default();
        for t in &rs.tables {
            let mut names: Vec<&'a str> = t.chains.iter().map(|c| c.name).collect();
            names.sort_unstable();
            names.dedup();
            let ti = TableIndex {
                table: t,
                names,
                any_declared: t.chains.iter().any(|c| c.declared_at.is_some()),
            };
            idx.tables.insert(t.name, ti);
        }
        idx
    }

    /// The table `name`, if present.
    pub fn table(&self, name: &str) -> Option<&TableIndex<'d, 'a>> {
        self.tables.get(name)
    }
}

/// The user chain a rule jumps or goes to.
pub(crate) fn jump_target<'a>(r: &Rule<'a>) -> Option<&'a str> {
    r.jump_target()
}

/// The rule's comment, if any and written without escapes. Comments with escapes (`\"`, `\'`,
/// `\\`) are never kube-proxy's: its comments are built from service names, which cannot hold
/// those characters.
pub(crate) fn comment<'a>(r: &Rule<'a>) -> Option<&'a str> {
    r.matches().find_map(|m| match m {
        Match::Module(Module::Comment(c)) => c.borrowed(),
        _ => None,
    })
}

/// True when the rule's only matches are ones every packet reaching the chain satisfies in
/// practice: comments, a plain `-p`/`-m tcp` without ports, and nfacct counters.
pub(crate) fn is_unconditional(r: &Rule<'_>) -> bool {
    r.matches().all(|m| match m {
        Match::Module(Module::Comment(_)) | Match::Module(Module::Nfacct(_)) => true,
        Match::Protocol(p) => !p.negated,
        Match::Module(Module::Ports {
            sport: None,
            dport: None,
            other,
            ..
        }) => other.is_empty(),
        _ => false,
    })
}
