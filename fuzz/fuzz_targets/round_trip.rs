//! Whatever parses round-trips: parse (lenient) → canonical restore text → parse (strict) gives
//! the same rules, and the canonical text is a fixed point.
//!
//! The canonical model and serialiser are `kproxy-core`'s `model`, compiled in by path: it
//! depends only on std, `kproxy-parsers` and a few hashing and serialisation crates, and this
//! keeps the fuzz build free of `kproxy-core`'s Kubernetes dependencies.
#![no_main]

#[allow(dead_code, unused_imports)]
#[path = "../../crates/kproxy-core/src/model/mod.rs"]
mod model;

use kproxy_parsers::iptables::ParseOptions;
use libfuzzer_sys::fuzz_target;
use model::Ruleset;
use model::serialize::{Style, to_restore};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(rs) = Ruleset::parse(&text, &ParseOptions::lenient()) else {
        return;
    };
    let out = to_restore(&rs, Style::Canonical);
    let again = match Ruleset::parse(&out, &ParseOptions::strict()) {
        Ok(r) => r,
        Err(e) => panic!("canonical text does not parse: {e}\n{out}"),
    };
    let out_again = to_restore(&again, Style::Canonical);
    assert!(
        rs.same_rules(&again),
        "round trip changed the rules:\n{out}\n--- printed again as:\n{out_again}"
    );
    assert_eq!(out_again, out, "canonical text is not a fixed point");
});
