//! The rollback of an nftables-mode repair, with real nft in a network namespace (issue 38): it
//! puts back only the objects of `table ip kube-proxy` the repair changed — the objects it left
//! alone keep their rule handles, a foreign `table inet fw` (changed by another program while
//! the repair ran) stays exactly as that program left it, and the rollback transaction written
//! beside the backup names nothing else.

use crate::nftables_verify::{FOREIGN, kproxy, loaded, nft_config, tables};
use crate::support::netns::{Netns, require_root_and_tools};
use crate::support::repair::{expect_exit, json_doc, outcome, rollback_notes, text, wait_for_file};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

/// A stale endpoint chain of a service the API no longer has.
const STALE: &str = "endpoint-AAAAAAAA-shop/gone/tcp/http__10.244.9.9/8080";

/// What another program does to its own tables while the repair runs.
const OTHER_PROGRAM: &str = "add rule inet fw input tcp dport 2223 counter accept comment \"other\"\n\
add chain inet fw extra\nadd rule inet fw extra drop\nadd table ip other\nadd chain ip other c\n";

/// Drift in both families, so that the injected fault (in the last family's transaction)
/// fails ip6 after ip was applied: a rewritten chain, a map element gone, a stale chain. The
/// stale chain is named as kube-proxy names endpoint chains: a chain of a name this build does
/// not know would make repair refuse (an unknown layout) before any change.
fn drift(ns: &Netns) {
    ns.nft_load(&format!(
        "flush chain ip kube-proxy masquerading\n\
         delete element ip kube-proxy service-ips {{ 10.96.100.20 . tcp . 443 }}\n\
         add chain ip kube-proxy {STALE}\nadd rule ip kube-proxy {STALE} counter drop\n\
         flush chain ip6 kube-proxy masquerading\n"
    ))
    .expect("drift");
}

/// A repair of `ns` started with an injected fault, waiting before its rollback until `pause`
/// is removed.
fn paused_at_rollback(config: &Path, ns: &Netns, backups: &Path, pause: &Path) -> Child {
    let mut child = kproxy(
        config,
        &[
            "repair",
            "--local",
            "--netns",
            ns.name(),
            "--apply",
            "--inject-fault",
            "-o",
            "json",
        ],
    )
    .arg("--backup-dir")
    .arg(backups)
    .arg("--pause-before-rollback")
    .arg(pause)
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn repair");
    if !wait_for_file(pause, Duration::from_secs(60)) {
        let _ = child.kill();
        panic!("the repair never reached its rollback");
    }
    child
}

/// Lets the repair paused at `pause` roll back; its JSON document, once it says it rolled back.
fn rolled_back(child: Child, pause: &Path) -> serde_json::Value {
    std::fs::remove_file(pause).expect("release the rollback");
    let out = child.wait_with_output().expect("repair");
    expect_exit(&out, 2, "injected fault");
    let doc = json_doc(&out);
    assert_eq!(outcome(&doc), "rolled_back", "{doc:#}");
    assert_eq!(
        doc["rollback_error"],
        serde_json::Value::Null,
        "{}",
        text(&out)
    );
    doc
}

#[test]
fn nft_rollback_puts_back_only_what_the_repair_changed() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ns = loaded(&config, "nftrb");
    drift(&ns);
    let before = tables(&ns);
    // `services` is not changed by the repair: its rules must keep their handles.
    let untouched = || {
        ns.nft(&["-a", "list", "chain", "ip", "kube-proxy", "services"])
            .expect("list chain")
    };
    let untouched_before = untouched();
    assert!(untouched_before.contains("# handle "), "{untouched_before}");

    let pause = dir.path().join("pause");
    let child = paused_at_rollback(&config, &ns, dir.path(), &pause);
    ns.nft_load(OTHER_PROGRAM).expect("the other program");
    let doc = rolled_back(child, &pause);

    assert_eq!(
        tables(&ns),
        before,
        "kube-proxy's tables as before the repair"
    );
    assert_eq!(
        untouched(),
        untouched_before,
        "an object the repair did not change is left alone (same rule handles)"
    );
    // The other program's tables are as it left them.
    let alone = Netns::new("nftrb-alone").expect("netns");
    alone.nft_load(FOREIGN).expect("foreign table");
    alone.nft_load(OTHER_PROGRAM).expect("the other program");
    for (family, table) in [("inet", "fw"), ("ip", "other")] {
        assert_eq!(
            ns.nft(&["list", "table", family, table]).expect("list"),
            alone.nft(&["list", "table", family, table]).expect("list"),
            "table {family} {table}"
        );
    }
    // The rollback transaction, beside the backup: only the ip family's changed objects.
    let backup = doc["backup"].as_str().unwrap_or_default();
    let script =
        std::fs::read_to_string(Path::new(backup).join("ip-kube-proxy.rollback")).expect("file");
    assert!(
        script.contains("flush chain ip kube-proxy masquerading\n")
            && script.contains("flush map ip kube-proxy service-ips\n")
            && script.contains(&format!("chain {STALE} {{"))
            && !script.contains("chain services {")
            && !script.contains("table inet")
            && !script.contains("fw")
            && !script.contains("ip6 ")
            && !script.contains("ip other"),
        "{script}"
    );
    assert!(
        !Path::new(backup).join("ip6-kube-proxy.rollback").exists(),
        "the family whose transaction failed changed nothing and is not rolled back"
    );
}

/// A rule no render writes: what another writer puts into a chain the repair rewrote.
const LATER: &str = "meta mark 0x00001234 counter return comment \"written after the repair\"";

#[test]
fn nft_rollback_leaves_a_chain_another_writer_rewrote_after_the_repair() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ns = loaded(&config, "nftrb-later");
    // The repair rewrites masquerading, puts a map element back and deletes a stale chain in
    // ip; ip6 (its last transaction) fails with the injected fault.
    drift(&ns);
    let before = tables(&ns);
    let pause = dir.path().join("pause");
    let child = paused_at_rollback(&config, &ns, dir.path(), &pause);
    // Another writer (a kube-proxy syncing a newer state, say) rewrites masquerading now.
    let masquerading = || {
        ns.nft(&["list", "chain", "ip", "kube-proxy", "masquerading"])
            .expect("list chain")
    };
    let repaired = masquerading();
    ns.nft_load(&format!(
        "flush chain ip kube-proxy masquerading\nadd rule ip kube-proxy masquerading {LATER}\n"
    ))
    .expect("the other writer");
    let third = masquerading();
    assert!(
        third.contains("written after the repair") && third != repaired,
        "{third}"
    );
    let doc = rolled_back(child, &pause);

    assert_eq!(
        masquerading(),
        third,
        "the other writer's chain is as it left it"
    );
    // Everything else the repair changed is back as the backup had it.
    let without_masquerading = |t: String| -> Vec<String> {
        t.lines()
            .filter(|l| !l.contains("ip kube-proxy masquerading"))
            .map(str::to_string)
            .collect()
    };
    let after = tables(&ns);
    assert_eq!(
        without_masquerading(after),
        without_masquerading(before.clone())
    );
    assert!(
        before.contains(STALE) && before.contains("10.96.100.20"),
        "{before}"
    );
    let notes = rollback_notes(&doc);
    assert!(
        notes.iter().any(|n| n.starts_with(
            "table ip kube-proxy chain masquerading: changed after the repair wrote it"
        )),
        "{doc:#}"
    );
    assert_eq!(notes.len(), 1, "{notes:?}");
    let error = doc["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("chain masquerading: changed after the repair"),
        "{error}"
    );
}

#[test]
fn nft_rollback_deletes_a_table_it_created_only_while_it_holds_what_it_wrote() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ip_table = |ns: &Netns| ns.nft(&["list", "table", "ip", "kube-proxy"]);
    for (name, another_writer) in [("nftrb-made", false), ("nftrb-made-later", true)] {
        let ns = loaded(&config, name);
        // ip's table is gone (the repair creates it); ip6 drifts, so that its transaction, the
        // last, is the one the injected fault fails.
        ns.nft_load("delete table ip kube-proxy\nflush chain ip6 kube-proxy masquerading\n")
            .expect("drift");
        let backups = dir.path().join(name);
        let pause = dir.path().join(format!("{name}.pause"));
        let child = paused_at_rollback(&config, &ns, &backups, &pause);
        let created = ip_table(&ns).expect("the repair created table ip kube-proxy");
        if another_writer {
            // A kube-proxy syncing while the repair runs writes into the table it created.
            ns.nft_load(&format!(
                "add chain ip kube-proxy later\nadd rule ip kube-proxy later {LATER}\n"
            ))
            .expect("the other writer");
        }
        let written = ip_table(&ns).expect("list");
        let doc = rolled_back(child, &pause);
        let notes = rollback_notes(&doc);
        if another_writer {
            assert_eq!(
                ip_table(&ns).expect("left as the other writer left it"),
                written,
                "{doc:#}"
            );
            assert!(
                written != created && written.contains("chain later"),
                "{written}"
            );
            assert_eq!(notes.len(), 1, "{notes:?}");
            assert!(
                notes[0].starts_with(
                    "table ip kube-proxy: created by the repair, and holds `chain later`"
                ) && notes[0].ends_with("left as the other writer left it"),
                "{notes:?}"
            );
        } else {
            assert!(
                ip_table(&ns).is_err(),
                "the created table is deleted: {doc:#}"
            );
            assert!(notes.is_empty(), "{notes:?}");
        }
    }
}
