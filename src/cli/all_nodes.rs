//! `verify --all-nodes`: every node (or those `-l` selects) read through its kube-proxy pod or a
//! debug pod and verified, `--parallel` at a time.
//!
//! The API state and kube-proxy's configuration are read once and shared by every node (one
//! copy of the state, whatever the number of nodes); each node's own work is reading its rules
//! and what follows from its own facts. Each attempt at reading a node through its kube-proxy
//! pod has `--node-timeout` (a debug pod's steps have limits of their own); a failure that may
//! pass is tried again (`--retries`, 1 s then 2 s apart, …). Nothing keeps a
//! node's report: a node leaves its counts and its findings' roll-up keys, so what is held grows
//! with the concurrency and the distinct findings, not with the nodes.
//!
//! Ctrl-C stops the run: no node is started after it, the reads under way end (a debug pod is
//! deleted first), and what was verified is printed, the rest as not checked; the exit status
//! is then 2 (could not tell, for those nodes) rather than the shell's 130, so that a script
//! reading 0/1/2 sees the run as incomplete.

use super::common::{DumpArgs, GlobalArgs, StateArgs};
use super::live::{self, CollectorChoice, LiveArgs, ResolvedInputs};
use crate::exit::Outcome;
use crate::fleet::{FindingKey, NodeState, Notes, RolledNote, RolledUp, Rollup, Tally};
use crate::output::color::{Painter, Role};
use crate::output::fleet::{
    Head, few, findings_table, progress_bar, state_role, state_words, tally_line, thousands,
    visible,
};
use crate::output::table::KubeTable;
use anyhow::{anyhow, bail};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

/// What one node's verify came to: all that is kept of its report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSummary {
    /// Proxy mode verified.
    pub mode: crate::state::mode::ProxyMode,
    /// Service ports checked.
    pub service_ports_checked: usize,
    /// Error findings.
    pub errors: usize,
    /// Warning findings.
    pub warnings: usize,
    /// The node's exit outcome.
    pub outcome: Outcome,
    /// Its differences, for the roll-up ([`FindingKey::differences`]).
    pub differences: Vec<FindingKey>,
    /// The report's summary line, said for a node whose report could not tell everything.
    pub summary_line: String,
    /// Warnings of the verify, said once for all nodes at the end.
    pub notes: Vec<String>,
}

/// How the run is printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Nodes that are not in sync, grouped by state; the rolled-up findings; the counts.
    Table,
    /// As `table`, with every node.
    Wide,
    /// The document of docs/fleet.md.
    Json,
    /// The same as YAML.
    Yaml,
}

/// One node's line of the run (the JSON `nodes[]` item).
#[derive(Debug, Clone, Serialize)]
struct NodeRow {
    name: String,
    state: NodeState,
    mode: Option<String>,
    service_ports: Option<usize>,
    errors: Option<usize>,
    warnings: Option<usize>,
    collector: Option<String>,
    attempts: u32,
    error: Option<String>,
}

impl NodeRow {
    fn new(name: String, state: NodeState) -> NodeRow {
        NodeRow {
            name,
            state,
            mode: None,
            service_ports: None,
            errors: None,
            warnings: None,
            collector: None,
            attempts: 0,
            error: None,
        }
    }
}

/// The whole run (`-o json|yaml`; docs/fleet.md).
#[derive(Debug, Serialize)]
struct RunDocument<'a> {
    #[serde(flatten)]
    head: Head<'a>,
    interrupted: bool,
    nodes: &'a [NodeRow],
}

/// Runs `per_node` on every node (see the module docs), prints the run in `format` and returns
/// its outcome: the worst of its nodes' (0 in sync, 1 drift, 2 a node could not be verified or
/// was not checked). `per_node` must not print.
pub fn run<F>(
    global: &GlobalArgs,
    args: &LiveArgs,
    state: &StateArgs,
    format: Format,
    per_node: F,
) -> anyhow::Result<Outcome>
where
    F: Fn(ResolvedInputs) -> anyhow::Result<NodeSummary> + Send + Sync + 'static,
{
    if args.bundle.is_some() {
        bail!("--all-nodes reads the cluster; it cannot be combined with --bundle");
    }
    let collector = match args.collector {
        CollectorChoice::Auto | CollectorChoice::Exec => CollectorChoice::Exec,
        CollectorChoice::DebugPod => CollectorChoice::DebugPod,
        other => bail!(
            "--all-nodes needs --collector exec or debug-pod, not {}",
            live::collector_name(other)
        ),
    };
    let limits = Limits {
        exec_timeout: live::exec_timeout(args)?,
        node_timeout: live::positive_duration("--node-timeout", &args.node_timeout)?,
        retries: u32::from(args.retries),
    };
    let per_node = Arc::new(per_node);
    let rt = live::runtime()?;
    let result = rt.block_on(async {
        let shared = Arc::new(live::load_shared(global, args, state, collector).await?);
        let conn = shared
            .conn
            .clone()
            .ok_or_else(|| anyhow!("--all-nodes needs API access"))?;
        let names = crate::collect::fleet::list_node_names(&conn, args.selector.as_deref()).await?;
        if names.is_empty() {
            return Err(live::no_nodes(args.selector.as_deref()));
        }
        anyhow::Ok(fan_out(names, shared, args, collector, limits, per_node).await)
    });
    // A verify still running on a blocking thread after Ctrl-C is not waited for.
    rt.shutdown_background();
    let run = result?;
    print_notes(&run.notes);
    if run.interrupted {
        super::common::warn(format!(
            "interrupted: {} of {} nodes verified; the rest are not checked",
            thousands(run.tally.total() - run.tally.of(NodeState::NotChecked)),
            thousands(run.tally.total())
        ));
    }
    print(&run, format, global.no_headers)?;
    Ok(run.tally.outcome())
}

/// Bounds on the work of one node.
#[derive(Debug, Clone, Copy)]
struct Limits {
    exec_timeout: Duration,
    node_timeout: Duration,
    retries: u32,
}

/// What a run came to.
struct Run {
    rows: Vec<NodeRow>,
    tally: Tally,
    rolled: RolledUp,
    /// The nodes' warnings, each once.
    notes: (Vec<RolledNote>, usize),
    interrupted: bool,
}

/// What one node leaves: its row, its differences, and its warnings with the names that are
/// its own.
struct Done {
    row: NodeRow,
    differences: Vec<FindingKey>,
    notes: Vec<String>,
    pod: Option<String>,
}

impl Done {
    fn row(row: NodeRow) -> Done {
        Done {
            row,
            differences: Vec::new(),
            notes: Vec::new(),
            pod: None,
        }
    }
}

/// Each warning once, with the number of nodes that had it.
fn print_notes((notes, left_out): &(Vec<RolledNote>, usize)) {
    for n in notes {
        if n.nodes == 1 {
            super::common::warn(visible(&n.text));
        } else {
            super::common::warn(format!(
                "{} (the same on {} nodes)",
                visible(&n.text),
                thousands(n.nodes)
            ));
        }
    }
    if *left_out > 0 {
        super::common::warn(format!(
            "{} more warnings not shown: too many distinct ones",
            thousands(*left_out)
        ));
    }
}

async fn fan_out<F>(
    names: Vec<String>,
    shared: Arc<live::Shared>,
    args: &LiveArgs,
    collector: CollectorChoice,
    limits: Limits,
    per_node: Arc<F>,
) -> Run
where
    F: Fn(ResolvedInputs) -> anyhow::Result<NodeSummary> + Send + Sync + 'static,
{
    use futures::StreamExt;
    let bar = progress_bar(names.len() as u64, "nodes");
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let tasks = names.into_iter().map(|node| {
        let shared = Arc::clone(&shared);
        let per_node = Arc::clone(&per_node);
        let stopped = stopped.clone();
        async move { one_node(node, &shared, args, collector, limits, per_node, stopped).await }
    });
    let mut results = futures::stream::iter(tasks).buffer_unordered(usize::from(args.parallel));
    let mut rows = Vec::new();
    let mut tally = Tally::default();
    let mut rollup = Rollup::default();
    let mut notes = Notes::default();
    let mut interrupted = false;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut listening = true;
    loop {
        tokio::select! {
            heard = &mut ctrl_c, if listening => {
                // Without a signal handler (it could not be installed) the run goes on.
                listening = false;
                if heard.is_ok() {
                    interrupted = true;
                    let _ = stop.send(true);
                }
            }
            next = results.next() => {
                let Some(done) = next else { break };
                bar.inc(1);
                let row = done.row;
                tally.add(row.state);
                rollup.add(&row.name, done.differences);
                let own = [row.name.as_str(), done.pod.as_deref().unwrap_or_default()];
                for note in &done.notes {
                    notes.add(&row.name, &own, note);
                }
                rows.push(row);
            }
        }
    }
    bar.finish_and_clear();
    rows.sort_by(|a, b| a.name.cmp(&b.name));
    Run {
        rows,
        tally,
        rolled: rollup.finish(),
        notes: notes.finish(),
        interrupted,
    }
}

/// Reads and verifies one node.
async fn one_node<F>(
    node: String,
    shared: &live::Shared,
    args: &LiveArgs,
    collector: CollectorChoice,
    limits: Limits,
    per_node: Arc<F>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> Done
where
    F: Fn(ResolvedInputs) -> anyhow::Result<NodeSummary> + Send + Sync + 'static,
{
    let mut row = NodeRow::new(node.clone(), NodeState::NotChecked);
    if *stopped.borrow() {
        return Done::row(row);
    }
    let dumps = DumpArgs::default();
    let read = loop {
        row.attempts += 1;
        let read = live::collect_node(shared, args, &dumps, collector, &node, limits.exec_timeout);
        // A debug pod is never dropped half-way, which would leave it running: it ends by
        // itself on Ctrl-C (deleting its pod first), and its steps have their own limits
        // (starting, each command), so --node-timeout bounds the exec collector only.
        let outcome = if collector == CollectorChoice::DebugPod {
            Ok(read.await)
        } else {
            tokio::select! {
                r = tokio::time::timeout(limits.node_timeout, read) => r,
                _ = stopped.wait_for(|s| *s) => return Done::row(row),
            }
        };
        let (error, again) = match outcome {
            Ok(Ok(snapshot)) => break Ok(snapshot),
            Ok(Err(e)) => {
                let interrupted = e
                    .downcast_ref::<crate::collect::CollectError>()
                    .is_some_and(|c| matches!(c, crate::collect::CollectError::Interrupted));
                if interrupted {
                    return Done::row(row);
                }
                let again = e
                    .downcast_ref::<crate::collect::CollectError>()
                    .is_some_and(crate::collect::CollectError::is_transient);
                (e, again)
            }
            Err(_) => (
                anyhow!(
                    "reading the node took longer than --node-timeout {}",
                    crate::state::duration::format(limits.node_timeout)
                ),
                true,
            ),
        };
        if !again || row.attempts > limits.retries {
            break Err(error);
        }
        let pause = Duration::from_secs(1 << (row.attempts - 1).min(5));
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = stopped.wait_for(|s| *s) => return Done::row(row),
        }
    };
    let snapshot = match read {
        Ok(s) => s,
        Err(e) => {
            row.state = NodeState::Failed;
            row.error = Some(super::common::error_text(&e));
            return Done::row(row);
        }
    };
    row.collector = Some(snapshot.collector.clone());
    let pod = pod_of(&snapshot.collector);
    let mut inputs = shared.inputs_for(node, snapshot);
    // Said once for all nodes at the end, not once per node.
    let mut notes = std::mem::take(&mut inputs.snapshot.warnings);
    let verify = move || per_node(inputs);
    let (row, differences) = match tokio::task::spawn_blocking(verify).await {
        Ok(Ok(summary)) => {
            row.state = match summary.outcome {
                Outcome::Clean => NodeState::InSync,
                Outcome::Drift => NodeState::Drift,
                Outcome::Error => NodeState::Failed,
            };
            if summary.outcome == Outcome::Error {
                row.error = Some(summary.summary_line);
            }
            row.mode = Some(summary.mode.to_string());
            notes.extend(summary.notes);
            row.service_ports = Some(summary.service_ports_checked);
            row.errors = Some(summary.errors);
            row.warnings = Some(summary.warnings);
            (row, summary.differences)
        }
        Ok(Err(e)) => {
            row.state = NodeState::Failed;
            row.error = Some(super::common::error_text(&e));
            (row, Vec::new())
        }
        Err(e) => {
            row.state = NodeState::Failed;
            row.error = Some(format!("the verify stopped: {e}"));
            (row, Vec::new())
        }
    };
    Done {
        row,
        differences,
        notes,
        pod,
    }
}

/// The pod a collector read through (`exec (kube-system/kube-proxy-x)`, `debug-pod
/// (kube-system/kproxy-debug-…, IMAGE)`): its name.
fn pod_of(collector: &str) -> Option<String> {
    let inside = collector.split_once('(')?.1;
    let location = inside.split([',', ')']).next()?;
    Some(location.rsplit('/').next()?.trim().to_string())
}

fn print(run: &Run, format: Format, no_headers: bool) -> anyhow::Result<()> {
    let text = match format {
        Format::Json | Format::Yaml => {
            let doc = RunDocument {
                head: Head::new(
                    &run.tally,
                    run.rows.iter().map(|r| (r.name.as_str(), r.state)),
                    &run.rolled,
                ),
                interrupted: run.interrupted,
                nodes: &run.rows,
            };
            if format == Format::Json {
                crate::output::to_json(&doc)?
            } else {
                crate::output::to_yaml(&doc)?
            }
        }
        Format::Table | Format::Wide => table(
            run,
            format == Format::Wide,
            no_headers,
            Painter::for_stdout(),
        ),
    };
    super::common::write_stdout(&text)?;
    Ok(())
}

/// The nodes grouped by state (in sync ones only when `wide`), the rolled-up findings, and the
/// counts.
fn table(run: &Run, wide: bool, no_headers: bool, painter: Painter) -> String {
    let mut out = String::new();
    let dash = |v: &Option<String>| v.as_deref().map_or("-".into(), |s| visible(s).into_owned());
    let count = |v: Option<usize>| v.map_or("-".into(), thousands);
    for state in NodeState::ALL {
        let rows: Vec<&NodeRow> = run.rows.iter().filter(|r| r.state == state).collect();
        if rows.is_empty() || (state == NodeState::InSync && !wide) {
            continue;
        }
        let title = format!(
            "{} ({})",
            state_words(state).to_uppercase(),
            thousands(rows.len())
        );
        out.push_str(&painter.paint(state_role(state), &title));
        out.push('\n');
        let t = match state {
            NodeState::Failed => {
                let mut t = KubeTable::new(["node", "attempts", "collector", "error"]);
                for r in rows {
                    t.row([
                        visible(&r.name).into_owned(),
                        r.attempts.to_string(),
                        dash(&r.collector),
                        dash(&r.error),
                    ]);
                }
                t
            }
            NodeState::NotChecked if !wide => {
                // Names only, a few: -o wide and -o json list them all.
                let names: Vec<String> = rows.iter().take(10).map(|r| r.name.clone()).collect();
                out.push_str(&few(&names, rows.len()));
                out.push_str("\n\n");
                continue;
            }
            NodeState::NotChecked => {
                let mut t = KubeTable::new(["node"]);
                for r in rows {
                    t.row([visible(&r.name).into_owned()]);
                }
                t
            }
            _ => {
                let mut t = KubeTable::new([
                    "node",
                    "mode",
                    "service-ports",
                    "errors",
                    "warnings",
                    "collector",
                ]);
                for r in rows {
                    t.row([
                        visible(&r.name).into_owned(),
                        dash(&r.mode),
                        count(r.service_ports),
                        count(r.errors),
                        count(r.warnings),
                        dash(&r.collector),
                    ]);
                }
                t
            }
        };
        out.push_str(&t.render(no_headers));
        out.push('\n');
    }
    let findings = findings_table("FINDINGS", &run.rolled, no_headers, painter);
    if !findings.is_empty() {
        out.push_str(&findings);
        out.push('\n');
    }
    let role = match run.tally.outcome() {
        Outcome::Clean => Role::Ok,
        Outcome::Drift => Role::Error,
        Outcome::Error => Role::Warn,
    };
    out.push_str(&painter.paint(role, &tally_line(&run.tally)));
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::pod_of;

    #[test]
    fn the_pod_a_collector_read_through() {
        assert_eq!(
            pod_of("exec (kube-system/kube-proxy-node-1)").as_deref(),
            Some("kube-proxy-node-1")
        );
        assert_eq!(
            pod_of("debug-pod (kube-system/kproxy-debug-node-1-x7k2p, docker.io/nicolaka/netshoot:v0.13)")
                .as_deref(),
            Some("kproxy-debug-node-1-x7k2p")
        );
        assert_eq!(pod_of("files"), None);
    }
}
