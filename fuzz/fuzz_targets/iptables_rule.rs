//! `iptables::parse_rule_line` never panics on any line, and a rule it returns is the first line's.
#![no_main]

use kproxy_parsers::iptables::parse_rule_line;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = parse_rule_line(&text);
});
