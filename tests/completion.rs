//! Shell completion as a shell runs it: the static bash script of `completion bash` sourced into
//! a real bash, and `kubectl kproxy <TAB>` through kubectl's own bash completion, which asks
//! `kubectl __complete kproxy …`, which runs `scripts/kubectl_complete-kproxy`, which runs the
//! hidden `kubectl-kproxy __complete` (Cobra's protocol).

use std::path::{Path, PathBuf};
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_kubectl-kproxy")
}

fn find(tool: &str) -> Option<PathBuf> {
    crate::support::netns::find_tool(tool)
}

/// Runs `script` in a non-interactive bash with `dir` first on PATH and HOME in a temporary
/// directory (no kubeconfig: nothing may reach a cluster); returns stdout.
fn bash(dir: &Path, script: &str) -> String {
    let path = std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .expect("PATH");
    let out = Command::new(find("bash").expect("bash"))
        .arg("--norc")
        .arg("--noprofile")
        .arg("-c")
        .arg(script)
        .env("PATH", path)
        .env("HOME", dir)
        .env("KUBECONFIG", dir.join("no-kubeconfig"))
        .env_remove("BASH_ENV")
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "bash failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        script
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// Bash code that completes the command line `words` (cursor at its end) with the function
/// registered for `words[0]` — as bash does on <TAB> — and prints COMPREPLY one per line.
fn complete_line(words: &[&str]) -> String {
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let line = words.join(" ");
    format!(
        r#"COMP_WORDS=({words})
COMP_CWORD={cword}
COMP_LINE='{line}'
COMP_POINT=${{#COMP_LINE}}
COMPREPLY=()
spec=$(complete -p {cmd}) || {{ echo "no completion registered for {cmd}" >&2; exit 3; }}
fn=$(printf '%s\n' "$spec" | sed -n 's/.* -F \([^ ]*\) .*/\1/p')
"$fn" {cmd} '{cur}' '{prev}' 2>/dev/null
printf '%s\n' "${{COMPREPLY[@]}}"
"#,
        words = quoted.join(" "),
        cword = words.len() - 1,
        cmd = words[0],
        cur = words[words.len() - 1],
        prev = words[words.len().saturating_sub(2)],
    )
}

fn lines(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect()
}

/// The static script: `kubectl-kproxy verify --<TAB>` offers verify's own flags (clap_complete's
/// bash script used to lose its state after the first word when the binary name has a `-`),
/// and the hidden `__complete` is offered nowhere.
#[test]
fn static_bash_completion_completes_subcommand_flags() {
    if find("bash").is_none() {
        crate::support::skip("completion", "bash not installed");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(bin())
        .args(["completion", "bash"])
        .output()
        .expect("completion bash");
    assert!(out.status.success());
    let script = dir.path().join("kubectl-kproxy.bash");
    std::fs::write(&script, &out.stdout).expect("write script");
    let run = |words: &[&str]| {
        bash(
            dir.path(),
            &format!(". '{}'\n{}", script.display(), complete_line(words)),
        )
    };

    let verify = run(&["kubectl-kproxy", "verify", "--"]);
    let verify = lines(&verify);
    for flag in [
        "--state",
        "--iptables-save",
        "--all-nodes",
        "--kubeconfig",
        "--output",
    ] {
        assert!(
            verify.contains(&flag),
            "verify --<TAB> lacks {flag}: {verify:?}"
        );
    }
    assert!(
        !verify.contains(&"--packet"),
        "trace's flags offered for verify: {verify:?}"
    );

    let trace = run(&["kubectl-kproxy", "trace", "--pac"]);
    assert_eq!(lines(&trace), ["--packet"]);

    let shells = run(&["kubectl-kproxy", "completion", "f"]);
    assert_eq!(lines(&shells), ["fish"]);

    let top = run(&["kubectl-kproxy", ""]);
    let top = lines(&top);
    assert!(top.contains(&"verify") && top.contains(&"trace"), "{top:?}");
    assert!(!top.contains(&"__complete"), "{top:?}");
    let help = run(&["kubectl-kproxy", "help", ""]);
    let help = lines(&help);
    assert!(help.contains(&"repair"), "{help:?}");
    assert!(!help.contains(&"__complete"), "{help:?}");
}

/// No generated script, and no help text, names the hidden command; it still answers.
#[test]
fn hidden_complete_command_is_not_offered() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = Command::new(bin())
            .args(["completion", shell])
            .output()
            .expect("completion");
        assert!(out.status.success(), "{shell}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("kubectl-kproxy"), "{shell}");
        assert!(!text.contains("__complete"), "{shell} offers __complete");
    }
    let help = Command::new(bin()).arg("--help").output().expect("help");
    assert!(!String::from_utf8_lossy(&help.stdout).contains("__complete"));
    let out = Command::new(bin())
        .args(["__complete", "ver"])
        .output()
        .expect("__complete");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "verify\n:4\n");
}

/// `kubectl kproxy trace --<TAB>` in bash: kubectl's completion script (which needs the
/// bash-completion package, as kubectl's docs say) calls `kubectl __complete kproxy trace --`,
/// kubectl runs `kubectl_complete-kproxy` from PATH, and the candidates come back.
#[test]
fn kubectl_plugin_completion_in_bash() {
    let bash_completion = Path::new("/usr/share/bash-completion/bash_completion");
    for (what, present) in [
        ("bash", find("bash").is_some()),
        ("kubectl", find("kubectl").is_some()),
        ("bash-completion", bash_completion.is_file()),
    ] {
        if !present {
            crate::support::skip("completion", &format!("{what} not installed"));
            return;
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(bin(), dir.path().join("kubectl-kproxy")).expect("symlink");
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kubectl_complete-kproxy");
    let helper = dir.path().join("kubectl_complete-kproxy");
    crate::support::install_executable(&shipped, &helper);
    let run = |words: &[&str]| {
        bash(
            dir.path(),
            &format!(
                ". '{}'\n. <(kubectl completion bash)\n{}",
                bash_completion.display(),
                complete_line(words)
            ),
        )
    };

    let trace = run(&["kubectl", "kproxy", "trace", "--"]);
    let trace = lines(&trace);
    for flag in ["--packet", "--node", "--iptables-save", "--context"] {
        assert!(
            trace.contains(&flag),
            "trace --<TAB> lacks {flag}: {trace:?}"
        );
    }

    let verify = run(&["kubectl", "kproxy", "verify", "--ipt"]);
    let verify = lines(&verify);
    assert!(verify.contains(&"--iptables-save"), "{verify:?}");
    assert!(verify.iter().all(|c| c.starts_with("--ipt")), "{verify:?}");

    let top = run(&["kubectl", "kproxy", ""]);
    let top = lines(&top);
    assert!(
        top.contains(&"verify") && top.contains(&"collect"),
        "{top:?}"
    );
    assert!(!top.contains(&"__complete"), "{top:?}");
}
