//! What the API implies per service port on this node, as facts the graph level compares with the
//! service graph of the dump: entries, endpoints per policy chain, masquerade, affinity, firewall
//! and REJECT/DROP verdicts (`proxier.go` `syncProxyRules`). An adapter over the proxier's own decisions
//! ([`ServiceDecisions`]), so `verify` and `render` cannot disagree about the API.

use crate::proxier::iptables::{LocalDetector, ServiceDecisions, ServicePortDecisions};
use crate::state::ip::IpFamily;
use std::net::IpAddr;

/// The filter-table verdict kube-proxy writes for a destination without usable endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// `REJECT` — `has no endpoints`.
    Reject,
    /// `DROP` — `has no local endpoints`.
    Drop,
}

impl Verdict {
    /// `REJECT` / `DROP`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Reject => "REJECT",
            Verdict::Drop => "DROP",
        }
    }
}

/// One endpoint as the rules should DNAT to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpectedEndpoint<'p> {
    /// Address.
    pub ip: IpAddr,
    /// Target port.
    pub port: u16,
    /// `ip:port` / `[ip]:port`.
    pub endpoint: &'p str,
    /// `KUBE-SEP-<hash>`.
    pub chain: &'p str,
    /// On this node.
    pub is_local: bool,
    /// `nodeName`, when set.
    pub node_name: Option<&'p str>,
}

/// A set of a plan port's endpoints (cluster, local or reachable), read from the plan on each
/// iteration: no copy per endpoint (a 10k-service node has 100k of them, in up to three sets).
#[derive(Debug, Clone, Copy)]
pub struct ExpectedEndpoints<'p> {
    plan: &'p ServicePortDecisions,
    /// Indexes into the plan port's endpoints.
    members: &'p [u32],
}

impl<'p> ExpectedEndpoints<'p> {
    /// The endpoints of `plan` at positions `members`.
    fn of(plan: &'p ServicePortDecisions, members: &'p [u32]) -> Self {
        ExpectedEndpoints { plan, members }
    }

    /// Number of endpoints in the set.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The endpoints, in the plan's order.
    pub fn iter(&self) -> impl Iterator<Item = ExpectedEndpoint<'p>> + 'p {
        let p = self.plan;
        self.members.iter().filter_map(move |&i| {
            let (e, chain) = (
                p.endpoints.get(i as usize)?,
                p.endpoint_chains.get(i as usize)?,
            );
            Some(ExpectedEndpoint {
                ip: e.ip,
                port: port_u16(e.port),
                endpoint: &e.endpoint,
                chain,
                is_local: e.is_local,
                node_name: e.node_name.as_deref(),
            })
        })
    }
}

/// Per service port: what kube-proxy's rules must do. Borrows the plan it was read from (a
/// 10k-service node has 100k endpoints: copies of their names would double what verify holds).
#[derive(Debug, Clone)]
pub struct ExpectedPort<'p> {
    /// `ns/name[:port]`.
    pub name: &'p str,
    /// `tcp`, `udp`, `sctp`.
    pub protocol: &'static str,
    /// The SVC/SVL/EXT/FW hash.
    pub hash: &'p str,
    /// Cluster IP of this family.
    pub cluster_ip: IpAddr,
    /// Service port.
    pub port: u16,
    /// NodePort (none when 0).
    pub node_port: Option<u16>,
    /// External IPs of this family.
    pub external_ips: &'p [IpAddr],
    /// Load-balancer VIPs of this family.
    pub lb_ips: &'p [IpAddr],
    /// Allowed source ranges in the `KUBE-FW-*` chain (including the LB VIPs when the node IP is in
    /// a range), canonical text.
    pub firewall_sources: Vec<String>,
    /// Health-check node port.
    pub health_check_node_port: Option<u16>,
    /// `ClientIP` affinity timeout.
    pub affinity_seconds: Option<u32>,
    /// internalTrafficPolicy Local.
    pub internal_local: bool,
    /// externalTrafficPolicy Local (and externally accessible).
    pub external_local: bool,
    /// Usable endpoints somewhere.
    pub has_endpoints: bool,
    /// The cluster IP is served (not REJECT/DROP).
    pub has_internal_endpoints: bool,
    /// External destinations are served.
    pub has_external_endpoints: bool,
    /// `KUBE-SVC-*` endpoints (empty when the chain is not used).
    pub cluster_endpoints: ExpectedEndpoints<'p>,
    /// `KUBE-SVL-*` endpoints (empty when the chain is not used).
    pub local_endpoints: ExpectedEndpoints<'p>,
    /// Every endpoint chain that should exist (the union).
    pub reachable: ExpectedEndpoints<'p>,
    /// The `KUBE-EXT-*` chain is used.
    pub uses_ext: bool,
    /// The `KUBE-FW-*` chain is used.
    pub uses_fw: bool,
    /// The API knows endpoints for this port but none is usable (e.g. all unready).
    pub unusable_endpoints: usize,
}

impl ExpectedPort<'_> {
    /// `KUBE-SVC-<hash>`.
    pub fn svc_chain(&self) -> String {
        format!("KUBE-SVC-{}", self.hash)
    }
    /// `KUBE-SVL-<hash>`.
    pub fn svl_chain(&self) -> String {
        format!("KUBE-SVL-{}", self.hash)
    }
    /// `KUBE-EXT-<hash>`.
    pub fn ext_chain(&self) -> String {
        format!("KUBE-EXT-{}", self.hash)
    }
    /// `KUBE-FW-<hash>`.
    pub fn fw_chain(&self) -> String {
        format!("KUBE-FW-{}", self.hash)
    }
    /// The chain the cluster IP jumps to.
    pub fn internal_chain(&self) -> String {
        if self.internal_local {
            self.svl_chain()
        } else {
            self.svc_chain()
        }
    }
    /// The verdict for the cluster IP when it is not served.
    pub fn internal_verdict(&self) -> Option<Verdict> {
        if !self.has_endpoints {
            Some(Verdict::Reject)
        } else if !self.has_internal_endpoints {
            Some(Verdict::Drop)
        } else {
            None
        }
    }
    /// The verdict for external destinations when they are not served.
    pub fn external_verdict(&self) -> Option<Verdict> {
        if !self.has_endpoints {
            Some(Verdict::Reject)
        } else if !self.has_external_endpoints {
            Some(Verdict::Drop)
        } else {
            None
        }
    }
    /// The chain load-balancer IPs jump to.
    pub fn lb_target(&self) -> String {
        if self.uses_fw {
            self.fw_chain()
        } else {
            self.external_entry_chain()
        }
    }

    /// `KUBE-XLB-<hash>`: the Local policy chain of kube-proxy before 1.24.
    pub fn xlb_chain(&self) -> String {
        format!("KUBE-XLB-{}", self.hash)
    }

    /// The chain NodePorts and external IPs jump to: `KUBE-EXT-…`, or (kube-proxy before
    /// 1.24) the service's `KUBE-XLB-…` with Local policy, else its `KUBE-SVC-…`.
    pub fn external_entry_chain(&self) -> String {
        if self.uses_ext {
            self.ext_chain()
        } else if self.external_local {
            self.xlb_chain()
        } else {
            self.svc_chain()
        }
    }

    /// The chains an external entry may jump to and still lead where it must, whichever
    /// release wrote it: the chain the plan's release writes first, then the one releases on
    /// the other side of 1.24 write (`KUBE-EXT-…` against `KUBE-XLB-…`/`KUBE-SVC-…`; a
    /// load-balancer IP without source ranges went through `KUBE-FW-…` before 1.24 and goes
    /// to `KUBE-EXT-…` since).
    pub fn external_targets(&self, load_balancer: bool) -> Vec<String> {
        let old = if self.external_local {
            self.xlb_chain()
        } else {
            self.svc_chain()
        };
        let (first, others) = if !load_balancer {
            (self.external_entry_chain(), [self.ext_chain(), old])
        } else if self.firewall_sources.is_empty() {
            (self.lb_target(), [self.ext_chain(), self.fw_chain()])
        } else {
            return vec![self.fw_chain()];
        };
        let mut v = vec![first];
        for other in others {
            if !v.contains(&other) {
                v.push(other);
            }
        }
        v
    }
}

/// The local-traffic detector's not-local condition text (`10.0.0.0/8`, `cbr0`, `veth+`), or
/// `None` when it is a no-op.
pub fn detector_text(plan: &ServiceDecisions) -> Option<String> {
    match &plan.local_detector {
        LocalDetector::NoOp => None,
        LocalDetector::Cidr(c) => Some(c.clone()),
        LocalDetector::Interface(i) => Some(i.clone()),
    }
}

/// The expected facts of every service port of the plan (the proxier's decisions),
/// in the plan's order.
pub fn expected_ports(plan: &ServiceDecisions) -> Vec<ExpectedPort<'_>> {
    plan.ports
        .iter()
        .map(|p| port_facts(p, plan.family))
        .collect()
}

fn port_u16(p: i32) -> u16 {
    u16::try_from(p).unwrap_or(0)
}

fn port_facts<'p>(p: &'p ServicePortDecisions, family: IpFamily) -> ExpectedPort<'p> {
    let info = &p.info;
    let set = |members: &'p [u32]| ExpectedEndpoints::of(p, members);
    let mut firewall_sources: Vec<String> = info
        .load_balancer_source_ranges
        .iter()
        .map(|c| c.to_string())
        .collect();
    if p.allow_from_node {
        firewall_sources.extend(
            info.load_balancer_vips
                .iter()
                .map(|ip| host_cidr(ip, family)),
        );
    }
    let has_endpoints = p.categorized.has_any;
    ExpectedPort {
        name: &info.name_string,
        protocol: info.name.protocol.lower(),
        hash: p.chains.svc.trim_start_matches("KUBE-SVC-"),
        cluster_ip: info.cluster_ip,
        port: port_u16(info.port),
        node_port: (info.node_port != 0).then(|| port_u16(info.node_port)),
        external_ips: &info.external_ips,
        lb_ips: &info.load_balancer_vips,
        firewall_sources,
        health_check_node_port: (info.health_check_node_port != 0)
            .then(|| port_u16(info.health_check_node_port)),
        affinity_seconds: info
            .session_affinity_seconds
            .and_then(|s| u32::try_from(s).ok()),
        internal_local: info.internal_policy_local,
        external_local: info.external_policy_local,
        has_endpoints,
        has_internal_endpoints: p.has_internal_endpoints,
        has_external_endpoints: p.has_external_endpoints,
        cluster_endpoints: set(if p.uses_cluster_policy_chain {
            &p.categorized.cluster
        } else {
            &[]
        }),
        local_endpoints: set(if p.uses_local_policy_chain {
            &p.categorized.local
        } else {
            &[]
        }),
        reachable: set(&p.categorized.reachable),
        uses_ext: p.uses_external_chain,
        uses_fw: p.uses_fw_chain,
        unusable_endpoints: if has_endpoints { 0 } else { p.endpoints.len() },
    }
}

/// `a.b.c.d/32` or `x::y/128`.
fn host_cidr(ip: &IpAddr, family: IpFamily) -> String {
    match family {
        IpFamily::V4 => format!("{ip}/32"),
        IpFamily::V6 => format!("{ip}/128"),
    }
}
