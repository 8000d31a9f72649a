//! Name → position in a list that holds the names itself (a table's chains, the render's chains):
//! a `hashbrown::HashTable` of positions that hashes and compares the list's own names, 4 bytes
//! an entry where a map keyed by name keeps a second copy of each name's slice (a large node has
//! 110k chains).

use kproxy_parsers::iptables::NameHash;

/// Positions into a list of names, found by name. Every method takes `name_of`, the name at a
/// position of that list.
#[derive(Debug, Default)]
pub struct NameIndex(hashbrown::HashTable<u32>);

fn name_hash(name: &str) -> u64 {
    use std::hash::BuildHasher;
    NameHash::default().hash_one(name)
}

impl NameIndex {
    /// Room for `n` more names.
    pub fn reserve<'n>(&mut self, n: usize, name_of: impl Fn(u32) -> &'n str) {
        self.0.reserve(n, |&i| name_hash(name_of(i)));
    }

    /// The position of `name`.
    pub fn get<'n>(&self, name: &str, name_of: impl Fn(u32) -> &'n str) -> Option<usize> {
        self.0
            .find(name_hash(name), |&i| name_of(i) == name)
            .map(|&i| i as usize)
    }

    /// Indexes the name at `position` (not indexed yet).
    pub fn insert<'n>(&mut self, position: usize, name_of: impl Fn(u32) -> &'n str) {
        let position = position as u32;
        self.0
            .insert_unique(name_hash(name_of(position)), position, |&i| {
                name_hash(name_of(i))
            });
    }

    /// Removes `name`, returning its position.
    pub fn remove<'n>(&mut self, name: &str, name_of: impl Fn(u32) -> &'n str) -> Option<usize> {
        let entry = self
            .0
            .find_entry(name_hash(name), |&i| name_of(i) == name)
            .ok()?;
        let (i, _) = entry.remove();
        Some(i as usize)
    }

    /// Every position, to renumber after a removal from the list.
    pub fn positions_mut(&mut self) -> impl Iterator<Item = &mut u32> {
        self.0.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::NameIndex;

    #[test]
    fn positions_are_found_by_the_list_names() {
        let mut names = vec!["KUBE-SERVICES", "KUBE-SEP-A", "cali-FORWARD"];
        let mut ix = NameIndex::default();
        for i in 0..names.len() {
            let list = &names;
            ix.insert(i, |p| list[p as usize]);
        }
        let list = &names;
        assert_eq!(ix.get("KUBE-SEP-A", |p| list[p as usize]), Some(1));
        assert_eq!(ix.get("KUBE-SEP-B", |p| list[p as usize]), None);
        assert_eq!(ix.remove("KUBE-SERVICES", |p| list[p as usize]), Some(0));
        names.remove(0);
        for p in ix.positions_mut() {
            *p -= 1;
        }
        let list = &names;
        assert_eq!(ix.get("cali-FORWARD", |p| list[p as usize]), Some(1));
        assert_eq!(ix.get("KUBE-SERVICES", |p| list[p as usize]), None);
    }
}
