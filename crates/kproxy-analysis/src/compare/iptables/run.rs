//! `verify` end to end for one node, offline: parse the dumps, compute what kube-proxy would write,
//! and run the node-wide, graph-level and rule-level comparisons into one [`Report`].

use super::expected::{self, ExpectedPort};
use super::graph_level::{self, GraphContext};
use super::nodewide::{self, NodeContext, ServiceAddresses};
use super::rule_level;
use crate::compare::catalogue as cat;
use crate::compare::finding::Finding;
use crate::compare::grouping::Folder;
use crate::compare::left_out::{LeftOutService, NotChecked};
use crate::compare::report::Report;
use crate::graph::{self, GraphOptions, NameResolver};
use crate::model::Ruleset;
use crate::proxier::iptables as ipt;
use crate::state::ClusterState;
use crate::state::config::ProxyConfig;
use crate::state::ip::IpFamily;
use crate::state::mode::ProxyMode;
use crate::state::node::NodeFacts;
use crate::state::validate::InvalidObject;
use kproxy_parsers::ParseError;
use kproxy_parsers::iptables::{Family, ParseOptions, parse_dump};
use std::sync::{Arc, Mutex, OnceLock};

/// One dump to verify.
#[derive(Debug, Clone, Copy)]
pub struct DumpText<'a> {
    /// Where it came from (`iptables-save`, a path), for messages.
    pub label: &'a str,
    /// The text.
    pub text: &'a str,
    /// The IP family its rules are for.
    pub family: IpFamily,
}

/// Everything `verify` needs for one node.
#[derive(Debug)]
pub struct VerifyInput<'a> {
    /// The node name shown in the report.
    pub node: &'a str,
    /// What kube-proxy would install, per family, from the API objects ([`NodePlans::new`], or
    /// [`NodePlans::start`] to plan while the dumps are parsed).
    pub plans: NodePlans,
    /// kube-proxy's configuration.
    pub config: &'a ProxyConfig,
    /// Node facts (their `family` is replaced per dump).
    pub facts: &'a NodeFacts,
    /// `iptables-save` / `ip6tables-save` output, one per family.
    pub dumps: Vec<DumpText<'a>>,
    /// `iptables-legacy-save` output (the other backend), if collected.
    pub legacy: Option<DumpText<'a>>,
    /// `nft list ruleset` output, if collected.
    pub nft_ruleset: Option<&'a str>,
    /// Parser options (lenient or strict).
    pub parse: ParseOptions,
    /// Mass drift folded as it is found ([`crate::compare::grouping::Folder`]), as
    /// [`Report::group_alike`] folds it after: the findings a group stands for are never all
    /// held. Off: every finding is reported (`--all-findings`).
    pub group_alike: bool,
}

/// What kube-proxy would install on the node, computed from the API state: either before the
/// dumps are read ([`NodePlans::new`]) or when verify first asks for it ([`NodePlans::start`]),
/// on one of its parallel tasks while the dumps are parsed. Either way the caller can let go of
/// the state (the largest input) before verify allocates the dumps'
/// models and graphs, which then reuse its memory.
#[derive(Debug)]
pub struct NodePlans {
    /// The families planned: those with a dump.
    families: Vec<IpFamily>,
    planned: OnceLock<Planned>,
    /// The Services whose rules are not judged ([`crate::compare::left_out::services`]): they
    /// are not planned, and their rules are taken out of the dumps. Known before the plans
    /// are made, which verify does while it parses the dumps.
    left_out: Vec<LeftOutService>,
    /// What [`NodePlans::start`] plans from, until the plans are made.
    pending: Mutex<Option<PlanInputs>>,
}

/// The inputs of a plan not made yet.
#[derive(Debug)]
struct PlanInputs {
    state: Arc<ClusterState>,
    config: ProxyConfig,
    facts: NodeFacts,
}

/// The plans themselves.
#[derive(Debug)]
struct Planned {
    /// One plan per family that has a dump.
    plans: Vec<ipt::ServiceDecisions>,
    /// Families without a dump, with the number of service ports that were not checked.
    not_collected: Vec<(IpFamily, usize)>,
    /// The objects the state left out ([`ClusterState::invalid`]).
    invalid: Vec<InvalidObject>,
}

impl Planned {
    fn new(
        state: &ClusterState,
        config: &ProxyConfig,
        facts: &NodeFacts,
        families: &[IpFamily],
        left_out: &[LeftOutService],
    ) -> Planned {
        let invalid = state.invalid.clone();
        let state = &*crate::compare::left_out::judged_state(state, left_out);
        let plan = |family: IpFamily| {
            let mut facts = facts.clone();
            facts.family = family;
            ipt::expected_service_ports(state, config, &facts)
        };
        let mut plans: Vec<ipt::ServiceDecisions> = Vec::new();
        let mut not_collected = Vec::new();
        for fam in [IpFamily::V4, IpFamily::V6] {
            if families.contains(&fam) {
                plans.push(plan(fam));
            } else if !families.is_empty() {
                not_collected.push((fam, plan(fam).ports.len()));
            }
        }
        Planned {
            plans,
            not_collected,
            invalid,
        }
    }
}

/// The families of `dumps`, each once.
fn dump_families(dumps: &[DumpText<'_>]) -> Vec<IpFamily> {
    let mut families: Vec<IpFamily> = dumps.iter().map(|d| d.family).collect();
    families.dedup();
    families
}

impl NodePlans {
    /// Plans every family of `dumps` (node facts as given, `family` replaced), and counts the
    /// service ports of the families no dump covers (none when there is no dump at all).
    pub fn new(
        state: &ClusterState,
        config: &ProxyConfig,
        facts: &NodeFacts,
        dumps: &[DumpText<'_>],
    ) -> NodePlans {
        let families = dump_families(dumps);
        let left_out = crate::compare::left_out::services(state);
        let planned = Planned::new(state, config, facts, &families, &left_out);
        NodePlans {
            families,
            planned: OnceLock::from(planned),
            left_out,
            pending: Mutex::new(None),
        }
    }

    /// [`NodePlans::new`], made when first asked for: verify asks on the task that reads the
    /// render while another parses the dumps. The reference to `state` is dropped once the
    /// plans are made: a caller that keeps no other frees the state then.
    pub fn start(
        state: Arc<ClusterState>,
        config: &ProxyConfig,
        facts: &NodeFacts,
        dumps: &[DumpText<'_>],
    ) -> NodePlans {
        NodePlans {
            families: dump_families(dumps),
            planned: OnceLock::new(),
            left_out: crate::compare::left_out::services(&state),
            pending: Mutex::new(Some(PlanInputs {
                state,
                config: config.clone(),
                facts: facts.clone(),
            })),
        }
    }

    /// The plans, made now when [`NodePlans::start`] left them to be made.
    fn planned(&self) -> &Planned {
        self.planned.get_or_init(|| {
            let inputs = self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take();
            match inputs {
                Some(PlanInputs {
                    state,
                    config,
                    facts,
                }) => Planned::new(&state, &config, &facts, &self.families, &self.left_out),
                None => panic!("planning failed earlier"),
            }
        })
    }

    /// Puts every plan in kube-proxy's large-cluster mode or out of it (no comments on
    /// endpoint rules past 1,000 endpoints): a plan of part of the state
    /// ([`super::scope`]) takes the whole state's mode.
    pub fn set_large_cluster(&mut self, large: bool) {
        if let Some(planned) = self.planned.get_mut() {
            for plan in &mut planned.plans {
                plan.large_cluster_mode = large;
            }
        }
    }

    /// Whether every plan is in large-cluster mode (none made yet: not).
    pub fn large_cluster(&self) -> bool {
        let plans = &self.planned().plans;
        !plans.is_empty() && plans.iter().all(|p| p.large_cluster_mode)
    }

    /// Whether `family` was planned (a dump of that family was given).
    pub fn has(&self, family: IpFamily) -> bool {
        self.families.contains(&family)
    }

    /// The plan of `family`, when a dump of that family was given to [`NodePlans::new`].
    pub fn of(&self, family: IpFamily) -> Option<&ipt::ServiceDecisions> {
        if !self.has(family) {
            return None;
        }
        self.planned().plans.iter().find(|p| p.family == family)
    }

    /// Families without a dump, with the number of service ports that were not checked.
    fn not_collected(&self) -> &[(IpFamily, usize)] {
        &self.planned().not_collected
    }

    /// The objects the state left out ([`ClusterState::invalid`]).
    fn invalid(&self) -> &[InvalidObject] {
        &self.planned().invalid
    }

    /// The Services whose rules are not judged.
    fn left_out(&self) -> &[LeftOutService] {
        &self.left_out
    }
}

/// Why verify could not run.
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    /// A dump did not parse (the error names the dump as its file).
    #[error("{error}")]
    Parse {
        /// The parse error (with `dump:line:col`).
        error: Box<ParseError>,
    },
    /// A dump is not all the node's rules (cut, filtered): what it lacks would be reported as
    /// missing, so nothing is compared.
    #[error(
        "{label}: {gaps}; verify compares all of a node's rules and would report what the input lacks as missing: give the whole `iptables-save` output"
    )]
    Partial {
        /// Which dump.
        label: String,
        /// Why it is partial, in words.
        gaps: String,
    },
    /// A dump holds the other family's rules (an `ip6tables-save` given as `--iptables-save`).
    #[error(
        "{label} holds {found} rules ({how}) but was given as the {expected} dump: pass it as --{flag}"
    )]
    FamilySwapped {
        /// Which dump.
        label: String,
        /// The family its content shows.
        found: &'static str,
        /// The family it was given as.
        expected: &'static str,
        /// How its family shows (header, addresses).
        how: &'static str,
        /// The flag it belongs to.
        flag: &'static str,
    },
    /// A dump's family was not planned ([`NodePlans::new`] was given other dumps).
    #[error("{label}: no {family} plan; NodePlans::new was not given this dump")]
    NotPlanned {
        /// Which dump.
        label: String,
        /// Its family.
        family: IpFamily,
    },
}

/// The masquerade mark bit value from the facts' mark text (`0x00004000`), else `1 << masqueradeBit`.
pub fn mark_value(facts: &NodeFacts, config: &ProxyConfig) -> u32 {
    let t = facts.masquerade_mark.trim();
    let hex = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X"));
    match hex.map(|h| u32::from_str_radix(h, 16)) {
        Some(Ok(v)) => v,
        _ => match t.parse::<u32>() {
            Ok(v) => v,
            Err(_) => 1u32 << config.masquerade_bit.min(31),
        },
    }
}

fn service_addresses(expected: &[ExpectedPort]) -> ServiceAddresses {
    let mut a = ServiceAddresses::default();
    for e in expected {
        for ip in std::iter::once(&e.cluster_ip)
            .chain(e.external_ips)
            .chain(e.lb_ips)
        {
            a.ips.entry(*ip).or_insert_with(|| e.name.to_string());
        }
        a.ports
            .entry((e.protocol.to_string(), e.port))
            .or_insert_with(|| e.name.to_string());
        if let Some(np) = e.node_port {
            a.ports
                .entry((e.protocol.to_string(), np))
                .or_insert_with(|| e.name.to_string());
        }
    }
    a
}

fn parse<'t>(
    d: &DumpText<'t>,
    opts: &ParseOptions,
) -> Result<kproxy_parsers::iptables::Dump<'t>, VerifyError> {
    let dump = parse_dump(d.text, opts).map_err(|e| VerifyError::Parse {
        error: Box::new(e.in_source(d.label)),
    })?;
    if dump.gaps.is_empty() {
        return Ok(dump);
    }
    let gaps: Vec<String> = dump.gaps.iter().map(ToString::to_string).collect();
    Err(VerifyError::Partial {
        label: d.label.to_string(),
        gaps: gaps.join("; "),
    })
}

/// Refuses a dump whose header or addresses show the other family than the one it was given as:
/// compared with the wrong family's plan, every rule would be reported as drift.
pub fn check_family(
    dump: &kproxy_parsers::iptables::Dump<'_>,
    expected: Family,
    label: &str,
) -> Result<(), VerifyError> {
    let name = |f: Family| if f == Family::V6 { "IPv6" } else { "IPv4" };
    if dump.family == Family::Unknown || dump.family == expected || expected == Family::Unknown {
        return Ok(());
    }
    Err(VerifyError::FamilySwapped {
        label: label.to_string(),
        found: name(dump.family),
        expected: name(expected),
        how: if dump.version.is_some() {
            "its header names the tool that saved it"
        } else {
            "its addresses"
        },
        flag: if dump.family == Family::V6 {
            "ip6tables-save"
        } else {
            "iptables-save"
        },
    })
}

/// How `verify` chose the kube-proxy release it compares with, and what the dump says of the
/// release that wrote it.
#[derive(Debug, Default)]
pub struct ReleaseCheck {
    /// What the dumps' own rules say of their release ([`crate::compare::version::infer`]); `None`:
    /// not looked at.
    pub inference: Option<crate::compare::version::Inference>,
    /// The release was chosen from `inference` (no flag, no image): say so (KP907).
    pub inferred: bool,
    /// When the rules look written by another release than the facts' (`--kube-proxy-version`,
    /// the node's image): that release's plans and facts, to tell its differences from drift
    /// (KP906).
    pub writer: Option<WriterRelease>,
}

/// The release that wrote the rules, when it is not the one verified against.
#[derive(Debug)]
pub struct WriterRelease {
    /// Its plans (as [`VerifyInput::plans`]).
    pub plans: NodePlans,
    /// The node facts with its version.
    pub facts: NodeFacts,
}

/// Runs every check for one node.
pub fn verify(input: &VerifyInput<'_>) -> Result<Report, VerifyError> {
    verify_release(input, &ReleaseCheck::default())
}

/// [`verify`], saying which kube-proxy release the rules were compared with when it was
/// inferred (KP907), naming rules of two releases (KP908), and grouping the differences that
/// are another release's rules into one finding (KP906) when `release.writer` is set.
pub fn verify_release(
    input: &VerifyInput<'_>,
    release: &ReleaseCheck,
) -> Result<Report, VerifyError> {
    let mode = ProxyMode::or_default(input.config.mode);
    // Telling another release's rules from drift (KP906) compares every finding of both.
    let mut findings = Folder::new(input.group_alike && release.writer.is_none());
    let mut service_ports = 0usize;
    let mut unchecked = 0usize;
    let mut main_has_rules = false;
    let mut legacy_present_warning = false;
    let (judged, not_checked) = judged_dumps(&input.dumps, input.plans.left_out());
    for d in judged.iter().map(JudgedDump::text) {
        let d = &d;
        let checked = match (&release.writer, &release.inference) {
            (Some(w), Some(inference)) => {
                let mut ours = Folder::new(false);
                let checked = verify_dump(input, (&input.plans, input.facts), d, mode, &mut ours)?;
                let mut theirs = Folder::new(false);
                verify_dump(input, (&w.plans, &w.facts), d, mode, &mut theirs)?;
                findings.extend(crate::compare::version::group_release_differences(
                    ours.finish().0,
                    &theirs.finish().0,
                    input.facts.kube_proxy_version,
                    w.facts.kube_proxy_version,
                    inference,
                ));
                checked
            }
            _ => verify_dump(input, (&input.plans, input.facts), d, mode, &mut findings)?,
        };
        service_ports += checked.service_ports;
        unchecked += checked.unchecked;
        main_has_rules |= checked.has_kube_proxy_rules;
        legacy_present_warning |= checked.legacy_tables_present;
    }
    if let Some(inference) = &release.inference {
        if release.inferred {
            findings.push(crate::compare::version::inferred_finding(
                inference,
                input.facts.kube_proxy_version,
            ));
        }
        findings.extend(crate::compare::version::mixed_finding(inference));
    }
    // Families whose dump was not given.
    for &(fam, n) in input.plans.not_collected() {
        if n > 0 {
            findings.push(
                cat::FAMILY_NOT_COLLECTED
                    .finding(format!(
                        "{n} {fam} service port(s) not checked: no {fam} dump given"
                    ))
                    .expected(format!(
                        "{} output",
                        if fam == IpFamily::V6 {
                            "ip6tables-save"
                        } else {
                            "iptables-save"
                        }
                    ))
                    .actual("not given"),
            );
        }
    }
    findings.extend(crate::compare::left_out::findings(
        input.plans.invalid(),
        &not_checked,
    ));
    match &input.legacy {
        Some(l) => {
            let legacy = parse(l, &input.parse)?;
            if nodewide::has_kube_proxy_rules(&legacy) && main_has_rules {
                findings.push(backend_split(&legacy, l.label));
            }
        }
        None if legacy_present_warning && main_has_rules => findings.push(
            cat::LEGACY_NOT_COLLECTED
                .finding("the dump says iptables-legacy tables are present; kube-proxy rules there were not checked")
                .expected("--iptables-legacy-save given")
                .actual("# Warning: iptables-legacy tables present"),
        ),
        None => {}
    }
    if let Some(nft) = input.nft_ruleset {
        findings.extend(nodewide::foreign_nft_tables(nft, mode));
    }
    // The node's rules are kube-proxy's iptables mode (an IPVS node takes the IPVS path): a
    // configuration that says otherwise is drift, whatever the rules hold.
    if main_has_rules && let Some(f) = crate::compare::ipvs::mode_finding(mode, ProxyMode::Iptables)
    {
        findings.push(f);
    }
    let (findings, left_out) = findings.finish();
    let mut report =
        Report::new(input.node, mode, service_ports, findings).with_unchecked(unchecked);
    report.left_out(left_out);
    Ok(report)
}

/// The dumps without the rules of the Services in `left_out` (those are not judged), and what
/// was taken out per Service (all dumps together).
fn judged_dumps<'a>(
    dumps: &[DumpText<'a>],
    left_out: &[LeftOutService],
) -> (Vec<JudgedDump<'a>>, Vec<NotChecked>) {
    let mut not_checked = Vec::new();
    if left_out.is_empty() {
        let same = dumps.iter().map(|d| JudgedDump {
            dump: *d,
            cut: None,
        });
        return (same.collect(), not_checked);
    }
    let judged = dumps
        .iter()
        .map(|d| {
            let (text, counts) = super::scope::without_left_out(d.text, left_out);
            for n in counts {
                crate::compare::left_out::tally(&mut not_checked, n);
            }
            JudgedDump {
                dump: *d,
                cut: Some(text),
            }
        })
        .collect();
    (judged, not_checked)
}

/// One dump as verify judges it: whole, or without some Services' rules.
struct JudgedDump<'a> {
    dump: DumpText<'a>,
    cut: Option<String>,
}

impl JudgedDump<'_> {
    /// The dump to check (its text the cut one, when cut).
    fn text(&self) -> DumpText<'_> {
        DumpText {
            text: self.cut.as_deref().unwrap_or(self.dump.text),
            ..self.dump
        }
    }
}

/// What checking one dump found, besides its findings.
struct DumpChecked {
    service_ports: usize,
    /// Service ports not checked (KP406).
    unchecked: usize,
    has_kube_proxy_rules: bool,
    legacy_tables_present: bool,
}

/// Node-wide, graph-level and rule-level checks of one dump, in two parallel steps:
///
/// 1. the dump is parsed into its model while kube-proxy's render is read into one key per rule
///    (the text is never held whole);
/// 2. the graph is built and compared with the expected ports (graph level) while the render's
///    keys are compared with the model's, chain by chain ([`rule_level::screen`]).
///
/// Then the few chains that differ are looked at rule by rule ([`rule_level::findings`]).
fn verify_dump(
    input: &VerifyInput<'_>,
    (plans, facts): (&NodePlans, &NodeFacts),
    d: &DumpText<'_>,
    mode: ProxyMode,
    found: &mut Folder,
) -> Result<DumpChecked, VerifyError> {
    let t0 = std::time::Instant::now();
    let stage = |what: &str| tracing::debug!("verify {}: {what} after {:?}", d.label, t0.elapsed());
    let mut facts = facts.clone();
    facts.family = d.family;
    let family = match d.family {
        IpFamily::V6 => Family::V6,
        IpFamily::V4 => Family::V4,
    };
    let not_planned = || VerifyError::NotPlanned {
        label: d.label.to_string(),
        family: d.family,
    };
    if !plans.has(d.family) {
        return Err(not_planned());
    }
    let render_error = |source: ParseError| VerifyError::Parse {
        error: Box::new(source.in_source(format!("render for {}", d.label))),
    };
    let render = |sink: &mut dyn FnMut(ipt::RenderChunk<'_>)| {
        if let Some(plan) = plans.of(d.family) {
            let _ = ipt::render_decisions_chunks(plan, &facts, sink);
        }
    };
    let omit = if facts.nfacct_known {
        rule_level::KEY_OMIT_KNOWN_NFACCT
    } else {
        rule_level::KEY_OMIT
    };
    let (expected_rules, dump) = rayon::join(
        || {
            // Plans first, when [`NodePlans::start`] left that to be done.
            let chains = plans
                .of(d.family)
                .map_or(0, ipt::ServiceDecisions::nat_chains_estimate);
            let keys = rule_level::ExpectedRules::build_omitting(&render, family, chains, omit);
            stage("render keys built");
            keys
        },
        || {
            let dump = parse(d, &input.parse)?;
            stage("parsed");
            check_family(&dump, family, d.label)?;
            Ok::<_, VerifyError>(dump)
        },
    );
    let dump = dump?;
    let expected_rules = expected_rules.map_err(render_error)?;
    // A table the dump lacks is one node-wide finding (KP011); the per-port findings about its
    // chains would only repeat it.
    let missing: Vec<&'static str> = ["nat", "filter"]
        .into_iter()
        .filter(|t| !dump.tables.iter().any(|d| d.name == *t))
        .collect();
    let plan = plans.of(d.family).ok_or_else(not_planned)?;
    let facts = &facts;
    // The expected ports name the node's service addresses (node-wide checks) and chain hashes
    // (graph, rule level); they are made again for the graph level, after the graph is built:
    // until then verify holds as little as it can.
    let resolver = {
        let expected = expected::expected_ports(plan);
        let addresses = service_addresses(&expected);
        let node_context = NodeContext {
            mark: mark_value(facts, input.config),
            mode,
            services: &addresses,
            large_cluster: plan.large_cluster_mode,
            label: d.label,
        };
        found.extend(nodewide::check(&dump, &node_context));
        stage("node-wide checks done");
        NameResolver::from_ports(expected.iter().map(|e| (e.name, e.protocol)))
    };
    let has_kube_proxy_rules = nodewide::has_kube_proxy_rules(&dump);
    let legacy_tables_present = dump.legacy_tables_present;
    let unreadable = nodewide::is_unreadable(&dump);
    let dump_summary = graph::iptables::DumpSummary::of(&dump);
    // One ruleset serves the graph and the rule level.
    let actual_rules = Ruleset::from_dump(dump);
    stage("dump indexed");
    let (screen, (graph_findings, explained, service_ports)) = rayon::join(
        || rule_level::screen(expected_rules, &actual_rules),
        || {
            let graph = graph::iptables::build_ruleset(
                &actual_rules,
                &dump_summary,
                &GraphOptions {
                    resolver: resolver.clone(),
                    source: Some(d.label.to_string()),
                    comparison_only: true,
                },
            );
            stage("graph built");
            let graph_context = GraphContext {
                masquerade_all: input.config.masquerade_all,
                local_detector: expected::detector_text(plan),
                large_cluster: plan.large_cluster_mode,
                unreadable,
            };
            let expected = expected::expected_ports(plan);
            let (mut graph_findings, explained) =
                graph_level::compare(&expected, &graph, &graph_context);
            if !missing.is_empty() {
                graph_findings.retain(|f| {
                    let table = match f.chain.as_deref() {
                        Some(c) if c.starts_with("filter ") => "filter",
                        _ => "nat",
                    };
                    !missing.contains(&table)
                });
            }
            stage("graph level compared");
            (graph_findings, explained, expected.len())
        },
    );
    stage("rule keys compared");
    let skeleton = graph_findings.iter().any(|f| f.id == cat::SKELETON_ONLY.id);
    found.extend(graph_findings);
    if !unreadable && !skeleton {
        rule_level::findings(
            &screen,
            (family, &render),
            &actual_rules,
            (&resolver, &explained),
            found,
        )
        .map_err(render_error)?;
        stage("rule level compared");
    }
    Ok(DumpChecked {
        service_ports,
        unchecked: explained.unchecked.len(),
        has_kube_proxy_rules,
        legacy_tables_present,
    })
}

/// KP002: what the other backend holds.
fn backend_split(legacy: &kproxy_parsers::iptables::Dump<'_>, label: &str) -> Finding {
    let mut chains = 0usize;
    let mut rules = 0usize;
    let mut entries = 0usize;
    for t in &legacy.tables {
        // One entry per chain that has rules, with its rule count.
        for &(chain, n) in &t.rule_chains {
            if crate::graph::ownership::is_kube_proxy_chain(t.name, chain) {
                rules += n as usize;
                chains += 1;
                if t.name == "nat" && chain == "KUBE-SERVICES" {
                    entries += n as usize;
                }
            }
        }
    }
    cat::BACKEND_SPLIT
        .finding(format!(
            "{label} also holds kube-proxy rules ({chains} chains, {rules} rules, {entries} service entries): both backends are evaluated, stale copies DNAT to old endpoints"
        ))
        .chain("nat KUBE-SERVICES")
        .expected("kube-proxy rules in one backend only")
        .actual(format!("{chains} kube-proxy chains with rules in the legacy backend"))
}
