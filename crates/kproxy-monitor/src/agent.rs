//! The loop: re-verify the node after API changes (debounced), while differences are pending,
//! and every interval; turn each result into the node's state ([`Tracker`]), the metrics and
//! endpoints ([`Shared`]), one log line per change of state, Events and the node condition
//! ([`Publisher`]), and, when asked, a repair while kube-proxy is down ([`Repairer`]).
//!
//! How a report is made is injected ([`Verifier`]), as are the inputs ([`ApiSource`],
//! [`NodeReader`]): the loop knows only reports and failures.

use crate::sources::{ApiSource, ApiView, BoxFuture, NodeReader};
use crate::status::{Shared, rfc3339};
use crate::tracker::{Assessment, NodeState, Tracker};
use kproxy_analysis::compare::Report;
use kproxy_analysis::fleet::condition;
use kproxy_core::state::ClusterState;
use kproxy_node::collect::NodeSnapshot;
use kproxy_node::collect::local::{ProxyHealth, kube_proxy_health};
use kproxy_node::publish::Condition;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Everything one verify reads.
#[derive(Debug, Clone)]
pub struct VerifyInputs {
    /// Services, EndpointSlices, Nodes.
    pub state: ClusterState,
    /// kube-proxy's configuration text and its source (`None`: defaults).
    pub config_text: Option<(String, String)>,
    /// The node's rules.
    pub snapshot: NodeSnapshot,
    /// The node's name.
    pub node: String,
}

/// What one verify made.
#[derive(Debug, Clone)]
pub struct Verified {
    /// The report, as `verify -o json` prints it.
    pub report: Report,
    /// The kube-proxy release the rules were compared with, when known.
    pub kube_proxy_version: Option<String>,
}

/// Makes a report from the inputs (`verify`'s logic). Runs on a blocking thread.
pub trait Verifier: Send + Sync + 'static {
    /// One verify; an error when it cannot conclude anything.
    fn verify(&self, inputs: VerifyInputs) -> Result<Verified, String>;
}

/// Repairs the node as `repair --local --apply` does. Runs on a blocking thread.
pub trait Repairer: Send + Sync + 'static {
    /// One repair from the API state; a one-line summary, or why it failed.
    fn repair(&self, view: &ApiView) -> Result<String, String>;
}

/// Tells the API about the node: Events and the node condition.
pub trait Publisher: Send + Sync {
    /// One Event on the Node.
    fn event(&self, warning: bool, reason: &str, note: &str) -> BoxFuture<'_, Result<(), String>>;
    /// Sets the node condition.
    fn condition(&self, condition: Condition) -> BoxFuture<'_, Result<(), String>>;
}

impl Publisher for kproxy_node::publish::NodePublisher {
    fn event(&self, warning: bool, reason: &str, note: &str) -> BoxFuture<'_, Result<(), String>> {
        let (reason, note) = (reason.to_string(), note.to_string());
        Box::pin(async move {
            kproxy_node::publish::NodePublisher::event(self, warning, &reason, "Verify", &note)
                .await
                .map_err(|e| e.to_string())
        })
    }

    fn condition(&self, condition: Condition) -> BoxFuture<'_, Result<(), String>> {
        Box::pin(async move {
            self.set_condition(&condition)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// The Event reason when drift appears.
pub const REASON_DRIFT: &str = "KubeProxyRulesDrift";
/// The Event reason when it clears.
pub const REASON_IN_SYNC: &str = "KubeProxyRulesInSync";
/// The node condition's type.
pub const CONDITION: &str = condition::TYPE;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `TIME node=N state=S previous=P message`.
    Text,
    /// One JSON object per line.
    Json,
}

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The node's name.
    pub node: String,
    /// Time between two verifies when nothing happens.
    pub interval: Duration,
    /// Wait after an API change before verifying (more changes coming at once are taken together).
    pub debounce: Duration,
    /// Time between verifies while differences are pending or an API change is not matched yet.
    pub recheck: Duration,
    /// How long a difference may last before it is drift (at start).
    pub grace: Duration,
    /// Whether the grace was given (`--grace`); else it follows kube-proxy's configuration
    /// ([`crate::grace::from_config`]) as that changes.
    pub grace_fixed: bool,
    /// The least time between two Events of one reason.
    pub event_interval: Duration,
    /// Whether to set the node condition.
    pub condition: bool,
    /// How often the condition is re-sent while it does not change.
    pub condition_heartbeat: Duration,
    /// Repair when drift lasts past the grace and kube-proxy is not healthy.
    pub repair: bool,
    /// kube-proxy's `healthzBindAddress`.
    pub healthz_address: String,
    /// Log line format.
    pub log: LogFormat,
    /// This build's version (`kproxy_build_info`).
    pub version: String,
}

/// The injected parts.
pub struct Parts {
    /// The API state and configuration.
    pub source: Box<dyn ApiSource>,
    /// The node's rules.
    pub reader: Box<dyn NodeReader>,
    /// verify.
    pub verifier: Arc<dyn Verifier>,
    /// Events and the node condition (`None`: not published).
    pub publisher: Option<Box<dyn Publisher>>,
    /// The repair (`None`: never repair).
    pub repairer: Option<Arc<dyn Repairer>>,
}

/// The loop's memory between verifies.
struct Memory {
    tracker: Tracker,
    last_event: HashMap<&'static str, Instant>,
    /// Whether the node was last published as drifted (events fire on changes of it).
    drifted: Option<bool>,
    /// The condition last sent: status, reason and when it was sent, and when the status last
    /// changed.
    condition: Option<(&'static str, &'static str, Instant, SystemTime)>,
    /// The failure last logged (a new reason is a new line).
    failure: Option<String>,
    last_repair: Option<Instant>,
    /// Whether a skipped repair was logged in this drift.
    repair_noted: bool,
    /// The view last verified, kept for `--repair` only (it is a copy of the whole API state).
    view: Option<ApiView>,
    /// [`ApiSource::fingerprint`] (else [`ApiView::fingerprint`]) of the view last verified.
    fingerprint: Option<u64>,
}

/// Runs the loop until `shutdown` completes.
pub async fn run(
    opts: Options,
    parts: Parts,
    shared: Arc<Shared>,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut mem = Memory {
        tracker: Tracker::new(opts.grace),
        last_event: HashMap::new(),
        drifted: None,
        condition: None,
        failure: None,
        last_repair: None,
        repair_noted: false,
        view: None,
        fingerprint: None,
    };
    shared.metrics.set_build(crate::metrics::BuildLabels {
        version: opts.version.clone(),
        mode: String::new(),
        kube_proxy_version: String::new(),
    });
    let mut next = Instant::now();
    loop {
        let due = if mem.tracker.wants_recheck(Instant::now()) {
            next.min(Instant::now() + opts.recheck)
        } else {
            next
        };
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep_until(due.into()) => {}
            () = parts.source.changed() => {
                let seen = Instant::now();
                tokio::time::sleep(opts.debounce).await;
                // A change that cannot touch the rules (another node's heartbeat) is no reason
                // to read the node.
                let now = parts.source.fingerprint(&opts.node).or_else(|| {
                    parts.source.current().ok().map(|v| v.fingerprint(&opts.node))
                });
                if now.is_some() && now == mem.fingerprint {
                    continue;
                }
                mem.tracker.api_changed(seen);
            }
            // The node's rules changed (kube-proxy synced, or something else wrote them).
            () = parts.reader.changed() => {
                tokio::time::sleep(opts.debounce).await;
            }
        }
        let again = once(&opts, &parts, &shared, &mut mem).await;
        next = if again {
            Instant::now()
        } else {
            Instant::now() + opts.interval
        };
    }
}

/// One verify and what follows from it; true when the node should be verified again at once
/// (it was just repaired).
async fn once(opts: &Options, parts: &Parts, shared: &Shared, mem: &mut Memory) -> bool {
    let started = Instant::now();
    let previous = mem.tracker.state();
    let result = verify(opts, parts).await;
    let took = started.elapsed();
    let (verified, view, fingerprint) = match result {
        Err(why) => {
            failed(opts, parts, shared, mem, previous, took, &why).await;
            return false;
        }
        Ok((verified, view, read)) => {
            shared.metrics.node_read(read.whole, read.rule_changes);
            (verified, view, read.fingerprint)
        }
    };
    mem.failure = None;
    if !opts.grace_fixed {
        follow_grace(opts, shared, mem, &view);
    }
    let grace = mem.tracker.grace();
    let at = SystemTime::now();
    let mode = verified.report.mode.to_string();
    let a = mem.tracker.assess(verified.report, started);
    shared.metrics.verified(&a, took, at);
    shared.verified(&a, at, grace);
    shared.metrics.set_build(crate::metrics::BuildLabels {
        version: opts.version.clone(),
        mode,
        kube_proxy_version: verified.kube_proxy_version.unwrap_or_default(),
    });
    if a.state != previous {
        log(opts, a.state, previous, &describe(&a, grace));
    }
    publish(opts, parts, mem, &a).await;
    mem.fingerprint = fingerprint;
    if opts.repair {
        mem.view = Some(view);
    }
    if a.state != NodeState::Drift {
        mem.repair_noted = false;
        return false;
    }
    repair(opts, parts, shared, mem).await
}

/// The grace period of the configuration `view` holds (kube-proxy's defaults without one),
/// when it differs from the tracker's: the tracker, the metrics and the staleness of reports
/// move to it, and a log line says so. A configuration that does not read leaves the grace as
/// it is (the verify says what is wrong with it).
fn follow_grace(opts: &Options, shared: &Shared, mem: &mut Memory, view: &ApiView) {
    let config = match &view.config_text {
        None => Ok(kproxy_core::state::config::ProxyConfig::default()),
        Some((text, name)) => kproxy_core::state::config::parse(text, name).map(|(c, _)| c),
    };
    let Ok(config) = config else {
        return;
    };
    let (grace, how) = crate::grace::from_config(&config);
    let old = mem.tracker.grace();
    if grace == old {
        return;
    }
    mem.tracker.set_grace(grace);
    shared.metrics.set_grace(grace);
    shared.grace_moved(old, grace);
    warn(
        opts,
        &format!(
            "kube-proxy's configuration changed: grace {} ({how}), was {}",
            kproxy_core::state::duration::format(grace),
            kproxy_core::state::duration::format(old)
        ),
    );
}

/// What one verify read: how it read the node (for the metrics), and the API state's
/// fingerprint, taken before the state (a change in between makes one verify more, never one
/// less).
struct ReadKind {
    whole: bool,
    rule_changes: u64,
    fingerprint: Option<u64>,
}

/// Reads the API side and the node, and verifies; the view comes back without its state unless
/// `--repair` needs it.
async fn verify(opts: &Options, parts: &Parts) -> Result<(Verified, ApiView, ReadKind), String> {
    let cheap = parts.source.fingerprint(&opts.node);
    let mut view = parts.source.current()?;
    let fingerprint = cheap.or_else(|| Some(view.fingerprint(&opts.node)));
    let read = parts.reader.read().await?;
    let kind = ReadKind {
        whole: read.whole,
        rule_changes: read.rule_changes,
        fingerprint,
    };
    // The state is the largest input: verify lets go of it once it has planned, so the view
    // keeps a copy only for `--repair`, which repairs from it.
    let state = if opts.repair {
        view.state.clone()
    } else {
        std::mem::take(&mut view.state)
    };
    let inputs = VerifyInputs {
        state,
        config_text: view.config_text.clone(),
        snapshot: read.snapshot,
        node: opts.node.clone(),
    };
    let verifier = Arc::clone(&parts.verifier);
    let verified = tokio::task::spawn_blocking(move || verifier.verify(inputs))
        .await
        .map_err(|e| format!("the verify stopped: {e}"))??;
    Ok((verified, view, kind))
}

/// A verify that could not run: counted, said once per reason, and the condition Unknown.
async fn failed(
    opts: &Options,
    parts: &Parts,
    shared: &Shared,
    mem: &mut Memory,
    previous: NodeState,
    took: Duration,
    why: &str,
) {
    mem.tracker.failed();
    shared.metrics.failed(took);
    shared.failed(why);
    if previous != NodeState::Failed || mem.failure.as_deref() != Some(why) {
        log(opts, NodeState::Failed, previous, why);
        mem.failure = Some(why.to_string());
    }
    if let Some(p) = &parts.publisher
        && opts.condition
    {
        set_condition(
            opts,
            p.as_ref(),
            mem,
            "Unknown",
            condition::VERIFY_FAILED,
            &format!("kproxy could not verify the node: {why}"),
        )
        .await;
    }
}

/// One line on what the node's state came to.
fn describe(a: &Assessment, grace: Duration) -> String {
    let s = &a.report.summary;
    let mut line = format!(
        "{} error(s), {} warning(s); {} drifted and {} pending service port(s), grace {}",
        s.errors,
        s.warnings,
        a.drifted_service_ports,
        a.pending_service_ports,
        kproxy_core::state::duration::format(grace)
    );
    let first: Vec<String> = a
        .tracked
        .iter()
        .filter(|t| t.drift || t.pending)
        .take(3)
        .map(|t| {
            let f = &t.finding;
            format!(
                "{} {}{}",
                f.id,
                f.service.as_deref().unwrap_or("-"),
                if t.drift { "" } else { " (pending)" }
            )
        })
        .collect();
    if !first.is_empty() {
        line.push_str(&format!(": {}", first.join(", ")));
    }
    line
}

/// Writes one log line on stderr.
fn log(opts: &Options, state: NodeState, previous: NodeState, message: &str) {
    use std::io::Write;
    let time = rfc3339(SystemTime::now());
    let line = match opts.log {
        LogFormat::Json => serde_json::json!({
            "time": time,
            "node": opts.node,
            "state": state.as_str(),
            "previous": previous.as_str(),
            "message": message,
        })
        .to_string(),
        LogFormat::Text => format!(
            "{time} node={} state={} previous={} {message}",
            opts.node,
            state.as_str(),
            previous.as_str()
        ),
    };
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Events when drift appears or clears, and the condition.
async fn publish(opts: &Options, parts: &Parts, mem: &mut Memory, a: &Assessment) {
    let Some(p) = &parts.publisher else {
        return;
    };
    let drifted = a.state == NodeState::Drift;
    let message = describe(a, mem.tracker.grace());
    if mem.drifted != Some(drifted) {
        // The first verify of a node in sync is no news; of a drifted node, it is.
        let news = drifted || mem.drifted.is_some();
        mem.drifted = Some(drifted);
        let reason = if drifted {
            REASON_DRIFT
        } else {
            REASON_IN_SYNC
        };
        let recent = mem
            .last_event
            .get(reason)
            .is_some_and(|t| t.elapsed() < opts.event_interval);
        if news && !recent {
            let note = if drifted {
                format!("kube-proxy's rules differ from the API past the grace period: {message}")
            } else {
                format!("kube-proxy's rules match the API again: {message}")
            };
            match p.event(drifted, reason, &note).await {
                Ok(()) => {
                    mem.last_event.insert(reason, Instant::now());
                }
                Err(e) => warn(opts, &format!("could not publish the {reason} Event: {e}")),
            }
        }
    }
    if opts.condition {
        // Pending is still True (kube-proxy's own lag is no drift), with a reason of its own so
        // that `status` can tell it apart.
        let (status, reason) = match a.state {
            NodeState::Drift => ("False", condition::RULES_DRIFTED),
            NodeState::Pending => ("True", condition::RULES_PENDING),
            _ => ("True", condition::RULES_MATCH),
        };
        set_condition(opts, p.as_ref(), mem, status, reason, &message).await;
    }
}

/// Sends the condition when its status or reason changed or its heartbeat is due; the
/// transition time moves only with the status.
async fn set_condition(
    opts: &Options,
    p: &dyn Publisher,
    mem: &mut Memory,
    status: &'static str,
    reason: &'static str,
    message: &str,
) {
    let now = SystemTime::now();
    let (due, transition) = match mem.condition {
        Some((s, r, sent, since)) if s == status => (
            r != reason || sent.elapsed() >= opts.condition_heartbeat,
            since,
        ),
        _ => (true, now),
    };
    if !due {
        return;
    }
    let c = Condition {
        type_: CONDITION.to_string(),
        status,
        reason: reason.to_string(),
        message: kproxy_node::collect::shorten(message, 1000),
        last_transition: rfc3339(transition),
        heartbeat: rfc3339(now),
    };
    match p.condition(c).await {
        Ok(()) => mem.condition = Some((status, reason, Instant::now(), transition)),
        Err(e) => warn(
            opts,
            &format!("could not set the node condition {CONDITION}: {e}"),
        ),
    }
}

fn warn(opts: &Options, message: &str) {
    use std::io::Write;
    let line = match opts.log {
        LogFormat::Json => serde_json::json!({
            "time": rfc3339(SystemTime::now()), "node": opts.node, "level": "warning",
            "message": message,
        })
        .to_string(),
        LogFormat::Text => format!(
            "{} node={} warning: {message}",
            rfc3339(SystemTime::now()),
            opts.node
        ),
    };
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// `--repair=when-kube-proxy-down`: the node has drifted past the grace; repair it when
/// kube-proxy is not healthy, at most once per grace period. True when it repaired.
async fn repair(opts: &Options, parts: &Parts, shared: &Shared, mem: &mut Memory) -> bool {
    let Some(repairer) = parts.repairer.as_ref().filter(|_| opts.repair) else {
        return false;
    };
    if mem
        .last_repair
        .is_some_and(|t| t.elapsed() < mem.tracker.grace().max(Duration::from_secs(1)))
    {
        return false;
    }
    match kube_proxy_health(&opts.healthz_address, Duration::from_secs(2)).await {
        ProxyHealth::Healthy => {
            shared.metrics.repair("skipped");
            if !mem.repair_noted {
                warn(
                    opts,
                    &format!(
                        "drift, but kube-proxy answers healthy at {}: not repairing (kube-proxy owns the rules)",
                        opts.healthz_address
                    ),
                );
                mem.repair_noted = true;
            }
            false
        }
        ProxyHealth::Unhealthy(why) | ProxyHealth::Unreachable(why) => {
            let Some(view) = mem.view.clone() else {
                return false;
            };
            mem.last_repair = Some(Instant::now());
            let r = Arc::clone(repairer);
            let done = tokio::task::spawn_blocking(move || r.repair(&view))
                .await
                .map_err(|e| format!("the repair stopped: {e}"))
                .and_then(|r| r);
            match done {
                Ok(summary) => {
                    shared.metrics.repair("applied");
                    mem.tracker.forget_change();
                    warn(
                        opts,
                        &format!(
                            "kube-proxy is not healthy ({why}): repaired the drift: {summary}"
                        ),
                    );
                    true
                }
                Err(e) => {
                    shared.metrics.repair("failed");
                    warn(
                        opts,
                        &format!("kube-proxy is not healthy ({why}); the repair failed: {e}"),
                    );
                    false
                }
            }
        }
    }
}
