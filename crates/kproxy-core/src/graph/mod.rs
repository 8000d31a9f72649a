//! The service graph rebuilt from a ruleset: entries, chains, endpoints with shares, anomalies.
//!
//! [`iptables::build`] turns one parsed `iptables-save` / `iptables -S` dump into a [`ServiceGraph`]: per
//! service port its entry points (cluster IP, NodePorts, external IPs, load-balancer IPs, health
//! check port), its `KUBE-SVC/SVL/EXT/FW/XLB` chains, each endpoint chain with its effective share
//! of new connections and DNAT target, masquerade rules and why they fire, session affinity, and the
//! filter-table verdicts (REJECT/DROP). What does not fit kube-proxy's shape is listed as
//! [`Anomaly`]s. Every kube-proxy layout since v1.2 builds a graph (masquerade rules in
//! `KUBE-SERVICES`, `KUBE-XLB-*`, the `0x4d415351` mark). Chain ownership is decided in one place,
//! [`ownership::is_kube_proxy_chain`].
//!
//! The JSON form (`graph -o json`) is a stable interface documented in `docs/graph-json.md`.

pub mod iptables;
pub mod ipvs;
pub mod names;
pub mod nftables;
pub mod ownership;

pub use names::NameResolver;
pub use ownership::{ChainKind, is_kube_proxy_chain};

use serde::Serialize;
use std::borrow::Cow;

/// The schema identifier written into every JSON/YAML document.
pub const SCHEMA: &str = "kproxy.graph/v1";

/// Graphs of one or more dumps (e.g. `--iptables-save` and `--ip6tables-save`): the top-level
/// JSON/YAML document of `graph`.
#[derive(Debug, Clone, Serialize)]
pub struct GraphDocument<'g, 'a> {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    /// One graph per input, in argument order.
    pub graphs: &'g [ServiceGraph<'a>],
}

impl<'g, 'a> GraphDocument<'g, 'a> {
    /// Wraps graphs into a document (borrowed: a node's graph is not copied to be printed).
    pub fn new(graphs: &'g [ServiceGraph<'a>]) -> Self {
        GraphDocument {
            schema: SCHEMA,
            graphs,
        }
    }
}

/// How to build a graph.
#[derive(Debug, Clone, Default)]
pub struct GraphOptions {
    /// Known service ports, to name chains of dumps without comments.
    pub resolver: NameResolver,
    /// Name of the input (file path or `<stdin>`), copied into [`ServiceGraph::source`].
    pub source: Option<String>,
    /// Keep only what `verify`'s graph-level comparison reads: no [`ServicePort::edges`]
    /// (drawing and tracing read them) and no hairpin rules of endpoint chains in
    /// [`ServicePort::masquerade`] (each endpoint's [`Endpoint::hairpin_masquerade`] still says
    /// whether it has one): on a large node, megabytes and hundreds of thousands of allocations
    /// less (BENCHMARKS.md).
    ///
    /// [`ServicePort::edges`]: ServicePort::edges
    /// [`ServicePort::masquerade`]: ServicePort::masquerade
    /// [`Endpoint::hairpin_masquerade`]: Endpoint::hairpin_masquerade
    pub comparison_only: bool,
}

/// The service graph of one dump. Per-endpoint strings borrow the dump text (`'a`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ServiceGraph<'a> {
    /// Where the dump came from (file name, `<stdin>`), if the caller set it.
    pub source: Option<String>,
    /// `ipv4` or `ipv6`, from the addresses in the rules; `None` when the dump has none.
    pub family: Option<String>,
    /// Backend from the dump header: `legacy`, `nf_tables`, or `None`.
    pub backend: Option<String>,
    /// The masquerade mark as `KUBE-MARK-MASQ` sets it (`0x4000/0x4000`), or the old fixed mark.
    pub masquerade_mark: Option<String>,
    /// Service ports, sorted by name (unnamed last), protocol, hash.
    pub service_ports: Vec<ServicePort<'a>>,
    /// What does not fit kube-proxy's shape.
    pub anomalies: Vec<Anomaly>,
    /// Lines the parser skipped in lenient mode (line number and reason).
    pub skipped_lines: Vec<SkippedLine>,
    /// Why the input is not a whole dump (cut, filtered), in words; empty for a whole dump.
    /// Chains whose callers may lie outside the input are then not reported as stale.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<String>,
}

impl<'a> ServiceGraph<'a> {
    /// The service ports whose name is `ns/name` or starts with `ns/name:` (all ports of a service).
    pub fn ports_of<'g>(&'g self, namespace: &str, name: &str) -> Vec<&'g ServicePort<'a>> {
        let base = format!("{namespace}/{name}");
        self.service_ports
            .iter()
            .filter(|p| {
                p.name.as_deref().is_some_and(|n| {
                    n == base || n.strip_prefix(&base).is_some_and(|r| r.starts_with(':'))
                })
            })
            .collect()
    }
}

/// A line the parser skipped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SkippedLine {
    /// 1-based line number.
    pub line: u32,
    /// Why it was skipped.
    pub reason: String,
}

/// Packet and byte counters of a rule (present when the dump was taken with `-c` / `-v`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Counters {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// Where a service port's name came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NameSource {
    /// A kube-proxy rule comment.
    Comment,
    /// The chain hash, matched against a service port the caller knows ([`NameResolver`]).
    Resolved,
    /// Not known: only the hash can be shown.
    Unknown,
    /// The nftables chain name (`service-HASH-ns/name/proto/port`), its hash checked.
    ChainName,
}

/// One service port (`ns/name:port` + protocol) as the dump implements it.
#[derive(Debug, Clone, Serialize)]
pub struct ServicePort<'a> {
    /// `ns/name[:port]`, when known.
    pub name: Option<String>,
    /// Where the name came from.
    pub name_source: NameSource,
    /// `tcp`, `udp`, `sctp`, when known.
    pub protocol: Option<String>,
    /// The 16-character chain hash shared by SVC/SVL/EXT/FW/XLB.
    pub hash: Option<String>,
    /// The service's chains (nat table) in kind order.
    pub chains: Vec<ChainRef>,
    /// Entry points, in table/line order.
    pub entries: Vec<Entry>,
    /// Endpoint chains reached from the service's chains (and orphans that name the service).
    pub endpoints: Vec<Endpoint<'a>>,
    /// Rules that mark traffic for masquerade, with the reason.
    pub masquerade: Vec<MasqueradeRule<'a>>,
    /// `ClientIP` session affinity (`-m recent`), when present.
    pub affinity: Option<Affinity>,
    /// Load-balancer source ranges (`KUBE-FW-*`), when present.
    pub firewall: Option<Firewall>,
    /// Filter-table (and old nat `KUBE-MARK-DROP`) verdicts for this service port.
    pub verdicts: Vec<Verdict>,
    /// Jumps between the service's chains, for drawing and tracing.
    pub edges: Vec<Edge<'a>>,
    /// What this build could not read on the port's path (rules of a kube-proxy newer than
    /// this build, or of another program): when not empty, `endpoints` holds only what could
    /// be read, and no endpoint, share or reachability is concluded for the port.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unknown_layout: Vec<UnknownObject>,
}

impl ServicePort<'_> {
    /// The display name: the name, or `<hash:XXXX>` when unknown.
    pub fn display_name(&self) -> String {
        match (&self.name, &self.hash) {
            (Some(n), _) => n.clone(),
            (None, Some(h)) => format!("<hash:{h}>"),
            (None, None) => "<unknown>".to_string(),
        }
    }

    /// The chain of `kind`, if the service has one.
    pub fn chain(&self, kind: ChainKind) -> Option<&ChainRef> {
        self.chains.iter().find(|c| c.kind == kind)
    }
}

/// A chain of a service port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChainRef {
    /// Chain kind.
    pub kind: ChainKind,
    /// Chain name.
    pub name: String,
    /// Number of rules in it.
    pub rules: usize,
}

/// Kinds of entry point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum EntryKind {
    /// `-d <clusterIP> --dport <port>` in nat `KUBE-SERVICES`.
    ClusterIp,
    /// An external IP in nat `KUBE-SERVICES`.
    ExternalIp,
    /// A load-balancer ingress IP in nat `KUBE-SERVICES`.
    LoadBalancerIp,
    /// `--dport <nodePort>` in nat `KUBE-NODEPORTS`.
    NodePort,
    /// The health-check node port `ACCEPT` in filter `KUBE-NODEPORTS`.
    HealthCheckNodePort,
}

impl EntryKind {
    /// Short human label.
    pub fn label(self) -> &'static str {
        match self {
            EntryKind::ClusterIp => "cluster-ip",
            EntryKind::ExternalIp => "external-ip",
            EntryKind::LoadBalancerIp => "load-balancer",
            EntryKind::NodePort => "node-port",
            EntryKind::HealthCheckNodePort => "health-check",
        }
    }
}

/// One way into a service port.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Entry {
    /// What kind of entry point.
    pub kind: EntryKind,
    /// Destination address (`10.96.0.1`, `127.0.0.0/8` for localhost NodePorts), if matched.
    pub address: Option<String>,
    /// Destination port.
    pub port: Option<u16>,
    /// Protocol.
    pub protocol: Option<String>,
    /// Table of the rule.
    pub table: String,
    /// Chain of the rule (`KUBE-SERVICES`, `KUBE-NODEPORTS`).
    pub chain: String,
    /// Where it goes (`KUBE-SVC-…`, `KUBE-EXT-…`, `KUBE-FW-…`, `ACCEPT`).
    pub target: String,
    /// 1-based line in the dump.
    pub line: u32,
    /// Rule counters, when dumped.
    pub counters: Option<Counters>,
}

impl Entry {
    /// `10.96.0.1:443/tcp`, `:30080/tcp` (NodePort on any local address), `127.0.0.0/8:30080/tcp`.
    pub fn display(&self) -> String {
        let addr = self.address.as_deref().unwrap_or("");
        let addr = if addr.contains(':') && !addr.contains('/') {
            format!("[{addr}]")
        } else {
            addr.to_string()
        };
        let port = self
            .port
            .map(|p| p.to_string())
            .unwrap_or_else(|| "*".into());
        match &self.protocol {
            Some(p) => format!("{addr}:{port}/{p}"),
            None => format!("{addr}:{port}"),
        }
    }
}

/// One endpoint chain of a service port.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Endpoint<'a> {
    /// `KUBE-SEP-…`.
    pub chain: &'a str,
    /// The DNAT destination as written (`10.244.0.5:8000`, `[fd00::1]:80`), if any.
    pub destination: Option<&'a str>,
    /// The DNAT address.
    pub ip: Option<std::net::IpAddr>,
    /// The DNAT port.
    pub port: Option<u16>,
    /// Effective share of new connections per policy chain that picks this endpoint.
    pub shares: Vec<Share<'a>>,
    /// True when the endpoint chain marks its own traffic for masquerade (`-s <ep> -j KUBE-MARK-MASQ`).
    pub hairpin_masquerade: bool,
    /// True when the endpoint chain records the client for session affinity (`-m recent --set`).
    pub affinity_set: bool,
    /// Line of the DNAT rule.
    pub dnat_line: Option<u32>,
    /// Counters of the DNAT rule, when dumped (boxed: a 10k-service node has 100k endpoints,
    /// and most dumps have no counters).
    pub counters: Option<Box<Counters>>,
}

impl<'a> Endpoint<'a> {
    /// An endpoint of chain `chain` with nothing known yet.
    pub fn new(chain: &'a str) -> Self {
        Endpoint {
            chain,
            destination: None,
            ip: None,
            port: None,
            shares: Vec::new(),
            hairpin_masquerade: false,
            affinity_set: false,
            dnat_line: None,
            counters: None,
        }
    }

    /// The largest share over all policy chains (0 when nothing picks it).
    pub fn max_share(&self) -> f64 {
        self.shares.iter().map(|s| s.share).fold(0.0, f64::max)
    }
}

/// The share of new connections a policy chain sends to an endpoint.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Share<'a> {
    /// The chain that picks (`KUBE-SVC-…`, `KUBE-SVL-…`, `KUBE-XLB-…`).
    pub via: &'a str,
    /// Effective share (product of the conditional probabilities up to this rule), 0.0–1.0.
    pub share: f64,
    /// The rule's conditional probability (`--probability`), `None` for the last, unconditional rule.
    pub probability: Option<f64>,
    /// Line of the picking rule.
    pub line: u32,
    /// Counters of the picking rule, when dumped (boxed, as [`Endpoint::counters`]).
    pub counters: Option<Box<Counters>>,
}

/// A share of new connections (0.0–1.0) as a percentage with one decimal: `33.3%`. The one
/// way shares are written, in anomaly and finding messages as in every output form.
pub fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// Why a rule marks traffic for masquerade.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MasqueradeReason {
    /// Source is not a pod (`! -s <clusterCIDR>`, `! -i <bridge>`): off-cluster clients of a cluster IP.
    OffClusterSource,
    /// Every source (`masqueradeAll`).
    AllSources,
    /// The endpoint talks to its own service (hairpin, `-s <endpoint>` in `KUBE-SEP-*`).
    Hairpin,
    /// Source is a local address of the node (`--src-type LOCAL`).
    LocalSource,
    /// External destinations (NodePort, external IP, LB IP with `externalTrafficPolicy: Cluster`).
    ExternalDestination,
    /// A condition this tool does not classify.
    Other,
}

impl MasqueradeReason {
    /// One-line explanation.
    pub fn explain(self) -> &'static str {
        match self {
            MasqueradeReason::OffClusterSource => "off-cluster source",
            MasqueradeReason::AllSources => "all sources (masqueradeAll)",
            MasqueradeReason::Hairpin => "hairpin (endpoint to itself)",
            MasqueradeReason::LocalSource => "node-local source",
            MasqueradeReason::ExternalDestination => "external destination",
            MasqueradeReason::Other => "other condition",
        }
    }
}

/// A rule that marks packets for masquerade.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MasqueradeRule<'a> {
    /// The chain holding it.
    pub chain: &'a str,
    /// Why it fires.
    pub reason: MasqueradeReason,
    /// The distinguishing condition as written (`! -s 10.244.0.0/16`, `-s 10.244.0.5/32`), if any.
    pub condition: Option<Cow<'a, str>>,
    /// 1-based line.
    pub line: u32,
    /// Counters, when dumped.
    pub counters: Option<Counters>,
}

/// `ClientIP` session affinity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Affinity {
    /// `--seconds` of the `--rcheck` rules (kube-proxy's timeoutSeconds), when written.
    pub timeout_seconds: Option<u32>,
    /// Chains holding `--rcheck` rules.
    pub chains: Vec<String>,
}

/// A `KUBE-FW-*` load-balancer firewall.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Firewall {
    /// The chain.
    pub chain: String,
    /// Allowed source ranges (`-s … -j KUBE-EXT/SVC/XLB`), in rule order.
    pub source_ranges: Vec<String>,
}

/// Why a verdict rule exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum VerdictReason {
    /// `has no endpoints` (REJECT).
    NoEndpoints,
    /// `has no local endpoints` (DROP).
    NoLocalEndpoints,
    /// Load-balancer source range firewall (DROP in `KUBE-PROXY-FIREWALL`, old `KUBE-MARK-DROP` in FW).
    SourceRange,
    /// The closing `KUBE-MARK-DROP` of an old firewall chain (`KUBE-FW-…`) of a service without
    /// source ranges: it takes what no rule above it does.
    FallThrough,
    /// Not classified.
    Other,
}

/// A REJECT/DROP for a service port.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// `filter` (or `nat` for old `KUBE-MARK-DROP` rules).
    pub table: String,
    /// Chain holding the rule.
    pub chain: String,
    /// `REJECT`, `DROP`, `KUBE-MARK-DROP`.
    pub verdict: String,
    /// Why.
    pub reason: VerdictReason,
    /// Destination address, if matched.
    pub address: Option<String>,
    /// Destination port, if matched.
    pub port: Option<u16>,
    /// 1-based line.
    pub line: u32,
    /// Counters, when dumped.
    pub counters: Option<Counters>,
}

/// A jump between chains of one service port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Edge<'a> {
    /// From chain.
    pub from: &'a str,
    /// To chain.
    pub to: &'a str,
    /// Condition in words (`p=0.5000`, `affinity`, `pod source`, `LOCAL source`, `-s 203.0.113.0/25`), empty when unconditional.
    pub label: Cow<'a, str>,
    /// 1-based line.
    pub line: u32,
}

/// Kinds of anomaly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AnomalyKind {
    /// A rule jumps to a chain the dump does not declare.
    UndeclaredJump,
    /// A kube-proxy service chain nothing jumps to (stale).
    UnreferencedChain,
    /// A kube-proxy service chain without rules.
    EmptyServiceChain,
    /// The same rule twice in one chain.
    DuplicateRule,
    /// A rule after an unconditional terminating rule (never reached).
    UnreachableRule,
    /// The probabilities of a policy chain leave some new connections unassigned.
    ProbabilityLeak,
    /// An endpoint chain without a DNAT rule.
    MissingDnat,
    /// iptables could not decode the rule's target (version skew).
    UnreadableRule,
    /// Chains that jump or go to each other in a cycle (or a chain to itself).
    JumpLoop,
    /// An nftables per-service chain whose hash is not kube-proxy's hash of the rest of its name.
    NameMismatch,
    /// A cluster IP with `service-ips` entries that the nftables `cluster-ips` set lacks.
    ClusterIpNotInSet,
    /// An object or rule of kube-proxy's own that this build does not know (a newer
    /// kube-proxy's layout, or another program's): nothing is concluded from it.
    UnknownLayout,
}

/// What an [`UnknownObject`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnknownKind {
    /// A chain.
    Chain,
    /// A set.
    Set,
    /// A map.
    Map,
    /// A named object other than a chain, set or map (`quota`, `ct helper`, …).
    Object,
    /// A statement of a known chain.
    Statement,
    /// An iptables rule of a kube-proxy chain (its target or matches).
    Rule,
}

impl UnknownKind {
    /// The word for it.
    pub fn word(self) -> &'static str {
        match self {
            UnknownKind::Chain => "chain",
            UnknownKind::Set => "set",
            UnknownKind::Map => "map",
            UnknownKind::Object => "object",
            UnknownKind::Statement => "statement",
            UnknownKind::Rule => "rule",
        }
    }
}

/// Something in kube-proxy's own rules that this build does not know.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct UnknownObject {
    /// What it is.
    pub kind: UnknownKind,
    /// Its name (`quota q1` for a named object); for a statement or a rule, its chain.
    pub name: String,
    /// 1-based input line, when the input has lines.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<u32>,
    /// The statement or rule as read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

impl UnknownObject {
    /// `chain foo (line 3)`, `statement `ct mark set 0x1` in chain services (line 10)`.
    pub fn describe(&self) -> String {
        let mut s = match (&self.text, self.kind) {
            (Some(t), kind) => format!("{} `{t}` in chain {}", kind.word(), self.name),
            (None, UnknownKind::Object) => self.name.clone(),
            (None, kind) => format!("{} {}", kind.word(), self.name),
        };
        if let Some(l) = self.line {
            s.push_str(&format!(" (line {l})"));
        }
        s
    }
}

/// What every command says of objects it does not know: which, and that the node's kube-proxy
/// may be newer than this build.
pub fn unknown_layout_message(objects: &[UnknownObject]) -> String {
    const SHOWN: usize = 3;
    let mut list: Vec<String> = objects
        .iter()
        .take(SHOWN)
        .map(UnknownObject::describe)
        .collect();
    if objects.len() > SHOWN {
        list.push(format!("and {} more", objects.len() - SHOWN));
    }
    format!(
        "this build does not know {}: the node's kube-proxy may be newer than this build (or another program wrote it); nothing is concluded from it",
        list.join(", ")
    )
}

/// Something that does not fit kube-proxy's shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Anomaly {
    /// Kind.
    pub kind: AnomalyKind,
    /// Table.
    pub table: String,
    /// Chain concerned.
    pub chain: Option<String>,
    /// 1-based line, when one rule is concerned.
    pub line: Option<u32>,
    /// The service port concerned, when known.
    pub service: Option<String>,
    /// One-line description.
    pub message: String,
}
