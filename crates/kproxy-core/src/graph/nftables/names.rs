//! kube-proxy's per-service object names in its nftables table, read back: `service-`, `local-`,
//! `external-`, `firewall-` + `HASH-ns/name/proto/port` and `endpoint-` + `HASH-ns/name/proto/
//! port__ip/port` (kube-proxy's `servicePortChainNameBase` / `servicePortEndpointChainNameBase` in
//! `pkg/proxy/nftables/proxier.go`), with the hash checked against the rest of the name.

use crate::graph::ChainKind;
use crate::model::nft_names::{
    ENDPOINT_PREFIX, EXTERNAL_PREFIX, FIREWALL_PREFIX, LOCAL_PREFIX, SERVICE_PREFIX,
    hash_and_truncate,
};

/// Length of the hash kube-proxy puts before the name.
const HASH_LEN: usize = 8;

/// A per-service chain name split into its parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjectName<'n> {
    /// `Svc` (`service-`), `Svl` (`local-`), `Ext` (`external-`), `Fw` (`firewall-`) or `Sep`
    /// (`endpoint-`).
    pub kind: ChainKind,
    /// The 8-character hash.
    pub hash: &'n str,
    /// What the hash is over: `ns/name/proto/port`, or `ns/name/proto/port__ip/port` for an
    /// endpoint (`ip` with `.` for `:`); cut and ending in `...` when the name was too long.
    pub hashed: &'n str,
}

impl<'n> ObjectName<'n> {
    /// The service-port part: `ns/name/proto/port` (for an endpoint, what precedes `__`).
    pub fn service_part(&self) -> &'n str {
        match self.kind {
            ChainKind::Sep => self
                .hashed
                .rsplit_once("__")
                .map_or(self.hashed, |(svc, _)| svc),
            _ => self.hashed,
        }
    }

    /// True when kube-proxy cut the name (`...` at the end): the hash cannot be checked.
    pub fn truncated(&self) -> bool {
        self.hashed.ends_with("...")
    }

    /// Whether the hash is kube-proxy's hash of the rest of the name (`None` when cut).
    pub fn hash_matches(&self) -> Option<bool> {
        if self.truncated() {
            return None;
        }
        Some(hash_and_truncate(self.hashed).get(..HASH_LEN) == Some(self.hash))
    }

    /// The service port this name belongs to, when the name holds all of it.
    pub fn service_port(&self) -> Option<ServicePortName<'n>> {
        ServicePortName::parse(self.service_part())
    }
}

/// Parses a per-service chain name; `None` for kube-proxy's fixed chains and foreign names.
pub fn parse_object_name(name: &str) -> Option<ObjectName<'_>> {
    let (kind, rest) = [
        (ChainKind::Svc, SERVICE_PREFIX),
        (ChainKind::Svl, LOCAL_PREFIX),
        (ChainKind::Ext, EXTERNAL_PREFIX),
        (ChainKind::Fw, FIREWALL_PREFIX),
        (ChainKind::Sep, ENDPOINT_PREFIX),
    ]
    .into_iter()
    .find_map(|(kind, prefix)| name.strip_prefix(prefix).map(|r| (kind, r)))?;
    let hash = rest.get(..HASH_LEN)?;
    let hashed = rest.get(HASH_LEN..)?.strip_prefix('-')?;
    let base32 = |b: u8| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b);
    if !hash.bytes().all(base32) || !hashed.contains('/') {
        return None;
    }
    Some(ObjectName { kind, hash, hashed })
}

/// The kind of a chain name of either proxy mode: kube-proxy's iptables chains
/// (`KUBE-SVC-…`) and its nftables per-service chains (`service-…`).
pub fn chain_kind(name: &str) -> Option<ChainKind> {
    crate::graph::ownership::service_chain(name)
        .map(|(kind, _)| kind)
        .or_else(|| parse_object_name(name).map(|n| n.kind))
}

/// A service port as its chain names spell it: `ns/name/proto/port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServicePortName<'n> {
    /// Namespace.
    pub namespace: &'n str,
    /// Service name.
    pub name: &'n str,
    /// Protocol, lower case.
    pub protocol: &'n str,
    /// Port name (empty for an unnamed port).
    pub port: &'n str,
}

impl<'n> ServicePortName<'n> {
    /// Parses `ns/name/proto/port`; `None` when a part is missing or the name was cut.
    pub fn parse(text: &'n str) -> Option<Self> {
        if text.ends_with("...") {
            return None;
        }
        let mut parts = text.split('/');
        let (namespace, name, protocol, port) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some()
            || namespace.is_empty()
            || name.is_empty()
            || !matches!(protocol, "tcp" | "udp" | "sctp")
        {
            return None;
        }
        Some(ServicePortName {
            namespace,
            name,
            protocol,
            port,
        })
    }

    /// `ns/name:port`, or `ns/name` for an unnamed port (kube-proxy's `ServicePortName` string).
    pub fn display(&self) -> String {
        if self.port.is_empty() {
            format!("{}/{}", self.namespace, self.name)
        } else {
            format!("{}/{}:{}", self.namespace, self.name, self.port)
        }
    }

    /// The `ns/name/proto/port` text the hash is over.
    pub fn hashed(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.namespace, self.name, self.protocol, self.port
        )
    }
}

/// The `ns/name/proto/port` text of a `no-endpoint-*` element comment (`ns/name[:port]`) and
/// its protocol.
pub fn hashed_from_comment(comment: &str, protocol: &str) -> Option<String> {
    let (service, port) = comment.split_once(':').unwrap_or((comment, ""));
    let (namespace, name) = service.split_once('/')?;
    let spn = ServicePortName {
        namespace,
        name,
        protocol,
        port,
    };
    ServicePortName::parse(&spn.hashed()).map(|s| s.hashed())
}

/// kube-proxy's hash of `hashed` (`ns/name/proto/port`).
pub fn hash_of(hashed: &str) -> String {
    let mut h = hash_and_truncate(hashed);
    h.truncate(HASH_LEN);
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_checks_kube_proxys_names() {
        let n = parse_object_name("service-ULMVA6XW-ns1/svc1/tcp/p80").unwrap();
        assert_eq!(
            (n.kind, n.hash, n.hashed),
            (ChainKind::Svc, "ULMVA6XW", "ns1/svc1/tcp/p80")
        );
        assert_eq!(n.hash_matches(), Some(true));
        assert_eq!(n.service_port().unwrap().display(), "ns1/svc1:p80");
        let e = parse_object_name("endpoint-5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80").unwrap();
        assert_eq!(
            (e.kind, e.service_part()),
            (ChainKind::Sep, "ns1/svc1/tcp/p80")
        );
        assert_eq!(e.hash_matches(), Some(true));
        let v6 =
            parse_object_name("endpoint-ZVRFLKHO-ns1/svc1/tcp/p80__fd00.10.180..1/80").unwrap();
        assert_eq!(v6.service_part(), "ns1/svc1/tcp/p80");
        let bad = parse_object_name("service-ULMVA6XX-ns1/svc1/tcp/p80").unwrap();
        assert_eq!(bad.hash_matches(), Some(false));
        let unnamed = parse_object_name("local-AAAAAAAA-ns/svc/udp/").unwrap();
        assert_eq!(unnamed.service_port().unwrap().display(), "ns/svc");
        for foreign in [
            "services",
            "service-endpoints-check",
            "firewall-check",
            "service-ulmva6xw-ns1/svc1/tcp/p80",
            "KUBE-SVC-AAAAAAAAAAAAAAAA",
        ] {
            assert!(parse_object_name(foreign).is_none(), "{foreign}");
        }
        assert_eq!(
            chain_kind("KUBE-SEP-AAAAAAAAAAAAAAAA"),
            Some(ChainKind::Sep)
        );
        assert_eq!(
            chain_kind("external-42NFTM6N-ns2/svc2/tcp/p80"),
            Some(ChainKind::Ext)
        );
        assert_eq!(
            hashed_from_comment("ns2/svc2:p80", "tcp").as_deref(),
            Some("ns2/svc2/tcp/p80")
        );
        assert_eq!(hash_of("ns2/svc2/tcp/p80"), "42NFTM6N");
    }
}
