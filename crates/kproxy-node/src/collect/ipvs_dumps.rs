//! An IPVS-mode node's dumps given as files (`--ipvsadm`, `--ipset`, `--ip-addr`) or pasted:
//! read as texts, several `ipvsadm` outputs as one, and under lenient reading cleaned of what
//! the parsers cannot read. What reading did is returned as warnings, one line each.

use super::CollectError;
use super::files::read_dump;
use kproxy_parsers::ipvsadm::IpvsDump;
use kproxy_parsers::{ParseError, ipset, ipvsadm};
use std::path::{Path, PathBuf};

/// The texts of an IPVS node's dumps, read once (parsed values borrow from them).
#[derive(Debug, Clone, Default)]
pub struct IpvsTexts {
    /// `ipvsadm -Ln` / `-Sn` / `-Lnc` / … output (several files one after the other).
    pub ipvsadm: String,
    /// Its name for messages: the files' names joined with `+`.
    pub ipvsadm_name: String,
    /// `ipset save` or `ipset list` output and its name.
    pub ipset: Option<(String, String)>,
    /// `ip addr` output covering `kube-ipvs0`.
    pub ip_addr: Option<String>,
    /// What lenient reading left out: lines skipped, cuts (`...`), in words.
    pub gaps: Vec<String>,
    /// The ipvsadm lines lenient reading skipped.
    pub skipped: Vec<usize>,
}

impl IpvsTexts {
    /// Reads the files (`-` = stdin, at most once) as every node text is read
    /// ([`read_dump`]); under `lenient`, lines the parsers cannot read are skipped with a
    /// warning each.
    pub fn read(
        ipvsadm_files: &[PathBuf],
        ipset_file: Option<&Path>,
        ip_addr_file: Option<&Path>,
        lenient: bool,
        warnings: &mut Vec<String>,
    ) -> Result<IpvsTexts, CollectError> {
        let mut gaps = Vec::new();
        let mut read = |p: &Path, warnings: &mut Vec<String>| -> Result<String, CollectError> {
            let d = read_dump(p, lenient)?;
            warnings.extend(d.warnings);
            gaps.extend(d.cuts.iter().map(|line| {
                format!(
                    "{}: the paste is cut at line {line}: what was left out is missing",
                    d.name
                )
            }));
            Ok(d.text)
        };
        let mut ipvsadm = String::new();
        for p in ipvsadm_files {
            ipvsadm.push_str(&read(p, warnings)?);
            if !ipvsadm.ends_with('\n') {
                ipvsadm.push('\n');
            }
        }
        let ipvsadm_name = ipvsadm_files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join("+");
        let ipset = match ipset_file {
            Some(p) => Some((read(p, warnings)?, p.display().to_string())),
            None => None,
        };
        let ip_addr = ip_addr_file.map(|p| read(p, warnings)).transpose()?;
        let mut texts = IpvsTexts::from_texts((ipvsadm, ipvsadm_name), ipset, lenient, warnings);
        texts.ip_addr = ip_addr;
        texts.gaps.splice(0..0, gaps);
        Ok(texts)
    }

    /// Texts read otherwise (the parts of a paste), each `(text, name)`; under `lenient`
    /// cleaned of lines the parsers cannot read, as [`IpvsTexts::read`] does.
    pub fn from_texts(
        ipvsadm: (String, String),
        ipset: Option<(String, String)>,
        lenient: bool,
        warnings: &mut Vec<String>,
    ) -> IpvsTexts {
        let (mut ipvsadm, ipvsadm_name) = ipvsadm;
        let mut ipset = ipset;
        let mut gaps = Vec::new();
        let mut skipped = Vec::new();
        if lenient {
            add_missing_header(&mut ipvsadm, &ipvsadm_name, warnings);
            skipped = skip_unreadable(&mut ipvsadm, &ipvsadm_name, warnings, |t| {
                ipvsadm::parse_dump(t).map(|_| ())
            });
            if !skipped.is_empty() {
                let names = skipped.iter().any(|(_, why)| why.contains("with -n"));
                gaps.push(format!(
                    "{ipvsadm_name}: {} line(s) could not be read and were skipped: the virtual and real servers on them are unknown{}",
                    skipped.len(),
                    if names {
                        " (`ipvsadm -L` without `-n` prints host and service names: `ipvsadm -Ln` prints what kproxy reads)"
                    } else {
                        ""
                    }
                ));
            }
            if let Some((text, name)) = &mut ipset {
                let lines =
                    skip_unreadable(text, name, warnings, |t| ipset::parse_ipset(t).map(|_| ()));
                if !lines.is_empty() {
                    gaps.push(format!(
                        "{name}: {} line(s) could not be read and were skipped",
                        lines.len()
                    ));
                }
            }
        }
        IpvsTexts {
            ipvsadm,
            ipvsadm_name,
            ipset,
            ip_addr: None,
            gaps,
            skipped: skipped.into_iter().map(|(line, _)| line).collect(),
        }
    }

    /// Adds what the capture lacks beyond what reading it found (a paste's cuts), in words.
    pub fn add_gaps(&mut self, gaps: impl IntoIterator<Item = String>) {
        self.gaps.extend(gaps);
    }

    /// Parses the ipvsadm text (named after its files in errors); the lines the parser passed
    /// over are warnings.
    pub fn dump(&self, warnings: &mut Vec<String>) -> Result<IpvsDump<'_>, ParseError> {
        let name = &self.ipvsadm_name;
        let d = ipvsadm::parse_dump(&self.ipvsadm).map_err(|e| e.in_source(name.clone()))?;
        warnings.extend(
            d.skipped
                .iter()
                .map(|s| format!("{name}:{}: skipped: {}", s.line, s.text.trim_end())),
        );
        Ok(d)
    }

    /// Parses the ipset text, if given; a `list` cut inside a set (before its `Members:`, or
    /// before its `Number of entries:` are listed) says so in a warning.
    pub fn sets(
        &self,
        warnings: &mut Vec<String>,
    ) -> Result<Option<Vec<ipset::IpSet<'_>>>, ParseError> {
        let Some((t, name)) = &self.ipset else {
            return Ok(None);
        };
        let sets = ipset::parse_ipset(t).map_err(|e| e.in_source(name.clone()))?;
        for (set, why) in sets.iter().filter_map(|s| Some((s, s.cut()?))) {
            warnings.push(format!("{name}:{}: {why}", set.line));
        }
        Ok(Some(sets))
    }

    /// What the capture lacks, in words: lines lenient reading skipped, `...` cuts, cut sets.
    pub fn gaps(&self, sets: Option<&[ipset::IpSet<'_>]>) -> Vec<String> {
        let mut gaps = self.gaps.clone();
        if let (Some(sets), Some((_, name))) = (sets, &self.ipset) {
            gaps.extend(
                sets.iter()
                    .filter_map(|s| Some(format!("{name}: {}", s.cut()?))),
            );
        }
        gaps
    }

    /// The IPVS graph of the capture, with what lenient reading skipped and what it lacks.
    pub fn graph(
        &self,
        warnings: &mut Vec<String>,
    ) -> Result<crate::graph::ipvs::IpvsGraph, ParseError> {
        let dump = self.dump(warnings)?;
        let sets = self.sets(warnings)?;
        let mut graph = crate::graph::ipvs::build(&dump, sets.as_deref());
        graph.skipped_lines.extend(&self.skipped);
        graph.skipped_lines.sort_unstable();
        graph.gaps = self.gaps(sets.as_deref());
        Ok(graph)
    }
}

/// Lenient reading of a grammar that stops at its first bad line: each line it fails on is
/// emptied (line numbers stay) and reported, until the text parses; the lines emptied and why
/// are returned. An unreadable virtual server line takes its real server lines (`  -> …`) with
/// it: read alone they would join the virtual server above. Bounded: a text that is not of the
/// grammar at all gives up after [`MAX_SKIPPED`] lines and leaves the error to the strict parse
/// that follows.
fn skip_unreadable(
    text: &mut String,
    name: &str,
    warnings: &mut Vec<String>,
    parse: impl Fn(&str) -> Result<(), ParseError>,
) -> Vec<(usize, String)> {
    let mut skipped = Vec::new();
    for _ in 0..MAX_SKIPPED {
        let Err(e) = parse(text) else { break };
        let Some((start, end)) = line_span(text, e.line) else {
            break;
        };
        let why = format!("expected {}, found {}", e.expected, e.found);
        warnings.push(format!("{name}:{}: skipped: {why}", e.line));
        let server_line = !text[start..end].starts_with(char::is_whitespace);
        text.replace_range(start..end, "");
        skipped.push((e.line as usize, why));
        if server_line {
            let mut line = e.line;
            while let Some((s, e2)) = line_span(text, line + 1)
                .filter(|&(s, e2)| text[s..e2].trim_start().starts_with("->"))
            {
                line += 1;
                warnings.push(format!(
                    "{name}:{line}: skipped: a real server of the virtual server skipped on line {}",
                    e.line
                ));
                text.replace_range(s..e2, "");
                skipped.push((
                    line as usize,
                    "a real server of a skipped virtual server".to_string(),
                ));
            }
        }
    }
    skipped
}

/// An `ipvsadm -Ln` or `-Lnc` listing filtered by `grep` has lost its header lines, which say
/// what the columns are: the listing's own header is put back in front (line numbers then count
/// it: two lines more).
fn add_missing_header(text: &mut String, name: &str, warnings: &mut Vec<String>) {
    let has_header = text.lines().any(|l| {
        l.starts_with("IP Virtual Server version")
            || l.starts_with("Prot LocalAddress:Port")
            || l.starts_with("IPVS connection entries")
            || l.starts_with("pro expire state")
            || l.starts_with("-A ")
    });
    if has_header {
        return;
    }
    let first = text.lines().map(str::trim).find(|l| !l.is_empty());
    let Some(first) = first else { return };
    let words: Vec<&str> = first.split_whitespace().collect();
    let connection = words
        .get(1)
        .is_some_and(|w| w.contains(':') && !w.contains('.'));
    let header = if connection {
        "IPVS connection entries\npro expire state       source             virtual            destination\n"
    } else {
        "Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n"
    };
    warnings.push(format!(
        "{name}: no header lines (filtered by grep?): read as `ipvsadm -Ln{}` output; line numbers below count two header lines more",
        if connection { "c" } else { "" }
    ));
    text.insert_str(0, header);
}

/// Most lines [`skip_unreadable`] empties.
const MAX_SKIPPED: usize = 1000;

/// The byte range of 1-based line `line` of `text` (without its newline).
fn line_span(text: &str, line: u32) -> Option<(usize, usize)> {
    let mut start = 0;
    for _ in 1..line {
        start += text.get(start..)?.find('\n')? + 1;
    }
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    (end > start).then_some((start, end))
}
