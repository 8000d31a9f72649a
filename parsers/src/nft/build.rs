//! Assembling a [`Ruleset`] from the objects an input declares, in any order and any number of
//! times (`nft -f` semantics: `add` of an existing object adds nothing, `flush` empties,
//! `delete` removes), with name lookups that stay fast for 100,000 chains.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::ast::{Chain, Element, Expr, Family, Ruleset, Set, Table, Warning};
use crate::iptables::NameHash;

/// Name → index of one table's chains or sets.
type Index<'a> = HashMap<Cow<'a, str>, usize, NameHash>;

/// A ruleset under construction.
#[derive(Debug, Default)]
pub(crate) struct Builder<'a> {
    /// What has been built so far.
    pub rs: Ruleset<'a>,
    /// Per table (same order as `rs.tables`): chain name → index.
    chains: Vec<Index<'a>>,
    /// Per table: set/map name → index.
    sets: Vec<Index<'a>>,
    /// The (table, chain) found last: command input names one chain on many lines in a row, and
    /// comparing a name is cheaper than hashing it.
    last_chain: Cell<Option<(usize, usize)>>,
}

impl<'a> Builder<'a> {
    /// Records a warning.
    pub(crate) fn warn(&mut self, line: u32, message: impl Into<String>) {
        self.rs.warnings.push(Warning {
            line,
            message: message.into(),
        });
    }

    /// The index of table `family name`.
    pub(crate) fn find_table(&self, family: Family, name: &str) -> Option<usize> {
        self.rs
            .tables
            .iter()
            .position(|t| t.family == family && t.name == name)
    }

    /// The index of table `family name`, created if absent.
    pub(crate) fn table(&mut self, family: Family, name: Cow<'a, str>, line: u32) -> usize {
        if let Some(i) = self.find_table(family, &name) {
            return i;
        }
        self.rs.tables.push(Table {
            family,
            name,
            line,
            ..Table::default()
        });
        self.chains.push(Index::default());
        self.sets.push(Index::default());
        self.rs.tables.len() - 1
    }

    /// The index of an existing table, or of a new one with a warning (command input that adds
    /// to a table it never created).
    pub(crate) fn table_for_use(&mut self, family: Family, name: &'a str, line: u32) -> usize {
        if let Some(i) = self.find_table(family, name) {
            return i;
        }
        self.warn(
            line,
            format!("table {family} {name} used before `add table`; created"),
        );
        self.table(family, Cow::Borrowed(name), line)
    }

    /// The table at `t`.
    pub(crate) fn table_mut(&mut self, t: usize) -> &mut Table<'a> {
        &mut self.rs.tables[t]
    }

    /// The index of chain `name` in table `t`.
    pub(crate) fn find_chain(&self, t: usize, name: &str) -> Option<usize> {
        if let Some((lt, lc)) = self.last_chain.get()
            && lt == t
            && self.rs.tables[t]
                .chains
                .get(lc)
                .is_some_and(|c| c.name == name)
        {
            return Some(lc);
        }
        let found = self.chains[t].get(name).copied();
        if let Some(c) = found {
            self.last_chain.set(Some((t, c)));
        }
        found
    }

    /// The index of chain `name` in table `t`, created if absent.
    pub(crate) fn chain(&mut self, t: usize, name: Cow<'a, str>, line: u32) -> usize {
        let chains = &mut self.rs.tables[t].chains;
        let i = match self.chains[t].entry(name) {
            Entry::Occupied(e) => *e.get(),
            Entry::Vacant(e) => {
                chains.push(Chain {
                    name: e.key().clone(),
                    line,
                    ..Chain::default()
                });
                *e.insert(chains.len() - 1)
            }
        };
        self.last_chain.set(Some((t, i)));
        i
    }

    /// The index of chain `name`, created with a warning when command input uses it first.
    pub(crate) fn chain_for_use(&mut self, t: usize, name: &'a str, line: u32) -> usize {
        if let Some(i) = self.find_chain(t, name) {
            return i;
        }
        self.warn(
            line,
            format!("chain {name} used before `add chain`; created"),
        );
        self.chain(t, Cow::Borrowed(name), line)
    }

    /// The chain at `c` of table `t`.
    pub(crate) fn chain_mut(&mut self, t: usize, c: usize) -> &mut Chain<'a> {
        &mut self.rs.tables[t].chains[c]
    }

    /// The index of set or map `name` in table `t`.
    pub(crate) fn find_set(&self, t: usize, name: &str) -> Option<usize> {
        self.sets[t].get(name).copied()
    }

    /// The index of set or map `name` in table `t`, created if absent.
    pub(crate) fn set(&mut self, t: usize, name: Cow<'a, str>, is_map: bool, line: u32) -> usize {
        if let Some(i) = self.find_set(t, &name) {
            return i;
        }
        let sets = &mut self.rs.tables[t].sets;
        sets.push(Set {
            name: name.clone(),
            is_map,
            line,
            ..Set::default()
        });
        let i = sets.len() - 1;
        self.sets[t].insert(name, i);
        i
    }

    /// The index of set `name`, created with a warning when command input uses it first.
    pub(crate) fn set_for_use(&mut self, t: usize, name: &'a str, line: u32) -> usize {
        if let Some(i) = self.find_set(t, name) {
            return i;
        }
        self.warn(line, format!("set {name} used before `add set`; created"));
        self.set(t, Cow::Borrowed(name), false, line)
    }

    /// The set at `s` of table `t`.
    pub(crate) fn set_mut(&mut self, t: usize, s: usize) -> &mut Set<'a> {
        &mut self.rs.tables[t].sets[s]
    }

    /// Removes table `t`.
    pub(crate) fn delete_table(&mut self, t: usize) {
        self.last_chain.set(None);
        self.rs.tables.remove(t);
        self.chains.remove(t);
        self.sets.remove(t);
    }

    /// Removes every table.
    pub(crate) fn clear(&mut self) {
        self.last_chain.set(None);
        self.rs.tables.clear();
        self.chains.clear();
        self.sets.clear();
    }

    /// Removes chain `c` of table `t`.
    pub(crate) fn delete_chain(&mut self, t: usize, c: usize) {
        self.last_chain.set(None);
        self.rs.tables[t].chains.remove(c);
        self.chains[t] = index(self.rs.tables[t].chains.iter().map(|c| &c.name));
    }

    /// Removes set `s` of table `t`.
    pub(crate) fn delete_set(&mut self, t: usize, s: usize) {
        self.rs.tables[t].sets.remove(s);
        self.sets[t] = index(self.rs.tables[t].sets.iter().map(|s| &s.name));
    }

    /// The finished ruleset. An element key added more than once (command input may add an
    /// element again, or change a map element's data) is kept once, as last added.
    pub(crate) fn finish(mut self) -> Ruleset<'a> {
        for set in self.rs.tables.iter_mut().flat_map(|t| t.sets.iter_mut()) {
            dedup_elements(&mut set.elements);
        }
        self.rs
    }
}

/// Keeps only the last element of each key, in place.
fn dedup_elements(elements: &mut Vec<Element<'_>>) {
    if elements.len() < 2 {
        return;
    }
    let last: HashMap<&Expr<'_>, usize> = elements
        .iter()
        .enumerate()
        .map(|(i, e)| (&e.key, i))
        .collect();
    if last.len() == elements.len() {
        return;
    }
    let keep: Vec<bool> = elements
        .iter()
        .enumerate()
        .map(|(i, e)| last.get(&e.key) == Some(&i))
        .collect();
    let mut flags = keep.into_iter();
    elements.retain(|_| flags.next().unwrap_or(true));
}

/// A name index over `names`.
fn index<'a, 'b>(names: impl Iterator<Item = &'b Cow<'a, str>>) -> Index<'a>
where
    'a: 'b,
{
    names.enumerate().map(|(i, n)| (n.clone(), i)).collect()
}
