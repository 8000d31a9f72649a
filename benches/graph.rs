//! `graph` speed on the 10k-service dump: parse + build the service graph
//! (`graph/parse_and_build/10k_services_x10`), build alone from a parsed ruleset
//! (`graph/build_ruleset/10k_services_x10`), and the table rendering (`graph/table/10k_services_x10`).
//!
//! Input: `target/scale/scale.nft.save` made by `testdata/make-scale-dump.sh` (root). When it is
//! absent the bench prints how to make it and measures nothing.

/// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use kproxy::graph::{self, GraphOptions, iptables::DumpSummary};
use kproxy::model::Ruleset;
use kproxy_parsers::iptables::{ParseOptions, parse_dump};
use std::hint::black_box;
use std::path::PathBuf;

fn benches(c: &mut Criterion) {
    kproxy::allocator::keep_freed_memory(); // as the binary does
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/scale/scale.nft.save");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!(
            "graph bench: {} missing; run `sudo testdata/make-scale-dump.sh` first",
            path.display()
        );
        return;
    };
    let opts = GraphOptions::default();
    let parse = ParseOptions::default();
    let mut g = c.benchmark_group("graph");
    g.sample_size(10);
    g.bench_function("parse_and_build/10k_services_x10", |b| {
        b.iter(|| {
            graph::iptables::from_text(black_box(&text), "scale", &parse, &opts)
                .map(|g| g.service_ports.len())
        })
    });
    let dump = parse_dump(&text, &parse).unwrap_or_else(|e| panic!("{e}"));
    let facts = DumpSummary::of(&dump);
    let rs = Ruleset::from_dump(dump);
    g.bench_function("build_ruleset/10k_services_x10", |b| {
        b.iter(|| {
            graph::iptables::build_ruleset(black_box(&rs), &facts, &opts)
                .service_ports
                .len()
        })
    });
    let built = graph::iptables::build_ruleset(&rs, &facts, &opts);
    g.bench_function("table/10k_services_x10", |b| {
        b.iter(|| kproxy::output::graph::table_text(black_box(&built), false, false).len())
    });
    g.finish();
}

criterion_group!(graph_benches, benches);
criterion_main!(graph_benches);
