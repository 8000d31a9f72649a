//! Building a [`ServiceGraph`] from a parsed dump.

use super::index::{DumpIndex, comment, is_unconditional, jump_target};
use super::names::{CommentRole, NameResolver, parse_comment, port_proto_hash};
use super::ownership::{ChainKind, service_chain};
use super::{
    Affinity, ChainRef, Counters, Edge, Endpoint, Entry, EntryKind, Firewall, MasqueradeReason,
    MasqueradeRule, NameSource, ServiceGraph, ServicePort, Share, SkippedLine, Verdict,
    VerdictReason,
};
use crate::model::{RuleEntry, Ruleset};
use crate::parsers::iptables::NameHash;
use crate::parsers::iptables::{
    AddrSpec, Backend, Dump, DumpForm, Family, MarkOp, Match, Module, Recent, RecentAction, Rule,
    Statistic, Target,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The fixed masquerade mark of kube-proxy v1.1–v1.2 (`"MASQ"` in ASCII).
pub(crate) const OLD_MASQ_MARK: u32 = 0x4d41_5351;

/// How to build a graph.
#[derive(Debug, Clone, Default)]
pub struct GraphOptions {
    /// Known service ports, to name chains of dumps without comments.
    pub resolver: NameResolver,
    /// Name of the input (file path or `<stdin>`), copied into [`ServiceGraph::source`].
    pub source: Option<String>,
}

/// What a graph needs to know about the dump beyond its rules (the [`Ruleset`] keeps only rules).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpFacts {
    /// The backend named in the dump header.
    pub backend: Backend,
    /// Save/restore text (declares every chain it uses) rather than an `iptables -S` listing.
    pub save_form: bool,
    /// Lines skipped by lenient parsing.
    pub skipped_lines: Vec<SkippedLine>,
}

impl DumpFacts {
    /// The facts of `dump` (call before handing the dump to [`Ruleset::from_dump`]).
    pub fn of(dump: &Dump<'_>) -> Self {
        DumpFacts {
            backend: dump.backend,
            save_form: dump.form == DumpForm::Save,
            skipped_lines: dump
                .skipped
                .iter()
                .map(|s| SkippedLine {
                    line: s.line,
                    reason: s.reason.clone(),
                })
                .collect(),
        }
    }
}

/// Builds the service graph of a parsed dump (consumed: it becomes the [`Ruleset`]).
pub fn from_dump(dump: Dump<'_>, opts: &GraphOptions) -> ServiceGraph {
    let facts = DumpFacts::of(&dump);
    let rs = Ruleset::from_dump(dump);
    build_ruleset(&rs, &facts, opts)
}

/// Builds the service graph of a parsed dump (any kube-proxy release since v1.2; `iptables-save`,
/// restore input or `iptables -S` text). Never fails: what does not fit is reported as anomalies.
/// Copies the dump into a [`Ruleset`]; use [`from_dump`] to hand it over, or [`build_ruleset`] when
/// a ruleset exists already.
pub fn build(dump: &Dump<'_>, opts: &GraphOptions) -> ServiceGraph {
    from_dump(dump.clone(), opts)
}

/// Builds the service graph of a ruleset (see [`build`]); `facts` carries what the ruleset does not.
pub fn build_ruleset(rs: &Ruleset<'_>, facts: &DumpFacts, opts: &GraphOptions) -> ServiceGraph {
    let idx = DumpIndex::new(rs);
    let mut b = Builder::default();
    (b.masq_mark, b.masq_mark_text) = find_masq_mark(&idx);
    if let Some(nat) = idx.table("nat") {
        b.register_chains(nat);
        b.name_from_chains(nat);
        b.entries(nat);
        b.policy_and_external_chains(nat);
        b.endpoint_chains(nat);
    }
    if let Some(filter) = idx.table("filter") {
        b.filter_verdicts(filter);
    }
    b.resolve_names(&opts.resolver);
    let mut graph = ServiceGraph {
        source: opts.source.clone(),
        family: match rs.family {
            Family::V4 => Some("ipv4".into()),
            Family::V6 => Some("ipv6".into()),
            Family::Unknown => None,
        },
        backend: match facts.backend {
            Backend::Legacy => Some("legacy".into()),
            Backend::NfTables => Some("nf_tables".into()),
            Backend::Unknown => None,
        },
        masquerade_mark: b.masq_mark_text.clone(),
        service_ports: Vec::new(),
        anomalies: Vec::new(),
        skipped_lines: facts.skipped_lines.clone(),
    };
    let mut anomalies = super::anomalies::find(&idx, facts.save_form);
    anomalies.append(&mut b.anomalies);
    graph.service_ports = b.finish();
    if anomalies
        .iter()
        .any(|a| a.service.is_none() && a.chain.is_some())
    {
        let mut owner: HashMap<&str, usize> = HashMap::new();
        for (i, p) in graph.service_ports.iter().enumerate() {
            let chains = p.chains.iter().map(|c| c.name.as_str());
            for c in chains.chain(p.endpoints.iter().map(|e| e.chain.as_str())) {
                owner.entry(c).or_insert(i);
            }
        }
        for a in &mut anomalies {
            if a.service.is_none() {
                a.service = a
                    .chain
                    .as_deref()
                    .and_then(|c| owner.get(c))
                    .and_then(|&i| graph.service_ports.get(i))
                    .map(ServicePort::display_name);
            }
        }
    }
    anomalies.sort_by(|a, b| {
        (a.kind, &a.table, a.line, &a.chain).cmp(&(b.kind, &b.table, b.line, &b.chain))
    });
    graph.anomalies = anomalies;
    graph
}

/// A service port while it is being built.
#[derive(Debug, Default)]
struct PortB {
    name: Option<String>,
    name_source: Option<NameSource>,
    protocol: Option<String>,
    hash: Option<String>,
    chains: BTreeMap<String, (ChainKind, usize)>,
    entries: Vec<Entry>,
    endpoints: Vec<Endpoint>,
    masquerade: Vec<MasqueradeRule>,
    affinity_seconds: Option<u32>,
    affinity_chains: BTreeSet<String>,
    firewall: Option<Firewall>,
    verdicts: Vec<Verdict>,
    edges: Vec<Edge>,
}

impl PortB {
    fn set_name(&mut self, name: &str, source: NameSource) {
        if self.name.is_none() {
            self.name = Some(name.to_string());
            self.name_source = Some(source);
        }
    }

    fn set_protocol(&mut self, proto: Option<String>) {
        if self.protocol.is_none() {
            self.protocol = proto;
        }
    }

    fn endpoint(&mut self, chain: &str) -> &mut Endpoint {
        let pos = match self.endpoints.iter().position(|e| e.chain == chain) {
            Some(p) => p,
            None => {
                self.endpoints.push(Endpoint {
                    chain: chain.to_string(),
                    destination: None,
                    ip: None,
                    port: None,
                    shares: Vec::new(),
                    hairpin_masquerade: false,
                    affinity_set: false,
                    dnat_line: None,
                    counters: None,
                });
                self.endpoints.len() - 1
            }
        };
        &mut self.endpoints[pos]
    }
}

#[derive(Debug, Default)]
struct Builder {
    ports: PortMap,
    /// `(name, proto)` → key.
    by_name: HashMap<(String, String), String>,
    /// SEP chain → key of the service that picks it.
    sep_owner: HashMap<String, String>,
    masq_mark: Option<u32>,
    masq_mark_text: Option<String>,
    anomalies: Vec<super::Anomaly>,
}

/// Service ports by key (the chain hash), in insertion order; one hash lookup per access and one
/// key allocation per port.
#[derive(Debug, Default)]
struct PortMap {
    index: HashMap<String, usize, NameHash>,
    ports: Vec<(String, PortB)>,
}

impl PortMap {
    fn position(&self, key: &str) -> Option<usize> {
        self.index.get(key).copied()
    }

    fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    fn get(&self, key: &str) -> Option<&PortB> {
        self.ports.get(self.position(key)?).map(|(_, p)| p)
    }

    fn get_mut(&mut self, key: &str) -> Option<&mut PortB> {
        let i = self.position(key)?;
        self.ports.get_mut(i).map(|(_, p)| p)
    }

    /// The port `key`, created empty when absent.
    fn entry(&mut self, key: &str) -> &mut PortB {
        let i = match self.position(key) {
            Some(i) => i,
            None => {
                self.index.insert(key.to_string(), self.ports.len());
                let p = PortB {
                    hash: super::ownership::is_chain_hash(key).then(|| key.to_string()),
                    ..PortB::default()
                };
                self.ports.push((key.to_string(), p));
                self.ports.len() - 1
            }
        };
        &mut self.ports[i].1
    }

    fn iter(&self) -> impl Iterator<Item = (&String, &PortB)> {
        self.ports.iter().map(|(k, p)| (k, p))
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut PortB> {
        self.ports.iter_mut().map(|(_, p)| p)
    }
}

impl Builder {
    fn port(&mut self, key: &str) -> &mut PortB {
        self.ports.entry(key)
    }

    /// The key of the service port a comment names, creating it (by computed hash) if `create`.
    fn key_for_name(&mut self, name: &str, proto: Option<&str>, create: bool) -> Option<String> {
        let proto = proto?.to_ascii_lowercase();
        if let Some(k) = self.by_name.get(&(name.to_string(), proto.clone())) {
            return Some(k.clone());
        }
        let hash = port_proto_hash(name, &proto);
        if self.ports.contains_key(&hash) || create {
            let p = self.port(&hash);
            p.set_name(name, NameSource::Comment);
            p.set_protocol(Some(proto.clone()));
            self.by_name.insert((name.to_string(), proto), hash.clone());
            return Some(hash);
        }
        None
    }

    fn register_chains(&mut self, nat: &super::index::TableIndex<'_, '_>) {
        for &name in &nat.names {
            if let Some((kind, hash)) = service_chain(name)
                && kind.is_service_port_chain()
            {
                let n = nat.rules(name).len();
                self.port(hash).chains.insert(name.to_string(), (kind, n));
            }
        }
    }

    fn name_from_chains(&mut self, nat: &super::index::TableIndex<'_, '_>) {
        let mut found: Vec<(String, String, Option<String>)> = Vec::new();
        for &chain in &nat.names {
            let rules = nat.rules(chain);
            let own_hash = service_chain(chain)
                .filter(|(k, _)| k.is_service_port_chain())
                .map(|(_, h)| h);
            for r in rules {
                let hash = own_hash.or_else(|| {
                    jump_target(r)
                        .and_then(service_chain)
                        .filter(|(k, _)| k.is_service_port_chain())
                        .map(|(_, h)| h)
                });
                let (Some(hash), Some(c)) = (hash, comment(r).and_then(parse_comment)) else {
                    continue;
                };
                found.push((hash.to_string(), c.name.to_string(), protocol(r)));
            }
        }
        for (hash, name, proto) in found {
            let p = self.port(&hash);
            p.set_name(&name, NameSource::Comment);
            p.set_protocol(proto.clone());
            if let Some(proto) =
                proto.or_else(|| self.ports.get(&hash).and_then(|p| p.protocol.clone()))
            {
                self.by_name.entry((name, proto)).or_insert(hash);
            }
        }
    }

    fn entries(&mut self, nat: &super::index::TableIndex<'_, '_>) {
        let mut masq_rules = Vec::new();
        for chain in ["KUBE-SERVICES", "KUBE-NODEPORTS"] {
            for r in nat.rules(chain) {
                if self.is_masq(r) {
                    masq_rules.push((chain, r));
                    continue;
                }
                let Some(target) = jump_target(r) else {
                    continue;
                };
                let Some((tkind, hash)) = service_chain(target) else {
                    continue;
                };
                if !tkind.is_service_port_chain() {
                    continue;
                }
                let role = comment(r).and_then(parse_comment).map(|c| c.role);
                let kind = if chain == "KUBE-NODEPORTS" {
                    EntryKind::NodePort
                } else {
                    match (role, tkind) {
                        (Some(CommentRole::ClusterIp), _) => EntryKind::ClusterIp,
                        (Some(CommentRole::ExternalIp), _) => EntryKind::ExternalIp,
                        (Some(CommentRole::LoadBalancerIp), _) => EntryKind::LoadBalancerIp,
                        (_, ChainKind::Fw) => EntryKind::LoadBalancerIp,
                        (_, ChainKind::Ext) => EntryKind::ExternalIp,
                        _ => EntryKind::ClusterIp,
                    }
                };
                let proto = protocol(r);
                let entry = Entry {
                    kind,
                    address: destination(r),
                    port: dport(r),
                    protocol: proto.clone(),
                    table: "nat".into(),
                    chain: chain.into(),
                    target: target.into(),
                    line: r.line,
                    counters: counters(r),
                };
                let p = self.port(hash);
                p.set_protocol(proto);
                p.entries.push(entry);
            }
        }
        for (chain, r) in masq_rules {
            let key = self.key_for_rule(r);
            let Some(key) = key else { continue };
            let role = comment(r).and_then(parse_comment).map(|c| c.role);
            let rule = masquerade_rule(chain, None, role, r);
            self.port(&key).masquerade.push(rule);
        }
    }

    /// The service port a rule outside the service's own chains belongs to: by comment, else by
    /// destination/port/protocol of a known entry.
    fn key_for_rule(&mut self, r: &Rule<'_>) -> Option<String> {
        let proto = protocol(r);
        if let Some(c) = comment(r).and_then(parse_comment)
            && let Some(k) = self.key_for_name(c.name, proto.as_deref(), false)
        {
            return Some(k);
        }
        let (addr, port) = (destination(r), dport(r));
        addr.as_ref()?;
        self.ports.iter().find_map(|(k, p)| {
            p.entries
                .iter()
                .any(|e| e.address == addr && e.port == port && e.protocol == proto)
                .then(|| k.clone())
        })
    }

    fn is_masq(&self, r: &Rule<'_>) -> bool {
        match r.target() {
            Some(Target::Jump("KUBE-MARK-MASQ")) => true,
            Some(Target::Mark(op)) => {
                let v = match op {
                    MarkOp::SetXmark { value, mask } if mask != 0 => value,
                    MarkOp::SetMark { value, .. } | MarkOp::Or(value) => value,
                    _ => return false,
                };
                v != 0 && (v == OLD_MASQ_MARK || Some(v) == self.masq_mark)
            }
            _ => false,
        }
    }

    fn policy_and_external_chains(&mut self, nat: &super::index::TableIndex<'_, '_>) {
        for i in 0..self.ports.ports.len() {
            // The port is taken out of the map while its chains are walked.
            let Some((key, p)) = self.ports.ports.get_mut(i) else {
                continue;
            };
            let key = std::mem::take(key);
            let mut p = std::mem::take(p);
            let chains: Vec<(String, ChainKind)> =
                p.chains.iter().map(|(n, (k, _))| (n.clone(), *k)).collect();
            for (chain, kind) in chains {
                let rules = nat.rules(&chain);
                match kind {
                    ChainKind::Svc | ChainKind::Svl | ChainKind::Xlb => {
                        self.policy_chain(&mut p, &key, &chain, kind, rules)
                    }
                    _ => self.external_chain(&mut p, &chain, kind, rules),
                }
            }
            if let Some(slot) = self.ports.ports.get_mut(i) {
                *slot = (key, p);
            }
        }
    }

    fn policy_chain(
        &mut self,
        p: &mut PortB,
        key: &str,
        chain: &str,
        kind: ChainKind,
        rules: &[RuleEntry<'_>],
    ) {
        let mut remaining = 1.0_f64;
        let mut saw_probability = false;
        for r in rules {
            let role = comment(r).and_then(parse_comment).map(|c| c.role);
            if self.is_masq(r) {
                let m = masquerade_rule(chain, Some(kind), role, r);
                p.masquerade.push(m);
                continue;
            }
            let Some(target) = jump_target(r) else {
                continue;
            };
            match service_chain(target) {
                Some((ChainKind::Sep, _)) => {
                    self.sep_owner
                        .entry(target.to_string())
                        .or_insert_with(|| key.to_string());
                    if let Some(rc) = recent(r).filter(|rc| {
                        matches!(rc.action, RecentAction::Rcheck | RecentAction::Update)
                    }) {
                        let seconds = rc.seconds;
                        p.affinity_seconds = p.affinity_seconds.or(seconds);
                        p.affinity_chains.insert(chain.to_string());
                        p.endpoint(target);
                        p.edges.push(edge(chain, target, "affinity", r));
                        continue;
                    }
                    let (share, probability, label) = match probability(r) {
                        Some(pr) => {
                            saw_probability = true;
                            let s = remaining * pr;
                            remaining *= 1.0 - pr;
                            (s, Some(pr), probability_label(pr))
                        }
                        None if is_unconditional(r) => {
                            let s = remaining;
                            remaining = 0.0;
                            (s, None, String::new())
                        }
                        None => (0.0, None, "conditional".to_string()),
                    };
                    p.endpoint(target).shares.push(Share {
                        via: chain.to_string(),
                        share,
                        probability,
                        line: r.line,
                        counters: counters(r),
                    });
                    p.edges.push(edge(chain, target, &label, r));
                }
                Some((k, _)) if k.is_service_port_chain() => {
                    let label = link_label(role, r);
                    p.edges.push(edge(chain, target, &label, r));
                }
                _ if target == "KUBE-MARK-DROP" => {
                    let reason = match role {
                        Some(CommentRole::NoLocalEndpoints) => VerdictReason::NoLocalEndpoints,
                        Some(CommentRole::NoEndpoints) => VerdictReason::NoEndpoints,
                        _ => VerdictReason::Other,
                    };
                    let v = verdict("nat", chain, "KUBE-MARK-DROP", reason, r);
                    p.verdicts.push(v);
                }
                _ => {}
            }
        }
        if saw_probability && remaining > 1e-6 {
            self.anomalies.push(super::Anomaly {
                kind: super::AnomalyKind::ProbabilityLeak,
                table: "nat".into(),
                chain: Some(chain.to_string()),
                line: None,
                service: None,
                message: format!(
                    "{} of new connections match no endpoint rule in {chain} and fall through",
                    crate::output::percent(remaining)
                ),
            });
        }
    }

    fn external_chain(
        &mut self,
        p: &mut PortB,
        chain: &str,
        kind: ChainKind,
        rules: &[RuleEntry<'_>],
    ) {
        for r in rules {
            let role = comment(r).and_then(parse_comment).map(|c| c.role);
            if self.is_masq(r) {
                let m = masquerade_rule(chain, Some(kind), role, r);
                p.masquerade.push(m);
                continue;
            }
            let Some(target) = jump_target(r) else {
                continue;
            };
            if target == "KUBE-MARK-DROP" {
                let v = verdict(
                    "nat",
                    chain,
                    "KUBE-MARK-DROP",
                    VerdictReason::SourceRange,
                    r,
                );
                p.verdicts.push(v);
                continue;
            }
            if service_chain(target).is_none() {
                continue;
            }
            let label = link_label(role, r);
            if kind == ChainKind::Fw
                && let Some(src) = source(r).filter(|s| !s.negated)
            {
                p.firewall
                    .get_or_insert_with(|| Firewall {
                        chain: chain.to_string(),
                        source_ranges: Vec::new(),
                    })
                    .source_ranges
                    .push(src.value.raw.to_string());
            }
            p.edges.push(edge(chain, target, &label, r));
        }
        if kind == ChainKind::Fw {
            p.firewall.get_or_insert_with(|| Firewall {
                chain: chain.to_string(),
                source_ranges: Vec::new(),
            });
        }
    }

    fn endpoint_chains(&mut self, nat: &super::index::TableIndex<'_, '_>) {
        for &chain in &nat.names {
            let Some((ChainKind::Sep, _)) = service_chain(chain) else {
                continue;
            };
            let rules = nat.rules(chain);
            let key = match self.sep_owner.get(chain) {
                Some(k) => Some(k.clone()),
                None => rules.iter().find_map(|r| {
                    let c = comment(r).and_then(parse_comment)?;
                    let proto = protocol(r).or_else(|| rules.iter().find_map(|r| protocol(r)));
                    self.key_for_name(c.name, proto.as_deref(), true)
                }),
            };
            let Some(key) = key else { continue };
            let mut masq = Vec::new();
            for r in rules {
                if self.is_masq(r) {
                    masq.push(masquerade_rule(chain, Some(ChainKind::Sep), None, r));
                }
            }
            if !self.ports.contains_key(&key) {
                self.port(&key);
            }
            let Some(p) = self.ports.get_mut(&key) else {
                continue;
            };
            p.endpoint(chain);
            for r in rules {
                if let Some(Target::Dnat { to, .. }) = r.target() {
                    let proto = protocol(r);
                    p.set_protocol(proto);
                    let set = recent(r).is_some_and(|rc| rc.action == RecentAction::Set);
                    let ep = p.endpoint(chain);
                    if ep.dnat_line.is_none() {
                        ep.destination = Some(to.raw.to_string());
                        ep.ip = to.addr;
                        ep.port = to.ports.map(|pr| pr.first);
                        ep.dnat_line = Some(r.line);
                        ep.counters = counters(r);
                    }
                    ep.affinity_set |= set;
                }
            }
            let hairpin = masq.iter().any(|m| m.reason == MasqueradeReason::Hairpin);
            p.endpoint(chain).hairpin_masquerade |= hairpin;
            p.masquerade.extend(masq);
        }
    }

    fn filter_verdicts(&mut self, filter: &super::index::TableIndex<'_, '_>) {
        for chain in [
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-PROXY-FIREWALL",
            "KUBE-NODEPORTS",
        ] {
            for r in filter.rules(chain) {
                let Some(c) = comment(r).and_then(parse_comment) else {
                    continue;
                };
                let proto = protocol(r);
                let (verdict_name, health) = match r.target() {
                    Some(Target::Reject { .. }) => ("REJECT", false),
                    Some(Target::Drop) => ("DROP", false),
                    Some(Target::Accept) if c.role == CommentRole::HealthCheck => ("ACCEPT", true),
                    _ => continue,
                };
                // Health-check rules are always tcp, whatever the service port's protocol: only
                // attach them to a port that exists by name.
                let key = if health {
                    self.by_name
                        .iter()
                        .find(|((n, _), _)| n == c.name)
                        .map(|(_, k)| k.clone())
                        .or_else(|| self.key_for_name(c.name, proto.as_deref(), true))
                } else {
                    self.key_for_name(c.name, proto.as_deref(), true)
                };
                let Some(key) = key else { continue };
                if health {
                    let e = Entry {
                        kind: EntryKind::HealthCheckNodePort,
                        address: destination(r),
                        port: dport(r),
                        protocol: proto,
                        table: "filter".into(),
                        chain: chain.into(),
                        target: "ACCEPT".into(),
                        line: r.line,
                        counters: counters(r),
                    };
                    self.port(&key).entries.push(e);
                    continue;
                }
                let reason = match c.role {
                    CommentRole::NoEndpoints => VerdictReason::NoEndpoints,
                    CommentRole::NoLocalEndpoints => VerdictReason::NoLocalEndpoints,
                    CommentRole::FirewallDrop => VerdictReason::SourceRange,
                    _ => VerdictReason::Other,
                };
                let v = verdict("filter", chain, verdict_name, reason, r);
                self.port(&key).verdicts.push(v);
            }
        }
    }

    fn resolve_names(&mut self, resolver: &NameResolver) {
        for p in self.ports.values_mut() {
            if p.name.is_none()
                && let Some((n, proto)) = p.hash.as_deref().and_then(|h| resolver.resolve(h))
            {
                p.name = Some(n.to_string());
                p.name_source = Some(NameSource::Resolved);
                p.set_protocol(Some(proto.to_string()));
            }
        }
    }

    fn finish(&mut self) -> Vec<ServicePort> {
        let mut out: Vec<ServicePort> = std::mem::take(&mut self.ports)
            .ports
            .into_iter()
            .map(|(_, p)| p)
            .map(|mut p| {
                p.entries.sort_by_key(|e| (e.kind, e.line));
                let mut chains: Vec<ChainRef> = p
                    .chains
                    .into_iter()
                    .map(|(name, (kind, rules))| ChainRef { kind, name, rules })
                    .collect();
                chains.sort_by_key(|c| c.kind);
                ServicePort {
                    name_source: p.name_source.unwrap_or(NameSource::Unknown),
                    name: p.name,
                    protocol: p.protocol,
                    hash: p.hash,
                    chains,
                    entries: p.entries,
                    endpoints: p.endpoints,
                    masquerade: p.masquerade,
                    affinity: (!p.affinity_chains.is_empty()).then(|| Affinity {
                        timeout_seconds: p.affinity_seconds,
                        chains: p.affinity_chains.into_iter().collect(),
                    }),
                    firewall: p.firewall,
                    verdicts: p.verdicts,
                    edges: p.edges,
                }
            })
            .collect();
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

/// The mark `KUBE-MARK-MASQ` sets (`0x4000/0x4000`), or the old fixed `0x4d415351` when some rule
/// sets that directly.
fn find_masq_mark(idx: &DumpIndex<'_, '_>) -> (Option<u32>, Option<String>) {
    let nat = idx.table("nat");
    if let Some(nat) = nat {
        for r in nat.rules("KUBE-MARK-MASQ") {
            match r.target() {
                Some(Target::Mark(MarkOp::SetXmark { value, mask })) if value != 0 => {
                    return (Some(value), Some(format!("{value:#x}/{mask:#x}")));
                }
                Some(Target::Mark(MarkOp::SetMark { value, .. }))
                | Some(Target::Mark(MarkOp::Or(value)))
                    if value != 0 =>
                {
                    return (Some(value), Some(format!("{value:#x}")));
                }
                _ => {}
            }
        }
        let old = nat.all_rules().any(|r| {
            matches!(r.target(), Some(Target::Mark(MarkOp::SetXmark { value, .. })) | Some(Target::Mark(MarkOp::SetMark { value, .. })) if value == OLD_MASQ_MARK)
        });
        if old {
            return (Some(OLD_MASQ_MARK), Some(format!("{OLD_MASQ_MARK:#x}")));
        }
    }
    (None, None)
}

/// `-p PROTO` (or the implicit protocol module), lower-cased.
pub(crate) fn protocol(r: &Rule<'_>) -> Option<String> {
    r.matches()
        .find_map(|m| match m {
            Match::Protocol(p) if !p.negated => Some(p.value.to_ascii_lowercase()),
            _ => None,
        })
        .or_else(|| {
            r.matches().find_map(|m| match m {
                Match::Module(Module::Ports { proto, .. }) => Some(proto.to_ascii_lowercase()),
                _ => None,
            })
        })
}

/// An address as people write it: the bare IP for a host prefix, else as written.
pub(crate) fn addr_text(a: &AddrSpec<'_>) -> String {
    let host = if a.addr.is_ipv4() { 32 } else { 128 };
    if a.prefix == host && a.mask.is_none() {
        a.addr.to_string()
    } else {
        a.raw.to_string()
    }
}

/// The non-negated `-d`.
pub(crate) fn destination(r: &Rule<'_>) -> Option<String> {
    r.matches().find_map(|m| match m {
        Match::Destination(d) if !d.negated => Some(addr_text(&d.value)),
        _ => None,
    })
}

/// The `-s` match, negated or not.
pub(crate) fn source<'a>(r: &Rule<'a>) -> Option<crate::parsers::iptables::Neg<AddrSpec<'a>>> {
    r.matches().find_map(|m| match m {
        Match::Source(s) => Some(s),
        _ => None,
    })
}

/// The first port of a non-negated `--dport`.
pub(crate) fn dport(r: &Rule<'_>) -> Option<u16> {
    r.matches().find_map(|m| match m {
        Match::Module(Module::Ports { dport: Some(d), .. }) if !d.negated => Some(d.value.first),
        _ => None,
    })
}

/// Rule counters, converted.
pub(crate) fn counters(r: &Rule<'_>) -> Option<Counters> {
    r.counters().map(|c| Counters {
        packets: c.packets,
        bytes: c.bytes,
    })
}

/// The `-m recent` match.
pub(crate) fn recent<'a>(r: &Rule<'a>) -> Option<Recent<'a>> {
    r.matches().find_map(|m| match m {
        Match::Module(Module::Recent(rc)) => Some(rc),
        _ => None,
    })
}

/// The conditional probability of a `-m statistic` match (`--mode nth --every N` counts as 1/N).
pub(crate) fn probability(r: &Rule<'_>) -> Option<f64> {
    r.matches().find_map(|m| match m {
        Match::Module(Module::Statistic(Statistic::Random {
            probability,
            negated: false,
            ..
        })) => Some(probability),
        Match::Module(Module::Statistic(Statistic::Nth {
            every,
            negated: false,
            ..
        })) if every > 0 => Some(1.0 / f64::from(every)),
        _ => None,
    })
}

fn has_local_src_type(r: &Rule<'_>) -> bool {
    r.matches().any(|m| {
        matches!(m, Match::Module(Module::Addrtype { src_type: Some(t), .. }) if !t.negated && t.value.eq_ignore_ascii_case("LOCAL"))
    })
}

fn negated_in_interface<'a>(r: &Rule<'a>) -> Option<&'a str> {
    r.matches().find_map(|m| match m {
        Match::InInterface(i) if i.negated => Some(i.value),
        _ => None,
    })
}

fn in_interface<'a>(r: &Rule<'a>) -> Option<&'a str> {
    r.matches().find_map(|m| match m {
        Match::InInterface(i) if !i.negated => Some(i.value),
        _ => None,
    })
}

/// Classifies a masquerade rule (spec §6).
fn masquerade_rule(
    chain: &str,
    kind: Option<ChainKind>,
    role: Option<CommentRole>,
    r: &Rule<'_>,
) -> MasqueradeRule {
    let (reason, condition) = if let Some(s) = source(r) {
        let text = [if s.negated { "! " } else { "" }, "-s ", s.value.raw].concat();
        let reason = if s.negated {
            MasqueradeReason::OffClusterSource
        } else if kind == Some(ChainKind::Sep) {
            MasqueradeReason::Hairpin
        } else {
            MasqueradeReason::Other
        };
        (reason, Some(text))
    } else if let Some(i) = negated_in_interface(r) {
        (
            MasqueradeReason::OffClusterSource,
            Some(format!("! -i {i}")),
        )
    } else if has_local_src_type(r) {
        (
            MasqueradeReason::LocalSource,
            Some("--src-type LOCAL".to_string()),
        )
    } else if matches!(
        role,
        Some(
            CommentRole::MasqueradeExternal | CommentRole::ExternalIp | CommentRole::LoadBalancerIp
        )
    ) || matches!(kind, Some(ChainKind::Ext | ChainKind::Fw))
        || chain == "KUBE-NODEPORTS"
    {
        (MasqueradeReason::ExternalDestination, None)
    } else if matches!(kind, Some(ChainKind::Svc | ChainKind::Svl)) || chain == "KUBE-SERVICES" {
        (MasqueradeReason::AllSources, None)
    } else {
        (MasqueradeReason::Other, None)
    };
    MasqueradeRule {
        chain: chain.to_string(),
        reason,
        condition,
        line: r.line,
        counters: counters(r),
    }
}

/// `p=0.3333`: a probability with four decimals, as `format!("p={pr:.4}")` prints it for
/// probabilities in [0, 1] (without the float formatter, which is slow for 100k endpoints).
fn probability_label(pr: f64) -> String {
    let scaled = pr * 10_000.0;
    // Near a tie only the exact decimal expansion decides: leave those to the formatter.
    if !(0.0..=1.0).contains(&pr) || (scaled.fract() - 0.5).abs() < 1e-6 {
        return format!("p={pr:.4}");
    }
    let n = scaled.round() as u32;
    let mut out = String::with_capacity(8);
    out.push_str("p=");
    out.push(char::from(b'0' + (n / 10_000) as u8));
    out.push('.');
    let frac = n % 10_000;
    for d in [1000, 100, 10, 1] {
        out.push(char::from(b'0' + ((frac / d) % 10) as u8));
    }
    out
}

/// Words for a jump between service chains.
fn link_label(role: Option<CommentRole>, r: &Rule<'_>) -> String {
    match role {
        Some(CommentRole::PodTraffic) => return "pod source".into(),
        Some(CommentRole::RouteLocal) => return "LOCAL source".into(),
        _ => {}
    }
    if let Some(s) = source(r) {
        return [if s.negated { "! " } else { "" }, "-s ", s.value.raw].concat();
    }
    if let Some(i) = in_interface(r) {
        return format!("-i {i}");
    }
    if has_local_src_type(r) {
        return "LOCAL source".into();
    }
    if is_unconditional(r) {
        String::new()
    } else {
        "conditional".into()
    }
}

fn edge(from: &str, to: &str, label: &str, r: &Rule<'_>) -> Edge {
    Edge {
        from: from.to_string(),
        to: to.to_string(),
        label: label.to_string(),
        line: r.line,
    }
}

fn verdict(
    table: &str,
    chain: &str,
    verdict: &str,
    reason: VerdictReason,
    r: &Rule<'_>,
) -> Verdict {
    Verdict {
        table: table.to_string(),
        chain: chain.to_string(),
        verdict: verdict.to_string(),
        reason,
        address: destination(r),
        port: dport(r),
        line: r.line,
        counters: counters(r),
    }
}

#[cfg(test)]
mod tests {
    use super::probability_label;

    #[test]
    fn probability_labels_match_the_float_formatter() {
        // kube-proxy's probabilities 1/(n-i) as iptables-save prints them, and a sweep of [0, 1].
        let mut values: Vec<f64> = (1..=200).map(|n| 1.0 / f64::from(n)).collect();
        values.extend((0..=10_000).map(|i| f64::from(i) / 10_000.0 + 0.000_013));
        values.extend([
            0.0,
            1.0,
            0.333_333_333_49,
            0.099_999_999_63,
            0.5,
            0.25,
            0.125,
        ]);
        for v in values.into_iter().filter(|v| (0.0..=1.0).contains(v)) {
            assert_eq!(probability_label(v), format!("p={v:.4}"), "{v}");
        }
    }
}
