//! `trace --nft-ruleset FILE`: the packet simulator and the path view on a node in kube-proxy's
//! nftables mode.

use super::{
    ModelArg, TraceArgs, decisions_of, kernel_input, packet_document, packet_format,
    print_path_view,
};
use crate::cli::common::{GlobalArgs, warn};
use crate::cli::graph::nftables::{parse_ruleset, read_ruleset, warn_without_kube_proxy_table};
use crate::exit::Outcome;
use crate::graph::GraphOptions;
use crate::graph::nftables::NftGraphs;
use crate::parsers::nft;
use crate::proxier::iptables::ServiceDecisions;
use crate::trace::path::{DivergenceKind, PathView, ServiceSelector};
use crate::trace::sim::nftables::{kernel, kptest};
use crate::trace::sim::{LocalAddrs, PacketSpec, Verdict, report};
use anyhow::bail;
use std::path::Path;

/// Runs `trace --nft-ruleset FILE` (`--packet`, or the path view of a service).
pub fn run(args: &TraceArgs, path: &Path, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if args.ipvs.dumps.given() {
        bail!("trace: --nft-ruleset and --ipvsadm describe different proxy modes; give one");
    }
    let input = read_ruleset(path, args.dump.lenient)?;
    let rules = parse_ruleset(&input, args.dump.lenient)?;
    match args.packet.as_deref() {
        Some(packet) => run_packet(args, &input.name, &rules, packet),
        None => run_path(args, global, &input.name, rules, &input.cuts),
    }
}

fn run_packet(
    args: &TraceArgs,
    name: &str,
    rules: &nft::Ruleset<'_>,
    packet_text: &str,
) -> anyhow::Result<Outcome> {
    let packet: PacketSpec = packet_text.parse()?;
    let format = packet_format(args)?;
    let mut unknown = false;
    let out = match args.model {
        ModelArg::KubeProxyTest => {
            if crate::trace::sim::nftables::table_for(rules, packet.dst).is_none() {
                warn_without_kube_proxy_table(name, rules);
                bail!(
                    "{name}: the kube-proxy-test model walks `table {} kube-proxy`, which the ruleset does not have",
                    if packet.dst.is_ipv4() { "ip" } else { "ip6" }
                );
            }
            let local = LocalAddrs::exact(args.local_ips.clone());
            let t = kptest::trace(rules, &packet, &local)?;
            for e in &t.errors {
                warn(format!("kube-proxy's test tracer would report: {e}"));
            }
            match packet_document(format, &|| report::test_trace_json(&t.trace))? {
                Some(doc) => doc,
                None => report::test_trace_text(&t.trace),
            }
        }
        ModelArg::Kernel => {
            let input = kernel_input(args, packet);
            let d = kernel::simulate(rules, &input)?;
            unknown = d.outcomes.iter().any(|o| o.verdict == Verdict::Unknown);
            match packet_document(format, &|| report::distribution_json(&d))? {
                Some(doc) => doc,
                None => report::distribution_text(&d),
            }
        }
    };
    crate::cli::common::write_stdout(&out)?;
    // An outcome past a statement this build does not know is not one.
    Ok(if unknown {
        Outcome::Error
    } else {
        Outcome::Clean
    })
}

fn run_path(
    args: &TraceArgs,
    global: &GlobalArgs,
    name: &str,
    rules: nft::Ruleset<'_>,
    cuts: &[u32],
) -> anyhow::Result<Outcome> {
    let Some(service) = args.service.as_deref() else {
        bail!(
            "trace needs a service (trace svc/NAME --nft-ruleset FILE) or a packet (--packet 'SRC[:SPORT]->DST:PORT/PROTO')"
        );
    };
    let selector =
        ServiceSelector::parse(service, global.namespace.as_deref(), args.port.as_deref())?;
    let plan = decisions_of(args, None)?;
    let mut nft = NftGraphs::new(rules);
    for &line in cuts {
        nft.add_gap(format!("the paste is cut at line {line}"));
    }
    let opts = GraphOptions {
        source: Some(name.to_string()),
        ..GraphOptions::default()
    };
    let graphs = nft.graphs(&opts);
    if graphs.is_empty() {
        warn_without_kube_proxy_table(name, nft.ruleset());
        bail!(
            "{name}: no kube-proxy table to trace {}",
            selector.service()
        );
    }
    // The table of the plan's family; without a plan, the first that has the service.
    let family = plan.as_ref().map(|(p, _)| match p.family {
        crate::state::ip::IpFamily::V6 => "ipv6",
        crate::state::ip::IpFamily::V4 => "ipv4",
    });
    let graph = graphs
        .iter()
        .find(|g| family.is_some_and(|f| g.family.as_deref() == Some(f)))
        .or_else(|| {
            graphs
                .iter()
                .find(|g| !g.ports_of(&selector.namespace, &selector.name).is_empty())
        })
        .unwrap_or(&graphs[0]);
    let mut view = crate::trace::path::build(graph, &selector, plan.as_ref().map(|(p, _)| p))?
        .with_node(plan.as_ref().map(|(_, n)| n.clone()));
    if let Some((plan, _)) = &plan {
        name_missing_endpoints(&mut view, plan);
    }
    print_path_view(args, global, view)
}

/// Endpoints the API has and the node lacks are named by the plan's iptables chain; on an
/// nftables node they are named as kube-proxy's nftables mode would name their chain.
fn name_missing_endpoints(view: &mut PathView, plan: &ServiceDecisions) {
    use crate::proxier::nftables::names::{ENDPOINT_PREFIX, endpoint_chain_name_base};
    for port in &mut view.ports {
        let Some(pp) = plan.ports.iter().find(|pp| {
            pp.info.name_string == port.name
                && port.protocol.as_deref() == Some(pp.info.name.protocol.lower())
        }) else {
            continue;
        };
        let endpoints = port
            .entries
            .iter_mut()
            .flat_map(|e| &mut e.branches)
            .flat_map(|b| &mut b.endpoints);
        for ep in endpoints {
            let missing = ep
                .divergence
                .as_ref()
                .is_some_and(|d| d.kind == DivergenceKind::MissingEndpoint);
            if let (true, Some(dest)) = (missing, &ep.destination) {
                ep.chain = format!(
                    "{ENDPOINT_PREFIX}{}",
                    endpoint_chain_name_base(&pp.info.name, dest)
                );
            }
        }
    }
}
