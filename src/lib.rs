//! kubectl-kproxy: the node-level debugger and emergency repair kit for kube-proxy.
//!
//! Data flows one way (see README "Architecture"):
//!
//! ```text
//! node text ──parsers──▶ Dump ──model──▶ Ruleset ──graph──▶ ServiceGraph ──┐
//!                                                                            ├──compare──▶ Findings ──cli──▶ output
//! API objects ──state──▶ ClusterState ──proxier──▶ expected Ruleset ────────┘
//!                                        └──apply──▶ plan (restore input) ──collect──▶ node
//! Ruleset + Packet ──trace──▶ outcome distribution
//! ```
#![deny(missing_docs)]

pub mod allocator;
pub mod apply;
pub mod cli;
pub mod collect;
pub mod compare;
pub mod exit;
pub mod graph;
pub mod kube_client;
pub mod model;
pub mod output;
pub mod proxier;
pub mod state;
pub mod trace;

pub use kproxy_parsers as parsers;
