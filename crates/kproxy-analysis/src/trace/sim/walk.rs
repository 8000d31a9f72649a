//! The walk both kernel models share: the first packet of a new connection taken through the
//! hooks netfilter runs for it, with every fork of the walk kept as a branch with its
//! probability. A model ([`Model`]: `iptables`, `nftables`) supplies only its chains and how one
//! of their rules is evaluated; the hooks, the branch queue, the limits, the chain stack
//! (jump, goto, return, the base chain's policy), the outcomes and notes are here.
//!
//! Traffic arriving at the node (`--from pod|external`) runs prerouting, then routing on the
//! (possibly DNAT'd) destination: input for a local one, else forward and postrouting.
//! Node-originated traffic (`--from node`) runs output and postrouting, and for a local
//! destination the loopback re-entry: prerouting and input again, where NAT is no longer
//! consulted (the connection's NAT is already set up).
//!
//! The MASQUERADE source is the node address the packet would leave from; lacking the routing
//! table, it is taken as the non-loopback `--local-ip` of the packet's family sharing the longest
//! prefix with the destination (the address on the directly connected subnet).

use super::SimError;
use super::engine::{ConntrackState, LocalAddrs};
use super::outcome::{Distribution, Outcome, Route, Step, StepResult, Verdict};
use super::packet::PacketSpec;
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

/// The walk's stage: a hook, and whether it is the loopback re-entry of the node's own traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
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
    /// Where a packet from `origin` starts.
    fn start(origin: Origin) -> Self {
        match origin {
            Origin::Node => Phase::Output,
            Origin::Pod | Origin::External => Phase::Prerouting,
        }
    }

    /// The hook's name as nft writes it (`prerouting`; empty when done).
    pub(super) fn hook(self) -> &'static str {
        match self {
            Phase::Prerouting | Phase::LoopbackPrerouting => "prerouting",
            Phase::Input | Phase::LoopbackInput => "input",
            Phase::Forward => "forward",
            Phase::Output => "output",
            Phase::Postrouting => "postrouting",
            Phase::Done => "",
        }
    }

    /// Where an accepted packet goes once the walk reached this stage.
    fn route(self) -> Option<Route> {
        match self {
            Phase::Input | Phase::LoopbackInput => Some(Route::Local),
            Phase::Forward => Some(Route::Forward),
            Phase::Output => Some(Route::Output),
            _ => None,
        }
    }

    fn loopback(self) -> bool {
        matches!(self, Phase::LoopbackPrerouting | Phase::LoopbackInput)
    }
}

/// Deepest chain nesting followed before giving up, by every walk (kube-proxy's chains nest 4
/// deep in iptables, 5 in nftables).
pub(super) const MAX_DEPTH: usize = 64;
/// Most outcomes one packet may have.
const MAX_OUTCOMES: usize = 100_000;
/// Most times one branch may enter the same chain. A packet enters a chain once per jump to it,
/// and kube-proxy's rules call `KUBE-MARK-MASQ` and friends at most a few times per hook; only a
/// `-j`/`-g` cycle (which `-g` keeps at a constant depth) reaches this.
const MAX_ENTRIES: u32 = 64;
/// Most rules evaluated over all branches, by every walk: bounds time and the memory of the
/// recorded paths whatever the ruleset (a 10,000-service dump takes some 20,000 steps per
/// branch; chains that fan out, every rule of A jumping to B, every rule of B to C, have
/// exponentially many paths without any loop).
pub(super) const MAX_STEPS: usize = 4_000_000;

/// A chain on a branch's stack: which one (as the model names it) and its next rule.
#[derive(Debug, Clone, Copy)]
pub(super) struct Frame<C> {
    pub(super) chain: C,
    pub(super) next: usize,
}

/// One branch of the walk: the packet's state and where it is. `C` names a chain, `S` is what
/// the model keeps besides.
#[derive(Debug, Clone)]
pub(super) struct Branch<'d, 'a, C, S> {
    pub(super) probability: f64,
    pub(super) src: IpAddr,
    pub(super) dst: IpAddr,
    pub(super) dport: u16,
    pub(super) mark: u32,
    pub(super) ct: ConntrackState,
    pub(super) dnat: Option<(IpAddr, u16)>,
    pub(super) snat: Option<IpAddr>,
    pub(super) masquerade: bool,
    pub(super) phase: Phase,
    /// Base chains of the current hook tried so far.
    pub(super) base: usize,
    route: Option<Route>,
    pub(super) stack: Vec<Frame<C>>,
    /// How often this branch entered each chain: the loop guard.
    entered: Entries<'a>,
    /// The filter rule or policy that accepted the packet last.
    decided_by: Option<String>,
    pub(super) path: Vec<Step<'d, 'a>>,
    pub(super) state: S,
}

impl<'d, 'a, C: Copy, S: Clone> Branch<'d, 'a, C, S> {
    /// A copy of this branch that takes `share` of its probability, with `step` on its path.
    pub(super) fn fork(&self, share: f64, step: Step<'d, 'a>) -> Self {
        let mut other = self.clone();
        other.probability *= share;
        other.path.push(step);
        other
    }

    /// The branch's end (its path moves into the outcome).
    pub(super) fn finish(
        &mut self,
        verdict: Verdict,
        decided_by: Option<String>,
    ) -> Outcome<'d, 'a> {
        Outcome {
            probability: self.probability,
            dnat: self.dnat,
            verdict,
            decided_by,
            route: if verdict == Verdict::Accept {
                self.route
            } else {
                None
            },
            masquerade: self.masquerade,
            snat: self.snat,
            mark: self.mark,
            path: std::mem::take(&mut self.path),
        }
    }

    /// `jump` (or `goto`) to `chain`, named `table/name`: a goto replaces the current chain,
    /// and a goto from a base chain makes the base chain's end come next.
    pub(super) fn enter(
        &mut self,
        chain: C,
        table: &'a str,
        name: &'a str,
        goto: bool,
    ) -> Result<(), SimError> {
        if self.stack.len() >= MAX_DEPTH {
            return Err(SimError::TooDeep {
                chain: format!("{table}/{name}"),
                depth: MAX_DEPTH,
            });
        }
        self.entered.enter(table, name)?;
        if goto {
            self.leave();
        }
        self.stack.push(Frame { chain, next: 0 });
        Ok(())
    }

    /// `return`: back to the calling chain, or from a base chain to its policy.
    pub(super) fn leave(&mut self) {
        if self.stack.len() == 1 {
            if let Some(f) = self.stack.last_mut() {
                f.next = usize::MAX;
            }
        } else {
            self.stack.pop();
        }
    }

    /// `accept` at `here`: the base chain ends; in a filter chain, `here` decided the verdict
    /// unless a later chain changes it.
    pub(super) fn accept(&mut self, here: String, filter: bool) {
        self.stack.clear();
        if filter {
            self.decided_by = Some(here);
        }
    }

    /// DNAT to `ip` (and `port`, when given).
    pub(super) fn dnat_to(&mut self, ip: IpAddr, port: Option<u16>) {
        self.dst = ip;
        if let Some(p) = port {
            self.dport = p;
        }
        self.dnat = Some((self.dst, self.dport));
        self.ct.dnat = true;
    }
}

/// What a rule did.
pub(super) enum Flow<'d, 'a> {
    /// Go on with the walk.
    Next,
    /// The branch ended.
    Done(Outcome<'d, 'a>),
}

/// What the walk finds at a chain's next rule.
pub(super) enum At<R> {
    /// A rule.
    Rule(R),
    /// The end of the chain.
    End,
    /// The chain is not there.
    Missing,
}

/// A base chain's end, as the walk applies it.
pub(super) struct ChainEnd<'a> {
    pub(super) table: &'a str,
    pub(super) chain: &'a str,
    /// The policy as the ruleset writes it.
    pub(super) policy: &'a str,
    /// The policy drops.
    pub(super) drop: bool,
    /// The policy shows on the path (a chain with rules, or one whose policy is not the default).
    pub(super) shown: bool,
    /// A filter chain: its accept decides the verdict.
    pub(super) filter: bool,
}

/// A kernel model: how one ruleset's chains are found and its rules evaluated.
pub(super) trait Model<'d, 'a>: Sized {
    /// Names a chain.
    type Chain: Copy;
    /// A rule.
    type Rule: Copy;
    /// What a branch keeps for this model besides the packet.
    type State: Clone;

    /// The next base chain of the branch's stage that sees the packet (`b.base` counts those
    /// already tried).
    fn next_base(&self, b: &mut BranchOf<'d, 'a, Self>) -> Option<Self::Chain>;

    /// Rule `index` of `chain`, or its end.
    fn rule_at(&self, chain: Self::Chain, index: usize) -> At<Self::Rule>;

    /// The end of base chain `chain`: its policy (asked only there, not at every chain's end).
    fn chain_end(&self, chain: Self::Chain) -> ChainEnd<'a>;

    /// Evaluates `rule`, rule `number` of `chain`, for branch `b`.
    fn eval(
        &self,
        walk: &mut Walk<'_, 'd, 'a, Self>,
        b: &mut BranchOf<'d, 'a, Self>,
        chain: Self::Chain,
        rule: Self::Rule,
        number: usize,
    ) -> Result<Flow<'d, 'a>, SimError>;

    /// Goes on with a branch forked in the middle of a rule, before its walk resumes.
    fn resume(
        &self,
        _walk: &mut Walk<'_, 'd, 'a, Self>,
        _b: &mut BranchOf<'d, 'a, Self>,
    ) -> Result<Flow<'d, 'a>, SimError> {
        Ok(Flow::Next)
    }
}

/// A branch of model `M`'s walk.
pub(super) type BranchOf<'d, 'a, M> =
    Branch<'d, 'a, <M as Model<'d, 'a>>::Chain, <M as Model<'d, 'a>>::State>;

/// A walk in progress: the branches still to run, the outcomes and notes so far.
pub(super) struct Walk<'r, 'd, 'a, M: Model<'d, 'a>> {
    pub(super) input: &'r KernelInput,
    pending: VecDeque<BranchOf<'d, 'a, M>>,
    outcomes: Vec<Outcome<'d, 'a>>,
    notes: Notes,
    /// Rules evaluated so far, over all branches.
    steps: usize,
}

impl<'r, 'd, 'a, M: Model<'d, 'a>> Walk<'r, 'd, 'a, M> {
    /// A walk of `input.packet`, with the note every walk makes on missing node addresses.
    pub(super) fn new(input: &'r KernelInput) -> Self {
        let mut walk = Walk {
            input,
            pending: VecDeque::new(),
            outcomes: Vec::new(),
            notes: Notes::default(),
            steps: 0,
        };
        if input.local.ips().is_empty() {
            walk.note(
                "no node addresses given (--local-ip/--node-ip): only loopback addresses count as local"
                    .to_string(),
            );
        }
        walk
    }

    /// Notes an assumption (each once).
    pub(super) fn note(&mut self, text: String) {
        self.notes.add(text);
    }

    /// Queues a forked branch; it runs after the ones before it.
    pub(super) fn defer(&mut self, b: BranchOf<'d, 'a, M>) {
        self.pending.push_back(b);
    }

    /// Runs the walk from the packet as given, with `state` the model's start, to every outcome.
    pub(super) fn run(
        mut self,
        model: &M,
        state: M::State,
    ) -> Result<Distribution<'d, 'a>, SimError> {
        let p = self.input.packet;
        self.pending.push_back(Branch {
            probability: 1.0,
            src: p.src,
            dst: p.dst,
            dport: p.dport,
            mark: 0,
            ct: ConntrackState::default(),
            dnat: None,
            snat: None,
            masquerade: false,
            phase: Phase::start(self.input.origin),
            base: 0,
            route: None,
            stack: Vec::new(),
            entered: Entries::default(),
            decided_by: None,
            path: Vec::new(),
            state,
        });
        while let Some(branch) = self.pending.pop_front() {
            let outcome = self.branch(model, branch)?;
            self.outcomes.push(outcome);
            if self.outcomes.len() + self.pending.len() > MAX_OUTCOMES {
                return Err(SimError::TooManyOutcomes {
                    limit: MAX_OUTCOMES,
                });
            }
        }
        Ok(Distribution {
            packet: p,
            origin: self.input.origin,
            outcomes: self.outcomes,
            notes: self.notes.into_list(),
        })
    }

    /// Runs one branch to its end; forks go to the queue.
    fn branch(
        &mut self,
        model: &M,
        mut b: BranchOf<'d, 'a, M>,
    ) -> Result<Outcome<'d, 'a>, SimError> {
        if let Flow::Done(o) = model.resume(self, &mut b)? {
            return Ok(o);
        }
        loop {
            // Enter the next base chain when the previous one finished, or the next stage.
            if b.stack.is_empty() {
                if let Some(chain) = model.next_base(&mut b) {
                    b.stack.push(Frame { chain, next: 0 });
                    continue;
                }
                b.phase = self.next_phase(&b);
                b.base = 0;
                if let Some(route) = b.phase.route() {
                    b.route = Some(route);
                }
                if b.phase == Phase::Done {
                    let decided = b.decided_by.clone();
                    return Ok(b.finish(Verdict::Accept, decided));
                }
                continue;
            }
            let depth = b.stack.len();
            let Some(frame) = b.stack.last_mut() else {
                continue;
            };
            let (chain, index) = (frame.chain, frame.next);
            match model.rule_at(chain, index) {
                At::Missing => {
                    b.stack.pop();
                }
                // A chain called from another returns to it.
                At::End if depth > 1 => {
                    b.stack.pop();
                }
                At::End => {
                    if let Some(o) = self.policy(&mut b, model.chain_end(chain)) {
                        return Ok(o);
                    }
                }
                At::Rule(rule) => {
                    frame.next += 1;
                    self.steps += 1;
                    if self.steps > MAX_STEPS {
                        return Err(SimError::TooManySteps { limit: MAX_STEPS });
                    }
                    if let Flow::Done(o) = model.eval(self, &mut b, chain, rule, index + 1)? {
                        return Ok(o);
                    }
                }
            }
        }
    }

    /// The end of a base chain: its policy.
    fn policy(
        &mut self,
        b: &mut BranchOf<'d, 'a, M>,
        end: ChainEnd<'a>,
    ) -> Option<Outcome<'d, 'a>> {
        b.stack.clear();
        if end.shown {
            b.path.push(Step {
                table: end.table,
                chain: end.chain,
                number: 0,
                result: StepResult::Policy,
                rule: None,
                policy: Some(end.policy),
            });
        }
        let decided = format!("{}/{} policy {}", end.table, end.chain, end.policy);
        if end.drop {
            return Some(b.finish(Verdict::Drop, Some(decided)));
        }
        if end.filter {
            b.decided_by = Some(decided);
        }
        None
    }

    /// The routing decision after prerouting / the stage after a hook.
    fn next_phase(&self, b: &BranchOf<'d, 'a, M>) -> Phase {
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

    /// The interfaces the packet arrives on and leaves by at the branch's stage, where known:
    /// `lo` on the loopback re-entry and out to a local address, none arriving from the node.
    pub(super) fn interfaces(&self, b: &BranchOf<'d, 'a, M>) -> (Option<&'r str>, Option<&'r str>) {
        let input = self.input;
        let in_iface = match b.phase {
            phase if phase.loopback() => Some("lo"),
            Phase::Output => None,
            _ if input.origin == Origin::Node => None,
            _ => input.in_iface.as_deref(),
        };
        let out_iface = match b.phase {
            Phase::Prerouting | Phase::Input | Phase::LoopbackPrerouting | Phase::LoopbackInput => {
                None
            }
            _ if input.local.contains(b.dst) => Some("lo"),
            _ => input.out_iface.as_deref(),
        };
        (in_iface, out_iface)
    }

    /// MASQUERADE (`name` as the ruleset writes it) at `here`: the source becomes the node
    /// address the packet leaves from, when the node's addresses are known.
    pub(super) fn masquerade(&mut self, b: &mut BranchOf<'d, 'a, M>, here: &str, name: &str) {
        match masquerade_source(b.dst, &self.input.local) {
            Some(addr) => {
                b.src = addr;
                b.snat = Some(addr);
            }
            None => self.note(format!(
                "{here}: {name} source unknown (give the node's addresses with --local-ip)"
            )),
        }
        b.masquerade = true;
        b.ct.snat = true;
    }

    /// Where REDIRECT sends the packet: loopback for the node's own traffic, else the node's
    /// first address of the family.
    pub(super) fn redirect_address(&self, dst: IpAddr) -> IpAddr {
        if self.input.origin == Origin::Node {
            return loopback_of(dst);
        }
        self.input
            .local
            .ips()
            .iter()
            .copied()
            .find(|ip| ip.is_ipv4() == dst.is_ipv4())
            .unwrap_or(loopback_of(dst))
    }
}

/// How often one branch entered each chain (table, chain): the loop guard. A map, so that each
/// jump costs the same however many chains the walk has already been through.
#[derive(Debug, Clone, Default)]
struct Entries<'a>(HashMap<(&'a str, &'a str), u32>);

impl<'a> Entries<'a> {
    /// Counts one more entry of `table`/`chain`; a loop error past [`MAX_ENTRIES`].
    fn enter(&mut self, table: &'a str, chain: &'a str) -> Result<(), SimError> {
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
struct Notes {
    list: Vec<String>,
    seen: HashSet<String>,
}

impl Notes {
    /// Adds `text` unless it was noted already.
    fn add(&mut self, text: String) {
        if !self.seen.contains(&text) {
            self.seen.insert(text.clone());
            self.list.push(text);
        }
    }

    /// The notes, in order.
    fn into_list(self) -> Vec<String> {
        self.list
    }
}

fn loopback_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::LOCALHOST),
    }
}

/// The address MASQUERADE picks: loopback for a loopback destination, else the non-loopback
/// local address of the same family with the longest common prefix with `dst`.
fn masquerade_source(dst: IpAddr, local: &LocalAddrs) -> Option<IpAddr> {
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
