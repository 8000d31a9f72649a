//! Repair: plans (per-chain diff → `iptables-restore --noflush` input), backups, the guarded
//! apply-verify-rollback transaction, and the resync loop that stands in for a dead kube-proxy.
//!
//! Everything here is dry-run by default at the CLI, touches only chains kube-proxy owns, and
//! never removes a rule from a built-in chain.

pub mod backup;
pub mod conntrack;
pub mod guard;
pub mod host;
pub mod ipvs;
pub mod nftables;
pub mod plan;
pub mod remote;
pub mod repair;
pub mod resync;
