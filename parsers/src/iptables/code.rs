//! The compact encoding of a rule's parsed facts, and its decoder.
//!
//! The parser types each rule once and writes what it found into a few bytes; [`Rule`]'s methods
//! decode them into the `Copy` views of [`super::ast`] on demand. Strings are never copied: they are
//! `(offset, length)` pairs into the rule's text ([`Rule::raw`]), so every decoded `&str` borrows
//! the dump. A typical kube-proxy rule takes 15–40 bytes.
//!
//! Layout of one rule (integers are fixed-width little-endian, so reading one is a load):
//!
//! ```text
//! code    = flags:u8 matches-at options-at counters-at [ target ] match-count:N { match }
//!           { option } [ packets bytes ]
//! match   = tag:u8 length:u8 [ length:u16 when the u8 is 255 ] payload   ; skippable
//! flags   = bit 0: counters present, bit 1: target present, bit 2: wide offsets,
//!           bit 3: unconditional (see Rule::is_unconditional)
//! *-at    = u8 byte offsets into the code (u16 with wide offsets)
//! string  = offset:N length:N      ; into Rule::raw
//! N       = the width the rule text's length needs: u8 (up to 255 bytes, most rules), u16, u32
//! list    = at:u16 count:u8 | at:u32 count:u16 | at:u32 count:u32   ; by the same width
//! address = 4:u8 4×u8 | 6:u8 16×u8
//! option  = negated:u8 name:string values:string
//! packets, bytes = LEB128 varints
//! ```
//!
//! The header's fixed offsets let every accessor jump straight to its part: a rule's target,
//! matches and counters are each read a few times while a graph is built.
//!
//! An [`OptList`] is `(byte offset in the option area, count)`. Decoding never panics in a release
//! build: bytes that are not a valid encoding (they cannot come from the parser) decode as empty
//! values. Debug builds (the tests, the fuzzers) assert instead, so that an encoder bug is found
//! where it is made rather than as a silently empty field.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::ast::{
    AddrSpec, Counters, GenericOpt, List, MarkOp, MarkValue, Match, Matches, Module, MultiportKind,
    NatRange, Neg, OptList, Options, PortList, PortRange, Recent, RecentAction, Statistic, Target,
    TargetKind, Text, Words,
};

/// Why a target is unreadable; encoded as an index into this table.
pub(crate) const UNREADABLE_REASONS: [&str; 9] = [
    "unsupported revision",
    "unexpected words after the target name",
    "empty NAT range",
    "extra words in NAT range",
    "undecodable NAT range",
    "NAT range without an address",
    "NAT range 0.0.0.0:0",
    "missing NAT range",
    "repeated NAT range",
];

const HAS_COUNTERS: u8 = 1;
const HAS_TARGET: u8 = 2;
const WIDE: u8 = 4;
const UNCONDITIONAL: u8 = 8;

// Match tags.
const M_SOURCE: u8 = 0;
const M_DESTINATION: u8 = 1;
const M_PROTOCOL: u8 = 2;
const M_IN: u8 = 3;
const M_OUT: u8 = 4;
const M_FRAGMENT: u8 = 5;
const M_COMMENT: u8 = 6;
const M_PORTS: u8 = 7;
const M_MULTIPORT: u8 = 8;
const M_RANDOM: u8 = 9;
const M_NTH: u8 = 10;
const M_RECENT: u8 = 11;
const M_ADDRTYPE: u8 = 12;
const M_MARK: u8 = 13;
const M_CONNMARK: u8 = 14;
const M_CONNTRACK: u8 = 15;
const M_STATE: u8 = 16;
const M_SET: u8 = 17;
const M_NFACCT: u8 = 18;
const M_GENERIC: u8 = 19;

// Target tags.
const T_JUMP: u8 = 0;
const T_GOTO: u8 = 1;
const T_ACCEPT: u8 = 2;
const T_DROP: u8 = 3;
const T_RETURN: u8 = 4;
const T_DNAT: u8 = 5;
const T_SNAT: u8 = 6;
const T_MASQUERADE: u8 = 7;
const T_MARK: u8 = 8;
const T_CONNMARK: u8 = 9;
const T_REJECT: u8 = 10;
const T_LOG: u8 = 11;
const T_TRACE: u8 = 12;
const T_NOTRACK: u8 = 13;
const T_CT: u8 = 14;
const T_GENERIC: u8 = 15;
const T_UNREADABLE: u8 = 16;

/// Appends encoded values to a buffer; strings are written as offsets into `raw`.
pub(crate) struct Enc<'b, 'a> {
    raw: &'a str,
    buf: &'b mut Vec<u8>,
}

impl<'b, 'a> Enc<'b, 'a> {
    pub(crate) fn new(raw: &'a str, buf: &'b mut Vec<u8>) -> Self {
        Enc { raw, buf }
    }

    fn u8(&mut self, b: u8) {
        self.buf.push(b);
    }

    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }

    /// A string offset or length (or a count): as wide as the rule text's length needs.
    fn offset(&mut self, v: usize) {
        match text_width(self.raw) {
            1 => self.u8(u8::try_from(v).unwrap_or(u8::MAX)),
            2 => self.u16(u16::try_from(v).unwrap_or(u16::MAX)),
            _ => self.u32(u32::try_from(v).unwrap_or(u32::MAX)),
        }
    }

    fn flags(&mut self, bits: &[bool]) {
        let mut b = 0u8;
        for (i, set) in bits.iter().enumerate() {
            if *set {
                b |= 1 << i;
            }
        }
        self.u8(b);
    }

    /// A slice of `raw` (the parser only hands out slices of the rule text; anything else is
    /// written empty and caught by the round-trip tests).
    fn str(&mut self, s: &str) {
        let base = self.raw.as_ptr() as usize;
        let at = (s.as_ptr() as usize).wrapping_sub(base);
        if s.is_empty()
            || at
                .checked_add(s.len())
                .is_none_or(|end| end > self.raw.len())
        {
            debug_assert!(s.is_empty(), "string {s:?} is not part of the rule text");
            self.offset(0);
            self.offset(0);
            return;
        }
        self.offset(at);
        self.offset(s.len());
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
            None => self.u8(0),
        }
    }

    fn ip(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => {
                self.u8(4);
                self.buf.extend_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                self.u8(6);
                self.buf.extend_from_slice(&a.octets());
            }
        }
    }

    fn ports(&mut self, p: PortRange) {
        self.u16(p.first);
        self.u16(p.last);
    }

    fn opt_neg_ports(&mut self, p: Option<Neg<PortRange>>) {
        match p {
            None => self.u8(0),
            Some(n) => {
                self.u8(1 | (u8::from(n.negated) << 1));
                self.ports(n.value);
            }
        }
    }

    fn list(&mut self, l: OptList) {
        if text_width(self.raw) == 1 {
            self.u16(u16::try_from(l.at).unwrap_or(u16::MAX));
        } else {
            self.u32(l.at);
        }
        self.offset(l.len as usize);
    }

    fn addr(&mut self, n: &Neg<AddrSpec<'_>>) {
        self.flags(&[n.negated, n.value.mask.is_some()]);
        self.str(n.value.raw);
        self.ip(n.value.addr);
        self.u8(n.value.prefix);
        if let Some(m) = n.value.mask {
            self.str(m);
        }
    }

    fn neg_str(&mut self, n: &Neg<&str>) {
        self.u8(u8::from(n.negated));
        self.str(n.value);
    }

    fn mark(&mut self, n: &Neg<MarkValue>) {
        self.flags(&[n.negated, n.value.mask.is_some()]);
        self.u32(n.value.value);
        if let Some(m) = n.value.mask {
            self.u32(m);
        }
    }

    fn nat(&mut self, r: &NatRange<'_>) {
        self.flags(&[r.addr.is_some(), r.addr_last.is_some(), r.ports.is_some()]);
        self.str(r.raw);
        if let Some(a) = r.addr {
            self.ip(a);
        }
        if let Some(a) = r.addr_last {
            self.ip(a);
        }
        if let Some(p) = r.ports {
            self.ports(p);
        }
    }

    /// One generic option (the option area).
    pub(crate) fn option(&mut self, negated: bool, name: &str, values: &str) {
        self.u8(u8::from(negated));
        self.str(name);
        self.str(values);
    }

    /// One match record: its tag, the payload's length (so readers can skip it), the payload.
    pub(crate) fn matcher(&mut self, m: &Match<'_>) {
        let start = self.buf.len();
        self.matcher_payload(m);
        // The payload writers start with the tag: put the length right after it.
        let len = self.buf.len() - start - 1;
        if len < 255 {
            self.buf.insert(start + 1, len as u8);
        } else {
            let wide = (len.min(usize::from(u16::MAX)) as u16).to_le_bytes();
            self.buf
                .splice(start + 1..start + 1, [255, wide[0], wide[1]]);
        }
    }

    fn matcher_payload(&mut self, m: &Match<'_>) {
        match m {
            Match::Source(n) => {
                self.u8(M_SOURCE);
                self.addr(n);
            }
            Match::Destination(n) => {
                self.u8(M_DESTINATION);
                self.addr(n);
            }
            Match::Protocol(n) => {
                self.u8(M_PROTOCOL);
                self.neg_str(n);
            }
            Match::InInterface(n) => {
                self.u8(M_IN);
                self.neg_str(n);
            }
            Match::OutInterface(n) => {
                self.u8(M_OUT);
                self.neg_str(n);
            }
            Match::Fragment(neg) => {
                self.u8(M_FRAGMENT);
                self.u8(u8::from(*neg));
            }
            Match::Module(m) => self.module(m),
        }
    }

    fn module(&mut self, m: &Module<'_>) {
        match m {
            Module::Comment(t) => {
                self.u8(M_COMMENT);
                self.u8(u8::from(t.escaped));
                self.str(t.raw);
            }
            Module::Ports {
                proto,
                sport,
                dport,
                other,
            } => {
                self.u8(M_PORTS);
                self.str(proto);
                self.opt_neg_ports(*sport);
                self.opt_neg_ports(*dport);
                self.list(*other);
            }
            Module::Multiport { kind, ports } => {
                self.u8(M_MULTIPORT);
                let k = match kind {
                    MultiportKind::Sports => 0,
                    MultiportKind::Dports => 1,
                    MultiportKind::Ports => 2,
                };
                self.u8(k | (u8::from(ports.negated) << 2));
                self.str(ports.value.raw);
            }
            Module::Statistic(Statistic::Random {
                text,
                probability,
                negated,
            }) => {
                self.u8(M_RANDOM);
                self.u8(u8::from(*negated));
                self.str(text);
                self.buf.extend_from_slice(&probability.to_le_bytes());
            }
            Module::Statistic(Statistic::Nth {
                every,
                packet,
                negated,
            }) => {
                self.u8(M_NTH);
                self.u8(u8::from(*negated));
                self.u32(*every);
                self.u32(*packet);
            }
            Module::Recent(r) => {
                self.u8(M_RECENT);
                let action = match r.action {
                    RecentAction::Set => 0,
                    RecentAction::Rcheck => 1,
                    RecentAction::Update => 2,
                    RecentAction::Remove => 3,
                };
                self.u8(action);
                let default_name = r.name == "DEFAULT" && !self.contains(r.name);
                self.flags(&[
                    r.negated,
                    r.reap,
                    r.rttl,
                    r.rdest,
                    r.seconds.is_some(),
                    r.hitcount.is_some(),
                    r.mask.is_some(),
                    default_name,
                ]);
                if !default_name {
                    self.str(r.name);
                }
                if let Some(s) = r.seconds {
                    self.u32(s);
                }
                if let Some(h) = r.hitcount {
                    self.u32(h);
                }
                if let Some(m) = r.mask {
                    self.str(m);
                }
            }
            Module::Addrtype {
                src_type,
                dst_type,
                limit_iface_in,
                limit_iface_out,
            } => {
                self.u8(M_ADDRTYPE);
                self.flags(&[
                    src_type.is_some(),
                    src_type.is_some_and(|t| t.negated),
                    dst_type.is_some(),
                    dst_type.is_some_and(|t| t.negated),
                    *limit_iface_in,
                    *limit_iface_out,
                ]);
                if let Some(t) = src_type {
                    self.str(t.value);
                }
                if let Some(t) = dst_type {
                    self.str(t.value);
                }
            }
            Module::Mark(n) => {
                self.u8(M_MARK);
                self.mark(n);
            }
            Module::Connmark(n) => {
                self.u8(M_CONNMARK);
                self.mark(n);
            }
            Module::Conntrack { ctstate, other } => {
                self.u8(M_CONNTRACK);
                self.flags(&[ctstate.is_some(), ctstate.is_some_and(|s| s.negated)]);
                if let Some(s) = ctstate {
                    self.str(s.value.raw);
                }
                self.list(*other);
            }
            Module::State(n) => {
                self.u8(M_STATE);
                self.u8(u8::from(n.negated));
                self.str(n.value.raw);
            }
            Module::Set {
                name,
                flags,
                negated,
                other,
            } => {
                self.u8(M_SET);
                self.u8(u8::from(*negated));
                self.str(name);
                self.str(flags);
                self.list(*other);
            }
            Module::Nfacct(n) => {
                self.u8(M_NFACCT);
                self.str(n);
            }
            Module::Generic { name, options } => {
                self.u8(M_GENERIC);
                self.str(name);
                self.list(*options);
            }
        }
    }

    /// Whether `s` is a slice of the rule text (a `recent --name DEFAULT` written out, as opposed
    /// to the default).
    fn contains(&self, s: &str) -> bool {
        let base = self.raw.as_ptr() as usize;
        let at = (s.as_ptr() as usize).wrapping_sub(base);
        at < self.raw.len() && at + s.len() <= self.raw.len()
    }

    /// The target record.
    pub(crate) fn target(&mut self, t: &Target<'_>) {
        match t {
            Target::Jump(c) => {
                self.u8(T_JUMP);
                self.str(c);
            }
            Target::Goto(c) => {
                self.u8(T_GOTO);
                self.str(c);
            }
            Target::Accept => self.u8(T_ACCEPT),
            Target::Drop => self.u8(T_DROP),
            Target::Return => self.u8(T_RETURN),
            Target::Dnat {
                to,
                random,
                persistent,
            } => {
                self.u8(T_DNAT);
                self.flags(&[*random, *persistent]);
                self.nat(to);
            }
            Target::Snat {
                to,
                random,
                random_fully,
                persistent,
            } => {
                self.u8(T_SNAT);
                self.flags(&[*random, *random_fully, *persistent]);
                self.nat(to);
            }
            Target::Masquerade {
                to_ports,
                random,
                random_fully,
            } => {
                self.u8(T_MASQUERADE);
                self.flags(&[*random, *random_fully, to_ports.is_some()]);
                if let Some(p) = to_ports {
                    self.ports(*p);
                }
            }
            Target::Mark(op) => {
                self.u8(T_MARK);
                let (kind, value, mask) = match *op {
                    MarkOp::SetXmark { value, mask } => (0, value, mask),
                    MarkOp::SetMark { value, mask } => (1, value, mask),
                    MarkOp::Or(v) => (2, v, 0),
                    MarkOp::Xor(v) => (3, v, 0),
                    MarkOp::And(v) => (4, v, 0),
                };
                self.u8(kind);
                self.u32(value);
                self.u32(mask);
            }
            Target::Connmark(l) => {
                self.u8(T_CONNMARK);
                self.list(*l);
            }
            Target::Reject { with } => {
                self.u8(T_REJECT);
                self.opt_str(*with);
            }
            Target::Log(l) => {
                self.u8(T_LOG);
                self.list(*l);
            }
            Target::Trace => self.u8(T_TRACE),
            Target::Notrack => self.u8(T_NOTRACK),
            Target::Ct(l) => {
                self.u8(T_CT);
                self.list(*l);
            }
            Target::Generic { name, options } => {
                self.u8(T_GENERIC);
                self.str(name);
                self.list(*options);
            }
            Target::Unreadable { raw, reason } => {
                self.u8(T_UNREADABLE);
                let i = UNREADABLE_REASONS
                    .iter()
                    .position(|r| r == reason)
                    .unwrap_or(0);
                self.u8(i as u8);
                self.str(raw);
            }
        }
    }
}

/// How many bytes string offsets, lengths and counts of a rule with text `raw` take.
#[inline]
fn text_width(raw: &str) -> u8 {
    match raw.len() {
        0..=255 => 1,
        256..=65_535 => 2,
        _ => 4,
    }
}

/// Assembles a rule's code from its parts (each already encoded against the same `raw`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn assemble(
    raw: &str,
    counters: Option<Counters>,
    target: &[u8],
    has_target: bool,
    match_count: usize,
    matches: &[u8],
    options: &[u8],
    unconditional: bool,
) -> Box<[u8]> {
    let width = usize::from(text_width(raw));
    let count_bytes = u32::try_from(match_count).unwrap_or(u32::MAX).to_le_bytes();
    let count = &count_bytes[..width];
    let mut tail = [0u8; 20];
    let tail = match counters {
        Some(c) => {
            let n = varint_into(&mut tail, c.packets).len();
            let m = varint_into(&mut tail[n..], c.bytes).len();
            &tail[..n + m]
        }
        None => &tail[..0],
    };
    let body = target.len() + count.len() + matches.len() + options.len() + tail.len();
    let wide = body + 4 > usize::from(u8::MAX);
    let header = if wide { 7 } else { 4 };
    let matches_at = header + target.len();
    let options_at = matches_at + count.len() + matches.len();
    let counters_at = options_at + options.len();
    let mut out = Vec::with_capacity(header + body);
    let mut flags = 0;
    if counters.is_some() {
        flags |= HAS_COUNTERS;
    }
    if has_target {
        flags |= HAS_TARGET;
    }
    if wide {
        flags |= WIDE;
    }
    if unconditional {
        flags |= UNCONDITIONAL;
    }
    out.push(flags);
    for at in [matches_at, options_at, counters_at] {
        if wide {
            out.extend_from_slice(&(at.min(usize::from(u16::MAX)) as u16).to_le_bytes());
        } else {
            out.push(at as u8);
        }
    }
    out.extend_from_slice(target);
    out.extend_from_slice(count);
    out.extend_from_slice(matches);
    out.extend_from_slice(options);
    out.extend_from_slice(tail);
    out.into_boxed_slice()
}

/// Writes `v` as a varint into `buf` (at least 10 bytes), returning the bytes written.
fn varint_into(buf: &mut [u8], mut v: u64) -> &[u8] {
    let mut n = 0;
    while let Some(slot) = buf.get_mut(n) {
        if v < 0x80 {
            *slot = v as u8;
            n += 1;
            break;
        }
        *slot = (v as u8) | 0x80;
        v >>= 7;
        n += 1;
    }
    &buf[..n]
}

/// Reads encoded values; out-of-range reads yield zeros and empty strings.
struct Dec<'r, 'a> {
    raw: &'a str,
    code: &'r [u8],
    pos: usize,
}

impl<'r, 'a> Dec<'r, 'a> {
    #[inline]
    fn u8(&mut self) -> u8 {
        debug_assert!(self.pos < self.code.len(), "read past the end of the code");
        let b = self.code.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }

    fn var(&mut self) -> u64 {
        let mut v = 0u64;
        let mut shift = 0u32;
        loop {
            let b = self.u8();
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            if b & 0x80 == 0 || self.pos >= self.code.len() {
                return v;
            }
            shift += 7;
        }
    }

    #[inline]
    fn u16(&mut self) -> u16 {
        let v = match self.code.get(self.pos..self.pos + 2) {
            Some(&[a, b]) => u16::from_le_bytes([a, b]),
            _ => {
                debug_assert!(false, "u16 read past the end of the code");
                0
            }
        };
        self.pos += 2;
        v
    }

    #[inline]
    fn u32(&mut self) -> u32 {
        let v = match self.code.get(self.pos..self.pos + 4) {
            Some(&[a, b, c, d]) => u32::from_le_bytes([a, b, c, d]),
            _ => {
                debug_assert!(false, "u32 read past the end of the code");
                0
            }
        };
        self.pos += 4;
        v
    }

    #[inline]
    fn offset(&mut self) -> usize {
        match text_width(self.raw) {
            1 => usize::from(self.u8()),
            2 => usize::from(self.u16()),
            _ => self.u32() as usize,
        }
    }

    #[inline]
    fn bit(b: u8, i: u8) -> bool {
        b & (1 << i) != 0
    }

    #[inline]
    fn str(&mut self) -> &'a str {
        let at = self.offset();
        let len = self.offset();
        let text = at.checked_add(len).and_then(|end| self.raw.get(at..end));
        debug_assert!(
            text.is_some(),
            "string {at}+{len} outside the rule text or not on character boundaries"
        );
        text.unwrap_or("")
    }

    fn opt_str(&mut self) -> Option<&'a str> {
        (self.u8() != 0).then(|| self.str())
    }

    #[inline]
    fn ip(&mut self) -> IpAddr {
        let family = self.u8();
        debug_assert!(family == 4 || family == 6, "address family tag {family}");
        match family {
            6 => {
                let mut o = [0u8; 16];
                let bytes = self.code.get(self.pos..self.pos + 16);
                debug_assert!(bytes.is_some(), "IPv6 address past the end of the code");
                if let Some(b) = bytes {
                    o.copy_from_slice(b);
                }
                self.pos += 16;
                IpAddr::V6(Ipv6Addr::from(o))
            }
            _ => {
                let mut o = [0u8; 4];
                let bytes = self.code.get(self.pos..self.pos + 4);
                debug_assert!(bytes.is_some(), "IPv4 address past the end of the code");
                if let Some(b) = bytes {
                    o.copy_from_slice(b);
                }
                self.pos += 4;
                IpAddr::V4(Ipv4Addr::from(o))
            }
        }
    }

    fn ports(&mut self) -> PortRange {
        PortRange {
            first: self.u16(),
            last: self.u16(),
        }
    }

    fn opt_neg_ports(&mut self) -> Option<Neg<PortRange>> {
        let f = self.u8();
        Self::bit(f, 0).then(|| Neg {
            negated: Self::bit(f, 1),
            value: self.ports(),
        })
    }

    fn list(&mut self) -> OptList {
        let at = if text_width(self.raw) == 1 {
            u32::from(self.u16())
        } else {
            self.u32()
        };
        OptList {
            at,
            len: self.offset() as u32,
        }
    }

    fn addr(&mut self) -> Neg<AddrSpec<'a>> {
        let f = self.u8();
        let raw = self.str();
        let addr = self.ip();
        let prefix = self.u8();
        let mask = Self::bit(f, 1).then(|| self.str());
        Neg {
            negated: Self::bit(f, 0),
            value: AddrSpec {
                raw,
                addr,
                prefix,
                mask,
            },
        }
    }

    fn neg_str(&mut self) -> Neg<&'a str> {
        let negated = self.u8() != 0;
        Neg {
            negated,
            value: self.str(),
        }
    }

    fn mark(&mut self) -> Neg<MarkValue> {
        let f = self.u8();
        let value = self.u32();
        let mask = Self::bit(f, 1).then(|| self.u32());
        Neg {
            negated: Self::bit(f, 0),
            value: MarkValue { value, mask },
        }
    }

    fn nat(&mut self) -> NatRange<'a> {
        let f = self.u8();
        let raw = self.str();
        let addr = Self::bit(f, 0).then(|| self.ip());
        let addr_last = Self::bit(f, 1).then(|| self.ip());
        let ports = Self::bit(f, 2).then(|| self.ports());
        NatRange {
            raw,
            addr,
            addr_last,
            ports,
        }
    }

    fn f64(&mut self) -> f64 {
        let mut b = [0u8; 8];
        if let Some(s) = self.code.get(self.pos..self.pos + 8) {
            b.copy_from_slice(s);
        }
        self.pos += 8;
        f64::from_le_bytes(b)
    }

    /// A record's tag and payload length; the position is then at the payload.
    #[inline]
    fn record(&mut self) -> (u8, usize) {
        let tag = self.u8();
        let len = match self.u8() {
            255 => usize::from(self.u16()),
            n => usize::from(n),
        };
        (tag, len)
    }

    fn matcher(&mut self, tag: u8) -> Match<'a> {
        let m = |m| Match::Module(m);
        match tag {
            M_SOURCE => Match::Source(self.addr()),
            M_DESTINATION => Match::Destination(self.addr()),
            M_PROTOCOL => Match::Protocol(self.neg_str()),
            M_IN => Match::InInterface(self.neg_str()),
            M_OUT => Match::OutInterface(self.neg_str()),
            M_FRAGMENT => Match::Fragment(self.u8() != 0),
            M_COMMENT => {
                let escaped = self.u8() != 0;
                m(Module::Comment(Text {
                    raw: self.str(),
                    escaped,
                }))
            }
            M_PORTS => m(Module::Ports {
                proto: self.str(),
                sport: self.opt_neg_ports(),
                dport: self.opt_neg_ports(),
                other: self.list(),
            }),
            M_MULTIPORT => {
                let f = self.u8();
                debug_assert!(f & 3 <= 2, "multiport kind {}", f & 3);
                let kind = match f & 3 {
                    0 => MultiportKind::Sports,
                    1 => MultiportKind::Dports,
                    _ => MultiportKind::Ports,
                };
                m(Module::Multiport {
                    kind,
                    ports: Neg {
                        negated: Self::bit(f, 2),
                        value: PortList { raw: self.str() },
                    },
                })
            }
            M_RANDOM => {
                let negated = self.u8() != 0;
                let text = self.str();
                m(Module::Statistic(Statistic::Random {
                    text,
                    probability: self.f64(),
                    negated,
                }))
            }
            M_NTH => {
                let negated = self.u8() != 0;
                m(Module::Statistic(Statistic::Nth {
                    every: self.u32(),
                    packet: self.u32(),
                    negated,
                }))
            }
            M_RECENT => {
                let action = self.u8();
                debug_assert!(action <= 3, "recent action {action}");
                let action = match action {
                    1 => RecentAction::Rcheck,
                    2 => RecentAction::Update,
                    3 => RecentAction::Remove,
                    _ => RecentAction::Set,
                };
                let f = self.u8();
                let name = if Self::bit(f, 7) {
                    "DEFAULT"
                } else {
                    self.str()
                };
                let seconds = Self::bit(f, 4).then(|| self.u32());
                let hitcount = Self::bit(f, 5).then(|| self.u32());
                let mask = Self::bit(f, 6).then(|| self.str());
                m(Module::Recent(Recent {
                    name,
                    action,
                    negated: Self::bit(f, 0),
                    seconds,
                    hitcount,
                    reap: Self::bit(f, 1),
                    rttl: Self::bit(f, 2),
                    mask,
                    rdest: Self::bit(f, 3),
                }))
            }
            M_ADDRTYPE => {
                let f = self.u8();
                let src_type = Self::bit(f, 0).then(|| Neg {
                    negated: Self::bit(f, 1),
                    value: self.str(),
                });
                let dst_type = Self::bit(f, 2).then(|| Neg {
                    negated: Self::bit(f, 3),
                    value: self.str(),
                });
                m(Module::Addrtype {
                    src_type,
                    dst_type,
                    limit_iface_in: Self::bit(f, 4),
                    limit_iface_out: Self::bit(f, 5),
                })
            }
            M_MARK => m(Module::Mark(self.mark())),
            M_CONNMARK => m(Module::Connmark(self.mark())),
            M_CONNTRACK => {
                let f = self.u8();
                let ctstate = Self::bit(f, 0).then(|| Neg {
                    negated: Self::bit(f, 1),
                    value: List { raw: self.str() },
                });
                m(Module::Conntrack {
                    ctstate,
                    other: self.list(),
                })
            }
            M_STATE => {
                let negated = self.u8() != 0;
                m(Module::State(Neg {
                    negated,
                    value: List { raw: self.str() },
                }))
            }
            M_SET => {
                let negated = self.u8() != 0;
                m(Module::Set {
                    name: self.str(),
                    flags: self.str(),
                    negated,
                    other: self.list(),
                })
            }
            M_NFACCT => m(Module::Nfacct(self.str())),
            tag => {
                debug_assert_eq!(tag, M_GENERIC, "match tag");
                m(Module::Generic {
                    name: self.str(),
                    options: self.list(),
                })
            }
        }
    }

    fn target(&mut self) -> Target<'a> {
        match self.u8() {
            T_JUMP => Target::Jump(self.str()),
            T_GOTO => Target::Goto(self.str()),
            T_ACCEPT => Target::Accept,
            T_DROP => Target::Drop,
            T_RETURN => Target::Return,
            T_DNAT => {
                let f = self.u8();
                Target::Dnat {
                    to: self.nat(),
                    random: Self::bit(f, 0),
                    persistent: Self::bit(f, 1),
                }
            }
            T_SNAT => {
                let f = self.u8();
                Target::Snat {
                    to: self.nat(),
                    random: Self::bit(f, 0),
                    random_fully: Self::bit(f, 1),
                    persistent: Self::bit(f, 2),
                }
            }
            T_MASQUERADE => {
                let f = self.u8();
                Target::Masquerade {
                    to_ports: Self::bit(f, 2).then(|| self.ports()),
                    random: Self::bit(f, 0),
                    random_fully: Self::bit(f, 1),
                }
            }
            T_MARK => {
                let kind = self.u8();
                debug_assert!(kind <= 4, "MARK operation {kind}");
                let value = self.u32();
                let mask = self.u32();
                Target::Mark(match kind {
                    0 => MarkOp::SetXmark { value, mask },
                    1 => MarkOp::SetMark { value, mask },
                    2 => MarkOp::Or(value),
                    3 => MarkOp::Xor(value),
                    _ => MarkOp::And(value),
                })
            }
            T_CONNMARK => Target::Connmark(self.list()),
            T_REJECT => Target::Reject {
                with: self.opt_str(),
            },
            T_LOG => Target::Log(self.list()),
            T_TRACE => Target::Trace,
            T_NOTRACK => Target::Notrack,
            T_CT => Target::Ct(self.list()),
            T_GENERIC => Target::Generic {
                name: self.str(),
                options: self.list(),
            },
            tag => {
                debug_assert_eq!(tag, T_UNREADABLE, "target tag");
                let reason = UNREADABLE_REASONS.get(usize::from(self.u8())).copied();
                debug_assert!(reason.is_some(), "unreadable-target reason out of range");
                let reason = reason.unwrap_or(UNREADABLE_REASONS[0]);
                Target::Unreadable {
                    raw: self.str(),
                    reason,
                }
            }
        }
    }
}

/// Where the parts of a rule's code are (from its fixed header).
#[derive(Debug, Clone, Copy)]
struct Layout {
    flags: u8,
    /// Start of the target record (right after the header).
    target: usize,
    matches: usize,
    options: usize,
    counters: usize,
}

#[inline]
fn layout(code: &[u8]) -> Layout {
    debug_assert!(!code.is_empty(), "a rule's code has a header");
    let flags = code.first().copied().unwrap_or(0);
    let at = |i: usize| -> usize {
        if flags & WIDE != 0 {
            let lo = code.get(1 + 2 * i).copied().unwrap_or(0);
            let hi = code.get(2 + 2 * i).copied().unwrap_or(0);
            usize::from(u16::from_le_bytes([lo, hi]))
        } else {
            usize::from(code.get(1 + i).copied().unwrap_or(0))
        }
    };
    Layout {
        flags,
        target: if flags & WIDE != 0 { 7 } else { 4 },
        matches: at(0),
        options: at(1),
        counters: at(2),
    }
}

#[inline]
pub(crate) fn counters(code: &[u8]) -> Option<Counters> {
    let l = layout(code);
    if l.flags & HAS_COUNTERS == 0 {
        return None;
    }
    let mut d = Dec {
        raw: "",
        code,
        pos: l.counters,
    };
    Some(Counters {
        packets: d.var(),
        bytes: d.var(),
    })
}

#[inline]
pub(crate) fn unconditional(code: &[u8]) -> bool {
    code.first().is_some_and(|f| f & UNCONDITIONAL != 0)
}

#[inline]
pub(crate) fn target<'a>(raw: &'a str, code: &[u8]) -> Option<Target<'a>> {
    let l = layout(code);
    (l.flags & HAS_TARGET != 0).then(|| {
        Dec {
            raw,
            code,
            pos: l.target,
        }
        .target()
    })
}

#[inline]
pub(crate) fn target_kind(code: &[u8]) -> Option<TargetKind> {
    let l = layout(code);
    if l.flags & HAS_TARGET == 0 {
        return None;
    }
    let tag = code.get(l.target).copied();
    debug_assert!(tag.is_some(), "target past the end of the code");
    Some(match tag.unwrap_or(T_UNREADABLE) {
        T_JUMP => TargetKind::Jump,
        T_GOTO => TargetKind::Goto,
        T_ACCEPT => TargetKind::Accept,
        T_DROP => TargetKind::Drop,
        T_RETURN => TargetKind::Return,
        T_DNAT => TargetKind::Dnat,
        T_SNAT => TargetKind::Snat,
        T_MASQUERADE => TargetKind::Masquerade,
        T_MARK => TargetKind::Mark,
        T_CONNMARK => TargetKind::Connmark,
        T_REJECT => TargetKind::Reject,
        T_LOG => TargetKind::Log,
        T_TRACE => TargetKind::Trace,
        T_NOTRACK => TargetKind::Notrack,
        T_CT => TargetKind::Ct,
        T_GENERIC => TargetKind::Generic,
        _ => TargetKind::Unreadable,
    })
}

#[inline]
pub(crate) fn jump_target<'a>(raw: &'a str, code: &[u8]) -> Option<&'a str> {
    let l = layout(code);
    if l.flags & HAS_TARGET == 0 {
        return None;
    }
    let mut d = Dec {
        raw,
        code,
        pos: l.target,
    };
    matches!(d.u8(), T_JUMP | T_GOTO).then(|| d.str())
}

#[inline]
pub(crate) fn matches<'r, 'a>(raw: &'a str, code: &'r [u8]) -> Matches<'r, 'a> {
    let l = layout(code);
    let mut d = Dec {
        raw,
        code,
        pos: l.matches,
    };
    // Every record takes a byte at least: a count beyond the code's end is not a valid encoding.
    let left = (d.offset() as u32).min(code.len().saturating_sub(d.pos) as u32);
    Matches {
        raw,
        code,
        pos: d.pos,
        left,
    }
}

#[inline]
pub(crate) fn next_match<'a>(it: &mut Matches<'_, 'a>) -> Option<Match<'a>> {
    let mut d = Dec {
        raw: it.raw,
        code: it.code,
        pos: it.pos,
    };
    if d.pos >= d.code.len() {
        it.left = 0;
        return None;
    }
    let (tag, len) = d.record();
    let end = d.pos + len;
    let m = d.matcher(tag);
    it.pos = end;
    Some(m)
}

/// The first match record with tag `want` (skipping the others undecoded), decoded by `read`.
#[inline]
fn find_record<'a, T>(
    raw: &'a str,
    code: &[u8],
    mut want: impl FnMut(u8, &mut Dec<'_, 'a>) -> Option<T>,
) -> Option<T> {
    let it = matches(raw, code);
    let mut d = Dec {
        raw,
        code,
        pos: it.pos,
    };
    for _ in 0..it.left {
        if d.pos >= code.len() {
            break;
        }
        let (tag, len) = d.record();
        let end = d.pos + len;
        if let Some(found) = want(tag, &mut d) {
            return Some(found);
        }
        d.pos = end;
    }
    None
}

#[inline]
pub(crate) fn comment<'a>(raw: &'a str, code: &[u8]) -> Option<Text<'a>> {
    find_record(raw, code, |tag, d| {
        (tag == M_COMMENT).then(|| {
            let escaped = d.u8() != 0;
            Text {
                raw: d.str(),
                escaped,
            }
        })
    })
}

#[inline]
pub(crate) fn protocol<'a>(raw: &'a str, code: &[u8]) -> Option<&'a str> {
    let mut module = None;
    let proto = find_record(raw, code, |tag, d| match tag {
        M_PROTOCOL => {
            let n = d.neg_str();
            (!n.negated).then_some(n.value)
        }
        M_PORTS => {
            if module.is_none() {
                module = Some(d.str());
            }
            None
        }
        _ => None,
    });
    proto.or(module)
}

pub(crate) fn options<'r, 'a>(raw: &'a str, code: &'r [u8], list: OptList) -> Options<'r, 'a> {
    let pos = layout(code).options.saturating_add(list.at as usize);
    Options {
        raw,
        code,
        pos,
        left: list.len.min(code.len().saturating_sub(pos) as u32),
    }
}

pub(crate) fn next_option<'a>(it: &mut Options<'_, 'a>) -> Option<GenericOpt<'a>> {
    let mut d = Dec {
        raw: it.raw,
        code: it.code,
        pos: it.pos,
    };
    if d.pos >= d.code.len() {
        it.left = 0;
        return None;
    }
    let negated = d.u8() != 0;
    let name = d.str();
    let values = Words { raw: d.str() };
    it.pos = d.pos;
    Some(GenericOpt {
        negated,
        name,
        values,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        for v in [
            0u64,
            1,
            127,
            128,
            300,
            16_383,
            16_384,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut bytes = [0u8; 10];
            let buf = varint_into(&mut bytes, v).to_vec();
            let mut d = Dec {
                raw: "",
                code: &buf,
                pos: 0,
            };
            assert_eq!(d.var(), v);
            assert_eq!(d.pos, buf.len());
        }
    }

    /// Bytes that are no encoding: a release build decodes them as empty values without
    /// panicking; a debug build (the tests, the fuzzers) stops at a debug assertion.
    #[test]
    fn garbage_code_is_caught_in_debug_and_harmless_in_release() {
        let raw = "-j ACCEPT";
        for code in [
            &[][..],
            &[0xff],
            &[0xff, 0xff, 0xff, 0xff],
            &[3, 1, 2, 5, 200, 200, 200],
            &[2, 9, 5, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
            &[0, 5, 255, 19, 200, 1, 7, 7],
        ] {
            let decoded = std::panic::catch_unwind(|| {
                let _ = counters(code);
                let _ = target(raw, code);
                let _ = jump_target(raw, code);
                let ms: Vec<_> = matches(raw, code).collect();
                for m in ms {
                    if let Match::Module(Module::Generic { options: l, .. }) = m {
                        let _: Vec<_> = options(raw, code, l).collect();
                    }
                }
            });
            assert_eq!(
                decoded.is_err(),
                cfg!(debug_assertions),
                "{code:?}: a debug build must assert, a release build must not panic"
            );
        }
    }
}
