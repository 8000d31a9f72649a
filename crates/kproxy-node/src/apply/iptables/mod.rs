//! The iptables mode's repair: the per-chain [`plan`] (→ `iptables-restore --noflush` input), the
//! guarded apply-verify-rollback transaction ([`repair`]), putting back only what it changed
//! ([`rollback`]), and the two places a node's rules are reached: this host ([`host`]) and a node
//! through the API ([`remote`]).

pub mod host;
pub mod plan;
pub mod remote;
pub mod repair;
pub mod rollback;
