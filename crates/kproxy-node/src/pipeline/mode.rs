//! Which proxy mode a node is in: the one place that weighs kube-proxy's configuration against
//! what the node's dumps show, for every command, with the reasons.
//!
//! Two questions, two rules:
//!
//! * [`for_verify`]: which mode's rules to check. Rules that clearly show another mode than the
//!   configured one are checked as what they are (the disagreement is a KP523 finding of the
//!   check): a report on rules nobody wrote would be all noise.
//! * [`for_writing`]: which mode's rules a repair or resync writes: what kube-proxy is
//!   configured for; only when its configuration names no mode, what this host holds. A write
//!   never follows what a node happens to hold against its configuration.
//!
//! In both, an input only one mode has (`verify --ipvsadm`, `repair --ipvsadm-save`, `repair
//! --nft-ruleset`) selects that mode: the user said which.

use crate::collect::{NodeSnapshot, holds_kube_proxy_table};
use crate::compare::ipvs::{chains_of, is_iptables_mode_chain};
use crate::state::ip::IpFamily;
use crate::state::mode::ProxyMode;
use kproxy_parsers::ipvsadm::IpvsDump;

/// A decided mode and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeDecision {
    /// The mode.
    pub mode: ProxyMode,
    /// Why, one clause each, in the order they were weighed (`configured nftables`, `the dumps
    /// show …`).
    pub reasons: Vec<String>,
}

impl ModeDecision {
    fn new(mode: ProxyMode, reasons: Vec<String>) -> ModeDecision {
        ModeDecision { mode, reasons }
    }

    /// `mode nftables: configured nftables; …`, for a note.
    pub fn note(&self) -> String {
        format!("mode {}: {}", self.mode, self.reasons.join("; "))
    }
}

/// An input given that only one mode has (`--ipvsadm FILE`, …): it selects that mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Given {
    /// The mode the input belongs to.
    pub mode: ProxyMode,
    /// The input, as the user named it (a flag).
    pub input: &'static str,
}

impl Given {
    fn decision(self) -> ModeDecision {
        ModeDecision::new(self.mode, vec![format!("{} given", self.input)])
    }
}

/// What the configuration says, as a reason.
fn configured_reason(configured: Option<ProxyMode>) -> String {
    match configured {
        Some(m) => format!("configured {m}"),
        None => "the configuration names no mode".to_string(),
    }
}

/// A node's dumps as [`for_verify`] looks at them: each look is made only when the decision
/// gets to it (some read a whole dump).
#[derive(Debug, Clone, Copy)]
pub struct Evidence<'a> {
    snapshot: &'a NodeSnapshot,
    listings: &'a [&'a str],
}

impl<'a> Evidence<'a> {
    /// The dumps of `snapshot`, and the nft listings to verify (`--nft-ruleset`, else the
    /// collected `nft list table` outputs).
    pub fn new(snapshot: &'a NodeSnapshot, listings: &'a [&'a str]) -> Evidence<'a> {
        Evidence { snapshot, listings }
    }

    /// The IPVS- or iptables-mode state the dumps hold, IPVS first (its nodes hold iptables
    /// rules too): IPVS virtual services or kube-proxy's ipsets; else `KUBE-SVC-`, `KUBE-SEP-`
    /// or `KUBE-SVL-` chains in an iptables dump of either backend.
    fn other_mode(&self) -> Option<ProxyMode> {
        let s = self.snapshot;
        let ipvs_services = s.ipvsadm.as_deref().is_some_and(|t| {
            t.lines()
                .any(|l| l.starts_with("TCP ") || l.starts_with("UDP ") || l.starts_with("SCTP "))
        });
        let ipvs_sets = s
            .ipset_save
            .as_deref()
            .is_some_and(|t| t.contains("create KUBE-CLUSTER-IP ") || t.contains("KUBE-IPVS"));
        if ipvs_services || ipvs_sets {
            return Some(ProxyMode::Ipvs);
        }
        [
            &s.iptables_save,
            &s.iptables_legacy_save,
            &s.iptables_nft_save,
        ]
        .into_iter()
        .flatten()
        .any(|t| t.contains(":KUBE-SVC-") || t.contains(":KUBE-SEP-") || t.contains(":KUBE-SVL-"))
        .then_some(ProxyMode::Iptables)
    }

    /// The reason nftables mode is (or is not) what the dumps show: no IPVS- or iptables-mode
    /// state besides it.
    fn no_other_mode(&self, reasons: &mut Vec<String>) -> bool {
        match self.other_mode() {
            Some(other) => {
                reasons.push(format!("the dumps show {other}-mode state"));
                false
            }
            None => {
                reasons.push("the dumps show no other mode's state".into());
                true
            }
        }
    }

    /// Whether the node's main iptables dump (`iptables-save`, else `ip6tables-save`) holds
    /// IPVS mode's rules and none of iptables mode's.
    fn ipvs_rules(&self) -> bool {
        let s = self.snapshot;
        s.iptables_save
            .as_deref()
            .or(s.ip6tables_save.as_deref())
            .is_some_and(|text| {
                names_ipvs(text) && rules_show(None, Some(text)) == Some(ProxyMode::Ipvs)
            })
    }
}

/// The mode whose rules `verify` checks (see the module docs): an input given; nftables when
/// the configuration says so (unless no listing was read and the dumps show another mode's
/// state), or says nothing while a listing holds kube-proxy's table and the dumps show no other
/// mode's state; IPVS when the main iptables dump holds IPVS mode's rules; else iptables.
pub fn for_verify(
    configured: Option<ProxyMode>,
    given: Option<Given>,
    dumps: &Evidence<'_>,
) -> ModeDecision {
    if let Some(g) = given {
        return g.decision();
    }
    let mut reasons = vec![configured_reason(configured)];
    let nftables = match configured {
        Some(ProxyMode::Nftables) if !dumps.listings.is_empty() => {
            reasons.push("an nft listing was read".into());
            true
        }
        Some(ProxyMode::Nftables) => dumps.no_other_mode(&mut reasons),
        None if dumps.listings.iter().any(|t| holds_kube_proxy_table(t)) => {
            reasons.push("an nft listing holds kube-proxy's table".into());
            dumps.no_other_mode(&mut reasons)
        }
        _ => false,
    };
    if nftables {
        return ModeDecision::new(ProxyMode::Nftables, reasons);
    }
    if dumps.ipvs_rules() {
        reasons.push("the iptables dump holds IPVS mode's rules".into());
        return ModeDecision::new(ProxyMode::Ipvs, reasons);
    }
    reasons.push("the iptables dump is checked as iptables mode's".into());
    ModeDecision::new(ProxyMode::Iptables, reasons)
}

/// The mode a repair or resync writes (see the module docs): an input given, else the
/// configured mode; when the configuration names none, nftables if `host_tables` (this host's
/// `nft list tables`, called only then; `None` when the host is not to be looked at) has
/// kube-proxy's table, else kube-proxy's default.
pub fn for_writing(
    configured: Option<ProxyMode>,
    given: Option<Given>,
    host_tables: impl FnOnce() -> Option<Vec<String>>,
) -> ModeDecision {
    if let Some(g) = given {
        return g.decision();
    }
    let mut reasons = vec![configured_reason(configured)];
    if let Some(m) = configured {
        return ModeDecision::new(m, reasons);
    }
    let table = host_tables().and_then(|tables| {
        tables
            .into_iter()
            .find(|t| t == "ip kube-proxy" || t == "ip6 kube-proxy")
    });
    match table {
        Some(t) => {
            reasons.push(format!("this host has table {t}"));
            ModeDecision::new(ProxyMode::Nftables, reasons)
        }
        None => {
            reasons.push(format!("kube-proxy's default is {}", ProxyMode::DEFAULT));
            ModeDecision::new(ProxyMode::DEFAULT, reasons)
        }
    }
}

/// The mode a command was told to work in (`render --mode`), and the configured mode it goes
/// against, if any.
pub fn asked(mode: ProxyMode, configured: Option<ProxyMode>) -> (ModeDecision, Option<ProxyMode>) {
    let against = configured.filter(|&c| c != mode);
    (
        ModeDecision::new(mode, vec!["--mode given".into()]),
        against,
    )
}

/// Whether an iptables dump names one of the chains or sets only IPVS mode's rules have (a
/// look at the text: without one, [`rules_show`] cannot say IPVS, and its read of the whole
/// dump is skipped).
fn names_ipvs(text: &str) -> bool {
    ["KUBE-IPVS-FILTER", "KUBE-CLUSTER-IP", "KUBE-LOOP-BACK"]
        .iter()
        .any(|m| text.contains(m))
}

/// The one mode an IPVS node's dumps show: IPVS for virtual services, or IPVS mode's chains or
/// set matches in the iptables dump; iptables for iptables mode's service chains. `None` when
/// they show both (a mode switch without clean-up) or neither.
pub fn rules_show(
    ipvsadm: Option<&IpvsDump<'_>>,
    iptables_save: Option<&str>,
) -> Option<ProxyMode> {
    let chains = iptables_save
        .map(|s| chains_of(s, IpFamily::V4))
        .unwrap_or_default();
    let ipvs = ipvsadm.is_some_and(|d| d.listings.iter().any(|l| !l.services.is_empty()))
        || chains.keys().any(|(_, c)| c == "KUBE-IPVS-FILTER")
        || chains
            .values()
            .flatten()
            .any(|r| r.contains("KUBE-CLUSTER-IP") || r.contains("KUBE-LOOP-BACK"));
    // Both modes have these two: they tell nothing.
    let iptables = chains.keys().any(|(_, c)| {
        is_iptables_mode_chain(c) && c != "KUBE-NODEPORTS" && c != "KUBE-EXTERNAL-SERVICES"
    });
    match (ipvs, iptables) {
        (true, false) => Some(ProxyMode::Ipvs),
        (false, true) => Some(ProxyMode::Iptables),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IPTABLES: &str = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]\nCOMMIT\n";
    const IPVS: &str = "*filter\n:KUBE-IPVS-FILTER - [0:0]\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT\nCOMMIT\n";
    const NFT: &str = "table ip kube-proxy {\n}\n";

    fn snapshot(iptables: Option<&str>) -> NodeSnapshot {
        NodeSnapshot {
            iptables_save: iptables.map(str::to_string),
            ..NodeSnapshot::default()
        }
    }

    fn verify(
        configured: Option<ProxyMode>,
        iptables: Option<&str>,
        listings: &[&str],
    ) -> ProxyMode {
        let snap = snapshot(iptables);
        for_verify(configured, None, &Evidence::new(&snap, listings)).mode
    }

    #[test]
    fn verify_checks_what_the_rules_show() {
        use ProxyMode::*;
        // Configured nftables: a listing read decides, else no other mode's rules.
        assert_eq!(verify(Some(Nftables), Some(IPTABLES), &[NFT]), Nftables);
        assert_eq!(verify(Some(Nftables), Some(IPTABLES), &[]), Iptables);
        assert_eq!(verify(Some(Nftables), None, &[]), Nftables);
        // No mode configured: kube-proxy's table in a listing, and no other mode's rules.
        assert_eq!(verify(None, None, &[NFT]), Nftables);
        assert_eq!(verify(None, Some(IPTABLES), &[NFT]), Iptables);
        assert_eq!(verify(None, None, &["table ip filter {\n}\n"]), Iptables);
        // Configured iptables or IPVS: the iptables dump says which.
        assert_eq!(verify(Some(Iptables), Some(IPVS), &[NFT]), Ipvs);
        assert_eq!(verify(Some(Ipvs), Some(IPTABLES), &[]), Iptables);
        let given = Given {
            mode: Ipvs,
            input: "--ipvsadm",
        };
        let snap = snapshot(Some(IPTABLES));
        let d = for_verify(Some(Nftables), Some(given), &Evidence::new(&snap, &[NFT]));
        assert_eq!(
            (d.mode, d.note().as_str()),
            (Ipvs, "mode ipvs: --ipvsadm given")
        );
    }

    #[test]
    fn reasons_say_what_decided() {
        let snap = snapshot(Some(IPTABLES));
        let d = for_verify(Some(ProxyMode::Nftables), None, &Evidence::new(&snap, &[]));
        assert_eq!(
            d.note(),
            "mode iptables: configured nftables; the dumps show iptables-mode state; the iptables dump is checked as iptables mode's"
        );
    }

    #[test]
    fn writes_follow_the_configuration() {
        use ProxyMode::*;
        let never = || -> Option<Vec<String>> { panic!("the host is not looked at") };
        assert_eq!(for_writing(Some(Ipvs), None, never).mode, Ipvs);
        let given = Given {
            mode: Nftables,
            input: "--nft-ruleset",
        };
        assert_eq!(
            for_writing(Some(Iptables), Some(given), never).mode,
            Nftables
        );
        let host = |t: &[&str]| {
            let t: Vec<String> = t.iter().map(|s| s.to_string()).collect();
            move || Some(t)
        };
        let d = for_writing(None, None, host(&["ip filter", "ip6 kube-proxy"]));
        assert_eq!(
            d.note(),
            "mode nftables: the configuration names no mode; this host has table ip6 kube-proxy"
        );
        assert_eq!(for_writing(None, None, host(&["ip filter"])).mode, Iptables);
        assert_eq!(for_writing(None, None, || None).mode, Iptables);
        assert_eq!(asked(Ipvs, Some(Iptables)).1, Some(Iptables));
        assert_eq!(asked(Ipvs, Some(Ipvs)).1, None);
    }

    #[test]
    fn other_modes_state_is_seen() {
        use ProxyMode::*;
        let other = |s: &NodeSnapshot| Evidence::new(s, &[]).other_mode();
        let mut s = NodeSnapshot::default();
        assert_eq!(other(&s), None);
        s.iptables_save = Some("*nat\n:KUBE-SVC-ABC - [0:0]\nCOMMIT\n".into());
        assert_eq!(other(&s), Some(Iptables));
        s.ipset_save = Some("create KUBE-CLUSTER-IP hash:ip,port family inet\n".into());
        assert_eq!(other(&s), Some(Ipvs));
        let json = "{\"nftables\": [{\"table\": {\"family\": \"ip\", \"name\": \"kube-proxy\", \"handle\": 1}}]}";
        assert_eq!(verify(None, None, &[json]), Nftables);
    }

    #[test]
    fn rules_show_one_mode_or_none() {
        assert_eq!(rules_show(None, Some(IPVS)), Some(ProxyMode::Ipvs));
        assert_eq!(rules_show(None, Some(IPTABLES)), Some(ProxyMode::Iptables));
        let both = format!("{IPVS}{IPTABLES}");
        assert_eq!(rules_show(None, Some(&both)), None);
        assert_eq!(rules_show(None, None), None);
    }
}
