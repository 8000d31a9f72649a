//! Whatever parses round-trips: parse → canonical restore text → parse (strict) gives the same
//! rules, and the canonical text is a fixed point.
#![no_main]

use kproxy::model::Ruleset;
use kproxy::model::serialize::{Style, to_restore};
use kproxy_parsers::iptables::ParseOptions;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(rs) = Ruleset::parse(text, &ParseOptions::lenient()) else {
        return;
    };
    let out = to_restore(&rs, Style::Canonical);
    let again = match Ruleset::parse(&out, &ParseOptions::strict()) {
        Ok(r) => r,
        Err(e) => panic!("canonical text does not parse: {e}\n{out}"),
    };
    assert!(
        rs.same_rules(&again),
        "round trip changed the rules:\n{out}"
    );
    assert_eq!(
        to_restore(&again, Style::Canonical),
        out,
        "canonical text is not a fixed point"
    );
});
