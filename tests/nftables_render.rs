//! `render --mode nftables` against kube-proxy's golden nftables data
//! (`../shared/conformance/nftables/`): the render cases and the rulesets behind the packet-flow
//! cases, compared as kube-proxy's tests compare dumps (`sortNFTablesTransaction`,
//! [`kproxy::proxier::nftables::canonical`]) after dropping the flushed service chains that
//! kube-proxy keeps for a while after a service goes away (a stateless render cannot know them),
//! exactly like `conformance.py nft-render`. Then the real kernel: renders of the repo's states
//! load with `nft -f` (IPv4 and IPv6) into a fresh network namespace and read back object for
//! object, and TCP through the loaded table (`ip` and `ip6`) reaches the echo servers of the pod
//! namespaces, masqueraded where kube-proxy masquerades.

use crate::render::{get, harness_args, text_of, yaml};
use crate::support::netns::{Pod, Probe, Topology, addr, ip, require_root_and_tools};
use kproxy::proxier::nftables::{self, canonical::sort_like_kube_proxy_tests};
use kproxy::state::{config, load, node};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;

fn shared() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/nftables");
    if p.is_dir() {
        Some(p)
    } else {
        crate::support::skip(
            "nftables_render",
            &format!("{} absent; nftables conformance skipped", p.display()),
        );
        None
    }
}

/// Renders the case in `dir` (state.json, config.yaml) with the node facts of `case`.
fn render_dir(dir: &Path, case: &Value) -> String {
    let state = load::from_files(&[dir.join("state.json")]).unwrap_or_else(|e| panic!("{e}"));
    let cfg_path = dir.join("config.yaml");
    let text = std::fs::read_to_string(&cfg_path).unwrap_or_else(|e| panic!("{e}"));
    let (cfg, warnings) =
        config::parse(&text, &cfg_path.display().to_string()).unwrap_or_else(|e| panic!("{e}"));
    assert!(warnings.is_empty(), "{}: {warnings:?}", dir.display());
    let cfg = cfg.for_nftables();
    let (facts, _) =
        node::build(&harness_args(case), &state, &cfg).unwrap_or_else(|e| panic!("{e}"));
    nftables::render_text(&state, &cfg, &facts).0
}

/// The lines to compare: whitespace collapsed, comments and blank lines gone, flushed service
/// chains dropped (a `/` in the name, no rules, nothing jumps or goes to them), then
/// kube-proxy's test order.
fn comparable(text: &str) -> String {
    let lines: Vec<String> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let word = |l: &str, i: usize| l.split(' ').nth(i).unwrap_or("").to_string();
    let ruled: BTreeSet<String> = lines
        .iter()
        .filter(|l| l.starts_with("add rule "))
        .map(|l| word(l, 4))
        .collect();
    let mut referenced: BTreeSet<String> = BTreeSet::new();
    for l in lines.iter().filter(|l| !l.starts_with("add chain ")) {
        let words: Vec<&str> = l.split(' ').collect();
        for w in words.windows(2) {
            if w[0] == "jump" || w[0] == "goto" {
                referenced.insert(w[1].trim_end_matches([',', ';', '}']).to_string());
            }
        }
    }
    let stale = |l: &str| {
        let name = word(l, 4);
        l.starts_with("add chain ")
            && name.contains('/')
            && !ruled.contains(&name)
            && !referenced.contains(&name)
    };
    let kept: Vec<&str> = lines
        .iter()
        .filter(|l| !stale(l))
        .map(String::as_str)
        .collect();
    sort_like_kube_proxy_tests(&kept.join("\n"))
}

fn first_diff(expected: &str, got: &str) -> String {
    let e: BTreeSet<&str> = expected.lines().collect();
    let g: BTreeSet<&str> = got.lines().collect();
    let missing: Vec<&&str> = e.difference(&g).take(3).collect();
    let extra: Vec<&&str> = g.difference(&e).take(3).collect();
    if missing.is_empty() && extra.is_empty() {
        return "same lines, different rule order within a chain".into();
    }
    format!("missing {missing:?}, extra {extra:?}")
}

/// `out` against the `expected.nft` of `dir`, as kube-proxy's tests compare them.
fn same_as_expected(dir: &Path, out: &str) -> Result<(), String> {
    let expected = std::fs::read_to_string(dir.join("expected.nft"))
        .map_err(|e| format!("expected.nft: {e}"))?;
    let (e, g) = (comparable(&expected), comparable(out));
    if e == g {
        Ok(())
    } else {
        Err(first_diff(&e, &g))
    }
}

fn check_render_case(dir: &Path) -> Result<(), String> {
    let case = yaml(&dir.join("case.yaml"));
    let out = render_dir(dir, &case);
    match text_of(get(&case, &["compare", "mode"])).as_deref() {
        Some("full-dump") => same_as_expected(dir, &out),
        Some("assertions") => {
            let text = std::fs::read_to_string(dir.join("expected.json"))
                .map_err(|e| format!("expected.json: {e}"))?;
            let e: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            let map = e["map"].as_str().unwrap_or_default();
            let key: Vec<&str> = e["key"]
                .as_array()
                .map(|k| k.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let want = e["present"].as_bool().unwrap_or(true);
            let prefix = format!("{map} {{ {} :", key.join(" . "));
            let present = out.lines().any(|l| {
                l.strip_prefix("add element ")
                    .and_then(|r| r.splitn(3, ' ').nth(2))
                    .is_some_and(|r| r.starts_with(&prefix))
            });
            if present == want {
                Ok(())
            } else {
                Err(format!("{map} {key:?} present={present}, want {want}"))
            }
        }
        other => Err(format!("unknown compare mode {other:?}")),
    }
}

fn report(what: &str, total: usize, misses: &[String]) {
    for m in misses {
        println!("  MISS {m}");
    }
    println!("{what}: {}/{total} equal", total - misses.len());
    assert!(total > 0, "{what}: no cases found");
    assert!(
        misses.is_empty(),
        "{what}: {} of {total} differ",
        misses.len()
    );
}

/// Checks every case folder (one with a `case.yaml`) of `root` with `check`.
fn check_cases(what: &str, root: &Path, check: impl Fn(&Path) -> Result<(), String>) {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("case.yaml").is_file())
        .collect();
    dirs.sort();
    let misses: Vec<String> = dirs
        .iter()
        .filter_map(|d| check(d).err().map(|why| format!("{}: {why}", d.display())))
        .collect();
    report(what, dirs.len(), &misses);
}

#[test]
fn nft_render_conformance_cases() {
    let Some(base) = shared() else { return };
    check_cases("nft-render", &base.join("render"), check_render_case);
}

/// kube-proxy 1.36's own `TestOverallNFTablesRules` (`../shared/conformance/nftables-next`).
#[test]
fn nft_render_conformance_cases_of_1_36() {
    let Some(base) = shared() else { return };
    check_cases(
        "nft-render 1.36",
        &base.join("../nftables-next/render"),
        check_render_case,
    );
}

/// The goldens of `testdata/kube-proxy-goldens/nftables-1.36`: kube-proxy 1.36's
/// `TestSyncProxyRulesRepeated` and `TestSyncProxyRulesStartup` steps, rendered from the inputs
/// of the same steps in `../shared` with every endpoint on the test node (as the 1.36 test
/// places them), equal under kube-proxy's test comparison.
#[test]
fn kube_proxy_136_goldens_render_byte_for_byte() {
    let Some(base) = shared() else { return };
    let root =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/kube-proxy-goldens/nftables-1.36");
    check_cases("kube-proxy 1.36 goldens", &root, |d| {
        check_golden_136(d, &base)
    });
}

/// One golden of `testdata/kube-proxy-goldens/nftables-1.36` (see its `case.yaml`).
fn check_golden_136(dir: &Path, shared: &Path) -> Result<(), String> {
    let golden = yaml(&dir.join("case.yaml"));
    let from = text_of(get(&golden, &["inputs", "from"])).ok_or("no inputs.from")?;
    let inputs = shared.join(
        from.strip_prefix("../shared/conformance/nftables/")
            .ok_or("inputs.from outside ../shared/conformance/nftables")?,
    );
    let node = text_of(get(&golden, &["inputs", "endpoints_node"])).ok_or("no endpoints_node")?;
    let mut state: Value = serde_json::from_str(
        &std::fs::read_to_string(inputs.join("state.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let items = state["items"]
        .as_array_mut()
        .ok_or("state.json has no items")?;
    for slice in items.iter_mut().filter(|i| i["kind"] == "EndpointSlice") {
        for ep in slice["endpoints"].as_array_mut().into_iter().flatten() {
            ep["nodeName"] = Value::String(node.clone());
        }
    }
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::write(work.path().join("state.json"), state.to_string()).map_err(|e| e.to_string())?;
    std::fs::copy(inputs.join("config.yaml"), work.path().join("config.yaml"))
        .map_err(|e| e.to_string())?;
    let mut case = yaml(&inputs.join("case.yaml"));
    case["kube_proxy_version"] = get(&golden, &["kube_proxy_version"])
        .cloned()
        .ok_or("no kube_proxy_version")?;
    same_as_expected(dir, &render_dir(work.path(), &case))
}

/// The rulesets the packet-flow cases trace (IPv6 tables, Local policies, masqueradeAll, no
/// detector, several nodePortAddresses, terminating endpoints …) rendered from their inputs.
#[test]
fn nft_render_matches_packetflow_rulesets() {
    let Some(base) = shared() else { return };
    let root = base.join("packetflow");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let mut total = 0;
    let mut misses = Vec::new();
    for f in &files {
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or_default();
        let inputs = root.join("inputs").join(stem);
        let pf: Value = serde_json::from_str(
            &std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display())),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert!(
            inputs.join("case.yaml").is_file(),
            "{}: no inputs/{stem}",
            f.display()
        );
        total += 1;
        let case = yaml(&inputs.join("case.yaml"));
        let (e, g) = (
            comparable(pf["ruleset"].as_str().unwrap_or_default()),
            comparable(&render_dir(&inputs, &case)),
        );
        if e != g {
            misses.push(format!("{stem}: {}", first_diff(&e, &g)));
        }
    }
    report("nft packet-flow rulesets", total, &misses);
}

/// The comparison itself: a rendered case stops comparing equal when a rule is dropped, when
/// two rules of a chain swap, or when an element changes.
#[test]
fn nft_comparison_sees_differences() {
    let Some(base) = shared() else { return };
    let dir = base.join("render/overall-nftables-rules");
    let case = yaml(&dir.join("case.yaml"));
    let out = render_dir(&dir, &case);
    let expected = comparable(&std::fs::read_to_string(dir.join("expected.nft")).unwrap());
    assert_eq!(comparable(&out), expected);
    let lines: Vec<&str> = out.lines().collect();
    let masq = lines
        .iter()
        .position(|l| l.contains("masquerading mark set mark xor"))
        .unwrap_or_else(|| panic!("no masquerading rule in\n{out}"));
    let mut swapped = lines.clone();
    swapped.swap(masq, masq + 1);
    let mut dropped = lines.clone();
    dropped.remove(masq);
    let changed = out.replace("tcp . 3001", "tcp . 3009");
    for variant in [swapped.join("\n"), dropped.join("\n"), changed] {
        assert_ne!(comparable(&variant), expected);
    }
}

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Runs the built binary; its stdout, or a panic with stderr.
fn kproxy(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args(args)
        .output()
        .expect("run kubectl-kproxy");
    assert!(
        out.status.success(),
        "kubectl-kproxy {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

/// `render --mode nftables` of `testdata/<dir>` (a `mode: iptables` configuration: the flag
/// reads it as kube-proxy would in nftables mode).
fn render_repo_state(dir: &str, extra: &[&str]) -> String {
    let state = repo(&format!("testdata/{dir}/state.json"));
    let cfg = repo(&format!("testdata/{dir}/config.yaml"));
    let mut args = vec![
        "render",
        "--mode",
        "nftables",
        "--state",
        state.to_str().unwrap_or_default(),
        "--config",
        cfg.to_str().unwrap_or_default(),
    ];
    args.extend_from_slice(extra);
    kproxy(&args)
}

#[test]
fn nft_render_json_form_and_families() {
    let v6 = render_repo_state("cluster", &["--ip-family", "6"]);
    assert!(v6.starts_with("add table ip6 kube-proxy { comment \"rules for kube-proxy\" ; }\n"));
    assert!(
        v6.lines()
            .all(|l| l.starts_with("add ") && l.contains(" ip6 kube-proxy")),
        "{v6}"
    );
    assert!(v6.contains("dnat to [fd00:10:244:1::60]:9200"), "{v6}");
    let text = render_repo_state("cluster", &[]);
    let json: Value = serde_json::from_str(&render_repo_state("cluster", &["-o", "json"]))
        .expect("render -o json");
    assert_eq!(json["family"], "IPv4");
    assert_eq!(json["table"]["family"], "ip");
    let objects = json["objects"].as_array().expect("objects");
    assert_eq!(objects.len(), text.lines().count());
    assert_eq!(objects[0]["add"], "table");
    let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["add"].as_str()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from(["chain", "element", "map", "rule", "set", "table"])
    );
    let hook = objects
        .iter()
        .find(|o| o["name"] == "nat-prerouting")
        .expect("nat-prerouting");
    assert_eq!(
        (&hook["type"], &hook["hook"], &hook["priority"]),
        (
            &Value::from("nat"),
            &Value::from("prerouting"),
            &Value::from(-100)
        )
    );
    let element = objects
        .iter()
        .find(|o| o["add"] == "element" && o["container"] == "service-ips")
        .expect("a service-ips element");
    assert_eq!(
        element["key"].as_array().map(Vec::len),
        Some(3),
        "{element}"
    );
    assert!(
        element["value"]
            .as_str()
            .is_some_and(|v| v.starts_with("goto service-")),
        "{element}"
    );
}

#[test]
fn nft_render_reports_bad_input() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let bad = tmp.path().join("state.json");
    std::fs::write(&bad, "{\n  \"kind\": \"List\",\n  \"items\": [,]\n}\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args(["render", "--mode", "nftables", "--node", "n1", "--state"])
        .arg(&bad)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("state.json:3:"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Objects per kind as `nft -j list table` reports them: chain names with their rule counts,
/// set and map names with their element counts.
fn listed(json: &str) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let v: Value = serde_json::from_str(json).expect("nft -j output");
    let mut chains: BTreeMap<String, usize> = BTreeMap::new();
    let mut sets: BTreeMap<String, usize> = BTreeMap::new();
    for o in v["nftables"].as_array().expect("nftables array") {
        if let Some(c) = o.get("chain") {
            chains
                .entry(c["name"].as_str().unwrap_or("").into())
                .or_default();
        } else if let Some(r) = o.get("rule") {
            *chains
                .entry(r["chain"].as_str().unwrap_or("").into())
                .or_default() += 1;
        } else if let Some(s) = o.get("set").or_else(|| o.get("map")) {
            let n = s["elem"].as_array().map_or(0, Vec::len);
            sets.insert(s["name"].as_str().unwrap_or("").into(), n);
        }
    }
    (chains, sets)
}

/// The same counts from a render's `add` lines.
fn rendered(text: &str) -> (BTreeMap<String, usize>, BTreeMap<String, usize>) {
    let mut chains: BTreeMap<String, usize> = BTreeMap::new();
    let mut sets: BTreeMap<String, usize> = BTreeMap::new();
    for l in text.lines() {
        let w: Vec<&str> = l.split(' ').collect();
        let name = w.get(4).copied().unwrap_or("").to_string();
        match w.get(1).copied() {
            Some("chain") => {
                chains.entry(name).or_default();
            }
            Some("rule") => *chains.entry(name).or_default() += 1,
            Some("set" | "map") => {
                sets.entry(name).or_default();
            }
            Some("element") => *sets.entry(name).or_default() += 1,
            _ => {}
        }
    }
    (chains, sets)
}

/// A configuration variant of `testdata/cluster`: pods told by interface name prefix (the
/// `iifname` form, in the pod short-circuit of eTP=Local services), NodePorts on every address
/// (the match-all rules, no `nodeport-ips`), masqueradeAll, another mark and ServiceCIDRs.
const VARIANT_CONFIG: &str = "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: node-1
detectLocalMode: InterfaceNamePrefix
detectLocal:
  interfaceNamePrefix: cali
nodePortAddresses: [\"0.0.0.0/0\", \"::/0\"]
nftables:
  masqueradeAll: true
  masqueradeBit: 5
";

const SERVICE_CIDRS: &str = r#"{"apiVersion":"networking.k8s.io/v1","kind":"ServiceCIDR",
"metadata":{"name":"kubernetes"},"spec":{"cidrs":["10.96.0.0/16","fd00:96::/108"]}}"#;

#[test]
fn nft_render_loads_into_the_kernel() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let variant = tmp.path().join("config.yaml");
    std::fs::write(&variant, VARIANT_CONFIG).expect("write");
    let cidrs = tmp.path().join("servicecidr.json");
    std::fs::write(&cidrs, SERVICE_CIDRS).expect("write");
    let state = repo("testdata/cluster/state.json");
    let variant_render = |family: &str| {
        kproxy(&[
            "render",
            "--mode",
            "nftables",
            "--state",
            state.to_str().unwrap_or_default(),
            "--state",
            cidrs.to_str().unwrap_or_default(),
            "--config",
            variant.to_str().unwrap_or_default(),
            "--ip-family",
            family,
        ])
    };
    let renders = [
        ("ip", render_repo_state("cluster", &["--ip-family", "4"])),
        ("ip6", render_repo_state("cluster", &["--ip-family", "6"])),
        ("ip", variant_render("4")),
        ("ip6", variant_render("6")),
    ];
    let v4_variant = &renders[2].1;
    for want in [
        "iifname cali* goto service-",
        "ip daddr 10.96.0.1 jump mark-for-masquerade",
        "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
        "ip daddr { 10.96.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"",
        "mark set mark or 0x00000020",
    ] {
        assert!(v4_variant.contains(want), "{want:?} not in\n{v4_variant}");
    }
    assert!(!v4_variant.contains("nodeport-ips"), "{v4_variant}");
    for (i, (family, text)) in renders.iter().enumerate() {
        let ns = crate::support::netns::Netns::new(&format!("nftload-{i}")).expect("netns");
        ns.nft_load(text)
            .unwrap_or_else(|e| panic!("render {i} ({family}) does not load: {e}\n{text}"));
        let json = ns
            .nft(&["-j", "list", "table", family, "kube-proxy"])
            .expect("nft -j list table");
        let (chains, sets) = listed(&json);
        let (want_chains, want_sets) = rendered(text);
        assert_eq!(chains, want_chains, "render {i}: chains and rule counts");
        assert_eq!(sets, want_sets, "render {i}: sets, maps and element counts");
        assert!(
            chains.keys().filter(|c| c.starts_with("endpoint-")).count() >= 2,
            "render {i}: {chains:?}"
        );
        // The listing in nft's own text form holds every rendered service chain too.
        let listing = ns
            .nft(&["list", "table", family, "kube-proxy"])
            .expect("nft list table");
        for name in want_chains.keys() {
            assert!(
                listing.contains(&format!("chain {name} {{")),
                "render {i}: {name} missing from nft list"
            );
        }
    }
}

const NODE_IP: &str = "192.168.77.2";
const CLIENT_IP: &str = "192.168.77.3";
/// A client address inside the cluster CIDR (10.244.0.0/16): not masqueraded.
const POD_CIDR_CLIENT_IP: &str = "10.244.50.3";
const CLUSTER_IP: &str = "172.30.0.10:80";
const NODE_PORT: &str = "192.168.77.2:30080";
const NO_ENDPOINTS: &str = "172.30.0.11:80";
/// A port the cluster IP does not serve (`cluster-ips-check` rejects it).
const WRONG_PORT: &str = "172.30.0.10:81";
/// Connections per check: with three endpoints, missing one has probability 3 · (2/3)^90.
const N: usize = 90;

/// TCP through the rendered table: `testdata/trace-traffic` (service `web`: three endpoints,
/// NodePort 30080; service `empty`: none) loaded into the node namespace of the harness's
/// topology; connections from the client (prerouting → forward) and from the node (output).
#[test]
fn nft_render_carries_traffic() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let rules = render_repo_state(
        "trace-traffic",
        &["--node", "kpt-node", "--node-ip", NODE_IP],
    );
    let topo = Topology::builder("nft-traffic")
        .client_addrs(&[
            &format!("{CLIENT_IP}/24"),
            &format!("{POD_CIDR_CLIENT_IP}/32"),
        ])
        .pod(Pod::new("pod-a", "10.244.1.5").tcp(8080))
        .pod(Pod::new("pod-b", "10.244.1.6").tcp(8080))
        .pod(Pod::new("pod-c", "10.244.2.7").tcp(8080))
        .build()
        .expect("topology");
    topo.node()
        .ip_batch(&format!("route add {POD_CIDR_CLIENT_IP}/32 dev eth0\n"))
        .expect("route back to the second client address");
    topo.node().nft_load(&rules).expect("nft -f the render");
    let all_pods = BTreeSet::from(["pod-a", "pod-b", "pod-c"]);

    let spread = |what: &str, from: &crate::support::netns::Netns, probe: &Probe, dst: &str| {
        let tally = from.connect_many(probe, addr(dst), N).expect("connect");
        assert_eq!(tally.ok(), N, "{what}: failures {:?}", tally.errors);
        let servers: BTreeSet<&str> = tally.servers.keys().map(String::as_str).collect();
        assert_eq!(servers, all_pods, "{what}: {:?}", tally.servers);
        println!("{what}: {:?} from {:?}", tally.servers, tally.peers);
        tally.peers.keys().copied().collect::<Vec<_>>()
    };

    // Client → ClusterIP: masqueraded (not from the cluster CIDR), spread over all endpoints.
    let peers = spread(
        "client -> ClusterIP",
        topo.client(),
        &Probe::from(ip(CLIENT_IP)),
        CLUSTER_IP,
    );
    assert_eq!(peers, vec![ip(NODE_IP)]);
    // From inside the cluster CIDR: the source is kept.
    let peers = spread(
        "pod-CIDR client -> ClusterIP",
        topo.client(),
        &Probe::from(ip(POD_CIDR_CLIENT_IP)),
        CLUSTER_IP,
    );
    assert_eq!(peers, vec![ip(POD_CIDR_CLIENT_IP)]);
    // NodePort (externalTrafficPolicy Cluster): masqueraded.
    let peers = spread(
        "client -> NodePort",
        topo.client(),
        &Probe::from(ip(CLIENT_IP)),
        NODE_PORT,
    );
    assert_eq!(peers, vec![ip(NODE_IP)]);
    // The node itself (nat-output).
    spread(
        "node -> ClusterIP",
        topo.node(),
        &Probe::default(),
        CLUSTER_IP,
    );

    // No endpoints: reject-chain; an unserved port of a cluster IP: cluster-ips-check.
    for (what, from, dst) in [
        ("client -> no endpoints", topo.client(), NO_ENDPOINTS),
        ("node -> no endpoints", topo.node(), NO_ENDPOINTS),
        ("client -> unserved port", topo.client(), WRONG_PORT),
    ] {
        let err = from.connect(addr(dst)).expect_err(what);
        assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{what}: {err}");
    }

    // Without the table nothing answers on the service addresses: the traffic above went
    // through it.
    topo.node()
        .nft(&["delete", "table", "ip", "kube-proxy"])
        .expect("delete table");
    let err = topo
        .client()
        .connect_with(&Probe::from(ip(CLIENT_IP)), addr(NODE_PORT))
        .expect_err("NodePort without the table");
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{err}");
}

/// Two Services claiming one LoadBalancer IP and port: one `service-ips` element (kube-proxy's
/// element store keeps one value per key) and a warning naming both; a multi-port Service's
/// cluster IP is one `cluster-ips` element.
#[test]
fn nft_render_keeps_one_element_per_key() {
    let svc = |name: &str, cip: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"Service","metadata":{{"name":"{name}","namespace":"ns"}},
            "spec":{{"type":"LoadBalancer","clusterIP":"{cip}","clusterIPs":["{cip}"],"ipFamilies":["IPv4"],
            "ports":[{{"name":"a","port":80,"protocol":"TCP","nodePort":0}},{{"name":"b","port":81,"protocol":"TCP"}}]}},
            "status":{{"loadBalancer":{{"ingress":[{{"ip":"192.0.2.10"}}]}}}}}}"#
        )
    };
    let slice = |name: &str, ep: &str| {
        format!(
            r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","addressType":"IPv4",
            "metadata":{{"name":"{name}-1","namespace":"ns","labels":{{"kubernetes.io/service-name":"{name}"}}}},
            "endpoints":[{{"addresses":["{ep}"]}}],
            "ports":[{{"name":"a","port":8080,"protocol":"TCP"}},{{"name":"b","port":8081,"protocol":"TCP"}}]}}"#
        )
    };
    let text = format!(
        r#"{{"kind":"List","items":[{},{},{},{}]}}"#,
        svc("one", "10.96.0.1"),
        svc("two", "10.96.0.2"),
        slice("one", "10.244.0.1"),
        slice("two", "10.244.0.2")
    );
    let state = load::from_str(&text, "state.json").expect("state");
    let cfg = config::ProxyConfig::default().for_nftables();
    let mut facts = node::NodeFacts::new("n1", kproxy::state::ip::IpFamily::V4);
    facts.node_ips = vec![ip("192.0.2.2")];
    let (out, summary) = nftables::render_text(&state, &cfg, &facts);
    let lb: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("service-ips { 192.0.2.10 . tcp . 80 :"))
        .collect();
    assert_eq!(
        lb,
        [
            "add element ip kube-proxy service-ips { 192.0.2.10 . tcp . 80 : goto external-VKRYK4JM-ns/two/tcp/a }"
        ],
        "{out}"
    );
    let cluster_ips = out
        .lines()
        .filter(|l| l.starts_with("add element ip kube-proxy cluster-ips "))
        .count();
    assert_eq!(cluster_ips, 2, "{out}");
    let conflict: Vec<String> = summary
        .warnings
        .iter()
        .map(ToString::to_string)
        .filter(|w| w.contains("192.0.2.10 . tcp . "))
        .collect();
    assert_eq!(conflict.len(), 2, "{:?}", summary.warnings);
    assert!(
        conflict[0].contains("ns/one:a") && conflict[0].contains("ns/two:a"),
        "{conflict:?}"
    );
    assert_eq!(
        summary.service_ports, 4,
        "two ports of each Service: {:?}",
        summary.warnings
    );
}

/// The `ip6` table carries TCP too: an IPv6 Service (cluster IP and NodePort) with two
/// endpoints, from the client (masqueraded: not in the cluster CIDR) and from the node.
#[test]
fn nft_render_carries_ipv6_traffic() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = tmp.path().join("state.json");
    std::fs::write(
        &state,
        r#"{"kind":"List","items":[
{"apiVersion":"v1","kind":"Service","metadata":{"name":"web6","namespace":"default"},
 "spec":{"type":"NodePort","clusterIP":"fd00:96::10","clusterIPs":["fd00:96::10"],"ipFamilies":["IPv6"],
  "ports":[{"name":"http","port":80,"protocol":"TCP","targetPort":8080,"nodePort":30080}]}},
{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","addressType":"IPv6",
 "metadata":{"name":"web6-1","namespace":"default","labels":{"kubernetes.io/service-name":"web6"}},
 "endpoints":[{"addresses":["fd00:10:244:1::5"],"nodeName":"kpt-node"},{"addresses":["fd00:10:244:2::6"],"nodeName":"other"}],
 "ports":[{"name":"http","port":8080,"protocol":"TCP"}]}]}"#,
    )
    .expect("write state");
    let cfg = tmp.path().join("config.yaml");
    std::fs::write(
        &cfg,
        "kind: KubeProxyConfiguration\nmode: nftables\nclusterCIDR: fd00:10:244::/56\n",
    )
    .expect("write config");
    let rules = kproxy(&[
        "render",
        "--mode",
        "nftables",
        "--state",
        state.to_str().unwrap_or_default(),
        "--config",
        cfg.to_str().unwrap_or_default(),
        "--node",
        "kpt-node",
        "--node-ip",
        "fd00:77::2",
        "--ip-family",
        "6",
    ]);
    assert!(rules.contains("dnat to [fd00:10:244:1::5]:8080"), "{rules}");
    let topo = Topology::builder("nft-traffic6")
        .node_addrs(&["192.168.77.2/24", "fd00:77::2/64"])
        .client_addrs(&["192.168.77.3/24", "fd00:77::3/64"])
        .pod(Pod::new("pod-a", "fd00:10:244:1::5").tcp(8080))
        .pod(Pod::new("pod-b", "fd00:10:244:2::6").tcp(8080))
        .build()
        .expect("topology");
    topo.node().nft_load(&rules).expect("nft -f the render");
    for (what, from, dst, peer) in [
        (
            "client -> ClusterIP",
            topo.client(),
            "[fd00:96::10]:80",
            Some("fd00:77::2"),
        ),
        (
            "client -> NodePort",
            topo.client(),
            "[fd00:77::2]:30080",
            Some("fd00:77::2"),
        ),
        ("node -> ClusterIP", topo.node(), "[fd00:96::10]:80", None),
    ] {
        let tally = from
            .connect_many(&Probe::default(), addr(dst), 60)
            .expect("connect");
        assert_eq!(tally.ok(), 60, "{what}: failures {:?}", tally.errors);
        assert_eq!(
            tally.servers.keys().map(String::as_str).collect::<Vec<_>>(),
            ["pod-a", "pod-b"],
            "{what}"
        );
        if let Some(p) = peer {
            assert_eq!(
                tally.peers.keys().copied().collect::<Vec<_>>(),
                [ip(p)],
                "{what}"
            );
        }
        println!("{what}: {:?} from {:?}", tally.servers, tally.peers);
    }
}

/// The nftables layouts of the releases differ: a render nobody named a release for says which
/// it wrote; one named says nothing of it.
#[test]
fn an_unnamed_release_is_said_by_the_nftables_render() {
    let run = |extra: &[&str]| {
        let out = crate::support::kproxy()
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args([
                "render", "--mode", "nftables", "--node", "node-1", "--nfacct", "none",
            ])
            .args(crate::support::EXAMPLE_STATE)
            .args(extra)
            .output()
            .expect("render");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let unnamed = run(&[]);
    assert!(
        unnamed.contains("nftables rules of kube-proxy 1.35 (no --kube-proxy-version given"),
        "{unnamed}"
    );
    let named = run(&["--kube-proxy-version", "1.36"]);
    assert!(!named.contains("--kube-proxy-version"), "{named}");
}
