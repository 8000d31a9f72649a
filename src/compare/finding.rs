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
}
