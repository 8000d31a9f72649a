//! What the HTTP endpoints serve: the metrics, readiness and the current findings, shared
//! between the loop that writes them and the server that reads them.

use crate::metrics::Metrics;
use crate::tracker::{Assessment, NodeState};
use serde_json::{Value, json};
use std::sync::RwLock;
use std::time::{Duration, Instant, SystemTime};

/// The loop's last word on the node.
#[derive(Debug, Clone)]
struct Last {
    state: NodeState,
    /// Why the monitor is not ready (`None`: ready).
    not_ready: Option<String>,
    /// When the last verify succeeded.
    verified: Option<Instant>,
    /// The `/findings` document of the last verify that succeeded.
    findings: Option<Value>,
}

/// Shared by the loop and the HTTP server.
pub struct Shared {
    /// The metrics.
    pub metrics: Metrics,
    last: RwLock<Last>,
    /// A verify older than this no longer speaks for the node (`kproxy_node_in_sync` 0,
    /// `/readyz` 503); it holds the grace period, which kube-proxy's configuration may move.
    stale_after: RwLock<Duration>,
}

/// RFC 3339 text of a wall-clock time.
pub fn rfc3339(t: SystemTime) -> String {
    k8s_openapi::jiff::Timestamp::try_from(t)
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

impl Shared {
    /// Nothing verified yet; a verify older than `stale_after` no longer speaks for the node.
    pub fn new(metrics: Metrics, stale_after: Duration) -> Shared {
        Shared {
            metrics,
            last: RwLock::new(Last {
                state: NodeState::Unknown,
                not_ready: Some("no verify has finished yet".into()),
                verified: None,
                findings: None,
            }),
            stale_after: RwLock::new(stale_after),
        }
    }

    /// The grace period moved from `old` to `new`: a verify gets as much longer (or shorter)
    /// before it no longer speaks for the node.
    pub fn grace_moved(&self, old: Duration, new: Duration) {
        if let Ok(mut s) = self.stale_after.write() {
            *s = s.saturating_sub(old) + new;
        }
    }

    fn stale_after(&self) -> Duration {
        self.stale_after.read().map_or(Duration::ZERO, |s| *s)
    }

    fn write(&self, f: impl FnOnce(&mut Last)) {
        if let Ok(mut last) = self.last.write() {
            f(&mut last);
        }
    }

    fn read(&self) -> Option<Last> {
        self.last.read().ok().map(|l| l.clone())
    }

    /// Notes a verify that succeeded; `grace` goes into the document.
    pub fn verified(&self, a: &Assessment, at: SystemTime, grace: Duration) {
        let doc = findings_document(a, at, grace);
        self.write(|l| {
            l.state = a.state;
            l.not_ready = None;
            l.verified = Some(Instant::now());
            l.findings = Some(doc);
        });
    }

    /// Notes a verify that failed, and why.
    pub fn failed(&self, why: &str) {
        self.write(|l| {
            l.state = NodeState::Failed;
            l.not_ready = Some(format!("the last verify failed: {why}"));
        });
    }

    /// The state after the last verify.
    pub fn state(&self) -> NodeState {
        self.read().map_or(NodeState::Unknown, |l| l.state)
    }

    /// Whether the last successful verify is too old to speak for the node.
    fn stale(&self, last: &Last) -> Option<String> {
        let age = last.verified?.elapsed();
        let stale_after = self.stale_after();
        (age > stale_after).then(|| {
            format!(
                "the last successful verify is {} old (more than {})",
                kproxy_core::state::duration::format(Duration::from_secs(age.as_secs())),
                kproxy_core::state::duration::format(stale_after)
            )
        })
    }

    /// `/readyz`: `Ok(text)` when ready, else `Err(why)`.
    pub fn readiness(&self) -> Result<String, String> {
        let Some(last) = self.read() else {
            return Err("the monitor's status is unreadable".into());
        };
        if let Some(why) = &last.not_ready {
            return Err(why.clone());
        }
        if let Some(why) = self.stale(&last) {
            return Err(why);
        }
        Ok(format!("ok: node {}", last.state.as_str()))
    }

    /// `/metrics`: the metrics text, with `kproxy_node_in_sync` 0 when the last verify is stale.
    pub fn metrics_text(&self) -> String {
        if let Some(last) = self.read()
            && self.stale(&last).is_some()
        {
            self.metrics.stale();
        }
        self.metrics.encode()
    }

    /// `/findings`: the last report (`None` before the first verify succeeded), marked
    /// `"stale"` with the reason when the last verify failed or is too old.
    pub fn findings(&self) -> Option<Value> {
        let last = self.read()?;
        let mut doc = last.findings.clone()?;
        let why = last.not_ready.clone().or_else(|| self.stale(&last));
        doc["stale"] = why.map_or(Value::Null, Value::String);
        doc["state"] = json!(last.state.as_str());
        Some(doc)
    }
}

/// The `/findings` document: `verify -o json`'s report, each finding with `since` (RFC 3339,
/// first seen) and `pending` (a difference still inside the grace period), and `drift`; plus
/// the node's `state`, `verified_at`, `grace_seconds` and the counts of pending and drifted
/// findings.
fn findings_document(a: &Assessment, at: SystemTime, grace: Duration) -> Value {
    let mut doc = serde_json::to_value(&a.report).unwrap_or_else(|_| json!({}));
    if let Some(items) = doc.get_mut("findings").and_then(Value::as_array_mut) {
        for (item, t) in items.iter_mut().zip(&a.tracked) {
            item["since"] = json!(rfc3339(t.since));
            item["pending"] = json!(t.pending);
            item["drift"] = json!(t.drift);
        }
    }
    doc["state"] = json!(a.state.as_str());
    doc["verified_at"] = json!(rfc3339(at));
    doc["grace_seconds"] = json!(grace.as_secs_f64());
    doc["pending"] = json!(a.tracked.iter().filter(|t| t.pending).count());
    doc["drifted"] = json!(a.tracked.iter().filter(|t| t.drift).count());
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::Tracker;
    use kproxy_analysis::compare::Report;

    fn assessment() -> Assessment {
        Tracker::new(Duration::from_secs(1)).assess(
            Report::new(
                "n",
                kproxy_core::state::mode::ProxyMode::Iptables,
                1,
                vec![],
            ),
            Instant::now(),
        )
    }

    #[test]
    fn ready_after_a_verify_until_it_fails_or_ages() {
        let s = Shared::new(
            Metrics::new(Duration::from_secs(1)),
            Duration::from_secs(3600),
        );
        assert!(s.readiness().is_err_and(|w| w.contains("no verify")));
        assert!(s.findings().is_none());
        let a = assessment();
        s.metrics.verified(&a, Duration::ZERO, SystemTime::now());
        s.verified(&a, SystemTime::now(), Duration::from_secs(1));
        assert_eq!(s.readiness(), Ok("ok: node in_sync".to_string()));
        assert!(s.metrics_text().contains("kproxy_node_in_sync 1"));
        let doc = s.findings().expect("a report");
        assert_eq!(
            (doc["state"].as_str(), doc["stale"].is_null()),
            (Some("in_sync"), true)
        );
        s.failed("iptables-save: executable not found");
        assert!(
            s.readiness()
                .is_err_and(|w| w.contains("executable not found"))
        );
        let doc = s.findings().expect("the last report");
        assert!(
            doc["stale"].as_str().is_some_and(|w| w.contains("failed")),
            "{doc}"
        );

        // A verify older than stale_after no longer speaks for the node.
        let old = Shared::new(Metrics::new(Duration::from_secs(1)), Duration::ZERO);
        old.metrics.verified(&a, Duration::ZERO, SystemTime::now());
        old.verified(&a, SystemTime::now(), Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(5));
        assert!(old.readiness().is_err_and(|w| w.contains("old")));
        assert!(old.metrics_text().contains("kproxy_node_in_sync 0"));
    }
}
