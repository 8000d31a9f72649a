//! Which kube-proxy release an nftables-mode node is verified against, and what follows when the
//! table was written by another: the same mechanism as iptables mode
//! ([`crate::compare::version`]): the release is `--kube-proxy-version`, else the kube-proxy
//! pod's image, else what the table's own objects point to (KP907); differences another
//! release's table explains are one KP906 finding; objects of two releases are KP908; the
//! `mark-for-masquerade` chain an in-place upgrade to 1.36 leaves is KP909, not drift.

use super::{NftText, NftVerifyError, NftVerifyInput, kube_proxy_table, parse_listings, verify};
use crate::compare::report::Report;
use crate::compare::version::{self, Inference, ReleaseChoice, ReleaseSource};
use kproxy_parsers::nft::Family;

/// What the node's listings say of the release that wrote their `kube-proxy` tables.
pub fn infer(listings: &[NftText<'_>], lenient: bool) -> Result<Inference, NftVerifyError> {
    let rulesets = parse_listings(listings, lenient)?;
    let tables: Vec<_> = [Family::Ip, Family::Ip6]
        .into_iter()
        .filter_map(|f| kube_proxy_table(&rulesets, f))
        .collect();
    Ok(version::infer_nftables(&tables))
}

/// [`verify`] against `release` (whose version `input.facts` carries), saying how the release
/// was chosen and telling another release's table from drift.
pub fn verify_release(
    input: &NftVerifyInput<'_>,
    release: &ReleaseChoice,
) -> Result<Report, NftVerifyError> {
    let asked = input.facts.kube_proxy_version;
    let mut report = verify(input)?;
    let mut findings = std::mem::take(&mut report.findings);
    if let Some(writer) = release.writer {
        let mut facts = input.facts.clone();
        facts.kube_proxy_version = writer;
        let theirs = verify(&NftVerifyInput {
            node: input.node,
            state: input.state,
            config: input.config,
            facts: &facts,
            listings: input.listings.clone(),
            iptables: input.iptables.clone(),
            ipvsadm: input.ipvsadm,
            ipset: input.ipset,
            lenient: input.lenient,
        })?;
        findings = version::group_release_differences(
            findings,
            &theirs.findings,
            asked,
            writer,
            &release.inference,
        );
    }
    if release.source == ReleaseSource::Inferred {
        findings.push(version::inferred_finding(&release.inference, asked));
    }
    findings.extend(version::mixed_finding(&release.inference));
    if asked.dnats_in_service_chains() {
        let rulesets = parse_listings(&input.listings, input.lenient)?;
        for family in [Family::Ip, Family::Ip6] {
            if kube_proxy_table(&rulesets, family).is_some_and(version::upgrade_residue) {
                findings.push(version::residue_finding(family.keyword()));
            }
        }
    }
    Ok(Report::new(
        input.node,
        crate::state::mode::ProxyMode::Nftables,
        report.summary.service_ports,
        findings,
    )
    .with_unchecked(report.summary.unchecked))
}
