//! Shell completion.
//!
//! - `kubectl-kproxy completion bash|zsh|fish|…` prints a static completion script
//!   (clap_complete) for the binary name `kubectl-kproxy`.
//! - `kubectl kproxy <TAB>`: kubectl (≥ 1.26) runs `kubectl_complete-kproxy` from `PATH` with
//!   the words after `kproxy` plus the word being completed (`""` for a new word) and reads
//!   one candidate per line and a last `:<directive>` line (Cobra's ShellCompDirective:
//!   0 default/file completion, 4 no file completion). The shipped script
//!   `scripts/kubectl_complete-kproxy` runs the hidden `kubectl-kproxy __complete "$@"`,
//!   which completes subcommands, flags, flag values (namespaces for `-n`, contexts,
//!   clusters and users from the kubeconfig, enum values), node names (`verify`, `collect`)
//!   and `svc/NAME` (`trace`).

use super::common::GlobalArgs;
use crate::exit::Outcome;
use clap::Args;
use std::io::Write;

/// Arguments of `completion`.
#[derive(Debug, Args)]
#[command(
    // It talks to no cluster: no kubeconfig flags in its help.
    override_usage = "kubectl kproxy completion <SHELL>",
    help_template = "{about-with-newline}\n{usage-heading} {usage}\n\nArguments:\n{positionals}{after-help}",
    after_help = "\
Examples:
  kubectl-kproxy completion bash > /etc/bash_completion.d/kubectl-kproxy
  kubectl-kproxy completion zsh > ~/.zfunc/_kubectl-kproxy

`kubectl kproxy <TAB>` (kubectl 1.26+) runs kubectl_complete-kproxy from PATH. The
release archives hold it; krew links only the plugin, so link it too:
  ln -s ~/.krew/store/kproxy/vX.Y.Z/kubectl_complete-kproxy ~/.krew/bin/
From a source tree: install -m 0755 scripts/kubectl_complete-kproxy /usr/local/bin/")]
pub struct CompletionArgs {
    /// The shell to generate a script for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Runs `completion`.
pub fn run(args: CompletionArgs, _global: &GlobalArgs) -> anyhow::Result<Outcome> {
    std::io::stdout()
        .lock()
        .write_all(&static_script(args.shell))?;
    Ok(Outcome::Clean)
}

/// The binary name the static scripts complete.
const BIN_NAME: &str = "kubectl-kproxy";

/// The static completion script for `shell`, for the binary `kubectl-kproxy`.
///
/// clap_complete's bash generator spells the state of its word loop (`kubectl__kproxy…`) and
/// the `case` labels it is matched against (`kubectl__subcmd__kproxy…`) differently when the
/// binary name holds a `-` (clap-rs/clap#6421), so nothing after the first word would
/// complete. The bash script is therefore generated for `kubectl_kproxy`, whose two spellings
/// agree, and only its `complete -F` registration is pointed back at `kubectl-kproxy` (the
/// loop matches the first word against `$1`, the name bash passes, never the generated name).
pub fn static_script(shell: clap_complete::Shell) -> Vec<u8> {
    let mut cmd = super::command();
    let generated_name = match shell {
        clap_complete::Shell::Bash => BIN_NAME.replace('-', "_"),
        _ => BIN_NAME.to_string(),
    };
    // Generated into memory: clap_complete panics when its writer fails (`| head`).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, generated_name.as_str(), &mut script);
    if generated_name == BIN_NAME {
        return script;
    }
    let text = String::from_utf8_lossy(&script);
    let suffix = format!(" {generated_name}");
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let registration = line.trim_start().starts_with("complete -F ");
        match line.strip_suffix(suffix.as_str()) {
            Some(head) if registration => out.push_str(&format!("{head} {BIN_NAME}")),
            _ => out.push_str(line),
        }
        out.push('\n');
    }
    out.into_bytes()
}

/// The words of a `__complete` call (Cobra protocol for kubectl plugin completion).
#[derive(Debug)]
pub struct CobraCompleteArgs {
    /// The words after `kproxy`; the last is the word being completed.
    pub words: Vec<String>,
}

/// The hidden command's name. It is not a clap subcommand, so that neither `--help` nor the
/// static completion scripts offer it: `cli::main` routes it before clap parses anything.
pub const COBRA_COMMAND: &str = "__complete";

/// Entry point for `kubectl-kproxy __complete WORDS…`, called by `cli::main` before clap
/// parses anything (the words contain flags such as `--context` that clap would take).
pub fn cobra_main(words: &[std::ffi::OsString]) -> Outcome {
    use clap::Parser;
    let global = match super::Cli::try_parse_from(["kubectl-kproxy", "completion", "bash"]) {
        Ok(cli) => cli.global,
        Err(_) => return Outcome::Error,
    };
    let words = words
        .iter()
        .map(|w| w.to_string_lossy().into_owned())
        .collect();
    run_cobra(CobraCompleteArgs { words }, &global).unwrap_or(Outcome::Error)
}

/// Cobra `ShellCompDirectiveDefault`: the shell may complete file names.
pub const DIRECTIVE_DEFAULT: u32 = 0;
/// Cobra `ShellCompDirectiveNoFileComp`.
pub const DIRECTIVE_NO_FILE: u32 = 4;

/// Runs `__complete`: prints candidates, one per line, then `:<directive>`.
pub fn run_cobra(args: CobraCompleteArgs, global: &GlobalArgs) -> anyhow::Result<Outcome> {
    let (candidates, directive) = complete(&args.words, global);
    let mut out = std::io::stdout().lock();
    for c in candidates {
        let _ = writeln!(out, "{c}");
    }
    let _ = writeln!(out, ":{directive}");
    Ok(Outcome::Clean)
}

/// What the word being completed is.
#[derive(Debug, PartialEq, Eq)]
enum Slot {
    Subcommand,
    Flag,
    FlagValue(String),
    Positional { command: String, index: usize },
}

/// Computes the candidates and directive for `words` (the last is the partial word).
pub fn complete(words: &[String], global: &GlobalArgs) -> (Vec<String>, u32) {
    let (partial, before) = match words.split_last() {
        Some((p, b)) => (p.as_str(), b),
        None => ("", &[][..]),
    };
    let root = super::command();
    let flags = Flags::scan(before, &root);
    let sub = flags
        .command
        .as_deref()
        .and_then(|c| root.find_subcommand(c));
    let slot = if let Some(flag) = &flags.pending_value {
        Slot::FlagValue(flag.clone())
    } else if partial.starts_with('-') {
        Slot::Flag
    } else if let Some(command) = &flags.command {
        Slot::Positional {
            command: command.clone(),
            index: flags.positionals,
        }
    } else {
        Slot::Subcommand
    };
    let mut g = global.clone();
    flags.apply(&mut g);
    let (mut list, directive) = match slot {
        Slot::Subcommand => (
            root.get_subcommands()
                .filter(|s| !s.is_hide_set())
                .map(|s| s.get_name().to_string())
                .collect(),
            DIRECTIVE_NO_FILE,
        ),
        Slot::Flag => {
            let mut names: Vec<String> = root
                .get_arguments()
                .chain(sub.into_iter().flat_map(|s| s.get_arguments()))
                .filter(|a| !a.is_hide_set())
                .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
                .collect();
            names.sort();
            names.dedup();
            (names, DIRECTIVE_NO_FILE)
        }
        Slot::FlagValue(flag) => flag_values(&flag, &root, sub, &g),
        Slot::Positional { command, index } => {
            (positionals(&command, index, &g), DIRECTIVE_NO_FILE)
        }
    };
    list.retain(|c| c.starts_with(partial));
    (list, directive)
}

/// What the words before the cursor say.
#[derive(Debug, Default)]
struct Flags {
    command: Option<String>,
    positionals: usize,
    pending_value: Option<String>,
    values: Vec<(String, String)>,
}

impl Flags {
    fn scan(words: &[String], root: &clap::Command) -> Flags {
        let mut f = Flags::default();
        let mut it = words.iter().peekable();
        while let Some(w) = it.next() {
            if let Some(flag) = w.strip_prefix("--").or_else(|| w.strip_prefix('-')) {
                if flag.is_empty() {
                    continue;
                }
                let (name, inline) = match flag.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (flag, None),
                };
                let sub = f.command.as_deref().and_then(|c| root.find_subcommand(c));
                let Some(long) = lookup_flag(name, w.starts_with("--"), root, sub) else {
                    continue;
                };
                if !takes_value(&long, root, sub) {
                    continue;
                }
                match inline.or_else(|| it.next().cloned()) {
                    Some(v) => f.values.push((long, v)),
                    None => f.pending_value = Some(long),
                }
            } else if f.command.is_none() {
                f.command = Some(w.clone());
            } else {
                f.positionals += 1;
            }
        }
        f
    }

    fn apply(&self, g: &mut GlobalArgs) {
        for (k, v) in &self.values {
            match k.as_str() {
                "kubeconfig" => g.kubeconfig = Some(v.into()),
                "context" => g.context = Some(v.clone()),
                "cluster" => g.cluster = Some(v.clone()),
                "user" => g.user = Some(v.clone()),
                "namespace" => g.namespace = Some(v.clone()),
                "request-timeout" => g.request_timeout = v.clone(),
                _ => {}
            }
        }
        if g.request_timeout == "0" {
            g.request_timeout = "5s".into();
        }
    }
}

fn all_args<'a>(
    root: &'a clap::Command,
    sub: Option<&'a clap::Command>,
) -> impl Iterator<Item = &'a clap::Arg> {
    root.get_arguments()
        .chain(sub.into_iter().flat_map(|s| s.get_arguments()))
}

/// The long name of flag `name` (`n` → `namespace`), when it is known.
fn lookup_flag(
    name: &str,
    is_long: bool,
    root: &clap::Command,
    sub: Option<&clap::Command>,
) -> Option<String> {
    all_args(root, sub)
        .find(|a| {
            if is_long {
                a.get_long() == Some(name)
            } else {
                a.get_short().map(String::from).as_deref() == Some(name)
            }
        })
        .map(|a| {
            a.get_long()
                .map(str::to_string)
                .unwrap_or_else(|| a.get_id().to_string())
        })
}

fn takes_value(long: &str, root: &clap::Command, sub: Option<&clap::Command>) -> bool {
    all_args(root, sub)
        .find(|a| a.get_long() == Some(long))
        .is_some_and(|a| a.get_action().takes_values())
}

fn flag_values(
    flag: &str,
    root: &clap::Command,
    sub: Option<&clap::Command>,
    g: &GlobalArgs,
) -> (Vec<String>, u32) {
    match flag {
        "namespace" => (live_list(g, Lookup::Namespaces), DIRECTIVE_NO_FILE),
        "node" => (live_list(g, Lookup::Nodes), DIRECTIVE_NO_FILE),
        "context" | "cluster" | "user" => (kubeconfig_names(g, flag), DIRECTIVE_NO_FILE),
        _ => {
            let Some(arg) = all_args(root, sub).find(|a| a.get_long() == Some(flag)) else {
                return (Vec::new(), DIRECTIVE_DEFAULT);
            };
            let values: Vec<String> = arg
                .get_possible_values()
                .into_iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_string())
                .collect();
            if !values.is_empty() {
                return (values, DIRECTIVE_NO_FILE);
            }
            match arg.get_value_hint() {
                clap::ValueHint::FilePath | clap::ValueHint::AnyPath | clap::ValueHint::Unknown
                    if looks_like_path(arg) =>
                {
                    (Vec::new(), DIRECTIVE_DEFAULT)
                }
                _ => (Vec::new(), DIRECTIVE_NO_FILE),
            }
        }
    }
}

fn looks_like_path(arg: &clap::Arg) -> bool {
    arg.get_value_names().into_iter().flatten().any(|v| {
        v.as_str().contains("FILE") || v.as_str().contains("PATH") || v.as_str().contains("DIR")
    }) || arg.get_long() == Some("kubeconfig")
}

fn positionals(command: &str, index: usize, g: &GlobalArgs) -> Vec<String> {
    match (command, index) {
        ("verify" | "collect", 0) => live_list(g, Lookup::Nodes),
        ("trace", 0) => live_list(g, Lookup::Services)
            .into_iter()
            .map(|s| format!("svc/{s}"))
            .collect(),
        ("completion", 0) => ["bash", "zsh", "fish", "elvish", "powershell"]
            .into_iter()
            .map(String::from)
            .collect(),
        _ => Vec::new(),
    }
}

enum Lookup {
    Nodes,
    Namespaces,
    Services,
}

/// Names from the API; empty on any error (completion must never print errors).
fn live_list(g: &GlobalArgs, what: Lookup) -> Vec<String> {
    let Ok(rt) = super::live::runtime() else {
        return Vec::new();
    };
    rt.block_on(async {
        let Ok(conn) = crate::kube_client::connect(&g.client_options()).await else {
            return Vec::new();
        };
        let names = match what {
            Lookup::Nodes => crate::collect::api::list_nodes(&conn, None)
                .await
                .map(|ns| ns.into_iter().filter_map(|n| n.metadata.name).collect()),
            Lookup::Namespaces => crate::collect::api::list_namespace_names(&conn).await,
            Lookup::Services => {
                let ns = g
                    .namespace
                    .clone()
                    .unwrap_or_else(|| conn.client.default_namespace().to_string());
                crate::collect::api::list_service_names(&conn, &ns).await
            }
        };
        let mut names = names.unwrap_or_default();
        names.sort();
        names
    })
}

fn kubeconfig_names(g: &GlobalArgs, what: &str) -> Vec<String> {
    let kc = match &g.kubeconfig {
        Some(p) => std::env::split_paths(p.as_os_str())
            .filter_map(|p| kube::config::Kubeconfig::read_from(p).ok())
            .reduce(|a, b| a.merge(b.clone()).unwrap_or(b)),
        None => kube::config::Kubeconfig::read().ok(),
    };
    let Some(kc) = kc else {
        return Vec::new();
    };
    let mut names: Vec<String> = match what {
        "context" => kc.contexts.into_iter().map(|c| c.name).collect(),
        "cluster" => kc.clusters.into_iter().map(|c| c.name).collect(),
        _ => kc.auth_infos.into_iter().map(|u| u.name).collect(),
    };
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn g() -> GlobalArgs {
        super::super::Cli::parse_from(["kubectl-kproxy", "completion", "bash"]).global
    }

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn subcommands_and_flags() {
        let (c, d) = complete(&words(&["ver"]), &g());
        assert_eq!(c, vec!["verify".to_string()]);
        assert_eq!(d, DIRECTIVE_NO_FILE);
        assert!(
            !complete(&words(&[""]), &g())
                .0
                .contains(&"__complete".to_string())
        );
        let (c, _) = complete(&words(&["collect", "--coll"]), &g());
        assert_eq!(c, vec!["--collector".to_string()]);
    }

    #[test]
    fn enum_values_and_paths() {
        let (c, d) = complete(&words(&["collect", "--collector", "d"]), &g());
        assert_eq!((c, d), (vec!["debug-pod".to_string()], DIRECTIVE_NO_FILE));
        let (c, d) = complete(&words(&["collect", "--bundle", ""]), &g());
        assert_eq!((c.len(), d), (0, DIRECTIVE_DEFAULT));
    }
}
