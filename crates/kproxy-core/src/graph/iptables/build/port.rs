//! Service ports while the graph is built, and their final form.

use crate::graph::ownership::{ChainKind, is_chain_hash};
use crate::graph::{
    Affinity, ChainRef, Edge, Endpoint, Entry, Firewall, MasqueradeRule, NameSource, ServicePort,
    UnknownObject, Verdict,
};
use crate::parsers::iptables::NameHash;
use std::borrow::Cow;
use std::collections::HashMap;

/// Makes room for one more item in `v`, growing it from one slot and then by doubling, where a
/// vector's first push makes room for four: a port holds one to three of most things, and the
/// spare slots of 10k ports are megabytes at the busiest moment of a large node's build.
pub(super) fn room_for_one<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.len().max(1));
    }
}

/// Pushes `item` onto `v` after [`room_for_one`].
pub(super) fn push_tight<T>(v: &mut Vec<T>, item: T) {
    room_for_one(v);
    v.push(item);
}

/// One of a port's chains (SVC/SVL/EXT/FW/XLB) in the nat table.
#[derive(Debug, Clone, Copy)]
pub(super) struct PortChain<'a> {
    pub kind: ChainKind,
    pub name: &'a str,
    /// Its number of rules.
    pub rules: usize,
    /// Its index in the nat table's chains.
    pub index: usize,
}

/// A service port while it is being built.
#[derive(Debug, Default)]
pub(super) struct PortBuilder<'a> {
    /// The key: the chain hash, or the hash computed from a comment's name.
    key: Cow<'a, str>,
    pub name: Option<Cow<'a, str>>,
    pub name_source: Option<NameSource>,
    pub protocol: Option<Cow<'static, str>>,
    /// The port's chains, sorted by name.
    pub chains: Vec<PortChain<'a>>,
    pub entries: Vec<Entry>,
    pub endpoints: Vec<Endpoint<'a>>,
    /// The nat chain index of each endpoint (parallel to `endpoints`; `u32::MAX` when the chain
    /// is not declared): endpoints are found by index, not by comparing names.
    endpoint_chains: Vec<u32>,
    /// Endpoints first met as an endpoint chain (not picked by a policy chain): the tail of
    /// `endpoints` from this index; they are ordered by chain name at the end.
    orphans_from: Option<usize>,
    pub masquerade: Vec<MasqueradeRule<'a>>,
    /// Masquerade rules of endpoint chains; appended in chain-name order at the end.
    pub endpoint_masquerade: Vec<MasqueradeRule<'a>>,
    pub affinity_seconds: Option<u32>,
    pub affinity_chains: Vec<&'a str>,
    pub firewall: Option<Firewall>,
    pub verdicts: Vec<Verdict>,
    pub edges: Vec<Edge<'a>>,
    /// Rules of the port's chains this build cannot read.
    pub unknown_layout: Vec<UnknownObject>,
}

impl<'a> PortBuilder<'a> {
    /// The chain hash, when the key is one.
    pub fn hash(&self) -> Option<&str> {
        is_chain_hash(&self.key).then_some(&*self.key)
    }

    pub fn set_name(&mut self, name: Cow<'a, str>, source: NameSource) {
        if self.name.is_none() {
            self.name = Some(name);
            self.name_source = Some(source);
        }
    }

    pub fn set_protocol(&mut self, proto: Option<Cow<'static, str>>) {
        if self.protocol.is_none() {
            self.protocol = proto;
        }
    }

    /// Registers one of the port's chains (kept sorted by name).
    pub fn add_chain(&mut self, chain: PortChain<'a>) {
        match self.chains.binary_search_by(|c| c.name.cmp(chain.name)) {
            Ok(i) => self.chains[i] = chain,
            Err(i) => {
                room_for_one(&mut self.chains);
                self.chains.insert(i, chain);
            }
        }
    }

    /// Room for `n` more endpoints.
    pub fn reserve_endpoints(&mut self, n: usize) {
        self.endpoints.reserve_exact(n);
        self.endpoint_chains.reserve_exact(n);
    }

    /// The position in `endpoints` of the endpoint of `chain` (nat chain index `idx`, when
    /// declared), created when absent.
    pub fn endpoint(&mut self, chain: &'a str, idx: Option<usize>) -> usize {
        self.find_endpoint(chain, idx).unwrap_or_else(|| {
            self.push_endpoint(chain, idx);
            self.endpoints.len() - 1
        })
    }

    /// The position in `endpoints` of endpoint chain `chain` (nat chain `idx`), which may not be
    /// picked by any policy chain (then it is created, as an orphan).
    pub fn endpoint_from_chain(&mut self, chain: &'a str, idx: usize) -> usize {
        self.find_endpoint(chain, Some(idx)).unwrap_or_else(|| {
            self.orphans_from.get_or_insert(self.endpoints.len());
            self.push_endpoint(chain, Some(idx));
            self.endpoints.len() - 1
        })
    }

    fn find_endpoint(&self, chain: &str, idx: Option<usize>) -> Option<usize> {
        match idx.and_then(|i| u32::try_from(i).ok()) {
            Some(i) => self.endpoint_chains.iter().position(|&c| c == i),
            None => self.endpoints.iter().position(|e| e.chain == chain),
        }
    }

    fn push_endpoint(&mut self, chain: &'a str, idx: Option<usize>) {
        self.endpoints.push(Endpoint::new(chain));
        self.endpoint_chains
            .push(idx.and_then(|i| u32::try_from(i).ok()).unwrap_or(u32::MAX));
    }

    fn finish(mut self) -> ServicePort<'a> {
        self.entries.sort_by_key(|e| (e.kind, e.line));
        if let Some(from) = self.orphans_from {
            self.endpoints[from..].sort_by(|a, b| a.chain.cmp(b.chain));
        }
        // Stable: one chain's rules stay in rule order.
        self.endpoint_masquerade
            .sort_by(|a, b| a.chain.cmp(b.chain));
        self.masquerade.append(&mut self.endpoint_masquerade);
        // What the graph keeps: no spare room (a node has 10k ports, 100k endpoints).
        self.entries.shrink_to_fit();
        self.masquerade.shrink_to_fit();
        self.endpoints.shrink_to_fit();
        self.edges.shrink_to_fit();
        let mut chains: Vec<ChainRef> = self
            .chains
            .into_iter()
            .map(|c| ChainRef {
                kind: c.kind,
                name: c.name.to_string(),
                rules: c.rules,
            })
            .collect();
        chains.sort_by_key(|c| c.kind);
        self.affinity_chains.sort_unstable();
        self.affinity_chains.dedup();
        let hash = is_chain_hash(&self.key).then(|| self.key.into_owned());
        ServicePort {
            name_source: self.name_source.unwrap_or(NameSource::Unknown),
            name: self.name.map(Cow::into_owned),
            protocol: self.protocol.map(Cow::into_owned),
            hash,
            chains,
            entries: self.entries,
            endpoints: self.endpoints,
            masquerade: self.masquerade,
            affinity: (!self.affinity_chains.is_empty()).then(|| Affinity {
                timeout_seconds: self.affinity_seconds,
                chains: self
                    .affinity_chains
                    .into_iter()
                    .map(str::to_string)
                    .collect(),
            }),
            firewall: self.firewall,
            verdicts: self.verdicts,
            edges: self.edges,
            unknown_layout: self.unknown_layout,
        }
    }
}

/// Service ports by key, in creation order; one hash lookup per access, no allocation to look up.
#[derive(Debug, Default)]
pub(super) struct PortMap<'a> {
    index: HashMap<Cow<'a, str>, usize, NameHash>,
    ports: Vec<PortBuilder<'a>>,
}

impl<'a> PortMap<'a> {
    pub fn position(&self, key: &str) -> Option<usize> {
        self.index.get(key).copied()
    }

    /// The port `key`, created empty when absent.
    pub fn entry(&mut self, key: Cow<'a, str>) -> usize {
        if let Some(&i) = self.index.get(&*key) {
            return i;
        }
        let i = self.ports.len();
        self.ports.push(PortBuilder {
            key: key.clone(),
            ..PortBuilder::default()
        });
        self.index.insert(key, i);
        i
    }

    pub fn at(&mut self, i: usize) -> &mut PortBuilder<'a> {
        &mut self.ports[i]
    }

    pub fn get(&self, i: usize) -> &PortBuilder<'a> {
        &self.ports[i]
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut PortBuilder<'a>> {
        self.ports.iter_mut()
    }

    /// The order key of port `i`: ports with chains by their first chain name, then the others in
    /// creation order.
    pub fn rank(&self, i: usize) -> (bool, Option<&'a str>, usize) {
        let first = self
            .ports
            .get(i)
            .and_then(|p| p.chains.first())
            .map(|c| c.name);
        (first.is_none(), first, i)
    }

    /// Port indices in rank order ([`PortMap::rank`]).
    pub fn by_rank(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.ports.len()).collect();
        order.sort_by_key(|&i| self.rank(i));
        order
    }

    /// The finished service ports, sorted by name (unnamed last), protocol, hash.
    pub fn finish(&mut self) -> Vec<ServicePort<'a>> {
        let mut out: Vec<ServicePort<'a>> = std::mem::take(&mut self.ports)
            .into_iter()
            .map(PortBuilder::finish)
            .collect();
        // Collected in place: the vector still has the (larger) builders' room.
        out.shrink_to_fit();
        out.sort_by(|a, b| {
            (a.name.is_none(), &a.name, &a.protocol, &a.hash).cmp(&(
                b.name.is_none(),
                &b.name,
                &b.protocol,
                &b.hash,
            ))
        });
        out
    }
}
