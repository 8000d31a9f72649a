//! `nft::parse` never panics, strict or lenient, on any input; lenient reading of text never
//! fails; whatever parses strictly parses leniently to the same tables with nothing skipped;
//! and text that parses strictly prints (as `nft -f` command lines) to text that parses to the
//! same normalised tables, which prints to itself.
#![no_main]

use kproxy_parsers::nft::{ParseOptions, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let json = text.trim_start_matches('\u{feff}').trim_start().starts_with('{');
    let strict = parse(&text, &ParseOptions::strict());
    let lenient = parse(&text, &ParseOptions::lenient());
    if !json {
        assert!(lenient.is_ok(), "lenient text parsing failed: {lenient:?}");
    }
    let Ok(mut strict) = strict else { return };
    let lenient = match lenient {
        Ok(l) => l,
        Err(e) => panic!("strict parsing succeeded but lenient failed: {e}"),
    };
    assert!(lenient.skipped.is_empty(), "skipped {:?}", lenient.skipped);
    assert_eq!(strict.tables, lenient.tables, "strict and lenient differ");
    if json {
        // Statements JSON keeps verbatim are JSON text, not nft text: no round trip.
        return;
    }
    let printed = strict.to_string();
    let mut back = match parse(&printed, &ParseOptions::strict()) {
        Ok(b) => b,
        Err(e) => panic!("printed ruleset does not parse: {e}\n{printed}"),
    };
    let reprinted = back.to_string();
    strict.normalize();
    back.normalize();
    assert_eq!(strict.tables, back.tables, "print → parse changed the ruleset:\n{printed}");
    assert_eq!(printed, reprinted, "printing is not a fixed point");
});
