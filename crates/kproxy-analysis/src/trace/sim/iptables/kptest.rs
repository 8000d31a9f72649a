//! `--model kube-proxy-test`: the walk of kube-proxy's unit-test packet tracer.
//!
//! Reproduces `tracePacket`/`runChain` of `pkg/proxy/iptables/proxier_test.go` on top of the
//! shared [`matches()`](crate::trace::sim::engine::matches) engine with
//! [`MatchPolicy::KubeProxyTest`]: nat PREROUTING, then the destination becomes the first
//! output cut at its first `:` (the port is never rewritten), then the filter chains
//! KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-NODEPORTS and KUBE-PROXY-FIREWALL from the
//! top. Every `statistic --probability` branch is explored; the result lists every terminal
//! output in rule order and whether any matched rule jumped to KUBE-MARK-MASQ.

use super::super::SimError;
use super::super::engine::{
    LocalAddrs, MatchCtx, MatchPolicy, PacketView, RuleMatch, has_destination_match,
    has_probability, matches,
};
use super::super::outcome::TestTrace;
use super::super::packet::PacketSpec;
use super::super::walk::{MAX_DEPTH, MAX_STEPS};
use crate::model::Ruleset;
use kproxy_parsers::iptables::{Rule, Target};
use std::net::{IpAddr, Ipv6Addr};

/// The filter chains the test tracer runs after nat PREROUTING, in order.
pub const FILTER_CHAINS: [&str; 4] = [
    "KUBE-SERVICES",
    "KUBE-EXTERNAL-SERVICES",
    "KUBE-NODEPORTS",
    "KUBE-PROXY-FIREWALL",
];

/// The destination as the tracer tracks it: an address, or the unparsable text an IPv6 DNAT
/// output leaves behind (`"[fd00"`).
#[derive(Debug, Clone, Copy)]
enum Dest<'a> {
    Ip(IpAddr),
    Garbled(&'a str),
}

struct Walk<'r, 'a> {
    rules: &'r Ruleset<'a>,
    local: &'r LocalAddrs,
    packet: PacketSpec,
    dst: Dest<'a>,
    outputs: Vec<&'a str>,
    masq: bool,
    matched: Vec<String>,
    /// Rules evaluated so far.
    steps: usize,
}

/// The name the test's rule parser records for `-j`: `None` for rules it sees no `-j` in
/// (no target, or `-g`, which it does not parse).
fn jump_name<'a>(target: &Option<Target<'a>>) -> Option<&'a str> {
    Some(match target.as_ref()? {
        Target::Jump(c) => c,
        Target::Goto(_) => return None,
        Target::Accept => "ACCEPT",
        Target::Drop => "DROP",
        Target::Return => "RETURN",
        Target::Dnat { .. } => "DNAT",
        Target::Snat { .. } => "SNAT",
        Target::Masquerade { .. } => "MASQUERADE",
        Target::Mark(_) => "MARK",
        Target::Connmark(_) => "CONNMARK",
        Target::Reject { .. } => "REJECT",
        Target::Log(_) => "LOG",
        Target::Trace => "TRACE",
        Target::Notrack => "NOTRACK",
        Target::Ct(_) => "CT",
        Target::Generic { name, .. } => name,
        Target::Unreadable { raw, .. } => raw.split_whitespace().next().unwrap_or(""),
    })
}

impl<'a> Walk<'_, 'a> {
    fn view(&self) -> PacketView<'static> {
        let dst = match self.dst {
            Dest::Ip(ip) => ip,
            // Never equal to a local address and never inside a CIDR: rules with `-d` abort first.
            Dest::Garbled(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        };
        PacketView {
            src: self.packet.src,
            sport: self.packet.sport,
            dst,
            dport: self.packet.dport,
            proto: self.packet.proto,
            in_iface: None,
            out_iface: None,
            mark: 0,
            ct: Default::default(),
            recent: &[],
        }
    }

    /// `runChain`: true if a terminal target ended the chain.
    fn run(&mut self, table: &str, chain: &str, depth: usize) -> Result<bool, SimError> {
        if depth > MAX_DEPTH {
            return Err(SimError::TooDeep {
                chain: format!("{table}/{chain}"),
                depth: MAX_DEPTH,
            });
        }
        let Some(ch) = self.rules.chain(table, chain) else {
            return Ok(false);
        };
        let ctx = MatchCtx {
            policy: MatchPolicy::KubeProxyTest,
            local: self.local,
        };
        for (i, rule) in ch.rules.iter().map(|e| &e.rule).enumerate() {
            self.steps += 1;
            if self.steps > MAX_STEPS {
                return Err(SimError::TooManySteps { limit: MAX_STEPS });
            }
            let Some(jump) = jump_name(&rule.target()) else {
                continue;
            };
            if let Dest::Garbled(text) = self.dst
                && has_destination_match(rule)
            {
                return Err(SimError::TracerAbort {
                    rule: format!("{table}/{chain}#{}", i + 1),
                    dst: text.to_string(),
                });
            }
            if !matches!(matches(rule, &self.view(), &ctx), RuleMatch::Matches) {
                continue;
            }
            self.matched.push(format!("{table}/{chain}#{}", i + 1));
            match jump {
                "KUBE-MARK-MASQ" => self.masq = true,
                "ACCEPT" | "REJECT" | "DROP" => {
                    self.outputs.push(jump);
                    return Ok(true);
                }
                "DNAT" => {
                    self.outputs.push(dnat_text(rule));
                    return Ok(true);
                }
                next => {
                    if self.run(table, next, depth + 1)? && !has_probability(rule) {
                        return Ok(true);
                    }
                }
            }
        }
        Ok(false)
    }
}

/// The `--to-destination` word as the test's parser records it.
fn dnat_text<'a>(rule: &Rule<'a>) -> &'a str {
    match &rule.target() {
        Some(Target::Dnat { to, .. }) => to.raw,
        _ => "",
    }
}

/// Traces one packet as kube-proxy's unit tests do. `local` is the tracer's local address list
/// (the tests pass `127.0.0.1`, `::1` and the node IPs; membership is exact).
pub fn trace(
    rules: &Ruleset<'_>,
    packet: &PacketSpec,
    local: &LocalAddrs,
) -> Result<TestTrace, SimError> {
    let mut walk = Walk {
        rules,
        local,
        packet: *packet,
        dst: Dest::Ip(packet.dst),
        outputs: Vec::new(),
        masq: false,
        matched: Vec::new(),
        steps: 0,
    };
    walk.run("nat", "PREROUTING", 0)?;
    if let Some(&first) = walk.outputs.first() {
        let host = first.split(':').next().unwrap_or("");
        walk.dst = match host.parse::<IpAddr>() {
            Ok(ip) => Dest::Ip(ip),
            Err(_) => Dest::Garbled(host),
        };
    }
    for chain in FILTER_CHAINS {
        walk.run("filter", chain, 0)?;
    }
    Ok(TestTrace {
        output: walk.outputs.join(", "),
        masq: walk.masq,
        matched: walk.matched,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::iptables::ParseOptions;

    #[test]
    fn history_matches_never_hold_and_goto_is_invisible() {
        let rules = "*nat
:PREROUTING ACCEPT [0:0]
:S - [0:0]
:E - [0:0]
-A PREROUTING -m mark ! --mark 0x4000/0x4000 -j DNAT --to-destination 1.1.1.1:1
-A PREROUTING -m conntrack ! --ctstate NEW -j DNAT --to-destination 1.1.1.2:1
-A PREROUTING -m recent ! --rcheck --name X -j DNAT --to-destination 1.1.1.3:1
-A PREROUTING -g E
-A PREROUTING -i eth9 -p tcp -m tcp --dport 80 -j S
-A S -m statistic --mode random --probability 0.5 -j KUBE-MARK-MASQ
-A S -m statistic --mode random --probability 0.5 -j E
-A S -j DNAT --to-destination 10.0.0.2:80
-A E -j DNAT --to-destination 10.0.0.1:80
COMMIT
";
        let rs = Ruleset::parse(rules, &ParseOptions::strict()).unwrap();
        let local = LocalAddrs::exact(vec![]);
        let t = trace(&rs, &"1.2.3.4->5.6.7.8:80/tcp".parse().unwrap(), &local).unwrap();
        assert_eq!(t.output, "10.0.0.1:80, 10.0.0.2:80");
        assert!(t.masq);
    }
}
