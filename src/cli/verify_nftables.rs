//! `verify` on nftables-mode nodes: which nodes are (the configuration's `mode: nftables`, or —
//! when it does not say — a `kube-proxy` table in the node's nft listing and no iptables- or
//! IPVS-mode rules), reading their listings (`--nft-ruleset FILE`, or what a collector or bundle
//! fetched with `nft -j list table ip|ip6 kube-proxy`), and the offline form that needs no
//! `iptables-save`. The comparison is [`crate::compare::nftables`].

use super::common::read_input;
use super::live::ResolvedInputs;
use super::verify::VerifyArgs;
use crate::collect::{self, NodeSnapshot};
use crate::compare::nftables::{NftText, NftVerifyInput};
use crate::compare::{Finding, Report};
use crate::state::config::ProxyConfig;
use crate::state::mode::ProxyMode;
use anyhow::{Context, bail};

/// The inputs of `verify --nft-ruleset FILE --state FILE [--config FILE]` when no iptables dump
/// and no bundle is given (an nftables node needs none): the state and configuration files and
/// an empty `files` snapshot (the listing is read by [`verify_if_nftables`]). `None` when
/// other inputs were given: they are resolved as usual.
pub fn offline_inputs(args: &VerifyArgs) -> anyhow::Result<Option<ResolvedInputs>> {
    use super::live::CollectorChoice;
    let dumps = &args.dumps;
    let has_iptables_files = dumps.iptables_save.is_some()
        || dumps.ip6tables_save.is_some()
        || dumps.iptables_legacy_save.is_some();
    if args.nft_ruleset.is_none()
        || has_iptables_files
        || args.live.bundle.is_some()
        || !matches!(
            args.live.collector,
            CollectorChoice::Auto | CollectorChoice::Files
        )
    {
        return Ok(None);
    }
    if args.state.state.is_empty() {
        bail!(
            "verify --nft-ruleset FILE compares with the API state: --state FILE (kubectl get services,endpointslices,nodes,servicecidrs -A -o json)"
        );
    }
    let state = crate::state::load::from_files(&args.state.state).context("reading --state")?;
    let config_text = match &args.state.config {
        Some(p) => Some((read_input(p)?, p.display().to_string())),
        None => None,
    };
    Ok(Some(ResolvedInputs {
        state,
        config_text,
        snapshot: NodeSnapshot {
            collector: "files".into(),
            ..NodeSnapshot::default()
        },
        node: args.node_name.clone().unwrap_or_default(),
    }))
}

/// The node's nft listings: `--nft-ruleset FILE` when given, else the collected `nft -j list
/// table ip|ip6 kube-proxy` outputs. (label, text) pairs.
fn listings(args: &VerifyArgs, snap: &NodeSnapshot) -> anyhow::Result<Vec<(String, String)>> {
    if let Some(p) = &args.nft_ruleset {
        let dump = collect::files::read_dump(p, args.dumps.lenient)?;
        dump.warnings.iter().for_each(super::common::warn);
        if dump.text.trim().is_empty() {
            bail!(
                "{} is empty: there is no ruleset to compare (was the command's output saved?)",
                dump.name
            );
        }
        return Ok(vec![(dump.name, dump.text)]);
    }
    Ok([
        ("ip", snap.nft_kube_proxy.as_ref()),
        ("ip6", snap.nft_kube_proxy6.as_ref()),
    ]
    .into_iter()
    .filter_map(|(f, t)| {
        Some((
            format!("nft -j list table {f} kube-proxy ({})", snap.collector),
            t?.clone(),
        ))
    })
    .collect())
}

/// The configuration the inputs carry (defaults when none), with its warnings printed.
fn config_of(inputs: &ResolvedInputs) -> anyhow::Result<ProxyConfig> {
    Ok(match &inputs.config_text {
        Some((text, source)) => {
            let (c, warnings) = crate::state::config::parse(text, source)
                .with_context(|| format!("reading the kube-proxy configuration ({source})"))?;
            for w in warnings {
                super::common::warn(w);
            }
            c
        }
        None => ProxyConfig::default(),
    })
}

/// Whether the node runs kube-proxy in nftables mode: the configuration says so (unless no
/// listing was given and the node's dumps show another mode's service rules: that node is
/// checked in the mode it runs, and the disagreement is a KP523 finding), or it says no mode
/// and the node's listings hold kube-proxy's table while its iptables and IPVS dumps show no
/// service rules.
fn is_nftables_node(
    config: &ProxyConfig,
    snap: &NodeSnapshot,
    listings: &[(String, String)],
) -> bool {
    let other_mode = || {
        matches!(
            collect::detect_mode(snap),
            Some(ProxyMode::Iptables | ProxyMode::Ipvs)
        )
    };
    match config.mode {
        Some(ProxyMode::Nftables) => !listings.is_empty() || !other_mode(),
        None => {
            listings
                .iter()
                .any(|(_, t)| collect::holds_kube_proxy_table(t))
                && !other_mode()
        }
        Some(ProxyMode::Iptables | ProxyMode::Ipvs) => false,
    }
}

/// Verifies the node of `inputs` when it is an nftables-mode node (see [`is_nftables_node`]);
/// `None` for the other modes.
pub fn verify_if_nftables(
    args: &VerifyArgs,
    inputs: &ResolvedInputs,
) -> anyhow::Result<Option<Report>> {
    let snap = &inputs.snapshot;
    let config = config_of(inputs)?;
    let listings = listings(args, snap)?;
    if !is_nftables_node(&config, snap, &listings) {
        return Ok(None);
    }
    for w in &snap.warnings {
        super::common::warn(w);
    }
    if listings.is_empty() {
        bail!(
            "kube-proxy runs in nftables mode here: verify needs the node's ruleset, --nft-ruleset FILE (nft -j list ruleset), or a collector whose image has nft (--collector debug-pod)"
        );
    }
    let config = config.for_nftables();
    let mut fact_args = args.facts.clone();
    if let Some(n) = args
        .node_name
        .clone()
        .or_else(|| (!inputs.node.is_empty()).then(|| inputs.node.clone()))
    {
        fact_args.node = Some(n);
    }
    let (facts, warnings) = crate::state::node::build(&fact_args.inputs(), &inputs.state, &config)
        .context("node facts")?;
    for w in warnings {
        super::common::warn(w);
    }
    let iptables: Vec<(String, &str)> = [
        (
            &args.dumps.iptables_save,
            "iptables-save",
            snap.iptables_save.as_deref(),
        ),
        (
            &args.dumps.ip6tables_save,
            "ip6tables-save",
            snap.ip6tables_save.as_deref(),
        ),
        (
            &args.dumps.iptables_legacy_save,
            "iptables-legacy-save",
            snap.iptables_legacy_save.as_deref(),
        ),
    ]
    .into_iter()
    .filter_map(|(path, command, text)| {
        let label = match path {
            Some(p) => p.display().to_string(),
            None => format!("{command} ({})", snap.collector),
        };
        Some((label, text?))
    })
    .collect();
    let node = if facts.node_name.is_empty() {
        inputs.node.as_str()
    } else {
        facts.node_name.as_str()
    };
    let input = NftVerifyInput {
        node,
        state: &inputs.state,
        config: &config,
        facts: &facts,
        listings: listings
            .iter()
            .map(|(label, text)| NftText { label, text })
            .collect(),
        iptables: iptables
            .iter()
            .map(|(label, text)| NftText { label, text })
            .collect(),
        ipvsadm: snap.ipvsadm.as_deref(),
        ipset: snap.ipset_save.as_deref(),
        lenient: args.dumps.lenient,
    };
    let report = crate::compare::nftables::verify(&input)?;
    let conntrack = super::conntrack::verify_findings(
        &args.conntrack,
        snap.conntrack.as_deref(),
        &snap.collector,
        args.dumps.lenient,
        (&inputs.state, &config, &facts),
    )?;
    Ok(Some(super::conntrack::with_findings(report, conntrack)))
}

/// KP004 for the nftables-mode tables a collector found on a node that runs another mode
/// (`nft -j list table ip kube-proxy` succeeded), when no `--nft-ruleset` was given.
pub fn foreign_tables(args: &VerifyArgs, snap: &NodeSnapshot, mode: ProxyMode) -> Vec<Finding> {
    if args.nft_ruleset.is_some() || mode != ProxyMode::Iptables {
        return Vec::new();
    }
    [("ip", &snap.nft_kube_proxy), ("ip6", &snap.nft_kube_proxy6)]
        .into_iter()
        .filter(|(_, t)| t.as_deref().is_some_and(collect::holds_kube_proxy_table))
        .map(|(family, _)| {
            let name = format!("table {family} kube-proxy");
            crate::compare::catalogue::FOREIGN_MODE
                .finding(format!(
                    "nftables-mode table `{name}` present although kube-proxy runs in iptables mode"
                ))
                .chain(name)
                .expected("no nftables kube-proxy table")
                .actual("present")
                .hint(format!(
                    "delete it (nft delete table {family} kube-proxy) once no kube-proxy runs in nftables mode"
                ))
        })
        .collect()
}
