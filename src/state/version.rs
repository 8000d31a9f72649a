//! Which kube-proxy writes the rules: its minor version (1.20 … 1.35), parsed from `1.28`,
//! `v1.28.4` or an image reference such as `registry.k8s.io/kube-proxy:v1.28.4`, and what that
//! version changes in the iptables rules, as switches the renderer asks.
//!
//! Each switch names one change and the release that made it, read from kube-proxy's
//! `pkg/proxy/iptables/proxier.go` (`syncProxyRules`), `pkg/proxy/topology.go` and the feature
//! gate defaults of `pkg/features/kube_features.go` at each release; docs/versions.md has the
//! table. A version is the newest by default: rules of older releases are asked for explicitly
//! (`--kube-proxy-version`), read from the node's kube-proxy image, or inferred from a dump
//! (`crate::compare::version`).

use crate::state::config::ProxyConfig;
use serde::Serialize;
use std::fmt;

/// A kube-proxy minor version (major 1) this build renders the iptables rules of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeProxyVersion {
    minor: u8,
}

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

/// Why a text names no kube-proxy version this build knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Not `1.N`, `v1.N.P` or an image with such a tag.
    #[error(
        "{0:?} is not a kube-proxy version: expected 1.N, v1.N.P or an image tag like registry.k8s.io/kube-proxy:v1.28.4"
    )]
    Malformed(String),
    /// Older than the oldest release this build renders.
    #[error("kube-proxy 1.{0} is older than the oldest version this build renders (1.20)")]
    TooOld(u32),
    /// Newer than the newest release this build knows.
    #[error("kube-proxy 1.{0} is newer than the newest version this build knows (1.35)")]
    TooNew(u32),
    /// An image whose name is not kube-proxy's (distributions that rebuild it).
    #[error(
        "image {0:?} is not kube-proxy's own image, so its tag does not tell the kube-proxy release (k3s, RKE2 and some managed offerings rebuild or embed kube-proxy): pass --kube-proxy-version X.Y"
    )]
    RenamedImage(String),
    /// A kube-proxy image without a version tag (pinned by digest, or `latest`).
    #[error(
        "image {0:?} has no version tag (pinned by digest, or a moving tag): pass --kube-proxy-version X.Y"
    )]
    UntaggedImage(String),
}

impl KubeProxyVersion {
    /// The oldest release rendered: 1.20.
    pub const OLDEST: KubeProxyVersion = KubeProxyVersion { minor: 20 };
    /// The newest release this build knows: 1.35.
    pub const NEWEST: KubeProxyVersion = KubeProxyVersion { minor: 35 };

    /// Version 1.`minor`, when this build renders it.
    pub fn of_minor(minor: u32) -> Result<KubeProxyVersion, VersionError> {
        if minor < u32::from(Self::OLDEST.minor) {
            Err(VersionError::TooOld(minor))
        } else if minor > u32::from(Self::NEWEST.minor) {
            Err(VersionError::TooNew(minor))
        } else {
            Ok(KubeProxyVersion { minor: minor as u8 })
        }
    }

    /// The minor number.
    pub fn minor(self) -> u32 {
        u32::from(self.minor)
    }

    /// Every version, oldest first.
    pub fn all() -> impl DoubleEndedIterator<Item = KubeProxyVersion> {
        (Self::OLDEST.minor..=Self::NEWEST.minor).map(|minor| KubeProxyVersion { minor })
    }

    /// The version a text names: `1.28`, `v1.28.4`, `1.28.2-eks-a5df82a`, `v1.28.4+k3s1`, or an
    /// image reference (see [`KubeProxyVersion::from_image`]).
    pub fn parse(text: &str) -> Result<KubeProxyVersion, VersionError> {
        let t = text.trim();
        if t.contains('/') || t.contains(':') || t.contains('@') {
            return Self::from_image(t);
        }
        let minor = release_minor(t).ok_or_else(|| VersionError::Malformed(t.to_string()))?;
        Self::of_minor(minor)
    }

    /// The version of a kube-proxy container image, from its tag: the image must be named
    /// `kube-proxy…` (`registry.k8s.io/kube-proxy:v1.28.4`,
    /// `….dkr.ecr.….amazonaws.com/eks/kube-proxy:v1.28.2-minimal-eksbuild.2`,
    /// `gke.gcr.io/kube-proxy-amd64:v1.27.3-gke.100`) and tagged `v1.N…`. Any other image is
    /// a distribution's own build, whose tag need not be the Kubernetes release.
    pub fn from_image(image: &str) -> Result<KubeProxyVersion, VersionError> {
        let image = image.trim();
        let without_digest = image.split('@').next().unwrap_or("");
        let last = without_digest.rsplit('/').next().unwrap_or("");
        let (name, tag) = match last.split_once(':') {
            Some((n, t)) => (n, Some(t)),
            None => (last, None),
        };
        if !name.starts_with("kube-proxy") {
            return Err(VersionError::RenamedImage(image.to_string()));
        }
        let tag = tag.ok_or_else(|| VersionError::UntaggedImage(image.to_string()))?;
        let minor =
            release_minor(tag).ok_or_else(|| VersionError::UntaggedImage(image.to_string()))?;
        Self::of_minor(minor)
    }

    /// `health check node port` ACCEPT rules in a filter `KUBE-NODEPORTS` chain, jumped to from
    /// INPUT (1.21).
    pub fn opens_health_check_ports(self) -> bool {
        self.minor >= 21
    }

    /// External IPs: one masquerade rule (off-cluster sources only when a local-traffic
    /// detector exists) and one jump, instead of 1.20's `physdev`/`addrtype` pair (1.21).
    pub fn one_external_ip_jump(self) -> bool {
        self.minor >= 21
    }

    /// Masquerade rules live in the service's `KUBE-SVC-…` chain rather than in
    /// `KUBE-SERVICES`/`KUBE-NODEPORTS` (1.22).
    pub fn masquerades_in_service_chain(self) -> bool {
        self.minor >= 22
    }

    /// Every endpoint of a service gets a `KUBE-SEP-…` chain, ready or not (1.22 only; 1.23
    /// writes only the chains rules jump to).
    pub fn chains_every_endpoint(self) -> bool {
        self.minor == 22
    }

    /// Addresses are written bare (`-d 10.0.0.1`), not as `/32` (`/128`) CIDRs (1.23).
    pub fn bare_addresses(self) -> bool {
        self.minor >= 23
    }

    /// `KUBE-FORWARD` accepts established traffic with one "kubernetes forwarding conntrack
    /// rule" instead of a pod source and a pod destination rule (1.23).
    pub fn one_forward_conntrack_rule(self) -> bool {
        self.minor >= 23
    }

    /// `KUBE-XLB-…` balancing rules carry the service port name as comment (1.23), not
    /// "Balancing rule N for …".
    pub fn names_local_balancing_rules(self) -> bool {
        self.minor >= 23
    }

    /// `KUBE-EXT-…` (external destinations) and `KUBE-SVL-…` (Local policy) chains replace
    /// `KUBE-XLB-…`; SVC→SEP rules are commented `<svc> -> <ip:port>`; `KUBE-FW-…` exists only
    /// with loadBalancerSourceRanges (1.24).
    pub fn uses_ext_chains(self) -> bool {
        self.minor >= 24
    }

    /// Drops are filter-table rules (`KUBE-PROXY-FIREWALL`, "has no local endpoints" DROP)
    /// rather than jumps to kubelet's `KUBE-MARK-DROP`; an empty `KUBE-SVL-…` chain is not
    /// written (1.25).
    pub fn drops_in_filter_table(self) -> bool {
        self.minor >= 25
    }

    /// `iptables.localhostNodePorts` is honoured and IPv6 NodePorts exclude `::1` (1.26);
    /// before, NodePorts are always open on IPv4 localhost.
    pub fn has_localhost_nodeports_option(self) -> bool {
        self.minor >= 26
    }

    /// kube-proxy writes the filter `KUBE-FIREWALL` localnet rule itself, and ends `KUBE-FW-…`
    /// chains with an "other traffic … will be dropped" comment rule (1.27).
    pub fn writes_kube_firewall(self) -> bool {
        self.minor >= 27
    }

    /// The `KUBE-FORWARD` INVALID drop is left out when `nf_conntrack_tcp_be_liberal` is set
    /// (1.29).
    pub fn drops_invalid_conditionally(self) -> bool {
        self.minor >= 29
    }

    /// nfacct counters on the INVALID drop and on localhost NodePort traffic, when the kernel
    /// has them (1.31).
    pub fn counts_with_nfacct(self) -> bool {
        self.minor >= 31
    }

    /// Terminating endpoints that are still serving are used when no ready one is left
    /// (`ProxyTerminatingEndpoints`: alpha off 1.22, beta on 1.26, GA 1.28).
    pub fn falls_back_to_terminating(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get("ProxyTerminatingEndpoints") {
            Some(&on) if (22..30).contains(&self.minor) => on,
            _ => self.minor >= 26,
        }
    }

    /// `internalTrafficPolicy: Local` is honoured (`ServiceInternalTrafficPolicy`: alpha off
    /// 1.21, beta on 1.22, GA 1.26).
    pub fn honours_internal_traffic_policy(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get("ServiceInternalTrafficPolicy") {
            Some(&on) if (21..28).contains(&self.minor) => on,
            _ => self.minor >= 22,
        }
    }

    /// Load-balancer ingress IPs with `ipMode: Proxy` get no rules (`LoadBalancerIPMode`:
    /// alpha off 1.29, beta on 1.30); before, every ingress IP does.
    pub fn honours_ip_mode(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get("LoadBalancerIPMode") {
            Some(&on) if self.minor >= 29 => on,
            _ => self.minor >= 30,
        }
    }

    /// How EndpointSlice zone hints steer Cluster-policy traffic (`TopologyAwareHints` beta on
    /// from 1.24, `ServiceTrafficDistribution` beta on from 1.31).
    pub fn topology_hints(self, config: &ProxyConfig) -> TopologyHints {
        let gate =
            |name: &str, default: bool| config.feature_gates.get(name).copied().unwrap_or(default);
        if self.minor >= 31 || (self.minor == 30 && gate("ServiceTrafficDistribution", false)) {
            TopologyHints::Always
        } else if !gate("TopologyAwareHints", self.minor >= 24) || self.minor < 21 {
            TopologyHints::Ignored
        } else if self.minor >= 27 {
            TopologyHints::WhenAnnotated
        } else {
            TopologyHints::WhenAnnotatedAuto
        }
    }

    /// Node hints (`PreferSameTrafficDistribution`: alpha off 1.33, beta on 1.34).
    pub fn uses_node_hints(self, config: &ProxyConfig) -> bool {
        match config.feature_gates.get("PreferSameTrafficDistribution") {
            Some(&on) => on && self.minor >= 33,
            None => self.minor >= 34,
        }
    }

    /// Large-cluster mode counts only ready endpoints (1.20: its endpoints map holds no
    /// others).
    pub fn counts_only_ready_endpoints(self) -> bool {
        self.minor < 21
    }
}

impl Default for KubeProxyVersion {
    fn default() -> Self {
        Self::NEWEST
    }
}

impl fmt::Display for KubeProxyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor)
    }
}

impl std::str::FromStr for KubeProxyVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for KubeProxyVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The minor number of a Kubernetes release text `[v]1.N[.P][-…|+…]`, if it is one.
fn release_minor(text: &str) -> Option<u32> {
    let t = text.strip_prefix(['v', 'V']).unwrap_or(text);
    let core = t.split(['-', '+']).next().unwrap_or("");
    let mut parts = core.split('.');
    let major = parts.next()?;
    let minor = parts.next()?;
    let patch = parts.next();
    if parts.next().is_some() || major != "1" {
        return None;
    }
    let digits = |s: &str| !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(minor) || patch.is_some_and(|p| !digits(p)) {
        return None;
    }
    minor.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> KubeProxyVersion {
        KubeProxyVersion::of_minor(minor).expect("known version")
    }

    #[test]
    fn parses_release_texts() {
        assert_eq!(KubeProxyVersion::parse("1.28"), Ok(v(28)));
        assert_eq!(KubeProxyVersion::parse("v1.28.4"), Ok(v(28)));
        assert_eq!(KubeProxyVersion::parse(" 1.20.15 "), Ok(v(20)));
        assert_eq!(KubeProxyVersion::parse("v1.27.3-gke.100"), Ok(v(27)));
        assert_eq!(KubeProxyVersion::parse("v1.28.4+k3s1"), Ok(v(28)));
        assert_eq!(
            KubeProxyVersion::parse("1.35"),
            Ok(KubeProxyVersion::NEWEST)
        );
        assert_eq!(
            KubeProxyVersion::parse("1.19"),
            Err(VersionError::TooOld(19))
        );
        assert_eq!(
            KubeProxyVersion::parse("1.36"),
            Err(VersionError::TooNew(36))
        );
        for bad in [
            "", "1", "2.28", "1.x", "1.28.4.1", "v", "1..2", "1.28.", "one.two",
        ] {
            assert_eq!(
                KubeProxyVersion::parse(bad),
                Err(VersionError::Malformed(bad.to_string())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn parses_image_tags() {
        let cases = [
            ("registry.k8s.io/kube-proxy:v1.28.4", 28),
            ("k8s.gcr.io/kube-proxy:v1.20.15", 20),
            (
                "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/kube-proxy:v1.29.0-minimal-eksbuild.1",
                29,
            ),
            ("gke.gcr.io/kube-proxy-amd64:v1.27.3-gke.100", 27),
            (
                "mcr.microsoft.com/oss/kubernetes/kube-proxy:v1.26.6-hotfix.20230612",
                26,
            ),
            ("localhost:5000/kube-proxy:v1.30.1", 30),
            ("registry.k8s.io/kube-proxy:v1.31.0@sha256:0123", 31),
        ];
        for (image, minor) in cases {
            assert_eq!(KubeProxyVersion::parse(image), Ok(v(minor)), "{image}");
        }
        assert!(matches!(
            KubeProxyVersion::from_image(
                "rancher/hardened-kubernetes:v1.28.4-rke2r1-build20231213"
            ),
            Err(VersionError::RenamedImage(_))
        ));
        assert!(matches!(
            KubeProxyVersion::from_image("registry.k8s.io/kube-proxy@sha256:0123"),
            Err(VersionError::UntaggedImage(_))
        ));
        assert!(matches!(
            KubeProxyVersion::from_image("localhost:5000/kube-proxy"),
            Err(VersionError::UntaggedImage(_))
        ));
        assert!(matches!(
            KubeProxyVersion::from_image("registry.k8s.io/kube-proxy:latest"),
            Err(VersionError::UntaggedImage(_))
        ));
        assert_eq!(
            KubeProxyVersion::from_image("registry.k8s.io/kube-proxy:v1.18.0"),
            Err(VersionError::TooOld(18))
        );
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
        assert!(
            KubeProxyVersion::all()
                .filter(|v| v.chains_every_endpoint())
                .eq([v(22)])
        );
        let newest = KubeProxyVersion::default();
        assert_eq!(newest, KubeProxyVersion::NEWEST);
        assert_eq!(newest.to_string(), "1.35");
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
