//! `render` against kube-proxy's golden cases (`../shared/conformance/iptables/render/*/`) and the
//! packet-flow inputs, plus CLI behaviour on bad input.
//!
//! Comparison follows kube-proxy's own tests (`assertIPTablesRulesEqual` after `sortIPTablesRules`,
//! see `kproxy::proxier::canonical`). Partial-sync steps are replayed into the full state they lead
//! to (iptables-restore `--noflush` semantics), exactly like `conformance.py`; chains the
//! expectation deletes (`-X`) are dropped because a stateless render cannot know stale chains.

use kproxy::proxier::canonical::sort_like_kube_proxy_tests;
use kproxy::proxier::iptables::{RenderOptions, Rendered, render};
use kproxy::state::ip::IpFamily;
use kproxy::state::node::NodeInputs;
use kproxy::state::{config, load, node};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn shared() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/iptables");
    if p.is_dir() {
        Some(p)
    } else {
        crate::support::skip(
            "render",
            &format!("{} absent; render conformance skipped", p.display()),
        );
        None
    }
}

pub(crate) fn yaml(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

pub(crate) fn get<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

pub(crate) fn text_of(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The node-fact flags of a case, the same mapping as `conformance.py harness_flags`.
pub(crate) fn harness_args(case: &Value) -> NodeInputs {
    let h = |k: &[&str]| {
        let mut p = vec!["harness"];
        p.extend_from_slice(k);
        text_of(get(case, &p))
    };
    let fam = h(&["ip_family"]).unwrap_or_else(|| "IPv4".into());
    let mut ips: Vec<std::net::IpAddr> = get(case, &["harness", "interfaces", "eth0"])
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .filter_map(|s| s.split('/').next().unwrap_or(s).parse().ok())
                .collect()
        })
        .unwrap_or_default();
    if let Some(prim) = h(&["primary_node_ip"]).and_then(|p| p.parse::<std::net::IpAddr>().ok())
        && let Some(i) = ips.iter().position(|x| *x == prim)
    {
        let p = ips.remove(i);
        ips.insert(0, p);
    }
    let counters: Vec<String> = [
        "ct_state_invalid_dropped_pkts",
        "localhost_nps_accepted_pkts",
    ]
    .into_iter()
    .filter(|c| h(&["nfacct_counters", c]).as_deref() == Some("true"))
    .map(str::to_string)
    .collect();
    NodeInputs {
        node: Some(h(&["node_name"]).unwrap_or_else(|| "test-node".into())),
        node_ips: ips,
        family: Some(if fam.contains('6') {
            IpFamily::V6
        } else {
            IpFamily::V4
        }),
        random_fully: h(&["iptables_has_random_fully"]).as_deref() == Some("true"),
        nfacct: Some(counters),
        tcp_be_liberal: h(&["nf_conntrack_tcp_be_liberal"]).as_deref() == Some("true"),
        masquerade_mark: h(&["masquerade_mark"]),
        not_in_state: false,
        kube_proxy_version: text_of(get(case, &["kube_proxy_version"])).map(|v| {
            v.parse()
                .unwrap_or_else(|e| panic!("case.yaml kube_proxy_version: {e}"))
        }),
        feature_gates: Default::default(),
    }
}

fn render_dir(dir: &Path, case: &Value, with_base_jumps: bool) -> Rendered {
    let state = load::from_files(&[dir.join("state.json")]).unwrap_or_else(|e| panic!("{e}"));
    let cfg_path = dir.join("config.yaml");
    let cfg_text = std::fs::read_to_string(&cfg_path).unwrap_or_else(|e| panic!("{e}"));
    let (cfg, warnings) =
        config::parse(&cfg_text, &cfg_path.display().to_string()).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        warnings.is_empty(),
        "{}: config warnings {warnings:?}",
        dir.display()
    );
    let (facts, _) =
        node::build(&harness_args(case), &state, &cfg).unwrap_or_else(|e| panic!("{e}"));
    render(&state, &cfg, &facts, RenderOptions { with_base_jumps })
}

/// A restore-text model with `--noflush` semantics (port of conformance.py's helpers).
#[derive(Default)]
struct RestoreState {
    tables: Vec<(String, Vec<ChainState>)>,
}

/// A chain of [`RestoreState`]: name, declaration line, rule lines.
type ChainState = (String, String, Vec<String>);

fn norm(line: &str) -> String {
    line.split_whitespace().collect::<Vec<_>>().join(" ")
}

type Delta = Vec<(
    String,
    Vec<(String, String)>,
    Vec<(String, String)>,
    Vec<String>,
)>;

fn parse_restore(text: &str) -> Delta {
    // (table, decls (name, line), rules (chain, line), deleted)
    let mut out: Delta = Vec::new();
    for raw in text.lines() {
        let s = norm(raw);
        if s.is_empty() || s.starts_with('#') || s == "COMMIT" {
            continue;
        }
        if let Some(t) = s.strip_prefix('*') {
            out.push((t.to_string(), vec![], vec![], vec![]));
            continue;
        }
        let Some(cur) = out.last_mut() else { continue };
        let name = s
            .split(' ')
            .nth(if s.starts_with(':') { 0 } else { 1 })
            .unwrap_or("");
        if let Some(decl) = s.strip_prefix(':') {
            let n = decl.split(' ').next().unwrap_or("").to_string();
            cur.1.push((n, s.clone()));
        } else if s.starts_with("-A ") {
            cur.2.push((name.to_string(), s.clone()));
        } else if s.starts_with("-X ") {
            cur.3.push(name.to_string());
        }
    }
    out
}

impl RestoreState {
    fn apply(&mut self, delta: &Delta) {
        for (t, decls, rules, deleted) in delta {
            let idx = match self.tables.iter().position(|(n, _)| n == t) {
                Some(i) => i,
                None => {
                    self.tables.push((t.clone(), vec![]));
                    self.tables.len() - 1
                }
            };
            let chains = &mut self.tables[idx].1;
            for (name, line) in decls {
                let new_rules: Vec<String> = rules
                    .iter()
                    .filter(|(c, _)| c == name)
                    .map(|(_, r)| r.clone())
                    .collect();
                match chains.iter_mut().find(|(n, _, _)| n == name) {
                    Some(slot) => {
                        slot.1 = line.clone();
                        slot.2 = new_rules;
                    }
                    None => chains.push((name.clone(), line.clone(), new_rules)),
                }
            }
            chains.retain(|(n, _, _)| !deleted.contains(n));
        }
    }

    fn dump(&self) -> String {
        let mut s = String::new();
        for (t, chains) in &self.tables {
            s.push_str(&format!("*{t}\n"));
            for (_, decl, _) in chains {
                s.push_str(decl);
                s.push('\n');
            }
            for (_, _, rules) in chains {
                for r in rules {
                    s.push_str(r);
                    s.push('\n');
                }
            }
            s.push_str("COMMIT\n");
        }
        s
    }
}

fn canon(text: &str, what: &str) -> String {
    sort_like_kube_proxy_tests(text).unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn first_diff(a: &str, b: &str) -> String {
    for (i, (x, y)) in a.lines().zip(b.lines()).enumerate() {
        if x != y {
            return format!("line {}: expected {x:?}\n              got {y:?}", i + 1);
        }
    }
    format!(
        "length differs: expected {} lines, got {}",
        a.lines().count(),
        b.lines().count()
    )
}

fn sync_type(case: &Value) -> String {
    text_of(get(case, &["sync", "type"])).unwrap_or_else(|| "full".into())
}

/// Checks one case; `Err` says why it differs.
fn check_case(root: &Path, name: &str) -> Result<(), String> {
    let dir = root.join(name);
    let case = yaml(&dir.join("case.yaml"));
    let mode = text_of(get(&case, &["compare", "mode"])).unwrap_or_default();
    let sync = sync_type(&case);
    let rendered = render_dir(&dir, &case, false);
    let out = rendered.to_restore_text();
    match mode.as_str() {
        "full-dump" => {
            // Replay from the last full sync up to this step.
            let mut chain = vec![name.to_string()];
            let mut cur = case.clone();
            while sync_type(&cur) != "full" {
                let prev = text_of(get(&cur, &["previous_step"]))
                    .ok_or("partial sync without previous_step")?;
                cur = yaml(&root.join(&prev).join("case.yaml"));
                chain.push(prev);
            }
            let mut st = RestoreState::default();
            for step in chain.iter().rev() {
                let exp = std::fs::read_to_string(root.join(step).join("expected.iptables"))
                    .map_err(|e| e.to_string())?;
                st.apply(&parse_restore(&exp));
            }
            let (e, a) = (canon(&st.dump(), "expected"), canon(&out, "render"));
            if e == a {
                Ok(())
            } else {
                Err(first_diff(&e, &a))
            }
        }
        "chain" => {
            let table = text_of(get(&case, &["compare", "table"])).unwrap_or_default();
            let ch = text_of(get(&case, &["compare", "chain"])).unwrap_or_default();
            let exp: Vec<String> = std::fs::read_to_string(dir.join("expected.chain"))
                .map_err(|e| e.to_string())?
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(norm)
                .collect();
            let act: Vec<String> = rendered
                .table(&table)
                .map(|t| t.chain_rules(&ch).map(norm).collect())
                .unwrap_or_default();
            if exp == act {
                Ok(())
            } else {
                Err(format!("{table}/{ch}: expected {exp:?}, got {act:?}"))
            }
        }
        "assertions" => check_assertions(&dir, &sync, &out),
        other => Err(format!("unknown compare mode {other:?}")),
    }
}

fn check_assertions(dir: &Path, sync: &str, out: &str) -> Result<(), String> {
    let e: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("expected.json")).map_err(|e| e.to_string())?,
    )
    .map_err(|e| e.to_string())?;
    let lines: Vec<String> = out.lines().map(norm).collect();
    if let Some(ip) = e.get("lb_ip").and_then(Value::as_str) {
        let want = e
            .get("expected_present")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let present = lines.iter().any(|l| {
            l.starts_with("-A KUBE-SERVICES ")
                && l.contains("loadbalancer IP")
                && l.split(' ').any(|w| w == ip || w == format!("{ip}/32"))
        });
        return if present == want {
            Ok(())
        } else {
            Err(format!("LB {ip} rule present={present}, want {want}"))
        };
    }
    let dnat: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("-A KUBE-SEP-") && l.contains("-j DNAT"))
        .collect();
    let with_comment = dnat.iter().filter(|l| l.contains("--comment")).count();
    let m = e.get("match").and_then(Value::as_str).unwrap_or("");
    let matching: Vec<&&String> = dnat
        .iter()
        .filter(|l| !m.is_empty() && l.contains(m))
        .collect();
    let want_rule = e
        .get("first_matching_dnat_rule")
        .and_then(Value::as_str)
        .map(norm)
        .unwrap_or_default();
    let want_n = e.get("num_dnat_rules").and_then(Value::as_u64).unwrap_or(0) as usize;
    let want_c = e
        .get("num_dnat_rules_with_comment")
        .and_then(Value::as_u64)
        .map(|n| n as usize);
    if sync == "full" {
        if dnat.len() != want_n {
            return Err(format!("{} DNAT rules, want {want_n}", dnat.len()));
        }
        if let Some(c) = want_c
            && c != with_comment
        {
            return Err(format!("{with_comment} DNAT rules with comment, want {c}"));
        }
        let got = matching.last().map(|s| s.as_str()).unwrap_or("");
        return if got == want_rule {
            Ok(())
        } else {
            Err(format!("matching rule {got:?}, want {want_rule:?}"))
        };
    }
    // A partial sync's restore input holds only the changed services; what a full render must
    // agree with: the rule it wrote is in the full state (or, when none, no rule matches), and
    // large-cluster mode (no comments) when the step says so.
    if want_rule.is_empty() {
        if !matching.is_empty() {
            return Err(format!(
                "a DNAT rule matching {m:?} is still rendered: {:?}",
                matching[0]
            ));
        }
    } else if !dnat.iter().any(|l| **l == want_rule) {
        return Err(format!(
            "full render lacks the rule the partial sync wrote: {want_rule:?}"
        ));
    }
    if want_c == Some(0) && want_n > 0 && with_comment != 0 {
        return Err(format!(
            "large-cluster mode expected, but {with_comment} DNAT rules have comments"
        ));
    }
    Ok(())
}

/// The cases (directories with a `case.yaml`) under `root`, sorted.
fn case_names(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().join("case.yaml").is_file())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Checks every case under `root` and fails naming the ones that differ.
fn check_suite(root: &Path, suite: &str) {
    let names = case_names(root);
    let mut misses = Vec::new();
    for n in &names {
        if let Err(why) = check_case(root, n) {
            misses.push(format!("{n}: {why}"));
        }
    }
    for m in &misses {
        println!("  MISS {m}");
    }
    println!(
        "{suite}: {}/{} cases equal",
        names.len() - misses.len(),
        names.len()
    );
    assert!(!names.is_empty(), "no cases found");
    assert!(
        misses.is_empty(),
        "{} of {} {suite} cases differ",
        misses.len(),
        names.len()
    );
}

#[test]
fn render_conformance_cases() {
    let Some(base) = shared() else { return };
    check_suite(&base.join("render"), "render");
}

/// The golden rules of older kube-proxy releases (`../shared/conformance/versions/*`, each from
/// that release's own unit test), rendered with the case's `kube_proxy_version`. On a node with
/// kube-proxy's nfacct counters (which these releases do not use), the release still writes its
/// golden rules while the newest writes others: the version is what made them equal.
#[test]
fn render_version_cases() {
    let Some(base) = shared() else { return };
    let root = base.join("../versions");
    check_suite(&root, "versions");
    let names = case_names(&root);
    assert!(
        names.len() >= 3,
        "v1.20, v1.24 and v1.28 at least: {names:?}"
    );
    for n in &names {
        let dir = root.join(n);
        let mut case = yaml(&dir.join("case.yaml"));
        let version = text_of(get(&case, &["kube_proxy_version"]))
            .unwrap_or_else(|| panic!("{n}: case.yaml has no kube_proxy_version"));
        let golden = canon(&render_dir(&dir, &case, false).to_restore_text(), n);
        if let Some(Value::Object(counters)) = case
            .get_mut("harness")
            .and_then(|h| h.get_mut("nfacct_counters"))
        {
            for v in counters.values_mut() {
                *v = Value::String("true".into());
            }
        }
        let own = canon(&render_dir(&dir, &case, false).to_restore_text(), n);
        assert_eq!(
            own, golden,
            "{n}: kube-proxy {version} used nfacct counters"
        );
        if let Value::Object(m) = &mut case {
            m.remove("kube_proxy_version");
        }
        let newest = canon(&render_dir(&dir, &case, false).to_restore_text(), n);
        assert_ne!(
            own, newest,
            "{n}: kube-proxy {version} renders what the newest release renders"
        );
    }
}

/// Normalises a ruleset for comparing our `--with-base-jumps` output with the packet-flow files,
/// which are FakeIPTables dumps: quotes dropped (the fake stores comments unquoted), built-in
/// chain policies and KUBE-PROXY-CANARY ignored, the mangle table dropped.
fn pf_norm(text: &str) -> String {
    let mut out = String::new();
    let mut skip = false;
    for l in text.lines() {
        let s = norm(&l.replace('"', ""));
        if let Some(t) = s.strip_prefix('*') {
            skip = t == "mangle";
        }
        if skip || s.is_empty() {
            continue;
        }
        if let Some(d) = s.strip_prefix(':') {
            let name = d.split(' ').next().unwrap_or("");
            if [
                "INPUT",
                "OUTPUT",
                "FORWARD",
                "PREROUTING",
                "POSTROUTING",
                "KUBE-PROXY-CANARY",
            ]
            .contains(&name)
            {
                continue;
            }
            out.push_str(&format!(":{name} - [0:0]\n"));
            continue;
        }
        out.push_str(&s);
        out.push('\n');
    }
    canon(&out, "packetflow")
}

#[test]
fn render_packetflow_inputs_match_rulesets() {
    let Some(base) = shared() else { return };
    let pf = base.join("packetflow");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&pf)
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let (mut total, mut misses) = (0, Vec::new());
    for f in &files {
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap_or_default())
            .unwrap_or(Value::Null);
        let Some(inputs) = doc.get("inputs").and_then(Value::as_str) else {
            println!(
                "  note: {} has no inputs (literal ruleset); not rendered",
                f.display()
            );
            continue;
        };
        total += 1;
        let dir = pf.join(inputs);
        let case = yaml(&dir.join("case.yaml"));
        let ours = render_dir(&dir, &case, true).to_restore_text();
        let want = doc.get("ruleset").and_then(Value::as_str).unwrap_or("");
        let (e, a) = (pf_norm(want), pf_norm(&ours));
        if e != a {
            misses.push(format!("{}: {}", f.display(), first_diff(&e, &a)));
        }
    }
    for m in &misses {
        println!("  MISS {m}");
    }
    println!(
        "packetflow inputs: {}/{} rulesets equal",
        total - misses.len(),
        total
    );
    // A directory without rendered cases (moved, renamed, emptied) checks nothing: a failure.
    assert!(
        total > 0,
        "{}: no packet-flow case with `inputs` to render ({} files)",
        pf.display(),
        files.len()
    );
    assert!(misses.is_empty());
}

mod cli {
    use assert_cmd::Command;
    use std::io::Write;

    fn bin() -> Command {
        Command::cargo_bin("kubectl-kproxy").unwrap_or_else(|e| panic!("{e}"))
    }

    fn file(text: &str, suffix: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::Builder::new()
            .suffix(suffix)
            .tempfile()
            .unwrap_or_else(|e| panic!("{e}"));
        f.write_all(text.as_bytes())
            .unwrap_or_else(|e| panic!("{e}"));
        f
    }

    const SVC: &str = r#"{"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"default"},
 "spec":{"type":"ClusterIP","clusterIP":"10.96.0.10","ports":[{"name":"http","port":80,"protocol":"TCP"}]}}"#;

    fn slice(extra: &str, addr: &str, port_name: &str) -> String {
        format!(
            r#"{{"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{{"name":"web-abc","namespace":"default"{extra}}},
 "addressType":"IPv4","ports":[{{"name":"{port_name}","port":8080,"protocol":"TCP"}}],
 "endpoints":[{{"addresses":["{addr}"],"conditions":{{"ready":true}}}}]}}"#
        )
    }

    const LABEL: &str = r#","labels":{"kubernetes.io/service-name":"web"}"#;

    fn list(items: &[&str]) -> String {
        format!(
            r#"{{"apiVersion":"v1","kind":"List","items":[{}]}}"#,
            items.join(",")
        )
    }

    #[test]
    fn malformed_json_is_an_error_with_position_and_no_output() {
        let f = file(
            "{\"kind\": \"List\",\n \"items\": [\n  {\"kind\": }\n]}",
            ".json",
        );
        let out = bin()
            .args(["render", "--node", "n1", "--state"])
            .arg(f.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.status.code(), Some(2));
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&format!("{}:3:", f.path().display())), "{err}");
    }

    #[test]
    fn wrong_field_type_names_object_and_field() {
        let f = file(
            &list(&[&SVC.replace("\"port\":80", "\"port\":\"eighty\"")]),
            ".json",
        );
        let out = bin()
            .args(["render", "--node", "n1", "--state"])
            .arg(f.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.status.code(), Some(2));
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Service default/web") && err.contains("spec.ports[0].port"),
            "{err}"
        );
    }

    #[test]
    fn slice_without_service_label_is_skipped_with_warning() {
        let f = file(&list(&[SVC, &slice("", "10.0.0.5", "http")]), ".json");
        let out = bin()
            .args(["render", "--node", "n1", "--state"])
            .arg(f.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.status.code(), Some(0));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.matches("warning:").count(), 1, "{err}");
        assert!(
            err.contains("EndpointSlice default/web-abc")
                && err.contains("kubernetes.io/service-name"),
            "{err}"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.contains("\"default/web:http has no endpoints\""),
            "{stdout}"
        );
    }

    #[test]
    fn unmatched_port_name_and_wrong_family_address_warn() {
        let f = file(&list(&[SVC, &slice(LABEL, "10.0.0.5", "metrics")]), ".json");
        let out = bin()
            .args(["render", "--node", "n1", "--state"])
            .arg(f.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0));
        assert!(
            err.contains("\"metrics\"/TCP matches no port of Service default/web"),
            "{err}"
        );

        let f = file(&list(&[SVC, &slice(LABEL, "fd00::5", "http")]), ".json");
        let out = bin()
            .args(["render", "--node", "n1", "--state"])
            .arg(f.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0));
        assert!(err.contains("\"fd00::5\" is not IPv4"), "{err}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("fd00::5"));
    }

    #[test]
    fn unknown_type_and_invalid_cluster_ip_skip_the_service() {
        let bad_type = SVC.replace("\"ClusterIP\"", "\"Weird\"");
        let bad_ip = SVC
            .replace("10.96.0.10", "10.96.0.999")
            .replace("\"web\"", "\"web2\"");
        let f = file(&list(&[&bad_type, &bad_ip]), ".json");
        let out = bin()
            .args(["render", "--node", "n1", "--state"])
            .arg(f.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.status.code(), Some(0));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Service default/web: unknown spec.type \"Weird\""),
            "{err}"
        );
        assert!(
            err.contains("Service default/web2: cluster IP \"10.96.0.999\""),
            "{err}"
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("default/web"));
    }

    #[test]
    fn yaml_stdin_and_json_output() {
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: default}\nspec:\n  clusterIP: 10.96.0.10\n  ports: [{name: http, port: 80}]\n---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-abc\n  namespace: default\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports: [{name: http, port: 8080}]\nendpoints:\n- addresses: [10.0.0.5]\n";
        let out = bin()
            .args(["render", "--node", "n1", "--state", "-", "-o", "json"])
            .write_stdin(y)
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}"));
        let nat = v["tables"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["name"] == "nat"))
            .cloned()
            .unwrap_or_default();
        let dnat = nat["rules"]
            .as_array()
            .map(|r| {
                r.iter().any(|r| {
                    r["args"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|w| w == "10.0.0.5:8080"))
                })
            })
            .unwrap_or(false);
        assert!(dnat, "{nat}");
    }

    #[test]
    fn bad_config_is_an_error_naming_field_and_file() {
        let s = file(&list(&[SVC]), ".json");
        let c = file(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\niptables:\n  masqueradeAll: maybe\n",
            ".yaml",
        );
        let out = bin()
            .args(["render", "--node", "n1", "--state"])
            .arg(s.path())
            .arg("--config")
            .arg(c.path())
            .output()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(out.status.code(), Some(2));
        assert!(out.stdout.is_empty());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("iptables.masqueradeAll") && err.contains(&c.path().display().to_string()),
            "{err}"
        );
    }
}

/// The rendered rules work: `render --with-base-jumps` restored on its own into a fresh node
/// namespace (nf_tables backend) sends real connections to the pods, masquerades off-cluster
/// clients, serves the NodePort, and REJECTs a service without endpoints. Root only.
mod netns {
    use crate::support::netns::{Backend, Pod, Topology, addr, require_root_and_tools};
    use kproxy::proxier::iptables::{RenderOptions, render};
    use kproxy::state::config::ProxyConfig;
    use kproxy::state::ip::IpFamily;
    use kproxy::state::load;
    use kproxy::state::node::NodeFacts;
    use std::io::ErrorKind;

    const STATE: &str = r#"{"apiVersion":"v1","kind":"List","items":[
 {"apiVersion":"v1","kind":"Service","metadata":{"name":"web","namespace":"default"},
  "spec":{"type":"NodePort","clusterIP":"172.30.0.10","ports":[{"name":"http","port":80,"protocol":"TCP","nodePort":30080}],
          "externalTrafficPolicy":"Cluster"}},
 {"apiVersion":"v1","kind":"Service","metadata":{"name":"empty","namespace":"default"},
  "spec":{"type":"ClusterIP","clusterIP":"172.30.0.11","ports":[{"port":80,"protocol":"TCP"}]}},
 {"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice",
  "metadata":{"name":"web-1","namespace":"default","labels":{"kubernetes.io/service-name":"web"}},
  "addressType":"IPv4","ports":[{"name":"http","port":8080,"protocol":"TCP"}],
  "endpoints":[{"addresses":["10.244.1.5"],"conditions":{"ready":true}},
               {"addresses":["10.244.2.7"],"conditions":{"ready":true}}]}
]}"#;

    #[test]
    fn rendered_rules_route_real_traffic() {
        let backend = Backend::Nft;
        if !require_root_and_tools(&backend.tools()) {
            return;
        }
        let topo = Topology::builder("render")
            .pod(Pod::new("pod-a", "10.244.1.5").tcp(8080))
            .pod(Pod::new("pod-b", "10.244.2.7").tcp(8080))
            .build()
            .expect("topology");
        let state = load::from_str(STATE, "state.json").expect("state");
        let config = ProxyConfig {
            cluster_cidrs: vec!["10.244.0.0/16".into()],
            ..ProxyConfig::default()
        };
        let mut facts = NodeFacts::new("node-1", IpFamily::V4);
        facts.node_ips = vec![topo.node_ip()];
        facts.nfacct_ct_state_invalid = false;
        facts.nfacct_localhost_nodeports = false;
        let rules = render(
            &state,
            &config,
            &facts,
            RenderOptions {
                with_base_jumps: true,
            },
        )
        .to_restore_text();
        topo.node()
            .restore(backend, &rules, false)
            .expect("restore of the render");

        let tally = topo
            .client()
            .connect_many(&Default::default(), addr("172.30.0.10:80"), 40)
            .expect("cluster IP");
        assert_eq!(tally.ok(), 40, "{tally:?}");
        assert!(
            tally.count("pod-a") > 0 && tally.count("pod-b") > 0,
            "{tally:?}"
        );
        assert!(
            !tally.peers.contains_key(&topo.client_ip()),
            "off-cluster client must be masqueraded: {tally:?}"
        );

        let node_port = std::net::SocketAddr::new(topo.node_ip(), 30080);
        let r = topo.client().connect(node_port).expect("node port");
        assert!(r.server == "pod-a" || r.server == "pod-b", "{r:?}");

        let refused = topo
            .client()
            .connect(addr("172.30.0.11:80"))
            .expect_err("no endpoints");
        assert_eq!(refused.kind(), ErrorKind::ConnectionRefused, "{refused}");
    }
}

/// Concatenates a render table by table and kind: (table, declarations?) → text.
fn by_table_and_kind(r: &Rendered) -> Vec<(String, bool, String)> {
    let mut out = Vec::new();
    for t in &r.tables {
        let chains: String = t
            .chains()
            .map(|(n, p)| format!(":{n} {p} [0:0]\n"))
            .collect();
        let rules: String = t.rules().map(|l| format!("{l}\n")).collect();
        out.push((t.name.to_string(), true, chains));
        out.push((t.name.to_string(), false, rules));
    }
    out
}

/// The streamed render (`render_decisions_chunks`, what verify reads) hands out exactly the lines of
/// the render, in order per table and kind: every conformance case, and a 2,000-service state
/// whose render (~7 MB) spans many chunks.
#[test]
fn streamed_render_is_the_render() {
    use kproxy::proxier::iptables::{
        expected_service_ports, render_decisions, render_decisions_chunks,
    };
    let mut inputs: Vec<(
        String,
        kproxy::state::ClusterState,
        config::ProxyConfig,
        node::NodeFacts,
    )> = Vec::new();
    if let Some(base) = shared() {
        let root = base.join("render");
        for e in std::fs::read_dir(&root)
            .unwrap_or_else(|e| panic!("{e}"))
            .flatten()
        {
            let dir = e.path();
            let Ok(case) = std::fs::read_to_string(dir.join("case.yaml")) else {
                continue;
            };
            let case: Value = serde_saphyr::from_str(&case).unwrap_or_else(|e| panic!("{e}"));
            let state =
                load::from_files(&[dir.join("state.json")]).unwrap_or_else(|e| panic!("{e}"));
            let cfg_text =
                std::fs::read_to_string(dir.join("config.yaml")).unwrap_or_else(|e| panic!("{e}"));
            let (cfg, _) =
                config::parse(&cfg_text, "config.yaml").unwrap_or_else(|e| panic!("{e}"));
            let (facts, _) =
                node::build(&harness_args(&case), &state, &cfg).unwrap_or_else(|e| panic!("{e}"));
            inputs.push((dir.display().to_string(), state, cfg, facts));
        }
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let Some(python) = crate::support::tool("render", "python3") else {
        return;
    };
    let generated = std::process::Command::new(python)
        .arg(root.join("testdata/gen-scale-state.py"))
        .args(["2000", "10"])
        .output()
        .expect("python3 runs testdata/gen-scale-state.py");
    assert!(generated.status.success(), "gen-scale-state.py failed");
    let text = String::from_utf8(generated.stdout).expect("utf-8");
    let state = load::from_str(&text, "generated.json").unwrap_or_else(|e| panic!("{e}"));
    let cfg_text =
        std::fs::read_to_string(root.join("testdata/cluster/config.yaml")).expect("config");
    let (cfg, _) = config::parse(&cfg_text, "config.yaml").unwrap_or_else(|e| panic!("{e}"));
    let args = NodeInputs {
        family: Some(IpFamily::V4),
        node: Some("node-1".into()),
        ..NodeInputs::default()
    };
    let (facts, _) = node::build(&args, &state, &cfg).unwrap_or_else(|e| panic!("{e}"));
    inputs.push(("generated 2000x10".into(), state, cfg, facts));
    let mut chunks_seen = 0;
    for (name, state, cfg, facts) in &inputs {
        let plan = expected_service_ports(state, cfg, facts);
        let whole = by_table_and_kind(&render_decisions(&plan, facts, RenderOptions::default()));
        let mut streamed: Vec<(String, bool, String)> = whole
            .iter()
            .map(|(t, d, _)| (t.clone(), *d, String::new()))
            .collect();
        chunks_seen = 0;
        render_decisions_chunks(&plan, facts, &mut |c| {
            chunks_seen += 1;
            let slot = streamed
                .iter_mut()
                .find(|(t, d, _)| t == c.table && *d == c.declarations)
                .expect("a table of the render");
            slot.2.push_str(c.text);
        });
        assert_eq!(streamed, whole, "{name}");
    }
    // The last input (7 MB of rules) came in chunks of about 1 MiB, not whole.
    assert!(chunks_seen > 6, "{chunks_seen} chunks");
}
