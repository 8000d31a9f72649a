//! `verify` of an IPVS-mode node: kube-proxy's IPVS state rendered per family
//! ([`crate::proxier::ipvs`]) against the node's `ipvsadm`, `ipset`, `kube-ipvs0` and iptables
//! dumps ([`crate::compare::ipvs`]).

use super::Note;
use super::mode::rules_show;
use super::verify::{NodeDumps, VerifyError};
use crate::collect::DumpKind;
use crate::compare::conntrack::{ServiceIndex, check_ipvs};
use crate::compare::ipvs::{ActualIpvs, mode_finding, verify};
use crate::compare::{Finding, Report};
use crate::proxier::ipvs::{DUMMY_DEVICE, ExpectedIpvs, IpvsNode, IpvsOptions, render};
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::ip::IpFamily;
use crate::state::mode::ProxyMode;
use crate::state::node::{NodeFacts, NodeInputs};
use kproxy_parsers::ipvsadm::{IpvsDump, ServiceKey};
use kproxy_parsers::{ip_addr, ipset, ipvsadm};

/// The families the check covers: the node's, and any other the `ipvsadm` dump shows.
fn families(dump: &IpvsDump<'_>, main: IpFamily) -> Vec<IpFamily> {
    let mut v = vec![main];
    for s in dump.merged_services() {
        if let ServiceKey::Inet { addr, .. } = s.key {
            let f = IpFamily::of(&addr);
            if !v.contains(&f) {
                v.push(f);
            }
        }
    }
    v
}

/// Renders kube-proxy's expected IPVS state per family and compares it with the node's dumps;
/// adds KP523 when the configured mode and the dumps disagree, and checks the connections of
/// an `ipvsadm -Lnc` listing against the services' serving endpoints (KP6xx). `given` holds the
/// masquerade mark given instead of the configuration's.
pub(super) fn check(
    dumps: &NodeDumps,
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    given: &NodeInputs,
    notes: &mut Vec<Note>,
) -> Result<Report, VerifyError> {
    let s = &dumps.snapshot;
    let ipvsadm_name = dumps.name(DumpKind::Ipvsadm, "ipvsadm");
    let dump = ipvsadm::parse_dump(s.ipvsadm.as_deref().unwrap_or_default())
        .map_err(|e| VerifyError::Ipvs(Box::new(e.in_source(ipvsadm_name.clone()))))?;
    notes.extend(dump.skipped.iter().map(|skipped| {
        Note::Warning(format!(
            "{ipvsadm_name}:{}: skipped: {}",
            skipped.line,
            skipped.text.trim_end()
        ))
    }));
    let sets = match s.ipset_save.as_deref() {
        Some(text) => {
            let name = dumps.name(DumpKind::IpsetSave, "ipset save");
            let sets = ipset::parse_ipset(text)
                .map_err(|e| VerifyError::Ipvs(Box::new(e.in_source(name.clone()))))?;
            if let Some(why) = sets.iter().find_map(ipset::IpSet::cut) {
                return Err(VerifyError::CutIpset(format!("{name}: {why}")));
            }
            Some(sets)
        }
        None => None,
    };
    let (v4, v6) = (s.iptables_save.as_deref(), s.ip6tables_save.as_deref());
    let kube_ipvs0 = dumps
        .ip_addr
        .as_deref()
        .map(|t| ip_addr::interface_addresses(t, DUMMY_DEVICE));
    let node = IpvsNode::from_facts(facts);
    let opts = IpvsOptions {
        random_fully: facts.random_fully,
        mark: given.masquerade_mark.clone(),
    };
    // The Services whose object was left out as invalid: not rendered, their objects on the
    // node not judged.
    let left_out = crate::compare::left_out::services(state);
    let judged = crate::compare::left_out::judged_state(state, &left_out);
    let mut not_checked = Vec::new();
    let cut: Vec<Option<String>> = [v4, v6]
        .into_iter()
        .map(|text| {
            let text = text.filter(|_| !left_out.is_empty())?;
            let (kept, counts) = crate::compare::iptables::scope::without_left_out(text, &left_out);
            for n in counts {
                crate::compare::left_out::tally(&mut not_checked, n);
            }
            Some(kept)
        })
        .collect();
    let (v4, v6) = (
        cut[0].as_deref().or(v4),
        cut.get(1).and_then(|c| c.as_deref()).or(v6),
    );
    let mut findings: Vec<Finding> = Vec::new();
    let mut ports = std::collections::BTreeSet::new();
    let mut warnings = Vec::new();
    let all_families = families(&dump, facts.family);
    let first = all_families.first().copied();
    for family in all_families {
        let first = first.unwrap_or(family);
        let expected: ExpectedIpvs = render(&judged, config, &node, family, &opts);
        // Said once: both families' renders warn of the same objects.
        for w in &expected.warnings {
            if !warnings.contains(w) {
                warnings.push(w.clone());
            }
        }
        ports.extend(expected.virtual_servers.iter().map(|v| v.service.clone()));
        let actual = ActualIpvs {
            dump: dump.clone(),
            ipsets: sets.clone(),
            iptables_save: if family == IpFamily::V6 { v6 } else { v4 },
            kube_ipvs0: kube_ipvs0.clone(),
        };
        let actual = if left_out.is_empty() {
            actual
        } else {
            let (kept, counts) = crate::compare::ipvs::without_left_out(&actual, &left_out);
            // Both families' passes see the same virtual servers and addresses: counted once.
            if family == first {
                for n in counts {
                    crate::compare::left_out::tally(&mut not_checked, n);
                }
            }
            kept
        };
        findings.extend(verify(&expected, &actual));
    }
    notes.extend(warnings.iter().map(|w| Note::Warning(w.to_string())));
    findings.extend(crate::compare::left_out::findings(
        &state.invalid,
        &not_checked,
    ));
    if let Some(shown) = rules_show(Some(&dump), v4.or(v6)) {
        findings.extend(mode_finding(ProxyMode::or_default(config.mode), shown));
    }
    if !dump.connections.is_empty() {
        let index = ServiceIndex::new(state, config, facts);
        let services = (!dump.listings.is_empty()).then(|| dump.merged_services());
        findings.extend(check_ipvs(&dump.connections, services.as_deref(), &index).findings());
    }
    Ok(Report::new(
        facts.node_name.clone(),
        ProxyMode::Ipvs,
        ports.len(),
        findings,
    ))
}
