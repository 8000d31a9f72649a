//! What the walks produce: the kernel models' [`Distribution`] of outcomes, each with its
//! rule-by-rule path, and the kube-proxy test tracers' [`TestTrace`].

use super::packet::PacketSpec;
use super::walk::Origin;
use kproxy_parsers::iptables::Rule;
use serde::Serialize;
use std::net::IpAddr;

/// The final verdict of a branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
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
                .map(|m| super::engine::describe_match(r, &m)),
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

/// The tracer's result, formatted exactly as kube-proxy's tests compare it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TestTrace {
    /// Terminal outputs joined with `", "`: DNAT destinations as written, `ACCEPT`, `DROP`, `REJECT`.
    pub output: String,
    /// True if any matched rule on any explored branch jumped to KUBE-MARK-MASQ.
    pub masq: bool,
    /// `table/chain#n` of every rule that matched, in walk order (text output only: the JSON
    /// form carries exactly `output` and `masq`, as kube-proxy's tests compare them).
    #[serde(skip)]
    pub matched: Vec<String>,
}
