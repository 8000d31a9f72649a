//! The rule specification: everything after `-A CHAIN`.
//!
//! Syntax (iptables(8) "PARAMETERS", plus `-c` of `iptables -S -v`):
//!
//! ```text
//! spec    = { item }
//! item    = [ "!" ] basic | "-m" MODULE | [ "!" ] "--" OPTION { VALUE }
//!         | ( "-j" | "-g" ) TARGET | "-c" PACKETS BYTES
//! basic   = ( "-s" | "-d" ) ADDR[/MASK] | "-p" PROTO | ( "-i" | "-o" ) IFACE | "-f"
//! ```
//!
//! Long forms (`--source`, `--destination`, `--src`, `--dst`, `--protocol`, `--in-interface`,
//! `--out-interface`, `--match`, `--jump`, `--goto`, `--fragment`, `--set-counters`) are accepted.
//! A `--option` belongs to the target when it follows `-j NAME` and the target accepts it;
//! otherwise to the most recently loaded module that accepts it; otherwise, for `--dport` and the
//! like, to the protocol module that `-p tcp|udp|sctp|icmp` loads implicitly (kube-proxy writes
//! `-m tcp -p tcp -d X --dport 80`, and `-p tcp --dport 80` without `-m tcp` is legal).

use std::ops::Range;

use super::ast::{Counters, Match, Module, Neg, OptList};
use super::code::{Enc, assemble};
use super::lexer::{Fail, Tok, tokenize};
use super::matches::{OptView, accepts, build_module, implicit_module};
use super::targets::{build_target, target_accepts};
use super::values;

/// Who an option belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Owner {
    /// The n-th loaded module.
    Module(usize),
    /// The target.
    Target,
}

/// An option gathered while walking the words, by word indices.
#[derive(Debug, Clone)]
struct PendingOpt<'a> {
    owner: Owner,
    negated: bool,
    name: &'a str,
    at: usize,
    values: Range<usize>,
}

/// The target as written: `-j`/`-g`, its name, the stray words that followed the name.
#[derive(Debug, Clone)]
struct TargetSpec<'a> {
    goto: bool,
    name: &'a str,
    name_start: usize,
    stray: Range<usize>,
    /// One past the last word of the target's own run: the name, stray words, and the options
    /// (with values) it owns that directly follow. Later words belong elsewhere.
    run_end: usize,
}

/// Reusable buffers, so that parsing a line allocates only the rule's code.
#[derive(Debug, Default)]
pub(crate) struct Scratch<'a> {
    toks: Vec<Tok<'a>>,
    opts: Vec<PendingOpt<'a>>,
    module_names: Vec<&'a str>,
    module_slots: Vec<usize>,
    matches: Vec<Match<'a>>,
    /// Encoded option lists of this rule (the code's option area).
    pool: Vec<u8>,
    /// Encoded match records.
    match_code: Vec<u8>,
    /// Encoded target record.
    target_code: Vec<u8>,
    /// Option views of the line (empty between lines; see [`recycle`]).
    views: Vec<OptView<'a, 'a>>,
}

/// Where a rule's generic options are written while its matches and target are typed.
pub(crate) struct Pool<'s, 'a> {
    raw: &'a str,
    buf: &'s mut Vec<u8>,
}

impl<'a> Pool<'_, 'a> {
    /// Writes `opts` as one list.
    pub(crate) fn push<'v, 't: 'v>(
        &mut self,
        opts: impl IntoIterator<Item = &'v OptView<'t, 'a>>,
    ) -> OptList
    where
        'a: 't,
    {
        let at = self.buf.len() as u32;
        let mut len = 0u32;
        let mut e = Enc::new(self.raw, self.buf);
        for o in opts {
            e.option(o.negated, o.name, o.span);
            len += 1;
        }
        OptList { at, len }
    }
}

/// What a rule specification holds: its text and its encoded facts.
#[derive(Debug)]
pub(crate) struct Spec<'a> {
    /// The specification as written (blanks trimmed).
    pub raw: &'a str,
    /// The encoded matches, target and counters.
    pub code: Box<[u8]>,
}

/// The value word of a single-valued option at word `i` (the option itself).
fn value_of<'t, 'a>(
    toks: &'t [Tok<'a>],
    i: usize,
    what: &'static str,
) -> Result<&'t Tok<'a>, Fail> {
    let opt = &toks[i];
    match toks.get(i + 1) {
        Some(v) if !v.is_option() && !v.is_bang() => Ok(v),
        Some(v) => Err(Fail::new(v.start, what, &v.value())),
        None => Err(Fail::new(opt.end, what, "")),
    }
}

/// `counter = 1*DIGIT`
fn counter(t: &Tok<'_>) -> Result<u64, Fail> {
    t.value()
        .parse()
        .map_err(|_| Fail::new(t.start, "a counter", &t.value()))
}

/// The options iptables itself parses (iptables(8) "PARAMETERS"), then module or target options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OptKind {
    Source,
    Destination,
    Protocol,
    InInterface,
    OutInterface,
    Fragment,
    Match,
    Jump,
    Goto,
    Counters,
    /// `--NAME`: an option of a match module or of the target.
    Long,
    /// Not an option.
    Other,
}

/// What option `opt` is, by its bytes (one dispatch instead of a string comparison per
/// alternative: a node's dump has millions of options).
fn option_kind(opt: &str) -> OptKind {
    match opt.as_bytes() {
        [b'-', c] => match c {
            b's' => OptKind::Source,
            b'd' => OptKind::Destination,
            b'p' => OptKind::Protocol,
            b'i' => OptKind::InInterface,
            b'o' => OptKind::OutInterface,
            b'f' => OptKind::Fragment,
            b'm' => OptKind::Match,
            b'j' => OptKind::Jump,
            b'g' => OptKind::Goto,
            b'c' => OptKind::Counters,
            // `--`: a long option without a name.
            b'-' => OptKind::Long,
            _ => OptKind::Other,
        },
        [b'-', b'-', long @ ..] => match long {
            b"source" | b"src" => OptKind::Source,
            b"destination" | b"dst" => OptKind::Destination,
            b"protocol" => OptKind::Protocol,
            b"in-interface" => OptKind::InInterface,
            b"out-interface" => OptKind::OutInterface,
            b"fragment" => OptKind::Fragment,
            b"match" => OptKind::Match,
            b"jump" => OptKind::Jump,
            b"goto" => OptKind::Goto,
            b"set-counters" => OptKind::Counters,
            _ => OptKind::Long,
        },
        _ => OptKind::Other,
    }
}

/// Parses the specification `line[from..]` (see the module doc for the grammar).
/// `first_addr` reports the first `-s`/`-d` address seen, for family detection.
pub(crate) fn parse_spec<'a>(
    line: &'a str,
    from: usize,
    prefix: Option<Counters>,
    scratch: &mut Scratch<'a>,
    first_addr: &mut Option<bool>,
) -> Result<Spec<'a>, Fail> {
    let Scratch {
        toks,
        opts,
        module_names,
        module_slots,
        matches,
        pool,
        match_code,
        target_code,
        views: view_buf,
    } = scratch;
    pool.clear();
    match_code.clear();
    target_code.clear();
    toks.clear();
    opts.clear();
    module_names.clear();
    module_slots.clear();
    // Matches in written order; a module's slot holds a placeholder until its options are typed.
    matches.clear();
    tokenize(line, from, toks)?;

    let mut target: Option<TargetSpec<'a>> = None;
    let mut after_target = false;
    let mut counters = None;
    let mut protocol: Option<&'a str> = None;
    let mut neg: Option<usize> = None;
    let mut i = 0;
    while let Some(tok) = toks.get(i) {
        if tok.is_bang() {
            if neg.is_some() {
                return Err(Fail::new(tok.start, "an option after `!`", "!"));
            }
            neg = Some(tok.start);
            i += 1;
            continue;
        }
        if !tok.is_option() {
            if let Some(t) = target.as_mut().filter(|t| after_target && t.stray.end == i) {
                t.stray.end = i + 1;
                t.run_end = i + 1;
                i += 1;
                continue;
            }
            return Err(Fail::new(tok.start, "an option", &tok.value()));
        }
        let negated = neg.take().is_some();
        let opt = tok.borrowed()?;
        let negatable = |what: &'static str| -> Result<(), Fail> {
            if negated {
                Err(Fail::new(tok.start, what, opt))
            } else {
                Ok(())
            }
        };
        let kind = option_kind(opt);
        match kind {
            OptKind::Source | OptKind::Destination => {
                let v = value_of(toks, i, "an address[/mask]")?;
                let spec = values::addr_spec(v.borrowed()?)
                    .ok_or_else(|| Fail::new(v.start, "an address[/mask]", &v.value()))?;
                first_addr.get_or_insert(spec.addr.is_ipv6());
                let n = Neg {
                    negated,
                    value: spec,
                };
                matches.push(if kind == OptKind::Source {
                    Match::Source(n)
                } else {
                    Match::Destination(n)
                });
                after_target = false;
                i += 2;
            }
            OptKind::Protocol | OptKind::InInterface | OptKind::OutInterface => {
                let what = if kind == OptKind::Protocol {
                    "a protocol"
                } else {
                    "an interface"
                };
                let value = value_of(toks, i, what)?.borrowed()?;
                let n = Neg { negated, value };
                matches.push(match kind {
                    OptKind::Protocol => {
                        if !negated {
                            protocol = Some(value);
                        }
                        Match::Protocol(n)
                    }
                    OptKind::InInterface => Match::InInterface(n),
                    _ => Match::OutInterface(n),
                });
                after_target = false;
                i += 2;
            }
            OptKind::Fragment => {
                matches.push(Match::Fragment(negated));
                after_target = false;
                i += 1;
            }
            OptKind::Match => {
                negatable("an option that can be negated (not `-m`)")?;
                let name = value_of(toks, i, "a match module name")?.borrowed()?;
                module_names.push(name);
                module_slots.push(matches.len());
                matches.push(Match::Fragment(false));
                after_target = false;
                i += 2;
            }
            OptKind::Jump | OptKind::Goto => {
                negatable("an option that can be negated (not a target)")?;
                if let Some(prev) = &target {
                    return Err(Fail::new(tok.start, "a single target per rule", prev.name));
                }
                let v = value_of(toks, i, "a target name")?;
                target = Some(TargetSpec {
                    goto: kind == OptKind::Goto,
                    name: v.borrowed()?,
                    name_start: v.start,
                    stray: i + 2..i + 2,
                    run_end: i + 2,
                });
                after_target = true;
                i += 2;
            }
            OptKind::Counters => {
                negatable("an option that can be negated (not `-c`)")?;
                let p = value_of(toks, i, "a packet counter")?;
                let b = value_of(toks, i + 1, "a byte counter")?;
                counters = Some(Counters {
                    packets: counter(p)?,
                    bytes: counter(b)?,
                });
                i += 3;
            }
            OptKind::Long => {
                let long = opt;
                let name = &long[2..];
                let mut end = i + 1;
                while toks
                    .get(end)
                    .is_some_and(|t| !t.is_option() && !t.is_bang())
                {
                    end += 1;
                }
                let owner = match &target {
                    Some(t) if after_target && target_accepts(t.name, name) => Owner::Target,
                    _ => match module_names.iter().rposition(|m| accepts(m, name)) {
                        Some(m) => Owner::Module(m),
                        None => match protocol.filter(|p| implicit_module(p, name)) {
                            Some(p) => {
                                module_names.push(p);
                                module_slots.push(matches.len());
                                matches.push(Match::Fragment(false));
                                Owner::Module(module_names.len() - 1)
                            }
                            None if !module_names.is_empty() => {
                                Owner::Module(module_names.len() - 1)
                            }
                            None => {
                                return Err(Fail::new(
                                    tok.start,
                                    "a match module (`-m NAME`) before this option",
                                    long,
                                ));
                            }
                        },
                    },
                };
                if let Some(t) = target
                    .as_mut()
                    .filter(|t| owner == Owner::Target && t.run_end == i)
                {
                    t.run_end = end;
                }
                opts.push(PendingOpt {
                    owner,
                    negated,
                    name,
                    at: tok.start,
                    values: i + 1..end,
                });
                i = end;
            }
            OptKind::Other => return Err(Fail::new(tok.start, "an option", opt)),
        }
    }
    if let Some(at) = neg {
        return Err(Fail::new(at, "an option after `!`", ""));
    }

    // Type the modules and the target from their gathered options, writing generic option lists
    // to the pool as they are made.
    let raw = line
        .get(from..)
        .unwrap_or("")
        .trim_matches(|c| c == ' ' || c == '\t');
    opts.sort_by_key(|o| o.owner);
    let mut views = recycle(std::mem::take(view_buf));
    views.extend(opts.iter().map(|o| OptView {
        negated: o.negated,
        name: o.name,
        at: o.at,
        values: &toks[o.values.clone()],
        span: match (
            toks.get(o.values.start),
            o.values.end.checked_sub(1).and_then(|e| toks.get(e)),
        ) {
            (Some(first), Some(last)) if !o.values.is_empty() => {
                line.get(first.start..last.end).unwrap_or("")
            }
            _ => "",
        },
    }));
    let owned = |owner: Owner| {
        let lo = opts.partition_point(|o| o.owner < owner);
        let hi = opts.partition_point(|o| o.owner <= owner);
        &views[lo..hi]
    };
    let mut pool = Pool { raw, buf: pool };
    for (n, (&name, &slot)) in module_names.iter().zip(module_slots.iter()).enumerate() {
        let module = build_module(name, owned(Owner::Module(n)), &mut pool)?;
        if let Some(m) = matches.get_mut(slot) {
            *m = Match::Module(module);
        }
    }
    let target = match target {
        None => None,
        Some(t) => {
            // Only the target's own words: an option after it that a module owns is printed with
            // that module, and must not be printed again as part of the target.
            let run_end =
                (t.run_end.checked_sub(1).and_then(|w| toks.get(w))).map_or(line.len(), |w| w.end);
            let target_text = line
                .get(t.name_start..run_end)
                .unwrap_or_default()
                .trim_end();
            Some(build_target(
                t.goto,
                t.name,
                &toks[t.stray.clone()],
                owned(Owner::Target),
                target_text,
                &mut pool,
            )?)
        }
    };
    let mut e = Enc::new(raw, match_code);
    for m in matches.iter() {
        e.matcher(m);
    }
    if let Some(t) = &target {
        Enc::new(raw, target_code).target(t);
    }
    let unconditional = matches.iter().all(|m| match m {
        Match::Module(Module::Comment(_) | Module::Nfacct(_)) => true,
        Match::Protocol(p) => !p.negated,
        Match::Module(Module::Ports {
            sport: None,
            dport: None,
            other,
            ..
        }) => other.is_empty(),
        _ => false,
    });
    let code = assemble(
        raw,
        prefix.or(counters),
        target_code,
        target.is_some(),
        matches.len(),
        match_code,
        pool.buf,
        unconditional,
    );
    *view_buf = recycle(views);
    Ok(Spec { raw, code })
}

/// An emptied vector of option views whose borrow of the words has ended, keeping its memory
/// (the in-place `collect` of an empty vector reuses the allocation): one buffer serves every line.
fn recycle<'t, 'u, 'a>(mut v: Vec<OptView<'t, 'a>>) -> Vec<OptView<'u, 'a>> {
    v.clear();
    v.into_iter()
        .map(|_| unreachable!("the vector is empty"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::ast::{
        MarkOp, MarkValue, Module, MultiportKind, PortRange, RecentAction, Rule, RuleOp, Statistic,
        Target,
    };

    fn spec(line: &str) -> Result<Rule<'_>, Fail> {
        let mut s = Scratch::default();
        let spec = parse_spec(line, 0, None, &mut s, &mut None)?;
        Ok(Rule {
            line: 1,
            op: RuleOp::Append,
            raw: spec.raw,
            code: spec.code,
        })
    }

    fn all<'a>(s: &Rule<'a>) -> Vec<Match<'a>> {
        s.matches().collect()
    }

    fn modules<'a>(s: &Rule<'a>) -> Vec<Module<'a>> {
        s.matches()
            .filter_map(|m| match m {
                Match::Module(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    /// The options of list `l` of rule `s`, as (name, values).
    fn opts(s: &Rule<'_>, l: OptList) -> Vec<(String, Vec<String>)> {
        s.options(l)
            .map(|o| (o.name.to_string(), o.values.to_vec()))
            .collect()
    }

    #[test]
    fn kube_proxy_order_attaches_dport_to_the_tcp_module() {
        let s =
            spec(r#"-m comment --comment "x" -m tcp -p tcp -d 10.0.0.1 --dport 80 -j KUBE-SVC-A"#)
                .unwrap();
        assert_eq!(s.matches().len(), 4);
        let m = modules(&s);
        assert!(matches!(
            m[1],
            Module::Ports {
                proto: "tcp",
                dport: Some(Neg {
                    negated: false,
                    value: PortRange {
                        first: 80,
                        last: 80
                    }
                }),
                ..
            }
        ));
        assert_eq!(s.target(), Some(Target::Jump("KUBE-SVC-A")));
    }

    #[test]
    fn dport_with_only_p_loads_the_protocol_module() {
        let s = spec("-p udp ! --dport 53 -m comment --comment c -j ACCEPT").unwrap();
        let m = modules(&s);
        assert!(matches!(
            m[0],
            Module::Ports {
                proto: "udp",
                dport: Some(Neg { negated: true, .. }),
                ..
            }
        ));
        assert!(matches!(m[1], Module::Comment(c) if c.raw == "c"));
        // Without -p and without a module the option has no owner.
        let e = spec("--dport 53 -j ACCEPT").unwrap_err();
        assert_eq!(e.at, 0);
        // `! -p tcp` does not load tcp.
        assert!(spec("! -p tcp --dport 53").is_err());
    }

    #[test]
    fn negation_applies_to_the_next_option_only() {
        let s = spec("! -s 10.0.0.0/8 -d 10.96.0.1/32 -m mark ! --mark 0x4000/0x4000 -j RETURN")
            .unwrap();
        assert!(matches!(&all(&s)[0], Match::Source(n) if n.negated && n.value.prefix == 8));
        assert!(matches!(&all(&s)[1], Match::Destination(n) if !n.negated));
        assert!(matches!(
            modules(&s)[0],
            Module::Mark(Neg {
                negated: true,
                value: MarkValue {
                    value: 0x4000,
                    mask: Some(0x4000)
                }
            })
        ));
        assert!(spec("! ! -s 1.2.3.4").is_err());
        assert!(spec("-s 1.2.3.4 !").is_err());
        assert!(spec("! -m tcp").is_err());
        assert!(spec("! -j ACCEPT").is_err());
    }

    #[test]
    fn statistic_recent_addrtype_conntrack_set() {
        let s = spec("-m statistic --mode random --probability 0.33333333349 -m statistic --mode nth --every 3 --packet 1").unwrap();
        let m = modules(&s);
        assert!(matches!(
            m[0],
            Module::Statistic(Statistic::Random {
                text: "0.33333333349",
                ..
            })
        ));
        assert!(matches!(
            m[1],
            Module::Statistic(Statistic::Nth {
                every: 3,
                packet: 1,
                negated: false
            })
        ));
        let s = spec("-m recent --rcheck --seconds 10800 --reap --name KUBE-SEP-A --mask 255.255.255.255 --rsource -j KUBE-SEP-A").unwrap();
        let Module::Recent(r) = modules(&s)[0] else {
            panic!()
        };
        assert_eq!(
            (r.name, r.action, r.seconds, r.reap, r.mask, r.rdest),
            (
                "KUBE-SEP-A",
                RecentAction::Rcheck,
                Some(10800),
                true,
                Some("255.255.255.255"),
                false
            )
        );
        let s = spec("-m addrtype ! --dst-type LOCAL --limit-iface-in -m conntrack ! --ctstate RELATED,ESTABLISHED,DNAT --ctdir ORIGINAL").unwrap();
        let m = modules(&s);
        assert!(matches!(
            m[0],
            Module::Addrtype {
                dst_type: Some(Neg {
                    negated: true,
                    value: "LOCAL"
                }),
                limit_iface_in: true,
                ..
            }
        ));
        assert!(
            matches!(m[1], Module::Conntrack { ctstate: Some(Neg { negated: true, value }), other } if value.len() == 3 && other.len() == 1)
        );
        let s = spec("-m set ! --match-set KUBE-CLUSTER-IP dst,dst -m state --state NEW -m multiport --dports 80,443,1000:2000").unwrap();
        let m = modules(&s);
        assert!(matches!(
            m[0],
            Module::Set {
                name: "KUBE-CLUSTER-IP",
                flags: "dst,dst",
                negated: true,
                ..
            }
        ));
        assert!(matches!(m[1], Module::State(n) if n.value.raw == "NEW"));
        assert!(
            matches!(m[2], Module::Multiport { kind: MultiportKind::Dports, ports } if ports.value.len() == 3)
        );
    }

    #[test]
    fn unknown_modules_and_options_stay_generic() {
        let s = spec("-m physdev --physdev-is-bridged -m limit --limit 10/min --limit-burst 10 -m foo --bar a b -j NFLOG --nflog-group 100").unwrap();
        let m = modules(&s);
        let Module::Generic {
            name: "physdev",
            options,
        } = m[0]
        else {
            panic!("{:?}", m[0])
        };
        assert_eq!(opts(&s, options), [("physdev-is-bridged".into(), vec![])]);
        assert!(matches!(m[1], Module::Generic { name: "limit", options } if options.len() == 2));
        let Module::Generic {
            name: "foo",
            options,
        } = m[2]
        else {
            panic!("{:?}", m[2])
        };
        assert_eq!(opts(&s, options)[0].1, ["a", "b"]);
        let Some(Target::Generic {
            name: "NFLOG",
            options,
        }) = s.target()
        else {
            panic!("{:?}", s.target())
        };
        assert_eq!(opts(&s, options)[0].1, ["100"]);
        // A typed module with an option it does not know degrades to generic.
        let s = spec("-m comment --comment x --frobnicate").unwrap();
        assert!(
            matches!(modules(&s)[0], Module::Generic { name: "comment", options } if options.len() == 2)
        );
    }

    #[test]
    fn targets() {
        fn t(l: &'static str) -> Target<'static> {
            spec(l).unwrap().target().unwrap()
        }
        assert!(
            matches!(t("-j DNAT --to-destination [fd00::1]:80"), Target::Dnat { to, random: false, .. } if to.ports == Some(PortRange { first: 80, last: 80 }))
        );
        assert!(matches!(
            t("-j SNAT --to-source 192.168.0.174 --random-fully"),
            Target::Snat {
                random_fully: true,
                ..
            }
        ));
        assert!(matches!(
            t("-j MASQUERADE --to-ports 1000-2000 --random-fully"),
            Target::Masquerade {
                to_ports: Some(PortRange {
                    first: 1000,
                    last: 2000
                }),
                random_fully: true,
                random: false
            }
        ));
        assert_eq!(
            t("-j MARK --or-mark 0x00004000"),
            Target::Mark(MarkOp::Or(0x4000))
        );
        assert_eq!(
            t("-j MARK --set-xmark 0x4000/0x0"),
            Target::Mark(MarkOp::SetXmark {
                value: 0x4000,
                mask: 0
            })
        );
        assert_eq!(
            t("-j MARK --set-mark 0x1"),
            Target::Mark(MarkOp::SetMark {
                value: 1,
                mask: u32::MAX
            })
        );
        assert_eq!(t("-j MARK --and-mark 0x1"), Target::Mark(MarkOp::And(1)));
        assert_eq!(t("-j MARK --xor-mark 0x1"), Target::Mark(MarkOp::Xor(1)));
        assert_eq!(t("-j REJECT"), Target::Reject { with: None });
        assert_eq!(
            t("-j REJECT --reject-with icmp-port-unreachable"),
            Target::Reject {
                with: Some("icmp-port-unreachable")
            }
        );
        assert!(
            matches!(t("-j CONNMARK --restore-mark --nfmask 0x80 --ctmask 0x80"), Target::Connmark(o) if o.len() == 3)
        );
        let s = spec("-j LOG --log-prefix \"x y\"").unwrap();
        let Some(Target::Log(o)) = s.target() else {
            panic!()
        };
        assert_eq!(opts(&s, o)[0].1, ["x y"]);
        assert!(matches!(t("-j CT --notrack"), Target::Ct(o) if o.len() == 1));
        assert_eq!(t("-j NOTRACK"), Target::Notrack);
        assert_eq!(t("-j TRACE"), Target::Trace);
        assert_eq!(t("-g KUBE-SVC-A"), Target::Goto("KUBE-SVC-A"));
        assert_eq!(t("-j cni-abc"), Target::Jump("cni-abc"));
        assert!(spec("-j ACCEPT -j DROP").is_err());
        assert!(spec("-j ACCEPT foo").is_ok());
        assert!(spec("-g X --foo").is_err());
        assert!(spec("-j MARK --or-mark zz").is_err());
    }

    #[test]
    fn nat_ports_iptables_refuses_are_errors_at_the_range() {
        // `:-1` would read as the range 0-1: a trace would DNAT to port 0.
        for (line, range) in [
            (
                "-p tcp -j DNAT --to-destination 10.244.0.5:-1",
                "10.244.0.5:-1",
            ),
            ("-j DNAT --to-destination [fd00::5]:-1", "[fd00::5]:-1"),
            (
                "-j DNAT --to-destination 10.244.0.5:90-80",
                "10.244.0.5:90-80",
            ),
            ("-j SNAT --to-source 10.0.0.1:-1", "10.0.0.1:-1"),
        ] {
            let e = spec(line)
                .err()
                .unwrap_or_else(|| panic!("{line}: accepted"));
            assert_eq!(e.at, line.find(range).unwrap_or_default(), "{line}");
            assert!(e.expected.contains("NAT port from 1 to 65535"), "{line}");
            assert_eq!(e.found, format!("`{range}`"), "{line}");
        }
        assert!(spec("-j DNAT --to-destination 10.244.0.5:80-90").is_ok());
        assert!(spec("-j DNAT --to-destination [fd00::5]:8080").is_ok());
    }

    #[test]
    fn undecodable_targets_are_unreadable() {
        fn t(l: &'static str) -> Target<'static> {
            spec(l).unwrap().target().unwrap()
        }
        let reason = |l: &'static str| match t(l) {
            Target::Unreadable { reason, raw } => (reason, raw.to_string()),
            other => panic!("{l}: {other:?}"),
        };
        assert_eq!(
            reason("-p tcp -m tcp -j DNAT [unsupported revision]"),
            (
                "unsupported revision",
                "DNAT [unsupported revision]".to_string()
            )
        );
        assert_eq!(
            reason("-j DNAT --to-destination  --random --to-destination 10.0.0.1:80").0,
            "empty NAT range"
        );
        assert_eq!(
            reason("-j DNAT --to-destination :0 --persistent --to-destination :0 --persistent").0,
            "NAT range without an address"
        );
        assert_eq!(
            reason("-j DNAT --to-destination 0.0.0.0:0").0,
            "NAT range 0.0.0.0:0"
        );
        assert_eq!(
            reason("-j DNAT --to-destination 10.0.0.1:80 --to-destination 10.0.0.2:80").0,
            "repeated NAT range"
        );
        assert_eq!(
            reason("-j DNAT --to-destination garbage").0,
            "undecodable NAT range"
        );
    }

    #[test]
    fn long_forms_fragment_and_interfaces() {
        let s = spec("--source 1.2.3.4 --dst ::1/128 --protocol tcp --in-interface eth0 ! -o cni+ ! -f --match tcp --destination-port 1:2 --jump ACCEPT").unwrap();
        assert!(matches!(&all(&s)[0], Match::Source(_)));
        assert!(matches!(&all(&s)[1], Match::Destination(n) if n.value.addr.is_ipv6()));
        assert!(matches!(&all(&s)[3], Match::InInterface(n) if n.value == "eth0"));
        assert!(matches!(&all(&s)[4], Match::OutInterface(n) if n.negated && n.value == "cni+"));
        assert!(matches!(&all(&s)[5], Match::Fragment(true)));
        assert_eq!(s.target(), Some(Target::Accept));
    }

    #[test]
    fn malformed_values_are_located() {
        let e = spec("-p tcp -m tcp --dport http").unwrap_err();
        assert_eq!((e.at, e.expected.as_ref()), (22, "a port or port range"));
        let e = spec("-s").unwrap_err();
        assert_eq!((e.at, e.found.as_str()), (2, "end of line"));
        let e = spec("-m mark --mark").unwrap_err();
        assert!(e.expected.contains("mark"));
        let e = spec("-m statistic --mode random --probability 2").unwrap_err();
        assert!(e.expected.contains("probability"));
        let e = spec("-w 5").unwrap_err();
        assert_eq!(e.expected, "an option");
    }

    /// Rules whose text passes 64 KiB use four-byte offsets (and a wide header); every part still
    /// reads back.
    #[test]
    fn very_long_rules_decode() {
        let comment = "x".repeat(70_000);
        let line = format!(
            "-s 10.0.0.1/32 -m comment --comment \"{comment}\" -m foo --bar a b -j DNAT --to-destination 10.0.0.2:80"
        );
        let s = spec(&line).unwrap();
        let m = all(&s);
        assert!(matches!(m[1], Match::Module(Module::Comment(c)) if c.raw.len() == 70_000));
        let Match::Module(Module::Generic { options, .. }) = m[2] else {
            panic!("{:?}", m[2])
        };
        assert_eq!(
            opts(&s, options),
            [("bar".into(), vec!["a".into(), "b".into()])]
        );
        assert!(matches!(s.target(), Some(Target::Dnat { to, .. }) if to.raw == "10.0.0.2:80"));
        assert!(!s.is_unconditional());
        assert!(
            spec("-p tcp -m comment --comment x -m tcp -j ACCEPT")
                .unwrap()
                .is_unconditional()
        );
        assert!(
            !spec("-p tcp -m tcp --dport 80 -j ACCEPT")
                .unwrap()
                .is_unconditional()
        );
    }

    #[test]
    fn comment_and_protocol_are_found_without_decoding_the_rest() {
        let s = spec(r#"-s 10.0.0.0/8 -m recent --rcheck --seconds 10 --name X --mask 255.255.255.255 --rsource -m comment --comment "a \"b\"" -m tcp -p udp -j ACCEPT"#).unwrap();
        let c = s.comment().unwrap();
        assert_eq!(c.value(), r#"a "b""#);
        assert_eq!(s.protocol(), Some("udp"));
        let s = spec("! -p tcp -m sctp -j ACCEPT").unwrap();
        assert_eq!((s.comment(), s.protocol()), (None, Some("sctp")));
        assert_eq!(spec("-j ACCEPT").unwrap().protocol(), None);
        // Long records (a 300-byte comment) are skipped and read as well.
        let long = "y".repeat(300);
        let line = format!("-m comment --comment {long} -p tcp -j ACCEPT");
        let s = spec(&line).unwrap();
        assert_eq!(
            (s.comment().map(|c| c.raw.len()), s.protocol()),
            (Some(300), Some("tcp"))
        );
        assert_eq!(all(&s).len(), 2);
    }

    #[test]
    fn unquoted_multi_word_comment_is_one_comment() {
        let s = spec("-m comment --comment kubernetes service portals -j KUBE-SERVICES").unwrap();
        assert!(
            matches!(modules(&s)[0], Module::Comment(c) if c.raw == "kubernetes service portals")
        );
    }

    #[test]
    fn option_kinds_by_short_and_long_name() {
        use super::{OptKind, option_kind};
        let pairs = [
            ("-s", "--source", OptKind::Source),
            ("-s", "--src", OptKind::Source),
            ("-d", "--destination", OptKind::Destination),
            ("-d", "--dst", OptKind::Destination),
            ("-p", "--protocol", OptKind::Protocol),
            ("-i", "--in-interface", OptKind::InInterface),
            ("-o", "--out-interface", OptKind::OutInterface),
            ("-f", "--fragment", OptKind::Fragment),
            ("-m", "--match", OptKind::Match),
            ("-j", "--jump", OptKind::Jump),
            ("-g", "--goto", OptKind::Goto),
            ("-c", "--set-counters", OptKind::Counters),
        ];
        for (short, long, kind) in pairs {
            assert_eq!(option_kind(short), kind, "{short}");
            assert_eq!(option_kind(long), kind, "{long}");
        }
        for long in [
            "--dport",
            "--comment",
            "--to-destination",
            "--",
            "--sourcex",
        ] {
            assert_eq!(option_kind(long), OptKind::Long, "{long}");
        }
        for other in ["-x", "-", "x", "", "-ss", "10.0.0.1"] {
            assert_eq!(option_kind(other), OptKind::Other, "{other}");
        }
    }

    /// Fuzzing (`round_trip`) found `-A ER1132 -p udp --sport 10 -j SNAT --`: the `--` after the
    /// unreadable target went to the `udp` module *and* stayed in the target's text, so the
    /// canonical form printed it twice and grew on every round trip.
    #[test]
    fn options_a_module_owns_are_not_part_of_an_unreadable_targets_text() {
        let s = spec("-p udp --sport 10 -j SNAT --").unwrap();
        assert!(matches!(modules(&s)[0], Module::Ports { other, .. } if other.len() == 1));
        assert!(matches!(
            s.target(),
            Some(Target::Unreadable { raw: "SNAT", .. })
        ));
        let s =
            spec("-j DNAT [unsupported revision] --to-destination 0.0.0.0:0 -m foo --bar").unwrap();
        assert!(matches!(
            s.target(),
            Some(Target::Unreadable {
                raw: "DNAT [unsupported revision] --to-destination 0.0.0.0:0",
                ..
            })
        ));
    }

    /// Fuzzing (`round_trip`) found quoted names with blanks or empty (`-m "AWS, outbound
    /// connections"`, `-p "lb_ traffic requiring SNAT"`, `-p " -j KUBE-PROXY-FIRtp"`): accepted as
    /// names, then printed bare by the canonical form, which no longer parsed as the same rule.
    #[test]
    fn quoted_names_with_blanks_or_empty_are_errors() {
        for (line, at) in [
            (
                r#"-m "AWS, outbound connections" -j AWS-CONNMARK-CHAIN-0"#,
                3,
            ),
            (r#"-p "lb_ traffic requiring SNAT" -j MASQUERADE"#, 3),
            (
                r#"-d 10.43.143.108/32 -p " -j KUBE-PROXY-FIRtp" -j KUBE-MARK-MASQ"#,
                23,
            ),
            (r#"-p tcp -p "" -j ACCEPT"#, 10),
            (r#"-j "KUBE MARK""#, 3),
            (
                r#"-m conntrack --ctstate "RELATED, ESTABLISHED" -j ACCEPT"#,
                23,
            ),
        ] {
            let e = spec(line).unwrap_err();
            assert_eq!(
                (e.at, e.expected.as_ref()),
                (at, "a name (not empty, without blanks)"),
                "{line}"
            );
        }
        assert!(spec(r#"-m "comment" --comment "a b" -p "tcp" -j "ACCEPT""#).is_ok());
    }
}
