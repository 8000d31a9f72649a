//! `repair` on IPVS-mode nodes: offline plans on the real kernel dumps in `testdata/ipvs/` (each
//! clean node plans nothing, each seeded drift plans exactly its fix, foreign virtual servers are
//! kept), and end to end inside a VM whose kernel has IPVS (`../shared/tools/ipvs-vm.sh`):
//! install from nothing, seed drifts with real commands, dry run (nothing changes), a failing apply
//! (rolled back to the byte), apply, verify, idempotence, foreign state untouched.

use crate::support::ipvs::{
    case_inputs, run_in_vm, sections, shared_ipvs, testdata_ipvs, vm_binary, vm_or_skip,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `repair -o json` offline on one dump directory of a case, with the case's state and a
/// configuration.
fn offline_plan(
    state: &Path,
    config: &Path,
    render_args: &[String],
    dir: &Path,
) -> (Option<i32>, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .arg("repair")
        .arg("--state")
        .arg(state)
        .arg("--config")
        .arg(config)
        .args(render_args)
        .arg("--ipvsadm-save")
        .arg(dir.join("ipvsadm-Sn.txt"))
        .arg("--ipset-save")
        .arg(dir.join("ipset-save.txt"))
        .arg("--iptables-save")
        .arg(dir.join("iptables-save.txt"))
        .arg("--kube-ipvs0")
        .arg(dir.join("ip-addr-kube-ipvs0.txt"))
        .args(["-o", "json"])
        .output()
        .expect("run repair");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{}: {e}\n{}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), doc)
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect()
}

/// The one command (or plan part) each seeded drift of `testdata/ipvs` must produce.
fn expected_fix(drift: &str, commands: &[String], plan: &Value) -> Result<(), String> {
    let one = |prefix: &str| -> Result<(), String> {
        if commands.len() == 1 && commands[0].starts_with(prefix) {
            Ok(())
        } else {
            Err(format!("want one `{prefix}…` command, got {commands:?}"))
        }
    };
    match drift {
        "drift-rs-removed" => one("ipvsadm -a ").and_then(|()| {
            commands[0]
                .ends_with(" -m -w 1")
                .then_some(())
                .ok_or_else(|| format!("{commands:?}"))
        }),
        "drift-rs-weight0" => one("ipvsadm -e "),
        "drift-ghost-weight0" => one("ipvsadm -d "),
        "drift-scheduler" => one("ipvsadm -E "),
        "drift-ipset-entry" => one("ipset restore -exist").and_then(|()| {
            let sets = plan["sets"].as_array().map_or(0, Vec::len);
            (sets == 1 && plan["sets"][0]["op"] == "add")
                .then_some(())
                .ok_or_else(|| format!("want one ipset add, got {}", plan["sets"]))
        }),
        "drift-kube-ipvs0-addr" => one("ip addr add "),
        "drift-iptables-rule" => one("iptables-restore --noflush"),
        "drift-stale-vs" => {
            let kept = strings(&plan["kept"]);
            if commands.is_empty() && kept.len() == 1 && kept[0].contains("foreign") {
                Ok(())
            } else {
                Err(format!(
                    "a VS on no service address is foreign: got {commands:?}, kept {kept:?}"
                ))
            }
        }
        other => Err(format!("unknown drift {other}")),
    }
}

/// Offline plans on real kernel dumps: every clean node plans nothing (exit 0), every seeded drift
/// plans exactly its fix (exit 1), and a virtual server on no service address is kept.
#[test]
fn repair_ipvs_offline_plans_on_real_dumps() {
    let Some(shared) = shared_ipvs() else { return };
    let mut cases = 0;
    let mut drifts = 0;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(testdata_ipvs())
        .expect("testdata/ipvs")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("render-args.txt").is_file())
        .collect();
    dirs.sort();
    for case in dirs {
        let name = case.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let args: Vec<String> = std::fs::read_to_string(case.join("render-args.txt"))
            .expect("render-args")
            .lines()
            .map(str::to_string)
            .collect();
        let (state, config) = case_inputs(&case, &shared);
        let (code, doc) = offline_plan(&state, &config, &args, &case);
        assert_eq!(
            (code, strings(&doc["commands"]).len()),
            (Some(0), 0),
            "{name}: the clean node must plan nothing: {doc:#}"
        );
        assert_eq!(doc["outcome"], "nothing_to_do", "{name}: {doc:#}");
        cases += 1;
        let mut sub: Vec<PathBuf> = std::fs::read_dir(&case)
            .expect("case dir")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        sub.sort();
        for d in sub {
            let drift = d.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let (code, doc) = offline_plan(&state, &config, &args, &d);
            let commands = strings(&doc["commands"]);
            if let Err(why) = expected_fix(drift, &commands, &doc["plan"]) {
                panic!("{name}/{drift}: {why}\n{doc:#}");
            }
            let want = if commands.is_empty() { 0 } else { 1 };
            assert_eq!(code, Some(want), "{name}/{drift}");
            let status = if commands.is_empty() {
                "nothing_to_do"
            } else {
                "dry_run"
            };
            assert_eq!(doc["outcome"], status, "{name}/{drift}: {doc:#}");
            assert_eq!(doc["applied"], false, "{name}/{drift}");
            drifts += 1;
        }
    }
    assert!(cases >= 5 && drifts >= 40, "{cases} cases, {drifts} drifts");
    println!(
        "repair ipvs offline: {cases} clean nodes plan nothing, {drifts} drifts plan exactly their fix"
    );
}

/// A configuration that is not `mode: ipvs` is refused for IPVS dumps.
#[test]
fn repair_ipvs_refuses_mode_mismatch() {
    let Some(shared) = shared_ipvs() else { return };
    let case = "constructed-kind-worker-example";
    let tmp = tempfile::tempdir().expect("tempdir");
    let cfg = std::fs::read_to_string(shared.join(case).join("config.yaml"))
        .expect("config")
        .replace("mode: ipvs", "mode: iptables");
    let cfg_path = tmp.path().join("config.yaml");
    std::fs::write(&cfg_path, cfg).expect("write config");
    let (_, doc) = offline_plan(
        &shared.join(case).join("state.json"),
        &cfg_path,
        &["--node".into(), "kind-worker".into()],
        &testdata_ipvs().join(case),
    );
    let refusals = strings(&doc["refusals"]);
    assert!(
        refusals.iter().any(|r| r.contains("\"iptables\"")),
        "{doc:#}"
    );
}

/// The script run inside the VM. Every step prints `=== BEGIN name ===` … `=== END name rc=N ===`.
const VM_SCRIPT: &str = r#"
export NO_COLOR=1
B=/data/kubectl-kproxy
A="--state /data/state.json --config /data/config.yaml --node kind-worker"
for m in xt_physdev xt_ipvs xt_set xt_conntrack xt_addrtype xt_MASQUERADE ipt_REJECT ip6t_REJECT; do modprobe $m 2>/dev/null; done
ip link add eth0 type dummy; ip link set eth0 up; ip addr add 172.18.0.3/24 dev eth0
step() { name=$1; shift; echo "=== BEGIN $name ==="; "$@" 2>&1; rc=$?; echo "=== END $name rc=$rc ==="; }
verify() {
  ipvsadm -Ln > /tmp/v.ln; ipset save > /tmp/v.sets; iptables-save > /tmp/v.ipt
  ip -o addr show dev kube-ipvs0 > /tmp/v.addr
  $B verify $A --ipvsadm /tmp/v.ln --ipset /tmp/v.sets --iptables-save /tmp/v.ipt --ip-addr /tmp/v.addr -o json
}
snap() {
  ipvsadm -Sn | sort > $1.ipvs
  ipset save | sed 's/ initval 0x[0-9a-f]*//' | sort > $1.sets
  iptables-save | grep -v '^#' > $1.ipt
  ip -o addr show dev kube-ipvs0 | awk '{print $4}' | sort > $1.addr
}
same() { # A B: compares two snapshots
  for f in ipvs sets ipt addr; do
    if busybox cmp -s $1.$f $2.$f; then echo "$f: same"; else echo "$f: DIFFERS"; busybox diff $1.$f $2.$f; fi
  done
}
foreign() {
  ipvsadm -Sn | grep -E '192[.]0[.]2[.]|203[.]0[.]113[.]7'
  ipset list -n | grep -v '^KUBE-'
  iptables -t nat -S FOREIGN-CHAIN
  iptables -t nat -S PREROUTING | grep FOREIGN
}
seed() {
  set -x
  ipvsadm -d -t 10.96.0.1:443 -r 172.18.0.2:6443
  ipvsadm -a -t 10.96.0.10:53 -r 10.244.9.9:53 -m -w 1
  ipvsadm -e -t 10.96.200.1:443 -r 10.244.1.9:8443 -m -w 5
  ipvsadm -E -t 10.96.120.7:80 -s wrr
  ipvsadm -D -t 10.96.50.5:8080
  ipset del KUBE-CLUSTER-IP 10.96.0.10,tcp:9153
  ip addr add 10.96.99.99/32 dev kube-ipvs0
  ipvsadm -A -t 10.96.99.99:80 -s rr
  ipvsadm -a -t 10.96.99.99:80 -r 10.244.7.7:80 -m -w 1
  ip addr del 10.96.60.6/32 dev kube-ipvs0
  iptables -t nat -D KUBE-MARK-MASQ 1
  iptables -t filter -D INPUT -m comment --comment "kubernetes ipvs access filter" -j KUBE-IPVS-FILTER
  ipset create KUBE-SRC-OLDSTALE hash:ip
  ipset add KUBE-SRC-OLDSTALE 10.1.2.3
  ipvsadm -A -t 192.0.2.10:80 -s wrr
  ipvsadm -a -t 192.0.2.10:80 -r 192.0.2.20:80 -g -w 3
  ipvsadm -A -t 203.0.113.7:8443 -s sh -p 60
  ipvsadm -a -t 203.0.113.7:8443 -r 10.0.0.1:8443 -m -w 2
  ipset create my-foreign hash:ip
  ipset add my-foreign 1.2.3.4
  iptables -t nat -N FOREIGN-CHAIN
  iptables -t nat -A FOREIGN-CHAIN -s 1.2.3.4/32 -j RETURN
  iptables -t nat -A PREROUTING -j FOREIGN-CHAIN
  set +x
}
step install-dry $B repair --local $A
step install $B repair --local --apply $A --backup-dir /tmp/bk
step verify-installed verify
step seed seed
snap /tmp/pre
foreign > /tmp/foreign.before
step foreign-before cat /tmp/foreign.before
step dry-run $B repair --local $A
snap /tmp/dry
step unchanged-by-dry-run same /tmp/pre /tmp/dry
step faulty-apply $B repair --local --apply --inject-fault $A --backup-dir /tmp/bk
snap /tmp/rb
step rolled-back same /tmp/pre /tmp/rb
step apply $B repair --local --apply $A --backup-dir /tmp/bk
step verify-repaired verify
foreign > /tmp/foreign.after
step foreign-after busybox diff /tmp/foreign.before /tmp/foreign.after
step stale-set ipset list -n
step again $B repair --local --apply $A --backup-dir /tmp/bk
step backups busybox find /tmp/bk -type f
ipvsadm -D -t 203.0.113.7:8443
step verify-without-foreign verify
"#;

fn finding_ids(verify_json: &str) -> Vec<(String, String)> {
    let start = verify_json.find('{').unwrap_or(0);
    let doc: Value = serde_json::from_str(&verify_json[start..])
        .unwrap_or_else(|e| panic!("verify output is not JSON ({e}): {verify_json}"));
    doc["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| {
            (
                f["id"].as_str().unwrap_or("").to_string(),
                f["chain"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// End to end on a real IPVS kernel (one VM boot): `repair --local --apply` installs kube-proxy's
/// IPVS state from nothing; seeded drifts are planned in a dry run that changes nothing; a failing
/// apply is rolled back exactly; the apply fixes every drift (verify finds only the foreign
/// virtual servers), leaves foreign virtual servers, ipsets (also one named `KUBE-…`, as
/// kube-router names its sets) and chains untouched, and a second apply has nothing to do.
#[test]
fn repair_ipvs_live_vm() {
    let Some(shared) = vm_or_skip("repair_ipvs", "the IPVS repair VM test", &[]) else {
        return;
    };
    let case = shared.join("constructed-kind-worker-example");
    let tmp = tempfile::tempdir().expect("tempdir");
    let config = std::fs::read_to_string(case.join("config.yaml")).expect("config");
    assert!(config.contains("excludeCIDRs: []"));
    std::fs::write(
        tmp.path().join("config.yaml"),
        config.replace("excludeCIDRs: []", "excludeCIDRs: [192.0.2.0/24]"),
    )
    .expect("write config");
    std::fs::copy(case.join("state.json"), tmp.path().join("state.json")).expect("copy state");
    let files = [
        vm_binary(tmp.path()),
        tmp.path().join("state.json"),
        tmp.path().join("config.yaml"),
    ];
    let stdout = run_in_vm(&shared, VM_SCRIPT, &files);
    let secs = sections(&stdout);
    let get = |name: &str| -> (String, i32) {
        let (_, body, rc) = secs
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("no section {name} in the VM output:\n{stdout}"));
        println!("--- {name} (exit {rc}) ---\n{body}");
        (body.clone(), *rc)
    };

    let (body, rc) = get("install");
    assert_eq!(rc, 0, "{body}");
    assert!(body.contains("applied and verified"), "{body}");
    let (body, rc) = get("verify-installed");
    assert_eq!((rc, finding_ids(&body)), (0, vec![]), "{body}");

    let (dry, rc) = get("dry-run");
    assert_eq!(rc, 1, "{dry}");
    for want in [
        "ipvsadm -a -t 10.96.0.1:443 -r 172.18.0.2:6443 -m -w 1",
        "ipvsadm -d -t 10.96.0.10:53 -r 10.244.9.9:53",
        "ipvsadm -e -t 10.96.200.1:443 -r 10.244.1.9:8443 -m -w 1",
        "ipvsadm -E -t 10.96.120.7:80 -s rr -p 10800",
        "ipvsadm -A -t 10.96.50.5:8080 -s rr",
        "ipvsadm -a -t 10.96.50.5:8080 -r 10.244.2.10:8080 -m -w 1",
        "ipvsadm -D -t 10.96.99.99:80",
        "add KUBE-CLUSTER-IP 10.96.0.10,tcp:9153",
        "ip addr add 10.96.60.6/32 dev kube-ipvs0",
        "ip addr del 10.96.99.99/32 dev kube-ipvs0",
        "rewrite KUBE-MARK-MASQ",
        "insert  INPUT",
        "keep: virtual server TCP 192.0.2.10:80: inside ipvs.excludeCIDRs",
        "keep: virtual server TCP 203.0.113.7:8443: foreign",
    ] {
        assert!(dry.contains(want), "dry run lacks `{want}`:\n{dry}");
    }
    for foreign in [
        "-t 203.0.113.7",
        "-t 192.0.2.10",
        "my-foreign",
        "KUBE-SRC-OLDSTALE",
        "FOREIGN-CHAIN",
    ] {
        assert!(
            !dry.lines()
                .any(|l| l.contains(foreign) && !l.starts_with("keep:")),
            "the plan touches foreign `{foreign}`:\n{dry}"
        );
    }
    let (body, _) = get("unchanged-by-dry-run");
    assert_eq!(body.matches(": same").count(), 4, "{body}");

    let (body, rc) = get("faulty-apply");
    assert_eq!(rc, 2, "{body}");
    assert!(body.contains("restored"), "{body}");
    let (body, _) = get("rolled-back");
    assert_eq!(body.matches(": same").count(), 4, "rollback: {body}");

    let (body, rc) = get("apply");
    assert_eq!(rc, 0, "{body}");
    assert!(body.contains("applied and verified"), "{body}");
    let (body, rc) = get("verify-repaired");
    let mut ids = finding_ids(&body);
    ids.sort();
    assert_eq!(
        ids,
        [
            ("KP502".to_string(), "TCP 203.0.113.7:8443".to_string()),
            ("KP520".to_string(), "TCP 192.0.2.10:80".to_string()),
        ],
        "after repair only the foreign virtual servers remain: {body}"
    );
    assert_eq!(rc, 1, "KP502 is a warning");
    let (body, rc) = get("foreign-before");
    assert_eq!(rc, 0);
    for want in [
        "-A -t 192.0.2.10:80 -s wrr",
        "-a -t 192.0.2.10:80 -r 192.0.2.20:80 -g -w 3",
        "-A -t 203.0.113.7:8443 -s sh -p 60",
        "-a -t 203.0.113.7:8443 -r 10.0.0.1:8443 -m -w 2",
        "my-foreign",
        "-A FOREIGN-CHAIN -s 1.2.3.4/32 -j RETURN",
        "-A PREROUTING -j FOREIGN-CHAIN",
    ] {
        assert!(body.contains(want), "foreign state lacks `{want}`: {body}");
    }
    let (body, rc) = get("foreign-after");
    assert_eq!((rc, body.trim()), (0, ""), "foreign state changed");
    let (body, _) = get("stale-set");
    assert!(
        body.contains("KUBE-SRC-OLDSTALE") && body.contains("my-foreign"),
        "a set of another program's (kube-router names its sets KUBE-SRC-/KUBE-DST-) is never destroyed: {body}"
    );
    let (body, rc) = get("again");
    assert_eq!(rc, 0, "{body}");
    assert!(body.contains("nothing to do"), "{body}");
    let (body, _) = get("backups");
    for f in [
        "ipvsadm-save.txt",
        "ipset-save.txt",
        "kube-ipvs0.txt",
        ".rules",
    ] {
        assert!(body.contains(f), "backup lacks {f}: {body}");
    }
    let (body, rc) = get("verify-without-foreign");
    assert_eq!(rc, 0, "{body}");
    assert!(
        finding_ids(&body).iter().all(|(id, _)| id == "KP520"),
        "{body}"
    );
}
