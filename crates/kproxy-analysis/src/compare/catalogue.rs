//! The findings catalogue: every check `verify` can report, with its stable ID, severity, title,
//! the incident classes of `docs/incidents.md` it covers, and the standard hint.
//!
//! IDs are grouped: KP0xx node-wide and backend, KP1xx service entries, KP2xx endpoints and shares,
//! KP3xx masquerade, affinity and firewall, KP4xx stale rules and structure, KP5xx IPVS (see
//! `compare::ipvs`), KP9xx rule level. `docs/findings.md` lists one line per ID; a test keeps the
//! two in step.

use super::finding::{Finding, Severity};

/// One entry of the catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Check {
    /// Stable identifier, e.g. `KP101`.
    pub id: &'static str,
    /// Severity every finding of this check carries.
    pub severity: Severity,
    /// One-line title (what the check detects).
    pub title: &'static str,
    /// Incident classes of `docs/incidents.md` it covers (`F01`…), comma-separated, or `""`.
    pub incidents: &'static str,
    /// What to do about it.
    pub hint: &'static str,
}

impl Check {
    /// A finding of this check with the catalogue's severity and hint.
    pub fn finding(&self, message: impl Into<String>) -> Finding {
        Finding {
            id: self.id,
            severity: self.severity,
            service: None,
            chain: None,
            message: message.into(),
            expected: None,
            actual: None,
            hint: Some(self.hint.to_owned()),
            group: None,
        }
    }
}

/// Declares checks: one `Check` constant per entry (`NAME = "KPnnn", Severity, "title",
/// "incidents", "hint";`) and, first, the name of the slice of them all, in the order given.
macro_rules! checks {
    ($(#[$all_doc:meta])* $all:ident; $( $(#[$doc:meta])* $name:ident = $id:literal, $sev:ident, $title:literal, $inc:literal, $hint:literal; )*) => {
        $( $(#[$doc])* pub const $name: $crate::compare::catalogue::Check = $crate::compare::catalogue::Check {
            id: $id,
            severity: $crate::compare::finding::Severity::$sev,
            title: $title,
            incidents: $inc,
            hint: $hint,
        }; )*
        $(#[$all_doc])*
        pub const $all: &[$crate::compare::catalogue::Check] = &[$($name),*];
    };
}
pub(crate) use checks;

checks! {
    /// Every check, in ID order.
    ALL;
    // ---- KP0xx: node-wide and backend ----
    /// The dump holds rules the iptables userspace could not decode (version skew).
    USERSPACE_SKEW = "KP001", Error,
        "iptables userspace cannot decode kube-proxy's rules (version skew)", "F02, F03",
        "collect with the iptables binary of the kube-proxy image (kubectl exec into kube-proxy: iptables-save); never restore this dump";
    /// kube-proxy rules exist in both the legacy and the nf_tables backend.
    BACKEND_SPLIT = "KP002", Error,
        "kube-proxy rules in both iptables backends (legacy and nf_tables)", "F01",
        "flush the KUBE-* chains of the backend kube-proxy does not use (iptables-legacy / iptables-nft), after checking which one it writes";
    /// The dump says legacy tables exist but no legacy dump was given.
    LEGACY_NOT_COLLECTED = "KP003", Warning,
        "iptables-legacy tables present but not collected", "F01",
        "collect iptables-legacy-save too and pass it with --iptables-legacy-save";
    /// Rules of another proxy mode (IPVS chains/ipsets, nftables kube-proxy table).
    FOREIGN_MODE = "KP004", Error,
        "leftovers of another proxy mode", "F07",
        "remove the other mode's rules (kube-proxy --cleanup with that mode, or delete the chains/table) once nothing uses them";
    /// A jump from a built-in chain into kube-proxy's chains is missing.
    BASE_JUMP_MISSING = "KP005", Error,
        "jump from a built-in chain into kube-proxy's chains missing", "F10, F21",
        "kube-proxy re-creates these jumps on its next full sync; restart it or check who deletes them (firewalld reload, host firewall scripts)";
    /// `KUBE-PROXY-CANARY` missing in a table.
    CANARY_MISSING = "KP006", Warning,
        "KUBE-PROXY-CANARY chain missing", "F10",
        "the tables were flushed by someone else (firewalld, iptables-services); kube-proxy should resync within its syncPeriod — find the flusher";
    /// The masquerade mark differs from the configured masqueradeBit.
    MARK_MISMATCH = "KP007", Error,
        "masquerade mark differs from masqueradeBit", "F11",
        "make kube-proxy's iptables.masqueradeBit agree with the rules (and with kubelet); then resync kube-proxy";
    /// A foreign terminal rule sits ahead of kube-proxy's jump and shadows it.
    SHADOWING_RULE = "KP008", Error,
        "foreign rule ahead of kube-proxy's jump shadows it", "F10",
        "move the host firewall rule below kube-proxy's jump, or narrow it; check iptables-services/firewalld configuration";
    /// kube-proxy's fixed chains exist but no service rules at all.
    SKELETON_ONLY = "KP009", Error,
        "kube-proxy's chains exist but hold no service rules (not syncing)", "F04",
        "kube-proxy is failing to sync: read its log for iptables-restore errors and the sync_proxy_rules_iptables_restore_failures_total metric";
    /// Another agent sets or clears kube-proxy's mark bit.
    MARK_CONFLICT = "KP010", Warning,
        "another rule sets or clears kube-proxy's mark bit", "F11",
        "give the other agent (CNI, VPN, mesh) a mark mask that does not include kube-proxy's masquerade bit";
    /// The dump lacks a table the checks need.
    TABLE_MISSING = "KP011", Warning,
        "table missing from the dump", "F04",
        "collect the full iptables-save output (all tables), not iptables-save -t nat";
    /// No dump of this IP family although Services of the family exist.
    FAMILY_NOT_COLLECTED = "KP012", Info,
        "services of an IP family whose dump was not given", "F05",
        "pass --ip6tables-save (or --iptables-save) to check that family too";
    /// Lines of the dump were skipped in lenient mode.
    LINES_SKIPPED = "KP013", Info,
        "lines of the dump were skipped (--lenient)", "",
        "check the skipped lines; findings about the rules on them may be wrong";
    /// An object of the API state the API server would reject, left out of it.
    INVALID_OBJECT = "KP014", Warning,
        "API object the API server would reject, left out of the check", "",
        "fix or remove it where the state comes from (a state file, a bundle, an API endpoint that is not a real API server); the rules of the object left out are not checked, the rest are";

    // ---- KP1xx: service entries ----
    /// Cluster IP entry missing.
    CLUSTER_IP_MISSING = "KP101", Error,
        "cluster IP entry missing", "F04, F06",
        "kube-proxy did not program this service port: check its sync errors, then resync (or kubectl kproxy repair)";
    /// NodePort entry missing.
    NODEPORT_MISSING = "KP102", Error,
        "NodePort entry missing", "F04, F06",
        "kube-proxy did not program this NodePort: check its sync errors and nodePortAddresses, then resync";
    /// External IP entry missing.
    EXTERNAL_IP_MISSING = "KP103", Error,
        "external IP entry missing", "F04, F06",
        "kube-proxy did not program this external IP: check its sync errors, then resync";
    /// LoadBalancer ingress IP entry missing.
    LB_IP_MISSING = "KP104", Error,
        "load-balancer IP entry missing", "F04, F06",
        "kube-proxy did not program this load-balancer IP: check the Service status and its ipMode, then resync";
    /// An entry leads to a chain other than the expected one.
    ENTRY_WRONG_TARGET = "KP105", Error,
        "entry leads to the wrong chain", "F06, F23",
        "the rules predate a change of the Service (traffic policy, ports); resync kube-proxy";
    /// Health-check NodePort accept rule missing.
    HEALTH_CHECK_MISSING = "KP106", Error,
        "health check node port not opened", "F06",
        "load balancers will mark this node unhealthy; resync kube-proxy";
    /// REJECT/DROP missing for a service port without (local) endpoints.
    REJECT_MISSING = "KP107", Warning,
        "no REJECT/DROP for a service port without endpoints", "F14",
        "clients hang until timeout instead of being refused; resync kube-proxy";
    /// REJECT/DROP present although the service port has endpoints.
    REJECT_WITH_ENDPOINTS = "KP108", Error,
        "REJECT/DROP for a service port that has endpoints", "F07, F08, F23",
        "stale no-endpoints rule (or another mode's leftover) refuses traffic: delete it and resync kube-proxy";
    /// Entry present although the service port has no endpoints.
    ENTRY_WITHOUT_ENDPOINTS = "KP109", Error,
        "traffic forwarded for a service port without endpoints", "F06, F14",
        "the rules predate the loss of the endpoints; resync kube-proxy (and clear conntrack for UDP)";
    /// Entry for an address or port the Service does not have.
    ENTRY_STALE = "KP110", Error,
        "entry for an address or port the Service does not have", "F06, F07",
        "the rules predate a change of the Service's IPs or ports; resync kube-proxy";

    // ---- KP2xx: endpoints and shares ----
    /// An endpoint the API lists is not reachable through the rules.
    ENDPOINT_MISSING = "KP201", Error,
        "endpoint missing", "F06, F23",
        "kube-proxy has not programmed a ready endpoint: resync kube-proxy; check its node name for Local policies";
    /// The rules forward to an endpoint the API does not list (or not as usable).
    ENDPOINT_EXTRA = "KP202", Error,
        "traffic forwarded to an endpoint the API does not have", "F06, F07",
        "stale endpoint: the pod is gone or not ready; resync kube-proxy and clear conntrack entries to that IP";
    /// Endpoint shares are not equal.
    UNEQUAL_SHARES = "KP203", Error,
        "endpoints do not get equal shares", "F06",
        "the statistic probabilities were edited or belong to another endpoint count; resync kube-proxy";
    /// DNAT to the wrong port.
    WRONG_TARGET_PORT = "KP204", Error,
        "DNAT to the wrong target port", "F06",
        "the rules predate a targetPort change; resync kube-proxy";
    /// Local policy forwards to a non-local endpoint.
    NOT_LOCAL_ENDPOINT = "KP205", Error,
        "Local traffic policy forwards to an endpoint on another node", "F23",
        "check kube-proxy's node name (hostnameOverride) against the EndpointSlices' nodeName";
    /// An endpoint chain does not DNAT.
    ENDPOINT_CHAIN_BROKEN = "KP206", Error,
        "endpoint chain does not DNAT", "F06",
        "the endpoint chain was flushed or edited; resync kube-proxy";

    // ---- KP3xx: masquerade, affinity, firewall ----
    /// A masquerade rule is missing.
    MASQ_MISSING = "KP301", Error,
        "masquerade rule missing", "F11, F12",
        "replies will bypass the node (asymmetric routing); resync kube-proxy";
    /// A masquerade rule is present where kube-proxy writes none.
    MASQ_EXTRA = "KP302", Warning,
        "masquerade rule kube-proxy would not write", "F12",
        "client source IPs are hidden from the endpoints; check masqueradeAll and clusterCIDR";
    /// Session affinity missing.
    AFFINITY_MISSING = "KP303", Error,
        "session affinity missing", "F06",
        "sessionAffinity: ClientIP is not enforced on this node; resync kube-proxy";
    /// Session affinity timeout differs.
    AFFINITY_TIMEOUT = "KP304", Error,
        "session affinity timeout differs", "F06",
        "the rules predate a sessionAffinityConfig change; resync kube-proxy";
    /// Session affinity present but not configured.
    AFFINITY_EXTRA = "KP305", Warning,
        "session affinity the Service does not ask for", "F06",
        "the rules predate a sessionAffinity change; resync kube-proxy";
    /// loadBalancerSourceRanges firewall differs.
    FIREWALL_MISMATCH = "KP306", Error,
        "load-balancer source-range firewall differs", "F06",
        "the allowed source ranges on the node differ from loadBalancerSourceRanges; resync kube-proxy";
    /// The local-traffic CIDR differs from the configuration.
    LOCAL_DETECT_MISMATCH = "KP307", Error,
        "local-traffic detection differs from the configuration", "F12",
        "make clusterCIDR / detectLocalMode match the pod network";
    /// The node-wide masquerade machinery is broken.
    MASQ_MACHINERY = "KP308", Error,
        "marked packets are not masqueraded", "F11",
        "KUBE-POSTROUTING / KUBE-MARK-MASQ were edited; resync kube-proxy";

    // ---- KP4xx: stale rules and structure ----
    /// Rules for a service port the API does not have.
    STALE_SERVICE = "KP401", Error,
        "rules for a service port the API does not have", "F06, F07",
        "stale service: kube-proxy missed the deletion or another proxy left it; resync kube-proxy or delete the chains";
    /// kube-proxy chain nothing references.
    ORPHAN_CHAIN = "KP402", Warning,
        "kube-proxy chain that nothing references", "F07, F22",
        "stale chain: harmless while unreferenced; kube-proxy deletes it on its next cleanup, or delete it by hand";
    /// A rule jumps to a chain that does not exist.
    DANGLING_JUMP = "KP403", Error,
        "jump to a chain that does not exist", "F04",
        "the dump is incomplete or the ruleset is broken; collect all tables again";
    /// The same rule repeated in one chain.
    DUPLICATE_RULES = "KP404", Warning,
        "identical rule repeated in one chain", "F09",
        "an agent's check-then-append is broken (iptables -C mismatch); delete the copies and fix that agent's iptables";
    /// Stale chain kept on purpose (large-cluster mode).
    STALE_CHAIN_LARGE_CLUSTER = "KP405", Info,
        "unreferenced chain kept by large-cluster mode", "F22",
        "kube-proxy garbage-collects stale chains at most once per syncPeriod in large clusters; no action needed";
    /// A service port's path holds rules no release this build knows writes: nothing is
    /// concluded of that port (its endpoints, its chains, the rules that differ).
    UNKNOWN_RULES = "KP406", Warning,
        "rules on a service port's path this build does not know (a newer kube-proxy's layout?); that service port not checked", "F02, F07",
        "the node's kube-proxy may be newer than this build: verify with a kubectl-kproxy that knows its release; if another program wrote these rules, find it before repairing";

    // ---- KP9xx: rule level ----
    /// A rule kube-proxy would write is missing.
    RULE_MISSING = "KP901", Error,
        "rule missing", "F06, F10",
        "resync kube-proxy (or kubectl kproxy repair); see the expected rule";
    /// A rule kube-proxy would not write is present.
    RULE_EXTRA = "KP902", Warning,
        "rule kube-proxy would not write", "F07",
        "something else edited kube-proxy's chain, or another kube-proxy version wrote it";
    /// A rule differs from what kube-proxy would write.
    RULE_CHANGED = "KP903", Warning,
        "rule differs from what kube-proxy would write", "F06",
        "the rule was edited or written by another kube-proxy version; resync kube-proxy";
    /// Rules in a wrong order.
    RULE_ORDER = "KP904", Warning,
        "rules in a different order than kube-proxy writes them", "F06",
        "order matters in this chain; resync kube-proxy";
    /// A chain kube-proxy would write is missing.
    CHAIN_MISSING = "KP905", Error,
        "chain missing", "F04, F06",
        "resync kube-proxy";
    /// The rules are another kube-proxy release's than the one verified against.
    OTHER_RELEASE = "KP906", Warning,
        "rules written by another kube-proxy version than the one verified against", "",
        "verify with --kube-proxy-version set to the node's kube-proxy; if that is the version verified against, kube-proxy has not rewritten its rules (restart it, or kubectl kproxy repair)";
    /// Which release the rules were verified with, inferred from the dump.
    VERSION_INFERRED = "KP907", Info,
        "kube-proxy version inferred from the rules", "",
        "pass --kube-proxy-version X.Y (the node's kube-proxy image tag) to verify with another release";
    /// Rules of more than one release on one node.
    VERSIONS_MIXED = "KP908", Warning,
        "rules of more than one kube-proxy version on the node", "",
        "a kube-proxy upgrade (or downgrade) left the other release's chains: they go on the next full sync; restart kube-proxy, or kubectl kproxy repair";
    /// What an in-place upgrade of an nftables-mode node leaves that no release deletes.
    UPGRADE_RESIDUE = "KP909", Info,
        "residue of a kube-proxy upgrade that no release deletes", "",
        "harmless (nothing jumps to it); kube-proxy deletes it only with its whole table (kube-proxy --cleanup, or a switch of mode), and repair leaves it as kube-proxy does";
}

/// Looks a check up by ID.
pub fn by_id(id: &str) -> Option<&'static Check> {
    ALL.iter().find(|c| c.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_sorted() {
        for w in ALL.windows(2) {
            assert!(w[0].id < w[1].id, "{} before {}", w[0].id, w[1].id);
        }
    }

    #[test]
    fn docs_list_every_check() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/findings.md");
        let docs = std::fs::read_to_string(path).unwrap_or_default();
        for c in ALL {
            let needle = format!("| {} | {} |", c.id, severity_word(c.severity));
            assert!(docs.contains(&needle), "docs/findings.md lacks `{needle}`");
        }
    }

    fn severity_word(s: Severity) -> &'static str {
        match s {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }

    #[test]
    fn every_incident_class_is_covered() {
        // The incident classes verify can detect from dumps alone (conntrack, IPVS, lock and timing
        // classes need other inputs).
        for f in [
            "F01", "F02", "F05", "F03", "F04", "F06", "F07", "F08", "F09", "F10", "F11", "F12",
            "F14", "F22", "F23",
        ] {
            assert!(
                ALL.iter().any(|c| c.incidents.contains(f)),
                "no check covers {f}"
            );
        }
    }
}
