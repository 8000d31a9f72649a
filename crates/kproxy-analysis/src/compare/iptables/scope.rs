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

use super::run::{DumpText, NodePlans, VerifyError, VerifyInput, verify};
use crate::compare::finding::Finding;
use crate::compare::left_out::{LeftOutService, NotChecked};
use crate::graph::ownership::{ChainKind, service_chain};
use crate::state::ClusterState;
use std::collections::{BTreeSet, HashMap};

/// The Services of `state` named in `services` (`namespace/name`), their EndpointSlices, and
/// everything node-wide (Nodes, ServiceCIDRs): what kube-proxy reads for those Services.
pub fn cut_state(state: &ClusterState, services: &BTreeSet<String>) -> ClusterState {
    // The objects of these Services left out as invalid: their rules are not judged here
    // either, as the whole verify does not judge them.
    let invalid = state
        .invalid
        .iter()
        .filter(|o| {
            crate::compare::left_out::owning_service(o).is_some_and(|s| services.contains(&s))
        })
        .cloned()
        .collect();
    crate::compare::left_out::with_services(state, |s| services.contains(s), invalid)
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
    let mut words = text.split(' ');
    let first = words.next()?;
    let word = if first.contains('/') {
        first
    } else {
        let mut previous = first;
        let mut found = None;
        for w in words {
            if matches!(previous, "for" | "to") && w.contains('/') {
                found = Some(w);
                break;
            }
            previous = w;
        }
        found?
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

/// Adds `item` to `list` unless it is there (the lists hold one or two Services).
fn add<'t>(list: &mut Vec<&'t str>, item: &'t str) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// A dump's lines by the Service they concern, made once per read of the node and cut for any
/// set of Services at a cost that grows with what they hold, not with the dump.
#[derive(Debug)]
pub struct DumpIndex<'t> {
    lines: Vec<&'t str>,
    /// The lines that concern no Service: table headers, declarations and rules of the shared
    /// chains that name none (kube-proxy's skeleton), `COMMIT`.
    common: Vec<u32>,
    /// The lines of each Service (`namespace/name`).
    by_service: HashMap<&'t str, Vec<u32>>,
}

impl<'t> DumpIndex<'t> {
    /// Reads `text` (an `iptables-save`, with or without counters) in two passes. A port chain
    /// belongs to the Services the rules jumping to it, or its own rules, name; an endpoint
    /// chain to those of the port chains jumping to it, or that its own rules name; a shared
    /// chain's rule to the Service its comment names, else to the owners of the chain it
    /// jumps to. Per-service chains no rule attributes to a Service belong to none and are in
    /// no cut: what they are is the whole verify's to say.
    pub fn new(text: &'t str) -> DumpIndex<'t> {
        DumpIndex::seeded(text, &[])
    }

    /// [`DumpIndex::new`], with port chains also owned by the Service whose port hash names
    /// them (`seeds`: hash, `namespace/name`), whatever the rules say: a Service known only by
    /// its object ([`crate::compare::left_out::LeftOutService::port_chain_hashes`]).
    pub fn seeded(text: &'t str, seeds: &[(&'t str, &'t str)]) -> DumpIndex<'t> {
        let lines: Vec<&'t str> = text.lines().collect();
        let mut port_owners: HashMap<&'t str, Vec<&'t str>> = HashMap::new();
        for &(hash, service) in seeds {
            add(port_owners.entry(hash).or_default(), service);
        }
        let mut endpoint_owners: HashMap<&'t str, Vec<&'t str>> = HashMap::new();
        let mut endpoint_jumps: Vec<(&'t str, &'t str)> = Vec::new();
        for line in lines.iter().map(|l| rule_text(l)) {
            if !line.starts_with("-A ") {
                continue;
            }
            let Some(chain) = line_chain(line) else {
                continue;
            };
            let named = comment_service(line);
            let own = per_service(chain);
            if let Some((ChainKind::Sep, sep)) = own {
                if let Some(s) = named {
                    add(endpoint_owners.entry(sep).or_default(), s);
                }
                continue;
            }
            let to = jump(line).and_then(per_service);
            if let (Some((_, hash)), Some((ChainKind::Sep, sep))) = (own, to) {
                endpoint_jumps.push((hash, sep));
            }
            if let Some(s) = named {
                for (kind, hash) in [own, to].into_iter().flatten() {
                    if kind != ChainKind::Sep {
                        add(port_owners.entry(hash).or_default(), s);
                    }
                }
            }
        }
        for (hash, sep) in endpoint_jumps {
            for s in port_owners.get(hash).into_iter().flatten() {
                add(endpoint_owners.entry(sep).or_default(), s);
            }
        }
        let chain_owners = |chain: &str| -> Option<&Vec<&'t str>> {
            match per_service(chain)? {
                (ChainKind::Sep, sep) => endpoint_owners.get(sep),
                (_, hash) => port_owners.get(hash),
            }
        };
        let orphan: Vec<&'t str> = Vec::new();
        let mut common = Vec::new();
        let mut by_service: HashMap<&'t str, Vec<u32>> = HashMap::new();
        for (i, full) in lines.iter().enumerate() {
            let at = u32::try_from(i).unwrap_or(u32::MAX);
            let line = rule_text(full);
            let owners: Option<&Vec<&'t str>> = match line_chain(line) {
                None => None,
                Some(chain) if per_service(chain).is_some() => {
                    Some(chain_owners(chain).unwrap_or(&orphan))
                }
                Some(_) if line.starts_with("-A ") => match comment_service(line) {
                    Some(s) => {
                        by_service.entry(s).or_default().push(at);
                        continue;
                    }
                    None => match jump(line).filter(|t| per_service(t).is_some()) {
                        Some(target) => Some(chain_owners(target).unwrap_or(&orphan)),
                        None => None,
                    },
                },
                Some(_) => None,
            };
            match owners {
                None => common.push(at),
                Some(owners) => {
                    for s in owners {
                        by_service.entry(s).or_default().push(at);
                    }
                }
            }
        }
        DumpIndex {
            lines,
            common,
            by_service,
        }
    }

    /// The lines that concern the Services in `services`, and those that concern no Service,
    /// in their order.
    pub fn cut(&self, services: &BTreeSet<String>) -> String {
        let mut picked: Vec<u32> = self.common.clone();
        for s in services {
            picked.extend(self.by_service.get(s.as_str()).into_iter().flatten());
        }
        picked.sort_unstable();
        picked.dedup();
        let mut out = String::new();
        for i in picked {
            if let Some(line) = self.lines.get(i as usize) {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }
}

impl<'t> DumpIndex<'t> {
    /// The lines that concern any of `services`, in their order.
    fn owned_by(&self, services: &BTreeSet<String>) -> Vec<u32> {
        let mut picked: Vec<u32> = services
            .iter()
            .flat_map(|s| self.by_service.get(s.as_str()).into_iter().flatten())
            .copied()
            .collect();
        picked.sort_unstable();
        picked.dedup();
        picked
    }

    /// What the lines (those `within` accepts) hold of each Service: its chains (declarations of per-service
    /// chains) and its rules in shared chains.
    fn counted(
        &self,
        services: &BTreeSet<String>,
        within: impl Fn(usize) -> bool,
    ) -> Vec<NotChecked> {
        services
            .iter()
            .filter_map(|s| {
                let lines = self.by_service.get(s.as_str())?;
                let mut n = NotChecked {
                    service: s.clone(),
                    ..NotChecked::default()
                };
                for &i in lines.iter().filter(|&&i| within(i as usize)) {
                    let line = rule_text(self.lines.get(i as usize)?);
                    match line_chain(line) {
                        Some(chain) if line.starts_with(':') => {
                            n.chains += usize::from(per_service(chain).is_some());
                        }
                        Some(chain) if per_service(chain).is_none() => n.objects += 1,
                        _ => {}
                    }
                }
                (n.chains + n.objects > 0).then_some(n)
            })
            .collect()
    }

    /// The dump without the lines that concern `services` (verify judges the rest), and what
    /// was taken out of it per Service.
    pub fn without(&self, services: &BTreeSet<String>) -> (String, Vec<NotChecked>) {
        let dropped = self.owned_by(services);
        let mut out = String::new();
        let mut next = dropped.iter().peekable();
        for (i, line) in self.lines.iter().enumerate() {
            if next.peek().is_some_and(|&&d| d as usize == i) {
                next.next();
                continue;
            }
            out.push_str(line);
            out.push('\n');
        }
        (out, self.counted(services, |_| true))
    }

    /// `expected` (an `iptables-restore` text of whole tables, as the render writes it) with
    /// this dump's lines of `services` added, as they are on the node: their chains declared
    /// and filled, their rules in shared chains put before the expected ones (in nat
    /// `KUBE-SERVICES` so before the `KUBE-NODEPORTS` tail). A plan against the node then
    /// neither deletes nor changes them. Tables `expected` does not write are left out of it.
    /// Also what was added per Service.
    pub fn kept_in(
        &self,
        expected: &str,
        services: &BTreeSet<String>,
    ) -> (String, Vec<NotChecked>) {
        let owned = self.owned_by(services);
        if owned.is_empty() {
            return (expected.to_string(), Vec::new());
        }
        // The node's lines by table: declarations, and rules by chain in their order.
        let mut declared: HashMap<&str, Vec<&str>> = HashMap::new();
        let mut rules: HashMap<(&str, &str), Vec<&str>> = HashMap::new();
        let mut table = "";
        let mut next = owned.iter().peekable();
        for (i, full) in self.lines.iter().enumerate() {
            let line = rule_text(full);
            if let Some(t) = line.strip_prefix('*') {
                table = t.trim();
            }
            if next.peek().is_none_or(|&&o| o as usize != i) {
                continue;
            }
            next.next();
            match line_chain(line) {
                Some(chain) if line.starts_with(':') => {
                    declared.entry(table).or_default().push(chain);
                }
                Some(chain) => rules.entry((table, chain)).or_default().push(line),
                None => {}
            }
        }
        let expected_declares: BTreeSet<(&str, &str)> = {
            let mut t = "";
            let mut set = BTreeSet::new();
            for line in expected.lines() {
                if let Some(name) = line.strip_prefix('*') {
                    t = name.trim();
                } else if let Some(chain) = line_chain(line).filter(|_| line.starts_with(':')) {
                    set.insert((t, chain));
                }
            }
            set
        };
        let mut out = String::with_capacity(expected.len());
        let put = |out: &mut String, line: &str| {
            out.push_str(line);
            out.push('\n');
        };
        let mut written: BTreeSet<(&str, &str)> = BTreeSet::new();
        let mut table = "";
        for line in expected.lines() {
            if let Some(name) = line.strip_prefix('*') {
                table = name.trim();
                put(&mut out, line);
                for chain in declared.get(table).into_iter().flatten() {
                    if !expected_declares.contains(&(table, *chain)) {
                        put(&mut out, &format!(":{chain} - [0:0]"));
                    }
                }
                continue;
            }
            let chain = line_chain(line).filter(|_| line.starts_with("-A "));
            if line.trim() == "COMMIT" {
                let mut rest: Vec<(&(&str, &str), &Vec<&str>)> = rules
                    .iter()
                    .filter(|(k, _)| k.0 == table && !written.contains(*k))
                    .collect();
                rest.sort_by_key(|(k, lines)| (lines.first().copied(), **k));
                for (k, lines) in rest {
                    written.insert(*k);
                    for l in lines {
                        put(&mut out, l);
                    }
                }
            } else if let Some(chain) = chain
                && written.insert((table, chain))
            {
                for l in rules.get(&(table, chain)).into_iter().flatten() {
                    put(&mut out, l);
                }
            }
            put(&mut out, line);
        }
        // What a table the render does not write holds is neither kept nor counted.
        let kept_tables: BTreeSet<&str> = expected
            .lines()
            .filter_map(|l| l.strip_prefix('*'))
            .map(str::trim)
            .collect();
        let mut table = "";
        let in_kept: Vec<bool> = self
            .lines
            .iter()
            .map(|l| {
                if let Some(name) = rule_text(l).strip_prefix('*') {
                    table = name.trim();
                }
                kept_tables.contains(table)
            })
            .collect();
        let counted = self.counted(services, |i| in_kept.get(i).copied().unwrap_or(false));
        (out, counted)
    }
}

/// The Services of `left_out` by name, and the hashes of their port chains as seeds of a
/// [`DumpIndex::seeded`].
fn left_out_seeds(left_out: &[LeftOutService]) -> (BTreeSet<String>, Vec<(String, &str)>) {
    let services = left_out.iter().map(|l| l.service.clone()).collect();
    let hashes = left_out
        .iter()
        .flat_map(|l| {
            l.port_chain_hashes()
                .into_iter()
                .map(move |h| (h, l.service.as_str()))
        })
        .collect();
    (services, hashes)
}

/// `text` (an `iptables-save`) without the rules of the Services in `left_out`, and what was
/// taken out per Service ([`DumpIndex::without`]).
pub fn without_left_out(text: &str, left_out: &[LeftOutService]) -> (String, Vec<NotChecked>) {
    let (services, hashes) = left_out_seeds(left_out);
    let seeds: Vec<(&str, &str)> = hashes.iter().map(|(h, s)| (h.as_str(), *s)).collect();
    DumpIndex::seeded(text, &seeds).without(&services)
}

/// `expected` with `current`'s rules of the Services in `left_out` kept as they are, and what
/// was kept per Service ([`DumpIndex::kept_in`]).
pub fn keep_left_out(
    expected: &str,
    current: &str,
    left_out: &[LeftOutService],
) -> (String, Vec<NotChecked>) {
    if left_out.is_empty() {
        return (expected.to_string(), Vec::new());
    }
    let (services, hashes) = left_out_seeds(left_out);
    let seeds: Vec<(&str, &str)> = hashes.iter().map(|(h, s)| (h.as_str(), *s)).collect();
    DumpIndex::seeded(current, &seeds).kept_in(expected, &services)
}

/// [`DumpIndex::cut`] of `text`, for one cut.
pub fn cut_dump(text: &str, services: &BTreeSet<String>) -> String {
    DumpIndex::new(text).cut(services)
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
    /// ungrouped. `input`'s dumps are the whole node's, its plans are replaced; `indexes` are
    /// theirs ([`DumpIndex::new`] of each, in their order), made once for many verifies (when
    /// they are not one per dump, the dumps are indexed now).
    pub fn findings(
        &self,
        input: &VerifyInput<'_>,
        indexes: &[DumpIndex<'_>],
    ) -> Result<Vec<Finding>, VerifyError> {
        let state = cut_state(self.state, self.services);
        let texts: Vec<String> = if indexes.len() == input.dumps.len() {
            indexes.iter().map(|i| i.cut(self.services)).collect()
        } else {
            input
                .dumps
                .iter()
                .map(|d| cut_dump(d.text, self.services))
                .collect()
        };
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
mod left_out {
    use super::*;
    use crate::compare::fixture::read;
    use crate::compare::left_out::WrittenPort;

    fn web() -> LeftOutService {
        let port = |name: &str, port| WrittenPort {
            name: name.into(),
            protocol: "TCP".into(),
            port: Some(port),
            node_port: None,
        };
        LeftOutService {
            service: "shop/web".into(),
            ports: vec![port("http", 80), port("https", 443)],
            cluster_ips: Vec::new(),
        }
    }

    /// The dump's lines without counters and comments, sorted.
    fn sorted(text: &str) -> Vec<String> {
        let mut v: Vec<String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| rule_text(l).to_string())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_left_out_services_chains_and_shared_rules_are_taken_out_and_counted() {
        let dump = read("testdata/dumps/cluster.nft.save");
        let (rest, counts) = without_left_out(&dump, &[web()]);
        assert!(!rest.contains("shop/web:"), "{rest}");
        assert!(!rest.contains("KUBE-SVC-67NZLRHBNDSAWJRO"), "{rest}");
        // Another Service whose name starts alike keeps its rules.
        assert!(rest.contains("shop/web-nodeport:http"), "{rest}");
        let gone = dump.lines().count() - rest.lines().count();
        assert_eq!(
            counts,
            [NotChecked {
                service: "shop/web".into(),
                chains: 8,
                objects: 2,
            }]
        );
        // Each chain is a declaration and its rules: more lines than chains and objects.
        assert!(gone > 10, "{gone}");
    }

    #[test]
    fn the_port_hash_finds_chains_no_comment_names() {
        // Without the KUBE-SERVICES rules that name the Service, its chains are known only by
        // the hash of its ports.
        let dump = read("testdata/dumps/cluster.nft.save");
        let uncommented = |l: &str| -> String {
            match l.find("-m comment --comment \"shop/web:") {
                Some(at) => {
                    let end = l[at + 22..]
                        .find("\" ")
                        .map_or(l.len(), |e| at + 22 + e + 2);
                    format!("{}{}", &l[..at], &l[end..])
                }
                None => l.to_string(),
            }
        };
        let unnamed: String = dump
            .lines()
            .filter(|l| !(l.starts_with("-A KUBE-SERVICES") && l.contains("shop/web:")))
            .map(|l| format!("{}\n", uncommented(l)))
            .collect();
        assert!(!unnamed.contains("shop/web:"), "{unnamed}");
        let (rest, counts) = without_left_out(&unnamed, &[web()]);
        assert!(!rest.contains("KUBE-SVC-67NZLRHBNDSAWJRO"), "{rest}");
        assert!(!rest.contains("KUBE-SVC-UB7LXFC7TRMUABOP"), "{rest}");
        assert_eq!(counts.first().map(|n| n.chains), Some(8));
        // The comment-less index alone leaves them to the whole verify.
        let index = DumpIndex::new(&unnamed);
        let (rest, _) = index.without(&BTreeSet::from(["shop/web".to_string()]));
        assert!(rest.contains("KUBE-SVC-67NZLRHBNDSAWJRO"));
    }

    #[test]
    fn kept_in_gives_back_the_nodes_rules_of_the_service() {
        let dump = read("testdata/dumps/cluster.nft.save");
        // What a render without the Service would be: the node's other rules.
        let (expected, _) = without_left_out(&dump, &[web()]);
        let (kept, counts) = keep_left_out(&expected, &dump, &[web()]);
        assert_eq!(sorted(&kept), sorted(&dump));
        assert_eq!(counts.first().map(|n| (n.chains, n.objects)), Some((8, 2)));
        // The nodeports tail stays the last rule of nat KUBE-SERVICES.
        let last = kept
            .lines()
            .rfind(|l| l.starts_with("-A KUBE-SERVICES"))
            .expect("rules");
        assert!(last.contains("KUBE-NODEPORTS"), "{last}");
        // Nothing to keep: the render as it is.
        let (same, none) = keep_left_out(&expected, &dump, &[]);
        assert_eq!(same, expected);
        assert!(none.is_empty());
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
        let indexes: Vec<DumpIndex<'_>> =
            input.dumps.iter().map(|d| DumpIndex::new(d.text)).collect();
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
            .findings(&input, &indexes)
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
