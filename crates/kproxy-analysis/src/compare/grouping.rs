//! Mass drift made readable: findings that differ only in the service port, chain or addresses
//! they name (a kube-proxy release that writes rules differently, a changed masquerade bit,
//! comments on or off) become one finding per cause, with how many there were, how many chains
//! they touch and a few examples. `verify --all-findings` keeps them one by one.

use super::finding::{Finding, FindingGroup, GroupExample};
use super::report::thousands;
use kproxy_parsers::iptables::NameHash;
use rayon::prelude::*;
use std::collections::{HashMap, HashSet};

/// Findings of one cause from which they are reported as one: below, each is shown (a few rules
/// edited by hand read better one by one).
pub const GROUP_FROM: usize = 50;

/// Examples kept in a group finding.
const EXAMPLES: usize = 3;

/// Replaces each set of at least [`GROUP_FROM`] findings of one cause by one finding (where the
/// first of them was); returns the findings and how many fewer there are.
pub fn group(findings: Vec<Finding>) -> (Vec<Finding>, usize) {
    if findings.len() < GROUP_FROM {
        return (findings, 0);
    }
    let mut folder = Folder::new(true);
    folder.extend(findings);
    folder.finish()
}

/// Findings as they are found, with mass drift folded on the way ([`Folder::new`] with `fold`):
/// once a cause has [`GROUP_FROM`] findings, later ones only add to its counts, so a node whose
/// every rule differs never holds every finding. Without `fold` it keeps every finding.
#[derive(Debug)]
pub struct Folder {
    fold: bool,
    /// Each cause's index in `tallies`.
    causes: HashMap<Cause, usize, NameHash>,
    tallies: Vec<Tally>,
    /// The findings kept and the groups, in the order their (first) findings came.
    slots: Vec<Slot>,
}

/// A place in a [`Folder`]'s output.
#[derive(Debug)]
enum Slot {
    /// A finding shown as it is.
    Kept(Finding),
    /// The group of a cause (its index), where its first finding came.
    Group(usize),
    /// A finding taken into a group after it was kept.
    Folded,
}

/// A finding on its way into a [`Folder`].
enum Entry {
    /// The finding, its cause and fingerprint (boxed: most findings of a mass drift are
    /// counted).
    Whole(Box<(Finding, Cause, u64)>),
    /// What a finding of a group (the index of its cause) adds to its counts.
    Counted {
        cause: usize,
        print: u64,
        chain: Option<String>,
        service: Option<String>,
    },
}

/// What a [`Folder`] knows of one cause.
#[derive(Debug, Default)]
struct Tally {
    /// Fingerprints of its distinct findings (an exact repeat counts once, as a report's
    /// duplicates do).
    distinct: HashSet<u64, NameHash>,
    /// The slots of its findings, until it is a group.
    kept: Vec<usize>,
    /// Its group, once it has [`GROUP_FROM`] distinct findings.
    group: Option<GroupTally>,
}

/// The counts of a cause's group.
#[derive(Debug)]
struct GroupTally {
    /// The first finding: its ID, severity, expected and actual stand for the group.
    first: Finding,
    chains: HashSet<String, NameHash>,
    services: HashSet<String, NameHash>,
    /// The first findings of distinct chains (or service ports).
    examples: Vec<GroupExample>,
}

impl GroupTally {
    fn new(first: Finding) -> GroupTally {
        GroupTally {
            first,
            chains: HashSet::default(),
            services: HashSet::default(),
            examples: Vec::new(),
        }
    }

    fn add(&mut self, f: Finding) {
        let pair = (f.chain.as_deref(), f.service.as_deref());
        if self.examples.len() < EXAMPLES
            && !self
                .examples
                .iter()
                .any(|e| (e.chain.as_deref(), e.service.as_deref()) == pair)
        {
            self.examples.push(GroupExample {
                service: f.service.clone(),
                chain: f.chain.clone(),
                expected: f.expected.clone(),
                actual: f.actual.clone(),
            });
        }
        self.count(f.chain, f.service);
    }

    /// Counts a finding's chain and service port.
    fn count(&mut self, chain: Option<String>, service: Option<String>) {
        self.chains.extend(chain);
        self.services.extend(service);
    }
}

/// A finding's fingerprint: equal findings have equal ones.
fn fingerprint(f: &Finding) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    (f.id, f.severity, &f.service, &f.chain, &f.message).hash(&mut h);
    (&f.expected, &f.actual, &f.hint).hash(&mut h);
    h.finish()
}

impl Folder {
    /// A folder that folds mass drift (`fold`) or keeps every finding.
    pub fn new(fold: bool) -> Folder {
        Folder {
            fold,
            causes: HashMap::default(),
            tallies: Vec::new(),
            slots: Vec::new(),
        }
    }

    /// Adds one finding.
    pub fn push(&mut self, f: Finding) {
        if self.fold {
            let (cause, print) = (Cause::of(&f), fingerprint(&f));
            self.push_of(f, cause, print);
        } else {
            self.slots.push(Slot::Kept(f));
        }
    }

    /// Adds findings in order (their causes worked out in parallel).
    pub fn extend(&mut self, findings: impl IntoIterator<Item = Finding>) {
        let findings: Vec<Finding> = findings.into_iter().collect();
        if !self.fold {
            self.slots.extend(findings.into_iter().map(Slot::Kept));
            return;
        }
        // A finding of a cause that is a group with all its examples only adds to the counts:
        // it is cut down to them here, in parallel.
        let (causes, tallies) = (&self.causes, &self.tallies);
        let entries: Vec<Entry> = findings
            .into_par_iter()
            .map(|f| {
                let (cause, print) = (Cause::of(&f), fingerprint(&f));
                match causes.get(&cause) {
                    Some(&i)
                        if tallies[i]
                            .group
                            .as_ref()
                            .is_some_and(|g| g.examples.len() == EXAMPLES) =>
                    {
                        Entry::Counted {
                            cause: i,
                            print,
                            chain: f.chain,
                            service: f.service,
                        }
                    }
                    _ => Entry::Whole(Box::new((f, cause, print))),
                }
            })
            .collect();
        for entry in entries {
            match entry {
                Entry::Whole(whole) => {
                    let (f, cause, print) = *whole;
                    self.push_of(f, cause, print);
                }
                Entry::Counted {
                    cause,
                    print,
                    chain,
                    service,
                } => {
                    let tally = &mut self.tallies[cause];
                    if let Some(group) = &mut tally.group
                        && tally.distinct.insert(print)
                    {
                        group.count(chain, service);
                    }
                }
            }
        }
    }

    /// Adds `f`, of `cause`, with its [`fingerprint`].
    fn push_of(&mut self, f: Finding, cause: Cause, print: u64) {
        let next = self.tallies.len();
        let i = *self.causes.entry(cause).or_insert(next);
        if i == next {
            self.tallies.push(Tally::default());
        }
        let tally = &mut self.tallies[i];
        let new = tally.distinct.insert(print);
        if let Some(group) = &mut tally.group {
            if new {
                group.add(f);
            }
            return;
        }
        tally.kept.push(self.slots.len());
        self.slots.push(Slot::Kept(f));
        if tally.distinct.len() < GROUP_FROM {
            return;
        }
        // The cause has become mass drift: its kept findings go into its group, which takes
        // the place of the first.
        let mut group: Option<GroupTally> = None;
        let mut seen: HashSet<u64, NameHash> = HashSet::default();
        for &slot in &tally.kept {
            let Slot::Kept(f) = std::mem::replace(&mut self.slots[slot], Slot::Folded) else {
                continue;
            };
            if !seen.insert(fingerprint(&f)) {
                continue;
            }
            match &mut group {
                Some(g) => g.add(f),
                None => {
                    let mut g = GroupTally::new(f.clone());
                    g.add(f);
                    group = Some(g);
                }
            }
        }
        if let Some(&first) = tally.kept.first() {
            self.slots[first] = Slot::Group(i);
        }
        tally.kept = Vec::new();
        tally.group = group;
    }

    /// The findings in order, each group where its first finding came, and how many findings
    /// the groups stand for beyond themselves.
    pub fn finish(self) -> (Vec<Finding>, usize) {
        let mut causes: Vec<Option<Cause>> = Vec::new();
        causes.resize_with(self.tallies.len(), || None);
        for (cause, i) in self.causes {
            causes[i] = Some(cause);
        }
        let mut tallies: Vec<Option<Tally>> = self.tallies.into_iter().map(Some).collect();
        let mut left_out = 0;
        let mut out = Vec::new();
        for slot in self.slots {
            match slot {
                Slot::Kept(f) => out.push(f),
                Slot::Folded => {}
                Slot::Group(i) => {
                    let tally = tallies[i].take();
                    if let (
                        Some(cause),
                        Some(Tally {
                            distinct,
                            group: Some(group),
                            ..
                        }),
                    ) = (&causes[i], tally)
                    {
                        left_out += distinct.len() - 1;
                        out.push(cause.finding(distinct.len(), group));
                    }
                }
            }
        }
        (out, left_out)
    }
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
                let (e, a) = (Options::of(e), Options::of(a));
                let same_start = (0..e.len().min(a.len()))
                    .take_while(|&i| e.get(i) == a.get(i))
                    .count();
                let rest = e.len().min(a.len()) - same_start;
                let same_end = (1..=rest)
                    .take_while(|&i| e.get(e.len() - i) == a.get(a.len() - i))
                    .count();
                let middle = |o: &Options<'_>| {
                    general_words(
                        o.words_of(same_start..o.len() - same_end).iter().copied(),
                        false,
                    )
                };
                What::Rule {
                    removed: middle(&e),
                    added: middle(&a),
                }
            }
            _ => {
                let text = |t: &str| match &f.service {
                    Some(s) => {
                        general_words(t.replace(s.as_str(), "<service>").split(BLANKS), true)
                    }
                    None => general_words(t.split(BLANKS), true),
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
                .map(|c| general_words(c.split(' '), false)),
            hint: f.hint.clone(),
            what,
        }
    }

    /// The finding that stands for the `count` findings of this cause that `group` tallied.
    fn finding(&self, count: usize, group: GroupTally) -> Finding {
        let chains = group.chains.len();
        let services = group.services.len();
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
        let named: Vec<&str> = group
            .examples
            .iter()
            .filter_map(|e| e.chain.as_deref().or(e.service.as_deref()))
            .collect();
        let mut message = message;
        if !named.is_empty() {
            message.push_str(&format!(" (e.g. {})", named.join(", ")));
        }
        let first = group.first;
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
                examples: group.examples,
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
struct Options<'a> {
    words: Vec<&'a str>,
    /// Where each option starts in `words`.
    starts: Vec<usize>,
}

impl<'a> Options<'a> {
    fn of(rule: &'a str) -> Options<'a> {
        let words = words(rule);
        let mut starts = Vec::new();
        for (i, w) in words.iter().enumerate() {
            let after_not = i > 0 && starts.last() == Some(&(i - 1)) && words[i - 1] == "!";
            if i == 0 || *w == "!" || (w.starts_with('-') && !after_not) {
                starts.push(i);
            }
        }
        Options { words, starts }
    }

    /// How many options.
    fn len(&self) -> usize {
        self.starts.len()
    }

    /// The words of option `i`.
    fn get(&self, i: usize) -> Option<&[&'a str]> {
        let start = *self.starts.get(i)?;
        let end = self.starts.get(i + 1).copied().unwrap_or(self.words.len());
        self.words.get(start..end)
    }

    /// The words of the options in `range`.
    fn words_of(&self, range: std::ops::Range<usize>) -> &[&'a str] {
        let start = self
            .starts
            .get(range.start)
            .copied()
            .unwrap_or(self.words.len());
        let end = self
            .starts
            .get(range.end)
            .copied()
            .unwrap_or(self.words.len());
        self.words.get(start..end.max(start)).unwrap_or_default()
    }
}

/// The words with what differs between service ports left out ([`general`]), joined by spaces;
/// with `numbers`, counts and ports too. A list of such values (`10.0.0.1:80, 10.0.0.2:80`),
/// cut by [`super::finding::listed`] or not (`… and 7 more`), is one: how long it is differs
/// between service ports as well.
fn general_words<'w>(words: impl Iterator<Item = &'w str>, numbers: bool) -> String {
    let mut shown: Vec<std::borrow::Cow<'w, str>> = Vec::new();
    let mut last_general = false;
    for w in words {
        let g = general(w, numbers);
        let is_general = g != w;
        if is_general
            && last_general
            && let Some(last) = shown.last_mut()
            && last.strip_suffix(',').unwrap_or(last) == g.strip_suffix(',').unwrap_or(&g)
        {
            *last = g;
            continue;
        }
        // `… and <n> more` after a list: the rest of the list (punctuation after it kept).
        if let Some(after) = w.strip_prefix("more")
            && after.chars().all(|c| WRAPPING.contains(&c))
            && let [.., list, and, count] = shown.as_slice()
            && (and, count) == (&"and".into(), &"<n>".into())
            && (list.starts_with('<') || list.contains('…'))
        {
            shown.truncate(shown.len() - 2);
            if let Some(list) = shown.last_mut() {
                list.to_mut().push_str(after);
            }
            continue;
        }
        last_general = is_general;
        shown.push(g);
    }
    shown.join(" ")
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

/// The prefix of a per-service object of kube-proxy's nftables table
/// (`endpoint-2GI6SST5-ns/svc/tcp/http__10.0.0.1/80`): one of its prefixes, then the eight
/// base32 characters of `hashAndTruncate` and a hyphen.
fn nft_object_prefix(word: &str) -> Option<&'static str> {
    use crate::model::nft_names as n;
    let prefix = [
        n::SERVICE_PREFIX,
        n::LOCAL_PREFIX,
        n::EXTERNAL_PREFIX,
        n::FIREWALL_PREFIX,
        n::ENDPOINT_PREFIX,
        n::AFFINITY_PREFIX,
    ]
    .into_iter()
    .find(|p| word.starts_with(p))?;
    let hash = word.get(prefix.len()..prefix.len() + 9)?;
    let base32 = |b: u8| b.is_ascii_uppercase() || (b'2'..=b'7').contains(&b);
    (hash.ends_with('-') && hash.bytes().take(8).all(base32)).then_some(prefix)
}

/// Punctuation that wraps a value in a message: `(10.0.0.1:80)`, `KUBE-SVC-…:`, `:KUBE-SEP-…`.
const WRAPPING: &[char] = &['(', ')', ',', ';', ':', '.', '`', '\'', '@'];

/// What separates the words of a finding's texts (an nft rule per line).
const BLANKS: &[char] = &[' ', '\n'];

/// A word with what differs between service ports left out: a chain's hash (`KUBE-SEP-…`), a
/// quoted text (`"…"`), an address, network or `address:port` (`<address>`), and with `numbers`
/// a number (`<n>`); punctuation around it is kept.
fn general(word: &str, numbers: bool) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    if word.starts_with('"') {
        return Cow::Borrowed("\"…\"");
    }
    if let Some(g) = general_value(word, numbers) {
        return g;
    }
    let core = word.trim_matches(WRAPPING);
    if core.is_empty() || core.len() == word.len() {
        return Cow::Borrowed(word);
    }
    match general_value(core, numbers) {
        Some(g) => {
            let before = word.len() - word.trim_start_matches(WRAPPING).len();
            let after = &word[before + core.len()..];
            Cow::Owned(format!("{}{g}{after}", &word[..before]))
        }
        None => Cow::Borrowed(word),
    }
}

/// [`general`] of a word without punctuation around it; `None` when nothing in it differs
/// between service ports.
fn general_value(word: &str, numbers: bool) -> Option<std::borrow::Cow<'static, str>> {
    use std::borrow::Cow;
    if let Some((prefix, hash)) = word.rsplit_once('-')
        && prefix.starts_with("KUBE-")
        && hash.len() == 16
        && hash
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    {
        return Some(Cow::Owned(format!("{prefix}-…")));
    }
    if let Some(prefix) = nft_object_prefix(word) {
        return Some(Cow::Owned(format!("{prefix}…")));
    }
    if numbers
        && word.bytes().next().is_some_and(|b| b.is_ascii_digit())
        && word.bytes().all(|b| b.is_ascii_digit() || b == b',')
    {
        return Some(Cow::Borrowed("<n>"));
    }
    // Only a word of digits, dots, colons, hex and brackets can be an address.
    let host = word.split('/').next().unwrap_or(word);
    let host = host.trim_start_matches('[');
    let maybe_address = host
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_hexdigit() || b == b':');
    let is_address = maybe_address
        && (host.parse::<std::net::IpAddr>().is_ok()
            || host.rsplit_once(':').is_some_and(|(h, p)| {
                h.trim_end_matches(']').parse::<std::net::IpAddr>().is_ok()
                    && p.parse::<u16>().is_ok()
            }));
    is_address.then_some(Cow::Borrowed("<address>"))
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
        let (out, left_out) = group(findings);
        assert_eq!(left_out, 299);
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
    fn a_folder_fed_run_by_run_counts_each_distinct_finding_once() {
        let sep = |n: usize| {
            let (chain, e, a) = sep_rule(n);
            changed(&chain, &e, &a)
        };
        let mut folder = Folder::new(true);
        folder.push(cat::CANARY_MISSING.finding("no canary"));
        for run in 0..4 {
            folder.extend((run * 100..run * 100 + 100).map(sep));
        }
        // An exact repeat (a rule written twice) is one finding, as in a report.
        folder.extend([sep(7), sep(7)]);
        let (out, left_out) = folder.finish();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].message, "no canary");
        let g = out[1].group.as_deref().unwrap_or_else(|| panic!("a group"));
        assert_eq!((g.count, g.chains, left_out), (400, 400, 399));
        let chains: Vec<_> = g.examples.iter().map(|e| e.chain.clone()).collect();
        assert_eq!(chains, [0, 1, 2].map(|n| Some(sep_rule(n).0)));
        let report =
            super::super::Report::new("node", crate::state::mode::ProxyMode::Iptables, 1, out);
        // The canary finding and the 400 of the group.
        assert_eq!(
            report.summary.warnings, 401,
            "a group counts as its findings"
        );

        let mut all = Folder::new(false);
        all.extend((0..300).map(sep));
        assert_eq!(all.finish().0.len(), 300);
    }

    /// KP905 as the rule level makes it for a chain of `rules` rules of service port `n`.
    fn chain_missing(chain: &str, rules: usize, n: usize) -> Finding {
        cat::CHAIN_MISSING
            .finding(format!("nat {chain} is missing ({rules} rule(s) expected)"))
            .chain(format!("nat {chain}"))
            .expected(format!(":{chain} with {rules} rule(s)"))
            .actual("no such chain")
            .service(format!("ns-{}/svc-{n}:http", n % 20))
    }

    #[test]
    fn chains_missing_per_endpoint_and_per_service_port_are_one_finding_each() {
        // One KUBE-SEP chain per endpoint (two rules each), one KUBE-SVC chain per service port
        // (a rule per endpoint, so the counts differ): the hash, the `:` before it, the rule
        // count and the service port are what differ.
        let mut findings: Vec<Finding> = (0..5_000)
            .map(|n| chain_missing(&format!("KUBE-SEP-{n:016}"), 2, n / 100))
            .collect();
        findings.extend((0..60).map(|n| chain_missing(&format!("KUBE-SVC-{n:016}"), 1 + n % 7, n)));
        let (out, left_out) = group(findings);
        assert_eq!(out.len(), 2, "{out:#?}");
        assert_eq!(left_out, 4_999 + 59);
        let sep = out[0].group.as_deref().unwrap_or_else(|| panic!("a group"));
        assert_eq!((sep.count, sep.chains, sep.services), (5_000, 5_000, 50));
        assert_eq!(out[0].chain.as_deref(), Some("nat KUBE-SEP-…"));
        assert!(
            out[0].message.starts_with(
                "5,000 findings alike in 5,000 chains and 50 service ports: nat KUBE-SEP-… is missing (<n> rule(s) expected)"
            ),
            "{}",
            out[0].message
        );
        let svc = out[1].group.as_deref().unwrap_or_else(|| panic!("a group"));
        assert_eq!(svc.count, 60);
    }

    #[test]
    fn endpoints_in_parentheses_and_lists_do_not_split_a_cause() {
        // KP201 as the graph level makes it: the endpoint in parentheses, the chain's picks
        // listed in `actual`, as many as the dump has for that service port.
        let findings: Vec<Finding> = (0..200)
            .map(|n| {
                let chain = format!("KUBE-SVC-{n:016}");
                let endpoint = format!("10.64.{}.{}:8080", n / 250, n % 250);
                let picked: Vec<String> = (0..1 + n % 12)
                    .map(|i| format!("10.65.0.{i}:8080"))
                    .collect();
                cat::ENDPOINT_MISSING
                    .finding(format!(
                        "ready endpoint {endpoint} is not reached from {chain}"
                    ))
                    .service(format!("ns/svc-{n}:http"))
                    .chain(chain.clone())
                    .expected(format!("{chain} -> KUBE-SEP-{n:016} ({endpoint})"))
                    .actual(super::super::finding::listed(picked))
            })
            .collect();
        let (out, left_out) = group(findings);
        assert_eq!((out.len(), left_out), (1, 199), "{out:#?}");
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
        let (out, left_out) = group(findings);
        assert_eq!(left_out, GROUP_FROM - 1);
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
        assert_eq!(general("KUBE-SEP-ABCDEFGH12345678", false), "KUBE-SEP-…");
        assert_eq!(general("10.0.0.1/32", false), "<address>");
        assert_eq!(general("10.0.0.1:8080", false), "<address>");
        assert_eq!(general("[fd00::1]:80", false), "<address>");
        assert_eq!(general("\"ns/a:http\"", false), "\"…\"");
        assert_eq!(general("0x4000/0x4000", false), "0x4000/0x4000");
        assert_eq!(general("KUBE-MARK-MASQ", false), "KUBE-MARK-MASQ");
        // Punctuation around a value, numbers (with `numbers`), lists of values.
        assert_eq!(general("(10.0.0.1:8080)", false), "(<address>)");
        assert_eq!(general(":KUBE-SEP-ABCDEFGH12345678", false), ":KUBE-SEP-…");
        assert_eq!(general("KUBE-SVC-ABCDEFGH12345678:", false), "KUBE-SVC-…:");
        assert_eq!(general("[fd00::1]:80,", false), "<address>,");
        assert_eq!(general("(2", true), "(<n>");
        assert_eq!(general("1,234", true), "<n>");
        assert_eq!(general("(2", false), "(2");
        assert_eq!(general("0x4000", true), "0x4000");
        assert_eq!(general("::1", false), "<address>");
        assert_eq!(
            general(
                "endpoint-2GI6SST5-ns-00/svc-00000/tcp/http__10.64.0.25/8080",
                false
            ),
            "endpoint-…"
        );
        assert_eq!(
            general("(local-DNINUHYX-ns/svc/tcp/http)", false),
            "(local-…)"
        );
        assert_eq!(general("service-ips", false), "service-ips");
        assert_eq!(
            general_words(
                "to 10.0.0.1:80, 10.0.0.2:80, 10.0.0.3:80 and 4 more, not 2".split(' '),
                true
            ),
            "to <address>, not <n>"
        );
        assert_eq!(
            general_words(
                "to KUBE-SEP-ABCDEFGH12345678, KUBE-SEP-BBCDEFGH12345678".split(' '),
                false
            ),
            "to KUBE-SEP-…"
        );
        assert_eq!(
            {
                let o = Options::of("-A X ! -s 10.0.0.1 -m comment --comment \"a b\" -j Y");
                (0..o.len())
                    .map(|i| o.get(i).unwrap_or_default().to_vec())
                    .collect::<Vec<_>>()
            },
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
