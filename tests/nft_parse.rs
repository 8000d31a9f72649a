//! The nftables parser over the shared conformance data and real `nft` listings: every sample,
//! render case and packet-flow ruleset parses; printed rulesets equal kube-proxy's dumps under
//! the comparison its tests use; `nft list`, `nft -a list` and `nft -j list` of one ruleset read
//! to the same tree as the dump it was loaded from — from the checked-in listings in
//! `testdata/nft/` and, as root, from listings made here in a scratch network namespace.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kproxy::parsers::nft::{Family, InputForm, ParseOptions, Ruleset, Stmt, Table, parse};

use crate::support::netns::{Netns, require_root_and_tools};

/// `../shared/conformance/nftables`, or `None` (with a notice) when the shared data is absent.
fn shared() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/conformance/nftables");
    if p.is_dir() {
        Some(p)
    } else {
        println!("notice: {} is absent; skipping", p.display());
        None
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn strict<'a>(text: &'a str, what: &str) -> Ruleset<'a> {
    parse(text, &ParseOptions::strict()).unwrap_or_else(|e| panic!("{what}: {}", e.in_source(what)))
}

fn normalized<'a>(text: &'a str, what: &str) -> Vec<Table<'a>> {
    let mut rs = strict(text, what);
    rs.normalize();
    rs.tables
}

/// kube-proxy's dump comparison (`sortNFTablesTransaction`, `pkg/proxy/nftables/helpers_test.go`):
/// non-empty lines not starting with `#`, stably sorted by object rank (table, chain, rule, set,
/// map, element), then object name (the 5th word), then the whole line except for rules, which
/// keep their order.
fn sort_transaction(text: &str) -> Vec<String> {
    let rank = |w: &str| match w {
        "table" => 10,
        "chain" => 9,
        "rule" => 8,
        "set" => 7,
        "map" => 6,
        "element" => 5,
        _ => 0,
    };
    let mut lines: Vec<&str> = text
        .split('\n')
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    lines.sort_by_key(|l| {
        let w: Vec<&str> = l.split(' ').collect();
        let kind = w.get(1).copied().unwrap_or("");
        let name = w.get(4).copied().unwrap_or("");
        (
            -rank(kind),
            name.to_string(),
            if kind == "rule" {
                String::new()
            } else {
                (*l).to_string()
            },
        )
    });
    lines.into_iter().map(str::to_string).collect()
}

/// `to_loadable.py`: the table first, then chains/sets/maps/counters, then rules/elements.
pub(crate) fn loadable(dump: &str) -> String {
    let rank = |l: &str| match l.split(' ').nth(1) {
        Some("table") => 0,
        Some("chain" | "set" | "map" | "counter") => 1,
        _ => 2,
    };
    let mut lines: Vec<&str> = dump
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .collect();
    lines.sort_by_key(|l| rank(l));
    lines.join("\n") + "\n"
}

/// Asserts that the printed ruleset is the dump, line for line, under kube-proxy's comparison.
fn assert_prints_as(rs: &Ruleset<'_>, dump: &str, what: &str) {
    let printed = rs.to_string();
    let (want, got) = (sort_transaction(dump), sort_transaction(&printed));
    if want != got {
        let missing: Vec<&String> = want.iter().filter(|l| !got.contains(l)).collect();
        let extra: Vec<&String> = got.iter().filter(|l| !want.contains(l)).collect();
        panic!("{what}: printed ruleset differs\n  missing: {missing:#?}\n  extra: {extra:#?}");
    }
}

/// How each sample is read, and what it holds.
struct Sample {
    prefix: &'static str,
    form: InputForm,
    /// Lines lenient reading skips (empty: the sample parses strictly).
    skipped: &'static [u32],
    /// Warnings of lenient reading.
    warnings: usize,
    /// (family, table, chains, rules, iptables-nft, xt statements, verbatim statements).
    tables: &'static [(&'static str, &'static str, usize, usize, bool, usize, usize)],
}

const SAMPLES: &[Sample] = &[
    // Shell prompt on line 1; iptables-nft tables with warnings and `xt` lines, netbird's tables
    // with `notrack`, `limit` and `tcp option` statements (kept verbatim).
    Sample {
        prefix: "01-",
        form: InputForm::Listing,
        skipped: &[1],
        warnings: 0,
        tables: &[
            ("ip6", "mangle", 3, 0, false, 0, 0),
            ("ip", "mangle", 3, 0, false, 0, 0),
            ("ip6", "nat", 9, 8, true, 0, 0),
            ("ip", "nat", 46, 105, true, 18, 0),
            ("ip6", "filter", 11, 14, true, 0, 0),
            ("ip", "netbird", 11, 18, false, 0, 5),
            ("inet", "netbird_wt0", 1, 1, false, 0, 0),
            ("ip", "filter", 27, 210, true, 22, 11),
        ],
    },
    Sample {
        prefix: "02-",
        form: InputForm::Commands,
        skipped: &[],
        warnings: 0,
        tables: &[("ip", "kube-proxy", 32, 57, false, 0, 0)],
    },
    Sample {
        prefix: "04-",
        form: InputForm::Listing,
        skipped: &[],
        warnings: 0,
        tables: &[("ip", "kube-proxy", 32, 57, false, 0, 0)],
    },
    Sample {
        prefix: "05-",
        form: InputForm::Json,
        skipped: &[],
        warnings: 0,
        tables: &[("ip", "kube-proxy", 32, 57, false, 0, 0)],
    },
    // Re-ordered blocks, 8-space indentation.
    Sample {
        prefix: "06-",
        form: InputForm::Listing,
        skipped: &[],
        warnings: 0,
        tables: &[("ip", "kube-proxy", 43, 77, false, 0, 0)],
    },
    // `nft -a` with handles, cut by the poster at `....` (line 74) inside the table.
    Sample {
        prefix: "07-",
        form: InputForm::Listing,
        skipped: &[74],
        warnings: 1,
        tables: &[("ip", "kube-proxy", 4, 8, false, 0, 0)],
    },
];

#[test]
fn every_sample_parses() {
    let Some(base) = shared() else { return };
    let dir = base.join("samples");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("samples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x != "md"))
        .collect();
    files.sort();
    assert_eq!(
        files.len(),
        SAMPLES.len(),
        "a sample without a row in SAMPLES"
    );
    for (path, s) in files.iter().zip(SAMPLES) {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        assert!(name.starts_with(s.prefix), "{name} vs {}", s.prefix);
        let text = read(path);
        let strict = parse(&text, &ParseOptions::strict());
        let rs = if s.skipped.is_empty() {
            strict.unwrap_or_else(|e| panic!("{}", e.in_source(name)))
        } else {
            let e = strict.expect_err("a cut paste fails strictly");
            assert_eq!(e.line, s.skipped[0], "{name}: {e}");
            parse(&text, &ParseOptions::lenient()).expect("lenient")
        };
        assert_eq!(rs.form, s.form, "{name}");
        let skipped: Vec<u32> = rs.skipped.iter().map(|l| l.line).collect();
        assert_eq!(skipped, s.skipped, "{name}");
        assert_eq!(rs.warnings.len(), s.warnings, "{name}: {:?}", rs.warnings);
        let got: Vec<_> = rs
            .tables
            .iter()
            .map(|t| {
                let stmts = || {
                    t.chains
                        .iter()
                        .flat_map(|c| &c.rules)
                        .flat_map(|r| &r.stmts)
                };
                (
                    t.family.keyword(),
                    &*t.name,
                    t.chains.len(),
                    t.chains.iter().map(|c| c.rules.len()).sum::<usize>(),
                    t.managed_by_iptables_nft,
                    stmts().filter(|s| matches!(s, Stmt::Xt { .. })).count(),
                    stmts().filter(|s| matches!(s, Stmt::Verbatim(_))).count(),
                )
            })
            .collect();
        assert_eq!(got, s.tables, "{name}");
    }
    // Sample 07's handles are kept: table, 7 sets/maps, 4 chains and 8 rules carry one.
    let t07 = read(&files[5]);
    let rs = parse(&t07, &ParseOptions::lenient()).expect("07");
    let t = &rs.tables[0];
    assert_eq!(t.handle, Some(18));
    assert!(t.sets.iter().all(|s| s.handle.is_some()));
    let chain = t
        .chain("service-2QRHZV4L-default/kubernetes/tcp/https")
        .expect("chain");
    assert_eq!(chain.handle, Some(55));
    assert_eq!(
        chain.rules.iter().map(|r| r.handle).collect::<Vec<_>>(),
        vec![Some(56), Some(58)]
    );
    // The test dump, nft's listing of it and nft's JSON of it are one ruleset.
    let texts: Vec<String> = files[1..4].iter().map(|p| read(p)).collect();
    let dump = normalized(&texts[0], "02");
    assert_eq!(normalized(&texts[1], "04"), dump);
    assert_eq!(normalized(&texts[2], "05"), dump);
}

#[test]
fn render_cases_parse_and_print_back() {
    let Some(base) = shared() else { return };
    let mut dumps = 0;
    let mut live = 0;
    for case in std::fs::read_dir(base.join("render")).expect("render") {
        let dir = case.expect("entry").path();
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        for file in ["expected.nft", "initial.nft", "expected-load.nft"] {
            let p = dir.join(file);
            if !p.exists() {
                continue;
            }
            let text = read(&p);
            let what = format!("{name}/{file}");
            let rs = strict(&text, &what);
            assert_eq!(rs.form, InputForm::Commands, "{what}");
            assert!(rs.warnings.is_empty(), "{what}: {:?}", rs.warnings);
            assert_eq!(rs.tables.len(), 1, "{what}");
            assert_eq!(
                (rs.tables[0].family, &*rs.tables[0].name),
                (Family::Ip, "kube-proxy")
            );
            assert_prints_as(&rs, &text, &what);
            dumps += 1;
        }
        let expected = dir.join("expected.nft");
        if !expected.exists() {
            continue;
        }
        let text = read(&expected);
        let want = normalized(&text, &name);
        for file in [
            "expected-load.nft",
            "expected-live.nft",
            "expected-live.json",
        ] {
            let p = dir.join(file);
            if p.exists() {
                let other = read(&p);
                assert_eq!(normalized(&other, file), want, "{name}/{file}");
                live += 1;
            }
        }
    }
    // 11 full-dump cases + 1 initial.nft + 2 expected-load.nft; 2 cases × 3 other forms.
    assert_eq!((dumps, live), (14, 6));
}

#[test]
fn packet_flow_rulesets_parse_and_print_back() {
    let Some(base) = shared() else { return };
    let mut n = 0;
    for entry in std::fs::read_dir(base.join("packetflow")).expect("packetflow") {
        let p = entry.expect("entry").path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let doc: serde_json::Value = serde_json::from_str(&read(&p)).expect("json");
        let text = doc["ruleset"].as_str().expect("ruleset").to_string();
        let what = p.display().to_string();
        let rs = strict(&text, &what);
        assert!(rs.warnings.is_empty(), "{what}: {:?}", rs.warnings);
        assert_eq!(
            rs.tables[0].family.keyword(),
            doc["ruleset_family"].as_str().expect("family"),
            "{what}"
        );
        assert_prints_as(&rs, &text, &what);
        n += 1;
    }
    assert!(n >= 28, "only {n} packet-flow rulesets");
    let live = base.join("packetflow/live");
    for case in [
        "load-balancer",
        "node-ports-ipv6-multiple-nodeport-addresses",
    ] {
        let load = read(&live.join(format!("{case}.load.nft")));
        let want = normalized(&load, case);
        for suffix in ["live.nft", "live.json"] {
            let other = read(&live.join(format!("{case}.{suffix}")));
            assert_eq!(normalized(&other, suffix), want, "{case}.{suffix}");
        }
    }
}

/// Removes what the text and JSON forms spell differently even after normalising (statements
/// kept verbatim, named objects) and returns how many rules and objects went.
fn without_verbatim(tables: &mut [Table<'_>]) -> (usize, usize) {
    let mut rules = 0;
    let mut objects = 0;
    for t in tables {
        objects += t.objects.len();
        t.objects.clear();
        for c in &mut t.chains {
            let before = c.rules.len();
            c.rules
                .retain(|r| !r.stmts.iter().any(|s| matches!(s, Stmt::Verbatim(_))));
            rules += before - c.rules.len();
        }
    }
    (rules, objects)
}

/// Checks the syntax tour's four forms: commands, listing, listing with handles, JSON.
fn check_syntax_tour(commands: &str, list: &str, list_a: &str, json: &str) {
    let forms = [
        ("commands", commands),
        ("list", list),
        ("list -a", list_a),
        ("json", json),
    ];
    let mut parsed: Vec<Vec<Table<'_>>> = Vec::new();
    for (what, text) in forms {
        let mut tables = normalized(text, what);
        let dropped = without_verbatim(&mut tables);
        // `limit` and `notrack` are kept verbatim in every form (`counter name` is read);
        // the counter object is dropped with them.
        assert_eq!(dropped, (2, 1), "{what}");
        parsed.push(tables);
    }
    for (i, (what, _)) in forms.iter().enumerate().skip(1) {
        if parsed[i] != parsed[0] {
            let a = Ruleset {
                tables: parsed[0].clone(),
                ..Ruleset::default()
            }
            .to_string();
            let b = Ruleset {
                tables: parsed[i].clone(),
                ..Ruleset::default()
            }
            .to_string();
            let missing: Vec<&str> = a.lines().filter(|l| !b.contains(l)).collect();
            let extra: Vec<&str> = b.lines().filter(|l| !a.contains(l)).collect();
            panic!(
                "{what} differs from the commands\n  missing: {missing:#?}\n  extra: {extra:#?}"
            );
        }
    }
    // `nft -a` and `nft -j` give every rule the same handle.
    let handles = |text: &str| -> BTreeMap<String, Vec<Option<u64>>> {
        let rs = strict(text, "handles");
        rs.tables
            .iter()
            .flat_map(|t| {
                t.chains.iter().map(move |c| {
                    (
                        format!("{} {} {}", t.family, t.name, c.name),
                        c.rules.iter().map(|r| r.handle).collect(),
                    )
                })
            })
            .collect()
    };
    let (a, j) = (handles(list_a), handles(json));
    assert_eq!(a, j);
    assert!(a.values().flatten().all(Option::is_some), "{a:?}");
    assert!(a.values().map(Vec::len).sum::<usize>() > 50);
}

#[test]
fn checked_in_listings_read_alike() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/nft");
    let file = |n: &str| read(&dir.join(n));
    check_syntax_tour(
        &file("syntax-tour.nft"),
        &file("syntax-tour.list.txt"),
        &file("syntax-tour.list-a.txt"),
        &file("syntax-tour.json"),
    );
    // iptables-nft's tables: marked in the listing; the listing shows translated statements
    // and `xt match recent`, the JSON shows every extension as `xt`.
    let list = file("iptables-nft.list.txt");
    let rs = strict(&list, "iptables-nft.list.txt");
    assert_eq!(rs.tables.len(), 2);
    assert!(rs.tables.iter().all(|t| t.managed_by_iptables_nft));
    let nat = rs.table(Family::Ip, "nat").expect("nat");
    let sep = nat.chain("KUBE-SEP-X").expect("chain");
    assert_eq!(
        sep.rules[0].to_string(),
        "ip saddr 10.0.0.1 counter packets 0 bytes 0 mark set mark or 0x4000"
    );
    assert_eq!(
        sep.rules[1].to_string(),
        "meta l4proto tcp counter packets 0 bytes 0 dnat to 10.0.0.1:80"
    );
    assert!(matches!(sep.rules[3].stmts[0], Stmt::Xt { .. }));
    let json = file("iptables-nft.json");
    let rs = strict(&json, "iptables-nft.json");
    let sep = rs
        .table(Family::Ip, "nat")
        .and_then(|t| t.chain("KUBE-SEP-X"))
        .expect("chain");
    assert_eq!(
        sep.rules[1].to_string(),
        "meta l4proto tcp xt match \"comment\" xt match \"tcp\" counter packets 0 bytes 0 xt target \"DNAT\""
    );
}

/// Lists the ruleset of `ns` three ways.
fn listings(ns: &Netns) -> [String; 3] {
    [
        ns.run(&["nft", "list", "ruleset"]).expect("nft list"),
        ns.run(&["nft", "-a", "list", "ruleset"])
            .expect("nft -a list"),
        ns.run(&["nft", "-j", "list", "ruleset"])
            .expect("nft -j list"),
    ]
}

#[test]
fn real_nft_listings_read_as_the_dump() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let Some(base) = shared() else { return };
    for case in [
        "render/overall-nftables-rules/expected.nft",
        "render/sync-proxy-rules-repeated-09-empty-endpoints/expected.nft",
        "packetflow/live/node-ports-ipv6-multiple-nodeport-addresses.load.nft",
    ] {
        let dump = read(&base.join(case));
        let want = normalized(&dump, case);
        let ns = Netns::new("nft-parse").expect("netns");
        ns.run_stdin(&["nft", "-f", "-"], &loadable(&dump))
            .expect("nft -f");
        let [list, list_a, json] = listings(&ns);
        for (what, text, form) in [
            ("nft list", &list, InputForm::Listing),
            ("nft -a list", &list_a, InputForm::Listing),
            ("nft -j list", &json, InputForm::Json),
        ] {
            let mut rs = strict(text, what);
            assert_eq!(rs.form, form);
            rs.normalize();
            assert_eq!(rs.tables, want, "{case}: {what}");
        }
        // Handles of `nft -a` are the kernel's: the same as in JSON.
        let handles = |text: &str| -> Vec<Option<u64>> {
            strict(text, "handles").tables[0]
                .chains
                .iter()
                .flat_map(|c| c.rules.iter().map(|r| r.handle))
                .collect()
        };
        let a = handles(&list_a);
        assert_eq!(a, handles(&json));
        assert!(a.iter().all(Option::is_some));

        // What the printer writes loads, and lists as the same ruleset.
        let printed = strict(&dump, case).to_string();
        ns.run(&["nft", "flush", "ruleset"]).expect("flush");
        ns.run_stdin(&["nft", "-f", "-"], &printed)
            .unwrap_or_else(|e| panic!("{case}: printed ruleset does not load: {e}\n{printed}"));
        let [list, _, json] = listings(&ns);
        assert_eq!(normalized(&list, "reloaded list"), want, "{case}");
        assert_eq!(normalized(&json, "reloaded json"), want, "{case}");
    }
}

#[test]
fn real_nft_syntax_tour_reads_alike() {
    if !require_root_and_tools(&["nft"]) {
        return;
    }
    let commands =
        read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/nft/syntax-tour.nft"));
    let ns = Netns::new("nft-tour").expect("netns");
    ns.run_stdin(&["nft", "-f", "-"], &commands)
        .expect("nft -f");
    let [list, list_a, json] = listings(&ns);
    check_syntax_tour(&commands, &list, &list_a, &json);
}
