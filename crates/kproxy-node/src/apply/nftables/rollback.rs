//! Rollback of an nftables repair: only the objects of `table ip|ip6 kube-proxy` the repair
//! changed are put back, from the backup's `nft list table` text — never another table, and
//! not the objects of kube-proxy's table the repair left alone (their rules keep their
//! handles and counters).
//!
//! One `nft -f` transaction per family (all of it or nothing):
//! 1. `flush chain` / `flush set|map` of every touched object the table has now;
//! 2. `delete chain|set|map` of those the repair created, or declared anew (hook or type);
//! 3. the backup's own blocks of every touched object the table had before (`table FAMILY
//!    kube-proxy { chain X { … } map Y { … elements = { … } } }`), which declare them again
//!    where they were deleted and refill them.
//!
//! A table the node did not have before is deleted whole: everything in it was the repair's.
//! Kernels before 6.2 release a chain from a map element only after the transaction that
//! deleted the element (`pkg/proxy/nftables/proxier.go`, stale chains): there a chain the
//! repair created is left flushed, and said so.

use super::plan::{Action, Change, FamilyPlan, name};
use kproxy_parsers::nft::Family;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One object of an `nft list table` listing: its kind word (`chain`, `set`, `map`, `counter`,
/// `ct helper`, …) and its lines, from `KIND NAME {` to the matching `}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The kind word(s).
    pub kind: String,
    /// The lines, with their newline.
    pub text: String,
}

/// The objects of one table's `nft list table` text by name (names as nft reads them back,
/// quotes removed), in listing order.
pub fn blocks(listing: &str) -> Vec<(String, Block)> {
    let mut out: Vec<(String, Block)> = Vec::new();
    let mut depth = 0usize;
    let mut open: Option<(String, Block)> = None;
    for line in listing.lines() {
        let start_depth = depth;
        depth = depth_after(line, depth);
        if let Some((_, b)) = open.as_mut() {
            b.text.push_str(line);
            b.text.push('\n');
            if depth <= 1 {
                out.extend(open.take());
            }
            continue;
        }
        if start_depth != 1 || depth < 1 {
            continue;
        }
        let head = line.trim();
        let Some(head) = head.strip_suffix('{').map(str::trim_end) else {
            // A one-line object (`counter c { packets 0 bytes 0 }`) opens and closes here.
            if let Some((kind, n)) = head
                .split_once('{')
                .and_then(|(h, _)| object_head(h.trim_end()))
            {
                out.push((
                    n,
                    Block {
                        kind,
                        text: format!("{line}\n"),
                    },
                ));
            }
            continue;
        };
        if let Some((kind, n)) = object_head(head) {
            let block = Block {
                kind,
                text: format!("{line}\n"),
            };
            if depth <= 1 {
                out.push((n, block));
            } else {
                open = Some((n, block));
            }
        }
    }
    out
}

/// `KIND NAME` of an object's first line (`chain services`, `ct helper "h"`).
fn object_head(head: &str) -> Option<(String, String)> {
    let (kind, rest) = head.split_once(' ')?;
    let (kind, rest) = if kind == "ct" {
        let (sub, rest) = rest.split_once(' ')?;
        (format!("ct {sub}"), rest)
    } else {
        (kind.to_string(), rest)
    };
    let n = rest.trim();
    let n = n
        .strip_prefix('"')
        .and_then(|n| n.strip_suffix('"'))
        .unwrap_or(n);
    (!n.is_empty() && !n.contains(' ')).then(|| (kind, n.to_string()))
}

/// The brace depth after `line`, from `depth` before it (braces inside quotes do not count).
fn depth_after(line: &str, mut depth: usize) -> usize {
    let mut quoted = false;
    for ch in line.chars() {
        match ch {
            '"' => quoted = !quoted,
            '{' if !quoted => depth += 1,
            '}' if !quoted => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    depth
}

/// Whether two kind words name the same kind of object for a rollback (sets and maps are
/// both `set|map` declarations).
fn same_class(a: &str, b: &str) -> bool {
    let is_set = |k: &str| k == "set" || k == "map";
    a == b || (is_set(a) && is_set(b))
}

/// The rollback transaction of one family: what `plan` changed put back as `before` (the
/// backup's `nft list table` text, `None` when the node had no such table) shows it. `now`
/// is the table's listing now, when it could be read (`Some(None)`: the table is gone); without
/// it the plan is taken to have been applied whole. Returns the script ("" when nothing is
/// to be undone) and what is left as it is now, and why.
pub fn rollback_script(
    family: Family,
    before: Option<&str>,
    now: Option<Option<&str>>,
    plan: &FamilyPlan,
    same_transaction_delete: bool,
) -> (String, Vec<String>) {
    let mut notes = Vec::new();
    let table = format!("table {family} kube-proxy");
    let mut s = format!("# kubectl-kproxy rollback: {table} (only what the repair changed)\n");
    let created_table = plan.changes.iter().any(|c| c.object == "table");
    let Some(before) = before.filter(|_| !created_table) else {
        if now.is_some_and(|n| n.is_none()) {
            return (String::new(), notes);
        }
        // The repair created the table: all of it goes (`add` first, so that the deletion
        // works whether or not it exists now).
        let _ = writeln!(s, "add {table}\ndelete {table}");
        return (s, notes);
    };
    let before_blocks: BTreeMap<String, Vec<Block>> = by_name(blocks(before));
    let now_blocks: Option<BTreeMap<String, Vec<Block>>> =
        now.map(|n| by_name(n.map(blocks).unwrap_or_default()));
    let head =
        |verb: &str, kind: &str, n: &str| format!("{verb} {kind} {family} kube-proxy {}", name(n));
    let mut flushes = String::new();
    let mut deletions = String::new();
    let mut refills: Vec<&Block> = Vec::new();
    for c in &plan.changes {
        // What the object is now: as listed, or as the plan left it.
        let has_now: Option<&str> = match &now_blocks {
            Some(n) => find(n, c).map(|b| b.kind.as_str()),
            None => (c.action != Action::Delete).then_some(c.object.as_str()),
        };
        let is_chain = c.object == "chain";
        let is_set = matches!(c.object.as_str(), "set" | "map");
        if let Some(kind) = has_now.filter(|_| is_chain || is_set) {
            let _ = writeln!(flushes, "{}", head("flush", kind, &c.name));
            if matches!(c.action, Action::Create | Action::Recreate) {
                if is_chain && !same_transaction_delete && c.action == Action::Create {
                    notes.push(format!(
                        "{table} chain {}: created by the repair, left empty (kernels before 6.2 delete it only in a later transaction)",
                        c.name
                    ));
                } else {
                    let _ = writeln!(deletions, "{}", head("delete", kind, &c.name));
                }
            }
        }
        if c.action != Action::Create
            && let Some(b) = find(&before_blocks, c)
        {
            refills.push(b);
        }
    }
    if flushes.is_empty() && deletions.is_empty() && refills.is_empty() {
        return (String::new(), notes);
    }
    // The table itself, in case it went away meanwhile.
    let _ = writeln!(s, "add {table}");
    s.push_str(&flushes);
    s.push_str(&deletions);
    if !refills.is_empty() {
        // In the backup listing's own order: sets before the chains whose rules use them.
        let order: Vec<String> = blocks(before).into_iter().map(|(_, b)| b.text).collect();
        refills.sort_by_key(|b| order.iter().position(|t| *t == b.text));
        refills.dedup();
        let _ = writeln!(s, "{table} {{");
        for b in refills {
            s.push_str(&b.text);
        }
        s.push_str("}\n");
    }
    (s, notes)
}

/// The block of `c`'s object in `blocks` (a set and a map of one name are one object).
fn find<'m>(blocks: &'m BTreeMap<String, Vec<Block>>, c: &Change) -> Option<&'m Block> {
    blocks
        .get(&c.name)?
        .iter()
        .find(|b| same_class(&b.kind, &c.object))
}

fn by_name(blocks: Vec<(String, Block)>) -> BTreeMap<String, Vec<Block>> {
    let mut m: BTreeMap<String, Vec<Block>> = BTreeMap::new();
    for (n, b) in blocks {
        m.entry(n).or_default().push(b);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "table ip kube-proxy {\n\
\tcomment \"rules for kube-proxy\"\n\
\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\tcomment \"Active { ClusterIPs\"\n\t\telements = { 10.96.0.1,\n\t\t\t     10.96.0.10 }\n\t}\n\n\
\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = { 10.96.0.1 . tcp . 443 : goto service-A }\n\t}\n\n\
\tcounter c { packets 0 bytes 0 }\n\n\
\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n\n\
\tchain service-A {\n\t\tip daddr 10.96.0.1 counter packets 3 bytes 180 jump mark-for-masquerade\n\t}\n}\n";

    fn change(object: &str, n: &str, action: Action) -> Change {
        Change {
            object: object.into(),
            name: n.into(),
            action,
            removed: Vec::new(),
            added: Vec::new(),
            note: None,
        }
    }

    fn plan(changes: Vec<Change>) -> FamilyPlan {
        FamilyPlan {
            family: "ip".into(),
            table: "table ip kube-proxy".into(),
            changes,
            script: String::new(),
        }
    }

    #[test]
    fn listings_split_into_objects() {
        let b = blocks(LISTING);
        let names: Vec<(&str, &str)> = b
            .iter()
            .map(|(n, b)| (n.as_str(), b.kind.as_str()))
            .collect();
        assert_eq!(
            names,
            [
                ("cluster-ips", "set"),
                ("service-ips", "map"),
                ("c", "counter"),
                ("services", "chain"),
                ("service-A", "chain")
            ]
        );
        assert!(
            b[0].1.text.ends_with("10.96.0.10 }\n\t}\n"),
            "{:?}",
            b[0].1.text
        );
        assert_eq!(b[2].1.text, "\tcounter c { packets 0 bytes 0 }\n");
    }

    #[test]
    fn only_touched_objects_are_put_back() {
        let p = plan(vec![
            change("chain", "service-A", Action::Rewrite),
            change("chain", "service-NEW", Action::Create),
            change("map", "service-ips", Action::Elements),
            change("set", "cluster-ips", Action::Delete),
        ]);
        let now = "table ip kube-proxy {\n\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t}\n\
\tchain services {\n\t}\n\tchain service-A {\n\t}\n\tchain service-NEW {\n\t}\n}\n";
        let (script, notes) = rollback_script(Family::Ip, Some(LISTING), Some(Some(now)), &p, true);
        assert!(notes.is_empty(), "{notes:?}");
        let lines: Vec<&str> = script.lines().collect();
        assert_eq!(
            &lines[..6],
            [
                "# kubectl-kproxy rollback: table ip kube-proxy (only what the repair changed)",
                "add table ip kube-proxy",
                "flush chain ip kube-proxy service-A",
                "flush chain ip kube-proxy service-NEW",
                "flush map ip kube-proxy service-ips",
                "delete chain ip kube-proxy service-NEW",
            ]
        );
        assert_eq!(lines[6], "table ip kube-proxy {");
        let body = lines[7..].join("\n");
        // Sets before chains, as listed; untouched objects are not named.
        assert!(body.starts_with("\tset cluster-ips {"), "{body}");
        assert!(body.contains("\tmap service-ips {") && body.contains("\tchain service-A {"));
        assert!(
            !body.contains("chain services") && !body.contains("counter c"),
            "{body}"
        );
        assert!(script.ends_with("}\n}\n"));
    }

    #[test]
    fn a_created_table_goes_and_old_kernels_keep_created_chains() {
        let created = plan(vec![change("table", "ip kube-proxy", Action::Create)]);
        let (script, _) = rollback_script(Family::Ip, None, None, &created, true);
        assert!(script.ends_with("add table ip kube-proxy\ndelete table ip kube-proxy\n"));
        let (script, _) = rollback_script(Family::Ip, None, Some(None), &created, true);
        assert_eq!(script, "", "already gone");
        let p = plan(vec![change("chain", "service-NEW", Action::Create)]);
        let (script, notes) = rollback_script(Family::Ip, Some(LISTING), None, &p, false);
        assert!(script.contains("flush chain ip kube-proxy service-NEW\n"));
        assert!(!script.contains("delete chain"), "{script}");
        assert_eq!(notes.len(), 1, "{notes:?}");
        // Nothing touched that exists now or existed before: nothing to do.
        let (script, _) = rollback_script(
            Family::Ip,
            Some(LISTING),
            Some(Some("table ip kube-proxy {\n}\n")),
            &p,
            true,
        );
        assert_eq!(script, "");
    }
}
