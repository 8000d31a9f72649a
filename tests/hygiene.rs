//! The repository stands on its own: no generated files are tracked, every `docs/*.md` the docs
//! and the code cite exists here, the incident classes the findings name are documented, and the
//! IPVS example of docs/ipvs.md runs from the repository alone (no `../shared`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Files under `dir` (relative to the repository) whose name ends with one of `exts`.
fn files_under(dir: &str, exts: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![repo().join(dir)];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if exts.iter().any(|x| p.to_string_lossy().ends_with(x)) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_python_bytecode_is_tracked() {
    let gitignore = read(".gitignore");
    assert!(
        gitignore.lines().any(|l| l.trim() == "__pycache__/"),
        ".gitignore must ignore __pycache__/"
    );
    if !repo().join(".git").exists() {
        crate::support::skip("hygiene", "skipped the git check: not a git checkout");
        return;
    }
    let out = Command::new("git")
        .arg("-C")
        .arg(repo())
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tracked: Vec<String> = out
        .stdout
        .split(|b| *b == 0)
        .map(|f| String::from_utf8_lossy(f).into_owned())
        .filter(|f| f.contains("__pycache__/") || f.ends_with(".pyc"))
        .collect();
    assert!(
        tracked.is_empty(),
        "generated files are tracked: {tracked:?}"
    );
}

/// `docs/<name>.md` cited anywhere (README, docs, code, scripts) and `[..](<name>.md)` links inside
/// docs/ name files of this repository; `../shared/docs/…` is the reference material, not ours.
#[test]
fn cited_docs_exist_in_the_repository() {
    let cite = regex::Regex::new(r"(\.\./shared/)?\bdocs/([A-Za-z0-9_-]+\.md)").expect("regex");
    let link = regex::Regex::new(r"\]\(([A-Za-z0-9_-]+\.md)(#[^)]*)?\)").expect("regex");
    let mut files = vec![repo().join("README.md"), repo().join("BENCHMARKS.md")];
    for (dir, exts) in [
        ("docs", &[".md"][..]),
        ("src", &[".rs"]),
        ("crates", &[".rs"]),
        ("parsers/src", &[".rs"]),
        ("tests", &[".rs"]),
        ("testdata", &[".sh", ".py"]),
        ("scripts", &[".sh"]),
    ] {
        files.extend(files_under(dir, exts));
    }
    let mut missing = BTreeSet::new();
    let mut cited = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for c in cite.captures_iter(&text) {
            if c.get(1).is_some() {
                continue;
            }
            cited += 1;
            if !repo().join("docs").join(&c[2]).is_file() {
                missing.insert(format!("{} cites docs/{}", f.display(), &c[2]));
            }
        }
        if f.parent() == Some(repo().join("docs").as_path()) {
            for c in link.captures_iter(&text) {
                cited += 1;
                if !repo().join("docs").join(&c[1]).is_file() {
                    missing.insert(format!("{} links {}", f.display(), &c[1]));
                }
            }
        }
    }
    assert!(missing.is_empty(), "{missing:#?}");
    assert!(cited > 10, "the scan found only {cited} citations");
}

/// `KP101–KP106` → every catalogue ID in that range; `KP108` → itself.
fn expand_ids(list: &str, known: &BTreeSet<String>) -> Vec<String> {
    let mut out = Vec::new();
    let id = regex::Regex::new(r"KP(\d{3})(?:–KP(\d{3}))?").expect("regex");
    for c in id.captures_iter(list) {
        let lo: u32 = c[1].parse().expect("number");
        let hi: u32 = c.get(2).map_or(lo, |m| m.as_str().parse().expect("number"));
        let span: Vec<String> = known
            .iter()
            .filter(|k| k[2..].parse::<u32>().is_ok_and(|n| (lo..=hi).contains(&n)))
            .cloned()
            .collect();
        assert!(
            span.iter().any(|k| k[2..].parse::<u32>() == Ok(lo))
                && span.iter().any(|k| k[2..].parse::<u32>() == Ok(hi)),
            "docs/incidents.md names {} which the catalogue does not have",
            &c[0]
        );
        out.extend(span);
    }
    out
}

/// Every incident class the findings catalogue names is described in docs/incidents.md, and
/// each class's "Findings:" line names only findings whose incidents column has that class.
#[test]
fn incident_classes_are_documented() {
    let findings = read("docs/findings.md");
    let mut classes_of: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let class = regex::Regex::new(r"F\d\d").expect("regex");
    for line in findings.lines().filter(|l| l.starts_with("| KP")) {
        let cols: Vec<&str> = line.split('|').map(str::trim).collect();
        let set = classes_of.entry(cols[1].to_string()).or_default();
        for f in class.find_iter(cols[4]) {
            set.insert(f.as_str().to_string());
        }
    }
    assert!(classes_of.len() > 50, "findings.md table not found");
    let known: BTreeSet<String> = classes_of.keys().cloned().collect();

    let incidents = read("docs/incidents.md");
    let mut documented = BTreeSet::new();
    let mut current: Option<String> = None;
    for line in incidents.lines() {
        if let Some(rest) = line.strip_prefix("### ") {
            let f = rest.split_whitespace().next().unwrap_or("").to_string();
            assert!(class.is_match(&f), "heading without a class: {line}");
            documented.insert(f.clone());
            current = Some(f);
        } else if let Some(list) = line.strip_prefix("Findings: ") {
            let f = current.clone().expect("Findings line outside a class");
            for id in expand_ids(list, &known) {
                assert!(
                    classes_of[&id].contains(&f),
                    "docs/incidents.md lists {id} under {f}, but findings.md does not"
                );
            }
        }
    }
    let named: BTreeSet<String> = classes_of.values().flatten().cloned().collect();
    let undocumented: Vec<&String> = named.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/incidents.md: {undocumented:?}"
    );
    assert_eq!(documented.len(), 23, "F01–F23");
}

/// The commands of docs/ipvs.md's example block, run by bash from the repository root with
/// `kubectl-kproxy` on PATH; returns (exit code, stdout) per command.
fn run_ipvs_example() -> Vec<(String, i32, String)> {
    let doc = read("docs/ipvs.md");
    let block = doc
        .split("repository's own IPVS example")
        .nth(1)
        .and_then(|rest| rest.split("```sh\n").nth(1))
        .and_then(|b| b.split("```").next())
        .expect("docs/ipvs.md: the example block");
    let joined = block.replace("\\\n", " ");
    let mut lines = joined.lines().map(str::trim).filter(|l| !l.is_empty());
    let assignment = lines.next().expect("D=…").to_string();
    assert!(assignment.starts_with("D="), "{assignment}");
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_kubectl-kproxy"),
        dir.path().join("kubectl-kproxy"),
    )
    .expect("symlink");
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    lines
        .map(|cmd| {
            let out = Command::new("bash")
                .arg("-c")
                .arg(format!("{assignment}\n{cmd}"))
                .current_dir(repo())
                .env("PATH", &path)
                .env("NO_COLOR", "1")
                .output()
                .expect("bash");
            (
                cmd.to_string(),
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        })
        .collect()
}

#[test]
fn ipvs_example_runs_from_the_repository_alone() {
    let case = repo().join("testdata/ipvs/example-cluster");
    let state = case.join("state.json").canonicalize().expect("state.json");
    assert!(
        state.starts_with(repo().canonicalize().expect("repo")),
        "the example's state must be the repository's: {}",
        state.display()
    );
    // config.yaml is the example cluster's configuration with mode ipvs (make-example-inputs.sh).
    let strip = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with('#'))
            .map(str::to_string)
            .collect()
    };
    let base = strip(&read("testdata/cluster/config.yaml"));
    let ipvs = strip(&read("testdata/ipvs/example-cluster/config.yaml"));
    let switched: Vec<String> = base
        .iter()
        .map(|l| {
            if l == "mode: iptables" {
                "mode: ipvs".into()
            } else {
                l.clone()
            }
        })
        .collect();
    assert_eq!(ipvs[..switched.len()], switched[..]);
    assert_eq!(ipvs[switched.len()], "ipvs:");

    if crate::support::tool("hygiene", "bash").is_none() {
        return;
    }
    let runs = run_ipvs_example();
    assert_eq!(runs.len(), 4, "{runs:#?}");
    let (cmd, code, out) = &runs[0];
    assert_eq!(*code, 0, "{cmd}\n{out}");
    assert!(out.contains("0 errors, 0 warnings"), "{out}");
    let (cmd, code, out) = &runs[1];
    assert_eq!(*code, 1, "{cmd}\n{out}");
    assert!(out.contains("KP509") && out.contains("1 error"), "{out}");
    let (cmd, code, out) = &runs[2];
    assert_eq!(*code, 0, "{cmd}\n{out}");
    assert!(
        out.contains("TCP 10.96.0.10:53") && out.contains("Masq"),
        "{out}"
    );
    let (cmd, code, out) = &runs[3];
    assert_eq!(*code, 0, "{cmd}\n{out}");
    assert!(out.starts_with("UDP 10.96.0.10:53  scheduler rr"), "{out}");
}

/// The `crate::<module>` paths `file` names outside comments: the modules of its crate it uses.
fn crate_modules_used(file: &std::path::Path) -> BTreeSet<String> {
    let path = regex::Regex::new(r"\bcrate::([a-z_]+)").expect("regex");
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .flat_map(|l| {
            path.captures_iter(l)
                .map(|c| c[1].to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The files of module `module` (a folder or a `.rs` file) under a crate's `src`.
fn module_files(src: &str, module: &str) -> Vec<PathBuf> {
    let file = repo().join(src).join(format!("{module}.rs"));
    if file.is_file() {
        vec![file]
    } else {
        files_under(&format!("{src}/{module}"), &[".rs"])
    }
}

/// README "Architecture": each layer uses only the ones below it. Between crates the compiler
/// keeps the order (kproxy-parsers ← kproxy-core ← kproxy-analysis ← kproxy-node ← the `kproxy`
/// library with output/ ← the binary with cli/); inside a crate, this test does: no module names
/// a module of its crate that it must not use (the observed side, graph/, and the expected side,
/// proxier/, know nothing of each other).
#[test]
fn no_module_uses_a_layer_above_it() {
    // (crate src, module, modules of the same crate it must not use)
    let rules: &[(&str, &str, &[&str])] = &[
        (
            "crates/kproxy-core/src",
            "model",
            &["state", "proxier", "graph"],
        ),
        ("crates/kproxy-core/src", "state", &["proxier", "graph"]),
        ("crates/kproxy-core/src", "proxier", &["graph"]),
        ("crates/kproxy-core/src", "graph", &["state", "proxier"]),
        ("crates/kproxy-analysis/src", "exit", &["compare", "trace"]),
        ("crates/kproxy-analysis/src", "compare", &["trace"]),
        ("crates/kproxy-analysis/src", "trace", &["compare"]),
        (
            "crates/kproxy-node/src",
            "kube_client",
            &["collect", "apply", "pipeline"],
        ),
        ("crates/kproxy-node/src", "collect", &["apply", "pipeline"]),
        ("crates/kproxy-node/src", "apply", &["pipeline"]),
        ("crates/kproxy-node/src", "publish", &["apply", "pipeline"]),
        // The monitor's state machine and metrics know nothing of how a report is made or
        // where its inputs come from.
        (
            "crates/kproxy-monitor/src",
            "tracker",
            &["agent", "sources", "server", "status", "metrics"],
        ),
        (
            "crates/kproxy-monitor/src",
            "metrics",
            &["agent", "sources", "server", "status"],
        ),
    ];
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (src, module, above) in rules {
        let files = module_files(src, module);
        assert!(!files.is_empty(), "{src}/{module}: no such module");
        for f in files {
            checked += 1;
            for used in crate_modules_used(&f) {
                if above.contains(&used.as_str()) {
                    wrong.push(format!("{} uses crate::{used}", f.display()));
                }
            }
        }
    }
    assert!(checked > 60, "only {checked} files checked");
    assert!(
        wrong.is_empty(),
        "a layer uses one above it:\n{}",
        wrong.join("\n")
    );
}

/// README "Architecture": `collect/`, `kube_client.rs` and `publish.rs` (kproxy-node) are the
/// only code that runs programs, calls the API or reads another process's `/proc` entries
/// (`publish.rs` only writes the monitor's Events and node condition); the rest reads only the
/// files it is given.
#[test]
fn only_collect_and_the_client_run_programs_or_call_the_api() {
    let io = regex::Regex::new(
        r#"Command::new|std::process::Command|tokio::process|kube::api::|kube::runtime|\bApi::<|\bApi<|read_dir\("/proc"\)"#,
    )
    .expect("regex");
    let allowed = [
        repo().join("crates/kproxy-node/src/collect"),
        repo().join("crates/kproxy-node/src/kube_client.rs"),
        repo().join("crates/kproxy-node/src/publish.rs"),
    ];
    let mut found = Vec::new();
    let mut checked = 0;
    for dir in ["src", "crates", "parsers/src"] {
        for f in files_under(dir, &[".rs"]) {
            if allowed.iter().any(|a| f.starts_with(a)) {
                continue;
            }
            checked += 1;
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            for (n, line) in text.lines().enumerate() {
                if !line.trim_start().starts_with("//") && io.is_match(line) {
                    found.push(format!("{}:{}: {}", f.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(checked > 100, "only {checked} files checked");
    assert!(
        found.is_empty(),
        "I/O outside collect/, kube_client.rs and publish.rs:\n{}",
        found.join("\n")
    );
}
