//! `conntrack::parse` (`conntrack -L` in every form, `conntrack -E` lines, `/proc/net/nf_conntrack`)
//! never panics, strict or lenient; lenient never fails; a strict success equals the lenient
//! result with nothing skipped; every error's line and column lie inside the input.
#![no_main]

use kproxy_parsers::conntrack::{ParseOptions, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let lenient = parse(&text, ParseOptions::lenient()).expect("lenient parsing never fails");
    match parse(&text, ParseOptions::strict()) {
        Ok(strict) => {
            assert!(lenient.skipped.is_empty());
            assert_eq!(strict, lenient);
        }
        Err(e) => {
            assert!(!lenient.skipped.is_empty());
            let line = text.split('\n').nth(e.line as usize - 1).expect("error line in input");
            assert!(e.col as usize <= line.chars().count() + 1, "{e}");
        }
    }
});
