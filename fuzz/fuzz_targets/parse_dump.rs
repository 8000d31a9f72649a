//! `parse_dump` never panics, strict or lenient, on any input; lenient parsing never fails.
#![no_main]

use kproxy_parsers::iptables::{ParseOptions, parse_dump, parse_rule_line};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_dump(&text, &ParseOptions::strict());
    let lenient = parse_dump(&text, &ParseOptions::lenient().with_table("nat"));
    assert!(lenient.is_ok(), "lenient parsing failed: {lenient:?}");
    let _ = parse_rule_line(&text);
});
