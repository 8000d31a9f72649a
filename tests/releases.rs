//! Every kube-proxy release this build knows, 1.20 … 1.38 (issues 28 and 33), one test each, on
//! the real kernel: the example cluster's rules of the release (`testdata/cluster`, both
//! families) are rendered, restored into a fresh network namespace with the real tools —
//! `iptables-restore` of both backends, and for the nftables mode (1.34 and later, the layouts
//! this build models) `nft -f` — read back and verified:
//!
//! * as that release (`--kube-proxy-version 1.X`): exit 0 and no finding at all;
//! * without the flag: exit 0, nothing but info findings, and the release the rules point to
//!   (KP907, and a note on stderr) is a range that holds 1.X.
//!
//! Besides: a 1.36 table verified as 1.35 is one KP906 finding; a release newer than the build
//! is refused (exit 2) naming the newest it knows; the `mark-for-masquerade` chain an in-place
//! upgrade leaves is KP909 and repair leaves it.

use crate::support::netns::{Backend, Family, Netns, require_root_and_tools};
use crate::support::repair::{cluster_file, config_in_mode};
use serde_json::Value;
use std::path::Path;
use std::process::Output;

/// `kubectl-kproxy ARGS… --state … --config CONFIG --nfacct none` (the namespaces have no
/// nfacct counters).
fn kproxy(config: &Path, args: &[&str]) -> Output {
    crate::support::kproxy()
        .args(args)
        .arg("--state")
        .arg(cluster_file("state.json"))
        .arg("--config")
        .arg(config)
        .args(["--nfacct", "none"])
        .env("NO_COLOR", "1")
        .output()
        .expect("run kubectl-kproxy")
}

fn stdout(o: &Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what}: exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout.clone()).expect("utf-8")
}

/// `verify -o json` with `inputs`: (exit code, report, stderr).
fn verify(config: &Path, inputs: &[&str], extra: &[&str]) -> (i32, Value, String) {
    let mut args = vec!["verify", "-o", "json"];
    args.extend_from_slice(inputs);
    args.extend_from_slice(extra);
    let o = kproxy(config, &args);
    let report: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "verify: not JSON ({e}): {}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    (
        o.status.code().unwrap_or(-1),
        report,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn findings(report: &Value) -> Vec<&Value> {
    report["findings"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// Verified as its own release: nothing; without the flag: only info findings, and a KP907
/// range that holds `minor`.
fn assert_clean_as_itself(what: &str, config: &Path, inputs: &[&str], minor: u32) {
    let version = format!("1.{minor}");
    let (code, own, stderr) = verify(config, inputs, &["--kube-proxy-version", &version]);
    assert!(
        code == 0 && findings(&own).is_empty(),
        "{what} as {version}: exit {code}: {own:#}\n{stderr}"
    );
    let (code, inferred, stderr) = verify(config, inputs, &[]);
    let noisy: Vec<_> = findings(&inferred)
        .into_iter()
        .filter(|f| f["severity"] != "info")
        .collect();
    assert!(
        code == 0 && noisy.is_empty(),
        "{what} without the flag: exit {code}: {inferred:#}\n{stderr}"
    );
    let said = findings(&inferred)
        .into_iter()
        .find(|f| f["id"] == "KP907")
        .and_then(|f| f["message"].as_str())
        .unwrap_or_else(|| panic!("{what}: no KP907: {inferred:#}"))
        .to_string();
    let (lo, hi) = range_of(&said);
    assert!(
        lo <= minor && minor <= hi,
        "{what}: {version} outside {said:?}"
    );
    assert!(
        stderr.contains("note: rules look written by kube-proxy"),
        "{what}: no note on stderr: {stderr}"
    );
}

/// The releases of `rules look written by kube-proxy 1.A–1.B` (or `1.A`).
fn range_of(message: &str) -> (u32, u32) {
    let rest = message
        .strip_prefix("rules look written by kube-proxy ")
        .unwrap_or_else(|| panic!("not a release range: {message:?}"));
    let range = rest.split(';').next().unwrap_or("");
    let minor = |v: &str| -> u32 {
        v.trim()
            .strip_prefix("1.")
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("not a release: {v:?} in {message:?}"))
    };
    match range.split_once('–') {
        Some((a, b)) => (minor(a), minor(b)),
        None => (minor(range), minor(range)),
    }
}

/// The iptables rules of release 1.`minor`, restored with each backend and saved back, verify
/// clean as themselves.
fn iptables_release(minor: u32) {
    let mut tools = Backend::Nft.tools().to_vec();
    tools.extend(Backend::Legacy.tools());
    if !require_root_and_tools(&tools) {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_in_mode(dir.path(), "iptables");
    let version = format!("1.{minor}");
    let render = |family: &str| {
        stdout(
            &kproxy(
                &config,
                &[
                    "render",
                    "--with-base-jumps",
                    "--ip-family",
                    family,
                    "--kube-proxy-version",
                    &version,
                ],
            ),
            "render",
        )
    };
    let (v4, v6) = (render("4"), render("6"));
    for backend in [Backend::Nft, Backend::Legacy] {
        let ns = Netns::new(&format!("rel{minor}")).expect("netns");
        ns.restore_family(backend, Family::V4, &v4, false)
            .unwrap_or_else(|e| panic!("{version} {backend}: restore: {e}"));
        ns.restore_family(backend, Family::V6, &v6, false)
            .unwrap_or_else(|e| panic!("{version} {backend}: restore -6: {e}"));
        let save4 = dir.path().join(format!("{backend}-4.save"));
        let save6 = dir.path().join(format!("{backend}-6.save"));
        std::fs::write(
            &save4,
            ns.save_family(backend, Family::V4, false).expect("save"),
        )
        .expect("write");
        std::fs::write(
            &save6,
            ns.save_family(backend, Family::V6, false).expect("save -6"),
        )
        .expect("write");
        let (s4, s6) = (save4.display().to_string(), save6.display().to_string());
        assert_clean_as_itself(
            &format!("iptables {version} ({backend})"),
            &config,
            &["--iptables-save", &s4, "--ip6tables-save", &s6],
            minor,
        );
    }
}

/// A fresh namespace holding the example cluster's nftables tables (both families) of
/// `version`, loaded with `nft -f`.
fn loaded(config: &Path, prefix: &str, version: &str) -> Netns {
    let ns = Netns::new(prefix).expect("netns");
    for family in ["4", "6"] {
        let table = stdout(
            &kproxy(
                config,
                &[
                    "render",
                    "--mode",
                    "nftables",
                    "--ip-family",
                    family,
                    "--kube-proxy-version",
                    version,
                ],
            ),
            "render",
        );
        ns.nft_load(&table)
            .unwrap_or_else(|e| panic!("nft -f of {version} IPv{family}: {e}"));
    }
    ns
}

/// The nftables table of release 1.`minor` (both families), loaded with `nft -f` and listed
/// back as text and as JSON, verifies clean as itself.
fn nftables_release(minor: u32) {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_in_mode(dir.path(), "nftables");
    let version = format!("1.{minor}");
    let ns = loaded(&config, &format!("reln{minor}"), &version);
    let listings = [
        ("text", ns.nft(&["list", "ruleset"]).expect("nft list")),
        ("json", ns.nft(&["-j", "list", "ruleset"]).expect("nft -j")),
    ];
    for (form, listing) in listings {
        let path = dir.path().join(format!("ruleset.{form}"));
        std::fs::write(&path, listing).expect("write");
        let p = path.display().to_string();
        assert_clean_as_itself(
            &format!("nftables {version} ({form})"),
            &config,
            &["--nft-ruleset", &p],
            minor,
        );
    }
}

macro_rules! releases {
    ($( $name:ident = $minor:literal ),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                iptables_release($minor);
                if $minor >= 34 {
                    nftables_release($minor);
                }
            }
        )*
    };
}

releases!(
    release_1_20 = 20,
    release_1_21 = 21,
    release_1_22 = 22,
    release_1_23 = 23,
    release_1_24 = 24,
    release_1_25 = 25,
    release_1_26 = 26,
    release_1_27 = 27,
    release_1_28 = 28,
    release_1_29 = 29,
    release_1_30 = 30,
    release_1_31 = 31,
    release_1_32 = 32,
    release_1_33 = 33,
    release_1_34 = 34,
    release_1_35 = 35,
    release_1_36 = 36,
    release_1_37 = 37,
    release_1_38 = 38,
);

#[test]
fn a_release_newer_than_the_build_is_refused() {
    let dir = tempfile::tempdir().expect("tmp");
    for mode in ["iptables", "nftables"] {
        let config = config_in_mode(dir.path(), mode);
        for args in [
            &["render", "--kube-proxy-version", "1.39"][..],
            &["render", "--kube-proxy-version", "v1.39.0"][..],
            &[
                "verify",
                "--kube-proxy-version",
                "1.40",
                "--iptables-save",
                "-",
            ][..],
        ] {
            let o = kproxy(&config, args);
            let stderr = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{args:?}: {stderr}");
            assert!(
                stderr.contains("newer than the newest release this build knows (1.38)"),
                "{args:?}: {stderr}"
            );
            assert!(o.stdout.is_empty(), "{args:?}: wrote {:?}", o.stdout);
        }
    }
}

/// A 1.36 table: against 1.35 one KP906 finding says the rules are another release's; an
/// in-place upgrade's orphan `mark-for-masquerade` chain is KP909 (info), which `repair` leaves.
#[test]
fn a_1_36_table_is_another_release_for_1_35_and_keeps_its_upgrade_residue() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_in_mode(dir.path(), "nftables");
    let ns = loaded(&config, "relres", "1.36");
    let write = |name: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, ns.nft(&["-j", "list", "ruleset"]).expect("nft -j")).expect("write");
        path.display().to_string()
    };
    let upgraded = write("1.36.json");
    let (code, report, stderr) = verify(
        &config,
        &["--nft-ruleset", &upgraded],
        &["--kube-proxy-version", "1.35"],
    );
    let ids: Vec<&str> = findings(&report)
        .iter()
        .filter_map(|f| f["id"].as_str())
        .collect();
    assert_eq!((code, ids), (1, vec!["KP906"]), "{report:#}\n{stderr}");
    let message = findings(&report)[0]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("differ the way rules of kube-proxy 1.36 differ from 1.35"),
        "{message}"
    );

    // The chain kube-proxy 1.35 wrote, left over: nothing jumps to it.
    ns.nft_load(
        "add chain ip kube-proxy mark-for-masquerade\n\
         add rule ip kube-proxy mark-for-masquerade mark set mark or 0x00004000\n",
    )
    .expect("add the orphan chain");
    let residue = write("residue.json");
    let (code, report, stderr) = verify(&config, &["--nft-ruleset", &residue], &[]);
    let ids: Vec<(&str, &str)> = findings(&report)
        .iter()
        .filter_map(|f| Some((f["id"].as_str()?, f["severity"].as_str()?)))
        .collect();
    assert_eq!(
        (code, ids),
        (0, vec![("KP907", "info"), ("KP909", "info")]),
        "{report:#}\n{stderr}"
    );
    assert!(
        stderr.contains("rules look written by kube-proxy 1.36"),
        "{stderr}"
    );
    let repair = kproxy(
        &config,
        &[
            "repair",
            "--local",
            "--netns",
            ns.name(),
            "-o",
            "json",
            "--backup-dir",
            &dir.path().display().to_string(),
        ],
    );
    let plan: Value = serde_json::from_slice(&repair.stdout).unwrap_or_else(|e| {
        panic!(
            "repair: not JSON ({e}): {}",
            String::from_utf8_lossy(&repair.stderr)
        )
    });
    assert_eq!(repair.status.code(), Some(0), "{plan:#}");
    assert_eq!(plan["outcome"], "nothing_to_do", "{plan:#}");
    let families = plan["plan"]["families"].as_array().expect("families");
    assert!(
        families.len() == 2
            && families
                .iter()
                .all(|f| f["changes"].as_array().is_some_and(|c| c.is_empty())),
        "repair plans nothing, the residue included: {plan:#}"
    );
    assert!(
        ns.nft(&["list", "chain", "ip", "kube-proxy", "mark-for-masquerade"])
            .is_ok(),
        "the residue is left"
    );
}

/// A 1.38 node whose localhost-NodePort reject counter is gone (its chain flushed, then the
/// counter deleted): verify names the missing counter (KP712) beside the chain, and repair
/// adds the counter before the rule that names it; verify is clean after.
#[test]
fn a_missing_named_counter_is_found_and_repaired() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let dir = tempfile::tempdir().expect("tmp");
    let config = config_in_mode(dir.path(), "nftables");
    let ns = loaded(&config, "relctr", "1.38");
    ns.nft_load(
        "flush chain ip kube-proxy localhost-nodeport-reject-tcp\n\
         delete counter ip kube-proxy localhost-nodeport-rejected-tcp\n",
    )
    .expect("drift");
    let listing = dir.path().join("drifted.json");
    std::fs::write(
        &listing,
        ns.nft(&["-j", "list", "ruleset"]).expect("nft -j"),
    )
    .expect("write");
    let version = ["--kube-proxy-version", "1.38"];
    let (code, report, stderr) = verify(
        &config,
        &["--nft-ruleset", &listing.display().to_string()],
        &version,
    );
    let ids: Vec<(&str, &str)> = findings(&report)
        .iter()
        .filter_map(|f| Some((f["id"].as_str()?, f["chain"].as_str()?)))
        .collect();
    assert_eq!(code, 1, "{report:#}\n{stderr}");
    assert!(
        ids.contains(&("KP712", "counter localhost-nodeport-rejected-tcp")),
        "{report:#}"
    );
    let backup = dir.path().display().to_string();
    let repair = kproxy(
        &config,
        &[
            "repair",
            "--local",
            "--netns",
            ns.name(),
            "--apply",
            "--kube-proxy-version",
            "1.38",
            "--backup-dir",
            &backup,
        ],
    );
    assert_eq!(
        repair.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&repair.stdout),
        String::from_utf8_lossy(&repair.stderr)
    );
    std::fs::write(
        &listing,
        ns.nft(&["-j", "list", "ruleset"]).expect("nft -j"),
    )
    .expect("write");
    let (code, report, stderr) = verify(
        &config,
        &["--nft-ruleset", &listing.display().to_string()],
        &version,
    );
    assert_eq!(code, 0, "{report:#}\n{stderr}");
}
