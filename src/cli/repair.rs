//! `repair` command: compute the expected rules, diff them with the node's, print the plan, and
//! with `--apply` install it atomically (backup, one `iptables-restore --noflush` per table,
//! read-back verification, rollback on failure).

use super::common::{
    GlobalArgs, NodeFactArgs, ProxyInputs, StateArgs, load_proxy_inputs, read_input,
};
use crate::apply::backup::DEFAULT_BACKUP_DIR;
use crate::apply::guard::{GuardInput, refusals};
use crate::apply::host::{Backend, IptablesHost};
use crate::apply::plan::{ChainAction, Plan, plan};
use crate::apply::repair::{RepairOptions, RepairReport, repair};
use crate::exit::Outcome;
use crate::model::Ruleset;
use crate::output::color::{Painter, Role};
use crate::proxier::iptables::{RenderOptions, render};
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use kproxy_parsers::iptables::ParseOptions;
use std::fmt::Write as _;
use std::path::PathBuf;
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
    /// Where to save the backup taken before applying. For a remote node it is written on this
    /// machine, and the default below is replaced by $XDG_STATE_HOME/kproxy/backups (else
    /// ~/.local/state/kproxy/backups, else ./kproxy-backups).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_BACKUP_DIR)]
    pub backup_dir: PathBuf,
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
}

/// Runs `repair`.
pub fn run(args: RepairArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
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
    let mut host = IptablesHost {
        ipv6: args.facts.ip_family == "6",
        backend: args.backend,
        netns: args.netns.clone(),
        wait: Duration::from_secs(args.wait),
    };
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
    let inputs = load_proxy_inputs(&args.state, &facts, args.node_name.as_deref())?;
    host.ipv6 = inputs.facts.family == crate::state::ip::IpFamily::V6;
    let (expected_text, guard) = expected_and_guard(&args, &inputs)?;
    let painter = Painter::for_stdout();

    if let Some(path) = &args.iptables_save {
        let text = read_input(path)?;
        let current = Ruleset::parse(&text, &ParseOptions::strict())
            .map_err(|e| e.in_source(path.display().to_string()))?;
        let expected = Ruleset::parse(&expected_text, &ParseOptions::strict())
            .context("parsing the render")?;
        let p = plan(&expected, &current, args.full);
        let refused = refusals(&guard, &current);
        print_plan(&args, &p, &refused, painter)?;
        return Ok(if p.is_empty() {
            Outcome::Clean
        } else {
            Outcome::Drift
        });
    }

    let opts = RepairOptions {
        full: args.full,
        apply: args.apply,
        backup_dir: args.backup_dir.clone(),
        node: inputs.facts.node_name.clone(),
        inject_fault: args.inject_fault,
    };
    let force = args.force;
    let (report, refused) = repair(&host, &expected_text, &opts, |current, _| {
        if force {
            Vec::new()
        } else {
            refusals(&guard, current)
        }
    })?;
    report_outcome(&args, &report, &refused, painter)
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
        configured_mode: &inputs.config.mode,
        state_age: state_age(&args.state.state),
        max_age: crate::kube_client::parse_duration(&args.max_age).with_context(|| {
            format!(
                "bad --max-age {:?}: expected e.g. 30s, 10m, 2h",
                args.max_age
            )
        })?,
    };
    Ok((rendered.to_restore_text(), guard))
}

/// Prints the plan and what happened, and returns the exit outcome: 0 nothing to do or
/// applied, 1 dry run with drift, 2 refused.
pub(super) fn report_outcome(
    args: &RepairArgs,
    report: &RepairReport,
    refused: &[String],
    painter: Painter,
) -> anyhow::Result<Outcome> {
    print_plan(args, &report.plan, refused, painter)?;
    if !refused.is_empty() && args.apply {
        eprintln!("error: refusing to apply (use --force to override)");
        return Ok(Outcome::Error);
    }
    if report.plan.is_empty() {
        println!("nothing to do: the node's kube-proxy rules already match");
        return Ok(Outcome::Clean);
    }
    if !args.apply {
        println!("dry run: nothing changed; re-run with --apply to install this plan");
        return Ok(Outcome::Drift);
    }
    if let Some(b) = &report.backup {
        println!("backup: {}", b.display());
    }
    println!(
        "applied and verified: {} bytes of restore input; restore {:.1} ms, read-back and verify {:.1} ms",
        report.restore_bytes,
        report.restore_time.as_secs_f64() * 1000.0,
        report.verify_time.as_secs_f64() * 1000.0
    );
    Ok(Outcome::Clean)
}

fn print_plan(
    args: &RepairArgs,
    p: &Plan,
    refused: &[String],
    painter: Painter,
) -> anyhow::Result<()> {
    if args.output == RepairFormat::Json {
        let doc = serde_json::json!({
            "plan": p,
            "refusals": refused,
            "restore_input": p.restore_input(),
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(());
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
    for t in &p.tables {
        if t.changes.is_empty() {
            continue;
        }
        let _ = writeln!(s, "table {}:", t.table);
        for c in &t.changes {
            let verb = match c.action {
                ChainAction::Create => painter.paint(Role::Ok, "create  "),
                ChainAction::Rewrite => painter.paint(Role::Warn, "rewrite "),
                ChainAction::Delete => painter.paint(Role::Error, "delete  "),
                ChainAction::KeepReferenced => painter.paint(Role::Dim, "keep    "),
                ChainAction::InsertJumps => painter.paint(Role::Ok, "insert  "),
            };
            let _ = writeln!(
                s,
                "  {verb} {} ({} → {} rules)",
                c.chain, c.rules_before, c.rules_after
            );
            if let Some(n) = &c.note {
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
