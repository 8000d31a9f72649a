//! The typed syntax tree of an nftables ruleset, shared by all three input forms.
//!
//! Names, comments and symbols are `Cow<str>`: borrowed from the input where the input holds them
//! as written (text always; JSON unless the string had escapes), owned where a form had to be
//! rebuilt. Constants are held by value (`0x00004000`, `0x4000`, `16384` and JSON `16384` are all
//! `Expr::Number(16384)`), so the same rule read from any form is the same tree.

use std::borrow::Cow;
use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use crate::iptables::SkippedLine;

/// Which of the three accepted forms an input was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InputForm {
    /// `nft list ruleset` / `nft [-a] list table …` text: nested `table { chain { … } }` blocks.
    #[default]
    Listing,
    /// `nft -f` command lines (`add table|chain|set|map|rule|element …`, `flush`, `delete`,
    /// `insert`): kube-proxy's knftables transactions and its tests' dumps.
    Commands,
    /// `nft -j list …` JSON (libnftables-json, schema version 1).
    Json,
}

/// A whole parsed input: the tables it holds (or, for command input, builds).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset<'a> {
    /// The detected input form (command input that also holds `table { … }` blocks is `Commands`).
    pub form: InputForm,
    /// Tables in input order.
    pub tables: Vec<Table<'a>>,
    /// The nft version of a JSON listing (`metainfo.version`).
    pub nft_version: Option<Cow<'a, str>>,
    /// Things read but not modelled, or repaired on the way: `define`s, objects created
    /// implicitly by command input, deleted objects that did not exist.
    pub warnings: Vec<Warning>,
    /// Lines skipped by lenient parsing, with the strict-mode error.
    pub skipped: Vec<SkippedLine<'a>>,
}

/// A remark about the input that is not an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// 1-based line of the input (0 when the input form has no lines, i.e. JSON).
    pub line: u32,
    /// What was noticed.
    pub message: String,
}

/// An address family of nf_tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Family {
    /// `ip` (IPv4; the default when a command names no family).
    #[default]
    Ip,
    /// `ip6`.
    Ip6,
    /// `inet` (both).
    Inet,
    /// `arp`.
    Arp,
    /// `bridge`.
    Bridge,
    /// `netdev`.
    Netdev,
}

impl Family {
    /// The family named by an nft keyword.
    pub fn from_keyword(word: &str) -> Option<Family> {
        Some(match word {
            "ip" => Family::Ip,
            "ip6" => Family::Ip6,
            "inet" => Family::Inet,
            "arp" => Family::Arp,
            "bridge" => Family::Bridge,
            "netdev" => Family::Netdev,
            _ => return None,
        })
    }

    /// The nft keyword of the family.
    pub fn keyword(self) -> &'static str {
        match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
            Family::Inet => "inet",
            Family::Arp => "arp",
            Family::Bridge => "bridge",
            Family::Netdev => "netdev",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.keyword())
    }
}

/// One table: `table ip kube-proxy { … }`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table<'a> {
    /// Address family.
    pub family: Family,
    /// Table name.
    pub name: Cow<'a, str>,
    /// Kernel handle (`nft -a`, JSON).
    pub handle: Option<u64>,
    /// `comment "…"` of the table.
    pub comment: Option<Cow<'a, str>>,
    /// Table flags (`dormant`, `owner`, `persist`).
    pub flags: Vec<Cow<'a, str>>,
    /// True when the listing said `# Warning: table ip nat is managed by iptables-nft, do not
    /// touch!` before the table: its rules belong to the iptables view of the node.
    pub managed_by_iptables_nft: bool,
    /// Chains in input order.
    pub chains: Vec<Chain<'a>>,
    /// Sets and maps in input order.
    pub sets: Vec<Set<'a>>,
    /// Other named objects (`counter`, `quota`, `flowtable`, `ct helper`, …), kept as written.
    pub objects: Vec<Object<'a>>,
    /// 1-based input line of the table's header (0 = unknown).
    pub line: u32,
}

impl<'a> Table<'a> {
    /// The chain called `name`.
    pub fn chain(&self, name: &str) -> Option<&Chain<'a>> {
        self.chains.iter().find(|c| c.name == name)
    }

    /// The set or map called `name`.
    pub fn set(&self, name: &str) -> Option<&Set<'a>> {
        self.sets.iter().find(|s| s.name == name)
    }
}

impl<'a> Ruleset<'a> {
    /// The table `family name`.
    pub fn table(&self, family: Family, name: &str) -> Option<&Table<'a>> {
        self.tables
            .iter()
            .find(|t| t.family == family && t.name == name)
    }
}

/// A named stateful object that is not a chain, set or map, kept as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Object<'a> {
    /// The object keyword: `counter`, `quota`, `limit`, `flowtable`, `ct helper`, ….
    pub kind: Cow<'a, str>,
    /// The object's name.
    pub name: Cow<'a, str>,
    /// Its body as written (text), or its JSON object (JSON input).
    pub body: Cow<'a, str>,
    /// 1-based input line (0 = unknown).
    pub line: u32,
}

/// One chain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Chain<'a> {
    /// Chain name.
    pub name: Cow<'a, str>,
    /// Kernel handle.
    pub handle: Option<u64>,
    /// Hook attachment, for a base chain.
    pub base: Option<BaseChain<'a>>,
    /// `comment "…"` of the chain.
    pub comment: Option<Cow<'a, str>>,
    /// Rules in order.
    pub rules: Vec<Rule<'a>>,
    /// 1-based input line of the chain's header or first `add chain` (0 = unknown).
    pub line: u32,
}

/// What makes a chain a base chain: `type nat hook prerouting priority dstnat; policy accept;`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseChain<'a> {
    /// Chain type: `filter`, `nat`, `route`.
    pub kind: Cow<'a, str>,
    /// Hook: `prerouting`, `input`, `forward`, `output`, `postrouting`, `ingress`, `egress`.
    pub hook: Cow<'a, str>,
    /// Priority as a number (`dstnat - 10` → -110; standard names resolved per family and hook).
    pub priority: i32,
    /// `device "eth0"` of netdev/ingress chains.
    pub device: Option<Cow<'a, str>>,
    /// `policy accept|drop` (`None` when not written; the kernel default is accept).
    pub policy: Option<Policy>,
}

/// A base chain's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
}

/// One rule: statements in order, plus its comment and handle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rule<'a> {
    /// Statements (matches, verdicts, actions) in order.
    pub stmts: Vec<Stmt<'a>>,
    /// `comment "…"`.
    pub comment: Option<Cow<'a, str>>,
    /// Kernel handle (`# handle N`, JSON `handle`).
    pub handle: Option<u64>,
    /// 1-based input line (0 = unknown).
    pub line: u32,
}

impl Rule<'_> {
    /// The rule's first `counter` statement, if it has one: `Some(None)` for a counter without
    /// values, `Some(Some(c))` for `counter packets P bytes B`.
    pub fn counter(&self) -> Option<Option<Counter>> {
        self.stmts.iter().find_map(|s| match s {
            Stmt::Counter(c) => Some(*c),
            _ => None,
        })
    }

    /// The rule's final verdict statement, if it ends in one.
    pub fn verdict(&self) -> Option<&Verdict<'_>> {
        match self.stmts.last() {
            Some(Stmt::Verdict(v)) => Some(v),
            _ => None,
        }
    }
}

/// Packet and byte counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Counter {
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
}

/// A set or a map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Set<'a> {
    /// Name.
    pub name: Cow<'a, str>,
    /// Kernel handle.
    pub handle: Option<u64>,
    /// True for `map` (elements carry data), false for `set`.
    pub is_map: bool,
    /// Key type: `type ipv4_addr . inet_proto . inet_service` or `typeof ip daddr`.
    pub key: SetType<'a>,
    /// Data type of a map (`verdict`, `ipv4_addr`, …).
    pub data: Option<SetType<'a>>,
    /// Flags.
    pub flags: SetFlags<'a>,
    /// Default element timeout (`timeout 3h`, `timeout 10800s`).
    pub timeout: Option<Duration>,
    /// `gc-interval`.
    pub gc_interval: Option<Duration>,
    /// Maximum size (`size 65535`; the kernel adds it to dynamic sets).
    pub size: Option<u64>,
    /// `policy performance|memory`.
    pub policy: Option<Cow<'a, str>>,
    /// `auto-merge`.
    pub auto_merge: bool,
    /// `counter`: every element carries a counter.
    pub counter: bool,
    /// `comment "…"`.
    pub comment: Option<Cow<'a, str>>,
    /// Elements, in input order.
    pub elements: Vec<Element<'a>>,
    /// 1-based input line of the declaration (0 = unknown).
    pub line: u32,
}

impl Default for Set<'_> {
    fn default() -> Self {
        Set {
            name: Cow::Borrowed(""),
            handle: None,
            is_map: false,
            key: SetType::Named(Vec::new()),
            data: None,
            flags: SetFlags::default(),
            timeout: None,
            gc_interval: None,
            size: None,
            policy: None,
            auto_merge: false,
            counter: false,
            comment: None,
            elements: Vec::new(),
            line: 0,
        }
    }
}

/// The type of a set key or map data.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SetType<'a> {
    /// `type ipv4_addr . inet_proto . inet_service`: the named types, in concatenation order.
    Named(Vec<Cow<'a, str>>),
    /// `typeof ip daddr . tcp dport`: the expression whose type is meant.
    Typeof(Expr<'a>),
}

/// Set flags.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SetFlags<'a> {
    /// `constant`.
    pub constant: bool,
    /// `interval`: elements may be prefixes and ranges.
    pub interval: bool,
    /// `timeout`: elements expire.
    pub timeout: bool,
    /// `dynamic`: rules add elements (`update @set { … }`).
    pub dynamic: bool,
    /// Any other flag (`eval`, …), as written.
    pub other: Vec<Cow<'a, str>>,
}

impl SetFlags<'_> {
    /// True when no flag is set.
    pub fn is_empty(&self) -> bool {
        !(self.constant || self.interval || self.timeout || self.dynamic) && self.other.is_empty()
    }
}

/// One element of a set or map (named or anonymous).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element<'a> {
    /// The key: a value, prefix, range or concatenation of them.
    pub key: Expr<'a>,
    /// A map element's data: a verdict (`goto service-…`) or a value.
    pub value: Option<Expr<'a>>,
    /// `comment "…"`.
    pub comment: Option<Cow<'a, str>>,
    /// `timeout 30s`.
    pub timeout: Option<Duration>,
    /// `expires 29s984ms` (time left, as listed).
    pub expires: Option<Duration>,
    /// Per-element counter (`counter packets P bytes B`).
    pub counter: Option<Counter>,
}

impl<'a> Element<'a> {
    /// An element with only a key.
    pub fn key(key: Expr<'a>) -> Self {
        Element {
            key,
            value: None,
            comment: None,
            timeout: None,
            expires: None,
            counter: None,
        }
    }
}

/// A statement of a rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stmt<'a> {
    /// `LEFT [OP] RIGHT`: `ip daddr 10.0.0.1`, `ip saddr != 10.0.0.0/8`, `ct state new`,
    /// `ip daddr @cluster-ips`, `mark and 0x4000 == 0`.
    Match {
        /// The packet expression.
        left: Expr<'a>,
        /// The relation (`==` when none is written).
        op: RelOp,
        /// The constant, set or set reference compared with.
        right: Expr<'a>,
    },
    /// `KEY vmap MAP`: a verdict-map lookup (`@service-ips` or `{ 0 : goto … }`).
    Vmap {
        /// The lookup key.
        key: Expr<'a>,
        /// The map: [`Expr::SetRef`] or an anonymous [`Expr::Set`] whose elements carry verdicts.
        map: Expr<'a>,
    },
    /// A verdict: `accept`, `drop`, `jump X`, ….
    Verdict(Verdict<'a>),
    /// `counter` (`None`) or `counter packets P bytes B`.
    Counter(Option<Counter>),
    /// `counter name "NAME"`: counts into the named counter object (`add counter …`).
    NamedCounter(Cow<'a, str>),
    /// `KEY set VALUE`: `mark set mark or 0x4000`, `ct mark set meta mark`.
    Mangle {
        /// What is written.
        key: Expr<'a>,
        /// The new value.
        value: Expr<'a>,
    },
    /// `dnat`, `snat`, `masquerade`, `redirect`.
    Nat(Nat<'a>),
    /// `reject [with …]`.
    Reject(Option<RejectWith<'a>>),
    /// `update @set { ip saddr }` (also `add`, `delete`).
    SetUpdate {
        /// `add`, `update` or `delete`.
        op: Cow<'a, str>,
        /// The set, without `@`.
        set: Cow<'a, str>,
        /// The element expression.
        elem: Expr<'a>,
    },
    /// `log [prefix "…"] [level …] [group N] …`.
    Log(Log<'a>),
    /// `xt match NAME` / `xt target NAME`: an iptables-nft extension nft cannot show natively.
    Xt {
        /// `match`, `target` or `watcher`.
        kind: Cow<'a, str>,
        /// Extension name (`DNAT`, `comment`, …).
        name: Cow<'a, str>,
    },
    /// Anything else, kept as written: the rest of the rule's text from the first statement that
    /// is not modelled, or a JSON statement object as written in the input.
    Verbatim(Cow<'a, str>),
}

/// A relation of a match.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RelOp {
    /// Equality, set membership or flag test (written as nothing, `==`, or JSON `in`).
    Eq,
    /// `!=`.
    Ne,
    /// `<`.
    Lt,
    /// `>`.
    Gt,
    /// `<=`.
    Le,
    /// `>=`.
    Ge,
}

impl RelOp {
    /// The operator as nft writes it.
    pub fn symbol(self) -> &'static str {
        match self {
            RelOp::Eq => "==",
            RelOp::Ne => "!=",
            RelOp::Lt => "<",
            RelOp::Gt => ">",
            RelOp::Le => "<=",
            RelOp::Ge => ">=",
        }
    }
}

/// A verdict.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Verdict<'a> {
    /// `accept`.
    Accept,
    /// `drop`.
    Drop,
    /// `return`.
    Return,
    /// `continue`.
    Continue,
    /// `jump CHAIN`.
    Jump(Cow<'a, str>),
    /// `goto CHAIN`.
    Goto(Cow<'a, str>),
}

/// Which NAT statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum NatKind {
    /// `dnat`.
    Dnat,
    /// `snat`.
    Snat,
    /// `masquerade`.
    Masquerade,
    /// `redirect`.
    Redirect,
}

impl NatKind {
    /// The statement keyword.
    pub fn keyword(self) -> &'static str {
        match self {
            NatKind::Dnat => "dnat",
            NatKind::Snat => "snat",
            NatKind::Masquerade => "masquerade",
            NatKind::Redirect => "redirect",
        }
    }
}

/// A NAT statement: `dnat to 10.180.0.1:80`, `dnat ip6 to [fd00::1]:80`, `masquerade fully-random`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Nat<'a> {
    /// Which statement.
    pub kind: NatKind,
    /// `ip`/`ip6` after `dnat`/`snat` (needed in `inet` tables).
    pub family: Option<Family>,
    /// The new address (an address or a range), if any.
    pub addr: Option<Expr<'a>>,
    /// The new port (a number or a range), if any.
    pub port: Option<Expr<'a>>,
    /// Flags: `fully-random`, `random`, `persistent`, ….
    pub flags: Vec<Cow<'a, str>>,
}

/// What a `reject` answers with: `with icmp host-unreachable`, `with tcp reset`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RejectWith<'a> {
    /// `icmp`, `icmpv6`, `icmpx` or `tcp reset`.
    pub kind: Cow<'a, str>,
    /// The ICMP code name (`port-unreachable`), absent for `tcp reset`.
    pub code: Option<Cow<'a, str>>,
}

/// A `log` statement.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Log<'a> {
    /// `prefix "…"`.
    pub prefix: Option<Cow<'a, str>>,
    /// `level warn`.
    pub level: Option<Cow<'a, str>>,
    /// `group N` (nflog).
    pub group: Option<u32>,
    /// `snaplen N`.
    pub snaplen: Option<u32>,
    /// `queue-threshold N`.
    pub queue_threshold: Option<u32>,
}

/// A bitwise operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum BinOp {
    /// `&` / `and`.
    And,
    /// `|` / `or`.
    Or,
    /// `^` / `xor`.
    Xor,
    /// `<<` / `lshift`.
    Lshift,
    /// `>>` / `rshift`.
    Rshift,
}

impl BinOp {
    /// The word form kube-proxy writes (`and`, `or`, `xor`, `lshift`, `rshift`).
    pub fn word(self) -> &'static str {
        match self {
            BinOp::And => "and",
            BinOp::Or => "or",
            BinOp::Xor => "xor",
            BinOp::Lshift => "lshift",
            BinOp::Rshift => "rshift",
        }
    }

    /// Binding strength: shifts bind tightest, then `&`, `^`, `|` (nft's grammar).
    pub fn precedence(self) -> u8 {
        match self {
            BinOp::Lshift | BinOp::Rshift => 4,
            BinOp::And => 3,
            BinOp::Xor => 2,
            BinOp::Or => 1,
        }
    }
}

/// An expression: what a packet is matched on, and the constants it is matched against.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Expr<'a> {
    /// A header field: `ip saddr`, `ip6 daddr`, `th dport`, `tcp dport`, `ip protocol`.
    Payload {
        /// `ip`, `ip6`, `th`, `tcp`, `udp`, `sctp`, `icmp`, `ether`, ….
        protocol: Cow<'a, str>,
        /// `saddr`, `daddr`, `dport`, `protocol`, ….
        field: Cow<'a, str>,
    },
    /// Packet metadata: `meta l4proto`, `mark` (= `meta mark`), `iifname`, ….
    Meta(Cow<'a, str>),
    /// Conntrack: `ct state`, `ct status`, `ct mark`, `ct original ip saddr`.
    Ct {
        /// `original` or `reply`, when written.
        dir: Option<Cow<'a, str>>,
        /// The key (`state`, `mark`, `ip saddr`, …).
        key: Cow<'a, str>,
    },
    /// A FIB lookup: `fib daddr type`, `fib saddr . iif oif`.
    Fib {
        /// Lookup inputs: `saddr`, `daddr`, `mark`, `iif`, `oif`.
        flags: Vec<Cow<'a, str>>,
        /// Result: `type`, `oif`, `oifname`.
        result: Cow<'a, str>,
    },
    /// `numgen random mod N [offset M]`.
    Numgen {
        /// `random` or `inc`.
        mode: Cow<'a, str>,
        /// The modulus N.
        modulus: u32,
        /// The offset (0 when not written).
        offset: u32,
    },
    /// `a . b . c`.
    Concat(Vec<Expr<'a>>),
    /// `left OP right`: `mark and 0x4000`.
    Binary {
        /// The operator.
        op: BinOp,
        /// Left operand.
        left: Box<Expr<'a>>,
        /// Right operand.
        right: Box<Expr<'a>>,
    },
    /// `KEY map { … }` / `KEY map @m`: a value looked up in a map (e.g. in `dnat to`).
    Map {
        /// The lookup key.
        key: Box<Expr<'a>>,
        /// The map: [`Expr::SetRef`] or an anonymous [`Expr::Set`].
        map: Box<Expr<'a>>,
    },
    /// An integer constant (ports, marks, numgen keys): `80`, `0x4000`.
    Number(u64),
    /// An IPv4 or IPv6 address.
    Addr(IpAddr),
    /// A prefix: `10.0.0.0/8`.
    Prefix(IpAddr, u8),
    /// A range: `1000-2000`, `10.0.0.1-10.0.0.9`.
    Range(Box<Expr<'a>>, Box<Expr<'a>>),
    /// Any other constant: a symbol (`tcp`, `new`, `local`), an interface name, a quoted string.
    Symbol(Cow<'a, str>),
    /// A comma-separated flag list: `established,related`.
    List(Vec<Expr<'a>>),
    /// A named set or map: `@cluster-ips` (the name without `@`).
    SetRef(Cow<'a, str>),
    /// An anonymous set `{ a , b }` or map `{ 0 : goto x , 1 : goto y }`.
    Set(Vec<Element<'a>>),
    /// A verdict, as map data.
    Verdict(Verdict<'a>),
}
