//! `iptables -L` listings (`-L`, `-L -n`, `-L -n -v [-x]`, `--line-numbers`, and the `ip6tables`
//! forms): recognised, so that strict reading can say what the input is, and read back
//! best-effort into `iptables -S` text for [`parse_dump`](super::parse_dump).
//!
//! Syntax (iptables(8) `-L`, as iptables 1.4–1.8 print it, both backends):
//!
//! ```text
//! listing = { chain | blank-line | other-line }
//! chain   = header columns { row }
//! header  = "Chain " NAME " (" ( "policy " POLICY [ " " N " packets, " N " bytes" ]
//!                              | N " references" ) ")"
//! columns = [ "num" ] [ "pkts bytes" ] "target prot opt" [ "in out" ] "source destination"
//! row     = [ NUM ] [ COUNT COUNT ] [ TARGET ] PROT [ OPT ] [ IFACE IFACE ] ADDR ADDR { extra }
//! COUNT   = 1*DIGIT [ "K" | "M" | "G" | "T" | "P" ]   ; suffixed unless -x
//! PROT    = [ "!" ] ( NAME | NUMBER )                 ; "all", "tcp", or "0", "6" (nft -n)
//! OPT     = "--" | "-f" | "!f"                         ; absent in older ip6tables
//! ADDR    = [ "!" ] ( "anywhere" | ADDRESS [ "/" MASK ] | NAME [ "/" MASK ] )
//! extra   = "/* " COMMENT " */" | "tcp" { "dpt:" PORT … } | "statistic mode random …"
//!         | "to:" RANGE | "ADDRTYPE match …" | "MARK or 0x4000" | …   ; one per match/target
//! ```
//!
//! The conversion keeps the line count: line N of the result is line N of the listing (`Chain`
//! lines become `-P`/`-N`, rows become `-A`, everything else a blank line), so the rules' line
//! numbers and any warning of the parser point into the listing as pasted. What a listing does not
//! show cannot come back: interfaces and counters without `-v`, exact counters without `-x`,
//! options the match's print function leaves out; extras that have no mapping here are dropped
//! and counted by kind in [`Listing::dropped`].

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use super::values;
use crate::error::ParseError;

/// The columns a listing shows, from its column header line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ListingShape {
    /// `--line-numbers`: a `num` column.
    pub line_numbers: bool,
    /// `-v`: `pkts bytes` counters and `in out` interface columns.
    pub verbose: bool,
    /// `opt` is in the header (every iptables; older ip6tables print it but leave rows blank).
    pub opt: bool,
}

/// Where the listing's table came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSource {
    /// The caller's table (`iptables -t nat -L`).
    Given,
    /// The listing's built-in chains name exactly one table.
    BuiltinChains,
    /// Guessed from chain and target names (a partial listing, no table given).
    Guessed,
}

/// An `iptables -L` listing read back into `iptables -S` text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// `iptables -S [-v]` text for [`Listing::table`], one line per listing line.
    pub text: String,
    /// The table the rules are read into.
    pub table: &'static str,
    /// How [`Listing::table`] was chosen.
    pub table_source: TableSource,
    /// The columns of the first chain.
    pub shape: ListingShape,
    /// Whether names were printed (no `-n`): `anywhere`, service and host names.
    pub names: bool,
    /// Extras and values that could not be read back, by kind, with how many were dropped.
    pub dropped: BTreeMap<String, usize>,
    /// One-line warnings for the user: how lossy the reading is and what was dropped.
    pub notes: Vec<String>,
}

/// The built-in chains of each table (iptables(8) "TABLES"), in preference order when several
/// tables hold the chains a partial listing shows.
const BUILTINS: [(&str, &[&str]); 5] = [
    ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
    ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
    ("raw", &["PREROUTING", "OUTPUT"]),
    (
        "mangle",
        &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"],
    ),
    ("security", &["INPUT", "FORWARD", "OUTPUT"]),
];

/// Port names `iptables -L` prints without `-n` (getservbyport(3) over netbase's
/// `/etc/services`, the file of Debian and Ubuntu nodes), as `name:port`.
const SERVICES: &str = "\
    tcpmux:1 echo:7 discard:9 systat:11 daytime:13 netstat:15 qotd:17 chargen:19 ftp-data:20
    ftp:21 fsp:21 ssh:22 telnet:23 smtp:25 time:37 whois:43 tacacs:49 domain:53 bootps:67
    bootpc:68 tftp:69 gopher:70 finger:79 http:80 kerberos:88 iso-tsap:102 acr-nema:104
    pop3:110 sunrpc:111 auth:113 nntp:119 ntp:123 epmap:135 netbios-ns:137 netbios-dgm:138
    netbios-ssn:139 imap2:143 snmp:161 snmp-trap:162 cmip-man:163 cmip-agent:164 mailq:174
    xdmcp:177 bgp:179 smux:199 qmtp:209 z3950:210 ipx:213 ptp-event:319 ptp-general:320
    pawserv:345 zserv:346 rpc2portmap:369 codaauth2:370 clearcase:371 ldap:389 svrloc:427
    https:443 snpp:444 microsoft-ds:445 kpasswd:464 submissions:465 saft:487 isakmp:500
    rtsp:554 nqs:607 asf-rmcp:623 qmqp:628 ipp:631 ldp:646 exec:512 biff:512 login:513
    who:513 shell:514 syslog:514 printer:515 talk:517 ntalk:518 route:520 gdomap:538
    uucp:540 klogin:543 kshell:544 dhcpv6-client:546 dhcpv6-server:547 afpovertcp:548
    nntps:563 submission:587 ldaps:636 tinc:655 silc:706 kerberos-adm:749 domain-s:853
    rsync:873 ftps-data:989 ftps:990 telnets:992 imaps:993 pop3s:995 socks:1080
    proofd:1093 rootd:1094 openvpn:1194 rmiregistry:1099 lotusnote:1352 ms-sql-s:1433
    ms-sql-m:1434 ingreslock:1524 datametrics:1645 sa-msg-port:1646 kermit:1649 groupwise:1677
    l2f:1701 radius:1812 radius-acct:1813 cisco-sccp:2000 nfs:2049 gnunet:2086 rtcm-sc104:2101
    gsigatekeeper:2119 gris:2135 cvspserver:2401 venus:2430 venus-se:2431 codasrv:2432
    codasrv-se:2433 mon:2583 dict:2628 f5-globalsite:2792 gsiftp:2811 gpsd:2947 gds-db:3050
    icpv2:3130 isns:3205 iscsi-target:3260 mysql:3306 ms-wbt-server:3389 nut:3493
    distcc:3632 daap:3689 svn:3690 suucp:4031 sysrqd:4094 sieve:4190 epmd:4369
    remctl:4373 f5-iquery:4353 ntske:4460 ipsec-nat-t:4500 iax:4569 mtn:4691 radmin-port:4899
    sip:5060 sip-tls:5061 xmpp-client:5222 xmpp-server:5269 cfengine:5308 mdns:5353
    postgresql:5432 freeciv:5556 amqps:5671 amqp:5672 mysql-proxy:6446 x11:6000 x11-1:6001
    x11-2:6002 x11-3:6003 x11-4:6004 x11-5:6005 x11-6:6006 x11-7:6007 gnutella-svc:6346
    gnutella-rtr:6347 redis:6379 sge-qmaster:6444 sge-execd:6445 babel:6696 ircs-u:6697
    bbs:7000 afs3-fileserver:7000 afs3-callback:7001 afs3-prserver:7002 afs3-vlserver:7003
    afs3-kaserver:7004 afs3-volser:7005 afs3-bos:7007 afs3-update:7008 afs3-rmtsys:7009
    font-service:7100 http-alt:8080 puppet:8140 bacula-dir:9101 bacula-fd:9102 bacula-sd:9103
    xmms2:9667 nbd:10809 zabbix-agent:10050 zabbix-trapper:10051 amanda:10080
    dicom:11112 hkp:11371 db-lsp:17500 dcap:22125 gsidcap:22128 wnn6:22273 kerberos4:750
    kerberos-master:751 passwd-server:752 krb-prop:754 zephyr-srv:2102 zephyr-clt:2103
    zephyr-hm:2104 iprop:2121 supfilesrv:871 supfiledbg:1127 poppassd:106 moira-db:775
    moira-update:777 moira-ureg:779 spamd:783 skkserv:1178 predict:1210 rmtcfg:1236
    xtel:1313 xtelw:1314 support:1529 cfinger:2003 frox:2121 zebrasrv:2600 zebra:2601
    ripd:2602 ripngd:2603 ospfd:2604 bgpd:2605 ospf6d:2606 ospfapi:2607 isisd:2608
    fax:4557 hylafax:4559 munin:4949 rplay:5555 nrpe:5666 nsca:5667 canna:5680
    syslog-tls:6514 sane-port:6566 ircd:6667 zope-ftp:8021 tproxy:8081 omniorb:8088
    clc-build-daemon:8990 xinetd:9098 git:9418 zope:9673 webmin:10000 kamanda:10081
    amandaidx:10082 amidxtape:10083 sgi-cmsd:17001 sgi-crsd:17002 sgi-gcd:17003
    sgi-cad:17004 binkp:24554 asp:27374 csync2:30865 dircproxy:57000 tfido:60177 fido:60179";

/// The port of a service name `iptables -L` printed, or of a number.
fn service_port(name: &str) -> Option<u16> {
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) {
        return name.parse().ok();
    }
    SERVICES
        .split_ascii_whitespace()
        .filter_map(|e| e.split_once(':'))
        .find(|(n, _)| *n == name)
        .and_then(|(_, p)| p.parse().ok())
}

/// Host and network names `iptables -L` prints without `-n` that are the same on every node
/// (`/etc/hosts`, `/etc/networks` of common distributions); others depend on the node's resolver.
fn well_known_host(name: &str, v6: bool) -> Option<&'static str> {
    Some(match name {
        "localhost" if v6 => "::1",
        "localhost" => "127.0.0.1",
        "ip6-localhost" | "ip6-loopback" => "::1",
        "loopback" => "127.0.0.0",
        "link-local" => "169.254.0.0",
        "default" => "0.0.0.0",
        _ => return None,
    })
}

/// `Chain NAME (policy P[ N packets, N bytes])` or `Chain NAME (N references)`: the name and,
/// for a built-in chain, its policy and counters (as printed).
struct ChainHeader<'a> {
    name: &'a str,
    policy: Option<&'a str>,
    counters: Option<(&'a str, &'a str)>,
}

fn chain_header(line: &str) -> Option<ChainHeader<'_>> {
    let rest = line.trim().strip_prefix("Chain ")?;
    let (name, rest) = rest.split_once(' ')?;
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    let words: Vec<&str> = inner.split_ascii_whitespace().collect();
    // iptables refuses chain names of XT_EXTENSION_MAXNAMELEN (29) bytes or more; the name is
    // written on every rule line of the chain, so a longer one is not a chain header.
    if name.is_empty() || name.len() > 28 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return None;
    }
    match words.as_slice() {
        ["policy", p] => Some(ChainHeader {
            name,
            policy: Some(p),
            counters: None,
        }),
        ["policy", p, packets, "packets,", bytes, "bytes"] => Some(ChainHeader {
            name,
            policy: Some(p),
            counters: Some((packets, bytes)),
        }),
        [n, "references" | "reference"] if n.bytes().all(|b| b.is_ascii_digit()) => {
            Some(ChainHeader {
                name,
                policy: None,
                counters: None,
            })
        }
        _ => None,
    }
}

/// The column header line (`[num] [pkts bytes] target prot opt [in out] source destination`).
fn column_header(line: &str) -> Option<ListingShape> {
    let words: Vec<&str> = line.split_ascii_whitespace().collect();
    let mut i = 0;
    let mut shape = ListingShape::default();
    if words.first() == Some(&"num") {
        shape.line_numbers = true;
        i += 1;
    }
    if words.get(i..i + 2) == Some(&["pkts", "bytes"]) {
        shape.verbose = true;
        i += 2;
    }
    if words.get(i..i + 2) != Some(&["target", "prot"]) {
        return None;
    }
    i += 2;
    if words.get(i) == Some(&"opt") {
        shape.opt = true;
        i += 1;
    }
    if shape.verbose {
        if words.get(i..i + 2) != Some(&["in", "out"]) {
            return None;
        }
        i += 2;
    }
    (words.get(i..) == Some(&["source", "destination"])).then_some(shape)
}

/// Whether a line belongs to another input form (save, restore, `-S`), which a listing never holds.
fn is_other_form(body: &str) -> bool {
    body.starts_with('*')
        || body.starts_with(':')
        || body == "COMMIT"
        || ["-A ", "-I ", "-N ", "-P ", "-X", "-F"]
            .iter()
            .any(|p| body.starts_with(p))
}

/// Where a listing is in `text`: the shape of its first column header and the lines of its first
/// and last chain content (1-based).
fn scan(text: &str) -> Option<(ListingShape, u32, u32)> {
    let mut found: Option<(ListingShape, u32, u32)> = None;
    let mut after_chain: Option<u32> = None;
    for (n, line) in text.split('\n').enumerate() {
        let line_no = u32::try_from(n + 1).unwrap_or(u32::MAX);
        let body = line.trim();
        if is_other_form(body) {
            return None;
        }
        if body.is_empty() {
            continue;
        }
        if let Some(chain_line) = after_chain.take()
            && let Some(shape) = column_header(body)
        {
            match &mut found {
                None => found = Some((shape, chain_line, line_no)),
                Some((_, _, last)) => *last = line_no,
            }
            continue;
        }
        if chain_header(body).is_some() {
            after_chain = Some(line_no);
        } else if let Some((_, _, last)) = &mut found {
            *last = line_no;
        }
    }
    found
}

/// Whether `text` is an `iptables -L` listing (and not save, restore or `-S` text): the shape of
/// its first chain's columns.
pub fn looks_like_listing(text: &str) -> Option<ListingShape> {
    scan(text).map(|(shape, _, _)| shape)
}

/// Turns a strict parse error on `text` into one that says the text is an `iptables -L` listing,
/// when it is one and the error is in it; other errors are returned unchanged.
pub fn explain(err: ParseError, text: &str) -> ParseError {
    match scan(text) {
        Some((_, _, last)) if (1..=last).contains(&err.line) => ParseError {
            expected: "`iptables-save` or `iptables -S` output".to_string(),
            found: "`iptables -L` output (`iptables-save`, or `iptables -t nat -S`, keeps what \
                    kproxy needs; pass --lenient to read this listing best-effort)"
                .to_string(),
            ..err
        },
        _ => err,
    }
}

/// A counter as `-v` prints it: a number, with a unit suffix unless `-x` (`463K`, `1733M`).
/// Returns the value and whether it was rounded.
fn count(word: &str) -> Option<(u64, bool)> {
    let (digits, scale) = match word.as_bytes().last()? {
        b'K' => (&word[..word.len() - 1], 1_000u64),
        b'M' => (&word[..word.len() - 1], 1_000_000),
        b'G' => (&word[..word.len() - 1], 1_000_000_000),
        b'T' => (&word[..word.len() - 1], 1_000_000_000_000),
        b'P' => (&word[..word.len() - 1], 1_000_000_000_000_000),
        _ => (word, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some((n.saturating_mul(scale), scale > 1))
}

/// `OPT`: the fragment column.
fn is_opt(word: &str) -> bool {
    matches!(word, "--" | "-f" | "!f")
}

/// `PROT`: a protocol name or number as the `prot` column prints it.
fn is_protocol(word: &str) -> bool {
    let w = word.strip_prefix('!').unwrap_or(word);
    !w.is_empty()
        && (w.bytes().all(|b| b.is_ascii_digit())
            || matches!(
                w,
                "all"
                    | "tcp"
                    | "udp"
                    | "udplite"
                    | "sctp"
                    | "dccp"
                    | "icmp"
                    | "icmpv6"
                    | "ipv6-icmp"
                    | "esp"
                    | "ah"
                    | "gre"
                    | "mh"
                    | "ipv6-mh"
            ))
}

/// The `-p` value of a `prot` column word: `None` for all protocols.
fn protocol(word: &str) -> Option<(bool, String)> {
    let (neg, w) = match word.strip_prefix('!') {
        Some(w) => (true, w),
        None => (false, word),
    };
    let name = match w {
        "all" | "0" => return None,
        "6" => "tcp",
        "17" => "udp",
        "132" => "sctp",
        "33" => "dccp",
        "136" => "udplite",
        "1" => "icmp",
        "58" => "ipv6-icmp",
        other => other,
    };
    Some((neg, name.to_string()))
}

/// Whether a word can be written into the `-S` text as one bare word.
fn is_plain(word: &str) -> bool {
    !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\'' && b != b'\\')
}

/// Writes `s` as a double-quoted word (`\"` and `\\` escaped, as iptables-save writes comments).
fn push_quoted(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

/// The words of a row's extras, with the comment (`/* … */`) and quoted words kept whole.
struct Extras<'a> {
    rest: &'a str,
}

impl<'a> Extras<'a> {
    fn trim(&mut self) {
        self.rest = self.rest.trim_start();
    }

    /// The comment's text if the extras continue with one.
    fn comment(&mut self) -> Option<&'a str> {
        self.trim();
        let body = self.rest.strip_prefix("/* ")?;
        let end = body.find(" */")?;
        self.rest = &body[end + 3..];
        Some(&body[..end])
    }

    fn peek(&self) -> Option<&'a str> {
        self.rest.split_ascii_whitespace().next()
    }

    fn next(&mut self) -> Option<&'a str> {
        self.trim();
        if self.rest.is_empty() {
            return None;
        }
        if self.rest.starts_with('"') {
            // A quoted value (a LOG prefix): up to the closing quote.
            let end = self.rest[1..].find('"').map_or(self.rest.len(), |i| i + 2);
            let (w, r) = self.rest.split_at(end);
            self.rest = r;
            return Some(w);
        }
        let end = self
            .rest
            .find(|c: char| c.is_ascii_whitespace())
            .unwrap_or(self.rest.len());
        let (w, r) = self.rest.split_at(end);
        self.rest = r;
        Some(w)
    }
}

/// Words that start an extra this reader knows; an unknown extra ends before the next of them.
fn starts_extra(word: &str) -> bool {
    word.starts_with("/*")
        || word.starts_with("to:")
        || matches!(
            word,
            "[goto]"
                | "tcp"
                | "udp"
                | "sctp"
                | "multiport"
                | "statistic"
                | "ADDRTYPE"
                | "MARK"
                | "mark"
                | "ctstate"
                | "state"
                | "recent:"
                | "reject-with"
                | "random-fully"
                | "random"
                | "persistent"
                | "masq"
                | "redir"
                | "match-set"
                | "nfacct-name"
        )
}

/// Targets of iptables itself (iptables-extensions(8) "TARGET EXTENSIONS" and the verdicts);
/// any other target is a user chain.
const STANDARD_TARGETS: [&str; 42] = [
    "ACCEPT",
    "DROP",
    "RETURN",
    "QUEUE",
    "AUDIT",
    "CHECKSUM",
    "CLASSIFY",
    "CLUSTERIP",
    "CONNMARK",
    "CONNSECMARK",
    "CT",
    "DNAT",
    "DNPT",
    "DSCP",
    "ECN",
    "HL",
    "HMARK",
    "IDLETIMER",
    "LED",
    "LOG",
    "MARK",
    "MASQUERADE",
    "NETMAP",
    "NFLOG",
    "NFQUEUE",
    "NOTRACK",
    "RATEEST",
    "REDIRECT",
    "REJECT",
    "SECMARK",
    "SET",
    "SNAT",
    "SNPT",
    "SYNPROXY",
    "TCPMSS",
    "TCPOPTSTRIP",
    "TEE",
    "TOS",
    "TPROXY",
    "TRACE",
    "TTL",
    "ULOG",
];

/// A kind of dropped part for the notes: its first 32 characters.
fn kind_name(s: &str) -> String {
    s.chars().take(32).collect()
}

/// One row being written as an `-A` line.
struct RowOut<'a> {
    target: &'a str,
    goto: bool,
    matches: String,
    target_opts: String,
}

/// The converter's state over a whole listing.
struct Reader {
    v6: bool,
    names: bool,
    rounded: bool,
    hosts: BTreeMap<String, usize>,
    unknown_services: BTreeMap<String, usize>,
    dropped: BTreeMap<String, usize>,
    /// Targets that are not iptables' own: chains the listing should show.
    jumps: std::collections::BTreeSet<String>,
}

impl Reader {
    fn drop(&mut self, kind: &str) {
        *self.dropped.entry(kind.to_string()).or_default() += 1;
    }

    /// An address column as `[!] FLAG ADDR` words appended to `out`; nothing for any address, and
    /// nothing (recorded) for a host name that cannot be read back.
    fn address(&mut self, word: &str, flag: &str, out: &mut String) {
        let (neg, w) = match word.strip_prefix('!') {
            Some(w) => (true, w),
            None => (false, word),
        };
        if matches!(w, "anywhere" | "0.0.0.0/0" | "::/0") && !neg {
            if w == "anywhere" {
                self.names = true;
            }
            return;
        }
        let value = if values::addr_spec(w).is_some() {
            w.to_string()
        } else {
            let (host, mask) = match w.split_once('/') {
                Some((h, m)) => (h, Some(m)),
                None => (w, None),
            };
            self.names = true;
            let any = host == "anywhere";
            match well_known_host(host, self.v6) {
                Some(a) => match mask {
                    Some(m) => format!("{a}/{m}"),
                    None => a.to_string(),
                },
                None if any && self.v6 => "::/0".to_string(),
                None if any => "0.0.0.0/0".to_string(),
                None => {
                    *self.hosts.entry(host.to_string()).or_default() += 1;
                    return;
                }
            }
        };
        if values::addr_spec(&value).is_none() {
            self.drop("address");
            return;
        }
        if neg {
            out.push_str(" !");
        }
        let _ = write!(out, " {flag} {value}");
    }

    /// An interface column (`-v`) as `[!] FLAG IFACE` words appended to `out`; `*` is any.
    fn interface(&mut self, word: &str, flag: &str, out: &mut String) {
        let (neg, w) = match word.strip_prefix('!') {
            Some(w) => (true, w),
            None => (false, word),
        };
        if w == "*" || (w.is_empty() && !neg) {
            return;
        }
        if !is_plain(w) {
            self.drop("interface");
            return;
        }
        if neg {
            out.push_str(" !");
        }
        let _ = write!(out, " {flag} {w}");
    }

    /// A port or range word (`80`, `http`, `1000:2000`) as `--dport` takes it; `None` (with the
    /// reason recorded) when it cannot be read back.
    fn ports(&mut self, word: &str) -> Option<String> {
        let mut out = String::new();
        for (i, part) in word.split(':').enumerate() {
            if i > 1 {
                self.drop("port");
                return None;
            }
            if i == 1 {
                out.push(':');
            }
            if part.is_empty() {
                continue;
            }
            let Some(port) = service_port(part) else {
                if part.bytes().all(|b| b.is_ascii_digit()) || !is_plain(part) {
                    self.drop("port");
                } else {
                    *self.unknown_services.entry(part.to_string()).or_default() += 1;
                }
                return None;
            };
            if !part.bytes().all(|b| b.is_ascii_digit()) {
                self.names = true;
            }
            let _ = write!(out, "{port}");
        }
        if values::port_range(&out).is_none() {
            self.drop("port");
            return None;
        }
        Some(out)
    }

    /// A `multiport` list (`80,443,8000:http-alt`).
    fn port_list(&mut self, word: &str) -> Option<String> {
        let items: Option<Vec<String>> = word.split(',').map(|p| self.ports(p)).collect();
        Some(items?.join(","))
    }

    /// The extras of one row.
    fn extras(&mut self, text: &str, row: &mut RowOut<'_>) {
        let mut ex = Extras { rest: text };
        let mut negated = false;
        loop {
            if let Some(c) = ex.comment() {
                row.matches.push_str(" -m comment --comment ");
                push_quoted(&mut row.matches, c);
                continue;
            }
            let Some(word) = ex.next() else { break };
            if word == "!" {
                negated = true;
                continue;
            }
            let not = std::mem::take(&mut negated);
            if let Err(kind) = self.extra(word, not, &mut ex, row) {
                self.drop(&kind);
                // Skip the rest of this extra: up to the next word that starts a known one.
                while let Some(w) = ex.peek() {
                    if starts_extra(w) || w == "!" || w == row.target {
                        break;
                    }
                    ex.next();
                }
            }
        }
    }

    /// One extra starting with `word` (negated by a preceding `!` when `not`). `Err(kind)` when
    /// it cannot be read back.
    fn extra(
        &mut self,
        word: &str,
        not: bool,
        ex: &mut Extras<'_>,
        row: &mut RowOut<'_>,
    ) -> Result<(), String> {
        let bang = if not { " !" } else { "" };
        let value = |ex: &mut Extras<'_>, what: &str| -> Result<String, String> {
            ex.next()
                .filter(|w| is_plain(w))
                .map(str::to_string)
                .ok_or_else(|| what.to_string())
        };
        match word {
            "[goto]" => row.goto = true,
            "tcp" | "udp" | "sctp" => {
                let mut opts = String::new();
                while let Some(w) = ex.peek() {
                    let (name, rest) = match w.split_once(':') {
                        Some((n @ ("spt" | "dpt" | "spts" | "dpts"), r)) => (n, r),
                        _ => break,
                    };
                    ex.next();
                    let (neg, ports) = match rest.strip_prefix('!') {
                        Some(r) => (" !", r),
                        None => ("", rest),
                    };
                    let flag = if name.starts_with('s') {
                        "--sport"
                    } else {
                        "--dport"
                    };
                    let Some(p) = self.ports(ports) else {
                        continue;
                    };
                    let _ = write!(opts, "{neg} {flag} {p}");
                }
                // `flags:0x06/0x02`, `option=2`: not read back.
                if let Some(w) = ex.peek()
                    && (w.starts_with("flags:") || w.starts_with("option="))
                {
                    let name = w.split([':', '=']).next().unwrap_or(w);
                    self.drop(&format!("{word} {name}"));
                    ex.next();
                }
                let _ = write!(row.matches, " -m {word}{opts}");
            }
            "multiport" => {
                let kind = ex
                    .next()
                    .filter(|k| matches!(*k, "dports" | "sports" | "ports"))
                    .ok_or("multiport")?;
                let mut list = ex.next().ok_or("multiport")?;
                let mut neg = not;
                if list == "!" {
                    neg = true;
                    list = ex.next().ok_or("multiport")?;
                } else if let Some(l) = list.strip_prefix('!') {
                    neg = true;
                    list = l;
                }
                // A port that cannot be read back is recorded by `ports`: the match goes.
                let Some(ports) = self.port_list(list) else {
                    return Ok(());
                };
                let bang = if neg { " !" } else { "" };
                let _ = write!(row.matches, " -m multiport{bang} --{kind} {ports}");
            }
            "statistic" => {
                if ex.next() != Some("mode") {
                    return Err("statistic".to_string());
                }
                if ex.peek() != Some("random") {
                    let mode = ex.peek().filter(|m| is_plain(m)).unwrap_or("?");
                    return Err(kind_name(&format!("statistic mode {mode}")));
                }
                ex.next();
                let mut neg = not;
                if ex.peek() == Some("!") {
                    ex.next();
                    neg = true;
                }
                if ex.next() != Some("probability") {
                    return Err("statistic".to_string());
                }
                let p = value(ex, "statistic")?;
                if !p.parse::<f64>().is_ok_and(|v| (0.0..=1.0).contains(&v)) {
                    return Err("statistic".to_string());
                }
                let bang = if neg { " !" } else { "" };
                let _ = write!(
                    row.matches,
                    " -m statistic --mode random{bang} --probability {p}"
                );
            }
            "ADDRTYPE" => {
                if ex.next() != Some("match") {
                    return Err("ADDRTYPE".to_string());
                }
                let mut opts = String::new();
                while let Some(w) = ex.peek() {
                    match w {
                        "src-type" | "dst-type" => {
                            ex.next();
                            let t = value(ex, "ADDRTYPE")?;
                            let (neg, t) = match t.strip_prefix('!') {
                                Some(t) => (" !", t),
                                None => ("", t.as_str()),
                            };
                            if t.is_empty() {
                                return Err("ADDRTYPE".to_string());
                            }
                            let _ = write!(opts, "{neg} --{w} {t}");
                        }
                        "limit-in" | "limit-out" => {
                            ex.next();
                            let dir = &w[6..];
                            let _ = write!(opts, " --limit-iface-{dir}");
                        }
                        _ => break,
                    }
                }
                if opts.is_empty() {
                    return Err("ADDRTYPE".to_string());
                }
                let _ = write!(row.matches, " -m addrtype{opts}");
            }
            "MARK" if row.target == "MARK" => {
                let op = ex.next().ok_or("MARK")?;
                let v = value(ex, "MARK")?;
                let (value, mask) = match op {
                    "xset" => {
                        let m = values::mark_value(&v).ok_or("MARK")?;
                        (m.value, m.mask.unwrap_or(u32::MAX))
                    }
                    _ => {
                        let n = values::number(&v).ok_or("MARK")?;
                        match op {
                            "or" => (n, n),
                            "xor" => (n, 0),
                            "and" => (0, !n),
                            "set" => (n, u32::MAX),
                            _ => return Err("MARK".to_string()),
                        }
                    }
                };
                let _ = write!(row.target_opts, " --set-xmark {value:#x}/{mask:#x}");
            }
            "mark" => {
                if ex.next() != Some("match") {
                    return Err("mark".to_string());
                }
                let mut neg = not;
                let mut v = value(ex, "mark")?;
                if v == "!" {
                    neg = true;
                    v = value(ex, "mark")?;
                }
                values::mark_value(&v).ok_or("mark")?;
                let bang = if neg { " !" } else { "" };
                let _ = write!(row.matches, " -m mark{bang} --mark {v}");
            }
            "ctstate" | "state" => {
                let states = value(ex, word)?;
                if !states.bytes().all(|b| b.is_ascii_uppercase() || b == b',') {
                    return Err(word.to_string());
                }
                let (module, flag) = if word == "state" {
                    ("state", "--state")
                } else {
                    ("conntrack", "--ctstate")
                };
                let _ = write!(row.matches, " -m {module}{bang} {flag} {states}");
            }
            "recent:" => self.recent(bang, ex, row)?,
            "reject-with" if row.target == "REJECT" => {
                let t = value(ex, "reject-with")?;
                let _ = write!(row.target_opts, " --reject-with {t}");
            }
            "random-fully" | "random" | "persistent"
                if matches!(row.target, "MASQUERADE" | "SNAT" | "DNAT" | "REDIRECT") =>
            {
                let _ = write!(row.target_opts, " --{word}");
            }
            w if w.starts_with("to:") && matches!(row.target, "DNAT" | "SNAT") => {
                let range = &w[3..];
                if !is_plain(range) || values::nat_range(range).is_none() {
                    return Err("to:".to_string());
                }
                let flag = if row.target == "DNAT" {
                    "--to-destination"
                } else {
                    "--to-source"
                };
                let _ = write!(row.target_opts, " {flag} {range}");
            }
            "masq" | "redir"
                if matches!(
                    (word, row.target),
                    ("masq", "MASQUERADE") | ("redir", "REDIRECT")
                ) =>
            {
                let label = ex.next().ok_or(word)?;
                if !matches!(label, "ports:" | "ports") {
                    return Err(word.to_string());
                }
                let p = value(ex, word)?;
                values::nat_ports(&p).ok_or(word)?;
                let _ = write!(row.target_opts, " --to-ports {p}");
            }
            "match-set" => {
                let name = value(ex, "match-set")?;
                let flags = value(ex, "match-set")?;
                if !flags.split(',').all(|f| matches!(f, "src" | "dst")) {
                    return Err("match-set".to_string());
                }
                let _ = write!(row.matches, " -m set{bang} --match-set {name} {flags}");
            }
            "nfacct-name" => {
                let name = value(ex, "nfacct-name")?;
                let _ = write!(row.matches, " -m nfacct --nfacct-name {name}");
            }
            other => return Err(kind_name(other.split([':', '=']).next().unwrap_or(other))),
        }
        Ok(())
    }

    /// `recent: SET|CHECK|UPDATE|REMOVE [seconds: N] [reap] [hit_count: N] [TTL-Match] name: NAME
    /// side: source|dest [mask: MASK]` → `-m recent …`, in iptables-save's option order.
    fn recent(
        &mut self,
        bang: &str,
        ex: &mut Extras<'_>,
        row: &mut RowOut<'_>,
    ) -> Result<(), String> {
        let err = || "recent:".to_string();
        let mut action = None;
        let mut opts = String::new();
        let (mut name, mut mask, mut side) = (String::new(), String::new(), "");
        while let Some(w) = ex.peek() {
            match w {
                "SET" | "CHECK" | "UPDATE" | "REMOVE" if action.is_none() => {
                    action = Some(match w {
                        "SET" => "--set",
                        "CHECK" => "--rcheck",
                        "UPDATE" => "--update",
                        _ => "--remove",
                    });
                    ex.next();
                }
                "seconds:" | "hit_count:" | "name:" | "mask:" | "side:" => {
                    ex.next();
                    let v = ex.next().filter(|v| is_plain(v)).ok_or_else(err)?;
                    match w {
                        "seconds:" | "hit_count:" => {
                            v.parse::<u32>().map_err(|_| err())?;
                            let flag = if w == "seconds:" {
                                "seconds"
                            } else {
                                "hitcount"
                            };
                            let _ = write!(opts, " --{flag} {v}");
                        }
                        "name:" => name = format!(" --name {v}"),
                        "mask:" => {
                            v.parse::<IpAddr>().map_err(|_| err())?;
                            mask = format!(" --mask {v}");
                        }
                        _ => {
                            side = match v {
                                "source" => " --rsource",
                                "dest" => " --rdest",
                                _ => return Err(err()),
                            }
                        }
                    }
                }
                "reap" => {
                    ex.next();
                    opts.push_str(" --reap");
                }
                "TTL-Match" => {
                    ex.next();
                    opts.push_str(" --rttl");
                }
                _ => break,
            }
        }
        let action = action.ok_or_else(err)?;
        let _ = write!(
            row.matches,
            " -m recent{bang} {action}{opts}{name}{mask}{side}"
        );
        Ok(())
    }

    /// One row (`[num] [pkts bytes] [target] prot [opt] [in out] source destination extras`) of
    /// chain `chain` as an `-A` line; `None` when it is not a row of this shape.
    fn row(&mut self, line: &str, chain: &str, shape: ListingShape) -> Option<String> {
        let mut cur = Words { rest: line };
        if shape.line_numbers && !cur.word()?.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let mut counters = None;
        if shape.verbose {
            let (p, rp) = count(cur.word()?)?;
            let (b, rb) = count(cur.word()?)?;
            self.rounded |= rp || rb;
            counters = Some((p, b));
        }
        // A rule without a target prints blanks in its place: the first word is then the
        // protocol, followed by the opt column (or, in older ip6tables, by the source).
        let first = cur.word()?;
        let second = cur.word()?;
        let (target, prot, mut held) =
            if is_opt(second) || (!is_protocol(second) && is_protocol(first)) {
                ("", first, Some(second))
            } else {
                (first, second, None)
            };
        let mut w = cur.held_or_word(&mut held)?;
        let mut frag = "";
        if is_opt(w) {
            frag = match w {
                "-f" => " -f",
                "!f" => " ! -f",
                _ => "",
            };
            w = cur.held_or_word(&mut held)?;
        }
        let mut ifaces = None;
        if shape.verbose {
            let o = cur.held_or_word(&mut held)?;
            ifaces = Some((w, o));
            w = cur.held_or_word(&mut held)?;
        }
        let source = w;
        let destination = cur.held_or_word(&mut held)?;
        if !target.is_empty() && !is_plain(target) {
            return None;
        }
        let mut out = format!("-A {chain}");
        self.address(source, "-s", &mut out);
        self.address(destination, "-d", &mut out);
        if let Some((i, o)) = ifaces {
            self.interface(i, "-i", &mut out);
            self.interface(o, "-o", &mut out);
        }
        if let Some((neg, p)) = protocol(prot) {
            if !is_plain(&p) {
                return None;
            }
            if neg {
                out.push_str(" !");
            }
            let _ = write!(out, " -p {p}");
        }
        out.push_str(frag);
        let mut row = RowOut {
            target,
            goto: false,
            matches: String::new(),
            target_opts: String::new(),
        };
        self.extras(cur.rest, &mut row);
        out.push_str(&row.matches);
        if let Some((p, b)) = counters {
            let _ = write!(out, " -c {p} {b}");
        }
        if !row.target.is_empty() && !STANDARD_TARGETS.contains(&row.target) {
            self.jumps.insert(row.target.to_string());
        }
        if !row.target.is_empty() {
            let jump = if row.goto { "-g" } else { "-j" };
            let _ = write!(out, " {jump} {}{}", row.target, row.target_opts);
        } else if row.goto {
            self.drop("[goto]");
        }
        Some(out)
    }
}

/// Blank-separated words, front to back.
struct Words<'a> {
    rest: &'a str,
}

impl<'a> Words<'a> {
    /// The word set aside in `held`, if any, else the next one.
    fn held_or_word(&mut self, held: &mut Option<&'a str>) -> Option<&'a str> {
        held.take().or_else(|| self.word())
    }

    fn word(&mut self) -> Option<&'a str> {
        let t = self.rest.trim_start();
        if t.is_empty() {
            return None;
        }
        let end = t.find(|c: char| c.is_ascii_whitespace()).unwrap_or(t.len());
        self.rest = &t[end..];
        Some(&t[..end])
    }
}

/// `line 3` or `3 lines: 3, 5, …` (up to five numbers), for a note.
fn line_list(lines: &[u32]) -> String {
    if let [one] = lines {
        return format!("line {one}");
    }
    let mut s = format!("{} lines: ", lines.len());
    s += &lines
        .iter()
        .take(5)
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if lines.len() > 5 {
        s.push_str(", …");
    }
    s
}

/// `kind (n), kind (n)` of a count map.
fn count_list(counts: &BTreeMap<String, usize>) -> String {
    counts
        .iter()
        .map(|(k, n)| format!("`{k}` ({n})"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether the listing holds an IPv6 address (a source, destination or NAT range, `::/0`).
fn has_v6_address(text: &str) -> bool {
    text.split_ascii_whitespace().any(|w| {
        let w = w.trim_start_matches('!');
        let w = w.strip_prefix("to:[").unwrap_or(w);
        let w = w.split(['/', ']']).next().unwrap_or(w);
        w.contains(':') && w.parse::<std::net::Ipv6Addr>().is_ok()
    })
}

/// Chain and target names that only kube-proxy's nat (or filter) rules use.
fn guess_table(text: &str) -> Option<&'static str> {
    const NAT: [&str; 8] = [
        "KUBE-SVC-",
        "KUBE-SEP-",
        "KUBE-SVL-",
        "KUBE-EXT-",
        "KUBE-MARK-MASQ",
        "KUBE-POSTROUTING",
        " DNAT ",
        " MASQUERADE ",
    ];
    const FILTER: [&str; 5] = [
        "KUBE-FORWARD",
        "KUBE-FIREWALL",
        "KUBE-PROXY-FIREWALL",
        "KUBE-EXTERNAL-SERVICES",
        "reject-with",
    ];
    if NAT.iter().any(|n| text.contains(n)) {
        Some("nat")
    } else if FILTER.iter().any(|n| text.contains(n)) {
        Some("filter")
    } else {
        None
    }
}

/// The table of a listing: the caller's if its built-in chains allow it, else the table whose
/// built-in chains are exactly the listing's, else a guess from kube-proxy's chain names.
fn choose_table(
    text: &str,
    builtins: &[&str],
    given: Option<&str>,
) -> (&'static str, TableSource, Option<String>) {
    let holds = |chains: &[&str]| builtins.iter().all(|b| chains.contains(b));
    let candidates: Vec<(&'static str, &[&str])> = BUILTINS
        .iter()
        .copied()
        .filter(|(_, chains)| holds(chains))
        .collect();
    let given_static = given.and_then(|g| BUILTINS.iter().map(|(t, _)| *t).find(|t| *t == g));
    if let Some(g) = given_static
        && candidates.iter().any(|(t, _)| *t == g)
    {
        return (g, TableSource::Given, None);
    }
    if !builtins.is_empty()
        && let Some((t, _)) = candidates
            .iter()
            .find(|(_, chains)| chains.len() == builtins.len())
    {
        let note = given.map(|g| {
            format!(
                "the listing's built-in chains ({}) are those of the {t} table, not of {g}: read as {t}",
                builtins.join(", ")
            )
        });
        return (t, TableSource::BuiltinChains, note);
    }
    if builtins.is_empty()
        && let Some(g) = given_static
    {
        return (g, TableSource::Given, None);
    }
    let guess = guess_table(text).filter(|g| candidates.iter().any(|(t, _)| t == g));
    // Without built-in chains every table is possible: kube-proxy's services are in nat.
    let fallback = if builtins.is_empty() {
        None
    } else {
        candidates.first().map(|(t, _)| *t)
    };
    let table = guess.or(fallback).unwrap_or("nat");
    (table, TableSource::Guessed, None)
}

/// What the reader tracks per input line.
enum State<'a> {
    /// Outside any chain.
    Outside,
    /// After `Chain NAME …`, before its column header.
    Header(&'a str),
    /// In chain NAME's rows.
    Rows(&'a str, ListingShape),
    /// After a chain that was listed before: a second listing, not read.
    Stopped,
}

/// Reads an `iptables -L` listing back into `iptables -S` text for one table (`table`, when the
/// caller knows it, as from `iptables -t nat -L`; else inferred). Never fails: what cannot be read
/// is left out and described in [`Listing::notes`].
pub fn read_listing(text: &str, table: Option<&str>) -> Listing {
    let mut builtins: Vec<&str> = Vec::new();
    for line in text.lines() {
        if let Some(h) = chain_header(line)
            && h.policy.is_some()
            && BUILTINS.iter().any(|(_, c)| c.contains(&h.name))
            && !builtins.contains(&h.name)
        {
            builtins.push(h.name);
        }
    }
    let (table, table_source, table_note) = choose_table(text, &builtins, table);
    let mut r = Reader {
        v6: has_v6_address(text),
        names: false,
        rounded: false,
        hosts: BTreeMap::new(),
        unknown_services: BTreeMap::new(),
        dropped: BTreeMap::new(),
        jumps: std::collections::BTreeSet::new(),
    };
    let mut out = String::with_capacity(text.len());
    let mut state = State::Outside;
    let mut shape: Option<ListingShape> = None;
    let mut seen: Vec<&str> = Vec::new();
    let mut stopped_at: Option<(u32, &str)> = None;
    let (mut unreadable, mut outside) = (Vec::new(), Vec::new());
    let mut legacy_present = false;
    for (n, raw) in text.split('\n').enumerate() {
        if n > 0 {
            out.push('\n');
        }
        let line_no = u32::try_from(n + 1).unwrap_or(u32::MAX);
        let line = raw.trim_end();
        if line.trim_start().is_empty() {
            if !matches!(state, State::Stopped) {
                state = State::Outside;
            }
            continue;
        }
        if matches!(state, State::Stopped) {
            continue;
        }
        if let Some(h) = chain_header(line) {
            if seen.contains(&h.name) {
                stopped_at = Some((line_no, h.name));
                state = State::Stopped;
                continue;
            }
            seen.push(h.name);
            match h.policy {
                Some(p) if is_plain(p) => {
                    let _ = write!(out, "-P {} {p}", h.name);
                    if let Some((pk, by)) = h.counters
                        && let (Some((pk, rp)), Some((by, rb))) = (count(pk), count(by))
                    {
                        r.rounded |= rp || rb;
                        let _ = write!(out, " -c {pk} {by}");
                    }
                }
                _ => {
                    let _ = write!(out, "-N {}", h.name);
                }
            }
            state = State::Header(h.name);
            continue;
        }
        match state {
            State::Header(chain) => match column_header(line) {
                Some(s) => {
                    shape.get_or_insert(s);
                    state = State::Rows(chain, s);
                }
                // No column header (cut from the paste): the rows of the chain before tell.
                None => {
                    let s = shape.unwrap_or_default();
                    match r.row(line, chain, s) {
                        Some(rule) => out.push_str(&rule),
                        None => unreadable.push(line_no),
                    }
                    state = State::Rows(chain, s);
                }
            },
            State::Rows(chain, s) => match r.row(line, chain, s) {
                Some(rule) => out.push_str(&rule),
                None => unreadable.push(line_no),
            },
            // iptables-nft's first line when the other backend has rules too.
            State::Outside if line.starts_with("# Warning: iptables-legacy tables present") => {
                legacy_present = true;
            }
            State::Outside => outside.push(line_no),
            State::Stopped => {}
        }
    }

    let shape = shape.unwrap_or_default();
    let how = match table_source {
        TableSource::Given => "the table asked for",
        TableSource::BuiltinChains => "from its built-in chains",
        TableSource::Guessed => "guessed from its chain names; pass the table if it is another",
    };
    let mut notes = vec![format!(
        "read from an `iptables -L` listing into the {table} table ({how}): best-effort and \
         lossy; `iptables-save` (or `iptables -t {table} -S`) keeps what kproxy needs"
    )];
    notes.extend(table_note);
    if table != "nat" {
        notes.push(
            "kube-proxy's service rules are in the nat table (`iptables -t nat -L -n -v`, \
             better `iptables-save`)"
                .to_string(),
        );
    }
    if !shape.verbose {
        notes.push(
            "the listing has no -v: rules are read without their interfaces (-i/-o) and counters"
                .to_string(),
        );
    } else if r.rounded {
        notes
            .push("counters are rounded to their K/M/G units (-x prints them exactly)".to_string());
    }
    if r.names {
        notes.push(
            "the listing was printed without -n: `anywhere`, well-known host and service names \
             were read back as addresses and ports"
                .to_string(),
        );
    }
    if !r.hosts.is_empty() {
        notes.push(format!(
            "host names cannot be read back; their address matches were dropped: {} (list with -n)",
            count_list(&r.hosts)
        ));
    }
    if !r.unknown_services.is_empty() {
        notes.push(format!(
            "service names that are not well known; their port matches were dropped: {} (list with -n)",
            count_list(&r.unknown_services)
        ));
    }
    if !r.dropped.is_empty() {
        notes.push(format!(
            "parts of rules with no reading here were dropped from their rules: {}",
            count_list(&r.dropped)
        ));
    }
    if !unreadable.is_empty() {
        notes.push(format!(
            "not listing rows, skipped: {}",
            line_list(&unreadable)
        ));
    }
    if !outside.is_empty() {
        notes.push(format!(
            "outside the listing's chains, ignored: {}",
            line_list(&outside)
        ));
    }
    let missing: Vec<&str> = r
        .jumps
        .iter()
        .map(String::as_str)
        .filter(|j| !seen.contains(j))
        .collect();
    if !missing.is_empty() {
        let mut names = missing
            .iter()
            .take(5)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if missing.len() > 5 {
            names.push_str(", …");
        }
        notes.push(format!(
            "the listing is partial: rules jump to {} chains it does not show ({names})",
            missing.len()
        ));
    }
    if legacy_present {
        notes.push(
            "the listing says iptables-legacy tables are present: kube-proxy's rules may be \
             there (`iptables-legacy-save`)"
                .to_string(),
        );
    }
    if let Some((line, chain)) = stopped_at {
        notes.push(format!(
            "chain {chain} is listed again on line {line}: the input holds more than one listing; \
             only the first was read (pass each listing on its own)"
        ));
    }
    for (host, n) in &r.hosts {
        *r.dropped.entry(format!("host {host}")).or_default() += n;
    }
    for (name, n) in &r.unknown_services {
        *r.dropped.entry(format!("service {name}")).or_default() += n;
    }
    Listing {
        text: out,
        table,
        table_source,
        shape,
        names: r.names,
        dropped: r.dropped,
        notes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::{ParseOptions, parse_dump};

    /// The `-A` lines of a listing read back (tables: the caller's `table`).
    fn rules(text: &str, table: Option<&str>) -> (Vec<String>, Listing) {
        let l = read_listing(text, table);
        let lines = l
            .text
            .lines()
            .filter(|line| line.starts_with("-A "))
            .map(str::to_string)
            .collect();
        (lines, l)
    }

    const NAT_N: &str = "\
Chain PREROUTING (policy ACCEPT)
target     prot opt source               destination         
KUBE-SERVICES  all  --  0.0.0.0/0            0.0.0.0/0            /* kubernetes service portals */

Chain KUBE-SVC-X (1 references)
target     prot opt source               destination         
KUBE-MARK-MASQ  tcp  -- !10.244.0.0/16        10.96.0.10           /* ns/a:dns cluster IP */ tcp dpt:53
KUBE-SEP-A  all  --  0.0.0.0/0            0.0.0.0/0            /* ns/a:dns -> 10.244.1.3:53 */ statistic mode random probability 0.50000000000
KUBE-SEP-B  all  --  0.0.0.0/0            0.0.0.0/0            /* ns/a:dns -> 10.244.2.3:53 */
";

    #[test]
    fn chain_headers_of_every_form() {
        let h = chain_header("Chain INPUT (policy DROP 12K packets, 3456M bytes)").unwrap();
        assert_eq!(
            (h.name, h.policy, h.counters),
            ("INPUT", Some("DROP"), Some(("12K", "3456M")))
        );
        let h = chain_header("Chain KUBE-SVC-X (0 references)").unwrap();
        assert_eq!((h.name, h.policy), ("KUBE-SVC-X", None));
        assert!(chain_header("Chain OUTPUT (policy ACCEPT)").is_some());
        for bad in [
            "Chain INPUT",
            "Chain INPUT (policy)",
            "Chain X (many references)",
            "Chain  (1 references)",
            "Chain THIS-NAME-IS-LONGER-THAN-ANY-CHAIN (1 references)",
            "chain INPUT (policy ACCEPT)",
        ] {
            assert!(chain_header(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn column_headers_give_the_shape() {
        let plain = column_header("target     prot opt source               destination").unwrap();
        assert_eq!(
            plain,
            ListingShape {
                line_numbers: false,
                verbose: false,
                opt: true
            }
        );
        let all = column_header(
            "num      pkts      bytes target     prot opt in     out     source               destination",
        )
        .unwrap();
        assert_eq!(
            all,
            ListingShape {
                line_numbers: true,
                verbose: true,
                opt: true
            }
        );
        assert!(column_header("pkts bytes target prot opt source destination").is_none());
        assert!(column_header("target prot opt source").is_none());
    }

    #[test]
    fn counters_with_and_without_units() {
        assert_eq!(count("0"), Some((0, false)));
        assert_eq!(count("99999"), Some((99_999, false)));
        assert_eq!(count("463K"), Some((463_000, true)));
        assert_eq!(count("1733M"), Some((1_733_000_000, true)));
        assert_eq!(count("34T"), Some((34_000_000_000_000, true)));
        for bad in ["", "K", "1.5K", "12X", "-1", "99999999999999999999"] {
            assert_eq!(count(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_listing_is_recognised_and_other_forms_are_not() {
        assert_eq!(looks_like_listing(NAT_N).map(|s| s.verbose), Some(false));
        let prompted = format!("[root@node ~]# iptables -t nat -L -n\n{NAT_N}");
        assert!(looks_like_listing(&prompted).is_some());
        for other in [
            "*nat\n:PREROUTING ACCEPT [0:0]\n-A PREROUTING -j KUBE-SERVICES\nCOMMIT\n",
            "-P INPUT ACCEPT\n-A INPUT -j ACCEPT\n",
            "Chain INPUT (policy ACCEPT)\nno columns here\n",
            "",
        ] {
            assert!(looks_like_listing(other).is_none(), "{other}");
        }
        // A save dump with a listing pasted after it is not a listing (lenient parsing skips
        // the listing's lines).
        let mixed = format!("*nat\n-A X -j ACCEPT\nCOMMIT\n{NAT_N}");
        assert!(looks_like_listing(&mixed).is_none());
    }

    #[test]
    fn strict_errors_on_a_listing_name_it() {
        let err = parse_dump(NAT_N, &ParseOptions::strict()).unwrap_err();
        assert_eq!((err.line, err.col), (1, 1));
        assert_eq!(err.expected, "`iptables-save` or `iptables -S` output");
        assert!(
            err.found.starts_with("`iptables -L` output ("),
            "{}",
            err.found
        );
        assert!(err.found.contains("pass --lenient"), "{}", err.found);
        // Other errors are left alone.
        let save = "*nat\n-A X --bogus\nCOMMIT\n";
        let err = parse_dump(save, &ParseOptions::strict()).unwrap_err();
        assert!(!err.found.contains("iptables -L"), "{}", err.found);
    }

    #[test]
    fn kube_proxy_rows_read_back() {
        let (rules, l) = rules(NAT_N, None);
        assert_eq!(
            rules,
            [
                "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
                "-A KUBE-SVC-X ! -s 10.244.0.0/16 -d 10.96.0.10 -p tcp -m comment --comment \"ns/a:dns cluster IP\" -m tcp --dport 53 -j KUBE-MARK-MASQ",
                "-A KUBE-SVC-X -m comment --comment \"ns/a:dns -> 10.244.1.3:53\" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-A",
                "-A KUBE-SVC-X -m comment --comment \"ns/a:dns -> 10.244.2.3:53\" -j KUBE-SEP-B",
            ]
        );
        assert_eq!(l.text.split('\n').count(), NAT_N.split('\n').count());
        assert_eq!(l.text.lines().nth(4), Some("-N KUBE-SVC-X"));
        assert_eq!(l.text.lines().next(), Some("-P PREROUTING ACCEPT"));
        // Only PREROUTING of the built-in chains: nat (KUBE-SVC-), guessed.
        assert_eq!((l.table, l.table_source), ("nat", TableSource::Guessed));
        assert!(l.dropped.is_empty());
        let dump = parse_dump(&l.text, &ParseOptions::lenient().with_table(l.table)).unwrap();
        assert!(dump.skipped.is_empty(), "{:?}", dump.skipped);
        assert_eq!(
            dump.tables[0].rules[1].line, 7,
            "line numbers are the listing's"
        );
    }

    #[test]
    fn verbose_rows_with_line_numbers_counters_and_interfaces() {
        let text = "\
Chain INPUT (policy ACCEPT 97G packets, 9942G bytes)
num      pkts      bytes target     prot opt in     out     source               destination
1        463K     273M ACCEPT     6    --  eth0   !cali+   0.0.0.0/0            10.0.0.1             tcp dpts:1000:2000
2           0        0            0    -f  *      *       0.0.0.0/0            0.0.0.0/0            /* no target */
";
        let (rules, l) = rules(text, Some("filter"));
        assert_eq!(
            rules,
            [
                "-A INPUT -d 10.0.0.1 -i eth0 ! -o cali+ -p tcp -m tcp --dport 1000:2000 -c 463000 273000000 -j ACCEPT",
                "-A INPUT -f -m comment --comment \"no target\" -c 0 0",
            ]
        );
        assert!(
            l.text
                .starts_with("-P INPUT ACCEPT -c 97000000000 9942000000000\n")
        );
        assert_eq!(
            l.shape,
            ListingShape {
                line_numbers: true,
                verbose: true,
                opt: true
            }
        );
        assert!(
            l.notes.iter().any(|n| n.contains("rounded")),
            "{:?}",
            l.notes
        );
    }

    #[test]
    fn rows_without_target_or_opt_column() {
        // Older ip6tables: an `opt` header but blank `opt` cells; a rule without a target.
        let text = "\
Chain KUBE-FW-X (1 references)
target     prot opt source               destination
KUBE-EXT-X  all      fd00::/64            ::/0                 /* lb */
           all      ::/0                 ::/0                 /* dropped by KUBE-PROXY-FIREWALL */
";
        let (rules, _) = rules(text, Some("nat"));
        assert_eq!(
            rules,
            [
                "-A KUBE-FW-X -s fd00::/64 -m comment --comment lb -j KUBE-EXT-X"
                    .replace("comment lb", "comment \"lb\""),
                "-A KUBE-FW-X -m comment --comment \"dropped by KUBE-PROXY-FIREWALL\"".to_string(),
            ]
        );
    }

    #[test]
    fn extras_map_to_their_save_options() {
        let cases = [
            (
                "MARK",
                "MARK or 0x4000",
                " -j MARK --set-xmark 0x4000/0x4000",
            ),
            ("MARK", "MARK xor 0x4000", " -j MARK --set-xmark 0x4000/0x0"),
            (
                "MARK",
                "MARK and 0xffffff00",
                " -j MARK --set-xmark 0x0/0xff",
            ),
            (
                "MARK",
                "MARK set 0x10",
                " -j MARK --set-xmark 0x10/0xffffffff",
            ),
            (
                "MARK",
                "MARK xset 0x10/0x30",
                " -j MARK --set-xmark 0x10/0x30",
            ),
            (
                "RETURN",
                "mark match ! 0x4000/0x4000",
                " -m mark ! --mark 0x4000/0x4000 -j RETURN",
            ),
            (
                "ACCEPT",
                "ctstate RELATED,ESTABLISHED",
                " -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
            ),
            (
                "DROP",
                "! ctstate INVALID",
                " -m conntrack ! --ctstate INVALID -j DROP",
            ),
            ("ACCEPT", "state NEW", " -m state --state NEW -j ACCEPT"),
            (
                "KUBE-SEP-A",
                "recent: CHECK seconds: 10800 reap name: KUBE-SEP-A side: source mask: 255.255.255.255",
                " -m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 --rsource -j KUBE-SEP-A",
            ),
            (
                "DNAT",
                "recent: SET name: KUBE-SEP-A side: source mask: 255.255.255.255 tcp to:10.244.1.5:8080",
                " -m recent --set --name KUBE-SEP-A --mask 255.255.255.255 --rsource -m tcp -j DNAT --to-destination 10.244.1.5:8080",
            ),
            (
                "DNAT",
                "tcp to:[fd00::5]:80",
                " -m tcp -j DNAT --to-destination [fd00::5]:80",
            ),
            ("SNAT", "to:192.0.2.1", " -j SNAT --to-source 192.0.2.1"),
            (
                "MASQUERADE",
                "random-fully",
                " -j MASQUERADE --random-fully",
            ),
            (
                "MASQUERADE",
                "masq ports: 1024-65535 random",
                " -j MASQUERADE --to-ports 1024-65535 --random",
            ),
            ("REDIRECT", "redir ports 443", " -j REDIRECT --to-ports 443"),
            (
                "REJECT",
                "reject-with icmp-port-unreachable",
                " -j REJECT --reject-with icmp-port-unreachable",
            ),
            (
                "KUBE-NODEPORTS",
                "ADDRTYPE match dst-type LOCAL",
                " -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS",
            ),
            (
                "RETURN",
                "ADDRTYPE match src-type !LOCAL limit-in",
                " -m addrtype ! --src-type LOCAL --limit-iface-in -j RETURN",
            ),
            (
                "ACCEPT",
                "multiport dports http,https,8000:http-alt",
                " -m multiport --dports 80,443,8000:8080 -j ACCEPT",
            ),
            (
                "ACCEPT",
                "multiport dports  !ssh,http",
                " -m multiport ! --dports 22,80 -j ACCEPT",
            ),
            (
                "ACCEPT",
                "udp spt:!domain dpts:1000:2000",
                " -m udp ! --sport 53 --dport 1000:2000 -j ACCEPT",
            ),
            ("ACCEPT", "sctp dpt:3868", " -m sctp --dport 3868 -j ACCEPT"),
            (
                "ACCEPT",
                "match-set KUBE-SET dst,dst",
                " -m set --match-set KUBE-SET dst,dst -j ACCEPT",
            ),
            (
                "DROP",
                "! match-set KUBE-SET src",
                " -m set ! --match-set KUBE-SET src -j DROP",
            ),
            (
                "KUBE-X",
                "nfacct-name  localhost_nps_accepted_pkts",
                " -m nfacct --nfacct-name localhost_nps_accepted_pkts -j KUBE-X",
            ),
            (
                "ACCEPT",
                "statistic mode random ! probability 0.25000000000",
                " -m statistic --mode random ! --probability 0.25000000000 -j ACCEPT",
            ),
            ("KUBE-T", "[goto] ", " -g KUBE-T"),
        ];
        for (target, extras, want) in cases {
            let text = format!(
                "Chain X (1 references)\ntarget prot opt source destination\n{target} all -- 0.0.0.0/0 0.0.0.0/0 {extras}\n"
            );
            let (rules, l) = rules(&text, Some("nat"));
            assert_eq!(rules, [format!("-A X{want}")], "{extras}");
            assert!(l.dropped.is_empty(), "{extras}: {:?}", l.dropped);
            let dump = parse_dump(&l.text, &ParseOptions::strict().with_table("nat"));
            assert!(dump.is_ok(), "{extras}: {dump:?}");
        }
    }

    #[test]
    fn what_has_no_reading_is_dropped_and_counted() {
        let text = "\
Chain X (1 references)
target prot opt source destination
LOG all -- 0.0.0.0/0 0.0.0.0/0 limit: avg 3/min burst 5 LOG flags 0 level 4 prefix \"a b: \"
ACCEPT tcp -- 0.0.0.0/0 0.0.0.0/0 tcp flags:0x06/0x02 /* kept */
ACCEPT all -- 0.0.0.0/0 0.0.0.0/0 reject-with tcp-reset ctstate NEW
ACCEPT tcp -- 0.0.0.0/0 0.0.0.0/0 tcp dpt:no-such-service
ACCEPT all -- node-7.example 0.0.0.0/0
";
        let (rules, l) = rules(text, Some("filter"));
        assert_eq!(
            rules,
            [
                "-A X -j LOG",
                "-A X -p tcp -m tcp -m comment --comment \"kept\" -j ACCEPT",
                "-A X -m conntrack --ctstate NEW -j ACCEPT",
                "-A X -p tcp -m tcp -j ACCEPT",
                "-A X -j ACCEPT",
            ]
        );
        let want: BTreeMap<String, usize> = [
            ("LOG", 1),
            ("limit", 1),
            ("tcp flags", 1),
            ("reject-with", 1),
            ("service no-such-service", 1),
            ("host node-7.example", 1),
        ]
        .into_iter()
        .map(|(k, n)| (k.to_string(), n))
        .collect();
        assert_eq!(l.dropped, want);
        let notes = l.notes.join("\n");
        assert!(notes.contains("host names cannot be read back; their address matches were dropped: `node-7.example` (1)"), "{notes}");
        assert!(notes.contains("`no-such-service` (1)"), "{notes}");
    }

    #[test]
    fn names_without_n_are_read_back() {
        let text = "\
Chain KUBE-NODEPORTS (1 references)
target     prot opt source               destination
KUBE-EXT-A  tcp  --  anywhere             loopback/8           tcp dpt:https
DROP       all  --  localhost            anywhere
";
        let (read, l) = rules(text, Some("nat"));
        assert_eq!(
            read,
            [
                "-A KUBE-NODEPORTS -d 127.0.0.0/8 -p tcp -m tcp --dport 443 -j KUBE-EXT-A",
                "-A KUBE-NODEPORTS -s 127.0.0.1 -j DROP",
            ]
        );
        assert!(l.names);
        // In an IPv6 listing `localhost` is ::1.
        let v6 = format!("{text}ACCEPT all -- fd00::1 anywhere\n");
        let (read, _) = rules(&v6, Some("nat"));
        assert_eq!(read[1], "-A KUBE-NODEPORTS -s ::1 -j DROP");
    }

    #[test]
    fn the_table_comes_from_the_caller_the_builtin_chains_or_the_names() {
        let filter = "Chain INPUT (policy ACCEPT)\ntarget prot opt source destination\n\n\
                      Chain FORWARD (policy ACCEPT)\ntarget prot opt source destination\n\n\
                      Chain OUTPUT (policy ACCEPT)\ntarget prot opt source destination\n";
        let l = read_listing(filter, Some("nat"));
        assert_eq!(
            (l.table, l.table_source),
            ("filter", TableSource::BuiltinChains)
        );
        assert!(l.notes[1].contains("not of nat"), "{:?}", l.notes);
        let l = read_listing(filter, Some("security"));
        assert_eq!((l.table, l.table_source), ("security", TableSource::Given));
        let l = read_listing(filter, None);
        assert_eq!(
            (l.table, l.table_source),
            ("filter", TableSource::BuiltinChains)
        );
        // Only INPUT (`iptables -L INPUT`): filter, the first table that has it.
        let input = "Chain INPUT (policy ACCEPT)\ntarget prot opt source destination\n";
        assert_eq!(read_listing(input, None).table, "filter");
        assert_eq!(read_listing(input, Some("nat")).table, "nat");
        // No built-in chain: the caller's table, else kube-proxy's names, else nat.
        let svc = "Chain KUBE-SERVICES (2 references)\ntarget prot opt source destination\n\
                   REJECT tcp -- 0.0.0.0/0 10.96.0.5 reject-with icmp-port-unreachable\n";
        assert_eq!(read_listing(svc, None).table, "filter");
        assert_eq!(read_listing(svc, Some("raw")).table, "raw");
        assert_eq!(read_listing("Chain A (0 references)\n", None).table, "nat");
    }

    #[test]
    fn a_second_listing_is_not_mixed_into_the_first() {
        let twice = format!("{NAT_N}\n{NAT_N}");
        let l = read_listing(&twice, None);
        let rules = l.text.lines().filter(|r| r.starts_with("-A")).count();
        assert_eq!(rules, 4);
        assert!(
            l.notes
                .iter()
                .any(|n| n.contains("chain PREROUTING is listed again on line 11")),
            "{:?}",
            l.notes
        );
    }

    #[test]
    fn lines_outside_chains_and_broken_rows_are_reported() {
        let text = format!("$ sudo iptables -t nat -L -n\n{NAT_N}KUBE-SEP-C\n");
        let l = read_listing(&text, None);
        let notes = l.notes.join("\n");
        assert!(
            notes.contains("outside the listing's chains, ignored: line 1\n"),
            "{notes}"
        );
        assert!(
            notes.contains("not listing rows, skipped: line 11"),
            "{notes}"
        );
        assert_eq!(l.text.split('\n').count(), text.split('\n').count());
    }

    #[test]
    fn jumps_to_chains_that_are_not_listed_make_it_partial() {
        let l = read_listing(NAT_N, None);
        let want = "the listing is partial: rules jump to 4 chains it does not show \
                    (KUBE-MARK-MASQ, KUBE-SEP-A, KUBE-SEP-B, KUBE-SERVICES)";
        assert!(l.notes.iter().any(|n| n == want), "{:?}", l.notes);
        let whole = "Chain INPUT (policy ACCEPT)\ntarget prot opt source destination\n\
                     KUBE-A all -- 0.0.0.0/0 0.0.0.0/0\nACCEPT all -- 0.0.0.0/0 0.0.0.0/0\n\n\
                     Chain KUBE-A (1 references)\ntarget prot opt source destination\n\
                     DNAT tcp -- 0.0.0.0/0 0.0.0.0/0 tcp to:10.0.0.1:80\n";
        let l = read_listing(whole, None);
        assert!(
            !l.notes.iter().any(|n| n.contains("partial")),
            "{:?}",
            l.notes
        );
    }

    #[test]
    fn the_legacy_tables_warning_is_a_note_of_its_own() {
        let text = format!(
            "# Warning: iptables-legacy tables present, use iptables-legacy to see them\n{NAT_N}"
        );
        let l = read_listing(&text, None);
        assert!(
            l.notes
                .iter()
                .any(|n| n.contains("iptables-legacy tables are present"))
        );
        assert!(
            !l.notes.iter().any(|n| n.contains("ignored")),
            "{:?}",
            l.notes
        );
    }

    #[test]
    fn a_chain_without_its_column_header_reads_with_the_shape_before() {
        let text = format!(
            "{NAT_N}\nChain KUBE-SEP-A (1 references)\nDNAT tcp -- 0.0.0.0/0 0.0.0.0/0 tcp to:10.244.1.3:53\n"
        );
        let (rules, _) = rules(&text, None);
        assert_eq!(
            rules.last().map(String::as_str),
            Some("-A KUBE-SEP-A -p tcp -m tcp -j DNAT --to-destination 10.244.1.3:53")
        );
    }

    #[test]
    fn service_names_are_netbase_s() {
        assert_eq!(service_port("http"), Some(80));
        assert_eq!(service_port("domain"), Some(53));
        assert_eq!(service_port("http-alt"), Some(8080));
        assert_eq!(service_port("9153"), Some(9153));
        assert_eq!(service_port("jetdirect"), None);
        assert_eq!(service_port(""), None);
    }
}
