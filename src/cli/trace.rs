//! `trace` command.

use super::common::GlobalArgs;
use crate::exit::Outcome;
use clap::Args;

/// Arguments of `trace`.
#[derive(Debug, Args)]
pub struct TraceArgs {}

/// Runs `trace`.
pub fn run(_args: TraceArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("trace: not implemented yet")
}
