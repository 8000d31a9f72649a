//! `iptables -L` listings: real captures (testdata/listing/, made by its make.sh with the real
//! iptables of both backends in a network namespace) read back and compared with the
//! `iptables-save -c` of the same rules; strict mode naming the format; `graph` and `trace`
//! under `--lenient`; and a live capture from a fresh namespace.

use crate::support::netns::{Backend, Family as NsFamily, Netns, require_root_and_tools};
use assert_cmd::Command;
use kproxy::graph::{self, GraphOptions, ServiceGraph};
use kproxy::model::{CanonicalRule, Ruleset};
use kproxy::parsers::iptables::listing::{Listing, TableSource, read_listing};
use kproxy::parsers::iptables::{Family, ParseOptions};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/listing")
}

fn read(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every capture: (file name, ruleset name such as `cluster.nft`, table, form).
fn captures() -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir()).expect("testdata/listing") {
        let name = e.expect("entry").file_name().to_string_lossy().to_string();
        let parts: Vec<&str> = name.splitn(4, '.').collect();
        if let [set, backend, table, form] = parts.as_slice()
            && form.starts_with('L')
        {
            out.push((
                name.clone(),
                format!("{set}.{backend}"),
                table.to_string(),
                form.to_string(),
            ));
        }
    }
    out.sort();
    assert!(out.len() >= 30, "captures: {}", out.len());
    out
}

/// The options a listing's rules lose in the reading (their rules are compared without them):
/// the interfaces without `-v`, and in extras.restore the matches with no reading.
fn loses(raw: &str, form: &str) -> bool {
    let interfaces = [" -i ", " -o ", "-i ", "-o "];
    (!form.contains('v')
        && interfaces
            .iter()
            .any(|i| raw.contains(i) || raw.starts_with(i)))
        || ["--tcp-flags", "--limit ", "--mode nth", "-j LOG"]
            .iter()
            .any(|m| raw.contains(m))
}

fn chain_names<'a>(t: &kproxy::model::TableRules<'a>) -> Vec<&'a str> {
    t.chains.iter().map(|c| c.name).collect()
}

fn parsed_listing(l: &Listing) -> Ruleset<'_> {
    let opts = ParseOptions::lenient().with_table(l.table);
    let dump = kproxy::parsers::iptables::parse_dump(&l.text, &opts).expect("lenient parse");
    assert!(
        dump.skipped.is_empty(),
        "the parser skipped lines of the read-back text: {:?}",
        dump.skipped
    );
    Ruleset::from_dump(dump)
}

#[test]
fn every_capture_reads_back_to_the_saved_rules() {
    let mut compared = 0usize;
    for (file, set, table, form) in captures() {
        let text = read(&file);
        let listing = read_listing(&text, None);
        assert_eq!(listing.table, table, "{file}: table");
        assert_eq!(listing.table_source, TableSource::BuiltinChains, "{file}");
        assert_eq!(
            listing.text.lines().count(),
            text.lines().count(),
            "{file}: one line per listing line"
        );
        assert_eq!(listing.shape.verbose, form.contains('v'), "{file}: -v");
        assert_eq!(listing.shape.line_numbers, form.ends_with("line"), "{file}");
        assert_eq!(
            listing.names,
            !form.contains('n'),
            "{file}: names without -n"
        );
        assert!(
            !listing.notes.iter().any(|n| n.contains("partial")),
            "{file}: every chain jumped to is listed: {:?}",
            listing.notes
        );
        let save = read(&format!("{set}.save"));
        let reference = Ruleset::parse(&save, &ParseOptions::strict()).expect("save parses");
        let got = parsed_listing(&listing);
        let family = reference.family;
        // A table with no address in it (a filter listing) does not tell its family.
        if table == "nat" {
            assert_eq!(got.family, family, "{file}: family");
        } else {
            assert!([Family::Unknown, family].contains(&got.family), "{file}");
        }
        let want_t = reference.table(&table).expect("reference table");
        let got_t = got.table(&table).expect("read-back table");
        assert_eq!(chain_names(got_t), chain_names(want_t), "{file}: chains");
        for want in &want_t.chains {
            let have = got_t.chain(want.name).expect("chain");
            assert_eq!(have.policy, want.policy, "{file}: {} policy", want.name);
            assert_eq!(have.rules.len(), want.rules.len(), "{file}: {}", want.name);
            for (i, (h, w)) in have.rules.iter().zip(&want.rules).enumerate() {
                let at = format!("{file}: {} rule {}", want.name, i + 1);
                if loses(w.raw, &form) {
                    continue;
                }
                assert_eq!(
                    CanonicalRule::of(h, family),
                    CanonicalRule::of(w, family),
                    "{at}"
                );
                compared += 1;
                let (Some(hc), Some(wc)) = (h.counters(), w.counters()) else {
                    assert!(!form.contains('v'), "{at}: -v shows counters");
                    continue;
                };
                if form.ends_with('x') {
                    assert_eq!(hc, wc, "{at}: -x counters are exact");
                } else {
                    // Rounded to 4 significant digits at most (`463K`, `1733M`).
                    for (a, b) in [(hc.packets, wc.packets), (hc.bytes, wc.bytes)] {
                        let unit = [1u64, 1_000, 1_000_000, 1_000_000_000, 1_000_000_000_000]
                            .into_iter()
                            .rev()
                            .find(|u| a % u == 0 && b / u > 9)
                            .unwrap_or(1);
                        assert!(a.abs_diff(b) <= unit / 2 + unit / 1000, "{at}: {a} vs {b}");
                    }
                }
            }
        }
    }
    assert!(compared > 1300, "rules compared: {compared}");
}

/// What a graph says of its service ports: entries (of the listing's table), endpoints, shares.
type PortView = (
    Option<String>,
    Option<String>,
    Vec<String>,
    Vec<(String, Vec<(String, String)>)>,
);

fn view(g: &ServiceGraph<'_>, table: &str) -> Vec<PortView> {
    g.service_ports
        .iter()
        .map(|p| {
            let mut entries: Vec<String> = p
                .entries
                .iter()
                .filter(|e| e.table == table)
                .map(|e| {
                    format!(
                        "{:?} {:?}:{:?}/{:?} {}",
                        e.kind, e.address, e.port, e.protocol, e.target
                    )
                })
                .collect();
            entries.sort();
            let endpoints = p
                .endpoints
                .iter()
                .map(|e| {
                    let shares = e
                        .shares
                        .iter()
                        .map(|s| (s.via.to_string(), format!("{:.9}", s.share)))
                        .collect();
                    (format!("{} {:?}:{:?}", e.chain, e.ip, e.port), shares)
                })
                .collect();
            (p.name.clone(), p.protocol.clone(), entries, endpoints)
        })
        .filter(|(_, _, entries, _)| !entries.is_empty())
        .collect()
}

#[test]
fn graph_of_each_nat_listing_equals_the_graph_of_its_save() {
    let (mut graphs, mut ports) = (0, 0);
    for (file, set, table, _form) in captures() {
        if table != "nat" || !set.starts_with("cluster") {
            continue;
        }
        let save = read(&format!("{set}.save"));
        let want = graph::from_text(
            &save,
            "save",
            &ParseOptions::strict(),
            &GraphOptions::default(),
        )
        .expect("save graph");
        let text = read(&file);
        let listing = read_listing(&text, Some("nat"));
        assert_eq!(listing.table_source, TableSource::Given);
        let opts = ParseOptions::lenient().with_table(listing.table);
        let got = graph::from_text(&listing.text, &file, &opts, &GraphOptions::default())
            .expect("listing graph");
        let (want_v, got_v) = (view(&want, "nat"), view(&got, "nat"));
        assert_eq!(got_v, want_v, "{file}");
        assert_eq!(got.family, want.family, "{file}");
        graphs += 1;
        ports += got_v.len();
    }
    assert_eq!(graphs, 14, "nat captures of the cluster");
    // 7 captures of each family: 13 IPv4 service ports with nat entries, 1 IPv6 one.
    assert_eq!(ports, 13 * 7 + 7, "service ports compared");
}

#[test]
fn extras_that_have_no_reading_are_dropped_and_counted() {
    let text = read("extras.nft.filter.L-n-v");
    let listing = read_listing(&text, None);
    let want: BTreeMap<String, usize> = [
        ("LOG", 1),
        ("limit", 1),
        ("statistic mode nth", 1),
        ("tcp flags", 1),
    ]
    .into_iter()
    .map(|(k, n)| (k.to_string(), n))
    .collect();
    assert_eq!(listing.dropped, want);
    let note = listing
        .notes
        .iter()
        .find(|n| n.contains("dropped"))
        .expect("a note on what was dropped");
    assert!(
        note.contains("`LOG` (1)") && note.contains("`tcp flags` (1)"),
        "{note}"
    );
    // The rules themselves stay, without the dropped parts.
    let got = parsed_listing(&listing);
    let t = got.table("filter").expect("filter");
    let rules: Vec<&str> = t
        .chain("KUBE-EXTRAS")
        .expect("chain")
        .rules
        .iter()
        .map(|r| r.raw)
        .collect();
    assert_eq!(rules[0], "-p tcp -m tcp -c 7029 4583000 -j DROP");
    assert_eq!(rules[1], "-c 49750 34000000 -j LOG");
}

#[test]
fn a_filter_listing_is_read_as_filter_whatever_the_default_table() {
    let text = read("cluster.nft.filter.L-n");
    let listing = read_listing(&text, Some("nat"));
    assert_eq!(listing.table, "filter");
    assert_eq!(listing.table_source, TableSource::BuiltinChains);
    let notes = listing.notes.join("\n");
    assert!(
        notes.contains("(INPUT, FORWARD, OUTPUT) are those of the filter table, not of nat"),
        "{notes}"
    );
    assert!(notes.contains("`iptables -t nat -L -n -v`"), "{notes}");
}

#[test]
fn without_n_names_are_read_back_and_said() {
    let text = read("cluster.nft.nat.L");
    assert!(
        text.contains("tcp dpt:http")
            && text.contains("dpt:http-alt")
            && text.contains("loopback/8")
    );
    let listing = read_listing(&text, None);
    assert!(listing.names);
    assert!(listing.dropped.is_empty(), "{:?}", listing.dropped);
    assert!(
        listing.text.contains("-d 127.0.0.0/8 -p tcp")
            && listing
                .text
                .contains("--dport 8080 -j KUBE-SVC-E7LOJCV5T5E4IPM4"),
        "loopback/8 and http-alt read back"
    );
    let notes = listing.notes.join("\n");
    assert!(notes.contains("printed without -n"), "{notes}");
    assert!(notes.contains("has no -v"), "{notes}");
}

fn kproxy() -> Command {
    Command::cargo_bin("kubectl-kproxy").expect("binary")
}

fn output_of(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().expect("runs");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn strict_graph_trace_and_verify_say_the_input_is_a_listing() {
    let file = dir().join("cluster.nft.nat.L-n-v");
    let path = file.to_str().expect("utf-8 path");
    let runs: [&[&str]; 3] = [
        &["graph", "--iptables-save", path],
        &[
            "trace",
            "--iptables-save",
            path,
            "--packet",
            "10.244.1.5->10.96.100.10:80/tcp",
        ],
        &[
            "verify",
            "--iptables-save",
            path,
            "--state",
            "testdata/cluster/state.json",
            "--config",
            "testdata/cluster/config.yaml",
        ],
    ];
    for args in runs {
        let (code, _, err) = output_of(kproxy().args(args));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(path), "{args:?}: {err}");
        assert!(
            err.contains(
                ":1:1: expected `iptables-save` or `iptables -S` output, found `iptables -L` output"
            ),
            "{args:?}: {err}"
        );
        assert!(
            err.contains("keeps what kproxy needs") && err.contains("--lenient"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn lenient_graph_reads_a_listing_and_warns_that_it_is_lossy() {
    let file = dir().join("cluster.nft.nat.L-n");
    let path = file.to_str().expect("utf-8 path");
    let (code, out, err) =
        output_of(kproxy().args(["graph", "--lenient", "--iptables-save", path]));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().any(|l| l.starts_with("shop/web:http ")
            && l.contains("cluster 10.96.100.10:80")
            && l.contains(
                "10.244.1.10:8080 33.3%, 10.244.1.11:8080 33.3%, 10.244.2.10:8080 33.3%"
            )),
        "{out}"
    );
    assert!(
        err.contains(&format!(
            "warning: {path}: read from an `iptables -L` listing into the nat table"
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("warning: {path}: the listing has no -v")),
        "{err}"
    );
    assert!(!err.contains("skipped"), "{err}");
}

#[test]
fn lenient_trace_of_a_listing_walks_as_the_save_does() {
    for (listing, save, packet) in [
        (
            "cluster.nft.nat.L",
            "cluster.nft.save",
            "10.244.1.5->10.96.100.10:80/tcp",
        ),
        (
            "cluster.nft.nat.L-n-v-x",
            "cluster.nft.save",
            "192.168.77.9->192.168.77.101:80/tcp",
        ),
        (
            "cluster-v6.nft.nat.L-n",
            "cluster-v6.nft.save",
            "[fd00:10:244:1::5]->[fd00:96::60]:80/tcp",
        ),
    ] {
        let run = |file: &str, lenient: bool| {
            let p = dir().join(file);
            let flag = if packet.starts_with('[') {
                "--ip6tables-save"
            } else {
                "--iptables-save"
            };
            let mut cmd = kproxy();
            cmd.args(["trace", flag, p.to_str().expect("path"), "--packet", packet]);
            cmd.args(["-o", "json"]);
            if lenient {
                cmd.arg("--lenient");
            }
            output_of(&mut cmd)
        };
        let (code, from_listing, err) = run(listing, true);
        assert_eq!(code, 0, "{listing}: {err}");
        let (_, from_save, _) = run(save, false);
        let outcomes = |json: &str| -> Vec<serde_json::Value> {
            let v: serde_json::Value = serde_json::from_str(json).expect("json");
            v["outcomes"]
                .as_array()
                .expect("outcomes")
                .iter()
                .map(|o| serde_json::json!([o["probability"], o["dnat"], o["masquerade"]]))
                .collect()
        };
        let (got, want) = (outcomes(&from_listing), outcomes(&from_save));
        assert!(!want.is_empty(), "{save}: {from_save}");
        assert_eq!(got, want, "{listing} against {save}");
        assert!(err.contains("read from an `iptables -L` listing"), "{err}");
    }
}

/// A listing taken now, from a fresh namespace, with the iptables of this machine.
#[test]
fn a_live_listing_reads_back_to_the_live_save() {
    for backend in [Backend::Nft, Backend::Legacy] {
        // kube-proxy's rules name its nfacct counters, which must exist before they restore.
        if !require_root_and_tools(&[&backend.tools()[..], &["nfacct"]].concat()) {
            return;
        }
        for (family, restore) in [
            (NsFamily::V4, "testdata/dumps/cluster.restore"),
            (NsFamily::V6, "testdata/dumps/cluster-v6.restore"),
        ] {
            let rules = std::fs::read_to_string(restore).expect("restore input");
            let ns = Netns::new("listing").expect("netns");
            ns.add_nfacct_counters(&rules).expect("nfacct");
            ns.restore_family(backend, family, &rules, false)
                .expect("restore");
            let listing_text = ns
                .iptables_family(backend, family, &["-t", "nat", "-L", "-n", "-v", "-x"])
                .expect("iptables -L");
            let save = ns.save_family(backend, family, true).expect("save");
            let listing = read_listing(&listing_text, None);
            assert_eq!(listing.table, "nat");
            let got = parsed_listing(&listing);
            let want = Ruleset::parse(&save, &ParseOptions::strict()).expect("save parses");
            let fam = want.family;
            assert_ne!(fam, Family::Unknown);
            let (g, w) = (
                got.table("nat").expect("nat"),
                want.table("nat").expect("nat"),
            );
            assert_eq!(g.chains.len(), w.chains.len());
            for (gc, wc) in g.chains.iter().zip(&w.chains) {
                assert_eq!(gc.name, wc.name);
                assert!(
                    gc.same_rules(wc, fam),
                    "{backend:?} {family:?} {}: {:?} vs {:?}",
                    wc.name,
                    gc.rules.iter().map(|r| r.raw).collect::<Vec<_>>(),
                    wc.rules.iter().map(|r| r.raw).collect::<Vec<_>>()
                );
                for (a, b) in gc.rules.iter().zip(&wc.rules) {
                    assert_eq!(a.counters(), b.counters(), "{}: {}", wc.name, b.raw);
                }
            }
        }
    }
}
