//! Change events of the node's nf_tables rules, so that a reader knows *that* and *where* the
//! rules changed without reading them: a netlink socket subscribed to the kernel's nf_tables
//! notifications (`NFNLGRP_NFTABLES`, what `nft monitor` listens to), opened in the network
//! namespace of the [`HostRunner`] and read on a thread of its own.
//!
//! Each notification names its object — the family and table, and the chain, set or map —
//! and each committed transaction ends with `NFT_MSG_NEWGEN` and the ruleset's new generation
//! number, one more than the last: a gap means notifications were lost, and so does the
//! socket's `ENOBUFS` (its buffer overflowed during a large sync). Either way the reader cannot
//! know what changed and must read everything again. Only the names are read from each
//! message: no rule is decoded, nothing of the ruleset is cached (`nft monitor` loads the whole
//! ruleset before it listens: on a node of 10,000 services 20 s of CPU and 0.9 GB, and changes
//! made meanwhile are never printed). The rules in nf_tables are iptables-nft's tables (`ip
//! nat`, `ip filter`, …) and kube-proxy's nftables tables (`ip kube-proxy`, `ip6 kube-proxy`);
//! iptables-legacy, ipsets and IPVS have no such events and are read every time.

use super::netns::HostRunner;
use std::collections::BTreeSet;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// The tables whose changes count: those `iptables-save` lists (of the nf_tables backend) and
/// kube-proxy's own in nftables mode. Changes of other families (`inet`, `bridge`, …) or
/// tables (another agent's `ip firewalld`) change nothing the collector reads.
pub const WATCHED_TABLES: [&str; 6] = ["nat", "filter", "mangle", "raw", "security", "kube-proxy"];

/// At most this many changed objects are named; more are counted only (a full sync of a large
/// node rewrites tens of thousands of rules).
const MAX_NAMED: usize = 64;

/// One notification of nf_tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An object added, changed or deleted.
    Change(Change),
    /// A transaction committed: the ruleset's generation after it, and who made it.
    Generation {
        /// The generation number.
        id: u32,
        /// The process that made it (`iptables-nft-re`, `nft`, `kube-proxy`).
        process: String,
    },
    /// Notifications were lost (the socket's buffer overflowed, or one did not fit the read).
    Lost,
}

/// An object a notification names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    /// `new`, `delete`.
    pub verb: &'static str,
    /// `table`, `chain`, `rule`, `set`, `element`, `object`, `flowtable`.
    pub kind: &'static str,
    /// `ip`, `ip6`, `inet`, …
    pub family: &'static str,
    /// The table.
    pub table: String,
    /// The chain, set or object, when the notification is about one (a table's has none).
    pub object: Option<String>,
}

impl Change {
    /// Whether it changes what the collector reads ([`WATCHED_TABLES`] of `ip` and `ip6`).
    pub fn watched(&self) -> bool {
        matches!(self.family, "ip" | "ip6") && WATCHED_TABLES.contains(&self.table.as_str())
    }

    /// `ip nat KUBE-SVC-ABC`, `ip kube-proxy` (the table itself).
    pub fn place(&self) -> String {
        match &self.object {
            Some(o) => format!("{} {} {o}", self.family, self.table),
            None => format!("{} {}", self.family, self.table),
        }
    }
}

/// `NFNL_SUBSYS_NFTABLES`: the high byte of an nf_tables message's type.
const SUBSYS_NFTABLES: u16 = 10;
/// `NFNLGRP_NFTABLES`: the multicast group of nf_tables' notifications.
const GROUP_NFTABLES: u32 = 7;

/// The families of `nfgenmsg.nfgen_family` (`NFPROTO_*`).
fn family_name(code: u8) -> &'static str {
    match code {
        1 => "inet",
        2 => "ip",
        3 => "arp",
        5 => "netdev",
        7 => "bridge",
        10 => "ip6",
        _ => "other",
    }
}

/// What an nf_tables message type (`enum nf_tables_msg_types`, `linux/netfilter/nf_tables.h`)
/// says: the verb and kind of a notification, with the attribute numbers of its table and
/// object names; `None` for requests and for what no reader needs (traces).
fn message_kind(msg: u16) -> Option<(&'static str, &'static str, u16, Option<u16>)> {
    Some(match msg {
        0 => ("new", "table", 1, None),
        2 | 26 => ("delete", "table", 1, None),
        3 => ("new", "chain", 1, Some(3)),
        5 | 27 => ("delete", "chain", 1, Some(3)),
        6 => ("new", "rule", 1, Some(2)),
        8 | 28 => ("delete", "rule", 1, Some(2)),
        9 => ("new", "set", 1, Some(2)),
        11 | 29 => ("delete", "set", 1, Some(2)),
        12 => ("new", "element", 1, Some(2)),
        14 | 30 => ("delete", "element", 1, Some(2)),
        18 => ("new", "object", 1, Some(2)),
        20 | 31 => ("delete", "object", 1, Some(2)),
        22 => ("new", "flowtable", 1, Some(2)),
        24 | 32 => ("delete", "flowtable", 1, Some(2)),
        _ => return None,
    })
}

/// `NFT_MSG_NEWGEN`.
const MSG_NEWGEN: u16 = 15;

/// The attributes of a message body: `(type, value)`, the type without its flag bits.
fn attributes(mut body: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while body.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([body[0], body[1]]));
        let kind = u16::from_ne_bytes([body[2], body[3]]) & 0x3fff;
        if len < 4 || len > body.len() {
            break;
        }
        out.push((kind, &body[4..len]));
        let next = (len + 3) & !3;
        body = body.get(next..).unwrap_or_default();
    }
    out
}

/// A string attribute's text (without its NUL).
fn text(value: &[u8]) -> String {
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    String::from_utf8_lossy(&value[..end]).into_owned()
}

/// Reads the netlink messages of one datagram into events; messages of other kinds are
/// skipped, and a message cut short ends the datagram.
pub fn parse_messages(mut data: &[u8]) -> Vec<Event> {
    let mut events = Vec::new();
    // nlmsghdr (16 bytes), then nfgenmsg (4 bytes), then attributes.
    while data.len() >= 16 {
        let len = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let kind = u16::from_ne_bytes([data[4], data[5]]);
        if len < 16 || len > data.len() {
            break;
        }
        let message = &data[16..len];
        data = data.get((len + 3) & !3..).unwrap_or_default();
        if kind == 4 {
            // NLMSG_OVERRUN
            events.push(Event::Lost);
            continue;
        }
        if kind >> 8 != SUBSYS_NFTABLES || message.len() < 4 {
            continue;
        }
        let family = family_name(message[0]);
        let attrs = attributes(&message[4..]);
        let attr = |n: u16| attrs.iter().find(|(k, _)| *k == n).map(|(_, v)| *v);
        let msg = kind & 0xff;
        if msg == MSG_NEWGEN {
            if let Some(id) = attr(1).and_then(|v| v.get(..4)) {
                events.push(Event::Generation {
                    id: u32::from_be_bytes([id[0], id[1], id[2], id[3]]),
                    process: attr(3).map(text).unwrap_or_default(),
                });
            }
            continue;
        }
        let Some((verb, what, table, object)) = message_kind(msg) else {
            continue;
        };
        events.push(Event::Change(Change {
            verb,
            kind: what,
            family,
            table: attr(table).map(text).unwrap_or_default(),
            object: object.and_then(attr).map(text),
        }));
    }
    events
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
    /// Why the events cannot say that nothing changed (`None`: they can): the socket failed,
    /// or notifications were lost.
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
    generation: Option<u32>,
    /// Why events were lost since the last take.
    lost: Option<String>,
    /// Why the socket stopped.
    stopped: Option<String>,
    /// Generations seen (all, watched or not).
    generations: u64,
}

impl State {
    /// Takes one event in; true when the reader should look (a transaction changed a watched
    /// table, or events were lost).
    fn event(&mut self, event: Event) -> bool {
        match event {
            Event::Change(c) if c.watched() => {
                self.changed = true;
                self.changes += 1;
                self.open += 1;
                if self.places.len() < MAX_NAMED {
                    self.places.insert(c.place());
                }
                false
            }
            Event::Change(_) => false,
            Event::Lost => {
                self.changed = true;
                self.lost =
                    Some("nf_tables notifications were lost (the socket overflowed)".into());
                true
            }
            Event::Generation { id, .. } => {
                self.generations += 1;
                if let Some(last) = self.generation
                    && id != last.wrapping_add(1)
                {
                    self.changed = true;
                    self.lost = Some(format!(
                        "the ruleset went from generation {last} to {id}: notifications were lost"
                    ));
                }
                self.generation = Some(id);
                let committed = std::mem::take(&mut self.open) > 0;
                committed || self.lost.is_some()
            }
        }
    }
}

/// The nf_tables notifications of a network namespace, read on a thread of their own; dropped,
/// the thread stops (within a second).
pub struct RuleEvents {
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
    stop: Arc<AtomicBool>,
}

impl Drop for RuleEvents {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// How long a read of the socket waits before the thread looks whether it should stop.
const POLL: Duration = Duration::from_secs(1);

/// The socket's receive buffer: a full sync of a large node sends tens of thousands of
/// notifications at once (nft asks for the same).
const RECEIVE_BUFFER: usize = 16 << 20;

/// A netlink socket subscribed to nf_tables' notifications, in the current thread's network
/// namespace.
fn subscribe() -> std::io::Result<OwnedFd> {
    use rustix::net::netlink::{self, SocketAddrNetlink};
    use rustix::net::{AddressFamily, SocketType, bind, socket, sockopt};
    let fd = socket(
        AddressFamily::NETLINK,
        SocketType::RAW,
        Some(netlink::NETFILTER),
    )?;
    // Forcing the size needs CAP_NET_ADMIN, which reading the rules needs anyway.
    if sockopt::set_socket_recv_buffer_size_force(&fd, RECEIVE_BUFFER).is_err() {
        sockopt::set_socket_recv_buffer_size(&fd, RECEIVE_BUFFER)?;
    }
    sockopt::set_socket_timeout(&fd, sockopt::Timeout::Recv, Some(POLL))?;
    bind(&fd, &SocketAddrNetlink::new(0, 1 << (GROUP_NFTABLES - 1)))?;
    Ok(fd)
}

/// Moves the current thread into the network namespace `ip netns` calls `name`.
fn enter_netns(name: &str) -> std::io::Result<()> {
    let file = std::fs::File::open(std::path::Path::new("/run/netns").join(name))?;
    rustix::thread::move_into_link_name_space(
        file.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )?;
    Ok(())
}

impl RuleEvents {
    /// Subscribes to the notifications of the namespace `runner` runs commands in; once this
    /// returns, every later change is seen (or said lost). An error when the subscription
    /// fails (no such namespace, no CAP_NET_ADMIN).
    pub fn start(runner: &HostRunner) -> Result<RuleEvents, String> {
        let state = Arc::new(Mutex::new(State::default()));
        let notify = Arc::new(Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, nt, halt) = (Arc::clone(&state), Arc::clone(&notify), Arc::clone(&stop));
        let netns = runner.netns.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let spawned = std::thread::Builder::new()
            .name("nf_tables events".into())
            .spawn(move || {
                let opened = match &netns {
                    Some(ns) => {
                        enter_netns(ns).map_err(|e| format!("entering network namespace {ns}: {e}"))
                    }
                    None => Ok(()),
                }
                .and_then(|()| {
                    subscribe().map_err(|e| format!("subscribing to nf_tables' notifications: {e}"))
                });
                let fd = match opened {
                    Ok(fd) => {
                        let _ = ready_tx.send(Ok(()));
                        fd
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let why = listen(&fd, &st, &nt, &halt);
                if let Ok(mut s) = st.lock() {
                    s.changed = true;
                    s.stopped = Some(why);
                }
                nt.notify_one();
            });
        if let Err(e) = spawned {
            return Err(format!("starting the nf_tables events' thread: {e}"));
        }
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(RuleEvents {
                state,
                notify,
                stop,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err("the nf_tables events' thread ended at once".into()),
        }
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
        let untrusted = s.stopped.clone().or_else(|| s.lost.take());
        let taken = Taken {
            changed: s.changed || untrusted.is_some(),
            places: std::mem::take(&mut s.places).into_iter().collect(),
            changes: std::mem::take(&mut s.changes),
            untrusted,
        };
        s.changed = false;
        taken
    }

    /// Why the events are no longer coming (the socket failed), if so.
    pub fn stopped(&self) -> Option<String> {
        self.state.lock().ok().and_then(|s| s.stopped.clone())
    }

    /// Generations seen so far (every commit in the namespace, watched or not).
    pub fn generations(&self) -> u64 {
        self.state.lock().map_or(0, |s| s.generations)
    }

    /// Completes when a transaction changed a watched table, events were lost, or they
    /// stopped (at once when that happened since the last call).
    pub async fn changed(&self) {
        self.notify.notified().await;
    }
}

/// Reads the socket until `stop` is set or it fails: why it ended.
fn listen(fd: &OwnedFd, state: &Mutex<State>, notify: &Notify, stop: &AtomicBool) -> String {
    use rustix::io::Errno;
    use rustix::net::{RecvFlags, recv};
    let mut buf = vec![0u8; 1 << 18];
    while !stop.load(Ordering::Relaxed) {
        let events = match recv(fd, &mut buf[..], RecvFlags::empty()) {
            // A datagram larger than the buffer was cut: what it held is unknown.
            Ok((got, len)) if len > got => vec![Event::Lost],
            Ok((got, _)) => parse_messages(&buf[..got]),
            Err(Errno::AGAIN | Errno::INTR) => continue,
            Err(Errno::NOBUFS) => vec![Event::Lost],
            Err(e) => return format!("reading nf_tables' notifications: {e}"),
        };
        let Ok(mut s) = state.lock() else {
            return "the events' state is unreadable".into();
        };
        let wake = events.into_iter().fold(false, |w, e| s.event(e) | w);
        drop(s);
        if wake {
            notify.notify_one();
        }
    }
    "stopped".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One nf_tables message as the kernel sends it: `nlmsghdr`, `nfgenmsg`, attributes.
    fn message(msg: u16, family: u8, attrs: &[(u16, &[u8])]) -> Vec<u8> {
        let mut body = vec![family, 0, 0, 0];
        for (kind, value) in attrs {
            let len = u16::try_from(4 + value.len()).unwrap_or(u16::MAX);
            body.extend(len.to_ne_bytes());
            body.extend(kind.to_ne_bytes());
            body.extend(*value);
            while body.len() % 4 != 0 {
                body.push(0);
            }
        }
        let mut out = Vec::new();
        out.extend(u32::try_from(16 + body.len()).unwrap_or(0).to_ne_bytes());
        out.extend(((SUBSYS_NFTABLES << 8) | msg).to_ne_bytes());
        out.extend(0u16.to_ne_bytes());
        out.extend([0u8; 8]);
        out.extend(body);
        out
    }

    fn rule(family: u8, table: &str, chain: &str, deleted: bool) -> Vec<u8> {
        let (t, c) = (format!("{table}\0"), format!("{chain}\0"));
        // NFTA_RULE_EXPRESSIONS (4), nested, as the kernel sends it: not read.
        let exprs: &[u8] = &[8, 0, 1, 0, 1, 2, 3, 4];
        message(
            if deleted { 8 } else { 6 },
            family,
            &[(1, t.as_bytes()), (2, c.as_bytes()), (0x8004, exprs)],
        )
    }

    fn generation(id: u32, process: &str) -> Vec<u8> {
        let p = format!("{process}\0");
        message(
            MSG_NEWGEN,
            0,
            &[
                (1, &id.to_be_bytes()),
                (2, &7u32.to_be_bytes()),
                (3, p.as_bytes()),
            ],
        )
    }

    #[test]
    fn messages_name_the_family_table_and_object() {
        let mut datagram = rule(2, "nat", "KUBE-SVC-ABC", true);
        datagram.extend(generation(5, "iptables-nft-re"));
        datagram.extend(message(0, 10, &[(1, b"kube-proxy\0")]));
        datagram.extend(message(
            12,
            2,
            &[(1, b"kube-proxy\0"), (2, b"service-ips\0")],
        ));
        datagram.extend(message(17, 2, &[])); // a trace: not a change
        let events = parse_messages(&datagram);
        assert_eq!(
            events[..2],
            [
                Event::Change(Change {
                    verb: "delete",
                    kind: "rule",
                    family: "ip",
                    table: "nat".into(),
                    object: Some("KUBE-SVC-ABC".into()),
                }),
                Event::Generation {
                    id: 5,
                    process: "iptables-nft-re".into()
                },
            ]
        );
        let places: Vec<(String, bool)> = events[2..]
            .iter()
            .map(|e| match e {
                Event::Change(c) => (c.place(), c.watched()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            places,
            [
                ("ip6 kube-proxy".to_string(), true),
                ("ip kube-proxy service-ips".to_string(), true)
            ]
        );
        // A message cut short ends the datagram; a netlink overrun is lost events.
        let whole = rule(2, "nat", "X", false);
        assert!(parse_messages(&whole[..whole.len() - 1]).is_empty());
        let mut overrun = vec![16, 0, 0, 0, 4, 0, 0, 0];
        overrun.extend([0u8; 8]);
        assert_eq!(parse_messages(&overrun), [Event::Lost]);
    }

    #[test]
    fn commits_of_watched_tables_wake_the_reader_and_others_do_not() {
        let mut s = State::default();
        let commits = [
            // iptables-nft adds a chain and a rule to ip nat.
            vec![
                rule(2, "nat", "KUBE-SVC-ABC", false),
                generation(2, "iptables-nft"),
            ],
            // another agent's inet table.
            vec![
                rule(1, "firewalld", "filter_IN", false),
                generation(3, "firewalld"),
            ],
            // kube-proxy's nftables table, a map element.
            vec![
                message(12, 2, &[(1, b"kube-proxy\0"), (2, b"service-ips\0")]),
                generation(4, "kube-proxy"),
            ],
        ];
        let wakes: Vec<bool> = commits
            .iter()
            .map(|c| {
                let events = parse_messages(&c.concat());
                events.into_iter().fold(false, |w, e| s.event(e) | w)
            })
            .collect();
        assert_eq!(wakes, [true, false, true]);
        assert_eq!(s.changes, 2);
        assert_eq!(
            s.places.iter().cloned().collect::<Vec<_>>(),
            ["ip kube-proxy service-ips", "ip nat KUBE-SVC-ABC"]
        );
        assert_eq!(s.lost, None);
    }

    #[test]
    fn a_gap_in_the_generations_is_lost_events() {
        let mut s = State::default();
        assert!(!s.event(Event::Generation {
            id: 7,
            process: "nft".into()
        }));
        // Only another table changed in between, but generation 8's notifications are missing.
        assert!(s.event(Event::Generation {
            id: 9,
            process: "nft".into()
        }));
        assert!(s.changed);
        assert!(
            s.lost.as_deref().is_some_and(|l| l.contains("7 to 9")),
            "{:?}",
            s.lost
        );
        let mut s = State::default();
        assert!(s.event(Event::Lost));
        assert!(s.changed);
    }
}
