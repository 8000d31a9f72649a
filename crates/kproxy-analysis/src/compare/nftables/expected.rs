//! The expected side of an nftables comparison: the `kube-proxy` table `render --mode nftables`
//! writes for one IP family, as `add …` lines (parsed by the caller, so the table borrows from
//! them), and an index of what each service port owns in it (its addresses and node port, by
//! which map elements are told apart).

use crate::proxier::nftables::objects::{StringSink, TableFamily};
use crate::proxier::nftables::{decisions, render_each, table_family};
use crate::state::config::ProxyConfig;
use crate::state::ip::IpFamily;
use crate::state::node::NodeFacts;
use crate::state::{ClusterState, Warning};
use kproxy_parsers::nft::{Expr, Family};
use std::collections::HashMap;
use std::net::IpAddr;

/// Which of a service port's addresses a `service-ips` key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    /// `spec.clusterIP(s)`.
    ClusterIp,
    /// `spec.externalIPs`.
    ExternalIp,
    /// A LoadBalancer ingress IP.
    LoadBalancerIp,
}

impl AddressKind {
    /// The words used in messages.
    pub fn words(self) -> &'static str {
        match self {
            AddressKind::ClusterIp => "cluster IP",
            AddressKind::ExternalIp => "external IP",
            AddressKind::LoadBalancerIp => "load-balancer IP",
        }
    }
}

/// One service port as the index knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortEntry {
    /// `ns/name:port` (`ns/name` for an unnamed port), as every finding names it.
    pub label: String,
    /// The port has usable endpoints somewhere (kube-proxy's `hasEndpoints`).
    pub has_endpoints: bool,
}

/// What each service port owns in the table: addresses (`ip . proto . port` keys of
/// `service-ips`, `firewall-ips`, `no-endpoint-services`) and node ports (`proto . port` keys
/// of `service-nodeports`, `no-endpoint-nodeports`).
#[derive(Debug, Clone, Default)]
pub struct PortIndex {
    /// The service ports, in render order.
    pub ports: Vec<PortEntry>,
    addresses: HashMap<(IpAddr, &'static str, u16), (u32, AddressKind)>,
    node_ports: HashMap<(&'static str, u16), u32>,
}

impl PortIndex {
    fn add(&mut self, p: &decisions::PortDecisions) {
        let id = self.ports.len() as u32;
        let info = &p.info;
        let proto = info.name.protocol.lower();
        self.ports.push(PortEntry {
            label: info.name_string.clone(),
            has_endpoints: p.has_endpoints,
        });
        let port = u16::try_from(info.port).unwrap_or(0);
        let mut address = |ip: IpAddr, kind: AddressKind| {
            self.addresses
                .entry((ip, proto, port))
                .or_insert((id, kind));
        };
        address(info.cluster_ip, AddressKind::ClusterIp);
        for ip in &info.external_ips {
            address(*ip, AddressKind::ExternalIp);
        }
        for ip in &info.load_balancer_vips {
            address(*ip, AddressKind::LoadBalancerIp);
        }
        if let Ok(np) = u16::try_from(info.node_port)
            && np != 0
        {
            self.node_ports.entry((proto, np)).or_insert(id);
        }
    }

    /// The service port owning the element key `key` (`ip . proto . port` or `proto . port`),
    /// with the kind of address for the former.
    pub fn owner_of_key(&self, key: &Expr<'_>) -> Option<(&PortEntry, Option<AddressKind>)> {
        let Expr::Concat(parts) = key else {
            return None;
        };
        let entry = |id: u32| self.ports.get(id as usize);
        match parts.as_slice() {
            [Expr::Addr(ip), proto, port] => {
                let (id, kind) = *self
                    .addresses
                    .get(&(*ip, protocol(proto)?, number(port)?))?;
                Some((entry(id)?, Some(kind)))
            }
            [proto, port] => {
                let id = *self.node_ports.get(&(protocol(proto)?, number(port)?))?;
                Some((entry(id)?, None))
            }
            _ => None,
        }
    }
}

/// The protocol of an element key part, as kube-proxy writes it.
fn protocol(e: &Expr<'_>) -> Option<&'static str> {
    match e {
        Expr::Symbol(s) => ["tcp", "udp", "sctp"].into_iter().find(|p| p == s),
        // `nft -j` may print well-known protocols by number.
        Expr::Number(6) => Some("tcp"),
        Expr::Number(17) => Some("udp"),
        Expr::Number(132) => Some("sctp"),
        _ => None,
    }
}

fn number(e: &Expr<'_>) -> Option<u16> {
    match e {
        Expr::Number(n) => u16::try_from(*n).ok(),
        _ => None,
    }
}

/// The rendered table of one family and the index of its service ports.
#[derive(Debug)]
pub struct ExpectedTable {
    /// The IP family.
    pub family: IpFamily,
    /// The `add …` lines (what `render --mode nftables` prints).
    pub text: String,
    /// What each service port owns.
    pub index: PortIndex,
    /// Endpoint chains written (locally reachable endpoints, summed over service ports).
    pub endpoint_chains: usize,
    /// What the render would warn about.
    pub warnings: Vec<Warning>,
}

impl ExpectedTable {
    /// Renders the table of `facts.family` and indexes its service ports. `config` is the
    /// configuration as kube-proxy reads it in nftables mode ([`ProxyConfig::for_nftables`]).
    pub fn build(state: &ClusterState, config: &ProxyConfig, facts: &NodeFacts) -> ExpectedTable {
        let family = table_family(facts.family);
        let mut sink = StringSink {
            family,
            text: String::new(),
        };
        let mut index = PortIndex::default();
        let mut endpoint_chains = 0usize;
        let summary = render_each(state, config, facts, &mut sink, &mut |port| {
            endpoint_chains += port.categorized.reachable.len();
            index.add(port);
        });
        ExpectedTable {
            family: facts.family,
            text: sink.text,
            index,
            endpoint_chains,
            warnings: summary.warnings,
        }
    }

    /// The nftables family of the table (`ip` / `ip6`).
    pub fn nft_family(&self) -> Family {
        nft_family(table_family(self.family))
    }
}

/// The parser's family of a table family.
pub fn nft_family(f: TableFamily) -> Family {
    match f {
        TableFamily::Ip => Family::Ip,
        TableFamily::Ip6 => Family::Ip6,
    }
}

/// The service port a per-service chain or set name belongs to, read from the name
/// (`service-HASH-ns/name/proto/port`, `endpoint-HASH-ns/name/proto/port__ip/port`, …): its
/// label `ns/name:port`, and for endpoint chains and affinity sets the endpoint `ip:port`.
/// `None` for the fixed chains; a name cut by kube-proxy's length limit that hides the service
/// is its own label.
pub fn service_of_name(name: &str) -> Option<(String, Option<String>)> {
    use crate::proxier::nftables::names::*;
    let rest = [
        SERVICE_PREFIX,
        LOCAL_PREFIX,
        EXTERNAL_PREFIX,
        FIREWALL_PREFIX,
        ENDPOINT_PREFIX,
        AFFINITY_PREFIX,
    ]
    .iter()
    .find_map(|p| name.strip_prefix(p))?;
    // `HASH-` is 8 base32 characters and a hyphen.
    let base = rest
        .get(9..)
        .filter(|_| rest.as_bytes().get(8) == Some(&b'-'))?;
    if !base.contains('/') {
        return None;
    }
    let (service, endpoint) = match base.split_once("__") {
        Some((s, e)) => (s, Some(e)),
        None => (base, None),
    };
    let parts: Vec<&str> = service.splitn(4, '/').collect();
    let label = match parts.as_slice() {
        [ns, svc, _proto, ""] => format!("{ns}/{svc}"),
        [ns, svc, _proto, port] => format!("{ns}/{svc}:{port}"),
        _ => return Some((name.to_string(), None)),
    };
    // The endpoint part is `ip/port` with the `:` of IPv6 addresses written `.`.
    let endpoint = endpoint.and_then(|e| {
        let (ip, port) = e.rsplit_once('/')?;
        if ip.matches('.').count() == 3 && !ip.contains("..") && ip.parse::<IpAddr>().is_ok() {
            Some(format!("{ip}:{port}"))
        } else {
            Some(format!("[{}]:{port}", ip.replace('.', ":")))
        }
    });
    Some((label, endpoint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tell_their_service_port() {
        assert_eq!(
            service_of_name("service-ULMVA6XW-ns1/svc1/tcp/p80"),
            Some(("ns1/svc1:p80".into(), None))
        );
        assert_eq!(
            service_of_name("endpoint-5TPGNJF2-ns1/svc1/tcp/p80__10.0.1.1/80"),
            Some(("ns1/svc1:p80".into(), Some("10.0.1.1:80".into())))
        );
        assert_eq!(
            service_of_name(
                "endpoint-U7E2ET36-testing/service/tcp/http__fd80.abcd.12..a1b2.c3d4.e5f6.9999/80"
            ),
            Some((
                "testing/service:http".into(),
                Some("[fd80:abcd:12::a1b2:c3d4:e5f6:9999]:80".into())
            ))
        );
        assert_eq!(
            service_of_name("external-42NFTM6N-ns2/svc2/udp/"),
            Some(("ns2/svc2".into(), None))
        );
        assert_eq!(service_of_name("services"), None);
        assert_eq!(service_of_name("service-endpoints-check"), None);
        assert_eq!(service_of_name("firewall-check"), None);
    }
}
