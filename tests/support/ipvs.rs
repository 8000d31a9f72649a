//! Shared pieces of the IPVS tests: where the conformance cases and the real kernel dumps are,
//! and whether the tools of the IPVS VM (`../shared/tools/ipvs-vm.sh`) are here.

use std::path::{Path, PathBuf};

/// `../shared/conformance/ipvs`, or `None` (with a printed notice) when it is absent.
pub fn shared_ipvs() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/ipvs");
    if p.is_dir() {
        Some(p)
    } else {
        crate::support::skip("ipvs", &format!("{} absent; skipping", p.display()));
        None
    }
}

/// `testdata/ipvs`: the real kernel dumps.
pub fn testdata_ipvs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/ipvs")
}

/// The API state and kube-proxy configuration a `testdata/ipvs/<case>` was made from: the
/// case's own `state.json`/`config.yaml` when it has them (the repository's example,
/// `make-example-inputs.sh`), else the `../shared/conformance/ipvs` case of the same name.
pub fn case_inputs(case_dir: &Path, shared_ipvs: &Path) -> (PathBuf, PathBuf) {
    let own = case_dir.join("config.yaml");
    let dir = if own.is_file() {
        case_dir.to_path_buf()
    } else {
        shared_ipvs.join(case_dir.file_name().expect("case name"))
    };
    (dir.join("state.json"), dir.join("config.yaml"))
}

/// Why the IPVS VM cannot run here (a missing tool of its own, of `extra`, or no kernel image
/// in /boot), or `None` when it can.
pub fn missing_vm_tools(extra: &[&str]) -> Option<String> {
    let vm = [
        "bash",
        "qemu-system-x86_64",
        "busybox",
        "ipvsadm",
        "ipset",
        "xtables-nft-multi",
        "cpio",
    ];
    for t in vm.iter().chain(extra) {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
            .unwrap_or(false);
        if !found {
            return Some(format!("{t} not installed"));
        }
    }
    let kernel = std::fs::read_dir("/lib/modules")
        .ok()
        .and_then(|r| r.filter_map(|e| e.ok()).map(|e| e.file_name()).max())
        .map(|k| Path::new("/boot").join(format!("vmlinuz-{}", k.to_string_lossy())));
    match kernel {
        Some(k) if k.is_file() => None,
        _ => Some("no kernel image in /boot for the VM".into()),
    }
}
