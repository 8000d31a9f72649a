//! The path of each service port through kube-proxy's table, and what its rules do: the chains
//! its entries and its own chains lead to, the endpoints its DNATs send connections to with
//! their shares, its masquerade rules, affinity and firewall, and what on the path this build
//! cannot read.

use super::anomalies::rule_targets;
use super::dnat::{self, DnatPick};
use super::layout;
use super::{
    Builder, ChainKind, Endpoint, Expr, Firewall, MasqueradeReason, MasqueradeRule, RelOp, Rule,
    Stmt, affinity_lookup, counters_of, edge, masquerade_rule, numgen_pick, probability_label,
    source_label,
};
use crate::graph::{AnomalyKind, Share, UnknownObject, unknown_layout_message};
use crate::parsers::nft;
use std::borrow::Cow;
use std::collections::{HashMap, HashSet, VecDeque};

impl<'r, 'a> Builder<'r, 'a> {
    /// The endpoint `(chain, destination)` of port `p`, created on first use (in pick order). A
    /// chain the table lacks is still an endpoint (a cut paste may hold its picks but not the
    /// chain); an endpoint another port picked first stays that port's.
    pub(super) fn endpoint(
        &mut self,
        p: usize,
        chain: &'r str,
        destination: Option<&'r str>,
    ) -> Option<usize> {
        if let Some(&(owner, e)) = self.endpoint_of.get(&(chain, destination)) {
            return (owner == p).then_some(e);
        }
        let eps = &mut self.ports[p].endpoints;
        let mut ep = Endpoint::new(chain);
        ep.destination = destination;
        eps.push(ep);
        let e = eps.len() - 1;
        self.endpoint_of.insert((chain, destination), (p, e));
        Some(e)
    }

    /// The chain index of `name`, when the table has it.
    fn index_of(&self, name: &str) -> Option<usize> {
        self.chain_index.get(name).copied()
    }

    /// Every port's path: the chains its entries and its own chains lead to (never into
    /// kube-proxy's fixed chains, which every port shares) and the sets they look up. Then the
    /// rules of the chains that are not picked as endpoints: masquerade, affinity, picks and the
    /// ways on.
    pub(super) fn paths(&mut self) {
        let table = self.table;
        // Chains a numgen vmap or an affinity lookup picks: endpoint chains.
        let mut picked: HashSet<usize> = HashSet::new();
        for p in 0..self.ports.len() {
            let mut seeds: Vec<usize> = self.ports[p]
                .chains
                .iter()
                .filter_map(|c| self.index_of(&c.name))
                .collect();
            seeds.extend(
                self.ports[p]
                    .entries
                    .iter()
                    .filter_map(|e| self.index_of(&e.target)),
            );
            let mut seen: HashSet<usize> = seeds.iter().copied().collect();
            let mut queue: VecDeque<usize> = seeds.into_iter().collect();
            let mut path = Vec::new();
            let mut sets: Vec<&'r str> = Vec::new();
            while let Some(ci) = queue.pop_front() {
                path.push(ci);
                let chain = &table.chains[ci];
                if !layout::known_chain(&chain.name) {
                    // Nothing is read from a chain this build does not know.
                    continue;
                }
                for rule in &chain.rules {
                    for name in set_refs(rule) {
                        if !sets.contains(&name) {
                            sets.push(name);
                        }
                    }
                    if let Some(pick) = numgen_pick(rule) {
                        picked.extend(pick.arms.iter().filter_map(|(_, t)| self.index_of((*t)?)));
                    }
                    if let Some((_, target)) = affinity_lookup(rule) {
                        picked.extend(self.index_of(target));
                    }
                    rule_targets(table, rule, &mut |target| {
                        if let Some(ti) = self.index_of(target)
                            && !layout::fixed_chain(target)
                            && seen.insert(ti)
                        {
                            queue.push_back(ti);
                        }
                    });
                }
            }
            let port = &mut self.ports[p];
            port.path = path;
            port.sets = sets;
        }
        // The rules of every path chain that is no endpoint chain, in table order.
        let mut todo: Vec<(usize, usize)> = Vec::new();
        let mut taken: HashSet<usize> = HashSet::new();
        for (p, port) in self.ports.iter().enumerate() {
            for &ci in &port.path {
                if !picked.contains(&ci)
                    && layout::known_chain(&table.chains[ci].name)
                    && taken.insert(ci)
                {
                    todo.push((ci, p));
                }
            }
        }
        todo.sort_unstable();
        for (ci, p) in todo {
            let kind = match self.object[ci].map(|o| o.kind) {
                Some(ChainKind::Fw) => {
                    self.firewall_chain(ci, p);
                    continue;
                }
                Some(ChainKind::Ext) => ChainKind::Ext,
                Some(ChainKind::Svl) => ChainKind::Svl,
                _ => ChainKind::Svc,
            };
            self.path_chain(ci, p, kind);
        }
    }

    /// The rules of a chain on port `p`'s path, acting as a chain of `kind`.
    fn path_chain(&mut self, ci: usize, p: usize, kind: ChainKind) {
        let chain: &'r nft::Chain<'a> = &self.table.chains[ci];
        let name: &'r str = &chain.name;
        for rule in &chain.rules {
            if let Some(m) = masquerade_rule(name, rule, kind, self.mark, &self.mark_chains) {
                self.ports[p].masquerade.push(m);
                continue;
            }
            if let Some((set, target)) = affinity_lookup(rule) {
                if !self.ports[p].affinity_chains.iter().any(|c| c == name) {
                    self.ports[p].affinity_chains.push(name.to_string());
                }
                if let Some(t) = self.table.set(set).and_then(|s| s.timeout) {
                    self.ports[p].affinity_timeout =
                        Some(u32::try_from(t.as_secs()).unwrap_or(u32::MAX));
                }
                self.endpoint(p, target, None);
                self.ports[p]
                    .edges
                    .push(edge(name, target, "affinity".into(), rule));
                continue;
            }
            if let Some(pick) = numgen_pick(rule) {
                self.numgen(p, name, rule, &pick);
                continue;
            }
            if let Some(pick) = rule
                .stmts
                .iter()
                .find_map(|s| dnat::dnat_pick(s, self.table))
            {
                if let Ok(pick) = pick {
                    self.dnat_here(p, ci, rule, &pick);
                }
                continue;
            }
            let label: Cow<'r, str> = source_label(rule);
            rule_targets(self.table, rule, &mut |target| {
                if self.chain_index.contains_key(target) && !layout::fixed_chain(target) {
                    self.ports[p]
                        .edges
                        .push(edge(name, target, label.clone(), rule));
                }
            });
        }
    }

    /// A DNAT in a chain of the path (1.36's `dnat … to numgen … map`, 1.37's `dnat to`): one
    /// endpoint per destination, with the share of the numgen values that pick it.
    fn dnat_here(&mut self, p: usize, ci: usize, rule: &'r Rule<'a>, pick: &DnatPick) {
        let name: &'r str = &self.table.chains[ci].name;
        let dests: &'r [String] = &self.destinations[ci];
        for (target, keys) in &pick.arms {
            let text = target.text();
            let Some(dest) = dests.iter().find(|d| **d == text).map(String::as_str) else {
                continue;
            };
            let Some(e) = self.endpoint(p, name, Some(dest)) else {
                continue;
            };
            let ep = &mut self.ports[p].endpoints[e];
            ep.ip = Some(target.ip);
            ep.port = target.port;
            ep.dnat_line = Some(rule.line);
            ep.shares.push(Share {
                via: name,
                share: pick.share(*keys),
                probability: None,
                line: rule.line,
                counters: counters_of(rule).map(Box::new),
            });
        }
        if !pick.missing.is_empty() {
            let n = f64::from(pick.modulus);
            let values: Vec<String> = pick.missing.iter().map(u64::to_string).collect();
            let msg = format!(
                "numgen random mod {}: {} {} {} no destination in the DNAT map, so {} of new connections get no DNAT",
                pick.modulus,
                if values.len() == 1 { "value" } else { "values" },
                values.join(", "),
                if values.len() == 1 { "has" } else { "have" },
                crate::graph::percent(pick.missing.len() as f64 / n)
            );
            self.anomaly(AnomalyKind::ProbabilityLeak, name, rule.line, Some(p), msg);
        }
    }

    /// One `numgen random mod N vmap { k : goto endpoint-… }`: each key drawn is 1/N.
    fn numgen(
        &mut self,
        p: usize,
        name: &'r str,
        rule: &'r Rule<'a>,
        pick: &super::NumgenPick<'r>,
    ) {
        let n = f64::from(pick.modulus.max(1));
        let drawn = |k: u64| {
            k >= u64::from(pick.offset) && k - u64::from(pick.offset) < u64::from(pick.modulus)
        };
        let mut covered = vec![false; pick.modulus as usize];
        let mut dead = Vec::new();
        for (keys, target) in &pick.arms {
            let count = keys.iter().filter(|&&k| drawn(k)).count();
            for &k in keys {
                if drawn(k) {
                    covered[(k - u64::from(pick.offset)) as usize] = true;
                } else {
                    dead.push(k);
                }
            }
            let Some(target) = target else { continue };
            if count == 0 {
                continue;
            }
            let share = count as f64 / n;
            let Some(e) = self.endpoint(p, target, None) else {
                continue;
            };
            let ep = &mut self.ports[p].endpoints[e];
            ep.shares.push(Share {
                via: name,
                share,
                probability: None,
                line: rule.line,
                counters: counters_of(rule).map(Box::new),
            });
            self.ports[p]
                .edges
                .push(edge(name, target, probability_label(share), rule));
        }
        let missing: Vec<String> = covered
            .iter()
            .enumerate()
            .filter(|(_, c)| !**c)
            .map(|(i, _)| (i as u64 + u64::from(pick.offset)).to_string())
            .collect();
        if !missing.is_empty() || !dead.is_empty() {
            let mut msg = format!("numgen random mod {}", pick.modulus);
            if !missing.is_empty() {
                let (values, have) = if missing.len() == 1 {
                    ("value", "has")
                } else {
                    ("values", "have")
                };
                msg += &format!(
                    ": {values} {} {have} no endpoint in the vmap, so {} of new connections get no DNAT",
                    missing.join(", "),
                    crate::graph::percent(missing.len() as f64 / n)
                );
            }
            if !dead.is_empty() {
                let dead: Vec<String> = dead.iter().map(u64::to_string).collect();
                msg += &format!("; keys {} are never drawn", dead.join(", "));
            }
            self.anomaly(AnomalyKind::ProbabilityLeak, name, rule.line, Some(p), msg);
        }
    }

    /// A `firewall-` chain: `ip saddr != { ranges } drop`.
    fn firewall_chain(&mut self, ci: usize, p: usize) {
        let chain = &self.table.chains[ci];
        let mut ranges = Vec::new();
        for rule in &chain.rules {
            for s in &rule.stmts {
                if let Stmt::Match {
                    left: Expr::Payload { field, .. },
                    op: RelOp::Ne,
                    right,
                } = s
                    && field == "saddr"
                {
                    match right {
                        Expr::Set(items) => ranges.extend(items.iter().map(|e| e.key.to_string())),
                        other => ranges.push(other.to_string()),
                    }
                }
            }
        }
        self.ports[p].firewall = Some(Firewall {
            chain: chain.name.to_string(),
            source_ranges: ranges,
        });
    }

    /// Endpoint chains (picked by a policy chain, or named `endpoint-…`): DNAT, hairpin
    /// masquerade, affinity update. Named chains nothing picks join the port their name names.
    pub(super) fn endpoint_chains(&mut self) {
        for ci in 0..self.table.chains.len() {
            let chain: &'r nft::Chain<'a> = &self.table.chains[ci];
            let name: &'r str = &chain.name;
            let named = self.object[ci].filter(|o| o.kind == ChainKind::Sep);
            let (p, e) = match (self.endpoint_of.get(&(name, None)), named) {
                (Some(&pe), _) => pe,
                (None, Some(o)) => {
                    let p = self.port_of_name(o);
                    match self.endpoint(p, name, None) {
                        Some(e) => (p, e),
                        None => continue,
                    }
                }
                (None, None) => continue,
            };
            let mut has_dnat = false;
            for rule in &chain.rules {
                if let Some(m) =
                    masquerade_rule(name, rule, ChainKind::Sep, self.mark, &self.mark_chains)
                {
                    self.ports[p].endpoints[e].hairpin_masquerade = true;
                    self.ports[p].masquerade.push(m);
                    continue;
                }
                if rule.stmts.iter().any(|s| {
                    matches!(s, Stmt::SetUpdate { set, .. } if set.starts_with(crate::model::nft_names::AFFINITY_PREFIX))
                }) {
                    self.ports[p].endpoints[e].affinity_set = true;
                }
                if let Some(d) = dnat::dnat_of(rule)
                    && !has_dnat
                {
                    has_dnat = true;
                    let text = d.text();
                    let ep = &mut self.ports[p].endpoints[e];
                    ep.destination = self.destinations[ci]
                        .iter()
                        .find(|t| **t == text)
                        .map(String::as_str);
                    ep.ip = Some(d.ip);
                    ep.port = d.port;
                    ep.dnat_line = Some(rule.line);
                    ep.counters = counters_of(rule).map(Box::new);
                }
            }
            if !has_dnat && !chain.rules.is_empty() {
                let line = chain.rules.first().map_or(chain.line, |r| r.line);
                self.anomaly(
                    AnomalyKind::MissingDnat,
                    name,
                    line,
                    Some(p),
                    "endpoint chain without a DNAT rule".to_string(),
                );
            }
        }
    }

    /// 1.36's hairpin masquerade: an endpoint whose `EP . EP . PROTO . PORT` is in the set a
    /// masquerading rule looks connections up in is masqueraded when it reaches itself.
    pub(super) fn hairpin(&mut self) {
        let rules = dnat::hairpin_rules(self.table);
        if rules.is_empty() {
            return;
        }
        let members: Vec<_> = rules
            .iter()
            .map(|h| dnat::hairpin_members(self.table, h.set))
            .collect();
        for p in 0..self.ports.len() {
            let Some(protocol) = self.ports[p]
                .protocol
                .as_deref()
                .and_then(|p| super::protocol_of(&Expr::Symbol(Cow::Borrowed(p))))
            else {
                continue;
            };
            for (h, members) in rules.iter().zip(&members) {
                let mut any = false;
                for ep in &mut self.ports[p].endpoints {
                    if let (Some(ip), Some(port)) = (ep.ip, ep.port)
                        && members.contains(&(ip, protocol, port))
                    {
                        ep.hairpin_masquerade = true;
                        any = true;
                    }
                }
                if any {
                    let condition = h
                        .rule
                        .stmts
                        .iter()
                        .filter(|s| matches!(s, Stmt::Match { .. }))
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(" ");
                    self.ports[p].masquerade.push(MasqueradeRule {
                        chain: h.chain,
                        reason: MasqueradeReason::Hairpin,
                        condition: Some(Cow::Owned(condition)),
                        line: h.rule.line,
                        counters: counters_of(h.rule),
                    });
                }
            }
        }
    }

    /// Masquerade marks set in kube-proxy's fixed chains for the destinations of a set (1.36:
    /// `services` marks `ip daddr @cluster-ips ip saddr != CIDR`): each port with an entry
    /// address in the set gets the rule.
    pub(super) fn dispatch_masquerade(&mut self) {
        let table = self.table;
        for c in table.chains.iter().filter(|c| layout::fixed_chain(&c.name)) {
            for rule in &c.rules {
                let Some(set) = rule.stmts.iter().find_map(|s| match s {
                    Stmt::Match {
                        left: Expr::Payload { field, .. },
                        op: RelOp::Eq,
                        right: Expr::SetRef(set),
                    } if field == "daddr" => Some(&**set),
                    _ => None,
                }) else {
                    continue;
                };
                let Some(m) =
                    masquerade_rule(&c.name, rule, ChainKind::Svc, self.mark, &self.mark_chains)
                else {
                    continue;
                };
                let Some(members) = table.set(set) else {
                    continue;
                };
                let addresses: HashSet<String> =
                    members.elements.iter().map(|e| e.key.to_string()).collect();
                for port in &mut self.ports {
                    if port
                        .entries
                        .iter()
                        .any(|e| e.address.as_ref().is_some_and(|a| addresses.contains(a)))
                    {
                        port.masquerade.push(m.clone());
                    }
                }
            }
        }
    }

    /// What this build cannot read: on a port's path it is the port's (an `unknown-layout`
    /// anomaly each), elsewhere the table's.
    pub(super) fn unknown_layout(&mut self) {
        let unknown = layout::unknown_objects(self.table);
        if unknown.is_empty() {
            return;
        }
        let mut on_path = vec![false; unknown.len()];
        let mut by_chain: HashMap<&str, Vec<usize>> = HashMap::new();
        let mut by_set: HashMap<&str, usize> = HashMap::new();
        for (i, u) in unknown.iter().enumerate() {
            match u.kind {
                crate::graph::UnknownKind::Set | crate::graph::UnknownKind::Map => {
                    by_set.insert(&u.name, i);
                }
                crate::graph::UnknownKind::Object => {}
                _ => by_chain.entry(&u.name).or_default().push(i),
            }
        }
        let mut found: Vec<(usize, UnknownObject)> = Vec::new();
        for (p, port) in self.ports.iter().enumerate() {
            let mut mine: Vec<usize> = port
                .path
                .iter()
                .filter_map(|&ci| by_chain.get(&*self.table.chains[ci].name))
                .flatten()
                .copied()
                .collect();
            mine.extend(port.sets.iter().filter_map(|s| by_set.get(s)).copied());
            mine.sort_unstable();
            mine.dedup();
            for i in mine {
                on_path[i] = true;
                found.push((p, unknown[i].clone()));
            }
        }
        for (p, u) in found {
            let chain = u.name.clone();
            let message = unknown_layout_message(std::slice::from_ref(&u));
            self.anomaly(
                AnomalyKind::UnknownLayout,
                &chain,
                u.line.unwrap_or(0),
                Some(p),
                format!("on this service port's path: {message}"),
            );
            self.ports[p].unknown_layout.push(u);
        }
        for (i, u) in unknown.iter().enumerate().filter(|(i, _)| !on_path[*i]) {
            let _ = i;
            let message = unknown_layout_message(std::slice::from_ref(u));
            self.anomaly(
                AnomalyKind::UnknownLayout,
                &u.name,
                u.line.unwrap_or(0),
                None,
                message,
            );
        }
    }
}

/// The named sets and maps a rule looks up.
fn set_refs<'r>(rule: &'r Rule<'_>) -> Vec<&'r str> {
    let mut out = Vec::new();
    for s in &rule.stmts {
        match s {
            Stmt::Match { left, right, .. } => {
                expr_set_refs(left, &mut out);
                expr_set_refs(right, &mut out);
            }
            Stmt::Vmap { key, map } => {
                expr_set_refs(key, &mut out);
                expr_set_refs(map, &mut out);
            }
            Stmt::Mangle { key, value } => {
                expr_set_refs(key, &mut out);
                expr_set_refs(value, &mut out);
            }
            Stmt::Nat(n) => {
                for e in n.addr.iter().chain(&n.port) {
                    expr_set_refs(e, &mut out);
                }
            }
            Stmt::SetUpdate { set, elem, .. } => {
                out.push(&**set);
                expr_set_refs(elem, &mut out);
            }
            _ => {}
        }
    }
    out
}

/// The named sets and maps an expression looks up (`@name`, at any depth).
fn expr_set_refs<'r>(e: &'r Expr<'_>, out: &mut Vec<&'r str>) {
    match e {
        Expr::SetRef(s) => out.push(s),
        Expr::Map { key, map } => {
            expr_set_refs(key, out);
            expr_set_refs(map, out);
        }
        Expr::Binary { left, right, .. } | Expr::Range(left, right) => {
            expr_set_refs(left, out);
            expr_set_refs(right, out);
        }
        Expr::Concat(items) | Expr::List(items) => {
            items.iter().for_each(|i| expr_set_refs(i, out));
        }
        Expr::Set(elements) => {
            for el in elements {
                expr_set_refs(&el.key, out);
                if let Some(v) = &el.value {
                    expr_set_refs(v, out);
                }
            }
        }
        _ => {}
    }
}
