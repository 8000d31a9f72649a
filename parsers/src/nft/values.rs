//! Constants of nft text: what a bare word means (number, address, prefix, range or symbol),
//! time values (`3h`, `10800s`, `29s984ms`) and chain priorities (`dstnat - 10`).

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Duration;

use nom::branch::alt;
use nom::bytes::complete::tag;
use nom::character::complete::digit1;
use nom::combinator::{all_consuming, map_res};
use nom::multi::many1;
use nom::{IResult, Parser};

use super::ast::{Expr, Family};

/// An unsigned integer written in decimal or `0x` hexadecimal (`80`, `0x00004000`).
pub(crate) fn number(word: &str) -> Option<u64> {
    if let Some(hex) = word.strip_prefix("0x").or_else(|| word.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        return u64::from_str_radix(hex, 16).ok();
    }
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    word.parse().ok()
}

/// An address or prefix as nft prints it (`10.0.0.1`, `fd00::/64`).
fn addr_or_prefix(word: &str) -> Option<Expr<'static>> {
    if let Ok(ip) = word.parse::<IpAddr>() {
        return Some(Expr::Addr(ip));
    }
    let (addr, len) = word.split_once('/')?;
    let ip = addr.parse::<IpAddr>().ok()?;
    let len: u8 = number(len).and_then(|n| u8::try_from(n).ok())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some(Expr::Prefix(ip, len))
}

/// What a bare constant word means: a number, an address, a prefix, a range of numbers or of
/// addresses of one family, or else a symbol (`tcp`, `new`, `local`, `eth0`, `veth*`).
pub(crate) fn classify(word: &str) -> Expr<'_> {
    if let Some(n) = number(word) {
        return Expr::Number(n);
    }
    // Only words that start like a number or an address can be one of the others.
    let first = word.as_bytes().first().copied().unwrap_or(b'g');
    let may_be_addr = first.is_ascii_hexdigit() || first == b':';
    if may_be_addr {
        if let Some(e) = addr_or_prefix(word) {
            return e;
        }
        if let Some((lo, hi)) = word.split_once('-') {
            match (number(lo), number(hi)) {
                (Some(a), Some(b)) => {
                    return Expr::Range(Box::new(Expr::Number(a)), Box::new(Expr::Number(b)));
                }
                _ => {
                    if let (Ok(a), Ok(b)) = (lo.parse::<IpAddr>(), hi.parse::<IpAddr>())
                        && a.is_ipv4() == b.is_ipv4()
                    {
                        return Expr::Range(Box::new(Expr::Addr(a)), Box::new(Expr::Addr(b)));
                    }
                }
            }
        }
    }
    Expr::Symbol(Cow::Borrowed(word))
}

/// One `NUMBER UNIT` part of a time value.
fn time_part(i: &str) -> IResult<&str, Duration> {
    let (i, n) = map_res(digit1, str::parse::<u64>).parse(i)?;
    let (i, unit) = alt((tag("ms"), tag("d"), tag("h"), tag("m"), tag("s"))).parse(i)?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.saturating_mul(60)),
        "h" => Duration::from_secs(n.saturating_mul(3600)),
        _ => Duration::from_secs(n.saturating_mul(86_400)),
    };
    Ok((i, d))
}

/// A time value: `3h`, `10800s`, `1d2h3m4s500ms`, or a bare number of seconds.
pub(crate) fn duration(word: &str) -> Option<Duration> {
    if let Some(n) = number(word) {
        return Some(Duration::from_secs(n));
    }
    let (_, parts) = all_consuming(many1(time_part)).parse(word).ok()?;
    Some(
        parts
            .into_iter()
            .fold(Duration::ZERO, Duration::saturating_add),
    )
}

/// The value of a standard priority name for a family (nft(8), "CHAINS"): `raw` -300,
/// `mangle` -150, `dstnat` -100, `filter` 0, `security` 50, `srcnat` 100; bridge: `dstnat`
/// -300, `filter` -200, `out` 100, `srcnat` 300.
pub(crate) fn standard_priority(family: Family, name: &str) -> Option<i32> {
    if family == Family::Bridge {
        return match name {
            "dstnat" => Some(-300),
            "filter" => Some(-200),
            "out" => Some(100),
            "srcnat" => Some(300),
            _ => None,
        };
    }
    match name {
        "raw" => Some(-300),
        "mangle" => Some(-150),
        "dstnat" => Some(-100),
        "filter" => Some(0),
        "security" => Some(50),
        "srcnat" => Some(100),
        _ => None,
    }
}

/// A signed integer (`-110`, `+5`, `100`).
pub(crate) fn signed(word: &str) -> Option<i32> {
    let (neg, digits) = match word.as_bytes().first() {
        Some(b'-') => (true, &word[1..]),
        Some(b'+') => (false, &word[1..]),
        _ => (false, word),
    };
    let n = i64::try_from(number(digits)?).ok()?;
    i32::try_from(if neg { -n } else { n }).ok()
}

/// A priority written as words: `-110`, `filter`, `dstnat - 10`, `srcnat + 5`, `dstnat-10`.
pub(crate) fn priority(family: Family, words: &[&str]) -> Option<i32> {
    let base = |w: &str| signed(w).or_else(|| standard_priority(family, w));
    match words {
        [one] => base(one).or_else(|| {
            // `dstnat-10` / `srcnat+5` written as one word.
            let at = one.find(['-', '+'])?;
            let b = standard_priority(family, &one[..at])?;
            b.checked_add(signed(&one[at..])?)
        }),
        [name, op, n] => {
            let b = base(name)?;
            let n = signed(n)?;
            match *op {
                "-" => b.checked_sub(n),
                "+" => b.checked_add(n),
                _ => None,
            }
        }
        _ => None,
    }
}

/// How a time value is printed in command input: whole seconds as knftables writes them
/// (`10800s`), else milliseconds (`1500ms`).
pub(crate) fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}
