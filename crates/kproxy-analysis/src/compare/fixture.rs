//! Test inputs shared by the compare modules' unit tests: the testdata cluster.

use crate::proxier::iptables::{ServiceDecisions, expected_service_ports};
use crate::state::node::NodeFacts;

/// A file of the repository (two levels above this crate), as text.
pub(crate) fn read(path: &str) -> String {
    let repo = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    std::fs::read_to_string(repo.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// kube-proxy's IPv4 plan for `testdata/cluster` (as `verify node-1 --random-fully true
/// --nfacct none` computes it), with the node facts it was made for.
pub(crate) fn cluster_decisions() -> (ServiceDecisions, NodeFacts) {
    let state = crate::state::load::from_str(&read("testdata/cluster/state.json"), "state.json")
        .expect("state");
    let (config, _) = crate::state::config::parse(&read("testdata/cluster/config.yaml"), "config")
        .expect("config");
    let args = crate::state::node::NodeInputs {
        family: Some(crate::state::ip::IpFamily::V4),
        nfacct: Some(Vec::new()),
        ..Default::default()
    };
    let (facts, _) = crate::state::node::build(&args, &state, &config).expect("facts");
    (expected_service_ports(&state, &config, &facts), facts)
}

/// The drifted dump of the testdata cluster (`testdata/dumps/drifted.nft-c.save`).
pub(crate) fn drifted_dump() -> String {
    read("testdata/dumps/drifted.nft-c.save")
}
