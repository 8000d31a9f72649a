//! `kubectl kproxy repair NODE` through the API (issue 8, remote form), run through the real
//! `kubectl` binary against the fake apiserver, whose exec handler plays the node: it runs the
//! iptables commands it receives for real inside a network namespace this test created, with
//! the stdin it received. The "image" of the pod has `iptables-save`/`iptables-restore` pointing
//! at the nft backend plus the explicit `-nft-`/`-legacy-` variants, and no ipset/ipvsadm;
//! anything else is refused (and fails the test).
//!
//! Checked for both backends (with the legacy one, the rules live in the backend the image's
//! default tools do not show, so the backend must be detected from the dumps): dry run exits 1
//! and changes nothing; `--apply` installs kube-proxy's rules so that real connections flow,
//! verify is clean afterwards, foreign rules stay byte-identical, a second `--apply` has
//! nothing to do; a restore failure part-way (`--inject-fault`) rolls the node back to the
//! backup and exits 2; the debug-pod collector works and deletes its pod. With the nft backend
//! also IPv6 (`ip6tables-*`), and then the live `kubectl kproxy verify` agrees. A v4-only API
//! server (no way to end stdin) is refused before anything changes.

use crate::support::fake_apiserver::{ExecReply, ExecRequest, FakeApiServer};
use crate::support::netns::{Backend, Family, Netns, require_root_and_tools, tool_path};
use crate::support::repair::{
    FOREIGN, WEB_SVC, cluster_file, expect_exit, expect_output, foreign_lines, iptables_tools,
    json_doc, kproxy_on_cluster, outcome, rules_and_user_chains, rules_only, text, topology,
    web_reachable,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

const NODE: &str = "node-1";

/// The backend the pod image's plain `iptables-save`/`iptables-restore` use.
const IMAGE_DEFAULT: Backend = Backend::Nft;

fn which(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|p| p.join(name))
        .find(|p| p.is_file())
}

/// The program an argv[0] names in the pod's image, and whether it reads stdin.
fn image_program(argv0: &str) -> Option<(String, bool)> {
    for backend in Backend::ALL {
        for family in [Family::V4, Family::V6] {
            if argv0 == backend.save(family) {
                return Some((argv0.to_string(), false));
            }
            if argv0 == backend.restore(family) {
                return Some((argv0.to_string(), true));
            }
        }
    }
    Some(match argv0 {
        "iptables-save" => (IMAGE_DEFAULT.save(Family::V4).to_string(), false),
        "ip6tables-save" => (IMAGE_DEFAULT.save(Family::V6).to_string(), false),
        "iptables-restore" => (IMAGE_DEFAULT.restore(Family::V4).to_string(), true),
        "ip6tables-restore" => (IMAGE_DEFAULT.restore(Family::V6).to_string(), true),
        _ => return None,
    })
}

/// Whether `argv` after the program is one of the shapes repair and the collector use:
/// `save [-c]` without stdin; `restore -w N (--noflush | --noflush --counters | --test --noflush)`
/// with it.
fn expected_shape(reads_stdin: bool, rest: &[&str], has_stdin: bool) -> bool {
    if !reads_stdin {
        return !has_stdin && matches!(rest, [] | ["-c"]);
    }
    match rest {
        ["-w", n, tail @ ..] => {
            has_stdin
                && !n.is_empty()
                && n.chars().all(|c| c.is_ascii_digit())
                && matches!(
                    tail,
                    ["--noflush"] | ["--noflush", "--counters"] | ["--test", "--noflush"]
                )
        }
        _ => false,
    }
}

/// The pod: runs the expected iptables argv shapes inside `ns` (with the stdin received),
/// answers ipset/ipvsadm/conntrack/nft as missing, and refuses (recording it) everything else.
fn node_exec(
    ns: String,
    refused: Arc<Mutex<Vec<Vec<String>>>>,
) -> impl Fn(&ExecRequest) -> ExecReply {
    move |req: &ExecRequest| {
        let argv: Vec<&str> = req.command.iter().map(String::as_str).collect();
        if argv == ["ipset", "save"]
            || argv == ["ipvsadm", "-Ln", "--exact"]
            || argv.first() == Some(&"conntrack")
            || argv == ["cat", "/proc/net/nf_conntrack"]
            || argv.first() == Some(&"nft")
        {
            return ExecReply::Missing;
        }
        let image = argv.first().and_then(|a| image_program(a));
        let rest = argv.get(1..).unwrap_or_default();
        let Some((program, reads_stdin)) =
            image.filter(|(_, r)| expected_shape(*r, rest, req.stdin.is_some()))
        else {
            refused.lock().unwrap().push(req.command.clone());
            return ExecReply::Output {
                stdout: String::new(),
                stderr: "refused by the test's fake node".into(),
                exit_code: 126,
            };
        };
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns, &program])
            .args(rest)
            .env("PATH", tool_path())
            .env("LC_ALL", "C")
            .stdin(if reads_stdin {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ip netns exec");
        if let (Some(mut pipe), Some(input)) = (child.stdin.take(), req.stdin.as_deref()) {
            let _ = pipe.write_all(input);
        }
        let out = child.wait_with_output().expect("wait");
        ExecReply::Output {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            exit_code: out.status.code().unwrap_or(-1),
        }
    }
}

/// A fake cluster (the example cluster's state and configuration, a kube-proxy pod on node-1)
/// whose pods exec into `ns`, and a directory with `kubectl-kproxy` for kubectl's plugin PATH.
struct Cluster {
    api: FakeApiServer,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
    bin: PathBuf,
    kubectl: PathBuf,
    refused: Arc<Mutex<Vec<Vec<String>>>>,
}

impl Cluster {
    fn new(ns: &Netns) -> Option<Cluster> {
        let Some(kubectl) = which("kubectl") else {
            crate::support::skip("repair_remote", "kubectl is not installed");
            return None;
        };
        let api = FakeApiServer::start();
        api.add_list_file(&cluster_file("state.json"));
        let config = std::fs::read_to_string(cluster_file("config.yaml")).expect("config");
        api.add_configmap("kube-system", "kube-proxy", &[("config.conf", &config)]);
        api.add_proxy_pod(NODE);
        let refused = Arc::new(Mutex::new(Vec::new()));
        api.on_exec(node_exec(ns.name().to_string(), Arc::clone(&refused)));
        let dir = tempfile::tempdir().expect("tempdir");
        let kubeconfig = api.write_kubeconfig(dir.path());
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("mkdir");
        std::os::unix::fs::symlink(
            assert_cmd::cargo::cargo_bin("kubectl-kproxy"),
            bin.join("kubectl-kproxy"),
        )
        .expect("symlink");
        Some(Cluster {
            api,
            dir,
            kubeconfig,
            bin,
            kubectl,
            refused,
        })
    }

    fn backups(&self) -> PathBuf {
        self.dir.path().join("backups")
    }

    /// `kubectl kproxy ARGS…` with the fake's kubeconfig and the plugin on PATH; fails the
    /// test if the fake node was asked to run anything unexpected.
    fn kubectl(&self, args: &[&str]) -> Output {
        let path = std::env::join_paths(std::iter::once(self.bin.clone()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .expect("PATH");
        let out = Command::new(&self.kubectl)
            .arg("kproxy")
            .args(args)
            .env("PATH", path)
            .env("HOME", self.dir.path())
            .env("XDG_STATE_HOME", self.dir.path().join("state"))
            .env("KUBECONFIG", &self.kubeconfig)
            .env("NO_COLOR", "1")
            .output()
            .expect("run kubectl");
        assert!(
            self.refused.lock().unwrap().is_empty(),
            "unexpected commands: {:?}",
            self.refused.lock().unwrap()
        );
        out
    }

    /// `kubectl kproxy repair node-1 ARGS…`.
    fn repair(&self, args: &[&str]) -> Output {
        let mut all = vec!["repair", NODE, "--exec-timeout", "60s"];
        all.extend_from_slice(args);
        self.kubectl(&all)
    }

    /// The argv of every exec so far that fed stdin.
    fn stdin_execs(&self) -> Vec<Vec<String>> {
        self.api
            .execs()
            .into_iter()
            .filter(|e| e.stdin.is_some())
            .map(|e| e.command)
            .collect()
    }
}

/// Offline verify of a saved ruleset against the example cluster (the namespace has no nfacct
/// counters, so none are expected): exit code and output.
fn verify(save: &str, dir: &Path) -> Output {
    let file = dir.join("verify-input.save");
    std::fs::write(&file, save).expect("write save");
    kproxy_on_cluster(&["verify", NODE, "--nfacct", "none"])
        .arg("--iptables-save")
        .arg(&file)
        .output()
        .expect("run verify")
}

#[test]
fn kubectl_kproxy_repair_node_repairs_through_the_api() {
    if !require_root_and_tools(&iptables_tools()) {
        return;
    }
    for backend in Backend::ALL {
        let topo = topology(&format!("rrepair-{backend}"));
        let node = topo.node();
        let Some(c) = Cluster::new(node) else { return };
        node.restore(backend, FOREIGN, true).expect("foreign rules");
        let save = || node.save(backend, false).expect("save");
        let foreign_before = foreign_lines(&save());
        assert!(!web_reachable(&topo), "{backend}: no service yet");

        // Dry run: the plan, exit 1, nothing changed.
        let before = save();
        let dry = c.repair(&[]);
        expect_exit(&dry, 1, &format!("{backend} dry run"));
        expect_output(&dry, false, "dry run: nothing changed");
        assert_eq!(
            rules_only(&save()),
            rules_only(&before),
            "{backend}: the dry run changed the node"
        );
        let dry_json = c.repair(&["-o", "json"]);
        expect_exit(&dry_json, 1, &format!("{backend} dry run -o json"));
        let doc = json_doc(&dry_json);
        assert_eq!(outcome(&doc), "dry_run", "{backend}: {doc}");
        assert!(
            c.stdin_execs().is_empty(),
            "{backend}: a dry run must not restore anything: {:?}",
            c.stdin_execs()
        );

        // Apply (default backup directory under $XDG_STATE_HOME).
        let applied = c.repair(&["--apply"]);
        expect_exit(&applied, 0, &format!("{backend} apply"));
        let stdout = String::from_utf8_lossy(&applied.stdout).into_owned();
        let backup = stdout
            .lines()
            .find_map(|l| l.strip_prefix("backup: "))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("no backup line: {}", text(&applied)));
        assert!(
            backup.starts_with(c.dir.path().join("state/kproxy/backups")),
            "{}",
            backup.display()
        );
        // The node's rules before the repair.
        assert_eq!(
            rules_and_user_chains(&std::fs::read_to_string(&backup).expect("backup file")),
            rules_and_user_chains(&before),
            "{backend}: the backup is the node's rules before the repair"
        );
        // The restores went to the backend holding kube-proxy's rules, with stdin.
        let restore = backend.restore(Family::V4);
        let image_default = backend == IMAGE_DEFAULT;
        for argv in c.stdin_execs() {
            let program = argv.first().map(String::as_str).unwrap_or_default();
            let ok = program == restore || (image_default && program == "iptables-restore");
            assert!(ok, "{backend}: restore ran {argv:?}");
        }
        assert!(
            web_reachable(&topo),
            "{backend}: the service works after the remote repair"
        );
        let after = save();
        let verified = verify(&after, c.dir.path());
        expect_exit(&verified, 0, &format!("{backend} verify"));
        assert_eq!(
            foreign_lines(&after),
            foreign_before,
            "{backend}: foreign rules changed"
        );
        println!("{backend}: {}", stdout.lines().last().unwrap_or_default());

        // Idempotent, here through a debug pod that is deleted afterwards.
        let backups = c.backups().to_str().expect("utf-8 path").to_string();
        let again = c.repair(&[
            "--apply",
            "--collector",
            "debug-pod",
            "--backup-dir",
            &backups,
        ]);
        expect_exit(&again, 0, &format!("{backend} again"));
        expect_output(&again, false, "nothing to do");
        let created = c.api.created_pods();
        assert_eq!(created.len(), 1, "{created:?}");
        assert_eq!(c.api.deleted_pods(), created, "the debug pod is deleted");
        assert!(
            c.api
                .execs()
                .iter()
                .any(|e| created.contains(&format!("{}/{}", e.namespace, e.pod))),
            "the commands ran in the debug pod"
        );

        if backend == IMAGE_DEFAULT {
            // IPv6: ip6tables-save/-restore through the same pod.
            let six = |extra: &[&str]| {
                let mut args = vec!["--ip-family", "6"];
                args.extend_from_slice(extra);
                c.repair(&args)
            };
            expect_exit(&six(&[]), 1, "v6 dry run");
            let applied6 = six(&["--apply"]);
            expect_exit(&applied6, 0, "v6 apply");
            expect_output(&applied6, false, "-ipv6-");
            expect_exit(&six(&[]), 0, "v6 again");
            let saved6 = node.save6(backend, false).expect("save6");
            assert!(saved6.contains(":KUBE-SERVICES "), "{saved6}");
            assert!(
                c.stdin_execs()
                    .iter()
                    .any(|argv| argv.first().is_some_and(|p| p == "ip6tables-restore")),
                "v6 restores ran ip6tables-restore"
            );
            // Both families repaired: live verify reads the node through the same pod and
            // agrees.
            expect_exit(&c.kubectl(&["verify", NODE]), 0, "live verify");
        }

        // Drift, then a restore failure part-way: rolled back to the backup, exit 2.
        node.iptables(backend, &["-t", "nat", "-F", WEB_SVC])
            .expect("flush");
        node.iptables(backend, &["-t", "filter", "-F", "KUBE-FORWARD"])
            .expect("flush");
        assert!(
            !web_reachable(&topo),
            "{backend}: the drift breaks the service"
        );
        let drifted = save();
        let failed = c.repair(&["--apply", "--inject-fault", "--backup-dir", &backups]);
        expect_exit(&failed, 2, &format!("{backend} fault"));
        expect_output(&failed, true, "restored from the backup");
        assert_eq!(
            rules_only(&save()),
            rules_only(&drifted),
            "{backend}: rules after a failed apply differ from the backup"
        );
        let mut backup_files: Vec<PathBuf> = std::fs::read_dir(c.backups())
            .expect("backup dir")
            .map(|e| e.expect("entry").path())
            .collect();
        backup_files.sort();
        // The backup and, beside it, the rollback input: only the chains the repair changed.
        assert_eq!(backup_files.len(), 2, "{backup_files:?}");
        let rollback = std::fs::read_to_string(&backup_files[0]).expect("rollback file");
        assert!(
            backup_files[0].extension().is_some_and(|e| e == "rollback")
                && rollback.contains(":KUBE-FORWARD - [0:0]")
                && !rollback.contains("DOCKER")
                && !rollback.contains("cni-"),
            "{backend}: {rollback}"
        );
        let backup = &backup_files[1];
        assert_eq!(
            rules_only(&std::fs::read_to_string(backup).expect("backup")),
            rules_only(&drifted),
            "{backend}: the backup is the drifted node"
        );

        // And the real repair of that drift.
        let fixed = c.repair(&["--apply", "--backup-dir", &backups]);
        expect_exit(&fixed, 0, &format!("{backend} fix"));
        assert!(web_reachable(&topo), "{backend}: the service works again");
        expect_exit(
            &verify(&save(), c.dir.path()),
            0,
            &format!("{backend} verify"),
        );
        assert_eq!(foreign_lines(&save()), foreign_before);
    }
}

/// Through the API, on a node without any table yet: the injected fault fails the apply part-way
/// and the rollback leaves no kube-proxy rule behind (the chains the repair created are deleted),
/// so a second plan equals the first.
#[test]
fn remote_rollback_on_an_empty_node_leaves_no_rules_behind() {
    if !require_root_and_tools(&iptables_tools()) {
        return;
    }
    for backend in Backend::ALL {
        let ns = Netns::new(&format!("rrepair-empty-{backend}")).expect("netns");
        let Some(c) = Cluster::new(&ns) else { return };
        let backups = c.backups().to_str().expect("utf-8 path").to_string();
        let with = |extra: &[&str]| {
            let mut args = vec!["--backend", backend.name(), "--backup-dir", &backups];
            args.extend_from_slice(extra);
            c.repair(&args)
        };
        let before = ns.save(backend, false).expect("save");
        let first = with(&["-o", "json"]);
        expect_exit(&first, 1, &format!("{backend} first plan"));
        let first = json_doc(&first);

        let failed = with(&["--apply", "--inject-fault", "-o", "json"]);
        expect_exit(&failed, 2, &format!("{backend} fault"));
        expect_output(&failed, true, "restored from the backup");
        let doc = json_doc(&failed);
        assert_eq!(outcome(&doc), "rolled_back", "{backend}: {doc}");
        assert!(
            !c.stdin_execs().is_empty(),
            "{backend}: the apply ran through the API"
        );

        let after = ns.save(backend, false).expect("save");
        assert!(
            !after.contains("KUBE-"),
            "{backend}: kube-proxy chains left after the rollback:\n{after}"
        );
        assert_eq!(
            rules_and_user_chains(&after),
            rules_and_user_chains(&before),
            "{backend}: rules after the rollback differ from before the repair"
        );
        let second = with(&["-o", "json"]);
        expect_exit(&second, 1, &format!("{backend} second plan"));
        let second = json_doc(&second);
        assert_eq!(second["plan"], first["plan"], "{backend}: plan differs");
        assert_eq!(second["restore_input"], first["restore_input"]);
    }
}

#[test]
fn v4_only_api_server_is_refused_before_any_change() {
    if !require_root_and_tools(&iptables_tools()) {
        return;
    }
    let ns = Netns::new("rrepair-v4").expect("netns");
    let Some(c) = Cluster::new(&ns) else { return };
    c.api.only_exec_protocol("v4.channel.k8s.io");
    ns.restore(IMAGE_DEFAULT, FOREIGN, true)
        .expect("foreign rules");
    let before = ns.save(IMAGE_DEFAULT, false).expect("save");
    let out = c.repair(&["--apply"]);
    expect_exit(&out, 2, "v4-only API server");
    expect_output(&out, true, "v5.channel.k8s.io");
    expect_output(&out, true, "nothing was changed");
    assert_eq!(
        rules_only(&ns.save(IMAGE_DEFAULT, false).expect("save")),
        rules_only(&before)
    );
    // Only the check ran (its stdin arrived whole, but no answer could come back).
    let restores = c.stdin_execs();
    assert_eq!(restores.len(), 1, "{restores:?}");
    assert!(
        restores
            .iter()
            .all(|argv| argv.iter().any(|a| a == "--test")),
        "{restores:?}"
    );
}
