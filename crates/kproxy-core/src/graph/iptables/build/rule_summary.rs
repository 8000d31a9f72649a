//! What the graph builder reads from one rule, gathered in a single pass over its matches.

use crate::parsers::iptables::{AddrSpec, Match, Module, Neg, Recent, Rule, Statistic};
use std::borrow::Cow;

/// What decides one rule's place in the graph, read from its matches.
#[derive(Debug, Clone, Default)]
pub(super) struct RuleSummary<'a> {
    /// The first comment, when written without escapes (escaped comments are never kube-proxy's:
    /// its comments are built from service names, which cannot hold `"`, `'` or `\`).
    pub comment: Option<&'a str>,
    /// The first non-negated `-p`, else the first protocol module (`-m tcp`), as written.
    pub protocol: Option<&'a str>,
    /// The first non-negated `-d`.
    pub destination: Option<AddrSpec<'a>>,
    /// The first `-s`, negated or not.
    pub source: Option<Neg<AddrSpec<'a>>>,
    /// The first port of the first non-negated `--dport`.
    pub dport: Option<u16>,
    /// The first `-m recent`.
    pub recent: Option<Recent<'a>>,
    /// The conditional probability of the first non-negated `statistic` match
    /// (`--mode nth --every N` counts as 1/N).
    pub probability: Option<f64>,
    /// `--src-type LOCAL` (not negated) in some `addrtype` match.
    pub local_source: bool,
    /// The first `! -i IFACE`.
    pub not_in_interface: Option<&'a str>,
    /// The first `-i IFACE`.
    pub in_interface: Option<&'a str>,
    /// [`Rule::is_unconditional`]: only matches every packet reaching the chain satisfies in
    /// practice (comments, a plain `-p`/`-m tcp` without ports, nfacct counters).
    pub unconditional: bool,
}

impl<'a> RuleSummary<'a> {
    /// Reads `r`'s matches once.
    pub fn of(r: &Rule<'a>) -> RuleSummary<'a> {
        let mut f = RuleSummary {
            unconditional: r.is_unconditional(),
            ..RuleSummary::default()
        };
        let mut module_proto = None;
        let mut seen_comment = false;
        for m in r.matches() {
            match m {
                Match::Module(Module::Comment(c)) if !seen_comment => {
                    seen_comment = true;
                    f.comment = c.borrowed();
                }
                Match::Protocol(p) if !p.negated && f.protocol.is_none() => {
                    f.protocol = Some(p.value);
                }
                Match::Module(Module::Ports { proto, dport, .. }) => {
                    module_proto.get_or_insert(proto);
                    if let Some(d) = dport.filter(|d| !d.negated)
                        && f.dport.is_none()
                    {
                        f.dport = Some(d.value.first);
                    }
                }
                Match::Destination(d) if !d.negated && f.destination.is_none() => {
                    f.destination = Some(d.value);
                }
                Match::Source(s) => {
                    f.source.get_or_insert(s);
                }
                Match::InInterface(i) => {
                    if i.negated {
                        f.not_in_interface.get_or_insert(i.value);
                    } else {
                        f.in_interface.get_or_insert(i.value);
                    }
                }
                Match::Module(Module::Recent(rc)) => {
                    f.recent.get_or_insert(rc);
                }
                Match::Module(Module::Statistic(s)) if f.probability.is_none() => {
                    f.probability = match s {
                        Statistic::Random {
                            probability,
                            negated: false,
                            ..
                        } => Some(probability),
                        Statistic::Nth {
                            every,
                            negated: false,
                            ..
                        } if every > 0 => Some(1.0 / f64::from(every)),
                        _ => None,
                    };
                }
                Match::Module(Module::Addrtype {
                    src_type: Some(t), ..
                }) => {
                    f.local_source |= !t.negated && t.value.eq_ignore_ascii_case("LOCAL");
                }
                _ => {}
            }
        }
        if f.protocol.is_none() {
            f.protocol = module_proto;
        }
        f
    }

    /// The protocol, lower-cased (borrowed unless the dump wrote capitals).
    pub fn protocol_lower(&self) -> Option<Cow<'static, str>> {
        self.protocol.map(proto_name)
    }

    /// The destination as people write it: the bare IP for a host prefix, else as written.
    pub fn destination_text(&self) -> Option<String> {
        self.destination.as_ref().map(addr_text)
    }
}

/// A protocol name lower-cased, without allocating for the names kube-proxy writes.
pub(super) fn proto_name(p: &str) -> Cow<'static, str> {
    const KNOWN: [&str; 6] = ["tcp", "udp", "sctp", "icmp", "udplite", "all"];
    match KNOWN.iter().find(|k| p.eq_ignore_ascii_case(k)) {
        Some(k) => Cow::Borrowed(k),
        None => Cow::Owned(p.to_ascii_lowercase()),
    }
}

/// An address as people write it: the bare IP for a host prefix, else as written.
pub(super) fn addr_text(a: &AddrSpec<'_>) -> String {
    let host = if a.addr.is_ipv4() { 32 } else { 128 };
    if a.prefix == host && a.mask.is_none() {
        a.addr.to_string()
    } else {
        a.raw.to_string()
    }
}

/// `[! ]-s ADDR` as written in the rule (borrowed from the dump when the rule text holds exactly
/// that, as iptables-save prints it).
pub(super) fn source_condition<'a>(raw: &'a str, s: &Neg<AddrSpec<'a>>) -> Cow<'a, str> {
    let prefix = if s.negated { "! -s " } else { "-s " };
    borrowed_with_prefix(raw, s.value.raw, prefix)
        .map_or_else(|| Cow::Owned([prefix, s.value.raw].concat()), Cow::Borrowed)
}

/// `-i IFACE` / `! -i IFACE` as written, borrowed when possible.
pub(super) fn interface_condition<'a>(raw: &'a str, iface: &'a str, negated: bool) -> Cow<'a, str> {
    let prefix = if negated { "! -i " } else { "-i " };
    borrowed_with_prefix(raw, iface, prefix)
        .map_or_else(|| Cow::Owned([prefix, iface].concat()), Cow::Borrowed)
}

/// The slice of `raw` that is `prefix` followed by `word`, when `word` is a slice of `raw`
/// directly preceded by `prefix`.
fn borrowed_with_prefix<'a>(raw: &'a str, word: &'a str, prefix: &str) -> Option<&'a str> {
    let at = (word.as_ptr() as usize).checked_sub(raw.as_ptr() as usize)?;
    let start = at.checked_sub(prefix.len())?;
    let end = at.checked_add(word.len())?;
    let text = raw.get(start..end)?;
    (text.starts_with(prefix) && text.len() == prefix.len() + word.len()).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::iptables::parse_rule_line;

    #[test]
    fn facts_in_one_pass() {
        let r = parse_rule_line(
            r#"-A X ! -s 10.0.0.0/8 -d 10.96.0.1/32 -p TCP -m comment --comment "ns/a:p cluster IP" -m tcp --dport 80 -j KUBE-SVC-A"#,
        )
        .unwrap();
        let f = RuleSummary::of(&r);
        assert_eq!(f.comment, Some("ns/a:p cluster IP"));
        assert_eq!(f.protocol_lower().as_deref(), Some("tcp"));
        assert_eq!(f.destination_text().as_deref(), Some("10.96.0.1"));
        assert_eq!(f.dport, Some(80));
        assert!(!f.unconditional);
        assert_eq!(
            source_condition(r.raw, &f.source.unwrap()),
            "! -s 10.0.0.0/8"
        );
        assert!(matches!(
            source_condition(r.raw, &f.source.unwrap()),
            Cow::Borrowed(_)
        ));
        let r = parse_rule_line("-A X --source 10.0.0.1 -m comment --comment x -j KUBE-MARK-MASQ")
            .unwrap();
        let f = RuleSummary::of(&r);
        assert_eq!(source_condition(r.raw, &f.source.unwrap()), "-s 10.0.0.1");
        let r = parse_rule_line("-A X -p tcp -m comment --comment x -m tcp -j ACCEPT").unwrap();
        assert!(RuleSummary::of(&r).unconditional);
        let r = parse_rule_line(
            "-A X -m statistic --mode nth --every 4 --packet 0 -m statistic --mode random --probability 0.5",
        )
        .unwrap();
        assert_eq!(RuleSummary::of(&r).probability, Some(0.25));
    }
}
