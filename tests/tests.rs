//! The one integration-test binary: each area adds its `tests/<area>.rs` and a `mod` line here.

mod support;

mod bounded_input;
mod cluster_e2e;
mod completion;
mod conntrack_e2e;
mod conntrack_ipvs;
mod graph;
mod hostile;
mod hygiene;
mod ipvs;
mod kubeconfig;
mod listing;
mod live;
mod mass_drift;
mod netns_harness;
mod nft_graph_trace;
mod nft_parse;
mod nftables_render;
mod nftables_verify;
mod packaging;
mod packetflow;
mod parse;
mod pastes;
mod render;
mod repair;
mod repair_ipvs;
mod repair_remote;
mod resync;
mod service_cidrs;
mod testdata_dumps;
mod trace_path;
mod trace_traffic;
mod verify;
mod versions;
mod wrong_inputs;
