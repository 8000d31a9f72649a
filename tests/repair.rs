//! `repair --local --apply` with real netfilter (both backends): installs kube-proxy's rules from
//! scratch next to foreign rules, repairs one drift at a time so that real connections flow again,
//! is idempotent, never changes a foreign chain or rule, and rolls back when a restore fails.

use crate::support::netns::{Backend, Netns, require_root_and_tools};
use crate::support::repair::{
    DELETE_PREROUTING_JUMP, FOREIGN, STALE_SEP, WEB_SEP_A, WEB_SVC, add_stale_endpoint_chain,
    expect_exit, expect_output, foreign_lines, iptables_tools, json_doc, kproxy_on_cluster,
    local_repair, outcome, rules_and_user_chains, rules_only, topology, web_reachable,
};
use serde_json::Value;
use std::process::Output;

/// One drift: what it is, whether it breaks client traffic, and the real iptables commands that make it.
type Drift<'a> = (&'static str, bool, Box<dyn Fn() + 'a>);

fn repair(ns: &Netns, backend: Backend, extra: &[&str], backups: &std::path::Path) -> Output {
    local_repair(ns, backend, backups)
        .args(extra)
        .output()
        .expect("run kubectl-kproxy repair")
}

#[test]
fn repair_installs_fixes_drift_and_leaves_foreign_rules_alone() {
    if !require_root_and_tools(&iptables_tools()) {
        return;
    }
    let backups = tempfile::tempdir().expect("tempdir");
    for backend in Backend::ALL {
        let topo = topology(&format!("repair-{backend}"));
        let node = topo.node();
        node.restore(backend, FOREIGN, true).expect("foreign rules");
        let foreign_before = foreign_lines(&node.save(backend, false).expect("save"));
        assert!(
            !web_reachable(&topo),
            "{backend}: no service before kube-proxy's rules exist"
        );

        // From scratch (kube-proxy never ran / flushed everything): dry run first, then apply.
        let dry = repair(node, backend, &[], backups.path());
        expect_exit(&dry, 1, &format!("{backend} dry run"));
        expect_output(&dry, false, "dry run: nothing changed");
        assert!(!web_reachable(&topo), "{backend}: dry run changed the node");
        // -o json: stdout is one JSON document holding the plan and the outcome.
        let dry_json = repair(node, backend, &["-o", "json"], backups.path());
        expect_exit(&dry_json, 1, &format!("{backend} dry run -o json"));
        let doc = json_doc(&dry_json);
        assert_eq!(outcome(&doc), "dry_run", "{doc}");
        assert_eq!(doc["applied"], Value::Bool(false), "{doc}");
        assert_eq!(doc["backup"], Value::Null, "{doc}");
        let input = doc["restore_input"].as_str().unwrap_or_default();
        assert!(input.contains(":KUBE-SERVICES"), "{doc}");
        assert_eq!(doc["restore_bytes"].as_u64(), Some(input.len() as u64));
        let applied = repair(node, backend, &["--apply"], backups.path());
        expect_exit(&applied, 0, &format!("{backend} apply"));
        expect_output(&applied, false, "backup: ");
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
        expect_exit(&again, 0, &format!("{backend} again"));
        expect_output(&again, false, "nothing to do");

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
                    add_stale_endpoint_chain(node, backend);
                    ipt(&["-t", "nat", "-I", WEB_SVC, "2", "-j", STALE_SEP]);
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
                Box::new(|| ipt(DELETE_PREROUTING_JUMP)),
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
            expect_exit(&found, 1, &format!("{backend} {what}: drift not planned"));
            let fixed = repair(node, backend, &["--apply", "-o", "json"], backups.path());
            expect_exit(&fixed, 0, &format!("{backend} {what}"));
            let doc = json_doc(&fixed);
            assert_eq!(outcome(&doc), "applied", "{backend} {what}: {doc}");
            assert_eq!(doc["applied"], Value::Bool(true), "{doc}");
            let backup = doc["backup"].as_str().unwrap_or_default();
            assert!(
                std::path::Path::new(backup).is_file(),
                "{backend} {what}: no backup file: {doc}"
            );
            assert!(doc["restore_bytes"].as_u64() > Some(0), "{doc}");
            assert!(doc["restore_ms"].as_f64() > Some(0.0), "{doc}");
            assert!(doc["verify_ms"].as_f64() > Some(0.0), "{doc}");
            assert!(
                web_reachable(&topo),
                "{backend} {what}: service must work after repair"
            );
            let check = repair(node, backend, &["-o", "json"], backups.path());
            expect_exit(
                &check,
                0,
                &format!("{backend} {what}: not clean after repair"),
            );
            assert_eq!(outcome(&json_doc(&check)), "nothing_to_do");
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
            &["--apply", "--inject-fault", "-o", "json"],
            backups.path(),
        );
        expect_exit(&failed, 2, &format!("{backend} fault"));
        expect_output(&failed, true, "restored from the backup");
        let doc = json_doc(&failed);
        assert_eq!(outcome(&doc), "rolled_back", "{doc}");
        assert_eq!(doc["rollback_error"], Value::Null, "{doc}");
        let after = node.save(backend, false).expect("save");
        assert_eq!(
            rules_only(&after),
            rules_only(&before),
            "{backend}: rules after a failed apply differ from the backup"
        );
    }
}

/// A namespace without any table yet (kube-proxy never ran, nothing else wrote rules): the
/// apply creates the tables, the injected fault fails the last one, and the rollback must
/// leave no kube-proxy chain or rule behind in the tables the backup did not have, so that a
/// second plan equals the first.
#[test]
fn failed_repair_of_an_empty_namespace_leaves_no_rules_behind() {
    if !require_root_and_tools(&iptables_tools()) {
        return;
    }
    let backups = tempfile::tempdir().expect("tempdir");
    for backend in Backend::ALL {
        let ns = Netns::new(&format!("repair-empty-{backend}")).expect("netns");
        let before = ns.save(backend, false).expect("save");
        let first = repair(&ns, backend, &["-o", "json"], backups.path());
        expect_exit(&first, 1, &format!("{backend} first plan"));
        let first = json_doc(&first);
        assert_eq!(outcome(&first), "dry_run", "{first}");

        let failed = repair(
            &ns,
            backend,
            &["--apply", "--inject-fault", "-o", "json"],
            backups.path(),
        );
        expect_exit(&failed, 2, &format!("{backend} fault"));
        expect_output(&failed, true, "restored from the backup");
        let doc = json_doc(&failed);
        assert_eq!(outcome(&doc), "rolled_back", "{backend}: {doc}");

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
        let second = repair(&ns, backend, &["-o", "json"], backups.path());
        expect_exit(&second, 1, &format!("{backend} second plan"));
        let second = json_doc(&second);
        assert_eq!(
            second["plan"], first["plan"],
            "{backend}: the plan after the rollback differs"
        );
        assert_eq!(second["restore_input"], first["restore_input"]);
    }
}

/// The offline plan against a saved `iptables-save` (no root needed): `-o json` prints one
/// JSON document with the plan and the outcome; the text plan has no status line.
#[test]
fn offline_plan_prints_one_json_document() {
    let dir = tempfile::tempdir().expect("tempdir");
    let save = dir.path().join("node.save");
    std::fs::write(&save, FOREIGN).expect("write save");
    let plan = |extra: &[&str]| {
        kproxy_on_cluster(&["repair", "--node", "node-1"])
            .arg("--iptables-save")
            .arg(&save)
            .args(extra)
            .output()
            .expect("run kubectl-kproxy repair")
    };
    let json = plan(&["-o", "json"]);
    expect_exit(&json, 1, "offline -o json");
    let doc = json_doc(&json);
    assert_eq!(outcome(&doc), "dry_run", "{doc}");
    assert_eq!(doc["applied"], Value::Bool(false), "{doc}");
    let input = doc["restore_input"].as_str().unwrap_or_default();
    assert!(input.contains(":KUBE-SERVICES"), "{doc}");
    assert_eq!(doc["restore_bytes"].as_u64(), Some(input.len() as u64));

    let text = plan(&[]);
    expect_exit(&text, 1, "offline text");
    expect_output(&text, false, "plan: ");
    assert!(
        !String::from_utf8_lossy(&text.stdout).contains("dry run:"),
        "the offline text plan has no status line"
    );
}

/// The allow-list of `apply::allow` accepts kube-proxy's own render of every release and both
/// families: what it refuses is never a kube-proxy rule (offline plans, no root needed).
#[test]
fn every_release_passes_the_allow_list() {
    let dir = tempfile::tempdir().expect("tempdir");
    let save = dir.path().join("node.save");
    std::fs::write(&save, FOREIGN).expect("write save");
    for minor in 20..=35 {
        for family in ["4", "6"] {
            let version = format!("1.{minor}");
            let o = kproxy_on_cluster(&["repair", "--node", "node-1", "-o", "json"])
                .args(["--kube-proxy-version", &version, "--ip-family", family])
                .arg("--iptables-save")
                .arg(&save)
                .output()
                .expect("run kubectl-kproxy repair");
            expect_exit(&o, 1, &format!("{version} IPv{family}"));
            let doc = json_doc(&o);
            assert_eq!(
                doc["refusals"],
                serde_json::json!([]),
                "{version} IPv{family}: {doc}"
            );
            assert!(
                doc["restore_input"]
                    .as_str()
                    .is_some_and(|i| i.contains("-I PREROUTING 1 ")),
                "{version} IPv{family}: the plan inserts kube-proxy's jumps"
            );
        }
    }
}
