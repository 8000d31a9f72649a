//! The large-node inputs of the benches: `target/scale/` made by `testdata/make-scale-dump.sh`
//! (root; a real `iptables-save` of the rendered 10,000 services × 10 endpoints).

use kproxy::compare::iptables::{DumpText, NodePlans, VerifyInput};
use kproxy::state::ClusterState;
use kproxy::state::config::ProxyConfig;
use kproxy::state::ip::IpFamily;
use kproxy::state::node::NodeFacts;
use kproxy_parsers::iptables::ParseOptions;
use std::path::PathBuf;
use std::sync::Arc;

/// The scale inputs, loaded: the API state and config parsed, the dump as text.
pub struct Scale {
    /// `state.json`, parsed.
    pub state: Arc<ClusterState>,
    /// `config.yaml`, parsed.
    pub config: ProxyConfig,
    /// Node facts as `verify node-1 --random-fully true --nfacct none` builds them.
    pub facts: NodeFacts,
    /// `scale.nft.save`.
    pub dump: String,
}

impl Scale {
    /// Loads `target/scale/`; `None` (with a printed hint) when it was not made.
    pub fn load(bench: &str) -> Option<Scale> {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/scale");
        let (Ok(state_text), Ok(config_text), Ok(dump)) = (
            std::fs::read_to_string(dir.join("state.json")),
            std::fs::read_to_string(dir.join("config.yaml")),
            std::fs::read_to_string(dir.join("scale.nft.save")),
        ) else {
            eprintln!(
                "{bench}: {} missing; run `sudo testdata/make-scale-dump.sh` first",
                dir.join("scale.nft.save").display()
            );
            return None;
        };
        let state = kproxy::state::load::from_str(&state_text, "state.json")
            .unwrap_or_else(|e| panic!("{e}"));
        let (config, _) = kproxy::state::config::parse(&config_text, "config.yaml")
            .unwrap_or_else(|e| panic!("{e}"));
        let args = kproxy::state::node::NodeInputs {
            family: Some(kproxy::state::ip::IpFamily::V4),
            nfacct: Some(Vec::new()),
            ..Default::default()
        };
        let (facts, _) =
            kproxy::state::node::build(&args, &state, &config).unwrap_or_else(|e| panic!("{e}"));
        Some(Scale {
            state: Arc::new(state),
            config,
            facts,
            dump,
        })
    }

    /// `verify node-1` of the dump against the state, as the command runs it: kube-proxy's plan
    /// computed on a thread of its own ([`NodePlans::start`]) while verify parses the dump.
    pub fn verify_input(&self) -> VerifyInput<'_> {
        let dumps = vec![DumpText {
            label: "scale.nft.save",
            text: &self.dump,
            family: IpFamily::V4,
        }];
        VerifyInput {
            node: "node-1",
            plans: NodePlans::start(Arc::clone(&self.state), &self.config, &self.facts, &dumps),
            config: &self.config,
            facts: &self.facts,
            dumps,
            legacy: None,
            nft_ruleset: None,
            parse: ParseOptions::strict(),
            group_alike: true,
        }
    }
}
