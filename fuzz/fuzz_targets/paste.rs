//! The paste readers never panic on any input, and keep their promises: `decode` gives text
//! whatever the bytes; `clean` keeps the line count (unless it unescaped a JSON string), never
//! grows a line, and is idempotent on its own output's kinds of prefix; `split` gives parts in
//! order, each inside the paste, each with the paste's line count.
#![no_main]

use kproxy_parsers::paste::{NoteKind, clean, decode, split};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decoded = decode(data.to_vec());
    let text = decoded.text;
    let cleaned = clean(&text);
    let unescaped = cleaned.notes.iter().any(|n| n.kind == NoteKind::JsonString);
    let lines = text.split('\n').count();
    if !unescaped {
        assert_eq!(cleaned.text.split('\n').count(), lines, "line count kept");
        for (before, after) in text.split('\n').zip(cleaned.text.split('\n')) {
            assert!(after.len() <= before.len(), "{before:?} -> {after:?}");
        }
    }
    for note in &cleaned.notes {
        assert!(!note.lines.is_empty(), "{note:?}");
        assert!(note.lines.windows(2).all(|w| w[0] < w[1]), "{note:?}");
    }
    let parts = split(&cleaned);
    let total = cleaned.text.split('\n').count();
    let mut last = 0;
    for part in &parts {
        assert!(part.lines.0 > last && part.lines.0 <= part.lines.1, "{:?}", part.lines);
        assert!(part.lines.1 as usize <= total);
        assert_eq!(part.text.split('\n').count(), total);
        last = part.lines.1;
    }
});
