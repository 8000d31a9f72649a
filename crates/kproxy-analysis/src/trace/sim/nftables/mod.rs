//! The packet simulator on nftables rulesets (`trace --packet --nft-ruleset FILE`): the same two
//! models as for iptables, on the typed rules of [`crate::parsers::nft`].
//!
//! * [`kptest`] — `--model kube-proxy-test`: kube-proxy's nftables unit-test tracer, formatted as
//!   its tests compare it (`{"output", "masq"}`).
//! * [`kernel`] — `--model kernel`: every base chain of the packet's family by hook and
//!   priority, statement by statement; `numgen` splits the walk into shares, giving the same
//!   [`Distribution`](super::Distribution) as the iptables walk.

mod eval;
pub mod kernel;
pub mod kptest;

use crate::parsers::nft::{Family, Ruleset, Table};
use crate::proxier::nftables::names as kp;
use std::net::IpAddr;

/// kube-proxy's table for a packet to `dst`: `ip kube-proxy` for IPv4, `ip6 kube-proxy` for IPv6.
pub fn table_for<'r, 'a>(rules: &'r Ruleset<'a>, dst: IpAddr) -> Option<&'r Table<'a>> {
    let family = if dst.is_ipv4() {
        Family::Ip
    } else {
        Family::Ip6
    };
    rules.table(family, kp::TABLE)
}
