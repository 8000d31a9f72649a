//! Expected vs actual: graph-level and rule-level diffs into findings.

pub mod finding;

pub use finding::{Finding, Severity};
