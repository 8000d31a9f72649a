//! Service → service ports, per IP family (kube-proxy `serviceport.go` `newBaseServiceInfo` and
//! `servicechangetracker.go`). Mode-independent: the iptables and IPVS proxiers both use it.

use super::version::TopologyHints;
use crate::state::Warning;
use crate::state::config::ProxyConfig;
use crate::state::ip::{Cidr, IpFamily, parse_ip_sloppy};
use crate::state::version::KubeProxyVersion;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use std::fmt;
use std::net::IpAddr;

/// The label that hands a Service/EndpointSlice to another proxy: kube-proxy ignores such objects.
pub const LABEL_SERVICE_PROXY_NAME: &str = "service.kubernetes.io/service-proxy-name";
/// The label of headless services' slices: kube-proxy ignores such objects.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Session-affinity timeout the API server defaults to.
pub const DEFAULT_STICKY_SECONDS: i32 = 10800;

/// Whether kube-proxy's informers filter this object out (label selector on both labels).
pub fn ignored_by_labels(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(LABEL_SERVICE_PROXY_NAME) || l.contains_key(LABEL_HEADLESS))
}

/// A service port protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Protocol {
    /// TCP
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP
    #[serde(rename = "SCTP")]
    Sctp,
}

impl Protocol {
    /// Parses the API spelling (`TCP`, `UDP`, `SCTP`).
    pub fn parse(s: &str) -> Option<Protocol> {
        match s {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// Lower case, as used in rules and chain hashes (`tcp`).
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The API spelling (`TCP`).
    pub fn as_k8s(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }
}

/// kube-proxy's ServicePortName: namespace, service name, port name and protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct ServicePortName {
    /// Namespace.
    pub namespace: String,
    /// Service name.
    pub name: String,
    /// Port name ("" for an unnamed port).
    pub port: String,
    /// Protocol.
    pub protocol: Protocol,
}

impl fmt::Display for ServicePortName {
    /// `ns/name:port`, or `ns/name` for an unnamed port (protocol not included).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.port.is_empty() {
            write!(f, "{}/{}", self.namespace, self.name)
        } else {
            write!(f, "{}/{}:{}", self.namespace, self.name, self.port)
        }
    }
}

/// One port of a Service as one proxier (IP family) sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ServicePortInfo {
    /// The key.
    pub name: ServicePortName,
    /// `name.to_string()`, precomputed.
    pub name_string: String,
    /// `spec.type` (defaulted to ClusterIP).
    pub service_type: String,
    /// The cluster IP of this family.
    pub cluster_ip: IpAddr,
    /// `ports[i].port`.
    pub port: i32,
    /// `ports[i].targetPort` as text (informational; endpoints carry the resolved port).
    pub target_port: Option<String>,
    /// `ports[i].nodePort` (0 = none).
    pub node_port: i32,
    /// `spec.externalIPs` of this family, in spec order.
    pub external_ips: Vec<IpAddr>,
    /// LoadBalancer ingress IPs of this family (ipMode unset or VIP), in status order.
    pub load_balancer_vips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges` of this family (trimmed, network form).
    pub load_balancer_source_ranges: Vec<Cidr>,
    /// `Some(timeoutSeconds)` when `sessionAffinity: ClientIP`.
    pub session_affinity_seconds: Option<i32>,
    /// eTP=Local on an externally accessible service.
    pub external_policy_local: bool,
    /// iTP=Local.
    pub internal_policy_local: bool,
    /// `spec.healthCheckNodePort` when type LoadBalancer and eTP=Local (0 = none).
    pub health_check_node_port: i32,
    /// Whether EndpointSlice topology hints may narrow its endpoints (releases 1.24–1.30 ask
    /// the Service's topology annotation, see [`service_ports_of_release`]).
    #[serde(skip)]
    pub topology_hints_allowed: bool,
}

impl ServicePortInfo {
    /// nodePort, an LB VIP or an external IP of this family.
    pub fn externally_accessible(&self) -> bool {
        self.node_port != 0 || !self.load_balancer_vips.is_empty() || !self.external_ips.is_empty()
    }

    /// Whether the port ever routes to cluster-wide endpoints.
    pub fn uses_cluster_endpoints(&self) -> bool {
        !self.internal_policy_local || self.externally_accessible()
    }

    /// Whether the port ever routes to node-local endpoints only.
    pub fn uses_local_endpoints(&self) -> bool {
        self.internal_policy_local || (self.external_policy_local && self.externally_accessible())
    }
}

/// The object label used in warnings (`Service ns/name`).
pub fn service_label(svc: &Service) -> String {
    format!(
        "Service {}/{}",
        svc.metadata.namespace.as_deref().unwrap_or(""),
        svc.metadata.name.as_deref().unwrap_or("")
    )
}

/// The cluster IP text for `family` (kube-proxy `GetClusterIPByFamily`), "" if none.
fn cluster_ip_by_family(svc: &Service, family: IpFamily) -> &str {
    let Some(spec) = svc.spec.as_ref() else {
        return "";
    };
    let families = spec.ip_families.as_deref().unwrap_or(&[]);
    if families.is_empty() {
        let ip = spec.cluster_ip.as_deref().unwrap_or("");
        if ip.is_empty() || ip == "None" {
            return "";
        }
        let is_v6 = parse_ip_sloppy(ip).is_some_and(|i| i.is_ipv6());
        return if is_v6 == (family == IpFamily::V6) {
            ip
        } else {
            ""
        };
    }
    let ips = spec.cluster_ips.as_deref().unwrap_or(&[]);
    families
        .iter()
        .position(|f| f == family.as_k8s())
        .and_then(|i| ips.get(i))
        .map(String::as_str)
        .unwrap_or("")
}

/// The service ports kube-proxy's `family` proxier builds from `svc` (empty when it skips it).
/// Oddities kube-proxy would log (bad IPs, unknown protocols or types) become warnings.
pub fn service_ports(
    svc: &Service,
    family: IpFamily,
    warnings: &mut Vec<Warning>,
) -> Vec<ServicePortInfo> {
    service_ports_honouring(svc, family, true, warnings)
}

/// [`service_ports`] as kube-proxy `version` builds them: before 1.30 load-balancer ingress IPs
/// with `ipMode: Proxy` get rules too, before 1.22 `internalTrafficPolicy` is ignored, with
/// `AllowServiceExternalIPs` off (1.36 and later) `spec.externalIPs` get none, and
/// 1.24–1.30 use topology hints only when the Service's annotation asks for them
/// (`service.kubernetes.io/topology-aware-hints`, from 1.27 also `…/topology-mode`).
pub fn service_ports_of_release(
    svc: &Service,
    family: IpFamily,
    version: KubeProxyVersion,
    config: &ProxyConfig,
    warnings: &mut Vec<Warning>,
) -> Vec<ServicePortInfo> {
    let mut ports = service_ports_honouring(svc, family, version.honours_ip_mode(config), warnings);
    let annotation = |key: &str| {
        svc.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    let hints = match version.topology_hints(config) {
        TopologyHints::Always => true,
        TopologyHints::Ignored => false,
        TopologyHints::WhenAnnotatedAuto => {
            matches!(
                annotation(ANNOTATION_TOPOLOGY_AWARE_HINTS),
                Some("Auto" | "auto")
            )
        }
        TopologyHints::WhenAnnotated => {
            let value = annotation(ANNOTATION_TOPOLOGY_MODE)
                .or_else(|| annotation(ANNOTATION_TOPOLOGY_AWARE_HINTS))
                .unwrap_or("");
            !matches!(value, "" | "disabled" | "Disabled")
        }
    };
    let itp = version.honours_internal_traffic_policy(config);
    let external_ips = version.allows_external_ips(config);
    for p in &mut ports {
        p.topology_hints_allowed = hints;
        p.internal_policy_local &= itp;
        if !external_ips {
            p.external_ips.clear();
        }
    }
    ports
}

/// The Service annotation that asked for topology-aware hints before 1.27.
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// The Service annotation that asks for topology-aware routing from 1.27.
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";

fn service_ports_honouring(
    svc: &Service,
    family: IpFamily,
    honour_ip_mode: bool,
    warnings: &mut Vec<Warning>,
) -> Vec<ServicePortInfo> {
    let label = || service_label(svc);
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let cluster_ip_field = spec.cluster_ip.as_deref().unwrap_or("");
    if cluster_ip_field.is_empty() || cluster_ip_field == "None" {
        return Vec::new();
    }
    let service_type = spec.type_.clone().unwrap_or_else(|| "ClusterIP".into());
    match service_type.as_str() {
        "ExternalName" => return Vec::new(),
        "ClusterIP" | "NodePort" | "LoadBalancer" => {}
        other => {
            warnings.push(Warning::new(
                label(),
                format!("unknown spec.type {other:?}; service ignored"),
            ));
            return Vec::new();
        }
    }
    let cip_text = cluster_ip_by_family(svc, family);
    if cip_text.is_empty() {
        return Vec::new();
    }
    let Some(cluster_ip) = parse_ip_sloppy(cip_text).filter(|ip| IpFamily::of(ip) == family) else {
        warnings.push(Warning::new(
            label(),
            format!("cluster IP {cip_text:?} is not a valid {family} address; service ignored"),
        ));
        return Vec::new();
    };

    let mut external_ips = Vec::new();
    for s in spec.external_ips.as_deref().unwrap_or(&[]) {
        match parse_ip_sloppy(s) {
            Some(ip) if IpFamily::of(&ip) == family => external_ips.push(ip),
            Some(_) => {}
            None if s.trim().is_empty() => {}
            None => warnings.push(Warning::new(
                label(),
                format!("externalIPs entry {s:?} is not an IP; skipped"),
            )),
        }
    }
    let mut source_ranges = Vec::new();
    for s in spec.load_balancer_source_ranges.as_deref().unwrap_or(&[]) {
        match Cidr::parse_sloppy(s.trim()) {
            Some(c) if c.family() == family => source_ranges.push(c),
            Some(_) => {}
            None => warnings.push(Warning::new(
                label(),
                format!("loadBalancerSourceRanges entry {s:?} is not a CIDR; skipped"),
            )),
        }
    }
    let mut lb_vips = Vec::new();
    let ingress = crate::state::load::load_balancer_ingress(svc);
    for ing in ingress {
        let ip = ing.ip.as_deref().unwrap_or("");
        if ip.is_empty() || (honour_ip_mode && ing.ip_mode.as_deref().is_some_and(|m| m != "VIP")) {
            continue;
        }
        match parse_ip_sloppy(ip) {
            Some(v) if IpFamily::of(&v) == family => lb_vips.push(v),
            Some(_) => {}
            None => warnings.push(Warning::new(
                label(),
                format!("status.loadBalancer.ingress ip {ip:?} is not an IP; skipped"),
            )),
        }
    }
    let session_affinity_seconds =
        (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
            spec.session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds)
                .unwrap_or(DEFAULT_STICKY_SECONDS)
        });
    let api_externally_accessible = service_type == "LoadBalancer"
        || service_type == "NodePort"
        || (service_type == "ClusterIP" && !spec.external_ips.as_deref().unwrap_or(&[]).is_empty());
    let external_policy_local =
        api_externally_accessible && spec.external_traffic_policy.as_deref() == Some("Local");
    let internal_policy_local = spec.internal_traffic_policy.as_deref() == Some("Local");
    let health_check_node_port = if service_type == "LoadBalancer" && external_policy_local {
        spec.health_check_node_port.unwrap_or(0)
    } else {
        0
    };
    let namespace = svc.metadata.namespace.clone().unwrap_or_default();
    let name = svc.metadata.name.clone().unwrap_or_default();

    let mut out: Vec<ServicePortInfo> = Vec::new();
    for (i, p) in spec.ports.as_deref().unwrap_or(&[]).iter().enumerate() {
        let proto_text = p.protocol.as_deref().unwrap_or("TCP");
        let Some(protocol) = Protocol::parse(proto_text) else {
            warnings.push(Warning::new(
                label(),
                format!(
                    "spec.ports[{i}] protocol {proto_text:?} is not TCP, UDP or SCTP; port ignored"
                ),
            ));
            continue;
        };
        let spn = ServicePortName {
            namespace: namespace.clone(),
            name: name.clone(),
            port: p.name.clone().unwrap_or_default(),
            protocol,
        };
        if let Some(why) = unwritable(&spn, p, health_check_node_port, session_affinity_seconds) {
            warnings.push(Warning::new(
                label(),
                format!("spec.ports[{i}] is not rendered: {why}"),
            ));
            continue;
        }
        let info = ServicePortInfo {
            name_string: spn.to_string(),
            name: spn,
            service_type: service_type.clone(),
            cluster_ip,
            port: p.port,
            target_port: p.target_port.as_ref().map(|t| match t {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => n.to_string(),
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
            }),
            node_port: p.node_port.unwrap_or(0),
            external_ips: external_ips.clone(),
            load_balancer_vips: lb_vips.clone(),
            load_balancer_source_ranges: source_ranges.clone(),
            session_affinity_seconds,
            external_policy_local,
            internal_policy_local,
            health_check_node_port,
            topology_hints_allowed: true,
        };
        // A repeated (name, protocol) replaces the earlier port, as in kube-proxy's map.
        if let Some(prev) = out.iter_mut().find(|o| o.name == info.name) {
            warnings.push(Warning::new(
                label(),
                format!(
                    "spec.ports[{i}] repeats port {:?}/{}; the later one wins",
                    info.name.port, proto_text
                ),
            ));
            *prev = info;
        } else {
            out.push(info);
        }
    }
    out
}

/// Why a service port cannot be written into rules safely (a name that is not plain, a number
/// no rule can hold), or `None`. Loading a state leaves out such Services already
/// ([`crate::state::validate`]); this keeps any other state from reaching the writers.
fn unwritable(
    spn: &ServicePortName,
    port: &k8s_openapi::api::core::v1::ServicePort,
    health_check_node_port: i32,
    affinity_seconds: Option<i32>,
) -> Option<String> {
    use super::quoting::{unwritable_name, writable_port};
    for (what, part) in [
        ("namespace", &spn.namespace),
        ("name", &spn.name),
        ("port name", &spn.port),
    ] {
        if let Some(why) = unwritable_name(part) {
            return Some(format!(
                "its {what} {} {why}",
                crate::state::validate::shown_value(part)
            ));
        }
    }
    let numbers = [
        ("port", port.port),
        ("nodePort", port.node_port.unwrap_or(0)),
        ("healthCheckNodePort", health_check_node_port),
    ];
    if let Some((what, n)) = numbers.into_iter().find(|(_, n)| !writable_port(*n)) {
        return Some(format!("its {what} {n} is not a port number (0–65535)"));
    }
    match affinity_seconds {
        Some(t) if t <= 0 => Some(format!("its session affinity timeout {t} is not positive")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn release(minor: u32) -> KubeProxyVersion {
        KubeProxyVersion::of_minor(minor).expect("known release")
    }

    fn service(annotations: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": "ns", "name": "svc", "annotations": annotations},
            "spec": {
                "type": "LoadBalancer", "clusterIP": "10.96.0.10",
                "internalTrafficPolicy": "Local",
                "ports": [{"name": "http", "port": 80, "protocol": "TCP", "nodePort": 30080}],
            },
            "status": {"loadBalancer": {"ingress": [
                {"ip": "192.0.2.1"}, {"ip": "192.0.2.2", "ipMode": "Proxy"},
            ]}},
        }))
        .expect("a Service")
    }

    fn one_port(svc: &Service, minor: u32) -> ServicePortInfo {
        let config = ProxyConfig::default();
        let mut warnings = Vec::new();
        let ports =
            service_ports_of_release(svc, IpFamily::V4, release(minor), &config, &mut warnings);
        assert!(warnings.is_empty(), "{warnings:?}");
        ports.into_iter().next().expect("one port")
    }

    #[test]
    fn releases_read_the_service_as_they_did() {
        let plain = service(serde_json::json!({}));
        // ipMode: Proxy ingress IPs get rules before 1.30.
        assert_eq!(one_port(&plain, 29).load_balancer_vips.len(), 2);
        assert_eq!(one_port(&plain, 30).load_balancer_vips.len(), 1);
        assert_eq!(one_port(&plain, 35), {
            let mut w = Vec::new();
            service_ports(&plain, IpFamily::V4, &mut w).remove(0)
        });
        // internalTrafficPolicy from 1.22.
        assert!(!one_port(&plain, 21).internal_policy_local);
        assert!(one_port(&plain, 22).internal_policy_local);
        // Topology hints: never before 1.24, then only when annotated, always from 1.31.
        let auto = service(serde_json::json!({ANNOTATION_TOPOLOGY_AWARE_HINTS: "Auto"}));
        let mode = service(serde_json::json!({ANNOTATION_TOPOLOGY_MODE: "Auto"}));
        let hints = |svc: &Service, minor| one_port(svc, minor).topology_hints_allowed;
        assert!(!hints(&auto, 23) && hints(&auto, 24) && hints(&auto, 27));
        assert!(!hints(&mode, 26) && hints(&mode, 27));
        assert!(!hints(&plain, 30) && hints(&plain, 31));
    }
}
