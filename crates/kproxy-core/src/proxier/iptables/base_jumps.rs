//! The jump rules kube-proxy ensures in built-in chains (`proxier.go` `iptablesJumpChains`,
//! `syncProxyRules`), added to a render so it restores on its own into a fresh namespace.

use super::emit::Line;
use super::rendered::{RenderedTable, TextBuf};
use crate::state::version::KubeProxyVersion;
use std::fmt::Write as _;

/// The jump rules kube-proxy ensures in built-in chains (`proxier.go` `iptablesJumpChains`), in
/// final top-of-chain order
/// on a fresh node: `(table, chain, extra args, comment, target)`.
pub const BASE_JUMPS: &[(&str, &str, &str, &str, &str)] = &[
    ("filter", "INPUT", "", "", "KUBE-FIREWALL"),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW",
        "kubernetes load balancer firewall",
        "KUBE-PROXY-FIREWALL",
    ),
    (
        "filter",
        "INPUT",
        "",
        "kubernetes health check service ports",
        "KUBE-NODEPORTS",
    ),
    (
        "filter",
        "INPUT",
        "-m conntrack --ctstate NEW",
        "kubernetes externally-visible service portals",
        "KUBE-EXTERNAL-SERVICES",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW",
        "kubernetes load balancer firewall",
        "KUBE-PROXY-FIREWALL",
    ),
    (
        "filter",
        "FORWARD",
        "",
        "kubernetes forwarding rules",
        "KUBE-FORWARD",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW",
        "kubernetes service portals",
        "KUBE-SERVICES",
    ),
    (
        "filter",
        "FORWARD",
        "-m conntrack --ctstate NEW",
        "kubernetes externally-visible service portals",
        "KUBE-EXTERNAL-SERVICES",
    ),
    ("filter", "OUTPUT", "", "", "KUBE-FIREWALL"),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW",
        "kubernetes load balancer firewall",
        "KUBE-PROXY-FIREWALL",
    ),
    (
        "filter",
        "OUTPUT",
        "-m conntrack --ctstate NEW",
        "kubernetes service portals",
        "KUBE-SERVICES",
    ),
    (
        "nat",
        "PREROUTING",
        "",
        "kubernetes service portals",
        "KUBE-SERVICES",
    ),
    (
        "nat",
        "OUTPUT",
        "",
        "kubernetes service portals",
        "KUBE-SERVICES",
    ),
    (
        "nat",
        "POSTROUTING",
        "",
        "kubernetes postrouting rules",
        "KUBE-POSTROUTING",
    ),
];

const BUILTIN_CHAINS: &[(&str, &[&str])] = &[
    ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
    ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
    (
        "mangle",
        &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    ),
];

/// The release from which kube-proxy ensures a base jump to `target`.
fn base_jump_since(target: &str) -> KubeProxyVersion {
    let minor = match target {
        "KUBE-NODEPORTS" => 21,
        "KUBE-PROXY-FIREWALL" => 25,
        "KUBE-FIREWALL" => 27,
        _ => return KubeProxyVersion::OLDEST,
    };
    KubeProxyVersion::of_minor(minor).unwrap_or(KubeProxyVersion::OLDEST)
}

pub(super) fn add_base_jumps(
    tables: &mut Vec<RenderedTable>,
    kube_firewall_declared: bool,
    version: KubeProxyVersion,
) {
    tables.push(RenderedTable::new("mangle"));
    for t in tables.iter_mut() {
        let mut chains = String::new();
        let mut rules = TextBuf::default();
        for (table, builtins) in BUILTIN_CHAINS {
            if *table == t.name {
                for b in *builtins {
                    let _ = writeln!(chains, ":{b} ACCEPT [0:0]");
                }
            }
        }
        chains.push_str(":KUBE-PROXY-CANARY - [0:0]\n");
        if t.name == "filter" && !kube_firewall_declared && version.writes_kube_firewall() {
            chains.push_str(":KUBE-FIREWALL - [0:0]\n");
        }
        if t.name == "nat" && !version.drops_in_filter_table() {
            // Ensured (empty) by kube-proxy for its drop jumps; kubelet fills it.
            chains.push_str(":KUBE-MARK-DROP - [0:0]\n");
        }
        for (table, chain, extra, comment, target) in BASE_JUMPS {
            if *table != t.name || version < base_jump_since(target) {
                continue;
            }
            let mut l = Line::start(&mut rules, chain);
            if !extra.is_empty() {
                l = l.w(extra);
            }
            if !comment.is_empty() {
                l = l.comment_q(&[comment]);
            }
            l.ws(&["-j", target]).end();
        }
        t.chain_lines.prepend(chains);
        t.rule_lines.prepend(rules.current);
    }
}
