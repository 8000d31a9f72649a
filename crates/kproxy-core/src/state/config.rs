//! `KubeProxyConfiguration` (`kubeproxy.config.k8s.io/v1alpha1`), read from YAML/JSON or from the
//! kube-proxy ConfigMap whose `config.conf` key holds it. Defaults are kube-proxy's (v1alpha1
//! `defaults.go`). Unknown fields give a warning; a field of the wrong type is an error naming the
//! field and the file.

use super::Warning;
use super::load::{StateError, parse_documents};
use super::mode::ProxyMode;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// How kube-proxy tells pod traffic from other traffic (`detectLocalMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub enum DetectLocalMode {
    /// `clusterCIDR` (the default).
    #[default]
    ClusterCIDR,
    /// The Node's `spec.podCIDRs`.
    NodeCIDR,
    /// `detectLocal.bridgeInterface`.
    BridgeInterface,
    /// `detectLocal.interfaceNamePrefix`.
    InterfaceNamePrefix,
}

/// The IPVS section (used by the IPVS proxier).
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct IpvsConfig {
    /// `ipvs.scheduler` ("" = rr).
    pub scheduler: String,
    /// `ipvs.excludeCIDRs`.
    pub exclude_cidrs: Vec<String>,
    /// `ipvs.strictARP`.
    pub strict_arp: bool,
    /// `ipvs.tcpTimeout` (duration text, "" = unset).
    pub tcp_timeout: String,
    /// `ipvs.tcpFinTimeout`.
    pub tcp_fin_timeout: String,
    /// `ipvs.udpTimeout`.
    pub udp_timeout: String,
    /// `ipvs.syncPeriod`.
    pub sync_period: String,
    /// `ipvs.minSyncPeriod` (duration text, "" = unset).
    pub min_sync_period: String,
}

/// The nftables section (used by the nftables proxier; see [`ProxyConfig::for_nftables`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NftablesConfig {
    /// `nftables.masqueradeAll` (or `linux.masqueradeAll`).
    pub masquerade_all: bool,
    /// `nftables.masqueradeBit` (default 14).
    pub masquerade_bit: u32,
    /// `nftables.syncPeriod` (duration text, default `30s`).
    pub sync_period: String,
    /// `nftables.minSyncPeriod` (duration text, default `1s`).
    pub min_sync_period: String,
}

impl Default for NftablesConfig {
    fn default() -> Self {
        NftablesConfig {
            masquerade_all: false,
            masquerade_bit: 14,
            sync_period: "30s".into(),
            min_sync_period: "1s".into(),
        }
    }
}

/// The parts of KubeProxyConfiguration that shape the rules, with kube-proxy's defaults applied.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProxyConfig {
    /// `mode`; `None` when it is unset or `""` (iptables on Linux, [`ProxyMode::DEFAULT`]).
    pub mode: Option<ProxyMode>,
    /// `hostnameOverride` (trimmed, lower-cased; "" = unset).
    pub hostname_override: String,
    /// `bindAddress` (default `0.0.0.0`).
    pub bind_address: String,
    /// `clusterCIDR`, split on commas (dual-stack).
    pub cluster_cidrs: Vec<String>,
    /// `detectLocalMode`.
    pub detect_local_mode: DetectLocalMode,
    /// `detectLocal.bridgeInterface`.
    pub bridge_interface: String,
    /// `detectLocal.interfaceNamePrefix`.
    pub interface_name_prefix: String,
    /// `nodePortAddresses` (empty = all; the keyword `primary`, and from 1.37 `localhost` and
    /// `all`, allowed).
    pub node_port_addresses: Vec<String>,
    /// `iptables.masqueradeAll`.
    pub masquerade_all: bool,
    /// `iptables.masqueradeBit` (default 14).
    pub masquerade_bit: u32,
    /// `iptables.localhostNodePorts` (default true).
    pub localhost_node_ports: bool,
    /// `iptables.syncPeriod` (duration text, default `30s`).
    pub sync_period: String,
    /// `iptables.minSyncPeriod` (or the top-level `minSyncPeriod`; duration text, default `1s`):
    /// how long kube-proxy waits to batch changes before a sync.
    pub min_sync_period: String,
    /// `healthzBindAddress` (default `0.0.0.0:10256`): where kube-proxy answers `/healthz`.
    pub healthz_bind_address: String,
    /// `conntrack.tcpBeLiberal`.
    pub tcp_be_liberal: bool,
    /// `featureGates`.
    pub feature_gates: BTreeMap<String, bool>,
    /// The `ipvs` section.
    pub ipvs: IpvsConfig,
    /// The `nftables` section.
    pub nftables: NftablesConfig,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            mode: None,
            hostname_override: String::new(),
            bind_address: "0.0.0.0".into(),
            cluster_cidrs: Vec::new(),
            detect_local_mode: DetectLocalMode::ClusterCIDR,
            bridge_interface: String::new(),
            interface_name_prefix: String::new(),
            node_port_addresses: Vec::new(),
            masquerade_all: false,
            masquerade_bit: 14,
            localhost_node_ports: true,
            sync_period: "30s".into(),
            min_sync_period: "1s".into(),
            healthz_bind_address: "0.0.0.0:10256".into(),
            tcp_be_liberal: false,
            feature_gates: BTreeMap::new(),
            ipvs: IpvsConfig::default(),
            nftables: NftablesConfig::default(),
        }
    }
}

impl ProxyConfig {
    /// Whether a feature gate is on (explicit setting, else kube-proxy's default for the gates
    /// that matter to rule generation: `PreferSameTrafficDistribution` is on by default).
    pub fn feature_enabled(&self, gate: &str) -> bool {
        match self.feature_gates.get(gate) {
            Some(v) => *v,
            None => gate == "PreferSameTrafficDistribution",
        }
    }

    /// The configuration as kube-proxy reads it in nftables mode (whatever `mode` says): the
    /// v1alpha1 conversion takes masqueradeAll, masqueradeBit and syncPeriod from the `nftables`
    /// section, and an empty `nodePortAddresses` means `primary` (`cmd/kube-proxy`
    /// `platformApplyDefaults`).
    pub fn for_nftables(&self) -> ProxyConfig {
        let mut c = self.clone();
        c.mode = Some(ProxyMode::Nftables);
        c.masquerade_all = self.nftables.masquerade_all;
        c.masquerade_bit = self.nftables.masquerade_bit;
        c.sync_period = self.nftables.sync_period.clone();
        c.min_sync_period = self.nftables.min_sync_period.clone();
        if c.node_port_addresses.is_empty() {
            c.node_port_addresses = vec!["primary".into()];
        }
        c
    }

    /// This configuration with `gates` set over its `featureGates` (kube-proxy's
    /// `--feature-gates` flag wins over the file's map); borrowed when there is nothing to set.
    pub fn with_feature_gates(
        &self,
        gates: &BTreeMap<String, bool>,
    ) -> std::borrow::Cow<'_, ProxyConfig> {
        if gates.is_empty() {
            return std::borrow::Cow::Borrowed(self);
        }
        let mut c = self.clone();
        c.feature_gates
            .extend(gates.iter().map(|(k, v)| (k.clone(), *v)));
        std::borrow::Cow::Owned(c)
    }

    /// The masquerade mark as kube-proxy formats `1 << masqueradeBit` (`%#08x` → `0x00004000`).
    pub fn masquerade_mark(&self) -> String {
        let value: u64 = 1u64 << self.masquerade_bit.min(31);
        format!("{value:#010x}")
    }
}

/// Feature gates as kube-proxy's `--feature-gates` flag spells them: `Name=bool,Name=bool`
/// (`true`/`false`, any case).
pub fn parse_feature_gates(text: &str) -> Result<BTreeMap<String, bool>, String> {
    let mut gates = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let Some((name, value)) = item.split_once('=') else {
            return Err(format!("{item:?} is not Name=true or Name=false"));
        };
        let name = name.trim();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(format!("{name:?} is not a feature gate name"));
        }
        let on = match value.trim().to_ascii_lowercase().as_str() {
            "true" => true,
            "false" => false,
            other => return Err(format!("{name}={other:?}: the value is not true or false")),
        };
        gates.insert(name.to_string(), on);
    }
    Ok(gates)
}

/// The CIDRs a `nodePortAddresses` keyword stands for (kube-proxy#138427, 1.37:
/// `localhost` is the loopback range of each family, `all` every address), or `None` for a CIDR
/// or `primary`, which the node's addresses decide.
pub fn node_port_keyword_cidrs(word: &str) -> Option<[&'static str; 2]> {
    match word.trim() {
        "localhost" => Some(["127.0.0.0/8", "::1/128"]),
        "all" => Some(["0.0.0.0/0", "::/0"]),
        _ => None,
    }
}

/// Why a configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not valid YAML/JSON, or unreadable.
    #[error(transparent)]
    Parse(#[from] StateError),
    /// A field has the wrong type or an invalid value.
    #[error("{source_name}: field `{field}`: {message}")]
    Field {
        /// File name.
        source_name: String,
        /// Dotted field path.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The document is not a KubeProxyConfiguration.
    #[error("{source_name}: {message}")]
    Document {
        /// File name.
        source_name: String,
        /// What is wrong.
        message: String,
    },
}

struct Reader<'a> {
    source: &'a str,
    warnings: Vec<Warning>,
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a map",
    }
}

impl Reader<'_> {
    fn err(&self, field: &str, message: String) -> ConfigError {
        ConfigError::Field {
            source_name: self.source.into(),
            field: field.into(),
            message,
        }
    }

    fn wrong(&self, field: &str, want: &str, v: &Value) -> ConfigError {
        self.err(field, format!("expected {want}, found {}", type_name(v)))
    }

    fn check_known(&mut self, map: &Map<String, Value>, prefix: &str, known: &[&str]) {
        for key in map.keys() {
            if !known.contains(&key.as_str()) {
                self.warnings.push(Warning::new(
                    format!("{}: field `{prefix}{key}`", self.source),
                    "unknown field, ignored",
                ));
            }
        }
    }

    fn string(
        &self,
        map: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<String>, ConfigError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(self.wrong(path, "a string", v)),
        }
    }

    fn boolean(
        &self,
        map: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<bool>, ConfigError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(path, "a boolean", v)),
        }
    }

    fn integer(
        &self,
        map: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<i64>, ConfigError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => n
                .as_i64()
                .map(Some)
                .ok_or_else(|| self.err(path, format!("expected an integer, found {n}"))),
            Some(v) => Err(self.wrong(path, "an integer", v)),
        }
    }

    /// A duration field: kept as written, refused as kube-proxy refuses it
    /// ([`super::duration::parse`]).
    fn duration(
        &self,
        map: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<String>, ConfigError> {
        let Some(text) = self.string(map, key, path)? else {
            return Ok(None);
        };
        super::duration::parse(&text).map_err(|e| self.err(path, e.to_string()))?;
        Ok(Some(text))
    }

    fn strings(
        &self,
        map: &Map<String, Value>,
        key: &str,
        path: &str,
    ) -> Result<Option<Vec<String>>, ConfigError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(self.wrong(&format!("{path}[{i}]"), "a string", v)),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Err(self.wrong(path, "a list of strings", v)),
        }
    }

    fn section<'m>(
        &self,
        map: &'m Map<String, Value>,
        key: &str,
    ) -> Result<Option<&'m Map<String, Value>>, ConfigError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(v) => Err(self.wrong(key, "a map", v)),
        }
    }
}

const TOP_LEVEL: &[&str] = &[
    "apiVersion",
    "kind",
    "featureGates",
    "clientConnection",
    "logging",
    "hostnameOverride",
    "bindAddress",
    "healthzBindAddress",
    "metricsBindAddress",
    "bindAddressHardFail",
    "enableProfiling",
    "showHiddenMetricsForVersion",
    "mode",
    "iptables",
    "ipvs",
    "nftables",
    "winkernel",
    "detectLocalMode",
    "detectLocal",
    "clusterCIDR",
    "nodePortAddresses",
    "oomScoreAdj",
    "conntrack",
    "configSyncPeriod",
    "portRange",
    "windowsRunAsService",
    "linux",
    "syncPeriod",
    "minSyncPeriod",
];
const IPTABLES: &[&str] = &[
    "masqueradeAll",
    "masqueradeBit",
    "localhostNodePorts",
    "syncPeriod",
    "minSyncPeriod",
];
const IPVS: &[&str] = &[
    "syncPeriod",
    "minSyncPeriod",
    "scheduler",
    "excludeCIDRs",
    "strictARP",
    "tcpTimeout",
    "tcpFinTimeout",
    "udpTimeout",
];
const NFTABLES: &[&str] = &[
    "masqueradeAll",
    "masqueradeBit",
    "syncPeriod",
    "minSyncPeriod",
];
const CONNTRACK: &[&str] = &[
    "maxPerCore",
    "min",
    "tcpEstablishedTimeout",
    "tcpCloseWaitTimeout",
    "tcpBeLiberal",
    "udpTimeout",
    "udpStreamTimeout",
];
const DETECT_LOCAL: &[&str] = &["bridgeInterface", "interfaceNamePrefix", "clusterCIDRs"];
const LINUX: &[&str] = &["masqueradeAll", "conntrack", "oomScoreAdj"];

/// Parses a KubeProxyConfiguration (YAML or JSON), or a ConfigMap holding one in `config.conf`.
pub fn parse(text: &str, source_name: &str) -> Result<(ProxyConfig, Vec<Warning>), ConfigError> {
    let docs = parse_documents(text, source_name)?;
    let mut docs = docs.into_iter();
    let doc = match docs.next() {
        Some(d) => d,
        None => return Ok((ProxyConfig::default(), Vec::new())),
    };
    let map = match doc {
        Value::Object(m) => m,
        other => {
            return Err(ConfigError::Document {
                source_name: source_name.into(),
                message: format!(
                    "expected a KubeProxyConfiguration map, found {}",
                    type_name(&other)
                ),
            });
        }
    };
    let mut extra = Vec::new();
    if docs.next().is_some() {
        extra.push(Warning::new(
            source_name,
            "more than one document; only the first is used",
        ));
    }
    if map.get("kind").and_then(Value::as_str) == Some("ConfigMap") {
        let inner = map
            .get("data")
            .and_then(|d| d.get("config.conf"))
            .and_then(Value::as_str)
            .ok_or_else(|| ConfigError::Document {
                source_name: source_name.into(),
                message: "ConfigMap has no string key data.\"config.conf\"".into(),
            })?;
        let name = format!("{source_name} (data.config.conf)");
        let (cfg, mut w) = parse(inner, &name)?;
        extra.append(&mut w);
        return Ok((cfg, extra));
    }
    let mut r = Reader {
        source: source_name,
        warnings: extra,
    };
    let cfg = read_config(&mut r, &map)?;
    Ok((cfg, r.warnings))
}

/// `mode` as kube-proxy's `validateProxyMode` accepts it on Linux: `""` (iptables), `iptables`,
/// `ipvs`, `nftables`, spelled exactly so.
fn valid_mode(r: &Reader<'_>, mode: String) -> Result<Option<ProxyMode>, ConfigError> {
    if mode.is_empty() {
        return Ok(None);
    }
    if let Ok(m) = mode.parse::<ProxyMode>() {
        return Ok(Some(m));
    }
    let hint = if mode == "kernelspace" {
        " (kernelspace is kube-proxy's Windows mode)".to_string()
    } else if mode.to_lowercase().parse::<ProxyMode>().is_ok() {
        format!(" (modes are lower case: {:?})", mode.to_lowercase())
    } else {
        String::new()
    };
    Err(r.err(
        "mode",
        format!(
            "{mode:?} is not a proxy mode kube-proxy accepts on Linux: iptables, ipvs, nftables, or \"\" for iptables{hint}"
        ),
    ))
}

fn read_config(r: &mut Reader<'_>, map: &Map<String, Value>) -> Result<ProxyConfig, ConfigError> {
    let mut cfg = ProxyConfig::default();
    if let Some(kind) = r.string(map, "kind", "kind")?
        && kind != "KubeProxyConfiguration"
    {
        return Err(ConfigError::Document {
            source_name: r.source.into(),
            message: format!("kind is {kind:?}, expected KubeProxyConfiguration or a ConfigMap"),
        });
    }
    if let Some(v) = r.string(map, "apiVersion", "apiVersion")?
        && v != "kubeproxy.config.k8s.io/v1alpha1"
    {
        r.warnings.push(Warning::new(
            format!("{}: field `apiVersion`", r.source),
            format!("{v:?} is not kubeproxy.config.k8s.io/v1alpha1; reading it as v1alpha1"),
        ));
    }
    r.check_known(map, "", TOP_LEVEL);
    if let Some(v) = r.string(map, "mode", "mode")? {
        cfg.mode = valid_mode(r, v)?;
    }
    if let Some(v) = r.string(map, "hostnameOverride", "hostnameOverride")? {
        cfg.hostname_override = v.trim().to_lowercase();
    }
    if let Some(v) = r.string(map, "bindAddress", "bindAddress")?
        && !v.is_empty()
    {
        cfg.bind_address = v;
    }
    if let Some(v) = r.string(map, "clusterCIDR", "clusterCIDR")? {
        cfg.cluster_cidrs = v
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
    }
    if let Some(v) = r.string(map, "detectLocalMode", "detectLocalMode")? {
        cfg.detect_local_mode = match v.as_str() {
            "" | "ClusterCIDR" => DetectLocalMode::ClusterCIDR,
            "NodeCIDR" => DetectLocalMode::NodeCIDR,
            "BridgeInterface" => DetectLocalMode::BridgeInterface,
            "InterfaceNamePrefix" => DetectLocalMode::InterfaceNamePrefix,
            other => {
                return Err(r.err(
                    "detectLocalMode",
                    format!("unknown mode {other:?} (ClusterCIDR, NodeCIDR, BridgeInterface, InterfaceNamePrefix)"),
                ));
            }
        };
    }
    if let Some(d) = r.section(map, "detectLocal")? {
        r.check_known(d, "detectLocal.", DETECT_LOCAL);
        if let Some(v) = r.string(d, "bridgeInterface", "detectLocal.bridgeInterface")? {
            cfg.bridge_interface = v;
        }
        if let Some(v) = r.string(d, "interfaceNamePrefix", "detectLocal.interfaceNamePrefix")? {
            cfg.interface_name_prefix = v;
        }
        if let Some(v) = r.strings(d, "clusterCIDRs", "detectLocal.clusterCIDRs")?
            && cfg.cluster_cidrs.is_empty()
        {
            cfg.cluster_cidrs = v;
        }
    }
    if let Some(v) = r.strings(map, "nodePortAddresses", "nodePortAddresses")? {
        cfg.node_port_addresses = v;
    }
    if let Some(v) = r.duration(map, "syncPeriod", "syncPeriod")? {
        cfg.sync_period = v;
    }
    if let Some(v) = r.duration(map, "minSyncPeriod", "minSyncPeriod")? {
        cfg.min_sync_period = v;
    }
    if let Some(v) = r.string(map, "healthzBindAddress", "healthzBindAddress")?
        && !v.is_empty()
    {
        cfg.healthz_bind_address = v;
    }
    if let Some(l) = r.section(map, "linux")? {
        r.check_known(l, "linux.", LINUX);
        if let Some(v) = r.boolean(l, "masqueradeAll", "linux.masqueradeAll")? {
            cfg.masquerade_all = v;
            cfg.nftables.masquerade_all = v;
        }
    }
    if let Some(ipt) = r.section(map, "iptables")? {
        r.check_known(ipt, "iptables.", IPTABLES);
        if let Some(v) = r.boolean(ipt, "masqueradeAll", "iptables.masqueradeAll")? {
            cfg.masquerade_all = cfg.masquerade_all || v;
        }
        if let Some(v) = r.integer(ipt, "masqueradeBit", "iptables.masqueradeBit")? {
            if !(0..=31).contains(&v) {
                return Err(r.err("iptables.masqueradeBit", format!("{v} is not in 0..31")));
            }
            cfg.masquerade_bit = v as u32;
        }
        if let Some(v) = r.boolean(ipt, "localhostNodePorts", "iptables.localhostNodePorts")? {
            cfg.localhost_node_ports = v;
        }
        if let Some(v) = r.duration(ipt, "syncPeriod", "iptables.syncPeriod")? {
            cfg.sync_period = v;
        }
        if let Some(v) = r.duration(ipt, "minSyncPeriod", "iptables.minSyncPeriod")? {
            cfg.min_sync_period = v;
        }
    }
    if let Some(ipvs) = r.section(map, "ipvs")? {
        r.check_known(ipvs, "ipvs.", IPVS);
        let p = |k: &str| format!("ipvs.{k}");
        cfg.ipvs.scheduler = r
            .string(ipvs, "scheduler", &p("scheduler"))?
            .unwrap_or_default();
        cfg.ipvs.exclude_cidrs = r
            .strings(ipvs, "excludeCIDRs", &p("excludeCIDRs"))?
            .unwrap_or_default();
        cfg.ipvs.strict_arp = r
            .boolean(ipvs, "strictARP", &p("strictARP"))?
            .unwrap_or(false);
        cfg.ipvs.tcp_timeout = r
            .duration(ipvs, "tcpTimeout", &p("tcpTimeout"))?
            .unwrap_or_default();
        cfg.ipvs.tcp_fin_timeout = r
            .duration(ipvs, "tcpFinTimeout", &p("tcpFinTimeout"))?
            .unwrap_or_default();
        cfg.ipvs.udp_timeout = r
            .duration(ipvs, "udpTimeout", &p("udpTimeout"))?
            .unwrap_or_default();
        cfg.ipvs.sync_period = r
            .duration(ipvs, "syncPeriod", &p("syncPeriod"))?
            .unwrap_or_default();
        cfg.ipvs.min_sync_period = r
            .duration(ipvs, "minSyncPeriod", &p("minSyncPeriod"))?
            .unwrap_or_default();
    }
    if let Some(nft) = r.section(map, "nftables")? {
        r.check_known(nft, "nftables.", NFTABLES);
        if let Some(v) = r.boolean(nft, "masqueradeAll", "nftables.masqueradeAll")? {
            cfg.nftables.masquerade_all = cfg.nftables.masquerade_all || v;
        }
        if let Some(v) = r.integer(nft, "masqueradeBit", "nftables.masqueradeBit")? {
            if !(0..=31).contains(&v) {
                return Err(r.err("nftables.masqueradeBit", format!("{v} is not in 0..31")));
            }
            cfg.nftables.masquerade_bit = v as u32;
        }
        if let Some(v) = r.duration(nft, "syncPeriod", "nftables.syncPeriod")? {
            cfg.nftables.sync_period = v;
        }
        if let Some(v) = r.duration(nft, "minSyncPeriod", "nftables.minSyncPeriod")? {
            cfg.nftables.min_sync_period = v;
        }
    }
    if let Some(ct) = r.section(map, "conntrack")? {
        r.check_known(ct, "conntrack.", CONNTRACK);
        if let Some(v) = r.boolean(ct, "tcpBeLiberal", "conntrack.tcpBeLiberal")? {
            cfg.tcp_be_liberal = v;
        }
    }
    if let Some(fg) = r.section(map, "featureGates")? {
        for (k, v) in fg {
            match v {
                Value::Bool(b) => {
                    cfg.feature_gates.insert(k.clone(), *b);
                }
                other => return Err(r.wrong(&format!("featureGates.{k}"), "a boolean", other)),
            }
        }
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    #[test]
    fn feature_gates_as_kube_proxy_spells_them() {
        let gates = parse_feature_gates(
            "AllowServiceExternalIPs=false, KubeProxyNFTablesLocalhostNodePorts=TRUE",
        )
        .expect("parses");
        assert_eq!(gates.get("AllowServiceExternalIPs"), Some(&false));
        assert_eq!(
            gates.get("KubeProxyNFTablesLocalhostNodePorts"),
            Some(&true)
        );
        assert!(parse_feature_gates("").expect("empty").is_empty());
        for bad in ["Gate", "Gate=yes", "=true", "Bad-Name=true"] {
            assert!(parse_feature_gates(bad).is_err(), "{bad}");
        }
        let mut config = ProxyConfig::default();
        config
            .feature_gates
            .insert("AllowServiceExternalIPs".into(), true);
        let merged = config.with_feature_gates(&gates);
        assert_eq!(
            merged.feature_gates.get("AllowServiceExternalIPs"),
            Some(&false)
        );
        assert!(matches!(
            config.with_feature_gates(&BTreeMap::new()),
            std::borrow::Cow::Borrowed(_)
        ));
    }

    #[test]
    fn node_port_keywords() {
        assert_eq!(
            node_port_keyword_cidrs("localhost"),
            Some(["127.0.0.0/8", "::1/128"])
        );
        assert_eq!(
            node_port_keyword_cidrs(" all "),
            Some(["0.0.0.0/0", "::/0"])
        );
        assert_eq!(node_port_keyword_cidrs("primary"), None);
        assert_eq!(node_port_keyword_cidrs("10.0.0.0/8"), None);
    }

    use super::*;

    #[test]
    fn defaults() {
        let (c, w) = parse(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n",
            "c.yaml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(w.is_empty());
        assert_eq!(c.masquerade_mark(), "0x00004000");
        assert!(c.localhost_node_ports);
        assert_eq!(c.detect_local_mode, DetectLocalMode::ClusterCIDR);
    }

    #[test]
    fn nftables_mode_reads_its_own_section() {
        let (c, w) = parse(
            "kind: KubeProxyConfiguration\nmode: nftables\niptables:\n  masqueradeAll: true\n  masqueradeBit: 12\nnftables:\n  masqueradeBit: 15\n  syncPeriod: 1m\n",
            "c.yaml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(w.is_empty(), "{w:?}");
        let n = c.for_nftables();
        assert!(!n.masquerade_all);
        assert_eq!(n.masquerade_mark(), "0x00008000");
        assert_eq!(n.sync_period, "1m");
        assert_eq!(n.node_port_addresses, ["primary"]);
        assert_eq!(c.masquerade_mark(), "0x00001000");
        let e = parse(
            "kind: KubeProxyConfiguration\nnftables:\n  masqueradeBit: 40\n",
            "c.yaml",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("nftables.masqueradeBit"), "{e}");
    }

    #[test]
    fn sync_periods_and_healthz() {
        let (c, w) = parse(
            "kind: KubeProxyConfiguration\nhealthzBindAddress: 127.0.0.1:10999\niptables:\n  minSyncPeriod: 500ms\n  syncPeriod: 1m\nnftables:\n  minSyncPeriod: 2s\n",
            "c.yaml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(c.min_sync_period, "500ms");
        assert_eq!(c.sync_period, "1m");
        assert_eq!(c.healthz_bind_address, "127.0.0.1:10999");
        assert_eq!(c.for_nftables().min_sync_period, "2s");
        let e = parse(
            "kind: KubeProxyConfiguration\niptables:\n  syncPeriod: \"30\"\n",
            "c.yaml",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            e.contains("iptables.syncPeriod") && e.contains("not a duration"),
            "{e}"
        );
    }

    #[test]
    fn configmap_form() {
        let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: kube-proxy, namespace: kube-system}\ndata:\n  config.conf: |\n    apiVersion: kubeproxy.config.k8s.io/v1alpha1\n    kind: KubeProxyConfiguration\n    clusterCIDR: 10.244.0.0/16,fd00::/48\n    iptables:\n      masqueradeAll: true\n";
        let (c, _) = parse(cm, "cm.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert!(c.masquerade_all);
        assert_eq!(c.cluster_cidrs, vec!["10.244.0.0/16", "fd00::/48"]);
    }

    #[test]
    fn unknown_field_warns() {
        let (_, w) = parse(
            "kind: KubeProxyConfiguration\nbogus: 1\niptables:\n  nope: true\n",
            "c.yaml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].object.contains("bogus"));
        assert!(w[1].object.contains("iptables.nope"));
    }

    #[test]
    fn wrong_type_is_error_naming_field_and_file() {
        let e = parse(
            "kind: KubeProxyConfiguration\niptables:\n  masqueradeBit: fourteen\n",
            "c.yaml",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(
            e.contains("c.yaml") && e.contains("iptables.masqueradeBit"),
            "{e}"
        );
    }
}
