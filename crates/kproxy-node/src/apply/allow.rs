//! The allow-list every repair plan is checked against after planning and before anything is
//! written: a repair changes only kube-proxy's own objects, whatever the render asked for.
//!
//! - iptables: chains kube-proxy creates ([`crate::graph::ownership`]: its fixed chains and
//!   `KUBE-{SVC,SVL,EXT,FW,SEP,XLB}-<hash>`; in IPVS mode also the IPVS proxier's fixed chains),
//!   and in built-in chains only the jump rules kube-proxy ensures there (`BASE_JUMPS`, the
//!   ones `render --with-base-jumps` writes; in IPVS mode the IPVS proxier's `JUMPS`). The
//!   check reads the exact restore input the plan sends, so it holds whatever the render said.
//! - nftables: every command of the `nft -f` transaction names `table ip|ip6 kube-proxy` of
//!   the plan's family; nothing else (`include`, `define`, other tables) is allowed.
//! - IPVS: ipsets kube-proxy's IPVS proxier creates (never a set destroyed: only a rollback does
//!   that, of a set its repair created), virtual servers the render
//!   expects or that [`super::ipvs::plan::Ownership`] says are kube-proxy's.
//!
//! A plan that asks for anything else is a bug in the render: it is refused, never applied,
//! also with `--force`. Each refusal starts with [`NOT_KUBE_PROXYS`] and names the object.

use super::iptables::plan::Plan;
use super::ipvs::plan::{Disposal, IpvsPlan, Ownership};
use super::ipvs::state::IpvsState;
use crate::graph::ownership::is_kube_proxy_chain;
use crate::model::Ruleset;
use crate::proxier::iptables::BASE_JUMPS;
use crate::proxier::ipvs::iptables::{FILTER_CHAINS, JUMPS, NAT_CHAINS};
use crate::proxier::ipvs::sets::SetDef;
use kproxy_parsers::iptables::{Family, ParseOptions, RuleOp};
use std::collections::HashSet;

/// How every refusal of this module begins; `--force` does not lift these.
pub const NOT_KUBE_PROXYS: &str = "not kube-proxy's";

/// The built-in chains of the tables a plan writes.
const BUILTIN: &[&str] = &["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"];

/// Whose iptables objects a plan writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proxier {
    /// kube-proxy's iptables proxier.
    Iptables,
    /// kube-proxy's IPVS proxier (its iptables part; the iptables proxier's per-service chains
    /// it deletes when stale are kube-proxy's too).
    Ipvs,
}

impl Proxier {
    /// Whether kube-proxy creates the chain `name` in `table` (this proxier, or the iptables
    /// proxier's chains that the IPVS mode deletes as stale).
    fn owns_chain(self, table: &str, name: &str) -> bool {
        is_kube_proxy_chain(table, name)
            || (self == Proxier::Ipvs
                && match table {
                    "nat" => NAT_CHAINS.contains(&name),
                    "filter" => FILTER_CHAINS.contains(&name),
                    _ => false,
                })
    }

    /// The restore text of the jump rules this proxier ensures in built-in chains.
    fn jumps_text(self) -> String {
        let mut by_table: Vec<(&str, String)> = Vec::new();
        let mut push = |table: &'static str, line: String| {
            match by_table.iter_mut().find(|(t, _)| *t == table) {
                Some((_, text)) => text.push_str(&line),
                None => by_table.push((table, line)),
            };
        };
        match self {
            Proxier::Iptables => {
                for (table, chain, extra, comment, target) in BASE_JUMPS {
                    let mut line = format!("-A {chain}");
                    if !extra.is_empty() {
                        line.push(' ');
                        line.push_str(extra);
                    }
                    if !comment.is_empty() {
                        line.push_str(&format!(" -m comment --comment \"{comment}\""));
                    }
                    line.push_str(&format!(" -j {target}\n"));
                    push(table, line);
                }
            }
            Proxier::Ipvs => {
                for (table, from, to, comment) in JUMPS {
                    push(
                        table,
                        format!("-A {from} -m comment --comment \"{comment}\" -j {to}\n"),
                    );
                }
            }
        }
        by_table
            .into_iter()
            .map(|(t, rules)| format!("*{t}\n{rules}COMMIT\n"))
            .collect()
    }

    /// The jumps as (table, chain, canonical rule) in a ruleset of `family`.
    fn jumps(self, family: Family) -> HashSet<(String, String, String)> {
        let text = self.jumps_text();
        let Ok(rs) = Ruleset::parse(&text, &ParseOptions::default()) else {
            return HashSet::new();
        };
        rs.tables
            .iter()
            .flat_map(|t| {
                t.chains.iter().flat_map(move |c| {
                    c.rules.iter().map(move |r| {
                        (
                            t.name.to_string(),
                            c.name.to_string(),
                            r.canonical(family).into_string(),
                        )
                    })
                })
            })
            .collect()
    }
}

/// The refusals of an iptables plan: one per chain it would declare, fill or delete that is
/// not kube-proxy's, per rule it would put into a built-in chain that is not one of
/// kube-proxy's jumps (or put there other than by inserting), and per built-in chain it
/// would declare (which flushes it). Read from the exact restore input of each table.
pub fn check_plan(plan: &Plan, proxier: Proxier) -> Vec<String> {
    let mut out = Vec::new();
    for tp in plan.tables.iter().filter(|t| !t.is_empty()) {
        let input = tp.restore_input();
        let rs = match Ruleset::parse(&input, &ParseOptions::default()) {
            Ok(rs) => rs,
            Err(e) => {
                out.push(format!(
                    "{NOT_KUBE_PROXYS}: the restore input of table {} does not read back ({e}); refusing to write it",
                    tp.table
                ));
                continue;
            }
        };
        let jumps = proxier.jumps(tp.family);
        for t in &rs.tables {
            if t.name != tp.table {
                out.push(format!(
                    "{NOT_KUBE_PROXYS}: the plan of table {} writes table {}",
                    tp.table, t.name
                ));
                continue;
            }
            for c in &t.chains {
                if !BUILTIN.contains(&c.name) {
                    if !proxier.owns_chain(t.name, c.name) {
                        out.push(format!(
                            "{NOT_KUBE_PROXYS}: the plan would write chain {} of table {}, which kube-proxy does not create; refusing to write it (a bug in the render)",
                            c.name, t.name
                        ));
                    }
                    continue;
                }
                if c.declared_at.is_some() {
                    out.push(format!(
                        "{NOT_KUBE_PROXYS}: the plan would declare (and so flush) built-in chain {} of table {}",
                        c.name, t.name
                    ));
                }
                for r in &c.rules {
                    let canonical = r.canonical(tp.family).into_string();
                    let key = (t.name.to_string(), c.name.to_string(), canonical);
                    if !matches!(r.rule.op, RuleOp::Insert(_)) || !jumps.contains(&key) {
                        out.push(format!(
                            "{NOT_KUBE_PROXYS}: the plan would put `{}` into built-in chain {} of table {}, which is not one of the jumps kube-proxy inserts there; refusing to write it (a bug in the render)",
                            key.2, c.name, t.name
                        ));
                    }
                }
            }
            for gone in &t.deleted {
                if !proxier.owns_chain(t.name, gone) {
                    out.push(format!(
                        "{NOT_KUBE_PROXYS}: the plan would delete chain {gone} of table {}, which kube-proxy does not create",
                        t.name
                    ));
                }
            }
        }
    }
    out
}

/// The refusals of an `nft -f` transaction of `family` (`ip`, `ip6`): one per command that
/// names another table or family, or is not a plain object command or a `table FAMILY
/// kube-proxy { … }` block; per `include` or `define` (wherever it stands); and per quote or
/// brace left open. Commands end at a newline or `;` outside braces and quotes; `#` outside
/// quotes starts a comment.
pub fn check_nft_script(family: &str, script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut refuse = |n: usize, why: &str, text: &str| {
        out.push(format!(
            "{NOT_KUBE_PROXYS}: line {n} of the nft transaction ({why}): {}",
            shorten(text.trim())
        ));
    };
    let (mut depth, mut cmd, mut cmd_line) = (0usize, String::new(), 1usize);
    for (i, line) in script.lines().enumerate() {
        let n = i + 1;
        if cmd.trim().is_empty() {
            cmd_line = n;
        }
        let first = line.split_whitespace().next().unwrap_or_default();
        if ["include", "define", "redefine", "undefine"].contains(&first) {
            refuse(n, &format!("`{first}` is not allowed"), line);
        }
        if line.trim_end().ends_with('\\') {
            refuse(n, "the line is continued", line);
        }
        let mut quoted = false;
        for ch in line.chars() {
            if quoted {
                quoted = ch != '"';
                cmd.push(ch);
                continue;
            }
            match ch {
                '"' => quoted = true,
                '#' => break,
                '{' => depth += 1,
                '}' if depth == 0 => refuse(n, "a brace closes that was not opened", line),
                '}' => depth -= 1,
                ';' if depth == 0 => {
                    if let Err(why) = nft_command_allowed(family, &cmd) {
                        refuse(cmd_line, &why, &cmd);
                    }
                    cmd.clear();
                    cmd_line = n;
                    continue;
                }
                _ => {}
            }
            cmd.push(ch);
        }
        if quoted {
            refuse(n, "a quote is not closed", line);
        }
        if depth == 0 {
            if let Err(why) = nft_command_allowed(family, &cmd) {
                refuse(cmd_line, &why, &cmd);
            }
            cmd.clear();
        } else {
            cmd.push(' ');
        }
    }
    if depth > 0 {
        refuse(cmd_line, "a brace is not closed", &cmd);
    }
    out
}

/// At most a line's worth of `text`, for messages.
fn shorten(text: &str) -> String {
    const MAX: usize = 160;
    match text.char_indices().nth(MAX) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Whether one nft command (empty: nothing) only touches `table FAMILY kube-proxy`.
fn nft_command_allowed(family: &str, cmd: &str) -> Result<(), String> {
    let mut words = cmd.split_whitespace();
    let Some(verb) = words.next() else {
        return Ok(());
    };
    if verb == "table" {
        // The block form: `table FAMILY kube-proxy { … }`.
        return match (words.next(), words.next()) {
            (Some(f), _) if f != family => {
                Err(format!("family {f} where the plan is for {family}"))
            }
            (_, Some("kube-proxy" | "\"kube-proxy\"")) => Ok(()),
            (_, other) => Err(format!(
                "table {} is not kube-proxy's",
                other.unwrap_or("(none)")
            )),
        };
    }
    if ![
        "add", "create", "insert", "replace", "delete", "destroy", "flush",
    ]
    .contains(&verb)
    {
        return Err(format!("`{verb}` is not an object command"));
    }
    let mut kind = words.next().unwrap_or_default();
    if kind == "ct" {
        // `ct helper|timeout|expectation` objects.
        kind = words.next().unwrap_or_default();
    }
    let known = [
        "table",
        "chain",
        "rule",
        "set",
        "map",
        "element",
        "counter",
        "quota",
        "limit",
        "helper",
        "timeout",
        "expectation",
        "secmark",
        "synproxy",
        "flowtable",
    ];
    if !known.contains(&kind) {
        return Err(format!("`{kind}` is not an object kind"));
    }
    let (fam, table) = (words.next(), words.next());
    if fam != Some(family) {
        return Err(format!(
            "family {} where the plan is for {family}",
            fam.unwrap_or("(none)")
        ));
    }
    match table {
        Some("kube-proxy") | Some("\"kube-proxy\"") => Ok(()),
        other => Err(format!(
            "table {} is not kube-proxy's",
            other.unwrap_or("(none)")
        )),
    }
}

/// The refusals of an IPVS plan: its iptables part ([`check_plan`]), ipsets kube-proxy does
/// not create (or, to destroy, that are not stale `KUBE-*` sets), and virtual servers that
/// are neither expected nor kube-proxy's by `ownership`.
pub fn check_ipvs_plan(
    plan: &IpvsPlan,
    expected: &IpvsState,
    ownership: &Ownership,
) -> Vec<String> {
    let mut out = check_plan(&plan.iptables, Proxier::Ipvs);
    for c in &plan.sets {
        if SetDef::by_name(c.set()).is_none() {
            out.push(format!(
                "{NOT_KUBE_PROXYS}: the plan would change ipset {} (`{}`), which kube-proxy does not create",
                c.set(),
                c.line()
            ));
        }
    }
    for c in &plan.destroy_sets {
        out.push(format!(
            "{NOT_KUBE_PROXYS}: the plan would destroy ipset {}; a repair never destroys a set",
            c.set()
        ));
    }
    for c in &plan.ipvs {
        let vs = c.vs();
        if !expected.virtual_servers.contains_key(vs)
            && ownership.virtual_server(vs) != Disposal::Remove
        {
            out.push(format!(
                "{NOT_KUBE_PROXYS}: the plan would run `{}` on virtual server {}, which is neither expected nor on a kube-proxy address",
                c.command(),
                super::ipvs::plan::vs_label(vs)
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::iptables::plan::plan;

    fn rs(text: &str) -> Ruleset<'_> {
        Ruleset::parse(text, &ParseOptions::default()).expect("test input parses")
    }

    /// A render kube-proxy could write: its chains and two of its base jumps.
    const GOOD: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-POSTROUTING - [0:0]\n\
:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"a/b cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j ACCEPT\nCOMMIT\n\
*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:KUBE-FORWARD - [0:0]\n\
-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES\n\
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\nCOMMIT\n";

    const EMPTY: &str =
        "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n*filter\n:INPUT ACCEPT [0:0]\nCOMMIT\n";

    #[test]
    fn kube_proxys_own_render_passes() {
        let p = plan(&rs(GOOD), &rs(EMPTY), false);
        assert!(!p.is_empty());
        assert_eq!(check_plan(&p, Proxier::Iptables), Vec::<String>::new());
    }

    #[test]
    fn a_render_naming_a_foreign_chain_is_refused() {
        let bad = GOOD.replace(
            "COMMIT\n*filter",
            ":MYCHAIN - [0:0]\n-A MYCHAIN -j ACCEPT\nCOMMIT\n*filter",
        );
        let p = plan(&rs(&bad), &rs(EMPTY), false);
        let r = check_plan(&p, Proxier::Iptables);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].starts_with(NOT_KUBE_PROXYS) && r[0].contains("chain MYCHAIN of table nat"),
            "{r:?}"
        );
        // Lookalikes of kube-proxy's names (kubelet's, kube-router's) are not kube-proxy's.
        let bad = GOOD.replace("KUBE-POSTROUTING", "KUBE-KUBELET-CANARY");
        let r = check_plan(&plan(&rs(&bad), &rs(EMPTY), false), Proxier::Iptables);
        assert!(
            r.iter().any(|m| m.contains("chain KUBE-KUBELET-CANARY")),
            "{r:?}"
        );
    }

    #[test]
    fn a_foreign_rule_in_a_built_in_chain_is_refused() {
        // What a port name holding a newline and a rule would make of the render.
        let bad = GOOD.replace(
            "-A KUBE-FORWARD -m conntrack",
            "-A INPUT -s 6.6.6.6/32 -j ACCEPT\n-A KUBE-FORWARD -m conntrack",
        );
        let p = plan(&rs(&bad), &rs(EMPTY), false);
        let r = check_plan(&p, Proxier::Iptables);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("6.6.6.6") && r[0].contains("built-in chain INPUT of table filter"),
            "{r:?}"
        );
        // A kube-proxy jump into the wrong chain is not a kube-proxy jump either.
        let bad = GOOD.replace(
            "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\"",
            "-A PREROUTING -m comment --comment \"kubernetes postrouting rules\"",
        );
        let r = check_plan(&plan(&rs(&bad), &rs(EMPTY), false), Proxier::Iptables);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(r[0].contains("built-in chain PREROUTING"), "{r:?}");
        // IPVS mode has other jumps: the iptables proxier's FORWARD jump is one of them, its
        // INPUT jump to KUBE-EXTERNAL-SERVICES is not.
        let r = check_plan(&plan(&rs(GOOD), &rs(EMPTY), false), Proxier::Ipvs);
        assert_eq!(r.len(), 1, "{r:?}");
        assert!(
            r[0].contains("KUBE-EXTERNAL-SERVICES") && r[0].contains("built-in chain INPUT"),
            "{r:?}"
        );
    }

    #[test]
    fn deleting_stale_kube_proxy_chains_passes() {
        let current = "*nat\n:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\nCOMMIT\n";
        let p = plan(&rs(GOOD), &rs(current), false);
        assert!(
            p.restore_input().contains("-X KUBE-SEP-BBBBBBBBBBBBBBBB\n"),
            "{}",
            p.restore_input()
        );
        assert_eq!(check_plan(&p, Proxier::Iptables), Vec::<String>::new());
        assert_eq!(
            check_plan(&p, Proxier::Ipvs).len(),
            1,
            "only the INPUT jump"
        );
    }

    #[test]
    fn nft_transactions_name_only_kube_proxys_table() {
        let good = "# kubectl-kproxy repair: table ip kube-proxy\n\
            flush chain ip kube-proxy services\n\
            add chain ip kube-proxy nat-prerouting { type nat hook prerouting priority -100 ; }\n\
            add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips\n\
            add element ip kube-proxy service-ips { 10.96.0.1 . tcp . 443 : goto service-X } # ok\n\
            add set ip kube-proxy cluster-ips { type ipv4_addr ; comment \"Active; ClusterIPs {\" ; }\n\
            delete ct helper ip kube-proxy h\n";
        assert_eq!(check_nft_script("ip", good), Vec::<String>::new());
        let block = "table ip kube-proxy {\n\tchain x {\n\t\tcounter drop # a comment {\n\t}\n\tset s {\n\t\ttype ipv4_addr\n\t\telements = { 10.0.0.1,\n\t\t\t10.0.0.2 }\n\t}\n}\n";
        assert_eq!(check_nft_script("ip", block), Vec::<String>::new());
        for (bad, why) in [
            ("add rule inet fw input accept", "family inet"),
            ("add rule ip filter input accept", "table filter"),
            (
                "add rule ip kube-proxy services accept ; add rule inet fw input accept",
                "family inet",
            ),
            ("include \"/etc/evil.nft\"", "`include`"),
            (
                "add element ip kube-proxy m { \"a\" }\" ; flush ruleset",
                "quote",
            ),
            ("add rule ip kube-proxy x { accept", "brace"),
            ("flush ruleset", "`ruleset`"),
            ("add rule ip6 kube-proxy services accept", "family ip6"),
            ("table inet fw {\n\tchain input {\n\t}\n}", "family inet"),
            ("table ip kube-proxy {\n\tinclude \"/x\"\n}", "`include`"),
            ("table ip kube-proxy {\n}\n}", "not opened"),
        ] {
            let r = check_nft_script("ip", bad);
            assert!(
                !r.is_empty()
                    && r.iter().all(|m| m.starts_with(NOT_KUBE_PROXYS))
                    && r.iter().any(|m| m.contains(why)),
                "{bad}: {r:?}"
            );
        }
    }

    #[test]
    fn ipvs_plans_touch_only_kube_proxys_sets_and_virtual_servers() {
        use crate::apply::ipvs::plan::{IpvsChange, SetChange};
        use crate::apply::ipvs::state::Ipvs0;
        use crate::state::ip::IpFamily;
        use kproxy_parsers::ipvsadm::Protocol;
        let ip = |s: &str| -> std::net::IpAddr { s.parse().expect("address") };
        let ownership = Ownership {
            family: IpFamily::V4,
            exclude_cidrs: Vec::new(),
            service_addrs: [ip("10.96.0.1")].into(),
            node_addrs: Default::default(),
        };
        let expected = IpvsState {
            virtual_servers: Default::default(),
            sets: None,
            kube_ipvs0: Ipvs0::Unknown,
        };
        let plan =
            |sets: Vec<SetChange>, destroy: Vec<SetChange>, ipvs: Vec<IpvsChange>| IpvsPlan {
                sets,
                ipvs0_add: Vec::new(),
                ipvs,
                iptables: Plan {
                    tables: Vec::new(),
                    full: false,
                    left_alone: Vec::new(),
                },
                destroy_sets: destroy,
                ipvs0_del: Vec::new(),
                kept: Vec::new(),
            };
        let ours = plan(
            vec![SetChange::Add {
                set: "KUBE-CLUSTER-IP".into(),
                member: "10.96.0.1,tcp:443".into(),
            }],
            Vec::new(),
            vec![IpvsChange::DeleteVs {
                vs: (Protocol::Tcp, ip("10.96.0.1"), 443),
            }],
        );
        assert_eq!(
            check_ipvs_plan(&ours, &expected, &ownership),
            Vec::<String>::new()
        );
        let foreign = plan(
            vec![SetChange::Add {
                set: "cali40all-hosts".into(),
                member: "10.0.0.1".into(),
            }],
            vec![
                SetChange::Destroy {
                    set: "KUBE-CLUSTER-IP".into(),
                },
                SetChange::Destroy {
                    set: "KUBE-SRC-OLDSTALE".into(),
                },
            ],
            vec![IpvsChange::DeleteVs {
                vs: (Protocol::Tcp, ip("192.0.2.10"), 80),
            }],
        );
        let r = check_ipvs_plan(&foreign, &expected, &ownership);
        assert_eq!(r.len(), 4, "{r:?}");
        assert!(r[0].contains("ipset cali40all-hosts"), "{r:?}");
        assert!(r[1].contains("destroy ipset KUBE-CLUSTER-IP"), "{r:?}");
        assert!(r[2].contains("destroy ipset KUBE-SRC-OLDSTALE"), "{r:?}");
        assert!(r[3].contains("TCP 192.0.2.10:80"), "{r:?}");
    }
}
