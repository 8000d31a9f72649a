//! Tokens shared by every ipvsadm layout: numeric `ADDR:PORT`, counters (with K/M/G/T suffixes),
//! expiry times, and a whitespace tokenizer that remembers columns.

use super::error::{self, IpvsParseError};
use nom::branch::alt;
use nom::bytes::complete::{tag, take_while1};
use nom::character::complete::{char, digit1};
use nom::combinator::{all_consuming, map_res, opt};
use nom::sequence::{delimited, preceded, terminated};
use nom::{IResult, Parser};
use serde::Serialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// A token of a line and its 0-based byte column.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tok<'a> {
    /// The token text.
    pub s: &'a str,
    /// 0-based byte offset in the line.
    pub col: usize,
}

/// Splits `line` on runs of ASCII whitespace into `out` (cleared first), keeping each token's column
/// (no field of ipvsadm's listings contains a space). Reusing `out` avoids an allocation per line.
pub(crate) fn tokens_into<'a>(line: &'a str, out: &mut Vec<Tok<'a>>) {
    out.clear();
    let bytes = line.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        while i < bytes.len() && bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        while i < bytes.len() && !bytes[i].is_ascii_whitespace() {
            i += 1;
        }
        if i > start {
            out.push(Tok {
                s: &line[start..i],
                col: start,
            });
        }
    }
}

/// Context for building errors about one line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LineCtx<'a> {
    /// 1-based line number.
    pub no: usize,
    /// The line text.
    pub text: &'a str,
}

impl<'a> LineCtx<'a> {
    /// An error at token `t`.
    pub fn err(&self, t: Tok<'_>, expected: &str) -> IpvsParseError {
        error::at(self.no, self.text, t.col, expected, t.s)
    }
    /// An error at the end of the line (a missing field).
    pub fn err_eol(&self, expected: &str) -> IpvsParseError {
        error::at(self.no, self.text, self.text.trim_end().len(), expected, "")
    }
    /// Token `i` of `toks`, or a "missing field" error.
    pub fn tok(
        &self,
        toks: &[Tok<'a>],
        i: usize,
        expected: &str,
    ) -> Result<Tok<'a>, IpvsParseError> {
        toks.get(i).copied().ok_or_else(|| self.err_eol(expected))
    }
}

fn ipv4(i: &str) -> IResult<&str, IpAddr> {
    map_res(
        take_while1(|c: char| c.is_ascii_digit() || c == '.'),
        |s: &str| s.parse::<Ipv4Addr>().map(IpAddr::V4),
    )
    .parse(i)
}

fn ipv6_text(i: &str) -> IResult<&str, IpAddr> {
    map_res(
        take_while1(|c: char| c.is_ascii_hexdigit() || c == ':' || c == '.'),
        |s: &str| s.parse::<Ipv6Addr>().map(IpAddr::V6),
    )
    .parse(i)
}

fn port(i: &str) -> IResult<&str, u16> {
    map_res(digit1, str::parse::<u16>).parse(i)
}

/// `ADDRPORT = IPV4 ":" PORT | "[" IPV6 "]" ":" PORT` (numeric form only).
pub(crate) fn addr_port(i: &str) -> IResult<&str, (IpAddr, u16)> {
    (
        alt((delimited(char('['), ipv6_text, char(']')), ipv4)),
        preceded(char(':'), port),
    )
        .parse(i)
}

/// Parses a whole token as `ADDR:PORT`.
pub(crate) fn parse_addr_port(
    cx: &LineCtx<'_>,
    t: Tok<'_>,
) -> Result<(IpAddr, u16), IpvsParseError> {
    all_consuming(addr_port)
        .parse(t.s)
        .map(|(_, v)| v)
        .map_err(|_| {
            cx.err(
                t,
                "numeric ADDR:PORT (IPv6 as [ADDR]:PORT; run ipvsadm with -n)",
            )
        })
}

/// Parses a whole token as an unsigned integer of type `T`.
pub(crate) fn parse_num<T: std::str::FromStr>(
    cx: &LineCtx<'_>,
    t: Tok<'_>,
    what: &str,
) -> Result<T, IpvsParseError> {
    if !t.s.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return Err(cx.err(t, what));
    }
    t.s.parse::<T>().map_err(|_| cx.err(t, what))
}

/// A counter from a listing. Values printed with a K/M/G/T suffix are lower bounds
/// (`123456K` = 123 456 000 ≤ n < 123 457 000, ipvsadm.c `print_largenum`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counter {
    /// The value (the lower bound when `exact` is false).
    pub value: u64,
    /// False when the text carried a unit suffix.
    pub exact: bool,
}

/// `largenum = DIGITS [ "K" | "M" | "G" | "T" ]` (ipvsadm.c `print_largenum`; decimal units).
fn largenum(i: &str) -> IResult<&str, Counter> {
    let (rest, digits) = map_res(digit1, str::parse::<u64>).parse(i)?;
    let (rest, unit) = opt(alt((char('K'), char('M'), char('G'), char('T')))).parse(rest)?;
    let mult: u64 = match unit {
        None => 1,
        Some('K') => 1_000,
        Some('M') => 1_000_000,
        Some('G') => 1_000_000_000,
        Some(_) => 1_000_000_000_000,
    };
    Ok((
        rest,
        Counter {
            value: digits.saturating_mul(mult),
            exact: unit.is_none(),
        },
    ))
}

/// Parses a whole token as a `largenum` counter.
pub(crate) fn parse_counter(cx: &LineCtx<'_>, t: Tok<'_>) -> Result<Counter, IpvsParseError> {
    all_consuming(largenum)
        .parse(t.s)
        .map(|(_, v)| v)
        .map_err(|_| cx.err(t, "a counter (digits with optional K/M/G/T suffix)"))
}

/// `EXPIRE = MINUTES ":" SS` with unbounded minutes (ipvsadm.c `list_conn`), in seconds.
pub(crate) fn parse_expire(cx: &LineCtx<'_>, t: Tok<'_>) -> Result<u64, IpvsParseError> {
    let r: IResult<&str, (u64, u64)> = all_consuming((
        terminated(map_res(digit1, str::parse::<u64>), tag(":")),
        map_res(digit1, str::parse::<u64>),
    ))
    .parse(t.s);
    match r {
        Ok((_, (m, s))) if s < 60 => Ok(m.saturating_mul(60).saturating_add(s)),
        _ => Err(cx.err(t, "an expiry MM:SS")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr_port_forms() {
        assert_eq!(
            addr_port("10.96.0.1:443").map(|r| r.1),
            Ok(("10.96.0.1".parse().unwrap(), 443))
        );
        assert_eq!(
            addr_port("[fd00::1]:53").map(|r| r.1),
            Ok(("fd00::1".parse().unwrap(), 53))
        );
        assert!(all_consuming(addr_port).parse("kube-dns:53").is_err());
    }

    #[test]
    fn largenum_suffixes() {
        let cx = LineCtx { no: 1, text: "x" };
        let t = |s| Tok { s, col: 0 };
        assert_eq!(
            parse_counter(&cx, t("123456K")).unwrap(),
            Counter {
                value: 123_456_000,
                exact: false
            }
        );
        assert_eq!(
            parse_counter(&cx, t("987G")).unwrap().value,
            987_000_000_000
        );
        assert_eq!(
            parse_counter(&cx, t("99999999")).unwrap(),
            Counter {
                value: 99_999_999,
                exact: true
            }
        );
        assert!(parse_counter(&cx, t("12X")).is_err());
        assert_eq!(parse_expire(&cx, t("179:58")).unwrap(), 179 * 60 + 58);
        assert_eq!(
            parse_expire(&cx, t("13171233:02")).unwrap(),
            13171233 * 60 + 2
        );
    }
}
