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

/// The release-or-debug binary under test.
pub fn kproxy() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
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
