//! What reaches a support ticket is rarely the bare output of one command. This module turns such
//! text back into what the grammars read, and says what it did:
//!
//! * [`decode`] — bytes to text: a UTF-8 byte-order mark is skipped, bytes that are not UTF-8
//!   (a Latin-1 comment) are replaced and their lines named. Always applied.
//! * [`clean`] — under `--lenient`: shell prompts and the commands they ran, markdown fences and
//!   `<details>` blocks, block quotes, a unified diff's prefixes, journald/syslog and klog
//!   prefixes (kube-proxy logs its failed `iptables-restore` input that way), text pasted as one
//!   JSON-escaped string, and `...` cuts. Each kind stripped gives one [`Note`].
//! * [`split`] — a paste of several commands (`iptables -t nat -S`, then `ipset list`, then
//!   `ipvsadm -Ln`) cut into its parts, each with the [`Kind`] of text it holds.
//!
//! Cleaning keeps line numbers: a removed line becomes an empty line and a stripped prefix
//! shortens its line, so `file:line` in later messages is the line of the paste (columns count
//! from the stripped prefix). Only the unescaping of a JSON string makes new lines; its note says
//! so.

use regex::Regex;
use std::fmt;
use std::sync::LazyLock;

/// Something the readers did to the input, reported as one warning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// What was done.
    pub kind: NoteKind,
    /// The 1-based lines concerned (empty when the note concerns the whole input).
    pub lines: Vec<u32>,
}

/// Kinds of [`Note`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NoteKind {
    /// A UTF-8 byte-order mark at the start was skipped.
    ByteOrderMark,
    /// Bytes that are not UTF-8 were replaced by U+FFFD.
    NotUtf8,
    /// Lines holding NUL bytes (never part of a command's text output) were removed.
    NulByte,
    /// Shell prompt lines (and the commands they ran) were removed.
    ShellPrompt,
    /// Markdown code fences were removed.
    MarkdownFence,
    /// The paste ends inside a markdown code fence (the line of its opening): what followed in
    /// the command's output was not pasted.
    OpenFence,
    /// HTML `<details>`/`<summary>`/`<pre>` lines were removed.
    HtmlBlock,
    /// A block quote's `> ` prefixes were removed.
    BlockQuote,
    /// A unified diff's prefixes were removed and its `-` lines dropped (the new side is read).
    DiffPrefix,
    /// journald/syslog line prefixes (`Nov 14 11:06:12 host kube-proxy[123]: `) were removed.
    JournalPrefix,
    /// klog line prefixes (`E1114 11:06:12.491680 12085 proxier.go:1282] `) were removed.
    KlogPrefix,
    /// A JSON-escaped string (`\n`, `\"`, `\t`) was unescaped; line numbers after it count the
    /// unescaped lines.
    JsonString,
    /// The paste is cut (`...`, `[snip]`): what lies between is missing.
    Cut,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            NoteKind::ByteOrderMark => "skipped a UTF-8 byte-order mark at the start of a line",
            NoteKind::NotUtf8 => "bytes that are not UTF-8 replaced by U+FFFD",
            NoteKind::NulByte => {
                "removed lines holding NUL bytes (binary data, not command output)"
            }
            NoteKind::ShellPrompt => "removed shell prompt lines",
            NoteKind::MarkdownFence => "removed markdown code fences",
            NoteKind::OpenFence => {
                "the paste ends inside a code fence that is never closed: the output is cut, its end is missing"
            }
            NoteKind::HtmlBlock => "removed HTML <details>/<summary> lines",
            NoteKind::BlockQuote => "removed block quote `> ` prefixes",
            NoteKind::DiffPrefix => {
                "read a unified diff's new side: removed its `+`/` ` prefixes and its `-` lines"
            }
            NoteKind::JournalPrefix => "removed journald/syslog line prefixes",
            NoteKind::KlogPrefix => "removed klog line prefixes",
            NoteKind::JsonString => {
                "unescaped text pasted as a JSON string (line numbers count its unescaped lines)"
            }
            NoteKind::Cut => "the paste is cut here: what was left out is missing from the input",
        };
        f.write_str(what)?;
        match self.lines.as_slice() {
            [] => Ok(()),
            [one] => write!(f, " (line {one})"),
            many => {
                let shown: Vec<String> = many.iter().take(5).map(u32::to_string).collect();
                let more = if many.len() > 5 { ", …" } else { "" };
                write!(f, " ({} lines: {}{more})", many.len(), shown.join(", "))
            }
        }
    }
}

/// Text decoded from bytes, with what decoding did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded {
    /// The text.
    pub text: String,
    /// A byte-order mark skipped, lines with bytes that are not UTF-8.
    pub notes: Vec<Note>,
    /// The first NUL byte: 1-based line and column (in characters). No command kproxy reads
    /// prints one; strict readers refuse the input there, [`clean`] removes its lines.
    pub nul: Option<(u32, u32)>,
}

/// Decodes a file's bytes: UTF-8 byte-order marks at the start of lines are skipped (a file's
/// own, and those of files concatenated into one paste) and bytes that are not UTF-8 are
/// replaced by U+FFFD, each with a [`Note`] (the lines are named).
pub fn decode(bytes: Vec<u8>) -> Decoded {
    let mut notes = Vec::new();
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => {
            let bytes = e.into_bytes();
            let lines = bytes
                .split(|&b| b == b'\n')
                .enumerate()
                .filter(|(_, line)| std::str::from_utf8(line).is_err())
                .map(|(i, _)| line_number(i))
                .collect();
            notes.push(Note {
                kind: NoteKind::NotUtf8,
                lines,
            });
            String::from_utf8_lossy(&bytes).into_owned()
        }
    };
    let (text, marks) = skip_byte_order_marks(text);
    if !marks.is_empty() {
        notes.insert(
            0,
            Note {
                kind: NoteKind::ByteOrderMark,
                lines: marks,
            },
        );
    }
    let nul = text.find('\0').map(|at| {
        let before = &text[..at];
        let line = before.bytes().filter(|&b| b == b'\n').count();
        let start = before.rfind('\n').map_or(0, |i| i + 1);
        let col = before[start..].chars().count() + 1;
        (line_number(line), u32::try_from(col).unwrap_or(u32::MAX))
    });
    Decoded { text, notes, nul }
}

/// `text` without the byte-order marks (U+FEFF) that start its lines, and those lines. A mark
/// is an encoding's signature, never part of a command's output: left in, it makes `*filter`
/// another word.
fn skip_byte_order_marks(text: String) -> (String, Vec<u32>) {
    const MARK: char = '\u{FEFF}';
    if !text.contains(MARK) {
        return (text, Vec::new());
    }
    let mut out = String::with_capacity(text.len());
    let mut lines = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let body = line.trim_start_matches(MARK);
        if body.len() != line.len() {
            lines.push(line_number(i));
        }
        out.push_str(body);
    }
    (out, lines)
}

fn line_number(index: usize) -> u32 {
    u32::try_from(index.saturating_add(1)).unwrap_or(u32::MAX)
}

/// Whether `text` is one JSON document (`kubectl get … -o json`, `nft -j`), which no text
/// reader of iptables, ipvsadm or ipset output takes. (A dump pasted as a JSON string is not one
/// after [`clean`] unescaped it.)
pub fn is_json_document(text: &str) -> bool {
    text.trim_start().starts_with(['{', '['])
        && serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
}

/// The kinds of node text the readers know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `iptables-save` / `iptables -S` text.
    Iptables,
    /// `iptables -L` listings.
    IptablesListing,
    /// `ipvsadm -Ln` / `ipvsadm -Sn`.
    Ipvsadm,
    /// `ipvsadm -Lnc` connection entries.
    IpvsConnections,
    /// `ipset list` / `ipset save`.
    Ipset,
    /// `nft list …` text or `nft -j` JSON.
    Nft,
    /// `conntrack -L` / `/proc/net/nf_conntrack`.
    Conntrack,
}

impl Kind {
    /// The command whose output this is, for messages.
    pub fn command(self) -> &'static str {
        match self {
            Kind::Iptables => "iptables-save",
            Kind::IptablesListing => "iptables -L",
            Kind::Ipvsadm => "ipvsadm -Ln",
            Kind::IpvsConnections => "ipvsadm -Lnc",
            Kind::Ipset => "ipset list",
            Kind::Nft => "nft list ruleset",
            Kind::Conntrack => "conntrack -L",
        }
    }
}

/// A command line found in a paste (after a shell prompt).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLine {
    /// 1-based line of the paste.
    pub line: u32,
    /// The command as typed (without the prompt and `sudo`).
    pub text: String,
}

impl CommandLine {
    /// The kind of text this command prints, when it is one kproxy reads.
    pub fn kind(&self) -> Option<Kind> {
        let words: Vec<&str> = self.text.split_whitespace().collect();
        let tool = words.first()?.rsplit('/').next()?;
        let has = |flag: &str| words.contains(&flag);
        let short_has = |c: char| {
            words
                .iter()
                .any(|w| w.starts_with('-') && !w.starts_with("--") && w.contains(c))
        };
        Some(match tool {
            "iptables-save"
            | "ip6tables-save"
            | "iptables-legacy-save"
            | "iptables-nft-save"
            | "ip6tables-legacy-save"
            | "ip6tables-nft-save" => Kind::Iptables,
            "iptables" | "ip6tables" | "iptables-legacy" | "iptables-nft" | "ip6tables-legacy"
            | "ip6tables-nft" => {
                if has("--list") || short_has('L') {
                    Kind::IptablesListing
                } else if has("--list-rules") || short_has('S') {
                    Kind::Iptables
                } else {
                    return None;
                }
            }
            "ipvsadm" if short_has('c') || has("--connection") => Kind::IpvsConnections,
            "ipvsadm" => Kind::Ipvsadm,
            "ipset" => Kind::Ipset,
            "nft" => Kind::Nft,
            "conntrack" => Kind::Conntrack,
            "cat" | "less" | "more" if self.text.contains("nf_conntrack") => Kind::Conntrack,
            _ => return None,
        })
    }

    /// The `-t TABLE` of an iptables command, if it names one.
    pub fn table(&self) -> Option<&str> {
        let mut words = self.text.split_whitespace();
        while let Some(w) = words.next() {
            if w == "-t" || w == "--table" {
                return words.next();
            }
            if let Some(t) = w.strip_prefix("--table=") {
                return Some(t);
            }
        }
        None
    }
}

/// A paste after [`clean`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cleaned {
    /// The text, line for line the paste's (see the module doc).
    pub text: String,
    /// What was stripped, one note per kind.
    pub notes: Vec<Note>,
    /// Commands run at shell prompts, in order.
    pub commands: Vec<CommandLine>,
}

impl Cleaned {
    /// The lines where the paste is cut: its `...` marks, and its last line when it ends inside
    /// a code fence that is never closed.
    pub fn cuts(&self) -> Vec<u32> {
        let mut cuts: Vec<u32> = self
            .notes
            .iter()
            .find(|n| n.kind == NoteKind::Cut)
            .map_or_else(Vec::new, |n| n.lines.clone());
        if self.notes.iter().any(|n| n.kind == NoteKind::OpenFence)
            && let Some(last) = self
                .text
                .split('\n')
                .enumerate()
                .filter(|(_, l)| !l.trim().is_empty())
                .last()
                .map(|(i, _)| line_number(i))
            && !cuts.contains(&last)
        {
            cuts.push(last);
        }
        cuts
    }
}

/// Tools whose command lines a bare `$ `/`# `/`> ` prompt may start (a `# ` line that starts
/// otherwise is a comment of the dump, such as `# Generated by iptables-save`).
const TOOLS: &str = r"(?:sudo\s+(?:-\S+\s+)*)?(?:/\S*/)?(?:iptables|ip6tables|iptables-save|ip6tables-save|iptables-legacy|iptables-nft|iptables-legacy-save|iptables-nft-save|ip6tables-legacy|ip6tables-nft|ip6tables-legacy-save|ip6tables-nft-save|ipvsadm|ipset|nft|conntrack|cat|kubectl|crictl|docker|ip|ss|grep|less|more|head|tail|journalctl|sudo|su|exit)\b";

static PROMPT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(
        r"^\s*(?:(?:\[[^\]\n]*@[^\]\n]*\]|[\w.-]+@[\w.-]+(?::[^\s#$]*)?|(?:sh|bash)-[\d.]+|[\w.-]+:[~/][^\s#$]*)\s*[#$%>]\s?(?P<cmd>.*)|[$#%>]\s+(?P<bare>{TOOLS}.*))$"
    ))
    .unwrap_or_else(|e| unreachable!("prompt pattern: {e}"))
});

static FENCE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\s*(?:```|~~~)[\w+-]*\s*$").unwrap_or_else(|e| unreachable!("fence: {e}"))
});

static HTML: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^\s*(?:</?details[^>]*>|<summary>.*</summary>|</?summary>|</?pre>|</?code>)\s*$",
    )
    .unwrap_or_else(|e| unreachable!("html: {e}"))
});

static JOURNAL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d|\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?) [\w.-]+ [\w./-]+(?:\[\d+\])?: ",
    )
    .unwrap_or_else(|e| unreachable!("journal: {e}"))
});

static KLOG: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6}\s+\d+ [\w.-]+:\d+\] ")
        .unwrap_or_else(|e| unreachable!("klog: {e}"))
});

/// klog's wrapper of a multi-line value: `rules=<` opens it, ` >` closes it.
static KLOG_WRAPPER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^(?:.*\s)?[\w-]+=<\s*$|^\s*>\s*$|^\s*>\s+[\w-]+=<\s*$"#)
        .unwrap_or_else(|e| unreachable!("klog wrapper: {e}"))
});

static CUT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^\s*(?:\.\.\.+|…+|\[\s*(?:\.\.\.|…|snip|snipped|truncated|cut)\s*\]|<\s*snip\s*>|\(\s*(?:\.\.\.|…|snip|truncated)\s*\)|\.\.\.\s*\(?\d+ (?:more )?lines.*)\s*$")
        .unwrap_or_else(|e| unreachable!("cut: {e}"))
});

/// Markers of dump text inside an escaped string (so a log line's other strings stay alone).
const DUMP_MARKERS: &[&str] = &[
    "*nat", "*filter", "*mangle", "*raw", "COMMIT", "\\n-A ", "\\n:KUBE", "-A KUBE", "Name: ",
    "TCP  ", "UDP  ", "table ip", "add rule",
];

/// Strips what is not the commands' output from a paste (see the module doc). Line numbers are
/// kept, except after an unescaped JSON string.
pub fn clean(text: &str) -> Cleaned {
    let mut notes: Vec<Note> = Vec::new();
    let add = |notes: &mut Vec<Note>, kind: NoteKind, line: u32| match notes
        .iter_mut()
        .find(|n| n.kind == kind)
    {
        Some(n) => n.lines.push(line),
        None => notes.push(Note {
            kind,
            lines: vec![line],
        }),
    };
    let unescaped;
    let text = match unescape_json_strings(text) {
        Some((t, lines)) => {
            for l in lines {
                add(&mut notes, NoteKind::JsonString, l);
            }
            unescaped = t;
            unescaped.as_str()
        }
        None => text,
    };
    let lines: Vec<&str> = text.split('\n').collect();
    let quoted = is_block_quote(&lines);
    let diff = is_unified_diff(&lines);
    let mut out = String::with_capacity(text.len());
    let mut commands = Vec::new();
    // The line of the fence that is open (a fence line opens or closes one).
    let mut open_fence: Option<u32> = None;
    // How deep the line is in an nft listing's braces: a `#` line there is an nft comment.
    let mut braces = 0usize;
    for (i, raw) in lines.iter().enumerate() {
        let n = line_number(i);
        let mut line = raw.trim_end_matches('\r');
        if i > 0 {
            out.push('\n');
        }
        if quoted && let Some(rest) = line.trim_start().strip_prefix('>') {
            add(&mut notes, NoteKind::BlockQuote, n);
            line = rest.strip_prefix(' ').unwrap_or(rest);
        }
        if diff {
            if line.starts_with("+++ ") || line.starts_with("--- ") || line.starts_with("@@") {
                add(&mut notes, NoteKind::DiffPrefix, n);
                continue;
            }
            match line.as_bytes().first() {
                Some(b'+' | b' ') => {
                    add(&mut notes, NoteKind::DiffPrefix, n);
                    line = &line[1..];
                }
                Some(b'-') => {
                    add(&mut notes, NoteKind::DiffPrefix, n);
                    continue;
                }
                _ => {}
            }
        }
        if let Some(m) = JOURNAL.find(line) {
            add(&mut notes, NoteKind::JournalPrefix, n);
            line = &line[m.end()..];
        }
        if let Some(m) = KLOG.find(line) {
            add(&mut notes, NoteKind::KlogPrefix, n);
            line = &line[m.end()..];
            if KLOG_WRAPPER.is_match(line) || line.starts_with('"') {
                continue;
            }
        } else if notes.iter().any(|n| n.kind == NoteKind::KlogPrefix)
            && KLOG_WRAPPER.is_match(line)
        {
            add(&mut notes, NoteKind::KlogPrefix, n);
            continue;
        }
        if FENCE.is_match(line) {
            add(&mut notes, NoteKind::MarkdownFence, n);
            open_fence = match open_fence {
                Some(_) => None,
                None => Some(n),
            };
            continue;
        }
        if HTML.is_match(line) {
            add(&mut notes, NoteKind::HtmlBlock, n);
            continue;
        }
        if line.contains('\0') {
            add(&mut notes, NoteKind::NulByte, n);
            continue;
        }
        if CUT.is_match(line) {
            add(&mut notes, NoteKind::Cut, n);
            continue;
        }
        let depth = braces;
        braces = nft_depth(braces, line);
        if let Some(c) = PROMPT.captures(line)
            && !(c.name("bare").is_some() && (depth > 0 || is_nft_comment(line)))
        {
            let cmd = c
                .name("cmd")
                .or_else(|| c.name("bare"))
                .map_or("", |m| m.as_str());
            add(&mut notes, NoteKind::ShellPrompt, n);
            let cmd = strip_sudo(cmd.trim());
            if !cmd.is_empty() {
                commands.push(CommandLine {
                    line: n,
                    text: cmd.to_string(),
                });
            }
            continue;
        }
        out.push_str(line);
    }
    if let Some(line) = open_fence {
        add(&mut notes, NoteKind::OpenFence, line);
    }
    notes.sort_by_key(|n| n.kind);
    Cleaned {
        text: out,
        notes,
        commands,
    }
}

/// The brace depth after `line`, from `depth` before it: braces outside quotes open and close
/// the blocks of an nft listing (`table ip nat {`, `chain X {`, `}`).
fn nft_depth(depth: usize, line: &str) -> usize {
    let mut depth = depth;
    let mut quoted = false;
    for c in line.chars() {
        match c {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth = depth.saturating_sub(1),
            '#' if !quoted => break,
            _ => {}
        }
    }
    depth
}

/// A `# ip saddr …` line: an nft statement commented out, not a root prompt running `ip`.
fn is_nft_comment(line: &str) -> bool {
    let mut words = line.trim_start().trim_start_matches('#').split_whitespace();
    matches!(words.next(), Some("ip" | "ip6"))
        && words.next().is_some_and(|w| {
            matches!(
                w,
                "saddr" | "daddr" | "protocol" | "nexthdr" | "version" | "dscp" | "length" | "ttl"
            )
        })
}

fn strip_sudo(cmd: &str) -> &str {
    let mut rest = cmd;
    while let Some(r) = rest.strip_prefix("sudo ") {
        rest = r.trim_start();
        while rest.starts_with('-') {
            rest = rest
                .split_once(char::is_whitespace)
                .map_or("", |(_, r)| r.trim_start());
        }
    }
    rest
}

/// Most non-empty lines start with `>`: a markdown or e-mail quote.
fn is_block_quote(lines: &[&str]) -> bool {
    let mut quoted = 0usize;
    let mut total = 0usize;
    for l in lines.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        total += 1;
        if l.starts_with("> ") || l == ">" {
            quoted += 1;
        }
    }
    total >= 2 && quoted * 10 >= total * 8
}

/// A unified diff of a dump: `@@` hunks, or most lines `+`/`-`/` ` before dump text.
fn is_unified_diff(lines: &[&str]) -> bool {
    let hunks = lines.iter().any(|l| l.starts_with("@@ "));
    let mut prefixed = 0usize;
    let mut added = 0usize;
    let mut total = 0usize;
    for l in lines.iter().filter(|l| !l.trim().is_empty()) {
        total += 1;
        let Some((&first, rest)) = l.as_bytes().split_first() else {
            continue;
        };
        let dump_text = [&b"-A "[..], b":", b"*", b"COMMIT", b"-N ", b"#"]
            .iter()
            .any(|p| rest.starts_with(p));
        if matches!(first, b'+' | b'-' | b' ') && dump_text {
            prefixed += 1;
            if first == b'+' {
                added += 1;
            }
        }
    }
    (hunks && prefixed > 0) || (total >= 2 && added > 0 && prefixed * 10 >= total * 9)
}

/// Replaces each JSON string that holds dump text with its unescaped content; returns the new
/// text and the lines that held such strings, or `None` when there is none. A string may start
/// before the paste does (the paste begins mid-string, `\n-A KUBE-SEP…`) or end after it: the
/// text before a line's first quote is a string's end when it holds escapes (`\n`, `\"`),
/// which JSON has only inside strings.
fn unescape_json_strings(text: &str) -> Option<(String, Vec<u32>)> {
    if !text.contains("\\n") {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut lines = Vec::new();
    for (i, line) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        if !line.contains("\\n") {
            out.push_str(line);
            continue;
        }
        if unescape_line(line, &mut out) {
            lines.push(line_number(i));
        }
    }
    (!lines.is_empty()).then_some((out, lines))
}

/// Writes `line` to `out` with its strings that hold dump text unescaped (each on lines of its
/// own); true when there was one.
fn unescape_line(line: &str, out: &mut String) -> bool {
    // Byte offsets of the quotes that are not escaped: they bound the strings.
    let bytes = line.as_bytes();
    let mut quotes = Vec::new();
    let mut at = 0;
    while let Some(&b) = bytes.get(at) {
        match b {
            b'\\' => at += 2,
            b'"' => {
                quotes.push(at);
                at += 1;
            }
            _ => at += 1,
        }
    }
    let segment = |k: usize| {
        let start = if k == 0 { 0 } else { quotes[k - 1] + 1 };
        let end = quotes.get(k).copied().unwrap_or(line.len());
        &line[start..end]
    };
    let head = segment(0);
    let starts_inside = head.contains("\\n") || head.contains("\\\"");
    let values: Vec<Option<String>> = (0..=quotes.len())
        .map(|k| {
            let inside = (k % 2 == 0) == starts_inside;
            let literal = segment(k);
            let holds_dump =
                literal.contains("\\n") && DUMP_MARKERS.iter().any(|m| literal.contains(m));
            (inside && holds_dump).then(|| unescape(literal))
        })
        .collect();
    for (k, value) in values.iter().enumerate() {
        match value {
            Some(v) => {
                out.push('\n');
                out.push_str(v);
                out.push('\n');
            }
            None => out.push_str(segment(k)),
        }
        // The quote after the segment, unless it bounds an unescaped string.
        if k < quotes.len() && value.is_none() && values.get(k + 1).is_some_and(Option::is_none) {
            out.push('"');
        }
    }
    values.iter().any(Option::is_some)
}

/// The value of a JSON string's content (without its quotes); a string cut inside an escape
/// keeps what is readable.
fn unescape(literal: &str) -> String {
    if let Ok(v) = serde_json::from_str::<String>(&format!("\"{literal}\"")) {
        return v;
    }
    let mut out = String::with_capacity(literal.len());
    let mut chars = literal.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => {}
            Some(other @ ('"' | '\\' | '/')) => out.push(other),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => {}
        }
    }
    out
}

/// One part of a paste: the lines of one command's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// What the part holds.
    pub kind: Kind,
    /// The iptables table its command named (`iptables -t nat -S`), if any.
    pub table: Option<String>,
    /// The IP family its command named (`ip6tables`, `conntrack -f ipv6`): true for IPv6.
    pub ipv6: bool,
    /// The command that printed it, when the paste shows it.
    pub command: Option<String>,
    /// 1-based first and last line of the part in the paste.
    pub lines: (u32, u32),
    /// The whole paste with every line outside the part emptied (so line numbers stay).
    pub text: String,
}

/// What a line of a paste is part of: kind, `-t` table, IPv6, and the command, when known.
type Origin = (Kind, Option<String>, bool, Option<String>);

/// Cuts a cleaned paste into the outputs of the commands it holds: at each command line (a
/// prompt), and where the kind of text changes. Returns one part for a paste of one kind.
pub fn split(cleaned: &Cleaned) -> Vec<Part> {
    let lines: Vec<&str> = cleaned.text.split('\n').collect();
    // The kind each line belongs to: a command's kind holds until the next command; without a
    // command, the kind of the line itself (continuation lines inherit the previous kind).
    let mut kinds: Vec<Option<Origin>> = Vec::with_capacity(lines.len());
    let mut commands = cleaned.commands.iter().peekable();
    let mut current: Option<Origin> = None;
    let mut from_command = false;
    for (i, line) in lines.iter().enumerate() {
        let n = line_number(i);
        while let Some(c) = commands.next_if(|c| c.line <= n) {
            let ipv6 = c.text.contains("ip6tables") || c.text.contains("ipv6");
            current = c
                .kind()
                .map(|k| (k, c.table().map(str::to_string), ipv6, Some(c.text.clone())));
            from_command = current.is_some();
        }
        if !from_command && let Some(kind) = line_kind(line) {
            match &current {
                Some((k, ..)) if *k == kind => {}
                _ => current = Some((kind, None, false, None)),
            }
        }
        kinds.push(if line.trim().is_empty() {
            None
        } else {
            current.clone()
        });
    }
    let mut parts: Vec<Part> = Vec::new();
    let mut open: Option<(usize, Origin)> = None;
    let mut last_line = 0usize;
    let close = |parts: &mut Vec<Part>, start: usize, end: usize, k: Origin| {
        let mut text = String::with_capacity(cleaned.text.len() / 2);
        for (i, l) in lines.iter().enumerate() {
            if i > 0 {
                text.push('\n');
            }
            if i >= start && i <= end {
                text.push_str(l);
            }
        }
        parts.push(Part {
            kind: k.0,
            table: k.1,
            ipv6: k.2,
            command: k.3,
            lines: (line_number(start), line_number(end)),
            text,
        });
    };
    for (i, k) in kinds.into_iter().enumerate() {
        let Some(k) = k else { continue };
        match &open {
            Some((_, ok)) if *ok == k => {}
            Some((start, _)) => {
                let (start, ok) = (*start, open.take().map(|(_, k)| k));
                if let Some(ok) = ok {
                    close(&mut parts, start, last_line, ok);
                }
                open = Some((i, k));
            }
            None => open = Some((i, k)),
        }
        last_line = i;
    }
    if let Some((start, k)) = open {
        close(&mut parts, start, last_line, k);
    }
    parts
}

/// The kind of text a line is evidence of, when it is distinctive.
pub fn line_kind(line: &str) -> Option<Kind> {
    let t = line.trim_start();
    let starts = |p: &str| t.starts_with(p);
    if starts("Chain ") && (t.contains("(policy ") || t.contains(" references)")) {
        return Some(Kind::IptablesListing);
    }
    if starts("target ") && t.contains("prot") && t.contains("source") {
        return Some(Kind::IptablesListing);
    }
    if (starts("pkts ") || starts("num ")) && t.contains("target") {
        return Some(Kind::IptablesListing);
    }
    if starts("IP Virtual Server version") || starts("Prot LocalAddress:Port") {
        return Some(Kind::Ipvsadm);
    }
    if starts("-> RemoteAddress:Port") || starts("-A -t ") || starts("-A -u ") || starts("-A -f ") {
        return Some(Kind::Ipvsadm);
    }
    if starts("-a -t ") || starts("-a -u ") || starts("-a -f ") || starts("-A --sctp-service") {
        return Some(Kind::Ipvsadm);
    }
    if starts("IPVS connection entries") || starts("pro expire state") {
        return Some(Kind::IpvsConnections);
    }
    if starts("Name: ") || starts("Type: hash:") || starts("Number of entries:") {
        return Some(Kind::Ipset);
    }
    if starts("create ") && t.contains(" hash:") || starts("create ") && t.contains(" bitmap:") {
        return Some(Kind::Ipset);
    }
    if starts("table ip ")
        || starts("table ip6 ")
        || starts("table inet ")
        || starts("add table ")
        || starts("add chain ")
        || starts("add rule ")
        || starts("add element ")
        || starts("add map ")
        || starts("add set ")
        || starts("{\"nftables\"")
    {
        return Some(Kind::Nft);
    }
    if starts("*") && t.len() > 1 && t[1..].bytes().all(|b| b.is_ascii_lowercase()) {
        return Some(Kind::Iptables);
    }
    if starts("-A ") || starts("-N ") || starts("-P ") || t == "COMMIT" {
        return Some(Kind::Iptables);
    }
    if starts(":") && t.contains(" [") {
        return Some(Kind::Iptables);
    }
    if starts("# Generated by iptables") || starts("# Generated by ip6tables") {
        return Some(Kind::Iptables);
    }
    let conntrack_proto = [
        "tcp ", "udp ", "sctp ", "icmp ", "icmpv6 ", "ipv4 ", "ipv6 ",
    ];
    if conntrack_proto.iter().any(|p| starts(p)) && t.contains(" src=") {
        return Some(Kind::Conntrack);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_order_mark_and_latin1_are_decoded_with_notes() {
        let d = decode(
            b"\xEF\xBB\xBF*filter\n-A X -m comment --comment \"caf\xE9\"\nCOMMIT\n".to_vec(),
        );
        assert!(d.text.starts_with("*filter\n"));
        assert_eq!(d.notes[0].kind, NoteKind::ByteOrderMark);
        assert_eq!(d.notes[1].kind, NoteKind::NotUtf8);
        assert_eq!(d.notes[1].lines, vec![2]);
        assert!(d.text.contains("caf\u{FFFD}"));
    }

    #[test]
    fn prompts_of_every_shape_are_commands() {
        let text = "$ iptables-save\n# iptables -t nat -S\n[root@node-1 ~]# ipset list\nroot@node-1:~# ipvsadm -Ln\nuser@host:~$ sudo iptables -L -n\n> nft list ruleset\n# Generated by iptables-save v1.8.7\n";
        let c = clean(text);
        let kinds: Vec<_> = c.commands.iter().map(|c| c.kind()).collect();
        assert_eq!(
            kinds,
            vec![
                Some(Kind::Iptables),
                Some(Kind::Iptables),
                Some(Kind::Ipset),
                Some(Kind::Ipvsadm),
                Some(Kind::IptablesListing),
                Some(Kind::Nft)
            ]
        );
        assert_eq!(c.commands[1].table(), Some("nat"));
        assert_eq!(c.text.lines().filter(|l| !l.is_empty()).count(), 1);
        assert!(c.text.contains("# Generated by iptables-save"));
        assert_eq!(c.text.split('\n').count(), text.split('\n').count());
    }

    #[test]
    fn fences_details_and_cuts_are_removed_line_for_line() {
        let text = "<details>\n<summary>rules</summary>\n\n```\n*nat\n-A KUBE-SERVICES -j X\n...\nCOMMIT\n```\n</details>";
        let c = clean(text);
        assert_eq!(c.text, "\n\n\n\n*nat\n-A KUBE-SERVICES -j X\n\nCOMMIT\n\n");
        let kinds: Vec<_> = c.notes.iter().map(|n| n.kind).collect();
        assert_eq!(
            kinds,
            vec![NoteKind::MarkdownFence, NoteKind::HtmlBlock, NoteKind::Cut]
        );
        assert_eq!(c.cuts(), &[7]);
        assert_eq!(c.notes[2].lines, vec![7]);
    }

    #[test]
    fn journal_and_klog_prefixes_are_stripped() {
        let text = "Nov 14 11:06:12 node-1 kube-proxy[123]: E1114 11:06:12.491680   12085 proxier.go:1282] \"Failed to execute iptables-restore\" rules=<\nNov 14 11:06:12 node-1 kube-proxy[123]: \t*nat\nNov 14 11:06:12 node-1 kube-proxy[123]: \t-A KUBE-SERVICES -j X\nNov 14 11:06:12 node-1 kube-proxy[123]: \tCOMMIT\nNov 14 11:06:12 node-1 kube-proxy[123]:  >";
        let c = clean(text);
        assert_eq!(c.text, "\n\t*nat\n\t-A KUBE-SERVICES -j X\n\tCOMMIT\n");
        let kinds: Vec<_> = c.notes.iter().map(|n| n.kind).collect();
        assert_eq!(kinds, vec![NoteKind::JournalPrefix, NoteKind::KlogPrefix]);
    }

    #[test]
    fn a_json_escaped_dump_is_unescaped() {
        let text = r#"{"message": "restore failed", "rules": "*nat\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -m comment --comment \"a b\" -j X\nCOMMIT\n"}"#;
        let c = clean(text);
        assert!(
            c.text
                .contains("\n-A KUBE-SERVICES -m comment --comment \"a b\" -j X\n")
        );
        assert_eq!(c.notes[0].kind, NoteKind::JsonString);
    }

    #[test]
    fn a_unified_diff_is_read_on_its_new_side() {
        let text = "--- a/rules\n+++ b/rules\n@@ -1,3 +1,3 @@\n *nat\n--A KUBE-SERVICES -j OLD\n+-A KUBE-SERVICES -j NEW\n COMMIT";
        let c = clean(text);
        assert_eq!(c.text, "\n\n\n*nat\n\n-A KUBE-SERVICES -j NEW\nCOMMIT");
    }

    #[test]
    fn a_block_quote_is_unquoted() {
        let c = clean("> *nat\n> -A X -j Y\n> COMMIT");
        assert_eq!(c.text, "*nat\n-A X -j Y\nCOMMIT");
    }

    #[test]
    fn a_paste_of_three_commands_splits_into_three_parts() {
        let text = "$ iptables -t nat -S\n-P PREROUTING ACCEPT\n-A KUBE-SERVICES -j X\n$ ipset list\nName: KUBE-CLUSTER-IP\nType: hash:ip,port\n\n$ ipvsadm -Ln\nIP Virtual Server version 1.2.1 (size=4096)\nTCP  10.96.0.1:443 rr\n";
        let parts = split(&clean(text));
        let kinds: Vec<_> = parts
            .iter()
            .map(|p| (p.kind, p.table.clone(), p.lines))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (Kind::Iptables, Some("nat".to_string()), (2, 3)),
                (Kind::Ipset, None, (5, 6)),
                (Kind::Ipvsadm, None, (9, 10)),
            ]
        );
        assert_eq!(
            parts[1].text.split('\n').nth(4),
            Some("Name: KUBE-CLUSTER-IP")
        );
        assert_eq!(parts[1].text.split('\n').nth(1), Some(""));
    }

    #[test]
    fn a_paste_without_prompts_splits_where_the_kind_changes() {
        let text = "*nat\n-A KUBE-SERVICES -j X\nCOMMIT\nIP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\nTCP  10.96.0.1:443 rr\n";
        let parts = split(&clean(text));
        let kinds: Vec<_> = parts.iter().map(|p| (p.kind, p.lines)).collect();
        assert_eq!(
            kinds,
            vec![(Kind::Iptables, (1, 3)), (Kind::Ipvsadm, (4, 6))]
        );
    }

    #[test]
    fn byte_order_marks_at_line_starts_are_skipped() {
        // Two files concatenated: the second one's mark stood before `*filter`.
        let d = decode(b"*nat\nCOMMIT\n\xEF\xBB\xBF*filter\nCOMMIT\n".to_vec());
        assert_eq!(d.text, "*nat\nCOMMIT\n*filter\nCOMMIT\n");
        assert_eq!(
            d.notes,
            vec![Note {
                kind: NoteKind::ByteOrderMark,
                lines: vec![3]
            }]
        );
    }

    #[test]
    fn a_paste_that_ends_inside_a_fence_is_cut_at_its_end() {
        let c = clean("$ iptables -t nat -S\n```\n-P PREROUTING ACCEPT\n-A KUBE-SERVICES -j X\n\n");
        assert!(
            c.notes
                .iter()
                .any(|n| n.kind == NoteKind::OpenFence && n.lines == [2])
        );
        assert_eq!(c.cuts(), vec![4]);
        let closed = clean("```\n-A KUBE-SERVICES -j X\n```\n");
        assert!(closed.cuts().is_empty());
        assert!(!closed.notes.iter().any(|n| n.kind == NoteKind::OpenFence));
    }

    #[test]
    fn a_json_string_cut_at_its_start_is_unescaped() {
        let text = r#"\n-A KUBE-SEP-AAAAAAAAAAAAAAAA -m comment --comment \"ns/a:http\" -j KUBE-MARK-MASQ\n-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -j DNAT --to-destination 10.0.0.1:80\nCOMMIT\n", "level": "error"}"#;
        let c = clean(text);
        let lines: Vec<&str> = c.text.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(
            lines,
            vec![
                r#"-A KUBE-SEP-AAAAAAAAAAAAAAAA -m comment --comment "ns/a:http" -j KUBE-MARK-MASQ"#,
                "-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -j DNAT --to-destination 10.0.0.1:80",
                "COMMIT",
                r#", "level": "error"}"#,
            ]
        );
        assert_eq!(c.notes[0].kind, NoteKind::JsonString);
        // A string cut at its end (no closing quote) is read to the end of the line.
        let c = clean(r#"{"rules": "*nat\n-A KUBE-SERVICES -j X\n-A KUBE-SVC"#);
        assert!(
            c.text
                .contains("\n*nat\n-A KUBE-SERVICES -j X\n-A KUBE-SVC"),
            "{}",
            c.text
        );
    }

    #[test]
    fn commented_nft_lines_are_not_prompts() {
        let text = "table ip kube-proxy {\n\tchain services {\n# ip daddr 10.96.0.1 tcp dport 443 goto service-x\n\t}\n}\n# ip saddr 10.0.0.0/8 drop\n# ip -o addr\n";
        let c = clean(text);
        let prompts: Vec<u32> = c
            .notes
            .iter()
            .filter(|n| n.kind == NoteKind::ShellPrompt)
            .flat_map(|n| n.lines.clone())
            .collect();
        assert_eq!(
            prompts,
            vec![7],
            "only the root prompt running `ip -o addr`"
        );
        assert!(c.text.contains("# ip daddr 10.96.0.1"));
    }

    #[test]
    fn plain_dumps_are_left_alone() {
        let text = "# Generated by iptables-save v1.8.7 on Thu\n*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n# Completed on Thu\n";
        let c = clean(text);
        assert_eq!(c.text, text);
        assert!(c.notes.is_empty());
        assert_eq!(split(&c).len(), 1);
    }
}
