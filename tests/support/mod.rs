//! Shared helpers for the integration tests.
//!
//! - [`repair`]: the example cluster's files, foreign rules, topology and output helpers of the
//!   `repair` tests (on this host and through the API).
//! - [`ipvs`]: where the IPVS conformance cases and real dumps are; the IPVS VM's tools.
//! - [`netns`]: real-netfilter harness — network namespaces, `iptables-restore`/`iptables-save`
//!   with the nf_tables and legacy backends, a node/client/pods topology with echo servers, and
//!   TCP/UDP probes. See `docs/testing.md` for a walk-through.
//!
//! Not every test module uses every helper, hence the `dead_code` allowance.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};

pub mod fake_apiserver;
pub mod ipvs;
pub mod netns;
pub mod repair;

/// Reports that a test could not run because a prerequisite is missing. Under
/// `KPROXY_REQUIRE_ALL=1` (set by `.ci/run`) that is a failure: a vanished tool, VM or
/// `../shared` must not turn tests green. Otherwise the reason is written straight to stderr,
/// past libtest's capture, so a local run shows every skip.
pub fn skip(test: &str, reason: &str) {
    if std::env::var_os("KPROXY_REQUIRE_ALL").is_some_and(|v| v != "0") {
        panic!("{test}: prerequisite missing under KPROXY_REQUIRE_ALL: {reason}");
    }
    let _ = writeln!(std::io::stderr(), "skipped: {test}: {reason}");
}

/// The path of the program `name` (on `PATH` or in the sbin directories), or `None` after
/// [`skip`]: every program a test runs besides the binary under test is a prerequisite.
pub fn tool(test: &str, name: &str) -> Option<PathBuf> {
    let found = netns::find_tool(name);
    if found.is_none() {
        skip(
            test,
            &format!("`{name}` is not installed (.ci/run installs it)"),
        );
    }
    found
}

/// `../shared/<sub>` (the reference material beside the project), or `None` after [`skip`].
pub fn shared(test: &str, sub: &str) -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared")
        .join(sub);
    if p.exists() {
        Some(p)
    } else {
        skip(test, &format!("{} is absent", p.display()));
        None
    }
}

/// Copies `from` to `to` as an executable (mode 0755) with the `install` program, so that no
/// file descriptor of this process ever has `to` open for writing. Writing it here would race
/// with the tests running beside us: a child forked by another test thread inherits the open
/// descriptor until it execs, and running `to` in that window fails with "Text file busy".
pub fn install_executable(from: &Path, to: &Path) {
    let status = std::process::Command::new("install")
        .arg("-m")
        .arg("0755")
        .arg(from)
        .arg(to)
        .status()
        .expect("run install");
    assert!(
        status.success(),
        "install {} {}",
        from.display(),
        to.display()
    );
}

/// Writes `text` to `to` as an executable script, through [`install_executable`].
pub fn write_executable(to: &Path, text: &str) {
    let staged = to.with_extension("staged");
    std::fs::write(&staged, text).expect("write the staged script");
    install_executable(&staged, to);
    std::fs::remove_file(&staged).expect("remove the staged script");
}

/// A path of the repository.
pub fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The example cluster's API state and kube-proxy configuration, as command-line flags.
pub const EXAMPLE_STATE: [&str; 4] = [
    "--state",
    "testdata/cluster/state.json",
    "--config",
    "testdata/cluster/config.yaml",
];

/// The release-or-debug binary under test.
pub fn kproxy() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
}

/// What a run of the binary printed.
pub struct Run {
    /// Exit status (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// Runs the binary in the repository with `NO_COLOR`, `FILE` and `FILE2` in `args` standing for
/// files (`paste.txt`, `paste2.txt` in a temporary directory) holding `inputs`.
pub fn run_with_files(args: &[&str], inputs: &[&[u8]]) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths: Vec<String> = inputs
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            let name = if i == 0 {
                "paste.txt".to_string()
            } else {
                format!("paste{}.txt", i + 1)
            };
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).expect("write");
            p.to_string_lossy().into_owned()
        })
        .collect();
    let args: Vec<&str> = args
        .iter()
        .map(|a| match *a {
            "FILE" => paths[0].as_str(),
            "FILE2" => paths[1].as_str(),
            other => other,
        })
        .collect();
    let out = kproxy()
        .args(&args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .expect("run");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The service-port names of a `graph -o json` document, sorted, each once.
pub fn service_names(doc: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = doc["graphs"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["service_ports"].as_array().cloned().unwrap_or_default())
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The binary under test pointed at the cluster of `kubeconfig` alone: `--kubeconfig` given,
/// `KUBECONFIG` and the in-cluster variables removed, `HOME` set to `home`, no colour.
pub fn kproxy_on_api(kubeconfig: &Path, home: &Path) -> std::process::Command {
    let mut cmd = kproxy();
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home)
        .env("NO_COLOR", "1");
    cmd
}
