//! The first ten minutes (issue 37, item 12), as a user runs the commands: flags that do
//! nothing are refused, `--no-headers` prints rows only, tables fit the terminal. The help
//! texts themselves are checked by the binary's unit tests (`src/cli/mod.rs`, `help_tests`).

use crate::support::{EXAMPLE_STATE, kproxy, run_with_files, tool};

const SAVE: &str = "testdata/dumps/cluster.nft-c.save";
const DRIFTED: &str = "testdata/dumps/drifted.nft-c.save";

/// `--all-nodes` belongs to verify: the one-node commands refuse it, also offline, saying so.
#[test]
fn one_node_commands_refuse_all_nodes() {
    let mut repair = vec!["repair", "node-1", "--all-nodes", "--iptables-save", SAVE];
    repair.extend(EXAMPLE_STATE);
    let mut collect = vec!["collect", "node-1", "--all-nodes", "-o", "x.tar.gz"];
    collect.extend(["--iptables-save", SAVE]);
    collect.extend(EXAMPLE_STATE);
    for args in [
        repair,
        vec![
            "trace",
            "svc/web",
            "-n",
            "shop",
            "--all-nodes",
            "--iptables-save",
            SAVE,
        ],
        collect,
    ] {
        let r = run_with_files(&args, &[]);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stdout);
        assert!(r.stderr.contains("--all-nodes"), "{args:?}: {}", r.stderr);
        assert!(r.stdout.is_empty(), "{args:?}: {}", r.stdout);
    }
}

/// `--no-headers` prints the findings' rows only: no group titles, column headers or summary.
#[test]
fn no_headers_prints_rows_only() {
    let mut args = vec![
        "verify",
        "node-1",
        "--iptables-save",
        DRIFTED,
        "--no-headers",
    ];
    args.extend(EXAMPLE_STATE);
    let r = run_with_files(&args, &[]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    let rows: Vec<&str> = r.stdout.lines().collect();
    for header in ["ERRORS", "INFO", "ID ", "checked "] {
        assert!(
            !rows.iter().any(|l| l.starts_with(header)),
            "{header}:\n{}",
            r.stdout
        );
    }
    assert_eq!(rows.len(), 6, "four errors and two infos:\n{}", r.stdout);
    assert!(rows.iter().all(|l| l.starts_with("KP")), "{}", r.stdout);
    assert!(rows[0].starts_with("KP005"), "errors first:\n{}", r.stdout);
}

/// On a terminal narrower than `graph`'s table the lists of entries, endpoints and masquerade
/// reasons stack, one item a line, and what is still wider says so; through a pipe each row is
/// one line, as before. No name or address is cut either way.
#[test]
fn graph_tables_fit_the_terminal() {
    let Some(script) = tool("help", "script") else {
        return;
    };
    let bin = env!("CARGO_BIN_EXE_kubectl-kproxy");
    let piped = kproxy()
        .args(["graph", "--iptables-save", SAVE])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("graph");
    let piped = String::from_utf8_lossy(&piped.stdout).into_owned();
    let piped_width = piped.lines().map(|l| l.chars().count()).max().unwrap_or(0);
    assert!(piped_width > 200, "{piped}");
    let on_terminal = |cols: usize| -> String {
        let command = format!("stty cols {cols} rows 50; {bin} graph --iptables-save {SAVE}");
        let out = std::process::Command::new(&script)
            .args(["-qec", &command, "/dev/null"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env("NO_COLOR", "1")
            .output()
            .expect("script");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).replace('\r', "")
    };
    let stacked = on_terminal(150);
    let table: Vec<&str> = stacked.lines().take_while(|l| !l.is_empty()).collect();
    assert!(table.iter().all(|l| l.chars().count() <= 150), "{stacked}");
    assert!(!stacked.contains("columns wide"), "{stacked}");
    for word in [
        "monitoring/node-exporter:metrics",
        "10.244.1.10:8080",
        "192.168.77.2:6443",
        "off-cluster",
    ] {
        assert_eq!(
            stacked.matches(word).count(),
            piped.matches(word).count(),
            "{word}:\n{stacked}"
        );
    }
    // Narrower than its widest names and addresses: said, with what shows it whole.
    let narrow = on_terminal(100);
    assert!(narrow.contains("the terminal 100"), "{narrow}");
    assert!(narrow.contains("-o json"), "{narrow}");
}
