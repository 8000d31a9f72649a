//! Command-line front end: one module per command. Formatting only; logic lives in the library modules.

pub mod collect;
pub mod common;
pub mod completion;
pub mod conntrack;
pub mod graph;
pub mod ipvs;
pub mod live;
pub mod nft_graph;
pub mod nft_trace;
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
    #[command(after_help = "Examples:
  kubectl kproxy graph --iptables-save node-1.save
  kubectl kproxy graph --iptables-save node-1.save -o json | jq '.graphs[0].service_ports[0]'
  kubectl kproxy graph --lenient --paste ticket.txt            # prompts, fences, several commands
  kubectl kproxy graph --ipvsadm ipvsadm.txt --ipset ipset.txt # an IPVS node
  kubectl kproxy graph --nft-ruleset ruleset.nft                # an nftables-mode node")]
    Graph(graph::GraphArgs),
    /// Print the exact rules kube-proxy would write for the given API state.
    #[command(after_help = "Examples:
  kubectl kproxy render --state state.json --config config.yaml --node node-1
  kubectl kproxy render --state state.json --node node-1 --mode nftables
  kubectl kproxy render --state state.json --node node-1 --kube-proxy-version 1.28")]
    Render(render::RenderArgs),
    /// Compare what the API says kube-proxy should have installed with what the node has.
    #[command(after_help = "Examples:
  kubectl kproxy verify node-1                                  # live: through the kube-proxy pod
  kubectl kproxy verify --all-nodes -o json
  kubectl kproxy verify node-1 --state state.json --config config.yaml --iptables-save node-1.save
  kubectl kproxy verify node-1 --bundle node-1.tar.gz --conntrack conntrack.txt")]
    Verify(verify::VerifyArgs),
    /// Show a service's data path on a node, or simulate a packet rule by rule.
    #[command(after_help = "Examples:
  kubectl kproxy trace svc/web -n shop --node node-1
  kubectl kproxy trace svc/web -n shop --state state.json --iptables-save node-1.save
  kubectl kproxy trace --iptables-save node-1.save --packet '10.244.1.5->10.96.0.10:53/udp'
  kubectl kproxy trace --iptables-save node-1.save --packet '192.168.1.9->10.0.0.5:30080' --from external")]
    Trace(trace::TraceArgs),
    /// Plan (and with --apply install) the repair of a node's kube-proxy rules.
    #[command(after_help = "Examples:
  kubectl kproxy repair node-1                     # the plan (dry run), through the API
  kubectl kproxy repair node-1 --apply             # backed up, atomic, verified, rolled back on failure
  sudo kubectl-kproxy repair --local --state state.json --config config.yaml
  sudo kubectl-kproxy repair --local --apply")]
    Repair(repair::RepairArgs),
    /// Stand in for a dead kube-proxy: watch the API and keep this node's rules in sync.
    #[command(after_help = "Examples:
  sudo kubectl-kproxy resync --local --watch --node node-1")]
    Resync(resync::ResyncArgs),
    /// Write a node's dumps, the API state and kube-proxy's configuration to one bundle.
    #[command(after_help = "Examples:
  kubectl kproxy collect node-1 -o node-1.tar.gz
  kubectl kproxy verify node-1 --bundle node-1.tar.gz")]
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

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::{CommandFactory, Parser};

    /// The words of an example line: `'…'` quoting, `#` comments, `sudo` and the plugin name
    /// (`kubectl kproxy` / `kubectl-kproxy`) handled as a shell would.
    fn words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let mut word = String::new();
        let mut quoted = false;
        for c in line.chars() {
            match c {
                '\'' => quoted = !quoted,
                '#' if !quoted => break,
                ' ' if !quoted => {
                    if !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                }
                c => word.push(c),
            }
        }
        if !word.is_empty() {
            words.push(word);
        }
        let start = match words.first().map(String::as_str) {
            Some("sudo") => 1,
            _ => 0,
        };
        let mut argv = vec!["kubectl-kproxy".to_string()];
        let rest = &words[start..];
        let skip = if rest.first().is_some_and(|w| w == "kubectl") {
            2
        } else {
            1
        };
        argv.extend(rest.iter().skip(skip).cloned());
        argv
    }

    #[test]
    fn every_help_example_parses() {
        let cmd = Cli::command();
        let mut checked = 0;
        for sub in cmd.get_subcommands() {
            let Some(after) = sub.get_after_help() else {
                continue;
            };
            let text = after.to_string();
            let Some((_, examples)) = text.split_once("Examples:\n") else {
                continue;
            };
            for line in examples.lines().take_while(|l| l.starts_with("  ")) {
                // A pipe's first command is the example.
                let command = line.split(" | ").next().unwrap_or(line);
                Cli::try_parse_from(words(command)).unwrap_or_else(|e| panic!("{line}: {e}"));
                checked += 1;
            }
        }
        assert!(checked >= 15, "{checked} examples");
    }
}

#[cfg(test)]
mod help_tests {
    use super::Cli;
    use clap::CommandFactory;

    /// `-h` fits a screen, and the flags come in groups: the command's own first, the kubeconfig
    /// flags last (as kubectl prints them), then the examples.
    #[test]
    fn short_help_is_one_screen_with_connection_flags_last() {
        let mut cmd = Cli::command();
        cmd.build();
        for sub in cmd.get_subcommands_mut() {
            let name = sub.get_name().to_string();
            let help = sub.render_help().to_string();
            let lines = help.lines().count();
            assert!(lines <= 70, "{name} -h: {lines} lines\n{help}");
            if let Some(connection) = help.find("Kubernetes connection:") {
                let options = help.find("Options:").unwrap_or(usize::MAX);
                assert!(options < connection, "{name}: own options first");
                let after = &help[connection..];
                let next_heading = after
                    .lines()
                    .skip(1)
                    .find(|l| !l.starts_with(' ') && !l.is_empty());
                assert!(
                    next_heading.is_none_or(|h| !h.ends_with(':') || h.starts_with("Examples")),
                    "{name}: connection flags last, found {next_heading:?}"
                );
            }
        }
    }
}
