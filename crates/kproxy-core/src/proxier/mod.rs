//! kube-proxy emulation: from cluster state to the rules kube-proxy would install. Never reads files or the API.

pub mod ipvs;

pub mod canonical;
pub mod endpoints;
pub mod iptables;
pub mod nftables;
pub mod quoting;
pub mod service_port;
pub mod version;
