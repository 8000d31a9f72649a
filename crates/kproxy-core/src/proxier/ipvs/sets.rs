//! The 17 ipsets of kube-proxy's IPVS proxier (`pkg/proxy/ipvs/proxier.go` `ipsetInfo`): base names, types and the comments
//! their iptables rules carry.

use crate::state::ip::IpFamily;

/// One ipset kube-proxy creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetDef {
    /// IPv4 (base) name.
    pub base: &'static str,
    /// ipset type.
    pub set_type: &'static str,
    /// Comment used on the iptables rule that matches the set.
    pub comment: &'static str,
}

macro_rules! sets {
    ($($id:ident = $name:literal, $ty:literal, $comment:literal;)*) => {
        $(#[doc = concat!("`", $name, "` (", $ty, ").")] pub const $id: SetDef = SetDef { base: $name, set_type: $ty, comment: $comment };)*
        /// Every set, in kube-proxy's declaration order.
        pub const ALL: &[SetDef] = &[$($id),*];
    };
}

sets! {
    LOOP_BACK = "KUBE-LOOP-BACK", "hash:ip,port,ip", "Kubernetes endpoints dst ip:port, source ip for solving hairpin purpose";
    CLUSTER_IP = "KUBE-CLUSTER-IP", "hash:ip,port", "Kubernetes service cluster ip + port for masquerade purpose";
    EXTERNAL_IP = "KUBE-EXTERNAL-IP", "hash:ip,port", "Kubernetes service external ip + port for masquerade and filter purpose";
    EXTERNAL_IP_LOCAL = "KUBE-EXTERNAL-IP-LOCAL", "hash:ip,port", "Kubernetes service external ip + port with externalTrafficPolicy=local";
    LOAD_BALANCER = "KUBE-LOAD-BALANCER", "hash:ip,port", "Kubernetes service lb portal";
    LOAD_BALANCER_LOCAL = "KUBE-LOAD-BALANCER-LOCAL", "hash:ip,port", "Kubernetes service load balancer ip + port with externalTrafficPolicy=local";
    LOAD_BALANCER_FW = "KUBE-LOAD-BALANCER-FW", "hash:ip,port", "Kubernetes service load balancer ip + port for load balancer with sourceRange";
    LOAD_BALANCER_SOURCE_IP = "KUBE-LOAD-BALANCER-SOURCE-IP", "hash:ip,port,ip", "Kubernetes service load balancer ip + port + source IP for packet filter purpose";
    LOAD_BALANCER_SOURCE_CIDR = "KUBE-LOAD-BALANCER-SOURCE-CIDR", "hash:ip,port,net", "Kubernetes service load balancer ip + port + source cidr for packet filter purpose";
    NODE_PORT_TCP = "KUBE-NODE-PORT-TCP", "bitmap:port", "Kubernetes nodeport TCP port for masquerade purpose";
    NODE_PORT_LOCAL_TCP = "KUBE-NODE-PORT-LOCAL-TCP", "bitmap:port", "Kubernetes nodeport TCP port with externalTrafficPolicy=local";
    NODE_PORT_UDP = "KUBE-NODE-PORT-UDP", "bitmap:port", "Kubernetes nodeport UDP port for masquerade purpose";
    NODE_PORT_LOCAL_UDP = "KUBE-NODE-PORT-LOCAL-UDP", "bitmap:port", "Kubernetes nodeport UDP port with externalTrafficPolicy=local";
    NODE_PORT_SCTP = "KUBE-NODE-PORT-SCTP-HASH", "hash:ip,port", "Kubernetes nodeport SCTP port for masquerade purpose with type 'hash ip:port'";
    NODE_PORT_LOCAL_SCTP = "KUBE-NODE-PORT-LOCAL-SCTP-HASH", "hash:ip,port", "Kubernetes nodeport SCTP port with externalTrafficPolicy=local with type 'hash ip:port'";
    HEALTH_CHECK_NODE_PORT = "KUBE-HEALTH-CHECK-NODE-PORT", "bitmap:port", "Kubernetes health check node port";
    IPVS_IPS = "KUBE-IPVS-IPS", "hash:ip", "Addresses on the ipvs interface";
}

impl SetDef {
    /// The set's name for a family: IPv6 sets are `KUBE-6-…`, truncated to 31 characters.
    pub fn name(&self, family: IpFamily) -> String {
        match family {
            IpFamily::V4 => self.base.to_string(),
            IpFamily::V6 => {
                let rest = self.base.strip_prefix("KUBE-").unwrap_or(self.base);
                let mut n = format!("KUBE-6-{rest}");
                n.truncate(31);
                n
            }
        }
    }

    /// The `ipset create` header options kube-proxy uses.
    pub fn create_options(&self, family: IpFamily) -> String {
        if self.set_type.starts_with("bitmap:") {
            "range 0-65535".to_string()
        } else {
            let fam = if family == IpFamily::V6 {
                "inet6"
            } else {
                "inet"
            };
            format!("family {fam} hashsize 1024 maxelem 65536")
        }
    }

    /// Finds a set by its name in either family's spelling.
    pub fn by_name(name: &str) -> Option<(SetDef, IpFamily)> {
        for d in ALL {
            if d.base == name {
                return Some((*d, IpFamily::V4));
            }
            if d.name(IpFamily::V6) == name {
                return Some((*d, IpFamily::V6));
            }
        }
        None
    }
}
