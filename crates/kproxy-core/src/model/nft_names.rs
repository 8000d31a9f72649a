//! Names in kube-proxy's nftables table (`pkg/proxy/nftables/proxier.go`): the fixed chains, sets
//! and maps, the prefixes of its per-service objects, and `hashAndTruncate`, which names them.
//! Both sides read them: the proxier writes these names, the graph reads them back.

use sha2::{Digest, Sha256};

/// The table kube-proxy owns in the `ip` and the `ip6` family.
pub const TABLE: &str = "kube-proxy";
/// The table's comment.
pub const TABLE_COMMENT: &str = "rules for kube-proxy";

/// Base chain at the prerouting hook, before DNAT: LoadBalancerSourceRanges.
pub const FILTER_PREROUTING_PRE_DNAT: &str = "filter-prerouting-pre-dnat";
/// Base chain at the output hook, before DNAT: LoadBalancerSourceRanges.
pub const FILTER_OUTPUT_PRE_DNAT: &str = "filter-output-pre-dnat";
/// Base chain at the input hook (filter priority).
pub const FILTER_INPUT: &str = "filter-input";
/// Base chain at the forward hook (filter priority).
pub const FILTER_FORWARD: &str = "filter-forward";
/// Base chain at the output hook (filter priority).
pub const FILTER_OUTPUT: &str = "filter-output";
/// Base nat chain at the prerouting hook.
pub const NAT_PREROUTING: &str = "nat-prerouting";
/// Base nat chain at the output hook.
pub const NAT_OUTPUT: &str = "nat-output";
/// Base nat chain at the postrouting hook.
pub const NAT_POSTROUTING: &str = "nat-postrouting";

/// Service dispatch chain (the `service-ips` / `service-nodeports` lookups).
pub const SERVICES_CHAIN: &str = "services";
/// Map: destination IP . protocol . port → the service's chain.
pub const SERVICE_IPS_MAP: &str = "service-ips";
/// Map: protocol . node port → the service's external chain.
pub const SERVICE_NODEPORTS_MAP: &str = "service-nodeports";
/// Set of the node addresses NodePorts are accepted on.
pub const NODEPORT_IPS_SET: &str = "nodeport-ips";
/// Set of the active cluster IPs.
pub const CLUSTER_IPS_SET: &str = "cluster-ips";
/// Chain looking up `no-endpoint-services`.
pub const SERVICE_ENDPOINTS_CHECK_CHAIN: &str = "service-endpoints-check";
/// Chain looking up `no-endpoint-nodeports`.
pub const NODEPORT_ENDPOINTS_CHECK_CHAIN: &str = "nodeport-endpoints-check";
/// Map: service IP . protocol . port → drop / reject for services without endpoints.
pub const NO_ENDPOINT_SERVICES_MAP: &str = "no-endpoint-services";
/// Map: protocol . node port → drop / reject for node ports without endpoints.
pub const NO_ENDPOINT_NODEPORTS_MAP: &str = "no-endpoint-nodeports";
/// Chain holding the one `reject` rule the no-endpoint maps jump to.
pub const REJECT_CHAIN: &str = "reject-chain";
/// Chain rejecting unknown ports of cluster IPs and dropping unallocated cluster IPs.
pub const CLUSTER_IPS_CHECK_CHAIN: &str = "cluster-ips-check";
/// Map: LoadBalancer IP . protocol . port → the service's firewall chain.
pub const FIREWALL_IPS_MAP: &str = "firewall-ips";
/// Chain looking up `firewall-ips`.
pub const FIREWALL_CHECK_CHAIN: &str = "firewall-check";
/// Chain setting the masquerade mark.
pub const MARK_MASQ_CHAIN: &str = "mark-for-masquerade";
/// Chain masquerading marked packets (from nat-postrouting).
pub const MASQUERADING_CHAIN: &str = "masquerading";

/// Set of the connections of local endpoints to themselves through a service (`saddr . daddr
/// . proto . port`), masqueraded in `masquerading` (since 1.36, replacing the endpoint chains'
/// hairpin marks).
pub const HAIRPIN_CONNECTIONS_SET: &str = "hairpin-connections";
/// Map: protocol . NodePort → the reject chain of its protocol, for localhost NodePorts kube-proxy
/// does not serve (1.38, `KubeProxyNFTablesLocalhostNodePorts`).
pub const LOCALHOST_NODEPORT_REJECT_MAP: &str = "localhost-nodeport-reject-ports";
/// Prefix of the per-protocol chains `localhost-nodeport-reject-ports` leads to (`…-tcp`).
pub const LOCALHOST_NODEPORT_REJECT_PREFIX: &str = "localhost-nodeport-reject-";

/// Prefix of the Cluster-policy chain of a service port.
pub const SERVICE_PREFIX: &str = "service-";
/// Prefix of the Local-policy chain of a service port.
pub const LOCAL_PREFIX: &str = "local-";
/// Prefix of the external-destinations chain of a service port.
pub const EXTERNAL_PREFIX: &str = "external-";
/// Prefix of the LoadBalancerSourceRanges chain of a service port.
pub const FIREWALL_PREFIX: &str = "firewall-";
/// Prefix of an endpoint chain.
pub const ENDPOINT_PREFIX: &str = "endpoint-";
/// Prefix of an endpoint's session-affinity set.
pub const AFFINITY_PREFIX: &str = "affinity-";

/// knftables' `NameLengthMax`.
const NAME_LENGTH_MAX: usize = 256;
/// The longest prefix kube-proxy puts before a base name, hyphen included.
const PREFIX_LENGTH_MAX: usize = 16;
/// The longest base name (`chainNameBaseLengthMax`).
const BASE_LENGTH_MAX: usize = NAME_LENGTH_MAX - PREFIX_LENGTH_MAX;

/// kube-proxy's `hashAndTruncate`: the first 8 characters of base32(sha256(`name`)), `-`, then
/// `name`; a result longer than 240 bytes is cut to 237 and ends in `...`.
pub fn hash_and_truncate(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let mut hash = [0u8; 8];
    // 5 bytes are exactly the first 8 base32 characters.
    if let Some(head) = digest.get(..5) {
        data_encoding::BASE32.encode_mut(head, &mut hash);
    }
    let mut out = String::with_capacity(9 + name.len());
    out.push_str(std::str::from_utf8(&hash).unwrap_or(""));
    out.push('-');
    out.push_str(name);
    if out.len() > BASE_LENGTH_MAX {
        let mut cut = BASE_LENGTH_MAX - 3;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
        out.push_str("...");
    }
    out
}
