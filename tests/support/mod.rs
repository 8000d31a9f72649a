//! Shared helpers for the integration tests.
//!
//! - [`netns`]: real-netfilter harness — network namespaces, `iptables-restore`/`iptables-save`
//!   with the nf_tables and legacy backends, a node/client/pods topology with echo servers, and
//!   TCP/UDP probes. See `docs/testing.md` for a walk-through.
//!
//! Not every test module uses every helper, hence the `dead_code` allowance.
#![allow(dead_code)]

pub mod fake_apiserver;
pub mod netns;
