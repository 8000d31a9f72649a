//! `monitor` on an IPVS-mode node, in the VM whose kernel has IPVS (`../shared/tools/ipvs-vm.sh`):
//! kube-proxy's IPVS state installed by `repair --local --apply`, the monitor in sync; a real
//! server deleted with `ipvsadm` is drift within interval + grace; `repair --local --apply`
//! brings it back in sync. IPVS and ipsets have no change events: the monitor reads them at
//! every verify.

use crate::support::ipvs::{run_in_vm, sections, vm_binary, vm_or_skip};

/// The script run inside the VM (steps as `repair_ipvs`'s: `=== BEGIN name ===` …
/// `=== END name rc=N ===`).
const VM_SCRIPT: &str = r#"
export NO_COLOR=1
B=/data/kubectl-kproxy
A="--state /data/state.json --config /data/config.yaml --node kind-worker"
for m in xt_physdev xt_ipvs xt_set xt_conntrack xt_addrtype xt_MASQUERADE ipt_REJECT ip6t_REJECT; do modprobe $m 2>/dev/null; done
ip link add eth0 type dummy; ip link set eth0 up; ip addr add 172.18.0.3/24 dev eth0
step() { name=$1; shift; echo "=== BEGIN $name ==="; "$@" 2>&1; rc=$?; echo "=== END $name rc=$rc ==="; }
metric() { busybox wget -q -O - http://127.0.0.1:9847/metrics | grep "^$1 " | awk '{print $2}'; }
# wait_for NAME VALUE SECONDS: polls the metric until it has the value.
wait_for() {
  i=0
  while [ $i -lt $3 ]; do
    [ "$(metric $1)" = "$2" ] && { echo "$1 $2 after ${i}s"; return 0; }
    sleep 1; i=$((i+1))
  done
  echo "$1 is $(metric $1), not $2, after $3 s"; return 1
}
step install $B repair --local --apply $A --backup-dir /tmp/bk
$B monitor $A --listen 127.0.0.1:9847 --interval 1s --grace 2s > /tmp/monitor.log 2>&1 &
step in-sync wait_for kproxy_node_in_sync 1 90
step mode sh -c "busybox wget -q -O - http://127.0.0.1:9847/metrics | grep '^kproxy_build_info'"
step delete-real-server ipvsadm -d -t 10.96.0.1:443 -r 172.18.0.2:6443
step drift wait_for kproxy_node_in_sync 0 60
step findings sh -c "busybox wget -q -O - http://127.0.0.1:9847/metrics | grep '^kproxy_findings'"
step repair $B repair --local --apply $A --backup-dir /tmp/bk
step in-sync-again wait_for kproxy_node_in_sync 1 60
step log cat /tmp/monitor.log
"#;

/// One VM boot: in sync, drift after a real server is deleted, in sync after the repair.
#[test]
fn monitor_ipvs_live_vm() {
    let Some(shared) = vm_or_skip("monitor_ipvs", "the IPVS monitor VM test", &[]) else {
        return;
    };
    let case = shared.join("constructed-kind-worker-example");
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::copy(case.join("config.yaml"), tmp.path().join("config.yaml")).expect("config");
    std::fs::copy(case.join("state.json"), tmp.path().join("state.json")).expect("state");
    let files = [
        vm_binary(tmp.path()),
        tmp.path().join("state.json"),
        tmp.path().join("config.yaml"),
    ];
    let stdout = run_in_vm(&shared, VM_SCRIPT, &files);
    let secs = sections(&stdout);
    let get = |name: &str| -> (String, i32) {
        secs.iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, body, rc)| (body.clone(), *rc))
            .unwrap_or_else(|| panic!("no section {name} in the VM output:\n{stdout}"))
    };
    let log = get("log").0;
    for step in [
        "install",
        "in-sync",
        "mode",
        "delete-real-server",
        "drift",
        "findings",
        "repair",
        "in-sync-again",
    ] {
        let (body, rc) = get(step);
        assert_eq!(rc, 0, "step {step}: {body}\n--- monitor log ---\n{log}");
    }
    let (mode, _) = get("mode");
    assert!(mode.contains("mode=\"ipvs\""), "{mode}");
    let (findings, _) = get("findings");
    assert!(findings.contains("severity=\"error\""), "{findings}");
    assert!(log.contains("state=drift"), "{log}");
    assert!(log.contains("state=in_sync previous=drift"), "{log}");
}
