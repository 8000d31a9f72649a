//! The finding type shared by every check (iptables and IPVS), with a stable JSON/YAML schema.

use serde::Serialize;

/// How bad a finding is. Exit status: any warning or error → 1 (drift); info only → 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Something broken: traffic goes (or may go) where the API says it must not.
    Error,
    /// Drift that does not break traffic now, or a risk.
    Warning,
    /// Context worth knowing; not drift.
    Info,
}

/// One thing `verify` found. Field names are a stable interface (`-o json|yaml`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// Stable identifier from the catalogue, e.g. `KP101`.
    pub id: &'static str,
    /// Severity of the finding.
    pub severity: Severity,
    /// The service port concerned (`ns/name:port`), or `None` for node-wide findings.
    pub service: Option<String>,
    /// The chain (or virtual server / ipset) concerned, if any.
    pub chain: Option<String>,
    /// One-line description.
    pub message: String,
    /// What the API implies.
    pub expected: Option<String>,
    /// What the node has.
    pub actual: Option<String>,
    /// What to do about it.
    pub hint: Option<String>,
    /// When the finding stands for many of one cause ([`super::grouping`]): how many, where,
    /// and a few of them. Absent for a single finding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<Box<FindingGroup>>,
}

/// The findings one finding stands for (mass drift, `verify` without `--all-findings`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FindingGroup {
    /// How many findings of this cause there are.
    pub count: usize,
    /// How many chains they are about.
    pub chains: usize,
    /// How many service ports they name.
    pub services: usize,
    /// The first few of them.
    pub examples: Vec<GroupExample>,
}

/// One finding of a group, as a few fields.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupExample {
    /// The service port concerned, if any.
    pub service: Option<String>,
    /// The chain concerned, if any.
    pub chain: Option<String>,
    /// What the API implies.
    pub expected: Option<String>,
    /// What the node has.
    pub actual: Option<String>,
}

/// At most this many items of a list are named in a finding's `expected` or `actual`.
pub const LISTED: usize = 10;

/// `a, b, c and 7 more`: the first [`LISTED`] items, the rest counted. A finding per stale
/// endpoint that named every endpoint of its service would make a report grow with the square
/// of the endpoints.
pub fn listed<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    use std::fmt::Write;
    let mut items = items.into_iter();
    let mut out = String::new();
    for (i, item) in items.by_ref().take(LISTED).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let _ = write!(out, "{item}");
    }
    let more = items.count();
    if more > 0 {
        let _ = write!(out, " and {more} more");
    }
    out
}

impl Severity {
    /// The lower-case word used in every output form (`error`, `warning`, `info`).
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

impl std::fmt::Display for Severity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Finding {
    /// Sets the service port (`ns/name:port`).
    pub fn service(mut self, service: impl Into<String>) -> Self {
        self.service = Some(service.into());
        self
    }

    /// Sets the chain (e.g. `nat KUBE-SERVICES` or `KUBE-SEP-…`).
    pub fn chain(mut self, chain: impl Into<String>) -> Self {
        self.chain = Some(chain.into());
        self
    }

    /// Sets what the API implies.
    pub fn expected(mut self, expected: impl Into<String>) -> Self {
        self.expected = Some(expected.into());
        self
    }

    /// Sets what the node has.
    pub fn actual(mut self, actual: impl Into<String>) -> Self {
        self.actual = Some(actual.into());
        self
    }

    /// Replaces the catalogue hint with a more specific one.
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_lists_are_cut_and_counted() {
        assert_eq!(super::listed(["a", "b"].iter()), "a, b");
        let many: Vec<String> = (0..25).map(|i| format!("10.0.0.{i}:80")).collect();
        let text = super::listed(many.iter());
        assert!(text.starts_with("10.0.0.0:80, 10.0.0.1:80, "), "{text}");
        assert!(text.ends_with("10.0.0.9:80 and 15 more"), "{text}");
    }
}
