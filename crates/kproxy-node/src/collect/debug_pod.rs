//! The `debug-pod` collector: a short-lived privileged hostNetwork pod pinned to the node
//! (`spec.nodeName`, tolerating every taint) whose image has iptables, ipset and ipvsadm.
//! It runs `sleep` (argv, no shell) and the dump commands are exec'd into it; the pod is
//! deleted afterwards whatever happened, Ctrl-C included, and has an
//! `activeDeadlineSeconds` so that a killed process leaves nothing running for long.

use super::exec::PodExec;
use super::{CollectError, NodeSnapshot};
use crate::kube_client::{ApiCall, ApiError, Connection};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, PostParams};
use std::time::Duration;

/// Default image: has iptables (nft and legacy), ip6tables, ipset and ipvsadm.
pub const DEFAULT_IMAGE: &str = "docker.io/nicolaka/netshoot:v0.13";
/// Namespace the debug pod is created in (privileged pods are normally allowed there).
pub const DEBUG_NAMESPACE: &str = "kube-system";
/// Label put on debug pods, so leftovers can be found: `kubectl delete pod -A -l kproxy.io/debug=true`.
pub const DEBUG_LABEL: (&str, &str) = ("kproxy.io/debug", "true");
/// The pod kills itself after this many seconds.
pub const ACTIVE_DEADLINE_SECONDS: i64 = 900;

/// A pod name for `node`: `kproxy-debug-<node>-<suffix>`, at most 63 characters.
pub fn pod_name(node: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write(node.as_bytes());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    let suffix = format!("{:05x}", h.finish() & 0xfffff);
    let clean: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    let max_node = 63 - "kproxy-debug-".len() - 1 - suffix.len();
    let node_part: String = clean.chars().take(max_node).collect();
    format!("kproxy-debug-{}-{suffix}", node_part.trim_matches('-'))
}

/// The debug pod object.
pub fn pod_spec(name: &str, node: &str, image: &str) -> Result<Pod, serde_json::Error> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": DEBUG_NAMESPACE,
            "labels": { DEBUG_LABEL.0: DEBUG_LABEL.1 },
        },
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "activeDeadlineSeconds": ACTIVE_DEADLINE_SECONDS,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{ "operator": "Exists" }],
            "containers": [{
                "name": "kproxy",
                "image": image,
                "command": ["sleep", ACTIVE_DEADLINE_SECONDS.to_string()],
                "securityContext": { "privileged": true },
            }],
        },
    }))
}

/// A debug pod on a node: [`DebugPod::start`] it, exec into it with [`DebugPod::runner`] for
/// as long as needed (a collection, a whole remote repair), then [`DebugPod::delete`] it —
/// whatever happened, a failed start included.
#[derive(Debug)]
pub struct DebugPod {
    api: Api<Pod>,
    runner: PodExec,
    node: String,
    image: String,
}

impl DebugPod {
    /// Picks the pod's name; nothing is created yet.
    pub fn new(conn: &Connection, node: &str, image: &str) -> DebugPod {
        DebugPod {
            api: Api::<Pod>::namespaced(conn.client.clone(), DEBUG_NAMESPACE),
            runner: PodExec {
                conn: conn.clone(),
                namespace: DEBUG_NAMESPACE.into(),
                pod: pod_name(node),
                container: Some("kproxy".into()),
            },
            node: node.to_string(),
            image: image.to_string(),
        }
    }

    /// Creates the pod and waits (at least a minute, or `exec_timeout`) until it runs.
    pub async fn start(&self, exec_timeout: Duration) -> Result<(), CollectError> {
        create_and_wait(
            &self.runner.conn,
            &self.api,
            &self.runner.pod,
            &self.node,
            &self.image,
            exec_timeout,
        )
        .await
    }

    /// Runs commands in the pod's container.
    pub fn runner(&self) -> &PodExec {
        &self.runner
    }

    /// `debug-pod (kube-system/NAME, IMAGE)`, for messages and snapshots.
    pub fn label(&self) -> String {
        format!(
            "debug-pod ({DEBUG_NAMESPACE}/{}, {})",
            self.runner.pod, self.image
        )
    }

    /// Deletes the pod (one that does not exist counts as deleted).
    pub async fn delete(&self) -> Result<(), ApiError> {
        delete(&self.runner.conn, &self.api, &self.runner.pod).await
    }
}

/// The `debug-pod` collector (see the module docs).
pub async fn collect(
    conn: &Connection,
    node: &str,
    image: &str,
    exec_timeout: Duration,
) -> Result<NodeSnapshot, CollectError> {
    let pod = DebugPod::new(conn, node, image);
    let work = async {
        pod.start(exec_timeout).await?;
        super::collect_with(pod.runner(), &pod.label(), exec_timeout).await
    };
    let result = tokio::select! {
        r = work => r,
        _ = tokio::signal::ctrl_c() => Err(CollectError::Interrupted),
    };
    let deleted = pod.delete().await;
    match (result, deleted) {
        (Ok(mut snap), Err(e)) => {
            snap.warnings.push(format!(
                "could not delete debug pod {DEBUG_NAMESPACE}/{}: {e} (delete it by hand)",
                pod.runner.pod
            ));
            Ok(snap)
        }
        (r, _) => r,
    }
}

async fn create_and_wait(
    conn: &Connection,
    api: &Api<Pod>,
    name: &str,
    node: &str,
    image: &str,
    exec_timeout: Duration,
) -> Result<(), CollectError> {
    let spec = pod_spec(name, node, image).map_err(|e| CollectError::DebugPod {
        namespace: DEBUG_NAMESPACE.into(),
        name: name.into(),
        node: node.into(),
        detail: e.to_string(),
    })?;
    api.create(&PostParams::default(), &spec)
        .await
        .map_err(|e| {
            ApiError::classify(
                e,
                ApiCall::new("create", "pods")
                    .in_namespace(DEBUG_NAMESPACE)
                    .named(name),
                &conn.server,
            )
        })?;
    wait_running(
        conn,
        api,
        name,
        node,
        exec_timeout.max(Duration::from_secs(60)),
    )
    .await
}

async fn wait_running(
    conn: &Connection,
    api: &Api<Pod>,
    name: &str,
    node: &str,
    limit: Duration,
) -> Result<(), CollectError> {
    let fail = |detail: String| CollectError::DebugPod {
        namespace: DEBUG_NAMESPACE.into(),
        name: name.into(),
        node: node.into(),
        detail,
    };
    let started = tokio::time::Instant::now();
    loop {
        let pod = api.get(name).await.map_err(|e| {
            ApiError::classify(
                e,
                ApiCall::new("get", "pods")
                    .in_namespace(DEBUG_NAMESPACE)
                    .named(name),
                &conn.server,
            )
        })?;
        let status = pod.status.unwrap_or_default();
        match status.phase.as_deref() {
            Some("Running") => return Ok(()),
            Some(p @ ("Failed" | "Succeeded")) => {
                return Err(fail(format!(
                    "phase {p}{}",
                    status.message.map(|m| format!(": {m}")).unwrap_or_default()
                )));
            }
            _ => {}
        }
        if started.elapsed() > limit {
            let waiting = status
                .container_statuses
                .unwrap_or_default()
                .into_iter()
                .filter_map(|c| c.state.and_then(|s| s.waiting))
                .map(|w| {
                    format!(
                        "{}{}",
                        w.reason.unwrap_or_default(),
                        w.message.map(|m| format!(": {m}")).unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            return Err(fail(format!("still pending after {limit:?} {waiting}")));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn delete(conn: &Connection, api: &Api<Pod>, name: &str) -> Result<(), ApiError> {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(e) => match ApiError::classify(
            e,
            ApiCall::new("delete", "pods")
                .in_namespace(DEBUG_NAMESPACE)
                .named(name),
            &conn.server,
        ) {
            ApiError::NotFound { .. } => Ok(()),
            other => Err(other),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_valid_dns_labels() {
        let n =
            pod_name("Very.Long_node-name-that-goes-on-and-on-and-on-and-on-forever-1234567890");
        assert!(n.len() <= 63, "{n}");
        assert!(n.starts_with("kproxy-debug-very-long-node"));
        assert!(
            n.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }

    #[test]
    fn spec_is_privileged_hostnetwork_pinned() {
        let p = pod_spec("x", "node-1", DEFAULT_IMAGE).ok();
        let spec = p.and_then(|p| p.spec);
        assert_eq!(
            spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some("node-1")
        );
        assert_eq!(spec.as_ref().and_then(|s| s.host_network), Some(true));
    }
}
