//! Pending or drift: every difference `verify` finds is *pending* until it has lasted past the
//! grace period, and only then *drift*. kube-proxy programs a change after up to
//! `minSyncPeriod` of batching (and retries a failed sync after `syncPeriod`), so a difference
//! younger than that is kube-proxy's own lag, not a fault. The same bookkeeping measures that
//! lag: from an API change first seen to the first read of the node that matches again.
//!
//! The tracker knows nothing of how a report is made: it takes reports (or failures) and the
//! times of API changes, and says the node's state.

use kproxy_analysis::compare::{Finding, Report, Severity};
use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime};

/// The node's state as the monitor reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// No verify has finished yet.
    Unknown,
    /// The rules match the API.
    InSync,
    /// Differences younger than the grace period only (kube-proxy may still be programming).
    Pending,
    /// A difference has lasted past the grace period.
    Drift,
    /// The last verify could not run (the node could not be read, the state was unreadable…);
    /// nothing is concluded about the rules.
    Failed,
}

impl NodeState {
    /// The word used in logs and `/findings`.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Unknown => "unknown",
            NodeState::InSync => "in_sync",
            NodeState::Pending => "pending",
            NodeState::Drift => "drift",
            NodeState::Failed => "failed",
        }
    }
}

/// A finding's identity across verifies: its check, service port and chain. The message is
/// left out: it may carry counts that change from one read to the next.
type Key = (&'static str, Option<String>, Option<String>);

fn key(f: &Finding) -> Key {
    (f.id, f.service.clone(), f.chain.clone())
}

/// One finding of the current report with its age.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// The finding as verify reported it.
    pub finding: Finding,
    /// When it was first seen (wall clock, for `/findings`).
    pub since: SystemTime,
    /// How long it has lasted at the last verify.
    pub age: Duration,
    /// Whether it is a difference (error or warning) still inside the grace period. Info
    /// findings are never pending and never drift.
    pub pending: bool,
    /// Whether it is a difference that has lasted past the grace period.
    pub drift: bool,
}

/// What one verify comes to.
#[derive(Debug, Clone)]
pub struct Assessment {
    /// The report the verify made.
    pub report: Report,
    /// Its findings with their ages, in the report's order.
    pub tracked: Vec<Tracked>,
    /// The node's state.
    pub state: NodeState,
    /// Service ports named by drifted findings.
    pub drifted_service_ports: usize,
    /// Service ports named by pending findings (and not by drifted ones).
    pub pending_service_ports: usize,
    /// A programming latency this verify observed (an API change whose difference was seen,
    /// matched now).
    pub latency: Option<Duration>,
}

/// The tracker: first-seen times of the current differences and the open API change.
#[derive(Debug)]
pub struct Tracker {
    grace: Duration,
    first_seen: HashMap<Key, (Instant, SystemTime)>,
    /// The first API change not yet matched by the node: when it was seen, and whether a
    /// verify after it has seen the node differ (only then is its programming observed).
    change: Option<(Instant, bool)>,
    state: NodeState,
}

impl Tracker {
    /// A tracker with `grace` as the time a difference may last before it is drift.
    pub fn new(grace: Duration) -> Tracker {
        Tracker {
            grace,
            first_seen: HashMap::new(),
            change: None,
            state: NodeState::Unknown,
        }
    }

    /// The grace period.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// Changes the grace period (kube-proxy's configuration changed); the differences keep
    /// their first-seen times.
    pub fn set_grace(&mut self, grace: Duration) {
        self.grace = grace;
    }

    /// The state after the last verify.
    pub fn state(&self) -> NodeState {
        self.state
    }

    /// Notes an API change first seen at `at` (the first of several open ones counts).
    pub fn api_changed(&mut self, at: Instant) {
        if self.change.is_none() {
            self.change = Some((at, false));
        }
    }

    /// Forgets the open API change without observing it (the monitor repaired the node itself:
    /// what matches then is not kube-proxy's work).
    pub fn forget_change(&mut self) {
        self.change = None;
    }

    /// Whether a re-verify soon would tell something new at `now`: differences are pending, or
    /// an API change younger than the grace period is not matched yet (past the grace it is
    /// drift, and the interval's verifies follow it).
    pub fn wants_recheck(&self, now: Instant) -> bool {
        self.state == NodeState::Pending
            || self
                .change
                .is_some_and(|(at, _)| now.saturating_duration_since(at) < self.grace)
    }

    /// Notes a verify that could not run: the findings' ages are kept (a difference does not
    /// become younger because one read failed), nothing else is concluded.
    pub fn failed(&mut self) -> NodeState {
        self.state = NodeState::Failed;
        self.state
    }

    /// Takes the report of a verify whose read of the node started at `read_at`.
    pub fn assess(&mut self, report: Report, read_at: Instant) -> Assessment {
        let now_wall = SystemTime::now();
        let mut seen: HashMap<Key, (Instant, SystemTime)> = HashMap::new();
        let mut tracked = Vec::with_capacity(report.findings.len());
        let mut drifted: std::collections::BTreeSet<&str> = Default::default();
        let mut pending: std::collections::BTreeSet<&str> = Default::default();
        let (mut any_drift, mut any_pending) = (false, false);
        for f in &report.findings {
            let difference = matches!(f.severity, Severity::Error | Severity::Warning);
            let k = key(f);
            let (first, first_wall) = *self
                .first_seen
                .get(&k)
                .or_else(|| seen.get(&k))
                .unwrap_or(&(read_at, now_wall));
            seen.insert(k, (first, first_wall));
            let age = read_at.saturating_duration_since(first);
            let drift = difference && age >= self.grace;
            let is_pending = difference && !drift;
            any_drift |= drift;
            any_pending |= is_pending;
            if let Some(s) = f.service.as_deref() {
                if drift {
                    drifted.insert(s);
                } else if is_pending {
                    pending.insert(s);
                }
            }
            tracked.push(Tracked {
                finding: f.clone(),
                since: first_wall,
                age,
                pending: is_pending,
                drift,
            });
        }
        self.first_seen = seen;
        let pending_ports = pending.difference(&drifted).count();
        let drifted_ports = drifted.len();
        self.state = if any_drift {
            NodeState::Drift
        } else if any_pending {
            NodeState::Pending
        } else {
            NodeState::InSync
        };
        let mut latency = None;
        if let Some((at, differed)) = self.change
            && read_at >= at
        {
            if self.state == NodeState::InSync {
                if differed {
                    latency = Some(read_at.duration_since(at));
                }
                self.change = None;
            } else {
                self.change = Some((at, true));
            }
        }
        Assessment {
            report,
            tracked,
            state: self.state,
            drifted_service_ports: drifted_ports,
            pending_service_ports: pending_ports,
            latency,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kproxy_analysis::compare::catalogue as cat;

    fn report(findings: Vec<Finding>) -> Report {
        Report::new(
            "n",
            kproxy_core::state::mode::ProxyMode::Iptables,
            3,
            findings,
        )
    }

    #[test]
    fn a_difference_is_pending_until_the_grace_passes() {
        let t0 = Instant::now();
        let mut t = Tracker::new(Duration::from_secs(2));
        let missing = || {
            cat::ENDPOINT_MISSING
                .finding("gone")
                .service("shop/web:http")
        };
        let a = t.assess(report(vec![missing()]), t0);
        assert_eq!(a.state, NodeState::Pending);
        assert_eq!((a.pending_service_ports, a.drifted_service_ports), (1, 0));
        assert!(a.tracked[0].pending && !a.tracked[0].drift);
        let a = t.assess(report(vec![missing()]), t0 + Duration::from_secs(1));
        assert_eq!(a.state, NodeState::Pending);
        let a = t.assess(report(vec![missing()]), t0 + Duration::from_secs(2));
        assert_eq!(a.state, NodeState::Drift);
        assert_eq!((a.pending_service_ports, a.drifted_service_ports), (0, 1));
        assert_eq!(a.tracked[0].age, Duration::from_secs(2));
        // A failed read keeps the age: the next good read still says drift.
        assert_eq!(t.failed(), NodeState::Failed);
        let a = t.assess(report(vec![missing()]), t0 + Duration::from_secs(3));
        assert_eq!(a.state, NodeState::Drift);
        let a = t.assess(report(vec![]), t0 + Duration::from_secs(4));
        assert_eq!(a.state, NodeState::InSync);
        // Gone and back: young again.
        let a = t.assess(report(vec![missing()]), t0 + Duration::from_secs(5));
        assert_eq!(a.state, NodeState::Pending);
    }

    #[test]
    fn info_findings_are_neither_pending_nor_drift() {
        let t0 = Instant::now();
        let mut t = Tracker::new(Duration::ZERO);
        let a = t.assess(
            report(vec![cat::STALE_CHAIN_LARGE_CLUSTER.finding("x")]),
            t0,
        );
        assert_eq!(a.state, NodeState::InSync);
        assert!(!a.tracked[0].pending && !a.tracked[0].drift);
    }

    #[test]
    fn latency_is_observed_when_a_seen_difference_matches() {
        let t0 = Instant::now();
        let mut t = Tracker::new(Duration::from_secs(30));
        assert_eq!(t.assess(report(vec![]), t0).state, NodeState::InSync);
        t.api_changed(t0 + Duration::from_secs(1));
        t.api_changed(t0 + Duration::from_secs(2));
        let pending = cat::ENDPOINT_MISSING
            .finding("new")
            .service("shop/web:http");
        let a = t.assess(report(vec![pending]), t0 + Duration::from_millis(1200));
        assert_eq!((a.state, a.latency), (NodeState::Pending, None));
        assert!(t.wants_recheck(t0 + Duration::from_millis(1200)));
        let a = t.assess(report(vec![]), t0 + Duration::from_millis(2500));
        assert_eq!(a.latency, Some(Duration::from_millis(1500)));
        assert!(!t.wants_recheck(t0 + Duration::from_millis(2500)));
        // A change whose first read already matches is not observed (nothing was seen
        // being programmed).
        t.api_changed(t0 + Duration::from_secs(3));
        let a = t.assess(report(vec![]), t0 + Duration::from_secs(4));
        assert_eq!(a.latency, None);
    }
}
