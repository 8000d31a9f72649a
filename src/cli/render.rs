//! `render` command.

use super::common::GlobalArgs;
use crate::exit::Outcome;
use clap::Args;

/// Arguments of `render`.
#[derive(Debug, Args)]
pub struct RenderArgs {}

/// Runs `render`.
pub fn run(_args: RenderArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("render: not implemented yet")
}
