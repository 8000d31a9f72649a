//! `repair` on nftables-mode nodes (configured `mode: nftables`, a configuration that names no
//! mode on a host whose rules are in kube-proxy's nftables table, or `--nft-ruleset FILE`
//! given): plan the `nft -f` transaction per family that makes `table ip kube-proxy` / `table
//! ip6 kube-proxy` what kube-proxy writes, changing only what differs; with `--apply` check
//! it, back up, apply, read back, verify, and roll back on failure. The logic is in
//! `apply::nftables`.

use super::report::{Ending, PlanDoc, finish, millis, write_left_alone, write_refusals};
use super::{RepairArgs, RepairFormat, input_facts};
use crate::apply::guard::unless_forced;
use crate::apply::nftables::host::{LocalNft, NftHost};
use crate::apply::nftables::plan::{Action, NftPlan};
use crate::apply::nftables::repair::{NftRepairReport, Target, repair};
use crate::cli::common::{GlobalArgs, load_config};
use crate::exit::Outcome;
use crate::output::color::{Painter, Role};
use crate::pipeline::mode::ModeDecision;
use crate::state::ProxyInputs;
use anyhow::{Context, bail};
use clap::Args;
use kproxy_parsers::nft::Family;
use std::fmt::Write as _;
use std::path::PathBuf;

/// Offline input of an nftables-mode repair plan.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "nftables mode (offline plan)")]
pub struct NftRepairArgs {
    /// nftables mode: plan against a saved `nft list ruleset` / `nft -j list ruleset` (or `nft
    /// list table ip kube-proxy`) file instead of the host (dry run only).
    #[arg(long = "nft-ruleset", value_name = "FILE", conflicts_with = "apply")]
    pub nft_ruleset: Option<PathBuf>,
}

/// The node's tables from a saved listing: what an offline plan is made against.
struct SavedListing {
    text: String,
    label: String,
}

impl NftHost for SavedListing {
    fn list_table(
        &self,
        family: Family,
        _json: bool,
    ) -> Result<Option<String>, crate::apply::host::HostError> {
        let listing = [crate::compare::nftables::NftText {
            label: &self.label,
            text: &self.text,
        }];
        // A listing that does not parse is reported when it is compared.
        let has = crate::compare::nftables::parse_listings(&listing, false)
            .map(|rs| crate::compare::nftables::kube_proxy_table(&rs, family).is_some())
            .unwrap_or(true);
        Ok(has.then(|| self.text.clone()))
    }

    fn check(&self, _script: &str) -> Result<(), crate::apply::host::HostError> {
        Err(offline_error())
    }

    fn apply(&self, _script: &str) -> Result<(), crate::apply::host::HostError> {
        Err(offline_error())
    }

    fn same_transaction_delete(&self) -> bool {
        true
    }

    fn by_hand(&self, file: &std::path::Path) -> String {
        crate::apply::nftables::host::nft_command_line(None, file)
    }
}

fn offline_error() -> crate::apply::host::HostError {
    crate::apply::host::HostError::Remote {
        program: "nft".into(),
        location: "a saved listing".into(),
        detail: "an offline plan cannot be applied".into(),
    }
}

/// Runs `repair` for an nftables-mode node.
pub fn run(
    args: RepairArgs,
    _global: &GlobalArgs,
    decision: &ModeDecision,
) -> anyhow::Result<Outcome> {
    let offline = args.nftables.nft_ruleset.clone();
    if !args.local && offline.is_none() {
        bail!(
            "nftables-mode repair works on the node itself: run `kubectl-kproxy repair --local` on the node as root \
             (or plan offline with --nft-ruleset FILE)"
        );
    }
    if args.iptables_save.is_some() {
        bail!(
            "the node runs kube-proxy in nftables mode: plan offline with --nft-ruleset FILE (nft -j list ruleset), not --iptables-save"
        );
    }
    let release = nftables_release(&args)?;
    let inputs = load_nftables_inputs(&args, release)?;
    let guard_facts = input_facts(&args, &inputs)?.decided(decision.mode);
    let targets = Target::both(&inputs.state, &inputs.config, &inputs.facts);
    crate::cli::common::print_warnings_once(targets.iter().flat_map(|t| &t.expected.warnings));
    let ports: usize = targets.iter().map(|t| t.expected.index.ports.len()).sum();
    let endpoints: usize = targets.iter().map(|t| t.expected.endpoint_chains).sum();
    let painter = Painter::for_stdout();
    let opts = args.repair_options(
        &inputs.facts.node_name,
        args.local_backup_dir(),
        &inputs.state,
    );
    let guard = |plan: &NftPlan, counts: &crate::apply::nftables::repair::NodeCounts| {
        unless_forced(args.force, || {
            crate::apply::nftables::repair::refusals(&guard_facts, ports, endpoints, counts, plan)
        })
    };
    let result = match &offline {
        Some(path) => {
            let dump = crate::collect::files::read_dump(path, false)?;
            dump.warnings.iter().for_each(crate::cli::common::warn);
            let host = SavedListing {
                text: dump.text,
                label: dump.name,
            };
            repair(&host, &targets, &opts, guard)
        }
        None => {
            let host = LocalNft {
                netns: args.netns.clone(),
            };
            repair(&host, &targets, &opts, guard)
        }
    };
    let (report, refused) = result?;
    let conntrack = super::conntrack::repair_step(&args, &inputs, &refused)?;
    let ending = Ending {
        refused: &refused,
        nothing_to_do: report.plan.is_empty() && conntrack.as_ref().is_none_or(|c| c.is_empty()),
        clean: Some(if offline.is_some() {
            "nothing to do: the listing already matches kube-proxy's nftables table"
        } else {
            "nothing to do: the node's kube-proxy tables already match"
        }),
        offline: offline.is_some(),
        backup: report.backup.as_deref(),
        rotation: &report.rotation,
        applied: if report.plan.is_empty() {
            "tables: nothing to change".to_string()
        } else {
            format!(
                "applied and verified: {} bytes of nft -f input; nft -f {:.1} ms, read-back and verify {:.1} ms",
                report.nft_bytes,
                report.apply_time.as_secs_f64() * 1000.0,
                report.verify_time.as_secs_f64() * 1000.0
            )
        },
        figures: serde_json::json!({
            "nft_bytes": report.nft_bytes,
            "apply_ms": millis(report.apply_time),
            "verify_ms": millis(report.verify_time),
        }),
    };
    let doc = super::conntrack::add_to_doc(
        plan_doc(&args, &report, &refused, painter)?,
        conntrack.as_ref(),
        painter,
    )?;
    let outcome = finish(&args, doc, &ending)?;
    Ok(match conntrack {
        Some(c) if c.remaining() > 0 && outcome == Outcome::Clean => Outcome::Drift,
        _ => outcome,
    })
}

/// The kube-proxy release whose table `repair` writes: `--kube-proxy-version`, else the release
/// the node's current table points to (never another release's layout behind kube-proxy's
/// back); how it was chosen is noted on stderr.
fn nftables_release(args: &RepairArgs) -> anyhow::Result<crate::state::version::KubeProxyVersion> {
    let flag = args.facts.kube_proxy_version;
    let listings: Vec<(String, String)> = if flag.is_some() {
        Vec::new()
    } else if let Some(path) = &args.nftables.nft_ruleset {
        let dump = crate::collect::files::read_dump(path, false)?;
        vec![(dump.name, dump.text)]
    } else {
        let host = LocalNft {
            netns: args.netns.clone(),
        };
        [Family::Ip, Family::Ip6]
            .into_iter()
            .filter_map(|f| host.list_table(f, true).ok().flatten())
            .map(|text| ("nft -j list table".to_string(), text))
            .collect()
    };
    let texts: Vec<crate::compare::nftables::NftText> = listings
        .iter()
        .map(|(label, text)| crate::compare::nftables::NftText { label, text })
        .collect();
    // A listing that does not parse is reported when it is compared.
    let inference = crate::compare::nftables::release::infer(&texts, false).unwrap_or_default();
    let release = crate::compare::version::choose_release(flag, None, inference, "repairing")?;
    crate::cli::common::print_notes(&release.notes);
    Ok(release.version)
}

/// `--state`, `--config` (read as kube-proxy reads it in nftables mode) and the node facts
/// built from them, for kube-proxy `release`.
fn load_nftables_inputs(
    args: &RepairArgs,
    release: crate::state::version::KubeProxyVersion,
) -> anyhow::Result<ProxyInputs> {
    if args.state.state.is_empty() {
        bail!(
            "the API state is needed: --state FILE (kubectl get services,endpointslices,nodes,servicecidrs -A -o json)"
        );
    }
    let state = crate::state::load::from_files(&args.state.state).context("reading --state")?;
    let (config, warnings) = load_config(args.state.config.as_deref())?;
    crate::cli::common::print_warnings(&warnings);
    let mode = config.mode;
    let mut config = config.for_nftables();
    // Keep what the configuration said, for the guard.
    config.mode = mode;
    let mut fact_args = args.facts.clone();
    if let Some(n) = &args.node_name {
        fact_args.node = Some(n.clone());
    }
    fact_args.kube_proxy_version = Some(release);
    let (facts, warnings) =
        crate::state::node::build(&fact_args.inputs(), &state, &config).context("node facts")?;
    warnings.iter().for_each(crate::cli::common::warn);
    Ok(ProxyInputs {
        state,
        config,
        facts,
    })
}

/// The plan as `-o` asks: text, or the JSON fields `mode`, `plan`, `refusals` and `nft_input`.
fn plan_doc(
    args: &RepairArgs,
    report: &NftRepairReport,
    refused: &[String],
    painter: Painter,
) -> anyhow::Result<PlanDoc> {
    let p = &report.plan;
    if args.output == RepairFormat::Json {
        let mut doc = serde_json::Map::new();
        doc.insert("mode".into(), "nftables".into());
        doc.insert("plan".into(), serde_json::to_value(p)?);
        doc.insert("refusals".into(), refused.into());
        doc.insert("nft_input".into(), p.script().into());
        return Ok(PlanDoc::Json(doc));
    }
    let mut s = String::new();
    let _ = writeln!(
        s,
        "plan (nftables mode): {} to create, {} to rewrite, {} to recreate, {} to delete, {} to flush, {} with other elements{}",
        p.count(Action::Create),
        p.count(Action::Rewrite),
        p.count(Action::Recreate),
        p.count(Action::Delete),
        p.count(Action::Flush),
        p.count(Action::Elements),
        if p.full { " (full rewrite)" } else { "" }
    );
    for f in &p.families {
        if f.changes.is_empty() {
            continue;
        }
        let _ = writeln!(s, "{}:", f.table);
        for c in &f.changes {
            let role = match c.action {
                Action::Create => Role::Ok,
                Action::Delete => Role::Error,
                Action::Flush => Role::Dim,
                _ => Role::Warn,
            };
            let verb = painter.paint(role, &format!("{:<8}", c.action.word()));
            let _ = writeln!(s, "  {verb} {} {}", c.object, c.name);
            if let Some(n) = &c.note {
                let _ = writeln!(s, "           {n}");
            }
            for r in &c.removed {
                let _ = writeln!(s, "      {}", painter.paint(Role::Error, &format!("- {r}")));
            }
            for r in &c.added {
                let _ = writeln!(s, "      {}", painter.paint(Role::Ok, &format!("+ {r}")));
            }
        }
    }
    write_left_alone(&mut s, &p.left_alone, painter);
    let input = p.script();
    if args.show_restore {
        let _ = writeln!(s, "--- nft -f input ---\n{input}---");
    } else if !input.is_empty() {
        let _ = writeln!(
            s,
            "nft -f input: {} bytes (--show-restore prints it)",
            input.len()
        );
    }
    write_refusals(&mut s, refused, painter);
    Ok(PlanDoc::Text(s))
}
