//! `graph` command.

use super::common::GlobalArgs;
use crate::exit::Outcome;
use clap::Args;

/// Arguments of `graph`.
#[derive(Debug, Args)]
pub struct GraphArgs {}

/// Runs `graph`.
pub fn run(_args: GraphArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("graph: not implemented yet")
}
