//! IPVS mode: parsers on every shared sample, `render --mode ipvs` against the conformance cases,
//! verify round trips and seeded drifts, and the real-kernel dumps in `testdata/ipvs/`.

use crate::support::ipvs::{case_inputs, missing_vm_tools, shared_ipvs, testdata_ipvs};
use kproxy::proxier::ipvs::{self, ExpectedIpvs, IpvsNode, IpvsOptions};
use kproxy::state::ip::IpFamily;
use kproxy::state::{self, ClusterState};
use kproxy_parsers::{ipset, ipvsadm};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A real dump file of a case (or drift) folder. `ipvsadm -Ln` read back in the VM that is
/// byte-identical to the case's `../shared/conformance/ipvs/<case>/expected.ipvsadm` is not stored
/// (`make-ipvs-dumps.sh` drops it): it is read from `../shared` instead.
fn dump_path(dir: &Path, name: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    if p.exists() || name != "ipvsadm-Ln.txt" {
        return p;
    }
    let case_dir = if dir.join("render-args.txt").exists() {
        dir
    } else {
        dir.parent().unwrap_or(dir)
    };
    let case = case_dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/conformance/ipvs")
        .join(case)
        .join("expected.ipvsadm")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `node: name:` from a case.yaml (block style).
fn case_node(case_yaml: &str) -> String {
    let mut in_node = false;
    for l in case_yaml.lines() {
        if l.starts_with("node:") {
            in_node = true;
            continue;
        }
        if in_node {
            if !l.starts_with(' ') {
                break;
            }
            if let Some(v) = l.trim().strip_prefix("name:") {
                return v.split('#').next().unwrap_or("").trim().to_string();
            }
        }
    }
    "test-node".into()
}

/// Renders a case directory for `family`.
fn render_case(dir: &Path, family: IpFamily) -> ExpectedIpvs {
    let st: ClusterState = state::load::from_files(&[dir.join("state.json")]).expect("state");
    let (cfg, _) =
        state::config::parse(&read(&dir.join("config.yaml")), "config.yaml").expect("config");
    let node = IpvsNode::from_state(&st, &case_node(&read(&dir.join("case.yaml"))), &[]);
    ipvs::render(&st, &cfg, &node, family, &IpvsOptions::default())
}

fn case_family(exp: &Value) -> IpFamily {
    match exp["proxier_families"][0].as_str() {
        Some("IPv6") => IpFamily::V6,
        _ => IpFamily::V4,
    }
}

type VsNorm = BTreeMap<(String, String, u64), (String, Option<u64>, Vec<(String, u64, i64)>)>;

fn norm_json(vs: &Value) -> VsNorm {
    let mut m = BTreeMap::new();
    for v in vs.as_array().into_iter().flatten() {
        let mut rs: Vec<(String, u64, i64)> = v["real_servers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                (
                    r["address"].as_str().unwrap_or("").to_string(),
                    r["port"].as_u64().unwrap_or(0),
                    r["weight"].as_i64().unwrap_or(1),
                )
            })
            .collect();
        rs.sort();
        m.insert(
            (
                v["protocol"].as_str().unwrap_or("").to_uppercase(),
                v["address"].as_str().unwrap_or("").to_string(),
                v["port"].as_u64().unwrap_or(0),
            ),
            (
                v["scheduler"].as_str().unwrap_or("").to_string(),
                v["persistent_timeout_s"].as_u64(),
                rs,
            ),
        );
    }
    m
}

fn sets_of(v: &Value) -> BTreeMap<String, BTreeSet<String>> {
    v.as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| {
            (
                k.clone(),
                v.as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|e| e.as_str().map(String::from))
                    .collect(),
            )
        })
        .collect()
}

fn case_dirs(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.join("case.yaml").is_file());
    v.sort();
    v
}

/// `render --mode ipvs` matches every conformance case: virtual servers, real servers, asserted and
/// derived ipsets, kube-ipvs0 addresses and (where given) the iptables payload.
#[test]
fn ipvs_conformance_cases() {
    let Some(root) = shared_ipvs() else { return };
    let cases = case_dirs(&root);
    let mut failures = Vec::new();
    for dir in &cases {
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_string();
        let exp: Value =
            serde_json::from_str(&read(&dir.join("expected.json"))).expect("expected.json");
        let got = render_case(dir, case_family(&exp));
        let got_json = serde_json::to_value(&got).expect("json");
        let mut why = Vec::new();
        let (e, a) = (
            norm_json(&exp["virtual_servers"]),
            norm_json(&got_json["virtual_servers"]),
        );
        if e != a {
            for k in e.keys().filter(|k| !a.contains_key(*k)) {
                why.push(format!("missing VS {k:?}"));
            }
            for k in a.keys().filter(|k| !e.contains_key(*k)) {
                why.push(format!("extra VS {k:?}"));
            }
            for (k, v) in &e {
                if let Some(av) = a.get(k)
                    && av != v
                {
                    why.push(format!("VS {k:?}: want {v:?} got {av:?}"));
                }
            }
        }
        let got_sets = sets_of(&got_json["ipsets"]);
        for key in ["ipsets", "ipsets_derived"] {
            for (set, want) in sets_of(&exp[key]) {
                let have = got_sets.get(&set).cloned().unwrap_or_default();
                if have != want {
                    why.push(format!("{key} {set}: want {want:?} got {have:?}"));
                }
            }
        }
        if key_nonempty_sets(&got_sets)
            != sets_of(&exp["ipsets_derived"])
                .keys()
                .cloned()
                .collect::<BTreeSet<_>>()
        {
            why.push(format!(
                "non-empty sets differ: got {:?}",
                key_nonempty_sets(&got_sets)
            ));
        }
        let want_addrs: BTreeSet<String> = exp["kube_ipvs0_addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(String::from))
            .collect();
        let got_addrs: BTreeSet<String> = got
            .kube_ipvs0_addresses
            .iter()
            .map(|a| a.to_string())
            .collect();
        if want_addrs != got_addrs {
            why.push(format!("kube-ipvs0: want {want_addrs:?} got {got_addrs:?}"));
        }
        if let Some(ipt) = exp["iptables"].as_str()
            && ipt != got.iptables
        {
            let diff = similar::TextDiff::from_lines(ipt, got.iptables.as_str())
                .unified_diff()
                .to_string();
            why.push(format!("iptables differ:\n{diff}"));
        }
        if !why.is_empty() {
            failures.push(format!("{name}: {}", why.join("; ")));
        }
    }
    println!(
        "ipvs: {}/{} cases",
        cases.len() - failures.len(),
        cases.len()
    );
    assert!(
        failures.is_empty(),
        "failing cases:\n{}",
        failures.join("\n")
    );
}

fn key_nonempty_sets(s: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    s.iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, _)| k.clone())
        .collect()
}

/// Every `expected.ipvsadm` parses and equals the case's expected virtual servers; every `formats/` and
/// `real-world/` sample parses.
#[test]
fn ipvs_every_sample_parses() {
    let Some(root) = shared_ipvs() else { return };
    let mut n = 0;
    for dir in case_dirs(&root) {
        let text = read(&dir.join("expected.ipvsadm"));
        let dump = ipvsadm::parse_dump(&text).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let exp: Value = serde_json::from_str(&read(&dir.join("expected.json"))).expect("json");
        let mut want = norm_json(&exp["virtual_servers"]);
        for (k, mut v) in norm_json(&exp["expected_remaining_foreign"]) {
            // Foreign services carry no scheduler in expected.json: any is fine.
            if v.0.is_empty() {
                v.0 = "rr".into();
            }
            want.insert(k, v);
        }
        let got: VsNorm = dump
            .merged_services()
            .iter()
            .filter_map(|s| match s.key {
                ipvsadm::ServiceKey::Inet {
                    protocol,
                    addr,
                    port,
                } => {
                    let mut rs: Vec<(String, u64, i64)> = s
                        .real_servers
                        .iter()
                        .map(|r| {
                            (
                                r.addr.to_string(),
                                u64::from(r.port),
                                i64::from(r.weight.unwrap_or(1)),
                            )
                        })
                        .collect();
                    rs.sort();
                    Some((
                        (
                            protocol.as_str().to_string(),
                            addr.to_string(),
                            u64::from(port),
                        ),
                        (
                            s.scheduler.unwrap_or("").to_string(),
                            s.persistent.map(u64::from),
                            rs,
                        ),
                    ))
                }
                ipvsadm::ServiceKey::Fwmark { .. } => None,
            })
            .collect();
        assert_eq!(got, want, "{}", dir.display());
        n += 1;
    }
    for sub in ["formats", "real-world"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join(sub))
            .expect("dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        files.sort();
        for f in files {
            let name = f
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("")
                .to_string();
            if !name.ends_with(".txt") || name.starts_with("proc-net") {
                continue;
            }
            let text = read(&f);
            if name.starts_with("ipset") {
                let sets = ipset::parse_ipset(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
                assert!(!sets.is_empty(), "{name}");
            } else if name.starts_with("R-input") {
                continue;
            } else if name.starts_with("L-names") {
                // Without -n: names instead of numbers must be a positioned error, not a guess.
                let e =
                    ipvsadm::parse_dump(&text).expect_err("non-numeric listing must be rejected");
                assert_eq!((e.line, e.col), (4, 6), "{e}");
            } else {
                ipvsadm::parse_dump(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            n += 1;
        }
    }
    println!("ipvs: {n} samples parsed");
}

/// The `ipvsadm -Ln` text we generate is byte-identical to the constructed `expected.ipvsadm`
/// (ipvsadm's sort order and padding), for the cases without pre-existing foreign services.
#[test]
fn ipvs_list_text_is_byte_exact() {
    let Some(root) = shared_ipvs() else { return };
    let mut n = 0;
    for dir in case_dirs(&root) {
        let exp: Value = serde_json::from_str(&read(&dir.join("expected.json"))).expect("json");
        if exp.get("expected_remaining_foreign").is_some() {
            continue;
        }
        let got = render_case(&dir, case_family(&exp)).to_ipvsadm_list();
        let want = read(&dir.join("expected.ipvsadm"));
        assert_eq!(got, want, "{}", dir.display());
        n += 1;
    }
    println!("ipvs: {n} expected.ipvsadm texts reproduced byte for byte");
}

fn ids(f: &[kproxy::compare::Finding]) -> Vec<&'static str> {
    f.iter().map(|f| f.id).collect()
}

fn jumps() -> String {
    let mut s = String::from("*nat\n");
    for (t, from, to, c) in ipvs::iptables::JUMPS {
        if *t == "nat" {
            s.push_str(&format!("-A {from} -m comment --comment \"{c}\" -j {to}\n"));
        }
    }
    s.push_str("COMMIT\n*filter\n");
    for (t, from, to, c) in ipvs::iptables::JUMPS {
        if *t == "filter" {
            s.push_str(&format!("-A {from} -m comment --comment \"{c}\" -j {to}\n"));
        }
    }
    s.push_str("COMMIT\n");
    s
}

fn verify_texts(
    exp: &ExpectedIpvs,
    ipvsadm_text: &str,
    ipset_text: &str,
    ipt: &str,
) -> Vec<kproxy::compare::Finding> {
    use kproxy::compare::ipvs::{ActualIpvs, verify};
    let actual = ActualIpvs {
        dump: ipvsadm::parse_dump(ipvsadm_text).expect("ipvsadm"),
        ipsets: Some(ipset::parse_ipset(ipset_text).expect("ipset")),
        iptables_save: Some(ipt),
        kube_ipvs0: Some(exp.kube_ipvs0_addresses.clone()),
    };
    verify(exp, &actual)
}

/// verify(render, the dumps render implies) is clean for every case, and seeded drifts are each
/// reported exactly once with the right ID.
#[test]
fn ipvs_verify_round_trip_and_seeded_drifts() {
    let Some(root) = shared_ipvs() else { return };
    let mut seeded = 0;
    for dir in case_dirs(&root) {
        let exp_json: Value =
            serde_json::from_str(&read(&dir.join("expected.json"))).expect("json");
        let exp = render_case(&dir, case_family(&exp_json));
        let ln = exp.to_ipvsadm_list();
        let sets = exp.to_ipset_save();
        let ipt = format!("{}{}", exp.iptables, jumps());
        let clean = verify_texts(&exp, &ln, &sets, &ipt);
        assert!(clean.is_empty(), "{}: {clean:#?}", dir.display());
        // The save form is equivalent.
        assert!(
            verify_texts(&exp, &exp.to_ipvsadm_save(), &sets, &ipt).is_empty(),
            "{}",
            dir.display()
        );

        let lines: Vec<&str> = ln.lines().collect();
        // 1. remove a real server
        if let Some(i) = lines
            .iter()
            .position(|l| l.starts_with("  -> ") && !l.contains("RemoteAddress"))
        {
            let mut m = lines.clone();
            m.remove(i);
            assert_eq!(
                ids(&verify_texts(&exp, &(m.join("\n") + "\n"), &sets, &ipt)),
                ["KP505"],
                "{}",
                dir.display()
            );
            // 2b. the same real server at weight 0
            let zero = lines[i].replacen("Masq    1 ", "Masq    0 ", 1);
            let text = lines
                .iter()
                .enumerate()
                .map(|(j, l)| if j == i { zero.as_str() } else { l })
                .collect::<Vec<_>>()
                .join("\n")
                + "\n";
            assert_eq!(
                ids(&verify_texts(&exp, &text, &sets, &ipt)),
                ["KP509"],
                "{}",
                dir.display()
            );
            seeded += 2;
        }
        // 2. leave a weight-0 real server of a gone endpoint (no connections, then with connections)
        if let Some(i) = lines
            .iter()
            .position(|l| l.starts_with("TCP  ") || l.starts_with("UDP  "))
        {
            let v6 = lines[i].contains('[');
            let ghost = if v6 {
                "[fd00:dead::1]:8080"
            } else {
                "10.255.255.254:8080"
            };
            for (conns, want) in [
                ("0          0         ", "KP507"),
                ("3          1         ", "KP508"),
            ] {
                let mut m: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
                m.insert(i + 1, format!("  -> {ghost:<28} Masq    0      {conns}"));
                assert_eq!(
                    ids(&verify_texts(&exp, &(m.join("\n") + "\n"), &sets, &ipt)),
                    [want],
                    "{}",
                    dir.display()
                );
                seeded += 1;
            }
            // 3. change the scheduler
            let mut m: Vec<String> = lines.iter().map(|s| s.to_string()).collect();
            m[i] = m[i].replacen(" rr", " wrr", 1);
            assert_eq!(
                ids(&verify_texts(&exp, &(m.join("\n") + "\n"), &sets, &ipt)),
                ["KP503"],
                "{}",
                dir.display()
            );
            seeded += 1;
        }
        // 3b. iptables-mode chains left over from a mode switch
        let leftover = ipt.replacen("*nat\n", "*nat\n:KUBE-SVC-ABCDEFGHIJKLMNOP - [0:0]\n", 1);
        assert_eq!(
            ids(&verify_texts(&exp, &ln, &sets, &leftover)),
            ["KP519"],
            "{}",
            dir.display()
        );
        seeded += 1;
        // 4. drop an ipset entry
        let set_lines: Vec<&str> = sets.lines().collect();
        if let Some(i) = set_lines.iter().position(|l| l.starts_with("add ")) {
            let mut m = set_lines.clone();
            m.remove(i);
            assert_eq!(
                ids(&verify_texts(&exp, &ln, &(m.join("\n") + "\n"), &ipt)),
                ["KP512"],
                "{}",
                dir.display()
            );
            seeded += 1;
        }
    }
    println!("ipvs: {seeded} seeded drifts each reported exactly");
}

/// Renders the expected state of a real-dump directory (`render-args.txt`: `--node N --ip-family F`;
/// state and config are the shared conformance case of the same name).
fn render_real(case_dir: &Path, root: &Path) -> ExpectedIpvs {
    let args = read(&case_dir.join("render-args.txt"));
    let a: Vec<&str> = args.lines().collect();
    let node = a
        .iter()
        .position(|x| *x == "--node")
        .and_then(|i| a.get(i + 1))
        .copied()
        .unwrap_or("test-node");
    let fam = if a
        .iter()
        .position(|x| *x == "--ip-family")
        .and_then(|i| a.get(i + 1))
        == Some(&"6")
    {
        IpFamily::V6
    } else {
        IpFamily::V4
    };
    let (state_path, config_path) = case_inputs(case_dir, root);
    let st = state::load::from_files(&[state_path]).expect("state");
    let (cfg, _) = state::config::parse(&read(&config_path), "config.yaml").expect("config");
    ipvs::render(
        &st,
        &cfg,
        &IpvsNode::from_state(&st, node, &[]),
        fam,
        &IpvsOptions::default(),
    )
}

/// Verifies one set of real dumps (a case directory or one of its `drift-*` directories).
fn verify_real(
    exp: &ExpectedIpvs,
    dir: &Path,
    ipvsadm_files: &[&str],
) -> Vec<kproxy::compare::Finding> {
    use kproxy::compare::ipvs::{ActualIpvs, verify};
    use kproxy::parsers::ip_addr::interface_addresses;
    use kproxy::proxier::ipvs::DUMMY_DEVICE;
    let ipvsadm_text: String = ipvsadm_files
        .iter()
        .map(|f| read(&dump_path(dir, f)))
        .collect();
    let sets = read(&dir.join("ipset-save.txt"));
    let ipt = read(&dir.join("iptables-save.txt"));
    let addrs = read(&dir.join("ip-addr-kube-ipvs0.txt"));
    let actual = ActualIpvs {
        dump: ipvsadm::parse_dump(&ipvsadm_text)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
        ipsets: Some(
            ipset::parse_ipset(&sets).unwrap_or_else(|e| panic!("{}: {e}", dir.display())),
        ),
        iptables_save: Some(&ipt),
        kube_ipvs0: Some(interface_addresses(&addrs, DUMMY_DEVICE)),
    };
    verify(exp, &actual)
}

/// The drift each `drift-NAME` directory was made with (real commands, see `drifts.sh`), and the one
/// finding verify must report for it.
const DRIFTS: &[(&str, &str)] = &[
    ("drift-rs-removed", "KP505"),
    ("drift-rs-weight0", "KP509"),
    ("drift-ghost-weight0", "KP507"),
    ("drift-scheduler", "KP503"),
    ("drift-ipset-entry", "KP512"),
    ("drift-kube-ipvs0-addr", "KP515"),
    ("drift-iptables-rule", "KP517"),
    ("drift-stale-vs", "KP502"),
];

/// Checks every case directory under `dumps`: clean on the base dumps (each ipvsadm form), exactly the
/// seeded finding on each drift. Returns (clean checks, drifts checked).
fn check_real_dumps(dumps: &Path, root: &Path) -> (usize, usize) {
    let (mut clean, mut drifts) = (0, 0);
    for dir in case_dirs_with(dumps, "render-args.txt") {
        let exp = render_real(&dir, root);
        for files in [
            &["ipvsadm-Ln.txt"][..],
            &["ipvsadm-Sn.txt"],
            &[
                "ipvsadm-Sn.txt",
                "ipvsadm-Ln-stats.txt",
                "ipvsadm-Lnc.txt",
                "ipvsadm-timeout.txt",
            ],
        ] {
            let f = verify_real(&exp, &dir, files);
            assert!(f.is_empty(), "{} {files:?}: {f:#?}", dir.display());
            clean += 1;
        }
        for (name, id) in DRIFTS {
            let d = dir.join(name);
            if !d.is_dir() {
                continue;
            }
            let f = verify_real(&exp, &d, &["ipvsadm-Ln.txt"]);
            assert_eq!(ids(&f), [*id], "{}: {f:#?}", d.display());
            drifts += 1;
        }
    }
    (clean, drifts)
}

fn case_dirs_with(root: &Path, marker: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|r| r.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.join(marker).is_file());
    v.sort();
    v
}

/// verify is clean on the real kernel dumps checked into `testdata/ipvs/` and reports each drift that
/// was seeded there with real ipvsadm/ipset/ip/iptables commands exactly.
#[test]
fn ipvs_real_kernel_dumps_checked_in() {
    let Some(root) = shared_ipvs() else { return };
    let (clean, drifts) = check_real_dumps(&testdata_ipvs(), &root);
    assert!(
        clean >= 12 && drifts >= 30,
        "too few real dumps: {clean} clean checks, {drifts} drifts"
    );
    println!(
        "ipvs: real dumps: {clean} clean verifications, {drifts} seeded drifts reported exactly"
    );
}

/// End to end on a real IPVS kernel: installs kube-proxy's expected state for a case inside a VM with
/// real commands, reads it back, seeds drifts, and verifies the fresh dumps.
#[test]
fn ipvs_real_kernel_live_vm() {
    let Some(root) = shared_ipvs() else { return };
    if let Some(why) = missing_vm_tools(&["python3"]) {
        crate::support::skip("ipvs", &format!("the IPVS VM test: {why}"));
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let status = std::process::Command::new("bash")
        .arg(testdata_ipvs().join("make-ipvs-dumps.sh"))
        .arg(tmp.path())
        .arg("only-local-nodeports")
        .env("KPROXY_BIN", env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .env("KPROXY_SHARED", root.join("../.."))
        .status()
        .expect("running make-ipvs-dumps.sh");
    assert!(status.success(), "make-ipvs-dumps.sh failed");
    let (clean, drifts) = check_real_dumps(tmp.path(), &root);
    assert_eq!(
        (clean, drifts),
        (3, DRIFTS.len()),
        "the VM run did not produce every dump"
    );
    println!("ipvs: live VM: {clean} clean verifications, {drifts} seeded drifts reported exactly");
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { failure_persistence: None, ..Default::default() })]
    /// Arbitrary text never panics the ipvsadm or ipset parsers (it parses or errors with a position).
    #[test]
    fn ipvs_parsers_never_panic(text in "(IP Virtual Server version 1.2.1 \\(size=4096\\)\n|Prot LocalAddress:Port Scheduler Flags\n|TCP  10.0.0.1:80 rr\n|  -> 10.0.0.2:80 Masq 1 0 0\n|-A -t 10.0.0.1:80 -s rr\n|IPVS connection entries\n|create S hash:ip\n|add S 1.2.3.4\nMembers:\n|[ -~]{0,40}\n){0,12}") {
        if let Err(e) = ipvsadm::parse_dump(&text) {
            proptest::prop_assert!(e.line >= 1 && e.col >= 1);
        }
        if let Err(e) = ipset::parse_ipset(&text) {
            proptest::prop_assert!(e.line >= 1 && e.col >= 1);
        }
    }
}

/// The CLI on real dumps: `verify` exits 0 on the clean node and 1 with the drift's ID on a drifted one;
/// `graph` and `trace` read the same dumps; `render --mode ipvs -o text` is the `-Sn` form.
#[test]
fn ipvs_cli_on_real_dumps() {
    let Some(root) = shared_ipvs() else { return };
    let case = "constructed-kind-worker-example";
    let d = testdata_ipvs().join(case);
    let s = root.join(case);
    let run = |dir: &Path| {
        assert_cmd::Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
            .args(["verify", "--node", "kind-worker", "-o", "json"])
            .arg("--state")
            .arg(s.join("state.json"))
            .arg("--config")
            .arg(s.join("config.yaml"))
            .arg("--ipvsadm")
            .arg(dump_path(dir, "ipvsadm-Ln.txt"))
            .arg("--ipset")
            .arg(dir.join("ipset-save.txt"))
            .arg("--iptables-save")
            .arg(dir.join("iptables-save.txt"))
            .arg("--ip-addr")
            .arg(dir.join("ip-addr-kube-ipvs0.txt"))
            .output()
            .expect("run verify")
    };
    let clean = run(&d);
    assert_eq!(
        clean.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&clean.stderr)
    );
    let report: Value = serde_json::from_slice(&clean.stdout).expect("json");
    assert_eq!(report["mode"], "ipvs");
    assert_eq!(report["findings"].as_array().map(Vec::len), Some(0));
    let drift = run(&d.join("drift-scheduler"));
    assert_eq!(drift.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&drift.stdout).expect("json");
    assert_eq!(report["findings"][0]["id"], "KP503");

    let graph = assert_cmd::Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args(["graph", "-o", "json"])
        .arg("--ipvsadm")
        .arg(dump_path(&d, "ipvsadm-Ln.txt"))
        .arg("--ipset")
        .arg(d.join("ipset-save.txt"))
        .output()
        .expect("graph");
    assert!(graph.status.success());
    let g: Value = serde_json::from_slice(&graph.stdout).expect("json");
    assert_eq!(g["virtual_servers"].as_array().map(Vec::len), Some(13));

    let trace = assert_cmd::Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args(["trace", "--vs", "10.96.0.10:53/udp"])
        .arg("--ipvsadm")
        .arg(dump_path(&d, "ipvsadm-Ln.txt"))
        .output()
        .expect("trace");
    let text = String::from_utf8_lossy(&trace.stdout);
    assert!(
        trace.status.success() && text.contains("10.244.0.3:53") && text.contains("50.0%"),
        "{text}"
    );

    let render = assert_cmd::Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args([
            "render",
            "--mode",
            "ipvs",
            "--node",
            "kind-worker",
            "-o",
            "text",
        ])
        .arg("--state")
        .arg(s.join("state.json"))
        .arg("--config")
        .arg(s.join("config.yaml"))
        .output()
        .expect("render");
    let text = String::from_utf8_lossy(&render.stdout).to_string();
    let rendered = ipvsadm::parse_dump(&text)
        .expect("render -o text parses")
        .merged_services();
    let real = read(&d.join("ipvsadm-Sn.txt"));
    let real = ipvsadm::parse_dump(&real)
        .expect("real -Sn")
        .merged_services();
    assert_eq!(rendered.len(), real.len());
    for (a, b) in rendered.iter().zip(real.iter()) {
        assert_eq!(
            (a.key, a.scheduler, a.persistent, a.real_servers.len()),
            (b.key, b.scheduler, b.persistent, b.real_servers.len())
        );
    }
}
