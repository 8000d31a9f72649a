//! The IPVS-mode state repair compares: virtual servers with their real servers, ipsets with their
//! members, and the `kube-ipvs0` addresses. Built from kube-proxy's expected state
//! ([`IpvsState::expected`]) or from a node's dumps ([`IpvsState::from_dumps`]); both sides use the
//! same canonical forms (ipset members as `ipset save` prints them, sorted scheduler flags).

use crate::proxier::ipvs::{ExpectedIpvs, sets};
use crate::state::ip::IpFamily;
use kproxy_parsers::ParseError;
use kproxy_parsers::ipset;
use kproxy_parsers::ipvsadm::{self, Forward, Protocol, ServiceKey};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// A virtual server's key: protocol, address, port.
pub type VsKey = (Protocol, IpAddr, u16);

/// A real server's key within its virtual server: address, port.
pub type RsKey = (IpAddr, u16);

/// Every attribute `ipvsadm -A`/`-E` sets on a virtual server (`-E` resets the ones not given).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VsAttrs {
    /// Scheduler (`-s`).
    pub scheduler: String,
    /// Persistence timeout (`-p`), when persistent.
    pub persistent: Option<u32>,
    /// Persistence netmask (`-M`), when not host-sized.
    pub netmask: Option<String>,
    /// Scheduler flags (`-b`), sorted.
    pub flags: Vec<String>,
    /// One-packet scheduling (`-o`).
    pub ops: bool,
    /// Persistence engine (`--pe`).
    pub pe: Option<String>,
}

/// Every attribute `ipvsadm -a`/`-e` sets on a real server (`-e` resets the ones not given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RsAttrs {
    /// Forwarding method (`-m`, `-g`, `-i`); kube-proxy uses masquerading.
    pub forward: FwdMethod,
    /// Weight (`-w`).
    pub weight: i32,
    /// Upper connection threshold (`-x`, 0 = none).
    pub upper_threshold: u64,
    /// Lower connection threshold (`-y`, 0 = none).
    pub lower_threshold: u64,
}

/// A forwarding method as `ipvsadm` sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FwdMethod {
    /// `-m` (NAT). Old kernels list a node-local masqueraded destination as `Local`.
    Masq,
    /// `-g` (direct routing).
    Route,
    /// `-i` (tunnelling).
    Tunnel,
}

impl FwdMethod {
    fn of(f: Option<Forward>) -> FwdMethod {
        match f {
            Some(Forward::Route) => FwdMethod::Route,
            Some(Forward::Tunnel) => FwdMethod::Tunnel,
            Some(Forward::Masq | Forward::Local | Forward::Bypass) | None => FwdMethod::Masq,
        }
    }

    /// The `ipvsadm` switch.
    pub fn switch(self) -> &'static str {
        match self {
            FwdMethod::Masq => "-m",
            FwdMethod::Route => "-g",
            FwdMethod::Tunnel => "-i",
        }
    }
}

/// One real server as the node has it (or should have it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RsState {
    /// Its attributes.
    pub attrs: RsAttrs,
    /// ActiveConn + InActConn when the dump shows them (never set on the expected side).
    pub connections: Option<u64>,
}

/// One virtual server with its real servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VsState {
    /// Its attributes.
    pub attrs: VsAttrs,
    /// Real servers by address and port.
    pub real_servers: BTreeMap<RsKey, RsState>,
}

/// One ipset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SetState {
    /// Type, e.g. `hash:ip,port`.
    pub set_type: String,
    /// `create` options (`family inet hashsize 1024 maxelem 65536`, `range 0-65535`).
    pub options: String,
    /// Members: canonical text → the text to give `ipset add`/`del`.
    pub members: BTreeMap<String, String>,
}

/// What is known about the `kube-ipvs0` dummy device.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ipvs0 {
    /// Not collected: the addresses are neither compared nor changed.
    Unknown,
    /// The device does not exist.
    Absent,
    /// The device exists with these addresses.
    Present(BTreeSet<IpAddr>),
}

/// The IPVS-mode state of a node (or what it should be).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IpvsState {
    /// Virtual servers (fwmark services are not kube-proxy's and are left out).
    pub virtual_servers: BTreeMap<VsKey, VsState>,
    /// ipsets by name; `None` when not collected (then sets are neither compared nor changed).
    pub sets: Option<BTreeMap<String, SetState>>,
    /// The `kube-ipvs0` device.
    pub kube_ipvs0: Ipvs0,
}

impl IpvsState {
    /// What kube-proxy's proxier of `expected.ip_family` installs.
    pub fn expected(expected: &ExpectedIpvs) -> IpvsState {
        let fam = expected.ip_family;
        let virtual_servers = expected
            .virtual_servers
            .iter()
            .map(|v| {
                let mut flags = v.flags.clone();
                flags.sort();
                let attrs = VsAttrs {
                    scheduler: v.scheduler.clone(),
                    persistent: v.persistent_timeout_s,
                    netmask: None,
                    flags,
                    ops: false,
                    pe: None,
                };
                let real_servers = v
                    .real_servers
                    .iter()
                    .map(|r| {
                        let attrs = RsAttrs {
                            forward: FwdMethod::Masq,
                            weight: r.weight,
                            upper_threshold: 0,
                            lower_threshold: 0,
                        };
                        (
                            (r.address, r.port),
                            RsState {
                                attrs,
                                connections: None,
                            },
                        )
                    })
                    .collect();
                (
                    v.key(),
                    VsState {
                        attrs,
                        real_servers,
                    },
                )
            })
            .collect();
        let sets = sets::ALL
            .iter()
            .map(|d| {
                let name = d.name(fam);
                let members = expected
                    .ipsets
                    .get(&name)
                    .into_iter()
                    .flatten()
                    .map(|e| (ipset::canonical_member(d.set_type, e), e.clone()))
                    .collect();
                let set = SetState {
                    set_type: d.set_type.to_string(),
                    options: d.create_options(fam),
                    members,
                };
                (name, set)
            })
            .collect();
        IpvsState {
            virtual_servers,
            sets: Some(sets),
            kube_ipvs0: Ipvs0::Present(expected.kube_ipvs0_addresses.iter().copied().collect()),
        }
    }

    /// The node's state from its dumps: `ipvsadm` text (`-Ln` and/or `-Sn`, concatenated in that
    /// order: the save form supplies every attribute, `-Ln` the connection counters), `ipset save`
    /// text when collected, and what is known about `kube-ipvs0`.
    pub fn from_dumps(
        ipvsadm_text: &str,
        ipset_text: Option<&str>,
        kube_ipvs0: Ipvs0Text<'_>,
    ) -> Result<IpvsState, ParseError> {
        let dump = ipvsadm::parse_dump(ipvsadm_text)?;
        let mut virtual_servers = BTreeMap::new();
        for s in dump.merged_services() {
            let ServiceKey::Inet {
                protocol,
                addr,
                port,
            } = s.key
            else {
                continue;
            };
            let mut flags: Vec<String> = s.sched_flags.iter().map(|f| f.to_string()).collect();
            flags.sort();
            let attrs = VsAttrs {
                scheduler: s.scheduler.unwrap_or_default().to_string(),
                persistent: s.persistent,
                netmask: s.netmask.map(str::to_string),
                flags,
                ops: s.ops,
                pe: s.pe.map(str::to_string),
            };
            let real_servers = s
                .real_servers
                .iter()
                .map(|r| {
                    let attrs = RsAttrs {
                        forward: FwdMethod::of(r.forward),
                        weight: r.weight.unwrap_or(0),
                        upper_threshold: r.upper_threshold.unwrap_or(0),
                        lower_threshold: r.lower_threshold.unwrap_or(0),
                    };
                    let connections = match (r.active_conns, r.inactive_conns) {
                        (Some(a), Some(i)) => Some(a + i),
                        _ => None,
                    };
                    ((r.addr, r.port), RsState { attrs, connections })
                })
                .collect();
            virtual_servers.insert(
                (protocol, addr, port),
                VsState {
                    attrs,
                    real_servers,
                },
            );
        }
        let sets = match ipset_text {
            None => None,
            Some(t) => Some(
                ipset::parse_ipset(t)?
                    .into_iter()
                    .map(|s| {
                        let members = s
                            .entries
                            .iter()
                            .map(|e| (e.member.to_string(), e.text.to_string()))
                            .collect();
                        let set = SetState {
                            set_type: s.set_type.to_string(),
                            options: s.header.join(" "),
                            members,
                        };
                        (s.name.to_string(), set)
                    })
                    .collect(),
            ),
        };
        let kube_ipvs0 = match kube_ipvs0 {
            Ipvs0Text::Unknown => Ipvs0::Unknown,
            Ipvs0Text::Absent => Ipvs0::Absent,
            Ipvs0Text::Addr(t) => Ipvs0::Present(
                kproxy_parsers::ip_addr::interface_addresses(t, crate::proxier::ipvs::DUMMY_DEVICE)
                    .into_iter()
                    .collect(),
            ),
        };
        Ok(IpvsState {
            virtual_servers,
            sets,
            kube_ipvs0,
        })
    }

    /// Virtual servers of one family.
    pub fn of_family(&self, fam: IpFamily) -> impl Iterator<Item = (&VsKey, &VsState)> {
        self.virtual_servers
            .iter()
            .filter(move |(k, _)| IpFamily::of(&k.1) == fam)
    }
}

/// What was collected about `kube-ipvs0`.
#[derive(Debug, Clone, Copy)]
pub enum Ipvs0Text<'a> {
    /// Not collected.
    Unknown,
    /// The device does not exist.
    Absent,
    /// `ip addr` / `ip -o addr` output covering the device.
    Addr(&'a str),
}
