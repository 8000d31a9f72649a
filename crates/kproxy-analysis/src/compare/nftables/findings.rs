//! Findings from a [`TableDiff`]: each difference named with the service port it concerns
//! (read from the chain name, or from the element key through the [`PortIndex`]) and the
//! check it fails. A chain's differences are explained once: a flushed endpoint chain is one
//! "does not DNAT" finding, not one per missing rule.

use super::diff::{ChainDiff, SetDiff, TableDiff, target};
use super::expected::{AddressKind, PortIndex, service_of_name};
use super::*;
use crate::compare::catalogue::Check;
use crate::graph::nftables::UnknownLayout;
use crate::graph::{UnknownObject, unknown_layout_message};
use crate::proxier::nftables::names::{self as n, MARK_MASQ_CHAIN};
use kproxy_parsers::nft::{BaseChain, Chain, Element, Expr, NatKind, Policy, Rule, Set, Stmt};
use std::collections::HashSet;

/// How many examples an aggregated finding quotes.
const EXAMPLES: usize = 5;

/// What a chain is, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ChainKind {
    /// A base chain of kube-proxy's table.
    Base,
    /// `masquerading` / `mark-for-masquerade`.
    Masquerade,
    /// Another fixed chain (`services`, `cluster-ips-check`, …).
    Fixed,
    /// `service-…` / `local-…`: load balancing over endpoints.
    Policy,
    /// `external-…`.
    External,
    /// `firewall-…`.
    Firewall,
    /// `endpoint-…`.
    Endpoint,
    /// A name kube-proxy does not use.
    Foreign,
}

fn chain_kind(name: &str, base: bool) -> ChainKind {
    if base {
        return ChainKind::Base;
    }
    if name == n::MASQUERADING_CHAIN || name == MARK_MASQ_CHAIN {
        return ChainKind::Masquerade;
    }
    if service_of_name(name).is_some() {
        return if name.starts_with(n::ENDPOINT_PREFIX) {
            ChainKind::Endpoint
        } else if name.starts_with(n::EXTERNAL_PREFIX) {
            ChainKind::External
        } else if name.starts_with(n::FIREWALL_PREFIX) {
            ChainKind::Firewall
        } else {
            ChainKind::Policy
        };
    }
    let fixed = crate::proxier::nftables::sync::BASE_CHAINS
        .iter()
        .any(|(c, _)| *c == name)
        || [
            n::SERVICES_CHAIN,
            n::SERVICE_ENDPOINTS_CHECK_CHAIN,
            n::NODEPORT_ENDPOINTS_CHECK_CHAIN,
            n::REJECT_CHAIN,
            n::CLUSTER_IPS_CHECK_CHAIN,
            n::FIREWALL_CHECK_CHAIN,
        ]
        .contains(&name);
    if fixed {
        ChainKind::Fixed
    } else {
        ChainKind::Foreign
    }
}

/// A finding about chain `chain` of table `family kube-proxy`, for service port `service`.
fn at(check: &Check, service: Option<&str>, chain: &str, message: String) -> Finding {
    let mut f = check.finding(message).chain(chain.to_string());
    f.service = service.map(str::to_string);
    f
}

/// `type nat hook prerouting priority -100; policy accept`.
fn hook_text(b: Option<&BaseChain<'_>>) -> String {
    match b {
        None => "regular chain (no hook)".into(),
        Some(b) => format!(
            "type {} hook {} priority {}; policy {}",
            b.kind,
            b.hook,
            b.priority,
            match b.policy {
                Some(Policy::Drop) => "drop",
                _ => "accept",
            }
        ),
    }
}

/// Rules as one line each, `(none)` for an empty chain.
fn rules_text<'r>(rules: impl IntoIterator<Item = &'r Rule<'r>>) -> String {
    let lines: Vec<String> = rules.into_iter().map(ToString::to_string).collect();
    if lines.is_empty() {
        "(none)".into()
    } else {
        lines.join("\n")
    }
}

/// Every finding of one family's table.
pub fn findings(
    d: &TableDiff<'_, '_, '_>,
    index: &PortIndex,
    expected: &Table<'_>,
) -> Vec<Finding> {
    let table = format!("table {} {}", d.family, n::TABLE);
    if d.table_missing {
        return vec![
            TABLE_MISSING
                .finding(format!(
                    "the node has no `{table}`: none of its {} service port(s) is programmed",
                    index.ports.len()
                ))
                .chain(table.clone())
                .expected(format!(
                    "{table} ({} chains, {} sets and maps)",
                    expected.chains.len(),
                    expected.sets.len()
                ))
                .actual("absent"),
        ];
    }
    let mut out = Vec::new();
    for c in &d.chains {
        chain_findings(c, &mut out);
    }
    for s in &d.sets {
        set_findings(s, index, &mut out);
    }
    for o in &d.missing_objects {
        out.push(
            OBJECT_MISSING
                .finding(format!(
                    "{} `{}` missing from kube-proxy's {table}",
                    o.kind, o.name
                ))
                .chain(format!("{} {}", o.kind, o.name))
                .expected(format!("{} {}", o.kind, o.name))
                .actual("absent"),
        );
    }
    for o in &d.extra_objects {
        out.push(
            FOREIGN_OBJECT
                .finding(format!("{} `{}` in kube-proxy's {table}", o.kind, o.name))
                .chain(format!("{} {}", o.kind, o.name))
                .expected("nothing")
                .actual(format!("{} {} {{ {} }}", o.kind, o.name, o.body)),
        );
    }
    out
}

fn chain_findings(c: &ChainDiff<'_, '_, '_>, out: &mut Vec<Finding>) {
    let name = c.name();
    let service = service_of_name(name);
    let label = service.as_ref().map(|(l, _)| l.as_str());
    let endpoint = service.as_ref().and_then(|(_, e)| e.as_deref());
    match c {
        ChainDiff::Missing { expected } => {
            let kind = chain_kind(name, expected.base.is_some());
            let (check, message) = match kind {
                ChainKind::Base => (&BASE_CHAIN, format!("base chain {name} missing")),
                ChainKind::Masquerade => (&MASQUERADING, format!("chain {name} missing")),
                ChainKind::Fixed | ChainKind::Foreign => {
                    (&FIXED_CHAIN, format!("chain {name} missing"))
                }
                ChainKind::Endpoint => (
                    &ENDPOINT_MISSING,
                    format!("endpoint {} has no chain {name}", endpoint.unwrap_or("?")),
                ),
                ChainKind::Firewall => (
                    &FIREWALL,
                    format!(
                        "source-range chain {name} missing: loadBalancerSourceRanges not enforced"
                    ),
                ),
                ChainKind::Policy | ChainKind::External => {
                    (&SERVICE_CHAIN_MISSING, format!("chain {name} missing"))
                }
            };
            out.push(
                at(check, label, name, message)
                    .expected(rules_text(&expected.rules))
                    .actual("no such chain"),
            );
        }
        ChainDiff::Hook { expected, actual } => {
            out.push(
                at(
                    &BASE_CHAIN,
                    label,
                    name,
                    format!("chain {name} is hooked differently"),
                )
                .expected(hook_text(expected.base.as_ref()))
                .actual(hook_text(actual.base.as_ref())),
            );
        }
        ChainDiff::Rules { expected, actual } => {
            let kind = chain_kind(name, expected.base.is_some());
            rule_findings(kind, expected, actual, label, endpoint, out);
        }
        ChainDiff::Extra { actual, .. } => {
            if actual.rules.is_empty() {
                // Only there because something leads to it: that is what gets reported.
                return;
            }
            let f = match label {
                Some(l) => at(
                    &STALE_CHAIN,
                    Some(l),
                    name,
                    match endpoint {
                        Some(e) => format!(
                            "chain {name} for endpoint {e}, which the service port does not have"
                        ),
                        None => format!(
                            "chain {name} of a service port the API does not have (or not this way)"
                        ),
                    },
                ),
                None => at(
                    &FOREIGN_OBJECT,
                    None,
                    name,
                    format!("chain {name} in kube-proxy's table is none of kube-proxy's"),
                ),
            };
            out.push(
                f.expected("no such chain")
                    .actual(rules_text(&actual.rules)),
            );
        }
    }
}

/// What a rule of a service port's chain is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topic {
    Masquerade,
    Dnat,
    Affinity,
    Shares,
    Other,
}

fn topic(r: &Rule<'_>) -> Topic {
    let mut t = Topic::Other;
    for s in &r.stmts {
        match s {
            Stmt::Verdict(v) if target(v) == Some(MARK_MASQ_CHAIN) => return Topic::Masquerade,
            Stmt::Nat(nat) if nat.kind == NatKind::Dnat => t = Topic::Dnat,
            Stmt::SetUpdate { set, .. } if set.starts_with(n::AFFINITY_PREFIX) => {
                t = Topic::Affinity
            }
            Stmt::Match {
                right: Expr::SetRef(set),
                ..
            } if set.starts_with(n::AFFINITY_PREFIX) => t = Topic::Affinity,
            Stmt::Vmap {
                key: Expr::Numgen { .. },
                ..
            } => t = Topic::Shares,
            _ => {}
        }
    }
    t
}

/// Expected rules the node lacks and the node's rules kube-proxy would not write (each rule
/// matched once).
fn unmatched<'r, 'e, 'a>(
    expected: &'r [Rule<'e>],
    actual: &'r [Rule<'a>],
) -> (Vec<&'r Rule<'e>>, Vec<&'r Rule<'a>>) {
    let mut used = vec![false; actual.len()];
    let mut missing = Vec::new();
    for e in expected {
        match actual
            .iter()
            .enumerate()
            .position(|(i, a)| !used[i] && a == e)
        {
            Some(i) => used[i] = true,
            None => missing.push(e),
        }
    }
    let extra = actual
        .iter()
        .zip(used)
        .filter(|(_, u)| !u)
        .map(|(a, _)| a)
        .collect();
    (missing, extra)
}

/// The load-balancing map of a numgen rule: modulus and (key, endpoint chain) entries.
fn shares<'r>(r: &'r Rule<'_>) -> Option<(u32, Vec<(u64, &'r str)>)> {
    r.stmts.iter().find_map(|s| match s {
        Stmt::Vmap {
            key: Expr::Numgen { modulus, .. },
            map: Expr::Set(elements),
        } => Some((
            *modulus,
            elements
                .iter()
                .filter_map(|e| match (&e.key, &e.value) {
                    (Expr::Number(k), Some(Expr::Verdict(v))) => Some((*k, target(v)?)),
                    _ => None,
                })
                .collect(),
        )),
        _ => None,
    })
}

/// The endpoint of an endpoint chain name, else the name.
fn endpoint_of(chain: &str) -> String {
    service_of_name(chain)
        .and_then(|(_, e)| e)
        .unwrap_or_else(|| chain.to_string())
}

fn rule_findings(
    kind: ChainKind,
    expected: &Chain<'_>,
    actual: &Chain<'_>,
    label: Option<&str>,
    endpoint: Option<&str>,
    out: &mut Vec<Finding>,
) {
    let name = expected.name.as_ref();
    let whole = |check: &Check, message: String| {
        at(check, label, name, message)
            .expected(rules_text(&expected.rules))
            .actual(rules_text(&actual.rules))
    };
    match kind {
        ChainKind::Base | ChainKind::Fixed | ChainKind::Foreign => {
            out.push(whole(&FIXED_CHAIN, format!("rules of chain {name} differ")));
            return;
        }
        ChainKind::Masquerade => {
            out.push(whole(
                &MASQUERADING,
                format!("rules of chain {name} differ"),
            ));
            return;
        }
        ChainKind::Firewall => {
            out.push(whole(
                &FIREWALL,
                format!("source-range rule of {name} differs from loadBalancerSourceRanges"),
            ));
            return;
        }
        _ => {}
    }
    if actual.rules.is_empty() {
        // Flushed: one finding says it all.
        let f = match kind {
            ChainKind::Endpoint => whole(
                &ENDPOINT_DNAT,
                format!(
                    "endpoint chain of {} is empty (flushed): traffic to it is not DNATed",
                    endpoint.unwrap_or("?")
                ),
            ),
            _ => whole(
                &SERVICE_CHAIN_MISSING,
                format!("chain {name} is empty (flushed): traffic to it is not forwarded"),
            ),
        };
        out.push(f);
        return;
    }
    let (missing, extra) = unmatched(&expected.rules, &actual.rules);
    if missing.is_empty() && extra.is_empty() {
        out.push(whole(
            &RULE_DIFFERS,
            format!("rules of {name} are in another order than kube-proxy writes them"),
        ));
        return;
    }
    let of = |rules: &[&Rule<'_>], t: Topic| -> Vec<String> {
        rules
            .iter()
            .filter(|r| topic(r) == t)
            .map(|r| r.to_string())
            .collect()
    };
    let one = |check: &Check, message: String, e: Vec<String>, a: Vec<String>| {
        let text = |v: Vec<String>| {
            if v.is_empty() {
                "(none)".to_string()
            } else {
                v.join("\n")
            }
        };
        at(check, label, name, message)
            .expected(text(e))
            .actual(text(a))
    };
    // Load balancing.
    let exp_shares = missing.iter().find_map(|r| shares(r));
    let act_shares = extra.iter().find_map(|r| shares(r));
    if exp_shares.is_some() || act_shares.is_some() {
        let targets = |s: &Option<(u32, Vec<(u64, &str)>)>| -> Vec<String> {
            s.as_ref()
                .map(|(_, e)| e.iter().map(|(_, c)| c.to_string()).collect())
                .unwrap_or_default()
        };
        let (et, at_) = (targets(&exp_shares), targets(&act_shares));
        if act_shares.is_none() && !et.is_empty() {
            out.push(one(
                &ENDPOINT_MISSING,
                format!(
                    "{name} has no load-balancing rule: none of its {} endpoint(s) is reachable",
                    et.len()
                ),
                of(&missing, Topic::Shares),
                of(&extra, Topic::Shares),
            ));
        } else {
            // One finding per endpoint, each naming its own map entry: with both maps in each,
            // a service port's findings would grow with the square of its endpoints.
            let (in_et, in_at): (HashSet<&String>, HashSet<&String>) =
                (et.iter().collect(), at_.iter().collect());
            let entry = |c: &str| format!("goto {c} in the numgen map of {name}");
            let without = |n: usize| format!("not in the map ({n} entries)");
            for c in et.iter().filter(|c| !in_at.contains(c)) {
                out.push(one(
                    &ENDPOINT_MISSING,
                    format!(
                        "endpoint {} is not in the load-balancing map of {name}",
                        endpoint_of(c)
                    ),
                    vec![entry(c)],
                    vec![without(at_.len())],
                ));
            }
            for c in at_.iter().filter(|c| !in_et.contains(c)) {
                out.push(one(
                    &ENDPOINT_EXTRA,
                    format!(
                        "{name} sends traffic to endpoint {}, which the service port does not have",
                        endpoint_of(c)
                    ),
                    vec![without(et.len())],
                    vec![entry(c)],
                ));
            }
        }
        if let Some((modulus, entries)) = &act_shares {
            let mut keys: Vec<u64> = entries.iter().map(|(k, _)| *k).collect();
            keys.sort_unstable();
            let mut chains: Vec<&str> = entries.iter().map(|(_, c)| *c).collect();
            chains.sort_unstable();
            chains.dedup();
            let even =
                keys.iter().copied().eq(0..u64::from(*modulus)) && chains.len() == entries.len();
            if !even {
                out.push(one(
                    &UNEQUAL_SHARES,
                    format!(
                        "numgen mod {modulus} of {name} over {} map entries for {} endpoint chain(s): shares are not 1/{}",
                        entries.len(),
                        chains.len(),
                        chains.len().max(1)
                    ),
                    of(&missing, Topic::Shares),
                    of(&extra, Topic::Shares),
                ));
            }
        }
    }
    // DNAT.
    let (ed, ad) = (of(&missing, Topic::Dnat), of(&extra, Topic::Dnat));
    if !ed.is_empty() || !ad.is_empty() {
        let message = match (ed.is_empty(), ad.is_empty()) {
            (false, true) => format!(
                "endpoint chain of {} does not DNAT",
                endpoint.unwrap_or("?")
            ),
            (false, false) => format!(
                "endpoint chain of {} DNATs elsewhere",
                endpoint.unwrap_or("?")
            ),
            _ => format!("{name} DNATs where kube-proxy would not"),
        };
        out.push(one(&ENDPOINT_DNAT, message, ed, ad));
    }
    // Masquerade.
    let (em, am) = (
        of(&missing, Topic::Masquerade),
        of(&extra, Topic::Masquerade),
    );
    if !em.is_empty() {
        out.push(one(
            &MASQ_MISSING,
            format!("masquerade rule of {name} missing"),
            em,
            am.clone(),
        ));
    } else if !am.is_empty() {
        out.push(one(
            &MASQ_EXTRA,
            format!("{name} masquerades where kube-proxy would not"),
            em,
            am,
        ));
    }
    // Session affinity.
    let (ea, aa) = (of(&missing, Topic::Affinity), of(&extra, Topic::Affinity));
    if !ea.is_empty() {
        out.push(one(
            &AFFINITY_MISSING,
            format!("session-affinity rule of {name} missing"),
            ea,
            aa,
        ));
    } else if !aa.is_empty() {
        out.push(one(
            &AFFINITY_EXTRA,
            format!("{name} has session-affinity rules the Service does not ask for"),
            ea,
            aa,
        ));
    }
    // The rest.
    let (eo, ao) = (of(&missing, Topic::Other), of(&extra, Topic::Other));
    if !eo.is_empty() || !ao.is_empty() {
        let message = match (eo.is_empty(), ao.is_empty()) {
            (false, true) => format!("{} rule(s) of {name} missing", eo.len()),
            (true, false) => format!(
                "{} rule(s) in {name} that kube-proxy would not write",
                ao.len()
            ),
            _ => format!("rules of {name} differ"),
        };
        out.push(one(&RULE_DIFFERS, message, eo, ao));
    }
}

/// What this build does not know replaces what would be concluded from it: the findings of
/// the service ports whose path holds it (and of the objects themselves) give way to one KP711
/// per port, and one for the rest. Returns how many service ports could not be checked: those,
/// or all `ports` of the family when a chain every port's traffic passes holds a statement this
/// build does not know.
pub fn unknown_layout(u: &UnknownLayout, ports: usize, found: &mut Vec<Finding>) -> usize {
    let shared = u.in_shared_chains();
    let names: HashSet<&str> = u
        .ports
        .iter()
        .flat_map(|(_, objs)| objs)
        .chain(&u.elsewhere)
        .map(|o| o.name.as_str())
        .collect();
    found.retain(|f| {
        let about_port = match &f.service {
            Some(s) => shared || u.ports.iter().any(|(p, _)| p == s),
            None => false,
        };
        let about_object = f.chain.as_deref().is_some_and(|c| names.contains(c));
        !about_port && !about_object
    });
    let list = |objs: &[UnknownObject]| -> String {
        objs.iter()
            .map(UnknownObject::describe)
            .collect::<Vec<_>>()
            .join("\n")
    };
    for (port, objs) in &u.ports {
        let mut f = UNKNOWN_LAYOUT
            .finding(format!(
                "{port} not checked: {}",
                unknown_layout_message(objs)
            ))
            .chain(objs.first().map_or_else(String::new, |o| o.name.clone()))
            .expected("rules of a kube-proxy release this build knows")
            .actual(list(objs));
        f.service = Some(port.clone());
        found.push(f);
    }
    if !u.elsewhere.is_empty() {
        let what = if shared {
            "no service port checked: a chain every service's traffic passes holds what it cannot read"
        } else {
            "on no service port's path"
        };
        found.push(
            UNKNOWN_LAYOUT
                .finding(format!("{what}: {}", unknown_layout_message(&u.elsewhere)))
                .chain(u.elsewhere[0].name.clone())
                .expected("objects of a kube-proxy release this build knows")
                .actual(list(&u.elsewhere)),
        );
    }
    if shared { ports } else { u.ports.len() }
}

/// `ip . proto . port` / `proto . port` as `ip proto/port` for messages.
fn key_text(key: &Expr<'_>) -> String {
    // Printed as set elements are (`tcp`, not the quoted symbol of an expression position).
    let c = |e: &Expr<'_>| Element::key(e.clone()).to_string();
    match key {
        Expr::Concat(parts) => match parts.as_slice() {
            [ip, proto, port] => format!("{} {}/{}", c(ip), c(proto), c(port)),
            [proto, port] => format!("{}/{}", c(proto), c(port)),
            _ => c(key),
        },
        other => c(other),
    }
}

fn value_text(e: &Element<'_>) -> String {
    e.value
        .as_ref()
        .map_or_else(|| "(none)".into(), ToString::to_string)
}

/// The service port of a map element: by its key, else by the chain its value leads to, else
/// by its comment (kube-proxy's no-endpoint elements carry `ns/name:port`).
fn element_owner(
    e: &Element<'_>,
    index: &PortIndex,
) -> (Option<String>, Option<AddressKind>, Option<bool>) {
    if let Some((p, kind)) = index.owner_of_key(&e.key) {
        return (Some(p.label.clone()), kind, Some(p.has_endpoints));
    }
    if let Some(Expr::Verdict(v)) = &e.value
        && let Some(c) = target(v)
        && let Some((label, _)) = service_of_name(c)
    {
        return (Some(label), None, None);
    }
    (e.comment.as_ref().map(|c| c.to_string()), None, None)
}

fn set_findings(s: &SetDiff<'_, '_, '_>, index: &PortIndex, out: &mut Vec<Finding>) {
    let name = s.name();
    let what = |set: &Set<'_>| if set.is_map { "map" } else { "set" };
    match s {
        SetDiff::Missing { expected } => {
            if let Some((label, endpoint)) = service_of_name(name) {
                out.push(
                    at(
                        &AFFINITY_MISSING,
                        Some(&label),
                        name,
                        format!(
                            "session-affinity set of endpoint {} missing",
                            endpoint.unwrap_or_default()
                        ),
                    )
                    .expected(declaration(expected))
                    .actual("no such set"),
                );
            } else {
                out.push(
                    at(
                        &SET_DECLARATION,
                        None,
                        name,
                        format!("{} {name} missing", what(expected)),
                    )
                    .expected(declaration(expected))
                    .actual(format!("no such {}", what(expected))),
                );
            }
        }
        SetDiff::Declaration { expected, actual } => {
            let (check, label) = match service_of_name(name) {
                Some((label, _)) => (&AFFINITY_MISSING, Some(label)),
                None => (&SET_DECLARATION, None),
            };
            out.push(
                at(
                    check,
                    label.as_deref(),
                    name,
                    format!("{} {name} is declared differently", what(expected)),
                )
                .expected(declaration(expected))
                .actual(declaration(actual)),
            );
        }
        SetDiff::Extra { actual } => {
            let f = match service_of_name(name) {
                Some((label, endpoint)) => at(
                    &AFFINITY_EXTRA,
                    Some(&label),
                    name,
                    format!(
                        "session-affinity set of endpoint {} that kube-proxy would not have",
                        endpoint.unwrap_or_default()
                    ),
                ),
                None => at(
                    &FOREIGN_OBJECT,
                    None,
                    name,
                    format!(
                        "{} {name} in kube-proxy's table is none of kube-proxy's",
                        what(actual)
                    ),
                ),
            };
            out.push(
                f.expected(format!("no such {}", what(actual)))
                    .actual(declaration(actual)),
            );
        }
        SetDiff::Elements {
            missing,
            extra,
            changed,
            expected,
            ..
        } => match name {
            n::CLUSTER_IPS_SET | n::NODEPORT_IPS_SET => {
                let check = if name == n::CLUSTER_IPS_SET {
                    &CLUSTER_IPS
                } else {
                    &NODEPORT_IPS
                };
                let list = |v: Vec<String>| {
                    let more = v.len().saturating_sub(EXAMPLES);
                    let mut s = v.into_iter().take(EXAMPLES).collect::<Vec<_>>().join(", ");
                    if more > 0 {
                        s.push_str(&format!(" and {more} more"));
                    }
                    if s.is_empty() { "(none)".into() } else { s }
                };
                out.push(
                    at(
                        check,
                        None,
                        name,
                        format!(
                            "{name}: {} address(es) missing, {} that kube-proxy would not have",
                            missing.len(),
                            extra.len()
                        ),
                    )
                    .expected(format!(
                        "also {}",
                        list(missing.iter().map(|e| e.key.to_string()).collect())
                    ))
                    .actual(format!(
                        "also {}",
                        list(extra.iter().map(|e| e.key.to_string()).collect())
                    )),
                );
            }
            _ => {
                for e in missing {
                    out.push(missing_element(name, e, index));
                }
                for a in extra {
                    out.push(extra_element(name, a, index));
                }
                for (e, a) in changed {
                    let (label, _, _) = element_owner(e, index);
                    let check = if name == n::FIREWALL_IPS_MAP {
                        &FIREWALL
                    } else {
                        &ELEMENT_WRONG
                    };
                    out.push(
                        at(
                            check,
                            label.as_deref(),
                            name,
                            format!("{name} element {} leads elsewhere", key_text(&e.key)),
                        )
                        .expected(value_text(e))
                        .actual(value_text(a)),
                    );
                }
                let _ = expected;
            }
        },
    }
}

/// `type ipv4_addr . inet_proto . inet_service : verdict; flags timeout; timeout 10800s`.
fn declaration(s: &Set<'_>) -> String {
    let mut t = format!("type {}", s.key);
    if let Some(d) = &s.data {
        t.push_str(&format!(" : {d}"));
    }
    if !s.flags.is_empty() {
        t.push_str(&format!("; flags {}", s.flags));
    }
    if let Some(d) = s.timeout {
        t.push_str(&format!("; timeout {}s", d.as_secs()));
    }
    t
}

fn missing_element(map: &str, e: &Element<'_>, index: &PortIndex) -> Finding {
    let (label, kind, _) = element_owner(e, index);
    let key = key_text(&e.key);
    let (check, message) = match map {
        n::SERVICE_IPS_MAP => (
            &SERVICE_IP_MISSING,
            format!(
                "{} {key} has no {map} element: its traffic is not forwarded",
                kind.map_or("address", AddressKind::words)
            ),
        ),
        n::SERVICE_NODEPORTS_MAP => (
            &NODEPORT_MISSING,
            format!("NodePort {key} has no {map} element: its traffic is not forwarded"),
        ),
        n::NO_ENDPOINT_SERVICES_MAP | n::NO_ENDPOINT_NODEPORTS_MAP => (
            &NO_ENDPOINT_MISSING,
            format!("{key} has no {map} element: traffic to it is not refused"),
        ),
        n::FIREWALL_IPS_MAP => (
            &FIREWALL,
            format!("{key} has no {map} element: loadBalancerSourceRanges not enforced"),
        ),
        _ => (&SET_DECLARATION, format!("{map} element {key} missing")),
    };
    at(check, label.as_deref(), map, message)
        .expected(format!("{key} : {}", value_text(e)))
        .actual("no such element")
}

fn extra_element(map: &str, a: &Element<'_>, index: &PortIndex) -> Finding {
    let (label, _, has_endpoints) = element_owner(a, index);
    let key = key_text(&a.key);
    let known = index.owner_of_key(&a.key).is_some();
    let (check, message) = match map {
        n::FIREWALL_IPS_MAP => (
            &FIREWALL,
            format!(
                "{map} element {key} kube-proxy would not write: its source ranges are filtered"
            ),
        ),
        n::NO_ENDPOINT_SERVICES_MAP | n::NO_ENDPOINT_NODEPORTS_MAP if known => (
            &NO_ENDPOINT_WITH_ENDPOINTS,
            format!(
                "{map} element {key} refuses traffic{}",
                if has_endpoints == Some(true) {
                    " although the service port has endpoints"
                } else {
                    " kube-proxy would not refuse this way"
                }
            ),
        ),
        _ if known => (
            &ELEMENT_WRONG,
            format!(
                "{map} element {key} kube-proxy would not write for this service port (it has {}endpoints)",
                if has_endpoints == Some(true) {
                    ""
                } else {
                    "no "
                }
            ),
        ),
        _ => (
            &ELEMENT_STALE,
            format!("{map} element {key} is for an address or port no service port has"),
        ),
    };
    at(check, label.as_deref(), map, message)
        .expected("no such element")
        .actual(format!("{key} : {}", value_text(a)))
}
