//! `iptables::parse_dump` never panics, strict or lenient, on any input; lenient parsing never
//! fails; whatever parses strictly parses leniently to the same dump with nothing skipped.
#![no_main]

use kproxy_parsers::iptables::{ParseOptions, parse_dump};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let strict = parse_dump(&text, &ParseOptions::strict());
    let lenient = parse_dump(&text, &ParseOptions::lenient());
    let lenient = match lenient {
        Ok(d) => d,
        Err(e) => panic!("lenient parsing failed: {e}"),
    };
    if let Ok(strict) = strict {
        assert!(
            lenient.skipped.is_empty(),
            "strict parse succeeded but lenient skipped {:?}",
            lenient.skipped
        );
        assert_eq!(
            format!("{strict:?}"),
            format!("{lenient:?}"),
            "strict and lenient dumps differ"
        );
    }
    // `iptables -t nat -S` input: the table comes from the options.
    let nat = parse_dump(&text, &ParseOptions::lenient().with_table("nat"));
    assert!(nat.is_ok(), "lenient -S parsing failed: {nat:?}");
});
