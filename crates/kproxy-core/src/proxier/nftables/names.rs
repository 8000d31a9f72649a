//! Names in kube-proxy's nftables table (`pkg/proxy/nftables/proxier.go`): the fixed chains, sets
//! and maps, and the hashed per-service objects `service-`/`local-`/`external-`/`firewall-` +
//! `HASH-ns/name/proto/port` and `endpoint-`/`affinity-` + `HASH-ns/name/proto/port__ip/port`
//! (`hashAndTruncate`, `servicePortChainNameBase`, `servicePortEndpointChainNameBase`). The fixed
//! names and `hashAndTruncate` live in [`crate::model::nft_names`], which the graph reads too.

pub use crate::model::nft_names::*;
use crate::proxier::service_port::ServicePortName;

/// The set of connections a local endpoint makes to itself through a service (1.36:
/// `hairpinConnectionsSet`), masqueraded in `masquerading`.
pub const HAIRPIN_CONNECTIONS_SET: &str = "hairpin-connections";
/// The map of localhost NodePorts kube-proxy rejects (1.37 with
/// `KubeProxyNFTablesLocalhostNodePorts`: `localhostNodePortRejectMap`).
pub const LOCALHOST_NODEPORT_REJECT_MAP: &str = "localhost-nodeport-reject-ports";
/// The prefix of the per-protocol chains that count and reject localhost NodePort traffic
/// (`localhostNodePortRejectChainName`: + `tcp` / `udp` / `sctp`).
pub const LOCALHOST_NODEPORT_REJECT_PREFIX: &str = "localhost-nodeport-reject-";
/// The prefix this build gives the per-protocol counters of those chains. kube-proxy names them
/// with `metrics.LocalhostNodePortRejectedCounterName(protocol)`, whose text no stored source
/// shows (docs/versions.md): `verify` reads the node's own counter names rather than this.
pub const LOCALHOST_NODEPORT_REJECTED_COUNTER_PREFIX: &str = "localhost-nodeport-rejected-";

/// `servicePortChainNameBase`: `HASH-ns/name/proto/port` (unnamed port: empty last part).
pub fn service_port_chain_name_base(spn: &ServicePortName) -> String {
    let mut name = String::with_capacity(spn.namespace.len() + spn.name.len() + spn.port.len() + 8);
    name.push_str(&spn.namespace);
    name.push('/');
    name.push_str(&spn.name);
    name.push('/');
    name.push_str(spn.protocol.lower());
    name.push('/');
    name.push_str(&spn.port);
    hash_and_truncate(&name)
}

/// `servicePortEndpointChainNameBase`: `HASH-ns/name/proto/port__ip/port` for `endpoint`
/// (`ip:port` or `[ip6]:port`, as kube-proxy prints endpoints), where an IPv6 address has every
/// `:` replaced by `.` (chain names cannot hold colons).
pub fn endpoint_chain_name_base(spn: &ServicePortName, endpoint: &str) -> String {
    let (ip, port) = split_host_port(endpoint);
    let mut name =
        String::with_capacity(spn.namespace.len() + spn.name.len() + spn.port.len() + 56);
    name.push_str(&spn.namespace);
    name.push('/');
    name.push_str(&spn.name);
    name.push('/');
    name.push_str(spn.protocol.lower());
    name.push('/');
    name.push_str(&spn.port);
    name.push_str("__");
    for c in ip.chars() {
        name.push(if c == ':' { '.' } else { c });
    }
    name.push('/');
    name.push_str(port);
    hash_and_truncate(&name)
}

/// Go's `net.SplitHostPort` for the forms endpoints take (`ip:port`, `[ip6]:port`).
fn split_host_port(endpoint: &str) -> (&str, &str) {
    if let Some(rest) = endpoint.strip_prefix('[')
        && let Some((host, port)) = rest.split_once("]:")
    {
        return (host, port);
    }
    endpoint.rsplit_once(':').unwrap_or((endpoint, ""))
}

/// Whether `chain` is a per-service chain (kube-proxy's `isServiceChainName`: only those hold a
/// `/`), which kube-proxy flushes and later deletes when it is no longer used.
pub fn is_service_chain_name(chain: &str) -> bool {
    chain.contains('/')
}

/// Whether `set` is an endpoint's session-affinity set (`isAffinitySetName`).
pub fn is_affinity_set_name(set: &str) -> bool {
    set.starts_with(AFFINITY_PREFIX)
}

/// The per-service-port chain names (`newServiceInfo`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ChainNames {
    /// `service-HASH-…`: Cluster traffic policy.
    pub cluster_policy: String,
    /// `local-HASH-…`: Local traffic policy.
    pub local_policy: String,
    /// `external-HASH-…`: NodePort, external IP and LoadBalancer traffic.
    pub external: String,
    /// `firewall-HASH-…`: loadBalancerSourceRanges.
    pub firewall: String,
}

impl ChainNames {
    /// The chain names of service port `spn`.
    pub fn new(spn: &ServicePortName) -> ChainNames {
        let base = service_port_chain_name_base(spn);
        ChainNames {
            cluster_policy: format!("{SERVICE_PREFIX}{base}"),
            local_policy: format!("{LOCAL_PREFIX}{base}"),
            external: format!("{EXTERNAL_PREFIX}{base}"),
            firewall: format!("{FIREWALL_PREFIX}{base}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxier::service_port::Protocol;

    fn spn(ns: &str, name: &str, port: &str) -> ServicePortName {
        ServicePortName {
            namespace: ns.into(),
            name: name.into(),
            port: port.into(),
            protocol: Protocol::Tcp,
        }
    }

    /// kube-proxy's `Test_servicePortChainNameBase` and `Test_servicePortEndpointChainNameBase`
    /// vectors, plus hashes of its golden dumps.
    #[test]
    fn kube_proxy_hash_vectors() {
        let base = |ns, name, port| service_port_chain_name_base(&spn(ns, name, port));
        assert_eq!(
            base("testing", "service", "http"),
            "P4ZYZVCF-testing/service/tcp/http"
        );
        assert_eq!(
            base("testing", "service", "https"),
            "LZBRENCP-testing/service/tcp/https"
        );
        assert_eq!(base("ns1", "svc1", "p80"), "ULMVA6XW-ns1/svc1/tcp/p80");
        assert_eq!(base("ns5", "svc5", "p80"), "HVFWP5L3-ns5/svc5/tcp/p80");
        let ep =
            |endpoint: &str| endpoint_chain_name_base(&spn("testing", "service", "http"), endpoint);
        assert_eq!(
            ep("10.180.0.1:80"),
            "JO2XBXZR-testing/service/tcp/http__10.180.0.1/80"
        );
        assert_eq!(
            ep("10.180.0.2:80"),
            "5S6H3H22-testing/service/tcp/http__10.180.0.2/80"
        );
        assert_eq!(
            ep("[fd80:abcd:12::a1b2:c3d4:e5f6:9999]:80"),
            "U7E2ET36-testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80"
        );
        assert_eq!(
            endpoint_chain_name_base(&spn("ns1", "svc1", "p80"), "10.0.1.1:80"),
            "5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80"
        );
    }

    /// The 63-character names of the same tests: the service base fits (205 characters), an
    /// endpoint base of exactly 240 is kept, longer ones are cut to 237 + `...` and told apart by
    /// the hash alone.
    #[test]
    fn long_names_are_truncated_with_distinct_hashes() {
        let ns = "very-long-namespace-name-abcdefghijklmnopqrstuvwxyz0123456789xx";
        let svc = "very-long-service-name-why-would-you-even-do-this-i-mean-really";
        let port = "port-443-providing-the-hypertext-transmission-protocol-with-tls";
        let long = ServicePortName {
            protocol: Protocol::Sctp,
            ..spn(ns, svc, port)
        };
        let head = format!("{ns}/{svc}/sctp/{port}");
        let base = service_port_chain_name_base(&long);
        assert_eq!(base, format!("KR6NACJP-{head}"));
        assert_eq!(base.len(), 205);
        let ep = |ip: &str| endpoint_chain_name_base(&long, &format!("[{ip}]:443"));
        let fits = ep("1234:5678:9abc:def0::abc:1234");
        assert_eq!(
            fits,
            format!("5YS7AFEA-{head}__1234.5678.9abc.def0..abc.1234/443")
        );
        assert_eq!(fits.len(), 240);
        assert_eq!(
            ep("1234:5678:9abc:def0::abcd:1234:5678"),
            format!("CI6C53Q3-{head}__1234.5678.9abc.def0..abcd.1234...")
        );
        assert_eq!(
            ep("1234:5678:9abc:def0::abcd:1234:8765"),
            format!("2FLXFK6X-{head}__1234.5678.9abc.def0..abcd.1234...")
        );
    }

    #[test]
    fn chain_kinds() {
        assert!(is_service_chain_name("service-ULMVA6XW-ns1/svc1/tcp/p80"));
        assert!(!is_service_chain_name(SERVICES_CHAIN));
        assert!(is_affinity_set_name(
            "affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80"
        ));
        let names = ChainNames::new(&spn("ns2", "svc2", "p80"));
        assert_eq!(names.external, "external-42NFTM6N-ns2/svc2/tcp/p80");
    }
}
