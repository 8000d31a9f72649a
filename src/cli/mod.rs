//! Command-line front end: one module per command. Formatting only; logic lives in the library modules.

pub mod collect;
pub mod common;
pub mod completion;
pub mod conntrack;
pub mod graph;
pub mod ipvs;
pub mod live;
pub mod render;
pub mod repair;
pub mod resync;
pub mod trace;
pub mod verify;

use crate::exit::Outcome;
use clap::{CommandFactory, Parser, Subcommand};
use common::GlobalArgs;

/// kubectl-kproxy: see, verify, trace and repair what kube-proxy installed on a node.
#[derive(Debug, Parser)]
#[command(name = "kubectl-kproxy", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    /// Flags every command accepts (kubectl conventions).
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// All commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Rebuild the service graph from a node's iptables dump.
    Graph(graph::GraphArgs),
    /// Print the exact rules kube-proxy would write for the given API state.
    Render(render::RenderArgs),
    /// Compare what the API says kube-proxy should have installed with what the node has.
    Verify(verify::VerifyArgs),
    /// Show a service's data path on a node, or simulate a packet rule by rule.
    Trace(trace::TraceArgs),
    /// Plan (and with --apply install) the repair of a node's kube-proxy rules.
    Repair(repair::RepairArgs),
    /// Stand in for a dead kube-proxy: watch the API and keep this node's rules in sync.
    Resync(resync::ResyncArgs),
    /// Write a node's dumps, the API state and kube-proxy's configuration to one bundle.
    Collect(collect::CollectArgs),
    /// Print a shell completion script (bash, zsh, fish, …).
    Completion(completion::CompletionArgs),
}

/// True when invoked as `kubectl kproxy` (the basename of `argv[0]` starts with `kubectl-`).
pub fn invoked_as_plugin() -> bool {
    std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().starts_with("kubectl-"))
        })
        .unwrap_or(false)
}

/// Entry point used by `main`: parses arguments, runs the command, prints errors, returns the exit code.
pub fn main() -> std::process::ExitCode {
    // `__complete` takes raw words (flags included) that clap must not interpret.
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == completion::COBRA_COMMAND) {
        return completion::cobra_main(argv.get(2..).unwrap_or_default()).into();
    }
    let mut cmd = Cli::command();
    if invoked_as_plugin() {
        cmd = cmd.bin_name("kubectl kproxy");
    }
    let matches = match cmd.try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            let code = if e.use_stderr() {
                Outcome::Error
            } else {
                Outcome::Clean
            };
            let _ = e.print();
            return code.into();
        }
    };
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return Outcome::Error.into();
        }
    };
    common::init_logging(cli.global.verbosity);
    match run(cli) {
        Ok(o) => o.into(),
        // The reader went away (`| head`): nothing more to say, as other command-line tools.
        Err(e) if is_broken_pipe(&e) => Outcome::Clean.into(),
        Err(e) => {
            common::print_error(&e);
            Outcome::Error.into()
        }
    }
}

/// Whether an error comes from writing to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// Runs one parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<Outcome> {
    let g = &cli.global;
    match cli.command {
        Command::Graph(a) => graph::run(a, g),
        Command::Render(a) => render::run(a, g),
        Command::Verify(a) => verify::run(a, g),
        Command::Trace(a) => trace::run(a, g),
        Command::Repair(a) => repair::run(a, g),
        Command::Resync(a) => resync::run(a, g),
        Command::Collect(a) => collect::run(a, g),
        Command::Completion(a) => completion::run(a, g),
    }
}
