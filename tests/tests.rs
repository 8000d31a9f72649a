//! The one integration-test binary: each area adds its `tests/<area>.rs` and a `mod` line here.

mod support;

mod cluster_e2e;
mod graph;
mod ipvs;
mod live;
mod netns_harness;
mod nft_parse;
mod packaging;
mod packetflow;
mod parse;
mod render;
mod repair;
mod repair_ipvs;
mod repair_remote;
mod resync;
mod testdata_dumps;
mod trace_path;
mod trace_traffic;
mod verify;
