//! Which kube-proxy release a job compares a node's rules with, or writes: the one given, else
//! the one the node's kube-proxy image runs, else the one its rules show
//! ([`crate::compare::version`] reads them).

use crate::compare::version::{self, Inference, NewerRelease, ReleaseChoice};
use crate::state::node::{NFACCT_CT_STATE_INVALID, NodeInputs};

/// The release a job works with: `given.kube_proxy_version`, else the node's kube-proxy
/// `image`'s, else the one the node's `rules` show (their texts; `None`: not looked at, when
/// reading them costs and a release is given). `verb` (`verifying`, `repairing`) says in the
/// choice's notes what the release is for. An image of a release newer than this build is
/// refused ([`NewerRelease`]), never taken for the newest known.
pub fn choose<'t>(
    given: &NodeInputs,
    image: Option<&str>,
    rules: Option<impl IntoIterator<Item = &'t str>>,
    verb: &str,
) -> Result<ReleaseChoice, NewerRelease> {
    // An INVALID drop without the counter means something only when the node has the counter.
    let counted = given
        .nfacct
        .as_ref()
        .is_some_and(|c| c.iter().any(|c| c == NFACCT_CT_STATE_INVALID));
    let inference = match rules {
        Some(texts) => version::infer(texts).given_invalid_counter(counted),
        None => Inference::default(),
    };
    version::choose_release(given.kube_proxy_version, image, inference, verb)
}
