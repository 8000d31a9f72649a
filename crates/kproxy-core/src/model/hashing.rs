//! kube-proxy's chain names: `KUBE-SVC-`/`SVL-`/`EXT-`/`FW-` + base32(sha256(spn + proto))[..16]
//! and `KUBE-SEP-` + base32(sha256(spn + proto + endpoint))[..16] (proxier.go
//! `portProtoHash`, `servicePortEndpointChainName`).

use sha2::{Digest, Sha256};

/// The 16-character hash of a service port: `spn` is `ns/name[:port]`, `proto` lower-case.
pub fn port_proto_hash(spn: &str, proto: &str) -> String {
    let mut h = Sha256::new();
    h.update(spn.as_bytes());
    h.update(proto.as_bytes());
    let mut buf = [0u8; 16];
    encode16(&h.finalize(), &mut buf).to_string()
}

/// The 16-character hash of an endpoint of a service port (`endpoint` is `ip:port` / `[ip6]:port`).
pub fn endpoint_hash(spn: &str, proto: &str, endpoint: &str) -> String {
    let mut buf = [0u8; 16];
    endpoint_hash_into(spn, proto, endpoint, &mut buf).to_string()
}

/// [`endpoint_hash`] into a caller-provided buffer (no allocation).
pub fn endpoint_hash_into<'b>(
    spn: &str,
    proto: &str,
    endpoint: &str,
    buf: &'b mut [u8; 16],
) -> &'b str {
    let mut h = Sha256::new();
    h.update(spn.as_bytes());
    h.update(proto.as_bytes());
    h.update(endpoint.as_bytes());
    encode16(&h.finalize(), buf)
}

fn encode16<'b>(digest: &[u8], buf: &'b mut [u8; 16]) -> &'b str {
    // 10 bytes are exactly 16 base32 characters (no padding), the prefix Go keeps.
    if let Some(head) = digest.get(..10) {
        data_encoding::BASE32.encode_mut(head, buf);
    }
    std::str::from_utf8(buf).unwrap_or("")
}

/// `KUBE-SEP-<hash>`, held inline (25 bytes, no allocation): a 10k-service node has 100k of
/// them. Reads as the chain name (`&str`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointChain([u8; 25]);

impl EndpointChain {
    /// The endpoint chain of `endpoint` of service port `spn` (protocol `proto`, lower-case).
    pub fn of(spn: &str, proto: &str, endpoint: &str) -> EndpointChain {
        let mut name = *b"KUBE-SEP-\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0";
        let mut hash = [0u8; 16];
        endpoint_hash_into(spn, proto, endpoint, &mut hash);
        name[9..].copy_from_slice(&hash);
        EndpointChain(name)
    }

    /// The chain name.
    pub fn as_str(&self) -> &str {
        // ASCII by construction (a prefix and base32 characters).
        std::str::from_utf8(&self.0).unwrap_or("")
    }
}

impl std::ops::Deref for EndpointChain {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for EndpointChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for EndpointChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.as_str(), f)
    }
}

impl serde::Serialize for EndpointChain {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// `KUBE-SVC-<hash>`: the cluster-policy chain.
pub fn service_chain(spn: &str, proto: &str) -> String {
    format!("KUBE-SVC-{}", port_proto_hash(spn, proto))
}

/// `KUBE-SEP-<hash>`: an endpoint chain.
pub fn endpoint_chain(spn: &str, proto: &str, endpoint: &str) -> String {
    format!("KUBE-SEP-{}", endpoint_hash(spn, proto, endpoint))
}

/// The prefixes of the chains kube-proxy owns per service (and garbage-collects).
pub const SERVICE_CHAIN_PREFIXES: [&str; 5] = [
    "KUBE-SVC-",
    "KUBE-SVL-",
    "KUBE-EXT-",
    "KUBE-FW-",
    "KUBE-SEP-",
];

/// Whether `chain` is a per-service chain kube-proxy creates and deletes.
pub fn is_service_chain_name(chain: &str) -> bool {
    SERVICE_CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inline_endpoint_chain_reads_as_the_allocated_name() {
        for (spn, proto, ep) in [
            ("ns1/svc1:p80", "tcp", "10.180.0.1:80"),
            ("ns2/svc2:", "udp", "[fd00::1]:53"),
        ] {
            let inline = EndpointChain::of(spn, proto, ep);
            assert_eq!(inline.as_str(), endpoint_chain(spn, proto, ep));
            assert_eq!(
                format!("{inline} {inline:?}"),
                format!("{0} {0:?}", endpoint_chain(spn, proto, ep))
            );
        }
    }

    #[test]
    fn known_hashes() {
        assert_eq!(
            service_chain("ns1/svc1:p80", "tcp"),
            "KUBE-SVC-XPGD46QRK7WJZT7O"
        );
        assert_eq!(
            endpoint_chain("ns1/svc1:p80", "tcp", "10.180.0.1:80"),
            "KUBE-SEP-SXIVWICOYRO3J4NJ"
        );
        assert_eq!(
            service_chain("ns2/svc2:p80", "tcp"),
            "KUBE-SVC-GNZBNJ2PO5MGZ6GT"
        );
        assert_eq!(
            endpoint_chain("ns2/svc2:p80", "tcp", "10.180.0.2:80"),
            "KUBE-SEP-RS4RBKLTHTF2IUXJ"
        );
        assert!(is_service_chain_name("KUBE-FW-ABC"));
        assert!(!is_service_chain_name("KUBE-SERVICES"));
    }
}
