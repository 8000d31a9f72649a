//! `repair` on IPVS-mode nodes (configured `mode: ipvs`, or `--ipvsadm-save` given): plan the
//! `ipvsadm` commands, `ipset restore -exist` input, `kube-ipvs0` addresses and IPVS-mode iptables
//! chains that make the node match kube-proxy's IPVS proxier, and with `--apply` run them (backup
//! first, read back and verify, roll back on failure). The logic is in `apply::ipvs`.

use super::common::{GlobalArgs, load_config, load_proxy_inputs, read_input};
use super::repair::{RepairArgs, RepairFormat};
use crate::apply::host::IptablesHost;
use crate::apply::ipvs::guard::{IpvsGuardInput, refusals};
use crate::apply::ipvs::host::IpvsTools;
use crate::apply::ipvs::plan::IpvsPlan;
use crate::apply::ipvs::repair::{IpvsRepairOptions, IpvsTarget, repair};
use crate::apply::ipvs::state::{Ipvs0Text, IpvsState};
use crate::apply::plan::ChainAction;
use crate::exit::Outcome;
use crate::model::Ruleset;
use crate::output::color::{Painter, Role};
use crate::proxier::ipvs::{self as px, IpvsNode, IpvsOptions};
use anyhow::{Context, bail};
use clap::Args;
use kproxy_parsers::iptables::ParseOptions;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

/// Offline inputs of an IPVS-mode repair plan.
#[derive(Debug, Clone, Default, Args)]
pub struct IpvsRepairArgs {
    /// IPVS mode: plan against a saved `ipvsadm-save -n` (or `ipvsadm -Ln`) file instead of the
    /// host (dry run only; with --ipset-save and --iptables-save).
    #[arg(long = "ipvsadm-save", value_name = "FILE", conflicts_with = "apply")]
    pub ipvsadm_save: Option<PathBuf>,
    /// IPVS mode: the saved `ipset save` output for the offline plan.
    #[arg(long = "ipset-save", value_name = "FILE", requires = "ipvsadm_save")]
    pub ipset_save: Option<PathBuf>,
    /// IPVS mode: saved `ip -o addr show dev kube-ipvs0` output for the offline plan.
    #[arg(long = "kube-ipvs0", value_name = "FILE", requires = "ipvsadm_save")]
    pub kube_ipvs0: Option<PathBuf>,
}

/// Whether `repair` should take the IPVS path: the offline IPVS dumps were given, or the
/// configuration says `mode: ipvs`.
pub fn selected(args: &RepairArgs) -> anyhow::Result<bool> {
    if args.ipvs.ipvsadm_save.is_some() {
        return Ok(true);
    }
    let (config, _) = load_config(args.state.config.as_deref())?;
    Ok(config.mode == "ipvs")
}

/// Runs `repair` for an IPVS-mode node.
pub fn run(args: RepairArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
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
    let expected = px::render(
        &inputs.state,
        &inputs.config,
        &IpvsNode::from_facts(&inputs.facts),
        family,
        &IpvsOptions {
            random_fully: inputs.facts.random_fully,
            mark: args.facts.masquerade_mark.clone(),
        },
    );
    for w in &expected.warnings {
        tracing::warn!("{w}");
    }
    let guard = IpvsGuardInput {
        expected_virtual_servers: expected.virtual_servers.len(),
        expected_real_servers: expected
            .virtual_servers
            .iter()
            .map(|v| v.real_servers.len())
            .sum(),
        configured_mode: &inputs.config.mode,
        state_age: state_age(&args.state.state),
        max_age: crate::kube_client::parse_duration(&args.max_age).with_context(|| {
            format!(
                "bad --max-age {:?}: expected e.g. 30s, 10m, 2h",
                args.max_age
            )
        })?,
    };
    let target = IpvsTarget::new(expected, &inputs.facts.node_ips);
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
            .plan(&current, &rules, &ipt_text)
            .context("parsing the rendered IPVS-mode iptables rules")?;
        let refused = refusals(&guard, &current, &target.ownership(&current), &rules);
        print_plan(&args, &plan, &refused, family, painter)?;
        if plan.is_empty() {
            say(
                &args,
                "nothing to do: the dumps already match kube-proxy's IPVS state",
            );
            return Ok(Outcome::Clean);
        }
        return Ok(Outcome::Drift);
    }

    let tools = IpvsTools {
        netns: args.netns.clone(),
    };
    let ipt = IptablesHost {
        ipv6: family == crate::state::ip::IpFamily::V6,
        backend: args.backend,
        netns: args.netns.clone(),
        wait: Duration::from_secs(args.wait),
    };
    let opts = IpvsRepairOptions {
        apply: args.apply,
        backup_dir: args.backup_dir.clone(),
        node: inputs.facts.node_name.clone(),
        inject_fault: args.inject_fault,
    };
    let force = args.force;
    let (report, refused) = repair(&tools, &ipt, &target, &opts, |current, rules, _| {
        if force {
            Vec::new()
        } else {
            refusals(&guard, current, &target.ownership(current), rules)
        }
    })?;
    print_plan(&args, &report.plan, &refused, family, painter)?;
    if !refused.is_empty() && args.apply {
        eprintln!("error: refusing to apply (use --force to override)");
        return Ok(Outcome::Error);
    }
    if report.plan.is_empty() {
        say(
            &args,
            "nothing to do: the node's IPVS state and kube-proxy rules already match",
        );
        return Ok(Outcome::Clean);
    }
    if !args.apply {
        say(
            &args,
            "dry run: nothing changed; re-run with --apply to install this plan",
        );
        return Ok(Outcome::Drift);
    }
    if let Some(b) = &report.backup {
        say(&args, &format!("backup: {}", b.display()));
    }
    say(
        &args,
        &format!(
            "applied and verified: {} command(s) in {:.1} ms; read-back and verify {:.1} ms",
            report.commands,
            report.apply_time.as_secs_f64() * 1000.0,
            report.verify_time.as_secs_f64() * 1000.0
        ),
    );
    Ok(Outcome::Clean)
}

/// Prints a status line after the plan (text output only: JSON stays one document).
fn say(args: &RepairArgs, line: &str) {
    if args.output == RepairFormat::Text {
        println!("{line}");
    }
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
    v.extend(
        p.ipvs0_add
            .iter()
            .map(|c| format!("ip {}", c.argv().join(" "))),
    );
    v.extend(
        p.ipvs
            .iter()
            .map(|c| format!("ipvsadm {}", c.argv().join(" "))),
    );
    for t in p.iptables.tables.iter().filter(|t| !t.is_empty()) {
        v.push(format!("iptables-restore --noflush <<< table {}", t.table));
    }
    if !p.destroy_sets.is_empty() {
        v.push(format!(
            "ipset restore -exist <<< {}",
            p.destroy_input().trim_end().replace('\n', "; ")
        ));
    }
    v.extend(
        p.ipvs0_del
            .iter()
            .map(|c| format!("ip {}", c.argv().join(" "))),
    );
    v
}

fn print_plan(
    args: &RepairArgs,
    p: &IpvsPlan,
    refused: &[String],
    family: crate::state::ip::IpFamily,
    painter: Painter,
) -> anyhow::Result<()> {
    if args.output == RepairFormat::Json {
        let doc = serde_json::json!({
            "mode": "ipvs",
            "plan": p,
            "commands": commands(p),
            "ipset_restore_input": p.ipset_input(),
            "iptables_restore_input": p.iptables.restore_input(),
            "refusals": refused,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
    }
    let mut s = String::new();
    let _ = writeln!(s, "plan (IPVS mode, {family}): {}", p.summary());
    if !p.sets.is_empty() {
        let _ = writeln!(s, "ipset restore -exist:");
        for c in &p.sets {
            let _ = writeln!(s, "  {}", c.line());
        }
    }
    if !p.ipvs0_add.is_empty() {
        let _ = writeln!(s, "kube-ipvs0:");
        for c in &p.ipvs0_add {
            let _ = writeln!(s, "  ip {}", c.argv().join(" "));
        }
    }
    if !p.ipvs.is_empty() {
        let _ = writeln!(s, "ipvsadm:");
        for c in &p.ipvs {
            let _ = writeln!(
                s,
                "  ipvsadm {}\n      {}",
                c.argv().join(" "),
                painter.paint(Role::Dim, &format!("# {}", c.describe()))
            );
        }
    }
    for t in &p.iptables.tables {
        if t.changes.is_empty() {
            continue;
        }
        let _ = writeln!(s, "iptables table {}:", t.table);
        for c in &t.changes {
            let verb = match c.action {
                ChainAction::Create => "create ",
                ChainAction::Rewrite => "rewrite",
                ChainAction::Delete => "delete ",
                ChainAction::KeepReferenced => "keep   ",
                ChainAction::InsertJumps => "insert ",
            };
            let _ = writeln!(
                s,
                "  {verb} {} ({} → {} rules)",
                c.chain, c.rules_before, c.rules_after
            );
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
    if args.show_restore && !p.iptables.is_empty() {
        let _ = writeln!(
            s,
            "--- iptables-restore --noflush input ---\n{}---",
            p.iptables.restore_input()
        );
    }
    if !p.destroy_sets.is_empty() {
        let _ = writeln!(s, "ipset restore -exist (after iptables):");
        for c in &p.destroy_sets {
            let _ = writeln!(s, "  {}", c.line());
        }
    }
    if !p.ipvs0_del.is_empty() {
        let _ = writeln!(s, "kube-ipvs0 (after ipvsadm):");
        for c in &p.ipvs0_del {
            let _ = writeln!(s, "  ip {}", c.argv().join(" "));
        }
    }
    for k in &p.kept {
        let _ = writeln!(s, "{} {k}", painter.paint(Role::Dim, "keep:"));
    }
    for r in refused {
        let _ = writeln!(s, "{}: {r}", painter.paint(Role::Error, "refusal"));
    }
    print!("{s}");
    Ok(())
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
