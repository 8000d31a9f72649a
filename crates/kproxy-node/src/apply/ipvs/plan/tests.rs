//! Plan tests: edits carry every attribute, ownership, order, draining, convergence and rollback.

use super::*;
use crate::apply::ipvs::state::{FwdMethod, Ipvs0, RsAttrs, VsAttrs};
use kproxy_parsers::ipvsadm::Protocol;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn vs(sched: &str, persistent: Option<u32>, flags: &[&str], rs: &[(&str, u16, i32)]) -> VsState {
    VsState {
        attrs: VsAttrs {
            scheduler: sched.into(),
            persistent,
            netmask: None,
            flags: flags.iter().map(|f| f.to_string()).collect(),
            ops: false,
            pe: None,
        },
        real_servers: rs
            .iter()
            .map(|(a, p, w)| {
                (
                    (ip(a), *p),
                    RsState {
                        attrs: RsAttrs {
                            forward: FwdMethod::Masq,
                            weight: *w,
                            upper_threshold: 0,
                            lower_threshold: 0,
                        },
                        connections: Some(0),
                    },
                )
            })
            .collect(),
    }
}

fn key(a: &str, port: u16) -> VsKey {
    (Protocol::Tcp, ip(a), port)
}

fn set(ty: &str, members: &[&str]) -> SetState {
    SetState {
        set_type: ty.into(),
        options: "family inet hashsize 1024 maxelem 65536".into(),
        members: members
            .iter()
            .map(|m| (m.to_string(), m.to_string()))
            .collect(),
    }
}

fn state(vss: Vec<(VsKey, VsState)>, sets: Vec<(&str, SetState)>, addrs: &[&str]) -> IpvsState {
    IpvsState {
        virtual_servers: vss.into_iter().collect(),
        sets: Some(sets.into_iter().map(|(n, s)| (n.to_string(), s)).collect()),
        kube_ipvs0: Ipvs0::Present(addrs.iter().map(|a| ip(a)).collect()),
    }
}

fn ownership(current: &IpvsState) -> Ownership {
    let mut service_addrs: BTreeSet<IpAddr> = [ip("10.96.0.1"), ip("10.96.0.10")].into();
    if let Ipvs0::Present(a) = &current.kube_ipvs0 {
        service_addrs.extend(a.iter().copied());
    }
    Ownership {
        family: IpFamily::V4,
        exclude_cidrs: vec![Cidr::parse_sloppy("192.0.2.0/24").expect("cidr")],
        service_addrs,
        node_addrs: [ip("172.18.0.3")].into(),
    }
}

fn no_iptables() -> Plan {
    Plan {
        tables: Vec::new(),
        full: false,
        left_alone: Vec::new(),
    }
}

fn run_plan(desired: &IpvsState, current: &IpvsState) -> IpvsPlan {
    plan(desired, current, &ownership(current), no_iptables())
}

/// Applies a plan's typed changes to a state, as the kernel would.
fn simulate(s: &IpvsState, p: &IpvsPlan) -> IpvsState {
    let mut s = s.clone();
    let sets = s.sets.get_or_insert_with(BTreeMap::new);
    for c in p.sets.iter().chain(&p.destroy_sets) {
        if let SetChange::Add { set, .. } = c {
            assert!(sets.contains_key(set), "add to a missing set {set}");
        }
        crate::apply::ipvs::rollback::apply_set_change(sets, c);
    }
    for c in &p.ipvs {
        let v = &mut s.virtual_servers;
        match c {
            IpvsChange::AddVs { vs, attrs } => {
                assert!(!v.contains_key(vs), "-A of an existing service");
                v.insert(
                    *vs,
                    VsState {
                        attrs: attrs.clone(),
                        real_servers: BTreeMap::new(),
                    },
                );
            }
            IpvsChange::EditVs { vs, to, .. } => {
                v.get_mut(vs).expect("-E of a missing service").attrs = to.clone();
            }
            IpvsChange::DeleteVs { vs } => {
                v.remove(vs).expect("-D of a missing service");
            }
            IpvsChange::AddRs { vs, rs, attrs } => {
                let r = &mut v.get_mut(vs).expect("-a to a missing service").real_servers;
                assert!(!r.contains_key(rs), "-a of an existing destination");
                r.insert(
                    *rs,
                    RsState {
                        attrs: *attrs,
                        connections: Some(0),
                    },
                );
            }
            IpvsChange::EditRs { vs, rs, to, .. } => {
                v.get_mut(vs)
                    .and_then(|x| x.real_servers.get_mut(rs))
                    .expect("-e of a missing destination")
                    .attrs = *to;
            }
            IpvsChange::DeleteRs { vs, rs } => {
                v.get_mut(vs)
                    .and_then(|x| x.real_servers.remove(rs))
                    .expect("-d of a missing destination");
            }
        }
    }
    if let Ipvs0::Present(a) = &mut s.kube_ipvs0 {
        for c in p.ipvs0_add.iter().chain(&p.ipvs0_del) {
            match c {
                Ipvs0Change::AddAddr(x) => {
                    a.insert(*x);
                }
                Ipvs0Change::DelAddr(x) => {
                    a.remove(x);
                }
                _ => {}
            }
        }
    }
    s
}

#[test]
fn edits_carry_every_attribute() {
    let desired = state(
        vec![(
            key("10.96.0.1", 443),
            VsState {
                attrs: VsAttrs {
                    scheduler: "mh".into(),
                    persistent: Some(10800),
                    netmask: Some("255.255.255.0".into()),
                    flags: vec!["mh-port".into()],
                    ops: false,
                    pe: None,
                },
                real_servers: [(
                    (ip("10.244.1.5"), 6443),
                    RsState {
                        attrs: RsAttrs {
                            forward: FwdMethod::Masq,
                            weight: 1,
                            upper_threshold: 100,
                            lower_threshold: 10,
                        },
                        connections: None,
                    },
                )]
                .into(),
            },
        )],
        vec![],
        &["10.96.0.1"],
    );
    let mut current = desired.clone();
    let v = current
        .virtual_servers
        .get_mut(&key("10.96.0.1", 443))
        .expect("vs");
    v.attrs.scheduler = "rr".into();
    if let Some(r) = v.real_servers.get_mut(&(ip("10.244.1.5"), 6443)) {
        r.attrs.weight = 3;
    }
    let p = run_plan(&desired, &current);
    let argv: Vec<String> = p.ipvs.iter().map(|c| c.argv().join(" ")).collect();
    assert_eq!(
        argv,
        [
            "-E -t 10.96.0.1:443 -s mh -p 10800 -M 255.255.255.0 -b mh-port",
            "-e -t 10.96.0.1:443 -r 10.244.1.5:6443 -m -w 1 -x 100 -y 10",
        ]
    );
    // Dropping persistence is an edit without -p (which -E then resets).
    let mut plain = desired.clone();
    if let Some(v) = plain.virtual_servers.get_mut(&key("10.96.0.1", 443)) {
        v.attrs.persistent = None;
        v.attrs.netmask = None;
    }
    let p = run_plan(&plain, &desired);
    assert_eq!(
        p.ipvs[0].argv().join(" "),
        "-E -t 10.96.0.1:443 -s mh -b mh-port"
    );
    assert!(
        p.ipvs
            .iter()
            .all(|c| !c.argv().iter().any(|a| a == "-C" || a == "-R"))
    );
}

#[test]
fn only_kube_proxy_virtual_servers_are_deleted() {
    let desired = state(
        vec![(
            key("10.96.0.1", 443),
            vs("rr", None, &[], &[("10.244.1.5", 6443, 1)]),
        )],
        vec![],
        &["10.96.0.1"],
    );
    let mut current = desired.clone();
    let extra = [
        (key("10.96.77.7", 80), "stale service address on kube-ipvs0"),
        (key("172.18.0.3", 31000), "stale NodePort"),
        (key("192.0.2.10", 80), "excluded"),
        (key("203.0.113.7", 8443), "foreign"),
        (
            key("172.18.0.3", 22),
            "node address outside the NodePort range",
        ),
        ((Protocol::Tcp, ip("fd00::1"), 80), "other family"),
    ];
    for (k, _) in &extra {
        current
            .virtual_servers
            .insert(*k, vs("wrr", None, &[], &[("10.1.1.1", 80, 3)]));
    }
    current.kube_ipvs0 = Ipvs0::Present([ip("10.96.0.1"), ip("10.96.77.7")].into());
    let p = run_plan(&desired, &current);
    let deleted: Vec<VsKey> = p
        .ipvs
        .iter()
        .filter_map(|c| match c {
            IpvsChange::DeleteVs { vs } => Some(*vs),
            _ => None,
        })
        .collect();
    assert_eq!(deleted, [key("10.96.77.7", 80), key("172.18.0.3", 31000)]);
    assert!(p.ipvs.iter().all(|c| deleted.contains(c.vs())), "{p:#?}");
    assert_eq!(p.kept.len(), 3, "{:?}", p.kept);
    assert!(
        p.kept
            .iter()
            .any(|k| k.contains("192.0.2.10:80") && k.contains("excludeCIDRs"))
    );
    assert!(
        p.kept
            .iter()
            .any(|k| k.contains("203.0.113.7:8443") && k.contains("foreign"))
    );
    assert!(!p.kept.iter().any(|k| k.contains("fd00::1")));
    assert_eq!(p.ipvs0_del, [Ipvs0Change::DelAddr(ip("10.96.77.7"))]);
}

#[test]
fn order_sets_before_rules_servers_before_deletes() {
    let desired = state(
        vec![
            (
                key("10.96.0.1", 443),
                vs("rr", None, &[], &[("10.244.1.5", 6443, 1)]),
            ),
            (
                key("10.96.0.10", 53),
                vs(
                    "rr",
                    None,
                    &[],
                    &[("10.244.0.3", 53, 1), ("10.244.0.4", 53, 1)],
                ),
            ),
        ],
        vec![
            (
                "KUBE-CLUSTER-IP",
                set("hash:ip,port", &["10.96.0.1,tcp:443", "10.96.0.10,tcp:53"]),
            ),
            (
                "KUBE-IPVS-IPS",
                set("hash:ip", &["10.96.0.1", "10.96.0.10"]),
            ),
        ],
        &["10.96.0.1", "10.96.0.10"],
    );
    let current = state(
        vec![
            (
                key("10.96.0.1", 443),
                vs("rr", None, &[], &[("10.244.9.9", 6443, 1)]),
            ),
            (key("10.96.0.2", 80), vs("rr", None, &[], &[])),
        ],
        vec![
            (
                "KUBE-CLUSTER-IP",
                set("hash:ip,port", &["10.96.0.2,tcp:80"]),
            ),
            ("KUBE-OLD-SET", set("hash:ip", &[])),
            ("KUBE-OLD-USED", set("hash:ip", &[])),
            ("cali40all-hosts", set("hash:ip", &[])),
            ("KUBE-6-CLUSTER-IP", set("hash:ip,port", &[])),
        ],
        &["10.96.0.1", "10.96.0.2"],
    );
    let p = run_plan(&desired, &current);
    let lines: Vec<String> = p.sets.iter().map(SetChange::line).collect();
    assert_eq!(
        lines,
        [
            "add KUBE-CLUSTER-IP 10.96.0.1,tcp:443",
            "add KUBE-CLUSTER-IP 10.96.0.10,tcp:53",
            "del KUBE-CLUSTER-IP 10.96.0.2,tcp:80",
            "create KUBE-IPVS-IPS hash:ip family inet hashsize 1024 maxelem 65536",
            "add KUBE-IPVS-IPS 10.96.0.1",
            "add KUBE-IPVS-IPS 10.96.0.10",
        ]
    );
    // Sets the node has beyond kube-proxy's are never destroyed, `KUBE-` prefix or not.
    assert_eq!(p.destroy_input(), "");
    let argv: Vec<String> = p.ipvs.iter().map(|c| c.argv().join(" ")).collect();
    assert_eq!(
        argv,
        [
            "-a -t 10.96.0.1:443 -r 10.244.1.5:6443 -m -w 1",
            "-d -t 10.96.0.1:443 -r 10.244.9.9:6443",
            "-A -t 10.96.0.10:53 -s rr",
            "-a -t 10.96.0.10:53 -r 10.244.0.3:53 -m -w 1",
            "-a -t 10.96.0.10:53 -r 10.244.0.4:53 -m -w 1",
            "-D -t 10.96.0.2:80",
        ]
    );
    assert_eq!(p.ipvs0_add, [Ipvs0Change::AddAddr(ip("10.96.0.10"))]);
    assert_eq!(p.ipvs0_del, [Ipvs0Change::DelAddr(ip("10.96.0.2"))]);
}

#[test]
fn draining_real_servers_are_left_to_kube_proxy() {
    let desired = state(
        vec![(key("10.96.0.1", 443), vs("rr", None, &[], &[]))],
        vec![],
        &["10.96.0.1"],
    );
    let mut current = state(
        vec![(
            key("10.96.0.1", 443),
            vs(
                "rr",
                None,
                &[],
                &[("10.244.1.5", 6443, 0), ("10.244.1.6", 6443, 0)],
            ),
        )],
        vec![],
        &["10.96.0.1"],
    );
    if let Some(r) = current
        .virtual_servers
        .get_mut(&key("10.96.0.1", 443))
        .and_then(|v| v.real_servers.get_mut(&(ip("10.244.1.5"), 6443)))
    {
        r.connections = Some(4);
    }
    let p = run_plan(&desired, &current);
    assert_eq!(
        p.ipvs,
        [IpvsChange::DeleteRs {
            vs: key("10.96.0.1", 443),
            rs: (ip("10.244.1.6"), 6443)
        }]
    );
    assert!(p.kept[0].contains("draining 4"), "{:?}", p.kept);
}

/// What kube-proxy wants and a drifted node: a virtual server edited and with an extra real
/// server, one missing, a stale one, a foreign one; a set with a stale member and a stale set;
/// kube-ipvs0 with a stale address and one missing.
fn drifted() -> (IpvsState, IpvsState) {
    let desired = state(
        vec![
            (
                key("10.96.0.1", 443),
                vs("rr", Some(10800), &[], &[("10.244.1.5", 6443, 1)]),
            ),
            (
                key("10.96.0.10", 53),
                vs("rr", None, &[], &[("10.244.0.3", 53, 1)]),
            ),
        ],
        vec![(
            "KUBE-CLUSTER-IP",
            set("hash:ip,port", &["10.96.0.1,tcp:443"]),
        )],
        &["10.96.0.1", "10.96.0.10"],
    );
    let current = state(
        vec![
            (
                key("10.96.0.1", 443),
                vs(
                    "wrr",
                    None,
                    &["sh-port"],
                    &[("10.244.1.5", 6443, 5), ("10.244.1.7", 6443, 1)],
                ),
            ),
            (
                key("10.96.0.99", 80),
                vs("rr", None, &[], &[("10.244.2.2", 80, 1)]),
            ),
            (
                key("203.0.113.7", 8443),
                vs("wrr", None, &[], &[("10.0.0.1", 8443, 3)]),
            ),
        ],
        vec![
            (
                "KUBE-CLUSTER-IP",
                set("hash:ip,port", &["10.96.0.99,tcp:80"]),
            ),
            ("KUBE-STALE", set("hash:ip", &["1.2.3.4"])),
        ],
        &["10.96.0.1", "10.96.0.99"],
    );
    (desired, current)
}

#[test]
fn apply_converges_and_rollback_restores() {
    let (desired, current) = drifted();
    let forward = run_plan(&desired, &current);
    assert!(!forward.is_empty());
    let after = simulate(&current, &forward);
    let again = run_plan(&desired, &after);
    assert!(again.is_empty(), "{again:#?}");
    assert_eq!(
        after.virtual_servers.get(&key("203.0.113.7", 8443)),
        current.virtual_servers.get(&key("203.0.113.7", 8443)),
        "the foreign virtual server is untouched"
    );
    let back = rollback_plan(&current, &after, &forward, IpFamily::V4);
    let restored = simulate(&after, &back);
    assert_eq!(restored, current);
}

#[test]
fn rollback_leaves_what_another_writer_changed_after_the_repair() {
    let (desired, current) = drifted();
    let forward = run_plan(&desired, &current);
    let after = simulate(&current, &forward);
    // Another writer since: a real server added to the edited virtual server, the deleted one
    // created again, a member added to the set, an address added to kube-ipvs0.
    let mut later = after.clone();
    later
        .virtual_servers
        .get_mut(&key("10.96.0.1", 443))
        .expect("edited")
        .real_servers
        .extend(vs("rr", None, &[], &[("10.244.1.9", 6443, 1)]).real_servers);
    later.virtual_servers.insert(
        key("10.96.0.99", 80),
        vs("rr", None, &[], &[("10.244.2.3", 80, 1)]),
    );
    later
        .sets
        .as_mut()
        .and_then(|s| s.get_mut("KUBE-CLUSTER-IP"))
        .expect("set")
        .members
        .insert("10.96.0.50,tcp:80".into(), "10.96.0.50,tcp:80".into());
    if let Ipvs0::Present(a) = &mut later.kube_ipvs0 {
        a.insert(ip("10.96.0.50"));
    }
    let back = rollback_plan(&current, &later, &forward, IpFamily::V4);
    let restored = simulate(&later, &back);
    for k in [key("10.96.0.1", 443), key("10.96.0.99", 80)] {
        assert_eq!(
            restored.virtual_servers.get(&k),
            later.virtual_servers.get(&k),
            "{k:?} as the other writer left it"
        );
    }
    assert_eq!(
        restored
            .sets
            .as_ref()
            .and_then(|s| s.get("KUBE-CLUSTER-IP")),
        later.sets.as_ref().and_then(|s| s.get("KUBE-CLUSTER-IP"))
    );
    // What is still the repair's goes back: the created virtual server, kube-ipvs0's addresses
    // it added and deleted; the other writer's address stays.
    assert_eq!(restored.virtual_servers.get(&key("10.96.0.10", 53)), None);
    assert_eq!(
        restored.kube_ipvs0,
        Ipvs0::Present(["10.96.0.1", "10.96.0.99", "10.96.0.50"].map(ip).into())
    );
    for want in [
        "virtual server TCP 10.96.0.1:443: changed after the repair wrote it",
        "virtual server TCP 10.96.0.99:80: changed after the repair wrote it",
        "ipset KUBE-CLUSTER-IP: changed after the repair wrote it",
    ] {
        assert!(
            back.kept.iter().any(|k| k.starts_with(want)),
            "no {want:?} in {:?}",
            back.kept
        );
    }
    assert_eq!(back.kept.len(), 3, "{:?}", back.kept);
}
