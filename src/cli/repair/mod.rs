//! `repair` command: compute the expected rules, diff them with the node's, print the plan, and
//! with `--apply` install it atomically (backup, one `iptables-restore --noflush` per table,
//! read-back verification, rollback on failure).
//!
//! [`run`] picks the path: `ipvs.rs` (IPVS-mode nodes), `nftables.rs` (nftables-mode nodes),
//! `remote.rs` (a node reached through the API), `local.rs` (this host, or the offline plan
//! against saved dumps). `report.rs` prints a
//! plan and what the repair came to; `conntrack.rs` is the conntrack step after the rules. The
//! transaction itself is `crate::apply`'s.

mod conntrack;
mod ipvs;
mod local;
mod nftables;
mod remote;
mod report;

use crate::apply::backup::{DEFAULT_BACKUP_DIR, DEFAULT_KEEP_BACKUPS};
use crate::apply::guard::InputConditions;
use crate::apply::iptables::host::IptablesHost;
use crate::apply::transaction::{RepairOptions, RollbackPolicy};
use crate::cli::common::{BackendArg, GlobalArgs, NodeFactArgs, StateArgs, load_config};
use crate::compare::version::ReleaseChoice;
use crate::exit::Outcome;
use crate::pipeline::mode::{Given, ModeDecision, for_writing};
use crate::state::ProxyInputs;
use crate::state::mode::ProxyMode;
use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
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
    /// Where to save the backup taken before applying [default on the node: /var/lib/kproxy/backups;
    /// for a remote node the backup is written on this machine, default
    /// $XDG_STATE_HOME/kproxy/backups, else ~/.local/state/kproxy/backups, else ./kproxy-backups].
    #[arg(hide_short_help = true, long, value_name = "DIR")]
    pub backup_dir: Option<PathBuf>,
    /// How many backups of the node to keep in the backup directory: older ones are removed
    /// after a new one is written, and the output says which (0 keeps all).
    #[arg(
        hide_short_help = true,
        long,
        value_name = "N",
        default_value_t = DEFAULT_KEEP_BACKUPS
    )]
    pub keep_backups: usize,
    /// Apply even when the inputs look wrong (empty state, mode mismatch, unreadable dump, old
    /// state) or a kube-proxy process writes the same rules. Never lifts the refusal of a plan
    /// that would change objects that are not kube-proxy's.
    #[arg(long)]
    pub force: bool,
    /// Refuse state files older than this (e.g. 10m, 1h; 0 = no limit).
    #[arg(
        hide_short_help = true,
        long,
        value_name = "DURATION",
        default_value = "0"
    )]
    pub max_age: String,
    /// Which iptables userspace to use on this host (for a remote node, `auto` means the
    /// backend that holds kube-proxy's rules, read from the node's dumps).
    #[arg(hide_short_help = true, long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Operate on the rules of this network namespace (`ip netns exec NAME …`).
    #[arg(hide_short_help = true, long, value_name = "NAME")]
    pub netns: Option<String>,
    /// Seconds to wait for the xtables lock.
    #[arg(
        hide_short_help = true,
        long,
        value_name = "SECONDS",
        default_value_t = 5
    )]
    pub wait: u64,
    /// Seconds each attempt of a rollback waits for the xtables lock (a rollback makes three
    /// attempts, pausing 1 s then 2 s between them).
    #[arg(
        hide_short_help = true,
        long,
        value_name = "SECONDS",
        default_value_t = 10
    )]
    pub rollback_wait: u64,
    /// Print the iptables-restore input of the plan.
    #[arg(hide_short_help = true, long)]
    pub show_restore: bool,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = RepairFormat::Text)]
    pub output: RepairFormat,
    /// Test only: make the last table's restore fail part-way (proves the rollback).
    #[arg(long, hide = true)]
    pub inject_fault: bool,
    /// Test only: before a rollback, create FILE and wait (at most a minute) until it is
    /// removed (a test holds the xtables lock meanwhile).
    #[arg(long, hide = true, value_name = "FILE")]
    pub pause_before_rollback: Option<PathBuf>,
    /// API state and configuration.
    #[command(flatten)]
    pub state: StateArgs,
    /// Node facts, as for render.
    #[command(flatten)]
    pub facts: NodeFactArgs,
    /// IPVS mode (`mode: ipvs` in the configuration, or these offline dumps given).
    #[command(flatten)]
    pub ipvs: ipvs::IpvsRepairArgs,
    /// nftables mode (`mode: nftables` in the configuration, or this offline listing given).
    #[command(flatten)]
    pub nftables: nftables::NftRepairArgs,
    /// How a remote node is reached (collector, kube-proxy pod selector, debug-pod image,
    /// kube-proxy ConfigMap, command timeout).
    #[command(flatten)]
    pub live: crate::cli::live::LiveArgs,
    /// The node's conntrack table (default with --local: this host's `conntrack -L`): its stale
    /// UDP/SCTP flows are deleted after the rules, by exact `conntrack -D` filters.
    #[command(flatten)]
    pub conntrack: crate::cli::conntrack::ConntrackArgs,
}

impl RepairArgs {
    /// The options of the repair transaction for `node`, its backup going to `backup_dir`.
    /// The Services whose object `state` left out as invalid are left as they are.
    fn repair_options(
        &self,
        node: &str,
        backup_dir: PathBuf,
        state: &crate::state::ClusterState,
    ) -> RepairOptions {
        RepairOptions {
            left_out: crate::compare::left_out::services(state),
            full: self.full,
            apply: self.apply,
            backup_dir,
            keep_backups: self.keep_backups,
            node: node.to_string(),
            rollback: self.rollback_policy(),
            inject_fault: self.inject_fault,
            pause_before_rollback: self.pause_before_rollback.clone(),
        }
    }

    /// The rollback's lock wait (`--rollback-wait`) and retries.
    fn rollback_policy(&self) -> RollbackPolicy {
        RollbackPolicy::waiting(Duration::from_secs(self.rollback_wait))
    }

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
        crate::cli::common::write_stdout(
            &(serde_json::to_string_pretty(&report::failure_doc(e))? + "\n"),
        )?;
    }
    result
}

/// Runs the path of `repair` the arguments select: IPVS, through the API, this host, or the
/// offline plan. Every `Ok` has printed the plan and its outcome; an `Err` printed nothing on
/// stdout.
fn run_path(args: RepairArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if args.live.all_nodes {
        bail!("repair works on one node at a time (--all-nodes is for verify): name the node");
    }
    let decision = mode(&args)?;
    match decision.mode {
        ProxyMode::Ipvs => return ipvs::run(args),
        ProxyMode::Nftables => return nftables::run(args, global, &decision),
        ProxyMode::Iptables => {}
    }
    if !args.local && args.iptables_save.is_none() {
        if args.node_name.is_some() {
            return remote::run(&args, global);
        }
        bail!(
            "which node? name one to repair it through the API (`kubectl get nodes` lists them), \
             run `kubectl-kproxy repair --local` on the node as root, or plan offline with --iptables-save FILE"
        );
    }
    local::run(args)
}

/// The mode whose rules `repair` writes ([`for_writing`]): the offline dumps of one mode given
/// (`--ipvsadm-save`, `--nft-ruleset`), else the configured mode; when the configuration names
/// none, nftables if this host (`--local`, no `--iptables-save`) has kube-proxy's table.
fn mode(args: &RepairArgs) -> anyhow::Result<ModeDecision> {
    let (config, _) = load_config(args.state.config.as_deref())?;
    let given = [
        (
            args.ipvs.ipvsadm_save.is_some(),
            ProxyMode::Ipvs,
            "--ipvsadm-save",
        ),
        (
            args.nftables.nft_ruleset.is_some(),
            ProxyMode::Nftables,
            "--nft-ruleset",
        ),
    ]
    .into_iter()
    .find(|(given, _, _)| *given)
    .map(|(_, mode, input)| Given { mode, input });
    let decision = for_writing(config.mode, given, || {
        let host = crate::apply::nftables::host::LocalNft {
            netns: args.netns.clone(),
        };
        (args.local && args.iptables_save.is_none())
            .then(|| host.tables().ok())
            .flatten()
    });
    tracing::info!("{}", decision.note());
    Ok(decision)
}

/// The kube-proxy release whose rules `repair` writes: `--kube-proxy-version`, else the
/// kube-proxy pod's `image`, else the release that wrote the node's rules (`current` reads
/// them): a repair never rewrites a node's rules into another release's behind its kube-proxy's
/// back. How it was chosen is noted on stderr.
fn choose_release(
    args: &RepairArgs,
    image: Option<&str>,
    current: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<ReleaseChoice> {
    let given = args.facts.inputs();
    let current = match given.kube_proxy_version {
        Some(_) => None,
        None => {
            let current = current()?;
            // Said before a release is inferred from text that holds no rules.
            if crate::parsers::paste::is_json_document(&current) {
                anyhow::bail!(
                    "the node's rules: expected iptables-save text, found a JSON document (API objects go to --state)"
                );
            }
            Some(current)
        }
    };
    let rules = current.as_deref().map(std::iter::once);
    let release = crate::pipeline::release::choose(&given, image, rules, "repairing")?;
    crate::cli::common::print_notes(&release.notes);
    Ok(release)
}

/// This host's iptables of one family, as `--backend`, `--netns` and `--wait` say.
fn local_iptables(args: &RepairArgs, ipv6: bool) -> IptablesHost {
    IptablesHost {
        ipv6,
        backend: args.backend.into(),
        netns: args.netns.clone(),
        wait: Duration::from_secs(args.wait),
    }
}

/// What the guard knows of the inputs: the configured mode, the age of the `--state` files,
/// `--max-age` (parsed), and on this host (`--local`) a kube-proxy process writing the rules of
/// the network namespace repaired.
fn input_facts(args: &RepairArgs, inputs: &ProxyInputs) -> anyhow::Result<InputConditions> {
    let max_age = crate::kube_client::parse_duration(&args.max_age).with_context(|| {
        format!(
            "bad --max-age {:?}: expected e.g. 30s, 10m, 2h",
            args.max_age
        )
    })?;
    let mut facts = InputConditions::new(&inputs.config, &args.state.state, max_age);
    if args.local {
        facts.kube_proxy_pid = crate::collect::local::kube_proxy_pid(args.netns.as_deref());
    }
    Ok(facts)
}
