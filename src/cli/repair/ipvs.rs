//! `repair` on IPVS-mode nodes (configured `mode: ipvs`, or `--ipvsadm-save` given): plan the
//! `ipvsadm` commands, `ipset restore -exist` input, `kube-ipvs0` addresses and IPVS-mode iptables
//! chains that make the node match kube-proxy's IPVS proxier, and with `--apply` run them (backup
//! first, read back and verify, roll back on failure). The logic is in `apply::ipvs`.

use super::report::{
    ChainListing, Ending, PlanDoc, finish, millis, write_chain_changes, write_refusals,
};
use super::{RepairArgs, RepairFormat, input_facts, local_iptables};
use crate::apply::guard::unless_forced;
use crate::apply::ipvs::changes::{Ipvs0Change, IpvsChange};
use crate::apply::ipvs::guard::{IpvsGuardInput, refusals};
use crate::apply::ipvs::host::IpvsTools;
use crate::apply::ipvs::plan::IpvsPlan;
use crate::apply::ipvs::repair::{IpvsRepairOptions, IpvsTarget, repair};
use crate::apply::ipvs::state::{Ipvs0Text, IpvsState};
use crate::apply::transaction::Rotation;
use crate::cli::common::{load_proxy_inputs, read_input};
use crate::exit::Outcome;
use crate::model::Ruleset;
use crate::output::color::{Painter, Role};
use crate::proxier::ipvs::{self as px, IpvsNode, IpvsOptions};
use anyhow::{Context, bail};
use clap::Args;
use kproxy_parsers::iptables::ParseOptions;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Offline inputs of an IPVS-mode repair plan.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "IPVS mode (offline plan)")]
pub struct IpvsRepairArgs {
    /// IPVS mode: plan against a saved `ipvsadm-save -n` (or `ipvsadm -Ln`) file instead of the
    /// host (dry run only; with --ipset-save and --iptables-save).
    #[arg(long = "ipvsadm-save", value_name = "FILE", conflicts_with = "apply")]
    pub ipvsadm_save: Option<PathBuf>,
    /// IPVS mode: the saved `ipset save` output for the offline plan.
    #[arg(
        hide_short_help = true,
        long = "ipset-save",
        value_name = "FILE",
        requires = "ipvsadm_save"
    )]
    pub ipset_save: Option<PathBuf>,
    /// IPVS mode: saved `ip -o addr show dev kube-ipvs0` output for the offline plan.
    #[arg(
        hide_short_help = true,
        long = "kube-ipvs0",
        value_name = "FILE",
        requires = "ipvsadm_save"
    )]
    pub kube_ipvs0: Option<PathBuf>,
}

/// Runs `repair` for an IPVS-mode node.
pub(super) fn run(args: RepairArgs) -> anyhow::Result<Outcome> {
    let offline = args.ipvs.ipvsadm_save.is_some();
    if !args.local && !offline {
        bail!(
            "IPVS-mode repair works on the node itself: run `kubectl-kproxy repair --local` on the node as root \
             (or plan offline with --ipvsadm-save FILE --ipset-save FILE --iptables-save FILE)"
        );
    }
    if args.full {
        bail!(
            "--full (rewrite every chain, as a kube-proxy full sync) is for iptables mode; it is not supported for IPVS nodes"
        );
    }
    if offline && args.iptables_save.is_none() {
        bail!("the offline IPVS plan needs the node's rules too: --iptables-save FILE");
    }
    let inputs = load_proxy_inputs(&args.state, &args.facts, args.node_name.as_deref())?;
    let family = inputs.facts.family;
    // A Service whose object (or one of whose slices) is invalid is not rendered: what the
    // node holds of it is kept as it is (`IpvsTarget::left_out`).
    let left_out = crate::compare::left_out::services(&inputs.state);
    let expected = px::render(
        &crate::compare::left_out::judged_state(&inputs.state, &left_out),
        &inputs.config,
        &IpvsNode::from_facts(&inputs.facts),
        family,
        &IpvsOptions {
            random_fully: inputs.facts.random_fully,
            mark: args.facts.masquerade_mark.clone(),
        },
    );
    for w in &expected.warnings {
        crate::cli::common::warn(w);
    }
    let guard = IpvsGuardInput {
        expected_virtual_servers: expected.virtual_servers.len(),
        expected_real_servers: expected
            .virtual_servers
            .iter()
            .map(|v| v.real_servers.len())
            .sum(),
        facts: input_facts(&args, &inputs)?,
    };
    let mut target = IpvsTarget::new(expected, &inputs.facts.node_ips);
    target.left_out = left_out;
    let painter = Painter::for_stdout();

    if offline {
        let (current, ipt_text) = read_offline(&args)?;
        let rules = Ruleset::parse(&ipt_text, &ParseOptions::strict()).map_err(|e| {
            e.in_source(
                args.iptables_save
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            )
        })?;
        let plan = target
            .plan(&current, &ipt_text, &rules)
            .context("parsing the rendered IPVS-mode iptables rules")?;
        let mut refused = refusals(&guard, &current, &target.ownership(&current), &rules);
        refused.extend(crate::apply::allow::check_ipvs_plan(
            &plan,
            &target.state,
            &target.ownership(&current),
        ));
        let ending = Ending {
            refused: &refused,
            nothing_to_do: plan.is_empty(),
            clean: Some("nothing to do: the dumps already match kube-proxy's IPVS state"),
            offline: true,
            backup: None,
            rotation: &Rotation::default(),
            applied: String::new(),
            figures: serde_json::json!({}),
        };
        return finish(
            &args,
            plan_doc(&args, &plan, &refused, family, painter)?,
            &ending,
        );
    }

    let tools = IpvsTools {
        netns: args.netns.clone(),
    };
    let ipt = local_iptables(&args, family == crate::state::ip::IpFamily::V6);
    let opts = IpvsRepairOptions {
        apply: args.apply,
        backup_dir: args.local_backup_dir(),
        keep_backups: args.keep_backups,
        node: inputs.facts.node_name.clone(),
        rollback: args.rollback_policy(),
        inject_fault: args.inject_fault,
    };
    let (report, refused) = repair(&tools, &ipt, &target, &opts, |current, rules, _| {
        unless_forced(args.force, || {
            refusals(&guard, current, &target.ownership(current), rules)
        })
    })?;
    let ending = Ending {
        refused: &refused,
        nothing_to_do: report.plan.is_empty(),
        clean: Some("nothing to do: the node's IPVS state and kube-proxy rules already match"),
        offline: false,
        backup: report.backup.as_deref(),
        rotation: &report.rotation,
        applied: format!(
            "applied and verified: {} command(s) in {:.1} ms; read-back and verify {:.1} ms",
            report.commands,
            report.apply_time.as_secs_f64() * 1000.0,
            report.verify_time.as_secs_f64() * 1000.0
        ),
        figures: serde_json::json!({
            "commands_run": report.commands,
            "apply_ms": millis(report.apply_time),
            "verify_ms": millis(report.verify_time),
        }),
    };
    finish(
        &args,
        plan_doc(&args, &report.plan, &refused, family, painter)?,
        &ending,
    )
}

/// Reads the offline dumps: the IPVS state and the iptables-save text.
fn read_offline(args: &RepairArgs) -> anyhow::Result<(IpvsState, String)> {
    let Some(ipvsadm_path) = &args.ipvs.ipvsadm_save else {
        bail!("--ipvsadm-save FILE is needed for the offline plan");
    };
    let ipvsadm = read_input(ipvsadm_path)?;
    let sets = args
        .ipvs
        .ipset_save
        .as_ref()
        .map(|p| read_input(p))
        .transpose()?;
    let addrs = args
        .ipvs
        .kube_ipvs0
        .as_ref()
        .map(|p| read_input(p))
        .transpose()?;
    let ipvs0 = match &addrs {
        Some(t) => Ipvs0Text::Addr(t),
        None => Ipvs0Text::Unknown,
    };
    let state = IpvsState::from_dumps(&ipvsadm, sets.as_deref(), ipvs0).map_err(|e| {
        let name = if e.line_text.starts_with("create ") || e.line_text.starts_with("add ") {
            args.ipvs.ipset_save.as_ref()
        } else {
            Some(ipvsadm_path)
        };
        e.in_source(name.map(|p| p.display().to_string()).unwrap_or_default())
    })?;
    let ipt = match &args.iptables_save {
        Some(p) => read_input(p)?,
        None => String::new(),
    };
    Ok((state, ipt))
}

/// The commands the plan runs, in order, as shell-quoted text (for display and JSON).
pub fn commands(p: &IpvsPlan) -> Vec<String> {
    let mut v = Vec::new();
    if !p.sets.is_empty() {
        v.push(format!("ipset restore -exist <<< {} line(s)", p.sets.len()));
    }
    v.extend(p.ipvs0_add.iter().map(Ipvs0Change::command));
    v.extend(p.ipvs.iter().map(IpvsChange::command));
    for t in p.iptables.tables.iter().filter(|t| !t.is_empty()) {
        v.push(format!("iptables-restore --noflush <<< table {}", t.table));
    }
    if !p.destroy_sets.is_empty() {
        v.push(format!(
            "ipset restore -exist <<< {}",
            p.destroy_input().trim_end().replace('\n', "; ")
        ));
    }
    v.extend(p.ipvs0_del.iter().map(Ipvs0Change::command));
    v
}

/// The plan as `-o` asks: text, or the JSON fields `mode`, `plan`, `commands`,
/// `ipset_restore_input`, `iptables_restore_input` and `refusals`.
fn plan_doc(
    args: &RepairArgs,
    p: &IpvsPlan,
    refused: &[String],
    family: crate::state::ip::IpFamily,
    painter: Painter,
) -> anyhow::Result<PlanDoc> {
    if args.output == RepairFormat::Json {
        let mut doc = serde_json::Map::new();
        doc.insert("mode".into(), "ipvs".into());
        doc.insert("plan".into(), serde_json::to_value(p)?);
        doc.insert("commands".into(), commands(p).into());
        doc.insert("ipset_restore_input".into(), p.ipset_input().into());
        doc.insert(
            "iptables_restore_input".into(),
            p.iptables.restore_input().into(),
        );
        doc.insert("refusals".into(), refused.into());
        return Ok(PlanDoc::Json(doc));
    }
    let mut s = String::new();
    let _ = writeln!(s, "plan (IPVS mode, {family}): {}", p.summary());
    section(
        &mut s,
        "ipset restore -exist:",
        p.sets.iter().map(|c| c.line()),
    );
    section(
        &mut s,
        "kube-ipvs0:",
        p.ipvs0_add.iter().map(|c| c.command()),
    );
    section(
        &mut s,
        "ipvsadm:",
        p.ipvs.iter().map(|c| {
            let why = painter.paint(Role::Dim, &format!("# {}", c.describe()));
            format!("{}\n      {why}", c.command())
        }),
    );
    write_chain_changes(&mut s, &p.iptables, &IPVS_CHAIN_LISTING, painter);
    if args.show_restore && !p.iptables.is_empty() {
        let _ = writeln!(
            s,
            "--- iptables-restore --noflush input ---\n{}---",
            p.iptables.restore_input()
        );
    }
    section(
        &mut s,
        "ipset restore -exist (after iptables):",
        p.destroy_sets.iter().map(|c| c.line()),
    );
    section(
        &mut s,
        "kube-ipvs0 (after ipvsadm):",
        p.ipvs0_del.iter().map(|c| c.command()),
    );
    for k in &p.kept {
        let _ = writeln!(s, "{} {k}", painter.paint(Role::Dim, "keep:"));
    }
    write_refusals(&mut s, refused, painter);
    Ok(PlanDoc::Text(s))
}

/// Writes `heading` and the indented `lines` under it, nothing when there are no lines.
fn section(s: &mut String, heading: &str, lines: impl Iterator<Item = String>) {
    let mut lines = lines.peekable();
    if lines.peek().is_some() {
        let _ = writeln!(s, "{heading}");
        for l in lines {
            let _ = writeln!(s, "  {l}");
        }
    }
}

/// The layout of the plan's iptables part (unpainted action words, no notes).
const IPVS_CHAIN_LISTING: ChainListing = ChainListing {
    heading: "iptables table",
    verb_width: 7,
    paint_verbs: false,
    notes: false,
};
