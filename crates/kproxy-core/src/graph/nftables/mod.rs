//! The service graph of a node in kube-proxy's nftables mode, rebuilt from `table ip kube-proxy`
//! / `table ip6 kube-proxy` (any input form [`crate::parsers::nft::parse`] reads).
//!
//! The same [`ServiceGraph`] as for iptables, so every renderer and the path view work on it:
//!
//! * entries are the elements of the `service-ips` and `service-nodeports` maps (cluster IP,
//!   external IP, load-balancer IP, NodePort) and of `no-endpoint-services` /
//!   `no-endpoint-nodeports` (their `drop` / `goto reject-chain`, which are also the port's
//!   [`Verdict`]s); an external-chain address that `firewall-ips` lists is a load-balancer IP,
//!   any other one an external IP (nftables keeps no comment that tells them apart);
//! * the service port is named by its chains, `PREFIX-HASH-ns/name/proto/port`, the hash checked
//!   against kube-proxy's (`hashAndTruncate` in `pkg/proxy/nftables/proxier.go`);
//! * its path is every chain its entries and its own chains lead to (jumps, gotos, verdict
//!   maps); what the rules on that path do is read from the statements, not from chain names
//!   ([`dnat`]): an endpoint is wherever a DNAT on the path sends a connection, with the share
//!   the `numgen` gives it — a `numgen random mod N vmap { k : goto CHAIN }` picking chains that
//!   DNAT (up to 1.35, and for ClientIP affinity), a `dnat … to numgen random mod N map { k :
//!   ADDR . PORT }` (1.36), or a plain `dnat to ADDR:PORT` (1.37, one endpoint); `ip saddr
//!   @affinity-… goto …` rules are `affinity` edges, the `affinity-…` sets' timeout the port's
//!   affinity timeout;
//! * masquerade rules are the rules that set the masquerade mark (the bits `masquerading` tests),
//!   inline or by a jump to a chain that only sets it; a mark set in a fixed chain for the
//!   destinations of a set (`ip daddr @cluster-ips …`, 1.36) belongs to every port with an entry
//!   in the set; hairpin masquerade is the `ip saddr EP jump …` of an endpoint chain, or the
//!   endpoint's element in the set a `masquerading` rule looks connections up in (1.36);
//! * `firewall-…` chains give the load-balancer source ranges (and a source-range DROP verdict
//!   per `firewall-ips` element).
//!
//! `table` in entries and verdicts is the type of the base chains that reach them: `nat` for
//! `service-ips`/`service-nodeports` (looked up from `nat-prerouting`/`nat-output`), `filter` for
//! the no-endpoint maps and the firewall (from the `filter-*` base chains); `chain` is the map,
//! or the firewall chain. What does not fit kube-proxy's shape is an [`Anomaly`] (see
//! [`anomalies`]); what this build does not know ([`layout`]) is an `unknown-layout` anomaly and
//! the port's [`ServicePort::unknown_layout`], and nothing is concluded from it.

mod anomalies;
pub mod dnat;
pub mod layout;
pub mod names;
mod paths;

pub use dnat::{DnatTarget, dnat_of, dnat_target};

use super::{
    Affinity, Anomaly, AnomalyKind, ChainKind, ChainRef, Counters, Edge, Endpoint, Entry,
    EntryKind, Firewall, GraphOptions, MasqueradeReason, MasqueradeRule, NameSource, ServiceGraph,
    ServicePort, SkippedLine, UnknownObject, Verdict, VerdictReason,
};
use crate::model::nft_names as kp;
use crate::parsers::nft::{
    self, Element, Expr, Family, RelOp, Rule, Stmt, Table, Verdict as NftVerdict,
};
use names::{ObjectName, ServicePortName, hash_of, hashed_from_comment, parse_object_name};
use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// A parsed nftables ruleset ready to be drawn: the tables and the DNAT destination texts of
/// every chain (which the graph's endpoints borrow, as they borrow iptables dump text).
#[derive(Debug)]
pub struct NftGraphs<'a> {
    ruleset: nft::Ruleset<'a>,
    /// Per table, per chain: every destination its DNATs send to, as `ip:port` / `[ip6]:port`,
    /// in rule and map order.
    destinations: Vec<Vec<Vec<String>>>,
    /// Why the input is not the whole listing, beyond what parsing found (a cut paste).
    gaps: Vec<String>,
}

impl<'a> NftGraphs<'a> {
    /// Takes a parsed ruleset.
    pub fn new(ruleset: nft::Ruleset<'a>) -> Self {
        let destinations = ruleset
            .tables
            .iter()
            .map(|t| t.chains.iter().map(|c| destinations_of(t, c)).collect())
            .collect();
        NftGraphs {
            ruleset,
            destinations,
            gaps: Vec::new(),
        }
    }

    /// Records why the input is not all of the listing (e.g. a paste cut at a line): chains
    /// whose callers may be missing are then not reported as stale.
    pub fn add_gap(&mut self, gap: String) {
        self.gaps.push(gap);
    }

    /// The ruleset.
    pub fn ruleset(&self) -> &nft::Ruleset<'a> {
        &self.ruleset
    }

    /// The kube-proxy tables (`ip kube-proxy`, `ip6 kube-proxy`), in input order.
    pub fn kube_proxy_tables(&self) -> impl Iterator<Item = &Table<'a>> {
        self.ruleset
            .tables
            .iter()
            .filter(|t| is_kube_proxy_table(t))
    }

    /// One graph per kube-proxy table (IPv4 and IPv6 tables of one listing give two graphs).
    pub fn graphs(&self, opts: &GraphOptions) -> Vec<ServiceGraph<'_>> {
        let skipped: Vec<SkippedLine> = self
            .ruleset
            .skipped
            .iter()
            .map(|s| SkippedLine {
                line: s.line,
                reason: s.reason.clone(),
            })
            .collect();
        // A cut paste (lenient reading skipped lines, or the input ends inside a block) may lack
        // the callers of a chain and the chains a map points to.
        let mut gaps: Vec<String> = self
            .ruleset
            .warnings
            .iter()
            .filter(|w| w.message.contains("unterminated") || w.message.contains("ends inside"))
            .map(|w| format!("line {}: {}", w.line, w.message))
            .collect();
        gaps.extend(self.gaps.iter().cloned());
        if !skipped.is_empty() {
            gaps.push(format!(
                "{} line(s) could not be read and were skipped",
                skipped.len()
            ));
        }
        self.ruleset
            .tables
            .iter()
            .zip(&self.destinations)
            .filter(|(t, _)| is_kube_proxy_table(t))
            .map(|(t, dests)| {
                let mut g = build_table(t, dests, gaps.is_empty());
                g.source = opts.source.clone();
                g.skipped_lines = skipped.clone();
                g.gaps = gaps.clone();
                g
            })
            .collect()
    }
}

/// What this build does not know in a kube-proxy table ([`layout`]), by where it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UnknownLayout {
    /// Per service port (`ns/name:port`, or `<hash:…>`): what is on its path.
    pub ports: Vec<(String, Vec<UnknownObject>)>,
    /// What is on no service port's path.
    pub elsewhere: Vec<UnknownObject>,
}

impl UnknownLayout {
    /// True when this build knows everything in the table.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && self.elsewhere.is_empty()
    }

    /// Whether what is on no port's path is a statement of a fixed chain, which every service
    /// port's traffic passes: then no service port's path is known.
    pub fn in_shared_chains(&self) -> bool {
        self.elsewhere
            .iter()
            .any(|u| u.kind == super::UnknownKind::Statement && layout::fixed_chain(&u.name))
    }
}

/// What this build does not know in kube-proxy's `table`, by service port (on its path) and
/// elsewhere. Building the graph is needed to place it, so a table this build knows all of is
/// not graphed.
pub fn unknown_layout(table: &Table<'_>) -> UnknownLayout {
    if layout::unknown_objects(table).is_empty() {
        return UnknownLayout::default();
    }
    let destinations: Vec<Vec<String>> = table
        .chains
        .iter()
        .map(|c| destinations_of(table, c))
        .collect();
    let g = build_table(table, &destinations, true);
    let ports: Vec<(String, Vec<UnknownObject>)> = g
        .service_ports
        .iter()
        .filter(|p| !p.unknown_layout.is_empty())
        .map(|p| (p.display_name(), p.unknown_layout.clone()))
        .collect();
    let on_path: HashSet<&UnknownObject> = ports.iter().flat_map(|(_, u)| u).collect();
    let elsewhere = layout::unknown_objects(table)
        .into_iter()
        .filter(|u| !on_path.contains(u))
        .collect();
    UnknownLayout { ports, elsewhere }
}

/// Every destination the DNATs of `chain` send to, as text, in rule and map order.
fn destinations_of(table: &Table<'_>, chain: &nft::Chain<'_>) -> Vec<String> {
    let mut texts: Vec<String> = Vec::new();
    for s in chain.rules.iter().flat_map(|r| &r.stmts) {
        if let Some(Ok(pick)) = dnat::dnat_pick(s, table) {
            for (target, _) in &pick.arms {
                let text = target.text();
                if !texts.contains(&text) {
                    texts.push(text);
                }
            }
        }
    }
    texts
}

/// Whether `t` is kube-proxy's table (`table ip kube-proxy` / `table ip6 kube-proxy`).
pub fn is_kube_proxy_table(t: &Table<'_>) -> bool {
    t.name == kp::TABLE && matches!(t.family, Family::Ip | Family::Ip6)
}

/// `table` of anomalies: `ip kube-proxy`.
fn table_label(t: &Table<'_>) -> String {
    format!("{} {}", t.family, t.name)
}

/// The chain a verdict goes to, and whether by `goto`.
fn verdict_chain<'r>(v: &'r NftVerdict<'_>) -> Option<&'r str> {
    match v {
        NftVerdict::Jump(c) | NftVerdict::Goto(c) => Some(c),
        _ => None,
    }
}

/// The parts of a concatenated key (`a . b . c`), or the key itself.
pub fn key_parts<'e, 'a>(e: &'e Expr<'a>) -> &'e [Expr<'a>] {
    match e {
        Expr::Concat(parts) => parts,
        other => std::slice::from_ref(other),
    }
}

/// `tcp`, `udp`, `sctp` from a protocol key part (a name or its number).
pub fn protocol_of(e: &Expr<'_>) -> Option<&'static str> {
    match e {
        Expr::Symbol(s) => match &**s {
            "tcp" => Some("tcp"),
            "udp" => Some("udp"),
            "sctp" => Some("sctp"),
            _ => None,
        },
        Expr::Number(6) => Some("tcp"),
        Expr::Number(17) => Some("udp"),
        Expr::Number(132) => Some("sctp"),
        _ => None,
    }
}

/// A port number constant.
fn port_of(e: &Expr<'_>) -> Option<u16> {
    match e {
        Expr::Number(n) => u16::try_from(*n).ok(),
        _ => None,
    }
}

/// A map element read as kube-proxy writes them: `[addr .] proto . port : verdict`.
#[derive(Debug, Clone, Copy)]
struct MapKey {
    address: Option<IpAddr>,
    protocol: &'static str,
    port: u16,
}

fn map_key(e: &Element<'_>) -> Option<MapKey> {
    match key_parts(&e.key) {
        [Expr::Addr(a), proto, port] => Some(MapKey {
            address: Some(*a),
            protocol: protocol_of(proto)?,
            port: port_of(port)?,
        }),
        [proto, port] => Some(MapKey {
            address: None,
            protocol: protocol_of(proto)?,
            port: port_of(port)?,
        }),
        _ => None,
    }
}

fn element_verdict<'e>(e: &'e Element<'_>) -> Option<&'e NftVerdict<'e>> {
    match &e.value {
        Some(Expr::Verdict(v)) => Some(v),
        _ => None,
    }
}

fn counters_of(rule: &Rule<'_>) -> Option<Counters> {
    rule.counter().flatten().map(|c| Counters {
        packets: c.packets,
        bytes: c.bytes,
    })
}

/// A service port while it is built.
#[derive(Debug, Default)]
struct PortB<'r> {
    name: Option<String>,
    protocol: Option<String>,
    hash: Option<String>,
    chains: Vec<ChainRef>,
    entries: Vec<Entry>,
    endpoints: Vec<Endpoint<'r>>,
    masquerade: Vec<MasqueradeRule<'r>>,
    affinity_chains: Vec<String>,
    affinity_timeout: Option<u32>,
    firewall: Option<Firewall>,
    verdicts: Vec<Verdict>,
    edges: Vec<Edge<'r>>,
    /// The chains on the port's path (its own, and what they lead to), in the order reached.
    path: Vec<usize>,
    /// Sets and maps the rules on the path look up.
    sets: Vec<&'r str>,
    unknown_layout: Vec<UnknownObject>,
}

/// What the graph of one table is built from and into.
struct Builder<'r, 'a> {
    table: &'r Table<'a>,
    label: String,
    /// Per chain: the destinations its DNATs send to.
    destinations: &'r [Vec<String>],
    /// Chain name → index.
    chain_index: HashMap<&'r str, usize>,
    /// Per chain: its parsed per-service name.
    object: Vec<Option<ObjectName<'r>>>,
    ports: Vec<PortB<'r>>,
    /// `ns/name/proto/port` (or the cut name) → port index.
    port_index: HashMap<Cow<'r, str>, usize>,
    /// (chain, destination) → (port, endpoint index in the port). An endpoint chain (picked by
    /// a `numgen` vmap or an affinity lookup, or named `endpoint-…`) has no destination in its
    /// key; a DNAT in a policy chain gives one endpoint per destination.
    endpoint_of: HashMap<(&'r str, Option<&'r str>), (usize, usize)>,
    /// The mark `masquerading` masquerades on, and the chains that only set it.
    mark: Option<u64>,
    mark_chains: Vec<&'r str>,
    anomalies: Vec<Anomaly>,
}

fn build_table<'r, 'a>(
    table: &'r Table<'a>,
    destinations: &'r [Vec<String>],
    whole: bool,
) -> ServiceGraph<'r> {
    let mark = dnat::masquerade_mark(table);
    let mut b = Builder {
        table,
        label: table_label(table),
        destinations,
        chain_index: table
            .chains
            .iter()
            .enumerate()
            .map(|(i, c)| (&*c.name, i))
            .collect(),
        object: table
            .chains
            .iter()
            .map(|c| parse_object_name(&c.name))
            .collect(),
        ports: Vec::new(),
        port_index: HashMap::new(),
        endpoint_of: HashMap::new(),
        mark,
        mark_chains: dnat::mark_chains(table, mark),
        anomalies: Vec::new(),
    };
    b.register_chains();
    b.maps();
    b.paths();
    b.endpoint_chains();
    b.hairpin();
    b.dispatch_masquerade();
    b.unknown_layout();
    let service_of: HashMap<usize, String> = b
        .object
        .iter()
        .enumerate()
        .filter_map(|(ci, o)| {
            let o = o.as_ref()?;
            let port = b.port_index.get(o.service_part())?;
            Some((ci, b.ports[*port].display_name()))
        })
        .collect();
    b.anomalies.extend(anomalies::find(
        table,
        &b.label,
        &b.object,
        &service_of,
        whole,
    ));
    b.finish()
}

impl PortB<'_> {
    fn display_name(&self) -> String {
        match (&self.name, &self.hash) {
            (Some(n), _) => n.clone(),
            (None, Some(h)) => format!("<hash:{h}>"),
            (None, None) => "<unknown>".to_string(),
        }
    }
}

impl<'r, 'a> Builder<'r, 'a> {
    /// The port whose chains are named after `hashed` (`ns/name/proto/port`), created on first use.
    fn port(&mut self, hashed: Cow<'r, str>) -> usize {
        if let Some(&i) = self.port_index.get(&*hashed) {
            return i;
        }
        let spn = ServicePortName::parse(&hashed);
        let port = PortB {
            name: spn.map(|s| s.display()),
            protocol: spn.map(|s| s.protocol.to_string()),
            hash: (!hashed.ends_with("...")).then(|| hash_of(&hashed)),
            ..PortB::default()
        };
        self.ports.push(port);
        let i = self.ports.len() - 1;
        self.port_index.insert(hashed, i);
        i
    }

    /// The port of a per-service object name (its hash is the port's for service-level chains).
    fn port_of_name(&mut self, o: ObjectName<'r>) -> usize {
        let i = self.port(Cow::Borrowed(o.service_part()));
        if o.kind != ChainKind::Sep && o.truncated() && self.ports[i].hash.is_none() {
            self.ports[i].hash = Some(o.hash.to_string());
        }
        i
    }

    fn anomaly(
        &mut self,
        kind: AnomalyKind,
        chain: &str,
        line: u32,
        port: Option<usize>,
        message: String,
    ) {
        let service = port.map(|p| self.ports[p].display_name());
        self.anomalies.push(Anomaly {
            kind,
            table: self.label.clone(),
            chain: Some(chain.to_string()),
            line: (line > 0).then_some(line),
            service,
            message,
        });
    }

    /// Every per-service chain joins its port; names whose hash is not kube-proxy's are flagged.
    fn register_chains(&mut self) {
        for ci in 0..self.table.chains.len() {
            let Some(o) = self.object[ci] else { continue };
            let c = &self.table.chains[ci];
            let p = self.port_of_name(o);
            if o.kind != ChainKind::Sep {
                self.ports[p].chains.push(ChainRef {
                    kind: o.kind,
                    name: c.name.to_string(),
                    rules: c.rules.len(),
                });
            }
            if o.hash_matches() == Some(false) {
                self.anomaly(
                    AnomalyKind::NameMismatch,
                    &c.name,
                    c.line,
                    Some(p),
                    format!(
                        "the name's hash {} is not kube-proxy's hash of `{}` ({})",
                        o.hash,
                        o.hashed,
                        hash_of(o.hashed)
                    ),
                );
            }
        }
        for p in &mut self.ports {
            p.chains.sort_by_key(|c| c.kind);
        }
    }

    /// The elements of the service and no-endpoint maps (entries and verdicts), the firewall
    /// map (source-range verdicts), and the `cluster-ips` set.
    fn maps(&mut self) {
        let table = self.table;
        let keys_of = |set: &str| -> HashSet<(Option<IpAddr>, &'static str, u16)> {
            table
                .set(set)
                .map(|s| {
                    s.elements
                        .iter()
                        .filter_map(map_key)
                        .map(|k| (k.address, k.protocol, k.port))
                        .collect()
                })
                .unwrap_or_default()
        };
        let firewalled = keys_of(kp::FIREWALL_IPS_MAP);
        let cluster_ips: Option<HashSet<IpAddr>> = table.set(kp::CLUSTER_IPS_SET).map(|s| {
            s.elements
                .iter()
                .filter_map(|e| match e.key {
                    Expr::Addr(a) => Some(a),
                    _ => None,
                })
                .collect()
        });
        for map in [kp::SERVICE_IPS_MAP, kp::SERVICE_NODEPORTS_MAP] {
            let Some(set) = table.set(map) else { continue };
            for el in &set.elements {
                let (Some(key), Some(target)) =
                    (map_key(el), element_verdict(el).and_then(verdict_chain))
                else {
                    continue;
                };
                let Some(o) = parse_object_name(target) else {
                    continue;
                };
                let p = self.port_of_name(o);
                let kind = match (key.address, o.kind) {
                    (None, _) => EntryKind::NodePort,
                    (Some(_), ChainKind::Svc | ChainKind::Svl) => EntryKind::ClusterIp,
                    (Some(_), ChainKind::Fw) => EntryKind::LoadBalancerIp,
                    (Some(a), _) if firewalled.contains(&(Some(a), key.protocol, key.port)) => {
                        EntryKind::LoadBalancerIp
                    }
                    (Some(_), _) => EntryKind::ExternalIp,
                };
                if kind == EntryKind::ClusterIp
                    && let (Some(a), Some(cips)) = (key.address, &cluster_ips)
                    && !cips.contains(&a)
                {
                    self.anomaly(
                        AnomalyKind::ClusterIpNotInSet,
                        kp::CLUSTER_IPS_SET,
                        set.line,
                        Some(p),
                        format!(
                            "cluster IP {a} is not in the {} set: cluster-ips-check does not reject its other ports",
                            kp::CLUSTER_IPS_SET
                        ),
                    );
                }
                self.ports[p].entries.push(Entry {
                    kind,
                    address: key.address.map(|a| a.to_string()),
                    port: Some(key.port),
                    protocol: Some(key.protocol.to_string()),
                    table: "nat".to_string(),
                    chain: map.to_string(),
                    target: target.to_string(),
                    line: set.line,
                    counters: el.counter.map(|c| Counters {
                        packets: c.packets,
                        bytes: c.bytes,
                    }),
                });
            }
        }
        for map in [kp::NO_ENDPOINT_SERVICES_MAP, kp::NO_ENDPOINT_NODEPORTS_MAP] {
            let Some(set) = table.set(map) else { continue };
            for el in &set.elements {
                let Some(key) = map_key(el) else { continue };
                let verdict = match element_verdict(el) {
                    Some(NftVerdict::Drop) => "DROP",
                    Some(NftVerdict::Goto(c) | NftVerdict::Jump(c)) if c == kp::REJECT_CHAIN => {
                        "REJECT"
                    }
                    _ => continue,
                };
                let Some(hashed) = el
                    .comment
                    .as_deref()
                    .and_then(|c| hashed_from_comment(c, key.protocol))
                else {
                    continue;
                };
                let p = self.port(Cow::Owned(hashed));
                let kind = match key.address {
                    None => EntryKind::NodePort,
                    Some(a) if cluster_ips.as_ref().is_some_and(|c| c.contains(&a)) => {
                        EntryKind::ClusterIp
                    }
                    Some(a) if firewalled.contains(&(Some(a), key.protocol, key.port)) => {
                        EntryKind::LoadBalancerIp
                    }
                    Some(_) => EntryKind::ExternalIp,
                };
                let address = key.address.map(|a| a.to_string());
                let port = &mut self.ports[p];
                let counters = el.counter.map(|c| Counters {
                    packets: c.packets,
                    bytes: c.bytes,
                });
                if !port
                    .entries
                    .iter()
                    .any(|e| e.address == address && e.port == Some(key.port))
                {
                    port.entries.push(Entry {
                        kind,
                        address: address.clone(),
                        port: Some(key.port),
                        protocol: Some(key.protocol.to_string()),
                        table: "filter".to_string(),
                        chain: map.to_string(),
                        target: match verdict {
                            "DROP" => "drop".to_string(),
                            _ => kp::REJECT_CHAIN.to_string(),
                        },
                        line: set.line,
                        counters,
                    });
                }
                port.verdicts.push(Verdict {
                    table: "filter".to_string(),
                    chain: map.to_string(),
                    verdict: verdict.to_string(),
                    reason: if verdict == "REJECT" {
                        VerdictReason::NoEndpoints
                    } else {
                        VerdictReason::NoLocalEndpoints
                    },
                    address,
                    port: Some(key.port),
                    line: set.line,
                    counters,
                });
            }
        }
        if let Some(set) = table.set(kp::FIREWALL_IPS_MAP) {
            for el in &set.elements {
                let (Some(key), Some(target)) =
                    (map_key(el), element_verdict(el).and_then(verdict_chain))
                else {
                    continue;
                };
                let Some(o) = parse_object_name(target) else {
                    continue;
                };
                let p = self.port_of_name(o);
                let drops = self
                    .chain_index
                    .get(target)
                    .map(|&ci| &self.table.chains[ci])
                    .is_some_and(|c| {
                        c.rules
                            .iter()
                            .any(|r| r.verdict() == Some(&NftVerdict::Drop))
                    });
                if drops {
                    self.ports[p].verdicts.push(Verdict {
                        table: "filter".to_string(),
                        chain: target.to_string(),
                        verdict: "DROP".to_string(),
                        reason: VerdictReason::SourceRange,
                        address: key.address.map(|a| a.to_string()),
                        port: Some(key.port),
                        line: set.line,
                        counters: None,
                    });
                }
            }
        }
    }

    fn finish(self) -> ServiceGraph<'r> {
        let mut service_ports: Vec<ServicePort<'r>> = self
            .ports
            .into_iter()
            .map(|p| {
                let mut entries = p.entries;
                entries.sort_by_key(|e| e.kind);
                ServicePort {
                    name_source: if p.name.is_some() {
                        NameSource::ChainName
                    } else {
                        NameSource::Unknown
                    },
                    name: p.name,
                    protocol: p.protocol,
                    hash: p.hash,
                    chains: p.chains,
                    entries,
                    endpoints: p.endpoints,
                    masquerade: p.masquerade,
                    affinity: (!p.affinity_chains.is_empty()).then_some(Affinity {
                        timeout_seconds: p.affinity_timeout,
                        chains: p.affinity_chains,
                    }),
                    firewall: p.firewall,
                    verdicts: p.verdicts,
                    edges: p.edges,
                    unknown_layout: p.unknown_layout,
                }
            })
            .collect();
        service_ports.sort_by(|a, b| {
            (a.name.is_none(), &a.name, &a.protocol, &a.hash).cmp(&(
                b.name.is_none(),
                &b.name,
                &b.protocol,
                &b.hash,
            ))
        });
        let mut anomalies = self.anomalies;
        anomalies.sort_by(|a, b| (a.kind, &a.table, a.line).cmp(&(b.kind, &b.table, b.line)));
        ServiceGraph {
            source: None,
            family: Some(
                match self.table.family {
                    Family::Ip6 => "ipv6",
                    _ => "ipv4",
                }
                .to_string(),
            ),
            backend: Some("nftables".to_string()),
            masquerade_mark: self.mark.map(|m| format!("{m:#x}")),
            service_ports,
            anomalies,
            skipped_lines: Vec::new(),
            gaps: Vec::new(),
        }
    }
}

fn edge<'r>(from: &'r str, to: &'r str, label: Cow<'r, str>, rule: &Rule<'_>) -> Edge<'r> {
    Edge {
        from,
        to,
        label,
        line: rule.line,
    }
}

/// `p=0.3333`, as the iptables graph labels its picks.
fn probability_label(p: f64) -> Cow<'static, str> {
    Cow::Owned(format!("p={p:.4}"))
}

/// What a rule of an external chain sends on: `pod source` (the local-traffic detector),
/// `LOCAL source` (`fib saddr type local`), other conditions as written, `""` unconditional.
fn source_label<'r>(rule: &Rule<'_>) -> Cow<'r, str> {
    let conds: Vec<&Stmt<'_>> = rule
        .stmts
        .iter()
        .filter(|s| matches!(s, Stmt::Match { .. }))
        .collect();
    match conds.as_slice() {
        [] => Cow::Borrowed(""),
        [
            Stmt::Match {
                left: Expr::Fib { flags, .. },
                op: RelOp::Eq,
                ..
            },
        ] if flags.iter().any(|f| f == "saddr") => Cow::Borrowed("LOCAL source"),
        [
            Stmt::Match {
                left: Expr::Payload { field, .. },
                op: RelOp::Eq,
                ..
            },
        ] if field == "saddr" => Cow::Borrowed("pod source"),
        [
            Stmt::Match {
                left: Expr::Meta(k),
                op: RelOp::Eq,
                ..
            },
        ] if k.starts_with("iif") => Cow::Borrowed("pod source"),
        other => Cow::Owned(
            other
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" "),
        ),
    }
}

/// A rule that marks the packet for masquerade (inline, or by a jump to a chain that only sets
/// the mark) in a chain that acts as one of kind `kind`, classified by its source condition.
fn masquerade_rule<'r>(
    chain: &'r str,
    rule: &Rule<'_>,
    kind: ChainKind,
    mark: Option<u64>,
    mark_chains: &[&str],
) -> Option<MasqueradeRule<'r>> {
    if !dnat::marks_for_masquerade(rule, mark, mark_chains) {
        return None;
    }
    let source = rule.stmts.iter().find(|s| match s {
        Stmt::Match {
            left: Expr::Payload { field, .. },
            ..
        } => field == "saddr",
        Stmt::Match {
            left: Expr::Meta(k),
            ..
        } => k.starts_with("iif"),
        Stmt::Match {
            left: Expr::Fib { flags, .. },
            ..
        } => flags.iter().any(|f| f == "saddr"),
        _ => false,
    });
    let reason = match (kind, source) {
        (ChainKind::Sep, Some(_)) => MasqueradeReason::Hairpin,
        (ChainKind::Ext, None) => MasqueradeReason::ExternalDestination,
        (
            _,
            Some(Stmt::Match {
                left: Expr::Fib { .. },
                ..
            }),
        ) => MasqueradeReason::LocalSource,
        (ChainKind::Svc | ChainKind::Svl, Some(Stmt::Match { op: RelOp::Ne, .. })) => {
            MasqueradeReason::OffClusterSource
        }
        (ChainKind::Svc | ChainKind::Svl, None) => MasqueradeReason::AllSources,
        _ => MasqueradeReason::Other,
    };
    Some(MasqueradeRule {
        chain,
        reason,
        condition: source.map(|s| Cow::Owned(s.to_string())),
        line: rule.line,
        counters: counters_of(rule),
    })
}

/// `ip saddr @affinity-X goto endpoint-X`: the set and the endpoint chain.
fn affinity_lookup<'r>(rule: &'r Rule<'_>) -> Option<(&'r str, &'r str)> {
    let set = rule.stmts.iter().find_map(|s| match s {
        Stmt::Match {
            left: Expr::Payload { field, .. },
            op: RelOp::Eq,
            right: Expr::SetRef(set),
        } if field == "saddr" && set.starts_with(kp::AFFINITY_PREFIX) => Some(&**set),
        _ => None,
    })?;
    Some((set, rule.verdict().and_then(verdict_chain)?))
}

/// A `numgen random mod N [offset M] vmap { k : verdict , … }`.
#[derive(Debug)]
pub struct NumgenPick<'r> {
    /// N.
    pub modulus: u32,
    /// M.
    pub offset: u32,
    /// Per element: the keys (a number, or every number of a range) and the chain it goes to
    /// (`None` for a verdict that is not a jump/goto).
    pub arms: Vec<(Vec<u64>, Option<&'r str>)>,
}

/// The numgen vmap of a rule, when its last statement is one.
pub fn numgen_pick<'r>(rule: &'r Rule<'_>) -> Option<NumgenPick<'r>> {
    let Some(Stmt::Vmap {
        key: Expr::Numgen {
            mode,
            modulus,
            offset,
        },
        map: Expr::Set(elements),
    }) = rule.stmts.last()
    else {
        return None;
    };
    if mode != "random" {
        return None;
    }
    let arms = elements
        .iter()
        .map(|el| {
            let keys = match &el.key {
                Expr::Number(k) => vec![*k],
                Expr::Range(lo, hi) => match (&**lo, &**hi) {
                    // A range wider than the modulus covers every value drawn; cap the list.
                    (Expr::Number(lo), Expr::Number(hi)) if hi >= lo => {
                        (*lo..=(*hi).min(lo.saturating_add(u64::from(*modulus)))).collect()
                    }
                    _ => Vec::new(),
                },
                _ => Vec::new(),
            };
            let target = element_verdict(el).and_then(verdict_chain);
            (keys, target)
        })
        .collect();
    Some(NumgenPick {
        modulus: *modulus,
        offset: *offset,
        arms,
    })
}

/// The kind of a kube-proxy per-service chain name of either mode (`KUBE-SVC-…`, `service-…`).
pub fn port_chain_kind(name: &str) -> Option<ChainKind> {
    names::chain_kind(name)
}

#[cfg(test)]
mod tests;
