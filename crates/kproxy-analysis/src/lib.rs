//! What a node has, set against what it should have: `verify`'s checks ([`compare`], findings and
//! their exit [`exit::Outcome`]), `trace`'s path view and packet simulator ([`trace`]), and many
//! nodes at a glance ([`fleet`]: node states, the monitor's condition, findings rolled up).
//!
//! ```text
//! ServiceGraph ─┐
//!               ├──compare──▶ Findings
//! expected ─────┘
//! Ruleset + packet ──trace──▶ outcome distribution
//! ```
#![deny(missing_docs)]

pub mod compare;
pub mod exit;
pub mod fleet;
pub mod trace;

// The layers below, under the names the code uses for them (`crate::model::…`).
use kproxy_core::{graph, model, proxier, state};
use kproxy_parsers as parsers;
