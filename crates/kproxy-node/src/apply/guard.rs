//! Refusals: inputs that look wrong enough that applying them would do more harm than good.
//! Each can be overridden with `--force`. The refusals every mode shares (configured mode,
//! unreadable rules, old state, a kube-proxy writing the same rules) are here once; IPVS mode
//! adds its own in [`super::ipvs::guard`]. (What no `--force` lifts — a plan that would change
//! objects that are not kube-proxy's — is [`super::allow`]'s.)

use crate::model::Ruleset;
use crate::state::config::ProxyConfig;
use crate::state::mode::ProxyMode;
use kproxy_parsers::iptables::Target;
use std::path::PathBuf;
use std::time::Duration;

/// Chains only kube-proxy's IPVS mode creates.
const IPVS_MODE_CHAINS: &[&str] = &[
    "KUBE-LOAD-BALANCER",
    "KUBE-NODE-PORT",
    "KUBE-IPVS-FILTER",
    "KUBE-IPVS-OUT-FILTER",
];

/// The facts the guard looks at.
#[derive(Debug, Clone)]
pub struct GuardInput {
    /// Service ports the state implies on this node.
    pub expected_service_ports: usize,
    /// Endpoints the state implies (summed over service ports).
    pub expected_endpoints: usize,
    /// The configured mode and the state's age.
    pub facts: InputConditions,
}

/// What every guard knows of its inputs besides what they imply on the node.
#[derive(Debug, Clone)]
pub struct InputConditions {
    /// The configured proxy mode (`None`: kube-proxy's default).
    pub configured_mode: Option<ProxyMode>,
    /// Age of the API state (file modification time, bundle time), when known.
    pub state_age: Option<Duration>,
    /// `--max-age`.
    pub max_age: Option<Duration>,
    /// The pid of a kube-proxy process that writes the rules this repair would write (it runs
    /// in the same network namespace of this host), when one does.
    pub kube_proxy_pid: Option<u32>,
}

impl InputConditions {
    /// What the guard knows of inputs read from `config` and the API state files `state_files`
    /// (`-` is stdin, of no age), refused when older than `max_age`.
    pub fn new(config: &ProxyConfig, state_files: &[PathBuf], max_age: Option<Duration>) -> Self {
        InputConditions {
            configured_mode: config.mode,
            state_age: newest_age(state_files),
            max_age,
            kube_proxy_pid: None,
        }
    }

    /// These conditions with the mode a command decided (`pipeline::mode::for_writing`)
    /// standing for the configured one when the configuration names none (the host's tables
    /// selected it).
    pub fn decided(mut self, mode: ProxyMode) -> Self {
        self.configured_mode = self.configured_mode.or(Some(mode));
        self
    }

    /// The refusal when a live kube-proxy writes the same rules: two writers undo each other's
    /// work, and a rollback after the read-back check failed would undo kube-proxy's.
    pub fn writer_refusal(&self) -> Option<String> {
        self.kube_proxy_pid.map(|pid| {
            format!(
                "a kube-proxy process (pid {pid}) is running in the network namespace this repair writes: it writes the same rules; stop it first"
            )
        })
    }

    /// The refusal when kube-proxy is configured for another mode than `wanted` (no mode is
    /// kube-proxy's default, `iptables`); `writes` says what the repair would write.
    pub fn mode_refusal(&self, wanted: ProxyMode, writes: &str) -> Option<String> {
        let mode = ProxyMode::or_default(self.configured_mode);
        (mode != wanted).then(|| {
            format!("kube-proxy is configured for mode \"{mode}\"; this repair writes {writes}")
        })
    }

    /// The refusal when the API state is older than `--max-age`.
    pub fn age_refusal(&self) -> Option<String> {
        match (self.state_age, self.max_age) {
            (Some(age), Some(max)) if age > max => Some(format!(
                "the API state is {}s old, older than --max-age {}s",
                age.as_secs(),
                max.as_secs()
            )),
            _ => None,
        }
    }
}

/// The refusals that veto applying: none when `force` (`--force`).
pub fn unless_forced(force: bool, refusals: impl FnOnce() -> Vec<String>) -> Vec<String> {
    if force { Vec::new() } else { refusals() }
}

/// Age of the newest of `files` (modification time), if they exist.
fn newest_age(files: &[PathBuf]) -> Option<Duration> {
    files
        .iter()
        .filter(|p| p.as_os_str() != "-")
        .filter_map(|p| std::fs::metadata(p).ok()?.modified().ok())
        .max()
        .and_then(|m| m.elapsed().ok())
}

/// Reasons not to apply, one sentence each.
pub fn refusals(input: &GuardInput, current: &Ruleset<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let nat = current.table("nat");
    let chains = |prefix: &str| {
        nat.map_or(0, |t| {
            t.chains
                .iter()
                .filter(|c| c.name.starts_with(prefix))
                .count()
        })
    };
    let node_services = chains("KUBE-SVC-") + chains("KUBE-SVL-");
    let node_endpoints = chains("KUBE-SEP-");
    if input.expected_service_ports == 0 && node_services >= 3 {
        out.push(format!(
            "the API state has no service ports for this node but the node has {node_services} service chains: is the state file complete?"
        ));
    } else if input.expected_endpoints == 0 && node_endpoints >= 3 {
        out.push(format!(
            "the API state has no endpoints but the node has {node_endpoints} endpoint chains: are EndpointSlices missing from the state?"
        ));
    }
    out.extend(
        input
            .facts
            .mode_refusal(ProxyMode::Iptables, "iptables-mode rules"),
    );
    let ipvs_chains = nat.map_or(0, |t| {
        t.chains
            .iter()
            .filter(|c| IPVS_MODE_CHAINS.contains(&c.name))
            .count()
    });
    if ipvs_chains > 0 && node_services == 0 {
        out.push("the node's rules are IPVS-mode rules (KUBE-LOAD-BALANCER/KUBE-NODE-PORT present, no KUBE-SVC chains)".into());
    }
    out.extend(unreadable_refusal(current));
    out.extend(unknown_refusal(current));
    out.extend(input.facts.age_refusal());
    out.extend(input.facts.writer_refusal());
    out
}

/// The refusal when a service port's path in the node's rules holds rules no kube-proxy
/// release this build knows writes (verify's KP406): the node's kube-proxy may be newer than
/// this build, and a plan from the rules this build knows would rewrite them.
pub fn unknown_refusal(current: &Ruleset<'_>) -> Option<String> {
    use crate::graph::iptables::{DumpSummary, build_ruleset};
    let graph = build_ruleset(
        current,
        &DumpSummary::default(),
        &crate::graph::GraphOptions {
            comparison_only: true,
            ..Default::default()
        },
    );
    let unknown: Vec<String> = graph
        .service_ports
        .iter()
        .flat_map(|p| &p.unknown_layout)
        .map(crate::graph::UnknownObject::describe)
        .collect();
    if unknown.is_empty() {
        return None;
    }
    const SHOWN: usize = 3;
    let mut list = unknown.iter().take(SHOWN).cloned().collect::<Vec<_>>();
    if unknown.len() > SHOWN {
        list.push(format!("and {} more", unknown.len() - SHOWN));
    }
    Some(format!(
        "the node's kube-proxy chains hold rules this build does not know ({}): the node's kube-proxy may be newer than this build, and a repair planned from the rules this build knows would rewrite them",
        list.join(", ")
    ))
}

/// The refusal when some of the node's rules are unreadable by this host's iptables.
pub fn unreadable_refusal(current: &Ruleset<'_>) -> Option<String> {
    let unreadable = current
        .tables
        .iter()
        .flat_map(|t| &t.chains)
        .flat_map(|c| &c.rules)
        .filter(|r| matches!(r.rule.target(), Some(Target::Unreadable { .. })))
        .count();
    (unreadable > 0).then(|| format!(
        "{unreadable} rules are unreadable by this host's iptables (userspace/kernel version mismatch): the dump cannot be trusted"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kproxy_parsers::iptables::ParseOptions;

    fn input() -> GuardInput {
        GuardInput {
            expected_service_ports: 5,
            expected_endpoints: 10,
            facts: InputConditions {
                configured_mode: Some(ProxyMode::Iptables),
                state_age: None,
                max_age: None,
                kube_proxy_pid: None,
            },
        }
    }

    const NODE: &str = "*nat\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n:KUBE-SVC-BBBBBBBBBBBBBBBB - [0:0]\n:KUBE-SVC-CCCCCCCCCCCCCCCC - [0:0]\n\
:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]\n:KUBE-SEP-BBBBBBBBBBBBBBBB - [0:0]\n:KUBE-SEP-CCCCCCCCCCCCCCCC - [0:0]\nCOMMIT\n";

    #[test]
    fn sane_inputs_pass() {
        let rs = Ruleset::parse(NODE, &ParseOptions::default()).expect("parses");
        assert!(refusals(&input(), &rs).is_empty());
    }

    #[test]
    fn empty_state_wrong_mode_and_old_state_are_refused() {
        let rs = Ruleset::parse(NODE, &ParseOptions::default()).expect("parses");
        let mut i = input();
        i.expected_service_ports = 0;
        i.facts.configured_mode = Some(ProxyMode::Ipvs);
        i.facts.state_age = Some(Duration::from_secs(7200));
        i.facts.max_age = Some(Duration::from_secs(600));
        i.facts.kube_proxy_pid = Some(4242);
        let r = refusals(&i, &rs);
        assert_eq!(r.len(), 4, "{r:?}");
        assert!(r[3].contains("pid 4242"), "{r:?}");
    }

    #[test]
    fn unreadable_dump_is_refused() {
        let text = "*nat\n:KUBE-SEP-AAAAAAAAAAAAAAAA - [0:0]\n-A KUBE-SEP-AAAAAAAAAAAAAAAA -p tcp -j DNAT [unsupported revision]\nCOMMIT\n";
        let rs = Ruleset::parse(text, &ParseOptions::default()).expect("parses");
        let r = refusals(&input(), &rs);
        assert!(r.iter().any(|m| m.contains("unreadable")), "{r:?}");
    }
}
