//! Many nodes at a glance, for `status` and `verify --all-nodes`: each node's [`NodeState`], the
//! monitor's node condition read as one ([`condition`]), and the findings of many nodes rolled
//! up, identical findings once with the number of nodes that have them ([`Rollup`]).
//!
//! Nothing here keeps a node's report: a fan-out hands each node's findings to the roll-up as it
//! gets them and lets the report go, so what is held grows with the distinct findings, not with
//! the nodes.

use crate::compare::{Finding, Severity};
use crate::exit::Outcome;
use serde::Serialize;
use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// What is known of one node's rules. Field names and the words of [`NodeState::as_str`] are a
/// stable interface (`-o json|yaml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// The rules differ from the API (past the monitor's grace period).
    Drift,
    /// The node could not be verified (the monitor says so, or `verify` could not read it).
    Failed,
    /// The monitor's condition is older than a few of its heartbeats: what it says no longer
    /// speaks for the node.
    AgentStale,
    /// The node has no condition: no monitor reports for it.
    AgentMissing,
    /// The condition says something this build does not know.
    Unknown,
    /// Not verified: the run was interrupted first.
    NotChecked,
    /// The rules differ, but not for longer than kube-proxy's own lag can explain.
    Pending,
    /// The rules match the API.
    InSync,
}

impl NodeState {
    /// Every state, in the order outputs show them: what needs a look first.
    pub const ALL: [NodeState; 8] = [
        NodeState::Drift,
        NodeState::Failed,
        NodeState::AgentStale,
        NodeState::AgentMissing,
        NodeState::Unknown,
        NodeState::NotChecked,
        NodeState::Pending,
        NodeState::InSync,
    ];

    /// The word used in every output form (`in_sync`, `agent_missing`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Drift => "drift",
            NodeState::Failed => "failed",
            NodeState::AgentStale => "agent_stale",
            NodeState::AgentMissing => "agent_missing",
            NodeState::Unknown => "unknown",
            NodeState::NotChecked => "not_checked",
            NodeState::Pending => "pending",
            NodeState::InSync => "in_sync",
        }
    }

    /// The exit status a node in this state asks for: in sync (pending included) 0, drift 1,
    /// could not tell 2.
    pub fn outcome(self) -> Outcome {
        match self {
            NodeState::InSync | NodeState::Pending => Outcome::Clean,
            NodeState::Drift => Outcome::Drift,
            NodeState::Failed
            | NodeState::AgentStale
            | NodeState::AgentMissing
            | NodeState::Unknown
            | NodeState::NotChecked => Outcome::Error,
        }
    }

    /// Whether nothing can be said of the node's rules in this state.
    pub fn could_not_tell(self) -> bool {
        self.outcome() == Outcome::Error
    }
}

/// How many nodes are in each state; serialised with every state as a key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    counts: [usize; NodeState::ALL.len()],
}

impl Tally {
    /// Counts one node.
    pub fn add(&mut self, state: NodeState) {
        if let Some(i) = NodeState::ALL.iter().position(|s| *s == state) {
            self.counts[i] += 1;
        }
    }

    /// The nodes in `state`.
    pub fn of(&self, state: NodeState) -> usize {
        NodeState::ALL
            .iter()
            .position(|s| *s == state)
            .map_or(0, |i| self.counts[i])
    }

    /// All nodes counted.
    pub fn total(&self) -> usize {
        self.counts.iter().sum()
    }

    /// The exit status of the whole: the worst of its nodes' (0 when there are none).
    pub fn outcome(&self) -> Outcome {
        NodeState::ALL
            .iter()
            .filter(|s| self.of(**s) > 0)
            .map(|s| s.outcome())
            .max()
            .unwrap_or(Outcome::Clean)
    }
}

impl Serialize for Tally {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(NodeState::ALL.len()))?;
        for state in NodeState::ALL {
            map.serialize_entry(state.as_str(), &self.of(state))?;
        }
        map.end()
    }
}

/// The monitor's node condition (`kubectl-kproxy monitor`, docs/monitor.md): its type, and the
/// reasons of its statuses. The monitor writes it; `status` reads it.
pub mod condition {
    /// The condition's type.
    pub const TYPE: &str = "KubeProxyRulesInSync";
    /// Status `True`: the rules match the API.
    pub const RULES_MATCH: &str = "RulesMatchAPI";
    /// Status `True`: the rules differ, but only for less than the grace period (kube-proxy's
    /// own lag can explain it).
    pub const RULES_PENDING: &str = "RulesPending";
    /// Status `False`: the rules differ past the grace period.
    pub const RULES_DRIFTED: &str = "RulesDrifted";
    /// Status `Unknown`: the last verify could not run.
    pub const VERIFY_FAILED: &str = "VerifyFailed";
    /// How often the monitor re-sends the condition while it does not change (its
    /// `lastHeartbeatTime` then tells how fresh it is).
    pub const HEARTBEAT: std::time::Duration = std::time::Duration::from_secs(300);
}

/// A node's condition as the API holds it (times parsed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionView {
    /// `True`, `False`, `Unknown` (or anything else a writer put there).
    pub status: String,
    /// The CamelCase reason.
    pub reason: String,
    /// The message: the monitor's one-line summary.
    pub message: String,
    /// When the status last changed.
    pub last_transition: Option<SystemTime>,
    /// When the monitor last sent it.
    pub heartbeat: Option<SystemTime>,
}

/// What a node's condition says, read at `now`: its state, and why when the condition is not
/// taken at its word (stale, or a status this build does not know). A condition whose heartbeat
/// is older than `stale_after` (or that has none) is [`NodeState::AgentStale`] whatever it says;
/// no condition at all is [`NodeState::AgentMissing`]. The status decides (`True` in sync, with
/// reason [`condition::RULES_PENDING`] pending; `False` drift; `Unknown` failed); the reason
/// only refines `True`.
pub fn classify(
    cond: Option<&ConditionView>,
    now: SystemTime,
    stale_after: Duration,
) -> (NodeState, Option<String>) {
    let Some(c) = cond else {
        return (
            NodeState::AgentMissing,
            Some(format!("no {} condition on the node", condition::TYPE)),
        );
    };
    let Some(heartbeat) = c.heartbeat else {
        return (
            NodeState::AgentStale,
            Some("the condition has no lastHeartbeatTime".into()),
        );
    };
    // A heartbeat in the future (clock skew between the node and this machine) is fresh.
    let age = now.duration_since(heartbeat).unwrap_or_default();
    if age > stale_after {
        return (
            NodeState::AgentStale,
            Some(format!(
                "last heartbeat {} ago (stale after {})",
                crate::state::duration::format(whole_seconds(age)),
                crate::state::duration::format(stale_after)
            )),
        );
    }
    match (c.status.as_str(), c.reason.as_str()) {
        ("True", condition::RULES_PENDING) => (NodeState::Pending, None),
        ("True", _) => (NodeState::InSync, None),
        ("False", _) => (NodeState::Drift, None),
        ("Unknown", _) => (NodeState::Failed, None),
        (other, _) => (
            NodeState::Unknown,
            Some(format!(
                "condition status {other:?} is none of True, False, Unknown"
            )),
        ),
    }
}

/// `d` cut to whole seconds (ages are shown to the second).
pub fn whole_seconds(d: Duration) -> Duration {
    Duration::from_secs(d.as_secs())
}

/// What makes two findings of two nodes the same finding: its ID, severity, service port, chain
/// and message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FindingKey {
    /// Severity (errors sort first).
    pub severity: Severity,
    /// The catalogue ID, e.g. `KP201`.
    pub id: String,
    /// The service port, if any.
    pub service: Option<String>,
    /// The chain, if any.
    pub chain: Option<String>,
    /// The one-line description.
    pub message: String,
}

impl FindingKey {
    /// The key of a finding of a report.
    pub fn of(f: &Finding) -> FindingKey {
        FindingKey {
            severity: f.severity,
            id: f.id.to_string(),
            service: f.service.clone(),
            chain: f.chain.clone(),
            message: f.message.clone(),
        }
    }

    /// The keys of a report's differences (errors and warnings; info findings are context, not
    /// drift, and would roll up into every node).
    pub fn differences(findings: &[Finding]) -> Vec<FindingKey> {
        findings
            .iter()
            .filter(|f| f.severity != Severity::Info)
            .map(FindingKey::of)
            .collect()
    }
}

/// How many node names a rolled-up finding keeps as examples.
pub const EXAMPLE_NODES: usize = 3;

/// The default bound on distinct findings a roll-up keeps ([`Rollup::new`]).
pub const MAX_DISTINCT: usize = 10_000;

/// Findings of many nodes, rolled up as they come: each distinct finding once, with the number
/// of nodes that have it and the first few of them by name.
#[derive(Debug)]
pub struct Rollup {
    entries: HashMap<FindingKey, Entry>,
    max_distinct: usize,
    left_out: usize,
}

#[derive(Debug, Default)]
struct Entry {
    nodes: usize,
    /// The smallest names, sorted: the same whatever order the nodes came in.
    examples: Vec<String>,
}

/// One finding and the nodes that have it. Field names are a stable interface.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RolledFinding {
    /// The catalogue ID.
    pub id: String,
    /// Severity.
    pub severity: Severity,
    /// The service port, if any.
    pub service: Option<String>,
    /// The chain, if any.
    pub chain: Option<String>,
    /// The one-line description.
    pub message: String,
    /// How many nodes have it.
    pub nodes: usize,
    /// The first few of them, by name.
    pub example_nodes: Vec<String>,
}

/// What a [`Rollup`] came to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RolledUp {
    /// Errors first, then the findings on most nodes.
    pub findings: Vec<RolledFinding>,
    /// Findings not rolled up because the roll-up held as many distinct ones as it may (counted
    /// once per node).
    pub left_out: usize,
}

impl Default for Rollup {
    fn default() -> Self {
        Rollup::new(MAX_DISTINCT)
    }
}

impl Rollup {
    /// An empty roll-up that keeps at most `max_distinct` distinct findings; later new ones are
    /// only counted ([`RolledUp::left_out`]), so a fleet whose every node differs in its own way
    /// cannot grow it without bound.
    pub fn new(max_distinct: usize) -> Rollup {
        Rollup {
            entries: HashMap::new(),
            max_distinct,
            left_out: 0,
        }
    }

    /// Adds one node's findings; a finding the node lists twice counts once.
    pub fn add(&mut self, node: &str, findings: impl IntoIterator<Item = FindingKey>) {
        let mut seen: Vec<FindingKey> = findings.into_iter().collect();
        seen.sort();
        seen.dedup();
        for key in seen {
            let full = self.entries.len() >= self.max_distinct;
            let entry = match self.entries.get_mut(&key) {
                Some(e) => e,
                None if full => {
                    self.left_out += 1;
                    continue;
                }
                None => self.entries.entry(key).or_default(),
            };
            entry.nodes += 1;
            keep_smallest(&mut entry.examples, node, EXAMPLE_NODES);
        }
    }

    /// The distinct findings so far.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no finding was added.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The rolled-up findings: errors first, then those on most nodes, then by ID, service,
    /// chain and message.
    pub fn finish(self) -> RolledUp {
        let mut findings: Vec<RolledFinding> = self
            .entries
            .into_iter()
            .map(|(k, e)| RolledFinding {
                id: k.id,
                severity: k.severity,
                service: k.service,
                chain: k.chain,
                message: k.message,
                nodes: e.nodes,
                example_nodes: e.examples,
            })
            .collect();
        findings.sort_by(|a, b| {
            (a.severity, std::cmp::Reverse(a.nodes), &a.id)
                .cmp(&(b.severity, std::cmp::Reverse(b.nodes), &b.id))
                .then_with(|| {
                    (&a.service, &a.chain, &a.message).cmp(&(&b.service, &b.chain, &b.message))
                })
        });
        RolledUp {
            findings,
            left_out: self.left_out,
        }
    }
}

/// Keeps the `n` smallest names in `names` (sorted) after adding `name`.
fn keep_smallest(names: &mut Vec<String>, name: &str, n: usize) {
    if names.len() >= n && names.last().is_some_and(|last| last.as_str() <= name) {
        return;
    }
    let at = names.partition_point(|x| x.as_str() < name);
    if names.get(at).is_some_and(|x| x == name) {
        return;
    }
    names.insert(at, name.to_string());
    names.truncate(n);
}

/// Notes (warnings) of many nodes, each said once: two nodes' notes are the same note when they
/// differ only by the names of the node itself (its name, its pod's), so that "`ipvsadm` is not
/// installed in pod kube-system/kube-proxy-node-7" on 1,000 nodes is one line.
#[derive(Debug, Default)]
pub struct Notes {
    entries: HashMap<String, NoteEntry>,
    left_out: usize,
}

#[derive(Debug)]
struct NoteEntry {
    /// The text as the node with the smallest name had it.
    text: String,
    first: String,
    nodes: usize,
}

/// One note and how many nodes had it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RolledNote {
    /// The note, as the first node (by name) had it.
    pub text: String,
    /// That node.
    pub node: String,
    /// How many nodes had it.
    pub nodes: usize,
}

impl Notes {
    /// Notes `text` of `node`; `own` are the node's own names (its name, its pod's), which do not
    /// make a note another. At most [`MAX_DISTINCT`] distinct notes are kept; later new ones
    /// are only counted.
    pub fn add(&mut self, node: &str, own: &[&str], text: &str) {
        let mut key = text.to_string();
        let mut own: Vec<&str> = own.iter().copied().filter(|o| !o.is_empty()).collect();
        // The longest first: a pod's name holds its node's.
        own.sort_by_key(|o| std::cmp::Reverse(o.len()));
        for (i, name) in own.iter().enumerate() {
            key = key.replace(name, &format!("\u{0}{i}"));
        }
        if !self.entries.contains_key(&key) && self.entries.len() >= MAX_DISTINCT {
            self.left_out += 1;
            return;
        }
        let entry = self.entries.entry(key).or_insert_with(|| NoteEntry {
            text: text.to_string(),
            first: node.to_string(),
            nodes: 0,
        });
        entry.nodes += 1;
        if node < entry.first.as_str() {
            entry.first = node.to_string();
            entry.text = text.to_string();
        }
    }

    /// The notes, those of most nodes first, then by text; and how many were left out.
    pub fn finish(self) -> (Vec<RolledNote>, usize) {
        let mut notes: Vec<RolledNote> = self
            .entries
            .into_values()
            .map(|e| RolledNote {
                text: e.text,
                node: e.first,
                nodes: e.nodes,
            })
            .collect();
        notes.sort_by(|a, b| b.nodes.cmp(&a.nodes).then_with(|| a.text.cmp(&b.text)));
        (notes, self.left_out)
    }
}

/// Keeps at most `n` names, the smallest, as they come: the few names an output lists for a
/// group of nodes, whatever order a fan-out finished them in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FewNames {
    names: Vec<String>,
    total: usize,
}

impl FewNames {
    /// Notes one name.
    pub fn add(&mut self, name: &str, n: usize) {
        self.total += 1;
        keep_smallest(&mut self.names, name, n);
    }

    /// The names kept, sorted.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// How many names were noted.
    pub fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str, message: &str) -> FindingKey {
        FindingKey {
            severity: Severity::Error,
            id: id.into(),
            service: Some("shop/web:http".into()),
            chain: None,
            message: message.into(),
        }
    }

    #[test]
    fn identical_findings_roll_up_with_the_smallest_names() {
        let mut r = Rollup::default();
        for node in ["node-9", "node-3", "node-7", "node-1", "node-5"] {
            r.add(node, [key("KP201", "gone"), key("KP201", "gone")]);
        }
        r.add("node-2", [key("KP202", "other")]);
        let done = r.finish();
        assert_eq!(done.findings.len(), 2);
        let first = &done.findings[0];
        assert_eq!((first.id.as_str(), first.nodes), ("KP201", 5));
        assert_eq!(first.example_nodes, ["node-1", "node-3", "node-5"]);
        assert_eq!(done.findings[1].nodes, 1);
        assert_eq!(done.left_out, 0);
    }

    #[test]
    fn the_order_nodes_come_in_does_not_matter() {
        let names: Vec<String> = (0..50).map(|i| format!("n{i:02}")).collect();
        let mut a = Rollup::default();
        let mut b = Rollup::default();
        for n in &names {
            a.add(n, [key("KP201", "x")]);
        }
        for n in names.iter().rev() {
            b.add(n, [key("KP201", "x")]);
        }
        assert_eq!(a.finish(), b.finish());
    }

    #[test]
    fn distinct_findings_are_bounded() {
        let mut r = Rollup::new(2);
        r.add("a", [key("KP1", "1"), key("KP2", "2"), key("KP3", "3")]);
        r.add("b", [key("KP1", "1"), key("KP4", "4")]);
        assert_eq!(r.len(), 2);
        let done = r.finish();
        assert_eq!(done.left_out, 2);
        assert_eq!(done.findings.iter().map(|f| f.nodes).sum::<usize>(), 3);
    }

    #[test]
    fn errors_first_then_most_nodes() {
        let mut r = Rollup::default();
        let warn = FindingKey {
            severity: Severity::Warning,
            ..key("KP301", "w")
        };
        for n in ["a", "b", "c"] {
            r.add(n, [warn.clone()]);
        }
        r.add("a", [key("KP201", "e")]);
        r.add("a", [key("KP005", "e2")]);
        r.add("b", [key("KP005", "e2")]);
        let ids: Vec<String> = r.finish().findings.into_iter().map(|f| f.id).collect();
        assert_eq!(ids, ["KP005", "KP201", "KP301"]);
    }

    fn cond(status: &str, reason: &str, age: u64, now: SystemTime) -> ConditionView {
        ConditionView {
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            last_transition: None,
            heartbeat: Some(now - Duration::from_secs(age)),
        }
    }

    #[test]
    fn conditions_read_as_states() {
        let now = SystemTime::now();
        let stale = Duration::from_secs(900);
        let state = |c: Option<&ConditionView>| classify(c, now, stale).0;
        assert_eq!(state(None), NodeState::AgentMissing);
        assert_eq!(
            state(Some(&cond("True", condition::RULES_MATCH, 10, now))),
            NodeState::InSync
        );
        assert_eq!(
            state(Some(&cond("True", condition::RULES_PENDING, 10, now))),
            NodeState::Pending
        );
        assert_eq!(
            state(Some(&cond("False", condition::RULES_DRIFTED, 10, now))),
            NodeState::Drift
        );
        assert_eq!(
            state(Some(&cond("Unknown", condition::VERIFY_FAILED, 10, now))),
            NodeState::Failed
        );
        assert_eq!(
            state(Some(&cond("Maybe", "Whatever", 10, now))),
            NodeState::Unknown
        );
        // Old news speaks for nothing, whatever it says.
        let (s, why) = classify(
            Some(&cond("False", condition::RULES_DRIFTED, 901, now)),
            now,
            stale,
        );
        assert_eq!(s, NodeState::AgentStale);
        assert_eq!(
            why.as_deref(),
            Some("last heartbeat 15m1s ago (stale after 15m0s)")
        );
        let mut none = cond("True", condition::RULES_MATCH, 0, now);
        none.heartbeat = None;
        assert_eq!(state(Some(&none)), NodeState::AgentStale);
        // A heartbeat from the future is fresh.
        let mut ahead = cond("True", condition::RULES_MATCH, 0, now);
        ahead.heartbeat = Some(now + Duration::from_secs(60));
        assert_eq!(state(Some(&ahead)), NodeState::InSync);
    }

    #[test]
    fn tally_outcome_is_the_worst_state() {
        let mut t = Tally::default();
        assert_eq!(t.outcome(), Outcome::Clean);
        t.add(NodeState::Pending);
        t.add(NodeState::InSync);
        assert_eq!(t.outcome(), Outcome::Clean);
        t.add(NodeState::Drift);
        assert_eq!(t.outcome(), Outcome::Drift);
        t.add(NodeState::AgentMissing);
        assert_eq!(t.outcome(), Outcome::Error);
        assert_eq!(t.total(), 4);
        let json = serde_json::to_value(&t).expect("json");
        assert_eq!(json["agent_missing"], 1);
        assert_eq!(json["not_checked"], 0);
        assert_eq!(
            json.as_object().map(|o| o.len()),
            Some(NodeState::ALL.len())
        );
    }

    #[test]
    fn notes_that_differ_only_by_the_nodes_names_are_one() {
        let mut n = Notes::default();
        for node in ["node-2", "node-1", "node-10"] {
            let pod = format!("kube-proxy-{node}");
            n.add(
                node,
                &[node, &pod],
                &format!("`ipvsadm` is not installed in pod kube-system/{pod}"),
            );
        }
        n.add(
            "node-1",
            &["node-1"],
            "ConfigMap kube-system/kube-proxy not found",
        );
        let (notes, left_out) = n.finish();
        assert_eq!(left_out, 0);
        assert_eq!(notes.len(), 2);
        assert_eq!(notes[0].nodes, 3);
        assert_eq!(notes[0].node, "node-1");
        assert_eq!(
            notes[0].text,
            "`ipvsadm` is not installed in pod kube-system/kube-proxy-node-1"
        );
        assert_eq!(notes[1].nodes, 1);
    }

    #[test]
    fn few_names_keeps_the_smallest() {
        let mut f = FewNames::default();
        for n in ["d", "a", "c", "b", "a"] {
            f.add(n, 2);
        }
        assert_eq!(f.names(), ["a", "b"]);
        assert_eq!(f.total(), 5);
    }
}
