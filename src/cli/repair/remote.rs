//! `repair NODE` (without `--local`): the same repair transaction as on the node, run through
//! the API — `iptables-save`/`iptables-restore` exec'd into the node's kube-proxy pod
//! (`--collector exec`, the default) or a short-lived debug pod (`--collector debug-pod`), the
//! restore input piped on stdin. The API state and configuration are read as `verify` reads
//! them live ([`crate::cli::live::load_live_state`]); the backup is written on this machine.

use super::local::report_outcome;
use super::{RepairArgs, choose_release, conntrack, input_facts};
use crate::apply::iptables::host::{Backend, tool_name};
use crate::apply::iptables::remote::{RemoteHost, detect_backend, nfacct_from_rules};
use crate::apply::iptables::repair::{expected_and_guard, guarded_repair};
use crate::cli::common::{GlobalArgs, print_warnings};
use crate::cli::live::{CollectorChoice, LiveState};
use crate::collect::{self, CommandRunner, NodeSnapshot};
use crate::compare::version::ReleaseChoice;
use crate::exit::Outcome;
use crate::output::color::Painter;
use crate::state::ProxyInputs;
use crate::state::ip::IpFamily;
use anyhow::{Context, anyhow, bail};
use std::path::PathBuf;
use std::time::Duration;

/// Runs `repair NODE` through the API (see the module docs).
pub fn run(args: &RepairArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let node = args
        .node_name
        .clone()
        .ok_or_else(|| anyhow!("remote repair needs the node's name"))?;
    if args.live.bundle.is_some() {
        bail!("--bundle is a snapshot: repair needs the live node (name it, without --bundle)");
    }
    if args.netns.is_some() {
        bail!("--netns works with --local only");
    }
    let debug_pod = match args.live.collector {
        CollectorChoice::Auto | CollectorChoice::Exec => false,
        CollectorChoice::DebugPod => true,
        CollectorChoice::Local => {
            bail!("to repair this host, use `kubectl-kproxy repair --local` (as root)")
        }
        CollectorChoice::Files => bail!(
            "repair cannot change files: plan offline with --iptables-save FILE, or name a node to repair it through the API"
        ),
    };
    let timeout = crate::kube_client::parse_duration(&args.live.exec_timeout)
        .ok()
        .flatten()
        .ok_or_else(|| {
            anyhow!(
                "invalid --exec-timeout {:?}: expected e.g. 30s, 2m (more than 0)",
                args.live.exec_timeout
            )
        })?;
    let rt = crate::cli::live::runtime()?;
    let live = rt.block_on(crate::cli::live::load_live_state(
        global,
        &args.live,
        &args.state,
        &node,
    ))?;
    live.warnings.iter().for_each(crate::cli::common::warn);
    if !debug_pod {
        let (runner, image) = rt.block_on(collect::exec::find_proxy_pod_and_image(
            &live.conn,
            collect::exec::PROXY_NAMESPACE,
            &args.live.proxy_selector,
            &node,
        ))?;
        let label = format!("exec ({}/{})", runner.namespace, runner.pod);
        let through = Through {
            runner: &runner,
            label: &label,
            image: image.as_deref(),
        };
        return repair_through(args, &rt, &live, &node, &through, timeout);
    }
    // The kube-proxy pod's image says which release wrote the rules (none on k3s or RKE2,
    // which run kube-proxy in their own process: then the rules say).
    let image = if args.facts.kube_proxy_version.is_none() {
        rt.block_on(crate::collect::api::kube_proxy_image_on_node(
            &live.conn,
            collect::exec::PROXY_NAMESPACE,
            &args.live.proxy_selector,
            &node,
        ))
        .unwrap_or_else(|e| {
            eprintln!("warning: could not read the kube-proxy pod's image: {e}");
            None
        })
    } else {
        None
    };
    let pod = collect::debug_pod::DebugPod::new(&live.conn, &node, &args.live.image);
    // Ctrl-C while the pod starts: delete it (afterwards the pod is deleted when the repair
    // ends, or by its activeDeadlineSeconds if the process is killed).
    let started = rt.block_on(async {
        tokio::select! {
            r = pod.start(timeout) => r,
            _ = tokio::signal::ctrl_c() => Err(collect::CollectError::Interrupted),
        }
    });
    let result = started.map_err(anyhow::Error::from).and_then(|()| {
        let label = pod.label();
        let through = Through {
            runner: pod.runner(),
            label: &label,
            image: image.as_deref(),
        };
        repair_through(args, &rt, &live, &node, &through, timeout)
    });
    if let Err(e) = rt.block_on(pod.delete()) {
        crate::cli::common::warn(format!(
            "could not delete debug pod {}/{}: {e} (delete it by hand)",
            pod.runner().namespace,
            pod.runner().pod
        ));
    }
    result
}

/// How the node is reached: the runner of its commands, its label, and the node's kube-proxy
/// image when known.
struct Through<'a, R> {
    runner: &'a R,
    label: &'a str,
    image: Option<&'a str>,
}

/// Reads the node through `runner`, then plans and (with `--apply`) applies the repair there.
fn repair_through<R: CommandRunner>(
    args: &RepairArgs,
    rt: &tokio::runtime::Runtime,
    live: &LiveState,
    node: &str,
    through: &Through<'_, R>,
    timeout: Duration,
) -> anyhow::Result<Outcome> {
    let (runner, label) = (through.runner, through.label);
    let snap = rt.block_on(collect::collect_with(runner, label, timeout))?;
    for w in &snap.warnings {
        crate::cli::common::warn(w);
    }
    let ipv6_asked = args.facts.ip_family == "6";
    let release = choose_release(args, through.image, || {
        Ok(
            dump_of(&snap, ipv6_asked, detect_backend(&snap, ipv6_asked).0)
                .unwrap_or_default()
                .to_string(),
        )
    })?;
    let inputs = proxy_inputs(args, live, node, &snap, &release)?;
    let ipv6 = inputs.facts.family == IpFamily::V6;
    let (backend, doubt) = match args.backend.into() {
        Backend::Auto => detect_backend(&snap, ipv6),
        chosen => (chosen, None),
    };
    if let Some(d) = doubt {
        crate::cli::common::warn(d);
    }
    eprintln!(
        "node {node} through {label}: {} / {}",
        tool_name(ipv6, backend, "save"),
        tool_name(ipv6, backend, "restore")
    );
    let (expected_text, guard) = expected_and_guard(&inputs, input_facts(args, &inputs)?);
    print_warnings(&inputs.state.invalid_warnings());
    let host = RemoteHost {
        runner,
        runtime: rt.handle().clone(),
        ipv6,
        backend,
        wait: Duration::from_secs(args.wait),
        timeout,
    };
    let opts = args.repair_options(
        &inputs.facts.node_name,
        backup_dir(args.backup_dir.as_deref()),
        &inputs.state,
    );
    let (report, refused) = guarded_repair(&host, &expected_text, &guard, &opts, args.force)
        .with_context(|| format!("repairing node {node} through {label}"))?;
    // Stale conntrack entries after the rules, in the same pod.
    let conntrack = conntrack::remote_repair_step(args, &inputs, &snap, &host, &refused)?;
    report_outcome(
        args,
        &report,
        &refused,
        Painter::for_stdout(),
        &release,
        conntrack.as_ref(),
    )
}

/// The proxier's inputs for `node`, as verify's live path builds them: the configuration from
/// `--config` or the ConfigMap (kube-proxy's defaults when absent), NODE as the node name, and
/// — unless `--nfacct` says — the nfacct counters the node's rules reference.
fn proxy_inputs(
    args: &RepairArgs,
    live: &LiveState,
    node: &str,
    snap: &NodeSnapshot,
    release: &ReleaseChoice,
) -> anyhow::Result<ProxyInputs> {
    let config = match &live.config_text {
        Some((text, source)) => {
            let (c, warnings) = crate::state::config::parse(text, source)
                .with_context(|| format!("reading the kube-proxy configuration ({source})"))?;
            print_warnings(&warnings);
            c
        }
        None => crate::state::config::ProxyConfig::default(),
    };
    let mut fact_args = args.facts.clone();
    fact_args.node = Some(node.to_string());
    fact_args.kube_proxy_version = Some(release.version);
    let build = |fact_args: &crate::cli::common::NodeFactArgs| {
        crate::state::node::build(&fact_args.inputs(), &live.state, &config).context("node facts")
    };
    let (mut facts, mut warnings) = build(&fact_args)?;
    if fact_args.nfacct.is_none() {
        let ipv6 = facts.family == IpFamily::V6;
        let dump = dump_of(snap, ipv6, detect_backend(snap, ipv6).0);
        fact_args.nfacct = Some(nfacct_from_rules(dump.unwrap_or_default()));
        (facts, warnings) = build(&fact_args)?;
    }
    for w in warnings {
        crate::cli::common::warn(w);
    }
    Ok(ProxyInputs {
        state: live.state.clone(),
        config,
        facts,
    })
}

/// The snapshot's dump of one family and backend.
fn dump_of(snap: &NodeSnapshot, ipv6: bool, backend: Backend) -> Option<&str> {
    match (ipv6, backend) {
        (true, _) => snap.ip6tables_save.as_deref(),
        (false, Backend::Auto) => snap.iptables_save.as_deref(),
        (false, Backend::Legacy) => snap.iptables_legacy_save.as_deref(),
        (false, Backend::Nft) => snap.iptables_nft_save.as_deref(),
    }
}

/// Where a remote node's backup goes on this machine: `--backup-dir` when given, else
/// `$XDG_STATE_HOME/kproxy/backups`, else `~/.local/state/kproxy/backups`, else `./kproxy-backups`.
fn backup_dir(given: Option<&std::path::Path>) -> PathBuf {
    if let Some(dir) = given {
        return dir.to_path_buf();
    }
    let absolute = |v: Option<std::ffi::OsString>| {
        v.map(PathBuf::from)
            .filter(|p| p.is_absolute() && !p.as_os_str().is_empty())
    };
    if let Some(state) = absolute(std::env::var_os("XDG_STATE_HOME")) {
        return state.join("kproxy/backups");
    }
    if let Some(home) = absolute(std::env::var_os("HOME")) {
        return home.join(".local/state/kproxy/backups");
    }
    PathBuf::from("kproxy-backups")
}
