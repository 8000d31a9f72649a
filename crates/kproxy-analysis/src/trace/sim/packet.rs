//! The packet a trace starts from, and the `--packet` syntax `SRC[:SPORT]->DST:PORT[/PROTO]`.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// The form `--packet` accepts, shown in every syntax error.
pub const PACKET_SYNTAX: &str = "SRC[:SPORT]->DST:PORT[/PROTO] (PROTO tcp|udp|sctp, default tcp; IPv6 as [ADDR]:PORT), \
e.g. 10.0.0.2->10.96.0.10:53/udp or [fd00::2]:40000->[fd00:10:96::1]:443/tcp";

/// A transport protocol kube-proxy writes rules for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// TCP (IP protocol 6).
    Tcp,
    /// UDP (IP protocol 17).
    Udp,
    /// SCTP (IP protocol 132).
    Sctp,
}

impl Protocol {
    /// The lower-case name iptables uses (`tcp`).
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// The IP protocol number.
    pub fn number(self) -> u8 {
        match self {
            Protocol::Tcp => 6,
            Protocol::Udp => 17,
            Protocol::Sctp => 132,
        }
    }

    /// Parses `tcp`/`udp`/`sctp` in any case.
    pub fn from_name(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The first packet of a new connection, as given with `--packet`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PacketSpec {
    /// Source address.
    pub src: IpAddr,
    /// Source port, when given (rules on `--sport` are otherwise undecidable).
    pub sport: Option<u16>,
    /// Destination address.
    pub dst: IpAddr,
    /// Destination port.
    pub dport: u16,
    /// Protocol.
    pub proto: Protocol,
}

/// A `--packet` value that does not follow [`PACKET_SYNTAX`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid packet `{input}`: {problem}\n  expected {PACKET_SYNTAX}")]
pub struct PacketSyntaxError {
    /// The text given.
    pub input: String,
    /// What is wrong with it.
    pub problem: String,
}

impl FromStr for PacketSpec {
    type Err = PacketSyntaxError;

    /// Parses `SRC[:SPORT]->DST:PORT[/PROTO]`; IPv6 addresses with a port are bracketed.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let err = |problem: String| PacketSyntaxError {
            input: input.to_string(),
            problem,
        };
        let text = input.trim();
        let (src_part, rest) = text
            .split_once("->")
            .ok_or_else(|| err("missing `->` between source and destination".into()))?;
        let (dst_part, proto) = match rest.rsplit_once('/') {
            Some((d, p)) => (
                d,
                Protocol::from_name(p.trim())
                    .ok_or_else(|| err(format!("unknown protocol `{p}` (tcp, udp or sctp)")))?,
            ),
            None => (rest, Protocol::Tcp),
        };
        let (src, sport) =
            parse_endpoint(src_part.trim(), false).map_err(|p| err(format!("source: {p}")))?;
        let (dst, dport) =
            parse_endpoint(dst_part.trim(), true).map_err(|p| err(format!("destination: {p}")))?;
        let dport = dport.ok_or_else(|| err("destination: missing `:PORT`".into()))?;
        if src.is_ipv4() != dst.is_ipv4() {
            return Err(err(
                "source and destination are of different IP families".into()
            ));
        }
        Ok(PacketSpec {
            src,
            sport,
            dst,
            dport,
            proto,
        })
    }
}

/// `ADDR`, `ADDR:PORT`, `[ADDR]`, `[ADDR]:PORT` (a bare IPv6 address has no port).
fn parse_endpoint(s: &str, want_port: bool) -> Result<(IpAddr, Option<u16>), String> {
    if s.is_empty() {
        return Err("empty address".into());
    }
    let port = |p: &str| -> Result<u16, String> {
        p.parse::<u16>()
            .map_err(|_| format!("`{p}` is not a port number (0-65535)"))
    };
    let addr = |a: &str| -> Result<IpAddr, String> {
        a.parse::<IpAddr>()
            .map_err(|_| format!("`{a}` is not an IP address"))
    };
    if let Some(inner) = s.strip_prefix('[') {
        let (a, tail) = inner
            .split_once(']')
            .ok_or_else(|| "missing `]` after the IPv6 address".to_string())?;
        let ip = addr(a)?;
        return match tail {
            "" => Ok((ip, None)),
            t => match t.strip_prefix(':') {
                Some(p) => Ok((ip, Some(port(p)?))),
                None => Err(format!("unexpected `{t}` after `]`")),
            },
        };
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        if ip.is_ipv6() && want_port {
            return Err(format!("write an IPv6 destination as [{s}]:PORT"));
        }
        return Ok((ip, None));
    }
    match s.rsplit_once(':') {
        Some((a, p)) if !a.contains(':') => Ok((addr(a)?, Some(port(p)?))),
        _ => Err(format!("`{s}` is not ADDR, ADDR:PORT or [IPv6]:PORT")),
    }
}

impl fmt::Display for PacketSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ep = |f: &mut fmt::Formatter<'_>, ip: IpAddr, port: Option<u16>| match (ip, port) {
            (IpAddr::V6(a), Some(p)) => write!(f, "[{a}]:{p}"),
            (ip, Some(p)) => write!(f, "{ip}:{p}"),
            (ip, None) => write!(f, "{ip}"),
        };
        ep(f, self.src, self.sport)?;
        f.write_str("->")?;
        ep(f, self.dst, Some(self.dport))?;
        write!(f, "/{}", self.proto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_forms() {
        let p: PacketSpec = "10.0.0.2->10.96.0.10:53/udp".parse().unwrap();
        assert_eq!(p.to_string(), "10.0.0.2->10.96.0.10:53/udp");
        assert_eq!(p.sport, None);
        let p: PacketSpec = "10.0.0.2:40000->10.96.0.10:80".parse().unwrap();
        assert_eq!((p.sport, p.proto), (Some(40000), Protocol::Tcp));
        let p: PacketSpec = "[fd00::2]:1->[fd00:10:96::1]:443/TCP".parse().unwrap();
        assert_eq!(p.to_string(), "[fd00::2]:1->[fd00:10:96::1]:443/tcp");
        let p: PacketSpec = "2001:db8::1->[fd00::1]:80/sctp".parse().unwrap();
        assert_eq!(p.proto, Protocol::Sctp);
    }

    #[test]
    fn rejects_bad_forms_with_the_expected_syntax() {
        for bad in [
            "10.0.0.2 10.96.0.10:53",
            "10.0.0.2->10.96.0.10",
            "10.0.0.2->10.96.0.10:99999",
            "10.0.0.2->10.96.0.10:53/icmp",
            "10.0.0.2->fd00::1:80",
            "10.0.0.2->[fd00::1]:80",
            "x->10.96.0.10:53",
            "[fd00::1->[fd00::2]:80",
        ] {
            let e = bad.parse::<PacketSpec>().unwrap_err();
            assert!(
                e.to_string().contains("expected SRC[:SPORT]->DST:PORT"),
                "{bad}: {e}"
            );
        }
    }
}
