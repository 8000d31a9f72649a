//! Rule level (KP9xx): per chain kube-proxy writes, the difference between `render` and the dump
//! under canonical rule equality (`crate::model::canonical`) — missing, extra, changed and reordered rules —
//! reported only where the graph level has not already explained it.
//!
//! What legitimately varies is never reported: service order in the service-keyed chains
//! (compared as multisets), `--random-fully` (iptables version), `-m nfacct` matches and the
//! localhost NodePort rule that depends on them (kernel support), the INVALID drop rule (sysctl),
//! and mark formatting (canonical form).
//!
//! The comparison runs on 128-bit keys ([`Fingerprint`]s of the canonical text without what
//! varies): [`ExpectedRules`] reads the render as it is produced and keeps one key per rule, never
//! the render's text, and each dump chain's keys are computed from the model. Only chains whose
//! keys differ are looked at rule by rule; for those the render runs again and keeps the texts of
//! just those chains (a drifted node has a few; a clean one none).

use super::graph_level::Explained;
use crate::compare::catalogue as cat;
use crate::compare::finding::Finding;
use crate::compare::grouping::Folder;
use crate::graph::names::{NameResolver, parse_comment};
use crate::graph::ownership::service_chain;
use crate::model::canonical::{Omit, write_rule, write_rule_omitting};
use crate::model::{Fingerprint, NameIndex, Ruleset};
use crate::proxier::iptables::{NODEPORTS_TAIL_COMMENT, RenderChunk};
use kproxy_parsers::ParseError;
use kproxy_parsers::iptables::{
    Family, Match, Module, NameHash, Rule, Target, TargetKind, for_each_rule,
};
use rayon::prelude::*;
use std::collections::HashMap;

/// Runs a render, handing its chunks to the sink (see
/// [`crate::proxier::iptables::render_decisions_chunks`]).
pub type RenderFn<'f> = dyn Fn(&mut dyn FnMut(RenderChunk<'_>)) + Sync + 'f;

/// What the comparison leaves out of every key.
pub const KEY_OMIT: Omit = Omit {
    nfacct: true,
    masquerade_random_fully: true,
};

/// What the comparison leaves out when the node's nfacct counters are known (`--nfacct`):
/// kube-proxy's nfacct matches and the localhost NodePort rule then must be as the facts say.
pub const KEY_OMIT_KNOWN_NFACCT: Omit = Omit {
    nfacct: false,
    masquerade_random_fully: true,
};

/// Chains whose rules kube-proxy writes in an order that matters.
fn is_ordered(table: &str, chain: &str) -> bool {
    !matches!(
        (table, chain),
        ("nat", "KUBE-SERVICES")
            | ("nat", "KUBE-NODEPORTS")
            | ("filter", "KUBE-SERVICES")
            | ("filter", "KUBE-NODEPORTS")
            | ("filter", "KUBE-EXTERNAL-SERVICES")
            | ("filter", "KUBE-PROXY-FIREWALL")
    )
}

/// Chains of the render that are not kube-proxy's restore payload (base jumps, canaries).
fn skipped_chain(chain: &str) -> bool {
    crate::model::BUILTIN_CHAINS.contains(&chain) || chain == "KUBE-PROXY-CANARY"
}

/// Whether a rule is optional: present or not depending on kernel features (then it has no key).
/// The localhost NodePort rule is, unless `omit` keeps nfacct matches (the counters are known).
fn optional(table: &str, chain: &str, r: &Rule<'_>, omit: Omit) -> bool {
    let has_nfacct = || {
        r.matches()
            .any(|m| matches!(m, Match::Module(Module::Nfacct(_))))
    };
    if omit.nfacct && table == "nat" && chain == "KUBE-NODEPORTS" && has_nfacct() {
        return true; // localhost NodePort rule: only with the nfacct counter
    }
    table == "filter"
        && chain == "KUBE-FORWARD"
        && r.target_kind() == Some(TargetKind::Drop)
        && r.matches().any(|m| {
            matches!(m, Match::Module(Module::Conntrack { ctstate: Some(s), .. }) if s.value.contains("INVALID"))
        })
}

/// A rule's comparison key: the fingerprint of its canonical text without what legitimately
/// varies; `None` for optional rules.
fn key(
    table: &str,
    chain: &str,
    r: &Rule<'_>,
    (family, omit): (Family, Omit),
    buf: &mut String,
) -> Option<Fingerprint> {
    (!optional(table, chain, r, omit)).then(|| Fingerprint::omitting(r, family, omit, buf))
}

/// A dump rule's key read straight off its text: the fingerprint of its specification as
/// written. It equals [`key`] whenever the text is already canonical without what varies — as
/// iptables-save prints every rule kube-proxy writes, `--random-fully` aside — because canonical
/// text reads back to itself (a tested fixed point). When it differs nothing is concluded: the
/// chain is compared again by [`key`].
fn text_key(r: &Rule<'_>) -> Fingerprint {
    Fingerprint::of_text(r.raw)
}

/// A chain's rule keys folded into one 128-bit digest, in rule order (optional rules have no
/// key and take no position, as rule by rule): two chains have the same keys in the same order
/// exactly when their digests are equal (a collision is a 2^-128 event). A chain's digest is all
/// the screen keeps of the render's keys, so a node's 440k keys are never held.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct KeyDigest {
    /// The digest: `xxh3-128(previous digest ‖ key)` for each key in turn (two words, so that a
    /// chain's record needs no 16-byte alignment).
    words: [u64; 2],
    /// How many keys were folded in.
    keys: u32,
}

impl KeyDigest {
    /// Folds in the next key.
    fn push(&mut self, key: Fingerprint) {
        let mut input = [0u8; 32];
        input[..8].copy_from_slice(&self.words[0].to_le_bytes());
        input[8..16].copy_from_slice(&self.words[1].to_le_bytes());
        input[16..].copy_from_slice(&key.0.get().to_le_bytes());
        let h = xxhash_rust::xxh3::xxh3_128(&input);
        self.words = [h as u64, (h >> 64) as u64];
        self.keys += 1;
    }

    /// The digest of `keys`, in order.
    fn of(keys: impl Iterator<Item = Fingerprint>) -> KeyDigest {
        let mut d = KeyDigest::default();
        keys.for_each(|k| d.push(k));
        d
    }
}

/// Whether the rule is the nat `KUBE-SERVICES` → `KUBE-NODEPORTS` tail rule.
fn is_tail(r: &Rule<'_>) -> bool {
    r.comment()
        .is_some_and(|c| c.value().contains(NODEPORTS_TAIL_COMMENT))
}

/// The service port a rule belongs to: its comment, its own chain's hash, or its jump target's hash.
fn owner(r: &Rule<'_>, chain: &str, names: &NameResolver) -> Option<String> {
    if let Some(c) = r.comment()
        && let Some(sc) = parse_comment(&c.value())
    {
        return Some(sc.name.to_string());
    }
    let by_hash = |c: &str| {
        service_chain(c)
            .and_then(|(_, h)| names.resolve(h))
            .map(|(n, _)| n.to_string())
    };
    by_hash(chain).or_else(|| match r.target() {
        Some(Target::Jump(t) | Target::Goto(t)) => by_hash(t),
        _ => None,
    })
}

/// One chain of the render: where it stands in its table, and its keys' digest.
#[derive(Debug, Clone, Copy)]
struct ExpectedChain {
    /// Position among the table's chain declarations ([`UNSET`] when not declared).
    declared: u32,
    /// Position among the chains rules were first written to ([`UNSET`] when none was).
    first_use: u32,
    /// The chain's rules, optional ones included.
    rules: u32,
    /// The digest of its rules' keys.
    digest: KeyDigest,
    /// Its name: `names[name_at..name_at + name_len]` of its table.
    name_at: u32,
    name_len: u32,
}

/// An [`ExpectedChain`] position that was never set (sorts after every set one).
const UNSET: u32 = u32::MAX;

impl Default for ExpectedChain {
    fn default() -> Self {
        ExpectedChain {
            declared: UNSET,
            first_use: UNSET,
            rules: 0,
            digest: KeyDigest::default(),
            name_at: 0,
            name_len: 0,
        }
    }
}

/// One table of the render.
#[derive(Debug, Default)]
struct ExpectedTable {
    name: &'static str,
    /// The chains, in the order first seen ([`ExpectedTable::order`] sorts them).
    chains: Vec<ExpectedChain>,
    /// Every chain's name, one after the other (one allocation, not one per chain).
    names: String,
    /// Chain name → position in `chains`, until [`ExpectedTable::order`] moves the chains.
    index: NameIndex,
    /// The chain the last rule was written to (the render writes a chain's rules together).
    last: Option<usize>,
    declarations: u32,
    uses: u32,
}

/// The name of `c` in `names` (its table's).
fn chain_name<'n>(names: &'n str, c: &ExpectedChain) -> &'n str {
    let at = c.name_at as usize;
    names.get(at..at + c.name_len as usize).unwrap_or("")
}

/// The name of chain `i` of `chains` (for [`NameIndex`]).
fn chain_names<'n>(names: &'n str, chains: &'n [ExpectedChain]) -> impl Fn(u32) -> &'n str + Copy {
    move |i| chains.get(i as usize).map_or("", |c| chain_name(names, c))
}

impl ExpectedTable {
    /// Every chain with its name, in order.
    #[cfg(test)]
    fn iter(&self) -> impl Iterator<Item = (&str, &ExpectedChain)> {
        self.chains.iter().map(|c| (chain_name(&self.names, c), c))
    }

    /// The index of chain `name`, added when new.
    fn chain(&mut self, name: &str) -> usize {
        let names = chain_names(&self.names, &self.chains);
        let found = match self.last {
            Some(i) if names(i as u32) == name => Some(i),
            _ => self.index.get(name, names),
        };
        let i = found.unwrap_or_else(|| {
            let i = self.chains.len();
            self.chains.push(ExpectedChain {
                name_at: self.names.len() as u32,
                name_len: name.len() as u32,
                ..ExpectedChain::default()
            });
            self.names.push_str(name);
            self.index.insert(i, chain_names(&self.names, &self.chains));
            i
        });
        self.last = Some(i);
        i
    }

    /// Declares chain `name` (its first declaration counts).
    fn declare(&mut self, name: &str) {
        let i = self.chain(name);
        let c = &mut self.chains[i];
        if c.declared == UNSET {
            c.declared = self.declarations;
            self.declarations += 1;
        }
    }

    /// Appends a rule with `key` (`None`: an optional rule) to chain `name`. The render writes
    /// some chains in several runs (the service-keyed chains, e.g. `KUBE-SERVICES`, interleaved
    /// with each service's own): the digest simply goes on.
    fn push_key(&mut self, name: &str, key: Option<Fingerprint>) {
        let i = self.chain(name);
        let c = &mut self.chains[i];
        if c.first_use == UNSET {
            c.first_use = self.uses;
            self.uses += 1;
        }
        c.rules += 1;
        if let Some(k) = key {
            c.digest.push(k);
        }
    }

    /// Puts the chains in the order a ruleset of the render would hold them: declared chains in
    /// declaration order, then chains only written to, in first-use order (in place: a copy of
    /// 110k chains is megabytes at verify's busiest moment).
    fn order(&mut self) {
        self.chains.sort_by_key(|c| (c.declared, c.first_use));
        self.index = NameIndex::default();
        self.last = None;
    }
}

/// A chunk of the render, kept until its window is read.
struct OwnedChunk {
    table: &'static str,
    declarations: bool,
    text: String,
}

/// Render chunks read at a time (in parallel).
const WINDOW_CHUNKS: usize = 8;

/// Runs `render` and hands its chunks to `read` a window of [`WINDOW_CHUNKS`] at a time, in
/// render order (the reader reads a window's chunks in parallel); stops at the first error.
fn read_in_windows(
    render: &RenderFn<'_>,
    mut read: impl FnMut(&[OwnedChunk]) -> Result<(), ParseError>,
) -> Result<(), ParseError> {
    let mut window: Vec<OwnedChunk> = Vec::new();
    let mut failed = None;
    render(&mut |chunk: RenderChunk<'_>| {
        if failed.is_some() {
            return;
        }
        window.push(OwnedChunk {
            table: chunk.table,
            declarations: chunk.declarations,
            text: chunk.text.to_string(),
        });
        if window.len() == WINDOW_CHUNKS {
            failed = read(&window).err();
            window.clear();
        }
    });
    match failed {
        Some(e) => Err(e),
        None => read(&window),
    }
}

/// What kube-proxy's render implies for the rule level: each chain's rule keys, read from the
/// render as it is produced (none of its text is kept).
#[derive(Debug, Default)]
pub struct ExpectedRules {
    /// In the order the render first writes to them.
    tables: Vec<ExpectedTable>,
    /// The room the nat table gets when the render first writes to it.
    nat_chains: usize,
    /// What the keys leave out.
    omit: Omit,
}

/// One render chunk's rules: each rule's chain and key.
type ChunkKeys<'a> = Vec<(&'a str, Option<Fingerprint>)>;

impl ExpectedRules {
    /// Runs `render` (the render of `family`) and keeps each chain's key digest. `nat_chains`
    /// is about how many nat chains the render writes ([`ServiceDecisions::nat_chains_estimate`]):
    /// room for them is made at once, not by doubling while verify is at its busiest.
    ///
    /// [`ServiceDecisions::nat_chains_estimate`]: crate::proxier::iptables::ServiceDecisions::nat_chains_estimate
    pub fn build(
        render: &RenderFn<'_>,
        family: Family,
        nat_chains: usize,
    ) -> Result<ExpectedRules, ParseError> {
        Self::build_omitting(render, family, nat_chains, KEY_OMIT)
    }

    /// [`ExpectedRules::build`] with keys that leave out `omit` ([`KEY_OMIT`], or
    /// [`KEY_OMIT_KNOWN_NFACCT`] when the node's nfacct counters are known).
    pub fn build_omitting(
        render: &RenderFn<'_>,
        family: Family,
        nat_chains: usize,
        omit: Omit,
    ) -> Result<ExpectedRules, ParseError> {
        let mut rules = ExpectedRules {
            tables: Vec::new(),
            nat_chains,
            omit,
        };
        // The render's chunks are gathered a window at a time; their rules are read into keys in
        // parallel, then added to the chains in render order.
        let read = read_in_windows(render, |window| rules.add_chunks(window, family));
        for t in &mut rules.tables {
            // Grown by doubling while the render was read: hand back the spare room.
            t.chains.shrink_to_fit();
            t.names.shrink_to_fit();
        }
        read.map(|()| rules)
    }

    /// Adds the chains and keys of `chunks` (a window of the render, in order); the chunks' keys
    /// are made in parallel.
    fn add_chunks(&mut self, chunks: &[OwnedChunk], family: Family) -> Result<(), ParseError> {
        let omit = self.omit;
        let keyed: Vec<Result<ChunkKeys<'_>, ParseError>> = chunks
            .par_iter()
            .map_init(String::new, |buf, chunk| {
                let mut keys = Vec::new();
                if !chunk.declarations {
                    for_each_rule(&chunk.text, |chain, r| {
                        keys.push((chain, key(chunk.table, chain, &r, (family, omit), buf)));
                    })?;
                }
                Ok(keys)
            })
            .collect();
        for (chunk, keys) in chunks.iter().zip(keyed) {
            let t = self.table(chunk.table);
            if chunk.declarations {
                for line in chunk.text.lines() {
                    let name = line
                        .strip_prefix(':')
                        .and_then(|l| l.split(' ').next())
                        .unwrap_or(line);
                    t.declare(name);
                }
                continue;
            }
            for (chain, key) in keys? {
                t.push_key(chain, key);
            }
        }
        Ok(())
    }

    fn table(&mut self, name: &'static str) -> &mut ExpectedTable {
        let i = match self.tables.iter().position(|t| t.name == name) {
            Some(i) => i,
            None => {
                let mut t = ExpectedTable {
                    name,
                    ..ExpectedTable::default()
                };
                if name == "nat" {
                    t.chains.reserve_exact(self.nat_chains);
                    // Most are `KUBE-SEP-` + 16 characters.
                    t.names.reserve_exact(self.nat_chains * 25);
                }
                self.tables.push(t);
                self.tables.len() - 1
            }
        };
        &mut self.tables[i]
    }
}

/// One rule as the detailed comparison reads it.
#[derive(Debug, Clone)]
struct RuleView {
    /// The key: the fingerprint of the canonical text without what varies (none for a rule
    /// the comparison leaves out).
    key: Option<Fingerprint>,
    /// `-A CHAIN <canonical>`.
    line: String,
    owner: Option<String>,
    /// Whether the graph level has reported what this rule is about (its chain, the chain it
    /// jumps to or its service port).
    explained: bool,
}

impl RuleView {
    fn of(
        (table, chain): (&str, &str),
        r: &Rule<'_>,
        (family, omit): (Family, Omit),
        (names, ex): (&NameResolver, &Explained),
        buf: &mut String,
    ) -> Self {
        let key =
            (!optional(table, chain, r, omit)).then(|| Fingerprint::omitting(r, family, omit, buf));
        buf.clear();
        write_rule(buf, r, family);
        let owner = owner(r, chain, names);
        let explained = ex.chains.contains(chain)
            || r.jump_target().is_some_and(|t| ex.chains.contains(t))
            || owner.as_ref().is_some_and(|s| ex.services.contains(s));
        RuleView {
            key,
            line: format!("-A {chain} {buf}"),
            owner,
            explained,
        }
    }
}

/// How one chain of the render compares with the dump, before the graph level has said what it
/// explains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// The dump has no such table (reported node-wide as KP011).
    TableMissing,
    /// The dump lacks the chain; the render has this many rules in it.
    ChainMissing(usize),
    /// The same keys in the same order.
    Same,
    /// The keys differ: looked at rule by rule.
    Differs,
}

/// The keys of every chain of the render compared with the dump's: which chains are missing or
/// different (and how the unordered chains compare: their NodePort tail is checked even when
/// they are the same). The costly part of the rule level (a key for each of the dump's rules),
/// independent of the graph level, so it runs while the graph is built.
#[derive(Debug, Default)]
pub struct Screen {
    /// In ruleset order; chains kube-proxy writes in order and the dump has the same are left out.
    chains: Vec<(&'static str, String, Status)>,
    /// What the keys leave out (the expected rules').
    omit: Omit,
}

/// Compares the keys of every chain of `expected` (the render) with `actual` (the dump).
pub fn screen(expected: ExpectedRules, actual: &Ruleset<'_>) -> Screen {
    screen_split(expected, actual, CHAINS_PER_TASK)
}

/// [`screen`], in parallel over runs of `per_task` chains.
fn screen_split(mut expected: ExpectedRules, actual: &Ruleset<'_>, per_task: usize) -> Screen {
    for t in &mut expected.tables {
        t.order();
    }
    // Each run keeps only the chains the findings read, in chain order. No list of all chains
    // is made: a large node's 110k would be megabytes at verify's busiest moment.
    let mut chains = Vec::new();
    let omit = expected.omit;
    for t in &expected.tables {
        let parts: Vec<Vec<_>> = t
            .chains
            .par_chunks(per_task.max(1))
            .map_init(String::new, |buf, part| {
                let mut kept = Vec::new();
                for ec in part {
                    let chain = chain_name(&t.names, ec);
                    if skipped_chain(chain) {
                        continue;
                    }
                    let status = chain_status(t.name, chain, ec, actual, (omit, buf));
                    if status != Status::Same || !is_ordered(t.name, chain) {
                        kept.push((t.name, chain.to_string(), status));
                    }
                }
                kept
            })
            .collect();
        chains.extend(parts.into_iter().flatten());
    }
    Screen { chains, omit }
}

/// How many chains one parallel task of [`screen`] compares.
const CHAINS_PER_TASK: usize = 4096;

/// How one chain of the render (`ec`) compares with the dump's chain of that name.
fn chain_status(
    table: &'static str,
    chain: &str,
    ec: &ExpectedChain,
    actual: &Ruleset<'_>,
    (omit, buf): (Omit, &mut String),
) -> Status {
    let at = actual.table(table);
    match (at, at.and_then(|t| t.chain(chain))) {
        (None, _) => Status::TableMissing,
        (Some(_), None) => Status::ChainMissing(ec.rules as usize),
        (Some(_), Some(ac)) => {
            let rules = || ac.rules.iter().filter(|r| !optional(table, chain, r, omit));
            // First by the dump's own text (see `text_key`), then, only when that differs, by
            // each rule's canonical text.
            let same = KeyDigest::of(rules().map(|r| text_key(r))) == ec.digest
                || KeyDigest::of(
                    rules().map(|r| Fingerprint::omitting(r, actual.family, omit, buf)),
                ) == ec.digest;
            if same { Status::Same } else { Status::Differs }
        }
    }
}

/// The findings of the rule level: `screen` says which chains differ; those are looked at rule
/// by rule, the render's side re-read through `render` (the render of `family`).
pub fn findings(
    screen: &Screen,
    (family, render): (Family, &RenderFn<'_>),
    actual: &Ruleset<'_>,
    (names, ex): (&NameResolver, &Explained),
    found: &mut Folder,
) -> Result<(), ParseError> {
    let mut out = Vec::new();
    let mut differing: Vec<(&'static str, String)> = Vec::new();
    for (table, chain, status) in &screen.chains {
        let (table, chain) = (*table, chain.as_str());
        let table_chain = || format!("{table} {chain}");
        match *status {
            Status::TableMissing => {}
            Status::ChainMissing(n) => {
                if ex.chains.contains(chain) {
                    continue; // explained chains are reported already
                }
                let svc = service_chain(chain)
                    .and_then(|(_, h)| names.resolve(h))
                    .map(|(n, _)| n.to_string());
                if svc.as_ref().is_some_and(|s| ex.services.contains(s)) {
                    continue;
                }
                let mut f = cat::CHAIN_MISSING
                    .finding(format!(
                        "{} is missing ({n} rule(s) expected)",
                        table_chain()
                    ))
                    .chain(table_chain())
                    .expected(format!(":{chain} with {n} rule(s)"))
                    .actual("no such chain");
                if let Some(s) = svc {
                    f = f.service(s);
                }
                out.push(f);
            }
            Status::Same => {
                // Same order: only the unordered chains' NodePort-tail check can still report.
                if !is_ordered(table, chain)
                    && !ex.chains.contains(chain)
                    && let Some(ac) = actual.chain(table, chain)
                {
                    tail_last(table, chain, (ac, screen.omit), &mut out);
                }
            }
            Status::Differs => differing.push((table, chain.to_string())),
        }
    }
    found.extend(out);
    if differing.is_empty() {
        return Ok(());
    }
    tracing::debug!(
        "rule level: {} chain(s) differ from the render, first {:?}",
        differing.len(),
        &differing[..differing.len().min(5)]
    );
    let omit = screen.omit;
    let t0 = std::time::Instant::now();
    let wanted = expected_views(render, (family, omit), &differing, (names, ex))?;
    tracing::debug!(
        "rule level: the render's rules of those read in {:?}",
        t0.elapsed()
    );
    // Each chain on its own, a run of chains at a time: a mass-drifted node has one per service
    // port, and `found` folds their findings before the next run is made.
    for (chains, wants) in differing
        .chunks(CHAINS_PER_TASK)
        .zip(wanted.chunks(CHAINS_PER_TASK))
    {
        let details: Vec<Vec<Finding>> = chains
            .par_iter()
            .zip(wants)
            .map_init(String::new, |buf, ((table, chain), want)| {
                let mut out = Vec::new();
                let Some(ac) = actual.chain(table, chain) else {
                    return out;
                };
                let got: Vec<RuleView> = ac
                    .rules
                    .iter()
                    .map(|r| {
                        RuleView::of((table, chain), r, (actual.family, omit), (names, ex), buf)
                    })
                    .collect();
                // The keys' texts, for a chain whose rules are all there but in another order.
                let key_texts = || {
                    ac.rules
                        .iter()
                        .filter(|r| !optional(table, chain, r, omit))
                        .map(|r| {
                            let mut t = String::new();
                            write_rule_omitting(&mut t, r, actual.family, omit);
                            t
                        })
                        .collect()
                };
                chain_details((table, chain), (want, &got), ex, &key_texts, &mut out);
                if !ex.chains.contains(chain.as_str()) && !is_ordered(table, chain) {
                    tail_last(table, chain, (ac, omit), &mut out);
                }
                out
            })
            .collect();
        found.extend(details.into_iter().flatten());
    }
    Ok(())
}

/// The rules of the `chains` of the render, rule by rule (the render runs again), in the order
/// of `chains`.
fn expected_views(
    render: &RenderFn<'_>,
    family: (Family, Omit),
    chains: &[(&'static str, String)],
    names: (&NameResolver, &Explained),
) -> Result<Vec<Vec<RuleView>>, ParseError> {
    let mut wanted: HashMap<&'static str, HashMap<&str, usize, NameHash>> = HashMap::new();
    for (i, (t, c)) in chains.iter().enumerate() {
        wanted.entry(t).or_default().insert(c.as_str(), i);
    }
    let mut views: Vec<Vec<RuleView>> = vec![Vec::new(); chains.len()];
    read_in_windows(render, |window| {
        let parts: Vec<Result<Vec<(usize, RuleView)>, ParseError>> = window
            .par_iter()
            .map_init(String::new, |buf, chunk| {
                let mut found = Vec::new();
                if let Some(ids) = wanted.get(chunk.table).filter(|_| !chunk.declarations) {
                    for_each_rule(&chunk.text, |chain, r| {
                        if let Some(&i) = ids.get(chain) {
                            let view = RuleView::of((chunk.table, chain), &r, family, names, buf);
                            found.push((i, view));
                        }
                    })?;
                }
                Ok(found)
            })
            .collect();
        for part in parts {
            for (i, v) in part? {
                views[i].push(v);
            }
        }
        Ok(())
    })?;
    Ok(views)
}

/// Missing, extra, changed and reordered rules of one chain whose keys differ.
///
/// `key_texts` gives the texts of `got`'s keys, in order: they are written only for a chain
/// whose rules are all there in another order (KP904).
fn chain_details(
    (table, chain): (&str, &str),
    (want, got): (&[RuleView], &[RuleView]),
    ex: &Explained,
    key_texts: &dyn Fn() -> Vec<String>,
    out: &mut Vec<Finding>,
) {
    let table_chain = format!("{table} {chain}");
    let mut counts: HashMap<Fingerprint, isize> = HashMap::new();
    for k in want.iter().filter_map(|r| r.key) {
        *counts.entry(k).or_default() += 1;
    }
    for k in got.iter().filter_map(|r| r.key) {
        *counts.entry(k).or_default() -= 1;
    }
    let mut missing: Vec<&RuleView> = Vec::new();
    let mut budget = counts.clone();
    for r in want {
        if let Some(n) = r.key.and_then(|k| budget.get_mut(&k))
            && *n > 0
        {
            *n -= 1;
            missing.push(r);
        }
    }
    let mut extra: Vec<&RuleView> = Vec::new();
    let mut budget = counts;
    for r in got {
        if let Some(n) = r.key.and_then(|k| budget.get_mut(&k))
            && *n < 0
        {
            *n += 1;
            extra.push(r);
        }
    }
    missing.retain(|r| !r.explained);
    extra.retain(|r| !r.explained);
    // Pairs of one missing and one extra rule of the same owner: a changed rule.
    let mut changed: Vec<(&RuleView, &RuleView)> = Vec::new();
    if is_ordered(table, chain) && missing.len() == extra.len() {
        changed = missing.iter().copied().zip(extra.iter().copied()).collect();
        missing.clear();
        extra.clear();
    }
    for (w, g) in changed {
        let mut f = cat::RULE_CHANGED
            .finding(format!(
                "a rule of {table_chain} differs from what kube-proxy writes"
            ))
            .chain(table_chain.clone())
            .expected(w.line.clone())
            .actual(g.line.clone());
        if let Some(s) = &w.owner {
            f = f.service(s.clone());
        }
        out.push(f);
    }
    for r in missing {
        let mut f = cat::RULE_MISSING
            .finding(format!("{table_chain} lacks a rule kube-proxy writes"))
            .chain(table_chain.clone())
            .expected(r.line.clone())
            .actual("no such rule");
        if let Some(s) = &r.owner {
            f = f.service(s.clone());
        }
        out.push(f);
    }
    for r in extra {
        let mut f = cat::RULE_EXTRA
            .finding(format!(
                "{table_chain} holds a rule kube-proxy does not write"
            ))
            .chain(table_chain.clone())
            .expected("no such rule")
            .actual(r.line.clone());
        if let Some(s) = &r.owner {
            f = f.service(s.clone());
        }
        out.push(f);
    }
    if ex.chains.contains(chain) || !is_ordered(table, chain) {
        return;
    }
    // KP904: the same rules in another order.
    let w: Vec<Fingerprint> = want.iter().filter_map(|r| r.key).collect();
    let g: Vec<Fingerprint> = got.iter().filter_map(|r| r.key).collect();
    let mut ws = w.clone();
    let mut gs = g.clone();
    ws.sort_unstable();
    gs.sort_unstable();
    if ws == gs && w != g {
        // The same keys: each of `want`'s has the text of the equal one of `got`.
        let texts: HashMap<Fingerprint, String> = g.iter().copied().zip(key_texts()).collect();
        let text = |k: &Fingerprint| texts.get(k).map_or("", String::as_str);
        let w: Vec<&str> = w.iter().map(text).collect();
        let g: Vec<&str> = g.iter().map(text).collect();
        out.push(
            cat::RULE_ORDER
                .finding(format!(
                    "{table_chain} holds kube-proxy's rules in another order"
                ))
                .chain(table_chain)
                .expected(w.join(" | "))
                .actual(g.join(" | ")),
        );
    }
}

/// KP904 for nat `KUBE-SERVICES`: the NodePort tail rule(s) must come after every service rule.
fn tail_last(
    table: &str,
    chain: &str,
    (ac, omit): (&crate::model::Chain<'_>, Omit),
    out: &mut Vec<Finding>,
) {
    if table != "nat" || chain != "KUBE-SERVICES" {
        return;
    }
    // Optional rules have no key and take no position, as in the comparison itself.
    let positions: Vec<bool> = ac
        .rules
        .iter()
        .filter(|r| !optional(table, chain, r, omit))
        .map(|r| is_tail(r))
        .collect();
    let last_non_tail = positions.iter().rposition(|t| !t);
    let first_tail = positions.iter().position(|t| *t);
    if let (Some(l), Some(t)) = (last_non_tail, first_tail)
        && t < l
    {
        out.push(
            cat::RULE_ORDER
                .finding("nat KUBE-SERVICES: the NodePort rule is not the last rule; later service rules are shadowed for local addresses".to_string())
                .chain(format!("{table} {chain}"))
                .expected("the KUBE-NODEPORTS jump last")
                .actual(format!("at position {} of {}", t + 1, positions.len())),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{ExpectedRules, ExpectedTable, KeyDigest, screen_split};
    use crate::model::Fingerprint;
    use crate::proxier::iptables::{RenderChunk, render_decisions_chunks};
    use kproxy_parsers::iptables::{Family, ParseOptions};

    /// Split into parallel tasks of one chain each, the screen says of every chain what one pass
    /// says, in the same order (the testdata cluster's render against a drifted dump of it).
    #[test]
    fn split_screen_says_what_one_pass_says() {
        let (plan, facts) = crate::compare::fixture::cluster_decisions();
        let render = |sink: &mut dyn FnMut(RenderChunk<'_>)| {
            let _ = render_decisions_chunks(&plan, &facts, sink);
        };
        let dump = crate::compare::fixture::drifted_dump();
        let actual = crate::model::Ruleset::parse(&dump, &ParseOptions::strict()).expect("dump");
        let keys = || {
            ExpectedRules::build(&render, Family::V4, plan.nat_chains_estimate())
                .expect("render keys")
        };
        let one = screen_split(keys(), &actual, usize::MAX);
        assert!(one.chains.len() >= 2, "several tasks");
        assert!(
            one.chains
                .iter()
                .any(|(_, _, s)| *s == super::Status::Differs),
            "the drifted dump differs somewhere"
        );
        let split = screen_split(keys(), &actual, 1);
        assert_eq!(split.chains, one.chains);
    }

    /// Chains written in one run and chains written in several (the render interleaves
    /// `KUBE-SERVICES` with each service's chains) both get the digest of their own keys in
    /// order; optional rules count as rules but not as keys.
    #[test]
    fn interleaved_chains_keep_their_own_keys() {
        let k = |t: &str| Some(Fingerprint::of_text(t));
        let writes = [
            ("KUBE-SERVICES", k("s1")),
            ("KUBE-SVC-A", k("a1")),
            ("KUBE-SVC-A", k("a2")),
            ("KUBE-SERVICES", k("s2")),
            ("KUBE-SVC-B", k("b1")),
            ("KUBE-SERVICES", k("s3")),
            ("KUBE-SEP-C", k("c1")),
            ("KUBE-SEP-C", None),
            ("KUBE-SVC-A", k("a3")),
            ("KUBE-SERVICES", k("s4")),
        ];
        let mut t = ExpectedTable::default();
        t.declare("KUBE-SVC-B");
        for (chain, key) in writes {
            t.push_key(chain, key);
        }
        t.order();
        let got: Vec<(&str, u32, KeyDigest)> = t
            .iter()
            .map(|(name, c)| (name, c.rules, c.digest))
            .collect();
        let digest = |keys: &[&str]| KeyDigest::of(keys.iter().map(|t| Fingerprint::of_text(t)));
        let want = [
            ("KUBE-SVC-B", 1, digest(&["b1"])),
            ("KUBE-SERVICES", 4, digest(&["s1", "s2", "s3", "s4"])),
            ("KUBE-SVC-A", 3, digest(&["a1", "a2", "a3"])),
            ("KUBE-SEP-C", 2, digest(&["c1"])),
        ];
        assert_eq!(got, want.to_vec());
        assert_ne!(digest(&["a1", "a2"]), digest(&["a2", "a1"]), "order counts");
        assert_ne!(digest(&["a1"]), digest(&["a1", "a1"]), "repeats count");
    }
}
