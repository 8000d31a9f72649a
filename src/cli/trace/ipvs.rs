//! `trace --ipvsadm FILE`: the IPVS path of a node's virtual servers. The logic lives in
//! `collect::ipvs_dumps` and `trace::ipvs`; this module calls them and formats.

use crate::cli::common::{IpvsArgs, with_warnings};
use crate::proxier::ipvs::ExpectedIpvs;
use anyhow::Context;
use clap::Args;

/// What to trace: a virtual server `ADDR:PORT[/PROTO]` and/or a service.
#[derive(Debug, Clone, Default)]
pub struct TraceTarget {
    /// `ADDR:PORT[/PROTO]` (IPv6 as `[ADDR]:PORT`).
    pub vs: Option<String>,
    /// `ns/name[:port]`; needs the state to resolve.
    pub service: Option<String>,
}

fn parse_vs(s: &str) -> anyhow::Result<crate::trace::ipvs::TraceQuery> {
    let (sock, proto) = match s.rsplit_once('/') {
        Some((a, p)) => (a, Some(p.to_ascii_uppercase())),
        None => (s, None),
    };
    let sa: std::net::SocketAddr = sock
        .parse()
        .with_context(|| format!("{s:?} is not ADDR:PORT[/PROTO] (IPv6 as [ADDR]:PORT)"))?;
    Ok(crate::trace::ipvs::TraceQuery {
        address: Some(sa.ip()),
        port: Some(sa.port()),
        protocol: proto,
        service: None,
    })
}

/// `trace --ipvsadm FILE`: the IPVS path of the matching virtual servers, as text or JSON.
pub fn trace(
    ipvs: &IpvsArgs,
    target: &TraceTarget,
    expected: Option<&ExpectedIpvs>,
    json: bool,
) -> anyhow::Result<String> {
    let texts = ipvs.read()?;
    let graph = with_warnings(|w| texts.graph(w))?;
    let mut q = match &target.vs {
        Some(v) => parse_vs(v)?,
        None => crate::trace::ipvs::TraceQuery::default(),
    };
    q.service = target.service.clone();
    let traces = crate::trace::ipvs::trace(&graph, expected, &q);
    if traces.is_empty() {
        let partial = if graph.gaps.is_empty() {
            String::new()
        } else {
            format!(
                "; the input is partial, so it may be in what is missing: {}",
                graph.gaps.join("; ")
            )
        };
        anyhow::bail!(
            "trace: no IPVS virtual server matches (the dump has {}){partial}",
            graph.virtual_servers.len()
        );
    }
    Ok(if json {
        serde_json::to_string_pretty(&traces)? + "\n"
    } else {
        crate::trace::ipvs::text(&traces)
    })
}

/// `trace` flags for IPVS nodes.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "IPVS dumps (offline)")]
pub struct IpvsTraceArgs {
    /// The virtual server to trace: ADDR:PORT[/PROTO] (default: --packet's destination, else all).
    #[arg(
        hide_short_help = true,
        help_heading = "Options",
        long = "vs",
        value_name = "ADDR:PORT[/PROTO]"
    )]
    pub vs: Option<String>,

    /// IPVS dumps.
    #[command(flatten)]
    pub dumps: IpvsArgs,
}

/// Runs `trace` on IPVS dumps (`packet`: the `--packet` text, whose destination selects the VS).
pub fn run_trace(
    args: &IpvsTraceArgs,
    packet: Option<&str>,
    json: bool,
) -> anyhow::Result<crate::exit::Outcome> {
    use std::io::Write;
    let vs = args.vs.clone().or_else(|| {
        packet
            .and_then(|p| p.split("->").nth(1))
            .map(|s| s.trim().to_string())
    });
    let text = trace(&args.dumps, &TraceTarget { vs, service: None }, None, json)?;
    anstream::stdout()
        .write_all(text.as_bytes())
        .context("writing output")?;
    Ok(crate::exit::Outcome::Clean)
}
