//! kube-proxy 1.36's nftables layout ("G4": DNAT straight through a `numgen` map, the
//! `hairpin-connections` set, inline masquerade marks; endpoint chains only for ClientIP
//! affinity), and layouts this build does not know, through the built binary:
//!
//! - kube-proxy 1.36's own `TestOverallNFTablesRules` table
//!   (`../shared/conformance/nftables-next/`), as its test dump and — loaded with real `nft` into
//!   a network namespace — as `nft list ruleset` and `nft -j list ruleset` print it: `graph`
//!   gives every service port the endpoints and shares the fixture's API state implies, and
//!   hairpin masquerade exactly for the endpoints on the node;
//! - the kernel model on those listings against real connections through the loaded table
//!   (chi-square), including an endpoint reaching itself through its service, masqueraded by the
//!   `hairpin-connections` lookup only when it lands on itself;
//! - a table with a chain and a statement form invented for the test: `graph` marks the ports
//!   "unknown layout", `trace` says the outcome is unknown (exit 2), `verify` names the objects
//!   (KP711, exit 2) and `repair --apply` refuses to touch them (exit 2, table unchanged) —
//!   never "no endpoints".

use crate::nft_graph_trace::{
    CLIENT_IP, NODE_IP, check_rejected, check_spread, json, kproxy, predict_both, str_of,
};
use crate::nft_parse::loadable;
use crate::support::netns::{Netns, Pod, Topology, ip, require_root_and_tools};
use crate::support::repair::{expect_exit, json_doc, text};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// kube-proxy 1.36's `TestOverallNFTablesRules` expectation and its fixture's API state.
fn golden() -> Option<(String, Value)> {
    let dir = crate::support::shared("nft_layouts", "conformance/nftables-next")?;
    let dump = std::fs::read_to_string(dir.join("TestOverallNFTablesRules-jesseward-5ec89f4.txt"))
        .expect("the 1.36 golden");
    let state = std::fs::read_to_string(dir.join("render/overall-nftables-rules-1.36/state.json"))
        .expect("its state");
    Some((dump, serde_json::from_str(&state).expect("state json")))
}

/// Loads `table` into a fresh namespace and writes its listings into `dir`: `[nft list
/// ruleset, nft -j list ruleset]`.
fn listed(ns: &Netns, table: &str, dir: &Path, name: &str) -> [PathBuf; 2] {
    ns.nft_load(table).expect("nft -f");
    let paths = [
        dir.join(format!("{name}.nft")),
        dir.join(format!("{name}.json")),
    ];
    std::fs::write(&paths[0], ns.nft(&["list", "ruleset"]).expect("nft list")).expect("write");
    std::fs::write(
        &paths[1],
        ns.nft(&["-j", "list", "ruleset"]).expect("nft -j list"),
    )
    .expect("write");
    paths
}

/// What the API state implies per service port (`ns/name:port`): each serving endpoint's
/// `IP:PORT` and whether it runs on the fixture's node (`test-node`).
fn implied(state: &Value) -> BTreeMap<String, BTreeMap<String, bool>> {
    let items = state["items"].as_array().expect("items");
    let mut out: BTreeMap<String, BTreeMap<String, bool>> = BTreeMap::new();
    for svc in items.iter().filter(|i| i["kind"] == "Service") {
        let ns = str_of(&svc["metadata"], "namespace");
        let name = str_of(&svc["metadata"], "name");
        for port in svc["spec"]["ports"].as_array().into_iter().flatten() {
            let pname = port["name"].as_str().unwrap_or("");
            let key = format!("{ns}/{name}:{pname}");
            let mut eps = BTreeMap::new();
            let slices = items.iter().filter(|i| {
                i["kind"] == "EndpointSlice"
                    && i["metadata"]["namespace"] == ns
                    && i["metadata"]["labels"]["kubernetes.io/service-name"] == name
            });
            for slice in slices {
                let Some(p) = slice["ports"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|p| p["name"].as_str().unwrap_or("") == pname)
                else {
                    continue;
                };
                for e in slice["endpoints"].as_array().into_iter().flatten() {
                    if e["conditions"]["ready"] == false {
                        continue;
                    }
                    let local = e["nodeName"] == "test-node";
                    for a in e["addresses"].as_array().into_iter().flatten() {
                        let a = a.as_str().expect("address");
                        eps.insert(format!("{a}:{}", p["port"]), local);
                    }
                }
            }
            out.insert(key, eps);
        }
    }
    out
}

/// `graph -o json` of `listing`: per service port, each endpoint's destination, largest share
/// and hairpin masquerade; and the ports of unknown layout.
type GraphView = BTreeMap<String, BTreeMap<String, (f64, bool)>>;

fn graph_of(listing: &Path) -> (GraphView, BTreeSet<String>) {
    let doc = json(&[
        "graph",
        "--nft-ruleset",
        listing.to_str().expect("path"),
        "-o",
        "json",
    ]);
    let mut ports = GraphView::new();
    let mut unknown = BTreeSet::new();
    for g in doc["graphs"].as_array().expect("graphs") {
        for p in g["service_ports"].as_array().expect("ports") {
            let name = str_of(p, "name").to_string();
            if p["unknown_layout"]
                .as_array()
                .is_some_and(|u| !u.is_empty())
            {
                unknown.insert(name.clone());
            }
            let eps = p["endpoints"]
                .as_array()
                .expect("endpoints")
                .iter()
                .map(|e| {
                    let share = e["shares"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|s| s["share"].as_f64())
                        .fold(0.0, f64::max);
                    (
                        str_of(e, "destination").to_string(),
                        (share, e["hairpin_masquerade"] == true),
                    )
                })
                .collect();
            ports.insert(name, eps);
        }
    }
    (ports, unknown)
}

/// Every port's endpoints are the API's, each with 1/n of new connections, hairpin masquerade
/// exactly for the endpoints on the node.
fn assert_graph_is_the_apis(
    what: &str,
    got: &GraphView,
    want: &BTreeMap<String, BTreeMap<String, bool>>,
) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "{what}: service ports"
    );
    for (port, eps) in want {
        let n = eps.len() as f64;
        let expected: BTreeMap<String, (f64, bool)> = eps
            .iter()
            .map(|(d, local)| (d.clone(), (1.0 / n, *local)))
            .collect();
        let have = &got[port];
        assert_eq!(
            have.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{what}: endpoints of {port}"
        );
        for (d, (share, hairpin)) in &expected {
            let (s, h) = have[d];
            assert!(
                (s - share).abs() < 1e-9,
                "{what}: {port} {d}: share {s}, want {share}"
            );
            assert_eq!(h, *hairpin, "{what}: {port} {d}: hairpin");
        }
    }
}

#[test]
fn g4_graph_of_every_form_is_what_the_api_implies() {
    let Some((dump, state)) = golden() else {
        return;
    };
    let want = implied(&state);
    // The fixture: six services, one without endpoints, two endpoints on another node.
    assert_eq!(want.len(), 6, "{want:?}");
    assert_eq!(want["ns4/svc4:p80"].len(), 2);
    assert!(want["ns6/svc6:p80"].is_empty());
    let tmp = tempfile::tempdir().expect("tempdir");
    let dump_path = tmp.path().join("g4.dump");
    std::fs::write(&dump_path, &dump).expect("write");
    let (graph, unknown) = graph_of(&dump_path);
    assert!(unknown.is_empty(), "{unknown:?}");
    assert_graph_is_the_apis("knftables dump", &graph, &want);
    let table = kproxy(&["graph", "--nft-ruleset", dump_path.to_str().expect("path")]);
    assert!(
        table.contains("10.180.0.4:80 50.0%, 10.180.0.5:80 50.0%"),
        "{table}"
    );
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let ns = Netns::new("g4-graph").expect("netns");
    for listing in listed(&ns, &loadable(&dump), tmp.path(), "g4") {
        let (graph, unknown) = graph_of(&listing);
        assert!(unknown.is_empty(), "{unknown:?}");
        assert_graph_is_the_apis(&listing.display().to_string(), &graph, &want);
    }
}

#[test]
fn g4_kernel_model_agrees_with_real_traffic() {
    let Some((dump, _)) = golden() else {
        return;
    };
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let topo = Topology::builder("g4-traffic")
        .pod(Pod::new("ep1", "10.180.0.1").tcp(80))
        .pod(Pod::new("ep3", "10.180.0.3").tcp(80))
        .pod(Pod::new("ep4", "10.180.0.4").tcp(80))
        .pod(Pod::new("ep5", "10.180.0.5").tcp(80))
        .build()
        .expect("topology");
    let node = topo.node();
    node.sysctl(&[("net.ipv4.icmp_ratelimit", "0")])
        .expect("no ICMP rate limit");
    let tmp = tempfile::tempdir().expect("tempdir");
    let listings = listed(node, &loadable(&dump), tmp.path(), "g4");
    let client = topo.client();
    let packet = |src: &str, dst: &str| format!("{src}->{dst}/tcp");

    // Two endpoints through one DNAT map: half each, masqueraded (off-cluster client, marked
    // in `services`).
    let svc4 = "172.30.0.44:80";
    let p = predict_both(&listings, &packet(CLIENT_IP, svc4), "external");
    let dnats: BTreeSet<Option<&str>> = p.iter().map(|o| o.1.as_deref()).collect();
    assert_eq!(
        dnats,
        BTreeSet::from([Some("10.180.0.4:80"), Some("10.180.0.5:80")]),
        "{p:?}"
    );
    assert!(
        p.iter()
            .all(|o| (o.0 - 0.5).abs() < 1e-9 && o.3.as_deref() == Some(NODE_IP)),
        "{p:?}"
    );
    check_spread("client -> svc4", &topo, client, Some(CLIENT_IP), svc4, &p);
    // One endpoint through a one-entry map, and the affinity service's endpoint chain.
    for (what, dst, pod) in [
        ("client -> svc1", "172.30.0.41:80", "10.180.0.1:80"),
        ("client -> svc5", "172.30.0.45:80", "10.180.0.3:80"),
    ] {
        let p = predict_both(&listings, &packet(CLIENT_IP, dst), "external");
        assert_eq!(p.len(), 1, "{what}: {p:?}");
        assert_eq!(p[0].1.as_deref(), Some(pod), "{what}: {p:?}");
        check_spread(what, &topo, client, Some(CLIENT_IP), dst, &p);
    }
    // Hairpin: ep5 reaching svc4 lands on itself half the time, and only then is masqueraded
    // (its connection is in `hairpin-connections`); to ep4 it keeps its source (in the cluster
    // CIDR, so `services` does not mark it).
    let ep5 = topo.pod("ep5").expect("ep5");
    let p = predict_both(&listings, &packet("10.180.0.5", svc4), "pod");
    let masq: BTreeMap<Option<&str>, Option<&str>> =
        p.iter().map(|o| (o.1.as_deref(), o.3.as_deref())).collect();
    assert_eq!(
        masq,
        BTreeMap::from([
            (Some("10.180.0.4:80"), None),
            (Some("10.180.0.5:80"), Some(NODE_IP))
        ]),
        "{p:?}"
    );
    let tally = check_spread(
        "ep5 -> svc4 (hairpin)",
        &topo,
        ep5,
        Some("10.180.0.5"),
        svc4,
        &p,
    );
    assert_eq!(
        tally.peers.get(&ip(NODE_IP)).copied().unwrap_or(0),
        tally.count("ep5"),
        "only the connections ep5 got back are masqueraded: {tally:?}"
    );
    assert_eq!(
        tally.peers.get(&ip("10.180.0.5")).copied().unwrap_or(0),
        tally.count("ep4"),
        "{tally:?}"
    );
    // No endpoints: rejected.
    let dst = "172.30.0.46:80";
    let p = predict_both(&listings, &packet(CLIENT_IP, dst), "external");
    check_rejected("client -> svc6", client, dst, &p);
}

/// A chain and a statement form invented for the test, in kube-proxy's table.
const INVENTED_CHAIN: &str = "endpoint-pool-v9";
const INVENTED_STATEMENT: &str = "meta l4proto tcp dnat ip addr . port to jhash ip saddr mod 2 map { 0 : 10.180.0.4 . 80 , 1 : 10.180.0.5 . 80 }";

/// The 1.36 table with svc4's DNAT in the invented statement form and svc1 sent through the
/// invented chain.
fn invented(dump: &str) -> String {
    let svc4 = "add rule ip kube-proxy service-LAUZTJTB-ns4/svc4/tcp/p80 ";
    let svc1 = "add rule ip kube-proxy service-ULMVA6XW-ns1/svc1/tcp/p80 ";
    let mut out = String::new();
    for l in dump.lines() {
        if l.starts_with(svc4) {
            out += &format!("{svc4}{INVENTED_STATEMENT}\n");
        } else if l.starts_with(svc1) {
            out += &format!("{svc1}goto {INVENTED_CHAIN}\n");
        } else {
            out += &format!("{l}\n");
        }
    }
    out += &format!(
        "add chain ip kube-proxy {INVENTED_CHAIN}\nadd rule ip kube-proxy {INVENTED_CHAIN} meta l4proto tcp dnat to 10.180.0.1:80\n"
    );
    out
}

#[test]
fn unknown_layouts_are_said_by_graph_and_trace() {
    let Some((dump, _)) = golden() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let table = invented(&dump);
    let commands = tmp.path().join("invented.dump");
    std::fs::write(&commands, &table).expect("write");
    let mut listings = vec![commands];
    let ns;
    if require_root_and_tools(&["nft"]) {
        ns = Netns::new("g4-unknown").expect("netns");
        listings.extend(listed(&ns, &loadable(&table), tmp.path(), "invented"));
    }
    for listing in &listings {
        let path = listing.to_str().expect("path");
        let (graph, unknown) = graph_of(listing);
        assert_eq!(
            unknown,
            BTreeSet::from(["ns1/svc1:p80".to_string(), "ns4/svc4:p80".to_string()]),
            "{path}"
        );
        // The others are read as ever.
        assert_eq!(graph["ns3/svc3:p80"].len(), 1, "{path}");
        let table = kproxy(&["graph", "--nft-ruleset", path]);
        let row = |port: &str| {
            table
                .lines()
                .find(|l| l.starts_with(port))
                .unwrap_or_else(|| panic!("{port} in\n{table}"))
                .to_string()
        };
        for port in ["ns1/svc1:p80", "ns4/svc4:p80"] {
            assert!(row(port).contains("<unknown layout>"), "{path}: {table}");
            assert!(!row(port).contains("<none>"), "{path}: {table}");
        }
        assert!(
            table.contains(INVENTED_CHAIN) && table.contains("may be newer than this build"),
            "{table}"
        );
        // trace --packet: unknown past the statement, never "no DNAT"; exit 2.
        for dst in ["172.30.0.44:80", "172.30.0.41:80"] {
            let packet = format!("{CLIENT_IP}->{dst}/tcp");
            let o = crate::support::kproxy()
                .args(["trace", "--nft-ruleset", path, "--packet", &packet])
                .args(["--local-ip", NODE_IP])
                .output()
                .expect("run");
            expect_exit(&o, 2, "trace --packet on an unknown layout");
            let out = String::from_utf8_lossy(&o.stdout);
            assert!(out.contains("UNKNOWN past kube-proxy/"), "{out}");
            assert!(!out.contains("no DNAT"), "{out}");
            let o = crate::support::kproxy()
                .args([
                    "trace",
                    "--nft-ruleset",
                    path,
                    "--packet",
                    &packet,
                    "-o",
                    "json",
                ])
                .output()
                .expect("run");
            let doc = json_doc(&o);
            assert!(
                doc["outcomes"]
                    .as_array()
                    .expect("outcomes")
                    .iter()
                    .all(|o| o["verdict"] == "UNKNOWN"),
                "{doc}"
            );
        }
        // The path view says so for the port, and exit 2.
        let o = crate::support::kproxy()
            .args(["trace", "svc/svc4", "-n", "ns4", "--nft-ruleset", path])
            .env("NO_COLOR", "1")
            .output()
            .expect("run");
        expect_exit(&o, 2, "trace svc on an unknown layout");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("jhash") && out.contains("endpoints unknown"),
            "{}",
            text(&o)
        );
    }
}

#[test]
fn unknown_layouts_are_not_verified_nor_repaired() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = crate::nftables_verify::nft_config(tmp.path());
    let render = crate::nftables_verify::render(&config, "4");
    let web = "add rule ip kube-proxy service-KHN6ECMT-shop/web/tcp/http numgen ";
    let cart = "add rule ip kube-proxy service-242WI43H-shop/cart/tcp/http numgen ";
    assert!(render.contains(web) && render.contains(cart), "{render}");
    let mut edited = String::new();
    for l in render.lines() {
        if l.starts_with(web) {
            edited += "add rule ip kube-proxy service-KHN6ECMT-shop/web/tcp/http meta l4proto tcp dnat ip addr . port to jhash ip saddr mod 3 map { 0 : 10.244.1.10 . 8080 , 1 : 10.244.1.11 . 8080 , 2 : 10.244.2.10 . 8080 }\n";
        } else if l.starts_with(cart) {
            edited += &format!(
                "add rule ip kube-proxy service-242WI43H-shop/cart/tcp/http goto {INVENTED_CHAIN}\n"
            );
        } else {
            edited += &format!("{l}\n");
        }
    }
    edited += &format!(
        "add chain ip kube-proxy {INVENTED_CHAIN}\nadd rule ip kube-proxy {INVENTED_CHAIN} meta l4proto tcp dnat to 10.244.1.50:8080\n"
    );
    let listing = tmp.path().join("invented.nft");
    std::fs::write(&listing, loadable(&edited)).expect("write");
    let verify = |listing: &Path| -> (Value, Option<i32>) {
        let o = crate::nftables_verify::kproxy(
            &config,
            &[
                "verify",
                "--nft-ruleset",
                listing.to_str().expect("path"),
                "-o",
                "json",
            ],
        )
        .output()
        .expect("run");
        (json_doc(&o), o.status.code())
    };
    let check = |report: &Value, code: Option<i32>, what: &str| {
        assert_eq!(code, Some(2), "{what}: {report}");
        let findings: Vec<(&str, Option<&str>)> = report["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .filter(|f| f["severity"] != "info")
            .map(|f| (str_of(f, "id"), f["service"].as_str()))
            .collect();
        assert_eq!(
            findings,
            [
                ("KP711", Some("shop/cart:http")),
                ("KP711", Some("shop/web:http"))
            ],
            "{what}: {report}"
        );
        assert_eq!(report["summary"]["unchecked"], 2, "{what}: {report}");
        let text = report.to_string();
        assert!(
            text.contains(INVENTED_CHAIN) && text.contains("jhash"),
            "{what}"
        );
    };
    let (report, code) = verify(&listing);
    check(&report, code, "commands");
    // Repair plans it (dry run) but refuses, naming the objects.
    let o = crate::nftables_verify::kproxy(
        &config,
        &[
            "repair",
            "--local",
            "--nft-ruleset",
            listing.to_str().expect("path"),
            "-o",
            "json",
        ],
    )
    .output()
    .expect("run");
    let plan = json_doc(&o);
    let refusals = plan["refusals"].to_string();
    assert!(
        refusals.contains(INVENTED_CHAIN)
            && refusals.contains("jhash")
            && refusals.contains("newer than this build"),
        "{}",
        text(&o)
    );
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let ns = Netns::new("g4-refuse").expect("netns");
    let listings = listed(&ns, &loadable(&edited), tmp.path(), "loaded");
    for l in &listings {
        let (report, code) = verify(l);
        check(&report, code, &l.display().to_string());
    }
    let before = ns.nft(&["list", "ruleset"]).expect("list");
    let backups = tempfile::tempdir().expect("tempdir");
    let o = crate::nftables_verify::kproxy(
        &config,
        &[
            "repair",
            "--local",
            "--netns",
            ns.name(),
            "--apply",
            "-o",
            "json",
        ],
    )
    .arg("--backup-dir")
    .arg(backups.path())
    .output()
    .expect("run");
    expect_exit(&o, 2, "repair --apply refuses");
    let doc = json_doc(&o);
    assert_eq!(doc["outcome"], "refused", "{}", text(&o));
    assert!(
        doc["refusals"].to_string().contains(INVENTED_CHAIN),
        "{doc}"
    );
    assert_eq!(
        ns.nft(&["list", "ruleset"]).expect("list"),
        before,
        "a refused repair changes nothing"
    );
}
