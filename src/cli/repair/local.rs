//! `repair --local` (this host's rules, run on the node as root) and the offline plan against a
//! saved `iptables-save` (`--iptables-save FILE`, dry run only).

use super::report::{
    ChainListing, Ending, PlanDoc, finish, millis, write_chain_changes, write_refusals,
};
use super::{RepairArgs, RepairFormat, choose_release, conntrack, input_facts, local_iptables};
use crate::apply::allow::{Proxier, check_plan};
use crate::apply::guard::refusals;
use crate::apply::iptables::host::RulesHost;
use crate::apply::iptables::plan::{ChainAction, Plan, plan};
use crate::apply::iptables::repair::{RepairReport, expected_and_guard, guarded_repair};
use crate::apply::transaction::Rotation;
use crate::cli::common::{load_proxy_inputs, read_input};
use crate::compare::iptables::scope::keep_left_out;
use crate::compare::version::ReleaseChoice;
use crate::exit::Outcome;
use crate::model::Ruleset;
use crate::output::color::Painter;
use anyhow::Context;
use kproxy_parsers::iptables::ParseOptions;
use std::fmt::Write as _;

/// Runs the repair of this host's rules, or the offline plan (see the module docs).
pub(super) fn run(args: RepairArgs) -> anyhow::Result<Outcome> {
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
    let (expected_text, guard) = expected_and_guard(&inputs, input_facts(&args, &inputs)?);
    crate::cli::common::print_warnings(&inputs.state.invalid_warnings());
    let painter = Painter::for_stdout();

    if let (Some(path), Some(text)) = (&args.iptables_save, given) {
        let current = Ruleset::parse(&text, &ParseOptions::strict())
            .map_err(|e| e.in_source(path.display().to_string()))?;
        let left_out = crate::compare::left_out::services(&inputs.state);
        let (expected_text, left_alone) = keep_left_out(&expected_text, &text, &left_out);
        let expected = Ruleset::parse(&expected_text, &ParseOptions::strict())
            .context("parsing the render")?;
        let mut p = plan(&expected, &current, args.full);
        p.left_alone = left_alone;
        let mut refused = refusals(&guard, &current);
        refused.extend(check_plan(&p, Proxier::Iptables));
        let conntrack = conntrack::repair_step(&args, &inputs, &refused)?;
        let ending = Ending {
            refused: &refused,
            nothing_to_do: p.is_empty() && conntrack.as_ref().is_none_or(|c| c.is_empty()),
            clean: None,
            offline: true,
            backup: None,
            rotation: &Rotation::default(),
            applied: String::new(),
            figures: serde_json::json!({ "restore_bytes": p.restore_input().len() }),
        };
        let doc = conntrack::add_to_doc(
            plan_doc(&args, &p, &refused, painter, &release)?,
            conntrack.as_ref(),
            painter,
        )?;
        return finish(&args, doc, &ending);
    }

    let opts = args.repair_options(
        &inputs.facts.node_name,
        args.local_backup_dir(),
        &inputs.state,
    );
    let (report, refused) = guarded_repair(&host, &expected_text, &guard, &opts, args.force)?;
    // Stale conntrack entries are cleared after the rules are right, as kube-proxy does after
    // each sync.
    let conntrack = conntrack::repair_step(&args, &inputs, &refused)?;
    report_outcome(
        &args,
        &report,
        &refused,
        painter,
        &release,
        conntrack.as_ref(),
    )
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
        rotation: &report.rotation,
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
