//! A by-name view over a [`Ruleset`] for the graph builder: per table, each chain's rules in order,
//! which chains are declared, and who jumps where (sorted maps, so the graph is deterministic).

use crate::model::{RuleEntry, Ruleset};
use crate::parsers::iptables::{Match, Module, Rule, Target};
use std::collections::{BTreeMap, BTreeSet, HashMap};

pub(crate) use crate::model::BUILTIN_CHAINS;

/// One table's chains.
#[derive(Debug, Default)]
pub(crate) struct TableIndex<'d, 'a> {
    /// Chains declared with `:NAME` / `-N NAME` / `-P NAME`.
    pub declared: BTreeSet<&'a str>,
    /// Every chain name that is declared or has rules, sorted (iterate this for a stable order).
    pub names: Vec<&'a str>,
    /// Rules per chain, in effective order (`-I`, `-F`, `-X` applied by the model).
    pub chains: HashMap<&'a str, Vec<&'d RuleEntry<'a>>>,
    /// For each jump/goto target: the rules that jump there.
    pub jumps_to: HashMap<&'a str, Vec<&'d RuleEntry<'a>>>,
}

impl<'d, 'a> TableIndex<'d, 'a> {
    /// Rules of `chain` (empty when absent).
    pub fn rules(&self, chain: &str) -> &[&'d RuleEntry<'a>] {
        self.chains.get(chain).map_or(&[], |v| v.as_slice())
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
            let ti = idx.tables.entry(t.name).or_default();
            for c in &t.chains {
                if c.declared_at.is_some() {
                    ti.declared.insert(c.name);
                }
                ti.names.push(c.name);
                let list = ti.chains.entry(c.name).or_default();
                for r in &c.rules {
                    list.push(r);
                    if let Some(target) = jump_target(r) {
                        ti.jumps_to.entry(target).or_default().push(r);
                    }
                }
            }
        }
        for ti in idx.tables.values_mut() {
            ti.names.sort_unstable();
            ti.names.dedup();
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
    match r.target {
        Some(Target::Jump(c)) | Some(Target::Goto(c)) => Some(c),
        _ => None,
    }
}

/// The rule's comment, if any.
pub(crate) fn comment<'r>(r: &'r Rule<'_>) -> Option<&'r str> {
    r.matches.iter().find_map(|m| match m {
        Match::Module(Module::Comment(c)) => Some(c.as_ref()),
        _ => None,
    })
}

/// True when the rule's only matches are ones every packet reaching the chain satisfies in
/// practice: comments, a plain `-p`/`-m tcp` without ports, and nfacct counters.
pub(crate) fn is_unconditional(r: &Rule<'_>) -> bool {
    r.matches.iter().all(|m| match m {
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
