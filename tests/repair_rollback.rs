//! `repair --local --apply` on a busy node, with real iptables in network namespaces (issue 38):
//! a rollback puts back only the chains the repair changed — rules and chains another program
//! wrote meanwhile stay byte-identical (both backends); it waits out a held xtables lock with
//! retries and, when it cannot, says the exact command that finishes it (legacy backend); many
//! repairs next to a writer of a kube-proxy chain and a third program adding chains lose none
//! of the third program's rules; a repair refuses next to a kube-proxy of its namespace; backups
//! are whole or absent, rotated, and never written through a symbolic link.

use crate::support::netns::{Backend, Netns, require_root_and_tools};
use crate::support::repair::{
    DELETE_PREROUTING_JUMP, FOREIGN, STALE_SEP, WEB_SEP_A, WEB_SVC, add_stale_endpoint_chain,
    chain_rules, expect_exit, expect_output, fake_kube_proxy, iptables_tools, json_doc,
    local_repair, outcome, rollback_notes, text, wait_for_file,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// What another program writes while a repair runs: chains in every table, rules in built-in
/// chains (one inserted above the jump kube-proxy's repair inserts), a rule in Docker's chain.
const THIRD: &[&[&str]] = &[
    &["-t", "filter", "-N", "THIRD-F"],
    &[
        "-t",
        "filter",
        "-A",
        "THIRD-F",
        "-s",
        "10.9.0.1/32",
        "-j",
        "RETURN",
    ],
    &[
        "-t", "filter", "-I", "INPUT", "1", "-p", "tcp", "--dport", "2223", "-j", "ACCEPT",
    ],
    &["-t", "filter", "-A", "FORWARD", "-j", "THIRD-F"],
    &["-t", "nat", "-N", "THIRD-N"],
    &["-t", "nat", "-A", "THIRD-N", "-j", "RETURN"],
    &["-t", "nat", "-I", "PREROUTING", "1", "-j", "THIRD-N"],
    &["-t", "nat", "-A", "DOCKER", "-i", "docker1", "-j", "RETURN"],
    &["-t", "mangle", "-N", "THIRD-M"],
    &["-t", "mangle", "-A", "THIRD-M", "-j", "RETURN"],
    &["-t", "mangle", "-A", "PREROUTING", "-j", "THIRD-M"],
];

fn third_program(ns: &Netns, backend: Backend) {
    for args in THIRD {
        ns.iptables(backend, args)
            .expect("the third program's rule");
    }
}

/// A namespace with the foreign rules and kube-proxy's rules installed by a repair.
fn installed(prefix: &str, backend: Backend, backups: &Path) -> Netns {
    let ns = Netns::new(prefix).expect("netns");
    ns.restore(backend, FOREIGN, true).expect("foreign rules");
    let o = local_repair(&ns, backend, backups)
        .arg("--apply")
        .output()
        .expect("run repair");
    expect_exit(&o, 0, &format!("{backend}: install"));
    ns
}

/// Drift in every table kube-proxy writes: in nat a flushed service chain, a deleted endpoint
/// chain, a stale endpoint chain and the PREROUTING jump gone; in filter a flushed chain; in
/// mangle the canary gone (so that the injected fault, in the last table, fails mangle after
/// filter and nat were applied).
fn drift(ns: &Netns, backend: Backend) {
    let ipt = |args: &[&str]| {
        ns.iptables(backend, args).expect("drift");
    };
    ipt(&["-t", "nat", "-F", WEB_SVC]);
    ipt(&["-t", "nat", "-F", WEB_SEP_A]);
    ipt(&["-t", "nat", "-X", WEB_SEP_A]);
    ipt(DELETE_PREROUTING_JUMP);
    add_stale_endpoint_chain(ns, backend);
    ipt(&["-t", "filter", "-F", "KUBE-FORWARD"]);
    ipt(&["-t", "mangle", "-X", "KUBE-PROXY-CANARY"]);
}

/// `save` with `commands` applied on top, as the kernel lists it: the same rules restored into a
/// fresh namespace and the same commands run there.
fn expected_after(prefix: &str, backend: Backend, save: &str, third: bool) -> String {
    let ns = Netns::new(prefix).expect("netns");
    ns.restore(backend, save, false).expect("restore the save");
    if third {
        third_program(&ns, backend);
    }
    ns.save(backend, false).expect("save")
}

/// A repair that fails in its last table and, before rolling back, waits for `pause` to go.
fn failing_repair(ns: &Netns, backend: Backend, backups: &Path, pause: &Path) -> Command {
    let mut cmd = local_repair(ns, backend, backups);
    cmd.args(["--apply", "--inject-fault", "-o", "json"])
        .arg("--pause-before-rollback")
        .arg(pause)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// The repair of a drifted node ([`drift`]) started, failed in its last table and waiting
/// before its rollback: the namespace, its rules before the repair, the pause file to remove
/// and the repair.
fn paused_at_rollback(
    prefix: &str,
    backend: Backend,
    dir: &Path,
) -> (Netns, String, PathBuf, Child) {
    let ns = installed(&format!("{prefix}-{backend}"), backend, dir);
    drift(&ns, backend);
    let before = ns.save(backend, false).expect("save");
    let pause = dir.join(format!("pause-{prefix}-{backend}"));
    let mut child = failing_repair(&ns, backend, dir, &pause)
        .spawn()
        .expect("spawn repair");
    at_rollback(&mut child, &pause);
    (ns, before, pause, child)
}

/// Waits for the repair to reach its rollback (the pause file exists).
#[track_caller]
fn at_rollback(child: &mut Child, pause: &Path) {
    if !wait_for_file(pause, Duration::from_secs(60)) {
        let _ = child.kill();
        panic!("the repair never reached its rollback");
    }
}

fn finished(child: Child) -> Output {
    child.wait_with_output().expect("repair output")
}

/// Lets the repair paused at `pause` roll back; its JSON document, once it says it rolled back.
fn rolled_back(child: Child, pause: &Path, backend: Backend) -> serde_json::Value {
    std::fs::remove_file(pause).expect("release the rollback");
    let out = finished(child);
    expect_exit(&out, 2, &format!("{backend}: injected fault"));
    let doc = json_doc(&out);
    assert_eq!(outcome(&doc), "rolled_back", "{backend}: {doc:#}");
    assert_eq!(doc["rollback_error"], serde_json::Value::Null, "{doc}");
    doc
}

/// The rollback file beside the backup a failed repair names.
fn rollback_file(doc: &serde_json::Value) -> PathBuf {
    let backup = doc["backup"].as_str().unwrap_or_default();
    assert!(!backup.is_empty(), "{doc}");
    Path::new(backup).with_extension("rollback")
}

#[test]
fn rollback_puts_back_only_what_the_repair_changed() {
    if !require_root_and_tools(&iptables_tools()) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for backend in Backend::ALL {
        let (ns, before, pause, child) = paused_at_rollback("rb-only", backend, dir.path());
        // Filter and nat are applied; mangle failed. Another program writes now.
        third_program(&ns, backend);
        let doc = rolled_back(child, &pause, backend);
        // The node is the drifted node plus exactly what the other program wrote.
        let after = ns.save(backend, false).expect("save");
        let expected = expected_after(&format!("rb-exp-{backend}"), backend, &before, true);
        assert_eq!(
            chain_rules(&after),
            chain_rules(&expected),
            "{backend}: after the rollback\n{after}\nexpected\n{expected}"
        );
        // The rollback input names only the chains the repair changed.
        let file = rollback_file(&doc);
        let input = std::fs::read_to_string(&file).expect("rollback file");
        for foreign in ["DOCKER", "cni-", "THIRD", "*mangle", "2222"] {
            assert!(!input.contains(foreign), "{backend}: {foreign} in\n{input}");
        }
        for ours in [
            format!(":{WEB_SVC} - [0:0]"),
            format!("-X {WEB_SEP_A}"),
            format!(":{STALE_SEP} - [0:0]"),
            ":KUBE-FORWARD - [0:0]".to_string(),
            "-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES"
                .to_string(),
        ] {
            assert!(input.contains(&ours), "{backend}: no {ours} in\n{input}");
        }
    }
}

/// Holds an xtables lock file (`flock -o FILE`, in a process group of its own) until released
/// or dropped; `ready` appears once it is held.
struct HeldLock(Child);

impl HeldLock {
    fn take(lock_file: &Path, ready: &Path, seconds: f64) -> HeldLock {
        use std::os::unix::process::CommandExt;
        let child = Command::new("flock")
            .arg("-o")
            .arg(lock_file)
            .args([
                "sh",
                "-c",
                &format!("touch '{}'; exec sleep {seconds}", ready.display()),
            ])
            .process_group(0)
            .spawn()
            .expect("spawn flock");
        let held = HeldLock(child);
        assert!(
            wait_for_file(ready, Duration::from_secs(30)),
            "the lock was never taken"
        );
        held
    }

    fn release(self) {}
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        let group = rustix::process::Pid::from_child(&self.0);
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = self.0.wait();
    }
}

/// The number of attempts a failed repair's message says its rollback took.
fn attempts(error: &str) -> Option<u32> {
    let (_, rest) = error.split_once("(after ")?;
    rest.split_once(' ')?.0.parse().ok()
}

#[test]
fn rollback_waits_out_a_held_xtables_lock_and_says_how_to_finish() {
    let mut tools = Backend::Legacy.tools().to_vec();
    tools.extend(["ip", "flock", "sh"]);
    if !require_root_and_tools(&tools) {
        return;
    }
    let backend = Backend::Legacy;
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = installed("rb-lock", backend, dir.path());
    drift(&ns, backend);
    let before = ns.save(backend, false).expect("save");
    let pause = dir.path().join("pause");

    // The host's own lock, held for 2.5 s of the rollback only (it is host-wide: other tests'
    // restores wait meanwhile): the first attempt (1 s wait) fails, the second gets it.
    let mut child = failing_repair(&ns, backend, dir.path(), &pause)
        .args(["--rollback-wait", "1"])
        .spawn()
        .expect("spawn repair");
    at_rollback(&mut child, &pause);
    let lock = HeldLock::take(
        Path::new("/run/xtables.lock"),
        &dir.path().join("held-1"),
        2.5,
    );
    std::fs::remove_file(&pause).expect("release the rollback");
    let out = finished(child);
    lock.release();
    expect_exit(&out, 2, "fault with the lock held");
    let doc = json_doc(&out);
    assert_eq!(outcome(&doc), "rolled_back", "{doc:#}");
    let error = doc["error"].as_str().unwrap_or_default();
    // Two attempts, or three if another program on this host held the lock too.
    assert!(attempts(error).is_some_and(|n| n >= 2), "{error}");
    assert_eq!(
        chain_rules(&ns.save(backend, false).expect("save")),
        chain_rules(&before)
    );

    // A lock held through every attempt (a lock file of this test's own, through
    // XTABLES_LOCKFILE, so that other tests are not held up for that long): the rollback gives
    // up and says the exact command, which then finishes it.
    let private = dir.path().join("xtables.lock");
    std::fs::write(&private, "").expect("lock file");
    let mut child = failing_repair(&ns, backend, dir.path(), &pause)
        .args(["--rollback-wait", "1"])
        .env("XTABLES_LOCKFILE", &private)
        .spawn()
        .expect("spawn repair");
    at_rollback(&mut child, &pause);
    let lock = HeldLock::take(&private, &dir.path().join("held-2"), 60.0);
    std::fs::remove_file(&pause).expect("release the rollback");
    let started = Instant::now();
    let out = finished(child);
    let gave_up_after = started.elapsed();
    lock.release();
    expect_exit(&out, 2, "fault with the lock held throughout");
    let doc = json_doc(&out);
    assert_eq!(outcome(&doc), "rollback_failed", "{doc:#}");
    let file = rollback_file(&doc);
    let command = format!(
        "ip netns exec {} iptables-legacy-restore -w 1 --noflush --counters < {}",
        ns.name(),
        file.display()
    );
    let rollback_error = doc["rollback_error"].as_str().unwrap_or_default();
    assert!(
        rollback_error.contains("after 3 attempt(s)") && rollback_error.contains(&command),
        "{rollback_error}"
    );
    expect_output(&out, true, &command);
    assert!(
        gave_up_after < Duration::from_secs(20),
        "bounded: {gave_up_after:?}"
    );
    println!("rollback gave up after {gave_up_after:?}: {rollback_error}");
    assert_ne!(
        chain_rules(&ns.save(backend, false).expect("save")),
        chain_rules(&before),
        "the node is half-changed until the command runs"
    );
    let by_hand = Command::new("sh")
        .args(["-c", &command])
        .env("PATH", crate::support::netns::tool_path())
        .output()
        .expect("run the command");
    assert!(by_hand.status.success(), "{}", text(&by_hand));
    assert_eq!(
        chain_rules(&ns.save(backend, false).expect("save")),
        chain_rules(&before),
        "the command of the message finishes the rollback"
    );
}

/// The shell loop of a program that adds `n` chains to filter and mangle (and every tenth one a
/// nat chain and jumps from built-in chains), then creates `done`.
fn third_program_loop(backend: Backend, n: usize, done: &Path) -> String {
    let ipt = format!("{} -w", backend.iptables(crate::support::netns::Family::V4));
    format!(
        "i=0\nwhile [ $i -lt {n} ]; do\n\
         {ipt} -t filter -N THIRD-F$i\n\
         {ipt} -t filter -A THIRD-F$i -s 10.9.$((i / 200)).$((i % 200 + 1))/32 -j RETURN\n\
         {ipt} -t mangle -N THIRD-M$i\n\
         {ipt} -t mangle -A THIRD-M$i -j MARK --set-mark $((i + 1))\n\
         if [ $((i % 10)) -eq 0 ]; then\n\
         {ipt} -t filter -A INPUT -j THIRD-F$i\n\
         {ipt} -t nat -N THIRD-N$i\n\
         {ipt} -t nat -A THIRD-N$i -j RETURN\n\
         {ipt} -t nat -I OUTPUT 1 -j THIRD-N$i\n\
         fi\n\
         i=$((i + 1))\nsleep 0.05\ndone\ntouch '{}'\n",
        done.display()
    )
}

/// The chains and rules of a save that are not kube-proxy's: every chain not named `KUBE-*`,
/// built-in chains without their jumps to `KUBE-*` chains (and left out when nothing else is
/// in them: a backend may list a table's empty built-in chains or not).
fn foreign_chains(save: &str) -> BTreeMap<(String, String), Vec<String>> {
    const BUILTIN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
    chain_rules(save)
        .into_iter()
        .filter(|((_, chain), _)| !chain.starts_with("KUBE-"))
        .map(|(k, rules)| {
            let rules: Vec<String> = rules
                .into_iter()
                .filter(|r| !r.contains("-j KUBE-"))
                .collect();
            (k, rules)
        })
        .filter(|((_, chain), rules)| !(BUILTIN.contains(&chain.as_str()) && rules.is_empty()))
        .collect()
}

#[test]
fn repairs_next_to_a_writer_and_a_third_program_lose_no_foreign_rule() {
    let mut tools = iptables_tools();
    tools.push("sh");
    if !require_root_and_tools(&tools) {
        return;
    }
    const CHAINS: usize = 100;
    const MIN_REPAIRS: usize = 20;
    let dir = tempfile::tempdir().expect("tempdir");
    for backend in Backend::ALL {
        let ns = installed(&format!("rb-busy-{backend}"), backend, dir.path());
        let restore = backend.restore(crate::support::netns::Family::V4);
        let ipt = backend.iptables(crate::support::netns::Family::V4);
        // A second writer of kube-proxy's rules: one service chain rewritten to another
        // endpoint list, and the nat OUTPUT jump deleted, over and over.
        let writer = format!(
            "while :; do\n\
             printf '*nat\\n:{WEB_SVC} - [0:0]\\n-A {WEB_SVC} -m comment --comment drift -j {WEB_SEP_A}\\nCOMMIT\\n' | {restore} -w --noflush\n\
             {ipt} -w -t nat -D OUTPUT -m comment --comment 'kubernetes service portals' -j KUBE-SERVICES 2>/dev/null\n\
             sleep 0.03\ndone\n"
        );
        ns.spawn(&["sh", "-c", &writer]).expect("writer");
        let done = dir.path().join(format!("third-done-{backend}"));
        ns.spawn(&["sh", "-c", &third_program_loop(backend, CHAINS, &done)])
            .expect("third program");
        let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
        // Rollbacks that left the writer's chain as the writer had rewritten it meanwhile.
        let mut left_to_writer = 0;
        let mut repairs = 0;
        let started = Instant::now();
        while repairs < MIN_REPAIRS || !done.exists() {
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "{backend}: the third program never finished"
            );
            let o = local_repair(&ns, backend, dir.path())
                .args(["--apply", "-o", "json", "--keep-backups", "5"])
                .output()
                .expect("repair");
            let doc = json_doc(&o);
            *outcomes.entry(outcome(&doc).to_string()).or_default() += 1;
            left_to_writer += rollback_notes(&doc)
                .iter()
                .filter(|n| n.starts_with(&format!("table nat chain {WEB_SVC}: changed after")))
                .count();
            assert!(
                matches!(outcome(&doc), "applied" | "rolled_back" | "nothing_to_do"),
                "{backend}: {}",
                text(&o)
            );
            repairs += 1;
        }
        // What the third program wrote, replayed alone next to the same foreign rules.
        let alone = Netns::new(&format!("rb-alone-{backend}")).expect("netns");
        alone
            .restore(backend, FOREIGN, true)
            .expect("foreign rules");
        let alone_done = dir.path().join(format!("alone-done-{backend}"));
        alone
            .run(&[
                "sh",
                "-c",
                &third_program_loop(backend, CHAINS, &alone_done),
            ])
            .expect("third program alone");
        let expected = foreign_chains(&alone.save(backend, false).expect("save"));
        let got = foreign_chains(&ns.save(backend, false).expect("save"));
        let lost: Vec<_> = expected
            .iter()
            .filter(|(k, rules)| got.get(*k) != Some(*rules))
            .map(|(k, _)| k)
            .collect();
        println!(
            "{backend}: {repairs} repairs next to a writer: {outcomes:?}, the writer's chain left to it by {left_to_writer} rollback(s); foreign chains {} (filter {}, mangle {}), differing or lost: {}",
            expected.len(),
            expected.keys().filter(|(t, _)| t == "filter").count(),
            expected.keys().filter(|(t, _)| t == "mangle").count(),
            lost.len()
        );
        assert!(lost.is_empty(), "{backend}: lost or changed: {lost:?}");
        assert_eq!(got, expected, "{backend}: foreign chains differ");
        assert!(
            outcomes.get("rolled_back").copied().unwrap_or(0) > 0,
            "{backend}: no repair was rolled back, the rollback was not exercised: {outcomes:?}"
        );
    }
}

#[test]
fn repair_refuses_next_to_a_kube_proxy_of_its_namespace() {
    if !require_root_and_tools(&iptables_tools()) {
        return;
    }
    let backend = Backend::Nft;
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(fake) = fake_kube_proxy("repair", dir.path()) else {
        return;
    };
    let ns = Netns::new("rb-kp").expect("netns");
    let other = Netns::new("rb-kp-other").expect("netns");
    let pid = ns
        .spawn(&[fake.to_str().expect("utf-8 path"), "60"])
        .expect("fake kube-proxy");
    // `ip netns exec` execs the program: the pid is the fake kube-proxy's once it runs.
    let started = Instant::now();
    while std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        != "kube-proxy"
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the fake never ran"
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    let refused = local_repair(&ns, backend, dir.path())
        .arg("--apply")
        .output()
        .expect("repair");
    expect_exit(&refused, 2, "next to kube-proxy");
    expect_output(
        &refused,
        false,
        &format!(
            "refusal: a kube-proxy process (pid {pid}) is running in the network namespace this repair writes"
        ),
    );
    expect_output(&refused, true, "--force");
    assert!(
        !ns.save(backend, false)
            .expect("save")
            .contains("KUBE-SERVICES"),
        "nothing was written"
    );
    // Another namespace's repair is not held up by it.
    let elsewhere = local_repair(&other, backend, dir.path())
        .arg("--apply")
        .output()
        .expect("repair");
    expect_exit(&elsewhere, 0, "another namespace");
    let forced = local_repair(&ns, backend, dir.path())
        .args(["--apply", "--force"])
        .output()
        .expect("repair");
    expect_exit(&forced, 0, "--force");
}

#[test]
fn backups_are_whole_rotated_and_never_follow_links() {
    let mut tools = iptables_tools();
    tools.extend(["unshare", "mount", "sh", "dd"]);
    if !require_root_and_tools(&tools) {
        return;
    }
    let backend = Backend::Nft;
    let dir = tempfile::tempdir().expect("tempdir");
    let ns = Netns::new("rb-backup").expect("netns");
    ns.restore(backend, FOREIGN, true).expect("foreign rules");
    let before = ns.save(backend, false).expect("save");

    // A full disk: a 64 KiB tmpfs, in a mount namespace of its own, filled up.
    let full = dir.path().join("full");
    std::fs::create_dir(&full).expect("mkdir");
    let repair = local_repair(&ns, backend, &full);
    let line = std::iter::once(repair.get_program())
        .chain(repair.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    let script = format!(
        "mount -t tmpfs -o size=64k tmpfs '{d}' && dd if=/dev/zero of='{d}/fill' bs=4k 2>/dev/null; \
         NO_COLOR=1 {line} --apply; echo \"exit $?\"; ls -A '{d}'",
        d = full.display()
    );
    let o = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("exit 2"), "{}", text(&o));
    expect_output(&o, true, "No space left on device");
    expect_output(&o, true, "nothing was changed");
    assert_eq!(
        stdout.lines().last(),
        Some("fill"),
        "no partial backup is left: {}",
        text(&o)
    );
    assert_eq!(
        chain_rules(&ns.save(backend, false).expect("save")),
        chain_rules(&before),
        "nothing changed"
    );

    // Rotation: three repairs with --keep-backups 2 leave two backups and say what went.
    let kept = dir.path().join("kept");
    for round in 0..3 {
        if round > 0 {
            ns.iptables(backend, &["-t", "nat", "-F", WEB_SVC])
                .expect("drift");
        }
        let o = local_repair(&ns, backend, &kept)
            .args(["--apply", "--keep-backups", "2"])
            .output()
            .expect("repair");
        expect_exit(&o, 0, &format!("round {round}"));
        let removed: Vec<String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("removed old backup: "))
            .map(str::to_string)
            .collect();
        assert_eq!(removed.len(), usize::from(round == 2), "{}", text(&o));
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(std::fs::read_dir(&kept).expect("dir").count(), 2);

    // A backup directory that is a symbolic link is refused, dangling or not; nothing changes.
    ns.iptables(backend, &["-t", "nat", "-F", WEB_SVC])
        .expect("drift");
    let drifted = ns.save(backend, false).expect("save");
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&kept, &link).expect("symlink");
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink(dir.path().join("gone"), &dangling).expect("symlink");
    for (path, want) in [
        (&link, "is a symbolic link"),
        (&dangling, "is a dangling symbolic link"),
    ] {
        let o = local_repair(&ns, backend, path)
            .arg("--apply")
            .output()
            .expect("repair");
        expect_exit(&o, 2, want);
        expect_output(&o, true, want);
        assert!(!String::from_utf8_lossy(&o.stderr).contains("File exists"));
        assert_eq!(
            chain_rules(&ns.save(backend, false).expect("save")),
            chain_rules(&drifted)
        );
    }
    assert_eq!(std::fs::read_dir(&kept).expect("dir").count(), 2);
}

#[test]
fn rollback_leaves_a_chain_another_writer_rewrote_after_the_repair() {
    if !require_root_and_tools(&iptables_tools()) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    for backend in Backend::ALL {
        let (ns, before, pause, child) = paused_at_rollback("rb-later", backend, dir.path());
        // Filter and nat are applied; mangle failed. Another writer (a kube-proxy syncing a
        // newer state, say) rewrites the service chain the repair rewrote.
        let web_svc =
            |save: &str| chain_rules(save).remove(&("nat".to_string(), WEB_SVC.to_string()));
        let repaired = web_svc(&ns.save(backend, false).expect("save"));
        ns.restore(
            backend,
            &format!(
                "*nat\n:{WEB_SVC} - [0:0]\n-A {WEB_SVC} -m comment --comment \"written after the repair\" -j RETURN\nCOMMIT\n"
            ),
            true,
        )
        .expect("the other writer");
        let third = web_svc(&ns.save(backend, false).expect("save"));
        assert!(third.is_some() && third != repaired, "{backend}: {third:?}");
        let doc = rolled_back(child, &pause, backend);

        let after = ns.save(backend, false).expect("save");
        assert_eq!(
            web_svc(&after),
            third,
            "{backend}: the other writer's chain\n{after}"
        );
        // Everything else the repair changed is back as the backup had it.
        let mut expected = chain_rules(&before);
        expected.insert(
            ("nat".to_string(), WEB_SVC.to_string()),
            third.clone().unwrap_or_default(),
        );
        assert_eq!(
            chain_rules(&after),
            expected,
            "{backend}: after the rollback\n{after}"
        );
        assert_eq!(
            rollback_notes(&doc),
            [format!(
                "table nat chain {WEB_SVC}: changed after the repair wrote it; left as the other writer left it"
            )],
            "{backend}: {doc:#}"
        );
        let input = std::fs::read_to_string(rollback_file(&doc)).expect("rollback file");
        assert!(!input.contains(WEB_SVC), "{backend}: {WEB_SVC} in\n{input}");
        assert!(
            input.contains(":KUBE-FORWARD - [0:0]"),
            "{backend}: {input}"
        );
    }
}
