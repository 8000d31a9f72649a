//! The packet simulator behind `trace --packet`: one rule-matching engine, two walk models, for
//! each proxy mode whose rules netfilter walks (`iptables/`, `nftables/`; an IPVS node's path is
//! [`super::ipvs`]).
//!
//! * [`engine`] — `matches(rule, packet, ctx)`, the only place iptables match criteria are
//!   evaluated, with a [`engine::MatchPolicy`] saying what a model may know. Reusable by graph/verify.
//! * `kernel` (`--model kernel`, in [`iptables::kernel`] and [`nftables::kernel`]): the hooks
//!   netfilter runs for the first packet of a new connection; `statistic` rules and `numgen`
//!   split the walk, giving a distribution of outcomes.
//! * `kptest` (`--model kube-proxy-test`, in [`iptables::kptest`] and [`nftables::kptest`]):
//!   kube-proxy's unit-test tracers, formatted as its tests compare them
//!   (`{"output": "10.180.0.1:80, 10.180.2.1:80", "masq": true}`).
//! * `walk` — the walk both kernel models share (hooks, branches and their probabilities,
//!   jumps, limits, outcomes and notes); each model supplies its chains and how a rule is
//!   evaluated.
//! * [`outcome`] — what the walks produce: a [`Distribution`] of outcomes, a [`TestTrace`].
//! * [`packet`] — the `--packet 'SRC[:SPORT]->DST:PORT/PROTO'` syntax.
//! * [`report`] — text and JSON renderings of both results.
//!
//! ```text
//! model::Ruleset ──iptables::kernel::simulate──▶ Distribution ──report──▶ text/JSON
//!                └─iptables::kptest::trace────▶ TestTrace ──report──▶ {"output", "masq"}
//! ```

pub mod engine;
pub mod iptables;
pub mod nftables;
pub mod outcome;
pub mod packet;
pub mod report;
mod walk;

pub use engine::{LocalAddrs, MatchCtx, MatchPolicy, PacketView, RuleMatch, matches};
pub use outcome::{Distribution, Outcome, Route, Step, StepResult, StepRule, TestTrace, Verdict};
pub use packet::{PacketSpec, PacketSyntaxError, Protocol};
pub use walk::{KernelInput, Origin};

/// Why a simulation could not complete.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SimError {
    /// Chains nest deeper than any sane ruleset (probably a loop of jumps).
    #[error("jumps nest deeper than {depth} chains at {chain} (a loop in the rules?)")]
    TooDeep {
        /// `table/chain` where the limit was hit.
        chain: String,
        /// The limit.
        depth: usize,
    },
    /// The walk entered one chain more often than any ruleset without a loop could make it.
    #[error(
        "loop in the rules: the packet entered {chain} {times} times (a -j/-g cycle); the kernel refuses to load such rules"
    )]
    Loop {
        /// `table/chain` entered too often.
        chain: String,
        /// How often it was entered.
        times: u32,
    },
    /// The walk evaluated more rules than its budget allows (rules that branch without end).
    #[error("loop in the rules? the walk evaluated more than {limit} rules and stopped")]
    TooManySteps {
        /// The limit.
        limit: usize,
    },
    /// The packet has too many possible outcomes to list.
    #[error("more than {limit} possible outcomes; refusing to enumerate them")]
    TooManyOutcomes {
        /// The limit.
        limit: usize,
    },
    /// The kube-proxy test tracer would abort the test here: after an IPv6 DNAT its destination
    /// is the text before the first `:` of the DNAT output, which is not an IP address.
    #[error(
        "kube-proxy-test model: {rule} matches on -d but the tracer's destination is `{dst}` (an IPv6 DNAT output cut at its first ':'); kube-proxy's tracer aborts here"
    )]
    TracerAbort {
        /// `table/chain#n` of the rule.
        rule: String,
        /// The unparsable destination text.
        dst: String,
    },
}
