//! A verify of some Services only: the same comparison as [`super::run::verify`], run on the
//! part of the API state and of each dump that concerns them. The monitor re-verifies the
//! Services an API change touched this way, instead of every service port of the node: on a
//! node of 10,000 services the whole comparison costs most of a second of CPU, the part of one
//! Service a few milliseconds.
//!
//! What concerns a Service in a dump: the rules of its per-service chains (`KUBE-SVC-`,
//! `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-`, `KUBE-XLB-`, all named by one hash per service port,
//! and the `KUBE-SEP-` chains those jump to), and the rules of the shared chains
//! (`KUBE-SERVICES`, `KUBE-NODEPORTS`, the filter table's) whose comment names it or that jump
//! to one of its chains. Rules that name no Service (kube-proxy's skeleton) are kept; rules of
//! other Services are left out. Only the findings of the Services' ports are answers: a cut
//! dump says nothing of the node as a whole ([`ScopedVerify::findings`] keeps only those).

use super::finding::Finding;
use super::run::{DumpText, NodePlans, VerifyError, VerifyInput, verify};
use crate::graph::ownership::{ChainKind, service_chain};
use crate::state::ClusterState;
use std::collections::{BTreeSet, HashSet};

/// The label an EndpointSlice names its Service with (`discovery.k8s.io/v1`).
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The Services of `state` named in `services` (`namespace/name`), their EndpointSlices, and
/// everything node-wide (Nodes, ServiceCIDRs): what kube-proxy reads for those Services.
pub fn cut_state(state: &ClusterState, services: &BTreeSet<String>) -> ClusterState {
    let named = |ns: Option<&String>, name: Option<&String>| {
        services.contains(&format!(
            "{}/{}",
            ns.map_or("", String::as_str),
            name.map_or("", String::as_str)
        ))
    };
    ClusterState {
        services: state
            .services
            .iter()
            .filter(|s| named(s.metadata.namespace.as_ref(), s.metadata.name.as_ref()))
            .cloned()
            .collect(),
        endpoint_slices: state
            .endpoint_slices
            .iter()
            .filter(|s| {
                let owner = s
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(SERVICE_NAME_LABEL));
                named(s.metadata.namespace.as_ref(), owner)
            })
            .cloned()
            .collect(),
        nodes: state.nodes.clone(),
        service_cidrs: state.service_cidrs.clone(),
        invalid: Vec::new(),
    }
}

/// The Service (`namespace/name`) a rule's comment names: its first word is `ns/name:port`
/// (`"shop/web:http cluster IP"`, `"shop/web:http has no endpoints"`), or the service is named
/// after `for ` or `to ` (`"masquerade traffic for shop/web:http external destinations"`).
fn comment_service(rule: &str) -> Option<&str> {
    let (_, rest) = rule.split_once("--comment ")?;
    let text = match rest.strip_prefix('"') {
        Some(quoted) => quoted.split('"').next()?,
        None => rest.split(' ').next()?,
    };
    let words: Vec<&str> = text.split(' ').collect();
    let word = match words.first() {
        Some(w) if w.contains('/') => *w,
        _ => words
            .windows(2)
            .find(|w| matches!(w[0], "for" | "to") && w[1].contains('/'))
            .map(|w| w[1])?,
    };
    let service = word.split_once(':').map_or(word, |(s, _)| s);
    service.contains('/').then_some(service)
}

/// A line without the counters `iptables-save -c` puts before each rule (`[3:180] -A …`).
fn rule_text(line: &str) -> &str {
    match line.strip_prefix('[').and_then(|r| r.split_once("] ")) {
        Some((counters, rule)) if counters.bytes().all(|b| b.is_ascii_digit() || b == b':') => rule,
        _ => line,
    }
}

/// The chain a `-A` rule or a `:` declaration is about.
fn line_chain(line: &str) -> Option<&str> {
    let line = rule_text(line);
    if let Some(rest) = line.strip_prefix("-A ") {
        return rest.split(' ').next();
    }
    line.strip_prefix(':')?.split(' ').next()
}

/// The target of a rule's jump (`-j X`, `-g X`).
fn jump(line: &str) -> Option<&str> {
    let at = line.find(" -j ").or_else(|| line.find(" -g "))?;
    line[at + 4..].split(' ').next()
}

/// A per-service chain's kind and hash (`KUBE-SVC-ABC…` → `(Svc, "ABC…")`): the port chains
/// (`KUBE-SVC-`, `KUBE-SVL-`, `KUBE-EXT-`, `KUBE-FW-`, `KUBE-XLB-`) share one hash per service
/// port (`servicePortChainName`, `pkg/proxy/iptables/proxier.go`); an endpoint's `KUBE-SEP-`
/// has its own. `None` for the shared chains.
fn per_service(chain: &str) -> Option<(ChainKind, &str)> {
    service_chain(chain)
}

/// Who a dump's per-service chains belong to: the hashes of the port chains of the Services
/// in scope, and their endpoint chains.
#[derive(Debug, Default)]
struct Owners<'t> {
    hashes: HashSet<&'t str>,
    endpoints: HashSet<&'t str>,
}

impl<'t> Owners<'t> {
    /// Reads the dump once: a port chain belongs to the Service a rule jumping to it (or one
    /// of its own rules) names, and an endpoint chain to the port chain that jumps to it, or
    /// the Service its own rules name.
    fn of(text: &'t str, services: &BTreeSet<String>) -> Owners<'t> {
        let mut o = Owners::default();
        let mut sep_jumps: Vec<(&str, &str)> = Vec::new();
        for line in text.lines().map(rule_text).filter(|l| l.starts_with("-A ")) {
            let Some(chain) = line_chain(line) else {
                continue;
            };
            let named = comment_service(line).map(|s| services.contains(s));
            let target = jump(line);
            let own = per_service(chain);
            if let Some((ChainKind::Sep, sep)) = own {
                if named == Some(true) {
                    o.endpoints.insert(sep);
                }
                continue;
            }
            let to = target.and_then(per_service);
            if let (Some((_, hash)), Some((ChainKind::Sep, sep))) = (own, to) {
                sep_jumps.push((hash, sep));
            }
            let port_chains = [own, to]
                .into_iter()
                .flatten()
                .filter(|(kind, _)| *kind != ChainKind::Sep);
            if named == Some(true) {
                o.hashes.extend(port_chains.map(|(_, hash)| hash));
            }
        }
        for (hash, sep) in sep_jumps {
            if o.hashes.contains(hash) {
                o.endpoints.insert(sep);
            }
        }
        o
    }

    /// Whether a chain is about a Service in scope (`Some(true)`), about another one
    /// (`Some(false)`), or about none (`None`: kube-proxy's skeleton).
    fn chain(&self, chain: &str) -> Option<bool> {
        match per_service(chain)? {
            (ChainKind::Sep, sep) => Some(self.endpoints.contains(sep)),
            (_, hash) => Some(self.hashes.contains(hash)),
        }
    }
}

/// The lines of an `iptables-save` text that concern the Services in `services`, and those
/// that concern no Service, in their order. Per-service chains no rule attributes to a
/// Service are left out: what they are is the whole verify's to say.
pub fn cut_dump(text: &str, services: &BTreeSet<String>) -> String {
    let owners = Owners::of(text, services);
    let mut out = String::with_capacity(text.len().min(1 << 20));
    for full in text.lines() {
        let line = rule_text(full);
        let keep = match line_chain(line) {
            None => true,
            Some(chain) => match owners.chain(chain) {
                Some(ours) => ours,
                // A shared chain's rule: kept unless it is another Service's.
                None if line.starts_with("-A ") => {
                    let by_comment = comment_service(line).map(|s| services.contains(s));
                    let by_jump = jump(line).and_then(|t| owners.chain(t));
                    by_comment.or(by_jump).unwrap_or(true)
                }
                None => true,
            },
        };
        if keep {
            out.push_str(full);
            out.push('\n');
        }
    }
    out
}

/// A verify of some Services of a node.
#[derive(Debug)]
pub struct ScopedVerify<'a> {
    /// The Services (`namespace/name`).
    pub services: &'a BTreeSet<String>,
    /// The whole API state (only the Services' part is read).
    pub state: &'a ClusterState,
    /// Whether the whole state puts kube-proxy in large-cluster mode (more than 1,000
    /// endpoints: no comments on endpoint rules), as the last whole verify's plan says: the
    /// Services' part alone would not.
    pub large_cluster: bool,
}

impl ScopedVerify<'_> {
    /// The findings of the Services' ports: what [`verify`] of the whole node finds for them,
    /// ungrouped. `input`'s dumps are the whole node's, its plans are replaced.
    pub fn findings(&self, input: &VerifyInput<'_>) -> Result<Vec<Finding>, VerifyError> {
        let state = cut_state(self.state, self.services);
        let texts: Vec<String> = input
            .dumps
            .iter()
            .map(|d| cut_dump(d.text, self.services))
            .collect();
        let dumps: Vec<DumpText<'_>> = input
            .dumps
            .iter()
            .zip(&texts)
            .map(|(d, text)| DumpText {
                label: d.label,
                text,
                family: d.family,
            })
            .collect();
        let mut plans = NodePlans::new(&state, input.config, input.facts, &dumps);
        plans.set_large_cluster(self.large_cluster);
        let cut = VerifyInput {
            node: input.node,
            plans,
            config: input.config,
            facts: input.facts,
            dumps,
            legacy: None,
            nft_ruleset: None,
            parse: input.parse.clone(),
            group_alike: false,
        };
        let report = verify(&cut)?;
        Ok(report
            .findings
            .into_iter()
            .filter(|f| {
                f.service.as_deref().is_some_and(|port| {
                    let service = port.split_once(':').map_or(port, |(s, _)| s);
                    self.services.contains(service)
                })
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_name_their_service() {
        let rule = |c: &str| format!("-A KUBE-SERVICES -m comment --comment \"{c}\" -j X");
        assert_eq!(
            comment_service(&rule("shop/web:http cluster IP")),
            Some("shop/web")
        );
        assert_eq!(
            comment_service(&rule(
                "masquerade traffic for shop/web:http external destinations"
            )),
            Some("shop/web")
        );
        assert_eq!(
            comment_service(&rule(
                "other traffic to shop/web:https will be dropped by KUBE-PROXY-FIREWALL"
            )),
            Some("shop/web")
        );
        assert_eq!(comment_service(&rule("kubernetes service portals")), None);
        assert_eq!(
            comment_service("-A KUBE-SEP-X -m comment --comment shop/web:http -j DNAT"),
            Some("shop/web")
        );
        assert_eq!(comment_service("-A KUBE-SEP-X -j DNAT"), None);
    }
}

#[cfg(test)]
mod equality {
    use super::*;
    use crate::compare::fixture::read;
    use crate::state::ip::IpFamily;
    use kproxy_parsers::iptables::ParseOptions;

    /// The whole verify's findings of `dump` and each Service's own verify, which must find
    /// the same for its ports (in the same order), for every Service of the testdata cluster
    /// and for all of them at once.
    fn same_findings(dump: &str) -> usize {
        let state = crate::state::load::from_str(&read("testdata/cluster/state.json"), "state")
            .expect("state");
        let (config, _) =
            crate::state::config::parse(&read("testdata/cluster/config.yaml"), "config")
                .expect("config");
        let args = crate::state::node::NodeInputs {
            family: Some(IpFamily::V4),
            nfacct: Some(Vec::new()),
            ..Default::default()
        };
        let (facts, _) = crate::state::node::build(&args, &state, &config).expect("facts");
        let dumps = vec![DumpText {
            label: "iptables-save",
            text: dump,
            family: IpFamily::V4,
        }];
        let input = VerifyInput {
            node: "node-1",
            plans: NodePlans::new(&state, &config, &facts, &dumps),
            config: &config,
            facts: &facts,
            dumps,
            legacy: None,
            nft_ruleset: None,
            parse: ParseOptions::default(),
            group_alike: false,
        };
        let whole = verify(&input).expect("verify").findings;
        let large_cluster = input.plans.large_cluster();
        let names: Vec<String> = state
            .services
            .iter()
            .map(|s| {
                format!(
                    "{}/{}",
                    s.metadata.namespace.as_deref().unwrap_or_default(),
                    s.metadata.name.as_deref().unwrap_or_default()
                )
            })
            .collect();
        let mut scopes: Vec<BTreeSet<String>> =
            names.iter().map(|n| BTreeSet::from([n.clone()])).collect();
        scopes.push(names.iter().cloned().collect());
        let mut compared = 0;
        for services in &scopes {
            let of_scope = |f: &&Finding| {
                f.service
                    .as_deref()
                    .is_some_and(|p| services.contains(p.split_once(':').map_or(p, |(s, _)| s)))
            };
            let expected: Vec<&Finding> = whole.iter().filter(of_scope).collect();
            let scoped = ScopedVerify {
                services,
                state: &state,
                large_cluster,
            }
            .findings(&input)
            .expect("scoped verify");
            let got: Vec<&Finding> = scoped.iter().collect();
            assert_eq!(got, expected, "services {services:?}");
            compared += expected.len();
        }
        compared
    }

    #[test]
    fn so_it_does_with_any_one_rule_missing_or_twice() {
        let clean = read("testdata/dumps/cluster.nft.save");
        let lines: Vec<&str> = clean.lines().collect();
        let mut compared = 0;
        for (i, line) in lines.iter().enumerate() {
            if !line.starts_with("-A KUBE-") {
                continue;
            }
            let mut cut: Vec<&str> = lines.clone();
            cut.remove(i);
            compared += same_findings(&(cut.join("\n") + "\n"));
            let mut twice: Vec<&str> = lines.clone();
            twice.insert(i, line);
            compared += same_findings(&(twice.join("\n") + "\n"));
        }
        assert!(compared > 100, "{compared}");
    }

    #[test]
    fn a_services_own_verify_finds_what_the_whole_one_finds_for_it() {
        // The drifted node has findings on several Services' ports: they must all be compared.
        assert!(same_findings(&read("testdata/dumps/drifted.nft-c.save")) > 4);
        same_findings(&read("testdata/dumps/cluster.nft.save"));
    }
}
