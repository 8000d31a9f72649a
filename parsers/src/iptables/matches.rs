//! Match modules: which options each module accepts, and the typed view of a module's options.
//!
//! Syntax of one module (iptables(8), iptables-extensions(8)):
//!
//! ```text
//! module = "-m" NAME { [ "!" ] "--" OPTION { VALUE } }
//! ```
//!
//! Options are gathered per module by the rule grammar first (an option attaches to the most
//! recently loaded module that accepts it); this file then types them. A module whose options do
//! not fit its typed shape (an option we do not know, a missing mandatory option) is kept as
//! [`Module::Generic`] — never an error — so it round-trips. A known option with a malformed value
//! (`--dport http`, `--mark 0xZZ`) is an error.

use super::ast::{
    List, MarkValue, Module, MultiportKind, Neg, PortList, PortRange, Recent, RecentAction,
    Statistic, Text,
};
use super::lexer::{Fail, Tok};
use super::rule::Pool;
use super::values;

/// One option of a module or target, as gathered by the rule grammar.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OptView<'t, 'a> {
    /// `!` before the option.
    pub negated: bool,
    /// Name without the leading dashes.
    pub name: &'a str,
    /// Byte offset of the option word in the line.
    pub at: usize,
    /// The value words that followed.
    pub values: &'t [Tok<'a>],
    /// The input text from the first to the last value word (empty without values).
    pub span: &'a str,
}

impl<'t, 'a> OptView<'t, 'a> {
    /// The single value of the option, or an error naming `what`.
    pub(crate) fn one(&self, what: &'static str) -> Result<&'t Tok<'a>, Fail> {
        match self.values {
            [v] => Ok(v),
            [] => Err(Fail::new(self.at + self.name.len() + 2, what, "")),
            [_, extra, ..] => Err(Fail::new(
                extra.start,
                "an option or `-j TARGET`",
                &extra.value(),
            )),
        }
    }
}

/// Options a known module accepts; `None` for a module we do not know (it accepts every option).
pub(crate) fn module_options(module: &str) -> Option<&'static [&'static str]> {
    Some(match module {
        "comment" => &["comment"],
        "tcp" => &[
            "sport",
            "source-port",
            "dport",
            "destination-port",
            "tcp-flags",
            "syn",
            "tcp-option",
        ],
        "udp" | "udplite" => &["sport", "source-port", "dport", "destination-port"],
        "sctp" => &[
            "sport",
            "source-port",
            "dport",
            "destination-port",
            "chunk-types",
        ],
        "multiport" => &[
            "ports",
            "sports",
            "dports",
            "source-ports",
            "destination-ports",
        ],
        "statistic" => &["mode", "probability", "every", "packet"],
        "recent" => &[
            "name", "set", "rcheck", "update", "remove", "seconds", "hitcount", "rttl", "reap",
            "mask", "rsource", "rdest",
        ],
        "addrtype" => &["src-type", "dst-type", "limit-iface-in", "limit-iface-out"],
        "mark" | "connmark" => &["mark"],
        "conntrack" => &[
            "ctstate",
            "ctproto",
            "ctorigsrc",
            "ctorigdst",
            "ctreplsrc",
            "ctrepldst",
            "ctorigsrcport",
            "ctorigdstport",
            "ctreplsrcport",
            "ctrepldstport",
            "ctstatus",
            "ctexpire",
            "ctdir",
        ],
        "state" => &["state"],
        "set" => &[
            "match-set",
            "set",
            "return-nomatch",
            "update-counters",
            "update-subcounters",
            "packets-eq",
            "packets-lt",
            "packets-gt",
            "bytes-eq",
            "bytes-lt",
            "bytes-gt",
        ],
        "nfacct" => &["nfacct-name"],
        "physdev" => &[
            "physdev-in",
            "physdev-out",
            "physdev-is-in",
            "physdev-is-out",
            "physdev-is-bridged",
        ],
        "limit" => &["limit", "limit-burst"],
        "icmp" => &["icmp-type"],
        "icmp6" => &["icmpv6-type"],
        "iprange" => &["src-range", "dst-range"],
        "pkttype" => &["pkt-type"],
        "owner" => &["uid-owner", "gid-owner", "socket-exists", "suppl-groups"],
        "socket" => &["transparent", "nowildcard", "restore-skmark"],
        _ => return None,
    })
}

/// Whether `module` accepts `--option` (unknown modules accept everything).
pub(crate) fn accepts(module: &str, option: &str) -> bool {
    module_options(module).is_none_or(|opts| opts.contains(&option))
}

/// The module a protocol loads implicitly for an option no loaded module accepts
/// (`-p tcp --dport 80` loads `tcp`; `-p icmp --icmp-type 8` loads `icmp`).
pub(crate) fn implicit_module(protocol: &str, option: &str) -> bool {
    let module = match protocol {
        "ipv6-icmp" | "icmpv6" => "icmp6",
        p => p,
    };
    matches!(
        module,
        "tcp" | "udp" | "udplite" | "sctp" | "icmp" | "icmp6"
    ) && accepts(module, option)
}

/// The value of a port option: `port | first:last`.
fn port_opt(o: &OptView<'_, '_>) -> Result<Neg<PortRange>, Fail> {
    let v = o.one("a port or port range")?;
    let value = values::port_range(&v.value())
        .ok_or_else(|| Fail::new(v.start, "a port or port range", &v.value()))?;
    Ok(Neg {
        negated: o.negated,
        value,
    })
}

/// The value of a mark option: `value[/mask]`.
fn mark_opt(o: &OptView<'_, '_>) -> Result<Neg<MarkValue>, Fail> {
    let v = o.one("a mark value[/mask]")?;
    let value = values::mark_value(&v.value())
        .ok_or_else(|| Fail::new(v.start, "a mark value[/mask]", &v.value()))?;
    Ok(Neg {
        negated: o.negated,
        value,
    })
}

/// A borrowed single word value.
fn word_opt<'a>(o: &OptView<'_, 'a>, what: &'static str) -> Result<&'a str, Fail> {
    o.one(what)?.borrowed()
}

/// A comma-separated list value (`RELATED,ESTABLISHED`).
fn list_opt<'a>(o: &OptView<'_, 'a>, what: &'static str) -> Result<List<'a>, Fail> {
    Ok(List {
        raw: word_opt(o, what)?,
    })
}

/// A decimal number value.
fn u32_opt(o: &OptView<'_, '_>, what: &'static str) -> Result<u32, Fail> {
    let v = o.one(what)?;
    v.value()
        .parse()
        .map_err(|_| Fail::new(v.start, what, &v.value()))
}

/// A flag option (no value).
fn flag(o: &OptView<'_, '_>) -> Result<(), Fail> {
    match o.values.first() {
        None => Ok(()),
        Some(v) => Err(Fail::new(v.start, "an option or `-j TARGET`", &v.value())),
    }
}

/// Types module `name` from its options; `Ok(None)` means "keep generic". Options a typed module
/// keeps generic (`other`) go to `pool` only once the module is known to be typed.
fn typed<'a>(
    name: &'a str,
    opts: &[OptView<'_, 'a>],
    pool: &mut Pool<'_, 'a>,
) -> Result<Option<Module<'a>>, Fail> {
    Ok(Some(match name {
        // comment = "--comment" TEXT
        // (kube-proxy's test fake stores multi-word comments unquoted: `--comment kubernetes service
        // portals`; such words are read as one comment.)
        "comment" => match opts {
            [o] if o.name == "comment" && !o.negated => match o.values {
                [_, _, ..] if o.values.iter().all(|t| !t.quoted) => Module::Comment(Text {
                    raw: o.span,
                    escaped: false,
                }),
                _ => Module::Comment(o.one("a comment text")?.text_view()),
            },
            _ => return Ok(None),
        },
        // tcp/udp/sctp = { [!] --sport P | [!] --dport P | other }
        "tcp" | "udp" | "sctp" | "udplite" => {
            let (mut sport, mut dport) = (None, None);
            for o in opts {
                match o.name {
                    "sport" | "source-port" => sport = Some(port_opt(o)?),
                    "dport" | "destination-port" => dport = Some(port_opt(o)?),
                    _ => {}
                }
            }
            let is_port = |o: &&OptView<'_, 'a>| {
                matches!(
                    o.name,
                    "sport" | "source-port" | "dport" | "destination-port"
                )
            };
            Module::Ports {
                proto: name,
                sport,
                dport,
                other: pool.push(opts.iter().filter(|o| !is_port(o))),
            }
        }
        // multiport = [!] ( --ports | --sports | --dports ) P{,P}
        "multiport" => match opts {
            [o] => {
                let kind = match o.name {
                    "sports" | "source-ports" => MultiportKind::Sports,
                    "dports" | "destination-ports" => MultiportKind::Dports,
                    _ => MultiportKind::Ports,
                };
                let v = o.one("a port list")?;
                let raw = v.borrowed()?;
                if !values::is_port_list(raw) {
                    return Err(Fail::new(v.start, "a port list", &v.value()));
                }
                Module::Multiport {
                    kind,
                    ports: Neg {
                        negated: o.negated,
                        value: PortList { raw },
                    },
                }
            }
            _ => return Ok(None),
        },
        "statistic" => match statistic(opts)? {
            Some(s) => Module::Statistic(s),
            None => return Ok(None),
        },
        "recent" => match recent(opts)? {
            Some(r) => Module::Recent(r),
            None => return Ok(None),
        },
        // addrtype = [ [!] --src-type T ] [ [!] --dst-type T ] [ --limit-iface-in | --limit-iface-out ]
        "addrtype" => {
            let (mut src_type, mut dst_type, mut lin, mut lout) = (None, None, false, false);
            for o in opts {
                match o.name {
                    "src-type" => {
                        src_type = Some(Neg {
                            negated: o.negated,
                            value: word_opt(o, "an address type")?,
                        })
                    }
                    "dst-type" => {
                        dst_type = Some(Neg {
                            negated: o.negated,
                            value: word_opt(o, "an address type")?,
                        })
                    }
                    "limit-iface-in" => {
                        flag(o)?;
                        lin = true
                    }
                    "limit-iface-out" => {
                        flag(o)?;
                        lout = true
                    }
                    _ => return Ok(None),
                }
            }
            Module::Addrtype {
                src_type,
                dst_type,
                limit_iface_in: lin,
                limit_iface_out: lout,
            }
        }
        // mark = [!] --mark V[/M] ; connmark likewise
        "mark" | "connmark" => match opts {
            [o] if o.name == "mark" => {
                let m = mark_opt(o)?;
                if name == "mark" {
                    Module::Mark(m)
                } else {
                    Module::Connmark(m)
                }
            }
            _ => return Ok(None),
        },
        // conntrack = [!] --ctstate S{,S} | other
        "conntrack" => {
            let mut ctstate = None;
            let mut state_at = None;
            for (i, o) in opts.iter().enumerate() {
                if o.name == "ctstate" && ctstate.is_none() {
                    ctstate = Some(Neg {
                        negated: o.negated,
                        value: list_opt(o, "conntrack states")?,
                    });
                    state_at = Some(i);
                }
            }
            let other = pool.push(
                opts.iter()
                    .enumerate()
                    .filter(|(i, _)| Some(*i) != state_at)
                    .map(|(_, o)| o),
            );
            Module::Conntrack { ctstate, other }
        }
        // state = [!] --state S{,S}
        "state" => match opts {
            [o] if o.name == "state" => Module::State(Neg {
                negated: o.negated,
                value: list_opt(o, "states")?,
            }),
            _ => return Ok(None),
        },
        // set = [!] --match-set NAME FLAGS { other }
        "set" => {
            let mut found = None;
            for (i, o) in opts.iter().enumerate() {
                match (o.name, o.values) {
                    ("match-set" | "set", [n, f]) if found.is_none() => {
                        found = Some((n.borrowed()?, f.borrowed()?, o.negated, i))
                    }
                    _ => {}
                }
            }
            match found {
                Some((name, flags, negated, at)) => Module::Set {
                    name,
                    flags,
                    negated,
                    other: pool.push(
                        opts.iter()
                            .enumerate()
                            .filter(|(i, _)| *i != at)
                            .map(|(_, o)| o),
                    ),
                },
                None => return Ok(None),
            }
        }
        // nfacct = --nfacct-name NAME
        "nfacct" => match opts {
            [o] if o.name == "nfacct-name" && !o.negated => {
                Module::Nfacct(word_opt(o, "an nfacct name")?)
            }
            _ => return Ok(None),
        },
        _ => return Ok(None),
    }))
}

/// `statistic = --mode random [!] --probability P | --mode nth [!] --every N [--packet P]`
fn statistic<'a>(opts: &[OptView<'_, 'a>]) -> Result<Option<Statistic<'a>>, Fail> {
    let mut mode = None;
    let (mut prob, mut every, mut packet) = (None, None, 0u32);
    for o in opts {
        match o.name {
            "mode" if !o.negated => mode = Some(word_opt(o, "a statistic mode")?),
            "probability" => {
                let v = o.one("a probability")?;
                let text = v.borrowed()?;
                let p: f64 = text
                    .parse()
                    .ok()
                    .filter(|p: &f64| (0.0..=1.0).contains(p))
                    .ok_or_else(|| Fail::new(v.start, "a probability between 0 and 1", text))?;
                prob = Some((text, p, o.negated));
            }
            "every" => every = Some((u32_opt(o, "a packet count")?, o.negated)),
            "packet" if !o.negated => packet = u32_opt(o, "a packet number")?,
            _ => return Ok(None),
        }
    }
    Ok(match (mode, prob, every) {
        (Some("random"), Some((text, probability, negated)), None) => Some(Statistic::Random {
            text,
            probability,
            negated,
        }),
        (Some("nth"), None, Some((every, negated))) => Some(Statistic::Nth {
            every,
            packet,
            negated,
        }),
        _ => None,
    })
}

/// `recent = [--name N] ( [!] --set | [!] --rcheck | [!] --update | [!] --remove ) [--seconds S]
/// [--reap] [--hitcount H] [--rttl] [--mask M] [--rsource | --rdest]`, in any order.
fn recent<'a>(opts: &[OptView<'_, 'a>]) -> Result<Option<Recent<'a>>, Fail> {
    let mut r = Recent {
        name: "DEFAULT",
        action: RecentAction::Set,
        negated: false,
        seconds: None,
        hitcount: None,
        reap: false,
        rttl: false,
        mask: None,
        rdest: false,
    };
    let mut action = None;
    for o in opts {
        let act = match o.name {
            "set" => Some(RecentAction::Set),
            "rcheck" => Some(RecentAction::Rcheck),
            "update" => Some(RecentAction::Update),
            "remove" => Some(RecentAction::Remove),
            _ => None,
        };
        if let Some(a) = act {
            flag(o)?;
            if action.is_some() {
                return Ok(None);
            }
            action = Some(a);
            r.negated = o.negated;
            continue;
        }
        if o.negated {
            return Ok(None);
        }
        match o.name {
            "name" => r.name = word_opt(o, "a list name")?,
            "seconds" => r.seconds = Some(u32_opt(o, "a number of seconds")?),
            "hitcount" => r.hitcount = Some(u32_opt(o, "a hit count")?),
            "reap" => {
                flag(o)?;
                r.reap = true
            }
            "rttl" => {
                flag(o)?;
                r.rttl = true
            }
            "mask" => r.mask = Some(word_opt(o, "an address mask")?),
            "rsource" => {
                flag(o)?;
                r.rdest = false
            }
            "rdest" => {
                flag(o)?;
                r.rdest = true
            }
            _ => return Ok(None),
        }
    }
    Ok(action.map(|a| {
        r.action = a;
        r
    }))
}

/// Builds the module `name` from its options: typed when it fits, [`Module::Generic`] otherwise.
pub(crate) fn build_module<'a>(
    name: &'a str,
    opts: &[OptView<'_, 'a>],
    pool: &mut Pool<'_, 'a>,
) -> Result<Module<'a>, Fail> {
    if let Some(m) = typed(name, opts, pool)? {
        return Ok(m);
    }
    Ok(Module::Generic {
        name,
        options: pool.push(opts),
    })
}
