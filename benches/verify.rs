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
use kproxy::compare::{DumpText, VerifyInput, verify};
use kproxy::state::ip::IpFamily;
use kproxy_parsers::iptables::ParseOptions;
use std::hint::black_box;
use std::path::PathBuf;

fn scale_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/scale")
}

fn benches(c: &mut Criterion) {
    let dir = scale_dir();
    let (Ok(state_text), Ok(config_text), Ok(dump)) = (
        std::fs::read_to_string(dir.join("state.json")),
        std::fs::read_to_string(dir.join("config.yaml")),
        std::fs::read_to_string(dir.join("scale.nft.save")),
    ) else {
        eprintln!(
            "verify bench: {} missing; run `sudo testdata/make-scale-dump.sh` first",
            dir.join("scale.nft.save").display()
        );
        return;
    };
    let state =
        kproxy::state::load::from_str(&state_text, "state.json").unwrap_or_else(|e| panic!("{e}"));
    let (config, _) =
        kproxy::state::config::parse(&config_text, "config.yaml").unwrap_or_else(|e| panic!("{e}"));
    let args = kproxy::cli::common::NodeFactArgs {
        ip_family: "4".into(),
        random_fully: true,
        nfacct: Some("none".into()),
        ..Default::default()
    };
    let (facts, _) =
        kproxy::state::node::build(&args, &state, &config).unwrap_or_else(|e| panic!("{e}"));
    let input = VerifyInput {
        node: "node-1",
        state: &state,
        config: &config,
        facts: &facts,
        dumps: vec![DumpText {
            label: "scale.nft.save",
            text: &dump,
            family: IpFamily::V4,
        }],
        legacy: None,
        nft_ruleset: None,
        parse: ParseOptions::strict(),
    };
    // Sanity: the dump is what kube-proxy would write, so the report is clean.
    let report = verify(&input).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        report.summary.errors + report.summary.warnings,
        0,
        "scale dump is not clean"
    );
    let mut g = c.benchmark_group("verify_end_to_end");
    g.sample_size(10);
    g.bench_function("10k_services_x10", |b| {
        b.iter(|| black_box(verify(black_box(&input))))
    });
    g.finish();
}

criterion_group!(verify_benches, benches);
criterion_main!(verify_benches);
