//! Repair of nftables-mode nodes: the `nft -f` transaction that makes a node's `table ip
//! kube-proxy` / `table ip6 kube-proxy` what `render --mode nftables` writes, changing only what
//! differs ([`plan`]), run on this host ([`host`]) with the guarantees of the iptables repair:
//! checked first, backed up, one atomic transaction per family, read back and compared again,
//! rolled back on failure ([`repair`]: only the objects the repair changed, [`rollback`]). No
//! other table is ever named.

pub mod host;
pub mod plan;
pub mod repair;
pub mod rollback;
