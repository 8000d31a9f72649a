//! `collect` command: read one node (dumps), the API state and kube-proxy's configuration,
//! and write them as one support bundle that every command reads back with `--bundle FILE`.

use super::common::{DumpArgs, GlobalArgs, StateArgs};
use super::live::{self, LiveArgs};
use crate::collect::bundle::{self, Bundle};
use crate::exit::Outcome;
use anyhow::{Context, bail};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `collect`.
#[derive(Debug, Args)]
pub struct CollectArgs {
    /// The node to collect (default with --collector local: this host).
    #[arg(value_name = "NODE")]
    pub node: Option<String>,
    /// Where to write the bundle (a .tar.gz).
    #[arg(short = 'o', long = "output", value_name = "FILE.tar.gz")]
    pub output: PathBuf,
    /// Live access flags.
    #[command(flatten)]
    pub live: LiveArgs,
    /// Offline API state and configuration (override what the API would give).
    #[command(flatten)]
    pub state: StateArgs,
    /// Offline dumps (the `files` collector).
    #[command(flatten)]
    pub dumps: DumpArgs,
}

/// Runs `collect`.
pub fn run(args: CollectArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    if args.live.all_nodes {
        bail!("collect works on one node; run it once per node instead of --all-nodes");
    }
    let inputs = live::resolve_inputs(
        global,
        &args.live,
        &args.state,
        &args.dumps,
        args.node.as_deref(),
    )?;
    let b = Bundle {
        node: inputs.node,
        state: std::sync::Arc::unwrap_or_clone(inputs.state),
        config: inputs.config_text,
        snapshot: inputs.snapshot,
    };
    bundle::write(&args.output, &b)
        .with_context(|| format!("writing bundle {}", args.output.display()))?;
    b.snapshot.warnings.iter().for_each(super::common::warn);
    let mut out = anstream::stdout();
    let _ = writeln!(
        out,
        "wrote {} (node {:?}, {} services, {} endpointslices, {} nodes, collector {})",
        args.output.display(),
        b.node,
        b.state.services.len(),
        b.state.endpoint_slices.len(),
        b.state.nodes.len(),
        b.snapshot.collector
    );
    Ok(Outcome::Clean)
}
