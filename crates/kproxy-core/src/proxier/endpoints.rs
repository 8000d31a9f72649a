//! EndpointSlices → endpoints per service port (kube-proxy `endpointslicecache.go`) and their
//! categorisation into cluster/local/reachable sets with terminating fallback and topology hints
//! (`topology.go` `CategorizeEndpoints`). Mode-independent: the iptables and IPVS proxiers use it.

use super::service_port::{Protocol, ServicePortName, ignored_by_labels};
use crate::state::Warning;
use crate::state::ip::{IpFamily, join_host_port, parse_ip_sloppy};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::Serialize;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

fn serialize_arc_str<S: serde::Serializer>(v: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(v)
}

/// The label naming an EndpointSlice's Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// The object an endpoint stands for (usually a Pod).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TargetRef {
    /// `kind` (e.g. `Pod`).
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// One endpoint of one service port, as kube-proxy stores it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Endpoint {
    /// `addresses[0]`, normalised.
    pub ip: IpAddr,
    /// The slice port's number (the resolved target port).
    pub port: i32,
    /// `ip:port` / `[ip]:port`: the sort key and the SEP hash input.
    pub endpoint: String,
    /// `conditions.ready` (nil → true).
    pub ready: bool,
    /// `conditions.serving` (nil → true).
    pub serving: bool,
    /// `conditions.terminating` (nil → false).
    pub terminating: bool,
    /// `nodeName` equals the proxier's node name.
    pub is_local: bool,
    /// `nodeName` (informational), one allocation per node name: the endpoints of one node
    /// share it.
    #[serde(serialize_with = "serialize_opt_arc_str")]
    pub node_name: Option<Arc<str>>,
    /// Topology hints, `zone` and `targetRef`, boxed: an endpoint without any costs one word
    /// (a 10k-service node has 100k endpoints).
    #[serde(flatten)]
    pub extra: Option<Box<EndpointExtra>>,
    /// The EndpointSlice it came from (`name`).
    #[serde(serialize_with = "serialize_arc_str")]
    pub slice: Arc<str>,
}

/// What few endpoints carry besides their address and conditions.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct EndpointExtra {
    /// `hints.forZones[].name`.
    pub zone_hints: Box<[String]>,
    /// `hints.forNodes[].name`.
    pub node_hints: Box<[String]>,
    /// `zone` (informational).
    pub zone: Option<Box<str>>,
    /// `targetRef` (informational).
    pub target_ref: Option<TargetRef>,
}

impl EndpointExtra {
    /// `None` when it holds nothing.
    fn boxed(self) -> Option<Box<EndpointExtra>> {
        (self != EndpointExtra::default()).then(|| Box::new(self))
    }
}

impl Endpoint {
    /// `hints.forZones[].name`.
    pub fn zone_hints(&self) -> &[String] {
        self.extra.as_ref().map_or(&[], |x| &x.zone_hints)
    }

    /// `hints.forNodes[].name`.
    pub fn node_hints(&self) -> &[String] {
        self.extra.as_ref().map_or(&[], |x| &x.node_hints)
    }

    /// `zone` (informational).
    pub fn zone(&self) -> Option<&str> {
        self.extra.as_ref().and_then(|x| x.zone.as_deref())
    }

    /// `nodeName` (informational).
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// `targetRef` (informational).
    pub fn target_ref(&self) -> Option<&TargetRef> {
        self.extra.as_ref().and_then(|x| x.target_ref.as_ref())
    }
}

fn serialize_opt_arc_str<S: serde::Serializer>(
    v: &Option<Arc<str>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_some(&**v),
        None => s.serialize_none(),
    }
}

/// Endpoints per service port, each list sorted by endpoint string.
pub type EndpointsMap = HashMap<ServicePortName, Vec<Endpoint>>;

fn slice_label(s: &EndpointSlice) -> String {
    format!(
        "EndpointSlice {}/{}",
        s.metadata.namespace.as_deref().unwrap_or(""),
        s.metadata.name.as_deref().unwrap_or("")
    )
}

/// How much of each endpoint's informational data (`nodeName`, `zone`, `targetRef`, hints are
/// always kept) to copy: rule generation needs none of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointDetail {
    /// Everything (for explaining rules: verify, trace).
    Full,
    /// Only what rule generation needs (`node_name`, `zone`, `target_ref` left empty).
    Lean,
}

/// Builds the endpoints map of one proxier (IP family) from all slices, as kube-proxy's cache does:
/// slices of other address types are ignored, only `addresses[0]` is used, duplicates keep the
/// first copy unless a later one is not terminating, each list is sorted by `ip:port`.
pub fn endpoints_map(
    slices: &[EndpointSlice],
    family: IpFamily,
    node_name: &str,
    warnings: &mut Vec<Warning>,
) -> EndpointsMap {
    endpoints_map_with(slices, family, node_name, EndpointDetail::Full, warnings)
}

/// [`endpoints_map`] with a choice of how much informational data to copy.
pub fn endpoints_map_with(
    slices: &[EndpointSlice],
    family: IpFamily,
    node_name: &str,
    detail: EndpointDetail,
    warnings: &mut Vec<Warning>,
) -> EndpointsMap {
    // Deterministic stand-in for Go's map order: by namespace, service, slice name.
    let mut order: Vec<(&str, &str, &str, &EndpointSlice)> = Vec::with_capacity(slices.len());
    for s in slices {
        if ignored_by_labels(&s.metadata) || s.address_type != family.as_k8s() {
            continue;
        }
        let svc = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_SERVICE_NAME))
            .map(String::as_str)
            .unwrap_or("");
        let ns = s.metadata.namespace.as_deref().unwrap_or("");
        let name = s.metadata.name.as_deref().unwrap_or("");
        if svc.is_empty() {
            warnings.push(Warning::new(
                slice_label(s),
                format!("no {LABEL_SERVICE_NAME} label; slice ignored"),
            ));
            continue;
        }
        order.push((ns, svc, name, s));
    }
    order.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));

    let full = detail == EndpointDetail::Full;
    let mut node_names = NodeNames::default();
    let mut map: EndpointsMap = HashMap::new();
    let mut parsed: Vec<(IpAddr, &k8s_openapi::api::discovery::v1::Endpoint)> = Vec::new();
    for (ns, svc, slice_name, s) in order {
        // Parse the endpoints once per slice, then attach them to each port.
        parsed.clear();
        for (i, ep) in s.endpoints.iter().enumerate() {
            let Some(addr) = ep.addresses.first() else {
                continue;
            };
            let Some(ip) = parse_ip_sloppy(addr) else {
                warnings.push(Warning::new(
                    slice_label(s),
                    format!("endpoints[{i}] address {addr:?} is not an IP; endpoint ignored"),
                ));
                continue;
            };
            if IpFamily::of(&ip) != family {
                warnings.push(Warning::new(
                    slice_label(s),
                    format!(
                        "endpoints[{i}] address {addr:?} is not {family} but the slice's addressType is; endpoint ignored"
                    ),
                ));
                continue;
            }
            parsed.push((ip, ep));
        }
        let slice_arc: Arc<str> = Arc::from(slice_name);
        for (pi, port) in s.ports.as_deref().unwrap_or(&[]).iter().enumerate() {
            let Some(port_name) = port.name.as_ref() else {
                warnings.push(Warning::new(
                    slice_label(s),
                    format!("ports[{pi}] has no name (not even \"\"); port ignored"),
                ));
                continue;
            };
            let Some(port_num) = port.port.filter(|p| *p != 0) else {
                warnings.push(Warning::new(
                    slice_label(s),
                    format!("ports[{pi}] ({port_name:?}) has no port number; port ignored"),
                ));
                continue;
            };
            // Loading a state leaves such slices out (`state::validate`); no rule can hold it.
            if !super::quoting::writable_port(port_num) {
                warnings.push(Warning::new(
                    slice_label(s),
                    format!("ports[{pi}] ({port_name:?}) port {port_num} is not a port number (0–65535); port ignored"),
                ));
                continue;
            }
            let proto_text = port.protocol.as_deref().unwrap_or("TCP");
            let Some(protocol) = Protocol::parse(proto_text) else {
                warnings.push(Warning::new(
                    slice_label(s),
                    format!(
                        "ports[{pi}] protocol {proto_text:?} is not TCP, UDP or SCTP; port ignored"
                    ),
                ));
                continue;
            };
            let spn = ServicePortName {
                namespace: ns.to_string(),
                name: svc.to_string(),
                port: port_name.clone(),
                protocol,
            };
            let list = map.entry(spn).or_default();
            list.reserve(parsed.len());
            for (ip, ep) in &parsed {
                let cond = ep.conditions.as_ref();
                let hints = ep.hints.as_ref();
                let node = ep.node_name.as_deref();
                list.push(Endpoint {
                    ip: *ip,
                    port: port_num,
                    endpoint: join_host_port(ip, port_num),
                    ready: cond.and_then(|c| c.ready).unwrap_or(true),
                    serving: cond.and_then(|c| c.serving).unwrap_or(true),
                    terminating: cond.and_then(|c| c.terminating).unwrap_or(false),
                    is_local: !node_name.is_empty() && node == Some(node_name),
                    node_name: if full {
                        node.map(|n| node_names.of(n))
                    } else {
                        None
                    },
                    extra: EndpointExtra {
                        zone_hints: hints
                            .and_then(|h| h.for_zones.as_ref())
                            .map(|z| z.iter().map(|z| z.name.clone()).collect())
                            .unwrap_or_default(),
                        node_hints: hints
                            .and_then(|h| h.for_nodes.as_ref())
                            .map(|z| z.iter().map(|z| z.name.clone()).collect())
                            .unwrap_or_default(),
                        zone: if full {
                            ep.zone.as_deref().map(Box::from)
                        } else {
                            None
                        },
                        target_ref: if full {
                            ep.target_ref.as_ref().map(|t| TargetRef {
                                kind: t.kind.clone().unwrap_or_default(),
                                namespace: t.namespace.clone().unwrap_or_default(),
                                name: t.name.clone().unwrap_or_default(),
                            })
                        } else {
                            None
                        },
                    }
                    .boxed(),
                    slice: slice_arc.clone(),
                });
            }
        }
    }
    map.retain(|_, v| !v.is_empty());
    for v in map.values_mut() {
        dedup_sorted(v);
    }
    map
}

/// Node names, each allocated once and shared by its endpoints.
#[derive(Default)]
struct NodeNames(std::collections::HashSet<Arc<str>>);

impl NodeNames {
    fn of(&mut self, name: &str) -> Arc<str> {
        if let Some(n) = self.0.get(name) {
            return Arc::clone(n);
        }
        let n: Arc<str> = Arc::from(name);
        self.0.insert(Arc::clone(&n));
        n
    }
}

/// Sorts by endpoint string and resolves duplicates as kube-proxy's cache does when it meets
/// them in list order: the first copy stays unless a later copy is not terminating (then the
/// last such copy wins).
fn dedup_sorted(v: &mut Vec<Endpoint>) {
    v.sort_by(|a, b| a.endpoint.cmp(&b.endpoint)); // stable: keeps list order among duplicates
    if v.windows(2)
        .all(|w| w.first().map(|a| &a.endpoint) != w.get(1).map(|b| &b.endpoint))
    {
        return;
    }
    let old = std::mem::take(v);
    let mut group: Vec<Endpoint> = Vec::new();
    let flush = |group: &mut Vec<Endpoint>, out: &mut Vec<Endpoint>| {
        let pick = group.iter().rposition(|e| !e.terminating).unwrap_or(0);
        if let Some(e) = group.drain(..).nth(pick) {
            out.push(e);
        }
    };
    for e in old {
        if group.first().is_some_and(|g| g.endpoint != e.endpoint) {
            flush(&mut group, v);
        }
        group.push(e);
    }
    flush(&mut group, v);
}

/// Which topology filtering applies to a service port's cluster endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum TopologyMode {
    /// No filtering.
    #[default]
    None,
    /// Only endpoints hinted for this node's zone.
    PreferSameZone,
    /// Only endpoints hinted for this node.
    PreferSameNode,
}

/// The result of kube-proxy's `CategorizeEndpoints`, as indexes into the endpoint list.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Categorized {
    /// Endpoints used with Cluster policy (ready and topology-available, else serving+terminating).
    pub cluster: Vec<u32>,
    /// Endpoints used with Local policy (local ready, else local serving+terminating).
    pub local: Vec<u32>,
    /// Union of both: every endpoint reachable from this node (sorted by endpoint string).
    pub reachable: Vec<u32>,
    /// Whether the service has usable endpoints anywhere in the cluster.
    pub has_any: bool,
    /// The topology mode chosen for the cluster endpoints.
    pub topology: TopologyMode,
}

/// What the categorisation needs to know about the node and the service port.
#[derive(Debug, Clone, Copy)]
pub struct CategorizeInput<'a> {
    /// `ServicePortInfo::uses_cluster_endpoints`.
    pub uses_cluster: bool,
    /// `ServicePortInfo::uses_local_endpoints`.
    pub uses_local: bool,
    /// This node's name.
    pub node_name: &'a str,
    /// This node's zone ("" if unknown).
    pub zone: &'a str,
    /// Feature gate `PreferSameTrafficDistribution` (node hints).
    pub node_hints_enabled: bool,
}

fn topology_mode(eps: &[Endpoint], inp: &CategorizeInput<'_>) -> TopologyMode {
    let mut has_ready = false;
    let (mut all_node_hints, mut for_node) = (true, false);
    let (mut all_zone_hints, mut for_zone) = (true, false);
    for e in eps.iter().filter(|e| e.ready) {
        has_ready = true;
        if e.node_hints().is_empty() {
            all_node_hints = false;
        } else if e.node_hints().iter().any(|n| n == inp.node_name) {
            for_node = true;
        }
        if e.zone_hints().is_empty() {
            all_zone_hints = false;
        } else if e.zone_hints().iter().any(|z| z == inp.zone) {
            for_zone = true;
        }
    }
    if !has_ready {
        return TopologyMode::None;
    }
    if inp.node_hints_enabled && all_node_hints && for_node {
        return TopologyMode::PreferSameNode;
    }
    if all_zone_hints && for_zone {
        return TopologyMode::PreferSameZone;
    }
    TopologyMode::None
}

fn available(e: &Endpoint, mode: TopologyMode, inp: &CategorizeInput<'_>) -> bool {
    match mode {
        TopologyMode::None => true,
        TopologyMode::PreferSameNode => e.node_hints().iter().any(|n| n == inp.node_name),
        TopologyMode::PreferSameZone => e.zone_hints().iter().any(|z| z == inp.zone),
    }
}

/// What a kube-proxy release's `CategorizeEndpoints` does besides the newest's behaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CategorizeRules {
    /// Zone (and node) hints may narrow the cluster endpoints (topology-aware routing).
    pub topology_hints: bool,
    /// Serving terminating endpoints stand in when no ready one is left
    /// (`ProxyTerminatingEndpoints`).
    pub terminating_fallback: bool,
}

impl CategorizeRules {
    /// The newest kube-proxy's rules: both on.
    pub const NEWEST: CategorizeRules = CategorizeRules {
        topology_hints: true,
        terminating_fallback: true,
    };
}

/// kube-proxy's `CategorizeEndpoints` over `eps` (sorted by endpoint string).
pub fn categorize(eps: &[Endpoint], inp: &CategorizeInput<'_>) -> Categorized {
    categorize_with(eps, inp, CategorizeRules::NEWEST)
}

/// [`categorize`] as a release with `rules` does it (1.24 and later; `topology.go`
/// `CategorizeEndpoints`).
pub fn categorize_with(
    eps: &[Endpoint],
    inp: &CategorizeInput<'_>,
    rules: CategorizeRules,
) -> Categorized {
    let mut c = Categorized::default();
    if eps.is_empty() {
        return c;
    }
    let idx = |pred: &dyn Fn(&Endpoint) -> bool| -> Vec<u32> {
        (0u32..)
            .zip(eps)
            .filter(|(_, e)| pred(e))
            .map(|(i, _)| i)
            .collect()
    };
    if inp.uses_cluster {
        if rules.topology_hints {
            c.topology = topology_mode(eps, inp);
        }
        let mode = c.topology;
        c.cluster = idx(&|e| e.ready && available(e, mode, inp));
        if c.cluster.is_empty() && rules.terminating_fallback {
            c.cluster = idx(&|e| e.serving && e.terminating);
        }
        c.has_any = !c.cluster.is_empty();
    }
    if !inp.uses_local {
        c.reachable = c.cluster.clone();
        return c;
    }
    let (mut local_ready, mut local_serving_terminating) = (false, false);
    for e in eps {
        if e.ready {
            c.has_any = true;
            local_ready |= e.is_local;
        } else if e.serving && e.terminating && rules.terminating_fallback {
            c.has_any = true;
            local_serving_terminating |= e.is_local;
        }
    }
    let mut use_serving_terminating = false;
    if local_ready {
        c.local = idx(&|e| e.is_local && e.ready);
    } else if local_serving_terminating {
        use_serving_terminating = true;
        c.local = idx(&|e| e.is_local && e.serving && e.terminating);
    }
    if !inp.uses_cluster {
        c.reachable = c.local.clone();
        return c;
    }
    if c.topology == TopologyMode::None && !use_serving_terminating {
        c.reachable = c.cluster.clone();
        return c;
    }
    let mut all: Vec<u32> = c.cluster.iter().chain(c.local.iter()).copied().collect();
    all.sort_unstable();
    all.dedup();
    c.reachable = all;
    c
}

/// How a release before 1.24 picks endpoints (`proxier.go` `syncProxyRules`, before
/// `CategorizeEndpoints` existed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EarlyRules {
    /// `internalTrafficPolicy: Local` keeps only this node's endpoints, for every destination
    /// of a service without `externalTrafficPolicy: Local` (1.22–1.23 `FilterEndpoints`).
    pub internal_local: bool,
    /// Serving terminating local endpoints stand in for `externalTrafficPolicy: Local` when no
    /// ready local one is left (the `ProxyTerminatingEndpoints` gate, 1.22–1.23).
    pub terminating_fallback: bool,
    /// The release: 20 … 23.
    pub minor: u32,
}

/// The endpoint sets of a release before 1.24: `cluster` (the `KUBE-SVC-…` chain: ready
/// endpoints), `local` (the `KUBE-XLB-…` chain of an `externalTrafficPolicy: Local` service:
/// ready local ones), `reachable` (the `KUBE-SEP-…` chains written: in 1.22 every endpoint, else
/// those the other two use) and `has_any` (in 1.22 any endpoint at all, else a usable one).
/// `inp.uses_local` is `externalTrafficPolicy: Local`; topology hints are never used (their gate
/// was off by default).
pub fn categorize_early(
    eps: &[Endpoint],
    inp: &CategorizeInput<'_>,
    rules: EarlyRules,
) -> Categorized {
    let mut c = Categorized::default();
    let filtered: Vec<u32> = (0u32..)
        .zip(eps)
        .filter(|(_, e)| !rules.internal_local || inp.uses_local || e.is_local)
        .map(|(i, _)| i)
        .collect();
    let pick = |pred: &dyn Fn(&Endpoint) -> bool| -> Vec<u32> {
        filtered
            .iter()
            .copied()
            .filter(|&i| eps.get(i as usize).is_some_and(pred))
            .collect()
    };
    c.cluster = pick(&|e| e.ready);
    if inp.uses_local {
        c.local = pick(&|e| e.is_local && e.ready);
        if c.local.is_empty() && rules.terminating_fallback {
            c.local = pick(&|e| e.is_local && e.serving && e.terminating);
        }
    }
    let terminating_in_use = rules.terminating_fallback
        && inp.uses_local
        && filtered
            .iter()
            .filter_map(|&i| eps.get(i as usize))
            .any(|e| !e.ready && e.serving && e.terminating);
    c.has_any = match rules.minor {
        22 => !filtered.is_empty(),
        _ => !c.cluster.is_empty() || terminating_in_use,
    };
    c.reachable = if rules.minor == 22 {
        filtered
    } else {
        let mut all: Vec<u32> = c.cluster.iter().chain(c.local.iter()).copied().collect();
        all.sort_unstable();
        all.dedup();
        all
    };
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(ip: &str, ready: bool, serving: bool, terminating: bool, local: bool) -> Endpoint {
        let ip: IpAddr = ip.parse().unwrap_or_else(|_| panic!("ip"));
        Endpoint {
            ip,
            port: 80,
            endpoint: join_host_port(&ip, 80),
            ready,
            serving,
            terminating,
            is_local: local,
            node_name: None,
            extra: None,
            slice: Arc::from(""),
        }
    }

    fn input(uses_cluster: bool, uses_local: bool) -> CategorizeInput<'static> {
        CategorizeInput {
            uses_cluster,
            uses_local,
            node_name: "n1",
            zone: "z1",
            node_hints_enabled: true,
        }
    }

    #[test]
    fn terminating_fallback_cluster() {
        let eps = vec![
            ep("10.0.0.1", false, true, true, false),
            ep("10.0.0.2", false, false, true, false),
        ];
        let c = categorize(&eps, &input(true, false));
        assert_eq!(c.cluster, vec![0]);
        assert!(c.has_any);
    }

    #[test]
    fn early_releases_pick_ready_endpoints_and_chain_them() {
        let eps = vec![
            ep("10.0.0.1", true, true, false, false),
            ep("10.0.0.2", false, true, true, true),
            ep("10.0.0.3", true, true, false, true),
            ep("10.0.0.4", false, false, false, false),
        ];
        let rules = |minor| EarlyRules {
            internal_local: false,
            terminating_fallback: false,
            minor,
        };
        let c = categorize_early(&eps, &input(true, true), rules(21));
        assert_eq!(
            (c.cluster.as_slice(), c.local.as_slice()),
            (&[0, 2][..], &[2][..])
        );
        assert_eq!(c.reachable, vec![0, 2]);
        // 1.22 chains every endpoint, ready or not.
        let c = categorize_early(&eps, &input(true, false), rules(22));
        assert_eq!(c.reachable, vec![0, 1, 2, 3]);
        assert!(c.local.is_empty());
        // 1.22 calls a service with only unready endpoints served; 1.23 does not.
        let unready = &eps[3..];
        assert!(categorize_early(unready, &input(true, false), rules(22)).has_any);
        assert!(!categorize_early(unready, &input(true, false), rules(23)).has_any);
        // internalTrafficPolicy: Local keeps this node's endpoints only.
        let mut itp = rules(23);
        itp.internal_local = true;
        let c = categorize_early(&eps, &input(true, false), itp);
        assert_eq!(c.cluster, vec![2]);
        // The terminating fallback gate (off by default) serves Local policy from a
        // terminating local endpoint.
        let mut gated = rules(23);
        gated.terminating_fallback = true;
        let c = categorize_early(&eps[..2], &input(true, true), gated);
        assert_eq!(c.local, vec![1]);
        assert_eq!(c.reachable, vec![0, 1]);
    }

    #[test]
    fn releases_without_the_fallback_serve_no_terminating_endpoint() {
        let eps = vec![ep("10.0.0.1", false, true, true, true)];
        let off = CategorizeRules {
            topology_hints: true,
            terminating_fallback: false,
        };
        let c = categorize_with(&eps, &input(true, true), off);
        assert!(c.cluster.is_empty() && c.local.is_empty() && !c.has_any);
        assert!(categorize(&eps, &input(true, true)).has_any);
    }

    #[test]
    fn local_policy_prefers_ready_local() {
        let eps = vec![
            ep("10.0.0.1", true, true, false, false),
            ep("10.0.0.2", false, true, true, true),
            ep("10.0.0.3", true, true, false, true),
        ];
        let c = categorize(&eps, &input(true, true));
        assert_eq!(c.local, vec![2]);
        assert_eq!(c.reachable, vec![0, 2]);
        let c = categorize(&eps[..2], &input(false, true));
        assert_eq!(c.local, vec![1]);
        assert_eq!(c.reachable, vec![1]);
        assert!(c.has_any);
    }

    #[test]
    fn duplicates_keep_first_unless_a_later_copy_is_not_terminating() {
        let mut a = ep("10.0.0.1", false, true, true, false);
        a.slice = Arc::from("s1");
        let mut b = ep("10.0.0.1", true, true, false, false);
        b.slice = Arc::from("s2");
        let mut c = ep("10.0.0.1", false, true, true, false);
        c.slice = Arc::from("s3");
        let mut v = vec![a.clone(), b, c, ep("10.0.0.0", true, true, false, false)];
        dedup_sorted(&mut v);
        assert_eq!(v.len(), 2);
        assert_eq!(&*v[1].slice, "s2");
        let mut c2 = a.clone();
        c2.slice = Arc::from("s9");
        let mut v = vec![a, c2];
        dedup_sorted(&mut v);
        assert_eq!((v.len(), &*v[0].slice), (1, "s1"));
    }

    #[test]
    fn zone_hints_filter_cluster_endpoints() {
        let mut a = ep("10.0.0.1", true, true, false, false);
        a.extra = EndpointExtra {
            zone_hints: Box::from(["z1".to_string()]),
            ..EndpointExtra::default()
        }
        .boxed();
        let mut b = ep("10.0.0.2", true, true, false, false);
        b.extra = EndpointExtra {
            zone_hints: Box::from(["z2".to_string()]),
            ..EndpointExtra::default()
        }
        .boxed();
        let eps = vec![a, b];
        let c = categorize(&eps, &input(true, false));
        assert_eq!(c.topology, TopologyMode::PreferSameZone);
        assert_eq!(c.cluster, vec![0]);
    }
}
