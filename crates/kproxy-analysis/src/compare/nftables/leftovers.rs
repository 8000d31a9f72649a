//! The other modes' state on an nftables-mode node: iptables-mode kube-proxy chains (in an
//! `iptables-save`, or in the iptables-nft tables of an `nft list ruleset`) and IPVS virtual
//! servers and `KUBE-*` ipsets. kube-proxy removes them when it starts in nftables mode
//! (`CleanupLeftovers`); when it did not, both modes' rules see the packets.

use super::{IPTABLES_LEFTOVER, IPVS_LEFTOVER, NftText};
use crate::compare::finding::Finding;
use kproxy_parsers::nft::Ruleset;

/// kube-proxy's iptables-mode chains that kubelet creates too (its `KUBE-FIREWALL` and
/// `KUBE-MARK-DROP`): not a sign of iptables mode.
const KUBELET_CHAINS: &[&str] = &["KUBE-FIREWALL", "KUBE-MARK-DROP"];

/// Whether `chain` in `table` is one of iptables-mode kube-proxy's.
fn is_leftover(table: &str, chain: &str) -> bool {
    crate::graph::ownership::is_kube_proxy_chain(table, chain) && !KUBELET_CHAINS.contains(&chain)
}

/// Summarises chains found: `KUBE-SERVICES, KUBE-SVC-… and 40 more`.
fn summary(chains: &[String]) -> String {
    let shown: Vec<&str> = chains.iter().take(5).map(String::as_str).collect();
    let mut s = shown.join(", ");
    if chains.len() > shown.len() {
        s.push_str(&format!(" and {} more", chains.len() - shown.len()));
    }
    s
}

/// KP708 for each `iptables-save` output holding iptables-mode kube-proxy chains.
pub fn iptables_leftovers(dumps: &[NftText<'_>]) -> Vec<Finding> {
    let mut out = Vec::new();
    for d in dumps {
        let mut table = "";
        let mut chains: Vec<String> = Vec::new();
        let mut rules = 0usize;
        for line in d.text.lines() {
            let line = line.trim_end();
            if let Some(t) = line.strip_prefix('*') {
                table = t;
            } else if let Some(decl) = line.strip_prefix(':') {
                let chain = decl.split_whitespace().next().unwrap_or("");
                if is_leftover(table, chain) {
                    chains.push(format!("{table} {chain}"));
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let chain = rule.split_whitespace().next().unwrap_or("");
                if is_leftover(table, chain) {
                    rules += 1;
                }
            }
        }
        if chains.is_empty() {
            continue;
        }
        out.push(
            IPTABLES_LEFTOVER
                .finding(format!(
                    "{}: {} iptables-mode kube-proxy chain(s) with {rules} rule(s) although kube-proxy runs in nftables mode",
                    d.label,
                    chains.len()
                ))
                .chain(d.label.to_string())
                .expected("no iptables-mode kube-proxy chains")
                .actual(summary(&chains)),
        );
    }
    out
}

/// KP708 for iptables-nft tables of an `nft list ruleset` that hold kube-proxy's iptables-mode
/// chains (when no `iptables-save` was given: that would report the same chains).
pub fn iptables_nft_tables(rulesets: &[Ruleset<'_>]) -> Vec<Finding> {
    let mut out = Vec::new();
    for t in rulesets.iter().flat_map(|r| &r.tables) {
        if t.name == crate::proxier::nftables::names::TABLE {
            continue;
        }
        let chains: Vec<String> = t
            .chains
            .iter()
            .filter(|c| is_leftover(&t.name, &c.name))
            .map(|c| c.name.to_string())
            .collect();
        if chains.is_empty() {
            continue;
        }
        let rules: usize = t
            .chains
            .iter()
            .filter(|c| is_leftover(&t.name, &c.name))
            .map(|c| c.rules.len())
            .sum();
        let name = format!("table {} {}", t.family, t.name);
        out.push(
            IPTABLES_LEFTOVER
                .finding(format!(
                    "{name}: {} iptables-mode kube-proxy chain(s) with {rules} rule(s) although kube-proxy runs in nftables mode",
                    chains.len()
                ))
                .chain(name)
                .expected("no iptables-mode kube-proxy chains")
                .actual(summary(&chains)),
        );
    }
    out
}

/// KP709 when `ipvsadm -Ln` lists virtual servers or `ipset save` holds kube-proxy's sets.
pub fn ipvs_leftovers(ipvsadm: Option<&str>, ipset: Option<&str>) -> Vec<Finding> {
    let servers = ipvsadm.map_or(0, |t| {
        t.lines()
            .filter(|l| l.starts_with("TCP ") || l.starts_with("UDP ") || l.starts_with("SCTP "))
            .count()
    });
    let sets: Vec<String> = ipset
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix("create "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|s| s.starts_with("KUBE-"))
        .map(str::to_string)
        .collect();
    if servers == 0 && sets.is_empty() {
        return Vec::new();
    }
    let mut what = Vec::new();
    if servers > 0 {
        what.push(format!("{servers} IPVS virtual server(s)"));
    }
    if !sets.is_empty() {
        what.push(format!("ipsets {}", summary(&sets)));
    }
    vec![
        IPVS_LEFTOVER
            .finding(format!(
                "IPVS-mode state although kube-proxy runs in nftables mode: {}",
                what.join("; ")
            ))
            .chain("ipvs")
            .expected("no IPVS virtual servers or KUBE-* ipsets")
            .actual(what.join("; ")),
    ]
}
