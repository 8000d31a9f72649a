//! The node agent behind `kubectl-kproxy monitor`: it re-verifies one node continuously —
//! after API changes, while differences are pending, and on an interval — and reports what it
//! finds as Prometheus metrics, HTTP endpoints, log lines, Events and a node condition
//! (docs/monitor.md).
//!
//! ```text
//! ApiSource ─┐                    ┌─▶ Shared (metrics, /readyz, /findings) ─▶ server
//!            ├─▶ Verifier ─▶ Tracker (pending or drift)
//! NodeReader ┘                    └─▶ log lines, Publisher (Events, condition), Repairer
//! ```
//!
//! The parts that read ([`sources`]), verify ([`agent::Verifier`]), publish and repair are
//! injected; the state machine ([`tracker`]), the metrics ([`metrics`]), the endpoints
//! ([`server`], [`status`]) and the loop ([`agent`]) do not depend on how a report is made.
#![deny(missing_docs)]

pub mod agent;
pub mod grace;
pub mod metrics;
pub mod server;
pub mod sources;
pub mod status;
pub mod tracker;
