//! `repair` command: compute the expected rules, diff them with the node's, print the plan, and
//! with `--apply` install it atomically (backup, one `iptables-restore --noflush` per table,
//! read-back verification, rollback on failure).

use super::common::{
    GlobalArgs, NodeFactArgs, ProxyInputs, StateArgs, load_proxy_inputs, read_input,
};
use crate::apply::backup::DEFAULT_BACKUP_DIR;
use crate::apply::guard::{GuardInput, InputFacts, refusals};
use crate::apply::host::{Backend, IptablesHost, RulesHost};
use crate::apply::plan::{ChainAction, Plan, plan};
use crate::apply::repair::{RepairError, RepairOptions, RepairReport, repair};
use crate::compare::version::{Inference, ReleaseChoice};
use crate::exit::Outcome;
use crate::model::Ruleset;
use crate::output::color::{Painter, Role};
use crate::proxier::iptables::{RenderOptions, render};
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use kproxy_parsers::iptables::ParseOptions;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Output formats of `repair`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RepairFormat {
    /// The plan as text, with a diff per rewritten chain.
    Text,
    /// The plan as JSON.
    Json,
}

/// Arguments of `repair`.
#[derive(Debug, Args)]
pub struct RepairArgs {
    /// The node to repair: through the API (exec into its kube-proxy pod, or --collector
    /// debug-pod) unless --local is given.
    #[arg(value_name = "NODE")]
    pub node_name: Option<String>,
    /// Work on this host's rules (run on the node as root, e.g. in `kubectl debug node/NAME --profile=sysadmin`).
    #[arg(long)]
    pub local: bool,
    /// Plan against a saved `iptables-save` file instead of the host (dry run only).
    #[arg(long = "iptables-save", value_name = "FILE", conflicts_with = "apply")]
    pub iptables_save: Option<PathBuf>,
    /// Apply the plan (default: dry run).
    #[arg(long)]
    pub apply: bool,
    /// Rewrite every kube-proxy chain, as a kube-proxy full sync does.
    #[arg(long)]
    pub full: bool,
    /// Where to save the backup taken before applying [default on the node: /var/lib/kproxy/backups;
    /// for a remote node the backup is written on this machine, default
    /// $XDG_STATE_HOME/kproxy/backups, else ~/.local/state/kproxy/backups, else ./kproxy-backups].
    #[arg(long, value_name = "DIR")]
    pub backup_dir: Option<PathBuf>,
    /// Apply even when the inputs look wrong (empty state, mode mismatch, unreadable dump, old state).
    #[arg(long)]
    pub force: bool,
    /// Refuse state files older than this (e.g. 10m, 1h; 0 = no limit).
    #[arg(long, value_name = "DURATION", default_value = "0")]
    pub max_age: String,
    /// Which iptables userspace to use on this host (for a remote node, `auto` means the
    /// backend that holds kube-proxy's rules, read from the node's dumps).
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub backend: Backend,
    /// Operate on the rules of this network namespace (`ip netns exec NAME …`).
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,
    /// Seconds to wait for the xtables lock.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub wait: u64,
    /// Print the iptables-restore input of the plan.
    #[arg(long)]
    pub show_restore: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = RepairFormat::Text)]
    pub output: RepairFormat,
    /// API state and configuration.
    #[command(flatten)]
    pub state: StateArgs,
    /// Node facts, as for render.
    #[command(flatten)]
    pub facts: NodeFactArgs,
    /// Test only: make the last table's restore fail part-way (proves the rollback).
    #[arg(long, hide = true)]
    pub inject_fault: bool,
    /// IPVS mode (`mode: ipvs` in the configuration, or these offline dumps given).
    #[command(flatten)]
    pub ipvs: super::repair_ipvs::IpvsRepairArgs,
    /// How a remote node is reached (collector, kube-proxy pod selector, debug-pod image,
    /// kube-proxy ConfigMap, command timeout).
    #[command(flatten)]
    pub live: super::live::LiveArgs,
    /// The node's conntrack table (default with --local: this host's `conntrack -L`): its stale
    /// UDP/SCTP flows are deleted after the rules, by exact `conntrack -D` filters.
    #[command(flatten)]
    pub conntrack: super::conntrack::ConntrackArgs,
}

impl RepairArgs {
    /// `--backup-dir`, or the on-node default [`DEFAULT_BACKUP_DIR`] (local and IPVS repair).
    pub fn local_backup_dir(&self) -> PathBuf {
        self.backup_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_BACKUP_DIR))
    }
}

/// Runs `repair`. With `-o json`, stdout holds exactly one JSON document, also when the
/// repair fails (then `outcome` is `failed`, `rolled_back` or `rollback_failed`, see
/// `failure_doc`); human text goes to stderr.
pub fn run(args: RepairArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let json = args.output == RepairFormat::Json;
    let result = run_path(args, global);
    if let (true, Err(e)) = (json, &result) {
        super::common::write_stdout(&(serde_json::to_string_pretty(&failure_doc(e))? + "\n"))?;
    }
    result
}

/// Runs the path of `repair` the arguments select: IPVS, through the API, this host, or the
/// offline plan. Every `Ok` has printed the plan and its outcome; an `Err` printed nothing on
/// stdout.
fn run_path(args: RepairArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if super::repair_ipvs::selected(&args)? {
        return super::repair_ipvs::run(args, _global);
    }
    if !args.local && args.iptables_save.is_none() {
        if args.node_name.is_some() {
            return super::repair_remote::run(&args, _global);
        }
        bail!(
            "which node? name one to repair it through the API (`kubectl get nodes` lists them), \
             run `kubectl-kproxy repair --local` on the node as root, or plan offline with --iptables-save FILE"
        );
    }
    let mut host = local_iptables(&args, args.facts.ip_family == "6");
    let mut facts = args.facts.clone();
    if args.local && facts.nfacct.is_none() {
        // kube-proxy uses its nfacct counters only where they exist: probe, as it does at start-up.
        let present = host.nfacct_objects().unwrap_or_default();
        let ours: Vec<&str> = [
            crate::state::node::NFACCT_CT_STATE_INVALID,
            crate::state::node::NFACCT_LOCALHOST_NODEPORTS,
        ]
        .into_iter()
        .filter(|c| present.iter().any(|p| p == c))
        .collect();
        facts.nfacct = Some(if ours.is_empty() {
            "none".into()
        } else {
            ours.join(",")
        });
    }
    // The node's rules, when given: what the plan is made against, and what tells the release.
    let given = args.iptables_save.as_deref().map(read_input).transpose()?;
    host.ipv6 = facts.ip_family == "6";
    let release = choose_release(&args, None, || match &given {
        Some(text) => Ok(text.clone()),
        None => host
            .save(false)
            .context("reading the node's rules (iptables-save)"),
    })?;
    facts.kube_proxy_version = Some(release.version);
    let inputs = load_proxy_inputs(&args.state, &facts, args.node_name.as_deref())?;
    host.ipv6 = inputs.facts.family == crate::state::ip::IpFamily::V6;
    let (expected_text, guard) = expected_and_guard(&args, &inputs)?;
    let painter = Painter::for_stdout();

    if let (Some(path), Some(text)) = (&args.iptables_save, given) {
        let current = Ruleset::parse(&text, &ParseOptions::strict())
            .map_err(|e| e.in_source(path.display().to_string()))?;
        let expected = Ruleset::parse(&expected_text, &ParseOptions::strict())
            .context("parsing the render")?;
        let p = plan(&expected, &current, args.full);
        let refused = refusals(&guard, &current);
        let conntrack = super::conntrack::repair_step(&args, &inputs, &refused)?;
        let ending = Ending {
            refused: &refused,
            nothing_to_do: p.is_empty() && conntrack.as_ref().is_none_or(|c| c.is_empty()),
            clean: None,
            offline: true,
            backup: None,
            applied: String::new(),
            figures: serde_json::json!({ "restore_bytes": p.restore_input().len() }),
        };
        let doc = super::conntrack::add_to_doc(
            plan_doc(&args, &p, &refused, painter, &release)?,
            conntrack.as_ref(),
            painter,
        )?;
        return finish(&args, doc, &ending);
    }

    let (report, refused) = guarded_repair(
        &host,
        &args,
        &expected_text,
        &guard,
        &inputs.facts.node_name,
        args.local_backup_dir(),
    )?;
    // Stale conntrack entries are cleared after the rules are right, as kube-proxy does after
    // each sync.
    let conntrack = super::conntrack::repair_step(&args, &inputs, &refused)?;
    report_outcome(
        &args,
        &report,
        &refused,
        painter,
        &release,
        conntrack.as_ref(),
    )
}

/// The kube-proxy release whose rules `repair` writes: `--kube-proxy-version`, else the
/// kube-proxy pod's `image`, else the release that wrote the node's rules (`current` reads
/// them): a repair never rewrites a node's rules into another release's behind its kube-proxy's
/// back. How it was chosen is noted on stderr.
pub(super) fn choose_release(
    args: &RepairArgs,
    image: Option<&str>,
    current: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<ReleaseChoice> {
    let flag = args.facts.kube_proxy_version;
    let inference = if flag.is_some() {
        Inference::default()
    } else {
        crate::compare::version::infer([current()?.as_str()]).given_invalid_counter(
            super::common::says_counter(&args.facts, crate::state::node::NFACCT_CT_STATE_INVALID),
        )
    };
    let release = crate::compare::version::choose_release(flag, image, inference, "repairing");
    super::common::print_notes(&release.notes);
    Ok(release)
}

/// This host's iptables of one family, as `--backend`, `--netns` and `--wait` say.
pub(super) fn local_iptables(args: &RepairArgs, ipv6: bool) -> IptablesHost {
    IptablesHost {
        ipv6,
        backend: args.backend,
        netns: args.netns.clone(),
        wait: Duration::from_secs(args.wait),
    }
}

/// The repair transaction on `host` (this host or a node reached through the API) with the
/// options `args` give, vetoed by the guard's refusals unless `--force`; the backup goes to
/// `backup_dir`.
pub(super) fn guarded_repair(
    host: &impl RulesHost,
    args: &RepairArgs,
    expected_text: &str,
    guard: &GuardInput<'_>,
    node: &str,
    backup_dir: PathBuf,
) -> Result<(RepairReport, Vec<String>), RepairError> {
    let opts = RepairOptions {
        full: args.full,
        apply: args.apply,
        backup_dir,
        node: node.to_string(),
        inject_fault: args.inject_fault,
    };
    repair(host, expected_text, &opts, |current, _| {
        unless_forced(args, || refusals(guard, current))
    })
}

/// The refusals that veto applying: none with `--force`.
pub(super) fn unless_forced(
    args: &RepairArgs,
    refusals: impl FnOnce() -> Vec<String>,
) -> Vec<String> {
    if args.force { Vec::new() } else { refusals() }
}

/// The rules kube-proxy would install (a render with base jumps, as `iptables-restore` text)
/// and the guard's view of the inputs (`--max-age` parsed; the age of `--state` files).
pub(super) fn expected_and_guard<'a>(
    args: &RepairArgs,
    inputs: &'a ProxyInputs,
) -> anyhow::Result<(String, GuardInput<'a>)> {
    let rendered = render(
        &inputs.state,
        &inputs.config,
        &inputs.facts,
        RenderOptions {
            with_base_jumps: true,
        },
    );
    let sp = crate::proxier::iptables::expected_service_ports(
        &inputs.state,
        &inputs.config,
        &inputs.facts,
    );
    let guard = GuardInput {
        expected_service_ports: sp.ports.len(),
        expected_endpoints: sp.total_endpoints,
        facts: input_facts(args, inputs)?,
    };
    Ok((rendered.to_restore_text(), guard))
}

/// The guard's facts of the inputs: the configured mode, the age of `--state` files and
/// `--max-age` (parsed).
pub(super) fn input_facts<'a>(
    args: &RepairArgs,
    inputs: &'a ProxyInputs,
) -> anyhow::Result<InputFacts<'a>> {
    Ok(InputFacts {
        configured_mode: &inputs.config.mode,
        state_age: state_age(&args.state.state),
        max_age: crate::kube_client::parse_duration(&args.max_age).with_context(|| {
            format!(
                "bad --max-age {:?}: expected e.g. 30s, 10m, 2h",
                args.max_age
            )
        })?,
    })
}

/// Prints the plan and what happened, and returns the exit outcome: 0 nothing to do or
/// applied, 1 dry run with drift, 2 refused. With the conntrack step of the repair, when there
/// was one: its deletions count as something to do, and flows still left after them as drift.
pub(super) fn report_outcome(
    args: &RepairArgs,
    report: &RepairReport,
    refused: &[String],
    painter: Painter,
    release: &ReleaseChoice,
    conntrack: Option<&crate::apply::conntrack::ConntrackRepair>,
) -> anyhow::Result<Outcome> {
    let ending = Ending {
        refused,
        nothing_to_do: report.plan.is_empty() && conntrack.is_none_or(|c| c.is_empty()),
        clean: Some("nothing to do: the node's kube-proxy rules already match"),
        offline: false,
        backup: report.backup.as_deref(),
        applied: if report.plan.is_empty() {
            "rules: nothing to change".to_string()
        } else {
            format!(
                "applied and verified: {} bytes of restore input; restore {:.1} ms, read-back and verify {:.1} ms",
                report.restore_bytes,
                report.restore_time.as_secs_f64() * 1000.0,
                report.verify_time.as_secs_f64() * 1000.0
            )
        },
        figures: serde_json::json!({
            "restore_bytes": report.restore_bytes,
            "restore_ms": millis(report.restore_time),
            "verify_ms": millis(report.verify_time),
        }),
    };
    let doc = super::conntrack::add_to_doc(
        plan_doc(args, &report.plan, refused, painter, release)?,
        conntrack,
        painter,
    )?;
    let outcome = finish(args, doc, &ending)?;
    Ok(match conntrack {
        Some(c) if c.remaining() > 0 && outcome == Outcome::Clean => Outcome::Drift,
        _ => outcome,
    })
}

/// A duration in milliseconds, for JSON output.
pub(super) fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What a repair came to, for the status lines after its plan (text) or the outcome fields
/// of its JSON document.
pub(super) struct Ending<'a> {
    /// The guard's refusals.
    pub refused: &'a [String],
    /// The plan was empty.
    pub nothing_to_do: bool,
    /// The line saying so (`None`: no line).
    pub clean: Option<&'a str>,
    /// A plan against saved dumps: nothing could be applied, so no dry-run line.
    pub offline: bool,
    /// The backup taken before applying.
    pub backup: Option<&'a Path>,
    /// The line reporting the applied and verified plan.
    pub applied: String,
    /// The figures of the repair (a JSON object: sizes, timings), added to the JSON document.
    pub figures: serde_json::Value,
}

/// How a repair that ran to its end came out: the `outcome` field of `-o json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    /// The node (or the dumps) already match.
    NothingToDo,
    /// A plan was printed and nothing changed.
    DryRun,
    /// `--apply` was vetoed by the guard.
    Refused,
    /// The plan was applied and verified.
    Applied,
}

impl Status {
    fn of(args: &RepairArgs, ending: &Ending<'_>) -> Status {
        if !ending.refused.is_empty() && args.apply {
            Status::Refused
        } else if ending.nothing_to_do {
            Status::NothingToDo
        } else if !args.apply {
            Status::DryRun
        } else {
            Status::Applied
        }
    }

    fn name(self) -> &'static str {
        match self {
            Status::NothingToDo => "nothing_to_do",
            Status::DryRun => "dry_run",
            Status::Refused => "refused",
            Status::Applied => "applied",
        }
    }

    /// The exit outcome: 0 nothing to do or applied, 1 dry run with drift, 2 refused.
    fn exit(self) -> Outcome {
        match self {
            Status::NothingToDo | Status::Applied => Outcome::Clean,
            Status::DryRun => Outcome::Drift,
            Status::Refused => Outcome::Error,
        }
    }
}

/// A plan ready to print: text (the status lines follow it) or the JSON object the outcome's
/// fields are added to.
pub(super) enum PlanDoc {
    /// The plan as text.
    Text(String),
    /// The plan's JSON fields.
    Json(serde_json::Map<String, serde_json::Value>),
}

/// Prints the plan `doc` and what the repair came to — the status lines after a text plan, or
/// the outcome fields in the one JSON document — and returns the exit outcome: 0 nothing to do
/// or applied, 1 dry run with drift, 2 refused.
pub(super) fn finish(
    args: &RepairArgs,
    doc: PlanDoc,
    ending: &Ending<'_>,
) -> anyhow::Result<Outcome> {
    use serde_json::Value;
    let status = Status::of(args, ending);
    match doc {
        PlanDoc::Text(mut s) => {
            match status {
                Status::Refused => {}
                Status::NothingToDo => {
                    if let Some(line) = ending.clean {
                        let _ = writeln!(s, "{line}");
                    }
                }
                Status::DryRun => {
                    if !ending.offline {
                        let _ = writeln!(
                            s,
                            "dry run: nothing changed; re-run with --apply to install this plan"
                        );
                    }
                }
                Status::Applied => {
                    if let Some(b) = ending.backup {
                        let _ = writeln!(s, "backup: {}", b.display());
                    }
                    let _ = writeln!(s, "{}", ending.applied);
                }
            }
            super::common::write_stdout(&s)?;
        }
        PlanDoc::Json(mut m) => {
            m.insert("outcome".into(), status.name().into());
            m.insert("applied".into(), (status == Status::Applied).into());
            m.insert(
                "backup".into(),
                ending
                    .backup
                    .map_or(Value::Null, |b| b.display().to_string().into()),
            );
            if let Value::Object(figures) = &ending.figures {
                m.extend(figures.clone());
            }
            super::common::write_stdout(
                &(serde_json::to_string_pretty(&Value::Object(m))? + "\n"),
            )?;
        }
    }
    if status == Status::Refused {
        eprintln!("error: refusing to apply (use --force to override)");
    }
    Ok(status.exit())
}

/// The JSON document of a repair that failed: `outcome` is `rolled_back` (a change failed or
/// did not verify, and the backup was restored), `rollback_failed` (restoring it failed too:
/// `rollback_error` says why) or `failed` (nothing was changed); `backup` is the backup when
/// one was taken, `error` the whole error message.
pub(super) fn failure_doc(e: &anyhow::Error) -> serde_json::Value {
    use crate::apply::ipvs::repair::IpvsRepairError;
    let changed = match (
        e.downcast_ref::<RepairError>(),
        e.downcast_ref::<IpvsRepairError>(),
    ) {
        (
            Some(
                RepairError::Apply {
                    backup, rollback, ..
                }
                | RepairError::Verify {
                    backup, rollback, ..
                },
            ),
            _,
        )
        | (
            _,
            Some(
                IpvsRepairError::Apply {
                    backup, rollback, ..
                }
                | IpvsRepairError::Verify {
                    backup, rollback, ..
                },
            ),
        ) => Some((backup, rollback)),
        _ => None,
    };
    let outcome = match changed {
        None => "failed",
        Some((_, None)) => "rolled_back",
        Some((_, Some(_))) => "rollback_failed",
    };
    serde_json::json!({
        "outcome": outcome,
        "applied": false,
        "backup": changed.map(|(b, _)| b.display().to_string()),
        "rollback_error": changed.and_then(|(_, r)| r.clone()),
        "error": format!("{e:#}"),
    })
}

/// The plan as `-o` asks: text, or the JSON fields `plan`, `refusals` and `restore_input`.
fn plan_doc(
    args: &RepairArgs,
    p: &Plan,
    refused: &[String],
    painter: Painter,
    release: &ReleaseChoice,
) -> anyhow::Result<PlanDoc> {
    if args.output == RepairFormat::Json {
        let mut doc = serde_json::Map::new();
        doc.insert("plan".into(), serde_json::to_value(p)?);
        doc.insert(
            "kube_proxy_version".into(),
            release.version.to_string().into(),
        );
        doc.insert(
            "kube_proxy_version_from".into(),
            release.source_word().into(),
        );
        doc.insert("refusals".into(), refused.into());
        doc.insert("restore_input".into(), p.restore_input().into());
        return Ok(PlanDoc::Json(doc));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "plan: {} to create, {} to rewrite, {} to delete, {} built-in chain(s) to get jumps{}",
        p.count(ChainAction::Create),
        p.count(ChainAction::Rewrite),
        p.count(ChainAction::Delete),
        p.count(ChainAction::InsertJumps),
        if p.full { " (full rewrite)" } else { "" }
    );
    let _ = writeln!(
        s,
        "rules of kube-proxy {} ({})",
        release.version,
        release.source_text()
    );
    write_chain_changes(&mut s, p, &ChainListing::IPTABLES, painter);
    let input = p.restore_input();
    if args.show_restore {
        let _ = writeln!(s, "--- iptables-restore --noflush input ---\n{input}---");
    } else if !input.is_empty() {
        let _ = writeln!(
            s,
            "restore input: {} bytes (--show-restore prints it)",
            input.len()
        );
    }
    write_refusals(&mut s, refused, painter);
    Ok(PlanDoc::Text(s))
}

/// How [`write_chain_changes`] lays out a plan's chain changes.
pub(super) struct ChainListing {
    /// Each table's heading before its name (`table`, `iptables table`).
    pub heading: &'static str,
    /// The width the action word is padded to.
    pub verb_width: usize,
    /// Colour the action word.
    pub paint_verbs: bool,
    /// Print each change's note.
    pub notes: bool,
}

impl ChainListing {
    /// The layout of an iptables-mode plan.
    pub const IPTABLES: ChainListing = ChainListing {
        heading: "table",
        verb_width: 8,
        paint_verbs: true,
        notes: true,
    };
}

/// Writes the chain changes of `p`, table by table, with the diff of each kept or rewritten chain.
pub(super) fn write_chain_changes(
    s: &mut String,
    p: &Plan,
    listing: &ChainListing,
    painter: Painter,
) {
    for t in &p.tables {
        if t.changes.is_empty() {
            continue;
        }
        let _ = writeln!(s, "{} {}:", listing.heading, t.table);
        for c in &t.changes {
            let (word, role) = match c.action {
                ChainAction::Create => ("create", Role::Ok),
                ChainAction::Rewrite => ("rewrite", Role::Warn),
                ChainAction::Delete => ("delete", Role::Error),
                ChainAction::KeepReferenced => ("keep", Role::Dim),
                ChainAction::InsertJumps => ("insert", Role::Ok),
            };
            let word = format!("{word:<width$}", width = listing.verb_width);
            let verb = if listing.paint_verbs {
                painter.paint(role, &word)
            } else {
                word
            };
            let _ = writeln!(
                s,
                "  {verb} {} ({} → {} rules)",
                c.chain, c.rules_before, c.rules_after
            );
            if let (true, Some(n)) = (listing.notes, &c.note) {
                let _ = writeln!(s, "           {n}");
            }
            if c.action != ChainAction::Delete {
                for r in &c.removed {
                    let _ = writeln!(s, "      {}", painter.paint(Role::Error, &format!("- {r}")));
                }
                for r in &c.added {
                    let _ = writeln!(s, "      {}", painter.paint(Role::Ok, &format!("+ {r}")));
                }
            }
        }
    }
}

/// Writes one `refusal: …` line per refusal.
pub(super) fn write_refusals(s: &mut String, refused: &[String], painter: Painter) {
    for r in refused {
        let _ = writeln!(s, "{}: {r}", painter.paint(Role::Error, "refusal"));
    }
}

/// Age of the newest state file (modification time), if the files exist.
fn state_age(files: &[PathBuf]) -> Option<Duration> {
    files
        .iter()
        .filter(|p| p.as_os_str() != "-")
        .filter_map(|p| std::fs::metadata(p).ok()?.modified().ok())
        .max()
        .and_then(|m| m.elapsed().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::host::HostError;

    fn apply_error(rollback: Option<&str>) -> anyhow::Error {
        anyhow::Error::from(RepairError::Apply {
            table: "nat".into(),
            source: Box::new(HostError::Failed {
                program: "iptables-restore".into(),
                code: 2,
                stderr: "bad rule".into(),
            }),
            backup: PathBuf::from("/b/node-ipv4-1.rules"),
            rollback: rollback.map(str::to_string),
        })
        .context("repairing node n1")
    }

    #[test]
    fn failure_documents_say_whether_the_node_was_restored() {
        let doc = failure_doc(&apply_error(None));
        assert_eq!(doc["outcome"], "rolled_back");
        assert_eq!(doc["backup"], "/b/node-ipv4-1.rules");
        assert_eq!(doc["rollback_error"], serde_json::Value::Null);
        let error = doc["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("repairing node n1: applying table nat failed")
                && error.ends_with("bad rule"),
            "{error}"
        );
        let doc = failure_doc(&apply_error(Some("lock busy")));
        assert_eq!(doc["outcome"], "rollback_failed");
        assert_eq!(doc["rollback_error"], "lock busy");
        let doc = failure_doc(&anyhow::anyhow!("no such state file"));
        assert_eq!(doc["outcome"], "failed");
        assert_eq!(doc["backup"], serde_json::Value::Null);
        assert_eq!(doc["applied"], false);
    }
}
