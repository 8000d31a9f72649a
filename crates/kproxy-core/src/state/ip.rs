//! IP addresses and CIDRs parsed and printed the way kube-proxy does (Go's "sloppy" parser of
//! `k8s.io/utils/net`: leading zeros in IPv4 octets accepted and dropped; CIDRs printed as
//! their network address; IPv4-mapped IPv6 addresses are IPv4).

use serde::Serialize;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IP family (one kube-proxy proxier per family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum IpFamily {
    /// IPv4 (`iptables`).
    #[serde(rename = "IPv4")]
    V4,
    /// IPv6 (`ip6tables`).
    #[serde(rename = "IPv6")]
    V6,
}

impl IpFamily {
    /// The family of an address.
    pub fn of(ip: &IpAddr) -> IpFamily {
        match ip {
            IpAddr::V4(_) => IpFamily::V4,
            IpAddr::V6(_) => IpFamily::V6,
        }
    }

    /// The Kubernetes spelling (`IPv4`/`IPv6`), as in `spec.ipFamilies` and `addressType`.
    pub fn as_k8s(self) -> &'static str {
        match self {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        }
    }
}

impl fmt::Display for IpFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_k8s())
    }
}

/// Parses an IPv4 dotted quad allowing leading zeros (`172.30.0.041` → `172.30.0.41`).
fn parse_ipv4_sloppy(s: &str) -> Option<Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut parts = s.split('.');
    for octet in &mut octets {
        let part = parts.next()?;
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let digits = part.trim_start_matches('0');
        if digits.len() > 3 {
            return None;
        }
        let v: u32 = if digits.is_empty() {
            0
        } else {
            digits.parse().ok()?
        };
        *octet = u8::try_from(v).ok()?;
    }
    if parts.next().is_some() {
        return None;
    }
    Some(Ipv4Addr::from(octets))
}

/// Parses an IP address like Go's `ParseIPSloppy`; IPv4-mapped IPv6 addresses become IPv4.
pub fn parse_ip_sloppy(s: &str) -> Option<IpAddr> {
    if !s.contains(':') {
        return parse_ipv4_sloppy(s).map(IpAddr::V4);
    }
    let v6: Ipv6Addr = match s.parse() {
        Ok(v) => v,
        Err(_) => {
            // An embedded IPv4 tail with leading zeros (`::ffff:1.2.3.004`).
            let (head, tail) = s.rsplit_once(':')?;
            let v4 = parse_ipv4_sloppy(tail)?;
            format!("{head}:{v4}").parse().ok()?
        }
    };
    Some(match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    })
}

/// A CIDR block, normalised to its network address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cidr {
    /// The network address (host bits cleared).
    pub addr: IpAddr,
    /// The prefix length.
    pub prefix: u8,
}

impl Cidr {
    /// The block of `ip` with `prefix` bits (host bits cleared); `None` when the prefix is longer
    /// than the address.
    pub fn new(ip: IpAddr, prefix: u8) -> Option<Cidr> {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        (prefix <= max).then(|| Cidr {
            addr: mask(ip, prefix),
            prefix,
        })
    }

    /// Parses `ip/prefix` like Go's `ParseCIDRSloppy` (the result is the network, e.g. `1.2.3.4/24` → `1.2.3.0/24`).
    pub fn parse_sloppy(s: &str) -> Option<Cidr> {
        let (ip, prefix) = s.split_once('/')?;
        if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_digit()) || prefix.len() > 3 {
            return None;
        }
        let prefix: u8 = prefix.parse().ok()?;
        let addr = if ip.contains(':') {
            // Go keeps a mapped address in a /96+ IPv6 CIDR as IPv6; only plain IPv6 parsing here.
            IpAddr::V6(ip.parse().ok()?)
        } else {
            IpAddr::V4(parse_ipv4_sloppy(ip)?)
        };
        Cidr::new(addr, prefix)
    }

    /// The family of the block.
    pub fn family(&self) -> IpFamily {
        IpFamily::of(&self.addr)
    }

    /// Whether `ip` lies in the block (addresses of the other family never do).
    pub fn contains(&self, ip: &IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                mask(*ip, self.prefix) == self.addr
            }
            _ => false,
        }
    }

    /// `0.0.0.0/0` or `::/0`.
    pub fn is_zero(&self) -> bool {
        self.prefix == 0
    }
}

fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            IpAddr::V4(Ipv4Addr::from(bits & m))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            IpAddr::V6(Ipv6Addr::from(bits & m))
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// `ip:port`, or `[ip]:port` for IPv6 (Go's `net.JoinHostPort`).
pub fn join_host_port(ip: &IpAddr, port: i32) -> String {
    let mut s = String::with_capacity(24);
    match ip {
        IpAddr::V4(_) => push_ip(&mut s, ip),
        IpAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(s, "[{v6}]");
        }
    }
    s.push(':');
    push_int(&mut s, i64::from(port));
    s
}

/// Appends an IP address as `Display` prints it; IPv4 octet by octet (the render writes one or
/// two per endpoint, and `Display` is slower).
pub fn push_ip(s: &mut String, ip: &IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, o) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    s.push('.');
                }
                s.push_str(itoa::Buffer::new().format(o));
            }
        }
        IpAddr::V6(v6) => {
            use std::fmt::Write as _;
            let _ = write!(s, "{v6}");
        }
    }
}

/// Appends a decimal integer.
pub fn push_int(s: &mut String, n: i64) {
    s.push_str(itoa::Buffer::new().format(n));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sloppy_ipv4_drops_leading_zeros() {
        assert_eq!(
            parse_ip_sloppy("172.30.0.041").map(|i| i.to_string()),
            Some("172.30.0.41".into())
        );
        assert_eq!(parse_ip_sloppy("1.2.3.256"), None);
        assert_eq!(parse_ip_sloppy("1.2.3"), None);
        assert_eq!(parse_ip_sloppy("a.b.c.d"), None);
        assert_eq!(parse_ip_sloppy(""), None);
    }

    #[test]
    fn mapped_ipv6_is_ipv4() {
        assert_eq!(
            parse_ip_sloppy("::ffff:1.2.3.4").map(|i| i.to_string()),
            Some("1.2.3.4".into())
        );
        assert_eq!(
            parse_ip_sloppy("2001:DB8::0:1").map(|i| i.to_string()),
            Some("2001:db8::1".into())
        );
    }

    #[test]
    fn cidr_network_form_and_contains() {
        let c = Cidr::parse_sloppy("203.0.113.000/025").unwrap_or_else(|| panic!("parse"));
        assert_eq!(c.to_string(), "203.0.113.0/25");
        let c = Cidr::parse_sloppy("1.2.3.4/24").unwrap_or_else(|| panic!("parse"));
        assert_eq!(c.to_string(), "1.2.3.0/24");
        assert!(c.contains(&"1.2.3.200".parse().unwrap_or_else(|_| panic!())));
        assert!(!c.contains(&"::1".parse().unwrap_or_else(|_| panic!())));
        assert!(Cidr::parse_sloppy("1.2.3.4/33").is_none());
        assert!(Cidr::parse_sloppy("1.2.3.4").is_none());
        assert_eq!(
            Cidr::parse_sloppy("fd00:10::1/64").map(|c| c.to_string()),
            Some("fd00:10::/64".into())
        );
    }

    #[test]
    fn addresses_print_as_display_does() {
        for a in ["0.0.0.0", "10.180.0.10", "255.255.255.255", "fd00::1"] {
            let ip: IpAddr = a.parse().unwrap_or_else(|_| panic!("{a}"));
            let mut s = String::new();
            push_ip(&mut s, &ip);
            assert_eq!(s, ip.to_string());
        }
    }

    #[test]
    fn host_port_brackets_ipv6() {
        let host = |ip: &str| ip.parse::<IpAddr>().unwrap_or_else(|_| panic!("{ip}"));
        assert_eq!(join_host_port(&host("10.0.0.1"), 8080), "10.0.0.1:8080");
        assert_eq!(join_host_port(&host("fd00::1"), 80), "[fd00::1]:80");
    }

    #[test]
    fn host_port() {
        assert_eq!(
            join_host_port(&"fd00::1".parse().unwrap_or_else(|_| panic!()), 80),
            "[fd00::1]:80"
        );
    }
}
