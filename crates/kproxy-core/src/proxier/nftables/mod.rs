//! The nftables proxier: the `kube-proxy` table (`table ip kube-proxy` or `table ip6
//! kube-proxy`) kube-proxy's nftables mode writes on a full sync (`pkg/proxy/nftables/proxier.go`
//! `syncProxyRules`), for one IP family, from Services, EndpointSlices, ServiceCIDRs, the
//! configuration and the node facts.
//!
//! Layers:
//! * [`decisions`] — what kube-proxy decides: node-wide facts and, per service port, the endpoints, names and
//!   flags (built on the service ports and endpoint categorisation all proxiers share);
//! * [`sync`] — the objects in the order of kube-proxy's first full sync into an empty table
//!   (`setupNFTables`, then one service port at a time; set and map elements last), given to
//!   an [`objects::Sink`];
//! * [`objects`] — the knftables object text (`add table|chain|set|map|rule|element …` lines,
//!   what kube-proxy sends to `nft -f` and what its tests compare) and a JSON form.
//!
//! Service ports come sorted by (namespace, name, port name, protocol); kube-proxy walks a Go
//! map, which only changes the order of lines that belong to different chains, sets and maps.
//! Stale chains and affinity sets (flushed or deleted by kube-proxy on later syncs) need the
//! node's current table and are not part of a render.

pub mod canonical;
pub mod decisions;
pub mod names;
pub mod objects;
pub mod sync;

use crate::proxier::endpoints::EndpointDetail;
use crate::state::config::ProxyConfig;
use crate::state::ip::IpFamily;
use crate::state::node::NodeFacts;
use crate::state::{ClusterState, Warning};
use objects::{JsonSink, Sink, StringSink, TableFamily};
use serde::Serialize;

/// What a render says besides its objects.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RenderSummary {
    /// The IP family rendered.
    pub family: IpFamily,
    /// `ip` or `ip6`.
    pub table_family: TableFamily,
    /// Service ports rendered.
    pub service_ports: usize,
    /// Objects skipped and oddities kube-proxy would log.
    pub warnings: Vec<Warning>,
}

/// The table family of `family`.
pub fn table_family(family: IpFamily) -> TableFamily {
    match family {
        IpFamily::V4 => TableFamily::Ip,
        IpFamily::V6 => TableFamily::Ip6,
    }
}

/// Renders the table into `sink`, one service port at a time (the working memory stays small
/// whatever the size of the cluster).
///
/// `config` is the configuration as kube-proxy reads it in nftables mode
/// ([`ProxyConfig::for_nftables`]) and `facts` were built from it (the mark comes from
/// `nftables.masqueradeBit`).
pub fn render_into(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    sink: &mut dyn Sink,
) -> RenderSummary {
    render_each(state, config, facts, sink, &mut |_| {})
}

/// [`render_into`], showing `each` every service port's decisions after its objects were
/// written (what a comparison indexes the table by).
pub fn render_each(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
    sink: &mut dyn Sink,
    each: &mut dyn FnMut(&decisions::PortDecisions),
) -> RenderSummary {
    let mut emitter = sync::Emitter::new(table_family(facts.family), sink);
    let mut ports = 0usize;
    let mut set_up = false;
    let (node, mut warnings) = decisions::decide_each(
        state,
        config,
        facts,
        EndpointDetail::Lean,
        &mut |node, port| {
            if !set_up {
                emitter.setup(node);
                set_up = true;
            }
            emitter.service_port(node, &port);
            each(&port);
            ports += 1;
        },
    );
    if !set_up {
        emitter.setup(&node);
    }
    warnings.extend(emitter.finish());
    RenderSummary {
        family: facts.family,
        table_family: node.table_family,
        service_ports: ports,
        warnings,
    }
}

/// Renders the table as `add …` lines.
pub fn render_text(
    state: &ClusterState,
    config: &ProxyConfig,
    facts: &NodeFacts,
) -> (String, RenderSummary) {
    let mut sink = StringSink {
        family: table_family(facts.family),
        text: String::new(),
    };
    let summary = render_into(state, config, facts, &mut sink);
    (sink.text, summary)
}

/// The `-o json` document of a render.
#[derive(Debug, Serialize)]
pub struct RenderedJson {
    /// `IPv4` / `IPv6`.
    pub family: IpFamily,
    /// The table: family and name.
    pub table: TableJson,
    /// The objects in load order, each `{"add": "table|chain|set|map|rule|element", …}`.
    pub objects: Vec<serde_json::Value>,
    /// Warnings.
    pub warnings: Vec<Warning>,
}

/// The table of a [`RenderedJson`].
#[derive(Debug, Serialize)]
pub struct TableJson {
    /// `ip` or `ip6`.
    pub family: TableFamily,
    /// `kube-proxy`.
    pub name: &'static str,
}

/// Renders the table as the `-o json` document.
pub fn render_json(state: &ClusterState, config: &ProxyConfig, facts: &NodeFacts) -> RenderedJson {
    let mut sink = JsonSink::default();
    let summary = render_into(state, config, facts, &mut sink);
    RenderedJson {
        family: summary.family,
        table: TableJson {
            family: summary.table_family,
            name: names::TABLE,
        },
        objects: sink.objects,
        warnings: summary.warnings,
    }
}
