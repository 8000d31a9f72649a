//! IPVS-mode verification (findings KP5xx, documented in `docs/findings.md` section "IPVS"): the
//! virtual servers, real servers, ipsets, `kube-ipvs0` addresses and iptables rules kube-proxy should
//! have installed ([`ExpectedIpvs`]) against what the node's dumps show ([`ActualIpvs`]).
//! Comparison rules (docs/ipvs.md, "What is compared"): keyed sets, never line order; weight-0
//! draining tolerated.

use super::finding::Finding;
use super::left_out::{LeftOutService, NotChecked, tally};
use crate::proxier::ipvs::{ExpectedIpvs, ExpectedVs, iptables as ipvs_rules, sets};
use crate::state::ip::IpFamily;
use crate::state::mode::ProxyMode;
use kproxy_parsers::ipset::{self, IpSet};
use kproxy_parsers::ipvsadm::{
    Forward, IpvsDump, Protocol, RealServer, ServiceKey, SocketText, VirtualService,
};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

crate::compare::catalogue::checks! {
    /// Every IPVS check, in ID order.
    CHECKS;
    /// A virtual server kube-proxy should have programmed is absent.
    VS_MISSING = "KP501", Error, "IPVS virtual server missing", "F17",
        "kube-proxy re-creates it on its next sync; if it does not, read kube-proxy's log (ipvs sync errors) and restart it";
    /// A virtual server of kube-proxy's family that no service port implies (outside excludeCIDRs).
    VS_STALE = "KP502", Warning, "stale IPVS virtual server (no service implies it)", "F17",
        "kube-proxy deletes it at its next full sync (hourly on v1.34+); delete it with ipvsadm -D, or add its range to ipvs.excludeCIDRs if another component owns it";
    /// Scheduler or scheduler flags differ from `ipvs.scheduler`.
    VS_SCHEDULER = "KP503", Error, "IPVS scheduler or scheduler flags differ from the configuration", "",
        "kube-proxy edits it on its next sync; otherwise ipvsadm -E with -s SCHED (and -p/-b as needed: -E replaces every attribute)";
    /// Persistence (ClientIP affinity) differs.
    VS_PERSISTENCE = "KP504", Error, "IPVS persistence differs from the service's session affinity", "F16",
        "kube-proxy edits it on its next sync; otherwise ipvsadm -E -s SCHED [-p TIMEOUT]";
    /// A real server for a current endpoint is absent.
    RS_MISSING = "KP505", Error, "IPVS real server missing for an endpoint", "",
        "kube-proxy adds it on its next sync; otherwise ipvsadm -a … -r EP:PORT -m -w 1";
    /// A real server that is no endpoint any more still has weight > 0.
    RS_STALE = "KP506", Error, "IPVS real server for a gone endpoint still takes traffic (weight > 0)", "F17",
        "new connections go to a pod that is gone: delete it (ipvsadm -d …) or resync kube-proxy";
    /// A weight-0 real server that is no endpoint and has no connections left.
    RS_ZERO_LEFTOVER = "KP507", Warning, "weight-0 real server left over with no connections", "F15",
        "graceful termination should have deleted it within a minute: delete it with ipvsadm -d …; restart kube-proxy if it keeps happening";
    /// A weight-0 real server that is no endpoint but still has connections (graceful termination).
    RS_DRAINING = "KP508", Info, "weight-0 real server draining its connections", "F15",
        "expected while connections drain; if it persists for long, clients may reuse ports (issue #81775)";
    /// A real server of a current endpoint has weight 0.
    RS_ZERO_WEIGHT = "KP509", Error, "real server of a ready endpoint has weight 0 (gets no traffic)", "F15",
        "set it back with ipvsadm -e … -m -w 1, or restart kube-proxy (it resets weights on its first sync, issues #92019/#108319)";
    /// A real server has a weight other than 0 or 1.
    RS_WEIGHT = "KP510", Warning, "real server weight differs from 1", "",
        "kube-proxy programs weight 1: ipvsadm -e … -m -w 1";
    /// The forwarding method is not masquerading.
    RS_FORWARD = "KP511", Warning, "real server forwarding method is not Masq", "",
        "kube-proxy needs NAT (-m): ipvsadm -e … -m -w 1";
    /// An ipset entry kube-proxy should have added is absent.
    IPSET_ENTRY_MISSING = "KP512", Error, "ipset entry missing", "",
        "iptables rules that match the set miss this service (masquerade, filter, NodePort); resync kube-proxy or ipset add SET ENTRY";
    /// An ipset holds an entry no service implies.
    IPSET_ENTRY_STALE = "KP513", Warning, "stale ipset entry", "F17",
        "kube-proxy removes it on its next sync; otherwise ipset del SET ENTRY";
    /// A kube-proxy ipset does not exist.
    IPSET_MISSING = "KP514", Error, "kube-proxy ipset missing", "",
        "kube-proxy creates all its sets on every sync; iptables-restore fails while a referenced set is missing — check kube-proxy's log";
    /// A service address is not bound to kube-ipvs0.
    IPVS0_ADDR_MISSING = "KP515", Error, "service address not bound to kube-ipvs0", "F17",
        "without the local route IPVS never sees the traffic: ip addr add ADDR/32 dev kube-ipvs0, or resync kube-proxy";
    /// kube-ipvs0 carries an address no service implies.
    IPVS0_ADDR_STALE = "KP516", Warning, "stale address on kube-ipvs0", "F17",
        "the node answers for an address no service owns: ip addr del ADDR/32 dev kube-ipvs0, or resync kube-proxy";
    /// An IPVS-mode iptables rule or chain is missing.
    IPT_RULE_MISSING = "KP517", Error, "IPVS-mode iptables rule missing", "F10",
        "kube-proxy rewrites its chains on every sync; if they stay broken, look for a firewall manager flushing them";
    /// A kube-proxy-owned chain has a rule kube-proxy would not write.
    IPT_RULE_EXTRA = "KP518", Warning, "unexpected rule in an IPVS-mode kube-proxy chain", "",
        "kube-proxy flushes its chains on every sync, so a foreign rule here disappears; put it in your own chain";
    /// iptables-mode chains are present on an IPVS node.
    IPTABLES_MODE_LEFTOVER = "KP519", Warning, "iptables-mode kube-proxy chains left over on an IPVS node", "F07",
        "run kube-proxy --cleanup for the old mode (or delete the KUBE-SVC-/KUBE-SEP-/KUBE-EXT- chains and their jumps) once nothing uses them";
    /// A foreign virtual server inside `ipvs.excludeCIDRs` (kept by kube-proxy).
    VS_EXCLUDED = "KP520", Info, "foreign IPVS virtual server inside ipvs.excludeCIDRs (left alone)", "",
        "nothing to do: kube-proxy does not touch virtual servers inside excludeCIDRs";
    /// A NodePort virtual server on an address the plugin was not told about.
    VS_UNKNOWN_NODE_ADDR = "KP521", Info, "NodePort virtual server on a node address not given to the plugin", "",
        "pass every interface address with --node-ip (kube-proxy listens on all of them unless nodePortAddresses restricts it)";
    /// IPVS connection timeouts differ from the configuration.
    TIMEOUTS = "KP522", Warning, "IPVS timeouts differ from ipvs.tcpTimeout/tcpFinTimeout/udpTimeout", "",
        "kube-proxy sets them at start-up; ipvsadm --set TCP TCPFIN UDP, or restart kube-proxy";
    /// The configured proxy mode and what the node runs disagree.
    MODE_MISMATCH = "KP523", Error, "configured proxy mode and the node's state disagree", "F07",
        "check which mode kube-proxy really runs (/proxyMode on its metrics port, its ConfigMap and flags) and verify with that mode";
}

/// What the node has, as parsed dumps.
#[derive(Debug, Clone, Default)]
pub struct ActualIpvs<'a> {
    /// `ipvsadm -Ln` / `-Sn` / `--stats` / `-Lnc` capture(s).
    pub dump: IpvsDump<'a>,
    /// `ipset save` / `ipset list`, when collected.
    pub ipsets: Option<Vec<IpSet<'a>>>,
    /// `iptables-save` (or `ip6tables-save`) text, when collected.
    pub iptables_save: Option<&'a str>,
    /// Addresses on `kube-ipvs0` (`ip -o addr show dev kube-ipvs0`), when collected.
    pub kube_ipvs0: Option<Vec<IpAddr>>,
}

/// The Service of `left_out` a virtual server at `protocol addr:port` belongs to: one at its
/// cluster IP (a cluster IP is one Service's alone, every port at it is that Service's), or
/// at one of its NodePorts (on any address).
pub fn left_out_virtual_server<'l>(
    left_out: &'l [LeftOutService],
    protocol: &str,
    addr: &IpAddr,
    port: u16,
) -> Option<&'l LeftOutService> {
    left_out.iter().find(|l| {
        l.cluster_ips
            .iter()
            .any(|ip| ip.parse::<IpAddr>().is_ok_and(|ip| ip == *addr))
            || l.ports
                .iter()
                .any(|p| p.protocol.eq_ignore_ascii_case(protocol) && p.node_port == Some(port))
    })
}

/// The Service of `left_out` whose cluster IP `address` is (a `kube-ipvs0` address, the
/// address an ipset entry starts with).
pub fn left_out_address<'l>(
    left_out: &'l [LeftOutService],
    address: &str,
) -> Option<&'l LeftOutService> {
    let parsed = address.parse::<IpAddr>().ok();
    left_out.iter().find(|l| {
        l.cluster_ips
            .iter()
            .any(|ip| ip == address || (parsed.is_some() && ip.parse::<IpAddr>().ok() == parsed))
    })
}

/// The `KUBE-LOOP-BACK` member kube-proxy adds for an endpoint `ip:port` of a `protocol`
/// virtual server (`ip,proto:port,ip`: the hairpin of a local endpoint, `syncEndpoint` in
/// `pkg/proxy/ipvs/proxier.go`).
pub fn loopback_member(protocol: &str, ip: &IpAddr, port: u16) -> String {
    format!("{ip},{}:{port},{ip}", protocol.to_ascii_lowercase())
}

/// `actual` without what belongs to the Services in `left_out` (their rules are not judged):
/// the virtual servers at their cluster IPs and at their NodePorts, their cluster IPs
/// on `kube-ipvs0` and in the ipsets' entries (`10.96.0.10,tcp:80`). Its `iptables-save` is
/// cut by the caller ([`super::iptables::scope::without_left_out`]), which owns the text.
/// Also what was taken out per Service.
pub fn without_left_out<'a>(
    actual: &ActualIpvs<'a>,
    left_out: &[LeftOutService],
) -> (ActualIpvs<'a>, Vec<NotChecked>) {
    let mut counts = Vec::new();
    let mut count = |l: &LeftOutService| {
        tally(
            &mut counts,
            NotChecked {
                service: l.service.clone(),
                chains: 0,
                objects: 1,
            },
        );
    };
    let owner = |key: &ServiceKey| -> Option<&LeftOutService> {
        let ServiceKey::Inet {
            protocol,
            addr,
            port,
        } = key
        else {
            return None;
        };
        left_out_virtual_server(left_out, protocol.as_str(), addr, *port)
    };
    // The hairpin members of the left-out virtual servers' endpoints are theirs too.
    let mut loopback: BTreeMap<String, &LeftOutService> = BTreeMap::new();
    for vs in actual.dump.listings.iter().flat_map(|l| &l.services) {
        if let (Some(l), ServiceKey::Inet { protocol, .. }) = (owner(&vs.key), &vs.key) {
            for rs in &vs.real_servers {
                loopback.insert(loopback_member(protocol.as_str(), &rs.addr, rs.port), l);
            }
        }
    }
    let mut kept = actual.clone();
    for listing in &mut kept.dump.listings {
        listing.services.retain(|vs| match owner(&vs.key) {
            Some(l) => {
                count(l);
                false
            }
            None => true,
        });
    }
    for set in kept.ipsets.iter_mut().flatten() {
        set.entries.retain(|e| {
            let address = e.text.split(',').next().unwrap_or("");
            let hairpin = loopback.get(e.text).copied();
            match hairpin.or_else(|| left_out_address(left_out, address)) {
                Some(l) => {
                    count(l);
                    false
                }
                None => true,
            }
        });
    }
    if let Some(addresses) = &mut kept.kube_ipvs0 {
        addresses.retain(|a| match left_out_address(left_out, &a.to_string()) {
            Some(l) => {
                count(l);
                false
            }
            None => true,
        });
    }
    (kept, counts)
}

fn vs_label(p: Protocol, a: IpAddr, port: u16) -> String {
    format!("{:<4} {}", p.as_str(), SocketText(a, port)).replace("  ", " ")
}

fn with(
    mut f: Finding,
    service: Option<&str>,
    chain: Option<String>,
    expected: Option<String>,
    actual: Option<String>,
) -> Finding {
    f.service = service.map(str::to_string);
    f.chain = chain;
    f.expected = expected;
    f.actual = actual;
    f
}

fn in_family(a: &IpAddr, fam: IpFamily) -> bool {
    IpFamily::of(a) == fam
}

/// Connection counts per (virtual address, port, destination address, port) from `-Lnc` rows.
fn conn_counts(dump: &IpvsDump<'_>) -> BTreeMap<(IpAddr, u16, IpAddr, u16), u64> {
    let mut m = BTreeMap::new();
    for c in &dump.connections {
        *m.entry((c.virtual_addr.0, c.virtual_addr.1, c.dest.0, c.dest.1))
            .or_insert(0) += 1;
    }
    m
}

/// Connections a real server holds, if the dump says: ActiveConn+InActConn, else `-Lnc` rows.
pub fn rs_connections(
    dump: &IpvsDump<'_>,
    vs: &VirtualService<'_>,
    rs: &RealServer<'_>,
) -> Option<u64> {
    if let (Some(a), Some(i)) = (rs.active_conns, rs.inactive_conns) {
        return Some(a + i);
    }
    if !dump.has_connection_table {
        return None;
    }
    let ServiceKey::Inet { addr, port, .. } = vs.key else {
        return None;
    };
    Some(
        conn_counts(dump)
            .get(&(addr, port, rs.addr, rs.port))
            .copied()
            .unwrap_or(0),
    )
}

/// Compares the IPVS table (virtual and real servers).
fn verify_table(exp: &ExpectedIpvs, act: &ActualIpvs<'_>, out: &mut Vec<Finding>) {
    let fam = exp.ip_family;
    let services = act.dump.merged_services();
    let has_attrs = act.dump.has_attributes();
    let actual: BTreeMap<(Protocol, IpAddr, u16), &VirtualService<'_>> = services
        .iter()
        .filter_map(|s| match s.key {
            ServiceKey::Inet {
                protocol,
                addr,
                port,
            } if in_family(&addr, fam) => Some(((protocol, addr, port), s)),
            _ => None,
        })
        .collect();
    let expected: BTreeMap<(Protocol, IpAddr, u16), &ExpectedVs> =
        exp.virtual_servers.iter().map(|v| (v.key(), v)).collect();
    for (key, e) in &expected {
        let label = vs_label(key.0, key.1, key.2);
        let Some(a) = actual.get(key) else {
            out.push(with(
                VS_MISSING.finding(format!("virtual server {label} is missing")),
                Some(&e.service),
                Some(label),
                Some(format!(
                    "{} {} real server(s)",
                    e.scheduler,
                    e.real_servers.len()
                )),
                Some("absent".into()),
            ));
            continue;
        };
        if has_attrs && let Some(sched) = a.scheduler {
            let flags: BTreeSet<&str> = a.sched_flags.iter().copied().collect();
            let want_flags: BTreeSet<&str> = e.flags.iter().map(String::as_str).collect();
            if sched != e.scheduler || flags != want_flags {
                out.push(with(
                    VS_SCHEDULER.finding(format!(
                        "virtual server {label} uses scheduler {sched}, not {}",
                        e.scheduler
                    )),
                    Some(&e.service),
                    Some(label.clone()),
                    Some(format!("{} {:?}", e.scheduler, e.flags)),
                    Some(format!("{sched} {:?}", a.sched_flags)),
                ));
            }
            if a.persistent != e.persistent_timeout_s {
                let show = |p: Option<u32>| {
                    p.map_or("not persistent".to_string(), |t| format!("persistent {t}"))
                };
                out.push(with(
                    VS_PERSISTENCE.finding(format!(
                        "virtual server {label} is {}, the service wants {}",
                        show(a.persistent),
                        show(e.persistent_timeout_s)
                    )),
                    Some(&e.service),
                    Some(label.clone()),
                    Some(show(e.persistent_timeout_s)),
                    Some(show(a.persistent)),
                ));
            }
        }
        verify_real_servers(exp, act, e, a, &label, out);
    }
    let np_ports: BTreeSet<(Protocol, u16)> = exp
        .virtual_servers
        .iter()
        .filter(|v| v.kind == crate::proxier::ipvs::VsKind::NodePort)
        .map(|v| (v.protocol, v.port))
        .collect();
    for (key, a) in &actual {
        if expected.contains_key(key) {
            continue;
        }
        let label = vs_label(key.0, key.1, key.2);
        let rs = format!("{} real server(s)", a.real_servers.len());
        if exp.exclude_cidrs.iter().any(|c| c.contains(&key.1)) {
            out.push(with(
                VS_EXCLUDED.finding(format!(
                    "virtual server {label} is inside ipvs.excludeCIDRs"
                )),
                None,
                Some(label),
                None,
                Some(rs),
            ));
        } else if np_ports.contains(&(key.0, key.2))
            && !exp.node_port_ips.contains(&key.1)
            && !exp.kube_ipvs0_addresses.contains(&key.1)
        {
            out.push(with(
                VS_UNKNOWN_NODE_ADDR.finding(format!("NodePort virtual server {label} is on an address the plugin does not know as a node address")),
                None,
                Some(label),
                Some(format!("node addresses {:?}", exp.node_port_ips)),
                Some(rs),
            ));
        } else {
            let probe = key.1.to_string() == "198.51.100.0" && key.2 == 20000;
            let msg = if probe {
                format!("virtual server {label} is kube-proxy's scheduler probe left behind")
            } else {
                format!("virtual server {label} is not implied by any service port")
            };
            out.push(with(
                VS_STALE.finding(msg),
                None,
                Some(label),
                Some("absent".into()),
                Some(rs),
            ));
        }
    }
}

fn verify_real_servers(
    exp: &ExpectedIpvs,
    act: &ActualIpvs<'_>,
    e: &ExpectedVs,
    a: &VirtualService<'_>,
    label: &str,
    out: &mut Vec<Finding>,
) {
    let _ = exp;
    let svc = Some(e.service.as_str());
    for want in &e.real_servers {
        let rs_label = SocketText(want.address, want.port).to_string();
        match a
            .real_servers
            .iter()
            .find(|r| r.addr == want.address && r.port == want.port)
        {
            None => out.push(with(
                RS_MISSING.finding(format!("{label}: real server {rs_label} is missing")),
                svc,
                Some(label.to_string()),
                Some(format!("{rs_label} weight {}", want.weight)),
                Some("absent".into()),
            )),
            Some(r) => {
                match r.weight {
                    Some(0) => out.push(with(
                        RS_ZERO_WEIGHT.finding(format!(
                            "{label}: real server {rs_label} of a current endpoint has weight 0"
                        )),
                        svc,
                        Some(label.to_string()),
                        Some("weight 1".into()),
                        Some("weight 0".into()),
                    )),
                    Some(w) if w != want.weight => out.push(with(
                        RS_WEIGHT
                            .finding(format!("{label}: real server {rs_label} has weight {w}")),
                        svc,
                        Some(label.to_string()),
                        Some(format!("weight {}", want.weight)),
                        Some(format!("weight {w}")),
                    )),
                    _ => {}
                }
                if let Some(f) = r.forward
                    && !matches!(f, Forward::Masq | Forward::Local)
                {
                    out.push(with(
                        RS_FORWARD.finding(format!(
                            "{label}: real server {rs_label} uses {}",
                            f.as_str()
                        )),
                        svc,
                        Some(label.to_string()),
                        Some("Masq".into()),
                        Some(f.as_str().into()),
                    ));
                }
            }
        }
    }
    for r in &a.real_servers {
        if e.real_servers
            .iter()
            .any(|w| w.address == r.addr && w.port == r.port)
        {
            continue;
        }
        let rs_label = SocketText(r.addr, r.port).to_string();
        let conns = rs_connections(&act.dump, a, r);
        let weight = r.weight.unwrap_or(1);
        let actual = Some(format!(
            "weight {weight}, {}",
            conns.map_or("connections unknown".to_string(), |c| format!(
                "{c} connection(s)"
            ))
        ));
        let f = if weight != 0 {
            RS_STALE.finding(format!("{label}: real server {rs_label} is no endpoint of the service but has weight {weight}"))
        } else {
            match conns {
                Some(c) if c > 0 => RS_DRAINING.finding(format!("{label}: real server {rs_label} is draining ({c} connection(s))")),
                Some(_) => RS_ZERO_LEFTOVER.finding(format!("{label}: weight-0 real server {rs_label} has no connections left")),
                None => RS_ZERO_LEFTOVER.finding(format!(
                    "{label}: weight-0 real server {rs_label} is no endpoint (the dump has no connection counters; collect ipvsadm -Ln)"
                )),
            }
        };
        out.push(with(
            f,
            svc,
            Some(label.to_string()),
            Some("absent".into()),
            actual,
        ));
    }
}

/// Compares the ipsets (members canonicalised, order ignored) and the kube-ipvs0 addresses.
fn verify_sets(exp: &ExpectedIpvs, act: &ActualIpvs<'_>, out: &mut Vec<Finding>) {
    if let Some(actual_sets) = &act.ipsets {
        for d in sets::ALL {
            let name = d.name(exp.ip_family);
            let want: BTreeSet<String> = exp
                .ipsets
                .get(&name)
                .into_iter()
                .flatten()
                .map(|e| ipset::canonical_member(d.set_type, e))
                .collect();
            let Some(set) = actual_sets.iter().find(|s| s.name == name) else {
                out.push(with(
                    IPSET_MISSING.finding(format!("ipset {name} does not exist")),
                    None,
                    Some(name.clone()),
                    Some(format!("{} with {} entries", d.set_type, want.len())),
                    Some("absent".into()),
                ));
                continue;
            };
            let have: BTreeSet<String> = set.entries.iter().map(|e| e.member.to_string()).collect();
            for m in want.difference(&have) {
                out.push(with(
                    IPSET_ENTRY_MISSING.finding(format!("ipset {name} lacks {m}")),
                    None,
                    Some(name.clone()),
                    Some(m.clone()),
                    Some("absent".into()),
                ));
            }
            for m in have.difference(&want) {
                out.push(with(
                    IPSET_ENTRY_STALE
                        .finding(format!("ipset {name} has {m}, which no service implies")),
                    None,
                    Some(name.clone()),
                    Some("absent".into()),
                    Some(m.clone()),
                ));
            }
        }
    }
    if let Some(addrs) = &act.kube_ipvs0 {
        let have: BTreeSet<IpAddr> = addrs
            .iter()
            .copied()
            .filter(|a| in_family(a, exp.ip_family))
            .collect();
        let want: BTreeSet<IpAddr> = exp.kube_ipvs0_addresses.iter().copied().collect();
        for a in want.difference(&have) {
            out.push(with(
                IPVS0_ADDR_MISSING.finding(format!("{a} is not bound to kube-ipvs0")),
                None,
                Some("kube-ipvs0".into()),
                Some(a.to_string()),
                Some("absent".into()),
            ));
        }
        for a in have.difference(&want) {
            out.push(with(
                IPVS0_ADDR_STALE
                    .finding(format!("kube-ipvs0 carries {a}, which no service implies")),
                None,
                Some("kube-ipvs0".into()),
                Some("absent".into()),
                Some(a.to_string()),
            ));
        }
    }
}

/// Splits an iptables rule line into arguments, honouring double quotes.
fn split_args(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut in_q = false;
    let mut has = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                in_q = !in_q;
                has = true;
            }
            '\\' if in_q => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() && !in_q => {
                if has {
                    out.push(std::mem::take(&mut cur));
                    has = false;
                }
            }
            c => {
                cur.push(c);
                has = true;
            }
        }
    }
    if has {
        out.push(cur);
    }
    out
}

fn hex_norm(v: &str) -> String {
    v.split('/')
        .map(|p| {
            match p
                .strip_prefix("0x")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
            {
                Some(n) => format!("{n:#x}"),
                None => p.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

fn with_prefix(a: &str) -> String {
    if a.contains('/') {
        a.to_string()
    } else if a.contains(':') {
        format!("{a}/128")
    } else {
        format!("{a}/32")
    }
}

/// Canonical text of a rule body (after `-A CHAIN`), applying the normalisations `iptables-save`
/// makes to what the IPVS proxier writes: basic matches first (`-s -d -i -o -p`), addresses with prefix, marks unpadded,
/// `--or-mark`/`--xor-mark` as `--set-xmark`, REJECT with its default `--reject-with`, ipvs match values.
pub fn canonical_rule(body: &[String], family: IpFamily) -> String {
    let order = |f: &str| match f {
        "-s" | "--source" => Some(0),
        "-d" | "--destination" => Some(1),
        "-i" | "--in-interface" => Some(2),
        "-o" | "--out-interface" => Some(3),
        "-p" | "--protocol" => Some(4),
        _ => None,
    };
    let mut basics: Vec<(usize, String)> = Vec::new();
    let mut rest: Vec<String> = Vec::new();
    let mut i = 0;
    while i < body.len() {
        let (neg, f) = if body[i] == "!" && body.get(i + 1).is_some_and(|n| order(n).is_some()) {
            (true, &body[i + 1])
        } else {
            (false, &body[i])
        };
        if let Some(o) = order(f) {
            let vi = i + if neg { 2 } else { 1 };
            let v = body.get(vi).cloned().unwrap_or_default();
            let v = if o <= 1 {
                with_prefix(&v)
            } else if o == 4 {
                v.to_ascii_lowercase()
            } else {
                v
            };
            let flag = ["-s", "-d", "-i", "-o", "-p"][o];
            basics.push((o, format!("{}{flag} {v}", if neg { "! " } else { "" })));
            i = vi + 1;
            continue;
        }
        let t = body[i].as_str();
        let next = body.get(i + 1).map(String::as_str).unwrap_or("");
        match t {
            "--mark" | "--set-xmark" => {
                rest.push(t.into());
                rest.push(hex_norm(next));
                i += 2;
            }
            "--or-mark" => {
                let m = hex_norm(next);
                rest.push("--set-xmark".into());
                rest.push(format!("{m}/{m}"));
                i += 2;
            }
            "--xor-mark" => {
                rest.push("--set-xmark".into());
                rest.push(format!("{}/0x0", hex_norm(next)));
                i += 2;
            }
            "--vaddr" => {
                rest.push(t.into());
                rest.push(with_prefix(next));
                i += 2;
            }
            "--vproto" => {
                rest.push(t.into());
                rest.push(match next {
                    "tcp" => "6".into(),
                    "udp" => "17".into(),
                    "sctp" => "132".into(),
                    o => o.into(),
                });
                i += 2;
            }
            _ => {
                rest.push(if t.contains(' ') {
                    format!("\"{t}\"")
                } else {
                    t.to_string()
                });
                i += 1;
            }
        }
    }
    // The ipvs match's options print in the extension's own order (`--vproto … --vaddr …`): sort them.
    if let Some(at) = rest.windows(2).position(|w| w[0] == "-m" && w[1] == "ipvs") {
        let start = at + 2;
        let mut end = start;
        while end + 1 < rest.len() && rest[end].starts_with("--v") {
            end += 2;
        }
        let mut pairs: Vec<(String, String)> = rest[start..end]
            .chunks(2)
            .map(|c| (c[0].clone(), c.get(1).cloned().unwrap_or_default()))
            .collect();
        pairs.sort();
        let flat: Vec<String> = pairs.into_iter().flat_map(|(a, b)| [a, b]).collect();
        rest.splice(start..end, flat);
    }
    if rest.last().is_some_and(|l| l == "REJECT") {
        rest.push("--reject-with".into());
        rest.push(
            if family == IpFamily::V6 {
                "icmp6-port-unreachable"
            } else {
                "icmp-port-unreachable"
            }
            .into(),
        );
    }
    basics.sort_by_key(|b| b.0);
    basics
        .into_iter()
        .map(|b| b.1)
        .chain(rest)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `table → chain → canonical rules` of an iptables-save / restore text (declared chains get an entry).
pub fn chains_of(text: &str, family: IpFamily) -> BTreeMap<(String, String), Vec<String>> {
    let mut m: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut table = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(t) = line.strip_prefix('*') {
            table = t.to_string();
        } else if let Some(c) = line.strip_prefix(':') {
            let name = c.split_whitespace().next().unwrap_or("").to_string();
            m.entry((table.clone(), name)).or_default();
        } else if line.starts_with("-A ") || line.starts_with("-I ") {
            let args = split_args(line);
            if let Some(chain) = args.get(1) {
                let body: Vec<String> = args.iter().skip(2).cloned().collect();
                m.entry((table.clone(), chain.clone()))
                    .or_default()
                    .push(canonical_rule(&body, family));
            }
        }
    }
    m
}

const IPTABLES_MODE_PREFIXES: &[&str] = &[
    "KUBE-SVC-",
    "KUBE-SEP-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SVL-",
    "KUBE-XLB-",
];
const IPTABLES_MODE_CHAINS: &[&str] = &[
    "KUBE-NODEPORTS",
    "KUBE-PROXY-CANARY",
    "KUBE-EXTERNAL-SERVICES",
];

/// True for a chain only kube-proxy's iptables mode creates.
pub fn is_iptables_mode_chain(name: &str) -> bool {
    IPTABLES_MODE_PREFIXES.iter().any(|p| name.starts_with(p))
        || IPTABLES_MODE_CHAINS.contains(&name)
}

/// Compares kube-proxy's IPVS-mode chains and jumps, and looks for iptables-mode leftovers.
fn verify_iptables(exp: &ExpectedIpvs, save: &str, out: &mut Vec<Finding>) {
    let fam = exp.ip_family;
    let want = chains_of(&exp.iptables, fam);
    let have = chains_of(save, fam);
    for ((table, chain), rules) in &want {
        let label = format!("{table}/{chain}");
        let Some(actual) = have.get(&(table.clone(), chain.clone())) else {
            out.push(with(
                IPT_RULE_MISSING.finding(format!("chain {label} is missing")),
                None,
                Some(label),
                Some(format!("{} rule(s)", rules.len())),
                Some("absent".into()),
            ));
            continue;
        };
        let mut remaining = actual.clone();
        for r in rules {
            match remaining.iter().position(|a| a == r) {
                Some(p) => {
                    remaining.remove(p);
                }
                None => out.push(with(
                    IPT_RULE_MISSING.finding(format!("{label} lacks: -A {chain} {r}")),
                    None,
                    Some(label.clone()),
                    Some(r.clone()),
                    Some("absent".into()),
                )),
            }
        }
        for r in remaining {
            out.push(with(
                IPT_RULE_EXTRA.finding(format!(
                    "{label} has a rule kube-proxy would not write: -A {chain} {r}"
                )),
                None,
                Some(label.clone()),
                Some("absent".into()),
                Some(r),
            ));
        }
    }
    for (table, from, to, comment) in ipvs_rules::JUMPS {
        let rule = canonical_rule(
            &split_args(&format!("-m comment --comment \"{comment}\" -j {to}")),
            fam,
        );
        let present = have
            .get(&((*table).to_string(), (*from).to_string()))
            .is_some_and(|r| r.contains(&rule));
        if !present {
            out.push(with(
                IPT_RULE_MISSING.finding(format!("{table}/{from} lacks the jump to {to}")),
                None,
                Some(format!("{table}/{from}")),
                Some(rule),
                Some("absent".into()),
            ));
        }
    }
    let leftovers: Vec<String> = have
        .keys()
        .filter(|(_, c)| is_iptables_mode_chain(c))
        .map(|(t, c)| format!("{t}/{c}"))
        .collect();
    if !leftovers.is_empty() {
        let shown: Vec<&str> = leftovers.iter().take(5).map(String::as_str).collect();
        out.push(with(
            IPTABLES_MODE_LEFTOVER.finding(format!(
                "{} iptables-mode chain(s) present: {}",
                leftovers.len(),
                shown.join(", ")
            )),
            None,
            None,
            Some("none".into()),
            Some(leftovers.join(", ")),
        ));
    }
}

/// Compares everything the actual dumps hold with what kube-proxy should have installed.
/// Findings are sorted by (severity, id, chain, message).
pub fn verify(expected: &ExpectedIpvs, actual: &ActualIpvs<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    if !actual.dump.listings.is_empty() {
        verify_table(expected, actual, &mut out);
    }
    verify_sets(expected, actual, &mut out);
    if let Some(save) = actual.iptables_save {
        verify_iptables(expected, save, &mut out);
    }
    if let Some(t) = actual.dump.timeouts {
        let have = [t.tcp, t.tcp_fin, t.udp];
        let names = ["tcp", "tcpfin", "udp"];
        for i in 0..3 {
            let want = expected.timeouts[i];
            if want > 0 && u64::try_from(have[i]).ok() != Some(want) {
                out.push(with(
                    TIMEOUTS.finding(format!(
                        "IPVS {} timeout is {}s, configured {want}s",
                        names[i], have[i]
                    )),
                    None,
                    None,
                    Some(format!("{want}")),
                    Some(format!("{}", have[i])),
                ));
            }
        }
    }
    out.sort_by(|a, b| {
        (a.severity, a.id, &a.chain, &a.message).cmp(&(b.severity, b.id, &b.chain, &b.message))
    });
    out
}

/// A KP523 finding when the configured mode (kube-proxy's default when none is configured)
/// and the one the node's dumps show disagree.
pub fn mode_finding(configured: ProxyMode, node: ProxyMode) -> Option<Finding> {
    (configured != node).then(|| {
        with(
            MODE_MISMATCH.finding(format!("kube-proxy is configured for mode {configured}, but the node's dumps show {node} mode")),
            None,
            None,
            Some(configured.to_string()),
            Some(node.to_string()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::Severity;

    #[test]
    fn ids_unique_sorted_documented() {
        for w in CHECKS.windows(2) {
            assert!(w[0].id < w[1].id);
        }
        let docs = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/findings.md"
        ))
        .unwrap_or_default();
        for c in CHECKS {
            let sev = match c.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
                Severity::Info => "info",
            };
            let needle = format!("| {} | {sev} |", c.id);
            assert!(docs.contains(&needle), "docs/findings.md lacks `{needle}`");
        }
    }

    #[test]
    fn save_normalisation_matches_restore_text() {
        let restore = [
            "-A KUBE-POSTROUTING -j MARK --xor-mark 0x004000",
            "-A KUBE-MARK-MASQ -j MARK --or-mark 0x004000",
            "-A KUBE-SERVICES -m comment --comment \"x y\" -m set --match-set KUBE-CLUSTER-IP dst,dst ! -s 10.244.0.0/16 -j KUBE-MARK-MASQ",
            "-A KUBE-IPVS-OUT-FILTER -s 1.2.3.4 -m ipvs --vaddr 1.2.3.4 --vproto tcp --vport 80 -j DROP",
            "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT",
        ];
        let saved = [
            "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
            "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
            "-A KUBE-SERVICES ! -s 10.244.0.0/16 -m comment --comment \"x y\" -m set --match-set KUBE-CLUSTER-IP dst,dst -j KUBE-MARK-MASQ",
            "-A KUBE-IPVS-OUT-FILTER -s 1.2.3.4/32 -m ipvs --vproto 6 --vaddr 1.2.3.4/32 --vport 80 -j DROP",
            "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set KUBE-IPVS-IPS dst -j REJECT --reject-with icmp-port-unreachable",
        ];
        for (r, s) in restore.iter().zip(saved.iter()) {
            let a = split_args(r);
            let b = split_args(s);
            assert_eq!(
                canonical_rule(&a[2..], IpFamily::V4),
                canonical_rule(&b[2..], IpFamily::V4),
                "{r}"
            );
        }
    }

    #[test]
    fn a_left_out_services_virtual_servers_addresses_and_entries_are_taken_out() {
        let dir = "testdata/ipvs/example-cluster";
        let ipvsadm = crate::compare::fixture::read(&format!("{dir}/ipvsadm-Ln.txt"));
        let ipset_text = crate::compare::fixture::read(&format!("{dir}/ipset-save.txt"));
        let addr = crate::compare::fixture::read(&format!("{dir}/ip-addr-kube-ipvs0.txt"));
        let actual = ActualIpvs {
            dump: kproxy_parsers::ipvsadm::parse_dump(&ipvsadm).expect("ipvsadm"),
            ipsets: Some(ipset::parse_ipset(&ipset_text).expect("ipset")),
            iptables_save: None,
            kube_ipvs0: Some(kproxy_parsers::ip_addr::interface_addresses(
                &addr,
                "kube-ipvs0",
            )),
        };
        let dns = LeftOutService {
            service: "kube-system/kube-dns".into(),
            ports: Vec::new(),
            cluster_ips: vec!["10.96.0.10".into()],
        };
        let (kept, counts) = without_left_out(&actual, std::slice::from_ref(&dns));
        let dns_ip: IpAddr = "10.96.0.10".parse().expect("ip");
        let at = |a: &ActualIpvs<'_>| {
            a.dump
                .merged_services()
                .iter()
                .filter(|vs| matches!(vs.key, ServiceKey::Inet { addr, .. } if addr == dns_ip))
                .count()
        };
        let (vs_before, vs_after) = (at(&actual), at(&kept));
        assert!(vs_before >= 3, "{vs_before}");
        assert_eq!(vs_after, 0);
        let services = |a: &ActualIpvs<'_>| a.dump.merged_services().len();
        assert_eq!(services(&kept), services(&actual) - vs_before);
        let entries = |a: &ActualIpvs<'_>| {
            a.ipsets
                .iter()
                .flatten()
                .flat_map(|s| &s.entries)
                .filter(|e| e.text.starts_with("10.96.0.10"))
                .count()
        };
        assert!(entries(&actual) >= 4);
        assert_eq!(entries(&kept), 0);
        let addresses = |a: &ActualIpvs<'_>| a.kube_ipvs0.as_ref().map(Vec::len).unwrap_or(0);
        assert_eq!(addresses(&kept), addresses(&actual) - 1);
        // The hairpin members of kube-dns's endpoint go with it.
        let all = |a: &ActualIpvs<'_>| {
            a.ipsets
                .iter()
                .flatten()
                .map(|s| s.entries.len())
                .sum::<usize>()
        };
        let hairpins = all(&actual) - all(&kept) - entries(&actual);
        assert_eq!(hairpins, 3);
        assert!(
            kept.ipsets
                .iter()
                .flatten()
                .flat_map(|s| &s.entries)
                .all(|e| !e.text.starts_with("10.244.1.3,"))
        );
        assert_eq!(
            counts,
            [NotChecked {
                service: dns.service.clone(),
                chains: 0,
                objects: vs_before + entries(&actual) + hairpins + 1,
            }]
        );
        // A NodePort is matched by port and protocol on any address.
        let np = LeftOutService {
            service: "shop/web-nodeport".into(),
            ports: vec![crate::compare::left_out::WrittenPort {
                name: "http".into(),
                protocol: "TCP".into(),
                port: Some(80),
                node_port: Some(30080),
            }],
            cluster_ips: Vec::new(),
        };
        let (kept, _) = without_left_out(&actual, &[np]);
        assert!(
            kept.dump
                .merged_services()
                .iter()
                .all(|vs| !matches!(vs.key, ServiceKey::Inet { port: 30080, .. }))
        );
        assert!(services(&kept) < services(&actual));
    }
}
