//! IPVS nodes: `verify --ipvsadm … --conntrack FILE` checks IPVS's own connection table (`ipvsadm
//! -Lnc`) against the API's serving endpoints as it checks the conntrack table (findings KP6xx).
//!
//! From files: the real dumps of the kind-worker example with the connection listings of
//! `../shared/conformance/ipvs/formats/` (every connection to a serving endpoint, one SCTP
//! connection through an address no service has), then the same node after an endpoint was
//! removed from the API. In a VM whose kernel has IPVS (`../shared/tools/ipvs-vm.sh`): a syslog
//! client keeps sending to a UDP virtual server from one source port while its real server is
//! deleted as kube-proxy deletes a UDP real server; the kernel keeps the connection on the gone
//! real server (`expire_nodest_conn=0`), deleting the flow's conntrack entry does not end it, and
//! with `expire_nodest_conn=1` (as kube-proxy sets it) the next packets move the flow to the
//! serving real server — verify reports each of these states from the VM's real listings.

use crate::support::ipvs::{missing_vm_tools, run_in_vm, sections, shared_ipvs, testdata_ipvs};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kproxy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run kubectl-kproxy")
}

fn report(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "verify output is not JSON ({e}):\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn findings<'a>(report: &'a Value, id: &str) -> Vec<&'a Value> {
    report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["id"] == id)
        .collect()
}

fn ids(report: &Value) -> Vec<String> {
    let mut v: Vec<String> = report["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| f["id"].as_str().unwrap_or("").to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

fn path(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn ipvs_connections_of_the_shared_formats_against_the_kind_worker_example() {
    let Some(shared) = shared_ipvs() else { return };
    let case = shared.join("constructed-kind-worker-example");
    let real = testdata_ipvs().join("constructed-kind-worker-example");
    let formats = shared.join("formats");
    let dir = tempfile::tempdir().expect("tempdir");
    let (config, listing) = (case.join("config.yaml"), case.join("expected.ipvsadm"));
    let verify = |state: &Path, extra: &[&str]| {
        let mut args = vec![
            "verify",
            "--node",
            "kind-worker",
            "-o",
            "json",
            "--state",
            path(state),
            "--config",
            path(&config),
            // The kernel read back kube-proxy's expected `-Ln` byte for byte (see tests/ipvs.rs).
            "--ipvsadm",
            path(&listing),
        ];
        args.extend(extra);
        kproxy(&args)
    };
    let lnc = formats.join("Lnc.constructed.txt");
    let lnc_pe = formats.join("Lnc-persistent-conn.constructed.txt");
    let empty = real.join("ipvsadm-Lnc.txt");
    let conns = [
        "--ipvsadm",
        path(&lnc),
        "--ipvsadm",
        path(&lnc_pe),
        "--ipvsadm",
        path(&empty),
    ];

    // The node as the API has it: every connection goes to a serving endpoint, except the SCTP
    // one through 10.96.77.1:9999, which no service has (its destination is in clusterCIDR).
    let out = verify(&case.join("state.json"), &conns);
    let r = report(&out);
    assert_eq!(ids(&r), vec!["KP605"], "{r:#}");
    assert_eq!(out.status.code(), Some(1));
    let f = findings(&r, "KP605")[0];
    assert_eq!(f["chain"], "ipvs sctp 10.96.77.1:9999");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .starts_with("1 SCTP flow to 10.96.77.1:9999, an address and port no service has, still go to real server 10.244.1.7:9999; still in the table: 1 ESTABLISHED, expiring in up to 3 s"),
        "{f:#}"
    );
    // Without the connection listings the same node is clean.
    let out = verify(&case.join("state.json"), &[]);
    assert_eq!((out.status.code(), ids(&report(&out))), (Some(0), vec![]));

    // kube-dns's endpoint 10.244.0.3 leaves the API, and kube-proxy has not synced: its real
    // servers are still there (KP506), the UDP connection of `-Lnc` still goes to it (KP601 from
    // the IPVS table) and so does the flow's conntrack entry (KP601 from the conntrack table,
    // with its exact `conntrack -D`); the TCP connection to 10.244.0.2 is fine.
    let mut state: Value = serde_json::from_str(
        &std::fs::read_to_string(case.join("state.json")).expect("state.json"),
    )
    .expect("state is JSON");
    for item in state["items"].as_array_mut().expect("items") {
        if item["kind"] == "EndpointSlice" && item["metadata"]["name"] == "kube-dns-x7k2p" {
            item["endpoints"]
                .as_array_mut()
                .expect("endpoints")
                .retain(|e| e["addresses"][0] != "10.244.0.3");
        }
    }
    let removed = dir.path().join("state.json");
    std::fs::write(&removed, state.to_string()).expect("write state");
    // `conntrack -L` of the same flow (IPVS with net.ipv4.vs.conntrack=1 keeps its NAT there).
    let ct = dir.path().join("conntrack.txt");
    std::fs::write(
        &ct,
        "udp      17 29 src=10.244.1.9 dst=10.96.0.10 sport=38211 dport=53 packets=3 bytes=183 src=10.244.0.3 dst=10.244.1.9 sport=53 dport=38211 packets=3 bytes=297 mark=0 use=1\n\
         tcp      6 86398 ESTABLISHED src=10.244.1.9 dst=10.96.0.1 sport=45678 dport=443 packets=9 bytes=1200 src=172.18.0.2 dst=10.244.1.9 sport=6443 dport=45678 packets=8 bytes=4100 [ASSURED] mark=0 use=1\n",
    )
    .expect("write listing");
    let mut extra = conns.to_vec();
    extra.extend(["--conntrack", path(&ct)]);
    let out = verify(&removed, &extra);
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        ids(&r).contains(&"KP506".to_string()),
        "the stale real servers: {r:#}"
    );
    let stale = findings(&r, "KP601");
    let chains: Vec<&str> = stale.iter().map(|f| f["chain"].as_str().unwrap()).collect();
    assert_eq!(
        chains,
        vec!["conntrack udp 10.96.0.10:53", "ipvs udp 10.96.0.10:53"],
        "{r:#}"
    );
    let (ct_finding, ipvs_finding) = (stale[0], stale[1]);
    assert!(
        ct_finding["hint"].as_str().unwrap().ends_with(
            "conntrack -D -f ipv4 -p udp --orig-dst 10.96.0.10 --orig-port-dst 53 --reply-src 10.244.0.3 --reply-port-src 53"
        ),
        "{ct_finding:#}"
    );
    let message = ipvs_finding["message"].as_str().unwrap();
    assert!(
        message.contains("still go to real server 10.244.0.3:53")
            && message.contains("1 UDP, expiring in up to 299 s")
            && message.contains("still a real server of the virtual server (weight 1)"),
        "{message}"
    );
    assert_eq!(ipvs_finding["service"], "kube-system/kube-dns:dns");
    assert!(
        ipvs_finding["hint"]
            .as_str()
            .unwrap()
            .contains("ipvsadm -d -u 10.96.0.10:53 -r 10.244.0.3:53"),
        "{ipvs_finding:#}"
    );
    assert!(findings(&r, "KP602").is_empty(), "{r:#}");
}

/// The VM's part: a UDP "syslog" virtual server with two real servers and a DNS one; a syslog
/// daemon forwarding to it from one socket (one source port: one connection), DNS lookups; then
/// the real server of the syslog connection deleted as kube-proxy deletes a UDP real server.
const VM_SCRIPT: &str = r#"
step() { name=$1; shift; echo "=== BEGIN $name ==="; "$@" 2>&1; rc=$?; echo "=== END $name rc=$rc ==="; }
dumps() { step $1-ln ipvsadm -Ln; step $1-lnc ipvsadm -Lnc; step $1-ct conntrack -L -o extended; }
modprobe nf_conntrack_netlink
# kube-proxy's sysctl; expire_nodest_conn starts at the kernel's default (0).
echo 1 > /proc/sys/net/ipv4/vs/conntrack
echo 0 > /proc/sys/net/ipv4/vs/expire_nodest_conn
# Rules that make the kernel track connections, as kube-proxy's do.
iptables -t nat -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE
iptables -A OUTPUT -m conntrack --ctstate INVALID -j DROP
ip link add kube-ipvs0 type dummy; ip link set kube-ipvs0 up
ip addr add 10.96.0.10/32 dev kube-ipvs0; ip addr add 10.96.0.20/32 dev kube-ipvs0
ip link add eth0 type dummy; ip link set eth0 up; ip addr add 192.168.77.2/24 dev eth0
ip route add 10.244.1.0/24 dev eth0
ipvsadm -A -u 10.96.0.20:514 -s rr
ipvsadm -a -u 10.96.0.20:514 -r 10.244.1.10:514 -m -w 1
ipvsadm -a -u 10.96.0.20:514 -r 10.244.1.11:514 -m -w 1
ipvsadm -A -u 10.96.0.10:53 -s rr
ipvsadm -a -u 10.96.0.10:53 -r 10.244.1.12:53 -m -w 1
busybox syslogd -n -R 10.96.0.20:514 -O /tmp/messages &
sleep 1
busybox logger m1
busybox timeout 2 busybox nslookup kubernetes 10.96.0.10 >/dev/null 2>&1
busybox timeout 2 busybox nslookup kubernetes 10.96.0.10 >/dev/null 2>&1
sleep 1
dumps before
stale=$(ipvsadm -Lnc | awk '$5=="10.96.0.20:514"{print $6}' | head -1)
echo "stale=$stale"
ipvsadm -d -u 10.96.0.20:514 -r $stale
busybox logger m2; sleep 1
dumps removed
step ct-delete conntrack -D -p udp --orig-dst 10.96.0.20 --orig-port-dst 514 --reply-src ${stale%:*}
busybox logger m3; sleep 1
dumps ct-deleted
echo 1 > /proc/sys/net/ipv4/vs/expire_nodest_conn
busybox logger m4; sleep 1
busybox logger m5; sleep 1
dumps expired
"#;

/// The VM's services: syslog (UDP 514 → `syslog`) and dns (UDP 53 → 10.244.1.12).
fn vm_state(syslog: &[&str]) -> Value {
    let service = |name: &str, ip: &str, port: u16, endpoints: &[&str]| {
        [
            json!({"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": name, "namespace": "vm"},
                   "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                            "ipFamilies": ["IPv4"],
                            "ports": [{"name": "p", "port": port, "targetPort": port, "protocol": "UDP"}]}}),
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                   "metadata": {"name": format!("{name}-1"), "namespace": "vm",
                                "labels": {"kubernetes.io/service-name": name}},
                   "addressType": "IPv4",
                   "endpoints": endpoints.iter().map(|a| json!({"addresses": [a],
                        "conditions": {"ready": true, "serving": true, "terminating": false}})).collect::<Vec<_>>(),
                   "ports": [{"name": "p", "port": port, "protocol": "UDP"}]}),
        ]
    };
    let mut items: Vec<Value> = Vec::new();
    items.extend(service("syslog", "10.96.0.20", 514, syslog));
    items.extend(service("dns", "10.96.0.10", 53, &["10.244.1.12"]));
    items.push(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "vm"},
                      "status": {"addresses": [{"type": "InternalIP", "address": "192.168.77.2"}]}}));
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

#[test]
fn ipvs_stale_udp_connection_on_a_real_kernel_vm() {
    let Some(shared) = shared_ipvs() else { return };
    if let Some(why) = missing_vm_tools(&["conntrack"]) {
        crate::support::skip("conntrack_ipvs", &format!("the IPVS VM test: {why}"));
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let stdout = run_in_vm(&shared, VM_SCRIPT, &[]);
    let secs = sections(&stdout);
    let dump = |name: &str| -> PathBuf {
        let (_, body, rc) = secs
            .iter()
            .find(|(n, _, _)| n == name)
            .unwrap_or_else(|| panic!("no section {name} in the VM output:\n{stdout}"));
        assert_eq!(*rc, 0, "{name}: {body}");
        let p = dir.path().join(format!("{name}.txt"));
        std::fs::write(&p, body).expect("write dump");
        p
    };
    let stale = stdout
        .lines()
        .find_map(|l| l.strip_prefix("stale="))
        .unwrap_or_else(|| panic!("no stale= line:\n{stdout}"))
        .to_string();
    let stale_ip = stale.split(':').next().expect("ip");
    let keep_ip = if stale_ip == "10.244.1.10" {
        "10.244.1.11"
    } else {
        "10.244.1.10"
    };
    let before_state = dir.path().join("before.json");
    std::fs::write(&before_state, vm_state(&[stale_ip, keep_ip]).to_string()).expect("state");
    let after_state = dir.path().join("after.json");
    std::fs::write(&after_state, vm_state(&[keep_ip]).to_string()).expect("state");
    let config = dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n",
    )
    .expect("config");
    let verify = |state: &Path, at: &str| {
        let (ln, lnc, ct) = (
            dump(&format!("{at}-ln")),
            dump(&format!("{at}-lnc")),
            dump(&format!("{at}-ct")),
        );
        let out = kproxy(&[
            "verify",
            "--node",
            "vm",
            "-o",
            "json",
            "--state",
            path(state),
            "--config",
            path(&config),
            "--ipvsadm",
            path(&ln),
            "--ipvsadm",
            path(&lnc),
            "--conntrack",
            path(&ct),
        ]);
        let r = report(&out);
        println!("--- {at} ---\n{}", std::fs::read_to_string(&lnc).unwrap());
        (out.status.code(), r, std::fs::read_to_string(&lnc).unwrap())
    };
    let syslog_lines = |lnc: &str| -> Vec<String> {
        lnc.lines()
            .filter(|l| l.contains(" 10.96.0.20:514 "))
            .map(str::to_string)
            .collect()
    };

    // Before: the syslog connection and the DNS lookups all go to serving endpoints.
    let (code, r, lnc) = verify(&before_state, "before");
    assert_eq!((code, ids(&r)), (Some(0), vec![]), "{r:#}");
    let first = syslog_lines(&lnc);
    assert_eq!(first.len(), 1, "one source port, one connection: {lnc}");
    assert!(first[0].ends_with(&format!(" {stale}")), "{lnc}");
    assert!(lnc.matches(" 10.96.0.10:53 ").count() >= 2, "{lnc}");

    // The endpoint leaves the API and its real server is deleted (kube-proxy's way for UDP):
    // the connection stays on it, and so does the flow's conntrack entry.
    let (code, r, lnc) = verify(&after_state, "removed");
    assert_eq!(code, Some(1));
    assert_eq!(ids(&r), vec!["KP601"], "{r:#}");
    let stale_findings = findings(&r, "KP601");
    let chains: Vec<&str> = stale_findings
        .iter()
        .map(|f| f["chain"].as_str().unwrap())
        .collect();
    assert_eq!(
        chains,
        vec!["conntrack udp 10.96.0.20:514", "ipvs udp 10.96.0.20:514"],
        "{r:#}"
    );
    let ipvs = stale_findings[1];
    let message = ipvs["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "1 UDP flow to 10.96.0.20:514 (cluster IP of vm/syslog:p) still go to real server {stale}, which is not a serving endpoint of it; still in the table: 1 UDP"
        )) && message.contains("no longer a real server of the virtual server"),
        "{message}"
    );
    assert_eq!(syslog_lines(&lnc).len(), 1);

    // Deleting the flow's conntrack entry does not end the IPVS connection: the next packet is
    // dropped and the connection still names the gone real server.
    dump("ct-delete");
    let (code, r, lnc) = verify(&after_state, "ct-deleted");
    assert_eq!(code, Some(1));
    let chains: Vec<String> = findings(&r, "KP601")
        .iter()
        .map(|f| f["chain"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(chains, vec!["ipvs udp 10.96.0.20:514"], "{r:#}");
    let held = syslog_lines(&lnc);
    assert!(
        held.len() == 1 && held[0].ends_with(&format!(" {stale}")),
        "{lnc}"
    );

    // With expire_nodest_conn=1, as kube-proxy sets it, the next packets end the connection
    // and the flow goes on to the serving real server: verify is clean.
    let (code, r, lnc) = verify(&after_state, "expired");
    assert_eq!((code, ids(&r)), (Some(0), vec![]), "{r:#}");
    // The ended connection may stay listed beside its replacement until it expires (up to a
    // minute, `expire_nodest_conn`): the longest-lived one is the flow's.
    let moved = syslog_lines(&lnc);
    let expires = |l: &String| l.split_whitespace().nth(1).unwrap_or_default().to_string();
    let newest = moved.iter().max_by_key(|l| expires(l));
    assert!(
        newest.is_some_and(|l| l.ends_with(&format!(" {keep_ip}:514")))
            && moved
                .iter()
                .filter(|l| Some(*l) != newest)
                .all(|l| expires(l).as_str() <= "01:00"),
        "{lnc}"
    );
}
