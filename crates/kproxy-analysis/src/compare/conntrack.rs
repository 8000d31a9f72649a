//! Conntrack verification (findings KP6xx, documented in `docs/findings.md`): the flows of the
//! node's connection-tracking table against the service ports and serving endpoints the API has now.
//!
//! NAT is decided at a flow's first packet and kept in its conntrack entry, so when an endpoint
//! goes away the entries that still DNAT to it keep sending the flow's packets there, whatever the
//! rules say. kube-proxy deletes them after each sync (`pkg/proxy/conntrack/cleanup.go`,
//! `CleanStaleEntries`): for every UDP flow whose original destination is a service IP and port
//! (cluster IP, external IP, load-balancer IP) or a NodePort and whose reply source (IP and port) is
//! not a serving endpoint of that service port. This module finds the entries that cleanup missed:
//!
//! * DNATed to a reply source that is no serving endpoint (KP601 UDP/SCTP, KP602 TCP). Unlike
//!   kube-proxy this includes service ports that have no endpoints left (since v1.32 kube-proxy
//!   skips those, kubernetes/kubernetes#139628) and SCTP;
//! * not DNATed at all (the reply source is the service address itself) while the port now has
//!   serving endpoints: the entry was made while the port had none, before the REJECT rule, and
//!   holds the flow past the new rules (KP603 UDP/SCTP, KP604 TCP; kubernetes/kubernetes#48370);
//! * DNATed through a service address or port no service has any more (a deleted Service, a
//!   removed port): kube-proxy only looks at the services it has (KP605 UDP/SCTP, KP606 TCP).
//!
//! A TCP flow ends on its own (RST or timeout), so TCP findings are informational; a UDP or SCTP
//! client that keeps sending never makes a new entry and stays blackholed, so those are errors.
//! Each finding is one group of flows with the same protocol, original destination and reply
//! source — exactly what one `conntrack -D` filter ([`StaleGroup::delete_args`]) matches.
//!
//! On an IPVS node the same check runs on IPVS's own connection table ([`check_ipvs`], `ipvsadm
//! -Lnc`: virtual address → destination), with the same IDs. IPVS keeps a connection on its real
//! server whatever the rules say, and no command deletes one connection: kube-proxy's IPVS proxier
//! deletes a UDP/SCTP real server at once and a TCP one once its connections are gone (weight 0
//! until then, `pkg/proxy/ipvs/graceful_termination.go`), and sets
//! `net.ipv4.vs.expire_nodest_conn=1`, so that the next packet of a connection whose real server is
//! gone ends it. Its findings say where the real server stands in the `-Ln` listing and what that
//! leaves the user to do.

use super::catalogue::Check;
use super::finding::{Finding, Severity};
use crate::proxier::endpoints::endpoints_map;
use crate::proxier::service_port::{self, Protocol};
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::ip::{Cidr, IpFamily, join_host_port};
use crate::state::node::NodeFacts;
use kproxy_parsers::conntrack::{Family, Flow};
use kproxy_parsers::ipvsadm::{self, Connection, ServiceKey, VirtualService};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;

crate::compare::catalogue::checks! {
    /// Every conntrack check, in ID order.
    CHECKS;
    /// UDP/SCTP flows whose reply source is no serving endpoint of the service port.
    STALE_ENDPOINT = "KP601", Error,
        "UDP/SCTP flows still DNAT to an endpoint the service port no longer has", "F13",
        "a client that keeps sending never makes a new entry and stays blackholed: delete exactly these entries (kubectl kproxy repair --local --conntrack FILE --apply, or the conntrack -D shown); kube-proxy should have after its sync";
    /// TCP flows whose reply source is no serving endpoint of the service port.
    STALE_ENDPOINT_TCP = "KP602", Info,
        "TCP connections to an endpoint the service port no longer has", "F13",
        "they end on their own (reset or timeout) and the client's next connection goes through the current rules";
    /// UDP/SCTP flows to a service port that were never DNATed, while the port has endpoints now.
    NO_DNAT = "KP603", Error,
        "UDP/SCTP flows to a service port held without DNAT (made while it had no endpoints)", "F13",
        "the entry predates the endpoints and keeps the flow away from them: delete it (kubectl kproxy repair --local --conntrack FILE --apply, or the conntrack -D shown)";
    /// TCP connection attempts to a service port that were never DNATed.
    NO_DNAT_TCP = "KP604", Info,
        "TCP connection attempts to a service port held without DNAT", "F14",
        "the attempt expires (SYN_SENT, 120 s) and the next connection goes through the current rules; many of them mean the REJECT rule was missing";
    /// UDP/SCTP flows DNATed through a service address or port no service has.
    UNKNOWN_SERVICE = "KP605", Error,
        "UDP/SCTP flows DNATed through a service address or port no service has", "F13",
        "the Service (or its port) is gone and kube-proxy only cleans flows of services it knows: delete these entries (the conntrack -D shown)";
    /// TCP flows DNATed through a service address or port no service has.
    UNKNOWN_SERVICE_TCP = "KP606", Info,
        "TCP connections DNATed through a service address or port no service has", "F13",
        "they end on their own; new connections to that address are refused or time out";
}

/// How the original destination of a flow belongs to a service port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Frontend {
    /// The cluster IP.
    ClusterIp,
    /// An external IP.
    ExternalIp,
    /// A load-balancer ingress IP.
    LoadBalancerIp,
    /// The NodePort on a node address.
    NodePort,
}

impl Frontend {
    /// `cluster IP`, `external IP`, `load-balancer IP`, `NodePort`.
    pub fn as_str(self) -> &'static str {
        match self {
            Frontend::ClusterIp => "cluster IP",
            Frontend::ExternalIp => "external IP",
            Frontend::LoadBalancerIp => "load-balancer IP",
            Frontend::NodePort => "NodePort",
        }
    }
}

/// Why a group of flows is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum StaleKind {
    /// DNATed to a reply source that is no serving endpoint of the service port.
    StaleEndpoint,
    /// Not DNATed, while the service port has serving endpoints.
    NoDnat,
    /// DNATed through a service address or port no service has.
    UnknownService,
}

/// The table a flow was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FlowTable {
    /// The netfilter connection-tracking table (`conntrack -L`, `/proc/net/nf_conntrack`).
    Conntrack,
    /// IPVS's connection table (`ipvsadm -Lnc`).
    Ipvs,
}

/// Where the destination of a group of IPVS connections stands in the `ipvsadm -Ln` listing of the
/// same dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "state")]
pub enum RealServerState {
    /// Still a real server of the virtual server with this weight (> 0): new flows go there too.
    Scheduled {
        /// Its weight.
        weight: i32,
    },
    /// A real server with weight 0: kube-proxy drains it (TCP) until its connections end.
    Draining,
    /// No longer a real server of the virtual server (or the virtual server is gone).
    Gone,
}

/// One group of stale flows: same kind, service port, protocol, original destination and reply
/// source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StaleGroup {
    /// The table the flows were read from.
    pub table: FlowTable,
    /// Why the flows are stale.
    pub kind: StaleKind,
    /// The service port (`ns/name:port`), when one still has the destination.
    pub service: Option<String>,
    /// How the destination belongs to the service port.
    pub frontend: Option<Frontend>,
    /// `tcp`, `udp` or `sctp`.
    pub protocol: &'static str,
    /// The original destination address.
    pub orig_dst: IpAddr,
    /// The original destination port.
    pub orig_port: u16,
    /// The reply source address (the DNAT target, or the destination itself without DNAT).
    pub reply_src: IpAddr,
    /// The reply source port.
    pub reply_port: u16,
    /// The serving endpoints of the service port now (`ip:port`).
    pub serving: Vec<String>,
    /// Number of flows.
    pub flows: usize,
    /// Flows marked `[ASSURED]`.
    pub assured: usize,
    /// Flows marked `[UNREPLIED]`.
    pub unreplied: usize,
    /// The longest remaining timeout, in seconds.
    pub max_timeout: Option<u32>,
    /// Packets sent by the clients, when the listing has counters.
    pub packets: Option<u64>,
    /// The listing's lines of the flows.
    pub lines: Vec<u32>,
    /// Connections per IPVS state (`ESTABLISHED`, `UDP`, …; IPVS groups only).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub states: BTreeMap<String, usize>,
    /// Where the destination stands in the dump's `ipvsadm -Ln` listing (IPVS groups, when the dump
    /// has one).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub real_server: Option<RealServerState>,
}

impl StaleGroup {
    /// The `conntrack` arguments that delete exactly this group's flows (by protocol, original
    /// destination and reply source, as kube-proxy's `filterForIPPortNAT` does; never a flush).
    pub fn delete_args(&self) -> Vec<String> {
        vec![
            "-D".into(),
            "-f".into(),
            family_word(&self.orig_dst).into(),
            "-p".into(),
            self.protocol.into(),
            "--orig-dst".into(),
            self.orig_dst.to_string(),
            "--orig-port-dst".into(),
            self.orig_port.to_string(),
            "--reply-src".into(),
            self.reply_src.to_string(),
            "--reply-port-src".into(),
            self.reply_port.to_string(),
        ]
    }

    /// The `conntrack` arguments that list this group's flows (the same filter as
    /// [`delete_args`](Self::delete_args)).
    pub fn list_args(&self) -> Vec<String> {
        let mut args = self.delete_args();
        args[0] = "-L".into();
        args
    }

    /// The check this group is a finding of.
    pub fn check(&self) -> &'static Check {
        let tcp = self.protocol == "tcp";
        match (self.kind, tcp) {
            (StaleKind::StaleEndpoint, false) => &STALE_ENDPOINT,
            (StaleKind::StaleEndpoint, true) => &STALE_ENDPOINT_TCP,
            (StaleKind::NoDnat, false) => &NO_DNAT,
            (StaleKind::NoDnat, true) => &NO_DNAT_TCP,
            (StaleKind::UnknownService, false) => &UNKNOWN_SERVICE,
            (StaleKind::UnknownService, true) => &UNKNOWN_SERVICE_TCP,
        }
    }

    /// Whether deleting the group's flows with `conntrack -D` is part of a repair (conntrack
    /// errors only: TCP flows end on their own, as kube-proxy leaves them too, and no command
    /// deletes one IPVS connection).
    pub fn needs_deletion(&self) -> bool {
        self.table == FlowTable::Conntrack && self.check().severity == Severity::Error
    }

    /// `udp 10.96.0.10:53` — protocol and original destination.
    pub fn destination(&self) -> String {
        format!(
            "{} {}",
            self.protocol,
            join_host_port(&self.orig_dst, i32::from(self.orig_port))
        )
    }

    /// `10.244.1.5:53` — the reply source.
    pub fn reply_source(&self) -> String {
        join_host_port(&self.reply_src, i32::from(self.reply_port))
    }

    /// The finding for this group.
    pub fn finding(&self) -> Finding {
        let check = self.check();
        let n = self.flows;
        let flows = match (self.protocol, n) {
            ("tcp", 1) => "1 TCP connection".to_string(),
            ("tcp", _) => format!("{n} TCP connections"),
            (p, 1) => format!("1 {} flow", p.to_uppercase()),
            (p, _) => format!("{n} {} flows", p.to_uppercase()),
        };
        let to = join_host_port(&self.orig_dst, i32::from(self.orig_port));
        let what = match (self.frontend, &self.service) {
            (Some(f), Some(s)) => format!("{to} ({} of {s})", f.as_str()),
            _ => to.clone(),
        };
        let (go_to, target, table, listing) = match self.table {
            FlowTable::Conntrack => ("still DNAT to", "reply source", "conntrack", "listing"),
            FlowTable::Ipvs => (
                "still go to real server",
                "destination",
                "ipvs",
                "ipvsadm -Lnc",
            ),
        };
        let mut message = match self.kind {
            StaleKind::StaleEndpoint => format!(
                "{flows} to {what} {go_to} {}, which is not a serving endpoint of it",
                self.reply_source()
            ),
            StaleKind::NoDnat => format!(
                "{flows} to {what} were never DNATed (made while it had no endpoints) and bypass its endpoints"
            ),
            StaleKind::UnknownService => format!(
                "{flows} to {to}, an address and port no service has, {go_to} {}",
                self.reply_source()
            ),
        };
        message.push_str(&format!("; {}", self.activity()));
        match (self.table, self.kind, self.protocol) {
            (FlowTable::Ipvs, _, _) => message.push_str(&self.ipvs_note()),
            (_, StaleKind::StaleEndpoint, "udp") if self.serving.is_empty() => message.push_str(
                "; the port has no serving endpoints, and kube-proxy since v1.32 leaves the flows of such ports alone (kubernetes/kubernetes#139628)",
            ),
            (_, _, "sctp") => message.push_str("; kube-proxy clears UDP flows only"),
            _ => {}
        }
        let expected = match self.kind {
            StaleKind::UnknownService => "no flows (no service has this address and port)".into(),
            _ if self.serving.is_empty() => "no serving endpoints".to_string(),
            _ if self.table == FlowTable::Ipvs => {
                format!(
                    "a serving endpoint as destination: {}",
                    self.serving.join(", ")
                )
            }
            _ => format!("reply from a serving endpoint: {}", self.serving.join(", ")),
        };
        let mut f = check
            .finding(message)
            .chain(format!("{table} {}", self.destination()))
            .expected(expected)
            .actual(format!(
                "{target} {} ({listing} lines {})",
                self.reply_source(),
                line_list(&self.lines)
            ));
        if let Some(s) = &self.service {
            f = f.service(s.clone());
        }
        if self.needs_deletion() {
            f = f.hint(format!(
                "{}: conntrack {}",
                check.hint,
                self.delete_args().join(" ")
            ));
        } else if self.table == FlowTable::Ipvs && check.severity == Severity::Error {
            f = f.hint(self.ipvs_hint());
        }
        f
    }

    /// What the real server's place in the `-Ln` listing means for the connections (kube-proxy's
    /// graceful termination, the kernel's `expire_nodest_conn`).
    fn ipvs_note(&self) -> String {
        let udp_like = self.protocol != "tcp";
        match self.real_server {
            Some(RealServerState::Scheduled { weight }) => format!(
                "; it is still a real server of the virtual server (weight {weight}), so new flows go there too (KP506)"
            ),
            Some(RealServerState::Draining) if udp_like => "; it is a real server with weight 0, which kube-proxy does not keep for UDP/SCTP (it deletes those at once)".into(),
            Some(RealServerState::Draining) => "; it is a real server with weight 0: kube-proxy drains it and deletes it once its connections are gone".into(),
            Some(RealServerState::Gone) if udp_like => format!(
                "; {}: with net.ipv4.vs.expire_nodest_conn=1 (kube-proxy sets it) the flow's next packet ends the connection{}; with 0, IPVS drops the flow's packets until the connection expires (they do not renew it)",
                if self.kind == StaleKind::UnknownService {
                    "its virtual server is gone"
                } else {
                    "it is no longer a real server of the virtual server"
                },
                if self.serving.is_empty() {
                    ""
                } else {
                    " and the flow goes on to a serving endpoint"
                }
            ),
            Some(RealServerState::Gone) => "; it is no longer a real server of the virtual server: with net.ipv4.vs.expire_nodest_conn=1 the next packet ends the connection".into(),
            None => String::new(),
        }
    }

    /// The hint of an IPVS error: what ends the connections, as no command deletes one.
    fn ipvs_hint(&self) -> String {
        let remove = match self.real_server {
            Some(RealServerState::Gone) => String::new(),
            _ => format!(
                " (kubectl kproxy repair --local on the node, or ipvsadm -d {} {} -r {})",
                match self.protocol {
                    "udp" => "-u",
                    "sctp" => "--sctp-service",
                    _ => "-t",
                },
                ipvsadm::SocketText(self.orig_dst, self.orig_port),
                ipvsadm::SocketText(self.reply_src, self.reply_port),
            ),
        };
        format!(
            "ipvsadm cannot delete one connection, and deleting the flow's conntrack entry (conntrack -D) does not end it: the real server must be gone from the virtual server{remove}, as kube-proxy deletes UDP/SCTP real servers at once, and net.ipv4.vs.expire_nodest_conn must be 1 (kube-proxy sets it; sysctl -w net.ipv4.vs.expire_nodest_conn=1): the flow's next packet then ends the connection and the flow goes on to a serving endpoint; otherwise the connection lasts until it expires"
        )
    }

    /// `2 assured, 1 unreplied, expiring in up to 118 s unless the clients keep sending`.
    fn activity(&self) -> String {
        let mut parts: Vec<String> = self
            .states
            .iter()
            .map(|(state, n)| format!("{n} {state}"))
            .collect();
        if self.assured > 0 {
            parts.push(format!("{} assured", self.assured));
        }
        if self.unreplied > 0 {
            parts.push(format!("{} unreplied", self.unreplied));
        }
        if let Some(p) = self.packets {
            parts.push(format!("{p} packets sent"));
        }
        match self.max_timeout {
            Some(t) if self.protocol == "tcp" => parts.push(format!("expiring in up to {t} s")),
            Some(t) => parts.push(format!(
                "expiring in up to {t} s unless the clients keep sending"
            )),
            None => {}
        }
        if parts.is_empty() {
            "still in the table".into()
        } else {
            format!("still in the table: {}", parts.join(", "))
        }
    }
}

fn family_word(ip: &IpAddr) -> &'static str {
    if ip.is_ipv4() { "ipv4" } else { "ipv6" }
}

/// `3, 7, 9` (the first ten, then `…`).
fn line_list(lines: &[u32]) -> String {
    let mut s: Vec<String> = lines.iter().take(10).map(u32::to_string).collect();
    if lines.len() > 10 {
        s.push("…".into());
    }
    s.join(", ")
}

/// One service port of one family with its serving endpoints.
#[derive(Debug, Clone)]
struct PortEntry {
    name: String,
    serving: HashSet<(IpAddr, u16)>,
}

/// The service side of the check: every service port's frontends and serving endpoints (both
/// families), and the node's and pods' addresses.
#[derive(Debug, Clone, Default)]
pub struct ServiceIndex {
    ports: Vec<PortEntry>,
    /// (protocol number, address, port) → (port entry, frontend).
    frontends: HashMap<(u8, IpAddr, u16), (usize, Frontend)>,
    /// (protocol number, IPv6?, NodePort) → port entry.
    node_ports: HashMap<(u8, bool, u16), usize>,
    /// Every cluster, external and load-balancer IP.
    service_ips: HashSet<IpAddr>,
    /// Addresses the NodePorts answer on.
    node_addresses: Vec<IpAddr>,
    /// `nodePortAddresses` CIDRs.
    node_port_cidrs: Vec<Cidr>,
    /// Pod networks: `clusterCIDR` and every Node's `podCIDRs`.
    pod_networks: Vec<Cidr>,
    /// Every endpoint address of every EndpointSlice.
    endpoint_ips: HashSet<IpAddr>,
}

fn protocol_number(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn protocol_word(n: u8) -> Option<&'static str> {
    match n {
        6 => Some("tcp"),
        17 => Some("udp"),
        132 => Some("sctp"),
        _ => None,
    }
}

fn port_u16(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|p| *p != 0)
}

impl ServiceIndex {
    /// Builds the index from the API state (what kube-proxy's `ServicePortMap` and `EndpointsMap`
    /// hold, both families), the configuration and the node facts. Oddities of the objects are
    /// not reported here: `verify` reports them once.
    pub fn new(state: &ClusterState, config: &ProxyConfig, facts: &NodeFacts) -> ServiceIndex {
        let mut ix = ServiceIndex::default();
        let mut ignored = Vec::new();
        for family in [IpFamily::V4, IpFamily::V6] {
            let eps = endpoints_map(
                &state.endpoint_slices,
                family,
                &facts.node_name,
                &mut ignored,
            );
            for svc in state
                .services
                .iter()
                .filter(|s| !service_port::ignored_by_labels(&s.metadata))
            {
                for info in service_port::service_ports(svc, family, &mut ignored) {
                    let Some(port) = port_u16(info.port) else {
                        continue;
                    };
                    let serving = eps
                        .get(&info.name)
                        .map(|list| {
                            list.iter()
                                .filter(|e| e.serving)
                                .filter_map(|e| Some((e.ip, port_u16(e.port)?)))
                                .collect()
                        })
                        .unwrap_or_default();
                    let idx = ix.ports.len();
                    let proto = protocol_number(info.name.protocol);
                    let mut add = |ip: IpAddr, frontend: Frontend| {
                        ix.service_ips.insert(ip);
                        ix.frontends
                            .entry((proto, ip, port))
                            .or_insert((idx, frontend));
                    };
                    add(info.cluster_ip, Frontend::ClusterIp);
                    for ip in &info.external_ips {
                        add(*ip, Frontend::ExternalIp);
                    }
                    for ip in &info.load_balancer_vips {
                        add(*ip, Frontend::LoadBalancerIp);
                    }
                    if let Some(np) = port_u16(info.node_port) {
                        ix.node_ports
                            .entry((proto, family == IpFamily::V6, np))
                            .or_insert(idx);
                    }
                    ix.ports.push(PortEntry {
                        name: info.name_string.clone(),
                        serving,
                    });
                }
            }
        }
        for slice in &state.endpoint_slices {
            for ep in &slice.endpoints {
                ix.endpoint_ips.extend(
                    ep.addresses
                        .iter()
                        .filter_map(|a| crate::state::ip::parse_ip_sloppy(a)),
                );
            }
        }
        ix.node_addresses = facts.local_addresses();
        ix.node_port_cidrs = config
            .node_port_addresses
            .iter()
            .filter_map(|c| Cidr::parse_sloppy(c))
            .collect();
        ix.pod_networks = config
            .cluster_cidrs
            .iter()
            .filter_map(|c| Cidr::parse_sloppy(c))
            .collect();
        for node in &state.nodes {
            let cidrs = node
                .spec
                .as_ref()
                .and_then(|s| s.pod_cidrs.as_deref())
                .unwrap_or(&[]);
            ix.pod_networks
                .extend(cidrs.iter().filter_map(|c| Cidr::parse_sloppy(c)));
        }
        ix
    }

    fn is_node_address(&self, ip: &IpAddr) -> bool {
        self.node_addresses.contains(ip)
            || ip.is_loopback()
            || self.node_port_cidrs.iter().any(|c| c.contains(ip))
    }

    fn is_pod_address(&self, ip: &IpAddr) -> bool {
        self.endpoint_ips.contains(ip) || self.pod_networks.iter().any(|c| c.contains(ip))
    }

    /// The service port and frontend a flow's original destination belongs to.
    fn frontend_of(&self, flow: &FlowView<'_>) -> Option<(usize, Frontend)> {
        let dst = flow.orig_dst;
        if let Some(hit) = self.frontends.get(&(flow.protocol, dst, flow.orig_port)) {
            return Some(*hit);
        }
        let idx = *self
            .node_ports
            .get(&(flow.protocol, dst.is_ipv6(), flow.orig_port))?;
        // kube-proxy's NodePort rules match every local address (or those of nodePortAddresses);
        // a DNATed flow to an address that is neither a service's nor a pod's reached one too.
        let local = self.is_node_address(&dst)
            || (flow.dnat && !self.service_ips.contains(&dst) && !self.is_pod_address(&dst));
        local.then_some((idx, Frontend::NodePort))
    }
}

/// What the check reads of one flow, from either table.
struct FlowView<'a> {
    line: u32,
    /// Protocol number (6, 17, 132).
    protocol: u8,
    orig_dst: IpAddr,
    orig_port: u16,
    reply_src: IpAddr,
    reply_port: u16,
    /// The destination was translated (always so for an IPVS connection to another address).
    dnat: bool,
    assured: bool,
    unreplied: bool,
    timeout: Option<u32>,
    packets: Option<u64>,
    /// The IPVS state (conntrack's TCP state is not shown: `[ASSURED]` says more).
    state: Option<&'a str>,
}

impl<'a> FlowView<'a> {
    fn of_conntrack(flow: &Flow<'a>) -> Option<FlowView<'a>> {
        debug_assert_eq!(flow.family == Family::Ipv6, flow.original.dst.is_ipv6());
        Some(FlowView {
            line: flow.line,
            protocol: flow.protocol,
            orig_dst: flow.original.dst,
            orig_port: flow.original.dport()?,
            reply_src: flow.reply.src,
            reply_port: flow.reply.sport()?,
            dnat: flow.is_dnat(),
            assured: flow.assured,
            unreplied: flow.unreplied,
            timeout: flow.timeout,
            packets: flow.original_counters.map(|c| c.packets),
            state: None,
        })
    }

    /// A connection of `ipvsadm -Lnc`; persistence templates (client port 0) are not flows: they
    /// only pin a client to a real server, and the kernel drops a template whose real server is
    /// unavailable when it is next used.
    fn of_ipvs(conn: &Connection<'a>) -> Option<FlowView<'a>> {
        if conn.is_template() {
            return None;
        }
        let protocol = match ipvsadm::Protocol::from_name(conn.protocol)? {
            ipvsadm::Protocol::Tcp => 6,
            ipvsadm::Protocol::Udp => 17,
            ipvsadm::Protocol::Sctp => 132,
            ipvsadm::Protocol::Unknown => return None,
        };
        Some(FlowView {
            line: u32::try_from(conn.line).unwrap_or(u32::MAX),
            protocol,
            orig_dst: conn.virtual_addr.0,
            orig_port: conn.virtual_addr.1,
            reply_src: conn.dest.0,
            reply_port: conn.dest.1,
            dnat: conn.dest != conn.virtual_addr,
            assured: false,
            unreplied: false,
            timeout: Some(u32::try_from(conn.expire_s).unwrap_or(u32::MAX)),
            packets: None,
            state: Some(conn.state),
        })
    }
}

/// The result of the check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConntrackCheck {
    /// Flows in the listing.
    pub flows: usize,
    /// Flows whose original destination is a service port.
    pub service_flows: usize,
    /// Stale groups, most severe first, then by destination and reply source.
    pub groups: Vec<StaleGroup>,
}

impl ConntrackCheck {
    /// One finding per group.
    pub fn findings(&self) -> Vec<Finding> {
        self.groups.iter().map(StaleGroup::finding).collect()
    }

    /// The groups a repair deletes (UDP and SCTP).
    pub fn deletions(&self) -> impl Iterator<Item = &StaleGroup> {
        self.groups.iter().filter(|g| g.needs_deletion())
    }
}

/// Checks every TCP, UDP and SCTP flow of a conntrack listing against the services (see the
/// module documentation).
pub fn check(flows: &[Flow<'_>], index: &ServiceIndex) -> ConntrackCheck {
    let views = flows.iter().filter_map(FlowView::of_conntrack);
    check_views(FlowTable::Conntrack, flows.len(), views, index, |_| None)
}

/// Checks every TCP, UDP and SCTP connection of `ipvsadm -Lnc` against the services, the same way
/// as [`check`]; `services` (the dump's `-Ln` listing, merged) says where each stale destination
/// stands, when the dump has one.
pub fn check_ipvs(
    connections: &[Connection<'_>],
    services: Option<&[VirtualService<'_>]>,
    index: &ServiceIndex,
) -> ConntrackCheck {
    // IPVS keeps one connection per client and virtual address: a second one for the same pair
    // exists only after the first was expired (`expire_nodest_conn`) while still referenced, and
    // the kernel frees that one within a minute (`ip_vs_conn_expire` retries at 60 s). Only the
    // longest-lived connection of a pair carries the flow.
    type Pair<'c> = (&'c str, (IpAddr, u16), (IpAddr, u16));
    let mut longest: HashMap<Pair<'_>, u64> = HashMap::new();
    for c in connections {
        let e = longest
            .entry((c.protocol, c.client, c.virtual_addr))
            .or_default();
        *e = (*e).max(c.expire_s);
    }
    let views = connections
        .iter()
        .filter(|c| longest[&(c.protocol, c.client, c.virtual_addr)] == c.expire_s)
        .filter_map(FlowView::of_ipvs);
    check_views(FlowTable::Ipvs, connections.len(), views, index, |g| {
        services.map(|s| real_server_state(s, g))
    })
}

/// Where `g`'s destination stands among the real servers of its virtual server.
fn real_server_state(services: &[VirtualService<'_>], g: &StaleGroup) -> RealServerState {
    let protocol = ipvsadm::Protocol::from_name(g.protocol);
    let vs = services.iter().find(|v| {
        matches!(v.key, ServiceKey::Inet { protocol: p, addr, port }
            if Some(p) == protocol && addr == g.orig_dst && port == g.orig_port)
    });
    let rs = vs.and_then(|v| {
        v.real_servers
            .iter()
            .find(|r| r.addr == g.reply_src && r.port == g.reply_port)
    });
    match rs.map(|r| r.weight) {
        None => RealServerState::Gone,
        Some(Some(0)) => RealServerState::Draining,
        Some(w) => RealServerState::Scheduled {
            weight: w.unwrap_or(1),
        },
    }
}

fn check_views<'a>(
    table: FlowTable,
    listed: usize,
    flows: impl Iterator<Item = FlowView<'a>>,
    index: &ServiceIndex,
    real_server: impl Fn(&StaleGroup) -> Option<RealServerState>,
) -> ConntrackCheck {
    type Key = (StaleKind, Option<usize>, u8, IpAddr, u16, IpAddr, u16);
    let mut groups: BTreeMap<Key, StaleGroup> = BTreeMap::new();
    let mut service_flows = 0;
    for flow in flows {
        let Some(protocol) = protocol_word(flow.protocol) else {
            continue;
        };
        let (reply_src, reply_port) = (flow.reply_src, flow.reply_port);
        let (kind, port) = match index.frontend_of(&flow) {
            Some((idx, frontend)) => {
                service_flows += 1;
                let entry = &index.ports[idx];
                let kind = if !flow.dnat {
                    if entry.serving.is_empty() {
                        continue;
                    }
                    StaleKind::NoDnat
                } else if entry.serving.contains(&(reply_src, reply_port)) {
                    continue;
                } else {
                    StaleKind::StaleEndpoint
                };
                (kind, Some((idx, frontend)))
            }
            None => {
                let dst = flow.orig_dst;
                let through_gone_service = flow.dnat
                    && (index.service_ips.contains(&dst)
                        || (!index.is_node_address(&dst)
                            && !index.is_pod_address(&dst)
                            && index.is_pod_address(&reply_src)));
                if !through_gone_service {
                    continue;
                }
                (StaleKind::UnknownService, None)
            }
        };
        let key: Key = (
            kind,
            port.map(|(i, _)| i),
            flow.protocol,
            flow.orig_dst,
            flow.orig_port,
            reply_src,
            reply_port,
        );
        let g = groups.entry(key).or_insert_with(|| {
            let entry = port.map(|(i, _)| &index.ports[i]);
            let mut serving: Vec<(IpAddr, u16)> = entry
                .map(|e| e.serving.iter().copied().collect())
                .unwrap_or_default();
            serving.sort();
            let mut g = StaleGroup {
                table,
                kind,
                service: entry.map(|e| e.name.clone()),
                frontend: port.map(|(_, f)| f),
                protocol,
                orig_dst: flow.orig_dst,
                orig_port: flow.orig_port,
                reply_src,
                reply_port,
                serving: serving
                    .iter()
                    .map(|(ip, p)| join_host_port(ip, i32::from(*p)))
                    .collect(),
                flows: 0,
                assured: 0,
                unreplied: 0,
                max_timeout: None,
                packets: None,
                lines: Vec::new(),
                states: BTreeMap::new(),
                real_server: None,
            };
            g.real_server = real_server(&g);
            g
        });
        g.flows += 1;
        g.assured += usize::from(flow.assured);
        g.unreplied += usize::from(flow.unreplied);
        g.max_timeout = g.max_timeout.max(flow.timeout);
        if let Some(p) = flow.packets {
            g.packets = Some(g.packets.unwrap_or(0) + p);
        }
        if let Some(state) = flow.state {
            *g.states.entry(state.to_string()).or_default() += 1;
        }
        g.lines.push(flow.line);
    }
    let mut groups: Vec<StaleGroup> = groups.into_values().collect();
    groups.sort_by(|a, b| {
        (
            a.check().severity,
            a.check().id,
            &a.service,
            a.orig_dst,
            a.orig_port,
        )
            .cmp(&(
                b.check().severity,
                b.check().id,
                &b.service,
                b.orig_dst,
                b.orig_port,
            ))
            .then((a.reply_src, a.reply_port).cmp(&(b.reply_src, b.reply_port)))
    });
    ConntrackCheck {
        flows: listed,
        service_flows,
        groups,
    }
}

impl fmt::Display for StaleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StaleKind::StaleEndpoint => "stale endpoint",
            StaleKind::NoDnat => "no DNAT",
            StaleKind::UnknownService => "no such service",
        })
    }
}

#[cfg(test)]
mod tests;
