//! Refusals for IPVS-mode repair: inputs that look wrong enough that applying them would do more
//! harm than good. Each can be overridden with `--force`.

use super::plan::{Disposal, Ownership};
use super::state::IpvsState;
use crate::apply::guard::{InputConditions, unreadable_refusal};
use crate::model::Ruleset;

/// The facts the guard looks at.
#[derive(Debug, Clone)]
pub struct IpvsGuardInput {
    /// Virtual servers kube-proxy should have.
    pub expected_virtual_servers: usize,
    /// Real servers kube-proxy should have (summed over virtual servers).
    pub expected_real_servers: usize,
    /// The configured mode and the state's age.
    pub facts: InputConditions,
}

/// Reasons not to apply, one sentence each.
pub fn refusals(
    input: &IpvsGuardInput,
    current: &IpvsState,
    ownership: &Ownership,
    current_rules: &Ruleset<'_>,
) -> Vec<String> {
    let mut out = Vec::new();
    out.extend(
        input
            .facts
            .mode_refusal(crate::state::mode::ProxyMode::Ipvs, "IPVS-mode state"),
    );
    let owned: Vec<_> = current
        .of_family(ownership.family)
        .filter(|(k, _)| ownership.virtual_server(k) == Disposal::Remove)
        .collect();
    let owned_rs: usize = owned.iter().map(|(_, v)| v.real_servers.len()).sum();
    if input.expected_virtual_servers == 0 && owned.len() >= 3 {
        out.push(format!(
            "the API state implies no virtual servers for this node but the node has {} on kube-proxy's service addresses: is the state file complete?",
            owned.len()
        ));
    } else if input.expected_real_servers == 0 && owned_rs >= 3 {
        out.push(format!(
            "the API state has no endpoints but the node has {owned_rs} real servers: are EndpointSlices missing from the state?"
        ));
    }
    let iptables_mode = current_rules.table("nat").is_some_and(|t| {
        t.chains
            .iter()
            .any(|c| c.name.starts_with("KUBE-SVC-") || c.name.starts_with("KUBE-SEP-"))
    });
    if iptables_mode && current.of_family(ownership.family).next().is_none() {
        out.push("the node runs kube-proxy's iptables mode (KUBE-SVC/KUBE-SEP chains, no IPVS virtual servers)".into());
    }
    out.extend(unreadable_refusal(current_rules));
    out.extend(input.facts.age_refusal());
    out.extend(input.facts.writer_refusal());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::ipvs::state::{FwdMethod, Ipvs0, RsAttrs, RsState, VsAttrs, VsState};
    use crate::state::ip::IpFamily;
    use crate::state::mode::ProxyMode;
    use kproxy_parsers::iptables::ParseOptions;
    use kproxy_parsers::ipvsadm::Protocol;
    use std::net::IpAddr;

    fn node(n: usize) -> IpvsState {
        let ip = |s: String| -> IpAddr { s.parse().expect("address") };
        let vs = VsState {
            attrs: VsAttrs {
                scheduler: "rr".into(),
                persistent: None,
                netmask: None,
                flags: Vec::new(),
                ops: false,
                pe: None,
            },
            real_servers: [(
                (ip("10.244.0.1".into()), 80),
                RsState {
                    attrs: RsAttrs {
                        forward: FwdMethod::Masq,
                        weight: 1,
                        upper_threshold: 0,
                        lower_threshold: 0,
                    },
                    connections: None,
                },
            )]
            .into(),
        };
        IpvsState {
            virtual_servers: (0..n)
                .map(|i| ((Protocol::Tcp, ip(format!("10.96.0.{i}")), 80), vs.clone()))
                .collect(),
            sets: None,
            kube_ipvs0: Ipvs0::Present((0..n).map(|i| ip(format!("10.96.0.{i}"))).collect()),
        }
    }

    fn ownership(s: &IpvsState) -> Ownership {
        let Ipvs0::Present(a) = &s.kube_ipvs0 else {
            unreachable!("test node has kube-ipvs0")
        };
        Ownership {
            family: IpFamily::V4,
            exclude_cidrs: Vec::new(),
            service_addrs: a.clone(),
            node_addrs: Default::default(),
        }
    }

    fn input(mode: Option<ProxyMode>, vss: usize, rss: usize) -> IpvsGuardInput {
        IpvsGuardInput {
            expected_virtual_servers: vss,
            expected_real_servers: rss,
            facts: InputConditions {
                configured_mode: mode,
                state_age: None,
                max_age: None,
                kube_proxy_pid: None,
            },
        }
    }

    #[test]
    fn sane_inputs_pass_wrong_ones_are_refused() {
        let empty = Ruleset::parse("*nat\nCOMMIT\n", &ParseOptions::default()).expect("rules");
        let n = node(4);
        let o = ownership(&n);
        assert!(refusals(&input(Some(ProxyMode::Ipvs), 4, 4), &n, &o, &empty).is_empty());
        let r = refusals(&input(None, 4, 4), &n, &o, &empty);
        assert!(r.len() == 1 && r[0].contains("\"iptables\""), "{r:?}");
        let r = refusals(&input(Some(ProxyMode::Ipvs), 0, 0), &n, &o, &empty);
        assert!(r.len() == 1 && r[0].contains("no virtual servers"), "{r:?}");
        let r = refusals(&input(Some(ProxyMode::Ipvs), 4, 0), &n, &o, &empty);
        assert!(r.len() == 1 && r[0].contains("no endpoints"), "{r:?}");
        let ipt = Ruleset::parse(
            "*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\nCOMMIT\n",
            &ParseOptions::default(),
        )
        .expect("rules");
        let none = node(0);
        let r = refusals(
            &input(Some(ProxyMode::Ipvs), 4, 4),
            &none,
            &ownership(&none),
            &ipt,
        );
        assert!(r.len() == 1 && r[0].contains("iptables mode"), "{r:?}");
    }
}
