//! Peak working memory (heap bytes added, counted by the allocator) of the large-node pipelines,
//! as a multiple of the dump size: parse, parse + model, parse + model + graph, verify, and the
//! parts verify holds at once (model, its comparison-only graph, plan, render keys). Input:
//! `target/scale/` made by `testdata/make-scale-dump.sh` (root). Prints one line per pipeline;
//! the dump text and the preloaded API state are inputs and not counted.

#[path = "support/counting.rs"]
mod counting;
#[path = "support/scale.rs"]
mod scale;

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting;

use kproxy::compare::iptables::verify;
use kproxy::graph::{self, GraphOptions};
use kproxy::model::Ruleset;
use kproxy_parsers::iptables::{Family, ParseOptions, parse_dump};
use std::hint::black_box;

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`: measuring a debug build
    // says nothing, so only `cargo bench` measures.
    if !std::env::args().any(|a| a == "--bench") {
        println!("footprint: measured only under `cargo bench --bench footprint`");
        return;
    }
    let Some(scale) = scale::Scale::load("footprint") else {
        return;
    };
    let dump = scale.dump.as_str();
    let size = dump.len() as f64;
    let report = |what: &str, peak: usize| {
        println!(
            "{what:<28} peak heap {:>7.1} MB = {:.2}x dump ({:.1} MB)",
            peak as f64 / 1e6,
            peak as f64 / size,
            size / 1e6
        )
    };
    let strict = ParseOptions::strict();
    let (_, p) = counting::peak_of(|| black_box(parse_dump(dump, &strict).map(|d| d.tables.len())));
    report("parse_dump", p);
    let (_, p) =
        counting::peak_of(|| black_box(Ruleset::parse(dump, &strict).map(|r| r.rule_count())));
    report("parse + model", p);
    let (_, p) = counting::peak_of(|| {
        black_box(
            graph::iptables::from_text(dump, "scale", &strict, &GraphOptions::default())
                .map(|g| g.service_ports.len()),
        )
    });
    report("parse + model + graph", p);
    // The parts: what the model keeps, and what building the graph adds on top of it.
    let base = counting::live();
    let dump_ast = parse_dump(dump, &strict).expect("parses");
    let facts = graph::iptables::DumpSummary::of(&dump_ast);
    let rs = Ruleset::from_dump(dump_ast);
    report("  model kept", counting::live() - base);
    let (g, p) =
        counting::peak_of(|| graph::iptables::build_ruleset(&rs, &facts, &GraphOptions::default()));
    report("  graph build (over the model)", p);
    drop(rs);
    report("  graph kept", counting::live() - base);
    drop(g);
    // verify's graph: only what the graph-level comparison reads.
    let base = counting::live();
    let dump_ast = parse_dump(dump, &strict).expect("parses");
    let rs = Ruleset::from_dump(dump_ast);
    let lean = GraphOptions {
        comparison_only: true,
        ..GraphOptions::default()
    };
    let (g, p) = counting::peak_of(|| graph::iptables::build_ruleset(&rs, &facts, &lean));
    report("  verify's graph build", p);
    drop(rs);
    report("  verify's graph kept", counting::live() - base);
    drop(g);
    // What verify holds besides the dump's rules.
    let state_path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/scale/state.json");
    let state_text = std::fs::read_to_string(&state_path).expect("state.json");
    let base = counting::live();
    let (state, p) = counting::peak_of(|| {
        kproxy::state::load::from_str(&state_text, "state.json").expect("state.json loads")
    });
    report("  API state load (from JSON)", p);
    report("  API state kept", counting::live() - base);
    drop(state);
    drop(state_text);
    let base = counting::live();
    let plan = kproxy::proxier::iptables::expected_service_ports(
        &scale.state,
        &scale.config,
        &scale.facts,
    );
    report("  plan kept", counting::live() - base);
    let base = counting::live();
    let expected = kproxy::compare::iptables::expected::expected_ports(&plan);
    report("  expected ports kept", counting::live() - base);
    drop(expected);
    let (rendered, p) = counting::peak_of(|| {
        kproxy::proxier::iptables::render_decisions(&plan, &scale.facts, Default::default())
    });
    report("  render (from the plan)", p);
    drop(rendered);
    let render = |sink: &mut dyn FnMut(kproxy::proxier::iptables::RenderChunk<'_>)| {
        let _ = kproxy::proxier::iptables::render_decisions_chunks(&plan, &scale.facts, sink);
    };
    let base = counting::live();
    let (keys, p) = counting::peak_of(|| {
        kproxy::compare::iptables::rule_level::ExpectedRules::build(
            &render,
            Family::V4,
            plan.nat_chains_estimate(),
        )
        .expect("render keys")
    });
    report("  render keys build", p);
    report("  render keys kept", counting::live() - base);
    drop(keys);
    drop(plan);
    let (r, p) = counting::peak_of(|| {
        verify(&scale.verify_input()).map(|r| r.summary.errors + r.summary.warnings)
    });
    assert_eq!(r.ok(), Some(0), "scale dump is not clean");
    report("verify (state preloaded)", p);
}
