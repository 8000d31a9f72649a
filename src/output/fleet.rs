//! How `status` and `verify --all-nodes` show many nodes: the states counted in one line, the
//! rolled-up findings as one table, ages as kubectl prints them, a progress bar for the
//! fan-out, and text from the cluster made safe for a terminal.

use super::color::{Painter, Role};
use super::table::KubeTable;
use crate::fleet::{NodeState, RolledFinding, RolledUp, Tally};
use serde::Serialize;
use std::borrow::Cow;
use std::time::Duration;

/// `text` with control characters written as escapes: node names, messages and errors come from
/// the cluster (an agent's answer, a condition anyone with `nodes/status` can write), and an
/// escape sequence in them must not reach the terminal.
pub fn visible(text: &str) -> Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return Cow::Borrowed(text);
    }
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

/// An age as kubectl prints one (`45s`, `3m12s`, `17m`, `5h3m`, `20h`, `3d4h`, `40d`;
/// k8s.io/apimachinery `duration.HumanDuration`).
pub fn age(d: Duration) -> String {
    let secs = d.as_secs();
    let (m, h, days) = (secs / 60, secs / 3600, secs / 86_400);
    if secs < 120 {
        format!("{secs}s")
    } else if m < 10 {
        match secs % 60 {
            0 => format!("{m}m"),
            s => format!("{m}m{s}s"),
        }
    } else if h < 3 {
        format!("{m}m")
    } else if h < 8 {
        match m % 60 {
            0 => format!("{h}h"),
            mm => format!("{h}h{mm}m"),
        }
    } else if h < 48 {
        format!("{h}h")
    } else if days < 8 {
        match h % 24 {
            0 => format!("{days}d"),
            hh => format!("{days}d{hh}h"),
        }
    } else {
        format!("{days}d")
    }
}

/// How a state is named in prose (`in sync`, `agent missing`).
pub fn state_words(state: NodeState) -> &'static str {
    match state {
        NodeState::Drift => "drift",
        NodeState::Failed => "failed",
        NodeState::AgentStale => "agent stale",
        NodeState::AgentMissing => "agent missing",
        NodeState::Unknown => "unknown",
        NodeState::NotChecked => "not checked",
        NodeState::Pending => "pending",
        NodeState::InSync => "in sync",
    }
}

/// The colour of a state's title.
pub fn state_role(state: NodeState) -> Role {
    match state {
        NodeState::Drift => Role::Error,
        NodeState::InSync => Role::Ok,
        NodeState::Pending => Role::Dim,
        _ => Role::Warn,
    }
}

/// `5,000 nodes: 5 drift, 2 failed, 3 pending, 4,990 in sync`: every state that has a node, in
/// the order the sections show them.
pub fn tally_line(tally: &Tally) -> String {
    let parts: Vec<String> = NodeState::ALL
        .iter()
        .filter(|s| tally.of(**s) > 0)
        .map(|s| format!("{} {}", thousands(tally.of(*s)), state_words(*s)))
        .collect();
    let total = tally.total();
    format!(
        "{} {}: {}",
        thousands(total),
        if total == 1 { "node" } else { "nodes" },
        if parts.is_empty() {
            "none".to_string()
        } else {
            parts.join(", ")
        }
    )
}

/// `1,234`.
pub fn thousands(n: usize) -> String {
    crate::compare::report::thousands(n)
}

/// A list of node names with `, …` when `total` is more than those shown.
pub fn few(names: &[String], total: usize) -> String {
    let mut text = names
        .iter()
        .map(|n| visible(n).into_owned())
        .collect::<Vec<_>>()
        .join(", ");
    if total > names.len() {
        text.push_str(", …");
    }
    text
}

/// What every fleet document starts with (`-o json|yaml` of `status` and `verify --all-nodes`,
/// docs/fleet.md): the counts, the nodes nothing can be told of, the rolled-up findings.
#[derive(Debug, Serialize)]
pub struct Head<'a> {
    /// All nodes.
    pub nodes_total: usize,
    /// Nodes per state.
    pub summary: &'a Tally,
    /// The nodes whose state says nothing of their rules ([`NodeState::could_not_tell`]).
    pub could_not_tell: Vec<&'a str>,
    /// The findings rolled up.
    pub findings: &'a [RolledFinding],
    /// Findings not rolled up (too many distinct ones).
    pub findings_left_out: usize,
}

impl<'a> Head<'a> {
    /// The head of a document of `nodes` (name and state of each).
    pub fn new(
        tally: &'a Tally,
        nodes: impl Iterator<Item = (&'a str, NodeState)>,
        rolled: &'a RolledUp,
    ) -> Head<'a> {
        Head {
            nodes_total: tally.total(),
            summary: tally,
            could_not_tell: nodes
                .filter(|(_, s)| s.could_not_tell())
                .map(|(n, _)| n)
                .collect(),
            findings: &rolled.findings,
            findings_left_out: rolled.left_out,
        }
    }
}

/// The rolled-up findings as a table under a title (empty when there are none): ID, severity,
/// how many nodes and a few of them, service, chain and message.
pub fn findings_table(
    title: &str,
    rolled: &RolledUp,
    no_headers: bool,
    painter: Painter,
) -> String {
    if rolled.findings.is_empty() && rolled.left_out == 0 {
        return String::new();
    }
    let mut out = painter.paint(
        Role::Strong,
        &format!("{title} ({} distinct)", thousands(rolled.findings.len())),
    );
    out.push('\n');
    let mut t = KubeTable::new([
        "id", "severity", "nodes", "examples", "service", "chain", "message",
    ]);
    for f in &rolled.findings {
        t.row([
            visible(&f.id).into_owned(),
            f.severity.to_string(),
            thousands(f.nodes),
            few(&f.example_nodes, f.nodes),
            f.service
                .as_deref()
                .map_or("-".into(), |s| visible(s).into_owned()),
            f.chain
                .as_deref()
                .map_or("-".into(), |s| visible(s).into_owned()),
            visible(&f.message).into_owned(),
        ]);
    }
    out.push_str(&t.render(no_headers));
    if rolled.left_out > 0 {
        out.push_str(&format!(
            "{} more findings not rolled up: too many distinct ones (-o json lists the nodes)\n",
            thousands(rolled.left_out)
        ));
    }
    out
}

/// A progress bar on stderr for `len` nodes, drawn only when stderr is a terminal.
pub fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    let template = format!("{{spinner}} {what} {{pos}}/{{len}} [{{bar:30}}] {{elapsed}}");
    if let Ok(style) = indicatif::ProgressStyle::with_template(&template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let s = Duration::from_secs;
        assert_eq!(age(s(45)), "45s");
        assert_eq!(age(s(192)), "3m12s");
        assert_eq!(age(s(300)), "5m");
        assert_eq!(age(s(17 * 60 + 5)), "17m");
        assert_eq!(age(s(5 * 3600 + 180)), "5h3m");
        assert_eq!(age(s(20 * 3600)), "20h");
        assert_eq!(age(s(3 * 86_400 + 4 * 3600)), "3d4h");
        assert_eq!(age(s(40 * 86_400)), "40d");
    }

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(visible("node-1"), "node-1");
        let shown = visible("evil\u{1b}[2Jnode\n");
        assert!(
            !shown.contains('\u{1b}') && !shown.contains('\n'),
            "{shown}"
        );
        assert!(shown.contains("node"));
    }

    #[test]
    fn tally_line_names_every_state_with_nodes() {
        let mut t = Tally::default();
        for _ in 0..1200 {
            t.add(NodeState::InSync);
        }
        t.add(NodeState::Drift);
        t.add(NodeState::AgentMissing);
        assert_eq!(
            tally_line(&t),
            "1,202 nodes: 1 drift, 1 agent missing, 1,200 in sync"
        );
        assert_eq!(tally_line(&Tally::default()), "0 nodes: none");
    }
}
