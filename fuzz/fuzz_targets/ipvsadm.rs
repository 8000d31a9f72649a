//! `ipvsadm::parse_dump` (`-Ln` listings in every layout, `-Lnc`, `--timeout`, `--daemon` and the
//! `-Sn` save form) never panics on any input, nor do the views of what it returns.
#![no_main]

use kproxy_parsers::ipvsadm::parse_dump;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(dump) = parse_dump(&text) {
        let _ = dump.merged_services();
    }
});
