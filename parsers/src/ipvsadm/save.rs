//! The command form: `ipvsadm -Sn` / `ipvsadm-save -n` output (ipvsadm.c `print_service_entry` with `FMT_RULE`), also accepted with a leading
//! `ipvsadm` token as in `ipvsadm -R` input.

use super::error::IpvsParseError;
use super::lexeme::{LineCtx, Tok, parse_addr_port, parse_num};
use super::model::{Forward, Protocol, RealServer, ServiceKey, VirtualService};

/// A parsed command line of the save form.
#[derive(Debug)]
pub(crate) enum SaveLine<'a> {
    /// `-A SVC …`.
    Service(VirtualService<'a>),
    /// `-a SVC -r ADDRPORT FWD -w N …`.
    Dest(ServiceKey, RealServer<'a>),
}

/// True when the line is in the command form (`-A …`, `-a …`, optionally after `ipvsadm`).
pub(crate) fn is_save_line(toks: &[Tok<'_>]) -> bool {
    let first = toks.iter().find(|t| t.s != "ipvsadm");
    matches!(
        first.map(|t| t.s),
        Some("-A" | "-a" | "--add-service" | "--add-server")
    )
}

/// ```text
/// add-service = "-A" SVC "-s" SCHED [ "-p" [TIMEOUT] [ "-M" MASK ] ] [ "--pe" PE ] [ "-o" ] [ "-b" FLAGS ]
/// add-dest    = "-a" SVC "-r" ADDRPORT FWD [ "-w" WEIGHT ] [ "-x" U ] [ "-y" L ] [ tun-opts ]
/// SVC         = ("-t" | "-u" | "--sctp-service") ADDRPORT | "-f" MARK [ "-6" ]
/// FWD         = "-m" | "-g" | "-i"
/// ```
/// Options may come in any order, as ipvsadm accepts them; `ipvsadm` tokens are ignored.
pub(crate) fn save_line<'a>(
    cx: &LineCtx<'a>,
    all: &[Tok<'a>],
) -> Result<SaveLine<'a>, IpvsParseError> {
    let toks: Vec<Tok<'a>> = all.iter().copied().filter(|t| t.s != "ipvsadm").collect();
    let cmd = cx.tok(&toks, 0, "-A or -a")?;
    let is_service = matches!(cmd.s, "-A" | "--add-service");
    let mut key: Option<ServiceKey> = None;
    let mut ipv6_fwm = false;
    let mut vs_sched = None;
    let mut flags = Vec::new();
    let mut persistent = None;
    let mut netmask = None;
    let mut pe = None;
    let mut ops = false;
    let mut dest: Option<(std::net::IpAddr, u16)> = None;
    let mut forward = None;
    let mut weight = None;
    let mut upper = None;
    let mut lower = None;
    let mut tunnel: Option<&'a str> = None;
    let mut i = 1;
    while i < toks.len() {
        let t = toks[i];
        let arg = |k: usize, what: &str| cx.tok(&toks, i + k, what);
        let mut used = 1;
        match t.s {
            "-t" | "--tcp-service" | "-u" | "--udp-service" | "--sctp-service" => {
                let protocol = match t.s {
                    "-t" | "--tcp-service" => Protocol::Tcp,
                    "-u" | "--udp-service" => Protocol::Udp,
                    _ => Protocol::Sctp,
                };
                let a = arg(1, "ADDR:PORT")?;
                let (addr, port) = parse_addr_port(cx, a)?;
                key = Some(ServiceKey::Inet {
                    protocol,
                    addr,
                    port,
                });
                used = 2;
            }
            "-f" | "--fwmark-service" => {
                let m = arg(1, "a firewall mark")?;
                key = Some(ServiceKey::Fwmark {
                    mark: parse_num(cx, m, "a firewall mark")?,
                    ipv6: false,
                });
                used = 2;
            }
            "-6" | "--ipv6" => ipv6_fwm = true,
            "-s" | "--scheduler" => {
                vs_sched = Some(arg(1, "a scheduler")?.s);
                used = 2;
            }
            "-p" | "--persistent" => {
                // The timeout is optional (default 360 s, ipvsadm.c).
                match toks.get(i + 1) {
                    Some(v) if v.s.bytes().all(|b| b.is_ascii_digit()) => {
                        persistent = Some(parse_num(cx, *v, "a persistence timeout")?);
                        used = 2;
                    }
                    _ => persistent = Some(360),
                }
            }
            "-M" | "--netmask" => {
                netmask = Some(arg(1, "a netmask")?.s);
                used = 2;
            }
            "--pe" => {
                pe = Some(arg(1, "a persistence engine")?.s);
                used = 2;
            }
            "-o" | "--ops" => ops = true,
            "-b" | "--sched-flags" => {
                flags = arg(1, "scheduler flags")?
                    .s
                    .split(',')
                    .filter(|f| !f.is_empty())
                    .collect();
                used = 2;
            }
            "-r" | "--real-server" => {
                let a = arg(1, "ADDR:PORT")?;
                dest = Some(parse_addr_port(cx, a)?);
                used = 2;
            }
            "-m" | "--masquerading" => forward = Some(Forward::Masq),
            "-g" | "--gatewaying" => forward = Some(Forward::Route),
            "-i" | "--ipip" => forward = Some(Forward::Tunnel),
            "(null)" => forward = Some(Forward::Bypass),
            "-w" | "--weight" => {
                weight = Some(parse_num(cx, arg(1, "a weight")?, "a weight")?);
                used = 2;
            }
            "-x" | "--u-threshold" => {
                upper = Some(parse_num(cx, arg(1, "a threshold")?, "a threshold")?);
                used = 2;
            }
            "-y" | "--l-threshold" => {
                lower = Some(parse_num(cx, arg(1, "a threshold")?, "a threshold")?);
                used = 2;
            }
            "--tun-type" => {
                tunnel = Some(arg(1, "a tunnel type")?.s);
                used = 2;
            }
            "--tun-port" => used = 2,
            "--tun-nocsum" | "--tun-csum" | "--tun-remcsum" => {}
            _ => return Err(cx.err(t, "an ipvsadm option of the save form")),
        }
        i += used;
    }
    let mut key = key.ok_or_else(|| cx.err_eol("-t/-u/--sctp-service ADDR:PORT or -f MARK"))?;
    if let ServiceKey::Fwmark { ipv6, .. } = &mut key {
        *ipv6 = ipv6_fwm;
    }
    if is_service {
        let mut vs = VirtualService::new(key, cx.no);
        // ipvsadm's default scheduler when -s is omitted (ipvsadm.c `DEF_SCHED`).
        vs.scheduler = Some(vs_sched.unwrap_or("wlc"));
        vs.sched_flags = flags;
        vs.persistent = persistent;
        vs.netmask = netmask;
        vs.pe = pe;
        vs.ops = ops;
        Ok(SaveLine::Service(vs))
    } else {
        let (addr, port) = dest.ok_or_else(|| cx.err_eol("-r ADDR:PORT"))?;
        let mut rs = RealServer::new(addr, port, cx.no);
        // Defaults when omitted: Route and weight 1 (ipvsadm.c `process_options`).
        rs.forward = Some(forward.unwrap_or(Forward::Route));
        rs.weight = Some(weight.unwrap_or(1));
        rs.upper_threshold = upper;
        rs.lower_threshold = lower;
        rs.tunnel = tunnel;
        Ok(SaveLine::Dest(key, rs))
    }
}
