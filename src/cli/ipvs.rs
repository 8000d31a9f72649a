//! IPVS-mode inputs shared by `graph`, `verify` and `trace` (`--ipvsadm`, `--ipset`, `--ip-addr`), and
//! the IPVS code paths of `graph` and `trace`. The logic lives in `collect::ipvs_dumps`,
//! `graph::ipvs` and `trace::ipvs` (`verify`'s in `pipeline`); this module calls them and
//! formats.

use super::common::with_warnings;
use crate::collect::ipvs_dumps::IpvsTexts;
use crate::graph::ipvs as g;
use crate::proxier::ipvs::ExpectedIpvs;
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;

/// IPVS-mode dump flags.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "IPVS dumps (offline)")]
pub struct IpvsArgs {
    /// `ipvsadm -Ln` / `-Sn` / `-Ln --stats` / `-Lnc` output (repeatable; files may concatenate several).
    #[arg(long = "ipvsadm", value_name = "FILE")]
    pub ipvsadm: Vec<PathBuf>,
    /// `ipset save` or `ipset list` output.
    #[arg(hide_short_help = true, long = "ipset", value_name = "FILE")]
    pub ipset: Option<PathBuf>,
    /// `ip addr` / `ip -o addr` output covering `kube-ipvs0` (its addresses are compared).
    #[arg(hide_short_help = true, long = "ip-addr", value_name = "FILE")]
    pub ip_addr: Option<PathBuf>,
    /// Read pastes (the command's `--lenient`, set by the command).
    #[arg(skip)]
    pub lenient: bool,
}

impl IpvsArgs {
    /// True when any IPVS dump was given (selects the IPVS code path).
    pub fn given(&self) -> bool {
        !self.ipvsadm.is_empty()
    }
}

impl IpvsArgs {
    /// Reads the dumps the flags name ([`IpvsTexts::read`]), printing what reading them did.
    pub fn read(&self) -> anyhow::Result<IpvsTexts> {
        Ok(with_warnings(|w| {
            IpvsTexts::read(
                &self.ipvsadm,
                self.ipset.as_deref(),
                self.ip_addr.as_deref(),
                self.lenient,
                w,
            )
        })?)
    }
}

/// `graph --ipvsadm FILE [--ipset FILE]`: the IPVS graph in `table`, `json`, `yaml` or `dot`.
pub fn graph(args: &IpvsArgs, format: &str, no_headers: bool) -> anyhow::Result<String> {
    graph_of_texts(&args.read()?, format, no_headers)
}

/// The IPVS graph of texts read by [`IpvsTexts::read`] or [`IpvsTexts::from_texts`].
pub fn graph_of_texts(texts: &IpvsTexts, format: &str, no_headers: bool) -> anyhow::Result<String> {
    let graph = with_warnings(|w| texts.graph(w))?;
    Ok(match format {
        "json" => crate::output::to_json(&graph)?,
        "yaml" => crate::output::to_yaml(&graph)?,
        "dot" => g::dot(&graph),
        _ => {
            let t = g::table(&graph, no_headers);
            if t.is_empty() {
                let mut none = "No IPVS virtual servers found.\n".to_string();
                if !graph.gaps.is_empty() {
                    none.push_str("partial input: the graph shows only what it holds:\n");
                    for gap in &graph.gaps {
                        none.push_str(&format!("  - {gap}\n"));
                    }
                }
                none
            } else {
                t
            }
        }
    })
}

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
