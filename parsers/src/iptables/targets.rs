//! Targets: `-j NAME [options]` and `-g CHAIN`, typed.
//!
//! Syntax (iptables(8), iptables-extensions(8) "TARGET EXTENSIONS"):
//!
//! ```text
//! target = "-g" CHAIN
//!        | "-j" NAME { "--" OPTION { VALUE } }
//! ```
//!
//! An extension whose options do not fit its typed shape is kept as [`Target::Generic`]. Text that
//! a mismatched iptables binary prints for rules it cannot decode — `DNAT [unsupported revision]`,
//! an empty or repeated `--to-destination`, `0.0.0.0:0` / `:0` — becomes [`Target::Unreadable`]
//! (class F02 of docs/incidents.md): it is never an error, and never read as a real destination.

use super::ast::{MarkOp, NatRange, PortRange, Target};
use super::lexer::{Fail, Tok};
use super::matches::OptView;
use super::rule::Pool;
use super::values;

/// Options a known target extension accepts (used to tell a target's options from a match's when a
/// `-m` follows the target); `None` for an unknown target (accepts everything).
pub(crate) fn target_accepts(target: &str, option: &str) -> bool {
    let opts: &[&str] = match target {
        "DNAT" => &["to-destination", "random", "persistent"],
        "SNAT" => &["to-source", "random", "random-fully", "persistent"],
        "MASQUERADE" => &["to-ports", "random", "random-fully"],
        "MARK" => &["set-xmark", "set-mark", "or-mark", "xor-mark", "and-mark"],
        "REJECT" => &["reject-with"],
        "ACCEPT" | "DROP" | "RETURN" | "TRACE" | "NOTRACK" => &[],
        _ => return true,
    };
    opts.contains(&option)
}

/// Whether the NAT range is one a mismatched iptables prints for an undecodable rule.
fn garbled(r: &NatRange<'_>) -> Option<&'static str> {
    let port_zero = r.ports == Some(PortRange { first: 0, last: 0 });
    match r.addr {
        None => Some("NAT range without an address"),
        Some(a) if a.is_unspecified() && (port_zero || r.ports.is_none()) => {
            Some("NAT range 0.0.0.0:0")
        }
        _ => None,
    }
}

/// The one `--to-destination R` / `--to-source R` value; `Err(reason)` when the text is
/// undecodable (or the option is missing or repeated: iptables-save prints one range per rule).
fn nat_range<'a>(opts: &[OptView<'_, 'a>], option: &str) -> Result<NatRange<'a>, &'static str> {
    let mut to = None;
    let mut count = 0;
    for o in opts.iter().filter(|o| o.name == option) {
        let [v] = o.values else {
            return Err(if o.values.is_empty() {
                "empty NAT range"
            } else {
                "extra words in NAT range"
            });
        };
        let Ok(word) = v.borrowed() else {
            return Err("undecodable NAT range");
        };
        let r = values::nat_range(word).ok_or("undecodable NAT range")?;
        if let Some(why) = garbled(&r) {
            return Err(why);
        }
        to.get_or_insert(r);
        count += 1;
    }
    match (to, count) {
        (Some(r), 1) => Ok(r),
        (None, _) => Err("missing NAT range"),
        _ => Err("repeated NAT range"),
    }
}

/// Refuses a NAT range whose ports iptables never prints and iptables-restore refuses
/// (`10.0.0.1:-1`, `10.0.0.1:9-1`): the first port must be written and the last must not come
/// before it (libxt_DNAT's `parse_to`). Read on, `:-1` would be the range 0–1 and a trace
/// would DNAT to port 0.
fn nat_ports_valid(to: &NatRange<'_>, opts: &[OptView<'_, '_>], option: &str) -> Result<(), Fail> {
    let Some(ports) = to.ports else {
        return Ok(());
    };
    // The port part: after the closing bracket of an IPv6 address, else after the last `:`.
    let after_addr = to.raw.rsplit_once(']').map_or(to.raw, |(_, rest)| rest);
    let port_text = after_addr.rsplit_once(':').map_or("", |(_, p)| p);
    if !port_text.starts_with('-') && ports.last >= ports.first {
        return Ok(());
    }
    let at = opts
        .iter()
        .find(|o| o.name == option)
        .and_then(|o| o.values.first())
        .map_or(0, |v| v.start);
    Err(Fail::new(
        at,
        "a NAT port from 1 to 65535 (or a range FIRST-LAST with FIRST ≤ LAST)",
        to.raw,
    ))
}

/// Whether flag option `name` is present (and written without values).
fn has_flag(opts: &[OptView<'_, '_>], name: &str) -> bool {
    opts.iter().any(|o| o.name == name)
}

/// `MARK = --set-xmark V[/M] | --set-mark V[/M] | --or-mark V | --xor-mark V | --and-mark V`
fn mark_op(opts: &[OptView<'_, '_>]) -> Result<Option<MarkOp>, Fail> {
    let [o] = opts else { return Ok(None) };
    if o.negated {
        return Ok(None);
    }
    let v = o.one("a mark value")?;
    let bad = || Fail::new(v.start, "a mark value", &v.value());
    let op = match o.name {
        "set-xmark" | "set-mark" => {
            let m = values::mark_value(&v.value()).ok_or_else(bad)?;
            let mask = m.mask.unwrap_or(u32::MAX);
            if o.name == "set-xmark" {
                MarkOp::SetXmark {
                    value: m.value,
                    mask,
                }
            } else {
                MarkOp::SetMark {
                    value: m.value,
                    mask,
                }
            }
        }
        "or-mark" => MarkOp::Or(values::number(&v.value()).ok_or_else(bad)?),
        "xor-mark" => MarkOp::Xor(values::number(&v.value()).ok_or_else(bad)?),
        "and-mark" => MarkOp::And(values::number(&v.value()).ok_or_else(bad)?),
        _ => return Ok(None),
    };
    Ok(Some(op))
}

/// Builds the target from `-j NAME` (or `-g NAME` when `goto`), the words that followed the name
/// before any option (`stray`), its options, and its text (`raw`, from the name to the end of
/// its own words). Generic option lists are written to `pool`.
pub(crate) fn build_target<'a>(
    goto: bool,
    name: &'a str,
    stray: &[Tok<'a>],
    opts: &[OptView<'_, 'a>],
    raw: &'a str,
    pool: &mut Pool<'_, 'a>,
) -> Result<Target<'a>, Fail> {
    if goto {
        return match (stray.first(), opts.first()) {
            (Some(t), _) => Err(Fail::new(
                t.start,
                "an option or end of rule after `-g CHAIN`",
                &t.value(),
            )),
            (None, Some(o)) => Err(Fail::new(o.at, "end of rule after `-g CHAIN`", o.name)),
            (None, None) => Ok(Target::Goto(name)),
        };
    }
    if !stray.is_empty() {
        let reason = if stray.iter().any(|t| t.text.starts_with("[unsupported")) {
            "unsupported revision"
        } else {
            "unexpected words after the target name"
        };
        return Ok(Target::Unreadable { raw, reason });
    }
    let generic = |pool: &mut Pool<'_, 'a>| Target::Generic {
        name,
        options: pool.push(opts),
    };
    let no_opts = opts.is_empty();
    let typed = match name {
        "ACCEPT" if no_opts => Target::Accept,
        "DROP" if no_opts => Target::Drop,
        "RETURN" if no_opts => Target::Return,
        "TRACE" if no_opts => Target::Trace,
        "NOTRACK" if no_opts => Target::Notrack,
        "DNAT" | "SNAT" => {
            let option = if name == "DNAT" {
                "to-destination"
            } else {
                "to-source"
            };
            let known = ["random", "random-fully", "persistent", option];
            if opts.iter().any(|o| !known.contains(&o.name) || o.negated) {
                return Ok(generic(pool));
            }
            let to = match nat_range(opts, option) {
                Ok(to) => to,
                Err(reason) => return Ok(Target::Unreadable { raw, reason }),
            };
            nat_ports_valid(&to, opts, option)?;
            let (random, persistent) = (has_flag(opts, "random"), has_flag(opts, "persistent"));
            if name == "DNAT" {
                if has_flag(opts, "random-fully") {
                    return Ok(generic(pool));
                }
                Target::Dnat {
                    to,
                    random,
                    persistent,
                }
            } else {
                Target::Snat {
                    to,
                    random,
                    random_fully: has_flag(opts, "random-fully"),
                    persistent,
                }
            }
        }
        // MASQUERADE = [--to-ports P[-Q]] [--random] [--random-fully]
        "MASQUERADE" => {
            let mut to_ports = None;
            for o in opts {
                match o.name {
                    "to-ports" => {
                        let v = o.one("a port or port range")?;
                        let r = values::nat_ports(&v.value()).ok_or_else(|| {
                            Fail::new(v.start, "a port or port range", &v.value())
                        })?;
                        to_ports = Some(r);
                    }
                    "random" | "random-fully" => {}
                    _ => return Ok(generic(pool)),
                }
            }
            Target::Masquerade {
                to_ports,
                random: has_flag(opts, "random"),
                random_fully: has_flag(opts, "random-fully"),
            }
        }
        "MARK" => match mark_op(opts)? {
            Some(op) => Target::Mark(op),
            None => generic(pool),
        },
        // REJECT = [--reject-with TYPE]
        "REJECT" => match opts {
            [] => Target::Reject { with: None },
            [o] if o.name == "reject-with" && !o.negated => Target::Reject {
                with: Some(o.one("an ICMP reject type")?.borrowed()?),
            },
            _ => generic(pool),
        },
        "CONNMARK" => Target::Connmark(pool.push(opts)),
        "LOG" => Target::Log(pool.push(opts)),
        "CT" => Target::Ct(pool.push(opts)),
        _ if no_opts && !is_extension_name(name) => Target::Jump(name),
        _ => generic(pool),
    };
    Ok(typed)
}

/// Built-in verdicts and common target extensions that take no options (never a user chain).
fn is_extension_name(name: &str) -> bool {
    matches!(
        name,
        "ACCEPT"
            | "DROP"
            | "RETURN"
            | "QUEUE"
            | "TRACE"
            | "NOTRACK"
            | "REJECT"
            | "MASQUERADE"
            | "NFLOG"
            | "ULOG"
    )
}
