//! The `files` collector: the offline `--iptables-save FILE …` flags.

use super::{CollectError, DumpKind, NodeSnapshot};
use std::path::PathBuf;

/// Paths of dump files, one per [`DumpKind`] (all optional; `-` reads stdin).
#[derive(Debug, Clone, Default)]
pub struct DumpFiles {
    /// (kind, path) pairs.
    pub files: Vec<(DumpKind, PathBuf)>,
    /// Clean pastes (prompts, fences, log prefixes, …; see [`crate::parsers::paste`]).
    pub lenient: bool,
}

/// A dump file's text as the parsers read it, with what reading it did.
#[derive(Debug, Clone, Default)]
pub struct DumpText {
    /// `<stdin>` or the path, as errors name it.
    pub name: String,
    /// The text: decoded and, under `--lenient`, cleaned (line numbers are the file's).
    pub text: String,
    /// What decoding and cleaning did, each as `NAME: what`.
    pub warnings: Vec<String>,
    /// The lines where the paste is cut (`...`).
    pub cuts: Vec<u32>,
    /// The iptables table the text is in when reading decided it (an `iptables -L` listing read
    /// back into `-S` text).
    pub table: Option<String>,
    /// Commands run at shell prompts in the paste (lenient only).
    pub commands: Vec<crate::parsers::paste::CommandLine>,
}

/// Reads one dump file (`-` = stdin): its bytes decoded (a byte-order mark skipped, bytes that
/// are not UTF-8 replaced, each with a warning naming the lines), and under `lenient` cleaned of
/// what a paste wraps around the commands' output. The one reader of node text files (read
/// within the input limits, [`crate::parsers::input`]).
pub fn read_dump(path: &std::path::Path, lenient: bool) -> Result<DumpText, CollectError> {
    let crate::parsers::input::Input { name, bytes } = crate::parsers::input::read(path)?;
    let decoded = crate::parsers::paste::decode(bytes);
    let mut warnings: Vec<String> = decoded
        .notes
        .iter()
        .map(|n| format!("{name}: {n}"))
        .collect();
    if let (false, Some((line, col))) = (lenient, decoded.nul) {
        let text = decoded.text.lines().nth(line as usize - 1).unwrap_or("");
        return Err(CollectError::Parse(
            crate::parsers::ParseError {
                source_name: Some(name),
                line,
                col,
                expected: "text (the output of iptables-save, ipvsadm, …)".to_string(),
                found: "a NUL byte: binary data (--lenient removes such lines)".to_string(),
                line_text: text.to_string(),
            }
            .into(),
        ));
    }
    if !lenient {
        return Ok(DumpText {
            name,
            text: decoded.text,
            warnings,
            ..DumpText::default()
        });
    }
    let cleaned = crate::parsers::paste::clean(&decoded.text);
    warnings.extend(cleaned.notes.iter().map(|n| format!("{name}: {n}")));
    Ok(DumpText {
        cuts: cleaned.cuts().to_vec(),
        name,
        text: cleaned.text,
        warnings,
        commands: cleaned.commands,
        table: None,
    })
}

impl DumpFiles {
    /// True when no file was given.
    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

/// Reads the given files into a snapshot (no shape check: the parsers report bad lines with
/// file:line:col, and `--lenient` applies).
pub fn collect(files: &DumpFiles) -> Result<NodeSnapshot, CollectError> {
    let mut snap = NodeSnapshot {
        collector: "files".to_string(),
        ..NodeSnapshot::default()
    };
    for (kind, path) in &files.files {
        let dump = read_dump(path, files.lenient)?;
        let iptables = match kind {
            DumpKind::IptablesSave | DumpKind::IptablesNftSave => Some("iptables-save"),
            DumpKind::Ip6tablesSave => Some("ip6tables-save"),
            DumpKind::IptablesLegacySave => Some("iptables-legacy-save"),
            _ => None,
        };
        if let Some(command) = iptables
            && crate::parsers::paste::is_json_document(&dump.text)
        {
            // Said before anything reads the text as rules (a release inferred from no rules).
            return Err(CollectError::Parse(
                crate::parsers::ParseError {
                    source_name: Some(dump.name),
                    line: 1,
                    col: 1,
                    expected: format!("{command} text"),
                    found: "a JSON document (API objects go to --state)".to_string(),
                    line_text: dump.text.lines().next().unwrap_or("").to_string(),
                }
                .into(),
            ));
        }
        snap.warnings.extend(dump.warnings);
        *kind.slot(&mut snap) = Some(dump.text);
    }
    Ok(snap)
}
