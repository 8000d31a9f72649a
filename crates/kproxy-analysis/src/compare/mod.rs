//! Expected vs actual: node-wide checks, graph-level and rule-level diffs into findings.
//!
//! [`run::verify`] is the whole of `verify` for one node: [`nodewide`] checks on the parsed dump
//! (KP0xx), [`graph_level`] per service port against the service graph (KP1xx–KP4xx), and
//! [`rule_level`] per chain against `render` (KP9xx), each reporting only what the previous level
//! has not explained. [`catalogue`] lists every check.

pub mod catalogue;
pub mod conntrack;
pub mod expected;
pub mod finding;
pub mod graph_level;
pub mod grouping;
pub mod ipvs;
pub mod left_out;
pub mod nftables;
pub mod nodewide;
pub mod report;
pub mod rule_level;
pub mod run;
pub mod scope;
pub mod version;

#[cfg(test)]
mod fixture;

pub use finding::{Finding, Severity};
pub use report::{Report, Summary};
pub use run::{
    DumpText, NodePlans, ReleaseCheck, VerifyError, VerifyInput, WriterRelease, verify,
    verify_release,
};
