//! conntrack listing parse speed: 100,000 entries (and the same in `/proc/net/nf_conntrack` form),
//! made from the real lines of `testdata/conntrack/` with their addresses and ports varied, so
//! every entry is distinct.
//!
//! * `conntrack_parse/list_100k` — `conntrack -L` (default form, counters on);
//! * `conntrack_parse/extended_100k` — `conntrack -L -o extended`;
//! * `conntrack_parse/proc_100k` — `cat /proc/net/nf_conntrack` (IPv6 groups in full).

use std::fmt::Write as _;
use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kproxy_parsers::conntrack::{ParseOptions, parse};

const ENTRIES: u32 = 100_000;

fn capture(name: &str) -> String {
    let path = format!(
        "{}/../testdata/conntrack/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// `ENTRIES` lines cycling through the captured flows of `name`, each with the client address
/// and source port replaced by a distinct pair (in both tuples).
fn generate(name: &str) -> String {
    let text = capture(name);
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.starts_with("conntrack v"))
        .collect();
    let mut out = String::with_capacity(
        lines.iter().map(|l| l.len() + 1).sum::<usize>() * 100_000 / lines.len(),
    );
    for i in 0..ENTRIES {
        let line = lines[i as usize % lines.len()];
        let client4 = format!("192.168.{}.{}", 50 + (i / 250) % 200, i % 250 + 2);
        let client6 = format!("fd00:50::{:x}", (i + 2) & 0xffff);
        let client6_full = format!(
            "fd00:0050:0000:0000:0000:0000:0000:{:04x}",
            (i + 2) & 0xffff
        );
        let port = 1024 + (i % 60_000);
        let mut l = line
            .replace("192.168.50.2", &client4)
            .replace("fd00:0050:0000:0000:0000:0000:0000:0002", &client6_full)
            .replace("fd00:50::2", &client6);
        for sport in [
            "40001", "40002", "40003", "40004", "40005", "40006", "41001", "41002",
        ] {
            l = l.replace(&format!("sport={sport} "), &format!("sport={port} "));
            l = l.replace(&format!("dport={sport} "), &format!("dport={port} "));
        }
        let _ = writeln!(out, "{l}");
    }
    let _ = writeln!(
        out,
        "conntrack v1.4.7 (conntrack-tools): {ENTRIES} flow entries have been shown."
    );
    out
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("conntrack_parse");
    group.sample_size(20);
    for (id, name) in [
        ("list_100k", "list.txt"),
        ("extended_100k", "extended.txt"),
        ("proc_100k", "proc.txt"),
    ] {
        let text = generate(name);
        let parsed = parse(&text, ParseOptions::strict()).expect("generated listing parses");
        assert_eq!(parsed.flows.len(), ENTRIES as usize);
        eprintln!("{id}: {} bytes, {} entries", text.len(), parsed.flows.len());
        drop(parsed);
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(id, |b| {
            b.iter(|| parse(black_box(&text), ParseOptions::strict()).map(|l| l.flows.len()))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
