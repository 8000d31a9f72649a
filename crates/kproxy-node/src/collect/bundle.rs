//! Support bundles: one node's dumps, the API state and kube-proxy's configuration in one
//! `.tar.gz`, written by `kubectl kproxy collect NODE -o FILE.tar.gz` and read back by every
//! command with `--bundle FILE`.
//!
//! Layout (all under `kproxy-bundle/`):
//!
//! | entry | content |
//! |-------|---------|
//! | `manifest.json` | `{"format":1,"node":…,"collector":…,"config_source":…,"warnings":[…],"created_unix":…,"kube_proxy_image":…}` (the last when the collector saw the kube-proxy pod) |
//! | `state.json` | a `v1 List` of the Services, EndpointSlices, Nodes and ServiceCIDRs (readable by `--state`), with those the API server would reject as served (last) |
//! | `config.conf` | the KubeProxyConfiguration text (readable by `--config`), when known |
//! | `iptables-save.txt`, `ip6tables-save.txt`, `iptables-legacy-save.txt`, `iptables-nft-save.txt`, `ipset-save.txt`, `ipvsadm.txt`, `conntrack.txt` | the dumps that were collected |
//! | `nft-ip-kube-proxy.json`, `nft-ip6-kube-proxy.json` | `nft -j list table ip\|ip6 kube-proxy` (nftables mode), when `nft` ran (empty: the node has no such table) |
//!
//! The format is plain so that a bundle can be unpacked and fed to the offline flags by hand.

use super::{CollectError, DumpKind, NodeSnapshot};
use crate::state::ClusterState;
use std::path::Path;

/// Directory inside the archive.
pub const ROOT: &str = "kproxy-bundle";
/// Current format number.
pub const FORMAT: u32 = 1;
/// Most entries a bundle may hold: the format writes at most 13, so an archive with more is
/// not one (and cannot make a reader walk millions of empty entries).
const MAX_ENTRIES: usize = 64;

/// A bundle's content.
#[derive(Debug, Clone, Default)]
pub struct Bundle {
    /// The node the dumps come from.
    pub node: String,
    /// API state.
    pub state: ClusterState,
    /// KubeProxyConfiguration text and where it came from (`configmap kube-system/kube-proxy`).
    pub config: Option<(String, String)>,
    /// The dumps.
    pub snapshot: NodeSnapshot,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Manifest {
    format: u32,
    node: String,
    collector: String,
    #[serde(default)]
    config_source: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
    #[serde(default)]
    created_unix: u64,
    /// The node's kube-proxy image: which release wrote the rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kube_proxy_image: Option<String>,
}

/// Writes `bundle` to `path` as a gzip-compressed tar.
pub fn write(path: &Path, bundle: &Bundle) -> Result<(), CollectError> {
    let io = |source| CollectError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = std::fs::File::create(path).map_err(io)?;
    let gz = flate2::write::GzEncoder::new(file, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let manifest = Manifest {
        format: FORMAT,
        node: bundle.node.clone(),
        collector: bundle.snapshot.collector.clone(),
        config_source: bundle.config.as_ref().map(|(_, s)| s.clone()),
        warnings: bundle.snapshot.warnings.clone(),
        created_unix: now,
        kube_proxy_image: bundle.snapshot.kube_proxy_image.clone(),
    };
    let bad = |detail: String| CollectError::Bundle {
        path: path.display().to_string(),
        detail,
    };
    let manifest = serde_json::to_vec_pretty(&manifest).map_err(|e| bad(e.to_string()))?;
    append(&mut tar, "manifest.json", &manifest, now).map_err(io)?;
    let state = state_to_list_json(&bundle.state).map_err(|e| bad(e.to_string()))?;
    append(&mut tar, "state.json", &state, now).map_err(io)?;
    if let Some((text, _)) = &bundle.config {
        append(&mut tar, "config.conf", text.as_bytes(), now).map_err(io)?;
    }
    for kind in DumpKind::ALL {
        if let Some(text) = kind.get(&bundle.snapshot) {
            append(&mut tar, kind.file_name(), text.as_bytes(), now).map_err(io)?;
        }
    }
    let gz = tar.into_inner().map_err(io)?;
    let file = gz.finish().map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(())
}

fn append<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    data: &[u8],
    mtime: u64,
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(mtime);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, format!("{ROOT}/{name}"), data)
}

/// Serialises API state as a `v1 List` (the shape of `kubectl get … -o json`).
pub fn state_to_list_json(state: &ClusterState) -> Result<Vec<u8>, serde_json::Error> {
    let mut items = Vec::new();
    for s in &state.services {
        items.push(serde_json::to_value(s)?);
    }
    for s in &state.endpoint_slices {
        items.push(serde_json::to_value(s)?);
    }
    for n in &state.nodes {
        items.push(serde_json::to_value(n)?);
    }
    for c in &state.service_cidrs {
        items.push(serde_json::to_value(c)?);
    }
    // What the API served that the API server would reject: recorded as served, left out
    // again (and reported) when the bundle is read.
    items.extend(state.invalid.iter().map(|o| o.object.clone()));
    serde_json::to_vec_pretty(&serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {},
        "items": items,
    }))
}

/// Reads a bundle written by [`write()`], within the input limits ([`crate::parsers::input`]):
/// the archive as read, and what it unpacks to (every entry, read or skipped), each hold at most
/// the size limit, and it has at most [`MAX_ENTRIES`] entries. An entry that says it is larger
/// than what is left is refused before it is unpacked, so a decompression bomb costs neither
/// the memory nor the time of its content.
pub fn read(path: &Path) -> Result<Bundle, CollectError> {
    use crate::parsers::input::{self, Capped, InputError};
    let shown = path.display().to_string();
    let bad = |detail: String| CollectError::Bundle {
        path: shown.clone(),
        detail,
    };
    let limit = input::limits().max_size;
    let source = input::open(path)?;
    // What the archive unpacks to, under its own name in messages.
    let unpacked = format!("{shown} (unpacked)");
    let mut archive = tar::Archive::new(Capped::new(
        flate2::read::GzDecoder::new(source),
        &unpacked,
        limit,
    ));
    // A limit passed by the archive (as read, or unpacked) is said as such; anything else
    // means the file is not a tar.gz archive.
    let not_archive = |e: InputError| match e {
        InputError::Io { source, .. } => bad(format!("not a tar.gz archive: {source}")),
        limit => limit.into(),
    };
    let archive_error = |e: std::io::Error| not_archive(InputError::from_io(&unpacked, e));
    let mut manifest: Option<Manifest> = None;
    let mut state_text: Option<String> = None;
    let mut config_text: Option<String> = None;
    let mut snapshot = NodeSnapshot::default();
    let mut held = 0u64;
    let entries = archive.entries().map_err(archive_error)?;
    for (i, entry) in entries.enumerate() {
        if i >= MAX_ENTRIES {
            return Err(bad(format!(
                "more than {MAX_ENTRIES} entries: not a kproxy bundle"
            )));
        }
        let mut entry = entry.map_err(archive_error)?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry
            .path()
            .map_err(|e| bad(e.to_string()))?
            .to_string_lossy()
            .into_owned();
        let Some(file_name) = name.strip_prefix(&format!("{ROOT}/")) else {
            continue;
        };
        // Refused by what the header says, before anything of it is unpacked: one entry too
        // large for the limit, or all read so far together.
        let size = entry.header().size().unwrap_or(u64::MAX);
        held = held.saturating_add(size);
        if held > limit {
            let name = if size > limit {
                format!("{shown}:{name}")
            } else {
                unpacked.clone()
            };
            return Err(InputError::TooLarge { name, limit }.into());
        }
        let bytes = input::read_all(
            &mut entry,
            &format!("{shown}:{name}"),
            limit,
            usize::try_from(size).unwrap_or(0),
        )
        .map_err(not_archive)?;
        let text = String::from_utf8(bytes)
            .map_err(|e| bad(format!("{name}: not UTF-8 text: {}", e.utf8_error())))?;
        match file_name {
            "manifest.json" => {
                manifest =
                    Some(serde_json::from_str(&text).map_err(|e| bad(format!("{name}: {e}")))?)
            }
            "state.json" => state_text = Some(text),
            "config.conf" => config_text = Some(text),
            other => {
                if let Some(kind) = DumpKind::ALL.into_iter().find(|k| k.file_name() == other) {
                    *kind.slot(&mut snapshot) = Some(text);
                }
            }
        }
    }
    let manifest =
        manifest.ok_or_else(|| bad(format!("no {ROOT}/manifest.json (not a kproxy bundle)")))?;
    if manifest.format != FORMAT {
        return Err(bad(format!(
            "format {} is not supported (this build reads format {FORMAT})",
            manifest.format
        )));
    }
    let state = match state_text {
        Some(t) => crate::state::load::from_str(&t, &format!("{shown}:{ROOT}/state.json"))
            .map_err(|e| bad(e.to_string()))?,
        None => ClusterState::default(),
    };
    snapshot.collector = format!("bundle ({}, collected by {})", shown, manifest.collector);
    snapshot.warnings = manifest.warnings;
    snapshot.kube_proxy_image = manifest.kube_proxy_image;
    let config = config_text.map(|t| {
        let source = manifest
            .config_source
            .clone()
            .unwrap_or_else(|| "bundle".to_string());
        (t, format!("{source} (from bundle {shown})"))
    });
    Ok(Bundle {
        node: manifest.node,
        state,
        config,
        snapshot,
    })
}
