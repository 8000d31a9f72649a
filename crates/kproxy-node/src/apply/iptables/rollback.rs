//! Rollback of an iptables repair: only what the repair changed is put back, from the backup —
//! never whole tables, so that rules other programs (Docker, a CNI plugin, kubelet) wrote while
//! the repair ran stay as they are.
//!
//! A chain is touched only while it still holds what the repair wrote: one another writer (a
//! kube-proxy still syncing, a CNI plugin, an admin) changed since is that writer's now, and
//! putting the backup back would undo its change; it is left, and a note says so.
//!
//! For each table the repair applied, one `iptables-restore --noflush --counters` input:
//! - a chain it created, still as it wrote it, is flushed and deleted (kept, empty, when a rule
//!   outside the rollback jumps to it now: deleting it would fail the whole table);
//! - a chain it rewrote, still as it wrote it, or deleted, still absent, is declared (created
//!   or flushed) and refilled with the backup's rules and counters;
//! - in a built-in chain, exactly the jump rules it inserted are deleted (`-D CHAIN SPEC`, each
//!   found in the chain as it is now: one it no longer holds is not deleted).
//!
//! The rollback has its own xtables lock wait and retries with backoff ([`crate::apply::transaction::RollbackPolicy`]);
//! before each attempt its input is written beside the backup, so that a rollback that still
//! fails can be finished by hand with the exact command of the backend and network namespace
//! used ([`super::host::RulesHost::by_hand`]).

use super::host::{RulesHost, restore_args, restore_argv};
use super::plan::{ChainAction, TablePlan};
use crate::apply::backup::write_private;
use crate::apply::transaction::{RollbackPolicy, RolledBack};
use crate::model::{Chain, RuleEntry, Ruleset, TableRules};
use kproxy_parsers::iptables::ParseOptions;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::path::Path;

/// The rollback input of the tables a repair applied, and what it could not put back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RollbackInput {
    /// The `iptables-restore --noflush --counters` input ("" when nothing is to be undone).
    pub text: String,
    /// What is left as it is now, and why (one sentence each).
    pub notes: Vec<String>,
}

/// The input that puts the chains `applied` changed back as `before` (the backup, an
/// `iptables-save -c`) holds them. `now` is the node's rules as they are now, when they could
/// be read: inserted jumps are deleted as it shows them, created chains only when they exist
/// and nothing outside the rollback jumps to them, and a created or rewritten chain only while
/// it holds what the repair wrote (a deleted one only while it is absent). Without `now` the
/// plan is taken to have been applied whole, and a note says so.
pub fn rollback_input(
    before: &Ruleset<'_>,
    now: Option<&Ruleset<'_>>,
    applied: &[&TablePlan],
) -> RollbackInput {
    let mut out = RollbackInput::default();
    if now.is_none() && !applied.is_empty() {
        out.notes.push(
            "the node's rules could not be read before the rollback: every chain the repair changed is put back, whatever it holds now".to_string(),
        );
    }
    for tp in applied {
        let body = table_rollback(
            tp,
            before.table(&tp.table),
            now.map(|n| n.table(&tp.table)),
            &mut out.notes,
        );
        if !body.is_empty() {
            let _ = write!(out.text, "*{}\n{body}COMMIT\n", tp.table);
        }
    }
    out
}

/// The lines of one table's rollback (between `*TABLE` and `COMMIT`). `now` is `None` when the
/// node's rules are unknown, `Some(None)` when the node has no such table now.
fn table_rollback(
    tp: &TablePlan,
    before: Option<&TableRules<'_>>,
    now: Option<Option<&TableRules<'_>>>,
    notes: &mut Vec<String>,
) -> String {
    let mut declare: Vec<&str> = Vec::new();
    let mut refill: Vec<&str> = Vec::new();
    let mut created: Vec<&str> = Vec::new();
    for c in &tp.changes {
        // What the chain is now: `None` unknown, `Some(None)` absent.
        let chain_now = now.map(|t| t.and_then(|t| t.chain(&c.chain)));
        let ours = |ch: &Chain<'_>| c.still_written(ch, tp.family);
        let mut left = |why: &str| {
            notes.push(format!(
                "table {} chain {}: {why}; left as the other writer left it",
                tp.table, c.chain
            ));
        };
        match c.action {
            ChainAction::Rewrite => match chain_now {
                Some(Some(ch)) if !ours(ch) => left("changed after the repair wrote it"),
                Some(None) => left("deleted after the repair wrote it"),
                _ => {
                    declare.push(&c.chain);
                    refill.push(&c.chain);
                }
            },
            ChainAction::Delete => match chain_now {
                Some(Some(_)) => left("deleted by the repair and created again since"),
                _ => {
                    declare.push(&c.chain);
                    refill.push(&c.chain);
                }
            },
            ChainAction::Create => match chain_now {
                Some(Some(ch)) if !ours(ch) => {
                    left("created by the repair and changed after it wrote it");
                }
                Some(None) => {}
                _ => {
                    declare.push(&c.chain);
                    created.push(&c.chain);
                }
            },
            ChainAction::KeepReferenced | ChainAction::InsertJumps => {}
        }
    }
    // The inserted jumps to delete, as the chain holds them now (rule text, and which rule).
    let mut deletions: Vec<(String, String)> = Vec::new();
    let mut deleted_rules: HashSet<*const RuleEntry<'_>> = HashSet::new();
    for c in tp
        .changes
        .iter()
        .filter(|c| c.action == ChainAction::InsertJumps)
    {
        match now {
            None => deletions.extend(c.inserted_rules().map(|r| (c.chain.clone(), r.to_string()))),
            Some(t) => {
                let rules = t
                    .and_then(|t| t.chain(&c.chain))
                    .map_or(&[][..], |ch| &ch.rules);
                for wanted in &c.added {
                    let found = rules.iter().find(|r| {
                        !deleted_rules.contains(&std::ptr::from_ref(*r))
                            && r.canonical(tp.family).into_string() == *wanted
                    });
                    match found {
                        Some(r) => {
                            deleted_rules.insert(std::ptr::from_ref(r));
                            deletions.push((c.chain.clone(), r.rule.raw.to_string()));
                        }
                        None => notes.push(format!(
                            "table {} {}: the inserted rule `{wanted}` is no longer there; nothing to delete",
                            tp.table, c.chain
                        )),
                    }
                }
            }
        }
    }
    // Created chains that something outside the rollback jumps to now stay, flushed.
    let flushed: HashSet<&str> = declare.iter().copied().collect();
    let mut remove: Vec<&str> = Vec::new();
    for c in created {
        let holders: Vec<String> = match now.flatten() {
            None => Vec::new(),
            Some(t) => t
                .jumps_to(c)
                .filter(|(holder, r)| {
                    !flushed.contains(holder.name)
                        && !deleted_rules.contains(&std::ptr::from_ref(*r))
                })
                .map(|(holder, r)| format!("-A {} {}", holder.name, r.rule.raw))
                .collect(),
        };
        if holders.is_empty() {
            remove.push(c);
        } else {
            notes.push(format!(
                "table {} chain {c}: created by the repair, left empty: {} jump(s) to it now ({})",
                tp.table,
                holders.len(),
                holders.join("; ")
            ));
        }
    }
    let mut s = String::new();
    for c in &declare {
        let _ = writeln!(s, ":{c} - [0:0]");
    }
    for c in &refill {
        for r in before
            .and_then(|t| t.chain(c))
            .map_or(&[][..], |ch| &ch.rules)
        {
            if let Some(n) = r.rule.counters() {
                let _ = write!(s, "[{}:{}] ", n.packets, n.bytes);
            }
            let _ = writeln!(s, "{}", rule_line("-A", c, r.rule.raw));
        }
    }
    for (chain, raw) in &deletions {
        let _ = writeln!(s, "{}", rule_line("-D", chain, raw));
    }
    for c in &remove {
        let _ = writeln!(s, "-X {c}");
    }
    s
}

fn rule_line(op: &str, chain: &str, raw: &str) -> String {
    if raw.is_empty() {
        format!("{op} {chain}")
    } else {
        format!("{op} {chain} {raw}")
    }
}

/// Puts back what the tables `applied` changed, from `backup_text` (the backup's
/// `iptables-save -c`), with `policy`'s lock wait and retries. Before each attempt the input
/// is read afresh against the node's rules and written to `file`. Returns what was done, or
/// why it failed with the command that finishes it by hand.
pub fn roll_back(
    host: &impl RulesHost,
    backup_text: &str,
    applied: &[&TablePlan],
    policy: &RollbackPolicy,
    file: &Path,
) -> Result<RolledBack, String> {
    let before = Ruleset::parse(backup_text, &ParseOptions::default())
        .map_err(|e| format!("reading the backup: {e}"))?;
    let args = restore_argv(policy.lock_wait, restore_args::ROLLBACK);
    let mut notes = Vec::new();
    let mut nothing_to_do = false;
    let mut written: Result<(), String> = Ok(());
    let (attempts, result) = policy.run(|| {
        let now_text = host.save(false).ok();
        let now = now_text
            .as_deref()
            .and_then(|t| Ruleset::parse(t, &ParseOptions::default()).ok());
        let input = rollback_input(&before, now.as_ref(), applied);
        notes = input.notes;
        if input.text.is_empty() {
            nothing_to_do = true;
            return Ok(());
        }
        written = write_private(file, &input.text)
            .map_err(|e| format!("writing {}: {e}", file.display()));
        host.restore_waiting(policy.lock_wait, restore_args::ROLLBACK, &input.text)
    });
    match result {
        Ok(()) => Ok(RolledBack {
            attempts: if nothing_to_do { 0 } else { attempts },
            notes,
        }),
        Err(e) => {
            let by_hand = match written {
                Ok(()) => format!(
                    "the rollback input (only the chains this repair changed) is in {}; finish the rollback by hand: {}",
                    file.display(),
                    host.by_hand("restore", &args, file)
                ),
                Err(w) => format!("the rollback input could not be written either ({w})"),
            };
            Err(format!("{e} (after {attempts} attempt(s)); {by_hand}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::iptables::plan::plan;

    fn rs(text: &str) -> Ruleset<'_> {
        Ruleset::parse(text, &ParseOptions::default()).expect("test input parses")
    }

    const EXPECTED: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"a/b cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j ACCEPT\nCOMMIT\n";

    /// The node before: a drifted service chain, a stale endpoint chain, no KUBE-SERVICES, a
    /// foreign chain and a foreign rule in PREROUTING.
    const BEFORE: &str = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n:DOCKER - [0:0]\n\
[3:180] -A PREROUTING -j DOCKER\n\
[7:420] -A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB\n\
[7:420] -A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -j DNAT --to-destination 10.0.0.1:80\n\
[0:0] -A DOCKER -j RETURN\nCOMMIT\n";

    #[test]
    fn only_the_changed_chains_and_inserted_jumps_are_undone() {
        let before = rs(BEFORE);
        let p = plan(&rs(EXPECTED), &before, false);
        let applied: Vec<&TablePlan> = p.tables.iter().collect();
        // Now: the plan applied, and meanwhile Docker added a chain and a rule.
        let now = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:DOCKER - [0:0]\n:DOCKER-2 - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A PREROUTING -j DOCKER\n-A PREROUTING -j DOCKER-2\n\
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"a/b cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j ACCEPT\n-A DOCKER -j RETURN\n-A DOCKER-2 -j RETURN\nCOMMIT\n";
        let r = rollback_input(&before, Some(&rs(now)), &applied);
        assert_eq!(
            r.text,
            "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n\
[7:420] -A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-BBBBBBBBBBBBBBBB\n\
[7:420] -A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -j DNAT --to-destination 10.0.0.1:80\n\
-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-X KUBE-SERVICES\nCOMMIT\n"
        );
        assert!(r.notes.is_empty(), "{:?}", r.notes);
        assert!(!r.text.contains("DOCKER"), "foreign chains are not named");
    }

    #[test]
    fn what_is_gone_or_held_by_others_is_left_and_said() {
        let before = rs(BEFORE);
        let p = plan(&rs(EXPECTED), &before, false);
        let applied: Vec<&TablePlan> = p.tables.iter().collect();
        // Someone removed the jump we inserted, and a foreign chain jumps to KUBE-SERVICES
        // (which, as the rewritten service chain, still holds what the repair wrote).
        let now = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:OTHER - [0:0]\n\
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"a/b cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j ACCEPT\n-A OTHER -j KUBE-SERVICES\nCOMMIT\n";
        let r = rollback_input(&before, Some(&rs(now)), &applied);
        assert!(!r.text.contains("-D PREROUTING"), "{}", r.text);
        assert!(!r.text.contains("-X KUBE-SERVICES"), "{}", r.text);
        assert!(
            r.text.contains(":KUBE-SERVICES - [0:0]\n"),
            "flushed all the same"
        );
        assert_eq!(r.notes.len(), 2, "{:?}", r.notes);
        assert!(
            r.notes[1].contains("-A OTHER -j KUBE-SERVICES"),
            "{:?}",
            r.notes
        );
        // A created chain that is gone now is not named at all.
        let gone = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\nCOMMIT\n";
        let r = rollback_input(&before, Some(&rs(gone)), &applied);
        assert!(!r.text.contains("KUBE-SERVICES"), "{}", r.text);
        // Without the node's rules, the plan is taken as applied whole, and that is said.
        let r = rollback_input(&before, None, &applied);
        assert!(
            r.text.contains("-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n")
                && r.text.contains("-X KUBE-SERVICES\n")
                && r.text.contains(":KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n")
                && r.text.contains(":KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n"),
            "{}",
            r.text
        );
        assert_eq!(r.notes.len(), 1, "{:?}", r.notes);
        assert!(r.notes[0].contains("could not be read"), "{:?}", r.notes);
        // A table the repair did not apply is not rolled back.
        assert_eq!(rollback_input(&before, None, &[]).text, "");
    }

    #[test]
    fn what_another_writer_changed_after_the_repair_is_left_and_said() {
        let before = rs(BEFORE);
        let p = plan(&rs(EXPECTED), &before, false);
        let applied: Vec<&TablePlan> = p.tables.iter().collect();
        // After the repair wrote its chains another writer rewrote the service chain (a newer
        // endpoint), created the stale endpoint chain again, and added a rule to the created
        // KUBE-SERVICES.
        let now = "*nat\n:PREROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n:KUBE-SEP-CCCCCCCCCCCCCCCC - [0:0]\n\
-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
-A KUBE-SERVICES -d 10.96.0.1/32 -p tcp -m comment --comment \"a/b cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SERVICES -d 10.96.0.9/32 -p tcp -m comment --comment \"e/f cluster IP\" -m tcp --dport 80 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j KUBE-SEP-CCCCCCCCCCCCCCCC\n\
-A KUBE-SEP-BBBBBBBBBBBBBBBB -p tcp -j DNAT --to-destination 10.0.0.1:80\n\
-A KUBE-SEP-CCCCCCCCCCCCCCCC -p tcp -j DNAT --to-destination 10.0.0.2:80\nCOMMIT\n";
        let r = rollback_input(&before, Some(&rs(now)), &applied);
        // Only the jump the repair inserted is undone: every chain is another writer's now.
        assert_eq!(
            r.text,
            "*nat\n-D PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\nCOMMIT\n"
        );
        let said = |chain: &str, why: &str| {
            r.notes.iter().any(|n| {
                n.starts_with(&format!("table nat chain {chain}: {why}"))
                    && n.ends_with("left as the other writer left it")
            })
        };
        assert!(
            said(
                "KUBE-SVC-AAAAAAAAAAAAAAAA",
                "changed after the repair wrote it"
            ),
            "{:?}",
            r.notes
        );
        assert!(
            said(
                "KUBE-SEP-BBBBBBBBBBBBBBBB",
                "deleted by the repair and created again"
            ),
            "{:?}",
            r.notes
        );
        assert!(
            said("KUBE-SERVICES", "created by the repair and changed after"),
            "{:?}",
            r.notes
        );
        assert_eq!(r.notes.len(), 3, "{:?}", r.notes);

        // A rewritten chain another writer deleted is not created again.
        let gone = "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n";
        let r = rollback_input(&before, Some(&rs(gone)), &applied);
        assert!(!r.text.contains("KUBE-SVC-AAAAAAAAAAAAAAAA"), "{}", r.text);
        assert!(
            r.text.contains(":KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n"),
            "the deleted chain, still absent, is created again: {}",
            r.text
        );
        assert!(
            said_in(
                &r.notes,
                "KUBE-SVC-AAAAAAAAAAAAAAAA",
                "deleted after the repair wrote it"
            ),
            "{:?}",
            r.notes
        );

        // The same rules in another order are still the repair's in KUBE-SERVICES, whose order
        // kube-proxy does not define, but not in a service chain.
        let expected = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n-A KUBE-SERVICES -d 10.96.0.2/32 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j RETURN\n-A KUBE-SVC-AAAAAAAAAAAAAAAA -j ACCEPT\nCOMMIT\n";
        let drifted =
            rs("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\nCOMMIT\n");
        let p = plan(&rs(expected), &drifted, false);
        let applied: Vec<&TablePlan> = p.tables.iter().collect();
        let swapped = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n\
-A KUBE-SERVICES -d 10.96.0.2/32 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n-A KUBE-SERVICES -d 10.96.0.1/32 -j KUBE-SVC-AAAAAAAAAAAAAAAA\n\
-A KUBE-SVC-AAAAAAAAAAAAAAAA -j ACCEPT\n-A KUBE-SVC-AAAAAAAAAAAAAAAA -j RETURN\nCOMMIT\n";
        let r = rollback_input(&drifted, Some(&rs(swapped)), &applied);
        assert_eq!(r.text, "*nat\n:KUBE-SERVICES - [0:0]\nCOMMIT\n");
        assert!(
            said_in(
                &r.notes,
                "KUBE-SVC-AAAAAAAAAAAAAAAA",
                "changed after the repair wrote it"
            ),
            "{:?}",
            r.notes
        );
    }

    fn said_in(notes: &[String], chain: &str, why: &str) -> bool {
        notes
            .iter()
            .any(|n| n.starts_with(&format!("table nat chain {chain}: {why}")))
    }
}
