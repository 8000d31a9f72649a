//! What an IPVS repair's rollback may still put back: only what holds what the repair wrote.
//! A virtual server, an ipset or a `kube-ipvs0` address another writer (kube-proxy still
//! syncing, an admin) changed after the repair is that writer's now; putting the backup back
//! would undo its change, so it is left, with a note ([`super::plan::rollback_plan`]).

use super::changes::{Ipvs0Change, IpvsChange, SetChange, vs_label};
use super::plan::IpvsPlan;
use super::state::{Ipvs0, IpvsState, RsState, SetState, VsKey, VsState};
use crate::state::ip::IpFamily;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// The state `saved` becomes once `plan` is applied, as the kernel applies its changes (what
/// the repair wrote). A change that finds nothing to change changes nothing.
pub fn applied(saved: &IpvsState, plan: &IpvsPlan) -> IpvsState {
    let mut s = saved.clone();
    if let Some(sets) = s.sets.as_mut() {
        for c in plan.sets.iter().chain(&plan.destroy_sets) {
            apply_set_change(sets, c);
        }
    }
    let v = &mut s.virtual_servers;
    for c in &plan.ipvs {
        match c {
            IpvsChange::AddVs { vs, attrs } => {
                v.entry(*vs).or_insert_with(|| VsState {
                    attrs: attrs.clone(),
                    real_servers: BTreeMap::new(),
                });
            }
            IpvsChange::EditVs { vs, to, .. } => {
                if let Some(x) = v.get_mut(vs) {
                    x.attrs = to.clone();
                }
            }
            IpvsChange::DeleteVs { vs } => {
                v.remove(vs);
            }
            IpvsChange::AddRs { vs, rs, attrs }
            | IpvsChange::EditRs {
                vs, rs, to: attrs, ..
            } => {
                if let Some(x) = v.get_mut(vs) {
                    x.real_servers.insert(
                        *rs,
                        RsState {
                            attrs: *attrs,
                            connections: None,
                        },
                    );
                }
            }
            IpvsChange::DeleteRs { vs, rs } => {
                if let Some(x) = v.get_mut(vs) {
                    x.real_servers.remove(rs);
                }
            }
        }
    }
    s
}

/// Applies one ipset change to `sets`, as `ipset restore -exist` does.
pub(super) fn apply_set_change(sets: &mut BTreeMap<String, SetState>, c: &SetChange) {
    match c {
        SetChange::Create {
            set,
            set_type,
            options,
        } => {
            sets.entry(set.clone()).or_insert_with(|| SetState {
                set_type: set_type.clone(),
                options: options.clone(),
                members: BTreeMap::new(),
            });
        }
        SetChange::Add { set, member } => {
            if let Some(st) = sets.get_mut(set) {
                st.members.insert(member.clone(), member.clone());
            }
        }
        SetChange::Del { set, member } => {
            if let Some(st) = sets.get_mut(set) {
                st.members.remove(member);
            }
        }
        SetChange::Destroy { set } => {
            sets.remove(set);
        }
    }
}

/// Whether two virtual servers (or their absence) are the same to a rollback: attributes and
/// real servers with their attributes (not their connection counts).
fn same_vs(a: Option<&VsState>, b: Option<&VsState>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.attrs == b.attrs
                && a.real_servers.len() == b.real_servers.len()
                && a.real_servers
                    .iter()
                    .all(|(k, r)| b.real_servers.get(k).is_some_and(|o| o.attrs == r.attrs))
        }
        _ => false,
    }
}

/// Whether two ipsets (or their absence) are the same to a rollback: type and members.
fn same_set(a: Option<&SetState>, b: Option<&SetState>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.set_type == b.set_type && a.members.keys().eq(b.members.keys()),
        _ => false,
    }
}

/// Of the virtual servers and sets `forward` touched, those that still hold what it wrote
/// (`wrote`) `now`; a note for each of the others. Sets are compared only when `now` lists them.
pub fn still_written(
    wrote: &IpvsState,
    now: &IpvsState,
    forward: &IpvsPlan,
    notes: &mut Vec<String>,
) -> (BTreeSet<VsKey>, BTreeSet<String>) {
    let (vss, sets) = forward.touched();
    let left = "changed after the repair wrote it; left as the other writer left it";
    let vss = vss
        .into_iter()
        .filter(|k| {
            let same = same_vs(now.virtual_servers.get(k), wrote.virtual_servers.get(k));
            if !same {
                notes.push(format!("virtual server {}: {left}", vs_label(k)));
            }
            same
        })
        .collect();
    let sets = sets
        .into_iter()
        .filter(|n| {
            let (Some(have), Some(had)) = (&now.sets, &wrote.sets) else {
                return true;
            };
            let same = same_set(have.get(n), had.get(n));
            if !same {
                notes.push(format!("ipset {n}: {left}"));
            }
            same
        })
        .collect();
    (vss, sets)
}

/// What `kube-ipvs0` goes back to: as it is `now`, without the addresses `forward` added and
/// with those it deleted (of `family`); the device goes only when `forward` created it and
/// holds nothing else now, and comes back only when `forward` deleted it and it is still
/// absent. Addresses others added or deleted meanwhile stay as they are.
pub fn ipvs0_back(
    saved: &Ipvs0,
    now: &Ipvs0,
    forward: &IpvsPlan,
    family: IpFamily,
    notes: &mut Vec<String>,
) -> Ipvs0 {
    let changes = || forward.ipvs0_add.iter().chain(&forward.ipvs0_del);
    let added: BTreeSet<IpAddr> = changes()
        .filter_map(|c| match c {
            Ipvs0Change::AddAddr(a) if IpFamily::of(a) == family => Some(*a),
            _ => None,
        })
        .collect();
    let deleted: BTreeSet<IpAddr> = changes()
        .filter_map(|c| match c {
            Ipvs0Change::DelAddr(a) if IpFamily::of(a) == family => Some(*a),
            _ => None,
        })
        .collect();
    let link_added = changes().any(|c| *c == Ipvs0Change::AddLink);
    let link_deleted = changes().any(|c| *c == Ipvs0Change::DelLink);
    match now {
        Ipvs0::Unknown => Ipvs0::Unknown,
        Ipvs0::Absent if link_deleted => saved.clone(),
        Ipvs0::Absent => {
            if link_added || !added.is_empty() || !deleted.is_empty() {
                notes.push(
                    "kube-ipvs0: deleted after the repair wrote it; left as the other writer left it"
                        .into(),
                );
            }
            Ipvs0::Absent
        }
        Ipvs0::Present(have) => {
            if link_deleted {
                notes.push(
                    "kube-ipvs0: deleted by the repair and created again since; left as the other writer left it"
                        .into(),
                );
            }
            let want: BTreeSet<IpAddr> = have.difference(&added).chain(&deleted).copied().collect();
            if !link_added {
                return Ipvs0::Present(want);
            }
            if want.is_empty() {
                return Ipvs0::Absent;
            }
            notes.push(format!(
                "kube-ipvs0: created by the repair, kept: it holds addresses the repair did not add ({}); left as the other writer left it",
                want.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            Ipvs0::Present(want)
        }
    }
}
