//! The rule-matching engine shared by every walk: does one rule match one packet?
//!
//! [`matches()`] is the single place where a rule's match criteria are evaluated. A
//! [`MatchPolicy`] decides what the model may know:
//!
//! * [`MatchPolicy::Kernel`] evaluates everything kube-proxy uses as netfilter would for the
//!   first packet of a new connection: addresses, protocol and ports, `addrtype` against the
//!   node's local addresses, `mark` against the packet mark set so far, `conntrack --ctstate`
//!   (`NEW`, plus the virtual `DNAT`/`SNAT` states once NAT happened), `recent` as "no entry
//!   yet" (unless `--set` earlier in the same walk), `statistic` as a probability, `nfacct` and
//!   `comment` as always-match. What cannot be known from the rules and the packet (interfaces
//!   that were not given, ipset contents, source ports that were not given, unknown modules) is
//!   *undecidable*: the rule is treated as not matching and the reason is reported.
//! * [`MatchPolicy::KubeProxyTest`] reproduces the matcher of kube-proxy's unit-test tracer
//!   (`ruleMatches` in `pkg/proxy/iptables/proxier_test.go`): `mark`, `--ctstate` and
//!   `recent --rcheck` never match (negated or not), interfaces, source ports, `statistic`,
//!   `multiport`, ipsets and unknown modules are ignored, ports compare as decimal strings, and
//!   `addrtype` knows only `LOCAL` (exact membership in the local address list).
//!
//! The graph and verify engines can reuse [`matches()`] with a [`PacketView`] of their own.

use super::packet::Protocol;
use kproxy_parsers::iptables::{
    AddrSpec, GenericOpt, List, MarkValue, Match, Module, MultiportKind, Neg, PortRange,
    RecentAction, Rule, Statistic,
};
use std::net::IpAddr;

/// What a model treats as knowable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchPolicy {
    /// Real netfilter semantics for the first packet of a connection.
    Kernel,
    /// The simplified matcher of kube-proxy's unit-test packet tracer.
    KubeProxyTest,
}

/// The addresses `addrtype LOCAL` (and routing) treat as the node's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalAddrs {
    ips: Vec<IpAddr>,
    loopback_ranges: bool,
}

impl LocalAddrs {
    /// The kernel's view: the given addresses plus every loopback address (`127.0.0.0/8`, `::1`).
    pub fn kernel(ips: Vec<IpAddr>) -> Self {
        LocalAddrs {
            ips,
            loopback_ranges: true,
        }
    }

    /// Exactly the given addresses (kube-proxy's test tracer passes the loopbacks explicitly).
    pub fn exact(ips: Vec<IpAddr>) -> Self {
        LocalAddrs {
            ips,
            loopback_ranges: false,
        }
    }

    /// True if `ip` is one of the node's addresses.
    pub fn contains(&self, ip: IpAddr) -> bool {
        (self.loopback_ranges && ip.is_loopback()) || self.ips.contains(&ip)
    }

    /// The addresses given explicitly, in order.
    pub fn ips(&self) -> &[IpAddr] {
        &self.ips
    }
}

/// Connection-tracking facts about the packet's connection (always a new one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ConntrackState {
    /// The connection's destination was rewritten (virtual ctstate `DNAT`).
    pub dnat: bool,
    /// The connection's source was rewritten (virtual ctstate `SNAT`).
    pub snat: bool,
    /// `NOTRACK`/`CT --notrack` applied: state `UNTRACKED` instead of `NEW`.
    pub untracked: bool,
}

/// The packet as it is when a rule is evaluated (after any NAT and marks so far).
#[derive(Debug, Clone, Copy)]
pub struct PacketView<'s> {
    /// Current source address.
    pub src: IpAddr,
    /// Source port, if known.
    pub sport: Option<u16>,
    /// Current destination address.
    pub dst: IpAddr,
    /// Current destination port.
    pub dport: u16,
    /// Protocol.
    pub proto: Protocol,
    /// Input interface, if known.
    pub in_iface: Option<&'s str>,
    /// Output interface, if known.
    pub out_iface: Option<&'s str>,
    /// The packet mark (`skb->mark`).
    pub mark: u32,
    /// Connection-tracking facts.
    pub ct: ConntrackState,
    /// `recent` lists this packet's source was added to earlier in the walk (`--set`).
    pub recent: &'s [&'s str],
}

/// Everything a match needs besides the rule and the packet.
#[derive(Debug, Clone, Copy)]
pub struct MatchCtx<'s> {
    /// What the model may know.
    pub policy: MatchPolicy,
    /// The node's addresses.
    pub local: &'s LocalAddrs,
}

/// The result of evaluating one rule's matches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RuleMatch {
    /// Every criterion holds.
    Matches,
    /// Every deterministic criterion holds; `statistic` makes the rule match with this probability
    /// (strictly between 0 and 1).
    Random(f64),
    /// The rule does not match.
    Fails {
        /// Index (into `rule.matches`) of the criterion that fails.
        at: usize,
        /// `Some(reason)` when that criterion could not be decided and was taken as not matching.
        undecidable: Option<&'static str>,
    },
}

/// One criterion's result.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cond {
    Yes,
    No,
    Undecidable(&'static str),
    Random(f64),
}

fn holds(value: bool, negated: bool) -> Cond {
    if value != negated {
        Cond::Yes
    } else {
        Cond::No
    }
}

/// Evaluates `rule`'s criteria against `pkt` (logical AND, in order).
///
/// A definite mismatch wins over an undecidable criterion, so a skipped rule is explained by a
/// real difference whenever there is one. Probabilities of several `statistic` matches multiply.
pub fn matches(rule: &Rule<'_>, pkt: &PacketView<'_>, ctx: &MatchCtx<'_>) -> RuleMatch {
    let mut probability = 1.0_f64;
    let mut undecided: Option<(usize, &'static str)> = None;
    for (at, m) in rule.matches().enumerate() {
        match criterion(rule, &m, pkt, ctx) {
            Cond::Yes => {}
            Cond::No => {
                return RuleMatch::Fails {
                    at,
                    undecidable: None,
                };
            }
            Cond::Undecidable(why) => {
                undecided.get_or_insert((at, why));
            }
            Cond::Random(p) => probability *= p,
        }
    }
    if let Some((at, why)) = undecided {
        return RuleMatch::Fails {
            at,
            undecidable: Some(why),
        };
    }
    if probability >= 1.0 {
        RuleMatch::Matches
    } else if probability <= 0.0 {
        // A statistic that can never fire: report it as the failing criterion.
        let at = rule
            .matches()
            .position(|m| matches!(m, Match::Module(Module::Statistic(_))))
            .unwrap_or(0);
        RuleMatch::Fails {
            at,
            undecidable: None,
        }
    } else {
        RuleMatch::Random(probability)
    }
}

/// True if the rule carries `-m statistic --mode random --probability P` (the test tracer's
/// "this jump does not terminate" marker).
pub fn has_probability(rule: &Rule<'_>) -> bool {
    rule.matches().any(|m| {
        matches!(
            m,
            Match::Module(Module::Statistic(Statistic::Random { .. }))
        )
    })
}

/// True if the rule has a `-d` criterion.
pub fn has_destination_match(rule: &Rule<'_>) -> bool {
    rule.matches().any(|m| matches!(m, Match::Destination(_)))
}

fn criterion(rule: &Rule<'_>, m: &Match<'_>, pkt: &PacketView<'_>, ctx: &MatchCtx<'_>) -> Cond {
    let kernel = ctx.policy == MatchPolicy::Kernel;
    match m {
        Match::Source(n) => holds(addr_contains(&n.value, pkt.src), n.negated),
        Match::Destination(n) => holds(addr_contains(&n.value, pkt.dst), n.negated),
        Match::Protocol(n) => {
            if kernel {
                match protocol_matches(n.value, pkt.proto) {
                    Some(v) => holds(v, n.negated),
                    None => Cond::Undecidable("unknown protocol name"),
                }
            } else {
                holds(n.value == pkt.proto.name(), n.negated)
            }
        }
        Match::InInterface(n) if kernel => interface(
            n,
            pkt.in_iface,
            "the input interface is not known (give --in-interface)",
        ),
        Match::OutInterface(n) if kernel => interface(
            n,
            pkt.out_iface,
            "the output interface is not known (give --out-interface)",
        ),
        Match::InInterface(_) | Match::OutInterface(_) => Cond::Yes,
        // The packet is never a fragment; the test tracer does not see `-f`.
        Match::Fragment(negated) if kernel => holds(false, *negated),
        Match::Fragment(_) => Cond::Yes,
        Match::Module(module) if kernel => kernel_module(rule, module, pkt, ctx),
        Match::Module(module) => test_module(rule, module, pkt, ctx),
    }
}

/// `-i`/`-o` with iptables' `+` wildcard suffix.
fn interface(n: &Neg<&str>, iface: Option<&str>, unknown: &'static str) -> Cond {
    let Some(name) = iface else {
        return Cond::Undecidable(unknown);
    };
    let hit = match n.value.strip_suffix('+') {
        Some(prefix) => name.starts_with(prefix),
        None => name == n.value,
    };
    holds(hit, n.negated)
}

/// `-p NAME|NUMBER|all`; `None` if the name is not one we know.
fn protocol_matches(rule_proto: &str, proto: Protocol) -> Option<bool> {
    let number = match rule_proto.to_ascii_lowercase().as_str() {
        "all" | "0" => return Some(true),
        "tcp" => 6,
        "udp" => 17,
        "sctp" => 132,
        "icmp" => 1,
        "ipv6-icmp" | "icmpv6" => 58,
        "udplite" => 136,
        "esp" => 50,
        "ah" => 51,
        "gre" => 47,
        other => other.parse::<u8>().ok()?,
    };
    Some(number == proto.number())
}

/// Address containment for `-s`/`-d` (prefix or dotted non-prefix mask); families never mix.
pub fn addr_contains(spec: &AddrSpec<'_>, ip: IpAddr) -> bool {
    match (spec.addr, ip) {
        (IpAddr::V4(net), IpAddr::V4(ip)) => {
            let mask = match spec.mask.and_then(|m| m.parse::<std::net::Ipv4Addr>().ok()) {
                Some(m) => u32::from(m),
                None => prefix_mask_u32(spec.prefix),
            };
            u32::from(net) & mask == u32::from(ip) & mask
        }
        (IpAddr::V6(net), IpAddr::V6(ip)) => {
            let mask = match spec.prefix {
                0 => 0,
                p => u128::MAX << (128 - u32::from(p.min(128))),
            };
            u128::from(net) & mask == u128::from(ip) & mask
        }
        _ => false,
    }
}

fn prefix_mask_u32(prefix: u8) -> u32 {
    match prefix {
        0 => 0,
        p => u32::MAX << (32 - u32::from(p.min(32))),
    }
}

fn port_in(range: &PortRange, port: u16) -> bool {
    range.first <= port && port <= range.last
}

fn mark_holds(n: &Neg<MarkValue>, mark: u32) -> Cond {
    let mask = n.value.mask.unwrap_or(u32::MAX);
    holds(mark & mask == n.value.value, n.negated)
}

/// The kernel's address type of `ip` (`addrtype` names), or `None` for types we cannot know.
fn address_type_matches(types: &str, ip: IpAddr, ctx: &MatchCtx<'_>) -> Option<bool> {
    let actual = if ctx.local.contains(ip) {
        "LOCAL"
    } else if ip.is_multicast() {
        "MULTICAST"
    } else if ip == IpAddr::V4(std::net::Ipv4Addr::BROADCAST) {
        "BROADCAST"
    } else if ip.is_unspecified() {
        "UNSPEC"
    } else {
        "UNICAST"
    };
    let mut any = false;
    for t in types.split(',') {
        let t = t.trim().to_ascii_uppercase();
        match t.as_str() {
            "LOCAL" | "UNICAST" | "MULTICAST" | "BROADCAST" | "UNSPEC" => any |= t == actual,
            _ => return None,
        }
    }
    Some(any)
}

fn addrtype(
    src_type: &Option<Neg<&str>>,
    dst_type: &Option<Neg<&str>>,
    pkt: &PacketView<'_>,
    ctx: &MatchCtx<'_>,
) -> Cond {
    let mut result = Cond::Yes;
    for (ty, ip) in [(src_type, pkt.src), (dst_type, pkt.dst)] {
        let Some(ty) = ty else { continue };
        let cond = match ctx.policy {
            MatchPolicy::Kernel => match address_type_matches(ty.value, ip, ctx) {
                Some(v) => holds(v, ty.negated),
                None => Cond::Undecidable(
                    "address type not modelled (only LOCAL, UNICAST, MULTICAST, BROADCAST)",
                ),
            },
            MatchPolicy::KubeProxyTest => {
                let actual = if ctx.local.contains(ip) {
                    "LOCAL"
                } else {
                    "not-matched"
                };
                holds(actual == ty.value, ty.negated)
            }
        };
        match cond {
            Cond::No => return Cond::No,
            Cond::Undecidable(_) => result = cond,
            _ => {}
        }
    }
    result
}

/// `--tcp-flags MASK COMP` for the first packet of a connection (flags = SYN).
fn tcp_flags_hold(opt: &GenericOpt<'_>) -> Option<bool> {
    let parse = |list: &str| -> Option<u8> {
        let mut bits = 0u8;
        for f in list.split(',') {
            bits |= match f.trim().to_ascii_uppercase().as_str() {
                "FIN" => 0x01,
                "SYN" => 0x02,
                "RST" => 0x04,
                "PSH" => 0x08,
                "ACK" => 0x10,
                "URG" => 0x20,
                "ALL" => 0x3f,
                "NONE" => 0,
                _ => return None,
            };
        }
        Some(bits)
    };
    let mut values = opt.values.iter();
    let mask = parse(&values.next()?)?;
    let comp = parse(&values.next()?)?;
    Some((0x02 & mask == comp) != opt.negated)
}

fn kernel_module(
    rule: &Rule<'_>,
    module: &Module<'_>,
    pkt: &PacketView<'_>,
    ctx: &MatchCtx<'_>,
) -> Cond {
    match module {
        Module::Comment(_) | Module::Nfacct(_) => Cond::Yes,
        Module::Ports {
            proto,
            sport,
            dport,
            other,
        } => {
            if protocol_matches(proto, pkt.proto) != Some(true) {
                return Cond::No;
            }
            if let Some(d) = dport
                && port_in(&d.value, pkt.dport) == d.negated
            {
                return Cond::No;
            }
            let mut result = Cond::Yes;
            if let Some(s) = sport {
                match pkt.sport {
                    Some(p) if port_in(&s.value, p) == s.negated => return Cond::No,
                    Some(_) => {}
                    None => {
                        result = Cond::Undecidable("the source port is not known (give SRC:SPORT)")
                    }
                }
            }
            for opt in rule.options(*other) {
                let decided = match (pkt.proto, opt.name) {
                    (Protocol::Tcp, "syn") => Some(!opt.negated),
                    (Protocol::Tcp, "tcp-flags") => tcp_flags_hold(&opt),
                    _ => None,
                };
                match decided {
                    Some(false) => return Cond::No,
                    Some(true) => {}
                    None => result = Cond::Undecidable("protocol match option not modelled"),
                }
            }
            result
        }
        Module::Multiport { kind, ports } => {
            let any_in = |p: u16| ports.value.iter().any(|r| port_in(&r, p));
            let hit = match kind {
                MultiportKind::Dports => any_in(pkt.dport),
                MultiportKind::Sports => match pkt.sport {
                    Some(p) => any_in(p),
                    None => {
                        return Cond::Undecidable("the source port is not known (give SRC:SPORT)");
                    }
                },
                _ => any_in(pkt.dport) || pkt.sport.is_some_and(any_in),
            };
            holds(hit, ports.negated)
        }
        Module::Statistic(Statistic::Random {
            probability,
            negated,
            ..
        }) => {
            // The kernel stores round(p * 2^31) and matches when (random & 0x7fffffff) < that.
            let stored = (probability * 2_147_483_648.0)
                .round()
                .clamp(0.0, 2_147_483_648.0);
            let p = stored / 2_147_483_648.0;
            Cond::Random(if *negated { 1.0 - p } else { p })
        }
        Module::Statistic(Statistic::Nth { every, negated, .. }) => {
            let p = 1.0 / f64::from((*every).max(1));
            Cond::Random(if *negated { 1.0 - p } else { p })
        }
        Module::Recent(r) => {
            let listed = pkt.recent.contains(&r.name);
            match r.action {
                RecentAction::Set => holds(true, r.negated),
                RecentAction::Rcheck | RecentAction::Update | RecentAction::Remove => {
                    holds(listed, r.negated)
                }
            }
        }
        Module::Addrtype {
            src_type, dst_type, ..
        } => addrtype(src_type, dst_type, pkt, ctx),
        Module::Mark(n) => mark_holds(n, pkt.mark),
        // A new connection's connmark is 0.
        Module::Connmark(n) => mark_holds(n, 0),
        Module::Conntrack { ctstate, other } => {
            if !other.is_empty() {
                return Cond::Undecidable("conntrack option other than --ctstate not modelled");
            }
            match ctstate {
                Some(states) => ctstate_holds(states, pkt, true),
                None => Cond::Yes,
            }
        }
        Module::State(states) => ctstate_holds(states, pkt, false),
        Module::Set { .. } => Cond::Undecidable("ipset contents are not known"),
        Module::Generic { .. } => Cond::Undecidable("match module not modelled"),
    }
}

/// `--ctstate`/`--state` for the first packet: `NEW` (or `UNTRACKED`), plus `DNAT`/`SNAT`
/// (conntrack only) once the connection was NATed.
fn ctstate_holds(states: &Neg<List<'_>>, pkt: &PacketView<'_>, virtual_states: bool) -> Cond {
    let hit = states
        .value
        .iter()
        .any(|s| match s.to_ascii_uppercase().as_str() {
            "NEW" => !pkt.ct.untracked,
            "UNTRACKED" => pkt.ct.untracked,
            "DNAT" => virtual_states && pkt.ct.dnat,
            "SNAT" => virtual_states && pkt.ct.snat,
            _ => false,
        });
    holds(hit, states.negated)
}

fn test_module(
    rule: &Rule<'_>,
    module: &Module<'_>,
    pkt: &PacketView<'_>,
    ctx: &MatchCtx<'_>,
) -> Cond {
    match module {
        // The tracer compares `--dport` as a decimal string: a range never equals a port.
        Module::Ports { dport: Some(d), .. } => holds(
            d.value.first == d.value.last && d.value.first == pkt.dport,
            d.negated,
        ),
        Module::Addrtype {
            src_type, dst_type, ..
        } => addrtype(src_type, dst_type, pkt, ctx),
        // MarkCheck / CTStateCheck / AffinityCheck: "no history", never match.
        Module::Mark(_) | Module::Connmark(_) => Cond::No,
        Module::Conntrack {
            ctstate: Some(_), ..
        } => Cond::No,
        Module::Recent(r) if r.action == RecentAction::Rcheck => Cond::No,
        Module::Generic { options, .. }
            if rule
                .options(*options)
                .any(|o| matches!(o.name, "mark" | "ctstate" | "rcheck")) =>
        {
            Cond::No
        }
        _ => Cond::Yes,
    }
}

/// One criterion in iptables-save syntax (`! -d 10.0.0.0/8`, `-m mark --mark 0x4000/0x4000`),
/// for explaining why a rule was skipped.
pub fn describe_match(rule: &Rule<'_>, m: &Match<'_>) -> String {
    let bang = |negated: bool| if negated { "! " } else { "" };
    let range = |r: &PortRange| {
        if r.first == r.last {
            r.first.to_string()
        } else {
            format!("{}:{}", r.first, r.last)
        }
    };
    match m {
        Match::Source(n) => format!("{}-s {}", bang(n.negated), n.value.raw),
        Match::Destination(n) => format!("{}-d {}", bang(n.negated), n.value.raw),
        Match::Protocol(n) => format!("{}-p {}", bang(n.negated), n.value),
        Match::InInterface(n) => format!("{}-i {}", bang(n.negated), n.value),
        Match::OutInterface(n) => format!("{}-o {}", bang(n.negated), n.value),
        Match::Fragment(negated) => format!("{}-f", bang(*negated)),
        Match::Module(module) => match module {
            Module::Comment(c) => format!("-m comment --comment {:?}", c.value()),
            Module::Ports {
                proto,
                sport,
                dport,
                other,
            } => {
                let mut s = format!("-m {proto}");
                if let Some(p) = sport {
                    s += &format!(" {}--sport {}", bang(p.negated), range(&p.value));
                }
                if let Some(p) = dport {
                    s += &format!(" {}--dport {}", bang(p.negated), range(&p.value));
                }
                for o in rule.options(*other) {
                    s += &format!(" {}", describe_opt(&o));
                }
                s
            }
            Module::Multiport { kind, ports } => format!(
                "-m multiport {}--{} {}",
                bang(ports.negated),
                kind.name(),
                ports
                    .value
                    .iter()
                    .map(|r| range(&r))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Module::Statistic(Statistic::Random { text, negated, .. }) => {
                format!(
                    "-m statistic --mode random {}--probability {text}",
                    bang(*negated)
                )
            }
            Module::Statistic(Statistic::Nth {
                every,
                packet,
                negated,
            }) => format!(
                "-m statistic --mode nth {}--every {every} --packet {packet}",
                bang(*negated)
            ),
            Module::Recent(r) => {
                let action = match r.action {
                    RecentAction::Set => "set",
                    RecentAction::Rcheck => "rcheck",
                    RecentAction::Update => "update",
                    RecentAction::Remove => "remove",
                };
                format!("-m recent {}--{action} --name {}", bang(r.negated), r.name)
            }
            Module::Addrtype {
                src_type, dst_type, ..
            } => {
                let mut s = "-m addrtype".to_string();
                if let Some(t) = src_type {
                    s += &format!(" {}--src-type {}", bang(t.negated), t.value);
                }
                if let Some(t) = dst_type {
                    s += &format!(" {}--dst-type {}", bang(t.negated), t.value);
                }
                s
            }
            Module::Mark(n) | Module::Connmark(n) => {
                let name = if matches!(module, Module::Mark(_)) {
                    "mark"
                } else {
                    "connmark"
                };
                match n.value.mask {
                    Some(mask) => format!(
                        "-m {name} {}--mark {:#x}/{mask:#x}",
                        bang(n.negated),
                        n.value.value
                    ),
                    None => format!("-m {name} {}--mark {:#x}", bang(n.negated), n.value.value),
                }
            }
            Module::Conntrack { ctstate, other } => {
                let mut s = "-m conntrack".to_string();
                if let Some(st) = ctstate {
                    s += &format!(" {}--ctstate {}", bang(st.negated), st.value.raw);
                }
                for o in rule.options(*other) {
                    s += &format!(" {}", describe_opt(&o));
                }
                s
            }
            Module::State(st) => format!("-m state {}--state {}", bang(st.negated), st.value.raw),
            Module::Set {
                name,
                flags,
                negated,
                ..
            } => format!("-m set {}--match-set {name} {flags}", bang(*negated)),
            Module::Nfacct(name) => format!("-m nfacct --nfacct-name {name}"),
            Module::Generic { name, options } => {
                let mut s = format!("-m {name}");
                for o in rule.options(*options) {
                    s += &format!(" {}", describe_opt(&o));
                }
                s
            }
        },
    }
}

fn describe_opt(o: &GenericOpt<'_>) -> String {
    let mut s = format!("{}--{}", if o.negated { "! " } else { "" }, o.name);
    for v in o.values.iter() {
        s.push(' ');
        s.push_str(&v);
    }
    s
}
