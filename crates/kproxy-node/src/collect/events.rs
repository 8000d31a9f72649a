//! Change events of the node's nf_tables rules, so that a reader knows *that* and *where* the
//! rules changed without reading them: `nft monitor` runs as a child process (in the network
//! namespace of the [`HostRunner`]) and its lines are read as they come.
//!
//! What the kernel reports (`nft monitor` prints one line per object changed, then one line per
//! committed transaction):
//!
//! ```text
//! add rule ip nat KUBE-SVC-ABC … counter packets 0 bytes 0 return
//! delete rule ip nat KUBE-SVC-ABC handle 3
//! add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 53 : goto service-… }
//! # new generation 5 by process 18134 (iptables-nft-re)
//! ```
//!
//! Every commit to nf_tables in the namespace ends with a new generation, numbered one more
//! than the last: a gap means lines were lost, and so does nft's own `# ERROR: We lost some
//! netlink events!` (its socket overflowed). Either way the reader cannot know what changed
//! and must read everything again, as it must while the child is not running. The rules in
//! nf_tables are iptables-nft's tables (`ip nat`, `ip filter`, …) and kube-proxy's nftables
//! tables (`ip kube-proxy`, `ip6 kube-proxy`); iptables-legacy, ipsets and IPVS have no such
//! events and are read every time.

use super::netns::HostRunner;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::AsyncBufReadExt;
use tokio::sync::Notify;

/// The tables whose changes count: those `iptables-save` lists (of the nf_tables backend) and
/// kube-proxy's own in nftables mode. Changes of other families (`inet`, `bridge`, …) or
/// tables (another agent's `ip firewalld`) change nothing the collector reads.
pub const WATCHED_TABLES: [&str; 6] = ["nat", "filter", "mangle", "raw", "security", "kube-proxy"];

/// At most this many changed objects are named; more are counted only (a full sync of a large
/// node rewrites tens of thousands of rules).
const MAX_NAMED: usize = 64;

/// One line of `nft monitor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// An object added, changed or deleted.
    Change(Change),
    /// A transaction committed: `# new generation ID by process PID (NAME)`.
    Generation {
        /// The ruleset's generation after it.
        id: u64,
        /// The process that made it (`iptables-nft-re`, `nft`, `kube-proxy`).
        process: String,
    },
    /// nft says it lost events (its socket overflowed).
    Lost,
    /// Anything else (a warning, a continued line).
    Other,
}

/// An object an event names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `add`, `delete`, `create`, `replace`, `flush`, `destroy`, `reset`.
    pub verb: String,
    /// `rule`, `chain`, `table`, `set`, `map`, `element`, …
    pub kind: String,
    /// `ip`, `ip6`, `inet`, …
    pub family: String,
    /// The table.
    pub table: String,
    /// The chain, set or map, when the event is about one (the table itself has none).
    pub object: Option<String>,
}

impl Change {
    /// Whether it changes what the collector reads ([`WATCHED_TABLES`] of `ip` and `ip6`).
    pub fn watched(&self) -> bool {
        matches!(self.family.as_str(), "ip" | "ip6")
            && WATCHED_TABLES.contains(&self.table.as_str())
    }

    /// `ip nat KUBE-SVC-ABC`, `ip kube-proxy` (the table itself).
    pub fn place(&self) -> String {
        match &self.object {
            Some(o) => format!("{} {} {o}", self.family, self.table),
            None => format!("{} {}", self.family, self.table),
        }
    }
}

/// Reads one line of `nft monitor`'s text output.
pub fn parse_line(line: &str) -> Line {
    let line = line.trim_end();
    if let Some(rest) = line.strip_prefix("# new generation ") {
        let mut words = rest.split_whitespace();
        let id = words.next().and_then(|w| w.parse().ok());
        // `by process PID (NAME)`
        let process = rest
            .rsplit_once('(')
            .map(|(_, n)| n.trim_end_matches(')').to_string())
            .unwrap_or_default();
        return match id {
            Some(id) => Line::Generation { id, process },
            None => Line::Other,
        };
    }
    if line.starts_with('#') && line.contains("lost") {
        return Line::Lost;
    }
    let mut words = line.split_whitespace();
    let (Some(verb), Some(kind), Some(family), Some(table)) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Line::Other;
    };
    let verbs = [
        "add", "delete", "create", "replace", "flush", "destroy", "reset", "insert",
    ];
    if !verbs.contains(&verb) || !is_family(family) {
        return Line::Other;
    }
    // `add table ip nat`: no object; `add rule ip nat CHAIN …`, `add element ip T SET { … }`.
    let object = match kind {
        "table" => None,
        _ => words.next().map(|w| w.trim_end_matches('{').to_string()),
    };
    Line::Change(Change {
        verb: verb.to_string(),
        kind: kind.to_string(),
        family: family.to_string(),
        table: table.to_string(),
        object: object.filter(|o| !o.is_empty()),
    })
}

fn is_family(word: &str) -> bool {
    matches!(word, "ip" | "ip6" | "inet" | "arp" | "bridge" | "netdev")
}

/// What the events said since the last [`RuleEvents::take`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Taken {
    /// Whether a watched table changed (or events were lost, or the events cannot be trusted):
    /// what was read before no longer stands for the node.
    pub changed: bool,
    /// The watched chains, sets and maps named (at most a few dozen, sorted).
    pub places: Vec<String>,
    /// How many changes of watched tables there were.
    pub changes: u64,
    /// Why the events cannot say that nothing changed (`None`: they can): the child is not
    /// running, lines were lost, it has not run long enough to be listening.
    pub untrusted: Option<String>,
}

/// The events' state between two takes.
#[derive(Debug, Default)]
struct State {
    changed: bool,
    places: BTreeSet<String>,
    changes: u64,
    /// The changes of the transaction not committed yet (its generation line not seen).
    open: u64,
    generation: Option<u64>,
    /// Why events were lost since the last take.
    lost: Option<String>,
    /// Why the child stopped.
    stopped: Option<String>,
    /// Generations seen (all, watched or not).
    generations: u64,
}

impl State {
    fn line(&mut self, line: Line) -> bool {
        match line {
            Line::Change(c) if c.watched() => {
                self.changed = true;
                self.changes += 1;
                self.open += 1;
                if self.places.len() < MAX_NAMED {
                    self.places.insert(c.place());
                }
                false
            }
            Line::Change(_) | Line::Other => false,
            Line::Lost => {
                self.changed = true;
                self.lost = Some("nft monitor lost events (its socket overflowed)".into());
                true
            }
            Line::Generation { id, .. } => {
                self.generations += 1;
                if let Some(last) = self.generation
                    && id != last.wrapping_add(1)
                {
                    self.changed = true;
                    self.lost = Some(format!(
                        "nft monitor skipped from generation {last} to {id}: lines were lost"
                    ));
                }
                self.generation = Some(id);
                let committed = std::mem::take(&mut self.open) > 0;
                committed || self.lost.is_some()
            }
        }
    }
}

/// `nft monitor` running in the background; dropped, it is killed.
pub struct RuleEvents {
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
    started: Instant,
    /// How long the child must have run before its silence says that nothing changed.
    settle: Duration,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RuleEvents {
    fn drop(&mut self) {
        // The task owns the child (killed when dropped).
        self.task.abort();
    }
}

impl RuleEvents {
    /// Starts `nft monitor` where `runner` runs commands. Its silence counts only once it has
    /// run for `settle` (it subscribes after it has started; a change before that is not seen).
    /// An error when it cannot be started (no `nft`).
    pub fn start(runner: &HostRunner, settle: Duration) -> Result<RuleEvents, String> {
        let argv = runner.argv(&["nft", "monitor"]);
        let (program, args) = argv.split_first().ok_or("no program")?;
        let mut child = tokio::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("starting `{}`: {e}", argv.join(" ")))?;
        let stdout = child.stdout.take().ok_or("nft monitor: no stdout")?;
        let stderr = child.stderr.take();
        let state = Arc::new(Mutex::new(State::default()));
        let notify = Arc::new(Notify::new());
        let (st, nt) = (Arc::clone(&state), Arc::clone(&notify));
        let command = argv.join(" ");
        let task = tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            let end = loop {
                match lines.next_line().await {
                    Ok(Some(line)) => {
                        let wake = st.lock().map(|mut s| s.line(parse_line(&line)));
                        if wake.unwrap_or(true) {
                            nt.notify_one();
                        }
                    }
                    Ok(None) => break "its output ended".to_string(),
                    Err(e) => break format!("reading its output: {e}"),
                }
            };
            let mut why = String::new();
            if let Some(mut e) = stderr {
                use tokio::io::AsyncReadExt;
                let mut buf = Vec::new();
                let _ = (&mut e).take(4096).read_to_end(&mut buf).await;
                why = String::from_utf8_lossy(&buf).trim().to_string();
            }
            let status = child
                .wait()
                .await
                .map(|s| s.to_string())
                .unwrap_or_default();
            if let Ok(mut s) = st.lock() {
                s.changed = true;
                s.stopped = Some(format!(
                    "`{command}` stopped ({end}; {status}){}",
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", super::shorten(&why, 300))
                    }
                ));
            }
            nt.notify_one();
        });
        Ok(RuleEvents {
            state,
            notify,
            started: Instant::now(),
            settle,
            task,
        })
    }

    /// What the events said since the last take, and resets it: a read that starts now covers
    /// every change taken.
    pub fn take(&self) -> Taken {
        let Ok(mut s) = self.state.lock() else {
            return Taken {
                changed: true,
                untrusted: Some("the events' state is unreadable".into()),
                ..Taken::default()
            };
        };
        let untrusted = s.stopped.clone().or_else(|| s.lost.take()).or_else(|| {
            (self.started.elapsed() < self.settle)
                .then(|| "nft monitor has only just started".to_string())
        });
        let taken = Taken {
            changed: s.changed || untrusted.is_some(),
            places: std::mem::take(&mut s.places).into_iter().collect(),
            changes: std::mem::take(&mut s.changes),
            untrusted,
        };
        s.changed = false;
        taken
    }

    /// Why the events are no longer coming (the child stopped), if so.
    pub fn stopped(&self) -> Option<String> {
        self.state.lock().ok().and_then(|s| s.stopped.clone())
    }

    /// Generations seen so far (every commit in the namespace, watched or not).
    pub fn generations(&self) -> u64 {
        self.state.lock().map_or(0, |s| s.generations)
    }

    /// Completes when a transaction changed a watched table, events were lost, or the child
    /// stopped (at once when that happened since the last call).
    pub async fn changed(&self) {
        self.notify.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `nft monitor` printed (nft 1.0.6) while iptables-nft, iptables-nft-restore and
    /// nft changed a namespace's rules.
    const CAPTURE: &str = "add table ip nat
create chain ip nat KUBE-SVC-ABC
# new generation 2 by process 16949 (iptables-nft)
add rule ip nat KUBE-SVC-ABC meta l4proto tcp  meta random & 2147483647 < 1073741824 counter packets 0 bytes 0 dnat to 10.0.0.1:80
# new generation 3 by process 18131 (iptables-nft)
delete rule ip nat KUBE-SVC-ABC handle 2
add rule ip nat KUBE-SVC-ABC ip saddr 1.2.3.4 counter packets 0 bytes 0 meta mark set mark or 0x4000
# new generation 4 by process 18134 (iptables-nft-re)
add table inet firewalld
# new generation 5 by process 99 (firewalld)
add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 53 : goto service-X }
delete set ip kube-proxy m
# new generation 6 by process 4216 (nft)
";

    #[test]
    fn lines_name_the_family_table_and_object() {
        assert_eq!(
            parse_line("delete rule ip nat KUBE-SVC-ABC handle 2"),
            Line::Change(Change {
                verb: "delete".into(),
                kind: "rule".into(),
                family: "ip".into(),
                table: "nat".into(),
                object: Some("KUBE-SVC-ABC".into()),
            })
        );
        assert_eq!(
            parse_line("# new generation 4 by process 18134 (iptables-nft-re)"),
            Line::Generation {
                id: 4,
                process: "iptables-nft-re".into()
            }
        );
        assert_eq!(
            parse_line("# ERROR: We lost some netlink events!"),
            Line::Lost
        );
        match parse_line("add table ip6 kube-proxy") {
            Line::Change(c) => {
                assert_eq!((c.place(), c.watched()), ("ip6 kube-proxy".into(), true))
            }
            other => panic!("{other:?}"),
        }
        match parse_line("add element ip kube-proxy service-ips { 1.2.3.4 : goto x }") {
            Line::Change(c) => assert_eq!(c.place(), "ip kube-proxy service-ips"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            parse_line("# Warning: table ip nat is managed by iptables-nft"),
            Line::Other
        );
        assert_eq!(parse_line("\tmeta l4proto tcp"), Line::Other);
    }

    #[test]
    fn commits_of_watched_tables_wake_the_reader_and_others_do_not() {
        let mut s = State::default();
        let wakes: Vec<bool> = CAPTURE.lines().map(|l| s.line(parse_line(l))).collect();
        // Generation lines are 3, 5, 8, 10, 13 (1-based): all but firewalld's commit wake.
        let woke: Vec<usize> = wakes
            .iter()
            .enumerate()
            .filter(|(_, w)| **w)
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(woke, [3, 5, 8, 13]);
        assert_eq!(s.changes, 7);
        assert_eq!(
            s.places.iter().cloned().collect::<Vec<_>>(),
            [
                "ip kube-proxy m",
                "ip kube-proxy service-ips",
                "ip nat",
                "ip nat KUBE-SVC-ABC"
            ]
        );
        assert_eq!(s.lost, None);
    }

    #[test]
    fn a_gap_in_the_generations_is_lost_events() {
        let mut s = State::default();
        assert!(!s.line(parse_line("# new generation 7 by process 1 (nft)")));
        // Only another table changed in between, but the lines of generation 8 are missing.
        assert!(s.line(parse_line("# new generation 9 by process 1 (nft)")));
        assert!(s.changed);
        assert!(
            s.lost.as_deref().is_some_and(|l| l.contains("7 to 9")),
            "{:?}",
            s.lost
        );
    }
}
