//! kube-proxy's proxy modes on Linux: the one type every layer names a mode with (the
//! configuration's `mode`, what a report checked, what a repair writes).

use serde::Serialize;

/// A proxy mode kube-proxy runs in on Linux (`--proxy-mode`, the configuration's `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProxyMode {
    /// The iptables proxier (`pkg/proxy/iptables`): kube-proxy's default on Linux.
    Iptables,
    /// The IPVS proxier (`pkg/proxy/ipvs`).
    Ipvs,
    /// The nftables proxier (`pkg/proxy/nftables`).
    Nftables,
}

impl ProxyMode {
    /// Every mode, in the order kube-proxy's `validateProxyMode` lists them.
    pub const ALL: [ProxyMode; 3] = [ProxyMode::Iptables, ProxyMode::Ipvs, ProxyMode::Nftables];

    /// The mode kube-proxy runs in when its configuration names none (`mode: ""`): iptables
    /// on Linux (`cmd/kube-proxy/app/server_linux.go`, `platformApplyDefaults`).
    pub const DEFAULT: ProxyMode = ProxyMode::Iptables;

    /// The name kube-proxy's configuration and flags spell it with: `iptables`, `ipvs`,
    /// `nftables`.
    pub fn name(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Ipvs => "ipvs",
            ProxyMode::Nftables => "nftables",
        }
    }

    /// The mode of a configured `mode` value: [`ProxyMode::DEFAULT`] when none is configured.
    pub fn or_default(configured: Option<ProxyMode>) -> ProxyMode {
        configured.unwrap_or(ProxyMode::DEFAULT)
    }
}

impl std::fmt::Display for ProxyMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is no proxy mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a proxy mode: iptables, ipvs or nftables")]
pub struct UnknownMode(pub String);

impl std::str::FromStr for ProxyMode {
    type Err = UnknownMode;

    /// Exactly as kube-proxy spells the modes (lower case).
    fn from_str(s: &str) -> Result<ProxyMode, UnknownMode> {
        ProxyMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| UnknownMode(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_serialize_as_written() {
        for m in ProxyMode::ALL {
            assert_eq!(m.name().parse::<ProxyMode>(), Ok(m));
            assert_eq!(
                serde_json::to_string(&m).ok(),
                Some(format!("\"{}\"", m.name()))
            );
            assert_eq!(m.to_string(), m.name());
        }
        assert!("IPVS".parse::<ProxyMode>().is_err());
        assert!("".parse::<ProxyMode>().is_err());
        assert_eq!(ProxyMode::or_default(None), ProxyMode::Iptables);
        assert_eq!(
            ProxyMode::or_default(Some(ProxyMode::Nftables)),
            ProxyMode::Nftables
        );
    }
}
