//! The facts kproxy works on: the one canonical rule representation ([`model`]), the API state,
//! kube-proxy's configuration and the node facts ([`state`]), kube-proxy's proxiers emulated
//! from them ([`proxier`], the expected side) and the service graph rebuilt from a node's rules
//! ([`graph`], the observed side). No I/O besides reading the files it is given.
//!
//! ```text
//! node text ──parsers──▶ Dump ──model──▶ Ruleset ──graph──▶ ServiceGraph
//! API objects ──state──▶ ClusterState ──proxier──▶ expected Ruleset
//! ```
#![deny(missing_docs)]

pub mod graph;
pub mod model;
pub mod proxier;
pub mod state;

use kproxy_parsers as parsers;
