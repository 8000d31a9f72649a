//! The grace period: how long a difference may last before it is drift, from kube-proxy's
//! configuration. kube-proxy batches changes for `minSyncPeriod` before a sync, and retries a
//! failed sync after `syncPeriod` (`pkg/proxy/iptables/proxier.go` `syncProxyRules`:
//! `proxier.syncRunner.RetryAfter(proxier.syncPeriod)`; the nftables and IPVS proxiers do the
//! same), so a change may take both before it is in the rules; the margin covers the sync's own
//! run time and the monitor's read.

use kproxy_core::state::config::ProxyConfig;
use kproxy_core::state::duration;
use kproxy_core::state::mode::ProxyMode;
use std::time::Duration;

/// What the grace period adds to kube-proxy's periods.
pub const MARGIN: Duration = Duration::from_secs(5);

/// The grace period for `config` (of the mode it configures) and how it was made, for logs.
pub fn from_config(config: &ProxyConfig) -> (Duration, String) {
    let (min_sync, sync) = match ProxyMode::or_default(config.mode) {
        ProxyMode::Nftables => {
            let n = config.for_nftables();
            (n.min_sync_period, n.sync_period)
        }
        ProxyMode::Ipvs => (
            non_empty(&config.ipvs.min_sync_period, &config.min_sync_period),
            non_empty(&config.ipvs.sync_period, &config.sync_period),
        ),
        ProxyMode::Iptables => (config.min_sync_period.clone(), config.sync_period.clone()),
    };
    // The configuration reader refused durations kube-proxy refuses; unset is zero.
    let min_sync_d = duration::parse(&min_sync).unwrap_or_default();
    let sync_d = duration::parse(&sync).unwrap_or_default();
    let grace = min_sync_d + sync_d + MARGIN;
    let how = format!(
        "minSyncPeriod {} + syncPeriod {} + {} margin",
        duration::format(min_sync_d),
        duration::format(sync_d),
        duration::format(MARGIN)
    );
    (grace, how)
}

fn non_empty(first: &str, fallback: &str) -> String {
    if first.trim().is_empty() {
        fallback.to_string()
    } else {
        first.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_modes() {
        let c = ProxyConfig::default();
        assert_eq!(from_config(&c).0, Duration::from_secs(36));
        let (c, _) = kproxy_core::state::config::parse(
            "kind: KubeProxyConfiguration\nmode: nftables\nnftables:\n  minSyncPeriod: 500ms\n  syncPeriod: 10s\n",
            "c.yaml",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let (g, how) = from_config(&c);
        assert_eq!(g, Duration::from_millis(15_500));
        assert!(how.contains("500ms") && how.contains("10s"), "{how}");
    }
}
