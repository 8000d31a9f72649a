//! Hostile API state (issue #38): names and numbers the API server would reject, as a state file
//! (or a bundle, or an API endpoint that is not a real API server) can hold them. Each such
//! object is left out with a warning (render, repair) or a KP014 finding (verify of iptables,
//! nftables and IPVS nodes) naming it and its field; the rest of the node is rendered, verified
//! and repaired as without it, and nothing it holds reaches the rules: a port name with a line
//! break and `-A INPUT …` installs no rule, one declaring `:MYCHAIN - [0:0]` does not flush that
//! chain, a `"` in nftables mode adds no map element. The same through the API's lists, a bundle
//! collected from them and the watches.
//!
//! The property tests give every name field of random states hostile strings: the render (of the
//! state as loaded, and of the raw objects, which only the render's own guards stand between)
//! declares only kube-proxy's chains and puts only the base jumps into built-in chains; the
//! nftables render is one `table ip kube-proxy` of exactly the objects it lists; and a real
//! `repair --local --apply` (both iptables backends and nftables, 6 cases of 3 repairs) leaves
//! the foreign rules of the namespace byte-identical.

use crate::support::fake_apiserver::{ExecReply, ExecRequest, FakeApiServer};
use crate::support::netns::{Backend, Netns, require_root_and_tools};
use crate::support::repair::{FOREIGN, cluster_file, expect_exit, json_doc, rules_only, text};
use kproxy::model::Ruleset;
use kproxy::proxier::iptables::{RenderOptions, render};
use kproxy::state::ClusterState;
use kproxy::state::config::ProxyConfig;
use kproxy::state::ip::IpFamily;
use kproxy::state::node::NodeFacts;
use kproxy_parsers::iptables::ParseOptions;
use proptest::prelude::*;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Output;

/// The issue's injections: a port name that adds a rule to INPUT, one that declares (and so
/// flushes) a foreign chain, one that closes an nft string to add a map element.
const INJECTIONS: &[(&str, &str, &str)] = &[
    (
        "input",
        "x\n-A INPUT -s 6.6.6.6/32 -j ACCEPT\n-A KUBE-SERVICES -j RETURN",
        "10.96.222.1",
    ),
    ("mychain", "x\n:MYCHAIN - [0:0]", "10.96.222.2"),
    (
        "quote",
        "x\" : drop , 10.96.222.9 . tcp . 80 comment \"y",
        "10.96.222.3",
    ),
];

/// What none of the outputs may hold: the injected rule, chain and element, and any trace of the
/// objects that carried them.
const NEVER_WRITTEN: &[&str] = &["6.6.6.6", "MYCHAIN", "10.96.222.", "evil"];

/// A Service `evil/NAME` whose one port is named `port_name`, and its EndpointSlice.
fn evil_objects(name: &str, port_name: &str, cluster_ip: &str) -> [Value; 2] {
    [
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "evil", "name": name},
            "spec": {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                "ipFamilies": ["IPv4"],
                "ports": [{"name": port_name, "port": 80, "protocol": "TCP", "targetPort": 8080}]}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "evil", "name": format!("{name}-abc"),
                "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.244.1.50"], "conditions": {"ready": true},
                "nodeName": "node-1"}],
            "ports": [{"name": port_name, "port": 8080, "protocol": "TCP"}]}),
    ]
}

/// The objects of every injection.
fn all_injections() -> Vec<Value> {
    INJECTIONS
        .iter()
        .flat_map(|(name, port_name, ip)| evil_objects(name, port_name, ip))
        .collect()
}

/// The example cluster's state with `extra` objects added.
fn cluster_with(extra: impl IntoIterator<Item = Value>) -> Value {
    let text = std::fs::read_to_string(cluster_file("state.json")).expect("state.json");
    let mut state: Value = serde_json::from_str(&text).expect("state.json is JSON");
    let items = state["items"].as_array_mut().expect("items");
    items.extend(extra);
    state
}

/// Writes `value` as JSON into `dir/name`.
fn write_json(dir: &Path, name: &str, value: &Value) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, value.to_string()).expect("write state");
    path
}

/// The example cluster's configuration, with `mode: nftables` when `nftables`.
fn config(dir: &Path, nftables: bool) -> PathBuf {
    if nftables {
        crate::nftables_verify::nft_config(dir)
    } else {
        cluster_file("config.yaml")
    }
}

/// `kubectl-kproxy ARGS… --state STATE --config CONFIG`, without colour.
fn kproxy(args: &[&str], state: &Path, config: &Path) -> Output {
    crate::support::kproxy()
        .args(args)
        .arg("--state")
        .arg(state)
        .arg("--config")
        .arg(config)
        .env("NO_COLOR", "1")
        .output()
        .expect("run kubectl-kproxy")
}

/// The warnings of the two objects of injection `name` (both name their invalid field).
fn left_out_warnings(name: &str) -> [String; 2] {
    [
        format!("warning: Service evil/{name}: left out: spec.ports[0].name \"x"),
        format!("warning: EndpointSlice evil/{name}-abc: left out: ports[0].name \"x"),
    ]
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn render_leaves_each_injection_out_and_the_rest_as_it_was() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clean = cluster_file("state.json");
    for nftables in [false, true] {
        let config = config(dir.path(), nftables);
        let mode = if nftables { "nftables" } else { "iptables" };
        let args = ["render", "--mode", mode];
        let want = kproxy(&args, &clean, &config);
        expect_exit(&want, 0, &format!("{mode} render of the clean state"));
        for (name, port_name, ip) in INJECTIONS {
            let state = write_json(
                dir.path(),
                &format!("{name}.json"),
                &cluster_with(evil_objects(name, port_name, ip)),
            );
            let got = kproxy(&args, &state, &config);
            expect_exit(&got, 0, &format!("{mode} render with {name}"));
            assert_eq!(stdout(&got), stdout(&want), "{mode} {name}: {}", text(&got));
            for w in left_out_warnings(name) {
                assert!(
                    stderr(&got).contains(&w),
                    "{mode} {name}: no `{w}`: {}",
                    text(&got)
                );
            }
            for never in NEVER_WRITTEN {
                assert!(
                    !stdout(&got).contains(never),
                    "{mode} {name}: {never} written"
                );
            }
        }
    }
}

/// The non-info findings of a report, sorted: (id, service, chain).
fn findings(report: &Value) -> Vec<(String, Option<String>, Option<String>)> {
    let mut all = crate::nftables_verify::findings(report);
    all.sort();
    all
}

#[test]
fn verify_names_each_invalid_object_and_checks_the_rest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clean = cluster_file("state.json");
    let dump = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/dumps/cluster.nft-c.save");
    let nft_config = config(dir.path(), true);
    // The nftables node: its table as kube-proxy writes it for the clean state.
    let nft_render = kproxy(&["render", "--mode", "nftables"], &clean, &nft_config);
    expect_exit(&nft_render, 0, "nftables render");
    let listing = dir.path().join("ruleset.nft");
    std::fs::write(&listing, &nft_render.stdout).expect("write listing");
    let nodes = [
        (
            "iptables",
            cluster_file("config.yaml"),
            "--iptables-save",
            dump,
        ),
        ("nftables", nft_config, "--nft-ruleset", listing),
    ];
    let injected = cluster_with(all_injections());
    let state = write_json(dir.path(), "all.json", &injected);
    for (mode, config, flag, rules) in &nodes {
        let args = |state: &Path| {
            crate::support::kproxy()
                .args(["verify", "node-1", "-o", "json", flag])
                .arg(rules)
                .arg("--state")
                .arg(state)
                .arg("--config")
                .arg(config)
                .output()
                .expect("run verify")
        };
        let before = args(&clean);
        expect_exit(&before, 0, &format!("{mode}: clean verify"));
        let after = args(&state);
        // Drift (exit 1): the objects left out are warnings; nothing else differs.
        expect_exit(&after, 1, &format!("{mode}: verify with the injections"));
        let (before, after) = (json_doc(&before), json_doc(&after));
        assert_eq!(
            after["summary"]["service_ports"], before["summary"]["service_ports"],
            "{mode}: the other service ports are all checked"
        );
        assert_eq!(findings(&after), injection_findings(), "{mode}: {after:#}");
        let messages = after["findings"].to_string();
        for (name, _, _) in INJECTIONS {
            for object in [
                format!("Service evil/{name} left out: spec.ports[0].name"),
                format!("EndpointSlice evil/{name}-abc left out: ports[0].name"),
            ] {
                assert!(
                    messages.contains(&object),
                    "{mode}: no `{object}`: {after:#}"
                );
            }
        }
    }
}

/// An IPVS node (the constructed kind-worker case and its real dumps): verify reports each
/// injection and nothing else, and checks the same service ports.
#[test]
fn ipvs_verify_names_each_invalid_object() {
    let Some(case) = crate::support::shared("ipvs verify", "conformance/ipvs") else {
        return;
    };
    let case = case.join("constructed-kind-worker-example");
    let dumps = crate::support::ipvs::testdata_ipvs().join("constructed-kind-worker-example");
    let dir = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string(case.join("state.json")).expect("state.json");
    let mut injected: Value = serde_json::from_str(&text).expect("state.json is JSON");
    injected["items"]
        .as_array_mut()
        .expect("items")
        .extend(all_injections());
    let hostile = write_json(dir.path(), "all.json", &injected);
    let verify = |state: &Path| {
        let mut cmd = crate::support::kproxy();
        cmd.args(["verify", "--node", "kind-worker", "-o", "json", "--state"])
            .arg(state)
            .arg("--config")
            .arg(case.join("config.yaml"));
        for (flag, file) in [
            ("--ipvsadm", "ipvsadm-Sn.txt"),
            ("--ipset", "ipset-save.txt"),
            ("--iptables-save", "iptables-save.txt"),
            ("--ip-addr", "ip-addr-kube-ipvs0.txt"),
        ] {
            cmd.arg(flag).arg(dumps.join(file));
        }
        cmd.output().expect("run verify")
    };
    let clean = verify(&case.join("state.json"));
    expect_exit(&clean, 0, "clean IPVS verify");
    let got = verify(&hostile);
    expect_exit(&got, 1, "IPVS verify with the injections");
    let (clean, got) = (json_doc(&clean), json_doc(&got));
    assert_eq!(findings(&got), injection_findings(), "{got:#}");
    assert_eq!(
        got["summary"]["service_ports"],
        clean["summary"]["service_ports"]
    );
}

/// The example cluster with every injection, served by a fake API server with kube-proxy's
/// ConfigMap and a kube-proxy pod on node-1 whose `iptables-save` is the example node's dump.
fn hostile_api() -> FakeApiServer {
    let api = FakeApiServer::start();
    api.add_list_file(&cluster_file("state.json"));
    api.add_objects(all_injections());
    let config = std::fs::read_to_string(cluster_file("config.yaml")).expect("config.yaml");
    api.add_configmap("kube-system", "kube-proxy", &[("config.conf", &config)]);
    api.add_proxy_pod("node-1");
    api.on_exec(|req: &ExecRequest| {
        let dump = |name: &str| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("testdata/dumps")
                .join(name);
            ExecReply::ok(std::fs::read_to_string(path).expect("dump"))
        };
        match req.command.first().map(String::as_str) {
            Some("iptables-save") => dump("cluster.nft-c.save"),
            Some("ip6tables-save") => dump("cluster-v6.nft-c.save"),
            Some("ipset") => ExecReply::ok(""),
            _ => ExecReply::Missing,
        }
    });
    api
}

/// The KP014 findings of every injection: one per Service (named as its service port is) and
/// one per EndpointSlice.
fn injection_findings() -> Vec<(String, Option<String>, Option<String>)> {
    let mut want = Vec::new();
    for (name, _, _) in INJECTIONS {
        want.push(("KP014".to_string(), Some(format!("evil/{name}")), None));
        want.push(("KP014".to_string(), None, None));
    }
    want.sort();
    want
}

/// The API's lists (live `verify`), a bundle collected from them, and the watches (`resync`)
/// leave the injected objects out: verify reports each and checks the rest, the bundle records
/// them as served and reads back to the same report, the watched state holds the rest.
#[test]
fn api_lists_bundles_and_watches_leave_the_injections_out() {
    let api = hostile_api();
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = api.write_kubeconfig(dir.path());
    let bundle = dir.path().join("bundle.tar.gz");
    let live = |args: &[&str]| {
        crate::support::kproxy()
            .args(args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env_remove("KUBECONFIG")
            .env("HOME", dir.path())
            .env("NO_COLOR", "1")
            .output()
            .expect("run kubectl-kproxy")
    };
    let collected = live(&["collect", "node-1", "-o", bundle.to_str().expect("utf-8")]);
    expect_exit(&collected, 0, "collect");
    let from_api = live(&["verify", "node-1", "-o", "json"]);
    let from_bundle = crate::support::kproxy()
        .args(["verify", "-o", "json", "--bundle"])
        .arg(&bundle)
        .output()
        .expect("run verify --bundle");
    for (what, o) in [("live", from_api), ("bundle", from_bundle)] {
        expect_exit(&o, 1, &format!("{what} verify"));
        let report = json_doc(&o);
        assert_eq!(
            findings(&report),
            injection_findings(),
            "{what}: {report:#}"
        );
        assert!(
            report["summary"]["service_ports"].as_u64() > Some(10),
            "{what}: {report:#}"
        );
    }

    let options = kproxy::kube_client::ClientOptions {
        kubeconfig: Some(kubeconfig.clone()),
        request_timeout: "0".into(),
        ..Default::default()
    };
    let clean = kproxy::state::load::from_files(&[cluster_file("state.json")]).expect("state");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let state = rt.block_on(async {
        let conn = kproxy::kube_client::connect(&options)
            .await
            .expect("connect");
        let watch = kproxy::collect::watch::ClusterWatch::start(&conn)
            .await
            .expect("watch");
        watch.ready().await;
        watch.state()
    });
    assert_eq!(
        state.invalid.len(),
        2 * INJECTIONS.len(),
        "{:#?}",
        state.invalid
    );
    assert_eq!(
        (
            state.services.len(),
            state.endpoint_slices.len(),
            state.nodes.len()
        ),
        (
            clean.services.len(),
            clean.endpoint_slices.len(),
            clean.nodes.len()
        )
    );
}

/// Foreign iptables rules next to [`FOREIGN`]: a user chain that a `:MYCHAIN` line would flush,
/// and a rule of INPUT that an injected `-A INPUT` would be inserted before.
const FOREIGN_MORE: &str = "*filter\n:MYCHAIN - [0:0]\n-A INPUT -j MYCHAIN\n\
-A MYCHAIN -s 192.0.2.7/32 -j DROP\n-A MYCHAIN -p udp -m udp --dport 5353 -j ACCEPT\nCOMMIT\n";

/// Foreign nftables tables repair must leave alone.
const FOREIGN_NFT: &str = "table inet fw {\n\tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\t\ttcp dport 22 counter accept comment \"ssh\"\n\t}\n}\n\
table ip mychain {\n\tset allowed {\n\t\ttype ipv4_addr\n\t\telements = { 192.0.2.1 }\n\t}\n\tchain c {\n\t\tip saddr @allowed accept\n\t}\n}\n";

/// What of a save is not kube-proxy's, by table: the built-in chains' policies, the chains not
/// named `KUBE-*` and their rules, and the rules of built-in chains that do not jump into a
/// `KUBE-*` chain (counters left out).
fn foreign_rules(save: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut tables = std::collections::BTreeMap::new();
    let mut table = String::new();
    for l in rules_only(save) {
        if let Some(t) = l.strip_prefix('*') {
            table = t.to_string();
            tables.entry(table.clone()).or_insert_with(Vec::new);
            continue;
        }
        let chain = match (l.strip_prefix(':'), l.strip_prefix("-A ")) {
            (Some(d), _) => d.split_whitespace().next().unwrap_or(""),
            (_, Some(r)) => r.split_whitespace().next().unwrap_or(""),
            _ => continue,
        };
        if !chain.starts_with("KUBE-") && !l.contains(" -j KUBE-") {
            tables.entry(table.clone()).or_default().push(l);
        }
    }
    tables
}

/// `after`'s foreign rules equal `before`'s: the same in every table that was there, and only
/// built-in chains with their default policy in a table kube-proxy's rules added.
fn same_foreign(
    before: &std::collections::BTreeMap<String, Vec<String>>,
    after: &std::collections::BTreeMap<String, Vec<String>>,
) -> Result<(), String> {
    for (table, lines) in after {
        match before.get(table) {
            Some(was) if was == lines => {}
            Some(was) => return Err(format!("table {table}: {was:#?} became {lines:#?}")),
            None if lines
                .iter()
                .all(|l| l.starts_with(':') && l.ends_with(" ACCEPT")) => {}
            None => return Err(format!("new table {table}: {lines:#?}")),
        }
    }
    match before.keys().find(|t| !after.contains_key(*t)) {
        Some(t) => Err(format!("table {t} is gone")),
        None => Ok(()),
    }
}

/// Where one repair writes: an iptables backend, or nftables mode.
#[derive(Debug, Clone, Copy)]
enum Target {
    Iptables(Backend),
    Nftables,
}

impl Target {
    const ALL: [Target; 3] = [
        Target::Iptables(Backend::Nft),
        Target::Iptables(Backend::Legacy),
        Target::Nftables,
    ];

    fn tools(self) -> Vec<&'static str> {
        match self {
            Target::Iptables(b) => {
                let mut t = vec!["ip"];
                t.extend(b.tools());
                t
            }
            Target::Nftables => vec!["ip", "nft"],
        }
    }

    /// A namespace holding the foreign rules.
    fn namespace(self) -> Netns {
        let ns = Netns::new("hostile").expect("netns");
        match self {
            Target::Iptables(b) => {
                ns.restore(b, FOREIGN, true).expect("foreign rules");
                ns.restore(b, FOREIGN_MORE, true).expect("foreign rules");
            }
            Target::Nftables => ns.nft_load(FOREIGN_NFT).expect("foreign tables"),
        }
        ns
    }

    /// What of the namespace is not kube-proxy's, by table (nftables: one entry, the listing of
    /// every other table), to compare byte for byte.
    fn foreign(self, ns: &Netns) -> std::collections::BTreeMap<String, Vec<String>> {
        match self {
            Target::Iptables(b) => {
                let save = ns.save(b, false).expect("save");
                assert!(!save.contains("6.6.6.6"), "{save}");
                foreign_rules(&save)
            }
            Target::Nftables => {
                let tables = ns.nft(&["list", "tables"]).expect("nft list tables");
                let mut out = tables.clone();
                for t in ["inet fw", "ip mychain"] {
                    let mut args = vec!["list", "table"];
                    args.extend(t.split(' '));
                    out.push_str(&ns.nft(&args).expect("nft list table"));
                }
                let ours = ns
                    .nft(&["list", "table", "ip", "kube-proxy"])
                    .unwrap_or_default();
                assert!(
                    !ours.contains("10.96.222.") && !ours.contains("evil"),
                    "{ours}"
                );
                // kube-proxy's tables are ours to write; every other one must be untouched.
                let lines = out
                    .lines()
                    .filter(|l| !l.contains("kube-proxy"))
                    .map(str::to_string)
                    .collect();
                std::collections::BTreeMap::from([("nft".to_string(), lines)])
            }
        }
    }

    /// `repair --local --apply` of `state` in `ns`.
    fn repair(self, ns: &Netns, state: &Path, config_dir: &Path, backups: &Path) -> Output {
        let config = config(config_dir, matches!(self, Target::Nftables));
        let mut args = vec!["repair", "--local", "--apply", "--netns", ns.name()];
        if let Target::Iptables(b) = self {
            args.extend(["--backend", b.name()]);
        }
        let mut cmd = crate::support::kproxy();
        cmd.args(&args)
            .arg("--backup-dir")
            .arg(backups)
            .arg("--state")
            .arg(state)
            .arg("--config")
            .arg(config)
            .env("NO_COLOR", "1");
        cmd.output().expect("run repair")
    }
}

#[test]
fn repair_with_the_injections_leaves_foreign_rules_byte_identical() {
    let tools: Vec<&str> = Target::ALL.iter().flat_map(|t| t.tools()).collect();
    if !require_root_and_tools(&tools) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let state = write_json(dir.path(), "all.json", &cluster_with(all_injections()));
    for target in Target::ALL {
        let ns = target.namespace();
        let before = target.foreign(&ns);
        let o = target.repair(&ns, &state, dir.path(), dir.path());
        expect_exit(&o, 0, &format!("{target:?} repair --apply"));
        assert!(
            stdout(&o).contains("applied and verified"),
            "{target:?}: {}",
            text(&o)
        );
        for (name, _, _) in INJECTIONS {
            for w in left_out_warnings(name) {
                assert!(
                    stderr(&o).contains(&w),
                    "{target:?}: no `{w}`: {}",
                    text(&o)
                );
            }
        }
        if let Err(e) = same_foreign(&before, &target.foreign(&ns)) {
            panic!("{target:?}: foreign rules changed: {e}");
        }
        // A second repair finds nothing to do: the render without the injections is installed.
        let again = target.repair(&ns, &state, dir.path(), dir.path());
        expect_exit(&again, 0, &format!("{target:?} second repair"));
        assert!(
            stdout(&again).contains("nothing to do"),
            "{target:?}: {}",
            text(&again)
        );
    }
}

// ---- a healthy Service whose object in the state is invalid --------------------------------------

impl Target {
    /// The node's kube-proxy rules as listed (iptables: `iptables-save` without its comment
    /// lines; nftables: `nft list table ip kube-proxy`).
    fn kube_proxy_rules(self, ns: &Netns) -> String {
        match self {
            Target::Iptables(b) => {
                let save = ns.save(b, false).expect("save");
                save.lines()
                    .filter(|l| !l.starts_with('#'))
                    .map(|l| format!("{l}\n"))
                    .collect()
            }
            Target::Nftables => ns
                .nft(&["list", "table", "ip", "kube-proxy"])
                .expect("nft list table"),
        }
    }

    /// Flushes the service chain of `shop/cart:http`: drift a repair must undo.
    fn drift_cart(self, ns: &Netns) {
        let rules = self.kube_proxy_rules(ns);
        match self {
            Target::Iptables(b) => {
                let chain = rules
                    .lines()
                    .find(|l| {
                        l.contains("\"shop/cart:http cluster IP\"") && l.contains("-j KUBE-SVC-")
                    })
                    .and_then(|l| l.rsplit(' ').next())
                    .expect("shop/cart's service chain");
                ns.restore(b, &format!("*nat\n:{chain} - [0:0]\nCOMMIT\n"), true)
                    .expect("flush");
            }
            Target::Nftables => {
                let chain = rules
                    .lines()
                    .filter_map(|l| l.trim().strip_prefix("chain "))
                    .map(|l| l.trim_end_matches(" {"))
                    .find(|c| c.starts_with("service-") && c.ends_with("-shop/cart/tcp/http"))
                    .expect("shop/cart's service chain");
                ns.nft(&["flush", "chain", "ip", "kube-proxy", chain])
                    .expect("flush");
            }
        }
    }

    /// `verify node-1 -o json` of the node's rules as listed now.
    fn verify(self, ns: &Netns, state: &Path, dir: &Path) -> Output {
        let (flag, listing) = match self {
            Target::Iptables(b) => ("--iptables-save", ns.save(b, false).expect("save")),
            Target::Nftables => ("--nft-ruleset", ns.nft(&["list", "ruleset"]).expect("nft")),
        };
        let file = dir.join("listing");
        std::fs::write(&file, listing).expect("write listing");
        crate::support::kproxy()
            .args(["verify", "node-1", "-o", "json", flag])
            .arg(&file)
            .arg("--state")
            .arg(state)
            .arg("--config")
            .arg(config(dir, matches!(self, Target::Nftables)))
            .output()
            .expect("run verify")
    }
}

/// The example cluster with the Service `shop/web` made invalid (a label the API server
/// rejects): the node's rules for it are kube-proxy's, the state's copy is not to be trusted.
fn web_invalid() -> Value {
    let mut state = cluster_with([]);
    let web = state["items"]
        .as_array_mut()
        .expect("items")
        .iter_mut()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "web")
        .expect("shop/web");
    web["metadata"]["labels"] = json!({"bad label!": "x"});
    state
}

#[test]
fn a_services_rules_are_neither_judged_nor_touched_when_its_object_is_invalid() {
    let tools: Vec<&str> = Target::ALL.iter().flat_map(|t| t.tools()).collect();
    if !require_root_and_tools(&tools) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let clean = write_json(dir.path(), "clean.json", &cluster_with([]));
    let bad = write_json(dir.path(), "bad.json", &web_invalid());
    for target in Target::ALL {
        let ns = target.namespace();
        let o = target.repair(&ns, &clean, dir.path(), dir.path());
        expect_exit(&o, 0, &format!("{target:?}: repair with the clean state"));
        let healthy = target.kube_proxy_rules(&ns);
        assert!(healthy.contains("shop/web"), "{target:?}: {healthy}");
        target.drift_cart(&ns);

        // verify: the drift of shop/cart is found, nothing of shop/web is judged.
        let o = target.verify(&ns, &bad, dir.path());
        let report = json_doc(&o);
        let judged: Vec<(String, Option<String>, Option<String>)> = findings(&report);
        assert!(
            judged
                .iter()
                .any(|(_, s, _)| s.as_deref().is_some_and(|s| s.starts_with("shop/cart"))),
            "{target:?}: the drift is not found: {report:#}"
        );
        let web: Vec<&(String, Option<String>, Option<String>)> = judged
            .iter()
            .filter(|(_, s, _)| {
                s.as_deref()
                    .is_some_and(|s| s.starts_with("shop/web:") || s == "shop/web")
            })
            .collect();
        assert_eq!(web.len(), 1, "{target:?}: {web:?}");
        assert_eq!(web[0].0, "KP014", "{target:?}: {web:?}");
        let said = report["findings"].to_string();
        assert!(
            said.contains("the node's rules of Service shop/web were not checked ("),
            "{target:?}: {said}"
        );

        // repair: shop/cart is repaired, shop/web's rules stay byte for byte as they were.
        let o = target.repair(&ns, &bad, dir.path(), dir.path());
        expect_exit(&o, 0, &format!("{target:?}: repair with shop/web invalid"));
        assert!(
            stdout(&o).contains("left as they are: Service shop/web ("),
            "{target:?}: {}",
            text(&o)
        );
        assert!(stdout(&o).contains("applied and verified"), "{}", text(&o));
        assert_eq!(
            target.kube_proxy_rules(&ns),
            healthy,
            "{target:?}: the node is not as kube-proxy left it"
        );
        let again = target.repair(&ns, &bad, dir.path(), dir.path());
        expect_exit(&again, 0, &format!("{target:?}: second repair"));
        assert!(stdout(&again).contains("nothing to do"), "{}", text(&again));
    }
}

/// `rules` with the rules of the chains whose order kube-proxy does not define sorted (the
/// `UNORDERED_CHAINS` of repair's plan); every other line in its place.
fn unordered(rules: &str) -> String {
    const UNORDERED: &[&str] = &[
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-EXTERNAL-SERVICES",
        "KUBE-PROXY-FIREWALL",
    ];
    let chain = |l: &str| {
        l.strip_prefix("-A ")
            .and_then(|r| r.split(' ').next())
            .filter(|c| UNORDERED.contains(c))
            .map(str::to_string)
    };
    let mut out: Vec<String> = Vec::new();
    let mut run: Vec<&str> = Vec::new();
    let mut run_chain: Option<String> = None;
    for line in rules.lines() {
        let c = chain(line);
        if c != run_chain || c.is_none() {
            run.sort_unstable();
            out.extend(run.drain(..).map(str::to_string));
            run_chain = c.clone();
        }
        if c.is_some() {
            run.push(line);
        } else {
            out.push(line.to_string());
        }
    }
    run.sort_unstable();
    out.extend(run.drain(..).map(str::to_string));
    out.join("\n")
}

/// resync, whose every sync plans as repair does: the drift of another Service is undone, the
/// rules of the Service whose object the API serves invalid are left as they are.
#[test]
fn resync_leaves_an_invalid_services_rules_as_they_are() {
    let tools: Vec<&str> = Target::ALL.iter().flat_map(|t| t.tools()).collect();
    if !require_root_and_tools(&tools) {
        return;
    }
    let _serial = crate::resync::KUBE_PROXY_NAME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let clean = write_json(dir.path(), "clean.json", &cluster_with([]));
    let items = web_invalid()["items"].as_array().cloned().expect("items");
    for target in Target::ALL {
        let ns = target.namespace();
        let o = target.repair(&ns, &clean, dir.path(), dir.path());
        expect_exit(&o, 0, &format!("{target:?}: repair with the clean state"));
        let healthy = target.kube_proxy_rules(&ns);
        target.drift_cart(&ns);
        assert_ne!(
            target.kube_proxy_rules(&ns),
            healthy,
            "{target:?}: no drift"
        );
        let api = FakeApiServer::start();
        api.add_objects(items.clone());
        let kubeconfig = api.write_kubeconfig(dir.path());
        let config = config(dir.path(), matches!(target, Target::Nftables));
        // The namespace has no nfacct objects (repair --local found none either).
        let mut args = vec!["--netns", ns.name(), "--node", "node-1", "--nfacct", "none"];
        args.push("--config");
        args.push(config.to_str().expect("utf-8 path"));
        if let Target::Iptables(b) = target {
            args.extend(["--backend", b.name()]);
        }
        let resync = crate::resync::Resync::spawn(dir.path(), &kubeconfig, &args);
        // Its first sync is a full one: every chain is written again, and the chains whose
        // order kube-proxy does not define (`KUBE-SERVICES`, …) may come back in another one.
        let healthy = unordered(&healthy);
        let started = std::time::Instant::now();
        let mut now = unordered(&target.kube_proxy_rules(&ns));
        while now != healthy && started.elapsed() < std::time::Duration::from_secs(30) {
            std::thread::sleep(std::time::Duration::from_millis(100));
            now = unordered(&target.kube_proxy_rules(&ns));
        }
        let differ: Vec<&str> = now
            .lines()
            .filter(|l| !healthy.lines().any(|h| h == *l))
            .chain(healthy.lines().filter(|h| !now.lines().any(|l| l == *h)))
            .collect();
        assert!(
            now == healthy,
            "{target:?}: after resync's first sync the node is not as kube-proxy left it: {differ:#?}\n{}",
            resync.stderr()
        );
    }
}

/// An IPVS node (the example cluster's real dumps) whose `kube-system/kube-dns` is healthy, and a
/// state in which that Service's object is invalid: verify judges nothing of it and says so, and
/// repair's plan leaves its virtual servers, set members, address and rules as they are.
#[test]
fn ipvs_leaves_an_invalid_services_objects_unjudged_and_untouched() {
    let case = crate::support::ipvs::testdata_ipvs().join("example-cluster");
    let dir = tempfile::tempdir().expect("tempdir");
    let written = std::fs::read_to_string(case.join("state.json")).expect("state.json");
    let mut state: Value = serde_json::from_str(&written).expect("state.json is JSON");
    let dns = state["items"]
        .as_array_mut()
        .expect("items")
        .iter_mut()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "kube-dns")
        .expect("kube-dns");
    dns["metadata"]["labels"] = json!({"bad label!": "x"});
    let bad = write_json(dir.path(), "bad.json", &state);
    let run = |command: &str, state: &Path, files: [(&str, &str); 4], json: bool| {
        let mut cmd = crate::support::kproxy();
        cmd.args([command, "--node", "node-1", "--ip-family", "4", "--state"])
            .arg(state)
            .arg("--config")
            .arg(case.join("config.yaml"))
            .env("NO_COLOR", "1");
        if json {
            cmd.args(["-o", "json"]);
        }
        for (flag, file) in files {
            cmd.arg(flag).arg(case.join(file));
        }
        cmd.output().expect("run kubectl-kproxy")
    };
    let verify_files = [
        ("--ipvsadm", "ipvsadm-Ln.txt"),
        ("--ipset", "ipset-save.txt"),
        ("--iptables-save", "iptables-save.txt"),
        ("--ip-addr", "ip-addr-kube-ipvs0.txt"),
    ];
    let repair_files = [
        ("--ipvsadm-save", "ipvsadm-Sn.txt"),
        ("--ipset-save", "ipset-save.txt"),
        ("--iptables-save", "iptables-save.txt"),
        ("--kube-ipvs0", "ip-addr-kube-ipvs0.txt"),
    ];
    let clean = run("verify", &case.join("state.json"), verify_files, true);
    expect_exit(&clean, 0, "clean IPVS verify");
    let got = run("verify", &bad, verify_files, true);
    let report = json_doc(&got);
    assert_eq!(
        findings(&report),
        [(
            "KP014".to_string(),
            Some("kube-system/kube-dns".to_string()),
            None
        )],
        "{report:#}"
    );
    assert!(
        report["findings"]
            .to_string()
            .contains("the node's rules of Service kube-system/kube-dns were not checked ("),
        "{report:#}"
    );
    let plan = run("repair", &bad, repair_files, false);
    expect_exit(&plan, 0, "IPVS repair plan");
    let said = stdout(&plan);
    assert!(said.contains("nothing to do"), "{}", text(&plan));
    assert!(
        said.contains("left as they are: Service kube-system/kube-dns ("),
        "{}",
        text(&plan)
    );
    let doc = json_doc(&run("repair", &bad, repair_files, true));
    assert_eq!(
        doc["plan"]["iptables"]["left_alone"][0]["service"], "kube-system/kube-dns",
        "{doc:#}"
    );
}

// ---- property tests ---------------------------------------------------------------------------

/// Pieces of hostile names: line breaks, quotes, restore and nft syntax, NUL, non-ASCII.
const FRAGMENTS: &[&str] = &[
    "a",
    "web-1",
    "\n",
    "\r",
    "\"",
    "'",
    "\\",
    " ",
    "\t",
    "\0",
    "-A INPUT -s 6.6.6.6/32 -j ACCEPT",
    ":MYCHAIN - [0:0]",
    "-X MYCHAIN",
    "COMMIT",
    "*filter",
    "}",
    "{",
    ";",
    "#",
    ":",
    "/",
    "add table ip evil",
    "\u{2028}",
    "é",
];

/// A name: a valid short label, a very long one, or fragments joined.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[a-z][a-z0-9]{0,10}",
        1 => Just("l".repeat(300)),
        6 => prop::collection::vec(prop::sample::select(FRAGMENTS), 1..5).prop_map(|v| v.concat()),
    ]
}

/// One Service with a slice, every name field of both drawn from [`name`].
#[derive(Debug, Clone)]
struct Names {
    namespace: String,
    service: String,
    port: String,
    slice: String,
    /// `None`: the slice names the Service it belongs to.
    slice_service: Option<String>,
    /// `None`: the slice's port has the Service port's name.
    slice_port: Option<String>,
    node: String,
    hostname: String,
    zone_hint: String,
    label: String,
}

fn names() -> impl Strategy<Value = Names> {
    (
        (name(), name(), name(), name()),
        (prop::option::of(name()), prop::option::of(name())),
        (name(), name(), name(), name()),
    )
        .prop_map(
            |(
                (namespace, service, port, slice),
                (slice_service, slice_port),
                (node, hostname, zone_hint, label),
            )| Names {
                namespace,
                service,
                port,
                slice,
                slice_service,
                slice_port,
                node,
                hostname,
                zone_hint,
                label,
            },
        )
}

/// The objects of `n` (the `i`th: its addresses are its own).
fn objects(i: usize, n: &Names) -> Vec<Value> {
    let cluster_ip = format!("10.96.150.{}", i + 1);
    let pod_ip = format!("10.244.150.{}", i + 1);
    let service = n.slice_service.as_deref().unwrap_or(&n.service);
    let port = n.slice_port.as_deref().unwrap_or(&n.port);
    vec![
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": n.namespace, "name": n.service, "labels": {"app": n.label}},
            "spec": {"type": "NodePort", "clusterIP": cluster_ip, "sessionAffinity": "ClientIP",
                "ports": [{"name": n.port, "port": 80, "protocol": "TCP", "targetPort": 8080,
                    "nodePort": 31000 + i}]}}),
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": n.namespace, "name": n.slice,
                "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [pod_ip], "conditions": {"ready": true},
                "nodeName": n.node, "hostname": n.hostname, "zone": n.zone_hint,
                "hints": {"forZones": [{"name": n.zone_hint}]}}],
            "ports": [{"name": port, "port": 8080, "protocol": "TCP"}]}),
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": n.node, "labels": {"topology.kubernetes.io/zone": n.zone_hint}}}),
    ]
}

/// The objects as they are, not validated: what a state built without loading holds.
fn raw_state(items: &[Value]) -> ClusterState {
    ClusterState {
        services: decode(items, "Service"),
        endpoint_slices: decode(items, "EndpointSlice"),
        nodes: decode(items, "Node"),
        ..ClusterState::default()
    }
}

/// The objects of `kind` among `items`, decoded.
fn decode<T: serde::de::DeserializeOwned>(items: &[Value], kind: &str) -> Vec<T> {
    let of: Vec<Value> = items
        .iter()
        .filter(|v| v["kind"] == kind)
        .cloned()
        .collect();
    serde_json::from_value(Value::Array(of)).expect("objects decode")
}

/// The objects loaded as a state file is (validated).
fn loaded_state(items: &[Value]) -> ClusterState {
    let text = json!({"kind": "List", "items": items}).to_string();
    kproxy::state::load::from_str(&text, "state.json").expect("a state")
}

fn facts() -> NodeFacts {
    let mut facts = NodeFacts::new("node-1", IpFamily::V4);
    facts.node_ips = vec!["192.168.77.2".parse().expect("ip")];
    facts
}

/// The iptables render with base jumps.
fn restore_text(state: &ClusterState) -> String {
    render(
        state,
        &ProxyConfig::default(),
        &facts(),
        RenderOptions {
            with_base_jumps: true,
        },
    )
    .to_restore_text()
}

/// Property (a): the restore input parses back, declares only built-in and `KUBE-*` chains of
/// filter, nat and mangle, jumps only to `KUBE-*` chains, and its built-in
/// chains hold exactly `base` (the base jumps, the same whatever the state).
fn check_restore_text(text: &str, base: &[(String, String, String)]) -> Result<(), TestCaseError> {
    prop_assert!(!text.contains('\0') && !text.contains('\r'), "{text}");
    let rs = Ruleset::parse(text, &ParseOptions::strict())
        .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
    let mut builtin = Vec::new();
    for table in &rs.tables {
        prop_assert!(
            ["filter", "nat", "mangle"].contains(&table.name),
            "table {}",
            table.name
        );
        for chain in &table.chains {
            prop_assert!(
                chain.is_builtin() || chain.name.starts_with("KUBE-"),
                "chain {} declared",
                chain.name
            );
            for r in &chain.rules {
                // A jump or goto names a chain; built-in targets (ACCEPT, DNAT, …) are none.
                if let Some(chain) = r.rule.jump_target() {
                    prop_assert!(
                        chain.starts_with("KUBE-"),
                        "{}: jumps to {chain:?}",
                        r.rule.raw
                    );
                }
                if chain.is_builtin() {
                    builtin.push((
                        table.name.to_string(),
                        chain.name.to_string(),
                        r.rule.raw.to_string(),
                    ));
                }
            }
        }
    }
    prop_assert_eq!(&builtin, base);
    Ok(())
}

/// The rules of the built-in chains in the render of an empty state: the base jumps.
fn base_jumps() -> Vec<(String, String, String)> {
    let text = restore_text(&ClusterState::default());
    let rs = Ruleset::parse(&text, &ParseOptions::strict()).expect("render of nothing");
    rs.tables
        .iter()
        .flat_map(|t| {
            t.chains
                .iter()
                .filter(|c| c.is_builtin())
                .flat_map(move |c| {
                    c.rules.iter().map(move |r| {
                        (
                            t.name.to_string(),
                            c.name.to_string(),
                            r.rule.raw.to_string(),
                        )
                    })
                })
        })
        .collect()
}

/// Property (b): the nftables render is `add` lines of `ip kube-proxy` only, parses as one
/// table `ip kube-proxy`, and holds exactly the chains, rules and elements its lines add.
fn check_nft_text(text: &str) -> Result<(), TestCaseError> {
    use kproxy_parsers::nft;
    prop_assert!(!text.contains('\0') && !text.contains('\r'), "{text}");
    let mut added = std::collections::BTreeMap::new();
    for line in text.lines() {
        let words: Vec<&str> = line.splitn(5, ' ').collect();
        prop_assert!(
            words.len() >= 4 && words[0] == "add" && words[2] == "ip" && words[3] == "kube-proxy",
            "line {line:?}"
        );
        *added.entry(words[1]).or_insert(0usize) += 1;
    }
    let rs = nft::parse(text, &nft::ParseOptions::strict())
        .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
    prop_assert_eq!(rs.tables.len(), 1);
    let table = &rs.tables[0];
    prop_assert_eq!(table.family, nft::Family::Ip);
    prop_assert_eq!(table.name.as_ref(), "kube-proxy");
    let count = |kind: &str| added.get(kind).copied().unwrap_or(0);
    prop_assert_eq!(table.chains.len(), count("chain"), "{}", text);
    let rules: usize = table.chains.iter().map(|c| c.rules.len()).sum();
    prop_assert_eq!(rules, count("rule"), "{}", text);
    let elements: usize = table.sets.iter().map(|s| s.elements.len()).sum();
    prop_assert_eq!(elements, count("element"), "{}", text);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, max_shrink_iters: 256, ..ProptestConfig::default() })]

    /// (a) and (b) for random states with hostile names, loaded and raw.
    #[test]
    fn renders_of_hostile_states_write_only_kube_proxys_objects(all in prop::collection::vec(names(), 1..5)) {
        let items: Vec<Value> = all.iter().enumerate().flat_map(|(i, n)| objects(i, n)).collect();
        let base = base_jumps();
        let config = ProxyConfig::default().for_nftables();
        for state in [loaded_state(&items), raw_state(&items)] {
            check_restore_text(&restore_text(&state), &base)?;
            let (nft_text, _) = kproxy::proxier::nftables::render_text(&state, &config, &facts());
            check_nft_text(&nft_text)?;
        }
    }
}

/// Whether the real-netfilter property can run (root and every tool); says why not once.
fn netfilter_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| {
        let tools: Vec<&str> = Target::ALL.iter().flat_map(|t| t.tools()).collect();
        require_root_and_tools(&tools)
    })
}

proptest! {
    // Real namespaces and real repairs: few cases, each a repair on every target (about a
    // second each), so that every backend is tried whatever the draw.
    #![proptest_config(ProptestConfig { cases: 6, max_shrink_iters: 32, ..ProptestConfig::default() })]

    /// (c) `repair --local --apply` of the example cluster plus random hostile objects, into a
    /// namespace holding foreign rules (iptables nf_tables and legacy, nftables), leaves those
    /// rules byte-identical.
    #[test]
    fn repair_of_hostile_states_leaves_foreign_rules_byte_identical(
        all in prop::collection::vec(names(), 1..4),
    ) {
        if !netfilter_ready() {
            return Ok(());
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let items: Vec<Value> = all.iter().enumerate().flat_map(|(i, n)| objects(i, n)).collect();
        let state = write_json(dir.path(), "state.json", &cluster_with(items));
        for target in Target::ALL {
            let ns = target.namespace();
            let before = target.foreign(&ns);
            let o = target.repair(&ns, &state, dir.path(), dir.path());
            prop_assert_eq!(o.status.code(), Some(0), "{:?}: {}", target, text(&o));
            let changed = same_foreign(&before, &target.foreign(&ns));
            prop_assert!(changed.is_ok(), "{:?}: foreign rules changed: {:?}", target, changed);
        }
    }
}

/// `trace` with `--state` compares the path with a plan that lacks the objects left out: it says
/// which they are, and the path view is the one of the clean state.
#[test]
fn trace_names_each_object_left_out_of_its_plan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = config(dir.path(), false);
    let dump = crate::support::repo("testdata/dumps/cluster.legacy-c.save");
    let dump = dump.to_str().expect("utf-8 path");
    let args = ["trace", "svc/shop/search", "--iptables-save", dump];
    let want = kproxy(&args, &cluster_file("state.json"), &config);
    expect_exit(&want, 0, "trace with the clean state");
    let state = write_json(dir.path(), "all.json", &cluster_with(all_injections()));
    let got = kproxy(&args, &state, &config);
    expect_exit(&got, 0, "trace with the injections");
    assert_eq!(stdout(&got), stdout(&want), "{}", text(&got));
    for (name, _, _) in INJECTIONS {
        for w in left_out_warnings(name) {
            assert!(stderr(&got).contains(&w), "no `{w}`: {}", text(&got));
        }
    }
}
