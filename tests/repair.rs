//! `repair --local --apply` with real netfilter (both backends): installs kube-proxy's rules from
//! scratch next to foreign rules, repairs one drift at a time so that real connections flow again,
//! is idempotent, never changes a foreign chain or rule, and rolls back when a restore fails.

use crate::support::netns::{Backend, Netns, Pod, Probe, Topology, addr, require_root_and_tools};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Duration;

const WEB: &str = "10.96.100.10:80";
const WEB_SVC: &str = "KUBE-SVC-67NZLRHBNDSAWJRO";
const WEB_SEP_A: &str = "KUBE-SEP-FZQ6KZLGXRSKN2AD";

/// Rules of other software that repair must leave byte-identical.
const FOREIGN: &str = "*nat\n:DOCKER - [0:0]\n:cni-portmap - [0:0]\n\
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
-A PREROUTING -p tcp -m tcp --dport 2222 -j REDIRECT --to-ports 22\n\
-A DOCKER -i docker0 -j RETURN\n\
-A cni-portmap -p tcp -m tcp --dport 9999 -j DNAT --to-destination 10.244.9.9:80\nCOMMIT\n\
*filter\n:DOCKER-USER - [0:0]\n-A INPUT -p tcp -m tcp --dport 2222 -j ACCEPT\n-A FORWARD -j DOCKER-USER\n\
-A DOCKER-USER -j RETURN\nCOMMIT\n";

/// One drift: what it is, whether it breaks client traffic, and the real iptables commands that make it.
type Drift<'a> = (&'static str, bool, Box<dyn Fn() + 'a>);

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/cluster")
}

fn repair(ns: &Netns, backend: Backend, extra: &[&str], backups: &std::path::Path) -> Output {
    let d = data();
    Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args([
            "repair",
            "--local",
            "--netns",
            ns.name(),
            "--backend",
            backend.name(),
        ])
        .arg("--state")
        .arg(d.join("state.json"))
        .arg("--config")
        .arg(d.join("config.yaml"))
        .arg("--backup-dir")
        .arg(backups)
        .args(extra)
        .env("NO_COLOR", "1")
        .output()
        .expect("run kubectl-kproxy repair")
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The lines of a save that belong to other software: foreign chains' declarations and rules,
/// and rules in built-in chains that do not jump to a KUBE-* chain.
fn foreign_lines(save: &str) -> Vec<String> {
    save.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let chain = l
                .split_whitespace()
                .nth(if l.starts_with('-') { 1 } else { 0 })
                .unwrap_or("");
            let chain = chain.trim_start_matches(':');
            let foreign_chain = chain.starts_with("DOCKER") || chain.starts_with("cni-");
            let builtin_rule = l.starts_with("-A ")
                && ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"].contains(&chain)
                && !l.contains("-j KUBE-");
            foreign_chain || builtin_rule
        })
        .map(str::to_string)
        .collect()
}

fn topology(backend: Backend) -> Topology {
    Topology::builder(&format!("repair-{backend}"))
        .node_addrs(&["192.168.77.2/24"])
        .client_addrs(&["192.168.77.3/24"])
        .pod(Pod::new("web-a", "10.244.1.10").tcp(8080))
        .pod(Pod::new("web-b", "10.244.1.11").tcp(8080))
        .pod(Pod::new("web-c", "10.244.2.10").tcp(8080))
        .build()
        .expect("topology")
}

fn web_reachable(topo: &Topology) -> bool {
    let probe = Probe::default().timeout(Duration::from_millis(800));
    topo.client()
        .connect_many(&probe, addr(WEB), 12)
        .map(|t| t.ok() == 12)
        .unwrap_or(false)
}

#[test]
fn repair_installs_fixes_drift_and_leaves_foreign_rules_alone() {
    let mut tools = vec!["ip"];
    tools.extend(Backend::Nft.tools());
    tools.extend(Backend::Legacy.tools());
    if !require_root_and_tools(&tools) {
        return;
    }
    let backups = tempfile::tempdir().expect("tempdir");
    for backend in Backend::ALL {
        let topo = topology(backend);
        let node = topo.node();
        node.restore(backend, FOREIGN, true).expect("foreign rules");
        let foreign_before = foreign_lines(&node.save(backend, false).expect("save"));
        assert!(
            !web_reachable(&topo),
            "{backend}: no service before kube-proxy's rules exist"
        );

        // From scratch (kube-proxy never ran / flushed everything): dry run first, then apply.
        let dry = repair(node, backend, &[], backups.path());
        assert_eq!(
            dry.status.code(),
            Some(1),
            "{backend} dry run: {}",
            text(&dry)
        );
        assert!(String::from_utf8_lossy(&dry.stdout).contains("dry run: nothing changed"));
        assert!(!web_reachable(&topo), "{backend}: dry run changed the node");
        let applied = repair(node, backend, &["--apply"], backups.path());
        assert_eq!(
            applied.status.code(),
            Some(0),
            "{backend} apply: {}",
            text(&applied)
        );
        assert!(
            String::from_utf8_lossy(&applied.stdout).contains("backup: "),
            "{}",
            text(&applied)
        );
        assert!(
            web_reachable(&topo),
            "{backend}: service must work after install"
        );
        assert_eq!(
            foreign_lines(&node.save(backend, false).expect("save")),
            foreign_before
        );

        // Idempotent.
        let again = repair(node, backend, &["--apply"], backups.path());
        assert_eq!(again.status.code(), Some(0), "{}", text(&again));
        assert!(
            String::from_utf8_lossy(&again.stdout).contains("nothing to do"),
            "{}",
            text(&again)
        );

        // One drift at a time, made with real iptables commands.
        let ipt = |args: &[&str]| {
            node.iptables(backend, args)
                .map(|_| ())
                .expect("iptables mutation")
        };
        let drifts: Vec<Drift<'_>> = vec![
            (
                // An empty SEP chain returns to the SVC chain: traffic shifts to the other endpoints.
                "flushed endpoint chain",
                false,
                Box::new(|| ipt(&["-t", "nat", "-F", WEB_SEP_A])),
            ),
            (
                "deleted service entry",
                true,
                Box::new(|| {
                    ipt(&[
                        "-t",
                        "nat",
                        "-D",
                        "KUBE-SERVICES",
                        "-d",
                        "10.96.100.10/32",
                        "-p",
                        "tcp",
                        "-m",
                        "comment",
                        "--comment",
                        "shop/web:http cluster IP",
                        "-m",
                        "tcp",
                        "--dport",
                        "80",
                        "-j",
                        WEB_SVC,
                    ])
                }),
            ),
            (
                "stale endpoint",
                true,
                Box::new(|| {
                    ipt(&["-t", "nat", "-N", "KUBE-SEP-STALESTALESTALE2"]);
                    ipt(&[
                        "-t",
                        "nat",
                        "-A",
                        "KUBE-SEP-STALESTALESTALE2",
                        "-p",
                        "tcp",
                        "-j",
                        "DNAT",
                        "--to-destination",
                        "10.244.9.99:8080",
                    ]);
                    ipt(&[
                        "-t",
                        "nat",
                        "-I",
                        WEB_SVC,
                        "2",
                        "-j",
                        "KUBE-SEP-STALESTALESTALE2",
                    ]);
                }),
            ),
            (
                "flushed service chain",
                true,
                Box::new(|| ipt(&["-t", "nat", "-F", WEB_SVC])),
            ),
            (
                "removed PREROUTING jump",
                true,
                Box::new(|| {
                    ipt(&[
                        "-t",
                        "nat",
                        "-D",
                        "PREROUTING",
                        "-m",
                        "comment",
                        "--comment",
                        "kubernetes service portals",
                        "-j",
                        "KUBE-SERVICES",
                    ])
                }),
            ),
            (
                // Only matches before DNAT (host-originated or non-DNATed traffic): client traffic survives.
                "REJECT for a service with endpoints",
                false,
                Box::new(|| {
                    ipt(&[
                        "-t",
                        "filter",
                        "-I",
                        "KUBE-SERVICES",
                        "1",
                        "-d",
                        "10.96.100.10/32",
                        "-p",
                        "tcp",
                        "--dport",
                        "80",
                        "-m",
                        "comment",
                        "--comment",
                        "shop/web:http has no endpoints",
                        "-j",
                        "REJECT",
                    ])
                }),
            ),
        ];
        for (what, breaks, mutate) in &drifts {
            mutate();
            if *breaks {
                assert!(
                    !web_reachable(&topo),
                    "{backend} {what}: drift did not break the service"
                );
            }
            let found = repair(node, backend, &[], backups.path());
            assert_eq!(
                found.status.code(),
                Some(1),
                "{backend} {what}: drift not planned: {}",
                text(&found)
            );
            let fixed = repair(node, backend, &["--apply"], backups.path());
            assert_eq!(
                fixed.status.code(),
                Some(0),
                "{backend} {what}: {}",
                text(&fixed)
            );
            assert!(
                web_reachable(&topo),
                "{backend} {what}: service must work after repair"
            );
            let check = repair(node, backend, &[], backups.path());
            assert_eq!(
                check.status.code(),
                Some(0),
                "{backend} {what}: not clean after repair: {}",
                text(&check)
            );
            assert_eq!(
                foreign_lines(&node.save(backend, false).expect("save")),
                foreign_before,
                "{backend} {what}: foreign rules changed"
            );
        }

        // Fault injection: the last table's restore fails after the first was applied → the node
        // equals the backup, exit 2.
        ipt(&["-t", "nat", "-F", WEB_SVC]);
        ipt(&["-t", "filter", "-F", "KUBE-FORWARD"]);
        let before = node.save(backend, false).expect("save");
        let failed = repair(
            node,
            backend,
            &["--apply", "--inject-fault"],
            backups.path(),
        );
        assert_eq!(
            failed.status.code(),
            Some(2),
            "{backend} fault: {}",
            text(&failed)
        );
        assert!(
            String::from_utf8_lossy(&failed.stderr).contains("restored from the backup"),
            "{}",
            text(&failed)
        );
        let after = node.save(backend, false).expect("save");
        let strip = |s: &str| {
            s.lines()
                .filter(|l| !l.starts_with('#'))
                .map(|l| match (l.starts_with(':'), l.rfind(" [")) {
                    // Chain counters move with traffic; the rules are what must be equal.
                    (true, Some(i)) => l[..i].to_string(),
                    _ => l.to_string(),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            strip(&after),
            strip(&before),
            "{backend}: rules after a failed apply differ from the backup"
        );
    }
}
