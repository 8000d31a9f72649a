//! Parsers for `ipset save` (`create`/`add` lines) and `ipset list` (`Name:`/`Type:`/…/`Members:` blocks),
//! including entry options (`timeout`, `packets`/`bytes` counters, `comment "…"`, `skbmark`, `nomatch`).
//! Grammar: what `ipset save` and `ipset list` print. Errors are [`IpvsParseError`] with `line:col`.

pub use crate::ipvsadm::IpvsParseError;
use crate::ipvsadm::error;
use nom::Parser;
use nom::bytes::complete::{tag, take_till, take_while1};
use nom::character::complete::{char, digit1, space0, space1};
use nom::combinator::{map_res, opt};
use nom::sequence::{delimited, preceded};
use serde::Serialize;
use std::fmt;
use std::net::IpAddr;

/// One set with its entries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpSet<'a> {
    /// Set name.
    pub name: &'a str,
    /// Set type, e.g. `hash:ip,port`.
    pub set_type: &'a str,
    /// Header option tokens (`family inet hashsize 1024 …`, `range 0-65535`).
    pub header: Vec<&'a str>,
    /// `References:` (list form only).
    pub references: Option<u64>,
    /// `Number of entries:` (list form only): more than [`IpSet::entries`] holds when the
    /// listing was cut.
    pub entries_declared: Option<usize>,
    /// Members in text order.
    pub entries: Vec<IpSetEntry<'a>>,
    /// 1-based line of `create`/`Name:`.
    pub line: usize,
    /// A `list` form set whose text stops before its `Members:` line (`ipset list` prints one
    /// for every set): its members are not in the input, which says nothing of them.
    pub members_missing: bool,
}

impl IpSet<'_> {
    /// Why the input holds only part of this set's members, if it does: a listing cut before
    /// its `Members:` line, or one that lists fewer members than its `Number of entries:`.
    pub fn cut(&self) -> Option<String> {
        if self.members_missing {
            return Some(format!(
                "set {} stops before its `Members:` line: the listing is cut, its members are missing (it is not an empty set)",
                self.name
            ));
        }
        match self.entries_declared {
            Some(declared) if declared > self.entries.len() => Some(format!(
                "set {} lists {} of its {declared} entries: the listing is cut, its other members are missing",
                self.name,
                self.entries.len()
            )),
            _ => None,
        }
    }

    /// The value following `key` in the header (e.g. `family` → `inet`).
    pub fn header_value(&self, key: &str) -> Option<&str> {
        self.header
            .iter()
            .position(|h| *h == key)
            .and_then(|i| self.header.get(i + 1))
            .copied()
    }
}

/// One member line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpSetEntry<'a> {
    /// The element text as printed (`10.96.0.1,tcp:443`).
    pub text: &'a str,
    /// The element, typed by the set type.
    pub member: Member,
    /// `timeout N`.
    pub timeout: Option<u64>,
    /// `packets N`.
    pub packets: Option<u64>,
    /// `bytes N`.
    pub bytes: Option<u64>,
    /// `comment "…"` (without quotes).
    pub comment: Option<&'a str>,
    /// `nomatch`.
    pub nomatch: bool,
    /// 1-based source line.
    pub line: usize,
}

/// A set element, typed by the set type (`hash:ip`, `hash:net`, `hash:ip,port`, `hash:ip,port,ip`,
/// `hash:ip,port,net`, `bitmap:port`); anything else is kept as text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Member {
    /// `hash:ip`: an address.
    Ip(IpAddr),
    /// `hash:net`: a network (host prefix when printed without `/N`).
    Net(IpAddr, u8),
    /// `bitmap:port`: one port.
    Port(u16),
    /// `bitmap:port`: a port range `A-B`.
    PortRange(u16, u16),
    /// `hash:ip,port`: `IP,PROTO:PORT`.
    IpPort(IpAddr, String, u16),
    /// `hash:ip,port,ip`: `IP,PROTO:PORT,IP`.
    IpPortIp(IpAddr, String, u16, IpAddr),
    /// `hash:ip,port,net`: `IP,PROTO:PORT,NET/LEN`.
    IpPortNet(IpAddr, String, u16, IpAddr, u8),
    /// Any other type: the text.
    Other(String),
}

fn host_len(a: &IpAddr) -> u8 {
    if a.is_ipv4() { 32 } else { 128 }
}

struct NetText<'a>(&'a IpAddr, u8);
impl fmt::Display for NetText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.1 == host_len(self.0) {
            write!(f, "{}", self.0)
        } else {
            write!(f, "{}/{}", self.0, self.1)
        }
    }
}

impl fmt::Display for Member {
    /// Canonical text: lower-case protocol, RFC 5952 IPv6, host-sized nets without `/32`/`/128`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Member::Ip(a) => write!(f, "{a}"),
            Member::Net(a, l) => write!(f, "{}", NetText(a, *l)),
            Member::Port(p) => write!(f, "{p}"),
            Member::PortRange(a, b) => write!(f, "{a}-{b}"),
            Member::IpPort(a, pr, p) => write!(f, "{a},{pr}:{p}"),
            Member::IpPortIp(a, pr, p, b) => write!(f, "{a},{pr}:{p},{b}"),
            Member::IpPortNet(a, pr, p, n, l) => write!(f, "{a},{pr}:{p},{}", NetText(n, *l)),
            Member::Other(s) => f.write_str(s),
        }
    }
}

fn parse_net(s: &str) -> Option<(IpAddr, u8)> {
    match s.split_once('/') {
        Some((a, l)) => {
            let a: IpAddr = a.parse().ok()?;
            let l: u8 = l.parse().ok()?;
            (l <= host_len(&a)).then_some((a, l))
        }
        None => {
            let a: IpAddr = s.parse().ok()?;
            Some((a, host_len(&a)))
        }
    }
}

fn parse_proto_port(s: &str) -> Option<(String, u16)> {
    // `PROTO:PORT`; ipset prints a bare port for tcp when given without a protocol in old versions.
    match s.split_once(':') {
        Some((pr, p)) => Some((pr.to_ascii_lowercase(), p.parse().ok()?)),
        None => Some(("tcp".to_string(), s.parse().ok()?)),
    }
}

/// Parses an element text for a set type. Returns `None` when the text does not fit the type.
pub fn parse_member(set_type: &str, text: &str) -> Option<Member> {
    let parts: Vec<&str> = text.split(',').collect();
    Some(match (set_type, parts.as_slice()) {
        ("hash:ip", [a]) => Member::Ip(a.parse().ok()?),
        ("hash:net", [n]) => {
            let (a, l) = parse_net(n)?;
            Member::Net(a, l)
        }
        ("bitmap:port", [p]) => match p.split_once('-') {
            Some((a, b)) => Member::PortRange(a.parse().ok()?, b.parse().ok()?),
            None => Member::Port(p.parse().ok()?),
        },
        ("hash:ip,port", [a, pp]) => {
            let (pr, p) = parse_proto_port(pp)?;
            Member::IpPort(a.parse().ok()?, pr, p)
        }
        ("hash:ip,port,ip", [a, pp, b]) => {
            let (pr, p) = parse_proto_port(pp)?;
            Member::IpPortIp(a.parse().ok()?, pr, p, b.parse().ok()?)
        }
        ("hash:ip,port,net", [a, pp, n]) => {
            let (pr, p) = parse_proto_port(pp)?;
            let (na, l) = parse_net(n)?;
            Member::IpPortNet(a.parse().ok()?, pr, p, na, l)
        }
        (
            "hash:ip" | "hash:net" | "bitmap:port" | "hash:ip,port" | "hash:ip,port,ip"
            | "hash:ip,port,net",
            _,
        ) => return None,
        _ => Member::Other(text.to_string()),
    })
}

/// Canonical text of an element (see [`Member`]'s `Display`); the text itself when it does not parse.
pub fn canonical_member(set_type: &str, text: &str) -> String {
    parse_member(set_type, text).map_or_else(|| text.to_string(), |m| m.to_string())
}

#[derive(Default)]
struct EntryOpts<'a> {
    timeout: Option<u64>,
    packets: Option<u64>,
    bytes: Option<u64>,
    comment: Option<&'a str>,
    nomatch: bool,
}

/// ```text
/// entry-opts = { SP ( "timeout" SP N | "packets" SP N | "bytes" SP N | "comment" SP '"' TEXT '"'
///                   | "skbmark" SP V | "skbprio" SP V | "skbqueue" SP V | "nomatch" ) }
/// ```
/// Returns the options and the byte offset of the first token it could not read, if any.
fn entry_opts(mut rest: &str) -> (EntryOpts<'_>, Option<usize>) {
    let total = rest.len();
    let mut o = EntryOpts::default();
    let num = |i| -> nom::IResult<&str, u64> { map_res(digit1, str::parse::<u64>).parse(i) };
    while let Ok((r, _)) = space0::<&str, nom::error::Error<&str>>(rest) {
        rest = r;
        if rest.is_empty() {
            return (o, None);
        }
        let kw: nom::IResult<&str, &str> =
            take_while1(|c: char| c.is_ascii_alphanumeric()).parse(rest);
        let Ok((after, kw)) = kw else {
            return (o, Some(total - rest.len()));
        };
        let r: nom::IResult<&str, ()> = match kw {
            "timeout" => preceded(space1, num).parse(after).map(|(r, v)| {
                o.timeout = Some(v);
                (r, ())
            }),
            "packets" => preceded(space1, num).parse(after).map(|(r, v)| {
                o.packets = Some(v);
                (r, ())
            }),
            "bytes" => preceded(space1, num).parse(after).map(|(r, v)| {
                o.bytes = Some(v);
                (r, ())
            }),
            "comment" => preceded(
                space1,
                delimited(char('"'), take_till(|c| c == '"'), char('"')),
            )
            .parse(after)
            .map(|(r, v)| {
                o.comment = Some(v);
                (r, ())
            }),
            "skbmark" | "skbprio" | "skbqueue" => {
                preceded(space1, take_while1(|c: char| !c.is_whitespace()))
                    .parse(after)
                    .map(|(r, _)| (r, ()))
            }
            "nomatch" => {
                o.nomatch = true;
                Ok((after, ()))
            }
            _ => return (o, Some(total - rest.len())),
        };
        match r {
            Ok((r, ())) => rest = r,
            Err(_) => return (o, Some(total - rest.len())),
        }
    }
    (o, None)
}

/// Parses one member line `ELEMENT [entry-opts]` starting at byte `col0` of `line`.
fn entry<'a>(
    no: usize,
    line: &'a str,
    col0: usize,
    set_type: &str,
) -> Result<IpSetEntry<'a>, IpvsParseError> {
    let body = line.get(col0..).unwrap_or("").trim_end();
    let (elem, rest) = body.split_once(' ').unwrap_or((body, ""));
    let member = parse_member(set_type, elem).ok_or_else(|| {
        error::at(
            no,
            line,
            col0,
            format!("an element of a {set_type} set"),
            elem,
        )
    })?;
    let (o, bad) = entry_opts(rest);
    if let Some(off) = bad {
        let c = col0 + elem.len() + 1 + off;
        let found = line.get(c..).unwrap_or("").trim_end();
        return Err(error::at(
            no,
            line,
            c,
            "timeout, packets, bytes, comment, skbmark or nomatch",
            found,
        ));
    }
    Ok(IpSetEntry {
        text: elem,
        member,
        timeout: o.timeout,
        packets: o.packets,
        bytes: o.bytes,
        comment: o.comment,
        nomatch: o.nomatch,
        line: no,
    })
}

/// Parses `ipset save` or `ipset list` text (either form is detected per line; both may be mixed).
///
/// ```text
/// save = { "create" SP NAME SP TYPE { SP OPT } NL | "add" SP NAME SP ELEMENT entry-opts NL }
/// list = { "Name:" NAME NL "Type:" TYPE NL "Revision:" N NL "Header:" OPTS NL "Size in memory:" N NL
///          "References:" N NL [ "Number of entries:" N NL ] "Members:" NL { ELEMENT entry-opts NL } [ NL ] }
/// ```
pub fn parse_ipset(text: &str) -> Result<Vec<IpSet<'_>>, IpvsParseError> {
    let mut sets: Vec<IpSet<'_>> = Vec::new();
    let mut in_members = false;
    for (idx, line) in text.lines().enumerate() {
        let no = idx + 1;
        let trimmed = line.trim_end();
        if trimmed.trim().is_empty() {
            in_members = false;
            continue;
        }
        let err = |col: usize, exp: &str, found: &str| error::at(no, line, col, exp, found);
        if let Some(rest) = trimmed.strip_prefix("create ") {
            let mut it = rest.split_ascii_whitespace();
            let name = it.next().ok_or_else(|| err(7, "a set name", ""))?;
            let set_type = it
                .next()
                .ok_or_else(|| err(trimmed.len(), "a set type", ""))?;
            sets.push(IpSet {
                name,
                set_type,
                header: it.collect(),
                references: None,
                entries_declared: None,
                entries: Vec::new(),
                line: no,
                members_missing: false,
            });
            in_members = false;
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix("add ") {
            let name_end = rest
                .find(' ')
                .ok_or_else(|| err(trimmed.len(), "a set name and an element", ""))?;
            let name = &rest[..name_end];
            let Some(set) = sets.iter_mut().rev().find(|s| s.name == name) else {
                return Err(err(4, "the name of a set created earlier", name));
            };
            let col0 = 4 + name_end + 1;
            let e = entry(no, line, col0, set.set_type)?;
            set.entries.push(e);
            continue;
        }
        let header: nom::IResult<&str, (&str, &str)> = (
            take_till(|c| c == ':'),
            preceded(tag(":"), opt(space1)).map(|_| ""),
        )
            .parse(trimmed);
        if !in_members && let Ok((value, (key, _))) = header {
            let value = value.trim();
            match key {
                "Name" => {
                    sets.push(IpSet {
                        name: value,
                        set_type: "",
                        header: Vec::new(),
                        references: None,
                        entries_declared: None,
                        entries: Vec::new(),
                        line: no,
                        members_missing: true,
                    });
                    continue;
                }
                "Type" | "Header" | "References" | "Revision" | "Size in memory"
                | "Number of entries" | "Members" => {
                    let Some(set) = sets.last_mut() else {
                        return Err(err(0, "Name: before the set header", key));
                    };
                    match key {
                        "Type" => set.set_type = value,
                        "Header" => set.header = value.split_ascii_whitespace().collect(),
                        "References" => set.references = value.parse().ok(),
                        "Number of entries" => set.entries_declared = value.parse().ok(),
                        "Members" => {
                            in_members = true;
                            set.members_missing = false;
                        }
                        _ => {}
                    }
                    continue;
                }
                _ => {}
            }
        }
        if in_members && let Some(set) = sets.last_mut() {
            let col0 = line.len() - line.trim_start().len();
            let e = entry(no, line, col0, set.set_type)?;
            set.entries.push(e);
            continue;
        }
        let found = trimmed.split_ascii_whitespace().next().unwrap_or("");
        return Err(err(
            0,
            "create, add, or an `ipset list` header line (Name:, Type:, …, Members:)",
            found,
        ));
    }
    Ok(sets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_and_list_agree() {
        let save = "create KUBE-CLUSTER-IP hash:ip,port family inet hashsize 1024 maxelem 65536\n\
                    add KUBE-CLUSTER-IP 10.96.0.10,udp:53\n\
                    create KUBE-NODE-PORT-TCP bitmap:port range 0-65535\nadd KUBE-NODE-PORT-TCP 30080\n";
        let list = "Name: KUBE-CLUSTER-IP\nType: hash:ip,port\nRevision: 5\nHeader: family inet hashsize 1024 maxelem 65536\n\
                    Size in memory: 440\nReferences: 3\nNumber of entries: 1\nMembers:\n10.96.0.10,udp:53\n\n\
                    Name: KUBE-NODE-PORT-TCP\nType: bitmap:port\nRevision: 3\nHeader: range 0-65535\nSize in memory: 1\n\
                    References: 1\nNumber of entries: 1\nMembers:\n30080\n";
        let a = parse_ipset(save).unwrap();
        let b = parse_ipset(list).unwrap();
        let key = |v: &[IpSet<'_>]| -> Vec<(String, Vec<String>)> {
            v.iter()
                .map(|s| {
                    (
                        s.name.to_string(),
                        s.entries.iter().map(|e| e.member.to_string()).collect(),
                    )
                })
                .collect()
        };
        assert_eq!(key(&a), key(&b));
        assert_eq!(a[0].header_value("family"), Some("inet"));
        assert_eq!(b[0].references, Some(3));
    }

    #[test]
    fn a_listing_cut_in_a_set_header_is_cut_not_empty() {
        let list = "Name: KUBE-CLUSTER-IP\nType: hash:ip,port\nRevision: 5\nHeader: family inet hashsize 1024 maxelem 65536\n\
                    Size in memory: 440\nReferences: 3\nNumber of entries: 1\nMembers:\n10.96.0.10,udp:53\n\n\
                    Name: KUBE-LOOP-BACK\nType: hash:ip,port,ip\nRevision: 5\n";
        let sets = parse_ipset(list).unwrap();
        assert_eq!(sets[0].cut(), None);
        assert!(sets[1].members_missing);
        let why = sets[1].cut().expect("cut");
        assert!(
            why.contains("KUBE-LOOP-BACK") && why.contains("Members:"),
            "{why}"
        );
        // An empty set lists its `Members:` line: it is empty, not cut.
        let empty =
            parse_ipset("Name: S\nType: hash:ip\nNumber of entries: 0\nMembers:\n").unwrap();
        assert_eq!(empty[0].cut(), None);
    }

    #[test]
    fn entry_options() {
        let t = "create S hash:ip family inet hashsize 1024 maxelem 65536 timeout 300 counters comment\n\
                 add S 10.0.0.1 timeout 299 packets 3 bytes 180 comment \"a b\"\n";
        let s = parse_ipset(t).unwrap();
        let e = &s[0].entries[0];
        assert_eq!(
            (e.timeout, e.packets, e.bytes, e.comment),
            (Some(299), Some(3), Some(180), Some("a b"))
        );
    }

    #[test]
    fn errors_have_positions() {
        let e = parse_ipset("create S hash:ip,port family inet\nadd S 10.0.0.1,tcp:http\n")
            .unwrap_err();
        assert_eq!((e.line, e.col), (2, 7));
        let e = parse_ipset("create S hash:ip\nadd S 10.0.0.1 bogus 3\n").unwrap_err();
        assert_eq!((e.line, e.col), (2, 16));
        assert!(parse_ipset("garbage line\n").is_err());
    }

    #[test]
    fn canonical_forms() {
        assert_eq!(
            canonical_member("hash:ip,port,net", "1.2.3.4,TCP:80,10.0.0.5/32"),
            "1.2.3.4,tcp:80,10.0.0.5"
        );
        assert_eq!(
            canonical_member("hash:ip,port", "fd00:10:96:0::1,tcp:443"),
            "fd00:10:96::1,tcp:443"
        );
    }
}
