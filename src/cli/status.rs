//! `status`: the fleet at a glance, from what the monitor (`kubectl-kproxy monitor` on every
//! node) already put in the cluster: each node's `KubeProxyRulesInSync` condition (one `list
//! nodes`), and the findings of the drifted nodes from their agents' `/findings`, through the
//! API server's pod proxy (docs/fleet.md).

use super::common::GlobalArgs;
use crate::collect::fleet::{self, Fleet, NodeStatus, StatusQuery};
use crate::exit::Outcome;
use crate::fleet::{NodeState, RolledUp, Rollup, Tally, condition, whole_seconds};
use crate::output::color::{Painter, Role};
use crate::output::fleet::{
    Head, age, findings_table, progress_bar, state_role, state_words, tally_line, thousands,
    visible,
};
use crate::output::table::KubeTable;
use anyhow::Context;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::time::{Duration, SystemTime};

/// Output formats of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    /// Nodes grouped by state, drifted ones first with their findings rolled up.
    Table,
    /// As `table`, with every node (in sync too) and the agent and heartbeat of each.
    Wide,
    /// The document of docs/fleet.md.
    Json,
    /// The same as YAML.
    Yaml,
}

/// Arguments of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = StatusFormat::Table)]
    pub output: StatusFormat,
    /// Node label selector, e.g. `node-role.kubernetes.io/worker=`.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// How many agents are asked for their findings at once.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub max_concurrency: u16,
    /// The longest one agent's findings may take to come (the agent serves a document it
    /// keeps: a healthy one answers in milliseconds).
    #[arg(long, value_name = "DURATION", default_value = "3s")]
    pub agent_timeout: String,
    /// A condition whose last heartbeat is older than this no longer speaks for its node (the
    /// monitor re-sends it every 5m: the default allows two missed).
    #[arg(long, value_name = "DURATION", default_value = "15m")]
    pub stale_after: String,
    /// Label selector of the monitor's pods.
    #[arg(hide_short_help = true, long, value_name = "SELECTOR", default_value = DEFAULT_AGENT_SELECTOR)]
    pub agent_selector: String,
    /// Namespace of the monitor's pods.
    #[arg(
        hide_short_help = true,
        long,
        value_name = "NS",
        default_value = "kube-system"
    )]
    pub agent_namespace: String,
    /// The monitor's port (default: its pod's container port named `metrics`, else 9847).
    #[arg(hide_short_help = true, long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub agent_port: Option<u16>,
}

/// The labels of the monitor's DaemonSet (`deploy/monitor/daemonset.yaml`).
pub const DEFAULT_AGENT_SELECTOR: &str = "app.kubernetes.io/name=kproxy-monitor";

/// Runs `status`.
pub fn run(args: StatusArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let timeout = super::live::positive_duration("--agent-timeout", &args.agent_timeout)?;
    let stale_after = super::live::positive_duration("--stale-after", &args.stale_after)?;
    let query = StatusQuery {
        selector: args.selector.clone(),
        agent_namespace: args.agent_namespace.clone(),
        agent_selector: args.agent_selector.clone(),
        agent_port_name: fleet::AGENT_PORT_NAME.to_string(),
        agent_port: args.agent_port,
        stale_after,
        max_concurrency: usize::from(args.max_concurrency),
        agent_timeout: timeout,
    };
    let now = SystemTime::now();
    let rt = super::live::runtime()?;
    let (fleet, rolled) = rt.block_on(async {
        // The pod proxy answers 503 for an agent that does not answer: kube's own retries of 503
        // would hide that until the timeout.
        let conn = crate::kube_client::connect_without_retries(&global.client_options()).await?;
        let mut fleet = fleet::read_fleet(&conn, &query, now).await?;
        let drifted = fleet.drifted();
        let bar = progress_bar(drifted.len() as u64, "findings of drifted nodes");
        let mut rollup = Rollup::default();
        fleet::fetch_findings_of(&conn, &mut fleet, &drifted, &query, &mut rollup, || {
            bar.inc(1)
        })
        .await;
        bar.finish_and_clear();
        anyhow::Ok((fleet, rollup.finish()))
    })?;
    rt.shutdown_background();
    if fleet.nodes.is_empty() {
        return Err(super::live::no_nodes(args.selector.as_deref()));
    }
    for w in &fleet.warnings {
        super::common::warn(w);
    }
    let mut tally = Tally::default();
    fleet.nodes.iter().for_each(|n| tally.add(n.state));
    let view = View {
        fleet: &fleet,
        rolled: &rolled,
        tally: &tally,
        now,
        stale_after,
    };
    let text = match args.output {
        StatusFormat::Json => crate::output::to_json(&view.document())?,
        StatusFormat::Yaml => crate::output::to_yaml(&view.document())?,
        StatusFormat::Table | StatusFormat::Wide => view.table(
            args.output == StatusFormat::Wide,
            global.no_headers,
            Painter::for_stdout(),
        ),
    };
    super::common::write_stdout(&text).context("writing the status")?;
    Ok(tally.outcome())
}

/// What is printed, and when it was read.
struct View<'a> {
    fleet: &'a Fleet,
    rolled: &'a RolledUp,
    tally: &'a Tally,
    now: SystemTime,
    stale_after: Duration,
}

/// `status -o json|yaml` (docs/fleet.md). Field names are a stable interface.
#[derive(Serialize)]
struct Document<'a> {
    #[serde(flatten)]
    head: Head<'a>,
    stale_after_seconds: u64,
    warnings: &'a [String],
    nodes: Vec<NodeDoc<'a>>,
}

#[derive(Serialize)]
struct NodeDoc<'a> {
    name: &'a str,
    state: NodeState,
    detail: Option<&'a str>,
    condition: Option<ConditionDoc<'a>>,
    agent: Option<AgentDoc<'a>>,
    findings: Option<FindingsDoc<'a>>,
}

#[derive(Serialize)]
struct ConditionDoc<'a> {
    status: &'a str,
    reason: &'a str,
    message: &'a str,
    last_transition_time: Option<String>,
    last_heartbeat_time: Option<String>,
    heartbeat_age_seconds: Option<u64>,
}

#[derive(Serialize)]
struct AgentDoc<'a> {
    namespace: &'a str,
    pod: &'a str,
    phase: Option<&'a str>,
    ready: bool,
    port: Option<u16>,
}

#[derive(Serialize)]
struct FindingsDoc<'a> {
    error: Option<&'a str>,
    drifted: usize,
    pending: usize,
    unknown_severity: usize,
    state: Option<&'a str>,
    stale: Option<&'a str>,
    verified_at: Option<&'a str>,
}

fn rfc3339(t: Option<SystemTime>) -> Option<String> {
    Some(crate::monitor::status::rfc3339(t?)).filter(|s| !s.is_empty())
}

impl View<'_> {
    fn age_of(&self, t: Option<SystemTime>) -> Option<Duration> {
        t.map(|t| whole_seconds(self.now.duration_since(t).unwrap_or_default()))
    }

    fn document(&self) -> Document<'_> {
        let nodes = self
            .fleet
            .nodes
            .iter()
            .map(|n| NodeDoc {
                name: &n.name,
                state: n.state,
                detail: n.detail.as_deref(),
                condition: n.condition.as_ref().map(|c| ConditionDoc {
                    status: &c.status,
                    reason: &c.reason,
                    message: &c.message,
                    last_transition_time: rfc3339(c.last_transition),
                    last_heartbeat_time: rfc3339(c.heartbeat),
                    heartbeat_age_seconds: self.age_of(c.heartbeat).map(|d| d.as_secs()),
                }),
                agent: n.agent.as_ref().map(|p| AgentDoc {
                    namespace: &p.namespace,
                    pod: &p.name,
                    phase: p.phase.as_deref(),
                    ready: p.ready,
                    port: p.port,
                }),
                findings: n.findings.as_ref().map(|f| FindingsDoc {
                    error: f.error.as_deref(),
                    drifted: f.drifted,
                    pending: f.pending,
                    unknown_severity: f.unknown_severity,
                    state: f.state.as_deref(),
                    stale: f.stale.as_deref(),
                    verified_at: f.verified_at.as_deref(),
                }),
            })
            .collect();
        Document {
            head: Head::new(
                self.tally,
                self.fleet.nodes.iter().map(|n| (n.name.as_str(), n.state)),
                self.rolled,
            ),
            stale_after_seconds: self.stale_after.as_secs(),
            warnings: &self.fleet.warnings,
            nodes,
        }
    }

    /// Drifted nodes first with their findings, then those nothing can be said of, then pending
    /// ones, then (wide) those in sync; the counts last.
    fn table(&self, wide: bool, no_headers: bool, painter: Painter) -> String {
        let mut out = String::new();
        let of = |state: NodeState| -> Vec<&NodeStatus> {
            self.fleet
                .nodes
                .iter()
                .filter(|n| n.state == state)
                .collect()
        };
        let section = |out: &mut String, title: String, role: Role, t: KubeTable| {
            out.push_str(&painter.paint(role, &title));
            out.push('\n');
            out.push_str(&t.render(no_headers));
            out.push('\n');
        };
        let drifted = of(NodeState::Drift);
        if !drifted.is_empty() {
            let mut t = KubeTable::new(self.columns(wide, &["since", "drifted", "pending"]));
            for n in &drifted {
                let (drift, pending, message) = findings_cells(n);
                let mut row = vec![visible(&n.name).into_owned(), self.since(n), drift, pending];
                self.wide_cells(&mut row, n, wide);
                row.push(message);
                t.row(row);
            }
            let title = format!("DRIFT ({})", thousands(drifted.len()));
            section(&mut out, title, state_role(NodeState::Drift), t);
            let findings = findings_table(
                "FINDINGS ON DRIFTED NODES",
                self.rolled,
                no_headers,
                painter,
            );
            if !findings.is_empty() {
                out.push_str(&findings);
                out.push('\n');
            }
        }
        let unsure: Vec<&NodeStatus> = self
            .fleet
            .nodes
            .iter()
            .filter(|n| n.state.could_not_tell())
            .collect();
        if !unsure.is_empty() {
            let mut t = KubeTable::new(self.columns(wide, &["state", "since"]));
            let mut ordered = unsure.clone();
            ordered.sort_by_key(|n| n.state);
            for n in ordered {
                let mut row = vec![
                    visible(&n.name).into_owned(),
                    state_words(n.state).to_string(),
                    self.since(n),
                ];
                self.wide_cells(&mut row, n, wide);
                row.push(unsure_detail(n));
                t.row(row);
            }
            let title = format!("COULD NOT TELL ({})", thousands(unsure.len()));
            section(&mut out, title, Role::Warn, t);
        }
        for state in [NodeState::Pending, NodeState::InSync] {
            let nodes = of(state);
            if nodes.is_empty() || (state == NodeState::InSync && !wide) {
                continue;
            }
            let mut t = KubeTable::new(self.columns(wide, &["since"]));
            for n in &nodes {
                let mut row = vec![visible(&n.name).into_owned(), self.since(n)];
                self.wide_cells(&mut row, n, wide);
                row.push(condition_message(n));
                t.row(row);
            }
            let title = format!(
                "{} ({})",
                state_words(state).to_uppercase(),
                thousands(nodes.len())
            );
            section(&mut out, title, state_role(state), t);
        }
        let role = match self.tally.outcome() {
            Outcome::Clean => Role::Ok,
            Outcome::Drift => Role::Error,
            Outcome::Error => Role::Warn,
        };
        out.push_str(&painter.paint(role, &tally_line(self.tally)));
        out.push('\n');
        out
    }

    /// NODE, then `middle`, then (wide) HEARTBEAT and AGENT, then MESSAGE.
    fn columns(&self, wide: bool, middle: &[&str]) -> Vec<String> {
        let mut cols = vec!["node".to_string()];
        cols.extend(middle.iter().map(|c| c.to_string()));
        if wide {
            cols.extend(["heartbeat".to_string(), "agent".to_string()]);
        }
        cols.push("message".to_string());
        cols
    }

    fn wide_cells(&self, row: &mut Vec<String>, n: &NodeStatus, wide: bool) {
        if !wide {
            return;
        }
        row.push(
            self.age_of(n.condition.as_ref().and_then(|c| c.heartbeat))
                .map_or("-".into(), age),
        );
        row.push(n.agent.as_ref().map_or("-".into(), |p| {
            visible(&format!("{}/{}", p.namespace, p.name)).into_owned()
        }));
    }

    /// How long the condition's status has held.
    fn since(&self, n: &NodeStatus) -> String {
        self.age_of(n.condition.as_ref().and_then(|c| c.last_transition))
            .map_or("-".into(), age)
    }
}

/// The drifted and pending counts and the message of a drifted node's row.
fn findings_cells(n: &NodeStatus) -> (String, String, String) {
    let Some(f) = &n.findings else {
        return ("-".into(), "-".into(), condition_message(n));
    };
    if let Some(e) = &f.error {
        return (
            "-".into(),
            "-".into(),
            format!("findings not read: {}", visible(e)),
        );
    }
    let mut notes = Vec::new();
    if let Some(state) = f.state.as_deref().filter(|s| *s != "drift") {
        notes.push(format!("the agent now says {}", visible(state)));
    }
    if let Some(stale) = &f.stale {
        notes.push(format!("its report is stale: {}", visible(stale)));
    }
    if f.unknown_severity > 0 {
        notes.push(format!(
            "{} finding(s) of a severity this build does not know",
            f.unknown_severity
        ));
    }
    let message = if notes.is_empty() {
        condition_message(n)
    } else {
        format!("{} ({})", condition_message(n), notes.join("; "))
    };
    (thousands(f.drifted), thousands(f.pending), message)
}

/// The condition's message, or `-`.
fn condition_message(n: &NodeStatus) -> String {
    n.condition
        .as_ref()
        .filter(|c| !c.message.is_empty())
        .map_or("-".into(), |c| visible(&c.message).into_owned())
}

/// Why nothing can be said of a node: the reason the condition is not taken at its word, and
/// what it last said.
fn unsure_detail(n: &NodeStatus) -> String {
    let mut parts = Vec::new();
    if let Some(d) = &n.detail {
        parts.push(visible(d).into_owned());
    }
    if let Some(c) = &n.condition {
        let said = if c.message.is_empty() {
            format!("{} {}", c.status, c.reason)
        } else {
            format!("{} {}: {}", c.status, c.reason, c.message)
        };
        let said = visible(&said).into_owned();
        parts.push(if n.state == NodeState::AgentStale {
            format!("it last said {said}")
        } else {
            said
        });
    }
    if parts.is_empty() {
        format!("no {} condition", condition::TYPE)
    } else {
        parts.join("; ")
    }
}
