//! The API server's validation of the objects kube-proxy reads, applied whenever a state is
//! loaded (`--state` files, bundles, the API's lists and watches): an object the API server
//! would have rejected never reaches kube-proxy, so it is left out here too, and recorded in
//! [`ClusterState::invalid`] for `verify` to report (KP014) and `render` to warn of. The rest of
//! the state is used as given: one bad object does not fail the node.
//!
//! The rules are those of `k8s.io/apimachinery/pkg/util/validation` ([`syntax`]) as
//! `pkg/apis/core/validation` (`ValidateService`, `validateServicePort`, `ValidateObjectMeta`)
//! and `pkg/apis/discovery/validation` (`ValidateEndpointSlice`) apply them, for the fields
//! kube-proxy reads. IP addresses and CIDRs are not checked here: the proxier parses them as
//! kube-proxy does (Go's sloppy parser) and skips a bad one with a warning of its own.

mod objects;
pub mod syntax;

use super::{ClusterState, Warning};
use serde::Serialize;

/// An object the API server would have rejected, left out of the state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InvalidObject {
    /// `Service`, `EndpointSlice`, `Node` or `ServiceCIDR`.
    pub kind: &'static str,
    /// `metadata.namespace` ("" for cluster-scoped kinds or when missing).
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// Every field that is invalid, in the object's order (at least one).
    pub problems: Vec<FieldProblem>,
    /// The object as it was given, for a support bundle to record what the API served (reading
    /// the bundle back leaves it out again).
    #[serde(skip)]
    pub object: serde_json::Value,
}

/// One invalid field of an object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FieldProblem {
    /// The field's path (`spec.ports[0].name`).
    pub field: String,
    /// Its value as shown in messages: quoted and escaped, cut when long.
    pub value: String,
    /// The rule it breaks.
    pub reason: &'static str,
}

impl InvalidObject {
    /// `Service ns/name` (names that are not plain text are quoted and escaped, so a message
    /// never carries a line break or a control character from the state).
    pub fn label(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, shown_name(&self.name))
        } else {
            format!(
                "{} {}/{}",
                self.kind,
                shown_name(&self.namespace),
                shown_name(&self.name)
            )
        }
    }

    /// `ns/name` of a Service (as findings name service ports), `None` for other kinds.
    pub fn service(&self) -> Option<String> {
        (self.kind == "Service")
            .then(|| format!("{}/{}", shown_name(&self.namespace), shown_name(&self.name)))
    }

    /// The first invalid field and why, and how many more there are.
    pub fn summary(&self) -> String {
        let Some(first) = self.problems.first() else {
            return String::new();
        };
        let more = match self.problems.len() - 1 {
            0 => String::new(),
            1 => " (and 1 more invalid field)".to_string(),
            n => format!(" (and {n} more invalid fields)"),
        };
        format!("{} {}: {}{more}", first.field, first.value, first.reason)
    }

    /// The warning `render` and the other commands print for it.
    pub fn warning(&self) -> Warning {
        Warning::new(
            self.label(),
            format!(
                "left out: {}; the API server rejects such an object, so kube-proxy never sees it",
                self.summary()
            ),
        )
    }
}

/// Moves every object the API server would reject out of `state` into `state.invalid`, keeping
/// the order of the others.
pub fn leave_out_invalid(state: &mut ClusterState) {
    let mut invalid = Vec::new();
    keep_valid(&mut state.services, objects::service, &mut invalid);
    keep_valid(
        &mut state.endpoint_slices,
        objects::endpoint_slice,
        &mut invalid,
    );
    keep_valid(&mut state.nodes, objects::node, &mut invalid);
    keep_valid(
        &mut state.service_cidrs,
        objects::service_cidr,
        &mut invalid,
    );
    state.invalid.append(&mut invalid);
}

fn keep_valid<T>(
    objects: &mut Vec<T>,
    check: fn(&T) -> Option<InvalidObject>,
    invalid: &mut Vec<InvalidObject>,
) {
    objects.retain(|o| match check(o) {
        Some(bad) => {
            invalid.push(bad);
            false
        }
        None => true,
    });
}

/// The longest value a message shows whole.
const SHOWN_MAX: usize = 64;

/// A name as messages show it: bare when it is plain (what a valid name is made of), else
/// quoted and escaped like [`shown_value`].
fn shown_name(s: &str) -> String {
    let plain = !s.is_empty()
        && s.len() <= SHOWN_MAX
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
    if plain { s.to_string() } else { shown_value(s) }
}

/// A value as messages show it: quoted, with control characters, quotes and backslashes
/// escaped, and cut after its first characters (`…` and the full length then follow).
pub fn shown_value(s: &str) -> String {
    let cut = s
        .char_indices()
        .nth(SHOWN_MAX)
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    let mut out = format!("{:?}", &s[..cut]);
    if cut < s.len() {
        out.push_str(&format!("… ({} bytes)", s.len()));
    }
    out
}

#[cfg(test)]
mod tests;
