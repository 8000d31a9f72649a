//! `ipset::parse_ipset` (`ipset save` and `ipset list` text) never panics on any input, and every
//! member it returns has a canonical text.
#![no_main]

use kproxy_parsers::ipset::{canonical_member, parse_ipset};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(sets) = parse_ipset(&text) {
        for set in &sets {
            let _ = set.header_value("family");
            for entry in &set.entries {
                let _ = canonical_member(set.set_type, entry.text);
                let _ = entry.member.to_string();
            }
        }
    }
});
