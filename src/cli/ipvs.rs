//! IPVS-mode inputs shared by `graph`, `verify` and `trace` (`--ipvsadm`, `--ipset`, `--ip-addr`), and
//! their IPVS code paths. The logic lives in `graph::ipvs`, `compare::ipvs`, `trace::ipvs` and
//! `proxier::ipvs`; this module reads files, calls them and formats.

use super::common::{DumpArgs, NodeFactArgs, StateArgs, load_proxy_inputs, read_input};
use crate::compare::ipvs::{self as cmp, ActualIpvs};
use crate::compare::{Finding, Report};
use crate::graph::ipvs as g;
use crate::proxier::ipvs::{self as px, ExpectedIpvs, IpvsNode, IpvsOptions};
use crate::state::ip::IpFamily;
use anyhow::Context;
use clap::Args;
use kproxy_parsers::ipvsadm::{IpvsDump, ServiceKey};
use kproxy_parsers::{ipset, ipvsadm};
use std::path::PathBuf;

/// IPVS-mode dump flags.
#[derive(Debug, Clone, Default, Args)]
pub struct IpvsArgs {
    /// `ipvsadm -Ln` / `-Sn` / `-Ln --stats` / `-Lnc` output (repeatable; files may concatenate several).
    #[arg(long = "ipvsadm", value_name = "FILE")]
    pub ipvsadm: Vec<PathBuf>,
    /// `ipset save` or `ipset list` output.
    #[arg(long = "ipset", value_name = "FILE")]
    pub ipset: Option<PathBuf>,
    /// `ip addr` / `ip -o addr` output covering `kube-ipvs0` (its addresses are compared).
    #[arg(long = "ip-addr", value_name = "FILE")]
    pub ip_addr: Option<PathBuf>,
}

impl IpvsArgs {
    /// True when any IPVS dump was given (selects the IPVS code path).
    pub fn given(&self) -> bool {
        !self.ipvsadm.is_empty()
    }
}

/// The texts of the IPVS dumps, read once (parsed values borrow from them).
pub struct IpvsTexts {
    ipvsadm: String,
    ipset: Option<(String, String)>,
    ip_addr: Option<String>,
}

impl IpvsTexts {
    /// Reads the files named by the flags (`-` = stdin, at most once).
    pub fn read(args: &IpvsArgs) -> anyhow::Result<IpvsTexts> {
        let mut ipvsadm = String::new();
        for p in &args.ipvsadm {
            ipvsadm.push_str(&read_input(p)?);
            if !ipvsadm.ends_with('\n') {
                ipvsadm.push('\n');
            }
        }
        let ipset = match &args.ipset {
            Some(p) => Some((read_input(p)?, p.display().to_string())),
            None => None,
        };
        let ip_addr = args.ip_addr.as_ref().map(|p| read_input(p)).transpose()?;
        Ok(IpvsTexts {
            ipvsadm,
            ipset,
            ip_addr,
        })
    }

    /// Parses the ipvsadm text (named after the flag's files in errors).
    pub fn dump(&self, args: &IpvsArgs) -> anyhow::Result<IpvsDump<'_>> {
        let names: Vec<String> = args
            .ipvsadm
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let d = ipvsadm::parse_dump(&self.ipvsadm).map_err(|e| e.in_source(names.join("+")))?;
        for s in &d.skipped {
            tracing::warn!(
                "{}:{}: skipped: {}",
                names.join("+"),
                s.line,
                s.text.trim_end()
            );
        }
        Ok(d)
    }

    /// Parses the ipset text, if given.
    pub fn sets(&self) -> anyhow::Result<Option<Vec<ipset::IpSet<'_>>>> {
        match &self.ipset {
            Some((t, name)) => Ok(Some(
                ipset::parse_ipset(t).map_err(|e| e.in_source(name.clone()))?,
            )),
            None => Ok(None),
        }
    }
}

/// `graph --ipvsadm FILE [--ipset FILE]`: the IPVS graph in `table`, `json`, `yaml` or `dot`.
pub fn graph(args: &IpvsArgs, format: &str, no_headers: bool) -> anyhow::Result<String> {
    let texts = IpvsTexts::read(args)?;
    let dump = texts.dump(args)?;
    let sets = texts.sets()?;
    let graph = g::build(&dump, sets.as_deref());
    Ok(match format {
        "json" => crate::output::to_json(&graph)?,
        "yaml" => crate::output::to_yaml(&graph)?,
        "dot" => g::dot(&graph),
        _ => {
            let t = g::table(&graph, no_headers);
            if t.is_empty() {
                "No IPVS virtual servers found.\n".to_string()
            } else {
                t
            }
        }
    })
}

/// The families the verification covers: the rendered one plus any the ipvsadm dump shows.
fn families(dump: &IpvsDump<'_>, main: IpFamily) -> Vec<IpFamily> {
    let mut v = vec![main];
    for s in dump.merged_services() {
        if let ServiceKey::Inet { addr, .. } = s.key {
            let f = IpFamily::of(&addr);
            if !v.contains(&f) {
                v.push(f);
            }
        }
    }
    v
}

/// `verify` on an IPVS node from files: reads the flags' dumps and runs [`verify_texts`].
pub fn verify(
    ipvs: &IpvsArgs,
    state: &StateArgs,
    facts: &NodeFactArgs,
    dumps: &DumpArgs,
    node: Option<&str>,
) -> anyhow::Result<Report> {
    let inputs = load_proxy_inputs(state, facts, node)?;
    let texts = IpvsTexts::read(ipvs)?;
    let v4 = dumps
        .iptables_save
        .as_ref()
        .map(|p| read_input(p))
        .transpose()?;
    let v6 = dumps
        .ip6tables_save
        .as_ref()
        .map(|p| read_input(p))
        .transpose()?;
    let names: Vec<String> = ipvs
        .ipvsadm
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    let node_dumps = IpvsNodeDumps {
        ipvsadm: (&texts.ipvsadm, names.join("+")),
        ipset: texts.ipset.as_ref().map(|(t, n)| (t.as_str(), n.clone())),
        ip_addr: texts.ip_addr.as_deref(),
        iptables_save: v4.as_deref(),
        ip6tables_save: v6.as_deref(),
    };
    verify_texts(&inputs, &node_dumps, facts.masquerade_mark.clone())
}

/// The texts an IPVS node's verification reads (from files, a bundle or a live collector).
#[derive(Debug, Clone)]
pub struct IpvsNodeDumps<'t> {
    /// `ipvsadm -Ln`/`-Sn`/… output and its name for messages.
    pub ipvsadm: (&'t str, String),
    /// `ipset save`/`list` output and its name.
    pub ipset: Option<(&'t str, String)>,
    /// `ip addr` output covering `kube-ipvs0`.
    pub ip_addr: Option<&'t str>,
    /// `iptables-save` output.
    pub iptables_save: Option<&'t str>,
    /// `ip6tables-save` output.
    pub ip6tables_save: Option<&'t str>,
}

/// `verify` on an IPVS node: renders kube-proxy's expected IPVS state per family and compares it with
/// the dumps; adds a KP523 finding when the configured mode and the node disagree.
pub fn verify_texts(
    inputs: &super::common::ProxyInputs,
    dumps: &IpvsNodeDumps<'_>,
    mark: Option<String>,
) -> anyhow::Result<Report> {
    let (ipvsadm_text, ipvsadm_name) = &dumps.ipvsadm;
    let dump = ipvsadm::parse_dump(ipvsadm_text).map_err(|e| e.in_source(ipvsadm_name.clone()))?;
    for s in &dump.skipped {
        tracing::warn!("{ipvsadm_name}:{}: skipped: {}", s.line, s.text.trim_end());
    }
    let sets = match &dumps.ipset {
        Some((t, name)) => Some(ipset::parse_ipset(t).map_err(|e| e.in_source(name.clone()))?),
        None => None,
    };
    let (v4, v6) = (dumps.iptables_save, dumps.ip6tables_save);
    let kube_ipvs0 = dumps.ip_addr.map(cmp::parse_kube_ipvs0_addrs);
    let node_view = IpvsNode::from_facts(&inputs.facts);
    let opts = IpvsOptions {
        random_fully: inputs.facts.random_fully,
        mark,
    };
    let mut findings: Vec<Finding> = Vec::new();
    let mut ports = std::collections::BTreeSet::new();
    for fam in families(&dump, inputs.facts.family) {
        let expected: ExpectedIpvs =
            px::render(&inputs.state, &inputs.config, &node_view, fam, &opts);
        for w in &expected.warnings {
            tracing::warn!("{w}");
        }
        ports.extend(expected.virtual_servers.iter().map(|v| v.service.clone()));
        let actual = ActualIpvs {
            dump: dump.clone(),
            ipsets: sets.clone(),
            iptables_save: if fam == IpFamily::V6 { v6 } else { v4 },
            kube_ipvs0: kube_ipvs0.clone(),
        };
        findings.extend(cmp::verify(&expected, &actual));
    }
    let detected = cmp::detect_mode(Some(&dump), v4.or(v6));
    findings.extend(cmp::mode_finding(&inputs.config.mode, detected));
    Ok(Report::new(
        inputs.facts.node_name.clone(),
        "ipvs",
        ports.len(),
        findings,
    ))
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
    let texts = IpvsTexts::read(ipvs)?;
    let dump = texts.dump(ipvs)?;
    let sets = texts.sets()?;
    let graph = g::build(&dump, sets.as_deref());
    let mut q = match &target.vs {
        Some(v) => parse_vs(v)?,
        None => crate::trace::ipvs::TraceQuery::default(),
    };
    q.service = target.service.clone();
    let traces = crate::trace::ipvs::trace(&graph, expected, &q);
    if traces.is_empty() {
        anyhow::bail!(
            "trace: no IPVS virtual server matches (the dump has {})",
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
pub struct IpvsTraceArgs {
    /// IPVS dumps.
    #[command(flatten)]
    pub dumps: IpvsArgs,
    /// The virtual server to trace: ADDR:PORT[/PROTO] (default: --packet's destination, else all).
    #[arg(long = "vs", value_name = "ADDR:PORT[/PROTO]")]
    pub vs: Option<String>,
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
