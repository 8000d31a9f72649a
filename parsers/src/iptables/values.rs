//! Option values: addresses, ports, marks, numbers, NAT ranges.
//!
//! Each function takes one whole word and returns `None` when the word is not of that form; the
//! caller turns that into a located error naming what was expected.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use nom::branch::alt;
use nom::bytes::complete::{tag, tag_no_case, take_while1};
use nom::character::complete::{char, digit1, hex_digit1};
use nom::combinator::{all_consuming, map_res, opt};
use nom::{IResult, Parser};

use super::ast::{AddrSpec, MarkValue, NatRange, PortRange};

/// `u32 = "0x" hex | decimal` (iptables' `strtoul(…, 0)` forms used in dumps).
fn u32_num(i: &str) -> IResult<&str, u32> {
    alt((
        (tag_no_case("0x"), hex_digit1).map_res(|(_, h): (&str, &str)| u32::from_str_radix(h, 16)),
        map_res(digit1, str::parse::<u32>),
    ))
    .parse(i)
}

/// A 32-bit number written in hex (`0x4000`, `0x00004000`) or decimal.
pub(crate) fn number(word: &str) -> Option<u32> {
    all_consuming(u32_num).parse(word).ok().map(|(_, v)| v)
}

/// `mark = u32 [ "/" u32 ]` — `--mark 0x4000/0x4000`, `--set-xmark 0x4000/0x0`.
pub(crate) fn mark_value(word: &str) -> Option<MarkValue> {
    all_consuming((u32_num, opt((char('/'), u32_num))))
        .parse(word)
        .ok()
        .map(|(_, (value, mask))| MarkValue {
            value,
            mask: mask.map(|(_, m)| m),
        })
}

/// `port = 1*DIGIT` (0–65535).
fn port(i: &str) -> IResult<&str, u16> {
    map_res(digit1, str::parse::<u16>).parse(i)
}

/// `portrange = port [ sep [ port ] ] | sep port` with `sep` = `:` for matches (`1000:2000`) and `-`
/// for NAT targets (`80-90`). An omitted bound is 0 or 65535, as iptables reads it.
fn port_range_sep(sep: char) -> impl FnMut(&str) -> IResult<&str, PortRange> {
    move |i: &str| {
        let (i, first) = opt(port).parse(i)?;
        let (i, last) = opt((char(sep), opt(port))).parse(i)?;
        match (first, last) {
            (Some(f), None) => Ok((i, PortRange { first: f, last: f })),
            (f, Some((_, l))) if f.is_some() || l.is_some() => Ok((
                i,
                PortRange {
                    first: f.unwrap_or(0),
                    last: l.unwrap_or(u16::MAX),
                },
            )),
            _ => Err(nom::Err::Error(nom::error::Error::new(
                i,
                nom::error::ErrorKind::Digit,
            ))),
        }
    }
}

/// A match port or range: `80`, `1000:2000`.
pub(crate) fn port_range(word: &str) -> Option<PortRange> {
    all_consuming(port_range_sep(':'))
        .parse(word)
        .ok()
        .map(|(_, p)| p)
}

/// Whether `word` is a port list of `multiport`: `portrange { "," portrange }`.
pub(crate) fn is_port_list(word: &str) -> bool {
    word.split(',').all(|p| port_range(p).is_some())
}

/// The ports of `MASQUERADE --to-ports`: `port [ "-" port ]`.
pub(crate) fn nat_ports(word: &str) -> Option<PortRange> {
    all_consuming(port_range_sep('-'))
        .parse(word)
        .ok()
        .map(|(_, p)| p)
}

/// Whether a dotted mask is a prefix; returns its length.
fn prefix_of_mask(mask: IpAddr) -> Option<u8> {
    let (bits, width) = match mask {
        IpAddr::V4(m) => (u128::from(u32::from(m)) << 96, 32u32),
        IpAddr::V6(m) => (u128::from(m), 128),
    };
    let ones = bits.leading_ones();
    (bits.checked_shl(ones).unwrap_or(0) == 0 && ones <= width).then_some(ones as u8)
}

/// An IPv4 address in dotted-quad form, exactly as `Ipv4Addr::from_str` reads it (four decimal
/// octets of one to three digits, no leading zeros, each at most 255) but without its general
/// parser machinery: addresses are in most rules of a large dump.
pub(crate) fn ipv4(s: &str) -> Option<Ipv4Addr> {
    let b = s.as_bytes();
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (n, octet) in octets.iter_mut().enumerate() {
        if n > 0 {
            if b.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
        let start = i;
        let mut v: u32 = 0;
        while let Some(d) = b.get(i).filter(|d| d.is_ascii_digit()) {
            v = v * 10 + u32::from(d - b'0');
            i += 1;
            if i - start > 3 {
                return None;
            }
        }
        let digits = i - start;
        if digits == 0 || v > 255 || (digits > 1 && b[start] == b'0') {
            return None;
        }
        *octet = v as u8;
    }
    (i == b.len()).then(|| Ipv4Addr::from(octets))
}

/// An address: IPv4 (the common case, read by [`ipv4`]) or anything `IpAddr` reads.
fn ip_addr(s: &str) -> Option<IpAddr> {
    match ipv4(s) {
        Some(a) => Some(IpAddr::V4(a)),
        None if s.contains(':') => s.parse().ok(),
        None => None,
    }
}

/// `addr = ip [ "/" ( prefixlen | dotted-mask ) ]` — `-s`/`-d` values: `10.0.0.1`, `10.0.0.0/8`,
/// `10.0.0.0/255.0.0.0`, `fd00::/64`.
pub(crate) fn addr_spec(word: &str) -> Option<AddrSpec<'_>> {
    let (ip, mask) = match word.split_once('/') {
        Some((a, m)) => (a, Some(m)),
        None => (word, None),
    };
    let addr = ip_addr(ip)?;
    let width: u8 = if addr.is_ipv4() { 32 } else { 128 };
    let (prefix, odd_mask) = match mask {
        None => (width, None),
        Some(m) if !m.is_empty() && m.bytes().all(|b| b.is_ascii_digit()) => {
            let p: u8 = m.parse().ok()?;
            if p > width {
                return None;
            }
            (p, None)
        }
        Some(m) => {
            let mask_addr = ip_addr(m)?;
            if mask_addr.is_ipv4() != addr.is_ipv4() {
                return None;
            }
            match prefix_of_mask(mask_addr) {
                Some(p) => (p, None),
                None => (width, Some(m)),
            }
        }
    };
    Some(AddrSpec {
        raw: word,
        addr,
        prefix,
        mask: odd_mask,
    })
}

/// `ipv6-in-brackets = "[" ipv6 "]"`
fn bracketed_v6(i: &str) -> IResult<&str, IpAddr> {
    let (i, _) = char('[').parse(i)?;
    let (i, a) = map_res(take_while1(|c: char| c != ']'), str::parse::<Ipv6Addr>).parse(i)?;
    let (i, _) = char(']').parse(i)?;
    Ok((i, IpAddr::V6(a)))
}

/// `ipv4 = 1*( DIGIT | "." )`
fn v4(i: &str) -> IResult<&str, IpAddr> {
    map_res(
        take_while1(|c: char| c.is_ascii_digit() || c == '.'),
        |s: &str| s.parse::<Ipv4Addr>().map(IpAddr::V4),
    )
    .parse(i)
}

/// `nat-range = [ addr [ "-" addr ] ] [ ":" portrange-with-dash ]` where `addr` is IPv4 or a
/// bracketed IPv6 address; an unbracketed IPv6 address (or range) has no port.
/// Examples: `10.0.0.1:80`, `[fd00::1]:80`, `10.0.0.1-10.0.0.9:80-90`, `fd00::1`.
pub(crate) fn nat_range(word: &str) -> Option<NatRange<'_>> {
    nat_range_v4_port(word).or_else(|| nat_range_any(word))
}

/// The form kube-proxy's DNAT rules print, `a.b.c.d:port`, without the combinators; `None` when
/// the word is of another form (then [`nat_range_any`] decides).
fn nat_range_v4_port(word: &str) -> Option<NatRange<'_>> {
    let (a, p) = word.split_once(':')?;
    if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (Some(addr), Ok(port)) = (ipv4(a), p.parse::<u16>()) else {
        return None;
    };
    Some(NatRange {
        raw: word,
        addr: Some(IpAddr::V4(addr)),
        addr_last: None,
        ports: Some(PortRange {
            first: port,
            last: port,
        }),
    })
}

/// Every form of [`nat_range`].
fn nat_range_any(word: &str) -> Option<NatRange<'_>> {
    // Unbracketed IPv6: `fd00::1` or `fd00::1-fd00::9`.
    if !word.starts_with('[') && word.bytes().filter(|&b| b == b':').count() > 1 {
        let (a, b) = match word.split_once('-') {
            Some((a, b)) => (a, Some(b)),
            None => (word, None),
        };
        let addr: Ipv6Addr = a.parse().ok()?;
        let last = match b {
            Some(b) => Some(IpAddr::V6(b.parse::<Ipv6Addr>().ok()?)),
            None => None,
        };
        return Some(NatRange {
            raw: word,
            addr: Some(IpAddr::V6(addr)),
            addr_last: last,
            ports: None,
        });
    }
    let parsed: IResult<&str, _> = all_consuming((
        opt((
            alt((bracketed_v6, v4)),
            opt((tag("-"), alt((bracketed_v6, v4)))),
        )),
        opt((char(':'), port_range_sep('-'))),
    ))
    .parse(word);
    let (_, (addrs, ports)) = parsed.ok()?;
    let (addr, addr_last) = match addrs {
        Some((a, last)) => (Some(a), last.map(|(_, l)| l)),
        None => (None, None),
    };
    if addr.is_none() && ports.is_none() {
        return None;
    }
    Some(NatRange {
        raw: word,
        addr,
        addr_last,
        ports: ports.map(|(_, p)| p),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers() {
        assert_eq!(number("0x00004000"), Some(0x4000));
        assert_eq!(number("0X4000"), Some(0x4000));
        assert_eq!(number("16384"), Some(16384));
        assert_eq!(number("0x"), None);
        assert_eq!(number("0x1ffffffff"), None);
    }

    #[test]
    fn marks() {
        assert_eq!(
            mark_value("0x4000/0x4000"),
            Some(MarkValue {
                value: 0x4000,
                mask: Some(0x4000)
            })
        );
        assert_eq!(
            mark_value("0x8000"),
            Some(MarkValue {
                value: 0x8000,
                mask: None
            })
        );
        assert_eq!(mark_value("0x4000/"), None);
    }

    #[test]
    fn ports() {
        assert_eq!(
            port_range("80"),
            Some(PortRange {
                first: 80,
                last: 80
            })
        );
        assert_eq!(
            port_range("30000:32767"),
            Some(PortRange {
                first: 30000,
                last: 32767
            })
        );
        assert_eq!(
            port_range(":1024"),
            Some(PortRange {
                first: 0,
                last: 1024
            })
        );
        assert_eq!(
            port_range("1024:"),
            Some(PortRange {
                first: 1024,
                last: 65535
            })
        );
        assert_eq!(port_range("70000"), None);
        assert_eq!(port_range(":"), None);
        assert!(is_port_list("80,443,1000:2000"));
        assert!(!is_port_list("80,,443"));
        assert_eq!(
            nat_ports("1000-2000"),
            Some(PortRange {
                first: 1000,
                last: 2000
            })
        );
    }

    #[test]
    fn addresses() {
        let a = addr_spec("10.0.0.1").unwrap();
        assert_eq!((a.prefix, a.mask), (32, None));
        assert_eq!(addr_spec("10.0.0.0/255.0.0.0").unwrap().prefix, 8);
        let odd = addr_spec("10.0.0.0/255.0.255.0").unwrap();
        assert_eq!(odd.mask, Some("255.0.255.0"));
        assert_eq!(addr_spec("fd00::/64").unwrap().prefix, 64);
        assert_eq!(addr_spec("::1").unwrap().prefix, 128);
        assert!(addr_spec("10.0.0.0/33").is_none());
        assert!(addr_spec("10.0.0.0/").is_none());
        assert!(addr_spec("host.example").is_none());
    }

    #[test]
    fn ipv4_reads_what_the_standard_parser_reads() {
        let mut words: Vec<String> = [
            "0.0.0.0",
            "10.0.0.1",
            "255.255.255.255",
            "256.0.0.1",
            "01.2.3.4",
            "1.2.3",
            "1.2.3.4.5",
            "1..2.3",
            ".1.2.3",
            "1.2.3.",
            "1.2.3.4 ",
            "1.2.3.0004",
            "1.2.3.400",
            "a.b.c.d",
            "",
            "0.0.0.00",
            "100.200.250.199",
            "1.2.3.4/32",
            "٣.1.2.3",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut x = 0x9e37_79b9_u32;
        for _ in 0..50_000 {
            let mut w = String::new();
            for _ in 0..(x % 16) {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                w.push(b"0123456789.."[(x % 12) as usize] as char);
            }
            x = x.wrapping_add(0x6d2b_79f5);
            words.push(w);
        }
        for w in &words {
            assert_eq!(ipv4(w), w.parse::<Ipv4Addr>().ok(), "{w:?}");
            let any = ip_addr(w);
            assert_eq!(any, w.parse::<IpAddr>().ok(), "{w:?}");
        }
        for w in ["fd00::1", "::", "::ffff:1.2.3.4", "fd00::1:", "1:2"] {
            assert_eq!(ip_addr(w), w.parse::<IpAddr>().ok(), "{w:?}");
        }
    }

    #[test]
    fn the_fast_nat_range_reads_what_the_grammar_reads() {
        for w in [
            "10.0.0.1:80",
            "10.244.1.10:8080",
            "0.0.0.0:0",
            "255.255.255.255:65535",
            "10.0.0.1:65536",
            "10.0.0.1:080",
            "01.0.0.1:80",
            "10.0.0:80",
            "10.0.0.1:",
            ":80",
            "10.0.0.1:80-90",
            "10.0.0.1-10.0.0.2:80",
            "[fd00::1]:80",
            "10.0.0.1:+80",
        ] {
            if let Some(fast) = nat_range_v4_port(w) {
                assert_eq!(Some(fast), nat_range_any(w), "{w}");
            }
        }
    }

    #[test]
    fn nat_ranges() {
        let r = nat_range("10.0.0.1:80").unwrap();
        assert_eq!(r.addr, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(
            r.ports,
            Some(PortRange {
                first: 80,
                last: 80
            })
        );
        let r = nat_range("[fd00::1]:8080").unwrap();
        assert_eq!(r.addr, Some("fd00::1".parse().unwrap()));
        let r = nat_range("10.0.0.1-10.0.0.9:80-90").unwrap();
        assert_eq!(r.addr_last, Some("10.0.0.9".parse().unwrap()));
        assert_eq!(
            r.ports,
            Some(PortRange {
                first: 80,
                last: 90
            })
        );
        assert_eq!(nat_range("fd00::1").unwrap().ports, None);
        let r = nat_range(":0").unwrap();
        assert_eq!(
            (r.addr, r.ports),
            (None, Some(PortRange { first: 0, last: 0 }))
        );
        assert!(nat_range("").is_none());
        assert!(nat_range("[unsupported").is_none());
        assert!(nat_range("10.0.0.1:").is_none());
    }
}
