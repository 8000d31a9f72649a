//! Line grammars of the `ipvsadm -L` layouts (ipvsadm.c `list_all`, `print_title`, `print_service_entry`).

use super::error::IpvsParseError;
use super::lexeme::{LineCtx, Tok, parse_addr_port, parse_counter, parse_num};
use super::model::{Forward, Layout, Protocol, RealServer, ServiceKey, Stats, VirtualService};

/// Recognises a title line and returns the layout it announces.
///
/// ```text
/// "Prot LocalAddress:Port Scheduler Flags"                        -> Default (or TunInfo, decided by title-2)
/// "Prot LocalAddress:Port  Conns InPkts OutPkts InBytes OutBytes"  -> Stats
/// "Prot LocalAddress:Port  CPS InPPS OutPPS InBPS OutBPS"          -> Rate
/// "Prot LocalAddress:Port  Uthreshold Lthreshold ActiveConn InActConn" -> Thresholds
/// "Prot LocalAddress:Port  Weight PersistConn ActiveConn InActConn"    -> PersistentConn
/// ```
pub(crate) fn title_layout(line: &str) -> Option<Layout> {
    let t: Vec<&str> = line.split_ascii_whitespace().collect();
    if t.first() != Some(&"Prot") || t.get(1) != Some(&"LocalAddress:Port") {
        return None;
    }
    Some(match t.get(2).copied() {
        Some("Conns") => Layout::Stats,
        Some("CPS") => Layout::Rate,
        Some("Uthreshold") => Layout::Thresholds,
        Some("Weight") => Layout::PersistentConn,
        _ => Layout::Default,
    })
}

/// `"  -> RemoteAddress:Port" …`: the second title line; `TunnelInfo` in it selects the tun-info layout.
pub(crate) fn is_rs_title(line: &str) -> Option<bool> {
    let t = line.trim_start();
    t.strip_prefix("-> RemoteAddress:Port")
        .map(|rest| rest.contains("TunnelInfo"))
}

/// `svc-name = PROTO4 SP ADDRPORT | "FWM  " MARK [ " IPv6" ]`; returns the key and the index of the next token.
pub(crate) fn service_key(
    cx: &LineCtx<'_>,
    toks: &[Tok<'_>],
) -> Result<(ServiceKey, usize), IpvsParseError> {
    let p = cx.tok(toks, 0, "a protocol (TCP, UDP, SCTP, FWM)")?;
    if p.s == "FWM" {
        let m = cx.tok(toks, 1, "a firewall mark")?;
        let mark = parse_num::<u32>(cx, m, "a firewall mark")?;
        let ipv6 = toks.get(2).is_some_and(|t| t.s == "IPv6");
        return Ok((ServiceKey::Fwmark { mark, ipv6 }, if ipv6 { 3 } else { 2 }));
    }
    let protocol =
        Protocol::from_name(p.s).ok_or_else(|| cx.err(p, "a protocol (TCP, UDP, SCTP, FWM)"))?;
    let a = cx.tok(toks, 1, "ADDR:PORT")?;
    let (addr, port) = parse_addr_port(cx, a)?;
    Ok((
        ServiceKey::Inet {
            protocol,
            addr,
            port,
        },
        2,
    ))
}

/// `service-line = svc-name SP sched [ " (" flags ")" ] [ " persistent " N [ " mask " M ] [ " pe " PE ] ] [ " ops" ]`
/// (also used by the thresholds, persistent-conn and tun-info layouts).
pub(crate) fn service_line<'a>(
    cx: &LineCtx<'a>,
    toks: &[Tok<'a>],
) -> Result<VirtualService<'a>, IpvsParseError> {
    let (key, mut i) = service_key(cx, toks)?;
    let mut vs = VirtualService::new(key, cx.no);
    let sched = cx.tok(toks, i, "a scheduler name")?;
    vs.scheduler = Some(sched.s);
    i += 1;
    if let Some(t) = toks.get(i)
        && t.s.starts_with('(')
    {
        let inner =
            t.s.strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| cx.err(*t, "(flag,flag)"))?;
        vs.sched_flags = inner.split(',').filter(|f| !f.is_empty()).collect();
        i += 1;
    }
    while let Some(t) = toks.get(i) {
        match t.s {
            "persistent" => {
                let v = cx.tok(toks, i + 1, "a persistence timeout")?;
                vs.persistent = Some(parse_num(cx, v, "a persistence timeout")?);
                i += 2;
            }
            "mask" => {
                vs.netmask = Some(cx.tok(toks, i + 1, "a netmask")?.s);
                i += 2;
            }
            "pe" => {
                vs.pe = Some(cx.tok(toks, i + 1, "a persistence engine")?.s);
                i += 2;
            }
            "ops" => {
                vs.ops = true;
                i += 1;
            }
            _ => return Err(cx.err(*t, "persistent, mask, pe or ops")),
        }
    }
    Ok(vs)
}

fn five_counters(cx: &LineCtx<'_>, toks: &[Tok<'_>], from: usize) -> Result<Stats, IpvsParseError> {
    let c = |k: usize| -> Result<_, IpvsParseError> {
        parse_counter(cx, cx.tok(toks, from + k, "a counter")?)
    };
    let s = Stats {
        conns: c(0)?,
        in_pkts: c(1)?,
        out_pkts: c(2)?,
        in_bytes: c(3)?,
        out_bytes: c(4)?,
    };
    if let Some(t) = toks.get(from + 5) {
        return Err(cx.err(*t, "end of line"));
    }
    Ok(s)
}

/// `svc-stats = svc-name N N N N N` (`--stats` and `--rate`).
pub(crate) fn service_stats_line<'a>(
    cx: &LineCtx<'a>,
    toks: &[Tok<'a>],
    layout: Layout,
) -> Result<VirtualService<'a>, IpvsParseError> {
    let (key, i) = service_key(cx, toks)?;
    let mut vs = VirtualService::new(key, cx.no);
    let s = five_counters(cx, toks, i)?;
    if layout == Layout::Rate {
        vs.rate = Some(s);
    } else {
        vs.stats = Some(s);
    }
    Ok(vs)
}

fn u64_at(cx: &LineCtx<'_>, toks: &[Tok<'_>], i: usize, what: &str) -> Result<u64, IpvsParseError> {
    parse_num(cx, cx.tok(toks, i, what)?, what)
}

fn end(cx: &LineCtx<'_>, toks: &[Tok<'_>], i: usize) -> Result<(), IpvsParseError> {
    match toks.get(i) {
        Some(t) => Err(cx.err(*t, "end of line")),
        None => Ok(()),
    }
}

/// `rs-line = "->" ADDRPORT …` with the columns of `layout` (ipvsadm.c `print_service_entry`).
/// `toks[0]` is the `->` marker.
pub(crate) fn real_server_line<'a>(
    cx: &LineCtx<'a>,
    toks: &[Tok<'a>],
    layout: Layout,
) -> Result<RealServer<'a>, IpvsParseError> {
    let a = cx.tok(toks, 1, "ADDR:PORT")?;
    let (addr, port) = parse_addr_port(cx, a)?;
    let mut rs = RealServer::new(addr, port, cx.no);
    let forward = |i: usize| -> Result<Forward, IpvsParseError> {
        let t = cx.tok(toks, i, "a forwarding method (Masq, Local, Route, Tunnel)")?;
        Forward::from_name(t.s)
            .ok_or_else(|| cx.err(t, "a forwarding method (Masq, Local, Route, Tunnel)"))
    };
    match layout {
        Layout::Default | Layout::Save => {
            rs.forward = Some(forward(2)?);
            rs.weight = Some(parse_num(cx, cx.tok(toks, 3, "a weight")?, "a weight")?);
            rs.active_conns = Some(u64_at(cx, toks, 4, "ActiveConn")?);
            rs.inactive_conns = Some(u64_at(cx, toks, 5, "InActConn")?);
            end(cx, toks, 6)?;
        }
        Layout::TunInfo => {
            rs.forward = Some(forward(2)?);
            rs.tunnel = Some(cx.tok(toks, 3, "tunnel info")?.s);
            rs.weight = Some(parse_num(cx, cx.tok(toks, 4, "a weight")?, "a weight")?);
            rs.active_conns = Some(u64_at(cx, toks, 5, "ActiveConn")?);
            rs.inactive_conns = Some(u64_at(cx, toks, 6, "InActConn")?);
            end(cx, toks, 7)?;
        }
        Layout::Thresholds => {
            rs.upper_threshold = Some(u64_at(cx, toks, 2, "Uthreshold")?);
            rs.lower_threshold = Some(u64_at(cx, toks, 3, "Lthreshold")?);
            rs.active_conns = Some(u64_at(cx, toks, 4, "ActiveConn")?);
            rs.inactive_conns = Some(u64_at(cx, toks, 5, "InActConn")?);
            end(cx, toks, 6)?;
        }
        Layout::PersistentConn => {
            rs.weight = Some(parse_num(cx, cx.tok(toks, 2, "a weight")?, "a weight")?);
            rs.persist_conns = Some(u64_at(cx, toks, 3, "PersistConn")?);
            rs.active_conns = Some(u64_at(cx, toks, 4, "ActiveConn")?);
            rs.inactive_conns = Some(u64_at(cx, toks, 5, "InActConn")?);
            end(cx, toks, 6)?;
        }
        Layout::Stats => rs.stats = Some(five_counters(cx, toks, 2)?),
        Layout::Rate => rs.rate = Some(five_counters(cx, toks, 2)?),
    }
    Ok(rs)
}
