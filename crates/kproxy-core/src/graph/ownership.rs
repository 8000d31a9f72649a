//! Which chains are kube-proxy's: decided by kube-proxy's exact chain-name patterns, never by the
//! `KUBE-` prefix alone (kube-router's `KUBE-ROUTER-*`/`KUBE-POD-FW-*`/`KUBE-NWPLCY-*`, kubelet's
//! `KUBE-KUBELET-CANARY`/`KUBE-IPTABLES-HINT` share the prefix and must never be touched).
//!
//! Patterns (`proxier.go` of every release since 1.20 and older ones):
//! * per-service chains `KUBE-{SVC,SVL,EXT,FW,SEP,XLB}-` + 16 characters of base32 (`A–Z2–7`);
//! * the fixed chains kube-proxy creates in each table.

/// The kind of a kube-proxy chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChainKind {
    /// `KUBE-SVC-<hash>`: cluster-policy service chain.
    Svc,
    /// `KUBE-SVL-<hash>`: local-policy service chain.
    Svl,
    /// `KUBE-EXT-<hash>`: external-destinations chain.
    Ext,
    /// `KUBE-FW-<hash>`: load-balancer source-range firewall chain.
    Fw,
    /// `KUBE-SEP-<hash>`: endpoint chain.
    Sep,
    /// `KUBE-XLB-<hash>`: pre-1.24 `externalTrafficPolicy: Local` chain.
    Xlb,
    /// One of kube-proxy's fixed chains (`KUBE-SERVICES`, `KUBE-NODEPORTS`, …).
    Fixed,
}

impl ChainKind {
    /// True for the per-service chains whose hash is the service port's (SVC, SVL, EXT, FW, XLB).
    pub fn is_service_port_chain(self) -> bool {
        matches!(
            self,
            ChainKind::Svc | ChainKind::Svl | ChainKind::Ext | ChainKind::Fw | ChainKind::Xlb
        )
    }
}

/// Fixed chains kube-proxy creates, per table (current and older releases).
const FIXED_NAT: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-POSTROUTING",
    "KUBE-MARK-MASQ",
    "KUBE-MARK-DROP",
    "KUBE-PROXY-CANARY",
];
const FIXED_FILTER: &[&str] = &[
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-FORWARD",
    "KUBE-NODEPORTS",
    "KUBE-PROXY-FIREWALL",
    "KUBE-FIREWALL",
    "KUBE-PROXY-CANARY",
];
const FIXED_MANGLE: &[&str] = &["KUBE-PROXY-CANARY"];

/// True if `s` is exactly 16 characters of the RFC 4648 base32 alphabet (`A–Z`, `2–7`).
pub fn is_chain_hash(s: &str) -> bool {
    /// The base32 alphabet as a byte table (runs for every chain and jump of a large dump).
    const BASE32: [bool; 256] = {
        let mut t = [false; 256];
        let mut b = 0;
        while b < 256 {
            t[b] = (b >= b'A' as usize && b <= b'Z' as usize)
                || (b >= b'2' as usize && b <= b'7' as usize);
            b += 1;
        }
        t
    };
    s.len() == 16 && s.bytes().all(|b| BASE32[usize::from(b)])
}

/// Classifies a per-service chain name by pattern, whatever the table: `KUBE-SVC-XPGD46QRK7WJZT7O`
/// → `(Svc, "XPGD46QRK7WJZT7O")`. Fixed chains and foreign names give `None`.
pub fn service_chain(name: &str) -> Option<(ChainKind, &str)> {
    // Every per-service chain is `KUBE-` + a short kind + `-` + 16 hash characters: check the
    // length and the kind's first letter before comparing prefixes (this runs for every chain
    // and every jump of a 100k-chain dump).
    let rest = name.strip_prefix("KUBE-")?;
    if !(19..=20).contains(&rest.len()) {
        return None;
    }
    let (prefix, kind) = match rest.as_bytes().first()? {
        b'S' => match rest.as_bytes().get(1..3)? {
            b"VC" => ("SVC-", ChainKind::Svc),
            b"VL" => ("SVL-", ChainKind::Svl),
            b"EP" => ("SEP-", ChainKind::Sep),
            _ => return None,
        },
        b'E' => ("EXT-", ChainKind::Ext),
        b'F' => ("FW-", ChainKind::Fw),
        b'X' => ("XLB-", ChainKind::Xlb),
        _ => return None,
    };
    rest.strip_prefix(prefix)
        .filter(|h| is_chain_hash(h))
        .map(|h| (kind, h))
}

/// The kind of `name` if kube-proxy creates it in `table` (`nat`, `filter`, `mangle`), else `None`.
/// Per-service chains live only in `nat`.
pub fn classify(table: &str, name: &str) -> Option<ChainKind> {
    let fixed = match table {
        "nat" => FIXED_NAT,
        "filter" => FIXED_FILTER,
        "mangle" => FIXED_MANGLE,
        _ => &[][..],
    };
    if fixed.contains(&name) {
        return Some(ChainKind::Fixed);
    }
    if table == "nat" {
        return service_chain(name).map(|(k, _)| k);
    }
    None
}

/// True if kube-proxy (iptables mode, any release since v1.2; IPVS-mode chains are not listed here)
/// creates the chain `name` in `table`.
/// Use this, not a `KUBE-` prefix test, wherever ownership matters (verify, repair, graph anomalies).
pub fn is_kube_proxy_chain(table: &str, name: &str) -> bool {
    classify(table, name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owns_exact_patterns_only() {
        assert!(is_kube_proxy_chain("nat", "KUBE-SVC-XPGD46QRK7WJZT7O"));
        assert!(is_kube_proxy_chain("nat", "KUBE-SEP-SXIVWICOYRO3J4NJ"));
        assert!(is_kube_proxy_chain("nat", "KUBE-XLB-TLHPL6Z5YI33DALW"));
        assert!(is_kube_proxy_chain("nat", "KUBE-MARK-MASQ"));
        assert!(is_kube_proxy_chain("filter", "KUBE-PROXY-FIREWALL"));
        assert!(is_kube_proxy_chain("mangle", "KUBE-PROXY-CANARY"));
        // kube-router, kubelet and lookalikes
        assert!(!is_kube_proxy_chain("filter", "KUBE-ROUTER-INPUT"));
        assert!(!is_kube_proxy_chain(
            "filter",
            "KUBE-POD-FW-4BDGZEWEU32YM75H"
        ));
        assert!(!is_kube_proxy_chain("filter", "KUBE-NWPLCY-DEFAULT"));
        assert!(!is_kube_proxy_chain("nat", "KUBE-KUBELET-CANARY"));
        assert!(!is_kube_proxy_chain("mangle", "KUBE-IPTABLES-HINT"));
        assert!(!is_kube_proxy_chain("nat", "KUBE-SVC-xpgd46qrk7wjzt7o"));
        assert!(!is_kube_proxy_chain("nat", "KUBE-SVC-XPGD46QRK7WJZT7"));
        assert!(!is_kube_proxy_chain("nat", "KUBE-SVC-XPGD46QRK7WJZT71"));
        assert!(!is_kube_proxy_chain("filter", "KUBE-SVC-XPGD46QRK7WJZT7O"));
        assert!(!is_kube_proxy_chain("mangle", "KUBE-SERVICES"));
    }

    /// Per-service chain prefixes and their kinds (kube-proxy's naming).
    const SERVICE_PREFIXES: &[(&str, ChainKind)] = &[
        ("KUBE-SVC-", ChainKind::Svc),
        ("KUBE-SVL-", ChainKind::Svl),
        ("KUBE-EXT-", ChainKind::Ext),
        ("KUBE-FW-", ChainKind::Fw),
        ("KUBE-SEP-", ChainKind::Sep),
        ("KUBE-XLB-", ChainKind::Xlb),
    ];

    #[test]
    fn service_chain_agrees_with_the_prefix_table() {
        fn reference(name: &str) -> Option<(ChainKind, &str)> {
            SERVICE_PREFIXES.iter().find_map(|(prefix, kind)| {
                name.strip_prefix(prefix)
                    .filter(|h| is_chain_hash(h))
                    .map(|h| (*kind, h))
            })
        }
        let mut names = vec![
            "KUBE-SERVICES".to_string(),
            "KUBE-SEP-".to_string(),
            "KUBE-FWD-GNZBNJ2PO5MGZ6GT".to_string(),
            "KUBE-SVCX-GNZBNJ2PO5MGZ6GT".to_string(),
            "kube-svc-GNZBNJ2PO5MGZ6GT".to_string(),
        ];
        for (prefix, _) in SERVICE_PREFIXES {
            for hash in [
                "GNZBNJ2PO5MGZ6GT",
                "GNZBNJ2PO5MGZ6G",
                "GNZBNJ2PO5MGZ6GT7",
                "gnzbnj2po5mgz6gt",
                "GNZBNJ2PO5MGZ6G1",
            ] {
                names.push(format!("{prefix}{hash}"));
            }
        }
        for n in &names {
            assert_eq!(service_chain(n), reference(n), "{n}");
        }
    }

    #[test]
    fn service_chain_splits_kind_and_hash() {
        assert_eq!(
            service_chain("KUBE-FW-GNZBNJ2PO5MGZ6GT"),
            Some((ChainKind::Fw, "GNZBNJ2PO5MGZ6GT"))
        );
        assert_eq!(service_chain("KUBE-SERVICES"), None);
    }
}
