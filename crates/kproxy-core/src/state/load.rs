//! Loading API objects from files: `kubectl get … -o json|yaml` output (a `List`), single objects,
//! JSON streams and multi-document YAML. `-` reads stdin.
//!
//! Only `Service`, `EndpointSlice`, `Node` and `ServiceCIDR` objects are kept; other kinds are skipped (logged at
//! debug level). Malformed input is an error with `file:line:col`; an object whose fields have the
//! wrong type is an error naming the file, the object and the field path. An object the API
//! server would reject (a name with a quote or a line break, a port out of range) is left out
//! and recorded in [`ClusterState::invalid`] ([`super::validate`]).

use super::ClusterState;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Why state could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The file could not be read, is not text, or is past the input limits.
    #[error(transparent)]
    Input(#[from] kproxy_parsers::input::InputError),
    /// The text is not valid JSON/YAML.
    #[error("{source_name}:{line}:{column}: {message}")]
    Syntax {
        /// File name (or `<stdin>`).
        source_name: String,
        /// 1-based line.
        line: usize,
        /// 1-based column.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The file is something else than API state (a configuration, a dump).
    #[error(
        "{source_name} is {what}, not API state: --state takes the output of `kubectl get services,endpointslices,nodes -A -o json`"
    )]
    NotState {
        /// File name (or `<stdin>`).
        source_name: String,
        /// What the file is, and where it belongs.
        what: String,
    },
    /// An object could not be decoded as its kind.
    #[error("{source_name}: {object}: field `{field}`: {message}")]
    Object {
        /// File name (or `<stdin>`).
        source_name: String,
        /// Where the object is (`items[3] Service ns1/svc1`).
        object: String,
        /// The field path inside the object (`spec.ports[0].port`).
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// Loads and merges every file (`-` = stdin) into one [`ClusterState`], in the given order.
pub fn from_files(paths: &[PathBuf]) -> Result<ClusterState, StateError> {
    let mut state = ClusterState::default();
    for path in paths {
        let (t0, cpu0) = (std::time::Instant::now(), thread_cpu_time());
        let (text, name) = read_source(path)?;
        let part = from_str(&text, &name)?;
        tracing::debug!(
            "state {name}: {} services, {} endpointslices, {} nodes loaded in {:?} (cpu {:?})",
            part.services.len(),
            part.endpoint_slices.len(),
            part.nodes.len(),
            t0.elapsed(),
            thread_cpu_time().saturating_sub(cpu0)
        );
        state.services.extend(part.services);
        state.endpoint_slices.extend(part.endpoint_slices);
        state.nodes.extend(part.nodes);
        state.service_cidrs.extend(part.service_cidrs);
        state.invalid.extend(part.invalid);
    }
    Ok(state)
}

/// CPU time this thread has used so far (`/proc/thread-self/schedstat`; zero where unavailable),
/// for the debug timing lines: wall time means little on a busy machine.
pub fn thread_cpu_time() -> std::time::Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split(' ').next().and_then(|ns| ns.parse::<u64>().ok()))
        .map(std::time::Duration::from_nanos)
        .unwrap_or_default()
}

/// Reads a file, or stdin for `-`, within the input limits ([`kproxy_parsers::input`]); returns
/// the text and the name to use in messages.
pub fn read_source(path: &Path) -> Result<(String, String), StateError> {
    Ok(kproxy_parsers::input::read_text(path)?)
}

/// Parses JSON (one value or a stream of values) or YAML (one or more documents) into values.
pub fn parse_documents(text: &str, source_name: &str) -> Result<Vec<Value>, StateError> {
    let body = text.trim_start_matches('\u{feff}');
    let first = body.trim_start().chars().next();
    if matches!(first, Some('{') | Some('[')) {
        let mut docs = Vec::new();
        for doc in serde_json::Deserializer::from_str(body).into_iter::<Value>() {
            docs.push(doc.map_err(|e| StateError::Syntax {
                source_name: source_name.into(),
                line: e.line(),
                column: e.column(),
                message: strip_json_position(&e.to_string()),
            })?);
        }
        Ok(docs)
    } else {
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(body).map_err(|e| yaml_error(&e, source_name))?;
        Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
    }
}

fn strip_json_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

fn yaml_error(e: &serde_saphyr::Error, source_name: &str) -> StateError {
    let (line, column) = e
        .location()
        .map(|l| (l.line() as usize, l.column() as usize))
        .unwrap_or((0, 0));
    StateError::Syntax {
        source_name: source_name.into(),
        line,
        column,
        message: e.to_string().lines().next().unwrap_or_default().to_string(),
    }
}

/// Parses one text (JSON or YAML) into a [`ClusterState`], leaving out the objects the API
/// server would reject ([`super::validate::leave_out_invalid`]); `source_name` is used in errors.
pub fn from_str(text: &str, source_name: &str) -> Result<ClusterState, StateError> {
    let mut state = decode_all(text, source_name)?;
    super::validate::leave_out_invalid(&mut state);
    Ok(state)
}

/// Every object of one text, as decoded.
///
/// JSON takes the direct decoder (objects decoded straight from the text); when that declines
/// (any error or unusual layout) the text is parsed again through `serde_json::Value`, which gives
/// the precise `file:line:col` / object / field messages.
fn decode_all(text: &str, source_name: &str) -> Result<ClusterState, StateError> {
    if let Some(state) = direct::from_json(text)
        && !state.is_empty()
    {
        return Ok(state);
    }
    let not_state = |what: String| StateError::NotState {
        source_name: source_name.into(),
        what,
    };
    match from_str_via_values(text, source_name) {
        Ok(state) if state.is_empty() => match what_else(text) {
            Some(what) => Err(not_state(what)),
            None => Ok(state),
        },
        Ok(state) => Ok(state),
        Err(e) => Err(what_else(text).map_or(e, not_state)),
    }
}

/// What a file that holds no API objects is, when it is something kproxy knows: a
/// KubeProxyConfiguration, the kube-proxy ConfigMap, a node's dump, or other objects.
fn what_else(text: &str) -> Option<String> {
    let first_kind = |v: &Value| v.get("kind").and_then(Value::as_str).map(str::to_string);
    if let Ok(docs) = parse_documents(text, "") {
        let kinds: Vec<String> = docs.iter().filter_map(first_kind).collect();
        if kinds.iter().any(|k| k == "KubeProxyConfiguration") {
            return Some(
                "a KubeProxyConfiguration (kube-proxy's configuration: pass it as --config)".into(),
            );
        }
        if docs
            .iter()
            .any(|d| d.get("data").and_then(|d| d.get("config.conf")).is_some())
        {
            return Some(
                "a ConfigMap holding kube-proxy's configuration (pass it as --config)".into(),
            );
        }
        if !docs.is_empty() && docs.iter().all(|d| !d.is_object() && !d.is_array()) {
            return Some("plain text, not JSON or YAML objects".into());
        }
        if let Some(k) = kinds.first()
            && !k.ends_with("List")
        {
            return Some(format!(
                "{} object(s) of kind {}",
                kinds.len(),
                kinds.join(", ")
            ));
        }
    }
    let kind = text
        .lines()
        .take(50)
        .find_map(kproxy_parsers::paste::line_kind)?;
    Some(format!("`{}` output (a node's dump)", kind.command()))
}

/// [`from_str`] through `serde_json::Value` / YAML documents: slower, exact error messages.
fn from_str_via_values(text: &str, source_name: &str) -> Result<ClusterState, StateError> {
    let mut state = ClusterState::default();
    for (i, doc) in parse_documents(text, source_name)?.into_iter().enumerate() {
        let path = format!("document[{i}]");
        add_value(&mut state, doc, &path, source_name)?;
    }
    Ok(state)
}

fn object_label(v: &Value, kind: &str, path: &str) -> String {
    let meta = v.get("metadata");
    let name = meta
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let ns = meta
        .and_then(|m| m.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("");
    if ns.is_empty() {
        format!("{path} {kind} {name}")
    } else {
        format!("{path} {kind} {ns}/{name}")
    }
}

fn decode<T: serde::de::DeserializeOwned>(
    v: Value,
    kind: &str,
    path: &str,
    source_name: &str,
) -> Result<T, StateError> {
    let label = object_label(&v, kind, path);
    serde_path_to_error::deserialize::<_, T>(v).map_err(|e| StateError::Object {
        source_name: source_name.into(),
        object: label,
        field: e.path().to_string(),
        message: e.inner().to_string(),
    })
}

fn add_value(
    state: &mut ClusterState,
    v: Value,
    path: &str,
    source_name: &str,
) -> Result<(), StateError> {
    match v {
        Value::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                add_value(state, item, &format!("{path}[{i}]"), source_name)?;
            }
            Ok(())
        }
        Value::Object(mut map) => {
            let kind = map
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string();
            let is_list = kind == "List" || kind.ends_with("List") || kind.is_empty();
            if is_list && let Some(items) = map.remove("items") {
                let base = if path.starts_with("document[0]") && path.len() == 11 {
                    String::new()
                } else {
                    format!("{path}.")
                };
                return match items {
                    Value::Array(items) => {
                        for (i, item) in items.into_iter().enumerate() {
                            add_value(state, item, &format!("{base}items[{i}]"), source_name)?;
                        }
                        Ok(())
                    }
                    Value::Null => Ok(()),
                    _ => Err(StateError::Object {
                        source_name: source_name.into(),
                        object: format!("{path} {kind}"),
                        field: "items".into(),
                        message: "expected a list of objects".into(),
                    }),
                };
            }
            let v = Value::Object(map);
            match kind.as_str() {
                "Service" => state.services.push(decode(v, &kind, path, source_name)?),
                "EndpointSlice" => state
                    .endpoint_slices
                    .push(decode(v, &kind, path, source_name)?),
                "Node" => state.nodes.push(decode(v, &kind, path, source_name)?),
                "ServiceCIDR" => state
                    .service_cidrs
                    .push(decode(v, &kind, path, source_name)?),
                _ => tracing::debug!("{source_name}: {path}: skipping object of kind {kind:?}"),
            }
            Ok(())
        }
        Value::Null => Ok(()),
        _ => Err(StateError::Object {
            source_name: source_name.into(),
            object: path.into(),
            field: String::new(),
            message: "expected an object or a list of objects".into(),
        }),
    }
}

mod direct {
    //! JSON straight into k8s-openapi types, without an intermediate `serde_json::Value` tree.
    //!
    //! An object's keys before `kind` (usually just `apiVersion`) are buffered; once `kind` is
    //! known the rest of the object streams into the right type. Anything unusual (`items` before
    //! `kind`, a repeated key, a non-string `kind`, any error) makes [`from_json`] return `None`
    //! so the caller takes the `Value` path, which has the exact error messages.

    use super::ClusterState;
    use k8s_openapi::api::core::v1::{Node, Service};
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::api::networking::v1::ServiceCIDR;
    use serde::Deserialize;
    use serde::de::{
        DeserializeSeed, Deserializer, Error as _, IgnoredAny, IntoDeserializer, MapAccess,
        SeqAccess, Visitor,
    };
    use serde_json::Value;
    use std::fmt;

    const DECLINE: &str = "kproxy: not the direct path";

    /// Every object of a JSON text (one value or a stream), or `None` to take the slow path.
    pub(super) fn from_json(text: &str) -> Option<ClusterState> {
        let body = text.trim_start_matches('\u{feff}');
        if !matches!(body.trim_start().as_bytes().first(), Some(b'{' | b'[')) {
            return None;
        }
        let mut state = ClusterState::default();
        for part in serde_json::Deserializer::from_str(body).into_iter::<Part>() {
            let part = part.ok()?.0;
            state.services.extend(part.services);
            state.endpoint_slices.extend(part.endpoint_slices);
            state.nodes.extend(part.nodes);
            state.service_cidrs.extend(part.service_cidrs);
        }
        Some(state)
    }

    /// The objects of one top-level JSON value.
    struct Part(ClusterState);

    impl<'de> Deserialize<'de> for Part {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let mut state = ClusterState::default();
            Objects(&mut state).deserialize(d)?;
            Ok(Part(state))
        }
    }

    /// Adds the objects of a value (an object, a `…List`, an array of them, or null) to the state.
    struct Objects<'s>(&'s mut ClusterState);

    impl<'de> DeserializeSeed<'de> for Objects<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Objects<'_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("an object or a list of objects")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
            Ok(())
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element_seed(Objects(&mut *self.0))?.is_some() {}
            Ok(())
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut before: Vec<(String, Value)> = Vec::new();
            let kind = loop {
                let Some(key) = map.next_key::<String>()? else {
                    // No `kind`: a list without items is nothing; with items, the slow path.
                    if before.iter().any(|(k, _)| k == "items") {
                        return Err(A::Error::custom(DECLINE));
                    }
                    return Ok(());
                };
                if key == "items" {
                    // `kubectl get -o json` prints `items` before `kind` (its keys are sorted).
                    return items_first(map, self.0);
                }
                let value: Value = map.next_value()?;
                if key == "kind" {
                    let Some(kind) = value.as_str().map(str::to_string) else {
                        return Err(A::Error::custom(DECLINE));
                    };
                    before.push((key, value));
                    break kind;
                }
                before.push((key, value));
            };
            let is_list = kind == "List" || kind.ends_with("List") || kind.is_empty();
            if is_list {
                let mut seen_items = false;
                while let Some(key) = map.next_key::<String>()? {
                    if key == "kind" || (key == "items" && seen_items) {
                        return Err(A::Error::custom(DECLINE));
                    }
                    if key == "items" {
                        seen_items = true;
                        map.next_value_seed(Items(&mut *self.0))?;
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                if seen_items {
                    return Ok(());
                }
                // A list kind without items: nothing to keep (as for any other kind).
                tracing::debug!("skipping object of kind {kind:?}");
                return Ok(());
            }
            let rest = Chained {
                before: before.into_iter(),
                pending: None,
                inner: map,
            };
            let whole = serde::de::value::MapAccessDeserializer::new(rest);
            match kind.as_str() {
                "Service" => self.0.services.push(Service::deserialize(whole)?),
                "EndpointSlice" => self
                    .0
                    .endpoint_slices
                    .push(EndpointSlice::deserialize(whole)?),
                "Node" => self.0.nodes.push(Node::deserialize(whole)?),
                "ServiceCIDR" => self.0.service_cidrs.push(ServiceCIDR::deserialize(whole)?),
                _ => {
                    tracing::debug!("skipping object of kind {kind:?}");
                    IgnoredAny::deserialize(whole)?;
                }
            }
            Ok(())
        }
    }

    /// The rest of an object whose `items` came before its `kind` (the value of `items` is next):
    /// decodes the items, then accepts the object only if its `kind` is a list kind.
    fn items_first<'de, A: MapAccess<'de>>(
        mut map: A,
        state: &mut ClusterState,
    ) -> Result<(), A::Error> {
        let mut items = ClusterState::default();
        map.next_value_seed(Items(&mut items))?;
        let mut list_kind = false;
        while let Some(key) = map.next_key::<String>()? {
            if key == "items" {
                return Err(A::Error::custom(DECLINE));
            }
            if key == "kind" {
                let kind: Value = map.next_value()?;
                match kind.as_str() {
                    Some(k) if k == "List" || k.ends_with("List") => list_kind = true,
                    _ => return Err(A::Error::custom(DECLINE)),
                }
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        if !list_kind {
            return Err(A::Error::custom(DECLINE));
        }
        state.services.extend(items.services);
        state.endpoint_slices.extend(items.endpoint_slices);
        state.nodes.extend(items.nodes);
        state.service_cidrs.extend(items.service_cidrs);
        Ok(())
    }

    /// A list's `items`: an array of objects, or null.
    struct Items<'s>(&'s mut ClusterState);

    impl<'de> DeserializeSeed<'de> for Items<'_> {
        type Value = ();
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Items<'_> {
        type Value = ();

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of objects")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
            Ok(())
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            while seq.next_element_seed(Objects(&mut *self.0))?.is_some() {}
            Ok(())
        }
    }

    /// The buffered entries of an object, then the rest of it from the parser.
    struct Chained<I, A> {
        before: I,
        pending: Option<Value>,
        inner: A,
    }

    impl<'de, I, A> MapAccess<'de> for Chained<I, A>
    where
        I: Iterator<Item = (String, Value)>,
        A: MapAccess<'de>,
    {
        type Error = A::Error;

        fn next_key_seed<K: DeserializeSeed<'de>>(
            &mut self,
            seed: K,
        ) -> Result<Option<K::Value>, A::Error> {
            if let Some((key, value)) = self.before.next() {
                self.pending = Some(value);
                let key: serde::de::value::StringDeserializer<A::Error> = key.into_deserializer();
                return seed.deserialize(key).map(Some);
            }
            self.inner.next_key_seed(seed)
        }

        fn next_value_seed<V: DeserializeSeed<'de>>(
            &mut self,
            seed: V,
        ) -> Result<V::Value, A::Error> {
            match self.pending.take() {
                Some(value) => seed.deserialize(value).map_err(A::Error::custom),
                None => self.inner.next_value_seed(seed),
            }
        }
    }
}

/// The objects of one kind, handy for tests: services by `ns/name`.
pub fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or(""),
        svc.metadata.name.as_deref().unwrap_or("")
    )
}

/// `ns/name` of an EndpointSlice.
pub fn slice_key(slice: &EndpointSlice) -> String {
    format!(
        "{}/{}",
        slice.metadata.namespace.as_deref().unwrap_or(""),
        slice.metadata.name.as_deref().unwrap_or("")
    )
}

/// The name of a Node.
pub fn node_key(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

/// A Service's `status.loadBalancer.ingress` (none when absent).
pub fn load_balancer_ingress(svc: &Service) -> &[LoadBalancerIngress] {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIST: &str = r#"{"apiVersion":"v1","kind":"List","items":[
 {"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"ns"},"spec":{"clusterIP":"10.0.0.1","ports":[{"port":80}]}},
 {"apiVersion":"discovery.k8s.io/v1","kind":"EndpointSlice","metadata":{"name":"a-1","namespace":"ns"},"addressType":"IPv4","endpoints":[]},
 {"apiVersion":"v1","kind":"Node","metadata":{"name":"n1"}},
 {"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}
]}"#;

    /// The direct JSON path and the `Value` path agree, whatever the key order and nesting.
    #[test]
    fn direct_json_matches_value_path() {
        let kind_last = r#"{"items":[
 {"metadata":{"name":"b","namespace":"ns"},"spec":{"clusterIP":"10.0.0.2","ports":[{"port":81,"protocol":"UDP"}]},"apiVersion":"v1","kind":"Service"},
 [{"apiVersion":"v1","kind":"Node","metadata":{"name":"n2"}}, null]
],"kind":"List"}"#;
        let stream = format!("{LIST}\n{LIST}\n[{LIST}]");
        for text in [LIST, kind_last, stream.as_str(), "{}", "[]", "null"] {
            let slow = from_str_via_values(text, "t.json").unwrap_or_else(|e| panic!("{e}"));
            let fast = from_str(text, "t.json").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                (fast.services, fast.endpoint_slices, fast.nodes),
                (slow.services, slow.endpoint_slices, slow.nodes),
                "{text}"
            );
        }
        // The direct path itself took the common layouts, including kubectl's (`items` first).
        assert!(direct::from_json(LIST).is_some());
        let kubectl = LIST
            .replace(r#""kind":"List","items":"#, r#""items":"#)
            .replace(
                "\n]}",
                "\n],\"kind\":\"List\",\"metadata\":{\"resourceVersion\":\"\"}}",
            );
        assert!(kubectl.find("\"items\"") < kubectl.rfind("\"kind\":\"List\""));
        let direct = direct::from_json(&kubectl).map(|s| (s.services, s.endpoint_slices, s.nodes));
        let slow = from_str_via_values(&kubectl, "t.json").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            direct,
            Some((slow.services, slow.endpoint_slices, slow.nodes))
        );
        assert!(direct::from_json(kind_last).is_some());
        // `items` first but not a list kind: left to the `Value` path.
        assert!(direct::from_json(r#"{"items":[],"kind":"Service"}"#).is_none());
        assert_eq!(
            direct::from_json(&format!("{LIST}\n{LIST}")).map(|s| s.services.len()),
            Some(2)
        );
    }

    #[test]
    fn json_list() {
        let s = from_str(LIST, "f.json").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (s.services.len(), s.endpoint_slices.len(), s.nodes.len()),
            (1, 1, 1)
        );
    }

    #[test]
    fn yaml_multi_document() {
        let y = "apiVersion: v1\nkind: Service\nmetadata: {name: a, namespace: ns}\nspec:\n  clusterIP: 10.0.0.1\n---\napiVersion: v1\nkind: Node\nmetadata:\n  name: n1\n";
        let s = from_str(y, "f.yaml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((s.services.len(), s.nodes.len()), (1, 1));
    }

    #[test]
    fn malformed_json_has_line_and_column() {
        let e = from_str("{\n  \"kind\": \"List\",\n  \"items\": [,]\n}", "bad.json")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("bad.json:3:"), "{e}");
    }

    #[test]
    fn malformed_yaml_has_line_and_column() {
        let e = from_str("kind: Service\nmetadata:\n  name: [a\n", "bad.yaml")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("bad.yaml:"), "{e}");
        let pos: Vec<&str> = e.split(':').take(3).collect();
        assert!(
            pos.len() == 3 && pos[1].parse::<usize>().map(|l| l > 0).unwrap_or(false),
            "{e}"
        );
    }

    #[test]
    fn wrong_type_names_object_and_field() {
        let j = r#"{"kind":"List","items":[{"apiVersion":"v1","kind":"Service","metadata":{"name":"a","namespace":"ns"},"spec":{"ports":[{"port":"eighty"}]}}]}"#;
        let e = from_str(j, "s.json")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.contains("s.json"), "{e}");
        assert!(e.contains("items[0] Service ns/a"), "{e}");
        assert!(e.contains("spec.ports[0].port"), "{e}");
    }
}
