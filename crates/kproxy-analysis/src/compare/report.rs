//! The result of `verify`: findings plus a summary, with the stable machine schema
//! `{node, mode, summary, findings: [{id, severity, service, chain, message, expected, actual, hint}]}`.

use super::finding::{Finding, Severity};
use crate::exit::Outcome;
use crate::state::mode::ProxyMode;
use rayon::prelude::*;
use serde::Serialize;

/// Counts over a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Summary {
    /// Service ports the API implies on this node (all families checked).
    pub service_ports: usize,
    /// Findings of severity error.
    pub errors: usize,
    /// Findings of severity warning.
    pub warnings: usize,
    /// Findings of severity info.
    pub info: usize,
    /// Service ports that could not be checked: their rules hold what this build does not know
    /// (a kube-proxy newer than this build); any makes the exit status 2.
    #[serde(skip_serializing_if = "is_zero")]
    pub unchecked: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// What `verify` found on one node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The node checked.
    pub node: String,
    /// The proxy mode checked (`iptables`, `ipvs`, `nftables`).
    pub mode: ProxyMode,
    /// Counts.
    pub summary: Summary,
    /// Findings, most severe first, then by ID, service and chain.
    pub findings: Vec<Finding>,
    /// How many findings [`Report::group_alike`] left out (those its group findings stand for,
    /// less one per group); absent when none were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub findings_truncated: Option<usize>,
}

impl Report {
    /// Builds a report: sorts the findings, drops exact duplicates and counts them.
    pub fn new(
        node: impl Into<String>,
        mode: ProxyMode,
        service_ports: usize,
        mut findings: Vec<Finding>,
    ) -> Report {
        findings.par_sort_by(|a, b| {
            (a.severity, a.id, &a.service, &a.chain, &a.message)
                .cmp(&(b.severity, b.id, &b.service, &b.chain, &b.message))
        });
        findings.dedup();
        // A group finding counts as the findings it stands for.
        let count = |s: Severity| {
            findings
                .iter()
                .filter(|f| f.severity == s)
                .map(|f| f.group.as_ref().map_or(1, |g| g.count))
                .sum()
        };
        let summary = Summary {
            service_ports,
            errors: count(Severity::Error),
            warnings: count(Severity::Warning),
            info: count(Severity::Info),
            unchecked: 0,
        };
        Report {
            node: node.into(),
            mode,
            summary,
            findings,
            findings_truncated: None,
        }
    }

    /// Mass drift made readable: each set of many findings of one cause becomes one finding
    /// ([`super::grouping`]). The summary still counts every finding (and so does the exit
    /// status); `findings_truncated` says how many are not shown.
    pub fn group_alike(mut self) -> Report {
        let (findings, left_out) = super::grouping::group(std::mem::take(&mut self.findings));
        self.findings = findings;
        self.left_out(left_out);
        self
    }

    /// Counts `n` more findings that group findings stand for (`findings_truncated`).
    pub fn left_out(&mut self, n: usize) {
        if n > 0 {
            self.findings_truncated = Some(self.findings_truncated.unwrap_or(0) + n);
        }
    }

    /// Records how many service ports could not be checked.
    pub fn with_unchecked(mut self, unchecked: usize) -> Report {
        self.summary.unchecked = unchecked;
        self
    }

    /// Exit status: could not run when a service port could not be checked, drift when any
    /// warning or error was found.
    pub fn outcome(&self) -> Outcome {
        if self.summary.unchecked > 0 {
            Outcome::Error
        } else if self.summary.errors + self.summary.warnings > 0 {
            Outcome::Drift
        } else {
            Outcome::Clean
        }
    }

    /// `checked 1,234 service ports: 3 errors, 1 warning` (and `, 2 info` when there are any).
    pub fn summary_line(&self) -> String {
        let s = &self.summary;
        let mut line = format!(
            "checked {} service {}: {}, {}",
            thousands(s.service_ports),
            if s.service_ports == 1 {
                "port"
            } else {
                "ports"
            },
            plural(s.errors, "error", "errors"),
            plural(s.warnings, "warning", "warnings"),
        );
        if s.info > 0 {
            line.push_str(&format!(", {} info", thousands(s.info)));
        }
        if s.unchecked > 0 {
            line.push_str(&format!(
                "; {} not checked (rules this build does not know)",
                thousands(s.unchecked)
            ));
        }
        line
    }
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{} {}", thousands(n), if n == 1 { one } else { many })
}

/// `1234567` → `1,234,567`.
pub fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::catalogue as cat;

    #[test]
    fn summary_line_counts_and_pluralises() {
        let r = Report::new(
            "n",
            ProxyMode::Iptables,
            1234,
            vec![
                cat::CLUSTER_IP_MISSING.finding("a"),
                cat::ENDPOINT_MISSING.finding("b"),
                cat::ENDPOINT_MISSING.finding("c"),
                cat::ORPHAN_CHAIN.finding("d"),
            ],
        );
        assert_eq!(
            r.summary_line(),
            "checked 1,234 service ports: 3 errors, 1 warning"
        );
        assert_eq!(r.outcome(), Outcome::Drift);
        assert_eq!(r.findings[0].id, "KP101");
    }

    #[test]
    fn info_only_is_clean() {
        let r = Report::new(
            "n",
            ProxyMode::Iptables,
            1,
            vec![cat::STALE_CHAIN_LARGE_CLUSTER.finding("x")],
        );
        assert_eq!(r.outcome(), Outcome::Clean);
        assert_eq!(
            r.summary_line(),
            "checked 1 service port: 0 errors, 0 warnings, 1 info"
        );
    }

    #[test]
    fn json_schema_is_stable() {
        let r = Report::new(
            "n",
            ProxyMode::Iptables,
            0,
            vec![cat::CANARY_MISSING.finding("m").chain("c")],
        );
        let text = serde_json::to_string(&r).unwrap_or_default();
        let pos = |k: &str| text.find(&format!("\"{k}\":")).unwrap_or(usize::MAX);
        let keys = [
            "node", "mode", "summary", "findings", "id", "severity", "service", "chain", "message",
            "expected", "actual", "hint",
        ];
        for w in keys.windows(2) {
            assert!(pos(w[0]) < pos(w[1]), "{} before {} in {text}", w[0], w[1]);
        }
        let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(v["summary"]["service_ports"], 0);
        assert_eq!(v["findings"][0]["severity"], "warning");
    }

    #[test]
    fn thousands_separators() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(10_000_000), "10,000,000");
    }
}
