//! The iptables-restore payload of kube-proxy's IPVS proxier (`pkg/proxy/ipvs/proxier.go` `writeIptablesRules`): owned chains of the nat
//! and filter tables, set-driven rules for the non-empty ipsets, in kube-proxy's order.

use super::sets::{self, SetDef};
use crate::state::ip::IpFamily;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

/// nat chains kube-proxy declares (and so flushes) at every sync.
pub const NAT_CHAINS: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-POSTROUTING",
    "KUBE-NODE-PORT",
    "KUBE-LOAD-BALANCER",
    "KUBE-MARK-MASQ",
];
/// filter chains kube-proxy declares at every sync.
pub const FILTER_CHAINS: &[&str] = &[
    "KUBE-FORWARD",
    "KUBE-NODE-PORT",
    "KUBE-PROXY-FIREWALL",
    "KUBE-SOURCE-RANGES-FIREWALL",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// Jump rules kube-proxy inserts into built-in chains (`pkg/proxy/ipvs/proxier.go` `iptablesJumpChain`): (table, from, to, comment).
pub const JUMPS: &[(&str, &str, &str, &str)] = &[
    (
        "nat",
        "OUTPUT",
        "KUBE-SERVICES",
        "kubernetes service portals",
    ),
    (
        "nat",
        "PREROUTING",
        "KUBE-SERVICES",
        "kubernetes service portals",
    ),
    (
        "nat",
        "POSTROUTING",
        "KUBE-POSTROUTING",
        "kubernetes postrouting rules",
    ),
    (
        "filter",
        "FORWARD",
        "KUBE-FORWARD",
        "kubernetes forwarding rules",
    ),
    (
        "filter",
        "INPUT",
        "KUBE-NODE-PORT",
        "kubernetes health check rules",
    ),
    (
        "filter",
        "INPUT",
        "KUBE-PROXY-FIREWALL",
        "kube-proxy firewall rules",
    ),
    (
        "filter",
        "FORWARD",
        "KUBE-PROXY-FIREWALL",
        "kube-proxy firewall rules",
    ),
    (
        "filter",
        "INPUT",
        "KUBE-IPVS-FILTER",
        "kubernetes ipvs access filter",
    ),
    (
        "filter",
        "OUTPUT",
        "KUBE-IPVS-OUT-FILTER",
        "kubernetes ipvs access filter",
    ),
];

/// How the KUBE-CLUSTER-IP masquerade rule tells local traffic (`writeIptablesRules`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalDetector {
    /// `iptables.masqueradeAll`.
    MasqueradeAll,
    /// `! -s CIDR` (ClusterCIDR or NodeCIDR mode) or `! -i IFACE` (bridge / prefix mode): the match text.
    NotLocal(String),
    /// No detector: `src,dst`.
    None,
}

/// Everything the rule text depends on.
#[derive(Debug, Clone)]
pub struct RuleInputs<'a> {
    /// Proxier family.
    pub family: IpFamily,
    /// Set contents by base name (only emptiness matters here).
    pub sets: &'a BTreeMap<&'static str, Vec<String>>,
    /// The local-traffic detector.
    pub detector: LocalDetector,
    /// Masquerade mark, formatted like kube-proxy (`0x004000`).
    pub mark: String,
    /// Whether iptables supports `--random-fully`.
    pub random_fully: bool,
    /// LB VIPs whose source ranges exclude the node: (vip, lower-case protocol, port).
    pub out_filter: &'a [(IpAddr, &'static str, u16)],
}

fn non_empty(inp: &RuleInputs<'_>, d: &SetDef) -> bool {
    inp.sets.get(d.base).is_some_and(|v| !v.is_empty())
}

fn set_rule(
    out: &mut String,
    inp: &RuleInputs<'_>,
    chain: &str,
    proto: Option<&str>,
    d: &SetDef,
    dirs: &str,
    tail: &str,
) {
    let _ = write!(out, "-A {chain}");
    if let Some(p) = proto {
        let _ = write!(out, " -p {p}");
    }
    let _ = writeln!(
        out,
        " -m comment --comment \"{}\" -m set --match-set {} {dirs} {tail}",
        d.comment,
        d.name(inp.family)
    );
}

/// The restore payload (nat then filter), exactly as kube-proxy writes it.
pub fn render(inp: &RuleInputs<'_>) -> String {
    let mut o = String::new();
    let fam = inp.family;
    let n = |d: &SetDef| d.name(fam);
    o.push_str("*nat\n");
    for c in NAT_CHAINS {
        let _ = writeln!(o, ":{c} - [0:0]");
    }
    let lo = if fam == IpFamily::V6 {
        "::1/128"
    } else {
        "127.0.0.0/8"
    };
    let _ = writeln!(o, "-A KUBE-SERVICES -s {lo} -j RETURN");
    let set_driven: &[(&SetDef, &str, &str, &str, Option<&str>)] = &[
        (
            &sets::LOOP_BACK,
            "KUBE-POSTROUTING",
            "MASQUERADE",
            "dst,dst,src",
            None,
        ),
        (
            &sets::LOAD_BALANCER,
            "KUBE-SERVICES",
            "KUBE-LOAD-BALANCER",
            "dst,dst",
            None,
        ),
        (
            &sets::LOAD_BALANCER_LOCAL,
            "KUBE-LOAD-BALANCER",
            "RETURN",
            "dst,dst",
            None,
        ),
        (
            &sets::NODE_PORT_LOCAL_TCP,
            "KUBE-NODE-PORT",
            "RETURN",
            "dst",
            Some("tcp"),
        ),
        (
            &sets::NODE_PORT_TCP,
            "KUBE-NODE-PORT",
            "KUBE-MARK-MASQ",
            "dst",
            Some("tcp"),
        ),
        (
            &sets::NODE_PORT_LOCAL_UDP,
            "KUBE-NODE-PORT",
            "RETURN",
            "dst",
            Some("udp"),
        ),
        (
            &sets::NODE_PORT_UDP,
            "KUBE-NODE-PORT",
            "KUBE-MARK-MASQ",
            "dst",
            Some("udp"),
        ),
        (
            &sets::NODE_PORT_LOCAL_SCTP,
            "KUBE-NODE-PORT",
            "RETURN",
            "dst,dst",
            Some("sctp"),
        ),
        (
            &sets::NODE_PORT_SCTP,
            "KUBE-NODE-PORT",
            "KUBE-MARK-MASQ",
            "dst,dst",
            Some("sctp"),
        ),
    ];
    for (d, chain, target, dirs, proto) in set_driven {
        if non_empty(inp, d) {
            set_rule(&mut o, inp, chain, *proto, d, dirs, &format!("-j {target}"));
        }
    }
    if non_empty(inp, &sets::CLUSTER_IP) {
        let d = &sets::CLUSTER_IP;
        match &inp.detector {
            LocalDetector::MasqueradeAll => set_rule(
                &mut o,
                inp,
                "KUBE-SERVICES",
                None,
                d,
                "dst,dst",
                "-j KUBE-MARK-MASQ",
            ),
            LocalDetector::NotLocal(m) => set_rule(
                &mut o,
                inp,
                "KUBE-SERVICES",
                None,
                d,
                "dst,dst",
                &format!("{m} -j KUBE-MARK-MASQ"),
            ),
            LocalDetector::None => set_rule(
                &mut o,
                inp,
                "KUBE-SERVICES",
                None,
                d,
                "src,dst",
                "-j KUBE-MARK-MASQ",
            ),
        }
    }
    let accept_ext = |o: &mut String, d: &SetDef| {
        set_rule(
            o,
            inp,
            "KUBE-SERVICES",
            None,
            d,
            "dst,dst",
            "-m physdev ! --physdev-is-in -m addrtype ! --src-type LOCAL -j ACCEPT",
        );
        set_rule(
            o,
            inp,
            "KUBE-SERVICES",
            None,
            d,
            "dst,dst",
            "-m addrtype --dst-type LOCAL -j ACCEPT",
        );
    };
    if non_empty(inp, &sets::EXTERNAL_IP) {
        set_rule(
            &mut o,
            inp,
            "KUBE-SERVICES",
            None,
            &sets::EXTERNAL_IP,
            "dst,dst",
            "-j KUBE-MARK-MASQ",
        );
        accept_ext(&mut o, &sets::EXTERNAL_IP);
    }
    if non_empty(inp, &sets::EXTERNAL_IP_LOCAL) {
        accept_ext(&mut o, &sets::EXTERNAL_IP_LOCAL);
    }
    o.push_str("-A KUBE-SERVICES -m addrtype --dst-type LOCAL -j KUBE-NODE-PORT\n");
    o.push_str("-A KUBE-LOAD-BALANCER -j KUBE-MARK-MASQ\n");
    if non_empty(inp, &sets::CLUSTER_IP) {
        let _ = writeln!(
            o,
            "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
            n(&sets::CLUSTER_IP)
        );
    }
    if non_empty(inp, &sets::LOAD_BALANCER) {
        let _ = writeln!(
            o,
            "-A KUBE-SERVICES -m set --match-set {} dst,dst -j ACCEPT",
            n(&sets::LOAD_BALANCER)
        );
    }
    let m = &inp.mark;
    let _ = writeln!(o, "-A KUBE-POSTROUTING -m mark ! --mark {m}/{m} -j RETURN");
    let _ = writeln!(o, "-A KUBE-POSTROUTING -j MARK --xor-mark {m}");
    let _ = writeln!(
        o,
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE{}",
        if inp.random_fully {
            " --random-fully"
        } else {
            ""
        }
    );
    let _ = writeln!(o, "-A KUBE-MARK-MASQ -j MARK --or-mark {m}");
    o.push_str("COMMIT\n*filter\n");
    for c in FILTER_CHAINS {
        let _ = writeln!(o, ":{c} - [0:0]");
    }
    let filter_sets: &[(&SetDef, &str, &str, &str)] = &[
        (
            &sets::LOAD_BALANCER_FW,
            "KUBE-PROXY-FIREWALL",
            "KUBE-SOURCE-RANGES-FIREWALL",
            "dst,dst",
        ),
        (
            &sets::LOAD_BALANCER_SOURCE_CIDR,
            "KUBE-SOURCE-RANGES-FIREWALL",
            "RETURN",
            "dst,dst,src",
        ),
        (
            &sets::LOAD_BALANCER_SOURCE_IP,
            "KUBE-SOURCE-RANGES-FIREWALL",
            "RETURN",
            "dst,dst,src",
        ),
    ];
    for (d, chain, target, dirs) in filter_sets {
        if non_empty(inp, d) {
            set_rule(&mut o, inp, chain, None, d, dirs, &format!("-j {target}"));
        }
    }
    o.push_str("-A KUBE-SOURCE-RANGES-FIREWALL -j DROP\n");
    for (vip, proto, port) in inp.out_filter {
        let _ = writeln!(
            o,
            "-A KUBE-IPVS-OUT-FILTER -s {vip} -m ipvs --vaddr {vip} --vproto {proto} --vport {port} -j DROP"
        );
    }
    let _ = writeln!(
        o,
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark {m}/{m} -j ACCEPT"
    );
    o.push_str("-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\n");
    let _ = writeln!(
        o,
        "-A KUBE-NODE-PORT -m comment --comment \"Kubernetes health check node port\" -m set --match-set {} dst -j ACCEPT",
        n(&sets::HEALTH_CHECK_NODE_PORT)
    );
    for (d, dirs) in [
        (&sets::LOAD_BALANCER, "dst,dst"),
        (&sets::CLUSTER_IP, "dst,dst"),
        (&sets::EXTERNAL_IP, "dst,dst"),
        (&sets::EXTERNAL_IP_LOCAL, "dst,dst"),
        (&sets::HEALTH_CHECK_NODE_PORT, "dst"),
    ] {
        let _ = writeln!(
            o,
            "-A KUBE-IPVS-FILTER -m set --match-set {} {dirs} -j RETURN",
            n(d)
        );
    }
    let _ = writeln!(
        o,
        "-A KUBE-IPVS-FILTER -m conntrack --ctstate NEW -m set --match-set {} dst -j REJECT",
        n(&sets::IPVS_IPS)
    );
    o.push_str("COMMIT\n");
    o
}
