//! `verify` of one node as one call ([`verify_node`]): which mode's rules to check, which
//! kube-proxy release to compare with, the node facts, the comparison of that mode, the
//! conntrack table and the nftables tables of another mode, in one report.

use super::conntrack::{self, ConntrackError};
use super::mode::{self, Evidence, Given};
use super::{NamedText, Note, ipvs, release};
use crate::collect::{self, DumpKind, NodeSnapshot};
use crate::compare::catalogue::FOREIGN_MODE;
use crate::compare::nftables::{NftText, NftVerifyError, NftVerifyInput};
use crate::compare::version::{ReleaseChoice, ReleaseSource};
use crate::compare::{
    DumpText, Finding, NodePlans, ReleaseCheck, Report, VerifyInput, WriterRelease,
};
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::ip::IpFamily;
use crate::state::mode::ProxyMode;
use crate::state::node::{self, NodeError, NodeFacts, NodeInputs};
use kproxy_parsers::ParseError;
use kproxy_parsers::iptables::ParseOptions;
use std::sync::Arc;

/// A node's dumps as `verify` reads them: what a collector, a bundle or the dump files read,
/// and the inputs given beside it.
#[derive(Debug, Clone, Default)]
pub struct NodeDumps {
    /// The dumps.
    pub snapshot: NodeSnapshot,
    /// The files dumps were read from, named as messages name them; a dump not listed is named
    /// after its command and the collector (`iptables-save (exec (kube-system/kube-proxy-x))`).
    pub files: Vec<(DumpKind, String)>,
    /// The node's nft listing given (`--nft-ruleset`): verified instead of the collected
    /// `nft list table` outputs on an nftables-mode node; on another its `kube-proxy` tables are
    /// leftovers.
    pub nft_listing: Option<NamedText>,
    /// The node's conntrack table given (`--conntrack`), instead of the collected one.
    pub conntrack: Option<NamedText>,
    /// `ip addr` output covering `kube-ipvs0` (IPVS mode: its addresses are compared).
    pub ip_addr: Option<String>,
}

impl NodeDumps {
    /// The name of the dump of `kind`: its file, else `COMMAND (COLLECTOR)`.
    pub(super) fn name(&self, kind: DumpKind, command: &str) -> String {
        self.files
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, name)| name.clone())
            .unwrap_or_else(|| format!("{command} ({})", self.snapshot.collector))
    }

    /// The nft listings to verify: the one given, else the collected `nft -j list table
    /// ip|ip6 kube-proxy` outputs; (name, text) pairs.
    fn listings(&self) -> Vec<(String, &str)> {
        if let Some(given) = &self.nft_listing {
            return vec![(given.label.clone(), given.text.as_str())];
        }
        let s = &self.snapshot;
        [("ip", &s.nft_kube_proxy), ("ip6", &s.nft_kube_proxy6)]
            .into_iter()
            .filter_map(|(family, text)| {
                Some((
                    format!("nft -j list table {family} kube-proxy ({})", s.collector),
                    text.as_deref()?,
                ))
            })
            .collect()
    }

    /// The conntrack listing to check: the one given, else the collected one.
    fn conntrack(&self) -> Option<NamedText> {
        self.conntrack.clone().or_else(|| {
            let s = &self.snapshot;
            s.conntrack.as_ref().map(|text| NamedText {
                text: text.clone(),
                label: format!("conntrack listing ({})", s.collector),
            })
        })
    }
}

/// What kube-proxy reads, for one node: the API state, its configuration, and what the caller
/// knows of the node.
#[derive(Debug, Clone)]
pub struct VerifyInputs {
    /// Services, EndpointSlices, Nodes, ServiceCIDRs. Shared: the comparison lets go of its
    /// reference as soon as kube-proxy's plan is made from it.
    pub state: Arc<ClusterState>,
    /// kube-proxy's configuration as written (defaults when there is none).
    pub config: ProxyConfig,
    /// The node facts given (flags). `kube_proxy_version` given is the release compared with;
    /// without it, the node's kube-proxy image's, else the one the rules show.
    pub facts: NodeInputs,
    /// The node's name as the dumps were read for it (`""` when unknown): the report's, when
    /// the facts name none.
    pub node: String,
}

/// How to verify.
#[derive(Debug, Clone, Copy, Default)]
pub struct VerifyOptions {
    /// Read pastes and partial inputs (`--lenient`).
    pub lenient: bool,
    /// Many findings of one cause (mass drift) as one finding with their count and a few
    /// examples (off: `--all-findings`).
    pub group_alike: bool,
    /// An input given that selects the mode (`--ipvsadm`).
    pub given: Option<Given>,
}

/// Why a node could not be verified.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// Neither an iptables dump nor, on an nftables-mode node, a listing.
    #[error(
        "verify needs the node's rules: --iptables-save FILE (and --ip6tables-save FILE for IPv6)"
    )]
    NoRules,
    /// The iptables dump is empty.
    #[error(
        "the node's rules are empty: there are no rules to compare (was the command's output saved?)"
    )]
    EmptyRules,
    /// An IPVS-mode node read without its `ipvsadm` output.
    #[error(
        "the node's rules are kube-proxy's IPVS mode (KUBE-IPVS-FILTER, KUBE-CLUSTER-IP set rules): verify it with --ipvsadm FILE (ipvsadm -Ln or -Sn) [--ipset FILE] [--ip-addr FILE] and this --iptables-save, or with a collector whose image has ipvsadm (--collector debug-pod)"
    )]
    NoIpvsadm,
    /// An nftables-mode node read without its tables.
    #[error(
        "kube-proxy runs in nftables mode here: verify needs the node's ruleset, --nft-ruleset FILE (nft -j list ruleset), or a collector whose image has nft (--collector debug-pod)"
    )]
    NoListing,
    /// The node facts could not be built from the state and the flags.
    #[error("node facts")]
    Facts(#[source] NodeError),
    /// An iptables dump did not parse, or is partial.
    #[error(transparent)]
    Iptables(#[from] crate::compare::VerifyError),
    /// An nft listing did not parse.
    #[error(transparent)]
    Nftables(#[from] NftVerifyError),
    /// An `ipvsadm` or `ipset` dump did not parse.
    #[error(transparent)]
    Ipvs(#[from] Box<ParseError>),
    /// An `ipset list` cut inside a set: its missing members would be reported as missing from
    /// the node.
    #[error("{0}; verify needs the whole `ipset list` (or `ipset save`)")]
    CutIpset(String),
    /// The node's kube-proxy image is of a release newer than this build.
    #[error(transparent)]
    NewerRelease(#[from] crate::compare::version::NewerRelease),
    /// The conntrack listing did not parse.
    #[error(transparent)]
    Conntrack(#[from] ConntrackError),
}

/// Verifies one node: decides its mode ([`mode::for_verify`]), and for an iptables-mode node
/// the kube-proxy release to compare with (the facts' `kube_proxy_version`, the node's
/// kube-proxy image, else the one its rules show: the choice is a [`Note::Choice`]); builds the
/// node facts; runs that mode's comparison; adds the conntrack table's findings and, on an
/// iptables-mode node, KP004 for nftables-mode tables a collector found. What the user should
/// be told comes out as `notes`, in order, also when the result is an error.
pub fn verify_node(
    dumps: &NodeDumps,
    inputs: VerifyInputs,
    options: &VerifyOptions,
    notes: &mut Vec<Note>,
) -> Result<Report, VerifyError> {
    let listings = dumps.listings();
    let texts: Vec<&str> = listings.iter().map(|(_, t)| *t).collect();
    let decision = mode::for_verify(
        inputs.config.mode,
        options.given,
        &Evidence::new(&dumps.snapshot, &texts),
    );
    let mode = decision.mode;
    notes.push(Note::Mode(decision));
    let report = match mode {
        ProxyMode::Nftables => nftables_node(dumps, &listings, inputs, options, notes)?,
        ProxyMode::Ipvs if options.given.is_some() => ipvs_node(dumps, &inputs, options, notes)?,
        ProxyMode::Ipvs | ProxyMode::Iptables => {
            let s = &dumps.snapshot;
            let main = s
                .iptables_save
                .as_deref()
                .or(s.ip6tables_save.as_deref())
                .ok_or(VerifyError::NoRules)?;
            notes.extend(s.warnings.iter().cloned().map(Note::Warning));
            if main.trim().is_empty() {
                return Err(VerifyError::EmptyRules);
            }
            if mode == ProxyMode::Ipvs {
                if s.ipvsadm.is_none() {
                    return Err(VerifyError::NoIpvsadm);
                }
                ipvs_node(dumps, &inputs, options, notes)?
            } else {
                iptables_node(dumps, inputs, options, notes)?
            }
        }
    };
    Ok(if options.group_alike {
        report.group_alike()
    } else {
        report
    })
}

/// The node facts for `config`, with the release `version` when one was chosen; the node is
/// the one the inputs name.
fn node_facts(
    inputs: &VerifyInputs,
    config: &ProxyConfig,
    version: Option<&ReleaseChoice>,
    notes: &mut Vec<Note>,
) -> Result<NodeFacts, VerifyError> {
    let mut given = inputs.facts.clone();
    if let Some(r) = version {
        given.kube_proxy_version = Some(r.version);
    }
    let (facts, warnings) =
        node::build(&given, &inputs.state, config).map_err(VerifyError::Facts)?;
    notes.extend(warnings.iter().map(|w| Note::Warning(w.to_string())));
    Ok(facts)
}

/// The report's node: the facts', else the one the dumps were read for.
fn node_name<'a>(facts: &'a NodeFacts, inputs: &'a VerifyInputs) -> &'a str {
    if facts.node_name.is_empty() {
        &inputs.node
    } else {
        &facts.node_name
    }
}

/// An nftables-mode node: its listings against the render of kube-proxy's table
/// ([`crate::compare::nftables`]), with the configuration read as kube-proxy reads it in
/// nftables mode.
fn nftables_node(
    dumps: &NodeDumps,
    listings: &[(String, &str)],
    inputs: VerifyInputs,
    options: &VerifyOptions,
    notes: &mut Vec<Note>,
) -> Result<Report, VerifyError> {
    let s = &dumps.snapshot;
    notes.extend(s.warnings.iter().cloned().map(Note::Warning));
    if listings.is_empty() {
        return Err(VerifyError::NoListing);
    }
    let config = inputs.config.for_nftables();
    // The kube-proxy release to compare with: the flag, the pod's image, else the table's own.
    let texts = nft_texts(listings);
    let release = crate::compare::version::choose_release(
        inputs.facts.kube_proxy_version,
        s.kube_proxy_image.as_deref(),
        crate::compare::nftables::release::infer(&texts, options.lenient)?,
        "verifying",
    )?;
    notes.extend(release.notes.iter().cloned().map(Note::Choice));
    notes.push(Note::Release(release.version));
    let facts = node_facts(&inputs, &config, Some(&release), notes)?;
    let iptables: Vec<(String, &str)> = [
        (DumpKind::IptablesSave, "iptables-save", &s.iptables_save),
        (DumpKind::Ip6tablesSave, "ip6tables-save", &s.ip6tables_save),
        (
            DumpKind::IptablesLegacySave,
            "iptables-legacy-save",
            &s.iptables_legacy_save,
        ),
    ]
    .into_iter()
    .filter_map(|(kind, command, text)| Some((dumps.name(kind, command), text.as_deref()?)))
    .collect();
    let input = NftVerifyInput {
        node: node_name(&facts, &inputs),
        state: &inputs.state,
        config: &config,
        facts: &facts,
        listings: texts,
        iptables: nft_texts(&iptables),
        ipvsadm: s.ipvsadm.as_deref(),
        ipset: s.ipset_save.as_deref(),
        lenient: options.lenient,
    };
    let report = crate::compare::nftables::release::verify_release(&input, &release)?;
    let flows = flows(dumps, options, (&inputs.state, &config, &facts), notes)?;
    Ok(conntrack::with_findings(report, flows))
}

/// The findings of the node's conntrack table (see [`conntrack::findings`]).
fn flows(
    dumps: &NodeDumps,
    options: &VerifyOptions,
    inputs: (&ClusterState, &ProxyConfig, &NodeFacts),
    notes: &mut Vec<Note>,
) -> Result<Vec<Finding>, ConntrackError> {
    conntrack::findings(dumps.conntrack().as_ref(), options.lenient, inputs, notes)
}

/// (name, text) pairs as the nftables comparison takes them.
fn nft_texts<'a>(texts: &'a [(String, &'a str)]) -> Vec<NftText<'a>> {
    texts
        .iter()
        .map(|(label, text)| NftText { label, text })
        .collect()
}

/// An IPVS-mode node: see [`ipvs::check`]; then its conntrack table.
fn ipvs_node(
    dumps: &NodeDumps,
    inputs: &VerifyInputs,
    options: &VerifyOptions,
    notes: &mut Vec<Note>,
) -> Result<Report, VerifyError> {
    let facts = node_facts(inputs, &inputs.config, None, notes)?;
    let report = ipvs::check(
        dumps,
        &inputs.state,
        &inputs.config,
        &facts,
        &inputs.facts,
        notes,
    )?;
    let flows = flows(
        dumps,
        options,
        (&inputs.state, &inputs.config, &facts),
        notes,
    )?;
    Ok(conntrack::with_findings(report, flows))
}

/// An iptables-mode node: the release to compare with, then its dumps (each family's, the other
/// backend's) against kube-proxy's plan ([`crate::compare::verify_release`]), made on a thread
/// of its own while the dumps are parsed — the API state goes with it and is freed once the
/// plan is made (also the plan of the release that wrote the rules, when that is another).
fn iptables_node(
    dumps: &NodeDumps,
    inputs: VerifyInputs,
    options: &VerifyOptions,
    notes: &mut Vec<Note>,
) -> Result<Report, VerifyError> {
    let s = &dumps.snapshot;
    let release = release(s, &inputs.facts)?;
    notes.extend(release.notes.iter().cloned().map(Note::Choice));
    notes.push(Note::Release(release.version));
    let facts = node_facts(&inputs, &inputs.config, Some(&release), notes)?;
    let flows = flows(
        dumps,
        options,
        (&inputs.state, &inputs.config, &facts),
        notes,
    )?;
    let main_family = if s.iptables_save.is_some() {
        facts.family
    } else {
        IpFamily::V6
    };
    let mut texts: Vec<(String, &str, IpFamily)> = Vec::new();
    if let Some(t) = s.iptables_save.as_deref() {
        texts.push((
            dumps.name(DumpKind::IptablesSave, "iptables-save"),
            t,
            main_family,
        ));
    }
    if let Some(t) = s.ip6tables_save.as_deref() {
        texts.push((
            dumps.name(DumpKind::Ip6tablesSave, "ip6tables-save"),
            t,
            IpFamily::V6,
        ));
    }
    let legacy = collect::other_backend(s).map(|(command, t)| {
        let kind = if command == "iptables-legacy-save" {
            DumpKind::IptablesLegacySave
        } else {
            DumpKind::IptablesNftSave
        };
        (dumps.name(kind, command), t)
    });
    let dump_texts: Vec<DumpText> = texts
        .iter()
        .map(|(label, text, family)| DumpText {
            label,
            text,
            family: *family,
        })
        .collect();
    let node = node_name(&facts, &inputs).to_string();
    let VerifyInputs { state, config, .. } = inputs;
    let writer = release.writer.map(|w| {
        let mut facts = facts.clone();
        facts.kube_proxy_version = w;
        WriterRelease {
            plans: NodePlans::start(Arc::clone(&state), &config, &facts, &dump_texts),
            facts,
        }
    });
    let plans = NodePlans::start(state, &config, &facts, &dump_texts);
    let input = VerifyInput {
        node: &node,
        plans,
        config: &config,
        facts: &facts,
        dumps: dump_texts,
        legacy: legacy.as_ref().map(|(label, text)| DumpText {
            label,
            text,
            family: main_family,
        }),
        nft_ruleset: dumps.nft_listing.as_ref().map(|l| l.text.as_str()),
        parse: if options.lenient {
            ParseOptions::lenient()
        } else {
            ParseOptions::strict()
        },
        group_alike: options.group_alike,
    };
    let check = ReleaseCheck {
        inferred: release.source == ReleaseSource::Inferred,
        inference: Some(release.inference),
        writer,
    };
    let report = crate::compare::verify_release(&input, &check)?;
    let mut flows = flows;
    if dumps.nft_listing.is_none() {
        flows.extend(foreign_tables(s, report.mode));
    }
    Ok(conntrack::with_findings(report, flows))
}

/// The kube-proxy release to compare an iptables-mode node's rules with (see
/// [`release::choose`]).
fn release(s: &NodeSnapshot, given: &NodeInputs) -> Result<ReleaseChoice, VerifyError> {
    let texts = [s.iptables_save.as_deref(), s.ip6tables_save.as_deref()];
    Ok(release::choose(
        given,
        s.kube_proxy_image.as_deref(),
        Some(texts.into_iter().flatten()),
        "verifying",
    )?)
}

/// KP004 for the nftables-mode tables a collector found on a node that runs another mode
/// (`nft -j list table ip kube-proxy` succeeded).
fn foreign_tables(snap: &NodeSnapshot, mode: ProxyMode) -> Vec<Finding> {
    if mode != ProxyMode::Iptables {
        return Vec::new();
    }
    [("ip", &snap.nft_kube_proxy), ("ip6", &snap.nft_kube_proxy6)]
        .into_iter()
        .filter(|(_, t)| t.as_deref().is_some_and(collect::holds_kube_proxy_table))
        .map(|(family, _)| {
            let name = format!("table {family} kube-proxy");
            FOREIGN_MODE
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxier::iptables::{RenderOptions, render};
    use crate::proxier::nftables;

    /// The repository's example cluster: its API state and kube-proxy's configuration.
    fn cluster(mode: Option<ProxyMode>) -> (Arc<ClusterState>, ProxyConfig) {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/cluster");
        let state = crate::state::load::from_files(&[dir.join("state.json")]).expect("state");
        let text = std::fs::read_to_string(dir.join("config.yaml")).expect("config");
        let (mut config, _) = crate::state::config::parse(&text, "config.yaml").expect("parses");
        config.mode = mode;
        (Arc::new(state), config)
    }

    fn node_1() -> NodeInputs {
        NodeInputs {
            node: Some("node-1".into()),
            ..NodeInputs::default()
        }
    }

    fn inputs(state: &Arc<ClusterState>, config: &ProxyConfig) -> VerifyInputs {
        VerifyInputs {
            state: Arc::clone(state),
            config: config.clone(),
            facts: node_1(),
            node: "node-1".into(),
        }
    }

    fn dumps(snapshot: NodeSnapshot) -> NodeDumps {
        NodeDumps {
            snapshot: NodeSnapshot {
                collector: "test".into(),
                ..snapshot
            },
            ..NodeDumps::default()
        }
    }

    const OPTIONS: VerifyOptions = VerifyOptions {
        lenient: false,
        group_alike: true,
        given: None,
    };

    fn decided(notes: &[Note]) -> Option<ProxyMode> {
        notes.iter().find_map(|n| match n {
            Note::Mode(d) => Some(d.mode),
            _ => None,
        })
    }

    /// One call verifies a node; the same call again gives the same report (nothing is kept
    /// between calls), and a rule deleted from the node is found.
    #[test]
    fn an_iptables_node_is_verified_by_one_call_again_and_again() {
        fn sendable<T: Send>(_: &T) {}
        let (state, config) = cluster(Some(ProxyMode::Iptables));
        let (facts, _) = node::build(&node_1(), &state, &config).expect("facts");
        let rules = render(
            &state,
            &config,
            &facts,
            RenderOptions {
                with_base_jumps: true,
            },
        )
        .to_restore_text();
        let clean = dumps(NodeSnapshot {
            iptables_save: Some(rules.clone()),
            ..NodeSnapshot::default()
        });
        sendable(&clean);
        sendable(&inputs(&state, &config));
        let mut notes = Vec::new();
        let first =
            verify_node(&clean, inputs(&state, &config), &OPTIONS, &mut notes).expect("verifies");
        assert_eq!((first.mode, first.summary.errors), (ProxyMode::Iptables, 0));
        assert_eq!(decided(&notes), Some(ProxyMode::Iptables));
        let again = verify_node(&clean, inputs(&state, &config), &OPTIONS, &mut Vec::new())
            .expect("verifies");
        assert_eq!(first, again);

        let sep = rules
            .lines()
            .find(|l| l.starts_with("-A KUBE-SEP-") && l.contains("DNAT"))
            .expect("an endpoint's DNAT rule");
        let drifted = dumps(NodeSnapshot {
            iptables_save: Some(rules.replace(&format!("{sep}\n"), "")),
            ..NodeSnapshot::default()
        });
        let report = verify_node(&drifted, inputs(&state, &config), &OPTIONS, &mut Vec::new())
            .expect("verifies");
        assert!(report.summary.errors > 0, "{:#?}", report.findings);
    }

    /// A configuration that says nftables, and the node's `kube-proxy` table collected: the
    /// table is verified, and a collector's warning comes out as a note.
    #[test]
    fn an_nftables_node_is_verified_from_its_collected_table() {
        let (state, config) = cluster(Some(ProxyMode::Nftables));
        let nft_config = config.for_nftables();
        let (facts, _) = node::build(&node_1(), &state, &nft_config).expect("facts");
        let mut sink =
            nftables::objects::TextSink::new(nftables::table_family(facts.family), Vec::new());
        nftables::render_into(&state, &nft_config, &facts, &mut sink);
        let table = String::from_utf8(sink.finish().expect("rendered")).expect("utf-8");
        let node = dumps(NodeSnapshot {
            nft_kube_proxy: Some(table),
            warnings: vec!["no ipvsadm in the image".into()],
            ..NodeSnapshot::default()
        });
        let mut notes = Vec::new();
        let report =
            verify_node(&node, inputs(&state, &config), &OPTIONS, &mut notes).expect("verifies");
        assert_eq!(
            (report.mode, report.summary.errors),
            (ProxyMode::Nftables, 0)
        );
        assert!(notes.contains(&Note::Warning("no ipvsadm in the image".into())));
    }

    /// What the inputs lack is an error, and what came before it is still in the notes.
    #[test]
    fn a_node_without_rules_is_an_error_with_its_notes() {
        let (state, config) = cluster(None);
        let empty = dumps(NodeSnapshot {
            iptables_save: Some("\n".into()),
            warnings: vec!["ip6tables-save is missing".into()],
            ..NodeSnapshot::default()
        });
        let mut notes = Vec::new();
        let e = verify_node(&empty, inputs(&state, &config), &OPTIONS, &mut notes);
        assert!(matches!(e, Err(VerifyError::EmptyRules)), "{e:?}");
        assert!(notes.contains(&Note::Warning("ip6tables-save is missing".into())));
        let none = dumps(NodeSnapshot::default());
        let e = verify_node(&none, inputs(&state, &config), &OPTIONS, &mut Vec::new());
        assert!(matches!(e, Err(VerifyError::NoRules)), "{e:?}");
    }
}
