//! A ruleset back to `iptables-restore` text.
//!
//! Layout per table (the order `iptables-save` uses): `*TABLE`, one `:NAME POLICY [p:b]` line per
//! chain (`-` as the policy of user chains), the rules chain by chain as `-A CHAIN SPEC`, a `-X NAME`
//! line for each chain the input deleted (with its `:NAME - [0:0]` line, as kube-proxy writes
//! them), then `COMMIT`.

use std::fmt::Write as _;

use super::{Ruleset, TableRules};

/// How rule specifications are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Style {
    /// The canonical form ([`super::CanonicalRule`]): what `iptables-save` would print.
    #[default]
    Canonical,
    /// Each rule's text as it was written in the input.
    Raw,
}

/// Prints `rs` as `iptables-restore` input.
pub fn to_restore(rs: &Ruleset<'_>, style: Style) -> String {
    let mut out = String::with_capacity(rs.rule_count() * 96 + 256);
    for t in &rs.tables {
        write_table(&mut out, t, style);
    }
    out
}

/// Prints one table as `iptables-restore` input (`*TABLE` … `COMMIT`).
pub fn write_table(out: &mut String, t: &TableRules<'_>, style: Style) {
    let _ = writeln!(out, "*{}", t.name);
    for c in &t.chains {
        let counters = c.counters.unwrap_or_default();
        let _ = writeln!(
            out,
            ":{} {} [{}:{}]",
            c.name,
            c.policy.unwrap_or("-"),
            counters.packets,
            counters.bytes
        );
    }
    for name in &t.deleted {
        let _ = writeln!(out, ":{name} - [0:0]");
    }
    let mut canonical = String::new();
    for c in &t.chains {
        for r in &c.rules {
            out.push_str("-A ");
            out.push_str(c.name);
            let spec = match style {
                Style::Canonical => {
                    canonical.clear();
                    super::canonical::write_rule(&mut canonical, &r.rule, t.family);
                    canonical.as_str()
                }
                Style::Raw => r.rule.raw,
            };
            if !spec.is_empty() {
                out.push(' ');
                out.push_str(spec);
            }
            out.push('\n');
        }
    }
    for name in &t.deleted {
        let _ = writeln!(out, "-X {name}");
    }
    out.push_str("COMMIT\n");
}
