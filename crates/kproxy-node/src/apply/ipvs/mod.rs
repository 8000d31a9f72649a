//! IPVS-mode repair: plan the `ipvsadm` commands, `ipset restore -exist` input, `kube-ipvs0`
//! address changes and IPVS-mode iptables chains that turn a node's state into what kube-proxy's
//! IPVS proxier would install, and apply them with backup, read-back verification and rollback.
//!
//! Only what kube-proxy owns is touched (see [`plan::Ownership`]); `ipvsadm -C`/`-R` are never used.

pub mod changes;
pub mod guard;
pub mod host;
pub mod plan;
pub mod repair;
pub mod rollback;
pub mod state;
