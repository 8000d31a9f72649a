//! Mass drift made readable: findings that differ only in the service port, chain or addresses
//! they name (a kube-proxy release that writes rules differently, a changed masquerade bit,
//! comments on or off) become one finding per cause, with how many there were, how many chains
//! they touch and a few examples. `verify --all-findings` keeps them one by one.

use super::finding::{Finding, FindingGroup, GroupExample};
use super::report::thousands;
use std::collections::{HashMap, HashSet};

/// Findings of one cause from which they are reported as one: below, each is shown (a few rules
/// edited by hand read better one by one).
pub const GROUP_FROM: usize = 50;

/// Examples kept in a group finding.
const EXAMPLES: usize = 3;

/// Replaces each set of at least [`GROUP_FROM`] findings of one cause by one finding (where the
/// first of them was); returns the findings and how many were folded into groups.
pub fn group(findings: Vec<Finding>) -> (Vec<Finding>, usize) {
    let keys: Vec<Cause> = findings.iter().map(Cause::of).collect();
    let mut sizes: HashMap<&Cause, usize> = HashMap::new();
    for k in &keys {
        *sizes.entry(k).or_default() += 1;
    }
    if sizes.values().all(|&n| n < GROUP_FROM) {
        return (findings, 0);
    }
    let mut members: HashMap<&Cause, Vec<Finding>> = HashMap::new();
    // Each group's place: the position of its first member.
    let mut order: Vec<Result<Finding, &Cause>> = Vec::new();
    let mut folded = 0;
    for (f, k) in findings.into_iter().zip(&keys) {
        if sizes.get(k).copied().unwrap_or(0) < GROUP_FROM {
            order.push(Ok(f));
            continue;
        }
        let list = members.entry(k).or_default();
        if list.is_empty() {
            order.push(Err(k));
        }
        list.push(f);
        folded += 1;
    }
    let out = order
        .into_iter()
        .filter_map(|slot| match slot {
            Ok(f) => Some(f),
            Err(k) => members.remove(k).map(|list| k.finding(list)),
        })
        .collect();
    (out, folded)
}

/// What findings of one cause share.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Cause {
    id: &'static str,
    severity: super::finding::Severity,
    /// The chain with its hash left out (`nat KUBE-SEP-…`).
    chain_kind: Option<String>,
    hint: Option<String>,
    what: What,
}

/// How findings of one cause differ from what kube-proxy writes.
#[derive(Debug, PartialEq, Eq, Hash)]
enum What {
    /// A rule with words the expected one lacks (`added`) or without words it has (`removed`),
    /// addresses, names and hashes left out.
    Rule { removed: String, added: String },
    /// Any other finding: its texts with the service port, chain, addresses and hashes left out.
    Other {
        message: String,
        expected: Option<String>,
        actual: Option<String>,
    },
}

impl Cause {
    fn of(f: &Finding) -> Cause {
        let what = match (f.expected.as_deref(), f.actual.as_deref()) {
            (Some(e), Some(a)) if is_rule(e) && is_rule(a) => {
                let (e, a) = (options(e), options(a));
                let same_start = e.iter().zip(&a).take_while(|(x, y)| x == y).count();
                let rest = e.len().min(a.len()) - same_start;
                let same_end = e
                    .iter()
                    .rev()
                    .zip(a.iter().rev())
                    .take(rest)
                    .take_while(|(x, y)| x == y)
                    .count();
                let middle = |o: &[Vec<&str>]| {
                    o.get(same_start..o.len() - same_end)
                        .unwrap_or_default()
                        .iter()
                        .flatten()
                        .map(|w| general(w))
                        .collect::<Vec<_>>()
                        .join(" ")
                };
                What::Rule {
                    removed: middle(&e),
                    added: middle(&a),
                }
            }
            _ => {
                let text = |t: &str| {
                    let mut t = t.to_string();
                    if let Some(s) = &f.service {
                        t = t.replace(s.as_str(), "<service>");
                    }
                    t.split(' ').map(general).collect::<Vec<_>>().join(" ")
                };
                What::Other {
                    message: text(&f.message),
                    expected: f.expected.as_deref().map(text),
                    actual: f.actual.as_deref().map(text),
                }
            }
        };
        Cause {
            id: f.id,
            severity: f.severity,
            chain_kind: f
                .chain
                .as_deref()
                .map(|c| c.split(' ').map(general).collect::<Vec<_>>().join(" ")),
            hint: f.hint.clone(),
            what,
        }
    }

    /// The finding that stands for `list` (all of this cause, in report order).
    fn finding(&self, list: Vec<Finding>) -> Finding {
        let count = list.len();
        let chains = list
            .iter()
            .filter_map(|f| f.chain.as_deref())
            .collect::<HashSet<_>>()
            .len();
        let services = list
            .iter()
            .filter_map(|f| f.service.as_deref())
            .collect::<HashSet<_>>()
            .len();
        let kind = self.chain_kind.as_deref().unwrap_or("kube-proxy");
        let message = match &self.what {
            What::Rule { removed, added } => {
                let rules = format!(
                    "{} rules in {} {kind} chains",
                    thousands(count),
                    thousands(chains)
                );
                match (removed.is_empty(), added.is_empty()) {
                    (true, _) => format!(
                        "{rules} carry `{added}`, which this kube-proxy version does not write: rules written by another kube-proxy version?"
                    ),
                    (false, true) => format!(
                        "{rules} lack `{removed}`, which this kube-proxy version writes: rules written by another kube-proxy version?"
                    ),
                    (false, false) => format!(
                        "{rules} have `{added}` where this kube-proxy version writes `{removed}`: rules written by another kube-proxy version, or a changed setting?"
                    ),
                }
            }
            What::Other { message, .. } => format!(
                "{} findings alike in {} chains and {} service ports: {message}",
                thousands(count),
                thousands(chains),
                thousands(services)
            ),
        };
        // The first findings of distinct chains (or service ports).
        let mut seen = HashSet::new();
        let examples: Vec<GroupExample> = list
            .iter()
            .filter(|f| seen.insert((f.chain.as_deref(), f.service.as_deref())))
            .take(EXAMPLES)
            .map(|f| GroupExample {
                service: f.service.clone(),
                chain: f.chain.clone(),
                expected: f.expected.clone(),
                actual: f.actual.clone(),
            })
            .collect();
        let named: Vec<&str> = examples
            .iter()
            .filter_map(|e| e.chain.as_deref().or(e.service.as_deref()))
            .collect();
        let mut message = message;
        if !named.is_empty() {
            message.push_str(&format!(" (e.g. {})", named.join(", ")));
        }
        let mut list = list.into_iter();
        let Some(first) = list.next() else {
            unreachable!("a cause has at least one finding");
        };
        Finding {
            service: None,
            chain: self.chain_kind.clone(),
            message,
            hint: Some(match &first.hint {
                Some(h) => format!("{h} (--all-findings lists each finding)"),
                None => "--all-findings lists each finding".to_string(),
            }),
            group: Some(Box::new(FindingGroup {
                count,
                chains,
                services,
                examples,
            })),
            ..first
        }
    }
}

/// `-A CHAIN …` or `-I CHAIN …`: a rule as iptables-save prints it.
fn is_rule(text: &str) -> bool {
    text.starts_with("-A ") || text.starts_with("-I ")
}

/// The options of a rule, each a word starting with `-` and the words up to the next such word
/// (`-m comment`, `--comment "…"`, `! -s 10.0.0.1`): rules are compared option by option, so an
/// added match reads as itself, not as a shifted run of words.
fn options(rule: &str) -> Vec<Vec<&str>> {
    let mut out: Vec<Vec<&str>> = Vec::new();
    for w in words(rule) {
        match out.last_mut() {
            Some(last) if w != "!" && (!w.starts_with('-') || *last == ["!"]) => last.push(w),
            _ => out.push(vec![w]),
        }
    }
    out
}

/// The words of a rule; a double-quoted comment is one word.
fn words(rule: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = rule.trim_start();
    while !rest.is_empty() {
        let end = if rest.starts_with('"') {
            rest.get(1..)
                .and_then(|r| r.find('"'))
                .map_or(rest.len(), |i| i + 2)
        } else {
            rest.find(' ').unwrap_or(rest.len())
        };
        let (word, tail) = rest.split_at(end);
        out.push(word);
        rest = tail.trim_start();
    }
    out
}

/// A word with what differs between service ports left out: a chain's hash (`KUBE-SEP-…`), a
/// quoted text (`"…"`), an address, network or `address:port` (`<address>`).
fn general(word: &str) -> String {
    if word.starts_with('"') {
        return "\"…\"".to_string();
    }
    if let Some((prefix, hash)) = word.rsplit_once('-')
        && prefix.starts_with("KUBE-")
        && hash.len() == 16
        && hash
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    {
        return format!("{prefix}-…");
    }
    let host = word.split('/').next().unwrap_or(word);
    let host = host.trim_start_matches('[');
    let is_address = host.parse::<std::net::IpAddr>().is_ok()
        || host.rsplit_once(':').is_some_and(|(h, p)| {
            h.trim_end_matches(']').parse::<std::net::IpAddr>().is_ok() && p.parse::<u16>().is_ok()
        });
    if is_address {
        "<address>".to_string()
    } else {
        word.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::catalogue as cat;

    /// A `KUBE-SEP-…` rule of endpoint `n` as kube-proxy writes it, and with a comment.
    fn sep_rule(n: usize) -> (String, String, String) {
        let chain = format!("KUBE-SEP-{n:016}");
        let ip = format!("10.64.{}.{}", n / 250, n % 250 + 1);
        (
            format!("nat {chain}"),
            format!("-A {chain} -s {ip}/32 -j KUBE-MARK-MASQ"),
            format!(
                "-A {chain} -s {ip}/32 -m comment --comment \"ns/svc-{n}:http\" -j KUBE-MARK-MASQ"
            ),
        )
    }

    fn changed(chain: &str, expected: &str, actual: &str) -> Finding {
        cat::RULE_CHANGED
            .finding(format!(
                "a rule of {chain} differs from what kube-proxy writes"
            ))
            .chain(chain)
            .expected(expected)
            .actual(actual)
    }

    #[test]
    fn many_rules_with_one_extra_comment_are_one_finding() {
        let findings: Vec<Finding> = (0..300)
            .map(|n| {
                let (chain, e, a) = sep_rule(n);
                changed(&chain, &e, &a)
            })
            .collect();
        let (out, folded) = group(findings);
        assert_eq!(folded, 300);
        assert_eq!(out.len(), 1);
        let f = &out[0];
        assert_eq!(f.id, "KP903");
        assert_eq!(
            f.message,
            "300 rules in 300 nat KUBE-SEP-… chains carry `-m comment --comment \"…\"`, which this kube-proxy version does not write: rules written by another kube-proxy version? (e.g. nat KUBE-SEP-0000000000000000, nat KUBE-SEP-0000000000000001, nat KUBE-SEP-0000000000000002)"
        );
        assert_eq!(f.chain.as_deref(), Some("nat KUBE-SEP-…"));
        let g = f.group.as_deref().unwrap_or_else(|| panic!("a group"));
        assert_eq!((g.count, g.chains, g.services), (300, 300, 0));
        assert_eq!(g.examples.len(), EXAMPLES);
        assert_eq!(
            g.examples[0].chain.as_deref(),
            Some("nat KUBE-SEP-0000000000000000")
        );
        assert_eq!(f.expected.as_deref(), Some(sep_rule(0).1.as_str()));
    }

    #[test]
    fn few_findings_and_different_causes_stay_as_they_are() {
        let mut findings: Vec<Finding> = (0..GROUP_FROM - 1)
            .map(|n| {
                let (chain, e, a) = sep_rule(n);
                changed(&chain, &e, &a)
            })
            .collect();
        // Another cause: a masquerade mark changed, on as many rules.
        findings.extend((0..GROUP_FROM - 1).map(|n| {
            let chain = format!("nat KUBE-SEP-{n:016}");
            changed(
                &chain,
                "-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000",
                "-A KUBE-MARK-MASQ -j MARK --or-mark 0x8000",
            )
        }));
        let before = findings.clone();
        assert_eq!(group(findings), (before, 0));
    }

    #[test]
    fn a_changed_value_names_both_sides_and_other_findings_keep_their_place() {
        let mut findings = vec![cat::CANARY_MISSING.finding("no canary")];
        findings.extend((0..GROUP_FROM).map(|n| {
            changed(
                &format!("nat KUBE-SVC-{n:016}"),
                &format!("-A KUBE-SVC-{n:016} -j MARK --or-mark 0x4000"),
                &format!("-A KUBE-SVC-{n:016} -j MARK --or-mark 0x8000"),
            )
        }));
        findings.push(cat::ORPHAN_CHAIN.finding("left over"));
        let (out, folded) = group(findings);
        assert_eq!(folded, GROUP_FROM);
        let ids: Vec<_> = out.iter().map(|f| f.id).collect();
        assert_eq!(
            ids,
            [
                cat::CANARY_MISSING.id,
                cat::RULE_CHANGED.id,
                cat::ORPHAN_CHAIN.id
            ]
        );
        assert!(
            out[1]
                .message
                .starts_with(&format!("{GROUP_FROM} rules in {GROUP_FROM} nat KUBE-SVC-… chains have `--or-mark 0x8000` where this kube-proxy version writes `--or-mark 0x4000`")),
            "{}",
            out[1].message
        );
        assert_eq!(out[0].message, "no canary");
        assert_eq!(out[2].message, "left over");
    }

    #[test]
    fn general_words_leave_out_what_differs_per_port() {
        assert_eq!(general("KUBE-SEP-ABCDEFGH12345678"), "KUBE-SEP-…");
        assert_eq!(general("10.0.0.1/32"), "<address>");
        assert_eq!(general("10.0.0.1:8080"), "<address>");
        assert_eq!(general("[fd00::1]:80"), "<address>");
        assert_eq!(general("\"ns/a:http\""), "\"…\"");
        assert_eq!(general("0x4000/0x4000"), "0x4000/0x4000");
        assert_eq!(general("KUBE-MARK-MASQ"), "KUBE-MARK-MASQ");
        assert_eq!(
            options("-A X ! -s 10.0.0.1 -m comment --comment \"a b\" -j Y"),
            [
                vec!["-A", "X"],
                vec!["!", "-s", "10.0.0.1"],
                vec!["-m", "comment"],
                vec!["--comment", "\"a b\""],
                vec!["-j", "Y"]
            ]
        );
        assert_eq!(
            words("-A X -m comment --comment \"a b\" -j Y"),
            [
                "-A",
                "X",
                "-m",
                "comment",
                "--comment",
                "\"a b\"",
                "-j",
                "Y"
            ]
        );
    }
}
