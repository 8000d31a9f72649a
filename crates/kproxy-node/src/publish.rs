//! What the monitor tells the API about its node: Events on the Node (through kube-rs's event
//! recorder, which turns a repeat of the same event within minutes into a series on one Event
//! object) and one node condition (a strategic-merge patch of `nodes/status`, which merges
//! conditions by type and so leaves the kubelet's own alone). With `crate::collect` and
//! `crate::kube_client`, the only code that calls the API; this is the only code that writes to
//! it on the monitor's behalf.

use crate::kube_client::{ApiCall, ApiError, Connection};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The reporting controller named on the Events (`reportingController` must look like a
/// domain-qualified name).
pub const CONTROLLER: &str = "kproxy.dev/monitor";

/// One node condition, as the monitor sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// The condition type, e.g. `KubeProxyRulesInSync`.
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: &'static str,
    /// A CamelCase reason.
    pub reason: String,
    /// One human-readable line.
    pub message: String,
    /// RFC 3339 time the status last changed (kept by the caller across patches).
    pub last_transition: String,
    /// RFC 3339 time of this report.
    pub heartbeat: String,
}

/// Publishes Events and the condition of one Node.
pub struct NodePublisher {
    conn: Connection,
    node: String,
    recorder: Recorder,
}

impl NodePublisher {
    /// A publisher for `node`; `instance` names this agent on its Events (its pod name).
    pub fn new(conn: Connection, node: &str, instance: Option<String>) -> NodePublisher {
        let reporter = Reporter {
            controller: CONTROLLER.to_string(),
            instance: instance.or_else(|| Some(node.to_string())),
        };
        NodePublisher {
            recorder: Recorder::new(conn.client.clone(), reporter),
            conn,
            node: node.to_string(),
        }
    }

    /// The Node as Events name it: `kubectl describe node` finds Events whose object has the
    /// node's name as its uid (as the kubelet's own node Events do).
    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            uid: Some(self.node.clone()),
            ..ObjectReference::default()
        }
    }

    /// Publishes one Event on the Node (`warning`: type Warning, else Normal).
    pub async fn event(
        &self,
        warning: bool,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), ApiError> {
        let ev = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            // The Events API refuses notes over 1 kB.
            note: Some(crate::collect::shorten(note, 1000)),
            action: action.to_string(),
            secondary: None,
        };
        self.recorder
            .publish(&ev, &self.reference())
            .await
            .map_err(|e| {
                let mut call = ApiCall::new("create", "events.events.k8s.io");
                call.namespace = Some("default".into());
                ApiError::classify(e, call, &self.conn.server)
            })
    }

    /// Sets `condition` on the Node's status, leaving its other conditions as they are.
    pub async fn set_condition(&self, condition: &Condition) -> Result<(), ApiError> {
        let patch = serde_json::json!({
            "status": {"conditions": [{
                "type": condition.type_,
                "status": condition.status,
                "reason": condition.reason,
                "message": condition.message,
                "lastTransitionTime": condition.last_transition,
                "lastHeartbeatTime": condition.heartbeat,
            }]}
        });
        Api::<Node>::all(self.conn.client.clone())
            .patch_status(
                &self.node,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .map(|_| ())
            .map_err(|e| {
                let call = ApiCall::new("patch", "nodes/status").named(&self.node);
                ApiError::classify(e, call, &self.conn.server)
            })
    }
}
