//! KP014: the objects of the API state that loading left out because the API server would
//! have rejected them ([`crate::state::validate`]). kube-proxy never sees such an object, so
//! its rules are not expected; the rest of the node is verified as usual.

use super::catalogue as cat;
use super::finding::Finding;
use crate::state::validate::InvalidObject;

/// One finding per object left out, naming it and its first invalid field.
pub fn findings(invalid: &[InvalidObject]) -> Vec<Finding> {
    invalid
        .iter()
        .map(|o| {
            let f = cat::INVALID_OBJECT
                .finding(format!("{} left out: {}", o.label(), o.summary()))
                .expected("an object the API server accepts")
                .actual(
                    o.problems
                        .first()
                        .map(|p| format!("{} {}", p.field, p.value))
                        .unwrap_or_default(),
                );
            match o.service() {
                Some(service) => f.service(service),
                None => f,
            }
        })
        .collect()
}
