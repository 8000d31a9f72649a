//! nftables-mode verification (findings KP7xx, documented in `docs/findings.md` section
//! "nftables mode"): the `kube-proxy` table `render --mode nftables` writes for each IP family
//! ([`expected::ExpectedTable`]) against the node's `table ip kube-proxy` / `table ip6
//! kube-proxy` read from `nft list`, `nft -j list` or `nft -f` text, both normalised
//! ([`kproxy_parsers::nft::Ruleset::normalize`]) so the three forms compare equal.
//!
//! [`diff`] computes what differs per chain, set and map (also the input of `repair`);
//! [`findings`] names each difference: per service port (map elements, service and endpoint
//! chains, load-balancing shares, masquerade, session affinity, source ranges) and node-wide
//! (base chains, the fixed chains, `cluster-ips`, `nodeport-ips`); [`leftovers`] looks for the
//! other modes' state (iptables `KUBE-*` chains, IPVS virtual servers and ipsets).

pub mod diff;
pub mod expected;
pub mod findings;
pub mod left_alone;
pub mod leftovers;
pub mod release;

#[cfg(test)]
mod tests;

use super::finding::Finding;
use super::report::Report;
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::ip::IpFamily;
use crate::state::node::NodeFacts;
use expected::ExpectedTable;
use kproxy_parsers::ParseError;
use kproxy_parsers::nft::{self, Family, ParseOptions, Ruleset, Table};
use std::sync::OnceLock;

crate::compare::catalogue::checks! {
    /// Every nftables check, in ID order.
    CHECKS;
    // ---- node-wide ----
    /// The node has no `kube-proxy` table of a family kube-proxy writes.
    TABLE_MISSING = "KP701", Error, "kube-proxy's nftables table missing", "F04",
        "kube-proxy in nftables mode has not synced, or something deleted its table: read kube-proxy's log (nftables sync failed), then kubectl kproxy repair --local recreates it";
    /// A base chain is missing, or hooked with another type, hook, priority or policy.
    BASE_CHAIN = "KP702", Error, "base chain missing or hooked differently (type, hook, priority, policy)", "F10",
        "kube-proxy re-creates its base chains on its first full sync (restart it); check who edits the kube-proxy table (nft scripts, firewall managers)";
    /// The rules of a fixed chain (the jumps from base chains, dispatch, no-endpoint and firewall checks) differ.
    FIXED_CHAIN = "KP703", Error, "rules of kube-proxy's fixed chains differ (jumps from base chains, dispatch, checks)", "F10",
        "kube-proxy rewrites these chains on every full sync; resync kube-proxy (or kubectl kproxy repair) and find who edits them";
    /// The masquerade chains differ: marked packets are not masqueraded (or not marked).
    MASQUERADING = "KP704", Error, "marked packets are not masqueraded (masquerading / mark-for-masquerade chains differ)", "F11",
        "replies of masqueraded connections bypass the node; resync kube-proxy (or kubectl kproxy repair)";
    /// A set or map is missing or declared with another type, flags or timeout.
    SET_DECLARATION = "KP705", Error, "set or map missing or declared differently", "F04",
        "rules that look the set up fail to load or match nothing; resync kube-proxy (or kubectl kproxy repair)";
    /// `cluster-ips` holds other addresses than the active cluster IPs.
    CLUSTER_IPS = "KP706", Warning, "cluster-ips set differs from the active cluster IPs", "F06",
        "traffic to invalid ports of these cluster IPs is dropped instead of rejected (or the reverse); resync kube-proxy";
    /// `nodeport-ips` holds other addresses than the node's NodePort addresses.
    NODEPORT_IPS = "KP707", Error, "nodeport-ips set differs from the node's NodePort addresses", "F06",
        "NodePorts are not served (or served) on these addresses; check nodePortAddresses and the node's IPs, then resync kube-proxy";
    /// iptables-mode kube-proxy chains on an nftables-mode node.
    IPTABLES_LEFTOVER = "KP708", Error, "iptables-mode kube-proxy rules left over on an nftables node", "F07",
        "both modes' rules see the packets and the old ones DNAT to old endpoints: run kube-proxy --cleanup with mode iptables (or delete the KUBE-* chains and their jumps) once nothing uses them";
    /// IPVS-mode state on an nftables-mode node.
    IPVS_LEFTOVER = "KP709", Error, "IPVS-mode state left over on an nftables node (virtual servers, KUBE-* ipsets)", "F07",
        "IPVS still answers for the old service addresses: run kube-proxy --cleanup with mode ipvs (ipvsadm -C, ipset destroy of the KUBE-* sets, ip link del kube-ipvs0) once nothing uses them";
    /// Something in kube-proxy's table that kube-proxy does not write.
    FOREIGN_OBJECT = "KP710", Warning, "chain, set or object in kube-proxy's table that kube-proxy does not write", "F07",
        "kube-proxy owns its table and may delete these on any sync: move them to a table of your own";
    /// Chains, sets, objects or statement forms in kube-proxy's table that no release this
    /// build knows writes: the service ports whose path holds them are not checked.
    UNKNOWN_LAYOUT = "KP711", Warning, "kube-proxy's table holds what this build does not know (a newer kube-proxy's layout?); those service ports not checked", "F02, F07",
        "the node's kube-proxy may be newer than this build: verify with a kubectl-kproxy that knows its release; if another program wrote these objects, move them to a table of its own";
    /// A named object the render has (1.37+: the localhost NodePort reject counters) is
    /// missing: the rules that name it cannot be loaded.
    OBJECT_MISSING = "KP712", Error, "named object (counter) kube-proxy writes is missing", "F04",
        "the rules that name it cannot exist without it: resync kube-proxy (or kubectl kproxy repair)";

    // ---- service entries ----
    /// A `service-ips` element is missing.
    SERVICE_IP_MISSING = "KP721", Error, "service-ips element missing (cluster, external or load-balancer IP)", "F04, F06",
        "kube-proxy did not program this address: check its sync errors, then resync (or kubectl kproxy repair)";
    /// A `service-nodeports` element is missing.
    NODEPORT_MISSING = "KP722", Error, "service-nodeports element missing", "F04, F06",
        "kube-proxy did not program this NodePort: check its sync errors, then resync (or kubectl kproxy repair)";
    /// A map element leads elsewhere than kube-proxy's.
    ELEMENT_WRONG = "KP723", Error, "map element leads elsewhere than kube-proxy's (chain or verdict)", "F06, F23",
        "the element predates a change of the Service (traffic policy, endpoints); resync kube-proxy";
    /// A map element for an address or port no service port has.
    ELEMENT_STALE = "KP724", Error, "map element for an address or port no service port has", "F06, F07",
        "the element predates the deletion or change of a Service; resync kube-proxy (or kubectl kproxy repair)";
    /// No drop/reject element for a service port without endpoints.
    NO_ENDPOINT_MISSING = "KP725", Warning, "no drop/reject element for a service port without endpoints", "F14",
        "clients hang until timeout instead of being refused; resync kube-proxy";
    /// A drop/reject element for a service port that has endpoints.
    NO_ENDPOINT_WITH_ENDPOINTS = "KP726", Error, "drop/reject element for a service port that has endpoints", "F07, F08, F23",
        "the no-endpoint element refuses traffic the endpoints should get: resync kube-proxy (or kubectl kproxy repair)";

    // ---- chains, endpoints and shares ----
    /// A service chain (`service-`, `local-`, `external-`, `firewall-`) is missing.
    SERVICE_CHAIN_MISSING = "KP731", Error, "service chain missing", "F04, F06",
        "resync kube-proxy (or kubectl kproxy repair)";
    /// An endpoint the API lists is not reachable.
    ENDPOINT_MISSING = "KP732", Error, "endpoint missing (no endpoint chain, or not in the load-balancing map)", "F06, F23",
        "kube-proxy has not programmed a ready endpoint: resync kube-proxy; check its node name for Local policies";
    /// Traffic goes to an endpoint the API does not list.
    ENDPOINT_EXTRA = "KP733", Error, "traffic sent to an endpoint the API does not have", "F06, F07",
        "stale endpoint: the pod is gone or not ready; resync kube-proxy and clear conntrack entries to that IP";
    /// Endpoints do not get equal shares.
    UNEQUAL_SHARES = "KP734", Error, "endpoints do not get equal shares (numgen modulus and map differ)", "F06",
        "the numgen rule was edited or belongs to another endpoint count; resync kube-proxy";
    /// An endpoint chain does not DNAT, or DNATs elsewhere.
    ENDPOINT_DNAT = "KP735", Error, "endpoint chain does not DNAT to its endpoint", "F06",
        "the endpoint chain was flushed or edited; resync kube-proxy (or kubectl kproxy repair)";

    // ---- masquerade, affinity, firewall ----
    /// A masquerade rule of a service port is missing.
    MASQ_MISSING = "KP741", Error, "masquerade rule missing", "F11, F12",
        "replies will bypass the node (asymmetric routing); resync kube-proxy";
    /// A masquerade rule kube-proxy would not write.
    MASQ_EXTRA = "KP742", Warning, "masquerade rule kube-proxy would not write", "F12",
        "client source IPs are hidden from the endpoints; check masqueradeAll and the local-traffic detection";
    /// Session affinity missing or with another timeout.
    AFFINITY_MISSING = "KP743", Error, "session affinity missing or with another timeout", "F06",
        "sessionAffinity: ClientIP is not enforced as configured on this node; resync kube-proxy";
    /// Session affinity the Service does not ask for.
    AFFINITY_EXTRA = "KP744", Warning, "session affinity the Service does not ask for", "F06",
        "the rules predate a sessionAffinity change; resync kube-proxy";
    /// loadBalancerSourceRanges firewall differs.
    FIREWALL = "KP745", Error, "load-balancer source-range firewall differs (firewall-ips, firewall chain)", "F06",
        "the allowed source ranges on the node differ from loadBalancerSourceRanges; resync kube-proxy";

    // ---- other rule differences ----
    /// Another difference in a service port's chain.
    RULE_DIFFERS = "KP751", Warning, "rule of a service port's chain differs from kube-proxy's", "F06",
        "the chain was edited; resync kube-proxy (or kubectl kproxy repair); see expected and actual";
    /// Rules for a service port the API does not have.
    STALE_CHAIN = "KP752", Warning, "chain with rules for a service port or endpoint the API does not have", "F07, F22",
        "nothing leads to it unless another finding says so; kube-proxy flushes it on its next sync, or kubectl kproxy repair deletes it";
}

/// Why an nftables verify could not run.
#[derive(Debug, thiserror::Error)]
pub enum NftVerifyError {
    /// A ruleset did not parse (the error names the input).
    #[error("{0}")]
    Parse(Box<ParseError>),
    /// The render did not parse back (a bug).
    #[error("parsing the rendered table: {0}")]
    Render(Box<ParseError>),
}

/// One node listing: `nft list ruleset`, `nft -j list table ip kube-proxy`, ….
#[derive(Debug, Clone, Copy)]
pub struct NftText<'a> {
    /// Where it came from (a path, `nft -j list table ip kube-proxy (exec …)`), for messages.
    pub label: &'a str,
    /// The text or JSON.
    pub text: &'a str,
}

/// Everything an nftables verify needs.
#[derive(Debug)]
pub struct NftVerifyInput<'a> {
    /// The node name shown in the report.
    pub node: &'a str,
    /// API state.
    pub state: &'a ClusterState,
    /// The configuration as kube-proxy reads it in nftables mode ([`ProxyConfig::for_nftables`]).
    pub config: &'a ProxyConfig,
    /// Node facts built from that configuration; `family` is the main family.
    pub facts: &'a NodeFacts,
    /// The node's listings (together they hold the `kube-proxy` tables).
    pub listings: Vec<NftText<'a>>,
    /// `iptables-save` / `ip6tables-save` outputs, when collected: their `KUBE-*` chains are
    /// leftovers of iptables mode.
    pub iptables: Vec<NftText<'a>>,
    /// `ipvsadm -Ln` output, when collected.
    pub ipvsadm: Option<&'a str>,
    /// `ipset save` output, when collected.
    pub ipset: Option<&'a str>,
    /// Lenient parsing (`--lenient`).
    pub lenient: bool,
}

/// The node's tables of one parse: every listing parsed and normalised.
pub fn parse_listings<'a>(
    listings: &[NftText<'a>],
    lenient: bool,
) -> Result<Vec<Ruleset<'a>>, NftVerifyError> {
    let opts = if lenient {
        ParseOptions::lenient()
    } else {
        ParseOptions::strict()
    };
    listings
        .iter()
        .map(|l| {
            let mut rs = nft::parse(l.text, &opts)
                .map_err(|e| NftVerifyError::Parse(Box::new(e.in_source(l.label))))?;
            rs.normalize();
            Ok(rs)
        })
        .collect()
}

/// The `kube-proxy` table of `family` among the parsed listings (the first one that has it).
pub fn kube_proxy_table<'r, 'a>(
    rulesets: &'r [Ruleset<'a>],
    family: Family,
) -> Option<&'r Table<'a>> {
    rulesets
        .iter()
        .find_map(|r| r.table(family, crate::proxier::nftables::names::TABLE))
}

/// Parses a render and normalises it.
pub fn parse_expected(expected: &ExpectedTable) -> Result<Ruleset<'_>, NftVerifyError> {
    let mut rs = nft::parse(&expected.text, &ParseOptions::strict())
        .map_err(|e| NftVerifyError::Render(Box::new(e.in_source("render"))))?;
    rs.normalize();
    Ok(rs)
}

/// The families to check: the main one always, the other when the node has its table or
/// services of it exist (reported as not collected when the table is absent).
fn families(main: IpFamily) -> [IpFamily; 2] {
    match main {
        IpFamily::V4 => [IpFamily::V4, IpFamily::V6],
        IpFamily::V6 => [IpFamily::V6, IpFamily::V4],
    }
}

/// Runs every nftables check for one node.
pub fn verify(input: &NftVerifyInput<'_>) -> Result<Report, NftVerifyError> {
    // The node's listings and the expected tables do not depend on each other: the main
    // family's table is rendered and parsed back while the listings are parsed and the other
    // family's table (usually small) is rendered.
    let [main_family, other_family] = families(input.facts.family);
    let left_out = super::left_out::services(input.state);
    let judged = super::left_out::judged_state(input.state, &left_out);
    let state: &ClusterState = &judged;
    let mut not_checked = Vec::new();
    let main_expected: OnceLock<ExpectedTable> = OnceLock::new();
    let (main_parsed, (rulesets, other_expected)) = rayon::join(
        || {
            let mut facts = input.facts.clone();
            facts.family = main_family;
            parse_expected(
                main_expected.get_or_init(|| ExpectedTable::build(state, input.config, &facts)),
            )
        },
        || {
            let rulesets = parse_listings(&input.listings, input.lenient);
            let mut facts = input.facts.clone();
            facts.family = other_family;
            (rulesets, ExpectedTable::build(state, input.config, &facts))
        },
    );
    let rulesets = rulesets?;
    let expected_tables = [
        (main_expected.get(), Some(main_parsed?)),
        (Some(&other_expected), None),
    ];
    let mut out: Vec<Finding> = Vec::new();
    let mut service_ports = 0usize;
    let mut unchecked = 0usize;
    for r in &rulesets {
        if !r.skipped.is_empty() {
            out.push(
                super::catalogue::LINES_SKIPPED
                    .finding(format!(
                        "{} line(s) of the nft ruleset were skipped (--lenient); findings about them may be wrong",
                        r.skipped.len()
                    ))
                    .actual(
                        r.skipped
                            .iter()
                            .take(3)
                            .map(|s| format!("line {}", s.line))
                            .collect::<Vec<_>>()
                            .join(", "),
                    ),
            );
        }
    }
    for (i, (expected, parsed)) in expected_tables.into_iter().enumerate() {
        let Some(expected) = expected else {
            continue;
        };
        let family = expected.family;
        let nft_family = expected.nft_family();
        let actual = kube_proxy_table(&rulesets, nft_family);
        let ports = expected.index.ports.len();
        if actual.is_none() && i > 0 {
            // The second family: kube-proxy writes its table only on dual-stack nodes.
            if ports > 0 {
                out.push(
                    super::catalogue::FAMILY_NOT_COLLECTED
                        .finding(format!(
                            "{ports} {family} service port(s) not checked: no `table {nft_family} kube-proxy` in the nft ruleset"
                        ))
                        .expected(format!("table {nft_family} kube-proxy (nft list ruleset)"))
                        .actual("not given")
                        .hint(format!(
                            "give a listing that holds table {nft_family} kube-proxy (nft -j list ruleset) to check that family too; kube-proxy writes it only on dual-stack nodes"
                        )),
                );
            }
            continue;
        }
        let parsed = match parsed {
            Some(parsed) => parsed,
            None => parse_expected(expected)?,
        };
        let Some(table) = parsed.table(nft_family, crate::proxier::nftables::names::TABLE) else {
            continue;
        };
        let cut = (!left_out.is_empty())
            .then(|| actual.map(|a| left_alone::without(a, &left_out)))
            .flatten();
        let actual = match &cut {
            Some((kept, counts)) => {
                for n in counts {
                    super::left_out::tally(&mut not_checked, n.clone());
                }
                Some(kept)
            }
            None => actual,
        };
        let d = diff::diff(table, actual);
        let mut found = findings::findings(&d, &expected.index, table);
        if let Some(actual) = actual {
            let unknown = crate::graph::nftables::unknown_layout(actual);
            if !unknown.is_empty() {
                unchecked += findings::unknown_layout(&unknown, ports, &mut found);
            }
        }
        out.extend(found);
        service_ports += ports;
    }
    out.extend(super::left_out::findings(
        &input.state.invalid,
        &not_checked,
    ));
    out.extend(leftovers::iptables_leftovers(&input.iptables));
    out.extend(leftovers::ipvs_leftovers(input.ipvsadm, input.ipset));
    if input.iptables.is_empty() {
        out.extend(leftovers::iptables_nft_tables(&rulesets));
    }
    Ok(Report::new(
        input.node,
        crate::state::mode::ProxyMode::Nftables,
        service_ports,
        out,
    )
    .with_unchecked(unchecked))
}
