//! The objects of kube-proxy's table in the order of its first full sync into an empty table
//! (`proxier.go` `setupNFTables`, then the per-service-port loop of `syncProxyRules` and
//! `writeServiceToEndpointRules`), without the `flush` / `delete` operations, which leave an
//! empty table unchanged, and with the set and map elements last (each key once, as kube-proxy's
//! element store keeps them). Every chain, set and map is added before the first rule or
//! element that names it, so the output loads with `nft -f` as it stands.

use super::decisions::{NodeDecisions, PortDecisions};
use super::names::*;
use super::objects::{BaseChain, Name, Object, Sink, TableFamily};
use crate::state::Warning;
use crate::state::ip::{push_int, push_ip};
use indexmap::IndexMap;
use std::net::IpAddr;

/// The base chains (`nftablesBaseChains`), priorities as knftables writes them (`dstnat` −100,
/// `filter` 0, `srcnat` 100).
pub const BASE_CHAINS: [(&str, BaseChain); 8] = [
    (
        FILTER_PREROUTING_PRE_DNAT,
        base("filter", "prerouting", -110),
    ),
    (FILTER_OUTPUT_PRE_DNAT, base("filter", "output", -110)),
    (FILTER_INPUT, base("filter", "input", 0)),
    (FILTER_FORWARD, base("filter", "forward", 0)),
    (FILTER_OUTPUT, base("filter", "output", 0)),
    (NAT_PREROUTING, base("nat", "prerouting", -100)),
    (NAT_OUTPUT, base("nat", "output", -100)),
    (NAT_POSTROUTING, base("nat", "postrouting", 100)),
];

const fn base(chain_type: &'static str, hook: &'static str, priority: i32) -> BaseChain {
    BaseChain {
        chain_type,
        hook,
        priority,
    }
}

/// The jumps from base chains (`nftablesJumpChains`): destination, source, leading match.
pub const JUMP_CHAINS: [(&str, &str, &str); 11] = [
    (NODEPORT_ENDPOINTS_CHECK_CHAIN, FILTER_INPUT, "ct state new"),
    (SERVICE_ENDPOINTS_CHECK_CHAIN, FILTER_INPUT, "ct state new"),
    (
        SERVICE_ENDPOINTS_CHECK_CHAIN,
        FILTER_FORWARD,
        "ct state new",
    ),
    (SERVICE_ENDPOINTS_CHECK_CHAIN, FILTER_OUTPUT, "ct state new"),
    (
        FIREWALL_CHECK_CHAIN,
        FILTER_PREROUTING_PRE_DNAT,
        "ct state new",
    ),
    (FIREWALL_CHECK_CHAIN, FILTER_OUTPUT_PRE_DNAT, "ct state new"),
    (SERVICES_CHAIN, NAT_OUTPUT, ""),
    (SERVICES_CHAIN, NAT_PREROUTING, ""),
    (MASQUERADING_CHAIN, NAT_POSTROUTING, ""),
    (CLUSTER_IPS_CHECK_CHAIN, FILTER_FORWARD, "ct state new"),
    (CLUSTER_IPS_CHECK_CHAIN, FILTER_OUTPUT, "ct state new"),
];

/// `s` cut to the kernel's comment limit (knftables `CommentLengthMax`), at a character
/// boundary.
fn truncate_comment(s: &str) -> &str {
    const COMMENT_LENGTH_MAX: usize = 128;
    if s.len() <= COMMENT_LENGTH_MAX {
        return s;
    }
    let mut end = COMMENT_LENGTH_MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Appends an element key `ip . protocol . port`.
fn ip_key<'a>(ip: &'a IpAddr, protocol: &'a str, port: i32) -> impl FnOnce(&mut String) + 'a {
    move |k: &mut String| {
        push_ip(k, ip);
        k.push_str(" . ");
        k.push_str(protocol);
        k.push_str(" . ");
        push_int(k, i64::from(port));
    }
}

/// One element as kube-proxy's `nftElementStorage` holds it.
#[derive(Debug)]
struct StoredElement {
    value: Option<Box<str>>,
    comment: Option<Box<str>>,
    /// The service port (or "node") that wrote it, for conflict warnings.
    owner: Box<str>,
}

/// The elements of the table's sets and maps, kept until the end: like kube-proxy's
/// `ensureElem`, a key written again with the same value changes nothing (a multi-port
/// service's cluster IP) and with another value replaces the element.
#[derive(Debug, Default)]
struct ElementStore {
    containers: Vec<(&'static str, IndexMap<Box<str>, StoredElement>)>,
    warnings: Vec<Warning>,
}

impl ElementStore {
    fn ensure(
        &mut self,
        container: &'static str,
        key: &str,
        value: Option<&str>,
        comment: Option<&str>,
        owner: &str,
    ) {
        let elements = match self.containers.iter().position(|(c, _)| *c == container) {
            Some(i) => &mut self.containers[i].1,
            None => {
                self.containers.push((container, IndexMap::new()));
                let last = self.containers.len() - 1;
                &mut self.containers[last].1
            }
        };
        let new = || StoredElement {
            value: value.map(Box::from),
            comment: comment.map(Box::from),
            owner: Box::from(owner),
        };
        match elements.get_mut(key) {
            None => {
                elements.insert(Box::from(key), new());
            }
            Some(old) if old.value.as_deref() == value => {}
            Some(old) => {
                self.warnings.push(Warning::new(
                    format!("{container} element {key}"),
                    format!(
                        "claimed by {} ({}) and {owner} ({}); kube-proxy keeps whichever it \
                         writes last (its map order), here {owner}",
                        old.owner,
                        old.value.as_deref().unwrap_or(""),
                        value.unwrap_or("")
                    ),
                ));
                *old = new();
            }
        }
    }
}

/// Writes the objects of one table to a [`Sink`].
pub struct Emitter<'s> {
    sink: &'s mut dyn Sink,
    /// `ip` / `ip6` (the payload protocol in matches).
    ip_x: &'static str,
    /// `ipv4_addr` / `ipv6_addr`.
    addr_type: &'static str,
    /// Rule text / element key being built.
    text: String,
    /// Element value being built.
    value: String,
    /// Who writes the next elements (a service port, or the node).
    owner: String,
    elements: ElementStore,
}

impl<'s> Emitter<'s> {
    /// An emitter for `family`'s table.
    pub fn new(family: TableFamily, sink: &'s mut dyn Sink) -> Emitter<'s> {
        let (ip_x, addr_type) = match family {
            TableFamily::Ip => ("ip", "ipv4_addr"),
            TableFamily::Ip6 => ("ip6", "ipv6_addr"),
        };
        Emitter {
            sink,
            ip_x,
            addr_type,
            text: String::with_capacity(512),
            value: String::with_capacity(256),
            owner: String::from("node"),
            elements: ElementStore::default(),
        }
    }

    /// Writes the elements of every set and map (after all chains, sets and maps, so the
    /// whole output loads) and returns the key conflicts met.
    pub fn finish(self) -> Vec<Warning> {
        for (container, elements) in &self.elements.containers {
            for (key, e) in elements {
                self.sink.add(Object::Element {
                    container,
                    key,
                    value: e.value.as_deref(),
                    comment: e.comment.as_deref(),
                });
            }
        }
        self.elements.warnings
    }

    fn chain(&mut self, name: Name<'_>) {
        self.sink.add(Object::Chain {
            name,
            base: None,
            comment: None,
        });
    }

    /// A rule whose text `build` appends.
    fn rule(&mut self, chain: Name<'_>, comment: Option<&str>, build: impl FnOnce(&mut String)) {
        self.text.clear();
        build(&mut self.text);
        self.sink.add(Object::Rule {
            chain,
            rule: &self.text,
            comment,
        });
    }

    /// A set element whose key `key` appends.
    fn set_element(&mut self, set: &'static str, key: impl FnOnce(&mut String)) {
        self.text.clear();
        key(&mut self.text);
        self.elements
            .ensure(set, &self.text, None, None, &self.owner);
    }

    /// A verdict-map element: key from `key`, value `verdict` + `target`.
    fn map_element(
        &mut self,
        map: &'static str,
        key: impl FnOnce(&mut String),
        verdict: &str,
        target: Name<'_>,
        comment: Option<&str>,
    ) {
        self.text.clear();
        key(&mut self.text);
        self.value.clear();
        self.value.push_str(verdict);
        if !target.base.is_empty() {
            self.value.push(' ');
            self.value.push_str(target.prefix);
            self.value.push_str(target.base);
        }
        self.elements
            .ensure(map, &self.text, Some(&self.value), comment, &self.owner);
    }

    /// `setupNFTables` on an empty table: the table, base chains, jumps, the fixed chains, sets
    /// and maps and their rules.
    pub fn setup(&mut self, node: &NodeDecisions) {
        let ip_x = self.ip_x;
        let addr_type = self.addr_type;
        let no_localhost = match node.table_family {
            TableFamily::Ip => "ip daddr != 127.0.0.0/8",
            TableFamily::Ip6 => "ip6 daddr != ::1",
        };
        let mark = node.masquerade_mark.as_str();
        self.sink.add(Object::Table {
            comment: TABLE_COMMENT,
        });
        for (name, b) in BASE_CHAINS {
            self.sink.add(Object::Chain {
                name: Name::whole(name),
                base: Some(b),
                comment: None,
            });
        }
        let mut created: Vec<&str> = Vec::new();
        for (dst, src, extra) in JUMP_CHAINS {
            if !created.contains(&dst) {
                created.push(dst);
                self.chain(Name::whole(dst));
            }
            self.rule(Name::whole(src), None, |r| {
                if !extra.is_empty() {
                    r.push_str(extra);
                    r.push(' ');
                }
                r.push_str("jump ");
                r.push_str(dst);
            });
        }
        // 1.36 dropped `mark-for-masquerade`: marks are set inline.
        let g4 = node.layout.dnats_in_service_chains;
        let top: &[&str] = if g4 {
            &[SERVICES_CHAIN, CLUSTER_IPS_CHECK_CHAIN, MASQUERADING_CHAIN]
        } else {
            &[
                SERVICES_CHAIN,
                CLUSTER_IPS_CHECK_CHAIN,
                MASQUERADING_CHAIN,
                MARK_MASQ_CHAIN,
            ]
        };
        for &c in top {
            if !created.contains(&c) {
                created.push(c);
                self.chain(Name::whole(c));
            }
        }

        let masquerading = Name::whole(MASQUERADING_CHAIN);
        if g4 {
            let hairpin_type = format!("{addr_type} . {addr_type} . inet_proto . inet_service");
            self.sink.add(Object::Set {
                name: Name::whole(HAIRPIN_CONNECTIONS_SET),
                set_type: &hairpin_type,
                flags: &[],
                timeout_seconds: None,
                comment: Some("service hairpin connections"),
            });
            self.rule(masquerading, None, |r| {
                r.push_str("mark and ");
                r.push_str(mark);
                r.push_str(" != 0 mark set mark xor ");
                r.push_str(mark);
                r.push_str(" masquerade fully-random");
            });
            // A local endpoint reaching itself through a service is masqueraded after DNAT
            // (the set holds `ip . ip . proto . port` of each local endpoint).
            self.rule(masquerading, None, |r| {
                r.push_str("ct status dnat ");
                r.push_str(ip_x);
                r.push_str(" saddr . ");
                r.push_str(ip_x);
                r.push_str(" daddr . meta l4proto . th dport @");
                r.push_str(HAIRPIN_CONNECTIONS_SET);
                r.push_str(" masquerade fully-random");
            });
        } else {
            self.rule(Name::whole(MARK_MASQ_CHAIN), None, |r| {
                r.push_str("mark set mark or ");
                r.push_str(mark);
            });
            self.rule(masquerading, None, |r| {
                r.push_str("mark and ");
                r.push_str(mark);
                r.push_str(" == 0 return");
            });
            self.rule(masquerading, None, |r| {
                r.push_str("mark set mark xor ");
                r.push_str(mark);
            });
            self.rule(masquerading, None, |r| {
                r.push_str("masquerade fully-random")
            });
        }

        self.sink.add(Object::Set {
            name: Name::whole(CLUSTER_IPS_SET),
            set_type: addr_type,
            flags: &[],
            timeout_seconds: None,
            comment: Some("Active ClusterIPs"),
        });
        let check = Name::whole(CLUSTER_IPS_CHECK_CHAIN);
        self.rule(
            check,
            Some("Reject traffic to invalid ports of ClusterIPs"),
            |r| {
                r.push_str(ip_x);
                r.push_str(" daddr @");
                r.push_str(CLUSTER_IPS_SET);
                r.push_str(" reject");
            },
        );
        if !node.service_cidrs.is_empty() {
            self.rule(check, Some("Drop traffic to unallocated ClusterIPs"), |r| {
                r.push_str(ip_x);
                r.push_str(" daddr { ");
                r.push_str(&node.service_cidrs.join(","));
                r.push_str(" } drop");
            });
        }

        // An empty table gains nothing from kube-proxy's "add + delete" of `nodeport-ips` when
        // nodePortAddresses match everything.
        if !node.node_ports_match_all {
            self.sink.add(Object::Set {
                name: Name::whole(NODEPORT_IPS_SET),
                set_type: addr_type,
                flags: &[],
                timeout_seconds: None,
                comment: Some("IPs that accept NodePort traffic"),
            });
            for ip in &node.node_port_ips {
                self.set_element(NODEPORT_IPS_SET, |k| push_ip(k, ip));
            }
        }

        let addr_proto_port = format!("{addr_type} . inet_proto . inet_service : verdict");
        self.sink.add(Object::Map {
            name: NO_ENDPOINT_SERVICES_MAP,
            map_type: &addr_proto_port,
            comment: Some("vmap to drop or reject packets to services with no endpoints"),
        });
        self.sink.add(Object::Map {
            name: NO_ENDPOINT_NODEPORTS_MAP,
            map_type: "inet_proto . inet_service : verdict",
            comment: Some("vmap to drop or reject packets to service nodeports with no endpoints"),
        });
        self.sink.add(Object::Chain {
            name: Name::whole(REJECT_CHAIN),
            base: None,
            comment: Some("helper for @no-endpoint-services / @no-endpoint-nodeports"),
        });
        self.rule(Name::whole(REJECT_CHAIN), None, |r| r.push_str("reject"));
        self.rule(Name::whole(SERVICE_ENDPOINTS_CHECK_CHAIN), None, |r| {
            r.push_str(ip_x);
            r.push_str(" daddr . meta l4proto . th dport vmap @");
            r.push_str(NO_ENDPOINT_SERVICES_MAP);
        });
        self.rule(Name::whole(NODEPORT_ENDPOINTS_CHECK_CHAIN), None, |r| {
            if node.node_ports_match_all {
                r.push_str(no_localhost);
            } else {
                r.push_str(ip_x);
                r.push_str(" daddr @");
                r.push_str(NODEPORT_IPS_SET);
            }
            r.push_str(" meta l4proto . th dport vmap @");
            r.push_str(NO_ENDPOINT_NODEPORTS_MAP);
        });
        self.localhost_rejects(node);

        self.sink.add(Object::Map {
            name: FIREWALL_IPS_MAP,
            map_type: &addr_proto_port,
            comment: Some("destinations that are subject to LoadBalancerSourceRanges"),
        });
        self.rule(Name::whole(FIREWALL_CHECK_CHAIN), None, |r| {
            r.push_str(ip_x);
            r.push_str(" daddr . meta l4proto . th dport vmap @");
            r.push_str(FIREWALL_IPS_MAP);
        });

        self.sink.add(Object::Map {
            name: SERVICE_IPS_MAP,
            map_type: &addr_proto_port,
            comment: Some("ClusterIP, ExternalIP and LoadBalancer IP traffic"),
        });
        self.sink.add(Object::Map {
            name: SERVICE_NODEPORTS_MAP,
            map_type: "inet_proto . inet_service : verdict",
            comment: Some("NodePort traffic"),
        });
        if g4 {
            // 1.36: one rule for every cluster IP replaces the per-service masquerade rule.
            let comment = if node.masquerade_all {
                Some("masquerade all clusterIP traffic")
            } else if node.local_detector.is_implemented() {
                Some("masquerade clusterIP traffic from outside cluster")
            } else {
                None
            };
            if comment.is_some() {
                self.rule(Name::whole(SERVICES_CHAIN), comment, |r| {
                    r.push_str(ip_x);
                    r.push_str(" daddr @");
                    r.push_str(CLUSTER_IPS_SET);
                    r.push(' ');
                    if !node.masquerade_all {
                        node.local_detector.push_if_not_local(r);
                        r.push(' ');
                    }
                    r.push_str("mark set mark or ");
                    r.push_str(mark);
                });
            }
        }
        self.rule(Name::whole(SERVICES_CHAIN), None, |r| {
            r.push_str(ip_x);
            r.push_str(" daddr . meta l4proto . th dport vmap @");
            r.push_str(SERVICE_IPS_MAP);
        });
        self.rule(Name::whole(SERVICES_CHAIN), None, |r| {
            if node.node_ports_match_all {
                r.push_str("fib daddr type local ");
                r.push_str(no_localhost);
            } else {
                r.push_str(ip_x);
                r.push_str(" daddr @");
                r.push_str(NODEPORT_IPS_SET);
            }
            r.push_str(" meta l4proto . th dport vmap @");
            r.push_str(SERVICE_NODEPORTS_MAP);
        });
    }

    /// The localhost NodePort reject objects of `setupNFTables` (1.37 with
    /// `KubeProxyNFTablesLocalhostNodePorts`): the map, then per rejected protocol a counter and
    /// a chain that counts and rejects, then the `nodeport-endpoints-check` rule that looks
    /// loopback NodePort traffic up in the map. With the gate off kube-proxy adds and deletes
    /// the map, which leaves an empty table as it was.
    fn localhost_rejects(&mut self, node: &NodeDecisions) {
        if node.layout.localhost_rejected.is_empty() {
            return;
        }
        self.sink.add(Object::Map {
            name: LOCALHOST_NODEPORT_REJECT_MAP,
            map_type: "inet_proto . inet_service : verdict",
            comment: Some("localhost NodePorts rejected by kube-proxy"),
        });
        let mut counter = String::new();
        for protocol in &node.layout.localhost_rejected {
            counter.clear();
            counter.push_str(LOCALHOST_NODEPORT_REJECTED_COUNTER_PREFIX);
            counter.push_str(protocol.lower());
            self.sink.add(Object::Counter { name: &counter });
            let chain = Name::prefixed(LOCALHOST_NODEPORT_REJECT_PREFIX, protocol.lower());
            self.chain(chain);
            self.rule(chain, None, |r| {
                r.push_str("counter name ");
                super::objects::push_go_quoted(r, &counter);
                r.push_str(" reject");
            });
        }
        self.rule(Name::whole(NODEPORT_ENDPOINTS_CHECK_CHAIN), None, |r| {
            r.push_str(match node.table_family {
                TableFamily::Ip => "ip daddr 127.0.0.0/8",
                TableFamily::Ip6 => "ip6 daddr ::1",
            });
            r.push_str(" meta l4proto . th dport vmap @");
            r.push_str(LOCALHOST_NODEPORT_REJECT_MAP);
        });
    }

    /// One service port: the body of `syncProxyRules`' loop over the service map, for a full
    /// sync into a table that has none of the port's objects yet.
    pub fn service_port(&mut self, node: &NodeDecisions, p: &PortDecisions) {
        let info = &p.info;
        let protocol = info.name.protocol.lower();
        let port = info.port;
        let spn = info.name_string.as_str();
        let affinity = info.session_affinity_seconds;
        let ip_x = self.ip_x;
        let cluster_policy_chain = Name::whole(&p.chains.cluster_policy);
        let local_policy_chain = Name::whole(&p.chains.local_policy);
        let internal_traffic_chain = Name::whole(p.internal_traffic_chain());
        let external_policy_chain = Name::whole(p.external_policy_chain());
        let external_traffic_chain = Name::whole(&p.chains.external);
        let fw_chain = Name::whole(&p.chains.firewall);
        let endpoint_chain = |i: u32| Name::prefixed(ENDPOINT_PREFIX, p.endpoint_base(i));
        let affinity_set = |i: u32| Name::prefixed(AFFINITY_PREFIX, p.endpoint_base(i));
        let key = |ip| ip_key(ip, protocol, port);
        let node_port_key = |k: &mut String| {
            k.push_str(protocol);
            k.push_str(" . ");
            push_int(k, i64::from(info.node_port));
        };
        let no_target = Name::whole("");
        self.owner.clear();
        self.owner.push_str(spn);
        let g4 = node.layout.dnats_in_service_chains;
        let mark = node.masquerade_mark.as_str();
        // 1.37 cuts element comments to the kernel's limit (`truncateNFTablesComment`).
        let spn = if node.layout.truncates_element_comments {
            truncate_comment(spn)
        } else {
            spn
        };

        // Note the endpoint chains that will be used (from 1.36 only with ClientIP affinity),
        // and from 1.36 the hairpin connections of the local ones.
        for &i in &p.categorized.reachable {
            if !g4 || affinity.is_some() {
                self.chain(endpoint_chain(i));
            }
            if g4
                && let Some(ep) = p.endpoints.get(i as usize)
                && ep.is_local
            {
                self.set_element(HAIRPIN_CONNECTIONS_SET, |k| {
                    push_ip(k, &ep.ip);
                    k.push_str(" . ");
                    push_ip(k, &ep.ip);
                    k.push_str(" . ");
                    k.push_str(protocol);
                    k.push_str(" . ");
                    push_int(k, i64::from(ep.port));
                });
            }
        }
        if p.uses_cluster_policy_chain {
            self.chain(cluster_policy_chain);
        }
        if p.uses_local_policy_chain {
            self.chain(local_policy_chain);
        }
        if p.uses_external_traffic_chain {
            self.chain(external_traffic_chain);
        }

        // Capture the clusterIP.
        self.set_element(CLUSTER_IPS_SET, |k| push_ip(k, &info.cluster_ip));
        if p.has_internal_endpoints {
            self.map_element(
                SERVICE_IPS_MAP,
                key(&info.cluster_ip),
                "goto",
                internal_traffic_chain,
                None,
            );
        } else if let Some(v) = p.internal_filter_verdict {
            self.map_element(
                NO_ENDPOINT_SERVICES_MAP,
                key(&info.cluster_ip),
                v.as_str(),
                no_target,
                Some(spn),
            );
        }

        // Capture externalIPs.
        for external_ip in &info.external_ips {
            if p.has_endpoints {
                self.map_element(
                    SERVICE_IPS_MAP,
                    key(external_ip),
                    "goto",
                    external_traffic_chain,
                    None,
                );
            }
            if let (false, Some(v)) = (p.has_external_endpoints, p.external_filter_verdict) {
                self.map_element(
                    NO_ENDPOINT_SERVICES_MAP,
                    key(external_ip),
                    v.as_str(),
                    no_target,
                    Some(spn),
                );
            }
        }

        if p.uses_fw_chain {
            self.chain(fw_chain);
        }

        // Capture load-balancer ingress.
        for lb_ip in &info.load_balancer_vips {
            if p.has_endpoints {
                self.map_element(
                    SERVICE_IPS_MAP,
                    key(lb_ip),
                    "goto",
                    external_traffic_chain,
                    None,
                );
            }
            if p.uses_fw_chain {
                self.map_element(FIREWALL_IPS_MAP, key(lb_ip), "goto", fw_chain, None);
            }
        }
        if let (false, Some(v)) = (p.has_external_endpoints, p.external_filter_verdict) {
            for lb_ip in &info.load_balancer_vips {
                self.map_element(
                    NO_ENDPOINT_SERVICES_MAP,
                    key(lb_ip),
                    v.as_str(),
                    no_target,
                    Some(spn),
                );
            }
        }

        // Capture nodeports (not subject to loadBalancerSourceRanges).
        if info.node_port != 0 {
            if node.layout.localhost_rejected.contains(&info.name.protocol) {
                let chain = Name::prefixed(LOCALHOST_NODEPORT_REJECT_PREFIX, protocol);
                self.map_element(
                    LOCALHOST_NODEPORT_REJECT_MAP,
                    node_port_key,
                    "goto",
                    chain,
                    None,
                );
            }
            if p.has_endpoints {
                self.map_element(
                    SERVICE_NODEPORTS_MAP,
                    node_port_key,
                    "goto",
                    external_traffic_chain,
                    None,
                );
            }
            if let (false, Some(v)) = (p.has_external_endpoints, p.external_filter_verdict) {
                self.map_element(
                    NO_ENDPOINT_NODEPORTS_MAP,
                    node_port_key,
                    v.as_str(),
                    no_target,
                    Some(spn),
                );
            }
        }

        // Set up internal traffic handling (from 1.36 one `services` rule does it for all).
        if p.has_internal_endpoints && !g4 {
            if node.masquerade_all {
                self.rule(internal_traffic_chain, None, |r| {
                    r.push_str(ip_x);
                    r.push_str(" daddr ");
                    push_ip(r, &info.cluster_ip);
                    r.push_str(" jump ");
                    r.push_str(MARK_MASQ_CHAIN);
                });
            } else if node.local_detector.is_implemented() {
                // Masquerade off-cluster traffic to the cluster IP (it may bounce off-node).
                self.rule(internal_traffic_chain, None, |r| {
                    r.push_str(ip_x);
                    r.push_str(" daddr ");
                    push_ip(r, &info.cluster_ip);
                    r.push(' ');
                    node.local_detector.push_if_not_local(r);
                    r.push_str(" jump ");
                    r.push_str(MARK_MASQ_CHAIN);
                });
            }
        }

        // Set up external traffic handling: every external destination goes to the external
        // chain, which handles special cases and then goes to the external policy chain.
        if p.uses_external_traffic_chain {
            if !info.external_policy_local {
                // Non-local endpoints: masquerade, in case the traffic crosses nodes.
                if g4 {
                    self.rule(external_traffic_chain, Some("masquerade"), |r| {
                        r.push_str("mark set mark or ");
                        r.push_str(mark);
                    });
                } else {
                    self.rule(external_traffic_chain, None, |r| {
                        r.push_str("jump ");
                        r.push_str(MARK_MASQ_CHAIN);
                    });
                }
            } else {
                if node.local_detector.is_implemented() {
                    // Pod → external destination is subject to neither traffic policy.
                    self.rule(
                        external_traffic_chain,
                        Some("short-circuit pod traffic"),
                        |r| {
                            node.local_detector.push_if_local(r);
                            r.push_str(" goto ");
                            r.push_str(&p.chains.cluster_policy);
                        },
                    );
                }
                // Host-originated traffic is masqueraded (its source is a local address) and
                // goes to all endpoints.
                self.rule(
                    external_traffic_chain,
                    Some("masquerade local traffic"),
                    |r| {
                        r.push_str("fib saddr type local ");
                        if g4 {
                            r.push_str("mark set mark or ");
                            r.push_str(mark);
                        } else {
                            r.push_str("jump ");
                            r.push_str(MARK_MASQ_CHAIN);
                        }
                    },
                );
                self.rule(
                    external_traffic_chain,
                    Some("short-circuit local traffic"),
                    |r| {
                        r.push_str("fib saddr type local goto ");
                        r.push_str(&p.chains.cluster_policy);
                    },
                );
            }
            // Anything else falls through to the policy chain.
            if p.has_external_endpoints {
                self.rule(external_traffic_chain, None, |r| {
                    r.push_str("goto ");
                    r.push_str(external_policy_chain.base);
                });
            }
        }

        if p.uses_fw_chain {
            self.rule(fw_chain, None, |r| {
                r.push_str(ip_x);
                r.push_str(" saddr != { ");
                for (i, cidr) in info.load_balancer_source_ranges.iter().enumerate() {
                    if i > 0 {
                        r.push_str(" , ");
                    }
                    push_ip(r, &cidr.addr);
                    r.push('/');
                    push_int(r, i64::from(cidr.prefix));
                }
                // A node reaching a VIP that is a local address loops back with the VIP as
                // its source.
                if p.allow_from_node {
                    for lb_ip in &info.load_balancer_vips {
                        r.push_str(" , ");
                        push_ip(r, lb_ip);
                    }
                }
                r.push_str(" } drop");
            });
        }

        if let Some(seconds) = affinity {
            // Per-endpoint affinity sets: a client IP sticks to an endpoint of this service
            // port, whichever service IP it used.
            for &i in &p.categorized.reachable {
                self.sink.add(Object::Set {
                    name: affinity_set(i),
                    set_type: self.addr_type,
                    flags: &["dynamic", "timeout"],
                    timeout_seconds: Some(seconds),
                    comment: None,
                });
            }
        }

        // From 1.36 only ClientIP affinity needs endpoint chains (for the per-endpoint
        // `update`); other service chains DNAT themselves.
        let direct = g4 && affinity.is_none();
        for (used, chain, endpoints) in [
            (
                p.uses_cluster_policy_chain,
                cluster_policy_chain,
                &p.categorized.cluster,
            ),
            (
                p.uses_local_policy_chain,
                local_policy_chain,
                &p.categorized.local,
            ),
        ] {
            match (used, direct) {
                (false, _) => {}
                (true, false) => self.service_to_endpoint_rules(p, chain, endpoints),
                (true, true) => self.service_to_endpoint_dnats(node, p, chain, endpoints),
            }
        }
        if direct {
            return;
        }

        // The per-endpoint chains.
        for &i in &p.categorized.reachable {
            let Some(ep) = p.endpoints.get(i as usize) else {
                continue;
            };
            let chain = endpoint_chain(i);
            // Traffic that loops back to its originator is masqueraded (from 1.36 by the
            // `hairpin-connections` rule of `masquerading`).
            if !g4 {
                self.rule(chain, None, |r| {
                    r.push_str(ip_x);
                    r.push_str(" saddr ");
                    push_ip(r, &ep.ip);
                    r.push_str(" jump ");
                    r.push_str(MARK_MASQ_CHAIN);
                });
            }
            if affinity.is_some() {
                self.rule(chain, None, |r| {
                    r.push_str("update @");
                    r.push_str(AFFINITY_PREFIX);
                    r.push_str(p.endpoint_base(i));
                    r.push_str(" { ");
                    r.push_str(ip_x);
                    r.push_str(" saddr }");
                });
            }
            self.rule(chain, None, |r| {
                r.push_str("meta l4proto ");
                r.push_str(protocol);
                r.push_str(" dnat to ");
                r.push_str(&ep.endpoint);
            });
        }
    }

    /// `writeServiceToEndpointDNATs` (1.36): the service chain DNATs straight to an endpoint
    /// picked by `numgen` from a map of `IP . PORT`, or from 1.37 with one endpoint
    /// `dnat to IP:PORT`.
    fn service_to_endpoint_dnats(
        &mut self,
        node: &NodeDecisions,
        p: &PortDecisions,
        chain: Name<'_>,
        endpoints: &[u32],
    ) {
        let ip_x = self.ip_x;
        let protocol = p.info.name.protocol.lower();
        let eps: Vec<_> = endpoints
            .iter()
            .filter_map(|&i| p.endpoints.get(i as usize))
            .collect();
        self.rule(chain, None, |r| {
            r.push_str("meta l4proto ");
            r.push_str(protocol);
            match eps.as_slice() {
                [ep] if node.layout.dnats_single_endpoint_directly => {
                    r.push_str(" dnat to ");
                    r.push_str(&ep.endpoint);
                }
                _ => {
                    r.push_str(" dnat ");
                    r.push_str(ip_x);
                    r.push_str(" addr . port to numgen random mod ");
                    push_int(r, eps.len() as i64);
                    r.push_str(" map { ");
                    for (n, ep) in eps.iter().enumerate() {
                        if n > 0 {
                            r.push_str(" , ");
                        }
                        push_int(r, n as i64);
                        r.push_str(" : ");
                        push_ip(r, &ep.ip);
                        r.push_str(" . ");
                        push_int(r, i64::from(ep.port));
                    }
                    r.push_str(" }");
                }
            }
        });
    }

    /// `writeServiceToEndpointRules`: affinity lookups, then the load-balancing vmap.
    fn service_to_endpoint_rules(&mut self, p: &PortDecisions, chain: Name<'_>, endpoints: &[u32]) {
        let ip_x = self.ip_x;
        if p.info.session_affinity_seconds.is_some() {
            for &i in endpoints {
                self.rule(chain, None, |r| {
                    r.push_str(ip_x);
                    r.push_str(" saddr @");
                    r.push_str(AFFINITY_PREFIX);
                    r.push_str(p.endpoint_base(i));
                    r.push_str(" goto ");
                    r.push_str(ENDPOINT_PREFIX);
                    r.push_str(p.endpoint_base(i));
                });
            }
        }
        self.rule(chain, None, |r| {
            r.push_str("numgen random mod ");
            push_int(r, endpoints.len() as i64);
            r.push_str(" vmap { ");
            for (n, &i) in endpoints.iter().enumerate() {
                if n > 0 {
                    r.push_str(" , ");
                }
                push_int(r, n as i64);
                r.push_str(" : goto ");
                r.push_str(ENDPOINT_PREFIX);
                r.push_str(p.endpoint_base(i));
            }
            r.push_str(" }");
        });
    }
}

#[cfg(test)]
mod tests {
    use super::truncate_comment;
    use crate::proxier::nftables::render_text;
    use crate::state::config::{ProxyConfig, parse};
    use crate::state::ip::IpFamily;
    use crate::state::node::{NodeInputs, build};
    use crate::state::version::KubeProxyVersion;
    use crate::state::{ClusterState, load};
    use std::path::PathBuf;

    fn cluster() -> (ClusterState, ProxyConfig) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/cluster");
        let state = load::from_files(&[dir.join("state.json")]).expect("state");
        let text = std::fs::read_to_string(dir.join("config.yaml")).expect("config");
        let (config, _) = parse(&text, "config.yaml").expect("config parses");
        (state, config.for_nftables())
    }

    /// The example cluster's table of release 1.`minor` and `family`, with `gates` set.
    fn table(minor: u32, family: IpFamily, config: &ProxyConfig, gates: &[(&str, bool)]) -> String {
        let (state, _) = cluster();
        let inputs = NodeInputs {
            family: Some(family),
            kube_proxy_version: Some(KubeProxyVersion::of_minor(minor).expect("known")),
            feature_gates: gates.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            ..NodeInputs::default()
        };
        let (facts, _) = build(&inputs, &state, config).expect("facts");
        render_text(&state, config, &facts).0
    }

    fn has(text: &str, part: &str) -> bool {
        text.lines().any(|l| l.contains(part))
    }

    #[test]
    fn each_release_writes_its_layout() {
        let (_, config) = cluster();
        let g3 = table(35, IpFamily::V4, &config, &[]);
        assert!(has(&g3, "add chain ip kube-proxy mark-for-masquerade"));
        assert!(has(&g3, " jump mark-for-masquerade"));
        assert!(!has(&g3, "hairpin-connections"));

        let g4 = table(36, IpFamily::V4, &config, &[]);
        assert!(!has(&g4, "mark-for-masquerade"), "{g4}");
        assert!(has(
            &g4,
            "add set ip kube-proxy hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; comment \"service hairpin connections\" ; }"
        ));
        assert!(has(
            &g4,
            "masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random"
        ));
        assert!(has(
            &g4,
            "services ip daddr @cluster-ips ip saddr != 10.244.0.0/16 mark set mark or 0x00004000 comment \"masquerade clusterIP traffic from outside cluster\""
        ));
        assert!(has(
            &g4,
            "dnat ip addr . port to numgen random mod 1 map { 0 : "
        ));
        assert!(!has(&g4, "localhost-nodeport-reject"));
        // Endpoint chains remain only for ClientIP affinity, and DNAT there.
        let endpoint_rules: Vec<&str> = g4
            .lines()
            .filter(|l| l.starts_with("add rule ip kube-proxy endpoint-"))
            .collect();
        assert!(!endpoint_rules.is_empty());
        assert!(
            endpoint_rules
                .iter()
                .all(|l| l.contains(" update @affinity-") || l.contains(" dnat to ")),
            "{endpoint_rules:?}"
        );

        let v37 = table(37, IpFamily::V4, &config, &[]);
        assert!(!has(&v37, "numgen random mod 1 map"), "{v37}");
        assert!(has(&v37, "dnat ip addr . port to numgen random mod 2 map"));
        assert!(!has(&v37, "localhost-nodeport-reject"));

        let v38 = table(38, IpFamily::V4, &config, &[]);
        for proto in ["tcp", "udp", "sctp"] {
            assert!(has(
                &v38,
                &format!("add chain ip kube-proxy localhost-nodeport-reject-{proto}")
            ));
        }
        assert!(has(
            &v38,
            "nodeport-endpoints-check ip daddr 127.0.0.0/8 meta l4proto . th dport vmap @localhost-nodeport-reject-ports"
        ));
        assert!(has(&v38, ": goto localhost-nodeport-reject-tcp }"));
        // The gate off by flag: 1.37's table; on in 1.37: 1.38's.
        let gate = crate::proxier::version::LOCALHOST_NODEPORTS_GATE;
        assert_eq!(table(38, IpFamily::V4, &config, &[(gate, false)]), v37);
        assert_eq!(table(37, IpFamily::V4, &config, &[(gate, true)]), v38);
    }

    #[test]
    fn ipv6_tables_name_ip6() {
        let (_, config) = cluster();
        let v37 = table(37, IpFamily::V6, &config, &[]);
        assert!(has(
            &v37,
            "ipv6_addr . ipv6_addr . inet_proto . inet_service"
        ));
        assert!(
            has(&v37, "dnat ip6 addr . port to numgen random mod") || has(&v37, "dnat to ["),
            "{v37}"
        );
        assert!(has(&v37, "ct status dnat ip6 saddr . ip6 daddr"));
        let v38 = table(38, IpFamily::V6, &config, &[]);
        assert!(has(
            &v38,
            "nodeport-endpoints-check ip6 daddr ::1 meta l4proto"
        ));
    }

    #[test]
    fn configuration_and_gates_shape_the_release() {
        let (_, config) = cluster();
        let mut all = config.clone();
        all.masquerade_all = true;
        let t = table(36, IpFamily::V4, &all, &[]);
        assert!(has(
            &t,
            "services ip daddr @cluster-ips mark set mark or 0x00004000 comment \"masquerade all clusterIP traffic\""
        ));
        // An explicit loopback range: the userspace proxy serves TCP, so only UDP and SCTP are
        // rejected.
        let mut lo = config.clone();
        lo.node_port_addresses = vec!["primary".into(), "localhost".into()];
        let t = table(38, IpFamily::V4, &lo, &[]);
        assert!(!has(&t, "localhost-nodeport-reject-tcp"), "{t}");
        assert!(has(
            &t,
            "add chain ip kube-proxy localhost-nodeport-reject-udp"
        ));
        // AllowServiceExternalIPs off (1.36 and later): no element for an external IP.
        let external = "192.168.77.50 . tcp";
        let gate = crate::proxier::version::ALLOW_EXTERNAL_IPS_GATE;
        assert!(has(&table(36, IpFamily::V4, &config, &[]), external));
        assert!(!has(
            &table(36, IpFamily::V4, &config, &[(gate, false)]),
            external
        ));
        assert!(has(
            &table(35, IpFamily::V4, &config, &[(gate, false)]),
            external
        ));
    }

    #[test]
    fn comments_are_cut_at_the_kernel_limit() {
        let long = "n".repeat(63) + "/" + &"s".repeat(63) + ":" + &"p".repeat(15);
        assert_eq!(truncate_comment(&long).len(), 128);
        assert_eq!(truncate_comment("ns1/svc1:p80"), "ns1/svc1:p80");
        let wide = "é".repeat(70);
        assert_eq!(truncate_comment(&wide).len(), 128);
        assert!(truncate_comment(&wide).is_char_boundary(128));
    }
}
