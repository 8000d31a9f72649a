//! Talking to nodes and the API: the collectors that read a node's rules and the API state
//! ([`collect`]), the Kubernetes client ([`kube_client`]), what changes a node: repair plans,
//! backups, the guarded repair transaction and the resync loop ([`apply`]), each job on a node
//! as one call ([`pipeline`]: its mode, release and facts, the comparison of its mode, its
//! conntrack table), and what the monitor writes to the API: Events and the node condition
//! ([`publish`]). [`collect`], [`kube_client`] and [`publish`] are the only modules that run
//! programs or call the API.
//!
//! ```text
//! expected rules ──apply──▶ plan (restore input) ──collect──▶ node
//! NodeSnapshot + API state ──pipeline──▶ Report
//! ```
#![deny(missing_docs)]

pub mod apply;
pub mod collect;
pub mod kube_client;
pub mod pipeline;
pub mod publish;

// The layers below, under the names the code uses for them (`crate::model::…`).
use kproxy_analysis::compare;
use kproxy_core::{graph, model, proxier, state};
use kproxy_parsers as parsers;
