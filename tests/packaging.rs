//! Release packaging: `krew-manifest.yaml` against krew's validation rules
//! (kubernetes-sigs/krew `internal/index/validation/validate.go` and the plugin-manifest docs,
//! summarised in `../shared/docs/ecosystem-notes.md` §2a), `LICENSE`, and `scripts/package.sh`.

use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Plugin {
    api_version: String,
    kind: String,
    metadata: Metadata,
    spec: Spec,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Metadata {
    name: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Spec {
    version: String,
    homepage: Option<String>,
    short_description: String,
    description: Option<String>,
    caveats: Option<String>,
    platforms: Vec<Platform>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Platform {
    selector: Option<Selector>,
    uri: String,
    sha256: String,
    bin: String,
    files: Option<Vec<FileOp>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Selector {
    match_labels: Option<BTreeMap<String, String>>,
    match_expressions: Option<Vec<Requirement>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Requirement {
    key: String,
    operator: String,
    values: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileOp {
    from: Option<String>,
    to: Option<String>,
}

/// Every krew rule a manifest breaks (empty = valid).
fn krew_violations(text: &str) -> Vec<String> {
    let plugin: Plugin = match serde_saphyr::from_str(text) {
        Ok(p) => p,
        Err(e) => return vec![format!("not a krew Plugin manifest: {e}")],
    };
    let mut v = Vec::new();
    let name = &plugin.metadata.name;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        v.push(format!("name {name:?} does not match ^[\\w-]+$"));
    }
    if is_windows_reserved(name) {
        v.push(format!("name {name:?} is a Windows reserved name"));
    }
    if plugin.api_version != "krew.googlecontainertools.github.com/v1alpha2" {
        v.push(format!("apiVersion {:?}", plugin.api_version));
    }
    if plugin.kind != "Plugin" {
        v.push(format!("kind {:?}", plugin.kind));
    }
    let short = &plugin.spec.short_description;
    if short.trim().is_empty() {
        v.push("shortDescription is empty".into());
    }
    if short.contains(['\r', '\n']) {
        v.push("shortDescription has a line break".into());
    }
    if short.chars().count() > 50 {
        v.push(format!(
            "shortDescription is {} characters (krew asks for <= 50)",
            short.chars().count()
        ));
    }
    for (field, text) in [
        ("description", &plugin.spec.description),
        ("caveats", &plugin.spec.caveats),
    ] {
        for line in text.iter().flat_map(|t| t.lines()) {
            if line.chars().count() > 80 {
                v.push(format!("{field} line longer than 80 columns: {line:?}"));
            }
        }
    }
    if !is_semver_with_v(&plugin.spec.version) {
        v.push(format!(
            "version {:?} is not semver with a leading v",
            plugin.spec.version
        ));
    }
    if plugin.spec.platforms.is_empty() {
        v.push("no platforms".into());
    }
    for (i, p) in plugin.spec.platforms.iter().enumerate() {
        if p.uri.is_empty() {
            v.push(format!("platform {i}: empty uri"));
        }
        if p.sha256.len() != 64 || !p.sha256.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')) {
            v.push(format!(
                "platform {i}: sha256 {:?} does not match ^[a-f0-9]{{64}}$",
                p.sha256
            ));
        }
        if p.bin.is_empty() {
            v.push(format!("platform {i}: empty bin"));
        }
        let keys = selector_keys(p.selector.as_ref());
        if keys.is_empty() {
            v.push(format!("platform {i}: nil or empty selector"));
        }
        for r in p
            .selector
            .iter()
            .flat_map(|s| s.match_expressions.iter().flatten())
        {
            let has_values = r.values.as_ref().is_some_and(|v| !v.is_empty());
            let ok = match r.operator.as_str() {
                "In" | "NotIn" => has_values,
                "Exists" | "DoesNotExist" => !has_values,
                _ => false,
            };
            if !ok {
                v.push(format!(
                    "platform {i}: bad selector requirement {} {}",
                    r.key, r.operator
                ));
            }
        }
        for k in keys.iter().filter(|k| *k != "os" && *k != "arch") {
            v.push(format!(
                "platform {i}: selector key {k:?} (only os/arch allowed)"
            ));
        }
        if let Some(files) = &p.files {
            if files.is_empty() {
                v.push(format!("platform {i}: files is empty"));
            }
            for f in files {
                if f.from.as_deref().unwrap_or("").is_empty()
                    || f.to.as_deref().unwrap_or("").is_empty()
                {
                    v.push(format!("platform {i}: file operation without from/to"));
                }
            }
        }
    }
    v
}

fn selector_keys(selector: Option<&Selector>) -> Vec<String> {
    let Some(s) = selector else { return Vec::new() };
    let labels = s.match_labels.iter().flat_map(|m| m.keys().cloned());
    let exprs = s.match_expressions.iter().flatten().map(|r| r.key.clone());
    labels.chain(exprs).collect()
}

fn is_windows_reserved(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    ["CON", "PRN", "AUX", "NUL"].contains(&upper.as_str())
        || ["COM", "LPT"].iter().any(|p| {
            upper
                .strip_prefix(p)
                .is_some_and(|n| n.len() == 1 && n.chars().all(|c| c.is_ascii_digit() && c != '0'))
        })
}

/// `v` + semver 2.0: MAJOR.MINOR.PATCH with no leading zeros, optional `-pre` and `+build`.
fn is_semver_with_v(version: &str) -> bool {
    let Some(rest) = version.strip_prefix('v') else {
        return false;
    };
    let (rest, build) = match rest.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (rest, None),
    };
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) => (c, Some(p)),
        None => (rest, None),
    };
    let numeric = |s: &str| {
        !s.is_empty() && s.chars().all(|c| c.is_ascii_digit()) && (s == "0" || !s.starts_with('0'))
    };
    let ident = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-');
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| numeric(p))
        && pre.is_none_or(|p| {
            p.split('.')
                .all(|i| ident(i) && (!i.chars().all(|c| c.is_ascii_digit()) || numeric(i)))
        })
        && build.is_none_or(|b| b.split('.').all(ident))
}

fn manifest_text() -> String {
    let path = repo().join("krew-manifest.yaml");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn krew_manifest_passes_krew_validation() {
    let violations = krew_violations(&manifest_text());
    assert!(
        violations.is_empty(),
        "krew-manifest.yaml:\n{}",
        violations.join("\n")
    );
}

#[test]
fn krew_manifest_matches_the_project() {
    let plugin: Plugin = serde_saphyr::from_str(&manifest_text()).expect("manifest parses");
    assert_eq!(plugin.metadata.name, "kproxy");
    assert_eq!(
        plugin.spec.version,
        format!("v{}", env!("CARGO_PKG_VERSION")),
        "manifest version vs Cargo.toml"
    );
    assert!(
        plugin
            .spec
            .homepage
            .as_deref()
            .is_some_and(|h| h.starts_with("https://"))
    );
    let caveats = plugin.spec.caveats.unwrap_or_default();
    assert!(
        caveats.contains("RBAC") && caveats.contains("exec"),
        "caveats must name the privileges"
    );

    let mut seen = BTreeSet::new();
    for p in &plugin.spec.platforms {
        let labels = p
            .selector
            .as_ref()
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default();
        let (os, arch) = (
            labels.get("os").cloned().unwrap_or_default(),
            labels.get("arch").cloned().unwrap_or_default(),
        );
        assert!(
            seen.insert((os.clone(), arch.clone())),
            "duplicate platform {os}/{arch}"
        );
        let archive = format!("kubectl-kproxy_{}_{os}_{arch}.tar.gz", plugin.spec.version);
        assert!(
            p.uri.starts_with("https://")
                && p.uri
                    .ends_with(&format!("/{}/{archive}", plugin.spec.version)),
            "{os}/{arch}: uri {} should end with /{}/{archive} (what scripts/package.sh builds)",
            p.uri,
            plugin.spec.version
        );
        assert_eq!(p.bin, "kubectl-kproxy");
        let from: Vec<&str> = p
            .files
            .iter()
            .flatten()
            .filter_map(|f| f.from.as_deref())
            .collect();
        assert!(
            from.contains(&"kubectl-kproxy") && from.contains(&"LICENSE"),
            "{os}/{arch} files: {from:?}"
        );
    }
    let want: BTreeSet<(String, String)> = ["linux", "darwin"]
        .iter()
        .flat_map(|os| ["amd64", "arm64"].map(|arch| ((*os).to_owned(), arch.to_owned())))
        .collect();
    assert_eq!(seen, want);
}

/// The validator itself must reject what krew rejects.
#[test]
fn krew_validator_rejects_bad_manifests() {
    let good = manifest_text();
    assert!(krew_violations(&good).is_empty());
    let cases = [
        ("version: v0.1.0", "version: 0.1.0"),
        ("version: v0.1.0", "version: v0.01.0"),
        ("name: kproxy", "name: kproxy/x"),
        ("name: kproxy", "name: LPT1"),
        (
            "shortDescription: Debug and repair kube-proxy rules on a node",
            "shortDescription: Debug and repair kube-proxy rules on a node, very long",
        ),
        ("kind: Plugin", "kind: Plugins"),
        (
            "\"0000000000000000000000000000000000000000000000000000000000000000\"",
            "\"00000000000000000000000000000000000000000000000000000000000000AA\"",
        ),
        (
            "          arch: amd64",
            "          arch: amd64\n          distro: debian",
        ),
        (
            "    Shows what kube-proxy",
            "    Shows what kube-proxy installed on a node and whether it is right, in one very long line:",
        ),
    ];
    for (from, to) in cases {
        assert!(good.contains(from), "test case anchor {from:?} missing");
        let bad = good.replacen(from, to, 1);
        assert!(
            !krew_violations(&bad).is_empty(),
            "accepted a manifest with {to:?}"
        );
    }
    let no_platforms = "apiVersion: krew.googlecontainertools.github.com/v1alpha2\nkind: Plugin\n\
                        metadata:\n  name: x\nspec:\n  version: v1.0.0\n  shortDescription: x\n  platforms: []\n";
    assert_eq!(krew_violations(no_platforms), ["no platforms"]);
    assert!(is_semver_with_v("v1.2.3-rc.1+build.5"));
    assert!(!is_semver_with_v("v1.2"));
}

#[test]
fn license_is_apache_2() {
    let text = std::fs::read_to_string(repo().join("LICENSE")).expect("LICENSE");
    assert!(text.contains("Apache License") && text.contains("Version 2.0, January 2004"));
    assert!(
        text.contains("END OF TERMS AND CONDITIONS"),
        "full text, not a stub"
    );
    assert!(env!("CARGO_PKG_LICENSE") == "Apache-2.0");
}

/// `scripts/package.sh` packs a binary and LICENSE at the archive root, reproducibly, prints
/// the archive's sha256 and writes it into a manifest.
#[test]
fn package_script_builds_the_krew_archive() {
    for tool in [
        "bash",
        "tar",
        "gzip",
        "sha256sum",
        "awk",
        "install",
        "rustc",
    ] {
        if crate::support::netns::find_tool(tool).is_none() {
            println!("skipped: {tool} not installed");
            return;
        }
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = dir.path().join("kproxy.yaml");
    std::fs::write(&manifest, manifest_text()).expect("copy manifest");
    // A stand-in binary: the debug build is ~200 MB and gzip -9 of it twice takes a minute.
    let bin = dir.path().join("kubectl-kproxy");
    std::fs::write(&bin, "#!/bin/sh\necho kubectl-kproxy\n").expect("stand-in binary");
    let run = |out: &Path| {
        let o = Command::new("bash")
            .arg(repo().join("scripts/package.sh"))
            .args(["--target", "x86_64-unknown-linux-gnu", "--out"])
            .arg(out)
            .arg("--manifest")
            .arg(&manifest)
            .env("KPROXY_PACKAGE_BIN", &bin)
            .output()
            .expect("run package.sh");
        assert!(
            o.status.success(),
            "package.sh: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).expect("utf-8")
    };
    let out1 = run(&dir.path().join("a"));
    let out2 = run(&dir.path().join("b"));
    let archive = dir.path().join(format!(
        "a/kubectl-kproxy_v{}_linux_amd64.tar.gz",
        env!("CARGO_PKG_VERSION")
    ));
    let bytes = std::fs::read(&archive).expect("archive");
    use sha2::Digest;
    let sha = data_encoding::HEXLOWER.encode(sha2::Sha256::digest(&bytes).as_slice());
    let printed = |out: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix("sha256 "))
            .map(str::to_owned)
    };
    assert_eq!(printed(&out1).as_deref(), Some(sha.as_str()), "{out1}");
    assert_eq!(
        printed(&out2),
        printed(&out1),
        "archives must be reproducible"
    );

    let listing = Command::new("tar")
        .arg("-tzf")
        .arg(&archive)
        .output()
        .expect("tar -t");
    let mut names: Vec<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    names.sort();
    let verbose = Command::new("tar")
        .arg("-tvzf")
        .arg(&archive)
        .output()
        .expect("tar -tv");
    let verbose = String::from_utf8_lossy(&verbose.stdout).into_owned();
    assert!(
        verbose
            .lines()
            .any(|l| l.starts_with("-rwxr-xr-x") && l.ends_with(" kubectl-kproxy")),
        "the binary must be executable in the archive: {verbose}"
    );
    assert_eq!(names, ["LICENSE", "kubectl-kproxy"]);

    let updated = std::fs::read_to_string(&manifest).expect("manifest");
    assert!(
        updated.contains(&format!("sha256: \"{sha}\"")),
        "sha not written"
    );
    assert_eq!(
        updated.matches(&sha).count(),
        1,
        "only the linux/amd64 entry changes"
    );
    assert!(krew_violations(&updated).is_empty());
}

/// CI runs the very command README.md documents under "Tests".
#[test]
fn ci_runs_the_readme_test_command() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = readme
        .split("\n## Tests\n")
        .nth(1)
        .expect("README.md has a \"## Tests\" section");
    let command = section
        .split("```")
        .nth(1)
        .and_then(|block| block.lines().nth(1))
        .expect("a fenced command in the Tests section")
        .trim()
        .to_owned();
    let ci = std::fs::read_to_string(repo().join(".ci/run")).expect(".ci/run");
    let last = ci
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty() && !l.starts_with('#'))
        .expect("a command in .ci/run");
    assert_eq!(last, command, ".ci/run must end with README's test command");
    assert!(ci.starts_with("#!/usr/bin/env bash") && ci.contains("set -euo pipefail"));
}
