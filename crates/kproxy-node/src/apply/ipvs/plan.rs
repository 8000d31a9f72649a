//! The IPVS repair plan: the `ipvsadm` commands (virtual and real servers to add, edit and
//! delete), the `ipset restore -exist` input (sets to create, members to add and delete), the
//! `kube-ipvs0` address changes, and the iptables chain plan of IPVS mode.
//!
//! Rules the plan keeps:
//! - `ipvsadm -E`/`-e` reset every attribute they are not given, so an edit always carries the
//!   complete attribute set (scheduler, persistence, netmask, flags, one-packet, persistence
//!   engine; forwarding method, weight, thresholds). `-C` and `-R` (which flush the whole table)
//!   are never used.
//! - Only what kube-proxy owns is touched ([`Ownership`]): virtual servers of its family on its
//!   service addresses (or node addresses in the NodePort range) outside `ipvs.excludeCIDRs`;
//!   ipsets by the names kube-proxy gives them ([`SetDef`](crate::proxier::ipvs::sets::SetDef)); `kube-ipvs0`. Everything else is
//!   listed as kept, with the reason.
//! - A repair never destroys an ipset: kube-proxy destroys its sets only on `--cleanup`, by
//!   name, and a `KUBE-` prefix proves nothing (kube-router's `KUBE-SRC-`/`KUBE-DST-` sets). Only
//!   a rollback destroys a set, one its own repair created.
//! - Order: sets are created and filled before the iptables rules that match them are written;
//!   weight-0 real servers still holding connections are left to kube-proxy's graceful
//!   termination.

pub use super::changes::{Ipvs0Change, IpvsChange, SetChange, vs_label};
use super::state::{Ipvs0, IpvsState, RsState, SetState, VsKey, VsState};
use crate::apply::iptables::plan::Plan;
use crate::state::ip::{Cidr, IpFamily};
use kproxy_parsers::ipvsadm::SocketText;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;

/// The NodePort range kube-apiserver allocates from by default (`--service-node-port-range`).
pub const NODE_PORT_RANGE: std::ops::RangeInclusive<u16> = 30000..=32767;

/// What to do with something the node has and the desired state lacks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposal {
    /// Not this repair's business (another family's proxier, another component): not mentioned.
    Ignore,
    /// kube-proxy's and stale: remove it.
    Remove,
    /// Left alone, for this reason (shown in the plan).
    Keep(String),
}

/// What belongs to kube-proxy's IPVS proxier of one family on this node.
#[derive(Debug, Clone)]
pub struct Ownership {
    /// The proxier's family.
    pub family: IpFamily,
    /// `ipvs.excludeCIDRs`: virtual servers inside are never touched.
    pub exclude_cidrs: Vec<Cidr>,
    /// Service addresses: those kube-proxy should bind to `kube-ipvs0` and those bound now.
    pub service_addrs: BTreeSet<IpAddr>,
    /// The node's own addresses (NodePort virtual servers live on them).
    pub node_addrs: BTreeSet<IpAddr>,
}

impl Ownership {
    /// What to do with a virtual server no service port implies.
    pub fn virtual_server(&self, key: &VsKey) -> Disposal {
        let (_, addr, port) = *key;
        if IpFamily::of(&addr) != self.family {
            return Disposal::Ignore;
        }
        if self.exclude_cidrs.iter().any(|c| c.contains(&addr)) {
            return Disposal::Keep("inside ipvs.excludeCIDRs".into());
        }
        if self.service_addrs.contains(&addr) {
            return Disposal::Remove;
        }
        if self.node_addrs.contains(&addr) && NODE_PORT_RANGE.contains(&port) {
            return Disposal::Remove;
        }
        // kube-proxy's scheduler probe (it creates and deletes it at start-up).
        if addr.to_string() == "198.51.100.0" && port == 20000 {
            return Disposal::Remove;
        }
        Disposal::Keep(
            "foreign: not on a kube-proxy service address (nor a node address in the NodePort range)"
                .into(),
        )
    }
}

/// The whole IPVS-mode repair plan, in apply order: `sets` (one `ipset restore -exist`),
/// `ipvs0_add`, `ipvs` (one `ipvsadm` call each), `iptables` (one `iptables-restore --noflush` per
/// table), `destroy_sets` (a rollback's only), `ipvs0_del`.
#[derive(Debug, Clone, Serialize)]
pub struct IpvsPlan {
    /// Sets to create, members to add and delete.
    pub sets: Vec<SetChange>,
    /// `kube-ipvs0` device and addresses to add.
    pub ipvs0_add: Vec<Ipvs0Change>,
    /// Virtual and real server changes.
    pub ipvs: Vec<IpvsChange>,
    /// IPVS-mode iptables chains.
    pub iptables: Plan,
    /// Sets to destroy: only in a rollback, the sets its repair created.
    pub destroy_sets: Vec<SetChange>,
    /// `kube-ipvs0` addresses (or the device) to delete.
    pub ipvs0_del: Vec<Ipvs0Change>,
    /// What is left alone, and why.
    pub kept: Vec<String>,
}

impl IpvsPlan {
    /// Whether applying changes nothing.
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
            && self.ipvs0_add.is_empty()
            && self.ipvs.is_empty()
            && self.iptables.is_empty()
            && self.destroy_sets.is_empty()
            && self.ipvs0_del.is_empty()
    }

    /// The `ipset restore -exist` input of the first step (empty when nothing to do).
    pub fn ipset_input(&self) -> String {
        lines(&self.sets)
    }

    /// The `ipset restore -exist` input that destroys the sets of `destroy_sets`.
    pub fn destroy_input(&self) -> String {
        lines(&self.destroy_sets)
    }

    /// Counts by kind, for the summary line.
    pub fn summary(&self) -> String {
        let count = |f: &dyn Fn(&IpvsChange) -> bool| self.ipvs.iter().filter(|c| f(c)).count();
        let vs_add = count(&|c| matches!(c, IpvsChange::AddVs { .. }));
        let vs_edit = count(&|c| matches!(c, IpvsChange::EditVs { .. }));
        let vs_del = count(&|c| matches!(c, IpvsChange::DeleteVs { .. }));
        let rs_add = count(&|c| matches!(c, IpvsChange::AddRs { .. }));
        let rs_edit = count(&|c| matches!(c, IpvsChange::EditRs { .. }));
        let rs_del = count(&|c| matches!(c, IpvsChange::DeleteRs { .. }));
        let chains: usize = self
            .iptables
            .tables
            .iter()
            .map(|t| {
                t.changes
                    .iter()
                    .filter(|c| {
                        c.action != crate::apply::iptables::plan::ChainAction::KeepReferenced
                    })
                    .count()
            })
            .sum();
        let mut s = String::new();
        let _ = write!(
            s,
            "virtual servers +{vs_add} ~{vs_edit} -{vs_del}; real servers +{rs_add} ~{rs_edit} -{rs_del}; \
             ipset lines {}, sets to destroy {}; kube-ipvs0 +{} -{}; iptables chains {chains}",
            self.sets.len(),
            self.destroy_sets.len(),
            self.ipvs0_add
                .iter()
                .filter(|c| matches!(c, Ipvs0Change::AddAddr(_)))
                .count(),
            self.ipvs0_del
                .iter()
                .filter(|c| matches!(c, Ipvs0Change::DelAddr(_)))
                .count(),
        );
        s
    }

    /// The virtual servers and sets this plan changes (what a rollback must restore).
    pub fn touched(&self) -> (BTreeSet<VsKey>, BTreeSet<String>) {
        let vss = self.ipvs.iter().map(|c| *c.vs()).collect();
        let sets = self
            .sets
            .iter()
            .chain(&self.destroy_sets)
            .map(|c| c.set().to_string())
            .collect();
        (vss, sets)
    }
}

fn lines(changes: &[SetChange]) -> String {
    changes.iter().map(|c| c.line() + "\n").collect()
}

/// How a diff treats what only the node has.
struct Scope<'a> {
    family: IpFamily,
    vs: &'a dyn Fn(&VsKey) -> Disposal,
    set: &'a dyn Fn(&str) -> Disposal,
    keep_draining: bool,
}

/// The plan from the node's `current` state to kube-proxy's `desired` one. Sets the node has
/// beyond the desired ones are left alone (see the module docs).
pub fn plan(
    desired: &IpvsState,
    current: &IpvsState,
    ownership: &Ownership,
    iptables: Plan,
) -> IpvsPlan {
    let scope = Scope {
        family: ownership.family,
        vs: &|k| ownership.virtual_server(k),
        set: &|_| Disposal::Ignore,
        keep_draining: true,
    };
    diff(desired, current, &scope, iptables)
}

/// The plan that puts back what `forward` changed: from the node's state `now` to the `saved`
/// one, restricted to the virtual servers and sets `forward` touched and to the `kube-ipvs0`
/// addresses of `family` it added or deleted — and of those, to what still holds what
/// `forward` wrote (the rest is another writer's now: left, each with a note in `kept`). The
/// iptables part is not included (rollback restores the saved iptables text exactly).
pub fn rollback_plan(
    saved: &IpvsState,
    now: &IpvsState,
    forward: &IpvsPlan,
    family: IpFamily,
) -> IpvsPlan {
    let wrote = super::rollback::applied(saved, forward);
    let mut notes = Vec::new();
    let (vss, sets) = super::rollback::still_written(&wrote, now, forward, &mut notes);
    let kube_ipvs0 = super::rollback::ipvs0_back(
        &saved.kube_ipvs0,
        &now.kube_ipvs0,
        forward,
        family,
        &mut notes,
    );
    let desired = IpvsState {
        virtual_servers: saved
            .virtual_servers
            .iter()
            .filter(|(k, _)| vss.contains(k))
            .map(|(k, v)| (*k, v.clone()))
            .collect(),
        sets: saved.sets.as_ref().map(|s| {
            s.iter()
                .filter(|(n, _)| sets.contains(*n))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect()
        }),
        kube_ipvs0,
    };
    let scope = Scope {
        family,
        vs: &|k| {
            if vss.contains(k) {
                Disposal::Remove
            } else {
                Disposal::Ignore
            }
        },
        set: &|n| {
            if sets.contains(n) {
                Disposal::Remove
            } else {
                Disposal::Ignore
            }
        },
        keep_draining: false,
    };
    let mut back = diff(
        &desired,
        now,
        &scope,
        Plan {
            tables: Vec::new(),
            full: false,
            left_alone: Vec::new(),
        },
    );
    back.kept.extend(notes);
    back
}

fn diff(desired: &IpvsState, current: &IpvsState, scope: &Scope<'_>, iptables: Plan) -> IpvsPlan {
    let mut p = IpvsPlan {
        sets: Vec::new(),
        ipvs0_add: Vec::new(),
        ipvs: Vec::new(),
        iptables,
        destroy_sets: Vec::new(),
        ipvs0_del: Vec::new(),
        kept: Vec::new(),
    };
    diff_ipvs(desired, current, scope, &mut p);
    if let (Some(want), Some(have)) = (&desired.sets, &current.sets) {
        diff_sets(want, have, scope, &mut p);
    }
    diff_ipvs0(
        &desired.kube_ipvs0,
        &current.kube_ipvs0,
        scope.family,
        &mut p,
    );
    p
}

fn diff_ipvs(desired: &IpvsState, current: &IpvsState, scope: &Scope<'_>, p: &mut IpvsPlan) {
    for (key, want) in &desired.virtual_servers {
        match current.virtual_servers.get(key) {
            None => {
                p.ipvs.push(IpvsChange::AddVs {
                    vs: *key,
                    attrs: want.attrs.clone(),
                });
                for (rs, r) in &want.real_servers {
                    p.ipvs.push(IpvsChange::AddRs {
                        vs: *key,
                        rs: *rs,
                        attrs: r.attrs,
                    });
                }
            }
            Some(have) => {
                if have.attrs != want.attrs {
                    p.ipvs.push(IpvsChange::EditVs {
                        vs: *key,
                        from: have.attrs.clone(),
                        to: want.attrs.clone(),
                    });
                }
                diff_real_servers(key, want, have, scope.keep_draining, p);
            }
        }
    }
    for key in current.virtual_servers.keys() {
        if desired.virtual_servers.contains_key(key) {
            continue;
        }
        match (scope.vs)(key) {
            Disposal::Ignore => {}
            Disposal::Remove => p.ipvs.push(IpvsChange::DeleteVs { vs: *key }),
            Disposal::Keep(why) => p
                .kept
                .push(format!("virtual server {}: {why}", vs_label(key))),
        }
    }
}

fn diff_real_servers(
    key: &VsKey,
    want: &VsState,
    have: &VsState,
    keep_draining: bool,
    p: &mut IpvsPlan,
) {
    for (rs, w) in &want.real_servers {
        match have.real_servers.get(rs) {
            None => p.ipvs.push(IpvsChange::AddRs {
                vs: *key,
                rs: *rs,
                attrs: w.attrs,
            }),
            Some(h) if h.attrs != w.attrs => p.ipvs.push(IpvsChange::EditRs {
                vs: *key,
                rs: *rs,
                from: h.attrs,
                to: w.attrs,
            }),
            Some(_) => {}
        }
    }
    for (rs, h) in &have.real_servers {
        if want.real_servers.contains_key(rs) {
            continue;
        }
        if keep_draining && draining(h) {
            p.kept.push(format!(
                "real server {} of {}: weight 0, draining {} connection(s) (kube-proxy's graceful termination deletes it)",
                SocketText(rs.0, rs.1),
                vs_label(key),
                h.connections.unwrap_or(0)
            ));
            continue;
        }
        p.ipvs.push(IpvsChange::DeleteRs { vs: *key, rs: *rs });
    }
}

fn draining(rs: &RsState) -> bool {
    rs.attrs.weight == 0 && rs.connections.is_some_and(|c| c > 0)
}

fn diff_sets(
    want: &BTreeMap<String, SetState>,
    have: &BTreeMap<String, SetState>,
    scope: &Scope<'_>,
    p: &mut IpvsPlan,
) {
    for (name, w) in want {
        match have.get(name) {
            None => {
                p.sets.push(SetChange::Create {
                    set: name.clone(),
                    set_type: w.set_type.clone(),
                    options: w.options.clone(),
                });
                for m in w.members.values() {
                    p.sets.push(SetChange::Add {
                        set: name.clone(),
                        member: m.clone(),
                    });
                }
            }
            Some(h) if h.set_type != w.set_type => p.kept.push(format!(
                "ipset {name}: type {} where kube-proxy creates {}; destroy it by hand once no rule uses it",
                h.set_type, w.set_type
            )),
            Some(h) => {
                for (canon, m) in &w.members {
                    if !h.members.contains_key(canon) {
                        p.sets.push(SetChange::Add {
                            set: name.clone(),
                            member: m.clone(),
                        });
                    }
                }
                for (canon, m) in &h.members {
                    if !w.members.contains_key(canon) {
                        p.sets.push(SetChange::Del {
                            set: name.clone(),
                            member: m.clone(),
                        });
                    }
                }
            }
        }
    }
    for name in have.keys() {
        if want.contains_key(name) {
            continue;
        }
        match (scope.set)(name) {
            Disposal::Ignore => {}
            Disposal::Remove => p
                .destroy_sets
                .push(SetChange::Destroy { set: name.clone() }),
            Disposal::Keep(why) => p.kept.push(format!("ipset {name}: {why}")),
        }
    }
}

fn diff_ipvs0(want: &Ipvs0, have: &Ipvs0, family: IpFamily, p: &mut IpvsPlan) {
    let of_family = |s: &BTreeSet<IpAddr>| -> BTreeSet<IpAddr> {
        s.iter()
            .copied()
            .filter(|a| IpFamily::of(a) == family)
            .collect()
    };
    match (want, have) {
        (Ipvs0::Unknown, _) | (_, Ipvs0::Unknown) | (Ipvs0::Absent, Ipvs0::Absent) => {}
        (Ipvs0::Present(w), Ipvs0::Absent) => {
            p.ipvs0_add.push(Ipvs0Change::AddLink);
            p.ipvs0_add
                .extend(of_family(w).into_iter().map(Ipvs0Change::AddAddr));
        }
        (Ipvs0::Absent, Ipvs0::Present(_)) => p.ipvs0_del.push(Ipvs0Change::DelLink),
        (Ipvs0::Present(w), Ipvs0::Present(h)) => {
            let (w, h) = (of_family(w), of_family(h));
            p.ipvs0_add
                .extend(w.difference(&h).copied().map(Ipvs0Change::AddAddr));
            p.ipvs0_del
                .extend(h.difference(&w).copied().map(Ipvs0Change::DelAddr));
        }
    }
}

#[cfg(test)]
mod tests;
