//! Pastes that lack part of what the node has (issue "real pastes, round three"): what the input
//! lacks is said, and no conclusion is drawn from it; when an answer depends on it, stdout says
//! so. Every input is built here, in the shape of a paste, from the repo's example dumps.

use crate::support::{EXAMPLE_STATE, Run, repo, run_with_files, service_names as names};
use serde_json::Value;

const SAVE: &str = "testdata/dumps/cluster.nft-c.save";
const NAT_S: &str = "testdata/dumps/cluster.nft.nat-v.S";
const STATE: [&str; 4] = EXAMPLE_STATE;

fn read(path: &str) -> String {
    std::fs::read_to_string(repo(path)).expect("test data")
}

/// Runs the binary with `FILE`, `FILE2` in `args` standing for files holding `inputs`.
fn run(args: &[&str], inputs: &[&[u8]]) -> Run {
    run_with_files(args, inputs)
}

/// `graph --lenient -o json` of one paste: the document and the run.
fn lenient_graph(paste: &str) -> (Value, Run) {
    let r = run(
        &[
            "graph",
            "--lenient",
            "-o",
            "json",
            "--iptables-save",
            "FILE",
        ],
        &[paste.as_bytes()],
    );
    (json(&r), r)
}

fn json(r: &Run) -> Value {
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
}

fn kinds(graph: &Value) -> Vec<String> {
    graph["anomalies"]
        .as_array()
        .expect("anomalies")
        .iter()
        .filter_map(|a| a["kind"].as_str().map(str::to_string))
        .collect()
}

/// The example node's `iptables -t nat -S` without counters (what the command prints).
fn nat_s() -> String {
    read(NAT_S)
        .lines()
        .map(|l| match l.find(" -c ") {
            Some(at) => {
                let rest = &l[at + 4..];
                let after = rest.splitn(3, ' ').nth(2).unwrap_or("");
                format!(
                    "{}{}{after}\n",
                    &l[..at],
                    if after.is_empty() { "" } else { " " }
                )
            }
            None => format!("{l}\n"),
        })
        .collect()
}

/// Item 1: an `iptables -t nat -S` paste whose fence never closes, cut after an endpoint
/// chain's first rule: the chains after it have no rules. Partial, said so, and no stale,
/// empty or missing-DNAT conclusion.
#[test]
fn a_cut_s_paste_in_an_open_fence_draws_no_conclusions() {
    let whole = nat_s();
    let lines: Vec<&str> = whole.lines().collect();
    let first_sep_rule = lines
        .iter()
        .position(|l| l.starts_with("-A KUBE-SEP-"))
        .expect("an endpoint rule");
    let paste = format!(
        "$ sudo iptables -t nat -S\n```\n{}\n",
        lines[..=first_sep_rule].join("\n")
    );
    for args in [
        vec![
            "graph",
            "--lenient",
            "-o",
            "json",
            "--iptables-save",
            "FILE",
        ],
        vec!["graph", "--paste", "FILE", "-o", "json"],
    ] {
        let r = run(&args, &[paste.as_bytes()]);
        let doc = json(&r);
        let g = &doc["graphs"][0];
        let found = kinds(g);
        for wrong in [
            "unreferenced-chain",
            "empty-service-chain",
            "missing-dnat",
            "undeclared-jump",
        ] {
            assert!(!found.iter().any(|k| k == wrong), "{args:?}: {found:?}");
        }
        let gaps = g["gaps"].to_string();
        assert!(gaps.contains("have no rules"), "{gaps}");
        assert!(gaps.contains("cut"), "{gaps}");
        assert!(r.stderr.contains("never closed"), "{}", r.stderr);
    }
    // The whole listing is whole: no gap, and the example's anomalies are none.
    let r = run(
        &["graph", "-o", "json", "--iptables-save", "FILE"],
        &[whole.as_bytes()],
    );
    let doc = json(&r);
    let gaps = &doc["graphs"][0]["gaps"];
    assert!(
        gaps.as_array().is_none_or(Vec::is_empty),
        "{gaps}: {}",
        r.stderr
    );
    assert!(names(&doc).contains(&"shop/web:http".to_string()));
}

/// An `ipset list` of two sets, the second cut inside its header.
const CUT_IPSET: &str = "Name: KUBE-CLUSTER-IP\nType: hash:ip,port\nRevision: 6\n\
Header: family inet hashsize 1024 maxelem 65536 bucketsize 12 initval 0x4146d543\n\
Size in memory: 1000\nReferences: 2\nNumber of entries: 1\nMembers:\n10.96.0.1,tcp:443\n\n\
Name: KUBE-LOOP-BACK\nType: hash:ip,port,ip\nRevision: 6\n";

/// Item 2: a set cut before its `Members:` line is cut, not empty: said on stderr, in the
/// graph's `gaps` and table, and verify refuses it.
#[test]
fn an_ipset_list_cut_in_a_set_header_is_not_an_empty_set() {
    let ipvsadm = read("testdata/ipvs/example-cluster/ipvsadm-Ln.txt");
    let r = run(
        &[
            "graph",
            "-o",
            "json",
            "--ipvsadm",
            "FILE",
            "--ipset",
            "FILE2",
        ],
        &[ipvsadm.as_bytes(), CUT_IPSET.as_bytes()],
    );
    let doc = json(&r);
    assert!(r.stderr.contains("KUBE-LOOP-BACK"), "{}", r.stderr);
    assert!(
        doc["gaps"].to_string().contains("KUBE-LOOP-BACK"),
        "{}",
        doc["gaps"]
    );
    let table = run(
        &["graph", "--ipvsadm", "FILE", "--ipset", "FILE2"],
        &[ipvsadm.as_bytes(), CUT_IPSET.as_bytes()],
    );
    assert!(table.stdout.contains("partial input"), "{}", table.stdout);
    let dir = "testdata/ipvs/example-cluster";
    let state = format!("{dir}/state.json");
    let config = format!("{dir}/config.yaml");
    let ipt = format!("{dir}/iptables-save.txt");
    let v = run(
        &[
            "verify",
            "node-1",
            "--state",
            &state,
            "--config",
            &config,
            "--ipvsadm",
            "FILE",
            "--ipset",
            "FILE2",
            "--iptables-save",
            &ipt,
        ],
        &[ipvsadm.as_bytes(), CUT_IPSET.as_bytes()],
    );
    assert_eq!(v.code, Some(2), "{}", v.stdout);
    assert!(v.stderr.contains("Members:"), "{}", v.stderr);
}

/// Items 3 and 8: a filtered paste (`iptables-save | grep KUBE`: the service chains, no
/// built-in chains) traced with `--packet` is walked from kube-proxy's chains, and stdout says
/// so; the outcome is the service's DNAT, as `graph` shows it.
#[test]
fn trace_packet_on_a_filtered_paste_says_where_it_starts() {
    let grep: String = read(SAVE)
        .lines()
        .filter(|l| l.contains("-A KUBE-"))
        .map(|l| format!("{}\n", l.trim_start_matches(|c| c != '-')))
        .collect();
    let packet = ["--packet", "192.168.77.3->10.96.100.10:80/tcp"];
    let mut text = vec!["trace", "--lenient", "--iptables-save", "FILE"];
    text.extend(packet);
    let r = run(&text, &[grep.as_bytes()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.starts_with("partial input"), "{}", r.stdout);
    assert!(
        r.stdout.contains("nat PREROUTING -> KUBE-SERVICES"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("filtered paste"), "{}", r.stdout);
    assert!(r.stdout.contains("DNAT 10.244.2.10:8080"), "{}", r.stdout);
    assert!(!r.stdout.contains("no DNAT"), "{}", r.stdout);
    let mut as_json = text.clone();
    as_json.extend(["-o", "json"]);
    let doc = json(&run(&as_json, &[grep.as_bytes()]));
    assert_eq!(doc["outcomes"].as_array().map(Vec::len), Some(3), "{doc}");
    assert!(
        doc["partial"]["entry_jumps"]
            .to_string()
            .contains("KUBE-SERVICES"),
        "{doc}"
    );
    // A whole dump assumes nothing and says nothing of it.
    let mut whole = vec!["trace", "--iptables-save", SAVE];
    whole.extend(packet);
    let r = run(&whole, &[]);
    assert!(r.stdout.starts_with("packet "), "{}", r.stdout);
    let mut whole_json = whole.clone();
    whole_json.extend(["-o", "json"]);
    assert!(json(&run(&whole_json, &[])).get("partial").is_none());
}

/// Item 4: `ipvsadm -L` without `-n` (names, not numbers) and a `...` cut: the JSON keeps the
/// skipped lines and the gaps the text warned of; an `ipvsadm -Lnc` listing shows its rows.
#[test]
fn ipvs_json_keeps_skipped_lines_and_cuts() {
    let names = "IP Virtual Server version 1.2.1 (size=4096)\n\
Prot LocalAddress:Port Scheduler Flags\n\
  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
TCP  kubernetes.default.svc.clust rr\n\
  -> 172-18-0-2.kubernetes.defaul Masq    1      0          0\n\
UDP  kube-dns.kube-system.svc.clu rr\n\
  -> 10.244.0.2:53                Masq    1      0          0\n\
TCP  10.96.0.10:9153 rr\n\
  -> 10.244.0.2:9153              Masq    1      0          0\n\
...\n";
    let r = run(
        &["graph", "--lenient", "-o", "json", "--ipvsadm", "FILE"],
        &[names.as_bytes()],
    );
    let doc = json(&r);
    assert_eq!(
        doc["skipped_lines"],
        serde_json::json!([4, 5, 6, 7]),
        "{doc}"
    );
    let gaps = doc["gaps"].to_string();
    assert!(gaps.contains("cut at line 10"), "{gaps}");
    assert!(gaps.contains("ipvsadm -Ln"), "{gaps}");
    // The numeric real server of a skipped virtual server does not join the one above it.
    let vs = doc["virtual_servers"].as_array().expect("virtual servers");
    assert_eq!(vs.len(), 1, "{doc}");
    assert_eq!(vs[0]["real_servers"].as_array().map(Vec::len), Some(1));

    let empty = read("testdata/ipvs/example-cluster/ipvsadm-Lnc.txt");
    let r = run(&["graph", "--ipvsadm", "FILE"], &[empty.as_bytes()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("connection table (0 rows)"),
        "{}",
        r.stdout
    );
    let lnc = format!(
        "{empty}TCP 14:58  ESTABLISHED 10.244.1.9:45678   10.96.0.1:443      192.168.77.2:6443
UDP 04:58  UDP         10.244.1.9:45679   10.96.0.10:53      10.244.1.3:53
UDP 04:59  UDP         10.244.1.9:45680   10.96.0.10:53      10.244.1.3:53
"
    );
    let r = run(&["graph", "--ipvsadm", "FILE"], &[lnc.as_bytes()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("connection-table row"), "{}", r.stdout);
    assert!(r.stdout.contains("ipvsadm -Ln"), "{}", r.stdout);
    let doc = json(&run(
        &["graph", "-o", "json", "--ipvsadm", "FILE"],
        &[lnc.as_bytes()],
    ));
    let rows: u64 = doc["connections_without_virtual_server"]
        .as_array()
        .expect("rows")
        .iter()
        .filter_map(|c| c["entries"].as_u64())
        .sum();
    assert_eq!(Some(rows), doc["connection_entries"].as_u64(), "{doc}");
}

/// A kube-proxy 1.23-style load balancer: a firewall chain without source ranges, closed by
/// `KUBE-MARK-DROP`, and one with a range.
fn old_firewall_dump() -> String {
    let lb = |hash: &str, svc: &str, ip: &str, range: Option<&str>| {
        let allow = match range {
            Some(r) => format!(
                "-A KUBE-FW-{hash} -s {r} -m comment --comment \"{svc} loadbalancer IP\" -j KUBE-SVC-{hash}\n"
            ),
            None => format!(
                "-A KUBE-FW-{hash} -m comment --comment \"{svc} loadbalancer IP\" -j KUBE-SVC-{hash}\n"
            ),
        };
        format!(
            ":KUBE-FW-{hash} - [0:0]\n:KUBE-SVC-{hash} - [0:0]\n:KUBE-SEP-{hash} - [0:0]\n\
-A KUBE-SERVICES -d {ip}/32 -p tcp -m comment --comment \"{svc} loadbalancer IP\" -m tcp --dport 80 -j KUBE-FW-{hash}\n\
-A KUBE-FW-{hash} -m comment --comment \"{svc} loadbalancer IP\" -j KUBE-MARK-MASQ\n{allow}\
-A KUBE-FW-{hash} -m comment --comment \"{svc} loadbalancer IP\" -j KUBE-MARK-DROP\n\
-A KUBE-SVC-{hash} -m comment --comment \"{svc}\" -j KUBE-SEP-{hash}\n\
-A KUBE-SEP-{hash} -p tcp -m comment --comment \"{svc}\" -m tcp -j DNAT --to-destination 10.244.1.5:8080\n"
        )
    };
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n:KUBE-MARK-DROP - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
-A KUBE-MARK-DROP -j MARK --set-xmark 0x8000/0x8000\n{}{}COMMIT\n",
        lb("AAAAAAAAAAAAAAAA", "shop/open:http", "192.168.77.100", None),
        lb(
            "BBBBBBBBBBBBBBBB",
            "shop/ranged:http",
            "192.168.77.101",
            Some("203.0.113.0/24")
        ),
    )
}

/// Item 5: the closing `KUBE-MARK-DROP` of a firewall chain without source ranges is not a
/// drop of "sources outside loadBalancerSourceRanges".
#[test]
fn a_firewall_fall_through_is_not_a_source_range_drop() {
    let dump = old_firewall_dump();
    let doc = json(&run(
        &["graph", "-o", "json", "--iptables-save", "FILE"],
        &[dump.as_bytes()],
    ));
    let reason = |name: &str| -> Vec<String> {
        doc["graphs"][0]["service_ports"]
            .as_array()
            .expect("ports")
            .iter()
            .filter(|p| p["name"] == name)
            .flat_map(|p| p["verdicts"].as_array().cloned().unwrap_or_default())
            .filter_map(|v| v["reason"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(reason("shop/open:http"), vec!["fall-through"]);
    assert_eq!(reason("shop/ranged:http"), vec!["source-range"]);
    let open = run(
        &["trace", "svc/open", "-n", "shop", "--iptables-save", "FILE"],
        &[dump.as_bytes()],
    );
    assert_eq!(open.code, Some(0), "{}", open.stderr);
    assert!(
        open.stdout.contains("has no loadBalancerSourceRanges"),
        "{}",
        open.stdout
    );
    assert!(!open.stdout.contains("sources outside"), "{}", open.stdout);
    let ranged = run(
        &[
            "trace",
            "svc/ranged",
            "-n",
            "shop",
            "--iptables-save",
            "FILE",
        ],
        &[dump.as_bytes()],
    );
    assert!(
        ranged
            .stdout
            .contains("sources outside loadBalancerSourceRanges"),
        "{}",
        ranged.stdout
    );
}

/// Item 6: `graph --paste` reads an `nft list` listing as `--nft-ruleset` reads it; an
/// iptables-nft listing (an iptables-mode node) says on stdout what it holds.
#[test]
fn graph_paste_reads_nft_listings() {
    let render = run(
        &[
            "render", "--mode", "nftables", "--node", "node-1", STATE[0], STATE[1], STATE[2],
            STATE[3],
        ],
        &[],
    );
    assert_eq!(render.code, Some(0), "{}", render.stderr);
    let paste = format!("$ sudo nft -f - <<EOF\n{}", render.stdout);
    let pasted = json(&run(
        &["graph", "--paste", "FILE", "-o", "json"],
        &[paste.as_bytes()],
    ));
    let direct = json(&run(
        &["graph", "--nft-ruleset", "FILE", "-o", "json"],
        &[render.stdout.as_bytes()],
    ));
    assert!(!names(&direct).is_empty());
    assert_eq!(names(&pasted), names(&direct));

    let iptables_nft = read("testdata/nft/iptables-nft.list.txt");
    let paste = format!("# nft list ruleset\n{iptables_nft}");
    let r = run(&["graph", "--paste", "FILE"], &[paste.as_bytes()]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("No kube-proxy service ports found"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("iptables-save"), "{}", r.stdout);
}

/// The example dump without its comments (`iptables-save` of a node whose iptables lacks the
/// comment module, or a paste that stripped them).
fn without_comments() -> String {
    read(SAVE)
        .lines()
        .map(|l| match l.find(" -m comment --comment \"") {
            Some(at) => {
                let end = l[at + 24..].find('"').map_or(l.len(), |e| at + 24 + e + 1);
                format!("{}{}\n", &l[..at], &l[end..])
            }
            None => format!("{l}\n"),
        })
        .collect()
}

/// Items 7 and 12: a service is found by its chains' hash when the dump has no comments, and a
/// name that exists in another namespace suggests `-n`.
#[test]
fn trace_finds_services_by_hash_and_suggests_the_namespace() {
    let dump = without_comments();
    assert!(!dump.contains("--comment"));
    let r = run(
        &["trace", "default/kubernetes", "--iptables-save", "FILE"],
        &[dump.as_bytes()],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stdout.contains("KUBE-SVC-NPX46M4PTMTKRN6Y"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("192.168.77.2:6443"), "{}", r.stdout);
    let r = run(
        &[
            "trace",
            "svc/web",
            "-n",
            "shop",
            "--port",
            "http",
            "--iptables-save",
            "FILE",
        ],
        &[dump.as_bytes()],
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stdout.contains("10.244.2.10:8080"), "{}", r.stdout);
    let r = run(
        &["trace", "svc/web", "--iptables-save", "FILE"],
        &[dump.as_bytes()],
    );
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("--port NAME"), "{}", r.stderr);
    let r = run(&["trace", "web", "--iptables-save", SAVE], &[]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("add -n shop"), "{}", r.stderr);
}

/// Item 8: a last line cut inside a chain name, a byte-order mark before `*filter`, a dump whose
/// `*nat` line was cut off, and a dump pasted as a JSON string that starts mid-string.
#[test]
fn cut_lines_marks_headless_tables_and_mid_string_json() {
    let whole = names(&json(&run(
        &["graph", "-o", "json", "--iptables-save", SAVE],
        &[],
    )));
    let save = read(SAVE);
    let nat_start = save.find("*nat\n").expect("nat");
    let nat_end = nat_start + save[nat_start..].find("COMMIT\n").expect("commit") + 7;
    let nat = &save[nat_start..nat_end];

    // The last rule cut inside the endpoint chain's name, in a paste that declares no chains.
    let rules: Vec<String> = nat
        .lines()
        .filter(|l| l.contains("-A KUBE-SVC"))
        .map(|l| l.trim_start_matches(|c| c != '-').to_string())
        .collect();
    let last = rules.last().expect("rules");
    let cut_at = last.rfind("KUBE-SEP-").expect("jump") + 12;
    let mut cut = rules[..rules.len() - 1].join("\n");
    cut.push('\n');
    cut.push_str(&last[..cut_at]);
    let (doc, r) = lenient_graph(&cut);
    assert!(
        doc["graphs"][0]["gaps"].to_string().contains("is cut off"),
        "{}",
        r.stderr
    );

    // Two files concatenated: the second one's byte-order mark before `*filter`.
    let filter_at = save.find("*filter").expect("filter");
    let mut bom = save.as_bytes()[..filter_at].to_vec();
    bom.extend(b"\xEF\xBB\xBF");
    bom.extend(&save.as_bytes()[filter_at..]);
    let plain = run(&["graph", "-o", "wide", "--iptables-save", SAVE], &[]);
    let marked = run(&["graph", "-o", "wide", "--iptables-save", "FILE"], &[&bom]);
    assert_eq!(marked.code, Some(0), "{}", marked.stderr);
    assert_eq!(marked.stdout, plain.stdout);
    assert!(
        marked.stderr.contains("byte-order mark"),
        "{}",
        marked.stderr
    );

    // The `*nat` line (and what came before it) cut off: the rules up to the first COMMIT.
    let body = &nat[nat.find("\n[").expect("rules") + 1..];
    let filter_end = filter_at + save[filter_at..].find("COMMIT\n").expect("commit") + 7;
    let headless = format!("{body}{}", &save[filter_at..filter_end]);
    let (doc, r) = lenient_graph(&headless);
    assert_eq!(names(&doc), whole, "{}", r.stderr);
    assert!(r.stderr.contains("read as table nat"), "{}", r.stderr);

    // A JSON-escaped dump whose paste starts inside the string, at an endpoint rule.
    let sep = nat.find("-A KUBE-SEP-").expect("endpoint rule");
    let from = nat[..sep].rfind('\n').expect("line start");
    let escaped = serde_json::to_string(&nat[from..]).expect("json");
    let mid = format!("{}, \"level\": \"error\"}}\n", &escaped[1..]);
    let (doc, r) = lenient_graph(&mid);
    assert!(r.stderr.contains("JSON string"), "{}", r.stderr);
    let read_names = names(&doc);
    assert!(
        read_names.contains(&"shop/web:http".to_string()),
        "{read_names:?}: {}",
        r.stderr
    );
    assert!(!r.stderr.contains("is cut off"), "{}", r.stderr);
}

/// Item 9: `-o wide`'s affinity cell, and a JSON document given as a dump.
#[test]
fn cosmetics_of_wide_tables_and_json_dumps() {
    let r = run(&["graph", "-o", "wide", "--iptables-save", SAVE], &[]);
    assert!(!r.stdout.contains(" None "), "{}", r.stdout);
    assert!(r.stdout.contains("ClientIP/"), "{}", r.stdout);
    let state = read("testdata/cluster/state.json");
    let mut verify = vec!["verify", "node-1", "--iptables-save", "FILE"];
    verify.extend(STATE);
    let r = run(&verify, &[state.as_bytes()]);
    assert_eq!(r.code, Some(2));
    assert!(r.stderr.contains("JSON document"), "{}", r.stderr);
    assert!(
        !r.stderr.contains("holds no kube-proxy rules"),
        "{}",
        r.stderr
    );
}

/// Where an answer is read — the graph table, the path view — a partial paste says so on
/// stdout, not only in stderr's warnings; a whole dump says nothing of it.
#[test]
fn stdout_says_when_the_paste_is_partial() {
    let grep: String = read(SAVE)
        .lines()
        .filter(|l| l.contains("-A KUBE-"))
        .map(|l| format!("{}\n", l.trim_start_matches(|c| c != '-')))
        .collect();
    let commands: [&[&str]; 3] = [
        &["graph", "--lenient", "--iptables-save", "FILE"],
        &[
            "trace",
            "svc/web",
            "-n",
            "shop",
            "--lenient",
            "--iptables-save",
            "FILE",
        ],
        &[
            "trace",
            "svc/web",
            "-n",
            "shop",
            "-o",
            "table",
            "--lenient",
            "--iptables-save",
            "FILE",
        ],
    ];
    for args in commands {
        let r = run(args, &[grep.as_bytes()]);
        assert_eq!(r.code, Some(0), "{args:?}: {}", r.stderr);
        assert!(
            r.stdout.contains("partial input"),
            "{args:?}:\n{}",
            r.stdout
        );
        assert!(
            r.stdout.contains("filtered paste"),
            "{args:?}:\n{}",
            r.stdout
        );
        let whole: Vec<&str> = args
            .iter()
            .map(|a| if *a == "FILE" { SAVE } else { a })
            .collect();
        let r = run(&whole, &[]);
        assert!(
            !r.stdout.contains("partial input"),
            "{args:?}:\n{}",
            r.stdout
        );
    }
    let doc = json(&run(
        &[
            "trace",
            "svc/web",
            "-n",
            "shop",
            "-o",
            "json",
            "--lenient",
            "--iptables-save",
            "FILE",
        ],
        &[grep.as_bytes()],
    ));
    assert!(doc["partial"].to_string().contains("filtered"), "{doc}");
}
