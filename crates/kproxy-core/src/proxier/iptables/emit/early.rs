//! The per-service rules of kube-proxy releases before 1.24 (`proxier.go` `syncProxyRules` of
//! 1.20 … 1.23): one `KUBE-SVC-…` chain for every destination, a `KUBE-XLB-…` chain for the
//! external destinations of an `externalTrafficPolicy: Local` service, a `KUBE-FW-…` chain for
//! every load-balancer IP, and drops through kubelet's `KUBE-MARK-DROP`. 1.24 rewrote this
//! part (`KUBE-EXT-…`/`KUBE-SVL-…`); what changed between 1.20 and 1.23 is asked of the
//! [`KubeProxyVersion`](crate::state::version::KubeProxyVersion) switches here.

use super::{
    BalancingComments, Emitter, Line, ServicePortDecisions, host_prefix, write_balancing_rules,
};
use crate::proxier::quoting::{iptables_quoted, iptables_word};
use std::net::IpAddr;

/// The `-d`/`-s` text of an address: bare from 1.23, a host CIDR before.
fn address(ip: &IpAddr, bare: bool) -> String {
    if bare {
        ip.to_string()
    } else {
        format!("{ip}{}", host_prefix(ip))
    }
}

impl Emitter {
    /// The rules of one service port, as a release before 1.24 writes them.
    pub(super) fn early_port(&mut self, p: &ServicePortDecisions) {
        let v = self.version;
        let info = &p.info;
        let spn = info.name_string.as_str();
        let proto = info.name.protocol.lower();
        let bare = v.bare_addresses();
        let cip = address(&info.cluster_ip, bare);
        let port = info.port.to_string();
        let has_endpoints = p.categorized.has_any;
        let local = info.external_policy_local;
        let svc = p.chains.svc.as_str();
        let xlb = p.xlb_chain();
        let dest = if local { xlb.as_str() } else { svc };
        // Masquerade rules: in KUBE-SERVICES / KUBE-NODEPORTS, from 1.22 in the service chain.
        let in_service_chain = v.masquerades_in_service_chain();
        let detector = self.detector.clone();
        let if_local = detector.is_implemented().then(|| detector.if_local());

        if has_endpoints {
            self.nat.chain(svc);
        }
        if local {
            self.nat.chain(&xlb);
        }

        // Cluster IP.
        let service_args = |comment: &str, ip: &str| -> Vec<String> {
            vec![
                "-m".into(),
                "comment".into(),
                "--comment".into(),
                iptables_quoted(&[spn, " ", comment]),
                "-m".into(),
                proto.into(),
                "-p".into(),
                proto.into(),
                "-d".into(),
                ip.into(),
                "--dport".into(),
                port.clone(),
            ]
        };
        if has_endpoints {
            let args = service_args("cluster IP", &cip);
            let masq_chain = if in_service_chain {
                svc
            } else {
                "KUBE-SERVICES"
            };
            if p.cluster_ip_masquerade == "all" {
                self.nat_rule(masq_chain, &args, &["-j", "KUBE-MARK-MASQ"]);
            } else if let Some([flag, value]) = if_local {
                self.nat_rule(
                    masq_chain,
                    &args,
                    &["!", flag, value, "-j", "KUBE-MARK-MASQ"],
                );
            }
            self.nat_rule("KUBE-SERVICES", &args, &["-j", svc]);
        } else {
            self.no_endpoints("KUBE-SERVICES", spn, proto, Some(&cip), &port, false);
        }

        // External IPs.
        for ip in &info.external_ips {
            let ip = address(ip, bare);
            if !has_endpoints {
                self.no_endpoints(
                    "KUBE-EXTERNAL-SERVICES",
                    spn,
                    proto,
                    Some(&ip),
                    &port,
                    false,
                );
                continue;
            }
            let args = service_args("external IP", &ip);
            if !v.one_external_ip_jump() {
                // 1.20: masquerade unconditionally, then accept traffic from off the node or to
                // a local address.
                if !local {
                    self.nat_rule("KUBE-SERVICES", &args, &["-j", "KUBE-MARK-MASQ"]);
                }
                self.nat_rule(
                    "KUBE-SERVICES",
                    &args,
                    &[
                        "-m",
                        "physdev",
                        "!",
                        "--physdev-is-in",
                        "-m",
                        "addrtype",
                        "!",
                        "--src-type",
                        "LOCAL",
                        "-j",
                        dest,
                    ],
                );
                self.nat_rule(
                    "KUBE-SERVICES",
                    &args,
                    &["-m", "addrtype", "--dst-type", "LOCAL", "-j", dest],
                );
                continue;
            }
            if !local {
                let masq_chain = if in_service_chain {
                    svc
                } else {
                    "KUBE-SERVICES"
                };
                match if_local {
                    Some([flag, value]) => self.nat_rule(
                        masq_chain,
                        &args,
                        &["!", flag, value, "-j", "KUBE-MARK-MASQ"],
                    ),
                    None => self.nat_rule(masq_chain, &args, &["-j", "KUBE-MARK-MASQ"]),
                }
            }
            self.nat_rule("KUBE-SERVICES", &args, &["-j", dest]);
        }

        // Load-balancer IPs: each through the firewall chain, whose rules are written once per
        // IP.
        let fw = p.chains.fw.as_str();
        if has_endpoints && !info.load_balancer_vips.is_empty() {
            self.nat.chain(fw);
        }
        for lb in &info.load_balancer_vips {
            let lb = address(lb, bare);
            if !has_endpoints {
                self.no_endpoints(
                    "KUBE-EXTERNAL-SERVICES",
                    spn,
                    proto,
                    Some(&lb),
                    &port,
                    false,
                );
                continue;
            }
            self.nat_rule(
                "KUBE-SERVICES",
                &service_args("loadbalancer IP", &lb),
                &["-j", fw],
            );
            let fw_comment = ["-m", "comment", "--comment"].map(String::from);
            let fw_args = [
                &fw_comment[..],
                &[iptables_quoted(&[spn, " loadbalancer IP"])],
            ]
            .concat();
            if !local {
                self.nat_rule(fw, &fw_args, &["-j", "KUBE-MARK-MASQ"]);
            }
            if info.load_balancer_source_ranges.is_empty() {
                self.nat_rule(fw, &fw_args, &["-j", dest]);
            } else {
                for range in &info.load_balancer_source_ranges {
                    self.nat_rule(fw, &fw_args, &["-s", &range.to_string(), "-j", dest]);
                }
                if p.allow_from_node {
                    self.nat_rule(fw, &fw_args, &["-s", &lb, "-j", dest]);
                }
            }
            self.nat_rule(fw, &fw_args, &["-j", "KUBE-MARK-DROP"]);
        }

        // Node port.
        if info.node_port != 0 {
            let node_port = info.node_port.to_string();
            if has_endpoints {
                let spn_word = iptables_word(spn);
                let args: Vec<String> = [
                    "-m",
                    "comment",
                    "--comment",
                    &spn_word,
                    "-m",
                    proto,
                    "-p",
                    proto,
                    "--dport",
                ]
                .iter()
                .map(|w| w.to_string())
                .chain([node_port.clone()])
                .collect();
                if !local {
                    let masq_chain = if in_service_chain {
                        svc
                    } else {
                        "KUBE-NODEPORTS"
                    };
                    self.nat_rule(masq_chain, &args, &["-j", "KUBE-MARK-MASQ"]);
                    self.nat_rule("KUBE-NODEPORTS", &args, &["-j", svc]);
                } else {
                    // Localhost NodePort traffic would leave with a martian source.
                    let loopback = if self.is_v6 { "::1/128" } else { "127.0.0.0/8" };
                    self.nat_rule(
                        "KUBE-NODEPORTS",
                        &args,
                        &["-s", loopback, "-j", "KUBE-MARK-MASQ"],
                    );
                    self.nat_rule("KUBE-NODEPORTS", &args, &["-j", &xlb]);
                }
            } else {
                self.no_endpoints("KUBE-EXTERNAL-SERVICES", spn, proto, None, &node_port, true);
            }
        }

        // Health check node port.
        if v.opens_health_check_ports() && info.health_check_node_port != 0 {
            Line::start(&mut self.filter.rule_lines, "KUBE-NODEPORTS")
                .comment_q(&[spn, " health check node port"])
                .ws(&["-m", "tcp", "-p", "tcp", "--dport"])
                .num(info.health_check_node_port)
                .ws(&["-j", "ACCEPT"])
                .end();
        }

        if !has_endpoints {
            return;
        }

        // The service chain picks among the ready endpoints; 1.22's affinity rules cover every
        // endpoint it made a chain for.
        let sticky: &[u32] = if v.chains_every_endpoint() {
            &p.categorized.reachable
        } else {
            &p.categorized.cluster
        };
        write_balancing_rules(
            &mut self.nat.rule_lines,
            p,
            svc,
            (sticky, &p.categorized.cluster),
            (BalancingComments::Name, self.large),
            &mut self.probabilities,
        );
        self.endpoint_chains(p);

        if !local {
            return;
        }
        // The Local policy chain: pods and the node itself go through the service chain.
        if let Some([flag, value]) = if_local {
            Line::start(&mut self.nat.rule_lines, &xlb)
                .comment_q(&[
                    "Redirect pods trying to reach external loadbalancer VIP to clusterIP",
                ])
                .ws(&[flag, value, "-j", svc])
                .end();
        }
        Line::start(&mut self.nat.rule_lines, &xlb)
            .comment_q(&["masquerade LOCAL traffic for ", spn, " LB IP"])
            .ws(&[
                "-m",
                "addrtype",
                "--src-type",
                "LOCAL",
                "-j",
                "KUBE-MARK-MASQ",
            ])
            .end();
        Line::start(&mut self.nat.rule_lines, &xlb)
            .comment_q(&["route LOCAL traffic for ", spn, " LB IP to service chain"])
            .ws(&["-m", "addrtype", "--src-type", "LOCAL", "-j", svc])
            .end();
        if p.categorized.local.is_empty() {
            Line::start(&mut self.nat.rule_lines, &xlb)
                .comment_q(&[spn, " has no local endpoints"])
                .ws(&["-j", "KUBE-MARK-DROP"])
                .end();
        } else {
            let comments = if v.names_local_balancing_rules() {
                BalancingComments::Name
            } else {
                BalancingComments::Numbered
            };
            write_balancing_rules(
                &mut self.nat.rule_lines,
                p,
                &xlb,
                (&p.categorized.local, &p.categorized.local),
                (comments, self.large),
                &mut self.probabilities,
            );
        }
    }

    /// `-A <chain> <args…> <tail…>` in the nat table.
    fn nat_rule(&mut self, chain: &str, args: &[String], tail: &[&str]) {
        let mut l = Line::start(&mut self.nat.rule_lines, chain);
        for a in args {
            l = l.w(a);
        }
        l.ws(tail).end();
    }

    /// The filter REJECT of a destination of a service without endpoints: `ip` and `port`, or
    /// the node port on local addresses.
    fn no_endpoints(
        &mut self,
        chain: &str,
        spn: &str,
        proto: &str,
        ip: Option<&str>,
        port: &str,
        node_port: bool,
    ) {
        let mut l =
            Line::start(&mut self.filter.rule_lines, chain).comment_q(&[spn, " has no endpoints"]);
        if node_port {
            l = l.ws(&["-m", "addrtype", "--dst-type", "LOCAL"]);
        }
        l = l.ws(&["-m", proto, "-p", proto]);
        if let Some(ip) = ip {
            l = l.ws(&["-d", ip]);
        }
        l.ws(&["--dport", port, "-j", "REJECT"]).end();
    }
}
