//! `graph --nft-ruleset` and `trace --nft-ruleset` through the built binary:
//!
//! - kube-proxy's nftables packet-flow vectors (`../shared/conformance/nftables/packetflow`):
//!   every packet with `--model kube-proxy-test`, as `conformance.py nft-packetflow` runs them,
//!   and the packets of the two cases whose tables were loaded into a kernel and listed back
//!   (`live/`) again on those `nft list ruleset` and `nft -j list ruleset` captures;
//! - every sample of `../shared/conformance/nftables/samples` gives a graph that names the
//!   service of each of its `service-…` chains;
//! - the path view (`trace svc/NAME`) of our own render of the example cluster: shares, pods,
//!   chain names, the API comparison, drift, and counters;
//! - the real kernel (root): the render of `testdata/trace-traffic` loaded with `nft -f` into the
//!   node namespace of the netns harness, beside a foreign `table ip skew` whose NAT chain runs
//!   first at the prerouting hook and splits one address 20% / 80%; `trace --packet --model
//!   kernel` on that namespace's `nft list ruleset` and `nft -j list ruleset` predicts the
//!   distribution over endpoints (chi-square against real TCP connections), the masquerading
//!   (the source the endpoints see) and the rejections real connections get.

use crate::support::netns::{
    Backend, Netns, Pod, Probe, Tally, Topology, addr, ip, require_root_and_tools,
};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Output;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn run(args: &[&str]) -> Output {
    crate::support::kproxy()
        .args(args)
        .output()
        .expect("run kubectl-kproxy")
}

/// Runs the binary; its stdout, or a panic with stderr when it exits non-zero.
pub(crate) fn kproxy(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "kubectl-kproxy {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

pub(crate) fn json(args: &[&str]) -> Value {
    serde_json::from_str(&kproxy(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

pub(crate) fn str_of<'v>(v: &'v Value, key: &str) -> &'v str {
    v.get(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("missing {key} in {v}"))
}

// ---- kube-proxy's packet-flow vectors ----------------------------------------------------------

/// `SRC->DST:PORT/proto` of a packet-flow packet (IPv6 destinations bracketed).
fn packet_arg(p: &Value) -> String {
    let dst = str_of(p, "dest_ip");
    let dst = if dst.contains(':') {
        format!("[{dst}]")
    } else {
        dst.to_string()
    };
    format!(
        "{}->{dst}:{}/{}",
        str_of(p, "source_ip"),
        p["dest_port"],
        str_of(p, "protocol").to_lowercase()
    )
}

/// Runs every packet of `case` through `trace --nft-ruleset rules --model kube-proxy-test`; the
/// packets whose `{"output","masq"}` differ from kube-proxy's, and how many were run.
fn score(name: &str, case: &Value, rules: &Path) -> (usize, Vec<String>) {
    let mut misses = Vec::new();
    let packets = case["packets"].as_array().expect("packets");
    for p in packets {
        let spec = packet_arg(p);
        let mut args = vec![
            "trace".to_string(),
            "--nft-ruleset".into(),
            rules.display().to_string(),
            "--packet".into(),
            spec,
            "--model".into(),
            "kube-proxy-test".into(),
            "-o".into(),
            "json".into(),
        ];
        for ip in case["tracer_local_ips"].as_array().into_iter().flatten() {
            args.push("--local-ip".into());
            args.push(ip.as_str().expect("ip").to_string());
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let got = json(&args);
        assert_eq!(got.as_object().map(|o| o.len()), Some(2), "{got}");
        if got["output"] != p["expected_output"] || got["masq"] != p["masq"] {
            misses.push(format!(
                "{name} / {}: got ({}, masq={}) want ({}, masq={})",
                str_of(p, "name"),
                got["output"],
                got["masq"],
                p["expected_output"],
                p["masq"]
            ));
        }
    }
    (packets.len(), misses)
}

fn packetflow_cases() -> Option<(PathBuf, Vec<(String, Value)>)> {
    let dir = crate::support::shared("nft_packetflow", "conformance/nftables/packetflow")?;
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read packetflow dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let cases = files
        .into_iter()
        .map(|p| {
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let name = p.file_stem().unwrap_or_default().to_string_lossy().into();
            (name, serde_json::from_str(&text).expect("case json"))
        })
        .collect();
    Some((dir, cases))
}

#[test]
fn nft_packetflow_every_packet_through_the_binary() {
    let Some((_, cases)) = packetflow_cases() else {
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let (mut total, mut misses) = (0, Vec::new());
    for (name, case) in &cases {
        let rules = tmp.path().join(format!("{name}.nft"));
        std::fs::write(&rules, str_of(case, "ruleset")).expect("write ruleset");
        let (n, mut m) = score(name, case, &rules);
        total += n;
        misses.append(&mut m);
    }
    assert!(
        cases.len() >= 28 && total >= 150,
        "{} cases, {total} packets",
        cases.len()
    );
    assert!(
        misses.is_empty(),
        "{}/{total} wrong:\n{}",
        misses.len(),
        misses.join("\n")
    );
}

/// The same packets on what a kernel listed back after loading the case's table: `nft list
/// ruleset` text and `nft -j list ruleset` JSON.
#[test]
fn nft_packetflow_on_kernel_listings() {
    let Some((dir, cases)) = packetflow_cases() else {
        return;
    };
    let mut checked = 0;
    for (name, case) in &cases {
        for ext in ["live.nft", "live.json"] {
            let listing = dir.join("live").join(format!("{name}.{ext}"));
            if !listing.exists() {
                continue;
            }
            let (n, misses) = score(&format!("{name}.{ext}"), case, &listing);
            assert!(misses.is_empty(), "{}", misses.join("\n"));
            checked += n;
        }
    }
    assert!(checked >= 10, "only {checked} packets on live listings");
}

// ---- graphs of the samples ----------------------------------------------------------------------

/// `service-HASH-ns/name/proto/port` chain names in a text: (ns/name, proto, port name).
fn service_chains(text: &str) -> BTreeSet<(String, String, String)> {
    let re = regex::Regex::new(
        r"service-[A-Z0-9]{8}-([a-z0-9.-]+)/([a-z0-9.-]+)/(tcp|udp|sctp)/([a-z0-9-]*)",
    )
    .expect("regex");
    re.captures_iter(text)
        .map(|c| {
            (
                format!("{}/{}", &c[1], &c[2]),
                c[3].to_string(),
                c[4].to_string(),
            )
        })
        .collect()
}

#[test]
fn nft_every_sample_names_its_services() {
    let Some(dir) = crate::support::shared("nft_samples", "conformance/nftables/samples") else {
        return;
    };
    let mut samples: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read samples")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| !p.to_string_lossy().ends_with(".md"))
        .collect();
    samples.sort();
    assert!(samples.len() >= 6, "{samples:?}");
    let mut named = 0;
    for sample in &samples {
        let text = std::fs::read_to_string(sample).expect("read sample");
        let want = service_chains(&text);
        let g = json(&[
            "graph",
            "--lenient",
            "--nft-ruleset",
            sample.to_str().expect("utf-8 path"),
            "-o",
            "json",
        ]);
        let mut have = BTreeSet::new();
        for p in g["graphs"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["service_ports"].as_array().into_iter().flatten())
        {
            assert_eq!(p["name_source"], "chain-name", "{}: {p}", sample.display());
            let name = str_of(p, "name");
            let (svc, port) = name.split_once(':').unwrap_or((name, ""));
            have.insert((
                svc.to_string(),
                str_of(p, "protocol").to_string(),
                port.to_string(),
            ));
        }
        let missing: Vec<_> = want.difference(&have).collect();
        assert!(
            missing.is_empty(),
            "{}: unnamed {missing:?}",
            sample.display()
        );
        named += want.len();
    }
    // Sample 01 is an iptables-mode node (no kube-proxy table); the others name 6 to 11 each.
    assert!(named >= 30, "{named} service chains named");
}

// ---- the path view ------------------------------------------------------------------------------

fn cluster_render() -> String {
    kproxy(&[
        "render",
        "--mode",
        "nftables",
        "--state",
        repo("testdata/cluster/state.json").to_str().expect("path"),
        "--config",
        repo("testdata/cluster/config.yaml").to_str().expect("path"),
    ])
}

/// `trace svc/web -n shop --port http -o json` on `rules`, with the example cluster's state;
/// the document and the exit code.
fn web_path(rules: &str) -> (Value, Option<i32>) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("rules.nft");
    std::fs::write(&file, rules).expect("write");
    let out = run(&[
        "trace",
        "svc/web",
        "-n",
        "shop",
        "--port",
        "http",
        "--nft-ruleset",
        file.to_str().expect("path"),
        "--state",
        repo("testdata/cluster/state.json").to_str().expect("path"),
        "--config",
        repo("testdata/cluster/config.yaml").to_str().expect("path"),
        "-o",
        "json",
    ]);
    let doc = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stderr));
    });
    (doc, out.status.code())
}

/// (chain, destination, share, pod, divergence kind) of each endpoint of the cluster-IP entry.
fn cluster_ip_endpoints(v: &Value) -> Vec<(String, String, f64, String, String)> {
    let entry = v["ports"][0]["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .find(|e| e["kind"] == "cluster-ip")
        .expect("cluster-ip entry");
    entry["branches"][0]["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .map(|e| {
            (
                str_of(e, "chain").to_string(),
                str_of(e, "destination").to_string(),
                e["share"].as_f64().expect("share"),
                e["pod"]["name"].as_str().unwrap_or("").to_string(),
                e["divergence"]["kind"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

#[test]
fn nft_path_view_matches_the_api() {
    let (v, code) = web_path(&cluster_render());
    assert_eq!(code, Some(0), "{v}");
    assert_eq!(v["compared_with_api"], true);
    assert_eq!(v["ports"][0]["hash"], "KHN6ECMT");
    let eps = cluster_ip_endpoints(&v);
    let third = 1.0 / 3.0;
    let want = [
        (
            "endpoint-CRLTNO23-shop/web/tcp/http__10.244.1.10/8080",
            "10.244.1.10:8080",
            "shop/web-7f9c8d6b5-abcde",
        ),
        (
            "endpoint-FAYF65XV-shop/web/tcp/http__10.244.1.11/8080",
            "10.244.1.11:8080",
            "shop/web-7f9c8d6b5-fghij",
        ),
        (
            "endpoint-SV2I7RHU-shop/web/tcp/http__10.244.2.10/8080",
            "10.244.2.10:8080",
            "shop/web-7f9c8d6b5-klmno",
        ),
    ];
    assert_eq!(eps.len(), 3, "{eps:?}");
    for ((chain, dest, share, pod, div), (wc, wd, wp)) in eps.iter().zip(want) {
        assert_eq!(
            (chain.as_str(), dest.as_str(), pod.as_str(), div.as_str()),
            (wc, wd, wp, "")
        );
        assert!((share - third).abs() < 1e-9, "{share}");
    }
    // The entry's masquerade steps in nftables words.
    let entry = &v["ports"][0]["entries"][0];
    let masq: Vec<(&str, &str)> = entry["masquerade"]
        .as_array()
        .expect("masquerade")
        .iter()
        .map(|m| (str_of(m, "chain"), m["condition"].as_str().unwrap_or("")))
        .collect();
    assert!(
        masq.contains(&("endpoint-*", "ip saddr <endpoint>")),
        "{masq:?}"
    );
    assert!(
        masq.contains(&(
            "service-KHN6ECMT-shop/web/tcp/http",
            "ip saddr != 10.244.0.0/16"
        )),
        "{masq:?}"
    );
}

#[test]
fn nft_path_view_reports_drift() {
    let rules = cluster_render();
    let vmap = "numgen random mod 3 vmap { 0 : goto endpoint-CRLTNO23-shop/web/tcp/http__10.244.1.10/8080 , 1 : goto endpoint-FAYF65XV-shop/web/tcp/http__10.244.1.11/8080 , 2 : goto endpoint-SV2I7RHU-shop/web/tcp/http__10.244.2.10/8080 }";
    assert!(rules.contains(vmap), "the render changed: {rules}");
    // One endpoint dropped from the vmap: the other two get 1/2, the third is missing.
    let drifted = rules.replace(
        vmap,
        "numgen random mod 2 vmap { 0 : goto endpoint-CRLTNO23-shop/web/tcp/http__10.244.1.10/8080 , 1 : goto endpoint-FAYF65XV-shop/web/tcp/http__10.244.1.11/8080 }",
    );
    let (v, code) = web_path(&drifted);
    assert_eq!(code, Some(1), "{v}");
    let eps = cluster_ip_endpoints(&v);
    let summary: Vec<(&str, f64, &str)> = eps
        .iter()
        .map(|e| (e.1.as_str(), e.2, e.4.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            ("10.244.1.10:8080", 0.5, "wrong-share"),
            ("10.244.1.11:8080", 0.5, "wrong-share"),
            ("10.244.2.10:8080", 0.0, "missing-endpoint"),
        ]
    );
    // The endpoint chain is still in the table and nothing reaches it: an anomaly of the port.
    let port_divs: Vec<(&str, &str)> = v["ports"][0]["divergences"]
        .as_array()
        .expect("divergences")
        .iter()
        .map(|d| (str_of(d, "kind"), str_of(d, "message")))
        .collect();
    assert!(
        port_divs.iter().any(|(k, m)| *k == "anomaly"
            && m.starts_with("endpoint-SV2I7RHU-shop/web/tcp/http__10.244.2.10/8080 ")
            && m.contains("stale")),
        "{port_divs:?}"
    );

    // The endpoint chain itself gone too: the missing endpoint is named by its nftables chain.
    let gone: String = drifted
        .lines()
        .filter(|l| !l.contains("endpoint-SV2I7RHU-shop/web/tcp/http__10.244.2.10/8080"))
        .map(|l| format!("{l}\n"))
        .collect();
    let (v, code) = web_path(&gone);
    assert_eq!(code, Some(1));
    let eps = cluster_ip_endpoints(&v);
    assert_eq!(
        (eps[2].0.as_str(), eps[2].4.as_str()),
        (
            "endpoint-SV2I7RHU-shop/web/tcp/http__10.244.2.10/8080",
            "missing-endpoint"
        )
    );
}

/// Counters of a listing (`nft list ruleset` with `counter` statements, as a node with
/// counters shows them): the entry's element counter and each endpoint's DNAT rule counter.
#[test]
fn nft_path_view_counters() {
    let text = r#"table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		counter
		elements = { 10.96.0.10 . tcp . 80 counter packets 12 bytes 720 : goto service-AXK6CI2C-demo/web/tcp/http }
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain services {
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
	chain service-AXK6CI2C-demo/web/tcp/http {
		numgen random mod 2 vmap { 0 : goto endpoint-6UVIXZI4-demo/web/tcp/http__10.244.1.5/8080, 1 : goto endpoint-AKK34346-demo/web/tcp/http__10.244.1.6/8080 }
	}
	chain endpoint-6UVIXZI4-demo/web/tcp/http__10.244.1.5/8080 {
		meta l4proto tcp counter packets 5 bytes 300 dnat to 10.244.1.5:8080
	}
	chain endpoint-AKK34346-demo/web/tcp/http__10.244.1.6/8080 {
		meta l4proto tcp counter packets 7 bytes 420 dnat to 10.244.1.6:8080
	}
}
"#;
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("counters.nft");
    std::fs::write(&file, text).expect("write");
    let v = json(&[
        "trace",
        "svc/web",
        "-n",
        "demo",
        "--nft-ruleset",
        file.to_str().expect("path"),
        "-o",
        "json",
    ]);
    let entry = &v["ports"][0]["entries"][0];
    assert_eq!(entry["counters"]["packets"], 12, "{entry}");
    let eps: Vec<(&str, f64, &Value)> = entry["branches"][0]["endpoints"]
        .as_array()
        .expect("endpoints")
        .iter()
        .map(|e| {
            (
                str_of(e, "destination"),
                e["share"].as_f64().unwrap_or(-1.0),
                &e["counters"]["packets"],
            )
        })
        .collect();
    assert_eq!(
        eps,
        [
            ("10.244.1.5:8080", 0.5, &Value::from(5)),
            ("10.244.1.6:8080", 0.5, &Value::from(7)),
        ]
    );
    // The tree shows them too.
    let tree = kproxy(&[
        "trace",
        "svc/web",
        "-n",
        "demo",
        "--nft-ruleset",
        file.to_str().expect("path"),
    ]);
    assert!(
        tree.contains("5 pkts") || tree.contains("packets 5") || tree.contains("5 packets"),
        "{tree}"
    );
}

// ---- the real kernel ----------------------------------------------------------------------------

pub(crate) const NODE_IP: &str = "192.168.77.2";
pub(crate) const CLIENT_IP: &str = "192.168.77.3";
/// A second client address inside the cluster CIDR (10.244.0.0/16): not masqueraded.
const POD_CIDR_CLIENT_IP: &str = "10.244.50.3";
const CLUSTER_IP: &str = "172.30.0.10:80";
const NODE_PORT: &str = "192.168.77.2:30080";
const NO_ENDPOINTS: &str = "172.30.0.11:80";
/// A port the cluster IP does not serve (`cluster-ips-check` rejects it).
const WRONG_PORT: &str = "172.30.0.10:81";
/// An address a foreign table DNATs before kube-proxy's `nat-prerouting` runs, 20% / 80%.
const SKEWED: &str = "172.30.0.20:80";
/// iptables-nft rules beside kube-proxy's table (`table ip nat` and `table ip filter`, as
/// iptables-nft makes them): client address .5 is DNATed to pod-b at kube-proxy's own priority
/// (`dstnat`): made after kube-proxy's table, the chain runs first, and kube-proxy's
/// `nat-prerouting` no longer sees the connection; client address .4 is refused on its way to
/// pod-c in FORWARD.
const IPTABLES_NFT: &str = "*nat
:PREROUTING ACCEPT [0:0]
-A PREROUTING -s 192.168.77.5/32 -d 172.30.0.10/32 -p tcp --dport 80 -j DNAT --to-destination 10.244.1.6:8080
COMMIT
*filter
:FORWARD ACCEPT [0:0]
-A FORWARD -s 192.168.77.4/32 -d 10.244.2.7/32 -p tcp --dport 8080 -j REJECT
COMMIT
";
const REJECTED_CLIENT_IP: &str = "192.168.77.4";
const NAT_CLIENT_IP: &str = "192.168.77.5";
const SKEW_TABLE: &str = "table ip skew {
	chain pre {
		type nat hook prerouting priority -110; policy accept;
		ip daddr 172.30.0.20 tcp dport 80 numgen random mod 5 vmap { 0 : goto to-a, 1-4 : goto to-b }
	}
	chain to-a {
		meta l4proto tcp dnat to 10.244.1.5:8080
	}
	chain to-b {
		meta l4proto tcp dnat to 10.244.1.6:8080
	}
}
";
/// New connections per distribution check.
const N: usize = 400;

/// What `trace --packet --model kernel -o json` predicts on `listing`: (probability, DNAT,
/// verdict, masquerade source or None) per outcome.
pub(crate) type Prediction = Vec<(f64, Option<String>, String, Option<String>)>;

pub(crate) fn predict(listing: &Path, packet: &str, from: &str) -> Prediction {
    let v = json(&[
        "trace",
        "--nft-ruleset",
        listing.to_str().expect("path"),
        "--packet",
        packet,
        "--model",
        "kernel",
        "--from",
        from,
        "--local-ip",
        NODE_IP,
        "-o",
        "json",
    ]);
    v["outcomes"]
        .as_array()
        .expect("outcomes")
        .iter()
        .map(|o| {
            let masq = (o["masquerade"] == true).then(|| str_of(o, "snat").to_string());
            (
                o["probability"].as_f64().expect("probability"),
                o["dnat"].as_str().map(str::to_string),
                str_of(o, "verdict").to_string(),
                masq,
            )
        })
        .collect()
}

/// The prediction on the text listing, checked equal to the one on the JSON listing.
pub(crate) fn predict_both(listings: &[PathBuf; 2], packet: &str, from: &str) -> Prediction {
    let text = predict(&listings[0], packet, from);
    let json = predict(&listings[1], packet, from);
    assert_eq!(text, json, "{packet}: text and JSON listings disagree");
    text
}

/// The pods of the topology by address.
pub(crate) fn pod_of(topo: &Topology, dnat: &str) -> String {
    let dnat = addr(dnat).ip();
    topo.pod_names()
        .into_iter()
        .find(|p| topo.pod_ips(p).contains(&dnat))
        .unwrap_or_else(|| panic!("DNAT to {dnat}, not a pod of the topology"))
        .to_string()
}

/// Chi-square of `tally` against the predicted shares and its critical value at p = 1e-6
/// (k-1 degrees of freedom): many checks run per suite, a wrong share still fails by far.
pub(crate) fn chi_square(tally: &Tally, shares: &BTreeMap<String, f64>) -> (f64, f64) {
    let n = tally.ok() as f64;
    let stat = shares
        .iter()
        .map(|(pod, p)| (tally.count(pod) as f64 - n * p).powi(2) / (n * p))
        .sum();
    let critical = [23.928, 27.631, 30.664, 33.377];
    let df = shares.len().saturating_sub(1).max(1);
    (stat, critical.get(df - 1).copied().unwrap_or(f64::INFINITY))
}

/// What answers a connection: the pod, or `refused` for a REJECT.
const REFUSED: &str = "refused";

/// Real connections from `from` agree with `predicted`: every outcome either ACCEPTed with a
/// DNAT to a pod or REJECTed, the spread over pods and refusals passes chi-square, the pods see
/// the predicted source. Returns what the connections met.
pub(crate) fn check_spread(
    what: &str,
    topo: &Topology,
    from: &Netns,
    src: Option<&str>,
    dst: &str,
    predicted: &Prediction,
) -> Tally {
    let mut shares: BTreeMap<String, f64> = BTreeMap::new();
    let mut peers = BTreeSet::new();
    for (p, dnat, verdict, masq) in predicted {
        if verdict == "REJECT" {
            *shares.entry(REFUSED.to_string()).or_insert(0.0) += p;
            continue;
        }
        assert_eq!(verdict, "ACCEPT", "{what}: {predicted:?}");
        let dnat = dnat
            .as_deref()
            .unwrap_or_else(|| panic!("{what}: no DNAT: {predicted:?}"));
        *shares.entry(pod_of(topo, dnat)).or_insert(0.0) += p;
        peers.insert(ip(masq.as_deref().or(src).unwrap_or(NODE_IP)));
    }
    let total: f64 = shares.values().sum();
    assert!(
        (total - 1.0).abs() < 1e-9,
        "{what}: probabilities sum to {total}"
    );
    let probe = src.map_or_else(Probe::default, |s| Probe::from(ip(s)));
    let mut tally = from.connect_many(&probe, addr(dst), N).expect("connect");
    let refused = tally.errors.remove("ConnectionRefused").unwrap_or(0);
    assert!(
        tally.errors.is_empty(),
        "{what}: failures {:?}",
        tally.errors
    );
    assert_eq!(tally.ok() + refused, N, "{what}: {tally:?}");
    if refused > 0 {
        tally.servers.insert(REFUSED.to_string(), refused);
    }
    for answer in tally.servers.keys() {
        assert!(
            shares.contains_key(answer),
            "{what}: {answer} answered, trace says never"
        );
    }
    let (stat, critical) = chi_square(&tally, &shares);
    println!(
        "{what}: observed {:?}, predicted {shares:?}, chi2 {stat:.2}",
        tally.servers
    );
    assert!(
        stat < critical,
        "{what}: {:?} vs {shares:?}: chi2 {stat:.2}",
        tally.servers
    );
    let seen: BTreeSet<IpAddr> = tally.peers.keys().copied().collect();
    assert_eq!(seen, peers, "{what}: endpoints saw {:?}", tally.peers);
    tally
}

pub(crate) fn check_rejected(what: &str, from: &Netns, dst: &str, predicted: &Prediction) {
    assert!(
        predicted.iter().all(|o| o.2 == "REJECT"),
        "{what}: {predicted:?}"
    );
    let err = from.connect(addr(dst)).expect_err(what);
    assert_eq!(err.kind(), ErrorKind::ConnectionRefused, "{what}: {err}");
}

#[test]
fn nft_kernel_model_agrees_with_real_traffic() {
    if !require_root_and_tools(&["nft", "iptables-nft-restore"]) {
        return;
    }
    let state = repo("testdata/trace-traffic/state.json");
    let cfg = repo("testdata/trace-traffic/config.yaml");
    let rules = kproxy(&[
        "render",
        "--mode",
        "nftables",
        "--state",
        state.to_str().expect("path"),
        "--config",
        cfg.to_str().expect("path"),
        "--node",
        "kpt-node",
        "--node-ip",
        NODE_IP,
    ]);
    let topo = Topology::builder("nft-trace")
        .client_addrs(&[
            &format!("{CLIENT_IP}/24"),
            &format!("{POD_CIDR_CLIENT_IP}/32"),
            &format!("{REJECTED_CLIENT_IP}/24"),
            &format!("{NAT_CLIENT_IP}/24"),
        ])
        .pod(Pod::new("pod-a", "10.244.1.5").tcp(8080))
        .pod(Pod::new("pod-b", "10.244.1.6").tcp(8080))
        .pod(Pod::new("pod-c", "10.244.2.7").tcp(8080))
        .build()
        .expect("topology");
    let node = topo.node();
    node.ip_batch(&format!("route add {POD_CIDR_CLIENT_IP}/32 dev eth0\n"))
        .expect("route back to the second client address");
    // A rate-limited REJECT drops the SYN silently; its retry is a new connection that draws
    // an endpoint again, which a one-packet model cannot predict.
    node.sysctl(&[("net.ipv4.icmp_ratelimit", "0")])
        .expect("no ICMP rate limit");
    node.nft_load(&rules).expect("nft -f the render");
    node.nft_load(SKEW_TABLE).expect("nft -f the skew table");
    node.restore(Backend::Nft, IPTABLES_NFT, true)
        .expect("iptables-nft-restore");

    // Predict on what the kernel holds, as nft lists it.
    let tmp = tempfile::tempdir().expect("tempdir");
    let listings = [
        tmp.path().join("ruleset.nft"),
        tmp.path().join("ruleset.json"),
    ];
    std::fs::write(
        &listings[0],
        node.nft(&["list", "ruleset"]).expect("nft list"),
    )
    .expect("write");
    std::fs::write(
        &listings[1],
        node.nft(&["-j", "list", "ruleset"]).expect("nft -j list"),
    )
    .expect("write");
    let client = topo.client();
    let packet = |src: &str, dst: &str| format!("{src}->{dst}/tcp");

    // Client → ClusterIP: prerouting DNAT, forward, masqueraded (not from the cluster CIDR).
    let p = predict_both(&listings, &packet(CLIENT_IP, CLUSTER_IP), "external");
    assert_eq!(p.len(), 3, "{p:?}");
    assert!(p.iter().all(|o| o.3.as_deref() == Some(NODE_IP)), "{p:?}");
    check_spread(
        "client -> ClusterIP",
        &topo,
        client,
        Some(CLIENT_IP),
        CLUSTER_IP,
        &p,
    );
    // From inside the cluster CIDR: not masqueraded.
    let p = predict_both(&listings, &packet(POD_CIDR_CLIENT_IP, CLUSTER_IP), "pod");
    assert!(p.iter().all(|o| o.3.is_none()), "{p:?}");
    check_spread(
        "pod-CIDR client -> ClusterIP",
        &topo,
        client,
        Some(POD_CIDR_CLIENT_IP),
        CLUSTER_IP,
        &p,
    );
    // The node itself: nat-output.
    let p = predict_both(&listings, &packet(NODE_IP, CLUSTER_IP), "node");
    check_spread("node -> ClusterIP", &topo, node, None, CLUSTER_IP, &p);
    // NodePort: service-nodeports → external chain (masquerade) → service chain.
    let p = predict_both(&listings, &packet(CLIENT_IP, NODE_PORT), "external");
    check_spread(
        "client -> NodePort",
        &topo,
        client,
        Some(CLIENT_IP),
        NODE_PORT,
        &p,
    );
    // The foreign table's NAT chain runs first (priority -110 < dstnat) and DNATs 20% / 80%;
    // kube-proxy's nat-prerouting then no longer runs for the connection.
    let p = predict_both(&listings, &packet(CLIENT_IP, SKEWED), "external");
    let shares: Vec<(f64, Option<&str>)> = p.iter().map(|o| (o.0, o.1.as_deref())).collect();
    assert_eq!(
        shares,
        [
            (0.2, Some("10.244.1.5:8080")),
            (0.8, Some("10.244.1.6:8080"))
        ],
        "{p:?}"
    );
    check_spread(
        "client -> skewed VIP",
        &topo,
        client,
        Some(CLIENT_IP),
        SKEWED,
        &p,
    );

    // iptables-nft's FORWARD refuses the third of the connections kube-proxy sends to pod-c.
    let p = predict_both(
        &listings,
        &packet(REJECTED_CLIENT_IP, CLUSTER_IP),
        "external",
    );
    assert_eq!(
        p.iter()
            .filter(|o| o.2 == "REJECT")
            .map(|o| o.0)
            .sum::<f64>(),
        1.0 / 3.0,
        "{p:?}"
    );
    check_spread(
        "client refused by iptables-nft FORWARD -> ClusterIP",
        &topo,
        client,
        Some(REJECTED_CLIENT_IP),
        CLUSTER_IP,
        &p,
    );
    // iptables-nft's nat PREROUTING and kube-proxy's nat-prerouting both at dstnat: the one
    // made last runs first and DNATs, the other no longer runs for the connection.
    // `nft list` shows iptables-nft's DNAT as `dnat to`; `nft -j` only as `xt target DNAT`,
    // whose destination the model says it cannot know.
    let nat_packet = packet(NAT_CLIENT_IP, CLUSTER_IP);
    let p = predict(&listings[0], &nat_packet, "external");
    let shares: Vec<(f64, Option<&str>)> = p.iter().map(|o| (o.0, o.1.as_deref())).collect();
    assert_eq!(shares, [(1.0, Some("10.244.1.6:8080"))], "{p:?}");
    let from_json = json(&[
        "trace",
        "--nft-ruleset",
        listings[1].to_str().expect("path"),
        "--packet",
        &nat_packet,
        "--local-ip",
        NODE_IP,
        "-o",
        "json",
    ]);
    assert!(
        from_json["notes"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|n| n.as_str().is_some_and(|n| n.contains("xt target DNAT"))),
        "{from_json}"
    );
    check_spread(
        "client DNATed by iptables-nft -> ClusterIP",
        &topo,
        client,
        Some(NAT_CLIENT_IP),
        CLUSTER_IP,
        &p,
    );

    // A service without endpoints and an unserved port of a cluster IP: rejected.
    for (what, from, src, dst, origin) in [
        (
            "client -> no endpoints",
            client,
            CLIENT_IP,
            NO_ENDPOINTS,
            "external",
        ),
        ("node -> no endpoints", node, NODE_IP, NO_ENDPOINTS, "node"),
        (
            "client -> unserved port",
            client,
            CLIENT_IP,
            WRONG_PORT,
            "external",
        ),
    ] {
        let p = predict_both(&listings, &packet(src, dst), origin);
        check_rejected(what, from, dst, &p);
    }
}

// ---- docs/nftables.md ---------------------------------------------------------------------------

/// The lines of docs/nftables.md's text block that follow the line `$ COMMAND…` (starting with
/// `command`), up to the next `$ ` line or the end of the block.
fn doc_output(command: &str) -> String {
    let doc = std::fs::read_to_string(repo("docs/nftables.md")).expect("docs/nftables.md");
    let mut lines = doc
        .lines()
        .skip_while(|l| !l.starts_with(&format!("$ {command}")));
    assert!(
        lines.next().is_some(),
        "docs/nftables.md has no `$ {command}`"
    );
    lines
        .take_while(|l| !l.starts_with("$ ") && !l.starts_with("```"))
        .map(|l| format!("{l}\n"))
        .collect()
}

/// The outputs docs/nftables.md shows are the binary's.
#[test]
fn nft_docs_show_the_binarys_output() {
    if let Some(dir) = crate::support::shared("nft_docs", "conformance/nftables/samples") {
        let sample =
            dir.join("04-kube-proxy-test-TestOverallNFTablesRules-as-listed-by-nft-1.0.6.txt");
        assert_eq!(
            kproxy(&["graph", "--nft-ruleset", sample.to_str().expect("path")]),
            doc_output("kubectl kproxy graph --nft-ruleset 04-")
        );
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let rules = tmp.path().join("node-1.nft");
    std::fs::write(&rules, cluster_render()).expect("write");
    let state = repo("testdata/cluster/state.json");
    let cfg = repo("testdata/cluster/config.yaml");
    let out = kproxy(&[
        "trace",
        "svc/web",
        "-n",
        "shop",
        "--port",
        "http",
        "--nft-ruleset",
        rules.to_str().expect("path"),
        "--state",
        state.to_str().expect("path"),
        "--config",
        cfg.to_str().expect("path"),
    ]);
    assert_eq!(
        out.replace(rules.to_str().expect("path"), "node-1.nft"),
        doc_output("kubectl kproxy trace svc/web -n shop --port http --nft-ruleset node-1.nft")
    );
}
