//! kubectl-kproxy: the node-level debugger and emergency repair kit for kube-proxy.
//!
//! Data flows one way (see README "Architecture"); each layer is a crate that can only use the
//! ones below it:
//!
//! ```text
//! node text ──parsers──▶ Dump ──model──▶ Ruleset ──graph──▶ ServiceGraph ──┐
//!                                                                            ├──compare──▶ Findings ──cli──▶ output
//! API objects ──state──▶ ClusterState ──proxier──▶ expected Ruleset ────────┘
//!                                        └──apply──▶ plan (restore input) ──collect──▶ node
//! Ruleset + packet ──trace──▶ outcome distribution
//! ```
//!
//! * `kproxy-parsers` ([`parsers`]): the text grammars;
//! * `kproxy-core`: [`model`], [`state`], [`proxier`], [`graph`];
//! * `kproxy-analysis`: [`compare`], [`trace`], [`exit`];
//! * `kproxy-node`: [`apply`], [`collect`], [`kube_client`], [`pipeline`], [`publish`];
//! * `kproxy-monitor` ([`monitor`]): the node agent of `monitor`;
//! * this library: [`output`] (presentation), which the layers above never use, and the
//!   allocator tuning of the binary.
//!
//! The commands (`cli/`) are the binary's own modules (`src/main.rs`), not part of this library:
//! nothing here or below can reach them.
#![deny(missing_docs)]

pub mod allocator;
pub mod output;

pub use kproxy_analysis::{compare, exit, trace};
pub use kproxy_core::{graph, model, proxier, state};
pub use kproxy_monitor as monitor;
pub use kproxy_node::{apply, collect, kube_client, pipeline, publish};
pub use kproxy_parsers as parsers;
