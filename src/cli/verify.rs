//! `verify` command.

use super::common::GlobalArgs;
use crate::exit::Outcome;
use clap::Args;

/// Arguments of `verify`.
#[derive(Debug, Args)]
pub struct VerifyArgs {}

/// Runs `verify`.
pub fn run(_args: VerifyArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    anyhow::bail!("verify: not implemented yet")
}
