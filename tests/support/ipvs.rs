//! Shared pieces of the IPVS tests: where the conformance cases and the real kernel dumps are,
//! and whether the tools of the IPVS VM (`../shared/tools/ipvs-vm.sh`) are here.

use std::path::{Path, PathBuf};
use std::process::Command;

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

/// `../shared/conformance/ipvs` when the IPVS VM can run here ([`missing_vm_tools`] with
/// `extra`, and `ipvs-vm.sh`); else `None`, skipped as `area` (`what` names the test).
pub fn vm_or_skip(area: &str, what: &str, extra: &[&str]) -> Option<PathBuf> {
    let shared = shared_ipvs()?;
    let tool = shared.join("../../tools/ipvs-vm.sh");
    let why = missing_vm_tools(extra)
        .or_else(|| (!tool.is_file()).then(|| format!("{} absent", tool.display())));
    match why {
        Some(why) => {
            crate::support::skip(area, &format!("{what}: {why}"));
            None
        }
        None => Some(shared),
    }
}

/// `(name, body, exit status)` of each `=== BEGIN name ===` … `=== END name rc=N ===` section
/// of a VM script's output.
pub fn sections(out: &str) -> Vec<(String, String, i32)> {
    let mut v = Vec::new();
    let mut cur: Option<(String, String)> = None;
    for line in out.lines() {
        if let Some(name) = line
            .strip_prefix("=== BEGIN ")
            .and_then(|r| r.strip_suffix(" ==="))
        {
            cur = Some((name.to_string(), String::new()));
        } else if let Some(rest) = line.strip_prefix("=== END ") {
            if let Some((name, body)) = cur.take() {
                let rc = rest
                    .rsplit_once("rc=")
                    .and_then(|(_, r)| r.trim_end_matches(" ===").parse().ok())
                    .unwrap_or(-1);
                v.push((name, body, rc));
            }
        } else if let Some((_, body)) = cur.as_mut() {
            body.push_str(line);
            body.push('\n');
        }
    }
    v
}

/// This build's `kubectl-kproxy`, copied into `dir` without its debug info (which only makes
/// the VM's initrd bigger), for [`run_in_vm`].
pub fn vm_binary(dir: &Path) -> PathBuf {
    let bin = dir.join("kubectl-kproxy");
    crate::support::install_executable(Path::new(env!("CARGO_BIN_EXE_kubectl-kproxy")), &bin);
    let _ = Command::new("strip")
        .arg("--strip-debug")
        .arg(&bin)
        .status();
    bin
}

/// Runs `script` in the IPVS VM (`../shared/tools/ipvs-vm.sh` beside `shared_ipvs`) with
/// `files` in its `/data`: what the script printed. Panics when the VM fails.
pub fn run_in_vm(shared_ipvs: &Path, script: &str, files: &[PathBuf]) -> String {
    let tool = shared_ipvs.join("../../tools/ipvs-vm.sh");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("vm.sh");
    std::fs::write(&path, script).expect("write script");
    let out = Command::new("bash")
        .arg(&tool)
        .arg(&path)
        .args(files)
        .output()
        .expect("run ipvs-vm.sh");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "ipvs-vm.sh failed: {}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
