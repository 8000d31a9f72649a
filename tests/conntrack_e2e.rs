//! Stale conntrack entries on a real kernel, end to end: a client namespace, a node namespace
//! holding kube-proxy's rules (our `render --with-base-jumps`, restored with the real
//! `iptables-restore`) and two endpoint namespaces behind it.
//!
//! UDP: a client socket keeps sending to the cluster IP from one source port, so all its
//! datagrams share one conntrack entry. Its endpoint is then removed from the API state and the
//! rules re-rendered and restored — the client still reaches the old endpoint (the entry keeps the
//! DNAT). `verify --conntrack` reports the stale flow (exit 1), `trace --conntrack` shows it next
//! to the endpoint the rules pick now, `repair --local --apply` deletes exactly the stale entries
//! (every other entry of the table survives) and the next datagram reaches the remaining endpoint.
//! TCP: the same removal gives an info finding only, and repair leaves the connections alone.
//! Through the API (`repair NODE`, a fake apiserver whose kube-proxy pod execs into the node
//! namespace): the collector's listing is planned and the exact deletion runs in the pod.

use crate::support::fake_apiserver::{ExecReply, ExecRequest, FakeApiServer};
use crate::support::netns::{
    Backend, Netns, Pod, Topology, addr, require_root_and_tools, tool_path,
};
use crate::support::repair::{expect_exit, text};
use kproxy::parsers::conntrack::{Flow, ParseOptions, parse};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub(crate) const NODE_IP: &str = "192.168.77.2";
pub(crate) const DNS: &str = "10.96.50.10:53";
const WEB: &str = "10.96.50.20:80";

/// A Service with one port and the EndpointSlice of `endpoints` (pod IPs) on `target`.
pub(crate) fn service(
    name: &str,
    ip: &str,
    port: u16,
    target: u16,
    proto: &str,
    endpoints: &[&str],
) -> [Value; 2] {
    [
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "e2e"},
            "spec": {
                "type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip], "ipFamilies": ["IPv4"],
                "ports": [{"name": "p", "port": port, "targetPort": target, "protocol": proto}],
            },
        }),
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-1"), "namespace": "e2e",
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "endpoints": endpoints.iter().map(|a| json!({
                "addresses": [a], "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": "node-1",
            })).collect::<Vec<_>>(),
            "ports": [{"name": "p", "port": target, "protocol": proto}],
        }),
    ]
}

/// The API state: `udp-dns` (UDP 53 → 5353) and `web` (TCP 80 → 8080) with the given endpoints,
/// and the node.
fn state(dns: &[&str], web: &[&str]) -> Value {
    let mut items: Vec<Value> = Vec::new();
    items.extend(service("udp-dns", "10.96.50.10", 53, 5353, "UDP", dns));
    items.extend(service("web", "10.96.50.20", 80, 8080, "TCP", web));
    items.push(json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
        "spec": {"podCIDRs": ["10.244.1.0/24"]},
        "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]},
    }));
    json!({"apiVersion": "v1", "kind": "List", "items": items})
}

fn write_state(dir: &Path, name: &str, v: &Value) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, v.to_string()).expect("write state");
    p
}

fn kproxy(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()
        .expect("run kubectl-kproxy")
}

/// The node facts every command gets.
/// The node's facts; the release is named, as the rules are the newest kube-proxy's (render's
/// default), so verify adds no note of an inferred release.
const FACTS: [&str; 8] = [
    "--node",
    "node-1",
    "--node-ip",
    NODE_IP,
    "--nfacct",
    "none",
    "--kube-proxy-version",
    "1.35",
];

/// Renders `state` with kube-proxy's base jumps and restores it into the node (whole tables),
/// for both families as kube-proxy's two proxiers do (the IPv6 one has no services here).
fn install_rules(node: &Netns, state: &Path) {
    for family in ["4", "6"] {
        let mut args = vec![
            "render",
            "--with-base-jumps",
            "--ip-family",
            family,
            "--state",
            state.to_str().unwrap(),
        ];
        args.extend(FACTS);
        let out = kproxy(&args);
        expect_exit(&out, 0, "render");
        let rules = String::from_utf8_lossy(&out.stdout);
        let restored = if family == "4" {
            node.restore(Backend::Nft, &rules, false)
        } else {
            node.restore6(Backend::Nft, &rules, false)
        };
        restored.expect("iptables-restore of the render");
    }
}

/// `conntrack -L -o extended` of the node, as text and written to `dir/name`.
pub(crate) fn listing(node: &Netns, dir: &Path, name: &str) -> (String, PathBuf) {
    let text = node
        .run(&["conntrack", "-L", "-o", "extended"])
        .expect("conntrack -L");
    let path = dir.join(name);
    std::fs::write(&path, &text).expect("write listing");
    (text, path)
}

pub(crate) fn flows(text: &str) -> Vec<Flow<'_>> {
    parse(text, ParseOptions::strict())
        .expect("listing parses")
        .flows
}

/// A flow's identity: protocol and original tuple (what stays the same while it lives).
pub(crate) fn key(f: &Flow<'_>) -> String {
    format!("{} {:?}", f.protocol, f.original)
}

/// A UDP socket of the client, bound to `port`, that keeps its source port (one conntrack entry).
pub(crate) fn client_socket(client: &Netns, port: u16) -> UdpSocket {
    client
        .in_ns(move || {
            let s = UdpSocket::bind(("0.0.0.0", port)).expect("bind client socket");
            s.set_read_timeout(Some(Duration::from_millis(800)))
                .expect("timeout");
            s
        })
        .expect("socket in the client namespace")
}

/// Sends one datagram to `dst` and returns the name of the echo server that answered.
pub(crate) fn ask(sock: &UdpSocket, dst: SocketAddr) -> Option<String> {
    sock.send_to(b"ping\n", dst).ok()?;
    let mut buf = [0u8; 512];
    let n = sock.recv(&mut buf).ok()?;
    let line = String::from_utf8_lossy(buf.get(..n)?).into_owned();
    let mut words = line.split_whitespace();
    (words.next() == Some("kproxy-echo")).then(|| words.next().map(str::to_string))?
}

/// A bounded loop of `n` datagrams from `sock`: the servers that answered.
pub(crate) fn ask_many(sock: &UdpSocket, dst: SocketAddr, n: usize) -> Vec<Option<String>> {
    (0..n)
        .map(|_| {
            let r = ask(sock, dst);
            std::thread::sleep(Duration::from_millis(20));
            r
        })
        .collect()
}

pub(crate) fn topology(name: &str) -> Topology {
    Topology::builder(name)
        .node_addrs(&["192.168.77.2/24"])
        .client_addrs(&["192.168.77.3/24"])
        .pod(Pod::new("dns-a", "10.244.1.10").udp(5353))
        .pod(Pod::new("dns-b", "10.244.1.11").udp(5353))
        .pod(Pod::new("web-a", "10.244.1.20").tcp(8080))
        .pod(Pod::new("web-b", "10.244.1.21").tcp(8080))
        .build()
        .expect("topology")
}

pub(crate) fn pod_ip(name: &str) -> &'static str {
    match name {
        "dns-a" => "10.244.1.10",
        "dns-b" => "10.244.1.11",
        "web-a" => "10.244.1.20",
        "web-b" => "10.244.1.21",
        _ => panic!("no pod {name}"),
    }
}

pub(crate) fn other(name: &str) -> &'static str {
    match name {
        "dns-a" => "dns-b",
        "dns-b" => "dns-a",
        "web-a" => "web-b",
        "web-b" => "web-a",
        _ => panic!("no pod {name}"),
    }
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(o)))
}

fn ids(report: &Value) -> Vec<String> {
    report["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|f| f["id"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn tools() -> Vec<&'static str> {
    let mut t = vec!["conntrack"];
    t.extend(Backend::Nft.tools());
    t
}

/// A UDP client pinned to an endpoint the API no longer has: the node's rules are the render of
/// the state without it, the client's entry still DNATs to it.
struct Blackhole {
    topo: Topology,
    dir: tempfile::TempDir,
    /// The client socket under test (source port 40001).
    sock: UdpSocket,
    /// Sockets of other clients and a flow straight to a pod, kept open.
    _others: Vec<UdpSocket>,
    /// The removed endpoint's pod.
    stale: String,
    /// The remaining endpoint's pod.
    keep: &'static str,
    /// The state without the removed endpoint.
    after: PathBuf,
    /// The node's `iptables-save` after the re-render.
    save: PathBuf,
}

/// Builds the [`Blackhole`]: rules for both endpoints, the client's bounded loop (one endpoint),
/// other clients, the endpoint removed and the rules re-rendered and restored, and the client
/// observed still reaching the removed endpoint while a new client reaches the other one.
fn udp_blackhole(prefix: &str) -> Blackhole {
    let dir = tempfile::tempdir().expect("tempdir");
    let topo = topology(prefix);
    let node = topo.node();
    let both = write_state(
        dir.path(),
        "both.json",
        &state(
            &["10.244.1.10", "10.244.1.11"],
            &["10.244.1.20", "10.244.1.21"],
        ),
    );
    install_rules(node, &both);

    // The client under test: one source port, a bounded loop of datagrams, one endpoint.
    let dns = addr(DNS);
    let sock = client_socket(topo.client(), 40001);
    let first = ask_many(&sock, dns, 5);
    let stale = first[0].clone().expect("the service answers");
    assert!(
        first.iter().all(|s| s.as_deref() == Some(stale.as_str())),
        "one entry, one endpoint: {first:?}"
    );
    // Other clients (other source ports) and a flow straight to a pod: entries that must survive
    // unless they, too, go to the endpoint that is removed.
    let mut others: Vec<UdpSocket> = (40002..40010)
        .map(|p| client_socket(topo.client(), p))
        .collect();
    for s in &others {
        assert!(ask(s, dns).is_some(), "other clients get answers");
    }
    let direct = client_socket(topo.client(), 40100);
    let keep = other(&stale);
    let keep_ip = pod_ip(keep);
    assert_eq!(
        ask(&direct, SocketAddr::new(keep_ip.parse().unwrap(), 5353)).as_deref(),
        Some(keep)
    );
    others.push(direct);

    // The endpoint goes away: the API no longer has it, and the rules are re-rendered.
    let stale_ip = pod_ip(&stale);
    let remaining: Vec<&str> = ["10.244.1.10", "10.244.1.11"]
        .into_iter()
        .filter(|ip| *ip != stale_ip)
        .collect();
    let after = write_state(
        dir.path(),
        "after.json",
        &state(&remaining, &["10.244.1.20", "10.244.1.21"]),
    );
    install_rules(node, &after);
    let save = dir.path().join("iptables-save.txt");
    std::fs::write(&save, node.run(&["iptables-nft-save"]).expect("save")).expect("write save");
    // The blackhole: the client's datagrams still reach the removed endpoint.
    let still = ask_many(&sock, dns, 5);
    assert!(
        still.iter().all(|s| s.as_deref() == Some(stale.as_str())),
        "the entry keeps the old DNAT: {still:?}"
    );
    // A new client already goes to the endpoint the rules pick now.
    let fresh = client_socket(topo.client(), 40200);
    assert_eq!(ask(&fresh, dns).as_deref(), Some(keep));
    others.push(fresh);
    Blackhole {
        topo,
        dir,
        sock,
        _others: others,
        stale,
        keep,
        after,
        save,
    }
}

/// The flows of a listing that go through the cluster IP to `reply_ip`.
pub(crate) fn through_dns_to<'a>(flows: &'a [Flow<'a>], reply_ip: &str) -> Vec<&'a Flow<'a>> {
    flows
        .iter()
        .filter(|f| {
            f.protocol == 17
                && f.original.dst.to_string() == "10.96.50.10"
                && f.reply.src.to_string() == reply_ip
        })
        .collect()
}

/// The exact deletion of the stale entries of a [`Blackhole`].
fn delete_command(stale_ip: &str) -> String {
    format!(
        "conntrack -D -f ipv4 -p udp --orig-dst 10.96.50.10 --orig-port-dst 53 --reply-src {stale_ip} --reply-port-src 5353"
    )
}

#[test]
fn stale_udp_flow_is_found_and_cleared_exactly() {
    if !require_root_and_tools(&tools()) {
        return;
    }
    let b = udp_blackhole("ct-udp");
    let (node, dir, sock, dns) = (b.topo.node(), &b.dir, &b.sock, addr(DNS));
    let (after, save, stale, keep) = (&b.after, &b.save, &b.stale, b.keep);
    let (stale_ip, keep_ip) = (pod_ip(stale), pod_ip(keep));

    // verify reports the stale flow, and nothing else is wrong.
    let (before_text, before_path) = listing(node, dir.path(), "before.txt");
    let before = flows(&before_text);
    let stale_flows = through_dns_to(&before, stale_ip);
    assert!(
        !stale_flows.is_empty()
            && stale_flows
                .iter()
                .any(|f| f.original.sport() == Some(40001))
    );
    let mut args = vec![
        "verify",
        "--state",
        after.to_str().unwrap(),
        "--iptables-save",
        save.to_str().unwrap(),
        "--conntrack",
        before_path.to_str().unwrap(),
        "-o",
        "json",
    ];
    args.extend(FACTS);
    let v = kproxy(&args);
    expect_exit(&v, 1, "verify --conntrack");
    let report = json_of(&v);
    assert_eq!(ids(&report), vec!["KP601".to_string()], "{report:#}");
    let f = &report["findings"][0];
    assert_eq!(f["service"], "e2e/udp-dns:p");
    assert_eq!(f["severity"], "error");
    assert!(
        f["message"]
            .as_str()
            .unwrap()
            .contains(&format!("{} UDP flow", stale_flows.len())),
        "{f}"
    );
    assert!(
        f["actual"]
            .as_str()
            .unwrap()
            .contains(&format!("reply source {stale_ip}:5353")),
        "{f}"
    );
    let command = delete_command(stale_ip);
    assert!(f["hint"].as_str().unwrap().ends_with(&command), "{f}");

    // The same through a bundle: `collect --collector local` run on the node (in its namespace)
    // fetches `conntrack -L -o extended` with the rules; `verify --bundle` reports the same.
    let bundle = dir.path().join("bundle.tar.gz");
    let collected = node
        .command(&[
            env!("CARGO_BIN_EXE_kubectl-kproxy"),
            "collect",
            "node-1",
            "--collector",
            "local",
            "--state",
            after.to_str().unwrap(),
            "-o",
            bundle.to_str().unwrap(),
        ])
        .output()
        .expect("run collect in the node");
    expect_exit(&collected, 0, "collect --collector local");
    let carried = kproxy::collect::bundle::read(&bundle).expect("bundle");
    let carried = carried
        .snapshot
        .conntrack
        .expect("the bundle carries the conntrack table");
    assert!(
        flows(&carried)
            .iter()
            .any(|f| f.original.sport() == Some(40001))
    );
    let mut args = vec!["verify", "--bundle", bundle.to_str().unwrap(), "-o", "json"];
    args.extend(FACTS);
    let v = kproxy(&args);
    expect_exit(&v, 1, "verify --bundle");
    assert_eq!(ids(&json_of(&v)), vec!["KP601".to_string()], "{}", text(&v));

    // trace: live flows per endpoint, and the stale ones where no rule goes.
    let t = kproxy(&[
        "trace",
        "svc/udp-dns",
        "-n",
        "e2e",
        "--iptables-save",
        save.to_str().unwrap(),
        "--conntrack",
        before_path.to_str().unwrap(),
        "-o",
        "json",
    ]);
    expect_exit(&t, 1, "trace --conntrack (stale UDP flows diverge)");
    let view = json_of(&t);
    let entry = &view["ports"][0]["entries"][0];
    let ep = &entry["branches"][0]["endpoints"][0];
    assert_eq!(ep["destination"], format!("{keep_ip}:5353"));
    let live_keep = before
        .iter()
        .filter(|f| {
            f.original.dst.to_string() == "10.96.50.10" && f.reply.src.to_string() == keep_ip
        })
        .count();
    assert_eq!(ep["live_flows"], live_keep);
    assert_eq!(
        entry["other_flows"][0]["reply_source"],
        format!("{stale_ip}:5353")
    );
    assert_eq!(entry["other_flows"][0]["flows"], stale_flows.len());

    // repair: dry run lists the command; --apply deletes exactly the stale entries.
    let mut args = vec![
        "repair",
        "--local",
        "--netns",
        node.name(),
        "--backend",
        "nft",
        "--backup-dir",
        dir.path().to_str().unwrap(),
        "--state",
        after.to_str().unwrap(),
    ];
    args.extend(FACTS);
    let dry = kproxy(&args);
    expect_exit(&dry, 1, "repair dry run");
    let dry_text = String::from_utf8_lossy(&dry.stdout);
    assert!(
        dry_text.contains(&command) && dry_text.contains("dry run: nothing changed"),
        "{}",
        text(&dry)
    );
    assert_eq!(
        flows(&listing(node, dir.path(), "dry.txt").0).len(),
        before.len(),
        "a dry run deletes nothing"
    );
    args.push("--apply");
    let applied = kproxy(&args);
    expect_exit(&applied, 0, "repair --apply");
    let out = String::from_utf8_lossy(&applied.stdout);
    assert!(
        out.contains(&format!(
            "deleted {}; listed again: 0 left",
            stale_flows.len()
        )),
        "{}",
        text(&applied)
    );
    let (after_text, _) = listing(node, dir.path(), "after.txt");
    let after_flows = flows(&after_text);
    let stale_keys: BTreeSet<String> = stale_flows.iter().map(|f| key(f)).collect();
    let expected: BTreeSet<String> = before
        .iter()
        .map(key)
        .filter(|k| !stale_keys.contains(k))
        .collect();
    let got: BTreeSet<String> = after_flows.iter().map(key).collect();
    assert_eq!(got, expected, "exactly the stale entries are gone");

    // The next datagram makes a new entry through the current rules: the remaining endpoint.
    let next = ask_many(sock, dns, 3);
    assert!(next.iter().all(|s| s.as_deref() == Some(keep)), "{next:?}");
}

#[test]
fn stale_tcp_connections_are_info_and_left_alone() {
    if !require_root_and_tools(&tools()) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let topo = topology("ct-tcp");
    let node = topo.node();
    let both = write_state(
        dir.path(),
        "both.json",
        &state(
            &["10.244.1.10", "10.244.1.11"],
            &["10.244.1.20", "10.244.1.21"],
        ),
    );
    install_rules(node, &both);
    let web = addr(WEB);
    let probe = crate::support::netns::Probe::default().timeout(Duration::from_millis(800));
    let tally = topo
        .client()
        .connect_many(&probe, web, 12)
        .expect("connections");
    assert_eq!(tally.ok(), 12, "{tally:?}");
    // Remove an endpoint that got connections.
    let gone = if tally.count("web-a") > 0 {
        "web-a"
    } else {
        "web-b"
    };
    let gone_ip = pod_ip(gone);
    let remaining: Vec<&str> = ["10.244.1.20", "10.244.1.21"]
        .into_iter()
        .filter(|ip| *ip != gone_ip)
        .collect();
    let after = write_state(
        dir.path(),
        "after.json",
        &state(&["10.244.1.10", "10.244.1.11"], &remaining),
    );
    install_rules(node, &after);
    let save = dir.path().join("iptables-save.txt");
    std::fs::write(&save, node.run(&["iptables-nft-save"]).expect("save")).expect("write save");

    let (before_text, before_path) = listing(node, dir.path(), "before.txt");
    let before = flows(&before_text);
    let stale = before
        .iter()
        .filter(|f| {
            f.protocol == 6
                && f.original.dst.to_string() == "10.96.50.20"
                && f.reply.src.to_string() == gone_ip
        })
        .count();
    assert_eq!(
        stale,
        tally.count(gone),
        "one entry per connection (TIME_WAIT)"
    );
    let mut args = vec![
        "verify",
        "--state",
        after.to_str().unwrap(),
        "--iptables-save",
        save.to_str().unwrap(),
        "--conntrack",
        before_path.to_str().unwrap(),
        "-o",
        "json",
    ];
    args.extend(FACTS);
    let v = kproxy(&args);
    expect_exit(&v, 0, "verify --conntrack: TCP is info only");
    let report = json_of(&v);
    assert_eq!(ids(&report), vec!["KP602".to_string()], "{report:#}");
    assert_eq!(report["findings"][0]["severity"], "info");

    let mut args = vec![
        "repair",
        "--local",
        "--netns",
        node.name(),
        "--backend",
        "nft",
        "--apply",
        "--backup-dir",
        dir.path().to_str().unwrap(),
        "--state",
        after.to_str().unwrap(),
    ];
    args.extend(FACTS);
    let r = kproxy(&args);
    expect_exit(&r, 0, "repair --apply");
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(
        out.contains("conntrack: no stale flow group to delete")
            && out.contains("1 stale TCP group(s) left alone"),
        "{}",
        text(&r)
    );
    let after_keys: BTreeSet<String> = flows(&listing(node, dir.path(), "after.txt").0)
        .iter()
        .map(key)
        .collect();
    let before_keys: BTreeSet<String> = before.iter().map(key).collect();
    assert_eq!(after_keys, before_keys, "TCP entries are left alone");
}

/// The exec handler of a fake kube-proxy pod on the node: iptables (the image's plain tools
/// are the nft backend), `conntrack` and `cat /proc/net/nf_conntrack` run for real in `ns`, with
/// the stdin received; anything else is missing from the "image".
fn pod_exec(ns: String) -> impl Fn(&ExecRequest) -> ExecReply + Send + Sync + 'static {
    move |req: &ExecRequest| {
        let argv: Vec<&str> = req.command.iter().map(String::as_str).collect();
        let program = match argv.first().copied() {
            Some("iptables-save") => "iptables-nft-save",
            Some("ip6tables-save") => "ip6tables-nft-save",
            Some("iptables-restore") => "iptables-nft-restore",
            Some("ip6tables-restore") => "ip6tables-nft-restore",
            Some(p @ ("iptables-nft-save" | "ip6tables-nft-save" | "conntrack")) => p,
            Some("cat") if argv == ["cat", "/proc/net/nf_conntrack"] => "cat",
            _ => return ExecReply::Missing,
        };
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns, program])
            .args(argv.get(1..).unwrap_or_default())
            .env("PATH", tool_path())
            .env("LC_ALL", "C")
            .stdin(if req.stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn ip netns exec");
        if let (Some(mut pipe), Some(input)) = (child.stdin.take(), req.stdin.as_deref()) {
            let _ = pipe.write_all(input);
        }
        let out = child.wait_with_output().expect("wait");
        ExecReply::Output {
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            exit_code: out.status.code().unwrap_or(-1),
        }
    }
}

#[test]
fn stale_udp_flow_is_cleared_through_the_api() {
    if !require_root_and_tools(&tools()) {
        return;
    }
    let b = udp_blackhole("ct-remote");
    let node = b.topo.node();
    let stale_ip = pod_ip(&b.stale);
    let api = FakeApiServer::start();
    api.add_list_file(&b.after);
    api.add_proxy_pod("node-1");
    api.on_exec(pod_exec(node.name().to_string()));
    let kubeconfig = api.write_kubeconfig(b.dir.path());
    let before_text = listing(node, b.dir.path(), "before.txt").0;
    let before = flows(&before_text);
    let stale_flows = through_dns_to(&before, stale_ip);
    assert!(!stale_flows.is_empty());
    let repair = |apply: bool| {
        let mut args = vec![
            "repair",
            "node-1",
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
            "--exec-timeout",
            "60s",
            "--backup-dir",
            b.dir.path().to_str().unwrap(),
            "--node-ip",
            NODE_IP,
        ];
        if apply {
            args.push("--apply");
        }
        kproxy(&args)
    };
    // The plan: the collector's listing, checked against the API's state; nothing deleted.
    let dry = repair(false);
    expect_exit(&dry, 1, "remote repair dry run");
    let command = delete_command(stale_ip);
    assert!(
        String::from_utf8_lossy(&dry.stdout).contains(&command),
        "{}",
        text(&dry)
    );
    assert!(
        !api.execs()
            .iter()
            .any(|e| e.command.get(1).map(String::as_str) == Some("-D"))
    );
    // --apply: the exact deletion runs in the pod, then the same filter is listed again.
    let applied = repair(true);
    expect_exit(&applied, 0, "remote repair --apply");
    assert!(
        String::from_utf8_lossy(&applied.stdout).contains(&format!(
            "deleted {}; listed again: 0 left",
            stale_flows.len()
        )),
        "{}",
        text(&applied)
    );
    let deletions: Vec<String> = api
        .execs()
        .iter()
        .filter(|e| e.command.get(1).map(String::as_str) == Some("-D"))
        .map(|e| e.command.join(" "))
        .collect();
    assert_eq!(deletions, vec![command]);
    let stale_keys: BTreeSet<String> = stale_flows.iter().map(|f| key(f)).collect();
    let expected: BTreeSet<String> = before
        .iter()
        .map(key)
        .filter(|k| !stale_keys.contains(k))
        .collect();
    let after_text = listing(node, b.dir.path(), "after.txt").0;
    let got: BTreeSet<String> = flows(&after_text).iter().map(key).collect();
    assert_eq!(got, expected, "exactly the stale entries are gone");
    let next = ask_many(&b.sock, addr(DNS), 3);
    assert!(
        next.iter().all(|s| s.as_deref() == Some(b.keep)),
        "{next:?}"
    );
}
