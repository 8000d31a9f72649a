//! Live flows on the path view (`trace svc/NAME --conntrack FILE`): next to each endpoint's share
//! of new connections (what the rules would choose now), the number of flows in the node's
//! conntrack table that reply from it (where traffic really goes), and the flows through an entry
//! that reply from somewhere no branch picks any more — a gone endpoint, or the service address
//! itself when the flow was never DNATed.
//!
//! A flow belongs to an entry when its protocol, original destination port and address match the
//! entry's (a NodePort entry without an address takes every destination address).

use super::path::PathView;
use crate::state::ip::{Cidr, join_host_port, parse_ip_sloppy};
use kproxy_parsers::conntrack::Flow;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// Flows through an entry whose reply source is no endpoint of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OtherFlows {
    /// The reply source (`10.244.1.5:53`).
    pub reply_source: String,
    /// Whether the flows were DNATed (false: the reply source is the entry's address itself).
    pub dnat: bool,
    /// Number of flows.
    pub flows: usize,
    /// How many are `[ASSURED]`.
    pub assured: usize,
}

impl OtherFlows {
    /// `3 live flows still DNAT to 10.244.1.5:53, which no rule picks any more`.
    pub fn describe(&self) -> String {
        let n = flows_text(self.flows);
        if self.dnat {
            format!(
                "{n} still DNAT to {}, which no rule here picks any more (stale conntrack entries)",
                self.reply_source
            )
        } else {
            format!("{n} were never DNATed and bypass the endpoints (stale conntrack entries)")
        }
    }
}

/// `1 live flow`, `3 live flows`.
pub fn flows_text(n: usize) -> String {
    if n == 1 {
        "1 live flow".into()
    } else {
        format!("{n} live flows")
    }
}

/// The address part of an entry: an address, a block (`127.0.0.0/8`), or any address.
fn entry_matches(address: Option<&str>, dst: &IpAddr) -> bool {
    match address {
        None => true,
        Some(a) => match Cidr::parse_sloppy(a) {
            Some(c) => c.contains(dst),
            None => parse_ip_sloppy(a).is_some_and(|ip| ip == *dst),
        },
    }
}

/// Fills [`EndpointPath::live_flows`](super::path::EndpointPath::live_flows) and
/// [`EntryPath::other_flows`](super::path::EntryPath::other_flows) from `flows`. Stale UDP and
/// SCTP flows count as divergences of the view (as `verify` reports them as errors; stale TCP
/// connections end on their own).
pub fn annotate(view: &mut PathView, flows: &[Flow<'_>]) {
    let mut stale = 0;
    for port in &mut view.ports {
        let Some(protocol) = port.protocol.as_deref().map(str::to_ascii_lowercase) else {
            continue;
        };
        for entry in &mut port.entries {
            let Some(entry_port) = entry.port else {
                continue;
            };
            // The family of the entry: its address, else its endpoints' (a NodePort entry
            // without an address is of the dump's family only).
            let v6 = entry
                .address
                .as_deref()
                .map(|a| a.contains(':'))
                .or_else(|| {
                    entry
                        .branches
                        .iter()
                        .flat_map(|b| &b.endpoints)
                        .find_map(|ep| ep.destination.as_deref())
                        .map(|d| d.starts_with('['))
                });
            // reply source → (DNATed, flows, assured)
            let mut by_reply: BTreeMap<SocketAddr, (bool, usize, usize)> = BTreeMap::new();
            for f in flows {
                if !f.protocol_name.eq_ignore_ascii_case(&protocol)
                    || f.original.dport() != Some(entry_port)
                    || !entry_matches(entry.address.as_deref(), &f.original.dst)
                    || v6.is_some_and(|v6| v6 != f.original.dst.is_ipv6())
                {
                    continue;
                }
                let Some(sport) = f.reply.sport() else {
                    continue;
                };
                let slot = by_reply
                    .entry(SocketAddr::new(f.reply.src, sport))
                    .or_insert((f.is_dnat(), 0, 0));
                slot.1 += 1;
                slot.2 += usize::from(f.assured);
            }
            for branch in &mut entry.branches {
                for ep in &mut branch.endpoints {
                    let dest = ep
                        .destination
                        .as_deref()
                        .and_then(|d| d.parse::<SocketAddr>().ok());
                    ep.live_flows = Some(
                        dest.and_then(|d| by_reply.get(&d))
                            .map_or(0, |(_, n, _)| *n),
                    );
                }
            }
            let picked: Vec<SocketAddr> = entry
                .branches
                .iter()
                .flat_map(|b| &b.endpoints)
                .filter_map(|ep| ep.destination.as_deref()?.parse().ok())
                .collect();
            entry.other_flows = by_reply
                .into_iter()
                .filter(|(reply, _)| !picked.contains(reply))
                .map(|(reply, (dnat, flows, assured))| OtherFlows {
                    reply_source: join_host_port(&reply.ip(), i32::from(reply.port())),
                    dnat,
                    flows,
                    assured,
                })
                .collect();
            if protocol != "tcp" {
                stale += entry.other_flows.len();
            }
        }
    }
    view.divergence_count += stale;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_addresses() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        assert!(entry_matches(None, &ip));
        assert!(entry_matches(Some("127.0.0.0/8"), &ip));
        assert!(!entry_matches(Some("10.96.0.10"), &ip));
        assert!(entry_matches(
            Some("10.96.0.10"),
            &"10.96.0.10".parse().unwrap()
        ));
        assert!(entry_matches(
            Some("fd00:96::10"),
            &"fd00:96::10".parse().unwrap()
        ));
    }

    #[test]
    fn descriptions() {
        let o = OtherFlows {
            reply_source: "10.244.1.5:53".into(),
            dnat: true,
            flows: 3,
            assured: 0,
        };
        assert_eq!(
            o.describe(),
            "3 live flows still DNAT to 10.244.1.5:53, which no rule here picks any more (stale conntrack entries)"
        );
        assert_eq!(flows_text(1), "1 live flow");
    }
}
