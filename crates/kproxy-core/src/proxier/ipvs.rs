//! kube-proxy's IPVS proxier (mode `ipvs`) emulated: from API state, KubeProxyConfiguration and node
//! facts, the virtual servers, real servers, ipsets, `kube-ipvs0` addresses and iptables rules it
//! installs (kube-proxy `pkg/proxy/ipvs/proxier.go`; docs/ipvs.md).
//!
//! Entry point: [`render`] (one family) → [`ExpectedIpvs`], printable as JSON ([`ExpectedIpvs`] is
//! `Serialize`), as `ipvsadm -Sn` ([`ExpectedIpvs::to_ipvsadm_save`]), as `ipvsadm -Ln`
//! ([`ExpectedIpvs::to_ipvsadm_list`]) and as `ipset save` ([`ExpectedIpvs::to_ipset_save`]).

pub mod iptables;
pub mod ports;
pub mod sets;

use crate::state::config::{DetectLocalMode, ProxyConfig};
use crate::state::ip::{Cidr, IpFamily};
use crate::state::node::NodeFacts;
use crate::state::{ClusterState, Warning};
use iptables::{LocalDetector, RuleInputs};
use kproxy_parsers::ipvsadm::{Protocol, SocketText};
use serde::{Serialize, Serializer};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

/// The dummy interface the IPVS proxier binds every service address to (`proxier.go`
/// `defaultDummyDevice`).
pub const DUMMY_DEVICE: &str = "kube-ipvs0";

/// What the IPVS proxier knows about its node (`pkg/proxy/ipvs/proxier.go` `NewProxier`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpvsNode {
    /// Node name (local endpoints have this `nodeName`).
    pub name: String,
    /// `topology.kubernetes.io/zone` label ("" when unset).
    pub zone: String,
    /// Addresses on the node's interfaces other than `kube-ipvs0` (both families, loopback allowed).
    pub addresses: Vec<IpAddr>,
    /// kube-proxy's node IP per family (first of each family in `addresses` unless given).
    pub primary_ips: Vec<IpAddr>,
    /// The Node's `spec.podCIDRs` (for `detectLocalMode: NodeCIDR`).
    pub pod_cidrs: Vec<Cidr>,
}

impl IpvsNode {
    /// Node facts from the API state: `node_ips` (e.g. `--node-ip` flags) are the interface addresses
    /// when given, else the Node object's InternalIP/ExternalIP addresses stand in for them.
    pub fn from_state(state: &ClusterState, name: &str, node_ips: &[IpAddr]) -> IpvsNode {
        let node = state
            .nodes
            .iter()
            .find(|n| n.metadata.name.as_deref() == Some(name));
        let zone = node
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get("topology.kubernetes.io/zone"))
            .cloned()
            .unwrap_or_default();
        let mut addresses: Vec<IpAddr> = node_ips.to_vec();
        if addresses.is_empty() {
            for a in node
                .and_then(|n| n.status.as_ref())
                .and_then(|s| s.addresses.as_ref())
                .into_iter()
                .flatten()
            {
                if (a.type_ == "InternalIP" || a.type_ == "ExternalIP")
                    && let Some(ip) = crate::state::ip::parse_ip_sloppy(&a.address)
                    && !addresses.contains(&ip)
                {
                    addresses.push(ip);
                }
            }
        }
        let mut primary_ips = Vec::new();
        for fam in [IpFamily::V4, IpFamily::V6] {
            if let Some(ip) = addresses
                .iter()
                .find(|a| IpFamily::of(a) == fam && !a.is_loopback())
            {
                primary_ips.push(*ip);
            }
        }
        let pod_cidrs = node
            .and_then(|n| n.spec.as_ref())
            .map(|s| {
                let mut v: Vec<&String> = s.pod_cidrs.iter().flatten().collect();
                if v.is_empty()
                    && let Some(c) = &s.pod_cidr
                {
                    v.push(c);
                }
                v.into_iter()
                    .filter_map(|c| Cidr::parse_sloppy(c))
                    .collect()
            })
            .unwrap_or_default();
        IpvsNode {
            name: name.to_string(),
            zone,
            addresses,
            primary_ips,
            pod_cidrs,
        }
    }

    /// The IPVS view of the shared node facts: the node IPs stand in for the interface addresses.
    pub fn from_facts(facts: &NodeFacts) -> IpvsNode {
        let mut primary_ips = Vec::new();
        for fam in [IpFamily::V4, IpFamily::V6] {
            let p = NodeFacts {
                family: fam,
                ..facts.clone()
            }
            .primary_ip();
            if !p.is_loopback() {
                primary_ips.push(p);
            }
        }
        IpvsNode {
            name: facts.node_name.clone(),
            zone: facts.zone.clone().unwrap_or_default(),
            addresses: facts.node_ips.clone(),
            primary_ips,
            pod_cidrs: facts.pod_cidrs.clone(),
        }
    }

    fn primary(&self, family: IpFamily) -> Option<IpAddr> {
        self.primary_ips
            .iter()
            .find(|a| IpFamily::of(a) == family)
            .copied()
    }
}

/// Rendering options that are facts of the node's tools, not of the configuration.
#[derive(Debug, Clone)]
pub struct IpvsOptions {
    /// Whether iptables supports `--random-fully` (default true).
    pub random_fully: bool,
    /// Masquerade mark text overriding `iptables.masqueradeBit` (kube-proxy prints `%#08x`: `0x004000`).
    pub mark: Option<String>,
}

impl Default for IpvsOptions {
    fn default() -> Self {
        IpvsOptions {
            random_fully: true,
            mark: None,
        }
    }
}

/// Which address of a service a virtual server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VsKind {
    /// The ClusterIP.
    ClusterIp,
    /// An externalIP.
    ExternalIp,
    /// A LoadBalancer ingress IP.
    LoadBalancer,
    /// A node address + nodePort.
    NodePort,
}

fn ser_proto<S: Serializer>(p: &Protocol, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(p.as_str())
}

/// One real server kube-proxy programs.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct ExpectedRs {
    /// Endpoint address.
    pub address: IpAddr,
    /// Endpoint port.
    pub port: u16,
    /// Weight (always 1 for a desired real server).
    pub weight: i32,
}

/// One virtual server kube-proxy programs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExpectedVs {
    /// `TCP`, `UDP` or `SCTP`.
    #[serde(serialize_with = "ser_proto")]
    pub protocol: Protocol,
    /// Virtual address.
    pub address: IpAddr,
    /// Virtual port.
    pub port: u16,
    /// Scheduler (`ipvs.scheduler`, default `rr`).
    pub scheduler: String,
    /// Persistence timeout (ClientIP affinity), else `null`.
    pub persistent_timeout_s: Option<u32>,
    /// Scheduler flags (`mh-port` for `mh`).
    pub flags: Vec<String>,
    /// Real servers, sorted by address and port.
    pub real_servers: Vec<ExpectedRs>,
    /// The service port (`ns/name:port`).
    pub service: String,
    /// Which address of the service this is.
    pub kind: VsKind,
}

impl ExpectedVs {
    /// The `(protocol, address, port)` key.
    pub fn key(&self) -> (Protocol, IpAddr, u16) {
        (self.protocol, self.address, self.port)
    }
}

/// The IPVS-mode state kube-proxy (one family) installs on the node.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExpectedIpvs {
    /// The proxier's family.
    pub ip_family: IpFamily,
    /// Virtual servers sorted by (protocol, address, port).
    pub virtual_servers: Vec<ExpectedVs>,
    /// All 17 ipsets (family names) with their entries (sorted; empty sets included).
    pub ipsets: BTreeMap<String, Vec<String>>,
    /// Addresses bound to `kube-ipvs0`.
    pub kube_ipvs0_addresses: Vec<IpAddr>,
    /// iptables-restore payload (nat then filter).
    pub iptables: String,
    /// `ipvs.excludeCIDRs` of this family: virtual servers inside are left alone.
    pub exclude_cidrs: Vec<Cidr>,
    /// `ipvs.tcpTimeout`/`tcpFinTimeout`/`udpTimeout` in seconds (0 = unchanged).
    pub timeouts: [u64; 3],
    /// `ipvs.strictARP`.
    pub strict_arp: bool,
    /// Node IPs NodePort virtual servers were created on.
    pub node_port_ips: Vec<IpAddr>,
    /// What kube-proxy would log and skip.
    pub warnings: Vec<Warning>,
}

/// An `ipvs.*Timeout` in whole seconds; "" (unset) is 0, which kube-proxy reads as "leave the
/// kernel's timeout alone". The configuration reader refused any other text that is no duration.
fn duration_s(s: &str) -> u64 {
    crate::state::duration::parse(s).map_or(0, |d| d.as_secs())
}

/// kube-proxy's node IP list for NodePort virtual servers (`pkg/proxy/ipvs/proxier.go` `syncProxyRules`).
pub fn node_port_ips(config: &ProxyConfig, node: &IpvsNode, family: IpFamily) -> Vec<IpAddr> {
    let mut cidrs: Vec<Cidr> = Vec::new();
    let mut primary = false;
    for s in &config.node_port_addresses {
        if s == "primary" {
            primary = true;
        } else if let Some(words) = crate::state::config::node_port_keyword_cidrs(s) {
            cidrs.extend(
                words
                    .iter()
                    .filter_map(|c| Cidr::parse_sloppy(c))
                    .filter(|c| c.family() == family),
            );
        } else if let Some(c) = Cidr::parse_sloppy(s.trim())
            && c.family() == family
        {
            cidrs.push(c);
        }
    }
    let of_family = node.addresses.iter().filter(|a| IpFamily::of(a) == family);
    let mut out: Vec<IpAddr> = Vec::new();
    if primary && cidrs.is_empty() {
        out.extend(node.primary(family));
    } else if cidrs.is_empty() || cidrs.iter().any(Cidr::is_zero) {
        out.extend(
            of_family
                .filter(|a| !a.is_loopback() && !is_v6_link_local(a))
                .copied(),
        );
    } else {
        out.extend(
            of_family
                .filter(|a| !a.is_loopback() && cidrs.iter().any(|c| c.contains(a)))
                .copied(),
        );
        if primary {
            out.extend(node.primary(family));
        }
    }
    let mut seen = BTreeSet::new();
    out.retain(|a| seen.insert(*a));
    out
}

fn is_v6_link_local(a: &IpAddr) -> bool {
    matches!(a, IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80)
}

fn detector(config: &ProxyConfig, node: &IpvsNode, family: IpFamily) -> LocalDetector {
    if config.masquerade_all {
        return LocalDetector::MasqueradeAll;
    }
    match config.detect_local_mode {
        DetectLocalMode::ClusterCIDR => config
            .cluster_cidrs
            .iter()
            .filter_map(|c| Cidr::parse_sloppy(c.trim()))
            .find(|c| c.family() == family)
            .map_or(LocalDetector::None, |c| {
                LocalDetector::NotLocal(format!("! -s {c}"))
            }),
        DetectLocalMode::NodeCIDR => node
            .pod_cidrs
            .iter()
            .find(|c| c.family() == family)
            .map_or(LocalDetector::None, |c| {
                LocalDetector::NotLocal(format!("! -s {c}"))
            }),
        DetectLocalMode::BridgeInterface if !config.bridge_interface.is_empty() => {
            LocalDetector::NotLocal(format!("! -i {}", config.bridge_interface))
        }
        DetectLocalMode::InterfaceNamePrefix if !config.interface_name_prefix.is_empty() => {
            LocalDetector::NotLocal(format!("! -i {}+", config.interface_name_prefix))
        }
        _ => LocalDetector::None,
    }
}

/// `IP,proto:PORT` (hash:ip,port entry).
fn ip_port(ip: &IpAddr, proto: Protocol, port: u16) -> String {
    format!("{ip},{}:{port}", proto.lower())
}

/// Computes what kube-proxy's IPVS proxier of `family` installs.
pub fn render(
    state: &ClusterState,
    config: &ProxyConfig,
    node: &IpvsNode,
    family: IpFamily,
    opts: &IpvsOptions,
) -> ExpectedIpvs {
    let scheduler = if config.ipvs.scheduler.is_empty() {
        "rr".to_string()
    } else {
        config.ipvs.scheduler.clone()
    };
    let flags: Vec<String> = if scheduler == "mh" {
        vec!["mh-port".into()]
    } else {
        Vec::new()
    };
    let mut set_entries: BTreeMap<&'static str, BTreeSet<String>> = sets::ALL
        .iter()
        .map(|d| (d.base, BTreeSet::new()))
        .collect();
    let mut add = |d: &sets::SetDef, e: String| {
        set_entries.entry(d.base).or_default().insert(e);
    };
    let mut warnings = state.invalid_warnings();
    let view = ports::NodeView {
        name: &node.name,
        zone: &node.zone,
        node_hints_enabled: config.feature_enabled("PreferSameTrafficDistribution"),
        allows_external_ips: config
            .feature_gates
            .get(crate::proxier::version::ALLOW_EXTERNAL_IPS_GATE)
            .copied()
            .unwrap_or(true),
    };
    let ports = ports::service_ports(state, family, view, &mut warnings);
    let has_node_port = ports.iter().any(|p| p.info.node_port != 0);
    let np_ips = if has_node_port {
        node_port_ips(config, node, family)
    } else {
        Vec::new()
    };
    let node_addrs: BTreeSet<IpAddr> = node.addresses.iter().copied().collect();
    let kp_node_ip = node.primary(family);
    let mut vss: BTreeMap<(Protocol, IpAddr, u16), ExpectedVs> = BTreeMap::new();
    let mut bind: BTreeSet<IpAddr> = BTreeSet::new();
    let mut out_filter: Vec<(IpAddr, &'static str, u16)> = Vec::new();

    for pv in &ports {
        let sp = &pv.info;
        let proto = pv.protocol();
        let (Ok(svc_port), Ok(node_port), Ok(hc_port)) = (
            u16::try_from(sp.port),
            u16::try_from(sp.node_port),
            u16::try_from(sp.health_check_node_port),
        ) else {
            warnings.push(Warning::new(
                sp.name_string.clone(),
                "port number out of range; service port skipped",
            ));
            continue;
        };
        let rs_of = |local_policy: bool| -> Vec<ExpectedRs> {
            let mut v: Vec<ExpectedRs> = pv
                .backends(local_policy)
                .iter()
                .filter_map(|e| {
                    u16::try_from(e.port).ok().map(|port| ExpectedRs {
                        address: e.ip,
                        port,
                        weight: 1,
                    })
                })
                .collect();
            v.sort();
            v.dedup();
            v
        };
        let mut make_vs = |address: IpAddr, port: u16, kind: VsKind, local_policy: bool| {
            let vs = ExpectedVs {
                protocol: proto,
                address,
                port,
                scheduler: scheduler.clone(),
                persistent_timeout_s: sp
                    .session_affinity_seconds
                    .and_then(|t| u32::try_from(t).ok()),
                flags: flags.clone(),
                real_servers: rs_of(local_policy),
                service: sp.name_string.clone(),
                kind,
            };
            vss.insert(vs.key(), vs);
        };
        for ep in pv.endpoints.iter().filter(|e| e.is_local) {
            add(
                &sets::LOOP_BACK,
                format!("{},{}:{},{}", ep.ip, proto.lower(), ep.port, ep.ip),
            );
        }
        add(&sets::CLUSTER_IP, ip_port(&sp.cluster_ip, proto, svc_port));
        make_vs(
            sp.cluster_ip,
            svc_port,
            VsKind::ClusterIp,
            sp.internal_policy_local,
        );
        bind.insert(sp.cluster_ip);
        for ip in &sp.external_ips {
            let set = if sp.external_policy_local {
                &sets::EXTERNAL_IP_LOCAL
            } else {
                &sets::EXTERNAL_IP
            };
            add(set, ip_port(ip, proto, svc_port));
            make_vs(*ip, svc_port, VsKind::ExternalIp, sp.external_policy_local);
            if !node_addrs.contains(ip) {
                bind.insert(*ip);
            }
        }
        for ip in &sp.load_balancer_vips {
            add(&sets::LOAD_BALANCER, ip_port(ip, proto, svc_port));
            if sp.external_policy_local {
                add(&sets::LOAD_BALANCER_LOCAL, ip_port(ip, proto, svc_port));
            }
            if !sp.load_balancer_source_ranges.is_empty() {
                add(&sets::LOAD_BALANCER_FW, ip_port(ip, proto, svc_port));
                let mut allow_from_node = false;
                for c in &sp.load_balancer_source_ranges {
                    add(
                        &sets::LOAD_BALANCER_SOURCE_CIDR,
                        format!("{},{c}", ip_port(ip, proto, svc_port)),
                    );
                    if kp_node_ip.is_some_and(|n| c.contains(&n)) {
                        allow_from_node = true;
                    }
                }
                if allow_from_node {
                    add(
                        &sets::LOAD_BALANCER_SOURCE_IP,
                        format!("{},{ip}", ip_port(ip, proto, svc_port)),
                    );
                } else {
                    out_filter.push((*ip, proto.lower(), svc_port));
                }
            }
            make_vs(
                *ip,
                svc_port,
                VsKind::LoadBalancer,
                sp.external_policy_local,
            );
            if !node_addrs.contains(ip) {
                bind.insert(*ip);
            }
        }
        if node_port != 0 {
            if np_ips.is_empty() {
                continue;
            }
            let (set, local_set) = match proto {
                Protocol::Tcp => (&sets::NODE_PORT_TCP, &sets::NODE_PORT_LOCAL_TCP),
                Protocol::Udp => (&sets::NODE_PORT_UDP, &sets::NODE_PORT_LOCAL_UDP),
                _ => (&sets::NODE_PORT_SCTP, &sets::NODE_PORT_LOCAL_SCTP),
            };
            let entries: Vec<String> = if proto == Protocol::Sctp {
                np_ips
                    .iter()
                    .map(|ip| ip_port(ip, proto, node_port))
                    .collect()
            } else {
                vec![node_port.to_string()]
            };
            for e in &entries {
                add(set, e.clone());
                if sp.external_policy_local {
                    add(local_set, e.clone());
                }
            }
            for ip in &np_ips {
                make_vs(*ip, node_port, VsKind::NodePort, sp.external_policy_local);
            }
        }
        if hc_port != 0 {
            add(&sets::HEALTH_CHECK_NODE_PORT, hc_port.to_string());
        }
    }
    for ip in &bind {
        add(&sets::IPVS_IPS, ip.to_string());
    }
    let by_base: BTreeMap<&'static str, Vec<String>> = set_entries
        .iter()
        .map(|(k, v)| (*k, v.iter().cloned().collect()))
        .collect();
    let mark = opts
        .mark
        .clone()
        .unwrap_or_else(|| format!("{:#08x}", 1u64 << config.masquerade_bit.min(31)));
    let iptables = iptables::render(&RuleInputs {
        family,
        sets: &by_base,
        detector: detector(config, node, family),
        mark,
        random_fully: opts.random_fully,
        out_filter: &out_filter,
    });
    let ipsets = sets::ALL
        .iter()
        .map(|d| {
            (
                d.name(family),
                by_base.get(d.base).cloned().unwrap_or_default(),
            )
        })
        .collect();
    ExpectedIpvs {
        ip_family: family,
        virtual_servers: vss.into_values().collect(),
        ipsets,
        kube_ipvs0_addresses: bind.into_iter().collect(),
        iptables,
        exclude_cidrs: config
            .ipvs
            .exclude_cidrs
            .iter()
            .filter_map(|c| Cidr::parse_sloppy(c.trim()))
            .filter(|c| c.family() == family)
            .collect(),
        timeouts: [
            duration_s(&config.ipvs.tcp_timeout),
            duration_s(&config.ipvs.tcp_fin_timeout),
            duration_s(&config.ipvs.udp_timeout),
        ],
        strict_arp: config.ipvs.strict_arp,
        node_port_ips: np_ips,
        warnings,
    }
}

/// ipvsadm's service comparator (libipvs `ipvs_cmp_services`): signed 32-bit wrapping differences over the address words.
fn ipvsadm_addr_cmp(a: &IpAddr, b: &IpAddr) -> std::cmp::Ordering {
    let words = |ip: &IpAddr| -> Vec<u32> {
        match ip {
            IpAddr::V4(v) => vec![u32::from(*v)],
            IpAddr::V6(v) => v
                .octets()
                .chunks(4)
                .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        }
    };
    for (x, y) in words(a).iter().zip(words(b).iter()) {
        let d = x.wrapping_sub(*y) as i32;
        if d != 0 {
            return d.cmp(&0);
        }
    }
    std::cmp::Ordering::Equal
}

/// A stable top-down merge sort (what glibc's qsort does for small arrays); tolerant of the
/// non-transitive ipvsadm comparator, unlike `slice::sort_by`.
fn merge_sort<T: Clone>(v: &mut [T], cmp: &impl Fn(&T, &T) -> std::cmp::Ordering) {
    if v.len() < 2 {
        return;
    }
    let mid = v.len() / 2;
    merge_sort(&mut v[..mid], cmp);
    merge_sort(&mut v[mid..], cmp);
    let mut merged = Vec::with_capacity(v.len());
    let (mut i, mut j) = (0, mid);
    while i < mid && j < v.len() {
        if cmp(&v[i], &v[j]) != std::cmp::Ordering::Greater {
            merged.push(v[i].clone());
            i += 1;
        } else {
            merged.push(v[j].clone());
            j += 1;
        }
    }
    merged.extend_from_slice(&v[i..mid]);
    merged.extend_from_slice(&v[j..]);
    v.clone_from_slice(&merged);
}

fn proto_num(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
        Protocol::Unknown => 255,
    }
}

impl ExpectedIpvs {
    /// Virtual servers in ipvsadm's listing order (libipvs `ipvs_sort_services`).
    pub fn in_ipvsadm_order(&self) -> Vec<ExpectedVs> {
        let mut v = self.virtual_servers.clone();
        merge_sort(&mut v, &|a: &ExpectedVs, b: &ExpectedVs| {
            (a.address.is_ipv6(), proto_num(a.protocol))
                .cmp(&(b.address.is_ipv6(), proto_num(b.protocol)))
                .then_with(|| ipvsadm_addr_cmp(&a.address, &b.address))
                .then(a.port.cmp(&b.port))
        });
        for vs in &mut v {
            merge_sort(&mut vs.real_servers, &|a: &ExpectedRs, b: &ExpectedRs| {
                ipvsadm_addr_cmp(&a.address, &b.address).then(a.port.cmp(&b.port))
            });
        }
        v
    }

    /// `ipvsadm -Sn` text (command form; restorable with `ipvsadm -R`).
    pub fn to_ipvsadm_save(&self) -> String {
        let mut o = String::new();
        for vs in self.in_ipvsadm_order() {
            let svc = format!(
                "{} {}",
                save_proto(vs.protocol),
                SocketText(vs.address, vs.port)
            );
            let _ = write!(o, "-A {svc} -s {}", vs.scheduler);
            if let Some(t) = vs.persistent_timeout_s {
                let _ = write!(o, " -p {t}");
            }
            if !vs.flags.is_empty() {
                let _ = write!(o, " -b {}", vs.flags.join(","));
            }
            o.push('\n');
            for rs in &vs.real_servers {
                let _ = writeln!(
                    o,
                    "-a {svc} -r {} -m -w {}",
                    SocketText(rs.address, rs.port),
                    rs.weight
                );
            }
        }
        o
    }

    /// `ipvsadm -Ln` text with zero counters, byte-exact to ipvsadm's printf formats.
    pub fn to_ipvsadm_list(&self) -> String {
        let mut o = String::from(
            "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n",
        );
        for vs in self.in_ipvsadm_order() {
            let _ = write!(
                o,
                "{:<4} {} {}",
                vs.protocol.as_str(),
                SocketText(vs.address, vs.port),
                vs.scheduler
            );
            if !vs.flags.is_empty() {
                let _ = write!(o, " ({})", vs.flags.join(","));
            }
            if let Some(t) = vs.persistent_timeout_s {
                let _ = write!(o, " persistent {t}");
            }
            o.push('\n');
            for rs in &vs.real_servers {
                let a = SocketText(rs.address, rs.port).to_string();
                let _ = writeln!(
                    o,
                    "  -> {a:<28} {:<7} {:<6} {:<10} {:<10}",
                    "Masq", rs.weight, 0, 0
                );
            }
        }
        o
    }

    /// `ipset save` text of every set (members sorted).
    pub fn to_ipset_save(&self) -> String {
        let mut o = String::new();
        for d in sets::ALL {
            let name = d.name(self.ip_family);
            let _ = writeln!(
                o,
                "create {name} {} {}",
                d.set_type,
                d.create_options(self.ip_family)
            );
            for e in self.ipsets.get(&name).into_iter().flatten() {
                let _ = writeln!(o, "add {name} {e}");
            }
        }
        o
    }
}

fn save_proto(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "-t",
        Protocol::Udp => "-u",
        Protocol::Sctp | Protocol::Unknown => "--sctp-service",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipvsadm_sort_wraps() {
        let a: IpAddr = "172.18.0.2".parse().unwrap();
        let b: IpAddr = "10.96.0.1".parse().unwrap();
        assert_eq!(ipvsadm_addr_cmp(&a, &b), std::cmp::Ordering::Less);
    }

    #[test]
    fn durations() {
        assert_eq!(duration_s("900s"), 900);
        assert_eq!(duration_s("1h2m3s"), 3723);
        assert_eq!(duration_s("0s"), 0);
        assert_eq!(duration_s(""), 0);
    }

    #[test]
    fn v6_set_names() {
        assert_eq!(
            sets::LOAD_BALANCER_SOURCE_CIDR.name(IpFamily::V6),
            "KUBE-6-LOAD-BALANCER-SOURCE-CID"
        );
        assert_eq!(
            sets::NODE_PORT_LOCAL_SCTP.name(IpFamily::V6),
            "KUBE-6-NODE-PORT-LOCAL-SCTP-HAS"
        );
    }
}
