//! The checks of each kind kube-proxy reads: what `ValidateService`, `ValidateEndpointSlice`
//! and `ValidateObjectMeta` reject among the fields the proxiers use.

use super::syntax::{
    PORT_RANGE_MSG, dns1123_label, dns1123_subdomain, label_value, port_name, port_number,
    qualified_name,
};
use super::{FieldProblem, InvalidObject, shown_value};
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::{BTreeMap, HashSet};

/// `pkg/apis/discovery/validation`: `maxEndpoints`, `maxAddresses`, `maxPorts`,
/// `maxTopologyLabels`, `maxZoneHints` (and the same limit for node hints).
const MAX_ENDPOINTS: usize = 1000;
const MAX_ADDRESSES: usize = 100;
const MAX_SLICE_PORTS: usize = 20000;
const MAX_TOPOLOGY_LABELS: usize = 16;
const MAX_HINTS: usize = 8;
/// `core.MaxClientIPServiceAffinitySeconds`.
const MAX_AFFINITY_SECONDS: i32 = 86400;

const REQUIRED: &str = "must be given";
const UNIQUE: &str = "must be unique";
const PROTOCOLS: &str = "must be TCP, UDP or SCTP";
const POLICIES: &str = "must be Cluster or Local";

/// The invalid fields of one object, collected as the checks run.
#[derive(Default)]
struct Problems(Vec<FieldProblem>);

impl Problems {
    /// Records `reason` for the field `field()` holding `value`, when there is a reason.
    fn check(&mut self, field: impl FnOnce() -> String, value: &str, reason: Option<&'static str>) {
        if let Some(reason) = reason {
            self.0.push(FieldProblem {
                field: field(),
                value: shown_value(value),
                reason,
            });
        }
    }

    /// Records `reason` for a number.
    fn number(&mut self, field: impl FnOnce() -> String, value: i64, reason: Option<&'static str>) {
        if let Some(reason) = reason {
            self.0.push(FieldProblem {
                field: field(),
                value: value.to_string(),
                reason,
            });
        }
    }

    /// The object, when anything was recorded.
    fn into_invalid<T: serde::Serialize>(
        self,
        kind: &'static str,
        meta: &ObjectMeta,
        object: &T,
    ) -> Option<InvalidObject> {
        (!self.0.is_empty()).then(|| InvalidObject {
            kind,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            problems: self.0,
            object: serde_json::to_value(object).unwrap_or_default(),
        })
    }
}

/// `ValidateObjectMeta`: the name by `name_rule`, the namespace of namespaced kinds, the labels.
fn meta(
    p: &mut Problems,
    meta: &ObjectMeta,
    name_rule: fn(&str) -> Option<&'static str>,
    namespaced: bool,
) {
    match meta.name.as_deref() {
        None | Some("") => p.check(|| "metadata.name".into(), "", Some(REQUIRED)),
        Some(name) => p.check(|| "metadata.name".into(), name, name_rule(name)),
    }
    if namespaced {
        match meta.namespace.as_deref() {
            None | Some("") => p.check(|| "metadata.namespace".into(), "", Some(REQUIRED)),
            Some(ns) => p.check(|| "metadata.namespace".into(), ns, dns1123_label(ns)),
        }
    }
    labels(p, meta.labels.as_ref(), "metadata.labels");
}

/// `ValidateLabels`: qualified-name keys, label values.
fn labels(p: &mut Problems, labels: Option<&BTreeMap<String, String>>, at: &str) {
    for (k, v) in labels.into_iter().flatten() {
        p.check(|| at.to_string(), k, qualified_name(k));
        p.check(|| format!("{at}[{}]", shown_value(k)), v, label_value(v));
    }
}

/// One of `allowed` (an absent or empty value is the API's default and always allowed).
fn one_of(value: Option<&str>, allowed: &[&str], reason: &'static str) -> Option<&'static str> {
    value
        .filter(|v| !v.is_empty() && !allowed.contains(v))
        .map(|_| reason)
}

/// A Service (`ValidateService` and `validateServicePort`).
pub(super) fn service(svc: &Service) -> Option<InvalidObject> {
    let mut p = Problems::default();
    meta(&mut p, &svc.metadata, dns1123_label, true);
    if let Some(spec) = &svc.spec {
        let ports = spec.ports.as_deref().unwrap_or(&[]);
        let mut names: HashSet<&str> = HashSet::new();
        for (i, port) in ports.iter().enumerate() {
            let at = |f: &str| format!("spec.ports[{i}].{f}");
            match port.name.as_deref().unwrap_or("") {
                "" if ports.len() > 1 => p.check(|| at("name"), "", Some(REQUIRED)),
                "" => {}
                name => {
                    p.check(|| at("name"), name, dns1123_label(name));
                    if !names.insert(name) {
                        p.check(|| at("name"), name, Some(UNIQUE));
                    }
                }
            }
            // The API server asks for 1–65535; kube-proxy's own tests write port 0
            // (`TestEndpointSliceE2E`: `--dport 0`), which no rule fails on, so only numbers
            // no rule can hold are left out.
            if port.port != 0 {
                p.number(|| at("port"), port.port.into(), port_number(port.port));
            }
            let protocol = port.protocol.as_deref();
            p.check(
                || at("protocol"),
                protocol.unwrap_or(""),
                one_of(protocol, &["TCP", "UDP", "SCTP"], PROTOCOLS),
            );
            match &port.target_port {
                Some(IntOrString::Int(n)) => {
                    p.number(|| at("targetPort"), (*n).into(), port_number(*n))
                }
                Some(IntOrString::String(s)) => p.check(|| at("targetPort"), s, port_name(s)),
                None => {}
            }
            // The API server also refuses a nodePort on a ClusterIP Service; kube-proxy's own
            // tests use one (`TestAcceptIPVSTraffic`) and write its rules, so only numbers no
            // rule can hold are left out.
            if let Some(n) = port
                .node_port
                .filter(|n| *n != 0 && port_number(*n).is_some())
            {
                p.number(|| at("nodePort"), n.into(), Some(PORT_RANGE_MSG));
            }
        }
        let affinity = spec.session_affinity.as_deref();
        p.check(
            || "spec.sessionAffinity".into(),
            affinity.unwrap_or(""),
            one_of(affinity, &["None", "ClientIP"], "must be None or ClientIP"),
        );
        let timeout = spec
            .session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds);
        if let Some(t) = timeout.filter(|t| !(1..=MAX_AFFINITY_SECONDS).contains(t)) {
            p.number(
                || "spec.sessionAffinityConfig.clientIP.timeoutSeconds".into(),
                t.into(),
                Some("must be between 1 and 86400, inclusive"),
            );
        }
        for (field, value) in [
            (
                "externalTrafficPolicy",
                spec.external_traffic_policy.as_deref(),
            ),
            (
                "internalTrafficPolicy",
                spec.internal_traffic_policy.as_deref(),
            ),
        ] {
            p.check(
                || format!("spec.{field}"),
                value.unwrap_or(""),
                one_of(value, &["Cluster", "Local"], POLICIES),
            );
        }
        if let Some(n) = spec
            .health_check_node_port
            .filter(|n| *n != 0 && port_number(*n).is_some())
        {
            p.number(
                || "spec.healthCheckNodePort".into(),
                n.into(),
                Some(PORT_RANGE_MSG),
            );
        }
        let families = spec.ip_families.as_deref().unwrap_or(&[]);
        let mut seen = HashSet::new();
        for (i, f) in families.iter().enumerate() {
            let at = || format!("spec.ipFamilies[{i}]");
            p.check(
                at,
                f,
                one_of(Some(f), &["IPv4", "IPv6"], "must be IPv4 or IPv6"),
            );
            if !seen.insert(f) {
                p.check(at, f, Some(UNIQUE));
            }
        }
    }
    let ingress = crate::state::load::load_balancer_ingress(svc);
    for (i, ing) in ingress.iter().enumerate() {
        let mode = ing.ip_mode.as_deref();
        p.check(
            || format!("status.loadBalancer.ingress[{i}].ipMode"),
            mode.unwrap_or(""),
            one_of(mode, &["VIP", "Proxy"], "must be VIP or Proxy"),
        );
    }
    p.into_invalid("Service", &svc.metadata, svc)
}

/// An EndpointSlice (`ValidateEndpointSlice`: `validateEndpoints`, `validatePorts`,
/// `validateHints`).
pub(super) fn endpoint_slice(slice: &EndpointSlice) -> Option<InvalidObject> {
    let mut p = Problems::default();
    meta(&mut p, &slice.metadata, dns1123_subdomain, true);
    let address_type = slice.address_type.as_str();
    let known = ["IPv4", "IPv6", "FQDN", "IP"].contains(&address_type);
    p.check(
        || "addressType".into(),
        address_type,
        (!known).then_some(if address_type.is_empty() {
            REQUIRED
        } else {
            "must be IPv4, IPv6 or FQDN"
        }),
    );
    if slice.endpoints.len() > MAX_ENDPOINTS {
        p.number(
            || "endpoints".into(),
            slice.endpoints.len() as i64,
            Some("must have at most 1000 items"),
        );
    }
    for (i, ep) in slice.endpoints.iter().enumerate().take(MAX_ENDPOINTS) {
        let at = |f: &str| format!("endpoints[{i}].{f}");
        if ep.addresses.is_empty() || ep.addresses.len() > MAX_ADDRESSES {
            p.number(
                || at("addresses"),
                ep.addresses.len() as i64,
                Some("must hold between 1 and 100 addresses"),
            );
        }
        if let Some(n) = ep.node_name.as_deref() {
            p.check(|| at("nodeName"), n, dns1123_subdomain(n));
        }
        if let Some(h) = ep.hostname.as_deref() {
            p.check(|| at("hostname"), h, dns1123_label(h));
        }
        if let Some(t) = &ep.deprecated_topology {
            if t.len() > MAX_TOPOLOGY_LABELS {
                p.number(
                    || at("deprecatedTopology"),
                    t.len() as i64,
                    Some("must have at most 16 items"),
                );
            }
            labels(&mut p, Some(t), &at("deprecatedTopology"));
        }
        let hints = ep.hints.as_ref();
        let zones = hints.and_then(|h| h.for_zones.as_deref()).unwrap_or(&[]);
        let nodes = hints.and_then(|h| h.for_nodes.as_deref()).unwrap_or(&[]);
        for (what, names, rule) in [
            (
                "forZones",
                zones.iter().map(|z| z.name.as_str()).collect::<Vec<_>>(),
                label_value as fn(&str) -> Option<&'static str>,
            ),
            (
                "forNodes",
                nodes.iter().map(|n| n.name.as_str()).collect(),
                dns1123_subdomain,
            ),
        ] {
            if names.len() > MAX_HINTS {
                p.number(
                    || at(&format!("hints.{what}")),
                    names.len() as i64,
                    Some("must have at most 8 items"),
                );
                continue;
            }
            let mut seen = HashSet::new();
            for (j, name) in names.into_iter().enumerate() {
                let field = || at(&format!("hints.{what}[{j}].name"));
                p.check(field, name, rule(name));
                if !seen.insert(name) {
                    p.check(field, name, Some(UNIQUE));
                }
            }
        }
    }
    let ports = slice.ports.as_deref().unwrap_or(&[]);
    if ports.len() > MAX_SLICE_PORTS {
        p.number(
            || "ports".into(),
            ports.len() as i64,
            Some("must have at most 20000 items"),
        );
    }
    let mut names = HashSet::new();
    for (i, port) in ports.iter().enumerate().take(MAX_SLICE_PORTS) {
        let at = |f: &str| format!("ports[{i}].{f}");
        let name = port.name.as_deref().unwrap_or("");
        if !name.is_empty() {
            p.check(|| at("name"), name, dns1123_label(name));
        }
        if !names.insert(name) {
            p.check(|| at("name"), name, Some(UNIQUE));
        }
        let protocol = port.protocol.as_deref();
        p.check(
            || at("protocol"),
            protocol.unwrap_or(""),
            one_of(protocol, &["TCP", "UDP", "SCTP"], PROTOCOLS),
        );
        // kube-proxy skips a port of 0 or none (`endpointslicecache.go`); any other number
        // outside the port range could only be written into a rule that fails the restore.
        if let Some(n) = port.port.filter(|n| *n != 0 && port_number(*n).is_some()) {
            p.number(|| at("port"), n.into(), Some(PORT_RANGE_MSG));
        }
        if let Some(a) = port.app_protocol.as_deref() {
            p.check(|| at("appProtocol"), a, qualified_name(a));
        }
    }
    p.into_invalid("EndpointSlice", &slice.metadata, slice)
}

/// A Node (`ValidateNode`: its name and labels).
pub(super) fn node(node: &Node) -> Option<InvalidObject> {
    let mut p = Problems::default();
    meta(&mut p, &node.metadata, dns1123_subdomain, false);
    p.into_invalid("Node", &node.metadata, node)
}

/// A ServiceCIDR (its name and labels; its CIDRs are parsed by the nftables proxier).
pub(super) fn service_cidr(cidr: &ServiceCIDR) -> Option<InvalidObject> {
    let mut p = Problems::default();
    meta(&mut p, &cidr.metadata, dns1123_subdomain, false);
    p.into_invalid("ServiceCIDR", &cidr.metadata, cidr)
}
