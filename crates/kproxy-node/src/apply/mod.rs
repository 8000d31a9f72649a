//! Repair, one module per mode ([`iptables`], [`ipvs`], [`nftables`]: plans, the guarded
//! apply-verify-rollback transaction) beside what they share ([`transaction`], [`backup`],
//! [`guard`], [`allow`], [`host`], [`conntrack`]), and the resync loop that stands in for a dead
//! kube-proxy.
//!
//! Everything here is dry-run by default at the CLI, touches only kube-proxy's own objects
//! (every plan is checked against [`allow`] before anything is written), never removes a rule
//! from a built-in chain that the repair did not insert, and rolls back only what it changed
//! ([`iptables::rollback`], [`nftables::rollback`]).

pub mod allow;
pub mod backup;
pub mod conntrack;
pub mod guard;
pub mod host;
pub mod iptables;
pub mod ipvs;
pub mod nftables;
pub mod resync;
pub mod transaction;
