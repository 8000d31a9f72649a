//! Building a [`ServiceGraph`] from a parsed dump.
//!
//! Passes over the model's chains, each reading a rule's matches once ([`RuleSummary`]): chains are
//! classified into service ports by their hash, ports are named from kube-proxy's comments, then
//! come the entry chains (`KUBE-SERVICES`, `KUBE-NODEPORTS`), each port's policy and external
//! chains, the endpoint chains, and the filter verdicts. Lookups go through indexes over borrowed
//! names (no string is allocated to look something up), and what the graph keeps per endpoint and
//! edge borrows the dump text. Where the output order depends on chain names (which comment names
//! a port first, the order of orphan endpoints), only those few items are sorted, not the 100k
//! chain names of a large node.

mod port;
mod rule_summary;

use crate::graph::names::{CommentRole, NameResolver, parse_comment, port_proto_hash};
use crate::graph::ownership::{ChainKind, service_chain};
use crate::graph::{
    Counters, Edge, Entry, EntryKind, Firewall, GraphOptions, MasqueradeReason, MasqueradeRule,
    NameSource, ServiceGraph, Share, SkippedLine, Verdict, VerdictReason,
};
use crate::model::{Chain, RuleEntry, Ruleset, TableRules};
use crate::parsers::iptables::{Backend, Dump, DumpForm, Family, MarkOp, NameHash, RecentAction};
use crate::parsers::iptables::{Rule, Target, TargetKind};
use port::{PortChain, PortMap, push_tight};
use rule_summary::{RuleSummary, interface_condition, proto_name, source_condition};
use std::borrow::Cow;
use std::collections::HashMap;

/// The fixed masquerade mark of kube-proxy v1.1–v1.2 (`"MASQ"` in ASCII).
pub(crate) const OLD_MASQ_MARK: u32 = 0x4d41_5351;

/// What a graph needs to know about the dump beyond its rules (the [`Ruleset`] keeps only rules).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DumpSummary {
    /// The backend named in the dump header.
    pub backend: Backend,
    /// Save/restore text (declares every chain it uses) rather than an `iptables -S` listing.
    pub save_form: bool,
    /// Lines skipped by lenient parsing.
    pub skipped_lines: Vec<SkippedLine>,
    /// Why the input is not a whole dump (cut, filtered), in words; empty for a whole dump.
    pub gaps: Vec<String>,
}

impl DumpSummary {
    /// The summary of `dump` (call before handing the dump to [`Ruleset::from_dump`]).
    pub fn of(dump: &Dump<'_>) -> Self {
        DumpSummary {
            backend: dump.backend,
            save_form: dump.form == DumpForm::Save,
            gaps: dump.gaps.iter().map(ToString::to_string).collect(),
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

/// Builds the service graph of a parsed dump (consumed: it becomes the [`Ruleset`], which is
/// dropped once the graph is built; the graph borrows only the dump text).
pub fn from_dump<'a>(dump: Dump<'a>, opts: &GraphOptions) -> ServiceGraph<'a> {
    let facts = DumpSummary::of(&dump);
    let rs = Ruleset::from_dump(dump);
    build_ruleset(&rs, &facts, opts)
}

/// Builds the service graph of a parsed dump (any kube-proxy release since v1.2; `iptables-save`,
/// restore input or `iptables -S` text). Never fails: what does not fit is reported as anomalies.
/// Copies the dump into a [`Ruleset`]; use [`from_dump`] to hand it over, or [`build_ruleset`] when
/// a ruleset exists already.
pub fn build<'a>(dump: &Dump<'a>, opts: &GraphOptions) -> ServiceGraph<'a> {
    from_dump(dump.clone(), opts)
}

/// Builds the service graph of a ruleset (see [`build`]); `facts` carries what the ruleset does not.
pub fn build_ruleset<'a>(
    rs: &Ruleset<'a>,
    facts: &DumpSummary,
    opts: &GraphOptions,
) -> ServiceGraph<'a> {
    let service_ports_of = || {
        let mut b = Builder {
            comparison_only: opts.comparison_only,
            ..Builder::default()
        };
        let nat = rs.table("nat");
        (b.masq_mark, b.masq_mark_text) = nat.map(find_masq_mark).unwrap_or_default();
        if let Some(nat) = nat {
            b.register_chains(nat);
            b.name_from_chains(nat);
            b.entries(nat);
            b.policy_and_external_chains(nat);
            b.endpoint_chains(nat);
        }
        if let Some(filter) = rs.table("filter") {
            b.filter_verdicts(filter);
        }
        b.resolve_names(&opts.resolver);
        b
    };
    // The anomaly checks read only the ruleset: they run in parallel with the service ports.
    let (mut anomalies, mut b) = rayon::join(
        || super::anomalies::find(rs, facts.save_form, facts.gaps.is_empty()),
        service_ports_of,
    );
    anomalies.append(&mut b.anomalies);
    let service_ports = b.ports.finish();
    if anomalies
        .iter()
        .any(|a| a.service.is_none() && a.chain.is_some())
    {
        let mut owner: HashMap<&str, usize, NameHash> = HashMap::default();
        for (i, p) in service_ports.iter().enumerate() {
            let chains = p.chains.iter().map(|c| c.name.as_str());
            for c in chains.chain(p.endpoints.iter().map(|e| e.chain)) {
                owner.entry(c).or_insert(i);
            }
        }
        for a in &mut anomalies {
            if a.service.is_none() {
                a.service = a
                    .chain
                    .as_deref()
                    .and_then(|c| owner.get(c))
                    .and_then(|&i| service_ports.get(i))
                    .map(crate::graph::ServicePort::display_name);
            }
        }
    }
    anomalies.sort_by(|a, b| {
        (a.kind, &a.table, a.line, &a.chain).cmp(&(b.kind, &b.table, b.line, &b.chain))
    });
    ServiceGraph {
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
        masquerade_mark: b.masq_mark_text,
        service_ports,
        anomalies,
        skipped_lines: facts.skipped_lines.clone(),
        gaps: facts.gaps.clone(),
    }
}

/// An entry's `(address, port, protocol)`.
type EntryKey = (String, Option<u16>, Option<String>);

/// A candidate name for a port from a kube-proxy comment: (chain, hash, name, protocol).
type NameCandidate<'a> = (&'a str, &'a str, &'a str, Option<Cow<'static, str>>);

#[derive(Debug, Default)]
struct Builder<'a> {
    ports: PortMap<'a>,
    /// `(name, protocol)` → port.
    by_name: HashMap<(&'a str, Cow<'static, str>), usize, NameHash>,
    /// `(address, port, protocol)` of entries → port, built on first use (old layouts only).
    by_entry: Option<HashMap<EntryKey, usize>>,
    /// Per nat chain (by index): the port whose policy chain (SVC/SVL/XLB) picks it as an
    /// endpoint chain (of several, the first in rank order; `None` when none does) and the
    /// position of its endpoint in that port's endpoints, where the chain's facts go.
    sep_owner: Vec<Option<(usize, usize)>>,
    masq_mark: Option<u32>,
    masq_mark_text: Option<String>,
    anomalies: Vec<crate::graph::Anomaly>,
    /// [`GraphOptions::comparison_only`].
    comparison_only: bool,
}

impl<'a> Builder<'a> {
    /// The port a comment names, creating it (by computed hash) if `create`.
    fn key_for_name(&mut self, name: &'a str, proto: Option<&str>, create: bool) -> Option<usize> {
        let proto = proto_name(proto?);
        if let Some(&i) = self.by_name.get(&(name, proto.clone())) {
            return Some(i);
        }
        let hash = port_proto_hash(name, &proto);
        let i = match self.ports.position(&hash) {
            Some(i) => i,
            None if create => self.ports.entry(Cow::Owned(hash)),
            None => return None,
        };
        let p = self.ports.at(i);
        p.set_name(Cow::Borrowed(name), NameSource::Comment);
        p.set_protocol(Some(proto.clone()));
        self.by_name.insert((name, proto), i);
        Some(i)
    }

    /// Every service-port chain (SVC/SVL/EXT/FW/XLB) registers its port, keyed by the hash.
    fn register_chains(&mut self, nat: &TableRules<'a>) {
        for (index, c) in nat.chains.iter().enumerate() {
            if let Some((kind, hash)) = service_chain(c.name)
                && kind.is_service_port_chain()
            {
                let i = self.ports.entry(Cow::Borrowed(hash));
                self.ports.at(i).add_chain(PortChain {
                    kind,
                    name: c.name,
                    rules: c.rules.len(),
                    index,
                });
            }
        }
    }

    /// Names ports from kube-proxy's comments in their own chains and in rules that jump to them.
    /// The first comment in chain-name order names a port (and is the first for its
    /// `(name, protocol)`), as if the chains were read sorted by name.
    fn name_from_chains(&mut self, nat: &TableRules<'a>) {
        let mut found: Vec<NameCandidate<'a>> = Vec::new();
        for c in &nat.chains {
            let own_hash = service_chain(c.name)
                .filter(|(k, _)| k.is_service_port_chain())
                .map(|(_, h)| h);
            let chain_start = found.len();
            for r in &c.rules {
                let Some(hash) = own_hash.or_else(|| {
                    r.jump_target()
                        .and_then(service_chain)
                        .filter(|(k, _)| k.is_service_port_chain())
                        .map(|(_, h)| h)
                }) else {
                    continue;
                };
                let Some(comment) = r.comment().and_then(|c| c.borrowed()) else {
                    continue;
                };
                let proto = r.protocol().map(proto_name);
                // Rules of one chain mostly repeat the same name: a comment that starts with the
                // previous name and a blank names the same port (names hold no blanks).
                if let Some((_, h, n, p)) = found.last().filter(|_| found.len() > chain_start)
                    && *h == hash
                    && *p == proto
                    && comment.strip_prefix(n).is_some_and(|t| t.starts_with(' '))
                {
                    continue;
                }
                let Some(sc) = parse_comment(comment) else {
                    continue;
                };
                found.push((c.name, hash, sc.name, proto));
            }
        }
        // Stable: one chain's candidates stay in rule order.
        found.sort_by(|a, b| a.0.cmp(b.0));
        for (_, hash, name, proto) in found {
            let i = self.ports.entry(Cow::Borrowed(hash));
            let p = self.ports.at(i);
            p.set_name(Cow::Borrowed(name), NameSource::Comment);
            p.set_protocol(proto.clone());
            if let Some(proto) = proto.or_else(|| p.protocol.clone()) {
                self.by_name.entry((name, proto)).or_insert(i);
            }
        }
    }

    fn entries(&mut self, nat: &TableRules<'a>) {
        let mut masq_rules = Vec::new();
        for chain in ["KUBE-SERVICES", "KUBE-NODEPORTS"] {
            for r in nat.rules(chain) {
                let target = r.target();
                if self.is_masq(target.as_ref()) {
                    masq_rules.push((chain, r));
                    continue;
                }
                let Some(Target::Jump(to) | Target::Goto(to)) = target else {
                    continue;
                };
                let Some((tkind, hash)) = service_chain(to) else {
                    continue;
                };
                if !tkind.is_service_port_chain() {
                    continue;
                }
                let f = RuleSummary::of(r);
                let role = role(&f);
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
                let proto = f.protocol_lower();
                let entry = Entry {
                    kind,
                    address: f.destination_text(),
                    port: f.dport,
                    protocol: proto.as_deref().map(str::to_string),
                    table: "nat".into(),
                    chain: chain.into(),
                    target: to.into(),
                    line: r.line,
                    counters: counters(r),
                };
                let i = self.ports.entry(Cow::Borrowed(hash));
                let p = self.ports.at(i);
                p.set_protocol(proto);
                p.entries.push(entry);
                self.by_entry = None;
            }
        }
        // Entry lists grew from four 160-byte slots; most ports have one or two entries.
        for p in self.ports.iter_mut() {
            p.entries.shrink_to_fit();
        }
        for (chain, r) in masq_rules {
            let f = RuleSummary::of(r);
            let Some(i) = self.key_for_rule(&f) else {
                continue;
            };
            let rule = masquerade_rule(chain, None, role(&f), r, &f);
            push_tight(&mut self.ports.at(i).masquerade, rule);
        }
    }

    /// The port a rule outside the service's own chains belongs to: by comment, else by
    /// destination/port/protocol of a known entry.
    fn key_for_rule(&mut self, f: &RuleSummary<'a>) -> Option<usize> {
        let proto = f.protocol_lower();
        if let Some(c) = f.comment.and_then(parse_comment)
            && let Some(i) = self.key_for_name(c.name, proto.as_deref(), false)
        {
            return Some(i);
        }
        let addr = f.destination_text()?;
        let ports = &self.ports;
        let index = self.by_entry.get_or_insert_with(|| {
            let mut m = HashMap::new();
            for i in ports.by_rank() {
                for e in &ports.get(i).entries {
                    if let Some(a) = &e.address {
                        m.entry((a.clone(), e.port, e.protocol.clone()))
                            .or_insert(i);
                    }
                }
            }
            m
        });
        index
            .get(&(addr, f.dport, proto.map(Cow::into_owned)))
            .copied()
    }

    fn is_masq(&self, target: Option<&Target<'_>>) -> bool {
        match target {
            Some(Target::Jump("KUBE-MARK-MASQ")) => true,
            Some(Target::Mark(op)) => {
                let v = match *op {
                    MarkOp::SetXmark { value, mask } if mask != 0 => value,
                    MarkOp::SetMark { value, .. } | MarkOp::Or(value) => value,
                    _ => return false,
                };
                v != 0 && (v == OLD_MASQ_MARK || Some(v) == self.masq_mark)
            }
            _ => false,
        }
    }

    /// Each port's SVC/SVL/XLB (policy) and EXT/FW (external) chains, ports in rank order (the
    /// first owner of a shared endpoint chain wins).
    fn policy_and_external_chains(&mut self, nat: &TableRules<'a>) {
        self.sep_owner = vec![None; nat.chains.len()];
        for i in self.ports.by_rank() {
            let chains = self.ports.get(i).chains.clone();
            for pc in chains {
                match pc.kind {
                    ChainKind::Svc | ChainKind::Svl | ChainKind::Xlb => {
                        self.policy_chain(i, pc, nat)
                    }
                    _ => {
                        if let Some(c) = nat.chains.get(pc.index) {
                            self.external_chain(i, c, pc.kind);
                        }
                    }
                }
            }
        }
    }

    /// A rule of one of `port`'s chains: records it when it marks for masquerade; otherwise the
    /// chain it jumps (or goes) to, if any.
    fn masquerade_or_jump(
        &mut self,
        port: usize,
        chain: &'a str,
        kind: ChainKind,
        r: &RuleEntry<'a>,
    ) -> Option<&'a str> {
        let target = r.target();
        if self.is_masq(target.as_ref()) {
            let f = RuleSummary::of(r);
            let m = masquerade_rule(chain, Some(kind), role(&f), r, &f);
            push_tight(&mut self.ports.at(port).masquerade, m);
            return None;
        }
        match target {
            Some(Target::Jump(to) | Target::Goto(to)) => Some(to),
            _ => None,
        }
    }

    fn policy_chain(&mut self, port: usize, pc: PortChain<'a>, nat: &TableRules<'a>) {
        let Some(c) = nat.chains.get(pc.index) else {
            return;
        };
        let (chain, kind) = (c.name, pc.kind);
        let with_edges = !self.comparison_only;
        // One endpoint and one edge per jump to an endpoint chain.
        let picks = c
            .rules
            .iter()
            .filter(|r| r.jump_target().is_some_and(|t| t.starts_with("KUBE-SEP-")))
            .count();
        let p = self.ports.at(port);
        p.reserve_endpoints(picks);
        if with_edges {
            p.edges.reserve(picks);
        }
        let mut remaining = 1.0_f64;
        let mut saw_probability = false;
        for (r, jump) in nat.rules_with_jumps(pc.index) {
            let Some(to) = self.masquerade_or_jump(port, chain, kind, r) else {
                // Besides its jumps, kube-proxy writes only the masquerade mark here (in every
                // release this build knows); a rule without a target only counts.
                if !matches!(
                    r.target_kind(),
                    None | Some(TargetKind::Jump | TargetKind::Goto)
                ) && !self.is_masq(r.target().as_ref())
                {
                    self.unknown_rule(port, chain, r);
                }
                continue;
            };
            match service_chain(to) {
                Some((ChainKind::Sep, _)) => {
                    let idx = jump.and_then(|j| j.chain);
                    let p = self.ports.at(port);
                    let at = p.endpoint(to, idx);
                    if let Some(slot) = idx.and_then(|ci| self.sep_owner.get_mut(ci)) {
                        slot.get_or_insert((port, at));
                    }
                    let f = RuleSummary::of(r);
                    let p = self.ports.at(port);
                    if let Some(rc) = f.recent.filter(|rc| {
                        matches!(rc.action, RecentAction::Rcheck | RecentAction::Update)
                    }) {
                        p.affinity_seconds = p.affinity_seconds.or(rc.seconds);
                        push_tight(&mut p.affinity_chains, chain);
                        if with_edges {
                            p.edges.push(edge(chain, to, Cow::Borrowed("affinity"), r));
                        }
                        continue;
                    }
                    let (share, probability, label) = match f.probability {
                        Some(pr) => {
                            saw_probability = true;
                            let s = remaining * pr;
                            remaining *= 1.0 - pr;
                            let label = if with_edges {
                                probability_label(pr)
                            } else {
                                Cow::Borrowed("")
                            };
                            (s, Some(pr), label)
                        }
                        None if f.unconditional => {
                            let s = remaining;
                            remaining = 0.0;
                            (s, None, Cow::Borrowed(""))
                        }
                        None => (0.0, None, Cow::Borrowed("conditional")),
                    };
                    let shares = &mut p.endpoints[at].shares;
                    // Almost every endpoint is picked by one chain: no spare capacity.
                    shares.reserve_exact(1);
                    shares.push(Share {
                        via: chain,
                        share,
                        probability,
                        line: r.line,
                        counters: counters(r).map(Box::new),
                    });
                    if with_edges {
                        p.edges.push(edge(chain, to, label, r));
                    }
                }
                // A jump to another of the port's chains is only an edge (none when the graph
                // is built for a comparison).
                Some((k, _)) if k.is_service_port_chain() => {
                    if with_edges {
                        let f = RuleSummary::of(r);
                        let label = link_label(role(&f), r, &f);
                        self.ports.at(port).edges.push(edge(chain, to, label, r));
                    }
                }
                _ if to == "KUBE-MARK-DROP" => {
                    let reason = match role(&RuleSummary::of(r)) {
                        Some(CommentRole::NoLocalEndpoints) => VerdictReason::NoLocalEndpoints,
                        Some(CommentRole::NoEndpoints) => VerdictReason::NoEndpoints,
                        _ => VerdictReason::Other,
                    };
                    let v = verdict("nat", chain, "KUBE-MARK-DROP", reason, r);
                    push_tight(&mut self.ports.at(port).verdicts, v);
                }
                // A jump kube-proxy does not write from a policy chain.
                _ => self.unknown_rule(port, chain, r),
            }
        }
        if saw_probability && remaining > 1e-6 {
            self.anomalies.push(crate::graph::Anomaly {
                kind: crate::graph::AnomalyKind::ProbabilityLeak,
                table: "nat".into(),
                chain: Some(chain.to_string()),
                line: None,
                service: None,
                message: format!(
                    "{} of new connections match no endpoint rule in {chain} and fall through",
                    crate::graph::percent(remaining)
                ),
            });
        }
    }

    /// A rule of `port`'s policy chain whose target this build does not know kube-proxy to
    /// write: the port is of unknown layout (nothing is concluded of its endpoints), an
    /// `unknown-layout` anomaly says so.
    fn unknown_rule(&mut self, port: usize, chain: &'a str, r: &Rule<'a>) {
        let u = crate::graph::UnknownObject {
            kind: crate::graph::UnknownKind::Rule,
            name: chain.to_string(),
            line: Some(r.line),
            text: Some(r.raw.to_string()),
        };
        let p = self.ports.at(port);
        let service = p.name.as_deref().map(str::to_string);
        self.anomalies.push(crate::graph::Anomaly {
            kind: crate::graph::AnomalyKind::UnknownLayout,
            table: "nat".into(),
            chain: Some(chain.to_string()),
            line: Some(r.line),
            service,
            message: format!(
                "on this service port's path: {}",
                crate::graph::unknown_layout_message(std::slice::from_ref(&u))
            ),
        });
        push_tight(&mut self.ports.at(port).unknown_layout, u);
    }

    fn external_chain(&mut self, port: usize, c: &Chain<'a>, kind: ChainKind) {
        let chain = c.name;
        for r in &c.rules {
            let Some(to) = self.masquerade_or_jump(port, chain, kind, r) else {
                continue;
            };
            let p = self.ports.at(port);
            if to == "KUBE-MARK-DROP" {
                let v = verdict(
                    "nat",
                    chain,
                    "KUBE-MARK-DROP",
                    VerdictReason::SourceRange,
                    r,
                );
                push_tight(&mut p.verdicts, v);
                continue;
            }
            if service_chain(to).is_none() {
                continue;
            }
            let f = RuleSummary::of(r);
            if kind == ChainKind::Fw
                && let Some(src) = f.source.filter(|s| !s.negated)
            {
                p.firewall
                    .get_or_insert_with(|| Firewall {
                        chain: chain.to_string(),
                        source_ranges: Vec::new(),
                    })
                    .source_ranges
                    .push(src.value.raw.to_string());
            }
            if !self.comparison_only {
                p.edges
                    .push(edge(chain, to, link_label(role(&f), r, &f), r));
            }
        }
        if kind == ChainKind::Fw {
            let p = self.ports.at(port);
            let fw = p.firewall.get_or_insert_with(|| Firewall {
                chain: chain.to_string(),
                source_ranges: Vec::new(),
            });
            // Without source ranges the chain's closing `KUBE-MARK-DROP` (kube-proxy writes it
            // in every firewall chain, `proxier.go` before 1.25) drops no range's outsiders: it
            // catches what the rules above it do not take.
            if fw.source_ranges.is_empty() {
                for v in p.verdicts.iter_mut().filter(|v| {
                    v.chain == chain && v.table == "nat" && v.reason == VerdictReason::SourceRange
                }) {
                    v.reason = VerdictReason::FallThrough;
                }
            }
        }
    }

    /// The endpoint chains: each one's DNAT, protocol, affinity and masquerade rules go to the
    /// endpoint its owner's policy chain made for it.
    fn endpoint_chains(&mut self, nat: &TableRules<'a>) {
        for (ci, c) in nat.chains.iter().enumerate() {
            if let Some((ChainKind::Sep, _)) = service_chain(c.name) {
                self.endpoint_chain(ci, c);
            }
        }
    }

    /// Reads endpoint chain `c` (nat chain `ci`) into its endpoint.
    fn endpoint_chain(&mut self, ci: usize, c: &Chain<'a>) {
        let chain = c.name;
        let facts: Vec<RuleSummary<'a>> = c.rules.iter().map(|r| RuleSummary::of(r)).collect();
        let (port, at) = match self.sep_owner.get(ci).copied().flatten() {
            Some(owner) => owner,
            None => {
                // An endpoint chain no policy chain picks: its port comes from its comment.
                let owner = facts.iter().find_map(|f| {
                    let sc = f.comment.and_then(parse_comment)?;
                    let proto = f.protocol.or_else(|| facts.iter().find_map(|f| f.protocol));
                    self.key_for_name(sc.name, proto, true)
                });
                let Some(port) = owner else {
                    return;
                };
                (port, self.ports.at(port).endpoint_from_chain(chain, ci))
            }
        };
        for (r, f) in c.rules.iter().zip(&facts) {
            match r.target() {
                t if self.is_masq(t.as_ref()) => {
                    let m = masquerade_rule(chain, Some(ChainKind::Sep), None, r, f);
                    let is_hairpin = m.reason == MasqueradeReason::Hairpin;
                    let p = self.ports.at(port);
                    p.endpoints[at].hairpin_masquerade |= is_hairpin;
                    if !(is_hairpin && self.comparison_only) {
                        p.endpoint_masquerade.push(m);
                    }
                }
                Some(Target::Dnat { to, .. }) => {
                    let p = self.ports.at(port);
                    p.set_protocol(f.protocol_lower());
                    let ep = &mut p.endpoints[at];
                    ep.affinity_set |= f.recent.is_some_and(|rc| rc.action == RecentAction::Set);
                    if ep.dnat_line.is_none() {
                        ep.destination = Some(to.raw);
                        ep.ip = to.addr;
                        ep.port = to.ports.map(|pr| pr.first);
                        ep.dnat_line = Some(r.line);
                        ep.counters = counters(r).map(Box::new);
                    }
                }
                _ => {}
            }
        }
    }

    fn filter_verdicts(&mut self, filter: &TableRules<'a>) {
        for chain in [
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-PROXY-FIREWALL",
            "KUBE-NODEPORTS",
        ] {
            for r in filter.rules(chain) {
                let f = RuleSummary::of(r);
                let Some(c) = f.comment.and_then(parse_comment) else {
                    continue;
                };
                let proto = f.protocol_lower();
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
                        .find(|((n, _), _)| *n == c.name)
                        .map(|(_, &i)| i)
                        .or_else(|| self.key_for_name(c.name, proto.as_deref(), true))
                } else {
                    self.key_for_name(c.name, proto.as_deref(), true)
                };
                let Some(i) = key else { continue };
                if health {
                    let e = Entry {
                        kind: EntryKind::HealthCheckNodePort,
                        address: f.destination_text(),
                        port: f.dport,
                        protocol: proto.map(Cow::into_owned),
                        table: "filter".into(),
                        chain: chain.into(),
                        target: "ACCEPT".into(),
                        line: r.line,
                        counters: counters(r),
                    };
                    self.ports.at(i).entries.push(e);
                    self.by_entry = None;
                    continue;
                }
                let reason = match c.role {
                    CommentRole::NoEndpoints => VerdictReason::NoEndpoints,
                    CommentRole::NoLocalEndpoints => VerdictReason::NoLocalEndpoints,
                    CommentRole::FirewallDrop => VerdictReason::SourceRange,
                    _ => VerdictReason::Other,
                };
                let v = verdict("filter", chain, verdict_name, reason, r);
                push_tight(&mut self.ports.at(i).verdicts, v);
            }
        }
    }

    fn resolve_names(&mut self, resolver: &NameResolver) {
        for p in self.ports.iter_mut() {
            if p.name.is_none()
                && let Some((n, proto)) = p.hash().and_then(|h| resolver.resolve(h))
            {
                p.name = Some(Cow::Owned(n.to_string()));
                p.name_source = Some(NameSource::Resolved);
                p.set_protocol(Some(proto_name(proto)));
            }
        }
    }
}

/// The role of the rule's kube-proxy comment, if it has one.
fn role(f: &RuleSummary<'_>) -> Option<CommentRole> {
    f.comment.and_then(parse_comment).map(|c| c.role)
}

/// The mark `KUBE-MARK-MASQ` sets (`0x4000/0x4000`), or the old fixed `0x4d415351` when some rule
/// sets that directly.
fn find_masq_mark(nat: &TableRules<'_>) -> (Option<u32>, Option<String>) {
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
    let old = nat.chains.iter().flat_map(|c| &c.rules).any(|r| {
        matches!(r.target(), Some(Target::Mark(MarkOp::SetXmark { value, .. })) | Some(Target::Mark(MarkOp::SetMark { value, .. })) if value == OLD_MASQ_MARK)
    });
    if old {
        return (Some(OLD_MASQ_MARK), Some(format!("{OLD_MASQ_MARK:#x}")));
    }
    (None, None)
}

/// Rule counters, converted.
fn counters(r: &Rule<'_>) -> Option<Counters> {
    r.counters().map(|c| Counters {
        packets: c.packets,
        bytes: c.bytes,
    })
}

/// Classifies a masquerade rule (the `KUBE-MARK-MASQ` jumps of `proxier.go` `syncProxyRules`).
fn masquerade_rule<'a>(
    chain: &'a str,
    kind: Option<ChainKind>,
    role: Option<CommentRole>,
    r: &RuleEntry<'a>,
    f: &RuleSummary<'a>,
) -> MasqueradeRule<'a> {
    let (reason, condition) = if let Some(s) = &f.source {
        let reason = if s.negated {
            MasqueradeReason::OffClusterSource
        } else if kind == Some(ChainKind::Sep) {
            MasqueradeReason::Hairpin
        } else {
            MasqueradeReason::Other
        };
        (reason, Some(source_condition(r.raw, s)))
    } else if let Some(i) = f.not_in_interface {
        (
            MasqueradeReason::OffClusterSource,
            Some(interface_condition(r.raw, i, true)),
        )
    } else if f.local_source {
        (
            MasqueradeReason::LocalSource,
            Some(Cow::Borrowed("--src-type LOCAL")),
        )
    } else if matches!(
        role,
        Some(
            CommentRole::MasqueradeExternal | CommentRole::ExternalIp | CommentRole::LoadBalancerIp
        )
    ) || matches!(kind, Some(ChainKind::Ext | ChainKind::Fw))
        || chain == "KUBE-NODEPORTS"
        // kube-proxy 1.22–1.23 masquerade NodePort traffic in the service chain: a node port,
        // no address.
        || (kind == Some(ChainKind::Svc) && f.destination.is_none() && f.dport.is_some())
    {
        (MasqueradeReason::ExternalDestination, None)
    } else if matches!(kind, Some(ChainKind::Svc | ChainKind::Svl)) || chain == "KUBE-SERVICES" {
        (MasqueradeReason::AllSources, None)
    } else {
        (MasqueradeReason::Other, None)
    };
    MasqueradeRule {
        chain,
        reason,
        condition,
        line: r.line,
        counters: counters(r),
    }
}

/// `p=0.3333`: a probability with four decimals, as `format!("p={pr:.4}")` prints it. Labels of
/// probabilities in [0, 1] are slices of one text of all 10,001 of them, made once (80 KB): a
/// large node has 100k endpoint edges, and the float formatter and an allocation per edge were
/// a measurable part of building its graph.
fn probability_label(pr: f64) -> Cow<'static, str> {
    /// Bytes per label: `p=` and `0.0000`.
    const WIDTH: usize = 8;
    static LABELS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let scaled = pr * 10_000.0;
    // Near a tie only the exact decimal expansion decides: leave those to the formatter.
    if !(0.0..=1.0).contains(&pr) || (scaled.fract() - 0.5).abs() < 1e-6 {
        return Cow::Owned(format!("p={pr:.4}"));
    }
    let labels = LABELS.get_or_init(|| {
        let mut all = String::with_capacity(10_001 * WIDTH);
        for n in 0..=10_000u32 {
            all.push_str("p=");
            all.push(char::from(b'0' + (n / 10_000) as u8));
            all.push('.');
            let frac = n % 10_000;
            for d in [1000, 100, 10, 1] {
                all.push(char::from(b'0' + ((frac / d) % 10) as u8));
            }
        }
        all
    });
    let n = scaled.round() as usize;
    match labels.get(n * WIDTH..(n + 1) * WIDTH) {
        Some(label) => Cow::Borrowed(label),
        None => Cow::Owned(format!("p={pr:.4}")),
    }
}

/// Words for a jump between service chains.
fn link_label<'a>(
    role: Option<CommentRole>,
    r: &RuleEntry<'a>,
    f: &RuleSummary<'a>,
) -> Cow<'a, str> {
    match role {
        Some(CommentRole::PodTraffic) => return Cow::Borrowed("pod source"),
        Some(CommentRole::RouteLocal) => return Cow::Borrowed("LOCAL source"),
        _ => {}
    }
    if let Some(s) = &f.source {
        return source_condition(r.raw, s);
    }
    if let Some(i) = f.in_interface {
        return interface_condition(r.raw, i, false);
    }
    if f.local_source {
        return Cow::Borrowed("LOCAL source");
    }
    Cow::Borrowed(if f.unconditional { "" } else { "conditional" })
}

fn edge<'a>(from: &'a str, to: &'a str, label: Cow<'a, str>, r: &Rule<'_>) -> Edge<'a> {
    Edge {
        from,
        to,
        label,
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
    let f = RuleSummary::of(r);
    Verdict {
        table: table.to_string(),
        chain: chain.to_string(),
        verdict: verdict.to_string(),
        reason,
        address: f.destination_text(),
        port: f.dport,
        line: r.line,
        counters: counters(r),
    }
}

#[cfg(test)]
mod tests {
    use super::probability_label;
    use crate::graph::iptables::from_text;
    use crate::graph::{AnomalyKind, GraphOptions, UnknownKind};
    use crate::parsers::iptables::ParseOptions;

    /// A KUBE-SVC rule whose target kube-proxy never writes there makes its port one of unknown
    /// layout; the other port is read as ever.
    #[test]
    fn a_policy_rule_kube_proxy_never_writes_is_unknown() {
        let dump = "*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]
:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]
:KUBE-SEP-CCCCCCCCCCCCCCCC - [0:0]
:KUBE-SEP-DDDDDDDDDDDDDDDD - [0:0]
:KUBE-POOL-V9 - [0:0]
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"ns/a:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA
-A KUBE-SERVICES -d 10.96.0.11/32 -p tcp -m comment --comment \"ns/b:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-BBBBBBBBBBBBBBBB
-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment \"ns/a:http -> 10.244.1.1:8080\" -j KUBE-POOL-V9
-A KUBE-SVC-BBBBBBBBBBBBBBBB -m comment --comment \"ns/b:http -> 10.244.1.2:8080\" -j KUBE-SEP-DDDDDDDDDDDDDDDD
-A KUBE-SEP-DDDDDDDDDDDDDDDD -p tcp -m comment --comment ns/b:http -m tcp -j DNAT --to-destination 10.244.1.2:8080
-A KUBE-POOL-V9 -p tcp -j DNAT --to-destination 10.244.1.1:8080
COMMIT
";
        let g = from_text(
            dump,
            "dump",
            &ParseOptions::default(),
            &GraphOptions::default(),
        )
        .expect("parses");
        let a = g.ports_of("ns", "a");
        let b = g.ports_of("ns", "b");
        assert_eq!(a[0].unknown_layout.len(), 1, "{:?}", a[0]);
        assert_eq!(a[0].unknown_layout[0].kind, UnknownKind::Rule);
        assert_eq!(a[0].unknown_layout[0].name, "KUBE-SVC-AAAAAAAAAAAAAAAA");
        assert!(b[0].unknown_layout.is_empty());
        assert_eq!(b[0].endpoints[0].destination, Some("10.244.1.2:8080"));
        assert!(
            g.anomalies
                .iter()
                .any(|x| x.kind == AnomalyKind::UnknownLayout
                    && x.service.as_deref() == Some("ns/a:http")),
            "{:?}",
            g.anomalies
        );
    }

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
