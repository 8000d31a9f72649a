//! `trace`'s path view of a service: kube-proxy's plan for the node, made from the API state,
//! which the node's rules are shown against (`kproxy_analysis::trace::path`).

use super::Note;
use crate::proxier::iptables::{ServiceDecisions, expected_service_ports};
use crate::state::config::ProxyConfig;
use crate::state::node::{self, NodeError, NodeInputs};
use crate::state::version::{KubeProxyVersion, VersionError};
use crate::state::{ClusterState, Warning};

/// kube-proxy's plan for a node, and the node's name.
#[derive(Debug)]
pub struct PathPlan {
    /// What kube-proxy decides for each service port.
    pub decisions: ServiceDecisions,
    /// The node planned for.
    pub node: String,
}

/// Why no plan was made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The node facts could not be built.
    #[error(transparent)]
    Facts(#[from] NodeError),
    /// The node's kube-proxy image is of a release newer than this build: never explained as
    /// the newest known release, its rules may be laid out otherwise.
    #[error("the kube-proxy pod runs {image}: {reason}")]
    NewerRelease {
        /// The pod's image.
        image: String,
        /// The version error, naming the newest release this build knows.
        reason: VersionError,
    },
}

/// kube-proxy's plan for the node of `given` from `state` and `config`, in the release
/// `given.kube_proxy_version`, else the one the node's kube-proxy `image` runs (an image this
/// build cannot read is a warning: then the default release is planned; one of a newer release
/// is refused).
pub fn plan(
    state: &ClusterState,
    config: &ProxyConfig,
    given: &NodeInputs,
    image: Option<&str>,
    notes: &mut Vec<Note>,
) -> Result<PathPlan, PlanError> {
    let mut given = given.clone();
    if let (None, Some(image)) = (given.kube_proxy_version, image) {
        match KubeProxyVersion::from_image(image) {
            Ok(v) => given.kube_proxy_version = Some(v),
            Err(reason @ VersionError::TooNew(_)) => {
                return Err(PlanError::NewerRelease {
                    image: image.to_string(),
                    reason,
                });
            }
            Err(e) => notes.push(Note::Warning(
                Warning::new("kube-proxy version", e.to_string()).to_string(),
            )),
        }
    }
    let (facts, warnings) = node::build(&given, state, config)?;
    notes.extend(warnings.iter().map(|w| Note::Warning(w.to_string())));
    Ok(PathPlan {
        decisions: expected_service_ports(state, config, &facts),
        node: facts.node_name,
    })
}
