//! What of kube-proxy's nftables table belongs to the Services whose API object was left out
//! as invalid ([`crate::compare::left_out`]): verify does not judge it and repair does not
//! touch it. kube-proxy names a service port's chains and sets `prefix-HASH-ns/name/proto/port`
//! (`servicePortChainNameBase`, `pkg/proxy/nftables/proxier.go`), comments the map and set
//! elements of a service port with `ns/name:port` (`svcPortNameString`), and puts its cluster
//! IPs in `cluster-ips` (no comment there: matched by address).

use super::diff::target;
use crate::compare::left_out::{LeftOutService, NotChecked, tally};
use kproxy_parsers::nft::{Element, Expr, Table};

/// The set kube-proxy puts every active cluster IP in.
const CLUSTER_IPS: &str = "cluster-ips";

/// Whether a chain or set name is one of `service`'s (`prefix-HASH-ns/name/…`).
fn names_service(name: &str, service: &str) -> bool {
    let Some((_, rest)) = name.split_once('-') else {
        return false;
    };
    rest.get(8..9) == Some("-")
        && rest
            .get(9..)
            .and_then(|r| r.strip_prefix(service))
            .is_some_and(|r| r.starts_with('/'))
}

/// Whether an element's comment names a port of `service` (`ns/name:port`, or `ns/name` for
/// an unnamed port).
fn comment_names(element: &Element<'_>, service: &str) -> bool {
    element.comment.as_deref().is_some_and(|c| {
        c.strip_prefix(service)
            .is_some_and(|r| r.is_empty() || r.starts_with(':'))
    })
}

/// The left-out Service (index into `left_out`) an element belongs to, if any.
fn element_owner(set: &str, element: &Element<'_>, left_out: &[LeftOutService]) -> Option<usize> {
    let leads_to = match &element.value {
        Some(Expr::Verdict(v)) => target(v),
        _ => None,
    };
    left_out.iter().position(|l| {
        comment_names(element, &l.service)
            || leads_to.is_some_and(|chain| names_service(chain, &l.service))
            || (set == CLUSTER_IPS
                && l.cluster_ips
                    .iter()
                    .any(|ip| element.key.to_string() == *ip))
    })
}

/// `table` without what belongs to the Services in `left_out` (their chains and sets, their
/// elements in shared sets and maps), and what was taken out per Service.
pub fn without<'a>(table: &Table<'a>, left_out: &[LeftOutService]) -> (Table<'a>, Vec<NotChecked>) {
    let mut counts: Vec<NotChecked> = Vec::new();
    let mut count = |i: usize, chains: usize, objects: usize| {
        tally(
            &mut counts,
            NotChecked {
                service: left_out[i].service.clone(),
                chains,
                objects,
            },
        );
    };
    let owner = |name: &str| {
        left_out
            .iter()
            .position(|l| names_service(name, &l.service))
    };
    let mut kept = table.clone();
    kept.chains.retain(|c| match owner(&c.name) {
        Some(i) => {
            count(i, 1, 0);
            false
        }
        None => true,
    });
    kept.sets.retain(|s| match owner(&s.name) {
        Some(i) => {
            count(i, 0, 1);
            false
        }
        None => true,
    });
    for set in &mut kept.sets {
        let name = set.name.to_string();
        set.elements
            .retain(|e| match element_owner(&name, e, left_out) {
                Some(i) => {
                    count(i, 0, 1);
                    false
                }
                None => true,
            });
    }
    (kept, counts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::left_out::WrittenPort;
    use kproxy_parsers::nft::{self, Family, ParseOptions};

    const TABLE: &str = r#"table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.10 . tcp . 80 : goto service-ULMVA6XW-shop/web/tcp/http,
			     10.96.0.11 . tcp . 80 : goto service-AAAAAAAA-shop/api/tcp/http }
	}
	set cluster-ips {
		type ipv4_addr
		elements = { 10.96.0.10, 10.96.0.11 }
	}
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.12 . tcp . 81 comment "shop/web:metrics" : goto reject-chain }
	}
	chain reject-chain {
		reject
	}
	chain service-ULMVA6XW-shop/web/tcp/http {
		numgen random mod 1 vmap { 0 : goto endpoint-5OJB2KTY-shop/web/tcp/http__10.0.1.5/8080 }
	}
	chain endpoint-5OJB2KTY-shop/web/tcp/http__10.0.1.5/8080 {
		meta l4proto tcp dnat to 10.0.1.5:8080
	}
	chain service-AAAAAAAA-shop/api/tcp/http {
		meta l4proto tcp dnat to 10.0.1.6:8080
	}
	chain service-BBBBBBBB-shop/web2/tcp/http {
		meta l4proto tcp dnat to 10.0.1.7:8080
	}
}
"#;

    #[test]
    fn a_left_out_services_chains_and_elements_are_taken_out_and_counted() {
        let mut rs = nft::parse(TABLE, &ParseOptions::strict()).expect("parses");
        rs.normalize();
        let table = rs.table(Family::Ip, "kube-proxy").expect("table");
        let web = LeftOutService {
            service: "shop/web".into(),
            ports: vec![WrittenPort {
                name: "http".into(),
                protocol: "TCP".into(),
                port: Some(80),
                node_port: None,
            }],
            cluster_ips: vec!["10.96.0.10".into()],
        };
        let (kept, counts) = without(table, std::slice::from_ref(&web));
        let chains: Vec<&str> = kept.chains.iter().map(|c| &*c.name).collect();
        // `shop/web2` shares the prefix of the name, not the Service.
        assert_eq!(
            chains,
            [
                "reject-chain",
                "service-AAAAAAAA-shop/api/tcp/http",
                "service-BBBBBBBB-shop/web2/tcp/http"
            ]
        );
        let elements: Vec<String> = kept
            .sets
            .iter()
            .flat_map(|s| s.elements.iter().map(|e| e.key.to_string()))
            .collect();
        assert_eq!(elements.len(), 2, "{elements:?}");
        assert!(
            elements.iter().all(|e| e.starts_with("10.96.0.11")),
            "{elements:?}"
        );
        assert_eq!(
            counts,
            [NotChecked {
                service: "shop/web".into(),
                chains: 2,
                objects: 3
            }]
        );
        // Nothing of another Service's.
        let other = LeftOutService {
            service: "shop/we".into(),
            cluster_ips: vec!["10.96.0.99".into()],
            ..web
        };
        let (kept, counts) = without(table, &[other]);
        assert_eq!(kept.chains.len(), table.chains.len());
        assert!(counts.is_empty());
    }
}
