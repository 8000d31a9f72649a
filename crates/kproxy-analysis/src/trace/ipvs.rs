//! The IPVS path of a service on a node: virtual server → real servers with weights, the share of new
//! connections the scheduler gives each (or what decides it when shares are not fixed), and the
//! per-real-server counters the dump has (`-Ln` ActiveConn/InActConn, `--stats`, `-Lnc` rows).

use crate::graph::ipvs::{GraphVs, IpvsGraph};
use crate::proxier::ipvs::ExpectedIpvs;
use kproxy_parsers::ipvsadm::SocketText;
use serde::Serialize;
use std::fmt::Write as _;
use std::net::IpAddr;

/// Which virtual servers to trace. Empty fields match anything.
#[derive(Debug, Clone, Default)]
pub struct TraceQuery {
    /// Virtual address.
    pub address: Option<IpAddr>,
    /// Virtual port.
    pub port: Option<u16>,
    /// Protocol (`TCP`, `UDP`, `SCTP`; case-insensitive).
    pub protocol: Option<String>,
    /// Service (`ns/name` or `ns/name:port`), resolved through the expected state.
    pub service: Option<String>,
}

/// One real server on the path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RsTrace {
    /// `ADDR:PORT`.
    pub real_server: String,
    /// Weight, when known.
    pub weight: Option<i32>,
    /// Expected share of new connections (0–1) when the scheduler fixes it.
    pub share: Option<f64>,
    /// Whether the API says this is an endpoint of the service (when the expected state is known).
    pub is_endpoint: Option<bool>,
    /// ActiveConn.
    pub active_conns: Option<u64>,
    /// InActConn.
    pub inactive_conns: Option<u64>,
    /// `-Lnc` rows to this real server.
    pub connection_entries: Option<u64>,
    /// Connections since creation (`--stats` Conns).
    pub total_conns: Option<u64>,
}

/// One virtual server on the path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VsTrace {
    /// `TCP 10.96.0.1:443`.
    pub virtual_server: String,
    /// The service port kube-proxy made it for (when the expected state is known).
    pub service: Option<String>,
    /// Scheduler.
    pub scheduler: Option<String>,
    /// Persistence timeout.
    pub persistent_timeout_s: Option<u32>,
    /// How the scheduler picks a real server.
    pub decision: String,
    /// Real servers.
    pub real_servers: Vec<RsTrace>,
}

/// Expected shares for `weights` under `scheduler`, and a sentence on what decides.
pub fn scheduler_shares(
    scheduler: &str,
    weights: &[Option<i32>],
    persistent: Option<u32>,
) -> (Vec<Option<f64>>, String) {
    let w: Vec<f64> = weights
        .iter()
        .map(|w| f64::from(w.unwrap_or(1).max(0)))
        .collect();
    let live = w.iter().filter(|x| **x > 0.0).count();
    let sum: f64 = w.iter().sum();
    let mut note = match scheduler {
        "rr" => "round robin: each real server with weight > 0 in turn (weight-0 servers are skipped)".to_string(),
        "wrr" => "weighted round robin: shares proportional to weight".to_string(),
        "lc" => "least connection: the server with the fewest connections (active×256 + inactive) gets the next one; shares follow load".into(),
        "wlc" => "weighted least connection: fewest connections per unit of weight; shares ≈ weights when servers are equally fast".into(),
        "sed" => "shortest expected delay: (active+1)/weight; shares follow load and weight".into(),
        "nq" => "never queue: an idle server first, else shortest expected delay".into(),
        "sh" => "source hashing: the client address (and port with sh-port) picks the server; a given client always lands on the same one".into(),
        "dh" => "destination hashing: the destination address picks the server".into(),
        "mh" => "Maglev hashing: the client address and port (mh-port) pick the server; shares ≈ weights over many clients".into(),
        "lblc" | "lblcr" => "locality-based least connection: per destination address, then least connection".into(),
        "fo" => "weighted failover: every connection to the available server with the highest weight".into(),
        "ovf" => "overflow: the highest-weight server until its active connections exceed its weight".into(),
        "twos" => "weighted random twos choice: two random servers (by weight), the less loaded wins".into(),
        other => format!("scheduler {other}: see ipvsadm(8)"),
    };
    let shares: Vec<Option<f64>> = match scheduler {
        _ if live == 0 => w.iter().map(|_| Some(0.0)).collect(),
        "rr" => w
            .iter()
            .map(|x| Some(if *x > 0.0 { 1.0 / live as f64 } else { 0.0 }))
            .collect(),
        "wrr" | "mh" => w.iter().map(|x| Some(x / sum)).collect(),
        "fo" => {
            let max = w.iter().copied().fold(0.0, f64::max);
            let first = w.iter().position(|x| *x == max);
            w.iter()
                .enumerate()
                .map(|(i, _)| Some(if Some(i) == first { 1.0 } else { 0.0 }))
                .collect()
        }
        _ => w
            .iter()
            .map(|x| if *x > 0.0 { None } else { Some(0.0) })
            .collect(),
    };
    if weights.is_empty() {
        note = "no real servers: IPVS drops the traffic (no REJECT in IPVS mode)".into();
    } else if live == 0 {
        note =
            "every real server has weight 0: no destination available, new connections are dropped"
                .into();
    }
    if let Some(t) = persistent {
        let _ = write!(
            note,
            "; persistent {t}s: a client stays on the server it first got (persistence templates in ipvsadm -Lnc)"
        );
    }
    (shares, note)
}

fn matches(vs: &GraphVs, q: &TraceQuery, svc_of: Option<&str>) -> bool {
    if let Some(a) = q.address
        && vs.address != Some(a)
    {
        return false;
    }
    if let Some(p) = q.port
        && vs.port != Some(p)
    {
        return false;
    }
    if let Some(p) = &q.protocol
        && !vs.protocol.eq_ignore_ascii_case(p)
    {
        return false;
    }
    if let Some(s) = &q.service {
        let Some(have) = svc_of else { return false };
        if have != s && !have.starts_with(&format!("{s}:")) {
            return false;
        }
    }
    true
}

/// Traces the virtual servers matching `q` in `graph`; `expected` adds the service names and says
/// which real servers are endpoints.
pub fn trace(graph: &IpvsGraph, expected: Option<&ExpectedIpvs>, q: &TraceQuery) -> Vec<VsTrace> {
    let mut out = Vec::new();
    for vs in &graph.virtual_servers {
        let exp_vs = expected.and_then(|e| {
            e.virtual_servers.iter().find(|x| {
                Some(x.address) == vs.address
                    && Some(x.port) == vs.port
                    && x.protocol.as_str() == vs.protocol
            })
        });
        if !matches(vs, q, exp_vs.map(|e| e.service.as_str())) {
            continue;
        }
        let weights: Vec<Option<i32>> = vs.real_servers.iter().map(|r| r.weight).collect();
        let sched = vs.scheduler.clone().unwrap_or_else(|| "rr".into());
        let (shares, decision) = scheduler_shares(&sched, &weights, vs.persistent_timeout_s);
        let real_servers = vs
            .real_servers
            .iter()
            .zip(shares)
            .map(|(r, share)| RsTrace {
                real_server: SocketText(r.address, r.port).to_string(),
                weight: r.weight,
                share,
                is_endpoint: exp_vs.map(|e| {
                    e.real_servers
                        .iter()
                        .any(|x| x.address == r.address && x.port == r.port)
                }),
                active_conns: r.active_conns,
                inactive_conns: r.inactive_conns,
                connection_entries: r.connection_entries,
                total_conns: r.stats.map(|s| s.conns),
            })
            .collect();
        out.push(VsTrace {
            virtual_server: vs.label(),
            service: exp_vs.map(|e| e.service.clone()),
            scheduler: vs.scheduler.clone(),
            persistent_timeout_s: vs.persistent_timeout_s,
            decision,
            real_servers,
        });
    }
    out
}

/// Human-readable form of traces.
pub fn text(traces: &[VsTrace]) -> String {
    let mut o = String::new();
    for t in traces {
        let _ = write!(o, "{}", t.virtual_server);
        if let Some(s) = &t.service {
            let _ = write!(o, "  ({s})");
        }
        let _ = writeln!(o, "  scheduler {}", t.scheduler.as_deref().unwrap_or("?"));
        let _ = writeln!(o, "  {}", t.decision);
        for r in &t.real_servers {
            let share = r
                .share
                .map_or_else(|| "load-dependent".to_string(), crate::graph::percent);
            let _ = write!(
                o,
                "  -> {:<28} weight {:<3} share {share:<14}",
                r.real_server,
                crate::graph::ipvs::opt_text(r.weight)
            );
            if let (Some(a), Some(i)) = (r.active_conns, r.inactive_conns) {
                let _ = write!(o, " active {a} inactive {i}");
            }
            if let Some(c) = r.connection_entries {
                let _ = write!(o, " conn-entries {c}");
            }
            if let Some(c) = r.total_conns {
                let _ = write!(o, " total-conns {c}");
            }
            if r.is_endpoint == Some(false) {
                o.push_str(" [not an endpoint]");
            }
            o.push('\n');
        }
        if t.real_servers.is_empty() {
            o.push_str("  -> (no real servers)\n");
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_by_scheduler() {
        let (s, _) = scheduler_shares("rr", &[Some(1), Some(0), Some(1)], None);
        assert_eq!(s, vec![Some(0.5), Some(0.0), Some(0.5)]);
        let (s, _) = scheduler_shares("wrr", &[Some(3), Some(1)], None);
        assert_eq!(s, vec![Some(0.75), Some(0.25)]);
        let (s, note) = scheduler_shares("lc", &[Some(1), Some(1)], Some(60));
        assert_eq!(s, vec![None, None]);
        assert!(note.contains("persistent 60s"));
        let (_, note) = scheduler_shares("rr", &[Some(0)], None);
        assert!(note.contains("no destination available"));
    }
}
