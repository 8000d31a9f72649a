//! Which kube-proxy writes the rules: its minor version (1.20 … 1.38), parsed from `1.28`,
//! `v1.28.4` or an image reference such as `registry.k8s.io/kube-proxy:v1.28.4`. Without one,
//! [`KubeProxyVersion::DEFAULT`] is rendered; other releases are asked for explicitly
//! (`--kube-proxy-version`), read from the node's kube-proxy image, or inferred from a dump
//! (`crate::compare::version`). A release newer than [`KubeProxyVersion::NEWEST`] is refused.
//! What each release changes in the rules is asked of its switches (`crate::proxier::version`).

use serde::Serialize;
use std::fmt;

/// A kube-proxy minor version (major 1) this build renders the iptables rules of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeProxyVersion {
    minor: u8,
}

/// Why a text names no kube-proxy version this build knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Not `1.N`, `v1.N.P` or an image with such a tag.
    #[error(
        "{0:?} is not a kube-proxy version: expected 1.N, v1.N.P or an image tag like registry.k8s.io/kube-proxy:v1.28.4"
    )]
    Malformed(String),
    /// Older than the oldest release this build renders.
    #[error("kube-proxy 1.{0} is older than the oldest version this build renders (1.20)")]
    TooOld(u32),
    /// Newer than the newest release this build knows: its rules may have a layout this build
    /// cannot write or read, so it is never taken for the newest known.
    #[error(
        "kube-proxy 1.{0} is newer than the newest release this build knows ({newest}): its rules may differ in ways this build cannot tell; use a newer kubectl-kproxy",
        newest = KubeProxyVersion::NEWEST
    )]
    TooNew(u32),
    /// An image whose name is not kube-proxy's (distributions that rebuild it).
    #[error(
        "image {0:?} is not kube-proxy's own image, so its tag does not tell the kube-proxy release (k3s, RKE2 and some managed offerings rebuild or embed kube-proxy): pass --kube-proxy-version X.Y"
    )]
    RenamedImage(String),
    /// A kube-proxy image without a version tag (pinned by digest, or `latest`).
    #[error(
        "image {0:?} has no version tag (pinned by digest, or a moving tag): pass --kube-proxy-version X.Y"
    )]
    UntaggedImage(String),
}

impl KubeProxyVersion {
    /// The oldest release rendered: 1.20.
    pub const OLDEST: KubeProxyVersion = KubeProxyVersion { minor: 20 };
    /// The newest release this build knows: 1.38 (its alphas: kube-proxy's rules of
    /// v1.38.0-alpha.2, where `KubeProxyNFTablesLocalhostNodePorts` turned on by default).
    pub const NEWEST: KubeProxyVersion = KubeProxyVersion { minor: 38 };

    /// The release rendered when nothing names one (no `--kube-proxy-version`, no kube-proxy
    /// image, no rules to read it from): 1.35, the newest release whose nftables rules the
    /// conformance goldens of kube-proxy's own tests pin without naming a release. From 1.36
    /// the nftables layout differs, so a 1.36+ node is rendered by naming its release (or read
    /// from its image or its rules).
    pub const DEFAULT: KubeProxyVersion = KubeProxyVersion { minor: 35 };

    /// Version 1.`minor`, when this build renders it.
    pub fn of_minor(minor: u32) -> Result<KubeProxyVersion, VersionError> {
        if minor < u32::from(Self::OLDEST.minor) {
            Err(VersionError::TooOld(minor))
        } else if minor > u32::from(Self::NEWEST.minor) {
            Err(VersionError::TooNew(minor))
        } else {
            Ok(KubeProxyVersion { minor: minor as u8 })
        }
    }

    /// The minor number.
    pub fn minor(self) -> u32 {
        u32::from(self.minor)
    }

    /// Every version, oldest first.
    pub fn all() -> impl DoubleEndedIterator<Item = KubeProxyVersion> {
        (Self::OLDEST.minor..=Self::NEWEST.minor).map(|minor| KubeProxyVersion { minor })
    }

    /// The version a text names: `1.28`, `v1.28.4`, `1.28.2-eks-a5df82a`, `v1.28.4+k3s1`, or an
    /// image reference (see [`KubeProxyVersion::from_image`]).
    pub fn parse(text: &str) -> Result<KubeProxyVersion, VersionError> {
        let t = text.trim();
        if t.contains('/') || t.contains(':') || t.contains('@') {
            return Self::from_image(t);
        }
        let minor = release_minor(t).ok_or_else(|| VersionError::Malformed(t.to_string()))?;
        Self::of_minor(minor)
    }

    /// The version of a kube-proxy container image, from its tag: the image must be named
    /// `kube-proxy…` (`registry.k8s.io/kube-proxy:v1.28.4`,
    /// `….dkr.ecr.….amazonaws.com/eks/kube-proxy:v1.28.2-minimal-eksbuild.2`,
    /// `gke.gcr.io/kube-proxy-amd64:v1.27.3-gke.100`) and tagged `v1.N…`. Any other image is
    /// a distribution's own build, whose tag need not be the Kubernetes release.
    pub fn from_image(image: &str) -> Result<KubeProxyVersion, VersionError> {
        let image = image.trim();
        let without_digest = image.split('@').next().unwrap_or("");
        let last = without_digest.rsplit('/').next().unwrap_or("");
        let (name, tag) = match last.split_once(':') {
            Some((n, t)) => (n, Some(t)),
            None => (last, None),
        };
        if !name.starts_with("kube-proxy") {
            return Err(VersionError::RenamedImage(image.to_string()));
        }
        let tag = tag.ok_or_else(|| VersionError::UntaggedImage(image.to_string()))?;
        let minor =
            release_minor(tag).ok_or_else(|| VersionError::UntaggedImage(image.to_string()))?;
        Self::of_minor(minor)
    }
}

impl Default for KubeProxyVersion {
    fn default() -> Self {
        Self::DEFAULT
    }
}

impl fmt::Display for KubeProxyVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "1.{}", self.minor)
    }
}

impl std::str::FromStr for KubeProxyVersion {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for KubeProxyVersion {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The minor number of a Kubernetes release text `[v]1.N[.P][-…|+…]`, if it is one.
fn release_minor(text: &str) -> Option<u32> {
    let t = text.strip_prefix(['v', 'V']).unwrap_or(text);
    let core = t.split(['-', '+']).next().unwrap_or("");
    let mut parts = core.split('.');
    let major = parts.next()?;
    let minor = parts.next()?;
    let patch = parts.next();
    if parts.next().is_some() || major != "1" {
        return None;
    }
    let digits = |s: &str| !s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(minor) || patch.is_some_and(|p| !digits(p)) {
        return None;
    }
    minor.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> KubeProxyVersion {
        KubeProxyVersion::of_minor(minor).expect("known version")
    }

    #[test]
    fn parses_release_texts() {
        assert_eq!(KubeProxyVersion::parse("1.28"), Ok(v(28)));
        assert_eq!(KubeProxyVersion::parse("v1.28.4"), Ok(v(28)));
        assert_eq!(KubeProxyVersion::parse(" 1.20.15 "), Ok(v(20)));
        assert_eq!(KubeProxyVersion::parse("v1.27.3-gke.100"), Ok(v(27)));
        assert_eq!(KubeProxyVersion::parse("v1.28.4+k3s1"), Ok(v(28)));
        assert_eq!(
            KubeProxyVersion::parse("1.38"),
            Ok(KubeProxyVersion::NEWEST)
        );
        assert_eq!(KubeProxyVersion::parse("v1.38.0-alpha.2"), Ok(v(38)));
        assert_eq!(KubeProxyVersion::parse("v1.36.2"), Ok(v(36)));
        assert_eq!(
            KubeProxyVersion::parse("1.19"),
            Err(VersionError::TooOld(19))
        );
        assert_eq!(
            KubeProxyVersion::parse("1.39"),
            Err(VersionError::TooNew(39))
        );
        let refused = VersionError::TooNew(39).to_string();
        assert!(
            refused.contains("1.39") && refused.contains("(1.38)"),
            "{refused}"
        );
        for bad in [
            "", "1", "2.28", "1.x", "1.28.4.1", "v", "1..2", "1.28.", "one.two",
        ] {
            assert_eq!(
                KubeProxyVersion::parse(bad),
                Err(VersionError::Malformed(bad.to_string())),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn parses_image_tags() {
        let cases = [
            ("registry.k8s.io/kube-proxy:v1.28.4", 28),
            ("k8s.gcr.io/kube-proxy:v1.20.15", 20),
            (
                "602401143452.dkr.ecr.us-west-2.amazonaws.com/eks/kube-proxy:v1.29.0-minimal-eksbuild.1",
                29,
            ),
            ("gke.gcr.io/kube-proxy-amd64:v1.27.3-gke.100", 27),
            (
                "mcr.microsoft.com/oss/kubernetes/kube-proxy:v1.26.6-hotfix.20230612",
                26,
            ),
            ("localhost:5000/kube-proxy:v1.30.1", 30),
            ("registry.k8s.io/kube-proxy:v1.31.0@sha256:0123", 31),
        ];
        for (image, minor) in cases {
            assert_eq!(KubeProxyVersion::parse(image), Ok(v(minor)), "{image}");
        }
        assert!(matches!(
            KubeProxyVersion::from_image(
                "rancher/hardened-kubernetes:v1.28.4-rke2r1-build20231213"
            ),
            Err(VersionError::RenamedImage(_))
        ));
        assert!(matches!(
            KubeProxyVersion::from_image("registry.k8s.io/kube-proxy@sha256:0123"),
            Err(VersionError::UntaggedImage(_))
        ));
        assert!(matches!(
            KubeProxyVersion::from_image("localhost:5000/kube-proxy"),
            Err(VersionError::UntaggedImage(_))
        ));
        assert!(matches!(
            KubeProxyVersion::from_image("registry.k8s.io/kube-proxy:latest"),
            Err(VersionError::UntaggedImage(_))
        ));
        assert_eq!(
            KubeProxyVersion::from_image("registry.k8s.io/kube-proxy:v1.18.0"),
            Err(VersionError::TooOld(18))
        );
    }
}
