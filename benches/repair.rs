//! `repair` planning speed on the 10k-service node: parse the expected rules (a render with base
//! jumps) and the node's `iptables-save`, then plan the repair of one drifted service —
//! `repair_plan/10k_services_one_drift`. The real apply time is measured with
//! `testdata/measure-repair-scale.sh` (root, real iptables); see BENCHMARKS.md.
//!
//! Input: `target/scale/` made by `testdata/make-scale-dump.sh`. When it is absent the bench prints
//! how to make it and measures nothing.

/// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use kproxy::apply::iptables::plan::plan;
use kproxy::model::Ruleset;
use kproxy_parsers::iptables::ParseOptions;
use std::hint::black_box;
use std::path::PathBuf;

fn benches(c: &mut Criterion) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/scale");
    let (Ok(expected), Ok(dump)) = (
        std::fs::read_to_string(dir.join("scale.restore")),
        std::fs::read_to_string(dir.join("scale.nft.save")),
    ) else {
        eprintln!(
            "repair bench: target/scale/scale.{{restore,nft.save}} missing; run `sudo testdata/make-scale-dump.sh` first"
        );
        return;
    };
    // One drifted service: drop the first endpoint rule of the first SVC chain.
    let victim = dump
        .lines()
        .position(|l| l.starts_with("-A KUBE-SVC-") && l.contains("--probability"))
        .unwrap_or(0);
    let drifted: String = dump
        .lines()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    let opts = ParseOptions::default();
    let mut g = c.benchmark_group("repair_plan");
    g.sample_size(10);
    g.bench_function("10k_services_one_drift", |b| {
        b.iter(|| {
            let e =
                Ruleset::parse(black_box(&expected), &opts).unwrap_or_else(|err| panic!("{err}"));
            let cur =
                Ruleset::parse(black_box(&drifted), &opts).unwrap_or_else(|err| panic!("{err}"));
            let p = plan(&e, &cur, false);
            assert!(!p.is_empty());
            black_box(p.restore_input().len())
        })
    });
    g.finish();
}

criterion_group!(repair, benches);
criterion_main!(repair);
