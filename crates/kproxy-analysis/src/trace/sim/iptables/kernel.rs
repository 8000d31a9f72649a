//! `--model kernel`: the first packet of a new connection walked through the hooks as netfilter
//! would, producing a distribution of outcomes.
//!
//! Traffic arriving at the node (`--from pod|external`): raw/mangle PREROUTING → nat PREROUTING
//! → routing on the (possibly DNAT'd) destination → local: mangle/filter/security/nat INPUT;
//! forwarded: mangle/filter/security FORWARD → mangle/nat POSTROUTING. Node-originated traffic
//! (`--from node`): raw/mangle/nat/filter/security OUTPUT → mangle/nat POSTROUTING, and for a
//! local destination the loopback re-entry (raw/mangle PREROUTING, mangle/filter/security INPUT;
//! nat is not consulted again, the connection's NAT is already set up). Tables run only where
//! the dump has the chain, so raw/mangle cost nothing when absent.
//!
//! Each `statistic` rule splits the walk into a matched and a skipped branch with their
//! probabilities (the kernel's stored `round(p·2^31)/2^31`), so the result is every outcome
//! with its probability, DNAT destination, verdict, masquerade/SNAT and rule-by-rule path.
//! Marks persist along the walk (KUBE-MARK-MASQ sets, KUBE-POSTROUTING clears), conntrack state
//! is `NEW` (plus virtual `DNAT`/`SNAT` after NAT), `recent` lists start empty.
//!
//! The MASQUERADE source is the node address the packet would leave from; lacking the routing
//! table, it is taken as the non-loopback `--local-ip` of the packet's family sharing the longest
//! prefix with the destination (the address on the directly connected subnet).

use super::super::SimError;
use super::super::engine::{
    ConntrackState, LocalAddrs, MatchCtx, MatchPolicy, PacketView, RuleMatch, matches,
};
use super::super::packet::PacketSpec;
use crate::model::Ruleset;
use kproxy_parsers::iptables::{GenericOpt, MarkOp, Match, Module, RecentAction, Rule, Target};
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Where the packet comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Origin {
    /// A pod on this node (arrives through PREROUTING).
    Pod,
    /// A host outside the node (arrives through PREROUTING).
    External,
    /// A process on the node itself (starts in OUTPUT).
    Node,
}

impl Origin {
    /// `pod`, `external`, `node`.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Pod => "pod",
            Origin::External => "external",
            Origin::Node => "node",
        }
    }
}

/// What the kernel walk needs besides the rules.
#[derive(Debug, Clone)]
pub struct KernelInput {
    /// The packet.
    pub packet: PacketSpec,
    /// Where it comes from.
    pub origin: Origin,
    /// The node's addresses (loopback addresses are always local).
    pub local: LocalAddrs,
    /// The interface it arrives on, if known (evaluates `-i`).
    pub in_iface: Option<String>,
    /// The interface it leaves by, if known (evaluates `-o`).
    pub out_iface: Option<String>,
}

/// The final verdict of a branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Verdict {
    /// The packet passes (delivered locally, forwarded or sent).
    Accept,
    /// Dropped.
    Drop,
    /// Rejected (an ICMP error or TCP reset is returned).
    Reject,
    /// Not known: the walk met a statement of kube-proxy's own that this build cannot read
    /// (`decided_by` says where), and nothing past it is concluded.
    Unknown,
}

impl Verdict {
    /// `ACCEPT`, `DROP`, `REJECT`, `UNKNOWN`.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Accept => "ACCEPT",
            Verdict::Drop => "DROP",
            Verdict::Reject => "REJECT",
            Verdict::Unknown => "UNKNOWN",
        }
    }
}

/// Where an accepted packet goes after the walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Route {
    /// Delivered to a local socket (INPUT).
    Local,
    /// Forwarded through the node (FORWARD).
    Forward,
    /// Sent by the node to another host (OUTPUT, not looped back).
    Output,
}

/// What happened at one step of the path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepResult {
    /// The rule matched (its target was applied).
    Matched,
    /// The rule's `statistic` fired: this branch took the rule, with this probability.
    MatchedRandom(f64),
    /// The rule did not match.
    Skipped {
        /// Index into `rule.matches` of the criterion that failed.
        at: usize,
        /// Why the criterion was undecidable, when it was taken as not matching for that reason.
        undecidable: Option<&'static str>,
    },
    /// The rule's `statistic` did not fire on this branch (probability of that).
    SkippedRandom(f64),
    /// The end of a built-in chain: its policy applied.
    Policy,
}

/// The rule a step evaluated: an iptables rule, or an nftables rule (`--nft-ruleset`).
#[derive(Debug, Clone, Copy)]
pub enum StepRule<'d, 'a> {
    /// An iptables rule.
    Iptables(&'d Rule<'a>),
    /// An nftables rule.
    Nft(&'d kproxy_parsers::nft::Rule<'a>),
}

impl<'d> StepRule<'d, '_> {
    /// The rule as written (iptables) or in nft's command form (nftables).
    pub fn text(&self) -> std::borrow::Cow<'d, str> {
        match self {
            StepRule::Iptables(r) => std::borrow::Cow::Borrowed(r.raw),
            StepRule::Nft(r) => std::borrow::Cow::Owned(r.to_string()),
        }
    }

    /// The criterion (iptables match) or statement (nftables) at index `at`, as written.
    pub fn describe(&self, at: usize) -> Option<String> {
        match self {
            StepRule::Iptables(r) => r
                .matches()
                .nth(at)
                .map(|m| super::super::engine::describe_match(r, &m)),
            StepRule::Nft(r) => r.stmts.get(at).map(ToString::to_string),
        }
    }
}

/// One step of a path: `table/chain#n` and what happened.
#[derive(Debug, Clone)]
pub struct Step<'d, 'a> {
    /// Table name (`nat`; for nftables the table's name, `kube-proxy`).
    pub table: &'a str,
    /// Chain name.
    pub chain: &'a str,
    /// 1-based rule number in the chain (0 for a policy step).
    pub number: usize,
    /// What happened.
    pub result: StepResult,
    /// The rule (`None` for a policy step).
    pub rule: Option<StepRule<'d, 'a>>,
    /// The chain policy (policy steps only).
    pub policy: Option<&'a str>,
}

impl Step<'_, '_> {
    /// `table/chain#n` (or `table/chain policy`).
    pub fn location(&self) -> String {
        match self.result {
            StepResult::Policy => format!("{}/{} policy", self.table, self.chain),
            _ => format!("{}/{}#{}", self.table, self.chain, self.number),
        }
    }
}

/// One possible fate of the packet.
#[derive(Debug, Clone)]
pub struct Outcome<'d, 'a> {
    /// Probability of this branch.
    pub probability: f64,
    /// The DNAT destination, if the destination was rewritten.
    pub dnat: Option<(IpAddr, u16)>,
    /// The verdict.
    pub verdict: Verdict,
    /// The rule or policy that decided the verdict (`filter/INPUT policy`, `filter/KUBE-SERVICES#4`).
    pub decided_by: Option<String>,
    /// Where an accepted packet goes.
    pub route: Option<Route>,
    /// True if a MASQUERADE target rewrote the source.
    pub masquerade: bool,
    /// The new source address after MASQUERADE/SNAT.
    pub snat: Option<IpAddr>,
    /// The packet mark at the end of the walk.
    pub mark: u32,
    /// Every rule evaluated, in order.
    pub path: Vec<Step<'d, 'a>>,
}

/// Every outcome of one packet.
#[derive(Debug, Clone)]
pub struct Distribution<'d, 'a> {
    /// The packet traced.
    pub packet: PacketSpec,
    /// Where it came from.
    pub origin: Origin,
    /// Outcomes in walk order (the first branch takes every `statistic` rule it meets).
    pub outcomes: Vec<Outcome<'d, 'a>>,
    /// Assumptions the walk had to make (undecidable criteria, unknown targets), deduplicated.
    pub notes: Vec<String>,
}

/// The walk's stage: a hook and the tables evaluated there, in priority order (the nftables
/// walk shares it, with the hooks' nft names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::trace::sim) enum Phase {
    Prerouting,
    Input,
    Forward,
    Output,
    Postrouting,
    LoopbackPrerouting,
    LoopbackInput,
    Done,
}

impl Phase {
    fn hook(self) -> &'static str {
        match self {
            Phase::Prerouting | Phase::LoopbackPrerouting => "PREROUTING",
            Phase::Input | Phase::LoopbackInput => "INPUT",
            Phase::Forward => "FORWARD",
            Phase::Output => "OUTPUT",
            Phase::Postrouting => "POSTROUTING",
            Phase::Done => "",
        }
    }

    fn tables(self) -> &'static [&'static str] {
        match self {
            Phase::Prerouting => &["raw", "mangle", "nat"],
            Phase::Input => &["mangle", "filter", "security", "nat"],
            Phase::Forward => &["mangle", "filter", "security"],
            Phase::Output => &["raw", "mangle", "nat", "filter", "security"],
            Phase::Postrouting => &["mangle", "nat"],
            Phase::LoopbackPrerouting => &["raw", "mangle"],
            Phase::LoopbackInput => &["mangle", "filter", "security"],
            Phase::Done => &[],
        }
    }
}

/// Deepest chain nesting followed before giving up.
pub(in crate::trace::sim) const MAX_DEPTH: usize = 64;
/// Most outcomes one packet may have.
pub(in crate::trace::sim) const MAX_OUTCOMES: usize = 100_000;
/// Most times one branch may enter the same chain. A packet enters a chain once per jump to it,
/// and kube-proxy's rules call `KUBE-MARK-MASQ` and friends at most a few times per hook; only a
/// `-j`/`-g` cycle (which `-g` keeps at a constant depth) reaches this.
const MAX_ENTRIES: u32 = 64;
/// Most rules evaluated over all branches: bounds time and the memory of the recorded paths
/// whatever the ruleset (a 10,000-service dump takes some 20,000 steps per branch).
pub(in crate::trace::sim) const MAX_STEPS: usize = 4_000_000;

#[derive(Debug, Clone)]
struct Frame<'a> {
    table: &'static str,
    chain: &'a str,
    next: usize,
}

/// One branch of the walk: the packet's state and where it is.
#[derive(Debug, Clone)]
struct Branch<'d, 'a> {
    probability: f64,
    src: IpAddr,
    dst: IpAddr,
    dport: u16,
    mark: u32,
    ct: ConntrackState,
    recent: Vec<&'a str>,
    dnat: Option<(IpAddr, u16)>,
    snat: Option<IpAddr>,
    masquerade: bool,
    phase: Phase,
    table_idx: usize,
    route: Option<Route>,
    stack: Vec<Frame<'a>>,
    /// How often this branch entered each user chain: the loop guard.
    entered: Entries<'a>,
    filter_decision: Option<String>,
    path: Vec<Step<'d, 'a>>,
}

struct Walker<'r, 'd, 'a> {
    rules: &'d Ruleset<'a>,
    input: &'r KernelInput,
    pending: VecDeque<Branch<'d, 'a>>,
    outcomes: Vec<Outcome<'d, 'a>>,
    notes: Notes,
    /// Rules evaluated so far, over all branches.
    steps: usize,
}

/// Walks `input.packet` through `rules` and returns every outcome.
pub fn simulate<'d, 'a>(
    rules: &'d Ruleset<'a>,
    input: &KernelInput,
) -> Result<Distribution<'d, 'a>, SimError> {
    let p = input.packet;
    let start = Branch {
        probability: 1.0,
        src: p.src,
        dst: p.dst,
        dport: p.dport,
        mark: 0,
        ct: ConntrackState::default(),
        recent: Vec::new(),
        dnat: None,
        snat: None,
        masquerade: false,
        phase: match input.origin {
            Origin::Node => Phase::Output,
            Origin::Pod | Origin::External => Phase::Prerouting,
        },
        table_idx: 0,
        route: None,
        stack: Vec::new(),
        entered: Entries::default(),
        filter_decision: None,
        path: Vec::new(),
    };
    let mut walker = Walker {
        rules,
        input,
        pending: VecDeque::from([start]),
        outcomes: Vec::new(),
        notes: Notes::default(),
        steps: 0,
    };
    if input.local.ips().is_empty() {
        walker.note(
            "no node addresses given (--local-ip/--node-ip): only loopback addresses count as local"
                .to_string(),
        );
    }
    if rules.table("nat").is_none() {
        walker.note("the dump has no nat table: no service rules apply".to_string());
    }
    while let Some(branch) = walker.pending.pop_front() {
        let outcome = walker.run(branch)?;
        walker.outcomes.push(outcome);
        if walker.outcomes.len() + walker.pending.len() > MAX_OUTCOMES {
            return Err(SimError::TooManyOutcomes {
                limit: MAX_OUTCOMES,
            });
        }
    }
    Ok(Distribution {
        packet: p,
        origin: input.origin,
        outcomes: walker.outcomes,
        notes: walker.notes.into_list(),
    })
}

impl<'d, 'a> Walker<'_, 'd, 'a> {
    fn note(&mut self, text: String) {
        self.notes.add(text);
    }

    fn finish(
        &self,
        b: Branch<'d, 'a>,
        verdict: Verdict,
        decided_by: Option<String>,
    ) -> Outcome<'d, 'a> {
        Outcome {
            probability: b.probability,
            dnat: b.dnat,
            verdict,
            decided_by,
            route: if verdict == Verdict::Accept {
                b.route
            } else {
                None
            },
            masquerade: b.masquerade,
            snat: b.snat,
            mark: b.mark,
            path: b.path,
        }
    }

    /// The packet as rules see it now.
    fn view<'s>(&'s self, b: &'s Branch<'d, 'a>) -> PacketView<'s> {
        let loopback = matches!(b.phase, Phase::LoopbackPrerouting | Phase::LoopbackInput);
        let in_iface = match b.phase {
            _ if loopback => Some("lo"),
            Phase::Output => None,
            _ if self.input.origin == Origin::Node => None,
            _ => self.input.in_iface.as_deref(),
        };
        let out_iface = match b.phase {
            Phase::Prerouting | Phase::Input | Phase::LoopbackPrerouting | Phase::LoopbackInput => {
                None
            }
            _ if self.input.local.contains(b.dst) => Some("lo"),
            _ => self.input.out_iface.as_deref(),
        };
        PacketView {
            src: b.src,
            sport: self.input.packet.sport,
            dst: b.dst,
            dport: b.dport,
            proto: self.input.packet.proto,
            in_iface,
            out_iface,
            mark: b.mark,
            ct: b.ct,
            recent: &b.recent,
        }
    }

    /// The routing decision after PREROUTING / the next stage after a hook.
    fn next_phase(&self, b: &Branch<'d, 'a>) -> Phase {
        let local = self.input.local.contains(b.dst);
        match b.phase {
            Phase::Prerouting if local => Phase::Input,
            Phase::Prerouting => Phase::Forward,
            Phase::Forward | Phase::Output => Phase::Postrouting,
            Phase::Postrouting if self.input.origin == Origin::Node && local => {
                Phase::LoopbackPrerouting
            }
            Phase::LoopbackPrerouting => Phase::LoopbackInput,
            Phase::Input | Phase::LoopbackInput | Phase::Postrouting | Phase::Done => Phase::Done,
        }
    }

    fn route_of(phase: Phase) -> Option<Route> {
        match phase {
            Phase::Input | Phase::LoopbackInput => Some(Route::Local),
            Phase::Forward => Some(Route::Forward),
            Phase::Output => Some(Route::Output),
            _ => None,
        }
    }

    /// Runs one branch to its end; forks go to `pending`.
    fn run(&mut self, mut b: Branch<'d, 'a>) -> Result<Outcome<'d, 'a>, SimError> {
        let rules = self.rules;
        let input = self.input;
        loop {
            // Enter the next built-in chain when the previous one finished.
            if b.stack.is_empty() {
                let tables = b.phase.tables();
                if let Some(&table) = tables.get(b.table_idx) {
                    b.table_idx += 1;
                    let hook = b.phase.hook();
                    if rules.chain(table, hook).is_some() {
                        b.stack.push(Frame {
                            table,
                            chain: hook,
                            next: 0,
                        });
                    }
                    continue;
                }
                b.phase = self.next_phase(&b);
                b.table_idx = 0;
                if let Some(route) = Self::route_of(b.phase) {
                    b.route = Some(route);
                }
                if b.phase == Phase::Done {
                    let decided = b.filter_decision.clone();
                    return Ok(self.finish(b, Verdict::Accept, decided));
                }
                continue;
            }
            let depth = b.stack.len();
            let Some(frame) = b.stack.last_mut() else {
                continue;
            };
            let (table, chain_name, idx) = (frame.table, frame.chain, frame.next);
            let Some(chain) = rules.chain(table, chain_name) else {
                b.stack.pop();
                continue;
            };
            let Some(rule) = chain.rules.get(idx).map(|e| &e.rule) else {
                // End of chain: a user chain returns, a built-in chain applies its policy.
                if depth > 1 {
                    b.stack.pop();
                    continue;
                }
                b.stack.clear();
                let policy = chain.policy.unwrap_or("ACCEPT");
                if !chain.rules.is_empty() || policy != "ACCEPT" {
                    b.path.push(Step {
                        table,
                        chain: chain_name,
                        number: 0,
                        result: StepResult::Policy,
                        rule: None,
                        policy: Some(policy),
                    });
                }
                let decided = format!("{table}/{chain_name} policy {policy}");
                if policy.eq_ignore_ascii_case("DROP") {
                    return Ok(self.finish(b, Verdict::Drop, Some(decided)));
                }
                if table == "filter" {
                    b.filter_decision = Some(decided);
                }
                continue;
            };
            frame.next += 1;
            let number = idx + 1;
            self.steps += 1;
            if self.steps > MAX_STEPS {
                return Err(SimError::TooManySteps { limit: MAX_STEPS });
            }
            let ctx = MatchCtx {
                policy: MatchPolicy::Kernel,
                local: &input.local,
            };
            let result = matches(rule, &self.view(&b), &ctx);
            let step = |result| Step {
                table,
                chain: chain_name,
                number,
                result,
                rule: Some(StepRule::Iptables(rule)),
                policy: None,
            };
            match result {
                RuleMatch::Fails { at, undecidable } => {
                    if let Some(why) = undecidable {
                        let what = rule
                            .matches()
                            .nth(at)
                            .map(|m| super::super::engine::describe_match(rule, &m))
                            .unwrap_or_default();
                        self.note(format!(
                            "`{what}` ({table}/{chain_name}#{number}): {why}; taken as not matching"
                        ));
                    }
                    b.path.push(step(StepResult::Skipped { at, undecidable }));
                    continue;
                }
                RuleMatch::Random(p) => {
                    let mut other = b.clone();
                    other.probability *= 1.0 - p;
                    other.path.push(step(StepResult::SkippedRandom(1.0 - p)));
                    self.pending.push_back(other);
                    b.probability *= p;
                    b.path.push(step(StepResult::MatchedRandom(p)));
                }
                RuleMatch::Matches => b.path.push(step(StepResult::Matched)),
            }
            record_recent(rule, &mut b.recent);
            let here = format!("{table}/{chain_name}#{number}");
            let Some(target) = &rule.target() else {
                continue;
            };
            match target {
                Target::Jump(next) | Target::Goto(next) => {
                    if rules.chain(table, next).is_none() {
                        self.note(format!(
                            "{here} jumps to {next}, which does not exist in {table}; ignored"
                        ));
                        continue;
                    }
                    if depth >= MAX_DEPTH {
                        return Err(SimError::TooDeep {
                            chain: format!("{table}/{next}"),
                            depth: MAX_DEPTH,
                        });
                    }
                    b.entered.enter(table, next)?;
                    if matches!(target, Target::Goto(_)) {
                        if depth == 1 {
                            // The goto'd chain's end ends the built-in chain: policy next.
                            if let Some(f) = b.stack.last_mut() {
                                f.next = usize::MAX;
                            }
                        } else {
                            b.stack.pop();
                        }
                    }
                    b.stack.push(Frame {
                        table,
                        chain: next,
                        next: 0,
                    });
                }
                Target::Accept => {
                    b.stack.clear();
                    if table == "filter" {
                        b.filter_decision = Some(here);
                    }
                }
                Target::Drop => return Ok(self.finish(b, Verdict::Drop, Some(here))),
                Target::Reject { .. } => return Ok(self.finish(b, Verdict::Reject, Some(here))),
                Target::Return => {
                    if depth == 1 {
                        if let Some(f) = b.stack.last_mut() {
                            f.next = usize::MAX;
                        }
                    } else {
                        b.stack.pop();
                    }
                }
                Target::Dnat { to: range, .. } => {
                    if range.addr_last.is_some() || range.ports.is_some_and(|p| p.first != p.last) {
                        self.note(format!(
                            "{here}: DNAT to a range; the first address/port is used"
                        ));
                    }
                    if let Some(addr) = range.addr {
                        b.dst = addr;
                    }
                    if let Some(ports) = range.ports {
                        b.dport = ports.first;
                    }
                    b.dnat = Some((b.dst, b.dport));
                    b.ct.dnat = true;
                    b.stack.clear();
                }
                Target::Snat { to, .. } => {
                    if let Some(addr) = to.addr {
                        b.src = addr;
                        b.snat = Some(addr);
                        b.ct.snat = true;
                    }
                    b.stack.clear();
                }
                Target::Masquerade { .. } => {
                    match masquerade_source(b.dst, &input.local) {
                        Some(addr) => {
                            b.src = addr;
                            b.snat = Some(addr);
                        }
                        None => self.note(format!(
                            "{here}: MASQUERADE source unknown (give the node's addresses with --local-ip)"
                        )),
                    }
                    b.masquerade = true;
                    b.ct.snat = true;
                    b.stack.clear();
                }
                Target::Mark(op) => b.mark = apply_mark(*op, b.mark),
                Target::Notrack => b.ct.untracked = true,
                Target::Ct(opts) if rule.options(*opts).any(|o| o.name == "notrack") => {
                    b.ct.untracked = true
                }
                Target::Ct(_) | Target::Connmark(_) | Target::Log(_) | Target::Trace => {}
                Target::Generic { name, options } if *name == "REDIRECT" => {
                    b.dst = if input.origin == Origin::Node {
                        loopback_of(b.dst)
                    } else {
                        let same_family = |ip: &IpAddr| ip.is_ipv4() == b.dst.is_ipv4();
                        input
                            .local
                            .ips()
                            .iter()
                            .copied()
                            .find(same_family)
                            .unwrap_or(loopback_of(b.dst))
                    };
                    if let Some(port) = to_ports(rule.options(*options)) {
                        b.dport = port;
                    }
                    b.dnat = Some((b.dst, b.dport));
                    b.ct.dnat = true;
                    b.stack.clear();
                }
                Target::Generic { name, .. } => {
                    self.note(format!(
                        "{here}: target {name} is not modelled; treated as not terminating"
                    ));
                }
                Target::Unreadable { raw, reason } => {
                    self.note(format!("{here}: target `{raw}` is unreadable ({reason}); treated as not terminating"));
                }
            }
        }
    }
}

/// How often one branch entered each user chain (table, chain): the loop guard. A map, so that
/// each jump costs the same however many chains the walk has already been through.
#[derive(Debug, Clone, Default)]
pub(in crate::trace::sim) struct Entries<'a>(HashMap<(&'a str, &'a str), u32>);

impl<'a> Entries<'a> {
    /// Counts one more entry of `table`/`chain`; a loop error past [`MAX_ENTRIES`].
    pub(in crate::trace::sim) fn enter(
        &mut self,
        table: &'a str,
        chain: &'a str,
    ) -> Result<(), SimError> {
        let times = self.0.entry((table, chain)).or_insert(0);
        *times += 1;
        if *times > MAX_ENTRIES {
            return Err(SimError::Loop {
                chain: format!("{table}/{chain}"),
                times: *times,
            });
        }
        Ok(())
    }
}

/// A walk's notes, each once, in the order they were first made (a set beside the list, so a
/// walk that makes one note per rule stays linear).
#[derive(Debug, Default)]
pub(in crate::trace::sim) struct Notes {
    list: Vec<String>,
    seen: HashSet<String>,
}

impl Notes {
    /// Adds `text` unless it was noted already.
    pub(in crate::trace::sim) fn add(&mut self, text: String) {
        if !self.seen.contains(&text) {
            self.seen.insert(text.clone());
            self.list.push(text);
        }
    }

    /// The notes, in order.
    pub(in crate::trace::sim) fn into_list(self) -> Vec<String> {
        self.list
    }
}

/// `recent --set` adds the source to the list for the rest of the walk; `--remove` takes it off.
fn record_recent<'a>(rule: &Rule<'a>, recent: &mut Vec<&'a str>) {
    for m in rule.matches() {
        if let Match::Module(Module::Recent(r)) = m {
            match r.action {
                RecentAction::Set if !r.negated => recent.push(r.name),
                RecentAction::Remove => recent.retain(|n| *n != r.name),
                _ => {}
            }
        }
    }
}

/// `-j MARK` semantics.
pub fn apply_mark(op: MarkOp, mark: u32) -> u32 {
    match op {
        MarkOp::SetXmark { value, mask } => (mark & !mask) ^ value,
        MarkOp::SetMark { value, mask } => (mark & !mask) | value,
        MarkOp::Or(v) => mark | v,
        MarkOp::Xor(v) => mark ^ v,
        MarkOp::And(v) => mark & v,
    }
}

fn loopback_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

fn to_ports<'a>(mut options: impl Iterator<Item = GenericOpt<'a>>) -> Option<u16> {
    let opt = options.find(|o| o.name == "to-ports")?;
    opt.values
        .iter()
        .next()?
        .split(['-', ':'])
        .next()?
        .parse()
        .ok()
}

/// The address MASQUERADE picks: loopback for a loopback destination, else the non-loopback
/// local address of the same family with the longest common prefix with `dst`.
pub fn masquerade_source(dst: IpAddr, local: &LocalAddrs) -> Option<IpAddr> {
    if dst.is_loopback() {
        return Some(loopback_of(dst));
    }
    let common = |a: IpAddr| -> u32 {
        match (a, dst) {
            (IpAddr::V4(a), IpAddr::V4(d)) => (u32::from(a) ^ u32::from(d)).leading_zeros(),
            (IpAddr::V6(a), IpAddr::V6(d)) => (u128::from(a) ^ u128::from(d)).leading_zeros(),
            _ => 0,
        }
    };
    local
        .ips()
        .iter()
        .copied()
        .filter(|ip| ip.is_ipv4() == dst.is_ipv4() && !ip.is_loopback())
        .enumerate()
        .max_by_key(|(i, ip)| (common(*ip), std::cmp::Reverse(*i)))
        .map(|(_, ip)| ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::iptables::ParseOptions;

    /// (probability, DNAT, verdict, masquerade, SNAT source, notes) per outcome.
    type Row = (
        f64,
        Option<String>,
        Verdict,
        bool,
        Option<IpAddr>,
        Vec<String>,
    );

    fn run(rules: &str, packet: &str, origin: Origin, in_iface: Option<&str>) -> Vec<Row> {
        let rs = Ruleset::parse(rules, &ParseOptions::strict()).unwrap();
        let input = KernelInput {
            packet: packet.parse().unwrap(),
            origin,
            local: LocalAddrs::kernel(vec![
                "192.168.1.2".parse().unwrap(),
                "10.1.0.1".parse().unwrap(),
            ]),
            in_iface: in_iface.map(str::to_string),
            out_iface: None,
        };
        let d = simulate(&rs, &input).unwrap();
        d.outcomes
            .iter()
            .map(|o| {
                (
                    o.probability,
                    o.dnat.map(|(ip, p)| format!("{ip}:{p}")),
                    o.verdict,
                    o.masquerade,
                    o.snat,
                    d.notes.clone(),
                )
            })
            .collect()
    }

    const SERVICE: &str = "*nat
:PREROUTING ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-A - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-POSTROUTING - [0:0]
-A PREROUTING -j KUBE-SERVICES
-A OUTPUT -j KUBE-SERVICES
-A POSTROUTING -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 172.30.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-SVC-A
-A KUBE-SVC-A ! -s 10.244.0.0/16 -d 172.30.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-A -m statistic --mode random --probability 0.33333333349 -j DNAT --to-destination 10.244.1.5:8080
-A KUBE-SVC-A -m statistic --mode random --probability 0.50000000000 -j DNAT --to-destination 10.244.1.6:8080
-A KUBE-SVC-A -j DNAT --to-destination 10.244.2.7:8080
COMMIT
";

    /// `n` chains jumped to in sequence from KUBE-SERVICES, each holding a rule that cannot be
    /// decided (an ipset of its own, so each makes a note of its own) and returns.
    fn chain_sequence(n: usize) -> String {
        let mut text = String::from("*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n");
        for i in 0..n {
            text.push_str(&format!(":C{i} - [0:0]\n"));
        }
        text.push_str("-A PREROUTING -j KUBE-SERVICES\n");
        for i in 0..n {
            text.push_str(&format!("-A KUBE-SERVICES -j C{i}\n"));
        }
        for i in 0..n {
            text.push_str(&format!("-A C{i} -m set --match-set S{i} dst -j RETURN\n"));
        }
        text.push_str("COMMIT\n");
        text
    }

    /// The fastest of three walks of `rules` (the machine may be busy with other work).
    fn walk_time(rules: &Ruleset<'_>) -> (std::time::Duration, usize, usize) {
        let input = KernelInput {
            packet: "10.1.1.1->10.96.0.1:80/tcp".parse().unwrap(),
            origin: Origin::Pod,
            local: LocalAddrs::kernel(Vec::new()),
            in_iface: None,
            out_iface: None,
        };
        let mut best = std::time::Duration::MAX;
        let mut shape = (0, 0);
        for _ in 0..3 {
            let t0 = std::time::Instant::now();
            let d = simulate(rules, &input).unwrap();
            best = best.min(t0.elapsed());
            shape = (d.outcomes[0].path.len(), d.notes.len());
        }
        (best, shape.0, shape.1)
    }

    #[test]
    fn walk_time_grows_linearly_with_the_chains_jumped_to() {
        // A loop guard or note list searched from the start at each step makes the walk
        // quadratic: four times the chains would take sixteen times as long.
        let (small, large) = (5_000, 20_000);
        let (small_text, large_text) = (chain_sequence(small), chain_sequence(large));
        let opts = ParseOptions::strict();
        let small_rules = Ruleset::parse(&small_text, &opts).unwrap();
        let large_rules = Ruleset::parse(&large_text, &opts).unwrap();
        let (t_small, steps, notes) = walk_time(&small_rules);
        // PREROUTING's jump and policy, and per chain the jump to it and its rule; one note per
        // chain plus the one about missing node addresses.
        assert_eq!((steps, notes), (2 + 2 * small, small + 1));
        let (t_large, steps, notes) = walk_time(&large_rules);
        assert_eq!((steps, notes), (2 + 2 * large, large + 1));
        let ratio = t_large.as_secs_f64() / t_small.as_secs_f64().max(1e-6);
        assert!(
            ratio < 8.0,
            "4x the chains took {ratio:.1}x as long ({t_small:?} for {small}, {t_large:?} for {large})"
        );
    }

    #[test]
    fn statistic_splits_into_a_distribution_and_marks_drive_masquerade() {
        let out = run(
            SERVICE,
            "192.168.1.9->172.30.0.10:80/tcp",
            Origin::External,
            None,
        );
        let dnats: Vec<_> = out.iter().map(|o| o.1.clone().unwrap()).collect();
        assert_eq!(
            dnats,
            ["10.244.1.5:8080", "10.244.1.6:8080", "10.244.2.7:8080"]
        );
        for o in &out {
            assert!((o.0 - 1.0 / 3.0).abs() < 1e-6, "{}", o.0);
            assert_eq!((o.2, o.3), (Verdict::Accept, true));
            // The local address on the destination's subnet side is the longest-prefix match.
            assert_eq!(o.4, Some("10.1.0.1".parse().unwrap()));
        }
        let pod = run(SERVICE, "10.244.3.3->172.30.0.10:80/tcp", Origin::Pod, None);
        assert!(pod.iter().all(|o| !o.3 && o.4.is_none()));
        let miss = run(SERVICE, "10.244.3.3->172.30.0.10:81/tcp", Origin::Pod, None);
        assert_eq!(miss.len(), 1);
        assert_eq!(miss[0].1, None);
    }

    #[test]
    fn policies_goto_return_and_drop() {
        let rules = "*nat
:PREROUTING ACCEPT [0:0]
:A - [0:0]
:B - [0:0]
-A PREROUTING -j A
-A PREROUTING -p tcp -j DNAT --to-destination 10.0.0.9:81
-A A -g B
-A A -j DNAT --to-destination 10.0.0.1:80
-A B -j RETURN
-A B -j DNAT --to-destination 10.0.0.2:80
COMMIT
*filter
:FORWARD DROP [0:0]
:X - [0:0]
-A FORWARD -d 10.0.0.9/32 -j X
-A X -p tcp -m tcp --dport 81 -j ACCEPT
COMMIT
";
        let out = run(
            rules,
            "192.168.1.9->172.30.0.10:80/tcp",
            Origin::External,
            None,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].1.as_deref(), Some("10.0.0.9:81"));
        assert_eq!(out[0].2, Verdict::Accept);
        let dropped = rules.replace("--dport 81 -j ACCEPT", "--dport 82 -j ACCEPT");
        let out = run(
            &dropped,
            "192.168.1.9->172.30.0.10:80/tcp",
            Origin::External,
            None,
        );
        assert_eq!(out[0].2, Verdict::Drop);
    }

    #[test]
    fn conntrack_recent_and_interfaces() {
        let rules = "*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -m recent --rcheck --name S -j DROP
-A INPUT -m recent --set --name S
-A INPUT -i eth9 -j DROP
-A INPUT -m recent --rcheck --name S -m conntrack --ctstate NEW -d 192.168.1.2/32 -p tcp -m tcp --dport 22 -j REJECT
-A INPUT -j ACCEPT
-A OUTPUT -d 127.0.0.0/8 ! -s 127.0.0.0/8 -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT -j DROP
COMMIT
";
        let out = run(
            rules,
            "192.168.1.9->192.168.1.2:22/tcp",
            Origin::External,
            None,
        );
        assert_eq!(out[0].2, Verdict::Reject);
        assert!(
            out[0]
                .5
                .iter()
                .any(|n| n.contains("-i eth9") && n.contains("--in-interface")),
            "{:?}",
            out[0].5
        );
        let out = run(
            rules,
            "192.168.1.9->192.168.1.2:22/tcp",
            Origin::External,
            Some("eth9"),
        );
        assert_eq!(out[0].2, Verdict::Drop);
        let out = run(rules, "192.168.1.2->127.0.0.1:22/tcp", Origin::Node, None);
        assert_eq!(out[0].2, Verdict::Drop);
    }

    #[test]
    fn node_traffic_to_a_local_address_loops_back_through_input() {
        let rules = "*filter
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
-A INPUT -i lo -p tcp -m tcp --dport 10250 -j REJECT
COMMIT
";
        let out = run(
            rules,
            "192.168.1.2->192.168.1.2:10250/tcp",
            Origin::Node,
            None,
        );
        assert_eq!(out[0].2, Verdict::Reject);
    }
}
