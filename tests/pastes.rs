//! What support work feeds the tool: cut, filtered, prefixed, mixed and oddly encoded pastes
//! (issue "read what people actually paste"). Every input is constructed here from the repo's
//! example dump, or made by real iptables in a network namespace.

use crate::support::netns::{Backend, Netns, require_root_and_tools};
use crate::support::{EXAMPLE_STATE, Run, kproxy, repo, run_with_files, service_names};

const DUMP: &str = "testdata/dumps/cluster.nft-c.save";
const STATE: [&str; 4] = EXAMPLE_STATE;

fn dump_text() -> String {
    std::fs::read_to_string(repo(DUMP)).expect("example dump")
}

fn run(args: &[&str], input: &[u8]) -> Run {
    run_with_files(args, &[input])
}

fn graph_json(args: &[&str], input: &[u8]) -> (serde_json::Value, String) {
    let mut all = vec!["graph", "-o", "json"];
    all.extend(args);
    let r = run(&all, input);
    assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
    (serde_json::from_str(&r.stdout).expect("json"), r.stderr)
}

/// The graph of the whole example dump: what every cleaned paste must give back.
fn whole_names() -> Vec<String> {
    service_names(&graph_json(&["--iptables-save", DUMP], b"").0)
}

#[test]
fn cut_dumps_warn_and_report_nothing_as_stale() {
    let text = dump_text();
    let lines: Vec<&str> = text.lines().collect();
    // Ends inside the nat table, before COMMIT, with the last rule cut mid-word.
    let last_sep = lines
        .iter()
        .rposition(|l| l.contains("-j KUBE-SEP-"))
        .expect("a SEP jump");
    let mut cut = lines[..last_sep].join("\n");
    let l = lines[last_sep];
    cut.push('\n');
    cut.push_str(&l[..l.find("-j KUBE-SEP-").expect("jump") + 12]);
    let r = run(
        &[
            "graph",
            "--lenient",
            "-o",
            "json",
            "--iptables-save",
            "FILE",
        ],
        cut.as_bytes(),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("ends before its COMMIT"), "{}", r.stderr);
    assert!(r.stderr.contains("is cut off"), "{}", r.stderr);
    let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    let anomalies = doc["graphs"][0]["anomalies"].as_array().expect("anomalies");
    assert!(
        !anomalies
            .iter()
            .any(|a| a["kind"] == "unreferenced-chain" || a["kind"] == "undeclared-jump"),
        "{anomalies:?}"
    );
    assert!(
        !doc["graphs"][0]["gaps"]
            .as_array()
            .expect("gaps")
            .is_empty()
    );
    // Strict mode refuses the cut dump with its position; verify refuses it even leniently.
    let strict = run(&["graph", "--iptables-save", "FILE"], cut.as_bytes());
    assert_eq!(strict.code, Some(2));
    assert!(
        strict.stderr.contains("expected `COMMIT`"),
        "{}",
        strict.stderr
    );
    let mut verify = vec!["verify", "node-1", "--lenient", "--iptables-save", "FILE"];
    verify.extend(STATE);
    let v = run(&verify, cut.as_bytes());
    assert_eq!(v.code, Some(2), "{}", v.stdout);
    assert!(v.stderr.contains("before its COMMIT"), "{}", v.stderr);
}

#[test]
fn filtered_pastes_say_they_are_partial() {
    let grep: String = dump_text()
        .lines()
        .filter(|l| l.contains("KUBE-SVC") || l.contains("KUBE-SEP"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (doc, stderr) = graph_json(&["--lenient", "--iptables-save", "FILE"], grep.as_bytes());
    assert!(stderr.contains("filtered paste"), "{stderr}");
    assert!(stderr.contains("read as table nat"), "{stderr}");
    let anomalies = doc["graphs"][0]["anomalies"].as_array().expect("anomalies");
    assert!(
        !anomalies.iter().any(|a| a["kind"] == "unreferenced-chain"),
        "{anomalies:?}"
    );
    assert!(!service_names(&doc).is_empty());
}

#[test]
fn prefixes_and_wrappers_are_stripped_with_one_warning_each() {
    let text = dump_text();
    let whole = whole_names();
    let prefixed =
        |prefix: &str| -> String { text.lines().map(|l| format!("{prefix}{l}\n")).collect() };
    let cases: Vec<(&str, String)> = vec![
        (
            "shell prompt",
            format!("[root@node-1 ~]# iptables-save\n{text}root@node-1:~# \n"),
        ),
        (
            "shell prompt",
            format!("user@host:~$ sudo iptables-save -c\n{text}"),
        ),
        ("shell prompt", format!("$ iptables-save\n{text}")),
        ("shell prompt", format!("# iptables-save\n{text}")),
        (
            "markdown code fences",
            format!("Here are my rules:\n```console\n{text}```\n"),
        ),
        (
            "HTML <details>",
            format!("<details>\n<summary>iptables-save</summary>\n\n```\n{text}```\n</details>\n"),
        ),
        ("block quote", prefixed("> ")),
        (
            "journald/syslog",
            prefixed("Nov 14 11:06:12 node-1 kube-proxy[123]: "),
        ),
        (
            "klog",
            prefixed("E1114 11:06:12.491680   12085 proxier.go:1282] "),
        ),
        ("unified diff", {
            let mut d = String::from("--- a/rules\n+++ b/rules\n@@ -1,300 +1,300 @@\n");
            d.push_str(&prefixed(" "));
            d
        }),
        (
            "JSON string",
            format!(
                "{{\"level\":\"error\",\"msg\":\"Failed to execute iptables-restore\",\"rules\":{}}}\n",
                serde_json::to_string(&text).expect("json")
            ),
        ),
    ];
    for (what, paste) in cases {
        let (doc, stderr) = graph_json(&["--lenient", "--iptables-save", "FILE"], paste.as_bytes());
        assert_eq!(service_names(&doc), whole, "{what}: {stderr}");
        assert!(stderr.contains(what), "{what}: {stderr}");
        let warnings = stderr.lines().filter(|l| l.contains(what)).count();
        assert_eq!(warnings, 1, "{what}: one warning per kind: {stderr}");
        // Strict mode fails on such input, at a line of the paste (a root prompt's `# ` line
        // is a comment to iptables-restore: that one paste reads strictly as well).
        let strict = run(&["graph", "--iptables-save", "FILE"], paste.as_bytes());
        if !paste.starts_with("# ") {
            assert_eq!(strict.code, Some(2), "{what}");
            assert!(
                strict.stderr.contains("paste.txt:"),
                "{what}: {}",
                strict.stderr
            );
        }
    }
}

#[test]
fn encodings_bom_latin1_and_nul() {
    let text = dump_text();
    let mut bom = b"\xEF\xBB\xBF".to_vec();
    bom.extend(text.as_bytes());
    let (doc, stderr) = graph_json(&["--iptables-save", "FILE"], &bom);
    assert!(stderr.contains("byte-order mark"), "{stderr}");
    assert_eq!(service_names(&doc), whole_names());
    // The filter table stays the filter table (a BOM once made `*filter` unrecognised).
    let r = run(&["graph", "-o", "wide", "--iptables-save", "FILE"], &bom);
    assert!(r.stdout.contains("REJECT"), "{}", r.stdout);

    let latin1 = text.replacen("\"shop/web:http\"", "\"shop/web:http caf\u{e9}\"", 1);
    let bytes: Vec<u8> = latin1
        .chars()
        .map(|c| if c == '\u{e9}' { 0xE9 } else { c as u8 })
        .collect();
    let line = text
        .lines()
        .position(|l| l.contains("\"shop/web:http\""))
        .expect("line")
        + 1;
    let (_, stderr) = graph_json(&["--iptables-save", "FILE"], &bytes);
    assert!(
        stderr.contains(&format!("not UTF-8 replaced by U+FFFD (line {line})")),
        "{stderr}"
    );

    let mut nul = text.clone().into_bytes();
    let at = text.find("-j KUBE-SERVICES").expect("jump") + 9;
    nul[at] = 0;
    let r = run(&["graph", "--iptables-save", "FILE"], &nul);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("NUL byte"), "{}", r.stderr);
    assert!(r.stderr.contains("\\0"), "the NUL is shown: {}", r.stderr);
    let r = run(&["graph", "--lenient", "--iptables-save", "FILE"], &nul);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("NUL bytes"), "{}", r.stderr);
}

#[test]
fn graph_and_trace_read_rule_only_input_as_the_same_table() {
    let rules: String = dump_text()
        .lines()
        .skip_while(|l| *l != "*nat")
        .take_while(|l| *l != "COMMIT")
        .filter(|l| l.contains("-A "))
        .map(|l| format!("{}\n", l.trim_start_matches(|c| c != '-')))
        .collect();
    let (doc, _) = graph_json(&["--lenient", "--iptables-save", "FILE"], rules.as_bytes());
    assert!(service_names(&doc).contains(&"shop/web:http".to_string()));
    let r = run(
        &[
            "trace",
            "-o",
            "json",
            "--iptables-save",
            "FILE",
            "--packet",
            "10.244.1.10->10.96.100.10:80/tcp",
        ],
        rules.as_bytes(),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("read as table nat"), "{}", r.stderr);
    assert!(r.stdout.contains("10.244.2.10"), "DNATed: {}", r.stdout);
    assert!(!r.stdout.contains("no nat table"), "{}", r.stdout);
}

#[test]
fn endpoint_chain_without_dnat_names_its_service_and_line() {
    // A whole dump that lost one endpoint's DNAT rule: the anomaly names the service and line.
    let text = dump_text();
    let dnat = text
        .lines()
        .find(|l| l.contains("-A KUBE-SEP") && l.contains("-j DNAT"))
        .expect("a DNAT rule");
    let without: String = text
        .lines()
        .filter(|l| *l != dnat)
        .map(|l| format!("{l}\n"))
        .collect();
    let (doc, _) = graph_json(&["--iptables-save", "FILE"], without.as_bytes());
    let anomalies = doc["graphs"][0]["anomalies"].as_array().expect("anomalies");
    let missing: Vec<_> = anomalies
        .iter()
        .filter(|a| a["kind"] == "missing-dnat")
        .collect();
    assert_eq!(missing.len(), 1, "{anomalies:?}");
    assert!(
        missing[0]["service"]
            .as_str()
            .is_some_and(|s| s.contains('/')),
        "{:?}",
        missing[0]
    );
    assert!(missing[0]["line"].as_u64().is_some(), "{:?}", missing[0]);
    // A paste of only the endpoint chains' masquerade rules (grep) lacks their DNAT rules: that
    // is what the paste lacks, not an anomaly of the node.
    let masq: String = text
        .lines()
        .filter(|l| l.contains("-A KUBE-SEP") && l.contains("KUBE-MARK-MASQ"))
        .map(|l| format!("{}\n", l.trim_start_matches(|c| c != '-')))
        .collect();
    let (doc, _) = graph_json(&["--lenient", "--iptables-save", "FILE"], masq.as_bytes());
    let g = &doc["graphs"][0];
    assert!(
        !g["anomalies"]
            .as_array()
            .expect("anomalies")
            .iter()
            .any(|a| a["kind"] == "missing-dnat"),
        "{g}"
    );
    assert!(!g["gaps"].as_array().expect("gaps").is_empty(), "{g}");
}

#[test]
fn empty_input_is_refused() {
    let mut verify = vec!["verify", "node-1", "--iptables-save", "FILE"];
    verify.extend(STATE);
    for args in [
        vec!["graph", "--iptables-save", "FILE"],
        vec![
            "trace",
            "--iptables-save",
            "FILE",
            "--packet",
            "10.0.0.1->10.96.0.1:80/tcp",
        ],
        verify,
    ] {
        for input in [&b""[..], b"\n\n  \n"] {
            let r = run(&args, input);
            assert_eq!(r.code, Some(2), "{args:?}: {}", r.stdout);
            assert!(r.stderr.contains("empty"), "{args:?}: {}", r.stderr);
        }
    }
}

#[test]
fn warnings_have_one_style_and_no_colour_off_a_terminal() {
    let paste = format!("$ iptables-save\n{}", dump_text());
    for args in [
        vec!["graph", "--lenient", "--iptables-save", "FILE"],
        vec![
            "trace",
            "--lenient",
            "--iptables-save",
            "FILE",
            "--packet",
            "10.244.1.10->10.96.100.10:80/tcp",
        ],
    ] {
        // Without NO_COLOR too: stderr is a pipe here.
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("p.txt");
        std::fs::write(&file, &paste).expect("write");
        let args: Vec<String> = args
            .iter()
            .map(|a| {
                if *a == "FILE" {
                    file.display().to_string()
                } else {
                    a.to_string()
                }
            })
            .collect();
        let out = kproxy()
            .args(&args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("NO_COLOR")
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains('\u{1b}'), "{args:?}: {stderr:?}");
        for line in stderr.lines() {
            assert!(line.starts_with("warning: "), "{args:?}: {line:?}");
        }
    }
}

#[test]
fn ipvsadm_and_ipset_pastes_are_read_leniently() {
    let Some(formats) = crate::support::shared("ipvs pastes", "conformance/ipvs/formats") else {
        return;
    };
    let ln = std::fs::read_to_string(formats.join("Ln.constructed.txt")).expect("Ln");
    let list = std::fs::read_to_string(formats.join("ipset-list.constructed.txt")).expect("list");
    let vs_count = |stdout: &str| {
        stdout
            .lines()
            .filter(|l| l.starts_with("TCP ") || l.starts_with("UDP "))
            .count()
    };
    let whole = run(&["graph", "--ipvsadm", "FILE"], ln.as_bytes());
    assert_eq!(whole.code, Some(0), "{}", whole.stderr);
    // Prompt, fence and a `...` cut.
    let paste = format!("```\n[root@node-1 ~]# ipvsadm -Ln\n{ln}...\n```\n");
    let strict = run(&["graph", "--ipvsadm", "FILE"], paste.as_bytes());
    assert_eq!(strict.code, Some(2));
    let r = run(
        &["graph", "--lenient", "--ipvsadm", "FILE"],
        paste.as_bytes(),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(vs_count(&r.stdout), vs_count(&whole.stdout), "{}", r.stdout);
    for what in ["shell prompt", "markdown", "cut"] {
        assert!(r.stderr.contains(what), "{what}: {}", r.stderr);
    }
    // Filtered by grep: no header lines.
    let grep: String = ln
        .lines()
        .filter(|l| l.contains("10.96."))
        .map(|l| format!("{l}\n"))
        .collect();
    let r = run(
        &["graph", "--lenient", "--ipvsadm", "FILE"],
        grep.as_bytes(),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("no header lines"), "{}", r.stderr);
    assert!(vs_count(&r.stdout) >= 4, "{}", r.stdout);
    // An `ipset list` cut before its declared number of entries.
    let cut: String = list.lines().take(10).map(|l| format!("{l}\n")).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let ipset = dir.path().join("ipset.txt");
    std::fs::write(&ipset, &cut).expect("write");
    let ln_file = formats.join("Ln.constructed.txt");
    let out = kproxy()
        .args(["graph", "--lenient", "--ipvsadm"])
        .arg(&ln_file)
        .arg("--ipset")
        .arg(&ipset)
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lists 2 of its 3 entries"), "{stderr}");
    // `--ipset` alone says what it goes with.
    let r = run(&["graph", "--ipset", "FILE"], cut.as_bytes());
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("go with --ipvsadm"), "{}", r.stderr);
}

/// A paste of three commands as a user makes it on a real node: `iptables -t nat -S` and
/// `iptables -S` of rules restored with real iptables, then `ipset list` and `ipvsadm -Ln`
/// output, with prompts between.
#[test]
fn a_paste_of_several_commands_is_read_part_by_part() {
    let Some(formats) = crate::support::shared("mixed paste", "conformance/ipvs/formats") else {
        return;
    };
    // kube-proxy's rules name its nfacct counters, which must exist before they restore.
    if !require_root_and_tools(&[&Backend::Nft.tools()[..], &["nfacct"]].concat()) {
        return;
    }
    let ns = Netns::new("paste").expect("netns");
    let rules = dump_text();
    ns.add_nfacct_counters(&rules).expect("nfacct counters");
    ns.restore(Backend::Nft, &rules, false).expect("restore");
    let nat = ns
        .iptables(Backend::Nft, &["-t", "nat", "-S"])
        .expect("nat -S");
    let filter = ns.iptables(Backend::Nft, &["-S"]).expect("-S");
    let list = std::fs::read_to_string(formats.join("ipset-list.constructed.txt")).expect("list");
    let ln = std::fs::read_to_string(formats.join("Ln.constructed.txt")).expect("Ln");
    let paste = format!(
        "[root@node-1 ~]# iptables -t nat -S\n{nat}[root@node-1 ~]# iptables -S\n{filter}[root@node-1 ~]# ipset list\n{list}[root@node-1 ~]# ipvsadm -Ln\n{ln}[root@node-1 ~]# exit\n"
    );
    for args in [
        vec!["graph", "--paste", "FILE", "-o", "json"],
        vec![
            "graph",
            "--lenient",
            "--iptables-save",
            "FILE",
            "-o",
            "json",
        ],
    ] {
        let r = run(&args, paste.as_bytes());
        assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
        for part in [
            "`iptables -t nat -S` output",
            "`iptables -S` output",
            "`ipset list` output",
            "`ipvsadm -Ln` output",
        ] {
            assert!(r.stderr.contains(part), "{part}: {}", r.stderr);
        }
        let doc: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
        assert_eq!(service_names(&doc["iptables"]), whole_names());
        let ipvs = doc["ipvs"].to_string();
        assert!(ipvs.contains("10.96.0.10"), "{ipvs}");
        assert!(ipvs.contains("KUBE-CLUSTER-IP"), "{ipvs}");
        // The filter part gives the REJECT of the service without endpoints.
        let reports = doc["iptables"]["graphs"][0]["service_ports"]
            .as_array()
            .expect("ports")
            .iter()
            .find(|p| p["name"] == "shop/reports:http")
            .expect("reports")
            .to_string();
        assert!(reports.contains("REJECT"), "{reports}");
    }
}
