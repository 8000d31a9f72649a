//! What a partial input means for a packet walk. A walk starts in the built-in chains
//! (`PREROUTING`, `OUTPUT`, …): a paste without them (`iptables-save | grep KUBE`, rule-only
//! `-A KUBE-…` lines, kube-proxy's own restore input as its logs print it) would send every
//! packet past kube-proxy's chains and answer "no DNAT" for a service the graph shows. Such a
//! walk starts where the paste starts instead: at kube-proxy's chains, through the jumps kube-proxy
//! itself installs in the built-in chains (`proxier.go` `iptablesJumpChains`), and says so.
//!
//! Only a table whose built-in chains the input neither declares nor has rules in gets them: a
//! dump that declares `:PREROUTING` without kube-proxy's jump has lost it on the node, and the
//! walk shows what that does.

use crate::parsers::iptables::Dump;
use crate::proxier::iptables::BASE_JUMPS;
use std::fmt::Write as _;

/// The built-in chains a walk passes, per table (the tables kube-proxy writes).
const BUILTIN: [(&str, &[&str]); 2] = [
    ("nat", &["PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"]),
    ("filter", &["INPUT", "FORWARD", "OUTPUT"]),
];

/// What the walk of a partial input takes for granted, and what the input lacks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assumptions {
    /// Why the input is not all of the node's rules, in words (the dump's gaps).
    pub gaps: Vec<String>,
    /// The jumps into kube-proxy's chains the walk adds (`nat PREROUTING -> KUBE-SERVICES`),
    /// because the input has no built-in chains of their table.
    pub entry_jumps: Vec<String>,
    /// Those jumps as `iptables-restore` text, to be parsed and merged into the ruleset.
    pub restore_text: String,
}

impl Assumptions {
    /// True when the input is whole and the walk assumes nothing.
    pub fn is_empty(&self) -> bool {
        self.gaps.is_empty() && self.entry_jumps.is_empty()
    }
}

/// What walking `dump` assumes: its gaps, and kube-proxy's entry jumps for each table that
/// holds kube-proxy chains but none of its built-in chains.
pub fn assumptions(dump: &Dump<'_>) -> Assumptions {
    let mut out = Assumptions {
        gaps: dump.gaps.iter().map(ToString::to_string).collect(),
        ..Assumptions::default()
    };
    for (table, builtins) in BUILTIN {
        let tables = || dump.tables.iter().filter(|t| t.name == table);
        let has_chain = |name: &str| {
            tables().any(|t| {
                t.chains.iter().any(|c| c.name == name)
                    || t.rule_chains.iter().any(|(c, _)| *c == name)
            })
        };
        if tables().next().is_none() || builtins.iter().any(|b| has_chain(b)) {
            continue;
        }
        let jumps: Vec<_> = BASE_JUMPS
            .iter()
            .filter(|(t, _, _, _, target)| *t == table && has_chain(target))
            .collect();
        if jumps.is_empty() {
            continue;
        }
        let _ = writeln!(out.restore_text, "*{table}");
        for (_, chain, extra, comment, target) in jumps {
            let mut line = format!("-A {chain}");
            if !extra.is_empty() {
                let _ = write!(line, " {extra}");
            }
            if !comment.is_empty() {
                let _ = write!(line, " -m comment --comment \"{comment}\"");
            }
            let _ = writeln!(out.restore_text, "{line} -j {target}");
            let jump = format!("{table} {chain} -> {target}");
            if !out.entry_jumps.contains(&jump) {
                out.entry_jumps.push(jump);
            }
        }
        out.restore_text.push_str("COMMIT\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parsers::iptables::{ParseOptions, parse_dump};

    #[test]
    fn rules_without_built_in_chains_get_kube_proxys_jumps() {
        let text = "-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j KUBE-SVC-NPX46M4PTMTKRN6Y\n\
                    -A KUBE-POSTROUTING -j MASQUERADE\n";
        let dump = parse_dump(text, &ParseOptions::lenient().with_table("nat")).expect("parse");
        let a = assumptions(&dump);
        assert_eq!(
            a.entry_jumps,
            vec![
                "nat PREROUTING -> KUBE-SERVICES",
                "nat OUTPUT -> KUBE-SERVICES",
                "nat POSTROUTING -> KUBE-POSTROUTING"
            ]
        );
        assert!(!a.gaps.is_empty(), "a filtered paste");
        let jumps = parse_dump(&a.restore_text, &ParseOptions::strict()).expect("restore text");
        assert_eq!(jumps.tables[0].rules.len(), 3);
    }

    #[test]
    fn declared_built_in_chains_are_taken_as_they_are() {
        let text = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\nCOMMIT\n";
        let dump = parse_dump(text, &ParseOptions::strict()).expect("parse");
        assert!(assumptions(&dump).is_empty());
    }
}
