//! `verify` speed end to end on the 10k-service dump: parse the `iptables-save` text, compute and
//! render what kube-proxy would write, build the service graph, and compare (node-wide, graph and
//! rule level) — `verify_end_to_end/10k_services_x10`.
//!
//! Input: `target/scale/` made by `testdata/make-scale-dump.sh` (root; a real `iptables-save` of
//! the rendered 10,000 services × 10 endpoints). When it is absent the bench prints how to make it
//! and measures nothing. The state JSON is parsed once outside the measurement (that is `render`'s
//! `load_state_json` bench).

/// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
#[path = "support/scale.rs"]
mod scale;

use kproxy::compare::iptables::verify;
use std::hint::black_box;

fn benches(c: &mut Criterion) {
    kproxy::allocator::keep_freed_memory(); // as the binary does
    let Some(scale) = scale::Scale::load("verify bench") else {
        return;
    };
    let input = scale.verify_input();
    // Sanity: the dump is what kube-proxy would write, so the report is clean.
    let report = verify(&input).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        report.summary.errors + report.summary.warnings,
        0,
        "scale dump is not clean"
    );
    let mut g = c.benchmark_group("verify_end_to_end");
    g.sample_size(10);
    // Each iteration plans (what kube-proxy would install), parses, renders and compares.
    g.bench_function("10k_services_x10", |b| {
        b.iter(|| black_box(verify(black_box(&scale.verify_input()))))
    });
    g.finish();
}

criterion_group!(verify_benches, benches);
criterion_main!(verify_benches);
