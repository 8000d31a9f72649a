//! Parsers for `ipvsadm` text: `-Ln` (default, `--stats`, `--rate`, `--exact`, `--thresholds`,
//! `--persistent-conn`, `--tun-info`, single-service form), `-Lnc`, `-L --timeout`, `-L --daemon` and the
//! command form `ipvsadm -Sn` / `ipvsadm-save -n`, as ipvsadm prints them.
//!
//! One capture may concatenate several outputs (e.g. `-Ln`, then `-Ln --stats`, then `-Lnc`); shell prompt
//! lines around them are skipped and reported in [`IpvsDump::skipped`]. Any other unexpected line is an
//! [`IpvsParseError`] with `line:col`.

mod connections;
pub(crate) mod error;
mod lexeme;
mod listing;
mod model;
mod save;

pub use error::IpvsParseError;
pub use lexeme::Counter;
pub use model::{
    Connection, Forward, IpvsDump, Layout, Listing, Protocol, RealServer, ServiceKey, Skipped,
    SocketText, Stats, Timeouts, VirtualService,
};

use lexeme::{LineCtx, Tok, parse_num, tokens_into};
use std::collections::BTreeMap;

/// Where the line-by-line reader is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    /// Outside any table.
    None,
    /// Inside a listing of this layout.
    Listing(Layout),
    /// Inside a connection table.
    Connections,
}

/// True for lines captured from a terminal around the output: shell prompts (`[root@h ~]# ipvsadm -Ln`,
/// `$ sudo …`, `root@h:~# …`) and `#` comments.
fn is_prompt(line: &str) -> bool {
    let t = line.trim_start();
    t.starts_with('#')
        || t.starts_with('$')
        || t.contains("# ")
        || t.contains("$ ")
        || t.ends_with('#')
        || t.ends_with('$')
}

/// `version-line = "IP Virtual Server version " V " (size=" N ")"`.
fn version_line<'a>(
    cx: &LineCtx<'a>,
    toks: &[Tok<'a>],
) -> Result<(&'a str, Option<u64>), IpvsParseError> {
    let v = cx.tok(toks, 4, "a version number")?;
    let size = match toks.get(5) {
        Some(t) => {
            let inner =
                t.s.strip_prefix("(size=")
                    .and_then(|s| s.strip_suffix(')'))
                    .ok_or_else(|| cx.err(*t, "(size=N)"))?;
            Some(parse_num(
                cx,
                Tok {
                    s: inner,
                    col: t.col + 6,
                },
                "a table size",
            )?)
        }
        None => None,
    };
    Ok((v.s, size))
}

/// `"Timeout (tcp tcpfin udp): " N N N` (ipvsadm.c `list_timeout`).
fn timeout_line(cx: &LineCtx<'_>, toks: &[Tok<'_>]) -> Result<Timeouts, IpvsParseError> {
    let n = |i: usize| -> Result<i64, IpvsParseError> {
        parse_num(cx, cx.tok(toks, i, "a timeout")?, "a timeout")
    };
    Ok(Timeouts {
        tcp: n(4)?,
        tcp_fin: n(5)?,
        udp: n(6)?,
    })
}

/// Parses any ipvsadm capture (see the module documentation for what it accepts).
pub fn parse_dump(text: &str) -> Result<IpvsDump<'_>, IpvsParseError> {
    let mut dump = IpvsDump::default();
    let mut section = Section::None;
    let mut toks: Vec<Tok<'_>> = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let cx = LineCtx {
            no: idx + 1,
            text: raw,
        };
        tokens_into(raw, &mut toks);
        let Some(first) = toks.first() else { continue };
        // Lines that open a new section, wherever they appear.
        if raw.starts_with("IP Virtual Server version") {
            let (v, size) = version_line(&cx, &toks)?;
            dump.listings.push(Listing {
                layout: Layout::Default,
                version: Some(v),
                conn_table_size: size,
                services: Vec::new(),
            });
            section = Section::None;
            continue;
        }
        if let Some(layout) = listing::title_layout(raw) {
            let starts_new = match dump.listings.last() {
                Some(l) => {
                    !(l.services.is_empty() && l.version.is_some() && section == Section::None)
                }
                None => true,
            };
            if starts_new {
                dump.listings.push(Listing {
                    layout,
                    version: None,
                    conn_table_size: None,
                    services: Vec::new(),
                });
            } else if let Some(l) = dump.listings.last_mut() {
                l.layout = layout;
            }
            section = Section::Listing(layout);
            continue;
        }
        if let Some(tun) = listing::is_rs_title(raw) {
            if let (Section::Listing(_), Some(l)) = (section, dump.listings.last_mut())
                && l.services.is_empty()
            {
                if tun {
                    l.layout = Layout::TunInfo;
                    section = Section::Listing(Layout::TunInfo);
                }
                continue;
            }
            return Err(cx.err(*first, "a real server line after a service line"));
        }
        if raw.starts_with("IPVS connection entries") {
            dump.has_connection_table = true;
            section = Section::Connections;
            continue;
        }
        if raw.starts_with("Timeout (tcp tcpfin udp):") {
            dump.timeouts = Some(timeout_line(&cx, &toks)?);
            section = Section::None;
            continue;
        }
        if raw.contains(" sync daemon (")
            && (raw.starts_with("master") || raw.starts_with("backup"))
        {
            dump.daemons.push(raw.trim_end());
            section = Section::None;
            continue;
        }
        if save::is_save_line(&toks) {
            if !matches!(section, Section::Listing(Layout::Save)) {
                dump.listings.push(Listing {
                    layout: Layout::Save,
                    version: None,
                    conn_table_size: None,
                    services: Vec::new(),
                });
                section = Section::Listing(Layout::Save);
            }
            let Some(listing) = dump.listings.last_mut() else {
                continue;
            };
            match save::save_line(&cx, &toks)? {
                save::SaveLine::Service(vs) => listing.services.push(vs),
                save::SaveLine::Dest(key, rs) => {
                    match listing.services.iter_mut().rev().find(|s| s.key == key) {
                        Some(vs) => vs.real_servers.push(rs),
                        None => {
                            return Err(cx.err(
                                toks[1.min(toks.len() - 1)],
                                "a destination of a service added earlier with -A",
                            ));
                        }
                    }
                }
            }
            continue;
        }
        match section {
            Section::Listing(layout) if layout != Layout::Save => {
                if first.s == "->" {
                    let rs = listing::real_server_line(&cx, &toks, layout)?;
                    match dump.listings.last_mut().and_then(|l| l.services.last_mut()) {
                        Some(vs) => vs.real_servers.push(rs),
                        None => return Err(cx.err(*first, "a service line before real servers")),
                    }
                    continue;
                }
                if matches!(first.s, "TCP" | "UDP" | "SCTP" | "FWM" | "?") {
                    let vs = match layout {
                        Layout::Stats | Layout::Rate => {
                            listing::service_stats_line(&cx, &toks, layout)?
                        }
                        _ => listing::service_line(&cx, &toks)?,
                    };
                    if let Some(l) = dump.listings.last_mut() {
                        l.services.push(vs);
                    }
                    continue;
                }
            }
            Section::Connections => {
                if connections::is_conn_title(&toks) {
                    continue;
                }
                if !is_prompt(raw) {
                    dump.connections.push(connections::conn_row(&cx, &toks)?);
                    continue;
                }
            }
            _ => {}
        }
        if is_prompt(raw) {
            dump.skipped.push(Skipped {
                line: cx.no,
                text: raw,
            });
            section = match section {
                Section::Listing(Layout::Save) => Section::None,
                s => s,
            };
            continue;
        }
        let expected = match section {
            Section::Listing(_) => {
                "a service line (TCP/UDP/SCTP/FWM …) or a real server line (  -> …)"
            }
            _ => {
                "an ipvsadm header line (IP Virtual Server version …, Prot LocalAddress:Port …, IPVS connection entries, -A …)"
            }
        };
        return Err(cx.err(*first, expected));
    }
    Ok(dump)
}

impl<'a> IpvsDump<'a> {
    /// All services of every listing merged by key: attributes (scheduler, flags, persistence) from the
    /// default/save layouts, counters from `--stats`/`--rate`, connection counters from the default layout;
    /// real servers merged by address:port. Result is sorted by key.
    pub fn merged_services(&self) -> Vec<VirtualService<'a>> {
        let mut by_key: BTreeMap<ServiceKey, VirtualService<'a>> = BTreeMap::new();
        for listing in &self.listings {
            for vs in &listing.services {
                let m = by_key
                    .entry(vs.key)
                    .or_insert_with(|| VirtualService::new(vs.key, vs.line));
                if vs.scheduler.is_some() {
                    m.scheduler = vs.scheduler;
                    m.sched_flags.clone_from(&vs.sched_flags);
                    m.persistent = vs.persistent;
                    m.netmask = vs.netmask;
                    m.pe = vs.pe;
                    m.ops = vs.ops;
                    m.line = vs.line;
                }
                m.stats = vs.stats.or(m.stats);
                m.rate = vs.rate.or(m.rate);
                for rs in &vs.real_servers {
                    match m
                        .real_servers
                        .iter_mut()
                        .find(|r| r.addr == rs.addr && r.port == rs.port)
                    {
                        Some(r) => merge_rs(r, rs),
                        None => m.real_servers.push(rs.clone()),
                    }
                }
            }
        }
        by_key.into_values().collect()
    }

    /// True when any listing carries scheduler/attribute information (default layout or save form).
    pub fn has_attributes(&self) -> bool {
        self.listings
            .iter()
            .any(|l| !matches!(l.layout, Layout::Stats | Layout::Rate))
    }
}

fn merge_rs<'a>(into: &mut RealServer<'a>, from: &RealServer<'a>) {
    into.forward = from.forward.or(into.forward);
    into.weight = from.weight.or(into.weight);
    into.active_conns = from.active_conns.or(into.active_conns);
    into.inactive_conns = from.inactive_conns.or(into.inactive_conns);
    into.persist_conns = from.persist_conns.or(into.persist_conns);
    into.upper_threshold = from.upper_threshold.or(into.upper_threshold);
    into.lower_threshold = from.lower_threshold.or(into.lower_threshold);
    into.tunnel = from.tunnel.or(into.tunnel);
    into.stats = from.stats.or(into.stats);
    into.rate = from.rate.or(into.rate);
}

#[cfg(test)]
mod tests;
