//! `verify` acceptance on real netfilter: render → `iptables-restore` → `iptables-save` → verify is
//! clean (both backends, with and without `-c`, IPv4 and IPv6, every golden render case); one
//! mutation made with real iptables commands is reported with the right ID and service and nothing
//! else; API-side drift is reported.

use crate::support::netns::{Backend, Family, Netns, require_root_and_tools};
use assert_cmd::Command;
use kproxy::compare::Report;
use kproxy::compare::iptables::{DumpText, NodePlans, VerifyInput};
use kproxy::proxier::iptables::{RenderOptions, render};
use kproxy::state::ClusterState;
use kproxy::state::config::ProxyConfig;
use kproxy::state::ip::IpFamily;
use kproxy::state::node::NodeFacts;
use kproxy_parsers::iptables::ParseOptions;
use std::path::PathBuf;

fn repo(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(p)
}

fn tools_ok() -> bool {
    require_root_and_tools(&Backend::Nft.tools())
        && require_root_and_tools(&Backend::Legacy.tools())
}

struct Cluster {
    state: ClusterState,
    config: ProxyConfig,
    facts: NodeFacts,
}

fn cluster_from(state_json: &str) -> Cluster {
    let state = kproxy::state::load::from_str(state_json, "state.json").expect("state");
    let config_text =
        std::fs::read_to_string(repo("testdata/cluster/config.yaml")).expect("config");
    let (config, _) = kproxy::state::config::parse(&config_text, "config.yaml").expect("config");
    let args = kproxy::state::node::NodeInputs {
        family: Some(kproxy::state::ip::IpFamily::V4),
        nfacct: Some(Vec::new()),
        ..Default::default()
    };
    let (facts, _) = kproxy::state::node::build(&args, &state, &config).expect("facts");
    Cluster {
        state,
        config,
        facts,
    }
}

fn cluster() -> Cluster {
    cluster_from(&std::fs::read_to_string(repo("testdata/cluster/state.json")).expect("state.json"))
}

fn rendered(c: &Cluster, family: IpFamily) -> String {
    let mut facts = c.facts.clone();
    facts.family = family;
    render(
        &c.state,
        &c.config,
        &facts,
        RenderOptions {
            with_base_jumps: true,
        },
    )
    .to_restore_text()
}

fn verify(c: &Cluster, v4: &str, v6: Option<&str>, legacy: Option<&str>) -> Report {
    let mut dumps = vec![DumpText {
        label: "iptables-save",
        text: v4,
        family: IpFamily::V4,
    }];
    if let Some(t) = v6 {
        dumps.push(DumpText {
            label: "ip6tables-save",
            text: t,
            family: IpFamily::V6,
        });
    }
    let input = VerifyInput {
        node: "node-1",
        plans: NodePlans::new(&c.state, &c.config, &c.facts, &dumps),
        config: &c.config,
        facts: &c.facts,
        dumps,
        legacy: legacy.map(|t| DumpText {
            label: "iptables-legacy-save",
            text: t,
            family: IpFamily::V4,
        }),
        nft_ruleset: None,
        parse: ParseOptions::strict(),
        group_alike: false,
    };
    kproxy::compare::iptables::verify(&input).expect("verify runs")
}

/// Planning on a thread of its own while the dump is parsed ([`NodePlans::start`], what the
/// command does) reports exactly what planning first ([`NodePlans::new`]) does: on a drifted dump
/// (findings at every level) and with the IPv6 family not collected (counted from its plan).
#[test]
fn planning_on_its_own_thread_reports_the_same() {
    let c = cluster();
    let dump = std::fs::read_to_string(repo("testdata/dumps/drifted.nft-c.save")).expect("dump");
    let report = |plans: &dyn Fn(&[DumpText<'_>]) -> NodePlans| {
        let dumps = vec![DumpText {
            label: "iptables-save",
            text: &dump,
            family: IpFamily::V4,
        }];
        let input = VerifyInput {
            node: "node-1",
            plans: plans(&dumps),
            config: &c.config,
            facts: &c.facts,
            dumps,
            legacy: None,
            nft_ruleset: None,
            parse: ParseOptions::strict(),
            group_alike: false,
        };
        kproxy::compare::iptables::verify(&input).expect("verify runs")
    };
    let first = report(&|d| NodePlans::new(&c.state, &c.config, &c.facts, d));
    let state = std::sync::Arc::new(c.state.clone());
    let threaded = report(&|d| NodePlans::start(state.clone(), &c.config, &c.facts, d));
    assert!(first.findings.len() > 1, "{}", show(&first));
    assert!(
        first.findings.iter().any(|f| f.id == "KP012"),
        "IPv6 not collected: {}",
        show(&first)
    );
    assert_eq!(show(&first), show(&threaded));
    assert_eq!(first.summary, threaded.summary);
}

fn show(r: &Report) -> String {
    r.findings
        .iter()
        .map(|f| {
            format!(
                "{} {:?} {:?}: {} [exp {:?} act {:?}]",
                f.id, f.service, f.chain, f.message, f.expected, f.actual
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// A node with the cluster's rules (IPv4 and IPv6) restored with `backend`.
fn node(c: &Cluster, backend: Backend) -> Netns {
    let ns = Netns::new("verify").expect("netns");
    ns.restore(backend, &rendered(c, IpFamily::V4), false)
        .expect("restore v4");
    ns.restore6(backend, &rendered(c, IpFamily::V6), false)
        .expect("restore v6");
    ns
}

#[test]
fn clean_cluster_reports_nothing_on_both_backends() {
    if !tools_ok() {
        return;
    }
    let c = cluster();
    for backend in Backend::ALL {
        let ns = node(&c, backend);
        for counters in [false, true] {
            let v4 = ns.save(backend, counters).expect("save");
            let v6 = ns.save6(backend, counters).expect("save6");
            let r = verify(&c, &v4, Some(&v6), None);
            assert!(
                r.findings.is_empty(),
                "{backend} -c={counters}:\n{}",
                show(&r)
            );
            assert!(r.summary.service_ports > 10);
            assert_eq!(r.outcome(), kproxy::exit::Outcome::Clean);
        }
    }
}

/// The rules of `chain` in `table` of an iptables-save text, without counters and `-A CHAIN`.
fn chain_rules(save: &str, table: &str, chain: &str) -> Vec<String> {
    let mut cur = "";
    let prefix = format!("-A {chain} ");
    let mut out = Vec::new();
    for line in save.lines() {
        if let Some(t) = line.strip_prefix('*') {
            cur = t;
            continue;
        }
        let line = if line.starts_with('[') {
            line.split_once("] ").map_or(line, |x| x.1)
        } else {
            line
        };
        if cur == table
            && let Some(rest) = line.strip_prefix(&prefix)
        {
            out.push(rest.to_string());
        }
    }
    out
}

/// The 1-based position of the first rule of `chain` containing every needle.
fn position(save: &str, table: &str, chain: &str, needles: &[&str]) -> usize {
    chain_rules(save, table, chain)
        .iter()
        .position(|r| needles.iter().all(|n| r.contains(n)))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("no rule with {needles:?} in {table} {chain}"))
}

fn jump_target(rule: &str) -> String {
    rule.rsplit("-j ")
        .next()
        .unwrap_or("")
        .split_whitespace()
        .next()
        .unwrap_or("")
        .to_string()
}

struct Names {
    web_svc: String,
    web_sep: String,
    web_cip_pos: usize,
    cart_svc: String,
}

fn names(save: &str) -> Names {
    let svc = |comment: &str| {
        let i = position(save, "nat", "KUBE-SERVICES", &[comment]);
        (
            jump_target(&chain_rules(save, "nat", "KUBE-SERVICES")[i - 1]),
            i,
        )
    };
    let (web_svc, web_cip_pos) = svc("\"shop/web:http cluster IP\"");
    let (cart_svc, _) = svc("\"shop/cart:http cluster IP\"");
    let first_ep = chain_rules(save, "nat", &web_svc)
        .into_iter()
        .find(|r| r.contains("KUBE-SEP-"))
        .expect("web endpoint rule");
    Names {
        web_sep: jump_target(&first_ep),
        web_svc,
        web_cip_pos,
        cart_svc,
    }
}

type Mutation = (
    &'static str,
    &'static str,
    Option<&'static str>,
    fn(&Names, &str) -> Vec<Vec<String>>,
);

fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn mutations() -> Vec<Mutation> {
    vec![
        (
            "flush an endpoint chain",
            "KP206",
            Some("shop/web:http"),
            |n, _| vec![words(&format!("-t nat -F {}", n.web_sep))],
        ),
        (
            "delete a service's KUBE-SERVICES rule",
            "KP101",
            Some("shop/web:http"),
            |n, _| vec![words(&format!("-t nat -D KUBE-SERVICES {}", n.web_cip_pos))],
        ),
        (
            "add a stale endpoint",
            "KP202",
            Some("shop/web:http"),
            |n, _| {
                let sep = "KUBE-SEP-AAAAAAAAAAAAAAAA";
                vec![
                    words(&format!("-t nat -N {sep}")),
                    words(&format!(
                        "-t nat -A {sep} -p tcp -m tcp -j DNAT --to-destination 10.244.3.99:8080"
                    )),
                    words(&format!(
                        "-t nat -I {} 2 -m statistic --mode random --probability 0.25 -j {sep}",
                        n.web_svc
                    )),
                ]
            },
        ),
        (
            "change a probability",
            "KP203",
            Some("shop/web:http"),
            |n, save| {
                let pos = position(save, "nat", &n.web_svc, &["--probability"]);
                let target = jump_target(&chain_rules(save, "nat", &n.web_svc)[pos - 1]);
                vec![words(&format!(
                    "-t nat -R {} {pos} -m statistic --mode random --probability 0.9 -j {target}",
                    n.web_svc
                ))]
            },
        ),
        (
            "remove a masquerade rule",
            "KP301",
            Some("shop/web:http"),
            |n, save| {
                let pos = position(save, "nat", &n.web_svc, &["KUBE-MARK-MASQ"]);
                vec![words(&format!("-t nat -D {} {pos}", n.web_svc))]
            },
        ),
        ("remove the PREROUTING jump", "KP005", None, |_, save| {
            let pos = position(save, "nat", "PREROUTING", &["-j KUBE-SERVICES"]);
            vec![words(&format!("-t nat -D PREROUTING {pos}"))]
        }),
        (
            "add a REJECT for a service that has endpoints",
            "KP108",
            Some("shop/web:http"),
            |_, _| {
                let mut w = words(
                    "-t filter -I KUBE-SERVICES -d 10.96.100.10/32 -p tcp -m comment --comment",
                );
                w.push("shop/web:http has no endpoints".into());
                w.extend(words("-m tcp --dport 80 -j REJECT"));
                vec![w]
            },
        ),
        (
            "remove session-affinity rules",
            "KP303",
            Some("shop/cart:http"),
            |n, save| {
                let rules = chain_rules(save, "nat", &n.cart_svc);
                let mut v: Vec<Vec<String>> = rules
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| r.contains("--rcheck"))
                    .map(|(i, _)| words(&format!("-t nat -D {} {}", n.cart_svc, i + 1)))
                    .collect();
                v.reverse();
                v
            },
        ),
        (
            "insert a host REJECT before the KUBE-SERVICES jump",
            "KP008",
            None,
            |_, _| {
                vec![words(
                    "-t filter -I FORWARD 1 -j REJECT --reject-with icmp-host-prohibited",
                )]
            },
        ),
    ]
}

#[test]
fn each_mutation_is_reported_alone() {
    if !tools_ok() {
        return;
    }
    let c = cluster();
    for backend in Backend::ALL {
        let clean = node(&c, backend).save(backend, false).expect("save");
        let n = names(&clean);
        for (what, id, service, make) in mutations() {
            let ns = node(&c, backend);
            for cmd in make(&n, &clean) {
                let mut args: Vec<&str> = vec![backend.iptables(Family::V4), "-w"];
                args.extend(cmd.iter().map(String::as_str));
                ns.run(&args)
                    .unwrap_or_else(|e| panic!("{what}: {args:?}: {e}"));
            }
            let v4 = ns.save(backend, true).expect("save");
            let v6 = ns.save6(backend, false).expect("save6");
            let r = verify(&c, &v4, Some(&v6), None);
            assert!(!r.findings.is_empty(), "{backend} {what}: nothing reported");
            for f in &r.findings {
                assert!(
                    f.id == id && f.service.as_deref() == service,
                    "{backend} {what}: expected only {id} {service:?}, got:\n{}",
                    show(&r)
                );
            }
            assert_eq!(
                r.outcome(),
                kproxy::exit::Outcome::Drift,
                "{backend} {what}"
            );
        }
    }
}

#[test]
fn rules_in_both_backends_are_reported() {
    if !tools_ok() {
        return;
    }
    let c = cluster();
    for (main, other) in [
        (Backend::Nft, Backend::Legacy),
        (Backend::Legacy, Backend::Nft),
    ] {
        let ns = node(&c, main);
        ns.restore(other, &rendered(&c, IpFamily::V4), false)
            .expect("restore other backend");
        let v4 = ns.save(main, false).expect("save");
        let v6 = ns.save6(main, false).expect("save6");
        let leg = ns.save(other, false).expect("save other");
        let r = verify(&c, &v4, Some(&v6), Some(&leg));
        let ids: Vec<&str> = r.findings.iter().map(|f| f.id).collect();
        assert_eq!(ids, ["KP002"], "{main}+{other}:\n{}", show(&r));
    }
}

#[test]
fn api_side_drift_is_reported() {
    if !tools_ok() {
        return;
    }
    let c = cluster();
    let ns = node(&c, Backend::Nft);
    let v4 = ns.save(Backend::Nft, false).expect("save");
    let v6 = ns.save6(Backend::Nft, false).expect("save6");
    let text = std::fs::read_to_string(repo("testdata/cluster/state.json")).expect("state");
    let mut doc: serde_json::Value = serde_json::from_str(&text).expect("json");

    // A new ready endpoint of shop/web.
    let mut grown = doc.clone();
    if let Some(items) = grown["items"].as_array_mut() {
        for it in items.iter_mut() {
            if it["kind"] == "EndpointSlice" && it["metadata"]["name"] == "web-b8d4f" {
                let mut ep = it["endpoints"][0].clone();
                ep["addresses"] = serde_json::json!(["10.244.1.77"]);
                if let Some(eps) = it["endpoints"].as_array_mut() {
                    eps.push(ep);
                }
            }
        }
    }
    let r = verify(&cluster_from(&grown.to_string()), &v4, Some(&v6), None);
    assert!(!r.findings.is_empty(), "new endpoint not reported");
    for f in &r.findings {
        assert!(
            f.id == "KP201"
                && f.service
                    .as_deref()
                    .is_some_and(|s| s.starts_with("shop/web:")),
            "new endpoint:\n{}",
            show(&r)
        );
    }

    // shop/web deleted from the API.
    if let Some(items) = doc["items"].as_array_mut() {
        items.retain(|it| {
            !(it["kind"] == "Service"
                && it["metadata"]["name"] == "web"
                && it["metadata"]["namespace"] == "shop")
        });
    }
    let r = verify(&cluster_from(&doc.to_string()), &v4, Some(&v6), None);
    let services: Vec<&str> = r
        .findings
        .iter()
        .filter_map(|f| f.service.as_deref())
        .collect();
    assert!(
        services.contains(&"shop/web:http") && services.contains(&"shop/web:https"),
        "{}",
        show(&r)
    );
    for f in &r.findings {
        assert_eq!(f.id, "KP401", "deleted service:\n{}", show(&r));
    }
}

/// Every golden render case: render → restore → save → verify is clean (zero false positives),
/// through the binary (exit status 0, JSON schema).
#[test]
fn golden_render_cases_verify_clean() {
    if !tools_ok() {
        return;
    }
    let dir = repo("../shared/conformance/iptables/render");
    let tools = repo("../shared/conformance/tools/conformance.py");
    if !dir.is_dir() || !tools.is_file() {
        crate::support::skip("verify", &format!("{} absent; skipping", dir.display()));
        return;
    }
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read_dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    cases.sort();
    let mut checked = 0;
    for case in cases {
        let case_yaml = case.join("case.yaml");
        if !case_yaml.is_file() {
            continue;
        }
        let out = std::process::Command::new("python3")
            .arg(&tools)
            .arg("flags")
            .arg(&case_yaml)
            .output();
        let Ok(out) = out else {
            crate::support::skip("verify", "python3 missing; skipping golden cases");
            return;
        };
        let mut flags: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect();
        // The namespaces have no nfacct counters: render without them (they legitimately vary).
        if let Some(i) = flags.iter().position(|f| f == "--nfacct") {
            flags.drain(i..(i + 2).min(flags.len()));
        }
        flags.extend(["--nfacct".to_string(), "none".to_string()]);
        let v6 = flags
            .windows(2)
            .any(|w| w[0] == "--ip-family" && w[1] == "6");
        let base = |cmd: &str| {
            let mut c = Command::cargo_bin("kubectl-kproxy").expect("binary");
            c.arg(cmd)
                .arg("--state")
                .arg(case.join("state.json"))
                .arg("--config")
                .arg(case.join("config.yaml"))
                .args(&flags);
            c
        };
        let rules = base("render")
            .arg("--with-base-jumps")
            .output()
            .expect("render");
        assert!(
            rules.status.success(),
            "{}: render failed: {}",
            case.display(),
            String::from_utf8_lossy(&rules.stderr)
        );
        let rules = String::from_utf8_lossy(&rules.stdout).to_string();
        let ns = Netns::new("golden").expect("netns");
        let family = if v6 { Family::V6 } else { Family::V4 };
        ns.restore_family(Backend::Nft, family, &rules, false)
            .unwrap_or_else(|e| panic!("{}: restore: {e}", case.display()));
        let save = ns.save_family(Backend::Nft, family, true).expect("save");
        let tmp = tempfile::NamedTempFile::new().expect("tmp");
        std::fs::write(tmp.path(), &save).expect("write");
        let dump_flag = if v6 {
            "--ip6tables-save"
        } else {
            "--iptables-save"
        };
        let out = base("verify")
            .arg(dump_flag)
            .arg(tmp.path())
            .args(["-o", "json"])
            .output()
            .expect("verify");
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let findings: Vec<&serde_json::Value> = json["findings"]
            .as_array()
            .map(|a| a.iter().filter(|f| f["severity"] != "info").collect())
            .unwrap_or_default();
        assert!(
            out.status.code() == Some(0) && findings.is_empty(),
            "{}: exit {:?}, findings {}\n{}",
            case.display(),
            out.status.code(),
            serde_json::to_string_pretty(&json["findings"]).unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        );
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} golden cases checked");
}

#[test]
fn cli_exit_status_and_table_summary() {
    if !tools_ok() {
        return;
    }
    let c = cluster();
    let ns = node(&c, Backend::Nft);
    let dir = tempfile::tempdir().expect("tmp");
    let v4 = dir.path().join("v4.save");
    let v6 = dir.path().join("v6.save");
    std::fs::write(&v4, ns.save(Backend::Nft, false).expect("save")).expect("write");
    std::fs::write(&v6, ns.save6(Backend::Nft, false).expect("save")).expect("write");
    let run = |v4: &PathBuf| {
        Command::cargo_bin("kubectl-kproxy")
            .expect("binary")
            .args(["verify", "node-1", "--nfacct", "none", "--state"])
            .arg(repo("testdata/cluster/state.json"))
            .arg("--config")
            .arg(repo("testdata/cluster/config.yaml"))
            .arg("--iptables-save")
            .arg(v4)
            .arg("--ip6tables-save")
            .arg(&v6)
            .output()
            .expect("run")
    };
    let out = run(&v4);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // The release is inferred from the rules (no --kube-proxy-version): one info finding.
    assert!(
        text.trim_end().ends_with("0 errors, 0 warnings, 1 info") && text.contains("KP907"),
        "{text}"
    );
    // Drift: remove the PREROUTING jump.
    ns.run(&["iptables-nft", "-w", "-t", "nat", "-D", "PREROUTING", "1"])
        .expect("delete");
    std::fs::write(&v4, ns.save(Backend::Nft, false).expect("save")).expect("write");
    let out = run(&v4);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("ERRORS (1)") && text.contains("KP005"),
        "{text}"
    );
    assert!(
        text.trim_end().ends_with("1 error, 0 warnings, 1 info"),
        "{text}"
    );
    // Could not run: unreadable input.
    std::fs::write(&v4, "*nat\n-A KUBE-SERVICES -j\n").expect("write");
    let out = run(&v4);
    assert_eq!(out.status.code(), Some(2));
}

/// A rule no kube-proxy release writes on a service port's path (a newer kube-proxy's layout,
/// say): verify names it (KP406), concludes nothing of that port — no "endpoint not reached",
/// no "stale" endpoint chain — and exits 2; repair refuses to rewrite it (unless `--force`).
#[test]
fn rules_this_build_does_not_know_are_said_not_judged() {
    let dump = std::fs::read_to_string(repo("testdata/dumps/cluster.legacy-c.save")).expect("dump");
    let jump = "-m comment --comment \"shop/search:http -> 10.244.1.60:9200\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-REMNJM74BPC7T4L2";
    assert!(dump.contains(jump), "the testdata dump changed");
    let unknown = dump
        .replace(
            jump,
            "-m statistic --mode random --probability 0.50000000000 -j KUBE-LB-NEWFORM",
        )
        .replace(
            ":KUBE-SVC-GTJZQLNV22BQ36AO - [0:0]\n",
            ":KUBE-SVC-GTJZQLNV22BQ36AO - [0:0]\n:KUBE-LB-NEWFORM - [0:0]\n",
        );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("unknown.save");
    std::fs::write(&file, unknown).expect("write");
    let run = |args: &[&str]| {
        Command::cargo_bin("kubectl-kproxy")
            .expect("binary")
            .args(args)
            .arg("--iptables-save")
            .arg(&file)
            .arg("--state")
            .arg(repo("testdata/cluster/state.json"))
            .arg("--config")
            .arg(repo("testdata/cluster/config.yaml"))
            .args(["--node", "node-1"])
            .env("NO_COLOR", "1")
            .output()
            .expect("run")
    };
    let out = run(&["verify", "-o", "json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["summary"]["unchecked"], 1, "{report:#}");
    let about_search: Vec<&str> = report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["service"] == "shop/search:http")
        .filter_map(|f| f["id"].as_str())
        .collect();
    assert_eq!(about_search, ["KP406"], "{report:#}");

    let out = run(&["repair"]);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("refusal: the node's kube-proxy chains hold rules this build does not know (rule `-m statistic --mode random --probability 0.50000000000 -j KUBE-LB-NEWFORM` in chain KUBE-SVC-GTJZQLNV22BQ36AO"),
        "{text}"
    );
}
