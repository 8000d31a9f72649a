//! The changes a plan is made of, and the commands they become: `ipvsadm` argv (edits carry
//! every attribute, since `ipvsadm -E`/`-e` reset the ones not given), `ipset restore` lines and
//! `ip` argv for `kube-ipvs0`.

use super::state::{RsAttrs, RsKey, VsAttrs, VsKey};
use kproxy_parsers::ipvsadm::{Protocol, SocketText};
use serde::Serialize;
use std::net::IpAddr;

/// One `ipvsadm` change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum IpvsChange {
    /// `ipvsadm -A`.
    AddVs {
        /// The virtual server.
        vs: VsKey,
        /// Its attributes.
        attrs: VsAttrs,
    },
    /// `ipvsadm -E` with every attribute.
    EditVs {
        /// The virtual server.
        vs: VsKey,
        /// Attributes now.
        from: VsAttrs,
        /// Attributes after.
        to: VsAttrs,
    },
    /// `ipvsadm -D`.
    DeleteVs {
        /// The virtual server.
        vs: VsKey,
    },
    /// `ipvsadm -a`.
    AddRs {
        /// The virtual server.
        vs: VsKey,
        /// The real server.
        rs: RsKey,
        /// Its attributes.
        attrs: RsAttrs,
    },
    /// `ipvsadm -e` with every attribute.
    EditRs {
        /// The virtual server.
        vs: VsKey,
        /// The real server.
        rs: RsKey,
        /// Attributes now.
        from: RsAttrs,
        /// Attributes after.
        to: RsAttrs,
    },
    /// `ipvsadm -d`.
    DeleteRs {
        /// The virtual server.
        vs: VsKey,
        /// The real server.
        rs: RsKey,
    },
}

/// `-t ADDR:PORT` / `-u …` / `--sctp-service …`.
fn service_args(vs: &VsKey) -> [String; 2] {
    let flag = match vs.0 {
        Protocol::Tcp => "-t",
        Protocol::Udp => "-u",
        Protocol::Sctp | Protocol::Unknown => "--sctp-service",
    };
    [flag.to_string(), SocketText(vs.1, vs.2).to_string()]
}

fn vs_attr_args(a: &VsAttrs, out: &mut Vec<String>) {
    out.extend(["-s".to_string(), a.scheduler.clone()]);
    if let Some(t) = a.persistent {
        out.extend(["-p".to_string(), t.to_string()]);
        if let Some(m) = &a.netmask {
            out.extend(["-M".to_string(), m.clone()]);
        }
    }
    if !a.flags.is_empty() {
        out.extend(["-b".to_string(), a.flags.join(",")]);
    }
    if a.ops {
        out.push("-o".into());
    }
    if let Some(pe) = &a.pe {
        out.extend(["--pe".to_string(), pe.clone()]);
    }
}

fn rs_attr_args(a: &RsAttrs, out: &mut Vec<String>) {
    out.push(a.forward.switch().to_string());
    out.extend(["-w".to_string(), a.weight.to_string()]);
    if a.upper_threshold > 0 {
        out.extend(["-x".to_string(), a.upper_threshold.to_string()]);
    }
    if a.lower_threshold > 0 {
        out.extend(["-y".to_string(), a.lower_threshold.to_string()]);
    }
}

/// `TCP 10.96.0.1:443`.
pub fn vs_label(vs: &VsKey) -> String {
    format!("{} {}", vs.0.as_str(), SocketText(vs.1, vs.2))
}

fn vs_attr_text(a: &VsAttrs) -> String {
    let mut v = Vec::new();
    vs_attr_args(a, &mut v);
    v.join(" ")
}

fn rs_attr_text(a: &RsAttrs) -> String {
    let mut v = Vec::new();
    rs_attr_args(a, &mut v);
    v.join(" ")
}

impl IpvsChange {
    /// The command as text (`ipvsadm ARGS…`), for display and step names.
    pub fn command(&self) -> String {
        format!("ipvsadm {}", self.argv().join(" "))
    }

    /// The `ipvsadm` arguments (without the program name).
    pub fn argv(&self) -> Vec<String> {
        let (op, vs) = match self {
            IpvsChange::AddVs { vs, .. } => ("-A", vs),
            IpvsChange::EditVs { vs, .. } => ("-E", vs),
            IpvsChange::DeleteVs { vs } => ("-D", vs),
            IpvsChange::AddRs { vs, .. } => ("-a", vs),
            IpvsChange::EditRs { vs, .. } => ("-e", vs),
            IpvsChange::DeleteRs { vs, .. } => ("-d", vs),
        };
        let mut a = vec![op.to_string()];
        a.extend(service_args(vs));
        match self {
            IpvsChange::AddVs { attrs, .. } | IpvsChange::EditVs { to: attrs, .. } => {
                vs_attr_args(attrs, &mut a);
            }
            IpvsChange::DeleteVs { .. } => {}
            IpvsChange::AddRs { rs, attrs, .. } | IpvsChange::EditRs { rs, to: attrs, .. } => {
                a.extend(["-r".to_string(), SocketText(rs.0, rs.1).to_string()]);
                rs_attr_args(attrs, &mut a);
            }
            IpvsChange::DeleteRs { rs, .. } => {
                a.extend(["-r".to_string(), SocketText(rs.0, rs.1).to_string()]);
            }
        }
        a
    }

    /// One line for the plan display.
    pub fn describe(&self) -> String {
        match self {
            IpvsChange::AddVs { vs, attrs } => {
                format!(
                    "add virtual server {} ({})",
                    vs_label(vs),
                    vs_attr_text(attrs)
                )
            }
            IpvsChange::EditVs { vs, from, to } => format!(
                "edit virtual server {}: {} → {}",
                vs_label(vs),
                vs_attr_text(from),
                vs_attr_text(to)
            ),
            IpvsChange::DeleteVs { vs } => format!("delete virtual server {}", vs_label(vs)),
            IpvsChange::AddRs { vs, rs, attrs } => format!(
                "add real server {} to {} ({})",
                SocketText(rs.0, rs.1),
                vs_label(vs),
                rs_attr_text(attrs)
            ),
            IpvsChange::EditRs { vs, rs, from, to } => format!(
                "edit real server {} of {}: {} → {}",
                SocketText(rs.0, rs.1),
                vs_label(vs),
                rs_attr_text(from),
                rs_attr_text(to)
            ),
            IpvsChange::DeleteRs { vs, rs } => format!(
                "delete real server {} from {}",
                SocketText(rs.0, rs.1),
                vs_label(vs)
            ),
        }
    }

    /// The virtual server changed.
    pub fn vs(&self) -> &VsKey {
        match self {
            IpvsChange::AddVs { vs, .. }
            | IpvsChange::EditVs { vs, .. }
            | IpvsChange::DeleteVs { vs }
            | IpvsChange::AddRs { vs, .. }
            | IpvsChange::EditRs { vs, .. }
            | IpvsChange::DeleteRs { vs, .. } => vs,
        }
    }
}

/// One `ipset restore` line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum SetChange {
    /// `create NAME TYPE OPTIONS`.
    Create {
        /// Set name.
        set: String,
        /// Type.
        set_type: String,
        /// Header options.
        options: String,
    },
    /// `add NAME MEMBER`.
    Add {
        /// Set name.
        set: String,
        /// Member text.
        member: String,
    },
    /// `del NAME MEMBER`.
    Del {
        /// Set name.
        set: String,
        /// Member text.
        member: String,
    },
    /// `destroy NAME`.
    Destroy {
        /// Set name.
        set: String,
    },
}

impl SetChange {
    /// The `ipset restore` line.
    pub fn line(&self) -> String {
        match self {
            SetChange::Create {
                set,
                set_type,
                options,
            } => format!("create {set} {set_type} {options}")
                .trim_end()
                .to_string(),
            SetChange::Add { set, member } => format!("add {set} {member}"),
            SetChange::Del { set, member } => format!("del {set} {member}"),
            SetChange::Destroy { set } => format!("destroy {set}"),
        }
    }

    /// The set changed.
    pub fn set(&self) -> &str {
        match self {
            SetChange::Create { set, .. }
            | SetChange::Add { set, .. }
            | SetChange::Del { set, .. }
            | SetChange::Destroy { set } => set,
        }
    }
}

/// One `kube-ipvs0` change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "op", content = "address", rename_all = "kebab-case")]
pub enum Ipvs0Change {
    /// `ip link add kube-ipvs0 type dummy`.
    AddLink,
    /// `ip link del kube-ipvs0` (only when rolling back to a node without it).
    DelLink,
    /// `ip addr add ADDR/32 dev kube-ipvs0`.
    AddAddr(IpAddr),
    /// `ip addr del ADDR/32 dev kube-ipvs0`.
    DelAddr(IpAddr),
}

impl Ipvs0Change {
    /// The command as text (`ip ARGS…`), for display and step names.
    pub fn command(&self) -> String {
        format!("ip {}", self.argv().join(" "))
    }

    /// The `ip` arguments.
    pub fn argv(&self) -> Vec<String> {
        let host = |a: &IpAddr| format!("{a}/{}", if a.is_ipv4() { 32 } else { 128 });
        let v: Vec<String> = match self {
            Ipvs0Change::AddLink => ["link", "add", "kube-ipvs0", "type", "dummy"]
                .map(String::from)
                .into(),
            Ipvs0Change::DelLink => ["link", "del", "kube-ipvs0"].map(String::from).into(),
            Ipvs0Change::AddAddr(a) => vec![
                "addr".into(),
                "add".into(),
                host(a),
                "dev".into(),
                "kube-ipvs0".into(),
            ],
            Ipvs0Change::DelAddr(a) => vec![
                "addr".into(),
                "del".into(),
                host(a),
                "dev".into(),
                "kube-ipvs0".into(),
            ],
        };
        v
    }
}
