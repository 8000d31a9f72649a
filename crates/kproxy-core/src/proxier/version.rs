//! What each kube-proxy release changes in the rules, as switches the renderers ask of a
//! [`KubeProxyVersion`].
//!
//! Each switch names one change and the release that made it, read from kube-proxy's
//! `pkg/proxy/iptables/proxier.go` and `pkg/proxy/nftables/proxier.go` (`syncProxyRules`),
//! `pkg/proxy/topology.go` and the feature gate defaults of `pkg/features/kube_features.go` at
//! each release; docs/versions.md has the table. A gate that changes rules is read from the
//! configuration's `featureGates` (or `--feature-gates`) for the releases that have it, and
//! otherwise takes its default at that release.

use crate::state::config::ProxyConfig;
use crate::state::version::KubeProxyVersion;

/// The gate of the nftables localhost NodePort handling (kube-proxy#138427).
pub const LOCALHOST_NODEPORTS_GATE: &str = "KubeProxyNFTablesLocalhostNodePorts";
/// The gate that lets Services' `spec.externalIPs` have rules (kube-proxy#137293).
pub const ALLOW_EXTERNAL_IPS_GATE: &str = "AllowServiceExternalIPs";

/// How a version uses EndpointSlice topology hints for Cluster-policy traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopologyHints {
    /// Hints are ignored (`TopologyAwareHints` off by default before 1.24).
    Ignored,
    /// Used when the Service's `service.kubernetes.io/topology-aware-hints` annotation is
    /// `Auto`/`auto` (1.24–1.26).
    WhenAnnotatedAuto,
    /// Used when the Service's topology annotation (`topology-mode`, else
    /// `topology-aware-hints`) is set and not `disabled` (1.27–1.30).
    WhenAnnotated,
    /// Used whenever every ready endpoint has hints (`ServiceTrafficDistribution` on, 1.31+).
    Always,
}

impl KubeProxyVersion {
    /// `health check node port` ACCEPT rules in a filter `KUBE-NODEPORTS` chain, jumped to from
    /// INPUT (1.21).
    pub fn opens_health_check_ports(self) -> bool {
        self.minor() >= 21
    }

    /// External IPs: one masquerade rule (off-cluster sources only when a local-traffic
    /// detector exists) and one jump, instead of 1.20's `physdev`/`addrtype` pair (1.21).
    pub fn one_external_ip_jump(self) -> bool {
        self.minor() >= 21
    }

    /// Masquerade rules live in the service's `KUBE-SVC-…` chain rather than in
    /// `KUBE-SERVICES`/`KUBE-NODEPORTS` (1.22).
    pub fn masquerades_in_service_chain(self) -> bool {
        self.minor() >= 22
    }

    /// Every endpoint of a service gets a `KUBE-SEP-…` chain, ready or not (1.22 only; 1.23
    /// writes only the chains rules jump to).
    pub fn chains_every_endpoint(self) -> bool {
        self.minor() == 22
    }

    /// Addresses are written bare (`-d 10.0.0.1`), not as `/32` (`/128`) CIDRs (1.23).
    pub fn bare_addresses(self) -> bool {
        self.minor() >= 23
    }

    /// `KUBE-FORWARD` accepts established traffic with one "kubernetes forwarding conntrack
    /// rule" instead of a pod source and a pod destination rule (1.23).
    pub fn one_forward_conntrack_rule(self) -> bool {
        self.minor() >= 23
    }

    /// `KUBE-XLB-…` balancing rules carry the service port name as comment (1.23), not
    /// "Balancing rule N for …".
    pub fn names_local_balancing_rules(self) -> bool {
        self.minor() >= 23
    }

    /// `KUBE-EXT-…` (external destinations) and `KUBE-SVL-…` (Local policy) chains replace
    /// `KUBE-XLB-…`; SVC→SEP rules are commented `<svc> -> <ip:port>`; `KUBE-FW-…` exists only
    /// with loadBalancerSourceRanges (1.24).
    pub fn uses_ext_chains(self) -> bool {
        self.minor() >= 24
    }

    /// Drops are filter-table rules (`KUBE-PROXY-FIREWALL`, "has no local endpoints" DROP)
    /// rather than jumps to kubelet's `KUBE-MARK-DROP`; an empty `KUBE-SVL-…` chain is not
    /// written (1.25).
    pub fn drops_in_filter_table(self) -> bool {
        self.minor() >= 25
    }

    /// `iptables.localhostNodePorts` is honoured and IPv6 NodePorts exclude `::1` (1.26);
    /// before, NodePorts are always open on IPv4 localhost.
    pub fn has_localhost_nodeports_option(self) -> bool {
        self.minor() >= 26
    }

    /// kube-proxy writes the filter `KUBE-FIREWALL` localnet rule itself, and ends `KUBE-FW-…`
    /// chains with an "other traffic … will be dropped" comment rule (1.27).
    pub fn writes_kube_firewall(self) -> bool {
        self.minor() >= 27
    }

    /// The `KUBE-FORWARD` INVALID drop is left out when `nf_conntrack_tcp_be_liberal` is set
    /// (1.29).
    pub fn drops_invalid_conditionally(self) -> bool {
        self.minor() >= 29
    }

    /// nfacct counters on the INVALID drop and on localhost NodePort traffic, when the kernel
    /// has them (1.31).
    pub fn counts_with_nfacct(self) -> bool {
        self.minor() >= 31
    }

    /// Terminating endpoints that are still serving are used when no ready one is left
    /// (`ProxyTerminatingEndpoints`: alpha off 1.22, beta on 1.26, GA 1.28).
    pub fn falls_back_to_terminating(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get("ProxyTerminatingEndpoints") {
            Some(&on) if (22..30).contains(&self.minor()) => on,
            _ => self.minor() >= 26,
        }
    }

    /// `internalTrafficPolicy: Local` is honoured (`ServiceInternalTrafficPolicy`: alpha off
    /// 1.21, beta on 1.22, GA 1.26).
    pub fn honours_internal_traffic_policy(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get("ServiceInternalTrafficPolicy") {
            Some(&on) if (21..28).contains(&self.minor()) => on,
            _ => self.minor() >= 22,
        }
    }

    /// Load-balancer ingress IPs with `ipMode: Proxy` get no rules (`LoadBalancerIPMode`:
    /// alpha off 1.29, beta on 1.30); before, every ingress IP does.
    pub fn honours_ip_mode(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get("LoadBalancerIPMode") {
            Some(&on) if self.minor() >= 29 => on,
            _ => self.minor() >= 30,
        }
    }

    /// How EndpointSlice zone hints steer Cluster-policy traffic (`TopologyAwareHints` beta on
    /// from 1.24, `ServiceTrafficDistribution` beta on from 1.31).
    pub fn topology_hints(self, config: &ProxyConfig) -> TopologyHints {
        let gate =
            |name: &str, default: bool| config.feature_gates.get(name).copied().unwrap_or(default);
        if self.minor() >= 31 || (self.minor() == 30 && gate("ServiceTrafficDistribution", false)) {
            TopologyHints::Always
        } else if !gate("TopologyAwareHints", self.minor() >= 24) || self.minor() < 21 {
            TopologyHints::Ignored
        } else if self.minor() >= 27 {
            TopologyHints::WhenAnnotated
        } else {
            TopologyHints::WhenAnnotatedAuto
        }
    }

    /// Node hints (`PreferSameTrafficDistribution`: alpha off 1.33, beta on 1.34).
    pub fn uses_node_hints(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get("PreferSameTrafficDistribution") {
            Some(&on) => on && self.minor() >= 33,
            None => self.minor() >= 34,
        }
    }

    /// nftables: a release whose table this build writes as kube-proxy does. The nftables
    /// mode came in 1.29 (alpha); the layout modelled here, with the `filter-*-pre-dnat` base
    /// chains, is that of 1.34 (kube-proxy#131492, #132456) and 1.35, on which 1.36 builds.
    pub fn models_nftables_layout(self) -> bool {
        self.minor() >= 34
    }

    /// nftables: the layout of kube-proxy#135800 and #136499 (1.36): no `mark-for-masquerade`
    /// chain (marks are set inline), a `hairpin-connections` set of local endpoints
    /// masqueraded in `masquerading`, the cluster-IP masquerade as one `services` rule, and
    /// service chains that DNAT through a `numgen … map` (endpoint chains only for ClientIP
    /// affinity).
    pub fn dnats_in_service_chains(self) -> bool {
        self.minor() >= 36
    }

    /// nftables: a service chain with one endpoint DNATs with `dnat to IP:PORT` rather than a
    /// one-entry `numgen` map (kube-proxy#140723, 1.37: `writeServiceToEndpointDNATs`).
    pub fn dnats_single_endpoint_directly(self) -> bool {
        self.minor() >= 37
    }

    /// nftables: element comments are cut to the kernel's 128 bytes
    /// (`truncateNFTablesComment`, kube-proxy#139516, 1.37); before, a longer one failed the
    /// whole sync.
    pub fn truncates_element_comments(self) -> bool {
        self.minor() >= 37
    }

    /// `nodePortAddresses` takes the keywords `localhost` and `all` besides `primary`
    /// (kube-proxy#138427, 1.37).
    pub fn expands_node_port_keywords(self) -> bool {
        self.minor() >= 37
    }

    /// nftables: localhost NodePorts kube-proxy does not serve are rejected through the
    /// `localhost-nodeport-reject-ports` map (`KubeProxyNFTablesLocalhostNodePorts`: alpha off
    /// 1.37, beta on from 1.38.0-alpha.2, kube-proxy#142490).
    pub fn rejects_localhost_nodeports(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get(LOCALHOST_NODEPORTS_GATE) {
            Some(&on) => on && self.minor() >= 37,
            None => self.minor() >= 38,
        }
    }

    /// A Service's `spec.externalIPs` get rules (`AllowServiceExternalIPs`, 1.36, on by
    /// default; kube-proxy#137293: off, kube-proxy writes nothing for them, in every mode).
    pub fn allows_external_ips(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get(ALLOW_EXTERNAL_IPS_GATE) {
            Some(&on) if self.minor() >= 36 => on,
            _ => true,
        }
    }

    /// Large-cluster mode counts only ready endpoints (1.20: its endpoints map holds no
    /// others).
    pub fn counts_only_ready_endpoints(self) -> bool {
        self.minor() < 21
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> KubeProxyVersion {
        KubeProxyVersion::of_minor(minor).expect("known version")
    }

    #[test]
    fn switches_turn_on_at_their_release() {
        let on_from = |f: fn(KubeProxyVersion) -> bool| {
            KubeProxyVersion::all()
                .find(|v| f(*v))
                .map(KubeProxyVersion::minor)
        };
        assert_eq!(
            on_from(KubeProxyVersion::opens_health_check_ports),
            Some(21)
        );
        assert_eq!(
            on_from(KubeProxyVersion::masquerades_in_service_chain),
            Some(22)
        );
        assert_eq!(on_from(KubeProxyVersion::bare_addresses), Some(23));
        assert_eq!(on_from(KubeProxyVersion::uses_ext_chains), Some(24));
        assert_eq!(on_from(KubeProxyVersion::drops_in_filter_table), Some(25));
        assert_eq!(
            on_from(KubeProxyVersion::has_localhost_nodeports_option),
            Some(26)
        );
        assert_eq!(on_from(KubeProxyVersion::writes_kube_firewall), Some(27));
        assert_eq!(
            on_from(KubeProxyVersion::drops_invalid_conditionally),
            Some(29)
        );
        assert_eq!(on_from(KubeProxyVersion::counts_with_nfacct), Some(31));
        assert_eq!(on_from(KubeProxyVersion::dnats_in_service_chains), Some(36));
        assert_eq!(
            on_from(KubeProxyVersion::dnats_single_endpoint_directly),
            Some(37)
        );
        assert_eq!(
            on_from(KubeProxyVersion::truncates_element_comments),
            Some(37)
        );
        assert_eq!(
            on_from(KubeProxyVersion::expands_node_port_keywords),
            Some(37)
        );
        assert!(
            KubeProxyVersion::all()
                .filter(|v| v.chains_every_endpoint())
                .eq([v(22)])
        );
        assert_eq!(KubeProxyVersion::NEWEST.to_string(), "1.38");
        assert_eq!(KubeProxyVersion::default().to_string(), "1.35");
    }

    #[test]
    fn gates_follow_their_defaults_unless_set() {
        let mut config = ProxyConfig::default();
        assert!(!v(25).falls_back_to_terminating(&config));
        assert!(v(26).falls_back_to_terminating(&config));
        assert!(!v(21).honours_internal_traffic_policy(&config));
        assert!(v(22).honours_internal_traffic_policy(&config));
        assert!(!v(29).honours_ip_mode(&config));
        assert!(v(30).honours_ip_mode(&config));
        assert_eq!(v(23).topology_hints(&config), TopologyHints::Ignored);
        assert_eq!(
            v(24).topology_hints(&config),
            TopologyHints::WhenAnnotatedAuto
        );
        assert_eq!(v(27).topology_hints(&config), TopologyHints::WhenAnnotated);
        assert_eq!(v(31).topology_hints(&config), TopologyHints::Always);
        assert!(!v(33).uses_node_hints(&config));
        assert!(v(34).uses_node_hints(&config));
        assert!(!v(37).rejects_localhost_nodeports(&config));
        assert!(v(38).rejects_localhost_nodeports(&config));
        assert!(v(35).allows_external_ips(&config));
        assert!(v(36).allows_external_ips(&config));
        config
            .feature_gates
            .insert(LOCALHOST_NODEPORTS_GATE.into(), true);
        config
            .feature_gates
            .insert(ALLOW_EXTERNAL_IPS_GATE.into(), false);
        assert!(!v(36).rejects_localhost_nodeports(&config));
        assert!(v(37).rejects_localhost_nodeports(&config));
        assert!(v(35).allows_external_ips(&config));
        assert!(!v(36).allows_external_ips(&config));
        config
            .feature_gates
            .insert("ProxyTerminatingEndpoints".into(), true);
        config
            .feature_gates
            .insert("TopologyAwareHints".into(), true);
        config
            .feature_gates
            .insert("PreferSameTrafficDistribution".into(), true);
        assert!(v(22).falls_back_to_terminating(&config));
        assert!(!v(21).falls_back_to_terminating(&config));
        assert_eq!(
            v(23).topology_hints(&config),
            TopologyHints::WhenAnnotatedAuto
        );
        assert!(v(33).uses_node_hints(&config));
    }
}
