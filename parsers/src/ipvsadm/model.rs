//! What the ipvsadm parsers produce: virtual services, real servers, counters, connections.

use super::lexeme::Counter;
use serde::Serialize;
use std::fmt;
use std::net::IpAddr;

/// A virtual-service protocol (ipvsadm.c `print_service_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Protocol {
    /// `TCP` / `-t`.
    Tcp,
    /// `UDP` / `-u`.
    Udp,
    /// `SCTP` / `--sctp-service`.
    Sctp,
    /// `?` (a protocol ipvsadm has no name for).
    Unknown,
}

impl Protocol {
    /// The listing name (`TCP`, `UDP`, `SCTP`, `?`).
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
            Protocol::Unknown => "?",
        }
    }
    /// The lower-case name used by ipset entries and iptables (`tcp`, `udp`, `sctp`).
    pub fn lower(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
            Protocol::Unknown => "?",
        }
    }
    /// Parses a listing or Kubernetes protocol name, case-insensitively.
    pub fn from_name(s: &str) -> Option<Protocol> {
        match s.to_ascii_uppercase().as_str() {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            "?" => Some(Protocol::Unknown),
            _ => None,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The key of a virtual service: protocol + address + port, or a firewall mark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum ServiceKey {
    /// `PROTO ADDR:PORT`.
    Inet {
        /// Protocol.
        protocol: Protocol,
        /// Virtual address.
        addr: IpAddr,
        /// Virtual port.
        port: u16,
    },
    /// `FWM MARK [IPv6]`.
    Fwmark {
        /// The firewall mark.
        mark: u32,
        /// True for an IPv6 fwmark service.
        ipv6: bool,
    },
}

impl fmt::Display for ServiceKey {
    /// Formats as a listing prints it: `TCP  10.96.0.1:443`, `TCP  [fd00::1]:443`, `FWM  100 IPv6`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceKey::Inet {
                protocol,
                addr,
                port,
            } => {
                write!(f, "{:<4} {}", protocol.as_str(), SocketText(*addr, *port))
            }
            ServiceKey::Fwmark { mark, ipv6 } => {
                write!(f, "FWM  {mark}{}", if *ipv6 { " IPv6" } else { "" })
            }
        }
    }
}

/// `ADDR:PORT` text as ipvsadm prints it (IPv6 bracketed).
#[derive(Debug, Clone, Copy)]
pub struct SocketText(pub IpAddr, pub u16);

impl fmt::Display for SocketText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            IpAddr::V4(a) => write!(f, "{a}:{}", self.1),
            IpAddr::V6(a) => write!(f, "[{a}]:{}", self.1),
        }
    }
}

/// Packet forwarding method of a real server (ipvsadm.c `print_service_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Forward {
    /// `Masq` / `-m` (NAT; what kube-proxy uses).
    Masq,
    /// `Local` (old kernels, node-local destination); saved as `-g`.
    Local,
    /// `Route` / `-g` (direct routing).
    Route,
    /// `Tunnel` / `-i`.
    Tunnel,
    /// `(null)`: the bypass method.
    Bypass,
}

impl Forward {
    /// The listing name.
    pub fn as_str(self) -> &'static str {
        match self {
            Forward::Masq => "Masq",
            Forward::Local => "Local",
            Forward::Route => "Route",
            Forward::Tunnel => "Tunnel",
            Forward::Bypass => "(null)",
        }
    }
    /// Parses a listing name.
    pub fn from_name(s: &str) -> Option<Forward> {
        Some(match s {
            "Masq" => Forward::Masq,
            "Local" => Forward::Local,
            "Route" => Forward::Route,
            "Tunnel" => Forward::Tunnel,
            "(null)" => Forward::Bypass,
            _ => return None,
        })
    }
}

/// The five counters of `--stats` (Conns InPkts OutPkts InBytes OutBytes) or `--rate`
/// (CPS InPPS OutPPS InBPS OutBPS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Conns (or CPS).
    pub conns: Counter,
    /// InPkts (or InPPS).
    pub in_pkts: Counter,
    /// OutPkts (or OutPPS).
    pub out_pkts: Counter,
    /// InBytes (or InBPS).
    pub in_bytes: Counter,
    /// OutBytes (or OutBPS).
    pub out_bytes: Counter,
}

/// One real server (destination) of a virtual service. Fields a layout does not print are `None`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RealServer<'a> {
    /// Destination address.
    pub addr: IpAddr,
    /// Destination port.
    pub port: u16,
    /// Forwarding method (default and tun-info layouts, save form).
    pub forward: Option<Forward>,
    /// Weight.
    pub weight: Option<i32>,
    /// ActiveConn.
    pub active_conns: Option<u64>,
    /// InActConn.
    pub inactive_conns: Option<u64>,
    /// PersistConn (`--persistent-conn`).
    pub persist_conns: Option<u64>,
    /// Upper threshold (`--thresholds`, `-x`).
    pub upper_threshold: Option<u64>,
    /// Lower threshold (`--thresholds`, `-y`).
    pub lower_threshold: Option<u64>,
    /// Tunnel info (`--tun-info` column, or `--tun-type …` options in the save form).
    pub tunnel: Option<&'a str>,
    /// `--stats` counters.
    pub stats: Option<Stats>,
    /// `--rate` counters.
    pub rate: Option<Stats>,
    /// 1-based source line.
    pub line: usize,
}

impl RealServer<'_> {
    /// A destination with only its address known (the other fields filled by the layout parser).
    pub(crate) fn new(addr: IpAddr, port: u16, line: usize) -> Self {
        RealServer {
            addr,
            port,
            forward: None,
            weight: None,
            active_conns: None,
            inactive_conns: None,
            persist_conns: None,
            upper_threshold: None,
            lower_threshold: None,
            tunnel: None,
            stats: None,
            rate: None,
            line,
        }
    }
}

/// One virtual service with its real servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VirtualService<'a> {
    /// Protocol/address/port or fwmark.
    pub key: ServiceKey,
    /// Scheduler name (`None` in the `--stats`/`--rate` layouts, which do not print it).
    pub scheduler: Option<&'a str>,
    /// Scheduler flags, e.g. `mh-port`, `sh-fallback`.
    pub sched_flags: Vec<&'a str>,
    /// Persistence timeout in seconds, when persistent.
    pub persistent: Option<u32>,
    /// Persistence netmask text (`255.255.255.0` or an IPv6 prefix length), when not host-sized.
    pub netmask: Option<&'a str>,
    /// Persistence engine (`pe sip`).
    pub pe: Option<&'a str>,
    /// One-packet scheduling.
    pub ops: bool,
    /// `--stats` counters.
    pub stats: Option<Stats>,
    /// `--rate` counters.
    pub rate: Option<Stats>,
    /// Real servers, in text order.
    pub real_servers: Vec<RealServer<'a>>,
    /// 1-based source line.
    pub line: usize,
}

impl<'a> VirtualService<'a> {
    /// A service with only its key known.
    pub(crate) fn new(key: ServiceKey, line: usize) -> Self {
        VirtualService {
            key,
            scheduler: None,
            sched_flags: Vec::new(),
            persistent: None,
            netmask: None,
            pe: None,
            ops: false,
            stats: None,
            rate: None,
            real_servers: Vec::new(),
            line,
        }
    }
}

/// Which command printed a listing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Layout {
    /// `ipvsadm -Ln` (also the single-service form).
    Default,
    /// `ipvsadm -Ln --stats`.
    Stats,
    /// `ipvsadm -Ln --rate`.
    Rate,
    /// `ipvsadm -Ln --thresholds`.
    Thresholds,
    /// `ipvsadm -Ln --persistent-conn`.
    PersistentConn,
    /// `ipvsadm -Ln --tun-info`.
    TunInfo,
    /// `ipvsadm -Sn` / `ipvsadm-save -n` (command form).
    Save,
}

/// One listing (or save output) of the IPVS table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing<'a> {
    /// Which layout it is in.
    pub layout: Layout,
    /// `1.2.1` from the version line, when present.
    pub version: Option<&'a str>,
    /// The connection hash table size from the version line.
    pub conn_table_size: Option<u64>,
    /// The services in text order.
    pub services: Vec<VirtualService<'a>>,
}

/// One row of `ipvsadm -Lnc` (ipvsadm.c `list_conn`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Connection<'a> {
    /// `TCP`, `UDP`, `SCTP`, `IP` (fwmark template), …
    pub protocol: &'a str,
    /// Seconds until expiry (unbounded: ipvsadm prints minutes without a limit).
    pub expire_s: u64,
    /// Connection state (`ESTABLISHED`, `NONE`, `UDP`, …).
    pub state: &'a str,
    /// Client address and port (port 0 for persistence templates).
    pub client: (IpAddr, u16),
    /// Virtual address and port.
    pub virtual_addr: (IpAddr, u16),
    /// Destination (real server) address and port.
    pub dest: (IpAddr, u16),
    /// Persistence engine name and data (`--persistent-conn`).
    pub pe: Option<(&'a str, &'a str)>,
    /// 1-based source line.
    pub line: usize,
}

impl Connection<'_> {
    /// True for a persistence template (client port 0).
    pub fn is_template(&self) -> bool {
        self.client.1 == 0
    }
}

/// `ipvsadm -L --timeout` (ipvsadm.c `list_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Timeouts {
    /// TCP established timeout, seconds.
    pub tcp: i64,
    /// TCP FIN timeout, seconds.
    pub tcp_fin: i64,
    /// UDP timeout, seconds.
    pub udp: i64,
}

/// A line the parser skipped (shell prompts and other captured noise outside the tables).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped<'a> {
    /// 1-based line number.
    pub line: usize,
    /// The line text.
    pub text: &'a str,
}

/// Everything found in one ipvsadm capture, which may concatenate several command outputs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct IpvsDump<'a> {
    /// Listings and save outputs, in text order.
    pub listings: Vec<Listing<'a>>,
    /// Connection entries (`-Lnc`).
    pub connections: Vec<Connection<'a>>,
    /// Whether a connection table header was seen (an empty table is still information).
    pub has_connection_table: bool,
    /// `--timeout` values.
    pub timeouts: Option<Timeouts>,
    /// `--daemon` lines.
    pub daemons: Vec<&'a str>,
    /// Lines that were skipped (prompts, comments).
    pub skipped: Vec<Skipped<'a>>,
}
