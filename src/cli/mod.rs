//! Command-line front end: one module per command. Formatting only; logic lives in the library modules.

pub mod collect;
pub mod common;
pub mod completion;
pub mod conntrack;
pub mod graph;
pub mod ipvs;
pub mod live;
pub mod monitor;
pub mod nft_graph;
pub mod nft_trace;
pub mod npd;
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
#[command(
    name = "kubectl-kproxy",
    version,
    about,
    long_about = None,
    propagate_version = true,
    after_help = "Examples:
  kubectl kproxy verify --all-nodes        # every node, via its kube-proxy pod
  kubectl kproxy verify node-1 -o json     # one node's findings, for scripts
  kubectl kproxy trace svc/web -n shop --node node-1
  kubectl kproxy graph --iptables-save node-1.save
  kubectl kproxy repair node-1             # the plan; --apply installs it

`kubectl kproxy COMMAND -h` for a command's flags and examples."
)]
pub struct Cli {
    /// Flags every command accepts (kubectl conventions).
    #[command(flatten)]
    pub global: GlobalArgs,
    /// Limits on what every command reads.
    #[command(flatten)]
    pub input: common::InputArgs,
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
  kubectl kproxy graph --iptables-save node-1.save -o json | jq .graphs[0]
  kubectl kproxy graph --paste ticket.txt         # prompts, fences, commands
  kubectl kproxy graph --ipvsadm ipvsadm.txt      # an IPVS node
  kubectl kproxy graph --nft-ruleset ruleset.nft  # an nftables-mode node")]
    Graph(graph::GraphArgs),
    /// Print the exact rules kube-proxy would write for the given API state.
    #[command(after_help = "Examples:
  kubectl kproxy render --state state.json --config config.yaml --node node-1
  kubectl kproxy render --state state.json --node node-1 --mode nftables
  kubectl kproxy render --state state.json --node node-1 --with-base-jumps")]
    Render(render::RenderArgs),
    /// Compare what the API says kube-proxy should have installed with what the node has.
    #[command(after_help = "Examples:
  kubectl kproxy verify node-1            # live: through the kube-proxy pod
  kubectl kproxy verify --all-nodes -o json
  kubectl kproxy verify node-1 --state state.json --iptables-save node-1.save
  kubectl kproxy verify node-1 --bundle n1.tar.gz --conntrack conntrack.txt")]
    Verify(verify::VerifyArgs),
    /// Show a service's data path on a node, or simulate a packet rule by rule.
    #[command(after_help = "Examples:
  kubectl kproxy trace svc/web -n shop --node node-1
  kubectl kproxy trace svc/web -n shop --state st.json --iptables-save n1.save
  kubectl kproxy trace --iptables-save n1.save \\
    --packet '10.244.1.5->10.96.0.10:53/udp'
  kubectl kproxy trace --iptables-save n1.save --from external \\
    --packet '192.168.1.9->10.0.0.5:30080'")]
    Trace(trace::TraceArgs),
    /// Plan (and with --apply install) the repair of a node's kube-proxy rules.
    #[command(after_help = "Examples:
  kubectl kproxy repair node-1           # the plan (dry run), through the API
  kubectl kproxy repair node-1 --apply   # backed up, atomic, undone on error
  sudo kubectl-kproxy repair --local --state state.json --config config.yaml
  sudo kubectl-kproxy repair --local --apply")]
    Repair(repair::RepairArgs),
    /// Stand in for a dead kube-proxy: watch the API and keep this node's rules in sync.
    #[command(after_help = "Examples:
  sudo kubectl-kproxy resync --local --watch --node node-1")]
    Resync(resync::ResyncArgs),
    /// Watch this node: re-verify it continuously, report metrics and Events.
    #[command(after_help = "Examples:
  kubectl-kproxy monitor --node node-1    # in-cluster: the API's watches
  kubectl-kproxy monitor --state state.json --config config.yaml \\
    --node node-1 --listen 127.0.0.1:9847 --interval 1s --grace 2s
  kubectl-kproxy monitor --node node-1 --repair when-kube-proxy-down")]
    Monitor(monitor::MonitorArgs),
    /// Write a node's dumps, the API state and kube-proxy's configuration to one bundle.
    #[command(after_help = "Examples:
  kubectl kproxy collect node-1 -o node-1.tar.gz
  kubectl kproxy verify node-1 --bundle node-1.tar.gz")]
    Collect(collect::CollectArgs),
    /// Print a shell completion script (bash, zsh, fish, …).
    Completion(completion::CompletionArgs),
}

/// The command line as it is parsed, completed and documented: clap's derive, plus what a
/// flag group shared by several commands cannot say per command: `trace`, `repair` and
/// `collect` work on one node, so the fleet flags of the live group (`--all-nodes`, `-l`,
/// `--parallel`) are not listed there (and refused when given).
pub fn command() -> clap::Command {
    let mut cmd = Cli::command();
    for one_node in ["trace", "repair", "collect"] {
        cmd = cmd.mut_subcommand(one_node, |mut sub| {
            for id in ["all_nodes", "selector", "parallel"] {
                sub = sub.mut_arg(id, |a| a.hide(true));
            }
            sub
        });
    }
    cmd
}

/// `COMMAND --help` (or `help COMMAND`): every flag of the command with its whole text, in
/// `-h`'s compact layout; clap's long layout spreads each flag over three lines or more
/// (`verify --help` ran to 213). `None` for `-h` and the top level, which clap prints.
pub fn full_help(argv: &[std::ffi::OsString], plugin: bool) -> Option<String> {
    let words: Vec<&str> = argv
        .iter()
        .skip(1)
        .map_while(|a| a.to_str())
        .take_while(|w| *w != "--")
        .collect();
    let mut cmd = command();
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|c| c.get_name().to_string())
        .collect();
    let name = words.iter().find(|w| names.iter().any(|n| n == *w))?;
    if !words.contains(&"--help") && words.first() != Some(&"help") {
        return None;
    }
    cmd = with_every_text(cmd).mut_subcommand(*name, with_every_text);
    if plugin {
        cmd = cmd.bin_name("kubectl kproxy");
    }
    cmd.build();
    Some(cmd.find_subcommand_mut(name)?.render_help().to_string())
}

/// `cmd` with each of its own arguments as [`full_help`] lists it ([`every_text`]).
fn with_every_text(mut cmd: clap::Command) -> clap::Command {
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    for id in &ids {
        cmd = cmd.mut_arg(id, every_text);
    }
    cmd
}

/// An argument as [`full_help`] lists it: shown (unless hidden everywhere), with its whole text.
fn every_text(a: clap::Arg) -> clap::Arg {
    if a.is_hide_set() {
        return a;
    }
    // Paragraphs run on: a blank line per paragraph is what made clap's long layout long.
    let text = a
        .get_long_help()
        .or_else(|| a.get_help())
        .map(|t| t.to_string().replace("\n\n", " "));
    let a = a.hide_short_help(false);
    match text {
        Some(t) => a
            .help(t)
            .long_help(clap::builder::Resettable::<clap::builder::StyledStr>::Reset),
        None => a,
    }
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
    let mut cmd = command();
    if invoked_as_plugin() {
        cmd = cmd.bin_name("kubectl kproxy");
    }
    let matches = match cmd.try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            if e.kind() == clap::error::ErrorKind::DisplayHelp
                && let Some(text) = full_help(&argv, invoked_as_plugin())
            {
                let _ = common::write_stdout(&text);
                return Outcome::Clean.into();
            }
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
    crate::parsers::input::set_limits(cli.input.limits());
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
        Command::Monitor(a) => monitor::run(a, g),
        Command::Collect(a) => collect::run(a, g),
        Command::Completion(a) => completion::run(a, g),
    }
}

#[cfg(test)]
mod tests {
    use super::{Cli, command};
    use clap::Parser;

    /// The words of an example line: `'…'` quoting, `#` comments, `sudo` and the plugin name
    /// (`kubectl kproxy` / `kubectl-kproxy`) handled as a shell would; a pipe's or a
    /// redirection's first command is the example.
    pub(super) fn words(line: &str) -> Vec<String> {
        let line = line.split(" | ").next().unwrap_or(line);
        let line = line.split(" > ").next().unwrap_or(line);
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

    /// The example lines of a command's `-h` (the top level's included).
    pub(super) fn examples(cmd: &clap::Command) -> Vec<String> {
        let text = cmd
            .get_after_help()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let Some((_, examples)) = text.split_once("Examples:\n") else {
            return Vec::new();
        };
        // A line ending in ` \` continues on the next (each line is checked for width first).
        let lines: Vec<&str> = examples
            .lines()
            .take_while(|l| l.starts_with("  "))
            .collect();
        for l in &lines {
            assert!(l.chars().count() <= 80, "{}: {l}", cmd.get_name());
        }
        let mut out: Vec<String> = Vec::new();
        let mut open = false;
        for l in lines {
            match (open, out.last_mut()) {
                (true, Some(last)) => last.push_str(l.trim_start()),
                _ => out.push(l.to_string()),
            }
            open = l.ends_with(" \\");
            if open && let Some(last) = out.last_mut() {
                last.truncate(last.len() - 1);
            }
        }
        out
    }

    #[test]
    fn every_help_example_parses() {
        let cmd = command();
        let mut checked = 0;
        for sub in std::iter::once(&cmd).chain(cmd.get_subcommands()) {
            for line in examples(sub) {
                Cli::try_parse_from(words(&line)).unwrap_or_else(|e| panic!("{line}: {e}"));
                checked += 1;
            }
        }
        assert!(checked >= 20, "{checked} examples");
    }
}

#[cfg(test)]
mod help_tests {
    use super::tests::{examples, words};
    use super::{command, full_help};

    /// `-h` fits a screen, and the flags come in groups: the command's own first, the kubeconfig
    /// flags last (as kubectl prints them), then the examples.
    #[test]
    fn short_help_is_one_screen_with_connection_flags_last() {
        let mut cmd = command();
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

    /// The top level has examples; every example fits 80 columns (so no terminal wraps one
    /// inside its comment, [`examples`] checks it) and uses only flags its command's `-h`
    /// lists.
    #[test]
    fn examples_fit_and_use_the_flags_short_help_lists() {
        let mut cmd = command().term_width(200);
        cmd.build();
        assert!(!examples(&cmd).is_empty(), "the top level has examples");
        let mut listed = std::collections::BTreeMap::new();
        for sub in cmd.get_subcommands_mut() {
            let help = sub.render_help().to_string();
            let flags = help
                .split("\nExamples:")
                .next()
                .unwrap_or(&help)
                .to_string();
            listed.insert(sub.get_name().to_string(), flags);
        }
        let all: Vec<String> = std::iter::once(&cmd)
            .chain(cmd.get_subcommands())
            .flat_map(examples)
            .collect();
        for line in all {
            let argv = words(&line);
            let name = argv.get(1).expect("a command");
            let flags = listed.get(name).expect("a known command");
            for flag in argv.iter().filter(|w| w.starts_with('-')) {
                let flag = flag.split('=').next().unwrap_or(flag);
                assert!(
                    flags.contains(&format!("{flag} ")) || flags.contains(&format!("{flag},")),
                    "the example `{line}` uses {flag}, which `{name} -h` does not list"
                );
            }
        }
    }

    /// `trace`, `repair` and `collect` work on one node: their help lists no fleet flag;
    /// `completion` talks to no cluster: its help lists no kubeconfig flag.
    #[test]
    fn help_lists_only_flags_that_act() {
        let mut cmd = command();
        cmd.build();
        for name in ["trace", "repair", "collect", "verify"] {
            let sub = cmd.find_subcommand_mut(name).expect("subcommand");
            let short = sub.render_help().to_string();
            let long = sub.render_long_help().to_string();
            let full = full_help(
                &["kubectl-kproxy".into(), name.into(), "--help".into()],
                false,
            )
            .expect("full help");
            for text in [&short, &long, &full] {
                assert_eq!(
                    text.contains("--all-nodes"),
                    name == "verify",
                    "{name}:\n{text}"
                );
            }
        }
        let sub = cmd.find_subcommand_mut("completion").expect("completion");
        for text in [
            sub.render_help().to_string(),
            full_help(
                &[
                    "kubectl-kproxy".into(),
                    "completion".into(),
                    "--help".into(),
                ],
                false,
            )
            .expect("full help"),
        ] {
            for flag in [
                "--kubeconfig",
                "--context",
                "--namespace",
                "--request-timeout",
            ] {
                assert!(!text.contains(flag), "completion lists {flag}:\n{text}");
            }
            assert!(text.contains("kubectl_complete-kproxy"), "{text}");
        }
    }

    /// `COMMAND --help` lists every flag `-h` hides, compactly: at most 150 lines for any
    /// command (verify's ran to 213 in clap's long layout).
    #[test]
    fn full_help_lists_every_flag_in_a_compact_layout() {
        let cmd = command();
        for sub in cmd.get_subcommands() {
            let name = sub.get_name();
            let text = full_help(
                &["kubectl-kproxy".into(), name.into(), "--help".into()],
                false,
            )
            .expect("full help");
            let lines = text.lines().count();
            assert!(lines <= 150, "{name} --help: {lines} lines\n{text}");
            for arg in sub.get_arguments().filter(|a| !a.is_hide_set()) {
                if let Some(long) = arg.get_long() {
                    assert!(
                        text.contains(&format!("--{long}")),
                        "{name} --help lacks --{long}"
                    );
                }
            }
        }
        let verify = full_help(
            &["kubectl-kproxy".into(), "verify".into(), "--help".into()],
            false,
        )
        .expect("verify");
        for hidden in [
            "--kube-proxy-version",
            "--exec-timeout",
            "--request-timeout",
        ] {
            assert!(verify.contains(hidden), "{hidden}");
        }
        let help_verify = full_help(
            &["kubectl-kproxy".into(), "help".into(), "verify".into()],
            false,
        );
        assert_eq!(help_verify.as_deref(), Some(verify.as_str()));
        assert!(
            full_help(
                &["kubectl-kproxy".into(), "verify".into(), "-h".into()],
                false
            )
            .is_none()
        );
    }
}
