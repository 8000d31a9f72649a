//! Service port names: from kube-proxy's rule comments, and from chain hashes when a dump has no
//! comments (`proxier.go` `portProtoHash`): `KUBE-SVC-` + `base32(sha256(servicePortName + lowercase protocol))[:16]`.
//! Without API state only the hash can be shown; a caller that knows the service ports (from
//! `ClusterState`) passes them as a [`NameResolver`] to turn hashes back into names.

use std::collections::HashMap;
use std::sync::Arc;

/// The hash of a service port: kube-proxy's `portProtoHash(spn, lowercase(proto))`, e.g.
/// `ns1/svc1:p80` + `TCP` → `XPGD46QRK7WJZT7O` (hashing itself lives in [`crate::model::hashing`]).
pub fn port_proto_hash(service_port_name: &str, protocol: &str) -> String {
    crate::model::hashing::port_proto_hash(service_port_name, &protocol.to_ascii_lowercase())
}

/// Turns service-port chain hashes back into names, from the service ports a caller knows.
/// Clones share one table (verify hands a node's 10k names to the graph and keeps them for the
/// rule level).
#[derive(Debug, Clone, Default)]
pub struct NameResolver {
    by_hash: Arc<HashMap<String, (String, String)>>,
}

impl NameResolver {
    /// An empty resolver (names come from comments only).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a service port (`ns/name[:port]`, protocol in any case).
    pub fn add(&mut self, service_port_name: &str, protocol: &str) -> &mut Self {
        let proto = protocol.to_ascii_lowercase();
        Arc::make_mut(&mut self.by_hash).insert(
            port_proto_hash(service_port_name, &proto),
            (service_port_name.to_string(), proto),
        );
        self
    }

    /// A resolver from `(service port name, protocol)` pairs.
    pub fn from_ports<I, S, P>(ports: I) -> Self
    where
        I: IntoIterator<Item = (S, P)>,
        S: AsRef<str>,
        P: AsRef<str>,
    {
        let mut r = Self::new();
        for (n, p) in ports {
            r.add(n.as_ref(), p.as_ref());
        }
        r
    }

    /// The `(name, protocol)` whose service-port hash is `hash`, if known.
    pub fn resolve(&self, hash: &str) -> Option<(&str, &str)> {
        self.by_hash
            .get(hash)
            .map(|(n, p)| (n.as_str(), p.as_str()))
    }

    /// Number of registered service ports.
    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    /// True when nothing is registered.
    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }
}

/// What a kube-proxy rule comment says about its rule (the comments `syncProxyRules` writes; older
/// releases too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommentRole {
    /// `"<spn> cluster IP"`.
    ClusterIp,
    /// `"<spn> external IP"`.
    ExternalIp,
    /// `"<spn> loadbalancer IP"`.
    LoadBalancerIp,
    /// `"<spn> health check node port"`.
    HealthCheck,
    /// `"<spn> has no endpoints"`.
    NoEndpoints,
    /// `"<spn> has no local endpoints"`.
    NoLocalEndpoints,
    /// `"<spn> -> ip:port"` (SVC/SVL → SEP).
    ToEndpoint,
    /// `"masquerade traffic for <spn> external destinations"`.
    MasqueradeExternal,
    /// `"masquerade LOCAL traffic for <spn> …"`.
    MasqueradeLocal,
    /// `"pod traffic for <spn> …"` or old `"Redirect pods trying to reach external loadbalancer VIP to clusterIP"`.
    PodTraffic,
    /// `"route LOCAL traffic for <spn> …"`.
    RouteLocal,
    /// `"<spn> traffic not accepted by KUBE-FW-…"`.
    FirewallDrop,
    /// `"other traffic to <spn> will be dropped by KUBE-PROXY-FIREWALL"`.
    FirewallOther,
    /// `"Balancing rule N for <spn>"` (old KUBE-XLB).
    Balancing,
    /// The bare `<spn>` (NodePort and SEP rules) or anything else after the name.
    Plain,
}

/// A parsed kube-proxy comment: the service port name and what the rule is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceComment<'a> {
    /// `ns/name[:port]` as written (old releases wrote `ns/name:` for unnamed ports; kept verbatim
    /// because their chain hashes were computed over that text).
    pub name: &'a str,
    /// What the rule is for.
    pub role: CommentRole,
}

/// Parses a kube-proxy rule comment; `None` for comments that name no service port
/// (`kubernetes service portals`, other software's comments).
pub fn parse_comment(comment: &str) -> Option<ServiceComment<'_>> {
    let c = comment.trim();
    let prefixes: [(&str, CommentRole); 5] = [
        ("masquerade traffic for ", CommentRole::MasqueradeExternal),
        (
            "masquerade LOCAL traffic for ",
            CommentRole::MasqueradeLocal,
        ),
        ("pod traffic for ", CommentRole::PodTraffic),
        ("route LOCAL traffic for ", CommentRole::RouteLocal),
        ("other traffic to ", CommentRole::FirewallOther),
    ];
    let (rest, prefix_role) = prefixes
        .iter()
        .find_map(|(p, r)| c.strip_prefix(p).map(|rest| (rest, Some(*r))))
        .or_else(|| {
            c.strip_prefix("Balancing rule ").and_then(|r| {
                r.split_once(" for ")
                    .map(|(_, rest)| (rest, Some(CommentRole::Balancing)))
            })
        })
        .unwrap_or((c, None));
    let (name, tail) = match rest.split_once(' ') {
        Some((n, t)) => (n, t.trim()),
        None => (rest, ""),
    };
    if !looks_like_service_port_name(name) {
        return None;
    }
    let role = prefix_role.unwrap_or(match tail {
        "cluster IP" => CommentRole::ClusterIp,
        "external IP" => CommentRole::ExternalIp,
        "loadbalancer IP" => CommentRole::LoadBalancerIp,
        "health check node port" => CommentRole::HealthCheck,
        "has no endpoints" => CommentRole::NoEndpoints,
        "has no local endpoints" => CommentRole::NoLocalEndpoints,
        t if t.starts_with("-> ") => CommentRole::ToEndpoint,
        t if t.starts_with("traffic not accepted by ") => CommentRole::FirewallDrop,
        _ => CommentRole::Plain,
    });
    Some(ServiceComment { name, role })
}

/// `ns/name` or `ns/name:port` with DNS-label-ish characters.
fn looks_like_service_port_name(s: &str) -> bool {
    let Some((ns, rest)) = s.split_once('/') else {
        return false;
    };
    let name = rest.split_once(':').map_or(rest, |(n, _)| n);
    let ok = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
    };
    ok(ns) && ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_kube_proxy() {
        assert_eq!(port_proto_hash("ns1/svc1:p80", "TCP"), "XPGD46QRK7WJZT7O");
        assert_eq!(port_proto_hash("ns2/svc2:p80", "tcp"), "GNZBNJ2PO5MGZ6GT");
        // real-world sample 01: default/kubernetes:https
        assert_eq!(
            port_proto_hash("default/kubernetes:https", "tcp"),
            "NPX46M4PTMTKRN6Y"
        );
    }

    #[test]
    fn resolver_turns_hashes_into_names() {
        let r = NameResolver::from_ports([("ns1/svc1:p80", "TCP")]);
        assert_eq!(r.resolve("XPGD46QRK7WJZT7O"), Some(("ns1/svc1:p80", "tcp")));
        assert_eq!(r.resolve("GNZBNJ2PO5MGZ6GT"), None);
    }

    #[test]
    fn parses_comments() {
        let c = |s| parse_comment(s).map(|c| (c.name, c.role));
        assert_eq!(
            c("ns/svc:p80 cluster IP"),
            Some(("ns/svc:p80", CommentRole::ClusterIp))
        );
        assert_eq!(
            c("default/nginx -> 10.42.0.10:8080"),
            Some(("default/nginx", CommentRole::ToEndpoint))
        );
        assert_eq!(
            c("masquerade traffic for a/b:c external destinations"),
            Some(("a/b:c", CommentRole::MasqueradeExternal))
        );
        assert_eq!(
            c("Balancing rule 1 for default/php-apache-svc:http"),
            Some(("default/php-apache-svc:http", CommentRole::Balancing))
        );
        assert_eq!(
            c("kube-system/monitoring-grafana:"),
            Some(("kube-system/monitoring-grafana:", CommentRole::Plain))
        );
        assert_eq!(
            c("ns/s:p traffic not accepted by KUBE-FW-GNZBNJ2PO5MGZ6GT"),
            Some(("ns/s:p", CommentRole::FirewallDrop))
        );
        assert_eq!(c("kubernetes service portals"), None);
        assert_eq!(
            c("kubernetes service nodeports; NOTE: this must be the last rule in this chain"),
            None
        );
        assert_eq!(
            c("allow LOCAL TCP traffic to node ports - LR7XO7NXDBGQJD2M"),
            None
        );
    }
}
