//! The iptables proxier: the `iptables-restore` input kube-proxy writes on a full sync
//! (`proxier.go` `syncProxyRules`), for one IP family, from Services, EndpointSlices, the
//! configuration and the node facts.
//!
//! Two layers:
//! * [`expected_service_ports`] — per service port, the facts kube-proxy decides on (service port
//!   info, endpoints with their conditions, the cluster/local/reachable categorisation, chain
//!   names, which chains and filter rules exist). `verify` and `trace` use it to explain rules.
//! * [`render`] — the rules themselves, in kube-proxy's emission order, as a [`Rendered`].
//!
//! kube-proxy iterates services in Go map order; here service ports are emitted sorted by
//! (namespace, name, port name, protocol), so the output is deterministic. Stale-chain deletion
//! (`-X`) needs the node's current chains and is not part of a render.
//!
//! The parts, in the order a render runs: `decisions.rs` (what kube-proxy decides per service port),
//! `emit.rs` (the rules, written as `syncProxyRules` writes them; `emit/early.rs` for releases
//! before 1.24), `base_jumps.rs` (the jumps kube-proxy ensures in built-in chains) and
//! `rendered.rs` (the resulting text, by table).

mod base_jumps;
mod decisions;
mod emit;
mod rendered;

pub use base_jumps::BASE_JUMPS;
pub use decisions::{
    ChainNames, LocalDetector, ServiceDecisions, ServicePortDecisions, decide_each, decide_with,
    decisions_by_name, expected_service_ports,
};
pub use emit::{RenderChunk, RenderSummary, render, render_decisions, render_decisions_chunks};
pub use rendered::{
    ChainJson, Rendered, RenderedJson, RenderedTable, RuleJson, TableJson, rule_chain, rule_words,
};

/// kube-proxy switches to large-cluster mode above this many endpoints.
pub const LARGE_CLUSTER_ENDPOINTS_THRESHOLD: usize = 1000;

/// The comment of the nat KUBE-SERVICES → KUBE-NODEPORTS tail rule.
pub const NODEPORTS_TAIL_COMMENT: &str =
    "kubernetes service nodeports; NOTE: this must be the last rule in this chain";

/// Render options beyond the state, configuration and node facts.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions {
    /// Also declare the built-in chains (ACCEPT policy), KUBE-PROXY-CANARY (filter, nat, mangle)
    /// and KUBE-FIREWALL, and add the jump rules kube-proxy ensures in built-in chains, so the
    /// output restores on its own into a fresh network namespace.
    pub with_base_jumps: bool,
}
