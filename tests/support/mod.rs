//! Shared helpers for the integration tests.
//!
//! - [`repair`]: the example cluster's files, foreign rules, topology and output helpers of the
//!   `repair` tests (on this host and through the API).
//! - [`ipvs`]: where the IPVS conformance cases and real dumps are; the IPVS VM's tools.
//! - [`netns`]: real-netfilter harness — network namespaces, `iptables-restore`/`iptables-save`
//!   with the nf_tables and legacy backends, a node/client/pods topology with echo servers, and
//!   TCP/UDP probes. See `docs/testing.md` for a walk-through.
//!
//! Not every test module uses every helper, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod fake_apiserver;
pub mod ipvs;
pub mod netns;
pub mod repair;
