//! The text of a render, table by table: chain declarations and rule lines as
//! `iptables-restore` input, and the `-o json` form.

use crate::state::Warning;
use crate::state::ip::IpFamily;
use serde::Serialize;

/// Text stored as a list of chunks of whole lines, so a large render never reallocates (and
/// never holds more than one chunk of spare capacity).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct TextBuf {
    /// Full chunks, in order.
    pub(super) done: Vec<String>,
    /// The chunk being filled (after `done`).
    pub(super) current: String,
}

/// A chunk's size: 256 KiB. A streamed render (verify) holds one partial chunk per table and kind
/// at a time, so this is what it costs on top of its reader.
const CHUNK: usize = 256 << 10;
const MAX_LINE: usize = 8 << 10;

impl TextBuf {
    /// The buffer to append the next whole line to.
    pub(super) fn line(&mut self) -> &mut String {
        if self.current.len() + MAX_LINE > self.current.capacity() {
            if self.current.capacity() < CHUNK {
                let more = self.current.capacity().max(MAX_LINE);
                self.current.reserve(more);
            } else {
                let full = std::mem::replace(&mut self.current, String::with_capacity(CHUNK));
                self.done.push(full);
            }
        }
        &mut self.current
    }

    pub(super) fn chunks(&self) -> impl Iterator<Item = &str> {
        self.done
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(self.current.as_str()))
    }

    pub(super) fn lines(&self) -> impl Iterator<Item = &str> {
        self.chunks().flat_map(str::lines)
    }

    pub(super) fn len(&self) -> usize {
        self.chunks().map(str::len).sum()
    }

    pub(super) fn prepend(&mut self, text: String) {
        self.done.insert(0, text);
    }
}

/// One table of a render: chain declarations and rule lines, as restore text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RenderedTable {
    /// `filter`, `nat` or `mangle`.
    pub name: &'static str,
    pub(super) chain_lines: TextBuf,
    pub(super) rule_lines: TextBuf,
}

impl RenderedTable {
    pub(super) fn new(name: &'static str) -> RenderedTable {
        RenderedTable {
            name,
            chain_lines: TextBuf::default(),
            rule_lines: TextBuf::default(),
        }
    }

    pub(super) fn chain(&mut self, name: &str) {
        let b = self.chain_lines.line();
        b.push(':');
        b.push_str(name);
        b.push_str(" - [0:0]\n");
    }

    /// The declared chains as `(name, policy)`; policy is `-` for user chains.
    pub fn chains(&self) -> impl Iterator<Item = (&str, &str)> {
        self.chain_lines.lines().map(|l| {
            let mut w = l.trim_start_matches(':').split(' ');
            (w.next().unwrap_or(""), w.next().unwrap_or("-"))
        })
    }

    /// The rule lines (`-A CHAIN …`), in emission order.
    pub fn rules(&self) -> impl Iterator<Item = &str> {
        self.rule_lines.lines()
    }

    /// The rules of one chain (full `-A` lines), in order.
    pub fn chain_rules<'a>(&'a self, chain: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.rules().filter(move |r| rule_chain(r) == chain)
    }

    /// Bytes of restore text this table contributes (without `*name`/`COMMIT`).
    pub fn text_len(&self) -> usize {
        self.chain_lines.len() + self.rule_lines.len()
    }
}

/// The chain a `-A CHAIN …` line appends to.
pub fn rule_chain(line: &str) -> &str {
    line.split(' ').nth(1).unwrap_or("")
}

/// Splits a rule into words; a double-quoted word (kube-proxy's multi-word comments) is one word
/// without its quotes.
pub fn rule_words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line.trim();
    while !rest.is_empty() {
        if let Some(q) = rest.strip_prefix('"') {
            let end = q.find('"').unwrap_or(q.len());
            out.push(q[..end].to_string());
            rest = q.get(end + 1..).unwrap_or("").trim_start();
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            out.push(rest[..end].to_string());
            rest = rest[end..].trim_start();
        }
    }
    out
}

/// The output of a render.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    /// The family rendered.
    pub family: IpFamily,
    /// Whether large-cluster mode was on.
    pub large_cluster_mode: bool,
    /// The tables, in output order (filter, nat, then mangle with base jumps).
    pub tables: Vec<RenderedTable>,
    /// Objects skipped or oddities kube-proxy would log.
    pub warnings: Vec<Warning>,
}

impl Rendered {
    /// The table named `name`.
    pub fn table(&self, name: &str) -> Option<&RenderedTable> {
        self.tables.iter().find(|t| t.name == name)
    }

    /// Writes the `iptables-restore` input.
    pub fn write_restore(&self, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        for t in &self.tables {
            writeln!(w, "*{}", t.name)?;
            for c in t.chain_lines.chunks().chain(t.rule_lines.chunks()) {
                w.write_all(c.as_bytes())?;
            }
            writeln!(w, "COMMIT")?;
        }
        Ok(())
    }

    /// The `iptables-restore` input as one string.
    pub fn to_restore_text(&self) -> String {
        let cap = self.tables.iter().map(|t| t.text_len() + 16).sum();
        let mut s = String::with_capacity(cap);
        for t in &self.tables {
            s.push('*');
            s.push_str(t.name);
            s.push('\n');
            for c in t.chain_lines.chunks().chain(t.rule_lines.chunks()) {
                s.push_str(c);
            }
            s.push_str("COMMIT\n");
        }
        s
    }

    /// The structured form used by `-o json`.
    pub fn to_json_value(&self) -> RenderedJson<'_> {
        RenderedJson {
            family: self.family,
            large_cluster_mode: self.large_cluster_mode,
            tables: self
                .tables
                .iter()
                .map(|t| TableJson {
                    name: t.name,
                    chains: t
                        .chains()
                        .map(|(name, policy)| ChainJson { name, policy })
                        .collect(),
                    rules: t
                        .rules()
                        .map(|line| {
                            let words = rule_words(line);
                            RuleJson {
                                chain: rule_chain(line),
                                args: words.into_iter().skip(2).collect(),
                                line,
                            }
                        })
                        .collect(),
                })
                .collect(),
            warnings: &self.warnings,
        }
    }
}

/// `-o json` document.
#[derive(Debug, Serialize)]
pub struct RenderedJson<'a> {
    /// `IPv4` / `IPv6`.
    pub family: IpFamily,
    /// Large-cluster mode on.
    pub large_cluster_mode: bool,
    /// Tables in output order.
    pub tables: Vec<TableJson<'a>>,
    /// Warnings.
    pub warnings: &'a [Warning],
}

/// One table in `-o json`.
#[derive(Debug, Serialize)]
pub struct TableJson<'a> {
    /// Table name.
    pub name: &'a str,
    /// Declared chains.
    pub chains: Vec<ChainJson<'a>>,
    /// Rules in emission order.
    pub rules: Vec<RuleJson<'a>>,
}

/// One chain declaration in `-o json`.
#[derive(Debug, Serialize)]
pub struct ChainJson<'a> {
    /// Chain name.
    pub name: &'a str,
    /// `-` or the built-in policy.
    pub policy: &'a str,
}

/// One rule in `-o json`.
#[derive(Debug, Serialize)]
pub struct RuleJson<'a> {
    /// The chain appended to.
    pub chain: &'a str,
    /// The words after `-A CHAIN` (quotes removed).
    pub args: Vec<String>,
    /// The restore line.
    pub line: &'a str,
}
