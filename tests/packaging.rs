//! Release packaging: the krew manifest rendered from its template `.krew.yaml` by
//! `scripts/krew-manifest.sh`, checked against krew's documented manifest rules (the
//! plugin-manifest page of krew's docs and the structural checks of krew's
//! `internal/index/validation/validate.go`, restated here) plus our own style rules; the release
//! archive of `scripts/package.sh`, unpacked as krew installs it and run; `cargo binstall`
//! metadata and the release workflow agreeing with the manifest; `LICENSE`.

use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn version_tag() -> String {
    format!("v{}", env!("CARGO_PKG_VERSION"))
}

/// The four platforms the release builds: (os, arch, Rust target).
const PLATFORMS: [(&str, &str, &str); 4] = [
    ("linux", "amd64", "x86_64-unknown-linux-gnu"),
    ("linux", "arm64", "aarch64-unknown-linux-gnu"),
    ("darwin", "amd64", "x86_64-apple-darwin"),
    ("darwin", "arm64", "aarch64-apple-darwin"),
];

fn archive_name(os: &str, arch: &str) -> String {
    format!("kubectl-kproxy_{}_{os}_{arch}.tar.gz", version_tag())
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    data_encoding::HEXLOWER.encode(sha2::Sha256::digest(bytes).as_slice())
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

/// Every way `text` breaks krew's documented manifest rules for a plugin whose manifest file is
/// `<file_name>.yaml` (empty = none).
fn krew_rule_violations(text: &str, file_name: &str) -> Vec<String> {
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
    if name != file_name {
        v.push(format!("name {name:?} is not the file name {file_name:?}"));
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
    if plugin
        .spec
        .description
        .as_deref()
        .is_none_or(|d| d.trim().is_empty())
    {
        v.push("description is missing".into());
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
        if let Some(s) = &p.selector {
            if s.match_labels.as_ref().is_some_and(|m| m.is_empty()) {
                v.push(format!("platform {i}: matchLabels specified but empty"));
            }
            if s.match_expressions.as_ref().is_some_and(|m| m.is_empty()) {
                v.push(format!(
                    "platform {i}: matchExpressions specified but empty"
                ));
            }
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

/// Our own rules on top of krew's: a short description that fits `kubectl krew search`
/// (at most 50 characters), description and caveats lines of at most 80 columns, an https
/// homepage.
fn style_violations(text: &str) -> Vec<String> {
    let Ok(plugin) = serde_saphyr::from_str::<Plugin>(text) else {
        return vec!["not a Plugin manifest".into()];
    };
    let mut v = Vec::new();
    let short = plugin.spec.short_description.chars().count();
    if short > 50 {
        v.push(format!(
            "shortDescription is {short} characters (at most 50)"
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
    if !plugin
        .spec
        .homepage
        .as_deref()
        .is_some_and(|h| h.starts_with("https://"))
    {
        v.push("homepage is not an https URL".into());
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

/// Runs `scripts/krew-manifest.sh` with `args`.
fn krew_manifest_script(args: &[&str]) -> Output {
    Command::new("bash")
        .arg(repo().join("scripts/krew-manifest.sh"))
        .args(args)
        .output()
        .expect("run krew-manifest.sh")
}

/// A `sha256sum`-style checksum file for the four archives (made-up sums unless given).
fn checksums(dir: &Path, given: &[(String, String)]) -> PathBuf {
    let mut text = String::new();
    for (os, arch, _) in PLATFORMS {
        let name = archive_name(os, arch);
        let sum = given
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s.clone())
            .unwrap_or_else(|| sha256_hex(name.as_bytes()));
        text.push_str(&format!("{sum}  dist/{name}\n"));
    }
    let path = dir.join("SHA256SUMS");
    std::fs::write(&path, text).expect("write checksums");
    path
}

/// The manifest for this version rendered from `.krew.yaml` with the checksums in `sums`.
fn rendered(sums: &Path) -> String {
    let out = krew_manifest_script(&[
        "--tag",
        &version_tag(),
        "--checksums",
        sums.to_str().expect("utf-8 path"),
    ]);
    assert!(
        out.status.success(),
        "krew-manifest.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8")
}

fn platform_labels(p: &Platform) -> (String, String) {
    let labels = p
        .selector
        .as_ref()
        .and_then(|s| s.match_labels.clone())
        .unwrap_or_default();
    (
        labels.get("os").cloned().unwrap_or_default(),
        labels.get("arch").cloned().unwrap_or_default(),
    )
}

#[test]
fn krew_template_renders_a_manifest_that_follows_krews_rules() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sums = checksums(dir.path(), &[]);
    let text = rendered(&sums);
    assert!(
        !text.contains("{{"),
        "left-over template expression:\n{text}"
    );
    let broken = krew_rule_violations(&text, "kproxy");
    assert!(broken.is_empty(), "krew's rules:\n{}", broken.join("\n"));
    let style = style_violations(&text);
    assert!(style.is_empty(), "style:\n{}", style.join("\n"));

    let plugin: Plugin = serde_saphyr::from_str(&text).expect("manifest parses");
    assert_eq!(
        plugin.spec.version,
        version_tag(),
        "manifest version vs Cargo.toml"
    );
    let repository = env!("CARGO_PKG_REPOSITORY");
    assert_eq!(plugin.spec.homepage.as_deref(), Some(repository));
    let mut seen = BTreeSet::new();
    for p in &plugin.spec.platforms {
        let (os, arch) = platform_labels(p);
        assert!(
            seen.insert((os.clone(), arch.clone())),
            "duplicate {os}/{arch}"
        );
        let name = archive_name(&os, &arch);
        assert_eq!(
            p.uri,
            format!("{repository}/releases/download/{}/{name}", version_tag()),
            "{os}/{arch}: the uri must be the archive scripts/package.sh builds"
        );
        assert_eq!(
            p.sha256,
            sha256_hex(name.as_bytes()),
            "{os}/{arch}: checksum"
        );
        assert_eq!(p.bin, "kubectl-kproxy");
        let from: Vec<&str> = p
            .files
            .iter()
            .flatten()
            .filter_map(|f| f.from.as_deref())
            .collect();
        assert_eq!(
            from,
            ["kubectl-kproxy", "kubectl_complete-kproxy", "LICENSE"],
            "{os}/{arch} files"
        );
    }
    let want: BTreeSet<(String, String)> = PLATFORMS
        .iter()
        .map(|(os, arch, _)| (os.to_string(), arch.to_string()))
        .collect();
    assert_eq!(seen, want);
}

/// The renderer refuses what would publish a wrong manifest, and prints nothing then.
#[test]
fn krew_manifest_script_refuses_bad_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sums = checksums(dir.path(), &[]);
    let sums = sums.to_str().expect("utf-8");
    let refused = |args: &[&str], why: &str| {
        let out = krew_manifest_script(args);
        assert_eq!(out.status.code(), Some(2), "{why}: {out:?}");
        assert!(out.stdout.is_empty(), "{why}: printed a manifest");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(stderr.starts_with("krew-manifest.sh: "), "{why}: {stderr}");
        stderr
    };
    let e = refused(&["--tag", "v9.9.9", "--checksums", sums], "tag");
    assert!(e.contains("not the version in Cargo.toml"), "{e}");
    refused(&["--tag", &version_tag()], "no checksums");
    let e = refused(
        &["--tag", &version_tag(), "--checksums", sums, "--unreleased"],
        "checksums of an unreleased version",
    );
    assert!(e.contains("exclude each other"), "{e}");

    let partial = dir.path().join("partial");
    let full = std::fs::read_to_string(sums).expect("sums");
    std::fs::write(
        &partial,
        full.lines().take(3).collect::<Vec<_>>().join("\n"),
    )
    .expect("w");
    let e = refused(
        &[
            "--tag",
            &version_tag(),
            "--checksums",
            partial.to_str().expect("utf-8"),
        ],
        "missing checksum",
    );
    assert!(e.contains(&archive_name("darwin", "arm64")), "{e}");

    let bad = dir.path().join("bad");
    std::fs::write(&bad, full.replacen(&full[..4], "XYZ!", 1)).expect("w");
    let e = refused(
        &[
            "--tag",
            &version_tag(),
            "--checksums",
            bad.to_str().expect("utf-8"),
        ],
        "malformed checksum",
    );
    assert!(e.contains("not a sha256 line"), "{e}");

    let template = dir.path().join("template.yaml");
    let text = std::fs::read_to_string(repo().join(".krew.yaml")).expect(".krew.yaml");
    std::fs::write(&template, text.replace("{{ .TagName }}", "{{ .Tag }}")).expect("w");
    let e = refused(
        &[
            "--tag",
            &version_tag(),
            "--checksums",
            sums,
            "--template",
            template.to_str().expect("utf-8"),
        ],
        "unknown expression",
    );
    assert!(e.contains("template expression left"), "{e}");
}

/// `krew-manifest.yaml` at the root is the manifest of Cargo.toml's version: before its release
/// the rendering with `--unreleased` (no checksum krew would take), after it the rendering with
/// the release's checksums, which the release workflow records there.
#[test]
fn the_root_krew_manifest_is_this_versions() {
    let text =
        std::fs::read_to_string(repo().join("krew-manifest.yaml")).expect("krew-manifest.yaml");
    let plugin: Plugin = serde_saphyr::from_str(&text).expect("krew-manifest.yaml parses");
    assert_eq!(
        plugin.spec.version,
        version_tag(),
        "krew-manifest.yaml's version"
    );
    let unreleased = plugin
        .spec
        .platforms
        .iter()
        .all(|p| p.sha256 == "unreleased");
    let expected = if unreleased {
        let out = krew_manifest_script(&["--tag", &version_tag(), "--unreleased"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8")
    } else {
        let dir = tempfile::tempdir().expect("tempdir");
        let given: Vec<(String, String)> = plugin
            .spec
            .platforms
            .iter()
            .map(|p| {
                let (os, arch) = platform_labels(p);
                (archive_name(&os, &arch), p.sha256.clone())
            })
            .collect();
        let expected = rendered(&checksums(dir.path(), &given));
        let broken = krew_rule_violations(&expected, "kproxy");
        assert!(broken.is_empty(), "krew's rules:\n{}", broken.join("\n"));
        expected
    };
    assert_eq!(
        text,
        expected,
        "krew-manifest.yaml is not .krew.yaml rendered for this version: run scripts/krew-manifest.sh --tag {} --unreleased > krew-manifest.yaml",
        version_tag()
    );
    // krew refuses the unreleased form: it can never be installed by mistake.
    if unreleased {
        assert!(!krew_rule_violations(&text, "kproxy").is_empty());
    }
}

/// The description names the three modes; the caveats say how to put the archive's completion
/// helper on PATH (krew links only the plugin itself, krew#812).
#[test]
fn krew_manifest_names_every_mode_and_the_completion_helper() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin: Plugin =
        serde_saphyr::from_str(&rendered(&checksums(dir.path(), &[]))).expect("manifest");
    let description = plugin.spec.description.clone().unwrap_or_default();
    for mode in ["iptables", "IPVS", "nftables"] {
        assert!(description.contains(mode), "{mode}: {description}");
    }
    let caveats = plugin
        .spec
        .caveats
        .clone()
        .unwrap_or_default()
        .replace("\\\n", "");
    let link = format!(
        "ln -s ~/.krew/store/kproxy/{}/kubectl_complete-kproxy",
        version_tag()
    );
    assert!(caveats.contains(&link), "{caveats}");
    assert!(caveats.contains("~/.krew/bin/"), "{caveats}");
}

/// The caveats list the RBAC that deploy/rbac.yaml grants, and every flag they or the
/// description name is a real flag of the plugin.
#[test]
fn krew_caveats_name_the_rbac_and_real_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugin: Plugin =
        serde_saphyr::from_str(&rendered(&checksums(dir.path(), &[]))).expect("manifest");
    let caveats = plugin.spec.caveats.clone().unwrap_or_default();

    let rbac_text = std::fs::read_to_string(repo().join("deploy/rbac.yaml")).expect("rbac.yaml");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&rbac_text).expect("rbac.yaml");
    let mut resources = BTreeSet::new();
    for rule in docs.iter().filter_map(|d| d["rules"].as_array()).flatten() {
        for r in rule["resources"].as_array().into_iter().flatten() {
            let r = r.as_str().expect("resource").to_string();
            match rule["resourceNames"].as_array() {
                Some(names) => {
                    for n in names {
                        resources.insert(format!("{r}:{}", n.as_str().expect("name")));
                    }
                }
                None => {
                    resources.insert(r);
                }
            }
        }
    }
    let want: BTreeSet<String> = [
        "configmaps:kube-proxy",
        "endpointslices",
        "namespaces",
        "nodes",
        "pods",
        "pods/exec",
        "servicecidrs",
        "services",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        resources, want,
        "deploy/rbac.yaml changed: update the caveats"
    );
    for r in &resources {
        let needle = match r.as_str() {
            "configmaps:kube-proxy" => "ConfigMap kube-system/kube-proxy",
            other => other,
        };
        assert!(
            caveats.contains(needle),
            "the caveats do not name {needle}:\n{caveats}"
        );
    }

    let flags = cli_flags();
    let text = format!("{caveats}\n{}", plugin.spec.description.unwrap_or_default());
    let named = regex::Regex::new(r"--([a-z][a-z0-9-]*)").expect("regex");
    let mut checked = 0;
    for m in named.captures_iter(&text) {
        assert!(
            flags.contains(&m[1]),
            "the manifest names --{}, which does not exist",
            &m[1]
        );
        checked += 1;
    }
    assert!(
        checked >= 2,
        "the caveats should name --apply and --collector"
    );
}

/// The long flags of the binary and of every command, read from their `--help`.
fn cli_flags() -> BTreeSet<String> {
    let help = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
            .args(args)
            .arg("--help")
            .env("NO_COLOR", "1")
            .output()
            .expect("run --help");
        assert!(out.status.success(), "{args:?} --help");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let option = regex::Regex::new(r"^\s+(?:-[A-Za-z], )?--([a-z][a-z0-9-]*)").expect("regex");
    let top = help(&[]);
    let commands: Vec<String> = top
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(commands.len() >= 5, "commands of --help: {commands:?}");
    let mut flags = BTreeSet::new();
    for text in std::iter::once(top).chain(commands.iter().map(|c| help(&[c.as_str()]))) {
        flags.extend(
            text.lines()
                .filter_map(|l| option.captures(l).map(|c| c[1].to_string())),
        );
    }
    assert!(
        flags.contains("kubeconfig") && flags.contains("apply"),
        "{flags:?}"
    );
    flags
}

/// Our checker of krew's documented rules must itself reject what those rules reject.
#[test]
fn krew_rule_checker_rejects_bad_manifests() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = rendered(&checksums(dir.path(), &[]));
    assert!(krew_rule_violations(&good, "kproxy").is_empty());
    assert_eq!(krew_rule_violations(&good, "other").len(), 1);
    let sum = sha256_hex(archive_name("linux", "amd64").as_bytes());
    let version = format!("version: {}", version_tag());
    let cases = [
        (version.as_str(), "version: 0.1.0"),
        (version.as_str(), "version: v0.01.0"),
        ("name: kproxy", "name: kproxy/x"),
        ("name: kproxy", "name: LPT1"),
        ("kind: Plugin", "kind: Plugins"),
        (
            sum.as_str(),
            "00000000000000000000000000000000000000000000000000000000000000AA",
        ),
        (
            "          arch: amd64",
            "          arch: amd64\n          distro: debian",
        ),
        (
            "        matchLabels:\n          os: linux\n          arch: amd64",
            "        matchLabels: {}",
        ),
        ("      bin: kubectl-kproxy", "      bin: \"\""),
        (
            "  shortDescription: Debug",
            "  shortDescription: |\n    Debug\n    and",
        ),
    ];
    for (from, to) in cases {
        assert!(good.contains(from), "test case anchor {from:?} missing");
        let bad = good.replacen(from, to, 1);
        assert!(
            !krew_rule_violations(&bad, "kproxy").is_empty(),
            "accepted a manifest with {to:?}"
        );
    }
    let long = good.replacen(
        "shortDescription: Debug and repair kube-proxy rules on a node",
        "shortDescription: Debug and repair kube-proxy rules on a node, very long",
        1,
    );
    assert_eq!(style_violations(&long).len(), 1);
    let no_platforms = "apiVersion: krew.googlecontainertools.github.com/v1alpha2\nkind: Plugin\n\
                        metadata:\n  name: x\nspec:\n  version: v1.0.0\n  shortDescription: x\n  \
                        description: x\n  platforms: []\n";
    assert_eq!(krew_rule_violations(no_platforms, "x"), ["no platforms"]);
    assert!(is_semver_with_v("v1.2.3-rc.1+build.5"));
    assert!(!is_semver_with_v("v1.2"));
}

/// `cargo binstall` fetches the same archives krew does, and the release workflow builds the
/// same four targets.
#[test]
fn binstall_metadata_and_release_workflow_match_the_archives() {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(repo())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let package = meta["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "kubectl-kproxy"))
        .expect("the package");
    let binstall = &package["metadata"]["binstall"];
    assert_eq!(binstall["pkg-fmt"], "tgz");
    assert_eq!(binstall["bin-dir"], "{ bin }{ binary-ext }");
    let overrides = binstall["overrides"].as_object().expect("overrides");
    assert_eq!(overrides.len(), PLATFORMS.len());
    for (os, arch, triple) in PLATFORMS {
        let url = overrides[triple]["pkg-url"].as_str().expect("pkg-url");
        let url = url
            .replace("{ repo }", env!("CARGO_PKG_REPOSITORY"))
            .replace("{ name }", env!("CARGO_PKG_NAME"))
            .replace("{ version }", env!("CARGO_PKG_VERSION"));
        assert_eq!(
            url,
            format!(
                "{}/releases/download/{}/{}",
                env!("CARGO_PKG_REPOSITORY"),
                version_tag(),
                archive_name(os, arch)
            )
        );
    }

    let workflow = std::fs::read_to_string(repo().join(".github/workflows/release.yml"))
        .expect("release workflow");
    let doc: serde_json::Value = serde_saphyr::from_str(&workflow).expect("workflow YAML");
    let matrix: BTreeSet<(String, String, String)> =
        doc["jobs"]["build"]["strategy"]["matrix"]["include"]
            .as_array()
            .expect("build matrix")
            .iter()
            .map(|m| {
                let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                (s("os"), s("arch"), s("target"))
            })
            .collect();
    let want: BTreeSet<(String, String, String)> = PLATFORMS
        .iter()
        .map(|(o, a, t)| (o.to_string(), a.to_string(), t.to_string()))
        .collect();
    assert_eq!(matrix, want);
    for (os, arch, triple) in PLATFORMS {
        assert!(
            workflow.contains(&format!("{os}:{arch}:{triple}")),
            "the publish job does not pack {os}/{arch}"
        );
    }
    for step in [
        "scripts/package.sh",
        "scripts/krew-manifest.sh --tag \"$TAG\" --checksums dist/SHA256SUMS",
        "sha256sum",
        "cp dist/krew-manifest.yaml krew-manifest.yaml",
    ] {
        assert!(workflow.contains(step), "the workflow does not run {step}");
    }
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

/// Runs `scripts/package.sh` for linux/amd64 on `bin`, into `out`; returns (archive, printed sha).
fn package(bin: &Path, out: &Path) -> (PathBuf, String) {
    let o = Command::new("bash")
        .arg(repo().join("scripts/package.sh"))
        .args(["--target", "x86_64-unknown-linux-gnu", "--bin"])
        .arg(bin)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run package.sh");
    assert!(
        o.status.success(),
        "package.sh: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stdout = String::from_utf8(o.stdout).expect("utf-8");
    let archive = out.join(archive_name("linux", "amd64"));
    assert_eq!(
        stdout.lines().next(),
        Some(archive.to_str().expect("utf-8"))
    );
    let sha = stdout
        .lines()
        .find_map(|l| l.strip_prefix("sha256 "))
        .expect("printed sha256")
        .to_string();
    (archive, sha)
}

/// The linux/amd64 archive built from this build's binary (stripped, as the release profile
/// ships it), checksummed into the manifest, unpacked with the manifest's `files` the way krew
/// installs it, and run. Also: archives are reproducible and hold exactly the binary (mode
/// 0755) and LICENSE.
#[test]
fn release_archive_installs_from_the_manifest_and_runs() {
    let test = "release_archive_installs_from_the_manifest_and_runs";
    if let Some(tool) = ["bash", "tar", "gzip", "sha256sum", "install"]
        .into_iter()
        .find(|t| crate::support::netns::find_tool(t).is_none())
    {
        crate::support::skip(test, &format!("{tool} is needed to build release archives"));
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");

    // Reproducible: a small stand-in binary packed twice gives the same bytes.
    let stand_in = dir.path().join("stand-in");
    std::fs::write(&stand_in, "#!/bin/sh\necho kubectl-kproxy\n").expect("stand-in");
    let (a, sha_a) = package(&stand_in, &dir.path().join("a"));
    let (_, sha_b) = package(&stand_in, &dir.path().join("b"));
    assert_eq!(sha_a, sha_b, "archives must be reproducible");
    assert_eq!(sha_a, sha256_hex(&std::fs::read(&a).expect("archive")));

    let bin = dir.path().join("kubectl-kproxy");
    crate::support::install_executable(Path::new(env!("CARGO_BIN_EXE_kubectl-kproxy")), &bin);
    if crate::support::netns::find_tool("strip").is_some() {
        let st = Command::new("strip").arg(&bin).status().expect("strip");
        assert!(st.success());
    }
    let (archive, sha) = package(&bin, &dir.path().join("dist"));
    println!(
        "linux/amd64 archive of this build: {} bytes (binary {} bytes)",
        std::fs::metadata(&archive).expect("archive").len(),
        std::fs::metadata(&bin).expect("binary").len()
    );
    let listing = Command::new("tar")
        .arg("-tvzf")
        .arg(&archive)
        .output()
        .expect("tar -tv");
    let listing = String::from_utf8_lossy(&listing.stdout).into_owned();
    let entries: Vec<&str> = listing.lines().collect();
    assert_eq!(entries.len(), 3, "{listing}");
    let entry = |name: &str| {
        entries
            .iter()
            .find(|l| l.ends_with(&format!(" {name}")))
            .copied()
            .unwrap_or_else(|| panic!("{name} missing: {listing}"))
    };
    assert!(entry("LICENSE").starts_with("-rw-r--r-- 0/0"), "{listing}");
    for bin in ["kubectl-kproxy", "kubectl_complete-kproxy"] {
        assert!(entry(bin).starts_with("-rwxr-xr-x 0/0"), "{listing}");
    }

    let sums = checksums(dir.path(), &[(archive_name("linux", "amd64"), sha.clone())]);
    let plugin: Plugin = serde_saphyr::from_str(&rendered(&sums)).expect("manifest");
    let platform = plugin
        .spec
        .platforms
        .iter()
        .find(|p| platform_labels(p) == ("linux".into(), "amd64".into()))
        .expect("linux/amd64 platform");
    assert_eq!(platform.sha256, sha);
    assert!(
        platform
            .uri
            .ends_with(&format!("/{}", archive_name("linux", "amd64")))
    );

    // Install as krew does: extract, copy each `files` entry, run `bin`.
    let extracted = dir.path().join("extracted");
    let installed = dir.path().join("installed");
    std::fs::create_dir_all(&extracted).expect("mkdir");
    std::fs::create_dir_all(&installed).expect("mkdir");
    let st = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&extracted)
        .status()
        .expect("tar -x");
    assert!(st.success());
    for op in platform.files.iter().flatten() {
        let (from, to) = (
            op.from.as_deref().expect("from"),
            op.to.as_deref().expect("to"),
        );
        assert!(!from.contains('*'), "no globs in our manifest");
        let dest = if to == "." {
            installed.join(from)
        } else {
            installed.join(to)
        };
        // krew copies the files; install keeps our write descriptor out of forked children.
        crate::support::install_executable(&extracted.join(from), &dest);
    }
    let out = Command::new(installed.join(&platform.bin))
        .arg("--version")
        .output()
        .expect("run the installed binary");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("kubectl-kproxy {}\n", env!("CARGO_PKG_VERSION"))
    );
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

/// The quick start's output in README.md is what its command prints, byte for byte.
#[test]
fn readme_quick_start_output_is_what_the_command_prints() {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let section = readme
        .split("\n## Quick start")
        .nth(1)
        .expect("README.md has a Quick start section");
    let mut blocks = section.split("```").skip(1).step_by(2);
    let command = blocks.next().expect("the command block");
    let printed = blocks.next().expect("the output block");
    let line = command
        .lines()
        .find(|l| l.contains("kubectl-kproxy "))
        .expect("a kubectl-kproxy command");
    let args: Vec<&str> = line
        .split("kubectl-kproxy ")
        .nth(1)
        .expect("arguments")
        .split_whitespace()
        .collect();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-kproxy"))
        .args(&args)
        .current_dir(repo())
        .env("NO_COLOR", "1")
        .output()
        .expect("run");
    let expected = printed.strip_prefix("text\n").expect("a ```text block");
    assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
    assert_eq!(out.status.code(), Some(1), "README says exit status 1");
}
