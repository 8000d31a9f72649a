//! The emitter: writes the rules of each service port into the filter and nat buffers, in
//! kube-proxy's emission order (`proxier.go` `syncProxyRules`).

mod early;

use super::base_jumps::add_base_jumps;
use super::decisions::{LocalDetector, ServiceDecisions, ServicePortDecisions, prepare};
use super::rendered::{Rendered, RenderedTable, TextBuf};
use super::{NODEPORTS_TAIL_COMMENT, RenderOptions};
use crate::proxier::endpoints::EndpointDetail;
use crate::state::config::ProxyConfig;
use crate::state::ip::IpFamily;
use crate::state::node::NodeFacts;
use crate::state::version::KubeProxyVersion;
use crate::state::{ClusterState, Warning};
use std::net::IpAddr;

/// Builds rule lines word by word into a table's buffer.
pub(super) struct Line<'t> {
    buf: &'t mut String,
}

impl<'t> Line<'t> {
    pub(super) fn start(text: &'t mut TextBuf, chain: &str) -> Line<'t> {
        let buf = text.line();
        buf.push_str("-A ");
        buf.push_str(chain);
        Line { buf }
    }
    pub(super) fn w(self, word: &str) -> Self {
        self.buf.push(' ');
        self.buf.push_str(word);
        self
    }
    pub(super) fn ws(mut self, words: &[&str]) -> Self {
        for word in words {
            self = self.w(word);
        }
        self
    }
    pub(super) fn num(self, n: i32) -> Self {
        self.buf.push(' ');
        crate::state::ip::push_int(self.buf, i64::from(n));
        self
    }
    /// `-m comment --comment "<parts…>"` (escaped where a part needs it).
    pub(super) fn comment_q(self, parts: &[&str]) -> Self {
        self.buf.push_str(" -m comment --comment ");
        crate::proxier::quoting::push_iptables_quoted(self.buf, parts);
        self
    }
    /// `-m comment --comment <word>` (unquoted, as kube-proxy writes it, unless it needs quotes).
    pub(super) fn comment(self, word: &str) -> Self {
        self.buf.push_str(" -m comment --comment ");
        crate::proxier::quoting::push_iptables_word(self.buf, word);
        self
    }
    pub(super) fn end(self) {
        self.buf.push('\n');
    }
}

/// Renders the restore input kube-proxy writes on a full sync (filter and nat), plus the base
/// chains and jumps when asked. Service ports are planned and emitted one at a time, so the
/// working memory stays close to the size of the output.
pub fn render(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    opts: RenderOptions,
) -> Rendered {
    let (decisions, work, decider) = prepare(state, config, facts, EndpointDetail::Lean);
    let mut emitter = Emitter::new(&decisions, facts);
    for (info, endpoints) in work {
        emitter.port(&decider.decide(info, endpoints));
    }
    emitter.finish(opts, decisions.warnings)
}

/// Renders an already computed [`ServiceDecisions`].
pub fn render_decisions(
    decisions: &ServiceDecisions,
    facts: &NodeFacts,
    opts: RenderOptions,
) -> Rendered {
    let mut emitter = Emitter::new(decisions, facts);
    for p in &decisions.ports {
        emitter.port(p);
    }
    emitter.finish(opts, decisions.warnings.clone())
}

/// Whole lines of one table, as [`render_decisions_chunks`] hands them out.
#[derive(Debug, Clone, Copy)]
pub struct RenderChunk<'c> {
    /// `filter` or `nat`.
    pub table: &'static str,
    /// Chain declarations (`:NAME - [0:0]`) when true, rules (`-A …`) when false.
    pub declarations: bool,
    /// The lines, each ending in a newline.
    pub text: &'c str,
}

/// What a render says besides its lines.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderSummary {
    /// The family rendered.
    pub family: IpFamily,
    /// Whether large-cluster mode was on.
    pub large_cluster_mode: bool,
    /// Objects skipped or oddities kube-proxy would log.
    pub warnings: Vec<Warning>,
}

/// Renders `decisions` as [`render_decisions`] does (without base jumps), handing the text to `sink` in
/// chunks of whole lines (256 KiB each) as it is written and keeping none of it: readers that
/// look at each rule once (verify) never hold a large render's text whole. Within one table and
/// kind, chunks come in render order.
pub fn render_decisions_chunks(
    decisions: &ServiceDecisions,
    facts: &NodeFacts,
    sink: &mut dyn FnMut(RenderChunk<'_>),
) -> RenderSummary {
    let mut emitter = Emitter::new(decisions, facts);
    for p in &decisions.ports {
        emitter.port(p);
        emitter.drain(sink);
    }
    let rendered = emitter.finish(RenderOptions::default(), decisions.warnings.clone());
    for t in &rendered.tables {
        for (declarations, buf) in [(true, &t.chain_lines), (false, &t.rule_lines)] {
            for text in buf.chunks().filter(|c| !c.is_empty()) {
                sink(RenderChunk {
                    table: t.name,
                    declarations,
                    text,
                });
            }
        }
    }
    RenderSummary {
        family: rendered.family,
        large_cluster_mode: rendered.large_cluster_mode,
        warnings: rendered.warnings,
    }
}

/// Writes the rules of one render into the filter and nat buffers.
struct Emitter {
    filter: RenderedTable,
    nat: RenderedTable,
    /// The release whose rules are written.
    version: KubeProxyVersion,
    family: IpFamily,
    is_v6: bool,
    mark_match: String,
    large: bool,
    nfacct_localhost: bool,
    nfacct_ct_state_invalid: bool,
    tcp_be_liberal: bool,
    kube_firewall: bool,
    localhost_node_ports: bool,
    match_all: bool,
    node_port_ips: Vec<IpAddr>,
    detector: LocalDetector,
    probabilities: Vec<String>,
    scratch: String,
}

impl Emitter {
    /// Hands the full chunks written so far to `sink` and forgets them.
    fn drain(&mut self, sink: &mut dyn FnMut(RenderChunk<'_>)) {
        for t in [&mut self.filter, &mut self.nat] {
            let name = t.name;
            for (declarations, buf) in [(true, &mut t.chain_lines), (false, &mut t.rule_lines)] {
                for text in buf.done.drain(..) {
                    sink(RenderChunk {
                        table: name,
                        declarations,
                        text: &text,
                    });
                }
            }
        }
    }

    /// Chain lines and the rules written before the services.
    fn new(decisions: &ServiceDecisions, facts: &NodeFacts) -> Emitter {
        let is_v6 = decisions.family == IpFamily::V6;
        let version = facts.kube_proxy_version;
        let mark = facts.masquerade_mark.as_str();
        let mut filter = RenderedTable::new("filter");
        let mut nat = RenderedTable::new("nat");

        for c in [
            "KUBE-SERVICES",
            "KUBE-EXTERNAL-SERVICES",
            "KUBE-FORWARD",
            "KUBE-NODEPORTS",
            "KUBE-PROXY-FIREWALL",
        ] {
            let written = match c {
                "KUBE-NODEPORTS" => version.opens_health_check_ports(),
                "KUBE-PROXY-FIREWALL" => version.drops_in_filter_table(),
                _ => true,
            };
            if written {
                filter.chain(c);
            }
        }
        for c in [
            "KUBE-SERVICES",
            "KUBE-NODEPORTS",
            "KUBE-POSTROUTING",
            "KUBE-MARK-MASQ",
        ] {
            nat.chain(c);
        }
        let mark_match = format!("{mark}/{mark}");
        Line::start(&mut nat.rule_lines, "KUBE-POSTROUTING")
            .ws(&["-m", "mark", "!", "--mark", &mark_match, "-j", "RETURN"])
            .end();
        Line::start(&mut nat.rule_lines, "KUBE-POSTROUTING")
            .ws(&["-j", "MARK", "--xor-mark", mark])
            .end();
        let l = Line::start(&mut nat.rule_lines, "KUBE-POSTROUTING")
            .comment_q(&["kubernetes service traffic requiring SNAT"])
            .ws(&["-j", "MASQUERADE"]);
        if facts.random_fully {
            l.w("--random-fully").end();
        } else {
            l.end();
        }
        Line::start(&mut nat.rule_lines, "KUBE-MARK-MASQ")
            .ws(&["-j", "MARK", "--or-mark", mark])
            .end();
        let kube_firewall =
            !is_v6 && decisions.localhost_node_ports && version.writes_kube_firewall();
        if kube_firewall {
            filter.chain("KUBE-FIREWALL");
            Line::start(&mut filter.rule_lines, "KUBE-FIREWALL")
                .comment_q(&["block incoming localnet connections"])
                .ws(&[
                    "-d",
                    "127.0.0.0/8",
                    "!",
                    "-s",
                    "127.0.0.0/8",
                    "-m",
                    "conntrack",
                    "!",
                    "--ctstate",
                    "RELATED,ESTABLISHED,DNAT",
                    "-j",
                    "DROP",
                ])
                .end();
        }
        Emitter {
            filter,
            nat,
            family: decisions.family,
            is_v6,
            mark_match,
            large: decisions.large_cluster_mode,
            nfacct_localhost: decisions.localhost_node_ports
                && !is_v6
                && facts.nfacct_localhost_nodeports
                && version.counts_with_nfacct(),
            nfacct_ct_state_invalid: facts.nfacct_ct_state_invalid && version.counts_with_nfacct(),
            tcp_be_liberal: facts.tcp_be_liberal && version.drops_invalid_conditionally(),
            version,
            kube_firewall,
            localhost_node_ports: decisions.localhost_node_ports,
            match_all: decisions.node_ports_match_all,
            node_port_ips: decisions.node_port_ips.clone(),
            detector: decisions.local_detector.clone(),
            probabilities: Vec::new(),
            scratch: String::with_capacity(64),
        }
    }

    /// The rules of one service port: the body of the service-port loop of `proxier.go`
    /// `syncProxyRules` (1.24 and later; [`Emitter::early_port`] before), in its order and with
    /// its section comments. Its variables are fields of the decisions under the same names
    /// (`hasEndpoints` is `p.categorized.has_any`, `hasInternalEndpoints`
    /// `p.has_internal_endpoints`, `usesExternalTrafficChain` `p.uses_external_chain`,
    /// `usesFWChain` `p.uses_fw_chain`); `serves_internal`/`serves_external` are
    /// `hasInternalEndpoints`/`hasExternalEndpoints` as 1.24 read them (it sent a destination
    /// on whenever the service had endpoints), and `int_target`/`int_comment`,
    /// `ext_target`/`ext_comment` are `internalTrafficFilterTarget`/`…Comment` and
    /// `externalTrafficFilterTarget`/`…Comment`.
    fn port(&mut self, p: &ServicePortDecisions) {
        if !self.version.uses_ext_chains() {
            self.early_port(p);
            return;
        }
        let info = &p.info;
        let spn = info.name_string.as_str();
        let proto = info.name.protocol.lower();
        let cip = info.cluster_ip.to_string();
        let port = info.port.to_string();
        let has_endpoints = p.categorized.has_any;
        let (int_target, int_comment, ext_target, ext_comment) = if !has_endpoints {
            ("REJECT", " has no endpoints", "REJECT", " has no endpoints")
        } else {
            (
                if p.has_internal_endpoints { "" } else { "DROP" },
                " has no local endpoints",
                if p.has_external_endpoints { "" } else { "DROP" },
                " has no local endpoints",
            )
        };
        let ext_ips: Vec<String> = info.external_ips.iter().map(|i| i.to_string()).collect();
        let lb_ips: Vec<String> = info
            .load_balancer_vips
            .iter()
            .map(|i| i.to_string())
            .collect();
        let lb_target = if p.uses_fw_chain {
            &p.chains.fw
        } else {
            &p.chains.ext
        };
        // 1.24 sends a destination on whenever the service has endpoints: an empty Local policy
        // chain then drops (through kubelet's KUBE-MARK-DROP), not the filter table.
        let drops = self.version.drops_in_filter_table();
        let serves_internal = p.has_internal_endpoints || (!drops && has_endpoints);
        let serves_external = p.has_external_endpoints || (!drops && has_endpoints);

        // Capture the clusterIP.
        if serves_internal {
            Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                .comment_q(&[spn, " cluster IP"])
                .ws(&[
                    "-m",
                    proto,
                    "-p",
                    proto,
                    "-d",
                    &cip,
                    "--dport",
                    &port,
                    "-j",
                    p.internal_chain(),
                ])
                .end();
        } else {
            Line::start(&mut self.filter.rule_lines, "KUBE-SERVICES")
                .comment_q(&[spn, int_comment])
                .ws(&[
                    "-m", proto, "-p", proto, "-d", &cip, "--dport", &port, "-j", int_target,
                ])
                .end();
        }
        // Capture externalIPs.
        for x in &ext_ips {
            if has_endpoints {
                Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                    .comment_q(&[spn, " external IP"])
                    .ws(&[
                        "-m",
                        proto,
                        "-p",
                        proto,
                        "-d",
                        x,
                        "--dport",
                        &port,
                        "-j",
                        &p.chains.ext,
                    ])
                    .end();
            }
            if !serves_external {
                Line::start(&mut self.filter.rule_lines, "KUBE-EXTERNAL-SERVICES")
                    .comment_q(&[spn, ext_comment])
                    .ws(&[
                        "-m", proto, "-p", proto, "-d", x, "--dport", &port, "-j", ext_target,
                    ])
                    .end();
            }
        }
        // Capture load-balancer ingress.
        for l in &lb_ips {
            if has_endpoints {
                Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                    .comment_q(&[spn, " loadbalancer IP"])
                    .ws(&[
                        "-m", proto, "-p", proto, "-d", l, "--dport", &port, "-j", lb_target,
                    ])
                    .end();
            }
            if p.uses_fw_chain && drops {
                Line::start(&mut self.filter.rule_lines, "KUBE-PROXY-FIREWALL")
                    .comment_q(&[spn, " traffic not accepted by ", &p.chains.fw])
                    .ws(&[
                        "-m", proto, "-p", proto, "-d", l, "--dport", &port, "-j", "DROP",
                    ])
                    .end();
            }
        }
        if !serves_external {
            for l in &lb_ips {
                Line::start(&mut self.filter.rule_lines, "KUBE-EXTERNAL-SERVICES")
                    .comment_q(&[spn, ext_comment])
                    .ws(&[
                        "-m", proto, "-p", proto, "-d", l, "--dport", &port, "-j", ext_target,
                    ])
                    .end();
            }
        }
        // Capture nodeports.
        if info.node_port != 0 {
            if has_endpoints {
                if self.nfacct_localhost {
                    Line::start(&mut self.nat.rule_lines, "KUBE-NODEPORTS")
                        .comment(spn)
                        .ws(&["-m", proto, "-p", proto, "-d", "127.0.0.0/8", "--dport"])
                        .num(info.node_port)
                        .ws(&[
                            "-m",
                            "nfacct",
                            "--nfacct-name",
                            crate::state::node::NFACCT_LOCALHOST_NODEPORTS,
                            "-j",
                            &p.chains.ext,
                        ])
                        .end();
                }
                Line::start(&mut self.nat.rule_lines, "KUBE-NODEPORTS")
                    .comment(spn)
                    .ws(&["-m", proto, "-p", proto, "--dport"])
                    .num(info.node_port)
                    .ws(&["-j", &p.chains.ext])
                    .end();
            }
            if !serves_external {
                Line::start(&mut self.filter.rule_lines, "KUBE-EXTERNAL-SERVICES")
                    .comment_q(&[spn, ext_comment])
                    .ws(&[
                        "-m",
                        "addrtype",
                        "--dst-type",
                        "LOCAL",
                        "-m",
                        proto,
                        "-p",
                        proto,
                        "--dport",
                    ])
                    .num(info.node_port)
                    .ws(&["-j", ext_target])
                    .end();
            }
        }
        // Capture healthCheckNodePorts.
        if info.health_check_node_port != 0 {
            Line::start(&mut self.filter.rule_lines, "KUBE-NODEPORTS")
                .comment_q(&[spn, " health check node port"])
                .ws(&["-m", "tcp", "-p", "tcp", "--dport"])
                .num(info.health_check_node_port)
                .ws(&["-j", "ACCEPT"])
                .end();
        }

        // Set up internal traffic handling.
        if serves_internal {
            fn base<'b>(
                buf: &'b mut TextBuf,
                chain: &str,
                spn: &str,
                proto: &str,
                cip: &str,
                port: &str,
            ) -> Line<'b> {
                Line::start(buf, chain)
                    .comment_q(&[spn, " cluster IP"])
                    .ws(&["-m", proto, "-p", proto, "-d", cip, "--dport", port])
            }
            if p.cluster_ip_masquerade == "all" {
                base(
                    &mut self.nat.rule_lines,
                    p.internal_chain(),
                    spn,
                    proto,
                    &cip,
                    &port,
                )
                .ws(&["-j", "KUBE-MARK-MASQ"])
                .end();
            } else if self.detector.is_implemented() {
                let [flag, value] = self.detector.if_local();
                base(
                    &mut self.nat.rule_lines,
                    p.internal_chain(),
                    spn,
                    proto,
                    &cip,
                    &port,
                )
                .ws(&["!", flag, value, "-j", "KUBE-MARK-MASQ"])
                .end();
            }
        }
        // Set up external traffic handling: every captured external destination jumps to the
        // EXT chain, which short-circuits local traffic and then jumps to the policy chain.
        if p.uses_external_chain {
            let ext = p.chains.ext.as_str();
            self.nat.chain(ext);
            if !info.external_policy_local {
                Line::start(&mut self.nat.rule_lines, ext)
                    .comment_q(&["masquerade traffic for ", spn, " external destinations"])
                    .ws(&["-j", "KUBE-MARK-MASQ"])
                    .end();
            } else {
                if self.detector.is_implemented() {
                    let [flag, value] = self.detector.if_local();
                    Line::start(&mut self.nat.rule_lines, ext)
                        .comment_q(&["pod traffic for ", spn, " external destinations"])
                        .ws(&[flag, value, "-j", &p.chains.svc])
                        .end();
                }
                Line::start(&mut self.nat.rule_lines, ext)
                    .comment_q(&[
                        "masquerade LOCAL traffic for ",
                        spn,
                        " external destinations",
                    ])
                    .ws(&[
                        "-m",
                        "addrtype",
                        "--src-type",
                        "LOCAL",
                        "-j",
                        "KUBE-MARK-MASQ",
                    ])
                    .end();
                Line::start(&mut self.nat.rule_lines, ext)
                    .comment_q(&["route LOCAL traffic for ", spn, " external destinations"])
                    .ws(&["-m", "addrtype", "--src-type", "LOCAL", "-j", &p.chains.svc])
                    .end();
            }
            if serves_external {
                Line::start(&mut self.nat.rule_lines, ext)
                    .ws(&["-j", p.external_policy_chain()])
                    .end();
            }
        }
        // Set up firewall chain, if needed.
        if p.uses_fw_chain && !drops {
            // 1.24 writes the firewall rules once per load-balancer IP, each set ending in a
            // drop mark.
            let fw = p.chains.fw.as_str();
            self.nat.chain(fw);
            for l in &lb_ips {
                let allowed = info
                    .load_balancer_source_ranges
                    .iter()
                    .map(|c| c.to_string());
                let from_node = p.allow_from_node.then(|| l.clone());
                for source in allowed.chain(from_node) {
                    Line::start(&mut self.nat.rule_lines, fw)
                        .comment_q(&[spn, " loadbalancer IP"])
                        .ws(&["-s", &source, "-j", &p.chains.ext])
                        .end();
                }
                Line::start(&mut self.nat.rule_lines, fw)
                    .comment_q(&[spn, " loadbalancer IP"])
                    .ws(&["-j", "KUBE-MARK-DROP"])
                    .end();
            }
        } else if p.uses_fw_chain {
            let fw = p.chains.fw.as_str();
            self.nat.chain(fw);
            for c in &info.load_balancer_source_ranges {
                let c = c.to_string();
                Line::start(&mut self.nat.rule_lines, fw)
                    .comment_q(&[spn, " loadbalancer IP"])
                    .ws(&["-s", &c, "-j", &p.chains.ext])
                    .end();
            }
            if p.allow_from_node {
                for l in &lb_ips {
                    Line::start(&mut self.nat.rule_lines, fw)
                        .comment_q(&[spn, " loadbalancer IP"])
                        .ws(&["-s", l, "-j", &p.chains.ext])
                        .end();
                }
            }
            if self.version.writes_kube_firewall() {
                Line::start(&mut self.nat.rule_lines, fw)
                    .comment_q(&[
                        "other traffic to ",
                        spn,
                        " will be dropped by KUBE-PROXY-FIREWALL",
                    ])
                    .end();
            }
        }
        // If Cluster policy is in use, create the chain and the rules jumping from it to the
        // cluster endpoints; the same for Local policy.
        if p.uses_cluster_policy_chain {
            self.nat.chain(&p.chains.svc);
            write_service_to_endpoint_rules(
                &mut self.nat.rule_lines,
                p,
                &p.chains.svc,
                &p.categorized.cluster,
                self.large,
                &mut self.probabilities,
            );
        }
        if p.uses_local_policy_chain {
            self.nat.chain(&p.chains.svl);
            write_service_to_endpoint_rules(
                &mut self.nat.rule_lines,
                p,
                &p.chains.svl,
                &p.categorized.local,
                self.large,
                &mut self.probabilities,
            );
            if p.categorized.local.is_empty() {
                // Only 1.24 writes a Local policy chain without endpoints.
                Line::start(&mut self.nat.rule_lines, &p.chains.svl)
                    .comment_q(&[spn, " has no local endpoints"])
                    .ws(&["-j", "KUBE-MARK-DROP"])
                    .end();
            }
        }
        self.endpoint_chains(p);
    }

    /// The `KUBE-SEP-…` chain of every endpoint the service's rules can reach.
    fn endpoint_chains(&mut self, p: &ServicePortDecisions) {
        let info = &p.info;
        let spn = info.name_string.as_str();
        let proto = info.name.protocol.lower();
        for &i in &p.categorized.reachable {
            let (Some(ep), Some(sep)) = (
                p.endpoints.get(i as usize),
                p.endpoint_chains.get(i as usize),
            ) else {
                continue;
            };
            self.nat.chain(sep);
            self.scratch.clear();
            crate::state::ip::push_ip(&mut self.scratch, &ep.ip);
            if !self.version.bare_addresses() {
                self.scratch.push_str(host_prefix(&ep.ip));
            }
            let mut l = Line::start(&mut self.nat.rule_lines, sep);
            if !self.large {
                l = l.comment(spn);
            }
            l.ws(&["-s", &self.scratch, "-j", "KUBE-MARK-MASQ"]).end();
            let mut l = Line::start(&mut self.nat.rule_lines, sep);
            if !self.large {
                l = l.comment(spn);
            }
            if info.session_affinity_seconds.is_some() {
                l = l.ws(&["-m", "recent", "--name", sep, "--set"]);
            }
            l.ws(&[
                "-m",
                proto,
                "-p",
                proto,
                "-j",
                "DNAT",
                "--to-destination",
                &ep.endpoint,
            ])
            .end();
        }
    }

    /// The tail rule(s), KUBE-FORWARD, and the base jumps when asked.
    fn finish(mut self, opts: RenderOptions, warnings: Vec<Warning>) -> Rendered {
        // The KUBE-SERVICES → KUBE-NODEPORTS tail rule(s).
        if self.match_all {
            let l = Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                .comment_q(&[NODEPORTS_TAIL_COMMENT])
                .ws(&["-m", "addrtype", "--dst-type", "LOCAL"]);
            let l = if self.is_v6 && self.version.has_localhost_nodeports_option() {
                l.ws(&["!", "-d", "::1/128"])
            } else if self.is_v6 {
                l
            } else if !self.localhost_node_ports {
                l.ws(&["!", "-d", "127.0.0.0/8"])
            } else {
                l
            };
            l.ws(&["-j", "KUBE-NODEPORTS"]).end();
        } else {
            for ip in &self.node_port_ips {
                if ip.is_loopback()
                    && (self.is_v6 || !self.localhost_node_ports)
                    && self.version.has_localhost_nodeports_option()
                {
                    continue;
                }
                let ip = ip.to_string();
                Line::start(&mut self.nat.rule_lines, "KUBE-SERVICES")
                    .comment_q(&[NODEPORTS_TAIL_COMMENT])
                    .ws(&["-d", &ip, "-j", "KUBE-NODEPORTS"])
                    .end();
            }
        }

        // KUBE-FORWARD.
        if !self.tcp_be_liberal {
            let l = Line::start(&mut self.filter.rule_lines, "KUBE-FORWARD").ws(&[
                "-m",
                "conntrack",
                "--ctstate",
                "INVALID",
            ]);
            let l = if self.nfacct_ct_state_invalid {
                l.ws(&[
                    "-m",
                    "nfacct",
                    "--nfacct-name",
                    crate::state::node::NFACCT_CT_STATE_INVALID,
                ])
            } else {
                l
            };
            l.ws(&["-j", "DROP"]).end();
        }
        Line::start(&mut self.filter.rule_lines, "KUBE-FORWARD")
            .comment_q(&["kubernetes forwarding rules"])
            .ws(&["-m", "mark", "--mark", &self.mark_match, "-j", "ACCEPT"])
            .end();
        let conntrack_comments: &[&str] = if self.version.one_forward_conntrack_rule() {
            &["kubernetes forwarding conntrack rule"]
        } else {
            &[
                "kubernetes forwarding conntrack pod source rule",
                "kubernetes forwarding conntrack pod destination rule",
            ]
        };
        for comment in conntrack_comments {
            Line::start(&mut self.filter.rule_lines, "KUBE-FORWARD")
                .comment_q(&[comment])
                .ws(&[
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "RELATED,ESTABLISHED",
                    "-j",
                    "ACCEPT",
                ])
                .end();
        }

        let mut tables = vec![self.filter, self.nat];
        if opts.with_base_jumps {
            add_base_jumps(&mut tables, self.kube_firewall, self.version);
        }
        Rendered {
            family: self.family,
            large_cluster_mode: self.large,
            tables,
            warnings,
        }
    }
}

fn probability(cache: &mut Vec<String>, n: usize) -> &str {
    while cache.len() <= n {
        let k = cache.len();
        cache.push(if k == 0 {
            String::new()
        } else {
            format!("{:.10}", 1.0 / k as f64)
        });
    }
    cache.get(n).map(String::as_str).unwrap_or("")
}

/// `/32` or `/128`: the host prefix releases before 1.23 wrote after addresses.
fn host_prefix(ip: &IpAddr) -> &'static str {
    if ip.is_ipv6() { "/128" } else { "/32" }
}

/// How a release comments the rules that jump from a service chain to its endpoint chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BalancingComments {
    /// `"<svc> -> <ip:port>"`, left out in large-cluster mode (1.24 and later).
    Arrow,
    /// `<svc>`, left out in large-cluster mode (before 1.24; 1.23's `KUBE-XLB-…`).
    Name,
    /// `<svc>` on affinity rules and `"Balancing rule N for <svc>"` on the others, always
    /// (`KUBE-XLB-…` before 1.23).
    Numbered,
}

fn write_service_to_endpoint_rules(
    out: &mut TextBuf,
    p: &ServicePortDecisions,
    chain: &str,
    eps: &[u32],
    large: bool,
    probabilities: &mut Vec<String>,
) {
    write_balancing_rules(
        out,
        p,
        chain,
        (eps, eps),
        (BalancingComments::Arrow, large),
        probabilities,
    );
}

/// The rules of `chain` that pick an endpoint: affinity rules for `sticky` (the endpoints the
/// affinity lists cover), then one probability rule per endpoint of `eps`.
fn write_balancing_rules(
    out: &mut TextBuf,
    p: &ServicePortDecisions,
    chain: &str,
    (sticky_eps, eps): (&[u32], &[u32]),
    (comments, large): (BalancingComments, bool),
    probabilities: &mut Vec<String>,
) {
    let spn = p.info.name_string.as_str();
    let commented = comments == BalancingComments::Numbered || !large;
    if let Some(sticky) = p.info.session_affinity_seconds {
        for &i in sticky_eps {
            let (Some(ep), Some(sep)) = (
                p.endpoints.get(i as usize),
                p.endpoint_chains.get(i as usize),
            ) else {
                continue;
            };
            let mut l = Line::start(out, chain);
            if commented {
                l = match comments {
                    BalancingComments::Arrow => l.comment_q(&[spn, " -> ", &ep.endpoint]),
                    BalancingComments::Name | BalancingComments::Numbered => l.comment(spn),
                };
            }
            l.ws(&["-m", "recent", "--name", sep, "--rcheck", "--seconds"])
                .num(sticky)
                .ws(&["--reap", "-j", sep])
                .end();
        }
    }
    let n = eps.len();
    for (k, &i) in eps.iter().enumerate() {
        let (Some(ep), Some(sep)) = (
            p.endpoints.get(i as usize),
            p.endpoint_chains.get(i as usize),
        ) else {
            continue;
        };
        let mut l = Line::start(out, chain);
        if commented {
            l = match comments {
                BalancingComments::Arrow => l.comment_q(&[spn, " -> ", &ep.endpoint]),
                BalancingComments::Name => l.comment(spn),
                BalancingComments::Numbered => {
                    let rule = k.to_string();
                    l.comment_q(&["Balancing rule ", &rule, " for ", spn])
                }
            };
        }
        if k + 1 < n {
            l = l.ws(&[
                "-m",
                "statistic",
                "--mode",
                "random",
                "--probability",
                probability(probabilities, n - k),
            ]);
        }
        l.ws(&["-j", sep]).end();
    }
}
