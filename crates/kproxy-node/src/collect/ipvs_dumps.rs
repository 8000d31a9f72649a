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
        let mut ipvsadm = String::new();
        for p in ipvsadm_files {
            ipvsadm.push_str(&read_text(p, lenient, warnings)?);
            if !ipvsadm.ends_with('\n') {
                ipvsadm.push('\n');
            }
        }
        let ipvsadm_name = ipvsadm_files
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join("+");
        if lenient {
            add_missing_header(&mut ipvsadm, &ipvsadm_name, warnings);
            skip_unreadable(&mut ipvsadm, &ipvsadm_name, warnings, |t| {
                ipvsadm::parse_dump(t).map(|_| ())
            });
        }
        let ipset = match ipset_file {
            Some(p) => {
                let mut text = read_text(p, lenient, warnings)?;
                let name = p.display().to_string();
                if lenient {
                    skip_unreadable(&mut text, &name, warnings, |t| {
                        ipset::parse_ipset(t).map(|_| ())
                    });
                }
                Some((text, name))
            }
            None => None,
        };
        let ip_addr = ip_addr_file
            .map(|p| read_text(p, lenient, warnings))
            .transpose()?;
        Ok(IpvsTexts {
            ipvsadm,
            ipvsadm_name,
            ipset,
            ip_addr,
        })
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
        if lenient {
            add_missing_header(&mut ipvsadm, &ipvsadm_name, warnings);
            skip_unreadable(&mut ipvsadm, &ipvsadm_name, warnings, |t| {
                ipvsadm::parse_dump(t).map(|_| ())
            });
            if let Some((text, name)) = &mut ipset {
                skip_unreadable(text, name, warnings, |t| ipset::parse_ipset(t).map(|_| ()));
            }
        }
        IpvsTexts {
            ipvsadm,
            ipvsadm_name,
            ipset,
            ip_addr: None,
        }
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

    /// Parses the ipset text, if given; a `list` whose set holds fewer members than its
    /// `Number of entries:` says was cut, and a warning says so.
    pub fn sets(
        &self,
        warnings: &mut Vec<String>,
    ) -> Result<Option<Vec<ipset::IpSet<'_>>>, ParseError> {
        let Some((t, name)) = &self.ipset else {
            return Ok(None);
        };
        let sets = ipset::parse_ipset(t).map_err(|e| e.in_source(name.clone()))?;
        for set in &sets {
            if let Some(declared) = set.entries_declared
                && declared > set.entries.len()
            {
                warnings.push(format!(
                    "{name}:{}: set {} lists {} of its {declared} entries: the listing is cut, its other members are missing",
                    set.line,
                    set.name,
                    set.entries.len()
                ));
            }
        }
        Ok(Some(sets))
    }
}

/// One file's text, as [`read_dump`] reads it, with what reading it did.
fn read_text(
    path: &Path,
    lenient: bool,
    warnings: &mut Vec<String>,
) -> Result<String, CollectError> {
    let d = read_dump(path, lenient)?;
    warnings.extend(d.warnings);
    Ok(d.text)
}

/// Lenient reading of a grammar that stops at its first bad line: each line it fails on is
/// emptied (line numbers stay) and reported, until the text parses. Bounded: a text that is not
/// of the grammar at all gives up after [`MAX_SKIPPED`] lines and leaves the error to the strict
/// parse that follows.
fn skip_unreadable(
    text: &mut String,
    name: &str,
    warnings: &mut Vec<String>,
    parse: impl Fn(&str) -> Result<(), ParseError>,
) {
    for _ in 0..MAX_SKIPPED {
        let Err(e) = parse(text) else { return };
        let Some((start, end)) = line_span(text, e.line) else {
            return;
        };
        warnings.push(format!(
            "{name}:{}: skipped: expected {}, found {}",
            e.line, e.expected, e.found
        ));
        text.replace_range(start..end, "");
    }
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
