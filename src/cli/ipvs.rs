//! IPVS-mode inputs shared by `graph`, `verify` and `trace` (`--ipvsadm`, `--ipset`, `--ip-addr`), and
//! their IPVS code paths. The logic lives in `graph::ipvs`, `compare::ipvs`, `trace::ipvs` and
//! `proxier::ipvs`; this module reads files, calls them and formats.

use super::common::{DumpArgs, NodeFactArgs, StateArgs, load_proxy_inputs, read_input, warn};
use crate::compare::conntrack::{ServiceIndex, check_ipvs};
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

/// The texts of the IPVS dumps, read once (parsed values borrow from them).
pub struct IpvsTexts {
    ipvsadm: String,
    ipvsadm_name: String,
    ipset: Option<(String, String)>,
    ip_addr: Option<String>,
}

impl IpvsTexts {
    /// Reads the files named by the flags (`-` = stdin, at most once), as every node text is
    /// read ([`crate::collect::files::read_dump`]); under `--lenient`, lines the parsers cannot
    /// read are skipped with a warning each.
    pub fn read(args: &IpvsArgs) -> anyhow::Result<IpvsTexts> {
        let read = |p: &PathBuf| -> anyhow::Result<String> {
            let d = crate::collect::files::read_dump(p, args.lenient)?;
            d.warnings.iter().for_each(warn);
            Ok(d.text)
        };
        let mut ipvsadm = String::new();
        for p in &args.ipvsadm {
            ipvsadm.push_str(&read(p)?);
            if !ipvsadm.ends_with('\n') {
                ipvsadm.push('\n');
            }
        }
        let names: Vec<String> = args
            .ipvsadm
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        if args.lenient {
            add_missing_header(&mut ipvsadm, &names.join("+"));
            skip_unreadable(&mut ipvsadm, &names.join("+"), |t| {
                ipvsadm::parse_dump(t).map(|_| ())
            });
        }
        let ipset = match &args.ipset {
            Some(p) => {
                let mut text = read(p)?;
                let name = p.display().to_string();
                if args.lenient {
                    skip_unreadable(&mut text, &name, |t| ipset::parse_ipset(t).map(|_| ()));
                }
                Some((text, name))
            }
            None => None,
        };
        let ip_addr = args.ip_addr.as_ref().map(read).transpose()?;
        Ok(IpvsTexts {
            ipvsadm,
            ipvsadm_name: names.join("+"),
            ipset,
            ip_addr,
        })
    }

    /// Texts read otherwise (the parts of a paste), each `(text, name)`; under `lenient`
    /// cleaned of lines the parsers cannot read, as [`IpvsTexts::read`] does.
    pub fn from_texts(
        ipvsadm: (String, String),
        ipset: Option<(String, String)>,
        lenient: bool,
    ) -> IpvsTexts {
        let (mut ipvsadm, ipvsadm_name) = ipvsadm;
        let mut ipset = ipset;
        if lenient {
            add_missing_header(&mut ipvsadm, &ipvsadm_name);
            skip_unreadable(&mut ipvsadm, &ipvsadm_name, |t| {
                ipvsadm::parse_dump(t).map(|_| ())
            });
            if let Some((text, name)) = &mut ipset {
                skip_unreadable(text, name, |t| ipset::parse_ipset(t).map(|_| ()));
            }
        }
        IpvsTexts {
            ipvsadm,
            ipvsadm_name,
            ipset,
            ip_addr: None,
        }
    }

    /// Parses the ipvsadm text (named after the flag's files in errors).
    pub fn dump(&self) -> anyhow::Result<IpvsDump<'_>> {
        let name = &self.ipvsadm_name;
        let d = ipvsadm::parse_dump(&self.ipvsadm).map_err(|e| e.in_source(name.clone()))?;
        for s in &d.skipped {
            warn(format!("{name}:{}: skipped: {}", s.line, s.text.trim_end()));
        }
        Ok(d)
    }

    /// Parses the ipset text, if given; a `list` whose set holds fewer members than its
    /// `Number of entries:` says was cut, and says so.
    pub fn sets(&self) -> anyhow::Result<Option<Vec<ipset::IpSet<'_>>>> {
        let Some((t, name)) = &self.ipset else {
            return Ok(None);
        };
        let sets = ipset::parse_ipset(t).map_err(|e| e.in_source(name.clone()))?;
        for set in &sets {
            if let Some(declared) = set.entries_declared
                && declared > set.entries.len()
            {
                warn(format!(
                    "{name}:{}: set {} lists {} of its {declared} entries: the listing is cut, its other members are missing",
                    set.line,
                    set.name,
                    set.entries.len()
                ));
            }
        }
        Ok(Some(sets))
    }
}

/// Lenient reading of a grammar that stops at its first bad line: each line it fails on is
/// emptied (line numbers stay) and reported, until the text parses. Bounded: a text that is not
/// of the grammar at all gives up after [`MAX_SKIPPED`] lines and leaves the error to the strict
/// parse that follows.
fn skip_unreadable(
    text: &mut String,
    name: &str,
    parse: impl Fn(&str) -> Result<(), crate::parsers::ParseError>,
) {
    for _ in 0..MAX_SKIPPED {
        let Err(e) = parse(text) else { return };
        let Some((start, end)) = line_span(text, e.line) else {
            return;
        };
        warn(format!(
            "{name}:{}: skipped: expected {}, found {}",
            e.line, e.expected, e.found
        ));
        text.replace_range(start..end, "");
    }
}

/// An `ipvsadm -Ln` or `-Lnc` listing filtered by `grep` has lost its header lines, which say
/// what the columns are: the listing's own header is put back in front (line numbers then count
/// it: two lines more).
fn add_missing_header(text: &mut String, name: &str) {
    let has_header = text.lines().any(|l| {
        l.starts_with("IP Virtual Server version")
            || l.starts_with("Prot LocalAddress:Port")
            || l.starts_with("IPVS connection entries")
            || l.starts_with("pro expire state")
            || l.starts_with("-A ")
    });
    if has_header {
        return;
    }
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    let Some(first) = first else { return };
    let words: Vec<&str> = first.split_whitespace().collect();
    let connection = words
        .get(1)
        .is_some_and(|w| w.contains(':') && !w.contains('.'));
    let header = if connection {
        "IPVS connection entries\npro expire state       source             virtual            destination\n"
    } else {
        "Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n"
    };
    warn(format!(
        "{name}: no header lines (filtered by grep?): read as `ipvsadm -Ln{}` output; line numbers below count two header lines more",
        if connection { "c" } else { "" }
    ));
    text.insert_str(0, header);
}

/// Most lines [`skip_unreadable`] empties.
const MAX_SKIPPED: usize = 1000;

/// The byte range of 1-based line `line` of `text` (without its newline).
fn line_span(text: &str, line: u32) -> Option<(usize, usize)> {
    let mut start = 0;
    for _ in 1..line {
        start += text.get(start..)?.find('\n')? + 1;
    }
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    (end > start).then_some((start, end))
}

/// `graph --ipvsadm FILE [--ipset FILE]`: the IPVS graph in `table`, `json`, `yaml` or `dot`.
pub fn graph(args: &IpvsArgs, format: &str, no_headers: bool) -> anyhow::Result<String> {
    graph_of_texts(&IpvsTexts::read(args)?, format, no_headers)
}

/// The IPVS graph of texts read by [`IpvsTexts::read`] or [`IpvsTexts::from_texts`].
pub fn graph_of_texts(texts: &IpvsTexts, format: &str, no_headers: bool) -> anyhow::Result<String> {
    let dump = texts.dump()?;
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

/// `verify` on an IPVS node from files: reads the flags' dumps and runs [`verify_texts`]; with
/// `--conntrack FILE` the conntrack table's flows are checked too.
pub fn verify(
    ipvs: &IpvsArgs,
    state: &StateArgs,
    facts: &NodeFactArgs,
    dumps: &DumpArgs,
    node: Option<&str>,
    conntrack: &super::conntrack::ConntrackArgs,
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
    let report = verify_texts(&inputs, &node_dumps, facts.masquerade_mark.clone())?;
    let flows = super::conntrack::verify_findings(
        conntrack,
        None,
        "",
        ipvs.lenient,
        (&inputs.state, &inputs.config, &inputs.facts),
    )?;
    Ok(super::conntrack::with_findings(report, flows))
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
/// the dumps; adds a KP523 finding when the configured mode and the node disagree, and checks the
/// connections of an `ipvsadm -Lnc` listing against the services' serving endpoints (KP6xx).
pub fn verify_texts(
    inputs: &crate::state::ProxyInputs,
    dumps: &IpvsNodeDumps<'_>,
    mark: Option<String>,
) -> anyhow::Result<Report> {
    let (ipvsadm_text, ipvsadm_name) = &dumps.ipvsadm;
    let dump = ipvsadm::parse_dump(ipvsadm_text).map_err(|e| e.in_source(ipvsadm_name.clone()))?;
    for s in &dump.skipped {
        super::common::warn(format!(
            "{ipvsadm_name}:{}: skipped: {}",
            s.line,
            s.text.trim_end()
        ));
    }
    let sets = match &dumps.ipset {
        Some((t, name)) => Some(ipset::parse_ipset(t).map_err(|e| e.in_source(name.clone()))?),
        None => None,
    };
    let (v4, v6) = (dumps.iptables_save, dumps.ip6tables_save);
    let kube_ipvs0 = dumps
        .ip_addr
        .map(|t| crate::parsers::ip_addr::interface_addresses(t, px::DUMMY_DEVICE));
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
            super::common::warn(w);
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
    findings.extend(cmp::mode_finding(
        crate::state::mode::ProxyMode::or_default(inputs.config.mode),
        detected,
    ));
    if !dump.connections.is_empty() {
        let index = ServiceIndex::new(&inputs.state, &inputs.config, &inputs.facts);
        let services = (!dump.listings.is_empty()).then(|| dump.merged_services());
        findings.extend(check_ipvs(&dump.connections, services.as_deref(), &index).findings());
    }
    Ok(Report::new(
        inputs.facts.node_name.clone(),
        crate::state::mode::ProxyMode::Ipvs,
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
    let dump = texts.dump()?;
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
