//! Path view of a service and the packet simulator, laid out per proxy mode as `proxier/` is.
//!
//! * [`path`] — a service's path view (`trace svc/NAME`), built from the service graph the same
//!   way for iptables and nftables nodes; [`conntrack`] adds the node's live flows to it.
//! * [`ipvs`] — an IPVS node's path: virtual server → real servers with their shares.
//! * [`sim`] — the packet simulator (`trace --packet`): the shared engine, packet, report and
//!   walk, with [`sim::iptables`] and [`sim::nftables`] each supplying only what differs.

pub mod conntrack;
pub mod ipvs;
pub mod path;
pub mod sim;
