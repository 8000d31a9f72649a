//! Wrong inputs are refused with a message that says what is wrong, never answered: a mode the
//! node does not run, a node the state does not list, swapped families, a configuration given
//! as the state, bad flag values.

use crate::support::kproxy;
use std::path::Path;

const DUMP: &str = "testdata/dumps/cluster.nft-c.save";
const DUMP6: &str = "testdata/dumps/cluster-v6.nft-c.save";
const STATE: &str = "testdata/cluster/state.json";
const CONFIG: &str = "testdata/cluster/config.yaml";

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = kproxy()
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("NO_COLOR", "1")
        .output()
        .expect("run");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `verify node-1` of the example cluster against `dump` (written to a file named `name`), with
/// `extra` flags; the file's path is returned too.
fn verify_dump(name: &str, dump: &str, extra: &[&str]) -> (Option<i32>, String, String, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join(name);
    std::fs::write(&file, dump).expect("write");
    let file = file.display().to_string();
    let mut args = vec![
        "verify",
        "node-1",
        "--state",
        STATE,
        "--config",
        CONFIG,
        "--iptables-save",
        &file,
    ];
    args.extend(extra);
    let (code, stdout, stderr) = run(&args);
    (code, stdout, stderr, file)
}

fn example_dump() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(DUMP)).expect("dump")
}

/// The example configuration with `mode:` set to `mode`, in a temporary file.
fn config_with_mode(dir: &Path, mode: &str) -> String {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(CONFIG))
        .expect("config");
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with("mode:"))
        .map(str::to_string)
        .collect();
    lines.push(format!("mode: {mode}"));
    let path = dir.join(format!("config-{}.yaml", mode.replace('"', "q")));
    std::fs::write(&path, lines.join("\n") + "\n").expect("write");
    path.display().to_string()
}

#[test]
fn the_configured_mode_is_checked_against_the_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    for mode in ["ipvs", "nftables"] {
        let cfg = config_with_mode(dir.path(), mode);
        let (code, stdout, stderr) = run(&[
            "verify",
            "node-1",
            "--state",
            STATE,
            "--config",
            &cfg,
            "--iptables-save",
            DUMP,
        ]);
        assert_eq!(code, Some(1), "{mode}: {stdout}{stderr}");
        assert!(stdout.contains("KP523"), "{mode}: {stdout}");
        assert!(
            stdout.contains(&format!("configured for mode {mode}")),
            "{stdout}"
        );
    }
    for mode in ["banana", "IPTABLES", "kernelspace"] {
        let cfg = config_with_mode(dir.path(), mode);
        for args in [
            vec![
                "verify",
                "node-1",
                "--state",
                STATE,
                "--config",
                &cfg,
                "--iptables-save",
                DUMP,
            ],
            vec![
                "render", "--node", "node-1", "--state", STATE, "--config", &cfg,
            ],
        ] {
            let (code, _, stderr) = run(&args);
            assert_eq!(code, Some(2), "{mode} {args:?}");
            assert!(stderr.contains("field `mode`"), "{mode}: {stderr}");
        }
    }
    // "" is kube-proxy's default, iptables.
    let cfg = config_with_mode(dir.path(), "\"\"");
    let (code, stdout, _) = run(&[
        "verify",
        "node-1",
        "--state",
        STATE,
        "--config",
        &cfg,
        "--iptables-save",
        DUMP,
    ]);
    assert_eq!(code, Some(0), "{stdout}");
}

#[test]
fn a_node_the_state_does_not_list_is_refused() {
    let common = ["--state", STATE, "--config", CONFIG];
    let cases: Vec<Vec<&str>> = vec![
        vec!["verify", "node-9", "--iptables-save", DUMP],
        vec!["repair", "--node", "node-9", "--iptables-save", DUMP],
        vec!["render", "--node", "node-9"],
        vec![
            "trace",
            "svc/web",
            "-n",
            "shop",
            "--node",
            "node-9",
            "--iptables-save",
            DUMP,
        ],
    ];
    for mut args in cases {
        args.extend(common);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {stdout}");
        assert!(
            stderr.contains("node \"node-9\" not found in the state; it has: node-1, node-2"),
            "{args:?}: {stderr}"
        );
    }
    // Said explicitly, with the node's address: rendered.
    let mut args = vec![
        "render",
        "--node",
        "node-9",
        "--node-ip",
        "192.168.77.9",
        "--node-not-in-state",
    ];
    args.extend(common);
    let (code, stdout, stderr) = run(&args);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("*nat"));
}

#[test]
fn swapped_families_are_refused() {
    let common = ["--state", STATE, "--config", CONFIG];
    for args in [
        vec!["verify", "node-1", "--iptables-save", DUMP6],
        vec![
            "verify",
            "node-1",
            "--iptables-save",
            DUMP,
            "--ip6tables-save",
            DUMP,
        ],
    ] {
        let mut args = args.clone();
        args.extend(common);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {stdout}");
        assert!(stderr.contains("pass it as --ip"), "{stderr}");
    }
    let mut ok = vec![
        "verify",
        "node-1",
        "--iptables-save",
        DUMP,
        "--ip6tables-save",
        DUMP6,
    ];
    ok.extend(common);
    assert_eq!(run(&ok).0, Some(0));
}

#[test]
fn a_state_that_is_not_api_state_says_what_it_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    let text = dir.path().join("text.txt");
    std::fs::write(&text, "hello world\n").expect("write");
    let text = text.display().to_string();
    for (file, what) in [
        (CONFIG, "a KubeProxyConfiguration"),
        (DUMP, "`iptables-save` output"),
        (text.as_str(), "plain text"),
    ] {
        let (code, _, stderr) = run(&["render", "--node", "node-1", "--state", file]);
        assert_eq!(code, Some(2), "{file}");
        assert!(stderr.contains(what), "{file}: {stderr}");
        assert!(stderr.contains("kubectl get services,endpointslices,nodes -A -o json"));
    }
}

#[test]
fn bad_flag_values_are_refused_by_the_parser() {
    let common = ["--state", STATE, "--config", CONFIG, "--node", "node-1"];
    for (flag, value) in [
        ("--masquerade-mark", "garbage"),
        ("--masquerade-mark", "0x"),
        ("--request-timeout", "banana"),
        ("--node-ip", "10.0.0.300"),
    ] {
        let mut args = vec!["render", flag, value];
        args.extend(common);
        let (code, stdout, stderr) = run(&args);
        assert_eq!(code, Some(2), "{flag} {value}: {stdout}");
        assert!(stderr.contains("invalid value"), "{flag}: {stderr}");
    }
    let mut args = vec!["render", "--masquerade-mark", "0x00008000"];
    args.extend(common);
    let (code, stdout, _) = run(&args);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("0x00008000/0x00008000"));
}

#[test]
fn a_parse_error_is_printed_once_with_the_file_name() {
    let bad = "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j\nCOMMIT\n";
    let (code, _, stderr, file) = verify_dump("bad.save", bad, &[]);
    assert_eq!(code, Some(2));
    assert_eq!(stderr.matches("expected").count(), 1, "{stderr}");
    assert!(stderr.contains(&format!("{file}:3:")), "{stderr}");
    assert!(!stderr.contains("<input>"), "{stderr}");
}

#[test]
fn a_missing_table_is_one_finding_not_many() {
    let text = example_dump();
    // The dump without its nat table.
    let start = text.find("*nat").expect("nat");
    let end = start + text[start..].find("COMMIT\n").expect("commit") + 7;
    let no_nat = format!("{}{}", &text[..start], &text[end..]);
    let (code, stdout, _, _) = verify_dump("no-nat.save", &no_nat, &["-o", "json"]);
    assert_eq!(code, Some(1));
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    let ids: Vec<&str> = doc["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter_map(|f| f["id"].as_str())
        .collect();
    assert!(ids.contains(&"KP011"), "{ids:?}");
    assert!(
        !ids.contains(&"KP101"),
        "no per-port nat findings next to KP011: {ids:?}"
    );
}

#[test]
fn a_missing_drop_is_reported_in_words() {
    let text = example_dump();
    let without: String = text
        .lines()
        .filter(|l| !(l.contains("has no local endpoints") && l.ends_with("-j DROP")))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(without.len(), text.len(), "the dump has such a DROP rule");
    let (code, stdout, _, _) = verify_dump("no-drop.save", &without, &[]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains("but is not dropped"), "{stdout}");
    assert!(!stdout.contains("droped"), "{stdout}");
}
