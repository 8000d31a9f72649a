//! Connection-tracking listings: `conntrack -L` in its default form and with `-o extended`, `-o id`,
//! `-o ktimestamp` (and `-f ipv6`), `conntrack -E` event lines, and `/proc/net/nf_conntrack`.
//!
//! Syntax (libnetfilter_conntrack's `__snprintf_conntrack_default`, the kernel's `ct_seq_show`):
//!
//! ```text
//! input   = { line "\n" }
//! line    = blank-line | summary | flow
//! summary = "conntrack v" VERSION " (conntrack-tools): " N " flow entries have been " VERB "."
//! flow    = [ "[" EVENT "]" ] [ L3NAME L3NUM ] L4NAME L4NUM [ TIMEOUT ] [ STATE ]
//!           tuple [ counters ] { flag } tuple [ counters ] { flag | key "=" value }
//! tuple   = "src=" ADDR "dst=" ADDR proto-tuple
//! proto-tuple = "sport=" N "dport=" N                  ; tcp, udp, sctp, dccp, udplite
//!             | "type=" N "code=" N "id=" N            ; icmp, icmpv6
//!             | "srckey=" HEX "dstkey=" HEX            ; gre
//!             | ""                                     ; any other protocol
//! counters = "packets=" N "bytes=" N                   ; net.netfilter.nf_conntrack_acct=1
//! flag    = "[" WORD "]" | "[" key "=" text "]"        ; [ASSURED] [UNREPLIED] [start=Thu Dec  3 …]
//! ```
//!
//! The first `src=` opens the original tuple, the second the reply tuple; a tuple's own keys follow
//! its `src=`/`dst=` until any other key. After the tuples come `mark=`, `secctx=`, `zone=`,
//! `delta-time=`, `use=`, `id=` (`-o id`) and any key this crate does not know, which is kept in
//! [`Flow::extra`] rather than rejected. `/proc/net/nf_conntrack` prints IPv6 addresses with every
//! group in full (`fd00:0050:0000:…`); they are read as the same addresses.
//!
//! `conntrack` writes its summary (`… 19 flow entries have been shown.`) to stderr, but pasted
//! listings carry it; it is read as [`Summary`] wherever it stands on a line of its own. Lines are
//! found with `memchr`, and a flow borrows every text field from the input.

use std::net::IpAddr;

use memchr::memchr;
use nom::bytes::complete::{tag, take_till, take_while1};
use nom::character::complete::{char, digit1};
use nom::combinator::{map_res, opt};
use nom::sequence::delimited;
use nom::{IResult, Parser};
use serde::Serialize;

use crate::error::ParseError;
use crate::iptables::SkippedLine;

/// How to read an input.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ParseOptions {
    /// Skip lines that are not conntrack output (shell prompts, tool errors, prose around a paste,
    /// a line cut by conntrack's stderr), recording each in [`ConntrackListing::skipped`].
    pub lenient: bool,
}

impl ParseOptions {
    /// Strict parsing (the default): the first line that is not conntrack output is an error.
    pub fn strict() -> Self {
        ParseOptions { lenient: false }
    }

    /// Lenient parsing: lines that are not conntrack output are skipped and recorded.
    pub fn lenient() -> Self {
        ParseOptions { lenient: true }
    }
}

/// A whole listing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConntrackListing<'a> {
    /// The flows, in input order.
    pub flows: Vec<Flow<'a>>,
    /// conntrack's summary lines (`N flow entries have been shown.`), in input order.
    pub summaries: Vec<Summary<'a>>,
    /// Lines skipped in lenient mode.
    #[serde(skip)]
    pub skipped: Vec<SkippedLine<'a>>,
}

/// `conntrack v1.4.7 (conntrack-tools): 19 flow entries have been shown.`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Summary<'a> {
    /// 1-based line.
    pub line: u32,
    /// The number of flows.
    pub count: u64,
    /// What was done with them: `shown`, `deleted`, `updated`.
    pub verb: &'a str,
}

/// The address family of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Family {
    /// `ipv4` (2).
    Ipv4,
    /// `ipv6` (10).
    Ipv6,
}

/// What follows the addresses of a tuple, by protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Ports {
    /// `sport=` `dport=` (TCP, UDP, SCTP, DCCP, UDP-Lite).
    Ports {
        /// Source port.
        sport: u16,
        /// Destination port.
        dport: u16,
    },
    /// `type=` `code=` `id=` (ICMP, ICMPv6).
    Icmp {
        /// ICMP type.
        icmp_type: u8,
        /// ICMP code.
        code: u8,
        /// Echo identifier.
        id: u16,
    },
    /// `srckey=` `dstkey=` (GRE keys, printed in hex).
    Gre {
        /// Source key.
        srckey: u32,
        /// Destination key.
        dstkey: u32,
    },
    /// No protocol part (protocols conntrack tracks by address only).
    None,
}

/// One direction of a flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct Tuple {
    /// Source address.
    pub src: IpAddr,
    /// Destination address.
    pub dst: IpAddr,
    /// The protocol part.
    pub ports: Ports,
}

impl Tuple {
    /// Source port (port protocols only).
    pub fn sport(&self) -> Option<u16> {
        match self.ports {
            Ports::Ports { sport, .. } => Some(sport),
            _ => None,
        }
    }

    /// Destination port (port protocols only).
    pub fn dport(&self) -> Option<u16> {
        match self.ports {
            Ports::Ports { dport, .. } => Some(dport),
            _ => None,
        }
    }
}

/// `packets=N bytes=N` of one direction (with `net.netfilter.nf_conntrack_acct=1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize)]
pub struct Counters {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// One conntrack entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Flow<'a> {
    /// 1-based line.
    pub line: u32,
    /// `conntrack -E` event (`NEW`, `UPDATE`, `DESTROY`), when the line is an event.
    pub event: Option<&'a str>,
    /// Address family (from the `ipv4`/`ipv6` column when printed, else from the addresses).
    pub family: Family,
    /// Protocol name as printed (`tcp`, `udp`, `sctp`, `icmp`, `icmpv6`, `unknown` …).
    pub protocol_name: &'a str,
    /// Protocol number (6, 17, 132, 1, 58 …).
    pub protocol: u8,
    /// Seconds until the entry expires.
    pub timeout: Option<u32>,
    /// Protocol state (`ESTABLISHED`, `SYN_SENT`, `TIME_WAIT`, SCTP `COOKIE_WAIT` …).
    pub state: Option<&'a str>,
    /// The original direction (as the first packet had it, before NAT).
    pub original: Tuple,
    /// The reply direction (as replies are expected, after NAT: its source is the DNAT target).
    pub reply: Tuple,
    /// Counters of the original direction.
    pub original_counters: Option<Counters>,
    /// Counters of the reply direction.
    pub reply_counters: Option<Counters>,
    /// `[ASSURED]`: traffic was seen both ways; the entry is not dropped early under pressure.
    pub assured: bool,
    /// `[UNREPLIED]`: no packet was seen in the reply direction.
    pub unreplied: bool,
    /// `[OFFLOAD]` or `[HW_OFFLOAD]`: the flow is handled by the flowtable.
    pub offload: bool,
    /// `mark=`.
    pub mark: Option<u32>,
    /// `zone=`.
    pub zone: Option<u16>,
    /// `use=` (reference count).
    pub use_count: Option<u32>,
    /// `id=` (with `-o id`).
    pub id: Option<u32>,
    /// `delta-time=` (seconds since the flow began, with `nf_conntrack_timestamp=1`).
    pub delta_time: Option<u64>,
    /// `secctx=` (SELinux context).
    pub secctx: Option<&'a str>,
    /// Every other `key=value`, and bracketed `[key=text]` / `[WORD]` items, in line order
    /// (`secmark=`, `helper=`, `labels=`, `[start=…]`, `[stop=…]` …). Bracketed words are kept with
    /// an empty value.
    pub extra: Vec<(&'a str, &'a str)>,
}

impl Flow<'_> {
    /// Whether the reply does not come from where the original was sent: the destination was
    /// translated (DNAT), as kube-proxy's service rules do.
    pub fn is_dnat(&self) -> bool {
        self.reply.src != self.original.dst
            || match (self.original.ports, self.reply.ports) {
                (Ports::Ports { dport, .. }, Ports::Ports { sport, .. }) => dport != sport,
                _ => false,
            }
    }

    /// The value of an [`extra`](Flow::extra) key.
    pub fn extra_value(&self, key: &str) -> Option<&str> {
        self.extra.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
    }
}

/// The layout of a protocol's tuple part, by protocol number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Ports,
    Icmp,
    Gre,
    None,
}

fn layout(protocol: u8) -> Layout {
    match protocol {
        6 | 17 | 33 | 132 | 136 => Layout::Ports,
        1 | 58 => Layout::Icmp,
        47 => Layout::Gre,
        _ => Layout::None,
    }
}

/// A failure inside one line: 0-based byte offset, what was expected, the word found.
#[derive(Debug)]
struct Fail<'a> {
    at: usize,
    expected: &'static str,
    found: &'a str,
}

type LineResult<'a, T> = Result<T, Fail<'a>>;

/// One word of a line: its text and its byte offset.
#[derive(Debug, Clone, Copy)]
struct Word<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Word<'a> {
    fn fail<T>(self, expected: &'static str) -> LineResult<'a, T> {
        Err(Fail {
            at: self.at,
            expected,
            found: self.text,
        })
    }
}

/// What a word is.
#[derive(Debug, Clone, Copy)]
enum Item<'a> {
    /// `key=value`.
    Pair(&'a str, &'a str),
    /// `[WORD]` or `[key=text with spaces]`.
    Bracket(&'a str),
    /// Anything else.
    Bare(&'a str),
}

fn is_blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn is_key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

// The word grammar runs over bytes: every delimiter is ASCII, so a split never lands inside a
// UTF-8 sequence, and no character is decoded on the way.

/// `[` … `]`, which may hold blanks (`[start=Thu Dec  3 09:41:18 2026]`).
fn bracket(i: &[u8]) -> IResult<&[u8], &[u8]> {
    delimited(char('['), take_till(|b| b == b']'), char(']')).parse(i)
}

/// Splits a line into words and classifies each.
struct Words<'a> {
    line: &'a str,
    /// Byte offset of the rest of the line.
    pos: usize,
}

impl<'a> Words<'a> {
    fn new(line: &'a str) -> Self {
        Words { line, pos: 0 }
    }

    /// The text of `part`, a slice of the line's bytes.
    fn text(&self, part: &[u8]) -> &'a str {
        let start = part.as_ptr() as usize - self.line.as_ptr() as usize;
        &self.line[start..start + part.len()]
    }

    /// The next word, without consuming it: a bracketed item, or a run of non-blanks that is a
    /// `key=value` when it has a `=` after a key. Words are short (a dozen bytes): one plain
    /// pass finds both the end and the `=`, cheaper than a vectorised search started per word.
    fn peek(&self) -> Option<(Word<'a>, Item<'a>)> {
        let bytes = self.line.as_bytes();
        let at = self.pos + bytes.get(self.pos..)?.iter().position(|b| !is_blank(*b))?;
        let rest = &bytes[at..];
        if rest.first() == Some(&b'[')
            && let Ok((after, inner)) = bracket(rest)
        {
            let text = &self.line[at..bytes.len() - after.len()];
            return Some((Word { text, at }, Item::Bracket(self.text(inner))));
        }
        let mut end = rest.len();
        let mut eq = None;
        for (i, b) in rest.iter().enumerate() {
            match b {
                b' ' | b'\t' => {
                    end = i;
                    break;
                }
                b'=' if eq.is_none() => eq = Some(i),
                _ => {}
            }
        }
        let word = &rest[..end];
        let item = match eq {
            Some(eq) if eq > 0 && word[..eq].iter().all(|b| is_key_byte(*b)) => {
                Item::Pair(self.text(&word[..eq]), self.text(&word[eq + 1..]))
            }
            _ => Item::Bare(self.text(word)),
        };
        Some((
            Word {
                text: self.text(word),
                at,
            },
            item,
        ))
    }

    fn next(&mut self) -> Option<(Word<'a>, Item<'a>)> {
        let (w, item) = self.peek()?;
        self.pos = w.at + w.text.len();
        Some((w, item))
    }
}

/// A decimal number of `T` (digits only: no sign, no blanks).
fn number<T: TryFrom<u64>>(s: &str) -> Option<T> {
    if s.is_empty() || s.len() > 20 {
        return None;
    }
    let mut v: u64 = 0;
    for b in s.bytes() {
        if !b.is_ascii_digit() {
            return None;
        }
        v = v.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    T::try_from(v).ok()
}

/// `0x…` (GRE keys) or decimal.
fn hex_or_decimal(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) if !h.is_empty() => u32::from_str_radix(h, 16).ok(),
        _ => number(s),
    }
}

/// An address: dotted-quad IPv4 read here (the common case, four times per flow), anything
/// else by the standard parser (which also decides every IPv4 text this one declines).
fn address(s: &str) -> Option<IpAddr> {
    match ipv4(s.as_bytes()) {
        Some(v4) => Some(IpAddr::V4(v4)),
        None => s.parse().ok(),
    }
}

/// `a.b.c.d`, each part 0-255 without leading zeros.
fn ipv4(b: &[u8]) -> Option<std::net::Ipv4Addr> {
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (n, octet) in octets.iter_mut().enumerate() {
        let start = i;
        let mut v: u32 = 0;
        while let Some(d) = b.get(i).filter(|d| d.is_ascii_digit()) {
            v = v * 10 + u32::from(d - b'0');
            i += 1;
            if i - start > 3 {
                return None;
            }
        }
        if i == start || (i - start > 1 && b[start] == b'0') {
            return None;
        }
        *octet = u8::try_from(v).ok()?;
        if n < 3 {
            if b.get(i) != Some(&b'.') {
                return None;
            }
            i += 1;
        }
    }
    (i == b.len()).then(|| std::net::Ipv4Addr::from(octets))
}

/// A tuple being read.
#[derive(Debug, Default)]
struct TupleParts {
    src: Option<IpAddr>,
    dst: Option<IpAddr>,
    a: Option<u32>,
    b: Option<u32>,
    c: Option<u32>,
    counters_packets: Option<u64>,
    counters_bytes: Option<u64>,
    /// Still reading the tuple's own keys.
    open: bool,
}

impl TupleParts {
    fn finish<'a>(
        &self,
        layout: Layout,
        end: Word<'a>,
    ) -> LineResult<'a, (Tuple, Option<Counters>)> {
        let Some(src) = self.src else {
            return end.fail("`src=ADDR`");
        };
        let Some(dst) = self.dst else {
            return end.fail("`dst=ADDR`");
        };
        let ports = match layout {
            Layout::Ports => match (self.a, self.b) {
                (Some(s), Some(d)) => Ports::Ports {
                    sport: s as u16,
                    dport: d as u16,
                },
                (None, _) => return end.fail("`sport=PORT`"),
                (_, None) => return end.fail("`dport=PORT`"),
            },
            Layout::Icmp => match (self.a, self.b, self.c) {
                (Some(t), Some(c), Some(id)) => Ports::Icmp {
                    icmp_type: t as u8,
                    code: c as u8,
                    id: id as u16,
                },
                (None, _, _) => return end.fail("`type=N`"),
                (_, None, _) => return end.fail("`code=N`"),
                (_, _, None) => return end.fail("`id=N`"),
            },
            Layout::Gre => match (self.a, self.b) {
                (Some(s), Some(d)) => Ports::Gre {
                    srckey: s,
                    dstkey: d,
                },
                (None, _) => return end.fail("`srckey=KEY`"),
                (_, None) => return end.fail("`dstkey=KEY`"),
            },
            Layout::None => Ports::None,
        };
        let counters = match (self.counters_packets, self.counters_bytes) {
            (None, None) => None,
            (p, b) => Some(Counters {
                packets: p.unwrap_or(0),
                bytes: b.unwrap_or(0),
            }),
        };
        Ok((Tuple { src, dst, ports }, counters))
    }
}

/// Which tuple slot of the protocol's layout `key` fills (0, 1, 2), if it is one.
fn tuple_slot(layout: Layout, key: &str) -> Option<usize> {
    match (layout, key) {
        (Layout::Ports, "sport") | (Layout::Icmp, "type") | (Layout::Gre, "srckey") => Some(0),
        (Layout::Ports, "dport") | (Layout::Icmp, "code") | (Layout::Gre, "dstkey") => Some(1),
        (Layout::Icmp, "id") => Some(2),
        _ => None,
    }
}

/// `conntrack v1.4.7 (conntrack-tools): 19 flow entries have been shown.`
fn summary(i: &str) -> IResult<&str, (u64, &str)> {
    let (i, _) = tag("conntrack v").parse(i)?;
    let (i, _) = take_till(|c| c == ' ').parse(i)?;
    let (i, _) = tag(" (conntrack-tools): ").parse(i)?;
    let (i, count) = map_res(digit1, str::parse::<u64>).parse(i)?;
    let (i, _) = tag(" flow entries have been ").parse(i)?;
    let (i, verb) = take_while1(|c: char| c.is_ascii_alphabetic()).parse(i)?;
    let (i, _) = opt(char('.')).parse(i)?;
    Ok((i, (count, verb)))
}

/// Reads one flow line (without its line end).
fn flow_line<'a>(line: &'a str, line_no: u32) -> LineResult<'a, Flow<'a>> {
    let mut words = Words::new(line);
    let end = Word {
        text: "",
        at: line.len(),
    };
    let next = |w: &mut Words<'a>, expected: &'static str| match w.next() {
        Some(x) => Ok(x),
        None => end.fail(expected),
    };

    // Header: [EVENT] [L3NAME L3NUM] L4NAME L4NUM [TIMEOUT] [STATE].
    let mut event = None;
    if let Some((_, Item::Bracket(e))) = words.peek()
        && matches!(e, "NEW" | "UPDATE" | "DESTROY")
    {
        event = Some(e);
        words.next();
    }
    let (first, item) = next(&mut words, "a protocol name (`tcp`, `udp`, `ipv4` …)")?;
    let Item::Bare(first_name) = item else {
        return first.fail("a protocol name (`tcp`, `udp`, `ipv4` …)");
    };
    if !is_protocol_name(first_name) {
        return first.fail("a protocol name (`tcp`, `udp`, `ipv4` …)");
    }
    let (num_word, _) = next(&mut words, "a protocol number")?;
    let Some(first_num) = number::<u8>(num_word.text) else {
        return num_word.fail("a protocol number");
    };
    // `ipv4 2 udp 17 …` (extended, /proc) or `udp 17 …` (default): an L3 column is followed by a
    // protocol name, the L4 column by a timeout, a state or the first key.
    let mut l3 = None;
    let (protocol_name, protocol) = match words.peek() {
        Some((_, Item::Bare(name))) if is_protocol_name(name) && is_l3(first_name, first_num) => {
            words.next();
            let (n, _) = next(&mut words, "a protocol number")?;
            let Some(num) = number::<u8>(n.text) else {
                return n.fail("a protocol number");
            };
            l3 = Some((first, first_name, first_num));
            (name, num)
        }
        _ => (first_name, first_num),
    };
    let mut timeout = None;
    if let Some((w, Item::Bare(t))) = words.peek()
        && t.bytes().next().is_some_and(|b| b.is_ascii_digit())
    {
        let Some(v) = number::<u32>(t) else {
            return w.fail("a timeout in seconds");
        };
        timeout = Some(v);
        words.next();
    }
    let mut state = None;
    if let Some((_, Item::Bare(s))) = words.peek() {
        state = Some(s);
        words.next();
    }

    // Body.
    let lay = layout(protocol);
    let mut tuples: [TupleParts; 2] = Default::default();
    let mut current: Option<usize> = None;
    let mut flow = Flow {
        line: line_no,
        event,
        family: Family::Ipv4,
        protocol_name,
        protocol,
        timeout,
        state,
        original: Tuple {
            src: IpAddr::from([0, 0, 0, 0]),
            dst: IpAddr::from([0, 0, 0, 0]),
            ports: Ports::None,
        },
        reply: Tuple {
            src: IpAddr::from([0, 0, 0, 0]),
            dst: IpAddr::from([0, 0, 0, 0]),
            ports: Ports::None,
        },
        original_counters: None,
        reply_counters: None,
        assured: false,
        unreplied: false,
        offload: false,
        mark: None,
        zone: None,
        use_count: None,
        id: None,
        delta_time: None,
        secctx: None,
        extra: Vec::new(),
    };
    while let Some((w, item)) = words.next() {
        match item {
            Item::Bracket(inner) => {
                if let Some(t) = current {
                    tuples[t].open = false;
                }
                match inner {
                    "ASSURED" => flow.assured = true,
                    "UNREPLIED" => flow.unreplied = true,
                    "OFFLOAD" | "HW_OFFLOAD" => flow.offload = true,
                    _ => match inner.split_once('=') {
                        Some((k, v)) => flow.extra.push((k, v)),
                        None => flow.extra.push((inner, "")),
                    },
                }
            }
            Item::Bare(_) => {
                return w.fail("`key=value` or a `[FLAG]`");
            }
            Item::Pair(key, value) => {
                if key == "src" {
                    let slot = match current {
                        None => 0,
                        Some(0) => 1,
                        Some(_) => return w.fail("the end of the line (both tuples were read)"),
                    };
                    let Some(a) = address(value) else {
                        return w.fail("`src=ADDR` with an IP address");
                    };
                    tuples[slot].src = Some(a);
                    tuples[slot].open = true;
                    current = Some(slot);
                    continue;
                }
                let Some(t) = current else {
                    return w.fail("`src=ADDR` (the original tuple)");
                };
                let parts = &mut tuples[t];
                if parts.open {
                    if key == "dst" && parts.dst.is_none() {
                        let Some(a) = address(value) else {
                            return w.fail("`dst=ADDR` with an IP address");
                        };
                        parts.dst = Some(a);
                        continue;
                    }
                    if let Some(slot) = tuple_slot(lay, key) {
                        let field = match slot {
                            0 => &mut parts.a,
                            1 => &mut parts.b,
                            _ => &mut parts.c,
                        };
                        if field.is_none() {
                            let v = if lay == Layout::Gre {
                                hex_or_decimal(value)
                            } else {
                                number::<u32>(value).filter(|v| match (lay, slot) {
                                    (Layout::Ports, _) | (Layout::Icmp, 2) => *v <= 0xFFFF,
                                    _ => *v <= 0xFF,
                                })
                            };
                            let Some(v) = v else {
                                return w.fail(match (lay, slot) {
                                    (Layout::Ports, _) => "a port number (0-65535)",
                                    (Layout::Icmp, 2) => "an ICMP id (0-65535)",
                                    (Layout::Icmp, _) => "an ICMP type or code (0-255)",
                                    _ => "a GRE key",
                                });
                            };
                            *field = Some(v);
                            continue;
                        }
                    }
                    if parts.dst.is_none() {
                        return w.fail("`dst=ADDR`");
                    }
                }
                match key {
                    "packets" | "bytes" if parts.counters_bytes.is_none() => {
                        parts.open = false;
                        let Some(v) = number::<u64>(value) else {
                            return w.fail("a counter");
                        };
                        if key == "packets" {
                            parts.counters_packets = Some(v);
                        } else {
                            parts.counters_bytes = Some(v);
                        }
                        continue;
                    }
                    _ => {}
                }
                parts.open = false;
                match key {
                    "mark" => flow.mark = Some(numeric(w, value, "a mark")?),
                    "zone" => flow.zone = Some(numeric(w, value, "a zone (0-65535)")?),
                    "use" => flow.use_count = Some(numeric(w, value, "a use count")?),
                    "id" => flow.id = Some(numeric(w, value, "a conntrack id")?),
                    "delta-time" => flow.delta_time = Some(numeric(w, value, "seconds")?),
                    "secctx" => flow.secctx = Some(value),
                    _ => flow.extra.push((key, value)),
                }
            }
        }
    }
    if current != Some(1) {
        return end.fail(if current.is_none() {
            "`src=ADDR` (the original tuple)"
        } else {
            "`src=ADDR` (the reply tuple)"
        });
    }
    let (original, original_counters) = tuples[0].finish(lay, end)?;
    let (reply, reply_counters) = tuples[1].finish(lay, end)?;
    if original.src.is_ipv4() != original.dst.is_ipv4()
        || reply.src.is_ipv4() != original.src.is_ipv4()
        || reply.dst.is_ipv4() != original.src.is_ipv4()
    {
        return end.fail("addresses of one family");
    }
    flow.family = if original.src.is_ipv4() {
        Family::Ipv4
    } else {
        Family::Ipv6
    };
    if let Some((w, name, _)) = l3
        && (name == "ipv4") != (flow.family == Family::Ipv4)
    {
        return w.fail("`ipv4 2` or `ipv6 10` matching the addresses");
    }
    flow.original = original;
    flow.reply = reply;
    flow.original_counters = original_counters;
    flow.reply_counters = reply_counters;
    Ok(flow)
}

/// Protocol names are lower-case words (`udplite`, `icmpv6`, `unknown`).
fn is_protocol_name(name: &str) -> bool {
    name.bytes().any(|b| b.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// Whether `name num` is a layer-3 column.
fn is_l3(name: &str, num: u8) -> bool {
    matches!((name, num), ("ipv4", 2) | ("ipv6", 10))
}

fn numeric<'a, T: TryFrom<u64>>(
    w: Word<'a>,
    value: &str,
    expected: &'static str,
) -> LineResult<'a, T> {
    match number(value) {
        Some(v) => Ok(v),
        None => w.fail(expected),
    }
}

fn to_error(line_no: u32, line: &str, f: Fail<'_>) -> ParseError {
    let at = f.at.min(line.len());
    let col = line.get(..at).map_or(at, |p| p.chars().count()) + 1;
    let found = if f.found.is_empty() {
        "end of line".to_string()
    } else {
        let short: String = f.found.chars().take(40).collect();
        if short.len() < f.found.len() {
            format!("`{short}…`")
        } else {
            format!("`{short}`")
        }
    };
    ParseError {
        source_name: None,
        line: line_no,
        col: u32::try_from(col).unwrap_or(u32::MAX),
        expected: f.expected.to_string(),
        found,
        line_text: line.to_string(),
    }
}

/// Parses a conntrack listing (see the module documentation for the forms). In strict mode the
/// first line that is neither a flow, a summary nor blank is an error; in lenient mode it is
/// recorded in [`ConntrackListing::skipped`].
pub fn parse(text: &str, opts: ParseOptions) -> Result<ConntrackListing<'_>, ParseError> {
    let bytes = text.as_bytes();
    let mut listing = ConntrackListing {
        // One flow per line, roughly 200 bytes each.
        flows: Vec::with_capacity(text.len() / 160 + 1),
        ..ConntrackListing::default()
    };
    let mut start = 0usize;
    let mut line_no: u32 = 0;
    while start < bytes.len() {
        let end = memchr(b'\n', &bytes[start..]).map_or(bytes.len(), |n| start + n);
        let line = text[start..end].trim_end_matches([' ', '\t', '\r']);
        start = end + 1;
        line_no = line_no.saturating_add(1);
        let body = line.trim_start_matches([' ', '\t']);
        if body.is_empty() {
            continue;
        }
        let lead = line.len() - body.len();
        if body.starts_with("conntrack v")
            && let Ok((rest, (count, verb))) = summary(body)
            && rest.trim().is_empty()
        {
            listing.summaries.push(Summary {
                line: line_no,
                count,
                verb,
            });
            continue;
        }
        match flow_line(body, line_no) {
            Ok(flow) => listing.flows.push(flow),
            Err(mut f) => {
                f.at += lead;
                let err = to_error(line_no, line, f);
                if opts.lenient {
                    listing.skipped.push(SkippedLine {
                        line: line_no,
                        text: line,
                        reason: format!("expected {}, found {}", err.expected, err.found),
                    });
                } else {
                    return Err(err);
                }
            }
        }
    }
    Ok(listing)
}

#[cfg(test)]
mod tests;
