//! Shared pieces of the `repair` tests (on this host, through the API): the example cluster's
//! files, the foreign rules repair must leave alone, the node/client/pods topology with the
//! `shop/web` service, and helpers to read outputs and compare saves.

use super::netns::{Backend, Netns, Pod, Probe, Topology, addr};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The `shop/web` service's cluster IP and port.
pub const WEB: &str = "10.96.100.10:80";
/// Its service chain.
pub const WEB_SVC: &str = "KUBE-SVC-67NZLRHBNDSAWJRO";
/// The endpoint chain of its first pod.
pub const WEB_SEP_A: &str = "KUBE-SEP-FZQ6KZLGXRSKN2AD";

/// The `iptables` arguments that delete kube-proxy's jump from nat PREROUTING.
pub const DELETE_PREROUTING_JUMP: &[&str] = &[
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
];

/// A stale endpoint chain (kube-proxy's name pattern, an endpoint the API does not have).
pub const STALE_SEP: &str = "KUBE-SEP-STALESTALESTALE2";

/// Creates [`STALE_SEP`] in nat with its DNAT rule, with real iptables.
pub fn add_stale_endpoint_chain(ns: &Netns, backend: Backend) {
    ns.iptables(backend, &["-t", "nat", "-N", STALE_SEP])
        .expect("stale chain");
    ns.iptables(
        backend,
        &[
            "-t",
            "nat",
            "-A",
            STALE_SEP,
            "-p",
            "tcp",
            "-j",
            "DNAT",
            "--to-destination",
            "10.244.9.99:8080",
        ],
    )
    .expect("stale rule");
}

/// A copy of `sleep` named `kube-proxy` in `dir` (run it with a number of seconds: a process
/// that looks like kube-proxy), or `None` after [`super::skip`] when there is no `sleep`.
pub fn fake_kube_proxy(test: &str, dir: &Path) -> Option<PathBuf> {
    let Some(sleep) = ["/bin/sleep", "/usr/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        super::skip(test, "no sleep binary to run as a fake kube-proxy");
        return None;
    };
    let fake = dir.join("kube-proxy");
    super::install_executable(Path::new(sleep), &fake);
    Some(fake)
}

/// Rules of other software that repair must leave byte-identical.
pub const FOREIGN: &str = "*nat\n:DOCKER - [0:0]\n:cni-portmap - [0:0]\n\
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER\n\
-A PREROUTING -p tcp -m tcp --dport 2222 -j REDIRECT --to-ports 22\n\
-A DOCKER -i docker0 -j RETURN\n\
-A cni-portmap -p tcp -m tcp --dport 9999 -j DNAT --to-destination 10.244.9.9:80\nCOMMIT\n\
*filter\n:DOCKER-USER - [0:0]\n-A INPUT -p tcp -m tcp --dport 2222 -j ACCEPT\n-A FORWARD -j DOCKER-USER\n\
-A DOCKER-USER -j RETURN\nCOMMIT\n";

/// A file of the example cluster (`testdata/cluster/NAME`: `state.json`, `config.yaml`).
pub fn cluster_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/cluster")
        .join(name)
}

/// The example cluster's configuration with `mode: MODE` instead of its `mode: iptables`,
/// written into `dir` as `config-MODE.yaml`.
pub fn config_in_mode(dir: &Path, mode: &str) -> PathBuf {
    let text = std::fs::read_to_string(cluster_file("config.yaml")).expect("config.yaml");
    assert!(
        text.contains("\nmode: iptables\n"),
        "config.yaml names its mode"
    );
    let path = dir.join(format!("config-{mode}.yaml"));
    std::fs::write(
        &path,
        text.replace("\nmode: iptables\n", &format!("\nmode: {mode}\n")),
    )
    .expect("write config");
    path
}

/// `kubectl-kproxy ARGS… --state … --config …` with the example cluster's files, without colour.
pub fn kproxy_on_cluster(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"));
    cmd.args(args)
        .arg("--state")
        .arg(cluster_file("state.json"))
        .arg("--config")
        .arg(cluster_file("config.yaml"))
        .env("NO_COLOR", "1");
    cmd
}

/// `kubectl-kproxy repair --local --netns NS --backend BACKEND --backup-dir DIR` on the example
/// cluster (more arguments may follow).
pub fn local_repair(ns: &Netns, backend: Backend, backups: &Path) -> Command {
    let mut cmd = kproxy_on_cluster(&[
        "repair",
        "--local",
        "--netns",
        ns.name(),
        "--backend",
        backend.name(),
    ]);
    cmd.arg("--backup-dir").arg(backups);
    cmd
}

/// The tools the iptables repair tests need: `ip` and both backends' save/restore.
pub fn iptables_tools() -> Vec<&'static str> {
    let mut tools = vec!["ip"];
    tools.extend(Backend::Nft.tools());
    tools.extend(Backend::Legacy.tools());
    tools
}

/// A process's exit code, stdout and stderr, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Fails the test unless `o` exited with `code`; `what` names the step.
#[track_caller]
pub fn expect_exit(o: &Output, code: i32, what: &str) {
    assert_eq!(o.status.code(), Some(code), "{what}: {}", text(o));
}

/// Fails the test unless `o`'s stdout (`stderr` false) or stderr contains `want`.
#[track_caller]
pub fn expect_output(o: &Output, stderr: bool, want: &str) {
    let stream = if stderr { &o.stderr } else { &o.stdout };
    assert!(
        String::from_utf8_lossy(stream).contains(want),
        "no `{want}`: {}",
        text(o)
    );
}

/// The lines of a save that belong to other software: foreign chains' declarations and rules,
/// and rules in built-in chains that do not jump to a KUBE-* chain.
pub fn foreign_lines(save: &str) -> Vec<String> {
    save.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            let chain = l
                .split_whitespace()
                .nth(if l.starts_with('-') { 1 } else { 0 })
                .unwrap_or("")
                .trim_start_matches(':');
            let foreign_chain = chain.starts_with("DOCKER") || chain.starts_with("cni-");
            let builtin_rule = l.starts_with("-A ")
                && ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"].contains(&chain)
                && !l.contains("-j KUBE-");
            foreign_chain || builtin_rule
        })
        .map(str::to_string)
        .collect()
}

/// A save without comments and counters (chain counters and `-c` rule counters move with
/// traffic; the rules are what must be equal).
pub fn rules_only(save: &str) -> Vec<String> {
    save.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| {
            let l = match l.strip_prefix('[') {
                Some(rest) => rest.split_once("] ").map_or(l, |(_, r)| r),
                None => l,
            };
            match (l.starts_with(':'), l.rfind(" [")) {
                (true, Some(i)) => l.get(..i).unwrap_or(l).to_string(),
                _ => l.to_string(),
            }
        })
        .collect()
}

/// The example cluster's node (192.168.77.2), a client (192.168.77.3) and the three `shop/web`
/// pods, in namespaces named after `name`.
pub fn topology(name: &str) -> Topology {
    Topology::builder(name)
        .node_addrs(&["192.168.77.2/24"])
        .client_addrs(&["192.168.77.3/24"])
        .pod(Pod::new("web-a", "10.244.1.10").tcp(8080))
        .pod(Pod::new("web-b", "10.244.1.11").tcp(8080))
        .pod(Pod::new("web-c", "10.244.2.10").tcp(8080))
        .build()
        .expect("topology")
}

/// Whether 12 connections from the client to `shop/web`'s cluster IP all succeed. Each gets the
/// probes' default timeout: on a loaded machine a working connect has taken longer than 800 ms,
/// and a broken service costs one timeout only (the probes stop at the first).
pub fn web_reachable(topo: &Topology) -> bool {
    let probe = Probe::default();
    topo.client()
        .connect_many(&probe, addr(WEB), 12)
        .map(|t| t.ok() == 12)
        .unwrap_or(false)
}

/// `o`'s stdout as the one JSON document `repair -o json` prints; fails the test when stdout
/// is not exactly one JSON document (e.g. status lines after it).
#[track_caller]
pub fn json_doc(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", text(o)))
}

/// The `outcome` field of a `repair -o json` document.
pub fn outcome(doc: &serde_json::Value) -> &str {
    doc.get("outcome")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
}

/// The `rollback_notes` of a `repair -o json` document: what the rollback left as it was.
pub fn rollback_notes(doc: &serde_json::Value) -> Vec<&str> {
    doc["rollback_notes"]
        .as_array()
        .map(|a| a.iter().filter_map(serde_json::Value::as_str).collect())
        .unwrap_or_default()
}

/// The rules of a save and the user chains it declares, each prefixed with its table, without
/// counters: what must be equal before a repair and after its rollback. Empty tables, built-in
/// chains and their policies are left out (a table the node gets only once a rule was written
/// to it comes back empty).
pub fn rules_and_user_chains(save: &str) -> Vec<String> {
    const BUILTIN: [&str; 5] = ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];
    let mut table = String::new();
    let mut out = Vec::new();
    for l in rules_only(save) {
        if let Some(t) = l.strip_prefix('*') {
            table = t.to_string();
            continue;
        }
        let user_chain = l
            .strip_prefix(':')
            .is_some_and(|c| !BUILTIN.contains(&c.split_whitespace().next().unwrap_or_default()));
        if l.starts_with("-A ") || user_chain {
            out.push(format!("{table}: {l}"));
        }
    }
    out
}

/// Every chain of a save by (table, chain), with its rules in order and without counters:
/// two saves of equal rules give equal maps, whatever order the backend lists chains in.
pub fn chain_rules(save: &str) -> BTreeMap<(String, String), Vec<String>> {
    let mut table = String::new();
    let mut out: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for l in rules_only(save) {
        if let Some(t) = l.strip_prefix('*') {
            table = t.to_string();
        } else if let Some(decl) = l.strip_prefix(':') {
            let chain = decl.split_whitespace().next().unwrap_or_default();
            out.entry((table.clone(), chain.to_string())).or_default();
        } else if let Some(rule) = l.strip_prefix("-A ") {
            let (chain, spec) = rule.split_once(' ').unwrap_or((rule, ""));
            out.entry((table.clone(), chain.to_string()))
                .or_default()
                .push(spec.to_string());
        }
    }
    out
}

/// Waits (at most `limit`) until `path` exists; false when it never did.
pub fn wait_for_file(path: &Path, limit: Duration) -> bool {
    let started = std::time::Instant::now();
    while !path.exists() {
        if started.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}
