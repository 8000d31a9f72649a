//! `verify` and `repair` of nftables-mode nodes on the real kernel, in fresh network namespaces:
//! the render of the example cluster (`testdata/cluster`, read in nftables mode) loads with
//! `nft -f`; `nft list ruleset` and `nft -j list ruleset` of it verify clean; drifts made with
//! real `nft` commands are each reported with the service port named; `repair --local --apply`
//! fixes each (verify clean after, a second apply changes nothing) and never touches a foreign
//! table; a failing transaction is rolled back. Also: kube-proxy's golden live captures
//! (`../shared/conformance/nftables/render/*/expected-live.{nft,json}`) verify clean against
//! the render of their case.

use crate::render::{get, text_of, yaml};
use crate::support::fake_apiserver::{ExecReply, ExecRequest, FakeApiServer};
use crate::support::netns::{Netns, require_root_and_tools};
use crate::support::repair::{cluster_file, expect_exit, json_doc, outcome, text};
use kproxy_parsers::nft::{self, ParseOptions};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The example cluster's configuration with `mode: nftables`, written into `dir`.
pub(crate) fn nft_config(dir: &Path) -> PathBuf {
    crate::support::repair::config_in_mode(dir, "nftables")
}

/// `kubectl-kproxy ARGS… --state … --config CONFIG` without colour.
pub(crate) fn kproxy(config: &Path, args: &[&str]) -> Command {
    let mut cmd = crate::support::kproxy();
    cmd.args(args)
        .arg("--state")
        .arg(cluster_file("state.json"))
        .arg("--config")
        .arg(config)
        .env("NO_COLOR", "1");
    cmd
}

fn run(mut cmd: Command) -> Output {
    cmd.output().expect("run kubectl-kproxy")
}

/// `render --mode nftables` of one family.
pub(crate) fn render(config: &Path, family: &str) -> String {
    let o = run(kproxy(
        config,
        &["render", "--mode", "nftables", "--ip-family", family],
    ));
    expect_exit(&o, 0, "render");
    String::from_utf8(o.stdout).expect("utf-8")
}

/// Verifies a listing saved in `dir` as `name`; returns the report and the exit code.
fn verify(config: &Path, dir: &Path, name: &str, listing: &str) -> (Value, Option<i32>) {
    let path = dir.join(name);
    std::fs::write(&path, listing).expect("write listing");
    let o = run(kproxy(
        config,
        &[
            "verify",
            "--nft-ruleset",
            path.to_str().expect("utf-8 path"),
            "-o",
            "json",
        ],
    ));
    assert!(
        matches!(o.status.code(), Some(0 | 1)),
        "verify could not run: {}",
        text(&o)
    );
    (json_doc(&o), o.status.code())
}

/// `repair --local --apply --netns NS` (extra args after).
fn repair(config: &Path, ns: &Netns, backups: &Path, extra: &[&str]) -> Output {
    let mut cmd = kproxy(config, &["repair", "--local", "--netns", ns.name()]);
    cmd.arg("--backup-dir").arg(backups).args(extra);
    run(cmd)
}

/// The (id, service, chain) of every finding that is not info.
pub(crate) fn findings(report: &Value) -> Vec<(String, Option<String>, Option<String>)> {
    report["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|f| f["severity"] != "info")
                .map(|f| {
                    (
                        f["id"].as_str().unwrap_or_default().to_string(),
                        f["service"].as_str().map(str::to_string),
                        f["chain"].as_str().map(str::to_string),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A foreign table that repair must never touch.
pub(crate) const FOREIGN: &str = "table inet fw {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\t\ttcp dport 22 counter accept comment \"ssh\"\n\t}\n}\n";

/// A namespace holding the example cluster's rendered tables (both families) and [`FOREIGN`].
pub(crate) fn loaded(config: &Path, prefix: &str) -> Netns {
    let ns = Netns::new(prefix).expect("netns");
    ns.nft_load(&render(config, "4"))
        .expect("load the ip table");
    ns.nft_load(&render(config, "6"))
        .expect("load the ip6 table");
    ns.nft_load(FOREIGN).expect("load the foreign table");
    ns
}

/// The name of the first chain of the listing with `prefix` whose name contains `part`.
fn chain_named(listing: &str, prefix: &str, part: &str) -> String {
    listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix("chain "))
        .map(|l| l.trim_end_matches(" {").to_string())
        .find(|c| c.starts_with(prefix) && c.contains(part))
        .unwrap_or_else(|| panic!("no chain {prefix}…{part}… in\n{listing}"))
}

#[test]
fn render_loads_and_its_listings_verify_clean() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ns = loaded(&config, "nftv-clean");
    let text = ns.nft(&["list", "ruleset"]).expect("nft list ruleset");
    let json = ns
        .nft(&["-j", "list", "ruleset"])
        .expect("nft -j list ruleset");
    for (name, listing) in [("ruleset.nft", &text), ("ruleset.json", &json)] {
        let (report, code) = verify(&config, dir.path(), name, listing);
        assert_eq!(code, Some(0), "{name}: {report:#}");
        assert_eq!(report["mode"], "nftables", "{report}");
        assert!(
            report["summary"]["service_ports"].as_u64() >= Some(10),
            "{report}"
        );
    }
    // The table of one family alone, as a collector fetches it (`nft -j list table ip
    // kube-proxy`): the other family is not checked, which is no drift.
    let ip = ns
        .nft(&["-j", "list", "table", "ip", "kube-proxy"])
        .expect("nft -j list table");
    let (report, code) = verify(&config, dir.path(), "ip.json", &ip);
    assert_eq!(code, Some(0), "{report:#}");
}

/// iptables-mode kube-proxy chains written with iptables-nft beside kube-proxy's nftables table
/// show in `nft list ruleset` as `table ip nat`: a leftover of the other mode (KP708), while
/// kubelet's own `KUBE-FIREWALL` is not.
#[test]
fn iptables_mode_leftovers_in_the_ruleset_are_found() {
    use crate::support::netns::Backend;
    if !require_root_and_tools(&["nft", "iptables-nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ns = loaded(&config, "nftv-left");
    ns.iptables(Backend::Nft, &["-t", "filter", "-N", "KUBE-FIREWALL"])
        .expect("kubelet's chain");
    for (name, listing) in [
        ("kubelet.nft", ns.nft(&["list", "ruleset"]).expect("list")),
        (
            "kubelet.json",
            ns.nft(&["-j", "list", "ruleset"]).expect("list"),
        ),
    ] {
        let (report, code) = verify(&config, dir.path(), name, &listing);
        assert_eq!(
            code,
            Some(0),
            "{name}: kubelet's chain is no leftover: {report:#}"
        );
    }
    for args in [
        &["-t", "nat", "-N", "KUBE-SERVICES"][..],
        &["-t", "nat", "-N", "KUBE-SVC-ABCDEFGHIJKLMNOP"],
        &["-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"],
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SERVICES",
            "-d",
            "10.96.100.20/32",
            "-p",
            "tcp",
            "--dport",
            "443",
            "-j",
            "KUBE-SVC-ABCDEFGHIJKLMNOP",
        ],
    ] {
        ns.iptables(Backend::Nft, args).expect("iptables-nft");
    }
    for (name, listing) in [
        ("left.nft", ns.nft(&["list", "ruleset"]).expect("list")),
        (
            "left.json",
            ns.nft(&["-j", "list", "ruleset"]).expect("list"),
        ),
    ] {
        let (report, code) = verify(&config, dir.path(), name, &listing);
        assert_eq!(code, Some(1), "{name}: {report:#}");
        assert_eq!(
            findings(&report),
            [("KP708".to_string(), None, Some("table ip nat".to_string()))],
            "{name}: {report:#}"
        );
    }
}

/// One drift: what it is, the nft commands that make it, and the finding it must give.
struct Drift {
    what: &'static str,
    /// `nft -f` input making the drift.
    script: String,
    /// (id, service, chain) that must be among the findings.
    finding: (&'static str, Option<&'static str>, Option<String>),
}

#[test]
fn drifts_are_found_and_repaired_without_touching_other_tables() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let backups = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ns = loaded(&config, "nftv-drift");
    let listing = ns
        .nft(&["list", "table", "ip", "kube-proxy"])
        .expect("list");
    let foreign_before = ns.nft(&["list", "table", "inet", "fw"]).expect("list fw");

    let endpoint = chain_named(&listing, "endpoint-", "shop/legacy-gateway/");
    let service = chain_named(&listing, "service-", "shop/legacy-gateway/");
    let handle = {
        let chain = ns
            .nft(&["-a", "list", "chain", "ip", "kube-proxy", &service])
            .expect("list chain");
        chain
            .lines()
            .find(|l| l.contains("numgen"))
            .and_then(|l| l.rsplit("# handle ").next())
            .map(|h| h.trim().to_string())
            .expect("the numgen rule's handle")
    };
    let stale = "endpoint-AAAAAAAA-shop/legacy-gateway/tcp/http__10.244.9.9/8080";
    let drifts = vec![
        Drift {
            what: "endpoint chain flushed",
            script: format!("flush chain ip kube-proxy {endpoint}\n"),
            finding: (
                "KP735",
                Some("shop/legacy-gateway:http"),
                Some(endpoint.clone()),
            ),
        },
        Drift {
            what: "service-ips element deleted",
            script: "delete element ip kube-proxy service-ips { 10.96.100.20 . tcp . 443 }\n"
                .into(),
            finding: (
                "KP721",
                Some("shop/frontend:https"),
                Some("service-ips".into()),
            ),
        },
        Drift {
            what: "masquerading chain flushed",
            script: "flush chain ip kube-proxy masquerading\n".into(),
            finding: ("KP704", None, Some("masquerading".into())),
        },
        Drift {
            what: "stale endpoint added",
            script: format!(
                "add chain ip kube-proxy {stale}\n\
                 add rule ip kube-proxy {stale} ip saddr 10.244.9.9 jump mark-for-masquerade\n\
                 add rule ip kube-proxy {stale} meta l4proto tcp dnat to 10.244.9.9:8080\n\
                 replace rule ip kube-proxy {service} handle {handle} numgen random mod 2 vmap {{ 0 : goto {endpoint} , 1 : goto {stale} }}\n"
            ),
            finding: (
                "KP733",
                Some("shop/legacy-gateway:http"),
                Some(service.clone()),
            ),
        },
    ];
    for d in &drifts {
        ns.nft_load(&d.script)
            .unwrap_or_else(|e| panic!("{}: {e}", d.what));
        let text = ns.nft(&["list", "ruleset"]).expect("list");
        let json = ns.nft(&["-j", "list", "ruleset"]).expect("list");
        let mut text_findings = None;
        for (name, listing) in [("drift.nft", &text), ("drift.json", &json)] {
            let (report, code) = verify(&config, dir.path(), name, listing);
            assert_eq!(code, Some(1), "{} ({name}): {report:#}", d.what);
            let got = findings(&report);
            let (id, svc, chain) = &d.finding;
            assert!(
                got.iter()
                    .any(|(i, s, c)| i == id && s.as_deref() == *svc && c == chain),
                "{} ({name}): no {id} for {svc:?} in {got:#?}",
                d.what
            );
            // Every finding names the service port it concerns (the masquerading chain serves
            // all of them and is node-wide).
            assert!(
                got.iter()
                    .all(|(_, s, c)| s.is_some() || c.as_deref() == Some("masquerading")),
                "{} ({name}): {got:#?}",
                d.what
            );
            // The text and JSON listings of one ruleset give the same findings.
            match &text_findings {
                None => text_findings = Some(got),
                Some(t) => assert_eq!(t, &got, "{}: text and JSON differ", d.what),
            }
        }

        let dry = repair(&config, &ns, backups.path(), &["-o", "json"]);
        expect_exit(&dry, 1, d.what);
        assert_eq!(outcome(&json_doc(&dry)), "dry_run");
        let fixed = repair(&config, &ns, backups.path(), &["--apply", "-o", "json"]);
        expect_exit(&fixed, 0, d.what);
        let doc = json_doc(&fixed);
        assert_eq!(outcome(&doc), "applied", "{}: {doc:#}", d.what);
        assert_eq!(doc["applied"], true);
        let input = doc["nft_input"].as_str().unwrap_or_default();
        assert!(
            input
                .lines()
                .filter(|l| !l.starts_with('#'))
                .all(|l| l.contains(" ip kube-proxy ") || l.contains(" ip6 kube-proxy ")),
            "{}: the transaction names another table:\n{input}",
            d.what
        );
        let backup = PathBuf::from(doc["backup"].as_str().expect("backup dir"));
        for f in ["ip-kube-proxy.nft", "ip-kube-proxy.json"] {
            let meta = std::fs::metadata(backup.join(f)).expect("backup file");
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{f}");
        }

        let json = ns.nft(&["-j", "list", "ruleset"]).expect("list");
        let (report, code) = verify(&config, dir.path(), "fixed.json", &json);
        assert_eq!(code, Some(0), "{} after repair: {report:#}", d.what);
        let again = repair(&config, &ns, backups.path(), &["--apply", "-o", "json"]);
        expect_exit(&again, 0, d.what);
        assert_eq!(
            outcome(&json_doc(&again)),
            "nothing_to_do",
            "{}: a second apply must change nothing",
            d.what
        );
        assert_eq!(
            ns.nft(&["list", "table", "inet", "fw"]).expect("list fw"),
            foreign_before,
            "{}: the foreign table changed",
            d.what
        );
    }
    // The stale endpoint's chain is gone, not only flushed (this kernel releases it at once).
    let after = ns
        .nft(&["list", "table", "ip", "kube-proxy"])
        .expect("list");
    assert!(!after.contains(stale), "{after}");
}

/// The node's `kube-proxy` tables, parsed and normalised (what a rollback must give back).
pub(crate) fn tables(ns: &Netns) -> String {
    let json = ns.nft(&["-j", "list", "ruleset"]).expect("list");
    let mut rs = nft::parse(&json, &ParseOptions::strict()).expect("parse");
    rs.normalize();
    rs.tables.retain(|t| t.name == "kube-proxy");
    format!("{rs}")
}

#[test]
fn a_failed_apply_changes_nothing_and_an_empty_node_is_installed() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let backups = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ns = loaded(&config, "nftv-rollback");
    ns.nft_load("flush chain ip kube-proxy masquerading\ndelete element ip kube-proxy service-ips { 10.96.100.20 . tcp . 443 }\n")
        .expect("drift");
    // Filled by packets in real life: the rollback must keep it.
    let listing = ns
        .nft(&["list", "table", "ip", "kube-proxy"])
        .expect("list");
    let affinity = listing
        .lines()
        .filter_map(|l| l.trim().strip_prefix("set "))
        .map(|l| l.trim_end_matches(" {").to_string())
        .find(|s| s.starts_with("affinity-"))
        .expect("cart's affinity set");
    ns.nft_load(&format!(
        "add element ip kube-proxy {affinity} {{ 10.1.2.3 }}\n"
    ))
    .expect("affinity element");
    let before = tables(&ns);
    let foreign_before = ns.nft(&["list", "table", "inet", "fw"]).expect("list fw");
    let failed = repair(
        &config,
        &ns,
        backups.path(),
        &["--apply", "--inject-fault", "-o", "json"],
    );
    expect_exit(&failed, 2, "injected fault");
    let doc = json_doc(&failed);
    // nft applies a transaction whole or not at all: the failed one changed nothing, and the
    // outcome says so (the text: "nothing had been changed").
    assert_eq!(outcome(&doc), "failed", "{doc:#}");
    assert!(
        doc["error"]
            .as_str()
            .is_some_and(|e| e.contains("nothing had been changed")),
        "{doc:#}"
    );
    assert!(doc["backup"].is_string(), "{doc}");
    assert_eq!(tables(&ns), before, "the tables are as they were");
    assert!(
        ns.nft(&["list", "set", "ip", "kube-proxy", &affinity])
            .expect("list set")
            .contains("10.1.2.3"),
        "the affinity element survives the rollback"
    );

    // From nothing: kube-proxy never ran here.
    ns.nft_load("delete table ip kube-proxy\ndelete table ip6 kube-proxy\n")
        .expect("delete tables");
    let dry = repair(&config, &ns, backups.path(), &[]);
    expect_exit(&dry, 1, "dry run from nothing");
    let applied = repair(&config, &ns, backups.path(), &["--apply"]);
    expect_exit(&applied, 0, "install from nothing");
    let json = ns.nft(&["-j", "list", "ruleset"]).expect("list");
    let (report, code) = verify(&config, dir.path(), "installed.json", &json);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(
        ns.nft(&["list", "table", "inet", "fw"]).expect("list fw"),
        foreign_before
    );
}

/// The node-fact flags of a golden case (`conformance.py harness_flags`).
fn harness_flags(case: &Value) -> Vec<String> {
    let a = crate::render::harness_args(case);
    let mut f: Vec<String> = Vec::new();
    let mut flag = |k: &str, v: String| {
        f.push(k.to_string());
        f.push(v);
    };
    if let Some(n) = a.node {
        flag("--node", n);
    }
    let v6 = a.family == Some(kproxy::state::ip::IpFamily::V6);
    flag("--ip-family", if v6 { "6" } else { "4" }.into());
    for ip in a.node_ips {
        flag("--node-ip", ip.to_string());
    }
    if let Some(m) = a.masquerade_mark {
        flag("--masquerade-mark", m);
    }
    flag("--random-fully", a.random_fully.to_string());
    let counters = a.nfacct.unwrap_or_default();
    flag(
        "--nfacct",
        if counters.is_empty() {
            "none".into()
        } else {
            counters.join(",")
        },
    );
    flag("--tcp-be-liberal", a.tcp_be_liberal.to_string());
    f
}

/// kube-proxy's golden render cases that were loaded into a kernel and listed back
/// (`expected-live.nft`, `expected-live.json`): each verifies clean against the render of its
/// case (flushed stale chains included, as kube-proxy's own comparison ignores them).
#[test]
fn golden_live_captures_verify_clean() {
    let Some(root) = crate::support::shared("nftables_verify", "conformance/nftables/render")
    else {
        return;
    };
    let mut checked = 0;
    for entry in std::fs::read_dir(&root).expect("render cases") {
        let dir = entry.expect("entry").path();
        let case = yaml(&dir.join("case.yaml"));
        if text_of(get(&case, &["compare", "mode"])).as_deref() != Some("full-dump") {
            continue;
        }
        for live in ["expected-live.nft", "expected-live.json"] {
            let path = dir.join(live);
            if !path.exists() {
                continue;
            }
            let mut cmd = crate::support::kproxy();
            cmd.arg("verify")
                .arg("--state")
                .arg(dir.join("state.json"))
                .arg("--config")
                .arg(dir.join("config.yaml"))
                .arg("--nft-ruleset")
                .arg(&path)
                .args(["-o", "json"])
                .args(harness_flags(&case));
            let o = run(cmd);
            assert_eq!(o.status.code(), Some(0), "{}: {}", path.display(), text(&o));
            checked += 1;
        }
    }
    // Every live capture of the suite (two cases, each in text and JSON) was checked.
    let captures = std::fs::read_dir(&root)
        .expect("render cases")
        .flat_map(|e| {
            let dir = e.expect("entry").path();
            ["expected-live.nft", "expected-live.json"].map(|f| dir.join(f).exists())
        })
        .filter(|&present| present)
        .count();
    assert!(captures >= 4, "only {captures} live captures in the suite");
    assert_eq!(
        checked, captures,
        "captures of cases that are not full dumps"
    );
}

/// What the fake kube-proxy pod's `nft` answers.
#[derive(Clone)]
enum NftAnswer {
    /// `nft -j list table FAMILY kube-proxy` prints these listings (ip, ip6).
    Tables(String, String),
    /// The node has neither table (nft's own error).
    Absent,
    /// The image has no `nft`.
    Missing,
}

/// A fake cluster: the example cluster's API state, kube-proxy's ConfigMap in nftables mode, a
/// kube-proxy pod on node-1 whose `nft` answers from `answer` and `ipvsadm` from `ipvsadm`
/// (missing when `None`).
fn nft_cluster(
    config: &Path,
    answer: std::sync::Arc<std::sync::Mutex<NftAnswer>>,
    ipvsadm: std::sync::Arc<std::sync::Mutex<Option<String>>>,
) -> FakeApiServer {
    let api = FakeApiServer::start();
    api.add_list_file(&cluster_file("state.json"));
    let text = std::fs::read_to_string(config).expect("config");
    api.add_configmap("kube-system", "kube-proxy", &[("config.conf", &text)]);
    api.add_proxy_pod("node-1");
    api.on_exec(move |req: &ExecRequest| {
        let argv: Vec<&str> = req.command.iter().map(String::as_str).collect();
        match argv.as_slice() {
            // An nftables node: the iptables-nft view shows no kube-proxy chains.
            ["iptables-save"] => ExecReply::ok("*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n"),
            ["nft", "-j", "list", "table", family, "kube-proxy"] => {
                match &*answer.lock().expect("answer") {
                    NftAnswer::Tables(ip, ip6) => ExecReply::ok(if *family == "ip" {
                        ip.clone()
                    } else {
                        ip6.clone()
                    }),
                    NftAnswer::Absent => ExecReply::Output {
                        stdout: String::new(),
                        stderr: format!(
                            "Error: No such file or directory\nlist table {family} kube-proxy\n"
                        ),
                        exit_code: 1,
                    },
                    NftAnswer::Missing => ExecReply::Missing,
                }
            }
            ["ipvsadm", ..] => match &*ipvsadm.lock().expect("ipvsadm") {
                Some(text) => ExecReply::ok(text.clone()),
                None => ExecReply::Missing,
            },
            _ => ExecReply::Missing,
        }
    });
    api
}

/// `kubectl-kproxy ARGS… --kubeconfig K -o json` against a fake cluster: (exit code, report or
/// null, stderr).
fn live(kubeconfig: &Path, home: &Path, args: &[&str]) -> (Option<i32>, Value, String) {
    let o = crate::support::kproxy()
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home)
        .env("NO_COLOR", "1")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .output()
        .expect("run kubectl-kproxy");
    let doc = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (
        o.status.code(),
        doc,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The live collectors (`exec` through the fake apiserver) fetch `nft -j list table ip|ip6
/// kube-proxy`; `verify NODE` of an nftables-mode node compares them, bundles carry them, and
/// a missing `nft` or a missing table is no collection failure.
#[test]
fn live_verify_and_bundles_use_the_collected_tables() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ns = loaded(&config, "nftv-live");
    let list = |family: &str| {
        ns.nft(&["-j", "list", "table", family, "kube-proxy"])
            .expect("nft -j list table")
    };
    let (ip, ip6) = (list("ip"), list("ip6"));
    let answer = std::sync::Arc::new(std::sync::Mutex::new(NftAnswer::Tables(
        ip.clone(),
        ip6.clone(),
    )));
    let ipvsadm = std::sync::Arc::new(std::sync::Mutex::new(None));
    let api = nft_cluster(&config, answer.clone(), ipvsadm.clone());
    let kubeconfig = api.write_kubeconfig(dir.path());
    let home = dir.path();

    let (code, report, stderr) = live(&kubeconfig, home, &["verify", "node-1", "-o", "json"]);
    assert_eq!(code, Some(0), "{stderr}\n{report:#}");
    assert_eq!(report["mode"], "nftables", "{report}");
    assert!(
        report["summary"]["service_ports"].as_u64() >= Some(10),
        "{report}"
    );

    // IPVS virtual servers left over from IPVS mode, seen through the collector.
    *ipvsadm.lock().expect("ipvsadm") = Some(
        "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\nTCP  10.96.0.1:443 rr\n  -> 192.168.77.2:6443            Masq    1      0          0\n".into(),
    );
    let (code, report, stderr) = live(&kubeconfig, home, &["verify", "node-1", "-o", "json"]);
    assert_eq!(code, Some(1), "{stderr}\n{report:#}");
    assert_eq!(
        findings(&report)
            .iter()
            .map(|f| f.0.as_str())
            .collect::<Vec<_>>(),
        ["KP709"],
        "{report:#}"
    );
    *ipvsadm.lock().expect("ipvsadm") = None;

    // The bundle carries both listings as collected, and verifies the same.
    let bundle = dir.path().join("bundle.tar.gz");
    let b = bundle.to_str().expect("utf-8");
    let (code, _, stderr) = live(&kubeconfig, home, &["collect", "node-1", "-o", b]);
    assert_eq!(code, Some(0), "{stderr}");
    let read = kproxy::collect::bundle::read(&bundle).expect("bundle");
    assert_eq!(read.snapshot.nft_kube_proxy.as_deref(), Some(ip.as_str()));
    assert_eq!(read.snapshot.nft_kube_proxy6.as_deref(), Some(ip6.as_str()));
    let (code, report, stderr) = live(&kubeconfig, home, &["verify", "--bundle", b, "-o", "json"]);
    assert_eq!(code, Some(0), "{stderr}\n{report:#}");
    assert_eq!(report["mode"], "nftables", "{report}");

    // Drift on the node is found through the collector, with the service named.
    let listing = ns
        .nft(&["list", "table", "ip", "kube-proxy"])
        .expect("list");
    let endpoint = chain_named(&listing, "endpoint-", "shop/legacy-gateway/");
    ns.nft_load(&format!("flush chain ip kube-proxy {endpoint}\n"))
        .expect("drift");
    *answer.lock().expect("answer") = NftAnswer::Tables(list("ip"), ip6.clone());
    let (code, report, stderr) = live(&kubeconfig, home, &["verify", "node-1", "-o", "json"]);
    assert_eq!(code, Some(1), "{stderr}\n{report:#}");
    assert!(
        findings(&report).contains(&(
            "KP735".into(),
            Some("shop/legacy-gateway:http".into()),
            Some(endpoint.clone())
        )),
        "{report:#}"
    );

    // No tables on the node: collected (empty), and verify says the table is missing.
    *answer.lock().expect("answer") = NftAnswer::Absent;
    let (code, _, stderr) = live(&kubeconfig, home, &["collect", "node-1", "-o", b]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        !stderr.contains("nft"),
        "an absent table is no warning: {stderr}"
    );
    let (code, report, stderr) = live(&kubeconfig, home, &["verify", "node-1", "-o", "json"]);
    assert_eq!(code, Some(1), "{stderr}\n{report:#}");
    assert!(
        findings(&report).iter().any(|(id, _, _)| id == "KP701"),
        "{report:#}"
    );

    // No nft in the image: collection warns once and succeeds; verify of an nftables node
    // cannot compare and says why.
    *answer.lock().expect("answer") = NftAnswer::Missing;
    let (code, _, stderr) = live(&kubeconfig, home, &["collect", "node-1", "-o", b]);
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stderr.matches("`nft` is not installed").count(),
        1,
        "{stderr}"
    );
    let (code, _, stderr) = live(&kubeconfig, home, &["verify", "node-1", "-o", "json"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("nftables mode") && stderr.contains("nft"),
        "{stderr}"
    );
}

/// `verify --collector local` run on an nftables node (inside its namespace) reads the tables
/// with nft itself.
#[test]
fn the_local_collector_reads_the_tables_with_nft() {
    if !require_root_and_tools(&["nft", "iptables-save"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ns = loaded(&config, "nftv-local");
    let verify_local = || {
        let mut cmd = ns.command(&[
            env!("CARGO_BIN_EXE_kubectl-kproxy"),
            "verify",
            "node-1",
            "--collector",
            "local",
            "--state",
            cluster_file("state.json").to_str().expect("utf-8"),
            "--config",
            config.to_str().expect("utf-8"),
            "-o",
            "json",
        ]);
        cmd.env("NO_COLOR", "1");
        let o = cmd.output().expect("run");
        (o.status.code(), json_doc(&o), text(&o))
    };
    let (code, report, out) = verify_local();
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(report["mode"], "nftables", "{report}");
    ns.nft_load("delete element ip kube-proxy service-ips { 10.96.100.20 . tcp . 443 }\n")
        .expect("drift");
    let (code, report, out) = verify_local();
    assert_eq!(code, Some(1), "{out}");
    assert!(
        findings(&report).contains(&(
            "KP721".into(),
            Some("shop/frontend:https".into()),
            Some("service-ips".into())
        )),
        "{report:#}"
    );
}

/// A child `resync` killed (if still running) when dropped; stderr goes to a file.
struct Resync {
    child: std::process::Child,
    log: PathBuf,
}

impl Resync {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Resync {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Polls until `ok` holds of the namespace's `table ip kube-proxy` (its `nft list` text, ""
/// when absent), or panics after `limit`.
fn until(
    ns: &Netns,
    resync: &Resync,
    limit: std::time::Duration,
    what: &str,
    ok: impl Fn(&str) -> bool,
) {
    let start = std::time::Instant::now();
    loop {
        let listing = ns
            .nft(&["list", "table", "ip", "kube-proxy"])
            .unwrap_or_default();
        if ok(&listing) {
            return;
        }
        assert!(
            start.elapsed() < limit,
            "{what}: not within {limit:?}\n{listing}\nresync log:\n{}",
            resync.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `resync --local --watch` on an nftables-mode node (mode from the configuration): it installs
/// the tables, follows the API, puts back drift at its full sync, and never touches another
/// table.
#[test]
fn resync_keeps_an_nftables_node_in_sync() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let config = nft_config(dir.path());
    let ns = Netns::new("nftv-resync").expect("netns");
    ns.nft_load(FOREIGN).expect("foreign table");
    let foreign_before = ns.nft(&["list", "table", "inet", "fw"]).expect("list fw");
    let api = FakeApiServer::start();
    api.add_list_file(&cluster_file("state.json"));
    let kubeconfig = api.write_kubeconfig(dir.path());
    let log = dir.path().join("resync.log");
    let child = crate::support::kproxy()
        .args(["resync", "--local", "--watch", "--netns", ns.name()])
        .args([
            "--node",
            "node-1",
            "--min-sync-period",
            "200ms",
            "--sync-period",
            "3s",
        ])
        // Another test of the suite runs a process named kube-proxy.
        .arg("--force")
        .arg("--config")
        .arg(&config)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", dir.path())
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn resync");
    let mut resync = Resync { child, log };
    let limit = std::time::Duration::from_secs(20);

    // The first sync installs both families' tables from nothing: verify is clean.
    until(&ns, &resync, limit, "the first sync", |l| {
        l.contains("service-ips")
    });
    let json = ns.nft(&["-j", "list", "ruleset"]).expect("list");
    let (report, code) = verify(&config, dir.path(), "synced.json", &json);
    assert_eq!(code, Some(0), "{report:#}\n{}", resync.log());
    assert!(resync.log().contains("sync: full"), "{}", resync.log());

    // A deleted Service leaves the service-ips map at the next sync.
    let listing = ns
        .nft(&["list", "table", "ip", "kube-proxy"])
        .expect("list");
    assert!(listing.contains("10.96.100.30 . tcp . 8080"), "{listing}");
    assert!(api.delete_object("Service", Some("shop"), "legacy-gateway"));
    until(&ns, &resync, limit, "the deletion", |l| {
        l.contains("service-ips") && !l.contains("10.96.100.30 . tcp . 8080")
    });

    // An object the API server would reject is left out of the syncs, and said once.
    api.add_objects([serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"namespace": "shop", "name": "bad-port", "resourceVersion": "1"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "10.96.100.31",
            "clusterIPs": ["10.96.100.31"],
            "ports": [{"name": "a\"b", "port": 80, "protocol": "TCP", "targetPort": 80}]
        }
    })]);
    let said = std::time::Instant::now();
    while !resync.log().contains("left out: Service shop/bad-port") {
        assert!(said.elapsed() < limit, "not said:\n{}", resync.log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    // Drift made by hand is put back by the periodic full sync.
    ns.nft_load("flush chain ip kube-proxy masquerading\n")
        .expect("drift");
    until(&ns, &resync, limit, "the full sync", |l| {
        l.split("chain masquerading {").nth(1).is_some_and(|rest| {
            rest.split('}')
                .next()
                .is_some_and(|c| c.contains("masquerade"))
        })
    });
    assert_eq!(
        ns.nft(&["list", "table", "inet", "fw"]).expect("list fw"),
        foreign_before,
        "the foreign table changed"
    );
    assert!(!resync.log().contains("sync failed"), "{}", resync.log());

    // A table holding what this build does not know (a newer kube-proxy's layout?) is not
    // synced: the drift beside it stays until the unknown chain is gone.
    ns.nft_load(
        "add chain ip kube-proxy pool-v9\nadd rule ip kube-proxy pool-v9 counter accept\n\
         flush chain ip kube-proxy masquerading\n",
    )
    .expect("unknown chain and drift");
    let masquerades = |l: &str| {
        l.split("chain masquerading {").nth(1).is_some_and(|rest| {
            rest.split('}')
                .next()
                .is_some_and(|c| c.contains("masquerade"))
        })
    };
    let refused = std::time::Instant::now();
    while !resync
        .log()
        .contains("does not know (table ip kube-proxy: chain pool-v9")
    {
        assert!(refused.elapsed() < limit, "no refusal:\n{}", resync.log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let listing = ns
        .nft(&["list", "table", "ip", "kube-proxy"])
        .expect("list");
    assert!(!masquerades(&listing), "synced anyway:\n{listing}");
    ns.nft_load("delete chain ip kube-proxy pool-v9\n")
        .expect("delete the unknown chain");
    until(&ns, &resync, limit, "the sync after", masquerades);
    assert_eq!(
        resync.log().matches("sync failed").count(),
        1,
        "the same refusal is said once:\n{}",
        resync.log()
    );
    assert_eq!(
        resync
            .log()
            .matches("left out: Service shop/bad-port")
            .count(),
        1,
        "the left-out object is said once:\n{}",
        resync.log()
    );
    let listing = ns
        .nft(&["list", "table", "ip", "kube-proxy"])
        .expect("list");
    assert!(!listing.contains("10.96.100.31"), "{listing}");

    // SIGTERM: a clean exit that leaves the tables in place.
    let pid = i32::try_from(resync.child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM");
    let start = std::time::Instant::now();
    let status = loop {
        if let Ok(Some(s)) = resync.child.try_wait() {
            break s;
        }
        assert!(
            start.elapsed() < limit,
            "resync did not exit:\n{}",
            resync.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}\n{}", resync.log());
    assert!(
        ns.nft(&["list", "table", "ip", "kube-proxy"])
            .expect("list")
            .contains("service-ips")
    );
}
