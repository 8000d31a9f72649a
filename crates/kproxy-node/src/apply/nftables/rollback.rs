//! Rollback of an nftables repair: only the objects of `table ip|ip6 kube-proxy` the repair
//! changed are put back, from the backup's `nft list table` text — never another table, and
//! not the objects of kube-proxy's table the repair left alone (their rules keep their
//! handles and counters).
//!
//! An object is touched only while it still holds what the repair wrote (a deleted one only
//! while it is still absent), compared as the planner compares them (the listing parsed and
//! normalised): one another writer (a kube-proxy still syncing, an admin) changed since is that
//! writer's now, and is left with a note. So is a created object something left as it is refers
//! to now (deleting it would fail the transaction). Without a listing of the table now, every
//! object the repair changed is put back, and a note says so.
//!
//! One `nft -f` transaction per family (all of it or nothing):
//! 1. `flush chain` / `flush set|map` of every touched object the table has now;
//! 2. `delete chain|set|map` of those the repair created, or declared anew (hook or type);
//! 3. the backup's own blocks of every touched object the table had before (`table FAMILY
//!    kube-proxy { chain X { … } map Y { … elements = { … } } }`), which declare them again
//!    where they were deleted and refill them.
//!
//! A table the node did not have before is deleted whole while it holds exactly what the
//! repair wrote; one another writer added to or changed since is left as it is, and said so.
//! Kernels before 6.2 release a chain from a map element only after the transaction that
//! deleted the element (`pkg/proxy/nftables/proxier.go`, stale chains): there a chain the
//! repair created is left flushed, and said so.

use super::plan::{Action, Change, FamilyPlan, name, rule_refs, table_contents};
use crate::compare::nftables::diff::target;
use crate::compare::nftables::{NftText, kube_proxy_table, parse_listings};
use kproxy_parsers::nft::{Expr, Family, Table};
use std::collections::{BTreeMap, BTreeSet};
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
        match now.map(|n| n.map(|text| created_table_now(text, family, plan))) {
            // Gone already: nothing to undo.
            Some(None) => return (String::new(), notes),
            Some(Some(TableNow::Ours)) => {}
            Some(Some(TableNow::Changed(why))) => {
                notes.push(format!(
                    "{table}: created by the repair, and {why} since; left as the other writer left it"
                ));
                return (String::new(), notes);
            }
            Some(Some(TableNow::Unreadable(e))) => notes.push(format!(
                "{table}: created by the repair; its listing before the rollback could not be read ({e}): deleted whole, whatever it holds now"
            )),
            None => notes.push(format!(
                "{table}: created by the repair; could not be listed before the rollback: deleted whole, whatever it holds now"
            )),
        }
        // The repair created the table and it holds only what the repair wrote: all of it
        // goes (`add` first, so that the deletion works whether or not it exists now).
        let _ = writeln!(s, "add {table}\ndelete {table}");
        return (s, notes);
    };
    let before_blocks: BTreeMap<String, Vec<Block>> = by_name(blocks(before));
    let now_blocks: Option<BTreeMap<String, Vec<Block>>> =
        now.map(|n| by_name(n.map(blocks).unwrap_or_default()));
    // What the objects hold now and held before, parsed as the planner reads them; without a
    // readable listing now, nothing can be told to be another writer's.
    let label = format!("nft list {table}");
    let parsed = |text| {
        parse_listings(
            &[NftText {
                label: &label,
                text,
            }],
            false,
        )
    };
    let now_rs = match now {
        None => {
            notes.push(format!(
                "{table}: could not be listed before the rollback: every object the repair changed is put back, whatever it holds now"
            ));
            None
        }
        Some(n) => match n.map(&parsed).transpose() {
            Ok(rs) => Some(rs),
            Err(e) => {
                notes.push(format!(
                    "{table}: its listing before the rollback could not be read ({e}): every object the repair changed is put back, whatever it holds now"
                ));
                None
            }
        },
    };
    let now_table = now_rs
        .as_ref()
        .map(|rs| rs.as_ref().and_then(|rs| kube_proxy_table(rs, family)));
    let before_rs = parsed(before).ok();
    let before_table = before_rs
        .as_ref()
        .and_then(|rs| kube_proxy_table(rs, family));
    let head =
        |verb: &str, kind: &str, n: &str| format!("{verb} {kind} {family} kube-proxy {}", name(n));
    let mut flushes: Vec<String> = Vec::new();
    let mut deletions = String::new();
    let mut refills: Vec<&Block> = Vec::new();
    // Objects this transaction flushes (their references go with their contents), and the
    // created objects to delete.
    let mut flushed: BTreeSet<&str> = BTreeSet::new();
    let mut created: Vec<(&str, &str)> = Vec::new();
    for c in &plan.changes {
        // What the object is now: as listed, or as the plan left it.
        let mut has_now: Option<&str> = match &now_blocks {
            Some(n) if now_table.is_some() => find(n, c).map(|b| b.kind.as_str()),
            _ => (c.action != Action::Delete).then_some(c.object.as_str()),
        };
        let mut left = |why: &str| {
            notes.push(format!(
                "{table} {} {}: {why}; left as the other writer left it",
                c.object, c.name
            ));
        };
        let is_chain = c.object == "chain";
        let is_set = matches!(c.object.as_str(), "set" | "map");
        // Whether the object is still the repair's: `None` when that cannot be told (the
        // listing now is unknown, or a created or replaced named object, whose content the
        // plan does not hold).
        let comparable = is_chain || is_set || c.action == Action::Delete;
        let ours = now_table.filter(|_| comparable).map(|t| {
            let held = t.and_then(|t| contents(t, c));
            match c.action {
                Action::Delete => held.is_none() && has_now.is_none(),
                _ => held.is_some() && held == written(c, before_table),
            }
        });
        if ours == Some(false) {
            match (c.action, has_now) {
                (Action::Delete, _) => left("deleted by the repair and created again since"),
                (Action::Create, None) => {}
                (Action::Create, Some(_)) => {
                    left("created by the repair and changed after it wrote it")
                }
                (_, None) => left("deleted after the repair wrote it"),
                (_, Some(_)) => left("changed after the repair wrote it"),
            }
            continue;
        }
        if !(is_chain || is_set) {
            has_now = None;
        }
        if let Some(kind) = has_now {
            flushes.push(head("flush", kind, &c.name));
            if c.action == Action::Create && (is_set || same_transaction_delete) {
                // Deleted after the loop, unless something left as it is refers to it.
                created.push((&c.name, kind));
                continue;
            }
            flushed.insert(&c.name);
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
    flushed.extend(created.iter().map(|(n, _)| *n));
    for (n, kind) in created {
        let holders = now_table
            .flatten()
            .map(|t| referrers(t, n, &flushed))
            .unwrap_or_default();
        if holders.is_empty() {
            let _ = writeln!(deletions, "{}", head("delete", kind, n));
        } else {
            let flush = head("flush", kind, n);
            flushes.retain(|f| *f != flush);
            notes.push(format!(
                "{table} {kind} {n}: created by the repair, left as it is: {} refer(s) to it now, left as another writer left it",
                holders.join(", ")
            ));
        }
    }
    if flushes.is_empty() && deletions.is_empty() && refills.is_empty() {
        return (String::new(), notes);
    }
    // The table itself, in case it went away meanwhile.
    let _ = writeln!(s, "add {table}");
    for f in &flushes {
        let _ = writeln!(s, "{f}");
    }
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

/// The rules of `c`'s chain, or the elements of its set or map (sorted), as the planner
/// prints them; `None` when `table` has no such object (or `c` is of another kind).
fn contents(table: &Table<'_>, c: &Change) -> Option<Vec<String>> {
    match c.object.as_str() {
        "chain" => table
            .chains
            .iter()
            .find(|x| x.name == c.name)
            .map(|x| x.rules.iter().map(ToString::to_string).collect()),
        "set" | "map" => table.sets.iter().find(|x| x.name == c.name).map(|x| {
            let mut v: Vec<String> = x.elements.iter().map(ToString::to_string).collect();
            v.sort_unstable();
            v
        }),
        _ => None,
    }
}

/// What `c`'s object holds once the repair applied it, in the form of [`contents`]: a chain
/// the rules it wrote, a set or map the elements it declared, or those `before` held with the
/// ones it removed taken out and the ones it added put in (a set's elements of Services left
/// out as invalid stay). `None` for a deleted object or one of another kind.
fn written(c: &Change, before: Option<&Table<'_>>) -> Option<Vec<String>> {
    let mut v = match (c.object.as_str(), c.action) {
        ("chain", Action::Create | Action::Rewrite | Action::Recreate) => c.written.clone(),
        ("chain", Action::Flush) => Vec::new(),
        ("set" | "map", Action::Create | Action::Recreate) => c.added.clone(),
        ("set" | "map", Action::Elements) => {
            let mut held = before.and_then(|t| contents(t, c)).unwrap_or_default();
            for r in &c.removed {
                if let Some(i) = held.iter().position(|h| h == r) {
                    held.swap_remove(i);
                }
            }
            held.extend(c.added.iter().cloned());
            held
        }
        _ => return None,
    };
    if c.object != "chain" {
        v.sort_unstable();
    }
    Some(v)
}

/// The chains, sets and maps of `table` outside `flushed` whose rules or elements refer to the
/// object `n` (deleting it would fail the whole transaction), as `KIND NAME`.
fn referrers(table: &Table<'_>, n: &str, flushed: &BTreeSet<&str>) -> Vec<String> {
    let kept = |name: &str| name != n && !flushed.contains(name);
    let chains = table.chains.iter().filter(|c| kept(&c.name)).filter(|c| {
        let (chains, sets) = rule_refs(c);
        chains.contains(&n) || sets.contains(&n)
    });
    let sets = table.sets.iter().filter(|s| kept(&s.name)).filter(|s| {
        s.elements.iter().any(|e| match &e.value {
            Some(Expr::Verdict(v)) => target(v) == Some(n),
            _ => false,
        })
    });
    chains
        .map(|c| format!("chain {}", c.name))
        .chain(sets.map(|s| format!("{} {}", if s.is_map { "map" } else { "set" }, s.name)))
        .collect()
}

/// What a table the repair created holds at rollback time.
enum TableNow {
    /// Exactly what the repair wrote: every object it created, with the rules and elements
    /// it wrote, and nothing else.
    Ours,
    /// Something else: what (for the note).
    Changed(String),
    /// The listing could not be parsed (why).
    Unreadable(String),
}

/// Whether `listing` (the table's `nft list` now) still holds exactly what `plan`, which
/// created the table, wrote into it ([`table_contents`]).
fn created_table_now(listing: &str, family: Family, plan: &FamilyPlan) -> TableNow {
    let label = format!("nft list table {family} kube-proxy");
    let parsed = match parse_listings(
        &[NftText {
            label: &label,
            text: listing,
        }],
        false,
    ) {
        Ok(parsed) => parsed,
        Err(e) => return TableNow::Unreadable(e.to_string()),
    };
    let Some(t) = kube_proxy_table(&parsed, family) else {
        return TableNow::Changed("it was listed without its kube-proxy table".into());
    };
    let written: BTreeSet<&str> = plan
        .changes
        .iter()
        .filter(|c| c.object == "table")
        .flat_map(|c| c.written.iter().map(String::as_str))
        .collect();
    let now = table_contents(t);
    let now_set: BTreeSet<&str> = now.iter().map(String::as_str).collect();
    match (
        now_set.difference(&written).next(),
        written.difference(&now_set).next(),
    ) {
        (None, None) => TableNow::Ours,
        (Some(extra), _) => {
            TableNow::Changed(format!("holds `{extra}`, which the repair did not write"))
        }
        (None, Some(gone)) => TableNow::Changed(format!("lost `{gone}`, which the repair wrote")),
    }
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
            written: Vec::new(),
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

    /// The plan of a repair that created the whole table as `listing` shows it (as the
    /// planner makes it: one change, the table's, with what it holds).
    fn created_as(listing: &str) -> FamilyPlan {
        let parsed = parse_listings(
            &[NftText {
                label: "written",
                text: listing,
            }],
            false,
        )
        .expect("listing");
        let t = kube_proxy_table(&parsed, Family::Ip).expect("table");
        let mut table = change("table", "ip kube-proxy", Action::Create);
        table.written = table_contents(t);
        plan(vec![table])
    }

    #[test]
    fn a_created_table_is_deleted_only_while_it_holds_what_the_repair_wrote() {
        let p = created_as(LISTING);
        let delete = "add table ip kube-proxy\ndelete table ip kube-proxy\n";
        // As the repair wrote it: deleted whole.
        let (script, notes) = rollback_script(Family::Ip, None, Some(Some(LISTING)), &p, true);
        assert!(script.ends_with(delete), "{script}");
        assert!(notes.is_empty(), "{notes:?}");
        // Another writer added a chain: left, said.
        let added = LISTING.replacen(
            "\tchain services {",
            "\tchain other {\n\t\tcounter\n\t}\n\n\tchain services {",
            1,
        );
        let (script, notes) = rollback_script(Family::Ip, None, Some(Some(&added)), &p, true);
        assert_eq!(script, "");
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(
            notes[0].contains("holds `chain other`, which the repair did not write")
                && notes[0].contains("left as the other writer left it"),
            "{notes:?}"
        );
        // Another writer rewrote a chain the repair created: left, said.
        let rewritten = LISTING.replace("jump mark-for-masquerade", "drop");
        let (script, notes) = rollback_script(Family::Ip, None, Some(Some(&rewritten)), &p, true);
        assert_eq!(script, "");
        assert!(
            notes[0].contains("holds `chain service-A rule 0: ") && notes[0].contains("drop`"),
            "{notes:?}"
        );
        // An element another writer added to a created map: left.
        let element = LISTING.replace(
            "elements = { 10.96.0.1 . tcp . 443 : goto service-A }",
            "elements = { 10.96.0.1 . tcp . 443 : goto service-A, 10.96.0.9 . tcp . 80 : goto service-A }",
        );
        let (script, notes) = rollback_script(Family::Ip, None, Some(Some(&element)), &p, true);
        assert_eq!(script, "");
        assert!(
            notes[0].contains("holds `map service-ips element: 10.96.0.9 . tcp . 80"),
            "{notes:?}"
        );
        // A chain the repair created, deleted by another writer: left, said.
        let deleted = LISTING.replace(
            "\n\tchain service-A {\n\t\tip daddr 10.96.0.1 counter packets 3 bytes 180 jump mark-for-masquerade\n\t}",
            "",
        );
        assert_ne!(deleted, LISTING);
        let (script, notes) = rollback_script(Family::Ip, None, Some(Some(&deleted)), &p, true);
        assert_eq!(script, "");
        assert!(notes[0].contains("lost `chain service-A"), "{notes:?}");
        // The node could not be listed: deleted whole, and said.
        let (script, notes) = rollback_script(Family::Ip, None, None, &p, true);
        assert!(script.ends_with(delete), "{script}");
        assert!(notes[0].contains("could not be listed"), "{notes:?}");
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
            Change {
                removed: vec!["10.96.0.1 . tcp . 443 : goto service-A".into()],
                ..change("map", "service-ips", Action::Elements)
            },
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
        assert_eq!(notes.len(), 2, "{notes:?}");
        assert!(notes[0].contains("could not be listed"), "{notes:?}");
        assert!(notes[1].contains("left empty"), "{notes:?}");
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

    /// A change of `object` `n` with the `written` rules (a chain) or `added` and `removed`
    /// elements (a set or map).
    fn wrote(
        object: &str,
        n: &str,
        action: Action,
        written: &[&str],
        added: &[&str],
        removed: &[&str],
    ) -> Change {
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_string()).collect();
        Change {
            written: strings(written),
            added: strings(added),
            removed: strings(removed),
            ..change(object, n, action)
        }
    }

    /// The table `LISTING` is, with `objects` (`KIND NAME { … }` blocks) in place of its own of
    /// those names.
    fn listing_with(objects: &[&str]) -> String {
        let mut s = String::from("table ip kube-proxy {\n");
        let replaced: Vec<String> = objects
            .iter()
            .filter_map(|o| blocks(&format!("table ip kube-proxy {{\n\t{o}\n}}\n")).pop())
            .map(|(n, _)| n)
            .collect();
        for (n, b) in blocks(LISTING) {
            if !replaced.contains(&n) {
                s.push_str(&b.text);
            }
        }
        for o in objects {
            s.push_str(&format!("\t{o}\n"));
        }
        s.push_str("}\n");
        s
    }

    #[test]
    fn what_another_writer_changed_after_the_repair_is_left_and_said() {
        let elem_a = "10.96.0.1 . tcp . 443 : goto service-A";
        let elem_b = "10.96.0.2 . tcp . 80 : goto service-B";
        let p = plan(vec![
            // Rewritten: service-A to one rule, services to a vmap and a drop.
            wrote(
                "chain",
                "service-A",
                Action::Rewrite,
                &["ip daddr 10.96.0.1 counter jump mark-for-masquerade"],
                &[],
                &[],
            ),
            wrote(
                "chain",
                "services",
                Action::Rewrite,
                &[
                    "ip daddr . meta l4proto . th dport vmap @service-ips",
                    "drop",
                ],
                &[],
                &[],
            ),
            // Created with one rule, and an empty set.
            wrote(
                "chain",
                "service-NEW",
                Action::Create,
                &["jump service-A"],
                &[],
                &[],
            ),
            wrote("set", "new-ips", Action::Create, &[], &[], &[]),
            // One map element replaced by another; a stale set deleted.
            wrote(
                "map",
                "service-ips",
                Action::Elements,
                &[],
                &[elem_b],
                &[elem_a],
            ),
            wrote("set", "cluster-ips", Action::Delete, &[], &[], &[]),
        ]);
        let map = |elements: &str| {
            format!(
                "map service-ips {{\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\telements = {{ {elements} }}\n\t}}"
            )
        };
        // As the repair left it: every object is still its own.
        let as_written = listing_with(&[
            "chain service-A {\n\t\tip daddr 10.96.0.1 counter packets 9 bytes 540 jump mark-for-masquerade\n\t}",
            "chain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t\tdrop\n\t}",
            "chain service-NEW {\n\t\tjump service-A\n\t}",
            "set new-ips {\n\t\ttype ipv4_addr\n\t}",
            &map(elem_b),
        ])
        .replace("\tset cluster-ips {\n\t\ttype ipv4_addr\n\t\tcomment \"Active { ClusterIPs\"\n\t\telements = { 10.96.0.1,\n\t\t\t     10.96.0.10 }\n\t}\n", "");
        assert!(!as_written.contains("cluster-ips"), "{as_written}");
        let (script, notes) =
            rollback_script(Family::Ip, Some(LISTING), Some(Some(&as_written)), &p, true);
        assert!(notes.is_empty(), "{notes:?}\n{as_written}");
        for line in [
            "flush chain ip kube-proxy service-A\n",
            "flush chain ip kube-proxy services\n",
            "delete chain ip kube-proxy service-NEW\n",
            "delete set ip kube-proxy new-ips\n",
            "flush map ip kube-proxy service-ips\n",
            "\tset cluster-ips {\n",
        ] {
            assert!(script.contains(line), "no {line:?} in\n{script}");
        }

        // Another writer since: service-A rewritten (a newer endpoint), services deleted,
        // service-NEW given a second rule, the map given another element, cluster-ips created
        // again. Only the created set that is still as written goes.
        let since = listing_with(&[
            "chain service-A {\n\t\tip daddr 10.96.0.1 jump service-C\n\t}",
            "chain service-NEW {\n\t\tjump service-A\n\t\tjump service-C\n\t}",
            "set new-ips {\n\t\ttype ipv4_addr\n\t}",
            &map(&format!("{elem_b}, 10.96.0.3 . tcp . 80 : goto service-C")),
        ]);
        let since = since.replace(
            "\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n",
            "",
        );
        assert!(!since.contains("chain services "), "{since}");
        let (script, notes) =
            rollback_script(Family::Ip, Some(LISTING), Some(Some(&since)), &p, true);
        assert_eq!(
            script,
            "# kubectl-kproxy rollback: table ip kube-proxy (only what the repair changed)\n\
add table ip kube-proxy\nflush set ip kube-proxy new-ips\ndelete set ip kube-proxy new-ips\n"
        );
        let said = |object: &str, why: &str| {
            notes.iter().any(|n| {
                n.starts_with(&format!("table ip kube-proxy {object}: {why}"))
                    && n.ends_with("; left as the other writer left it")
            })
        };
        assert!(
            said("chain service-A", "changed after the repair wrote it"),
            "{notes:?}"
        );
        assert!(
            said("chain services", "deleted after the repair wrote it"),
            "{notes:?}"
        );
        assert!(
            said(
                "chain service-NEW",
                "created by the repair and changed after"
            ),
            "{notes:?}"
        );
        assert!(
            said("map service-ips", "changed after the repair wrote it"),
            "{notes:?}"
        );
        assert!(
            said("set cluster-ips", "deleted by the repair and created again"),
            "{notes:?}"
        );
        assert_eq!(notes.len(), 5, "{notes:?}");

        // A created set another writer's chain now refers to stays (deleting it would fail
        // the transaction), and nothing is left to do.
        let held = since.replace(
            "ip daddr 10.96.0.1 jump service-C",
            "ip daddr @new-ips jump service-C",
        );
        let (script, notes) =
            rollback_script(Family::Ip, Some(LISTING), Some(Some(&held)), &p, true);
        assert_eq!(script, "", "{notes:?}");
        assert!(
            notes.iter().any(|n| n.starts_with(
                "table ip kube-proxy set new-ips: created by the repair, left as it is: chain service-A refer"
            )),
            "{notes:?}"
        );

        // The same listing unreadable: the plan is taken as applied whole, and that is said.
        let (script, notes) = rollback_script(
            Family::Ip,
            Some(LISTING),
            Some(Some("table ip kube-proxy {\n\tchain x {\n")),
            &p,
            true,
        );
        assert!(
            script.contains("flush chain ip kube-proxy service-A\n"),
            "{script}"
        );
        assert!(
            notes.iter().any(|n| n.contains("could not be read")),
            "{notes:?}"
        );
    }
}
