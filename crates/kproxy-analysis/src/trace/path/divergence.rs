//! Setting the path view against the plan (kube-proxy's decisions for the API state): missing
//! service ports and entry points, stale and missing endpoints, wrong shares.

use super::{AffinityView, DecidedEndpoint};
use super::{Branch, Divergence, DivergenceKind, EndpointPath, EntryPath, PodRef, PortPath};
use crate::graph::{ChainKind, EntryKind, nftables::port_chain_kind, percent};
use crate::model::hashing::EndpointChain;
use crate::proxier::iptables::ServicePortDecisions;

/// Shares closer than this are considered equal (dumps print probabilities with rounding).
const SHARE_TOLERANCE: f64 = 0.005;

pub(super) fn count_divergences(p: &PortPath) -> usize {
    p.divergences.len()
        + p.entries
            .iter()
            .flat_map(|e| &e.branches)
            .flat_map(|b| &b.endpoints)
            .filter(|e| e.divergence.is_some())
            .count()
}

pub(super) fn missing_port(decisions: &ServicePortDecisions) -> PortPath {
    PortPath {
        name: decisions.info.name_string.clone(),
        port_name: decisions.info.name.port.clone(),
        port: u16::try_from(decisions.info.port).ok(),
        protocol: Some(decisions.info.name.protocol.lower().to_string()),
        hash: None,
        in_dump: false,
        affinity: decisions.info.session_affinity_seconds.map(|s| AffinityView {
            timeout_seconds: None,
            expected_timeout_seconds: Some(s),
        }),
        entries: Vec::new(),
        divergences: vec![Divergence {
            kind: DivergenceKind::MissingServicePort,
            message: "the API has this service port but the node has no rules for it (kube-proxy not synced, or rules flushed)".into(),
        }],
    }
}

pub(super) fn missing_entries(
    decisions: &ServicePortDecisions,
    entries: &[EntryPath],
) -> Vec<Divergence> {
    let info = &decisions.info;
    let port = u16::try_from(info.port).ok();
    let mut want: Vec<(EntryKind, Option<String>, Option<u16>)> = vec![(
        EntryKind::ClusterIp,
        Some(info.cluster_ip.to_string()),
        port,
    )];
    if info.node_port != 0 {
        want.push((
            EntryKind::NodePort,
            None,
            u16::try_from(info.node_port).ok(),
        ));
    }
    for ip in &info.external_ips {
        want.push((EntryKind::ExternalIp, Some(ip.to_string()), port));
    }
    for ip in &info.load_balancer_vips {
        want.push((EntryKind::LoadBalancerIp, Some(ip.to_string()), port));
    }
    want.into_iter()
        .filter(|(kind, addr, p)| {
            !entries
                .iter()
                .any(|e| e.kind == *kind && e.port == *p && (addr.is_none() || e.address == *addr))
        })
        .map(|(kind, addr, p)| Divergence {
            kind: DivergenceKind::MissingEntry,
            message: format!(
                "the API implies a {} entry {}:{} the node has no rule for",
                kind.label(),
                addr.unwrap_or_default(),
                p.map(|p| p.to_string()).unwrap_or_default()
            ),
        })
        .collect()
}

/// The endpoints the API says `policy_chain` must pick.
fn expected_set<'p>(
    decisions: &'p ServicePortDecisions,
    policy_chain: &str,
) -> Vec<(&'p DecidedEndpoint, &'p str)> {
    let local = matches!(
        port_chain_kind(policy_chain),
        Some(ChainKind::Svl | ChainKind::Xlb)
    );
    let idx = if local {
        &decisions.categorized.local
    } else {
        &decisions.categorized.cluster
    };
    idx.iter()
        .filter_map(|&i| {
            let e = decisions.endpoints.get(i as usize)?;
            let c = decisions
                .endpoint_chains
                .get(i as usize)
                .map_or("", EndpointChain::as_str);
            Some((e, c))
        })
        .collect()
}

fn find_decided_endpoint<'p>(
    decisions: &'p ServicePortDecisions,
    ep: &EndpointPath,
) -> Option<&'p DecidedEndpoint> {
    decisions
        .endpoints
        .iter()
        .zip(
            decisions
                .endpoint_chains
                .iter()
                .map(Some)
                .chain(std::iter::repeat(None)),
        )
        .find(|(e, c)| {
            ep.destination.as_deref() == Some(e.endpoint.as_str())
                || c.is_some_and(|c| c.as_str() == ep.chain)
        })
        .map(|(e, _)| e)
}

pub(super) fn compare_branch(b: &mut Branch, decisions: &ServicePortDecisions) {
    let Some(policy) = b.policy_chain.clone() else {
        return;
    };
    let expected = expected_set(decisions, &policy);
    let n = expected.len();
    let even = (n > 0).then(|| 1.0 / n as f64);
    for ep in &mut b.endpoints {
        let plan_ep = find_decided_endpoint(decisions, ep);
        ep.pod = plan_ep.map(PodRef::from_decision);
        let in_set =
            plan_ep.is_some_and(|pe| expected.iter().any(|(e, _)| e.endpoint == pe.endpoint));
        if in_set {
            ep.expected_share = even;
            if let Some(want) = even
                && (ep.share - want).abs() > SHARE_TOLERANCE
            {
                ep.divergence = Some(Divergence {
                    kind: DivergenceKind::WrongShare,
                    message: format!(
                        "gets {} of new connections; the API implies {} ({n} endpoints)",
                        percent(ep.share),
                        percent(want)
                    ),
                });
            }
        } else {
            ep.expected_share = Some(0.0);
            let why = match plan_ep {
                None => "not in any EndpointSlice of the service".to_string(),
                Some(pe) if !(pe.ready || pe.serving && pe.terminating) => format!(
                    "the endpoint is {} in the API",
                    PodRef::from_decision(pe).state()
                ),
                Some(pe) if !pe.is_local && local_chain(&policy) => {
                    "the endpoint is not on this node, but this chain serves node-local endpoints only".into()
                }
                Some(_) => "kube-proxy would not pick it for this chain (topology or fallback rules)".into(),
            };
            ep.divergence = Some(Divergence {
                kind: DivergenceKind::StaleEndpoint,
                message: format!("stale: {why}"),
            });
        }
    }
    for (pe, chain) in expected {
        let present = b
            .endpoints
            .iter()
            .any(|ep| ep.destination.as_deref() == Some(pe.endpoint.as_str()) || ep.chain == chain);
        if !present {
            b.endpoints.push(EndpointPath {
                chain: chain.to_string(),
                destination: Some(pe.endpoint.clone()),
                share: 0.0,
                probability: None,
                expected_share: even,
                line: None,
                counters: None,
                hairpin_masquerade: false,
                pod: Some(PodRef::from_decision(pe)),
                live_flows: None,
                divergence: Some(Divergence {
                    kind: DivergenceKind::MissingEndpoint,
                    message: format!(
                        "missing: the API has this {} endpoint but {policy} does not route to it",
                        PodRef::from_decision(pe).state()
                    ),
                }),
            });
        }
    }
}

fn local_chain(chain: &str) -> bool {
    matches!(
        port_chain_kind(chain),
        Some(ChainKind::Svl | ChainKind::Xlb)
    )
}
