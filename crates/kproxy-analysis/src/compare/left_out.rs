//! KP014: the objects of the API state that loading left out because the API server would
//! have rejected them ([`crate::state::validate`]). kube-proxy never sees such an object, so
//! its rules are not expected; the rest of the node is verified as usual.
//!
//! The node's rules of such a Service are not judged either: the node was programmed from the
//! API, our copy of the object is the one we know to be unreliable. [`services`] names the
//! Services concerned (a Service left out, or the Service an EndpointSlice left out belongs
//! to: the endpoints it alone lists are unknown), with what the object says of its ports and
//! addresses even where a field is invalid; each mode's comparison takes their rules out of
//! what it judges, and `repair` leaves them as they are.

use super::catalogue as cat;
use super::finding::Finding;
use crate::model::hashing::port_proto_hash;
use crate::proxier::endpoints::LABEL_SERVICE_NAME;
use crate::state::ClusterState;
use crate::state::validate::InvalidObject;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A Service whose rules on the node are not judged: its object, or one of its
/// EndpointSlices, was left out as invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeftOutService {
    /// `namespace/name` as written (the form kube-proxy's comments and names carry).
    pub service: String,
    /// The ports as the Service's object writes them (the left-out object's, else the valid
    /// one's when only a slice was left out).
    pub ports: Vec<WrittenPort>,
    /// `spec.clusterIPs` (or `spec.clusterIP`) as written.
    pub cluster_ips: Vec<String>,
}

/// One port of a Service as its object writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrittenPort {
    /// `name` ("" when absent).
    pub name: String,
    /// `protocol` (`TCP` when absent).
    pub protocol: String,
    /// `port`, when a number.
    pub port: Option<u16>,
    /// `nodePort`, when a number other than 0.
    pub node_port: Option<u16>,
}

impl LeftOutService {
    /// The hashes of its service-port chains (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`,
    /// `KUBE-FW-`, `KUBE-XLB-` share one): `servicePortChainName` of `ns/name:port` and the
    /// lower-case protocol (`pkg/proxy/iptables/proxier.go`).
    pub fn port_chain_hashes(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|p| {
                port_proto_hash(
                    &format!("{}:{}", self.service, p.name),
                    &p.protocol.to_ascii_lowercase(),
                )
            })
            .collect()
    }
}

/// A Service (`namespace/name`) as messages name it: bare when it is plain text, else quoted
/// and escaped, so that no message carries a line break or control character from the state.
pub fn shown(service: &str) -> String {
    let plain = service
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'/'));
    if plain && service.len() <= 128 {
        service.to_string()
    } else {
        crate::state::validate::shown_value(service)
    }
}

/// The Service (`namespace/name` as written) an object left out concerns: a Service itself,
/// the Service an EndpointSlice's `kubernetes.io/service-name` label names; `None` for other
/// kinds.
pub fn owning_service(o: &InvalidObject) -> Option<String> {
    match o.kind {
        "Service" => Some(format!("{}/{}", o.namespace, o.name)),
        "EndpointSlice" => o
            .object
            .pointer("/metadata/labels")
            .and_then(|l| l.get(LABEL_SERVICE_NAME))
            .and_then(Value::as_str)
            .map(|owner| format!("{}/{owner}", o.namespace)),
        _ => None,
    }
}

/// The Services of `state` whose rules are not judged, each once, in name order.
pub fn services(state: &ClusterState) -> Vec<LeftOutService> {
    let mut out: BTreeMap<String, LeftOutService> = BTreeMap::new();
    for o in &state.invalid {
        let Some(service) = owning_service(o) else {
            continue;
        };
        let written = if o.kind == "Service" {
            Some(o.object.clone())
        } else {
            valid_service(state, &service)
        };
        let entry = out
            .entry(service.clone())
            .or_insert_with(|| LeftOutService {
                service,
                ports: Vec::new(),
                cluster_ips: Vec::new(),
            });
        if entry.ports.is_empty()
            && let Some(object) = written
        {
            entry.ports = written_ports(&object);
            entry.cluster_ips = written_cluster_ips(&object);
        }
    }
    out.into_values().collect()
}

/// The valid Service `ns/name` of `state`, as JSON.
fn valid_service(state: &ClusterState, service: &str) -> Option<Value> {
    let (ns, name) = service.split_once('/')?;
    state
        .services
        .iter()
        .find(|s| {
            s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name)
        })
        .and_then(|s| serde_json::to_value(s).ok())
}

/// `spec.ports` as written; a field of the wrong type counts as absent.
fn written_ports(object: &Value) -> Vec<WrittenPort> {
    let number = |p: &Value, f: &str| {
        p.get(f)
            .and_then(Value::as_u64)
            .and_then(|n| u16::try_from(n).ok())
            .filter(|n| *n != 0)
    };
    object
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|p| WrittenPort {
            name: p
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            protocol: p
                .get("protocol")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .unwrap_or("TCP")
                .to_string(),
            port: number(p, "port"),
            node_port: number(p, "nodePort"),
        })
        .collect()
}

/// `spec.clusterIPs`, else `spec.clusterIP`, as written (`None` and "" left out).
fn written_cluster_ips(object: &Value) -> Vec<String> {
    let listed: Vec<String> = object
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    let ips = if listed.is_empty() {
        object
            .pointer("/spec/clusterIP")
            .and_then(Value::as_str)
            .map(|s| vec![s.to_string()])
            .unwrap_or_default()
    } else {
        listed
    };
    ips.into_iter()
        .filter(|ip| !ip.is_empty() && ip != "None")
        .collect()
}

/// What of a left-out Service's rules the node holds and was not checked (or not touched).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct NotChecked {
    /// `namespace/name` as written.
    pub service: String,
    /// Chains (iptables, nftables) of the Service.
    pub chains: usize,
    /// Other objects: rules of shared chains, map and set elements, virtual servers, addresses.
    pub objects: usize,
}

impl NotChecked {
    /// `8 chain(s) and 2 other object(s)`, for messages.
    pub fn counts(&self) -> String {
        format!(
            "{} chain(s) and {} other object(s)",
            self.chains, self.objects
        )
    }
}

/// Adds `more` to the counts of the same Service in `all` (one entry per Service).
pub fn tally(all: &mut Vec<NotChecked>, more: NotChecked) {
    match all.iter_mut().find(|n| n.service == more.service) {
        Some(n) => {
            n.chains += more.chains;
            n.objects += more.objects;
        }
        None => all.push(more),
    }
}

/// One finding per object left out, naming it and its first invalid field, and saying which of
/// the node's rules were therefore not checked (`not_checked`: per Service, as each mode's
/// comparison counted them).
pub fn findings(invalid: &[InvalidObject], not_checked: &[NotChecked]) -> Vec<Finding> {
    let mut said: BTreeSet<&str> = BTreeSet::new();
    invalid
        .iter()
        .map(|o| {
            let owner = owning_service(o);
            let unchecked = owner.as_deref().and_then(|s| {
                let n = not_checked.iter().find(|n| n.service == s)?;
                // A Service with several objects left out: its rules are counted once.
                said.insert(&n.service).then(|| {
                    format!(
                        "; the node's rules of Service {} were not checked ({})",
                        shown(&n.service),
                        n.counts()
                    )
                })
            });
            let f = cat::INVALID_OBJECT
                .finding(format!(
                    "{} left out: {}{}",
                    o.label(),
                    o.summary(),
                    unchecked.unwrap_or_default()
                ))
                .expected("an object the API server accepts")
                .actual(
                    o.problems
                        .first()
                        .map(|p| format!("{} {}", p.field, p.value))
                        .unwrap_or_default(),
                );
            match o.service() {
                Some(service) => f.service(service),
                None => f,
            }
        })
        .collect()
}

/// `state` with the Services, and the EndpointSlices of the Services (`namespace/name`), for
/// which `keep` holds, every node-wide object (Nodes, ServiceCIDRs), and `invalid` as the
/// objects left out.
pub fn with_services(
    state: &ClusterState,
    keep: impl Fn(&str) -> bool,
    invalid: Vec<InvalidObject>,
) -> ClusterState {
    let kept = |ns: Option<&String>, name: Option<&String>| {
        keep(&format!(
            "{}/{}",
            ns.map_or("", String::as_str),
            name.map_or("", String::as_str)
        ))
    };
    ClusterState {
        services: state
            .services
            .iter()
            .filter(|s| kept(s.metadata.namespace.as_ref(), s.metadata.name.as_ref()))
            .cloned()
            .collect(),
        endpoint_slices: state
            .endpoint_slices
            .iter()
            .filter(|s| {
                let owner = s
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_SERVICE_NAME));
                kept(s.metadata.namespace.as_ref(), owner)
            })
            .cloned()
            .collect(),
        nodes: state.nodes.clone(),
        service_cidrs: state.service_cidrs.clone(),
        invalid,
    }
}

/// `state` without the Services in `left_out` and their EndpointSlices: what is judged. The
/// state itself when there is nothing to take out of it (no copy).
pub fn judged_state<'s>(
    state: &'s ClusterState,
    left_out: &[LeftOutService],
) -> std::borrow::Cow<'s, ClusterState> {
    if left_out.is_empty() {
        return std::borrow::Cow::Borrowed(state);
    }
    let names: BTreeSet<&str> = left_out.iter().map(|l| l.service.as_str()).collect();
    std::borrow::Cow::Owned(with_services(
        state,
        |service| !names.contains(service),
        state.invalid.clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(items: serde_json::Value) -> ClusterState {
        crate::state::load::from_str(
            &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
            "state",
        )
        .expect("state")
    }

    #[test]
    fn a_left_out_slice_names_its_service_with_the_valid_objects_ports() {
        let s = state(serde_json::json!([
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"namespace": "shop", "name": "web"},
             "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "http", "port": 80}]}},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"namespace": "shop", "name": "web-abc",
                          "labels": {"kubernetes.io/service-name": "web"}},
             "addressType": "IPv4",
             "ports": [{"name": "bad name!", "port": 8080}],
             "endpoints": [{"addresses": ["10.0.1.5"]}]},
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {"namespace": "shop", "name": "api", "labels": {"bad label!": "x"}},
             "spec": {"clusterIP": "10.96.0.11", "ports": [{"name": "p", "port": 81, "protocol": "UDP", "nodePort": 30081}]}}
        ]));
        assert_eq!(s.invalid.len(), 2, "{:?}", s.invalid);
        let left = services(&s);
        let names: Vec<&str> = left.iter().map(|l| l.service.as_str()).collect();
        assert_eq!(names, ["shop/api", "shop/web"]);
        assert_eq!(left[0].cluster_ips, ["10.96.0.11"]);
        assert_eq!(
            left[0].ports,
            [WrittenPort {
                name: "p".into(),
                protocol: "UDP".into(),
                port: Some(81),
                node_port: Some(30081),
            }]
        );
        assert_eq!(left[1].ports[0].protocol, "TCP");
        assert_eq!(left[1].cluster_ips, ["10.96.0.10"]);
        // The valid Service of the bad slice is not judged either.
        let judged = judged_state(&s, &left);
        assert!(judged.services.is_empty());
        assert!(judged.endpoint_slices.is_empty());
        let f = findings(
            &s.invalid,
            &[NotChecked {
                service: "shop/web".into(),
                chains: 3,
                objects: 1,
            }],
        );
        let web = f
            .iter()
            .find(|f| f.message.contains("EndpointSlice shop/web-abc"))
            .expect("finding");
        assert!(
            web.message
                .ends_with("the node's rules of Service shop/web were not checked (3 chain(s) and 1 other object(s))"),
            "{}",
            web.message
        );
    }
}
