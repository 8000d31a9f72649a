//! The monitor's Prometheus metrics (`/metrics`, OpenMetrics text through `prometheus-client`).
//! Names and labels are an interface (docs/monitor.md lists them); labels take bounded values
//! only: a severity, a finding ID of the catalogue, a run result, the build's version, mode and
//! kube-proxy release. No label names a service.

use crate::tracker::{Assessment, NodeState};
use kproxy_analysis::compare::Severity;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::AtomicU64;
use std::time::{Duration, SystemTime};

/// `kproxy_findings{severity,id}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FindingLabels {
    /// `error`, `warning` or `info`.
    pub severity: &'static str,
    /// The finding's catalogue ID, e.g. `KP201`.
    pub id: &'static str,
}

/// `kproxy_verify_runs_total{result}` and `kproxy_repairs_total{result}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `clean`, `drift`, `failed` (verify); `applied`, `failed`, `skipped` (repair).
    pub result: &'static str,
}

/// `kproxy_node_reads_total{read}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReadLabels {
    /// `whole` or `kept`.
    pub read: &'static str,
}

/// `kproxy_build_info{version,mode,kube_proxy_version}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// This build's version.
    pub version: String,
    /// The proxy mode verified (empty before the first verify).
    pub mode: String,
    /// The kube-proxy release the rules are compared with (empty when not known yet).
    pub kube_proxy_version: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Every metric of the monitor and the registry that encodes them.
pub struct Metrics {
    registry: Registry,
    in_sync: Gauge,
    findings: Family<FindingLabels, Gauge>,
    drifted_service_ports: Gauge,
    pending_service_ports: Gauge,
    verify_duration: Histogram,
    verify_runs: Family<ResultLabels, Counter>,
    last_verify: FloatGauge,
    latency: Histogram,
    stale_flows: Gauge,
    build_info: Family<BuildLabels, Gauge>,
    verify_failing: Gauge,
    grace: FloatGauge,
    repairs: Family<ResultLabels, Counter>,
    node_reads: Family<ReadLabels, Counter>,
    rule_changes: Counter,
}

/// Seconds since the Unix epoch.
pub fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Metrics {
    /// Registers every metric; `grace` is reported as `kproxy_grace_seconds`.
    pub fn new(grace: Duration) -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            in_sync: Gauge::default(),
            findings: Family::default(),
            drifted_service_ports: Gauge::default(),
            pending_service_ports: Gauge::default(),
            // 10 ms … ~82 s: a small node verifies in milliseconds, a 10k-service one in seconds.
            verify_duration: Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.01, 2.0, 14),
            ),
            verify_runs: Family::default(),
            last_verify: FloatGauge::default(),
            // kube-proxy batches for minSyncPeriod (1 s) and syncs in well under a second on a
            // small node; the alert threshold is 30 s.
            latency: Histogram::new([
                0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0,
            ]),
            stale_flows: Gauge::default(),
            build_info: Family::default(),
            verify_failing: Gauge::default(),
            grace: FloatGauge::default(),
            repairs: Family::default(),
            node_reads: Family::default(),
            rule_changes: Counter::default(),
            registry: Registry::default(),
        };
        m.grace.set(grace.as_secs_f64());
        registry.register(
            "kproxy_node_in_sync",
            "1 when the last verify succeeded, is recent, and no difference has lasted past the grace period; else 0",
            m.in_sync.clone(),
        );
        registry.register(
            "kproxy_findings",
            "Findings of the last verify, pending and drifted, by severity and finding ID",
            m.findings.clone(),
        );
        registry.register(
            "kproxy_drifted_service_ports",
            "Service ports with a difference that has lasted past the grace period",
            m.drifted_service_ports.clone(),
        );
        registry.register(
            "kproxy_pending_service_ports",
            "Service ports with a difference younger than the grace period (kube-proxy may still be programming them)",
            m.pending_service_ports.clone(),
        );
        registry.register_with_unit(
            "kproxy_verify_duration",
            "Time one verify took: reading the node and comparing it with the API",
            Unit::Seconds,
            m.verify_duration.clone(),
        );
        registry.register(
            "kproxy_verify_runs",
            "Verifies by result: clean, drift (any difference, pending or not) or failed (could not run)",
            m.verify_runs.clone(),
        );
        registry.register(
            "kproxy_last_verify_timestamp_seconds",
            "Unix time of the last verify that succeeded",
            m.last_verify.clone(),
        );
        registry.register_with_unit(
            "kproxy_programming_latency",
            "Time from an API change first seen by the monitor to the node's rules first seen matching it again (kube-proxy's network programming latency, measured from outside)",
            Unit::Seconds,
            m.latency.clone(),
        );
        registry.register(
            "kproxy_stale_conntrack_flows",
            "Conntrack flows that still go to endpoints the API no longer has (findings KP6xx)",
            m.stale_flows.clone(),
        );
        registry.register(
            "kproxy_build_info",
            "The monitor's version, the proxy mode it verifies and the kube-proxy release it compares with (value 1)",
            m.build_info.clone(),
        );
        registry.register(
            "kproxy_verify_failing",
            "1 while the last verify could not run (kproxy_node_in_sync is then 0 and says nothing about the rules)",
            m.verify_failing.clone(),
        );
        registry.register(
            "kproxy_grace_seconds",
            "How long a difference may last before it is drift",
            m.grace.clone(),
        );
        registry.register(
            "kproxy_repairs",
            "Repairs by --repair=when-kube-proxy-down: applied, failed, or skipped because kube-proxy is healthy",
            m.repairs.clone(),
        );
        registry.register(
            "kproxy_node_reads",
            "Reads of the node for a verify: whole (every output read), or kept (what was read from nf_tables kept from the last whole read, because its change events said nothing changed since)",
            m.node_reads.clone(),
        );
        registry.register(
            "kproxy_rule_changes",
            "Changes of the nf_tables tables the collector reads, as their change events reported them (rules, chains, sets, elements)",
            m.rule_changes.clone(),
        );
        let mut m = m;
        m.registry = registry;
        m
    }

    /// The grace period now (`kproxy_grace_seconds`).
    pub fn set_grace(&self, grace: Duration) {
        self.grace.set(grace.as_secs_f64());
    }

    /// Sets `kproxy_build_info`: one series, value 1.
    pub fn set_build(&self, labels: BuildLabels) {
        self.build_info.clear();
        self.build_info.get_or_create(&labels).set(1);
    }

    /// Records a verify that succeeded and took `took`.
    pub fn verified(&self, a: &Assessment, took: Duration, at: SystemTime) {
        self.verify_duration.observe(took.as_secs_f64());
        let result = if a.report.summary.errors + a.report.summary.warnings > 0 {
            "drift"
        } else {
            "clean"
        };
        self.verify_runs
            .get_or_create(&ResultLabels { result })
            .inc();
        self.last_verify.set(unix_seconds(at));
        self.verify_failing.set(0);
        self.in_sync.set(i64::from(a.state != NodeState::Drift));
        self.findings.clear();
        for t in &a.tracked {
            let f = &t.finding;
            let n = f.group.as_ref().map_or(1, |g| g.count);
            self.findings
                .get_or_create(&FindingLabels {
                    severity: severity_word(f.severity),
                    id: f.id,
                })
                .inc_by(i64::try_from(n).unwrap_or(i64::MAX));
        }
        self.drifted_service_ports
            .set(i64::try_from(a.drifted_service_ports).unwrap_or(i64::MAX));
        self.pending_service_ports
            .set(i64::try_from(a.pending_service_ports).unwrap_or(i64::MAX));
        self.stale_flows
            .set(i64::try_from(stale_flows(a)).unwrap_or(i64::MAX));
        if let Some(l) = a.latency {
            self.latency.observe(l.as_secs_f64());
        }
    }

    /// Records a verify that could not run: the node is not reported in sync.
    pub fn failed(&self, took: Duration) {
        self.verify_duration.observe(took.as_secs_f64());
        self.verify_runs
            .get_or_create(&ResultLabels { result: "failed" })
            .inc();
        self.verify_failing.set(1);
        self.in_sync.set(0);
    }

    /// Says the node is not in sync because the last verify is too old to speak for it.
    pub fn stale(&self) {
        self.in_sync.set(0);
    }

    /// Counts one read of the node, and the rule changes reported before it.
    pub fn node_read(&self, whole: bool, rule_changes: u64) {
        let read = if whole { "whole" } else { "kept" };
        self.node_reads.get_or_create(&ReadLabels { read }).inc();
        self.rule_changes.inc_by(rule_changes);
    }

    /// Counts one repair outcome.
    pub fn repair(&self, result: &'static str) {
        self.repairs.get_or_create(&ResultLabels { result }).inc();
    }

    /// The metrics as OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// OpenMetrics text as the Prometheus text format (0.0.4) says it, for scrapers and tools
/// that do not ask for OpenMetrics (`promtool check metrics`, `curl`): no `# UNIT` and `# EOF`
/// lines, and a counter's family named as its samples are (`…_total`).
pub fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The lower-case severity word.
fn severity_word(s: Severity) -> &'static str {
    s.as_str()
}

/// The flows the conntrack findings (KP6xx) count: each names its number of flows first
/// (`4 UDP flows to …`, `1 TCP connection to …`, `compare::conntrack` `StaleGroup::finding`).
fn stale_flows(a: &Assessment) -> usize {
    a.tracked
        .iter()
        .map(|t| &t.finding)
        .filter(|f| f.id.starts_with("KP6"))
        .map(|f| {
            f.message
                .split_whitespace()
                .next()
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(1)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_flows_are_the_counts_the_conntrack_findings_name() {
        use kproxy_analysis::compare::conntrack::STALE_ENDPOINT;
        let report = kproxy_analysis::compare::Report::new(
            "n",
            kproxy_core::state::mode::ProxyMode::Iptables,
            1,
            vec![
                STALE_ENDPOINT.finding("4 UDP flows to 10.96.0.10:53 still DNAT to 10.244.1.5:53"),
                STALE_ENDPOINT
                    .finding("1 UDP flow to 10.96.0.11:53 still DNAT to 10.244.1.6:53")
                    .chain("conntrack udp 10.96.0.11:53"),
            ],
        );
        let a =
            crate::tracker::Tracker::new(Duration::ZERO).assess(report, std::time::Instant::now());
        assert_eq!(stale_flows(&a), 5);
    }

    #[test]
    fn prometheus_text_names_counters_by_their_samples() {
        let m = Metrics::new(Duration::from_secs(2));
        m.failed(Duration::from_millis(5));
        let om = m.encode();
        assert!(om.contains("# TYPE kproxy_verify_runs counter"), "{om}");
        assert!(om.ends_with("# EOF\n"), "{om}");
        let text = prometheus_text(&om);
        assert!(
            text.contains("# TYPE kproxy_verify_runs_total counter"),
            "{text}"
        );
        assert!(
            text.contains("kproxy_verify_runs_total{result=\"failed\"} 1"),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("# UNIT"),
            "{text}"
        );
        assert!(text.contains("kproxy_node_in_sync 0"), "{text}");
    }
}
