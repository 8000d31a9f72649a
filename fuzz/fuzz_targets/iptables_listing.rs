//! The `iptables -L` reader never panics on any input; its `-S` text has one line per input line,
//! each blank or a `-P`/`-N`/`-A` line, and stays within a fixed multiple of the input's size;
//! lenient parsing of that text never fails; and strict parsing of anything recognised as a
//! listing fails with the error that names the format.
#![no_main]

use kproxy_parsers::iptables::listing::{looks_like_listing, read_listing};
use kproxy_parsers::iptables::{ParseOptions, parse_dump};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    for table in [None, Some("nat"), Some("filter")] {
        let l = read_listing(&text, table);
        assert_eq!(
            l.text.split('\n').count(),
            text.split('\n').count(),
            "one line per input line"
        );
        assert!(
            l.text.len() <= 32 * text.len() + 64,
            "{} bytes from {}",
            l.text.len(),
            text.len()
        );
        for line in l.text.lines() {
            assert!(
                line.is_empty() || ["-P ", "-N ", "-A "].iter().any(|p| line.starts_with(p)),
                "{line:?}"
            );
        }
        let parsed = parse_dump(&l.text, &ParseOptions::lenient().with_table(l.table));
        assert!(parsed.is_ok(), "lenient parsing failed: {parsed:?}");
    }
    if looks_like_listing(&text).is_some() {
        match parse_dump(&text, &ParseOptions::strict()) {
            Ok(_) => panic!("a listing parsed as iptables-save text"),
            Err(e) => assert!(e.found.starts_with("`iptables -L` output"), "{e}"),
        }
    }
});
