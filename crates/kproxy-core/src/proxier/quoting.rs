//! What the render writes from API state, and how, as defence in depth behind
//! [`crate::state::validate`] (which leaves out what the API server would reject when a state is
//! loaded): a state built any other way still cannot put a rule, a chain or a table into the
//! render's output.
//!
//! Names reach the rules as comments (`ns/name:port`) and, in nftables mode, as chain and set
//! names (`service-HASH-ns/name/tcp/port`). kube-proxy writes them as they are
//! (`proxier.go`: `fmt.Sprintf("\"%s\"", svcPortNameString)`; knftables: `%q`), trusting the API
//! server; here a service port whose name is not plain is not rendered at all
//! ([`unwritable_name`]), and the iptables writers escape what `iptables-restore` can read
//! escaped ([`push_iptables_quoted`], [`push_iptables_word`]).

/// The longest name part the render writes: an RFC 1123 label's.
pub const NAME_PART_MAX: usize = 63;

/// Why `part` (a namespace, a Service name or a port name) cannot be written into rules as it
/// is, or `None`: only letters, digits, `-`, `.` and `_`, at most [`NAME_PART_MAX`] bytes. Every
/// valid name is plain; a plain name needs no quoting anywhere (iptables words and comments,
/// nft strings and chain names), and the longest comment built from three of them fits
/// iptables' 255 bytes.
pub fn unwritable_name(part: &str) -> Option<&'static str> {
    if part.len() > NAME_PART_MAX {
        return Some("is longer than 63 bytes");
    }
    let plain = part
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    (!plain).then_some("holds characters other than letters, digits, '-', '.' and '_'")
}

/// Whether a port number can be written into a rule (0–65535: kube-proxy writes the 0 of a
/// Service port as it is, and 0 is no NodePort).
pub fn writable_port(n: i32) -> bool {
    (0..=65535).contains(&n)
}

/// Appends `parts` as one double-quoted `iptables-restore` word (`--comment "…"`): `"` and `\`
/// escaped with a backslash, as `iptables-save` writes them (`xtables_save_string`) and
/// `iptables-restore` reads them; a control character, which no quoting carries across a
/// line, as the visible text `\xNN`.
pub fn push_iptables_quoted(out: &mut String, parts: &[&str]) {
    out.push('"');
    for part in parts {
        push_iptables_escaped(out, part);
    }
    out.push('"');
}

/// [`push_iptables_quoted`] into a new string.
pub fn iptables_quoted(parts: &[&str]) -> String {
    let mut out = String::new();
    push_iptables_quoted(&mut out, parts);
    out
}

/// Appends `word` bare when `iptables-restore` reads it back as the same one word, else quoted
/// as [`push_iptables_quoted`] does (kube-proxy writes the endpoint chains' comment bare).
pub fn push_iptables_word(out: &mut String, word: &str) {
    let bare = !word.is_empty()
        && !word.starts_with('-')
        && word
            .bytes()
            .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'\''));
    if bare {
        out.push_str(word);
    } else {
        push_iptables_quoted(out, &[word]);
    }
}

/// [`push_iptables_word`] into a new string.
pub fn iptables_word(word: &str) -> String {
    let mut out = String::new();
    push_iptables_word(&mut out, word);
    out
}

fn push_iptables_escaped(out: &mut String, s: &str) {
    if !s
        .bytes()
        .any(|b| matches!(b, b'"' | b'\\') || b.is_ascii_control())
    {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_ascii_control() => {
                use std::fmt::Write as _;
                let _ = write!(out, "\\\\x{:02x}", c as u32);
            }
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names_only() {
        for ok in ["", "ns1", "kube-system", "a.b_c", &"a".repeat(63)] {
            assert_eq!(unwritable_name(ok), None, "{ok}");
        }
        for bad in [
            "a b",
            "a\"b",
            "a\nb",
            "a/b",
            "a:b",
            "}",
            ";",
            "a\0",
            &"a".repeat(64),
        ] {
            assert!(unwritable_name(bad).is_some(), "{bad:?}");
        }
        assert!(writable_port(0) && writable_port(1) && writable_port(65535));
        assert!(!writable_port(-1) && !writable_port(65536) && !writable_port(99999));
    }

    /// What the writers produce reads back, through the same lexer as `iptables-restore`'s
    /// rules, as one word holding the text (control characters as visible `\xNN`).
    #[test]
    fn iptables_quoting_reads_back_as_one_word() {
        use crate::model::Ruleset;
        use kproxy_parsers::iptables::ParseOptions;
        for text in [
            "plain",
            "two words",
            "q\"uote",
            "back\\slash",
            "line\nbreak -A INPUT -j ACCEPT",
            "",
        ] {
            let mut quoted = String::new();
            push_iptables_quoted(&mut quoted, &[text]);
            let mut word = String::new();
            push_iptables_word(&mut word, text);
            for written in [quoted, word] {
                assert!(!written.contains('\n'), "{written}");
                let dump = format!(
                    "*filter\n:KUBE-X - [0:0]\n-A KUBE-X -m comment --comment {written} -j ACCEPT\nCOMMIT\n"
                );
                let rs = Ruleset::parse(&dump, &ParseOptions::strict())
                    .unwrap_or_else(|e| panic!("{dump}: {e}"));
                let rules = rs.rules("filter", "KUBE-X");
                assert_eq!(rules.len(), 1, "{dump}");
                let comment = rules[0].rule.comment().map(|c| c.value().into_owned());
                assert_eq!(
                    comment.as_deref(),
                    Some(&*text.replace('\n', "\\x0a")),
                    "{dump}"
                );
            }
        }
    }
}
