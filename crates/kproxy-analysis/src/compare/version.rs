//! Which kube-proxy release wrote a dump, offline: each kind of rule that only some releases write
//! (a chain family, a comment text, where a rule sits) narrows the range of releases, and the
//! dump's release is the range all its clues agree on. Also what follows when `verify` compares
//! against another release than the one that wrote the rules: the differences are that release's,
//! reported as one finding rather than one per rule.
//!
//! The clues are read from kube-proxy's `proxier.go` `syncProxyRules` at each release (see
//! docs/versions.md): a clue says "written by a release in `oldest ..= newest`". A node can hold
//! rules of two releases (an upgrade whose stale chains are not yet deleted); then no release
//! satisfies every clue, and the release most clues agree on (the newest such) is the writer.

use super::catalogue as cat;
use super::finding::Finding;
use crate::state::version::KubeProxyVersion;
use std::collections::HashSet;

/// One kind of rule that only some releases write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clue {
    /// What was seen, e.g. `KUBE-XLB-… chains`.
    pub what: &'static str,
    /// The oldest release that writes it.
    pub oldest: KubeProxyVersion,
    /// The newest release that writes it.
    pub newest: KubeProxyVersion,
}

impl Clue {
    fn new(what: &'static str, oldest: u32, newest: u32) -> Clue {
        let v = |m| KubeProxyVersion::of_minor(m).unwrap_or(KubeProxyVersion::NEWEST);
        Clue {
            what,
            oldest: v(oldest),
            newest: v(newest),
        }
    }

    /// Written by `oldest` and every release after it, up to the newest this build knows.
    fn since(what: &'static str, oldest: u32) -> Clue {
        Clue::new(what, oldest, KubeProxyVersion::NEWEST.minor())
    }

    /// Whether `v` writes it.
    pub fn admits(&self, v: KubeProxyVersion) -> bool {
        self.oldest <= v && v <= self.newest
    }

    /// `what (1.20–1.23)`.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.what, range_text(self.oldest, self.newest))
    }
}

/// `1.22–1.23`, or `1.24` for one release.
pub fn range_text(oldest: KubeProxyVersion, newest: KubeProxyVersion) -> String {
    if oldest == newest {
        oldest.to_string()
    } else {
        format!("{oldest}–{newest}")
    }
}

/// What a dump says about the release that wrote it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inference {
    /// Every clue seen, once each, in the order first seen.
    pub clues: Vec<Clue>,
    /// Where each clue was first seen (`table chain`; parallel to `clues`; empty for clues of
    /// what is missing).
    pub seen_in: Vec<String>,
    /// Whether the dump holds kube-proxy's iptables rules at all.
    pub has_rules: bool,
    /// `KUBE-FORWARD`'s INVALID drop counts nothing (no nfacct match).
    invalid_drop_uncounted: bool,
}

impl Inference {
    /// The releases most clues agree on (the newest run of them), or `None` without clues.
    pub fn range(&self) -> Option<(KubeProxyVersion, KubeProxyVersion)> {
        if self.clues.is_empty() {
            return None;
        }
        let score = |v: KubeProxyVersion| self.clues.iter().filter(|c| c.admits(v)).count();
        let best = KubeProxyVersion::all().map(score).max().unwrap_or(0);
        let newest = KubeProxyVersion::all().rev().find(|v| score(*v) == best)?;
        let oldest = KubeProxyVersion::all()
            .rev()
            .skip_while(|v| *v != newest)
            .take_while(|v| score(*v) == best)
            .last()
            .unwrap_or(newest);
        Some((oldest, newest))
    }

    /// The release to verify with: the newest of [`Inference::range`].
    pub fn pick(&self) -> Option<KubeProxyVersion> {
        self.range().map(|(_, newest)| newest)
    }

    /// Whether the rules could be `v`'s (no clue says otherwise … or no clue at all).
    pub fn admits(&self, v: KubeProxyVersion) -> bool {
        self.range()
            .is_none_or(|(oldest, newest)| oldest <= v && v <= newest)
    }

    /// The release of [`Inference::range`] closest to `v`: what wrote the rules, when `v` did
    /// not.
    pub fn writer_nearest(&self, v: KubeProxyVersion) -> Option<KubeProxyVersion> {
        let (oldest, newest) = self.range()?;
        Some(v.clamp(oldest, newest))
    }

    /// Clues that no release of [`Inference::range`] writes: rules of another release.
    pub fn strays(&self) -> Vec<Clue> {
        let Some((oldest, newest)) = self.range() else {
            return Vec::new();
        };
        self.clues
            .iter()
            .filter(|c| !c.admits(oldest) && !c.admits(newest))
            .copied()
            .collect()
    }

    /// `rules look written by kube-proxy 1.22–1.23`, or why nothing can be said.
    pub fn describe(&self) -> String {
        match self.range() {
            Some((oldest, newest)) => {
                format!(
                    "rules look written by kube-proxy {}",
                    range_text(oldest, newest)
                )
            }
            None if self.has_rules => {
                "no rule tells which kube-proxy release wrote the rules".to_string()
            }
            None => "the dump holds no kube-proxy rules".to_string(),
        }
    }

    /// What the rules show of a node known to have kube-proxy's `ct_state_invalid_dropped_pkts`
    /// nfacct counter (`present`): 1.31 and later count INVALID drops with it, so a drop
    /// without it is an older release's.
    pub fn given_invalid_counter(mut self, present: bool) -> Inference {
        if present && self.invalid_drop_uncounted {
            self.add(Clue::new(
                "INVALID drop without the node's nfacct counter",
                20,
                30,
            ));
        }
        self
    }

    fn add(&mut self, clue: Clue) {
        self.add_in(clue, "", "");
    }

    /// Adds `clue`, seen in `table`'s `chain`.
    fn add_in(&mut self, clue: Clue, table: &str, chain: &str) {
        if !self.clues.contains(&clue) {
            self.clues.push(clue);
            self.seen_in.push(if chain.is_empty() {
                String::new()
            } else {
                format!("{table} {chain}")
            });
        }
    }

    /// The clues no release of [`Inference::range`] writes, with where each was first seen.
    pub fn strays_seen_in(&self) -> Vec<(Clue, &str)> {
        let strays = self.strays();
        self.clues
            .iter()
            .zip(&self.seen_in)
            .filter(|(c, _)| strays.contains(c))
            .map(|(c, at)| (*c, at.as_str()))
            .collect()
    }
}

/// Reads `texts` (`iptables-save` output, or restore input) for clues: one pass over their lines,
/// looking only at the chains kube-proxy writes.
pub fn infer<'t>(texts: impl IntoIterator<Item = &'t str>) -> Inference {
    let mut inf = Inference::default();
    for text in texts {
        scan(text, &mut inf);
    }
    inf
}

/// Reads nftables-mode `kube-proxy` tables (parsed and normalised, one per family) for clues of
/// the release that wrote them (kube-proxy's `pkg/proxy/nftables/proxier.go` at each release;
/// docs/versions.md). An unreferenced `mark-for-masquerade` chain is no clue: kube-proxy 1.36+
/// neither writes nor deletes it, so an upgraded node keeps it ([`upgrade_residue`]).
pub fn infer_nftables(tables: &[&kproxy_parsers::nft::Table<'_>]) -> Inference {
    use crate::proxier::nftables::names as n;
    let mut inf = Inference::default();
    for table in tables {
        inf.has_rules = true;
        let refs = super::nftables::diff::References::of(table);
        if refs.by_rule.contains(n::MARK_MASQ_CHAIN) {
            inf.add_in(
                Clue::new("jumps to mark-for-masquerade", NFTABLES_OLDEST, 35),
                "",
                n::MARK_MASQ_CHAIN,
            );
        }
        if table.set(n::HAIRPIN_CONNECTIONS_SET).is_some() {
            inf.add_in(
                Clue::since("hairpin-connections set", 36),
                "",
                n::HAIRPIN_CONNECTIONS_SET,
            );
        }
        // The map is 1.38's by default, and 1.37's with the gate turned on: the same rules.
        if table.set(n::LOCALHOST_NODEPORT_REJECT_MAP).is_some() {
            inf.add_in(
                Clue::since("localhost-nodeport-reject-ports map", 38),
                "",
                n::LOCALHOST_NODEPORT_REJECT_MAP,
            );
        } else {
            // On by default from 1.38 (KubeProxyNFTablesLocalhostNodePorts), whatever the
            // services: a table without the map is older, or has the gate off (then its rules
            // are 1.37's).
            inf.add(Clue::new(
                "no localhost-nodeport-reject-ports map",
                NFTABLES_OLDEST,
                37,
            ));
        }
        for chain in &table.chains {
            let policy = chain.name.starts_with(n::SERVICE_PREFIX)
                || chain.name.starts_with(n::LOCAL_PREFIX);
            if !policy {
                continue;
            }
            for rule in &chain.rules {
                let Some(nat) = rule.stmts.iter().find_map(|s| match s {
                    kproxy_parsers::nft::Stmt::Nat(nat)
                        if nat.kind == kproxy_parsers::nft::NatKind::Dnat =>
                    {
                        Some(nat)
                    }
                    _ => None,
                }) else {
                    continue;
                };
                let text = nat.to_string();
                let clue = if !text.contains("numgen") {
                    Clue::since("service chains DNAT one endpoint directly", 37)
                } else if text.contains(" mod 1 ") {
                    Clue::new("a one-endpoint numgen DNAT map", 36, 36)
                } else {
                    Clue::since("service chains DNAT through a numgen map", 36)
                };
                inf.add_in(clue, "", &chain.name);
            }
        }
    }
    inf
}

/// The oldest release with an nftables mode (alpha in 1.29).
const NFTABLES_OLDEST: u32 = 29;

/// Whether `table` (an nftables-mode `kube-proxy` table) keeps the `mark-for-masquerade`
/// chain of kube-proxy ≤1.35 with nothing jumping to it: an in-place upgrade to 1.36+ leaves it,
/// since kube-proxy then neither writes it nor deletes it (its stale-chain cleanup only takes
/// chains whose name holds a `/`, `proxier.go` `isServiceChainName`).
pub fn upgrade_residue(table: &kproxy_parsers::nft::Table<'_>) -> bool {
    use crate::proxier::nftables::names as n;
    table.chain(n::MARK_MASQ_CHAIN).is_some() && {
        let refs = super::nftables::diff::References::of(table);
        !refs.by_rule.contains(n::MARK_MASQ_CHAIN) && !refs.by_element.contains(n::MARK_MASQ_CHAIN)
    }
}

/// The finding (KP909) for [`upgrade_residue`] on a node verified as 1.36 or later.
pub fn residue_finding(family: &str) -> Finding {
    cat::UPGRADE_RESIDUE
        .finding(format!(
            "table {family} kube-proxy keeps the mark-for-masquerade chain of kube-proxy 1.35 or older, and nothing jumps to it: left by an in-place upgrade (kube-proxy 1.36 and later neither write nor delete it)"
        ))
        .chain(format!("{family} {}", crate::proxier::nftables::names::MARK_MASQ_CHAIN))
        .expected("no mark-for-masquerade chain (kube-proxy 1.36 and later)")
        .actual("an unreferenced mark-for-masquerade chain")
}

/// What one text shows.
#[derive(Default)]
struct Seen<'t> {
    filter_forward: bool,
    filter_nodeports: bool,
    proxy_firewall: bool,
    forward_rules: bool,
    invalid_drop: bool,
    /// The text is IPv6 rules.
    ipv6: bool,
    /// `KUBE-FW-…` chains with rules, and whether they end the way 1.27+ (the "other traffic"
    /// rule) or 1.20–1.24 (a `KUBE-MARK-DROP` jump) end them.
    firewalls: std::collections::HashMap<&'t str, bool>,
}

fn scan(text: &str, inf: &mut Inference) {
    let mut table = "";
    let mut seen = Seen {
        // `ip6tables-save` names itself in its header; a restore input shows IPv6 addresses.
        ipv6: text.lines().any(|l| {
            (l.starts_with('#') && l.contains("ip6tables"))
                || (l.starts_with("-A KUBE-SERVICES") && l.contains("/128"))
        }),
        ..Seen::default()
    };
    for line in text.lines() {
        let line = line.trim_end();
        if let Some(t) = line.strip_prefix('*') {
            table = t.trim();
            continue;
        }
        // `iptables -S` prints `-N CHAIN` for `:CHAIN` and no table headers.
        if let Some(decl) = line.strip_prefix(':').or_else(|| line.strip_prefix("-N ")) {
            let name = decl.split(' ').next().unwrap_or("");
            declared(table_of(table, name), name, &mut seen, inf);
            continue;
        }
        // `iptables-save -c` puts `[packets:bytes] ` before each rule.
        let line = match line.strip_prefix('[') {
            Some(counted) => counted.split_once("] ").map_or(line, |(_, rule)| rule),
            None => line,
        };
        let Some(rest) = line.strip_prefix("-A ") else {
            continue;
        };
        let chain = rest.split(' ').next().unwrap_or("");
        rule(table_of(table, chain), chain, line, &mut seen, inf);
    }
    // Chains every release since their introduction writes on each sync: their absence from a
    // filter table kube-proxy writes to says the release is older.
    if seen.filter_forward {
        inf.has_rules = true;
        if !seen.proxy_firewall {
            inf.add(Clue::new("no filter KUBE-PROXY-FIREWALL chain", 20, 24));
        }
        if !seen.filter_nodeports {
            inf.add(Clue::new("no filter KUBE-NODEPORTS chain", 20, 20));
        }
    }
    if seen.forward_rules && !seen.invalid_drop {
        inf.add(Clue::since("no INVALID drop in KUBE-FORWARD", 29));
    }
    if seen.firewalls.values().any(|ended| !ended) {
        inf.add(Clue::new(
            "KUBE-FW-… without a final drop or \"other traffic\" rule",
            25,
            26,
        ));
    }
}

/// The table of `chain`: the header's, or for `iptables -S` output without one, the table
/// kube-proxy writes the chain in (`KUBE-SERVICES` and `KUBE-NODEPORTS`, in both, count as nat:
/// no clue reads their filter rules there).
fn table_of<'a>(header: &'a str, chain: &str) -> &'a str {
    if !header.is_empty() {
        return header;
    }
    match chain {
        "KUBE-FORWARD" | "KUBE-EXTERNAL-SERVICES" | "KUBE-PROXY-FIREWALL" | "INPUT" => "filter",
        _ => "nat",
    }
}

fn declared(table: &str, name: &str, seen: &mut Seen, inf: &mut Inference) {
    match (table, name) {
        ("filter", "KUBE-FORWARD") => seen.filter_forward = true,
        ("filter", "KUBE-NODEPORTS") => seen.filter_nodeports = true,
        ("filter", "KUBE-PROXY-FIREWALL") => {
            seen.proxy_firewall = true;
            inf.add_in(
                Clue::since("filter KUBE-PROXY-FIREWALL chain", 25),
                table,
                name,
            );
        }
        ("nat", n) if n.starts_with("KUBE-XLB-") => {
            inf.add_in(Clue::new("KUBE-XLB-… chains", 20, 23), table, name);
        }
        ("nat", n) if n.starts_with("KUBE-EXT-") || n.starts_with("KUBE-SVL-") => {
            inf.add_in(Clue::since("KUBE-EXT-…/KUBE-SVL-… chains", 24), table, name);
        }
        ("nat", "KUBE-SERVICES") => inf.has_rules = true,
        _ => {}
    }
}

fn rule<'t>(table: &str, chain: &'t str, line: &str, seen: &mut Seen<'t>, inf: &mut Inference) {
    let masq = || line.ends_with("-j KUBE-MARK-MASQ") || line.contains("-j KUBE-MARK-MASQ ");
    let mark_drop = || line.ends_with("-j KUBE-MARK-DROP") || line.contains("-j KUBE-MARK-DROP ");
    match (table, chain) {
        ("filter", "KUBE-FORWARD") => {
            if line.contains("kubernetes forwarding rules") {
                seen.forward_rules = true;
            }
            if line.contains("INVALID") {
                seen.invalid_drop = true;
                inf.invalid_drop_uncounted |= !line.contains("--nfacct-name");
            }
            if line.contains("conntrack pod source rule") {
                inf.add_in(
                    Clue::new(
                        "KUBE-FORWARD pod source/destination conntrack rules",
                        20,
                        22,
                    ),
                    table,
                    chain,
                );
            } else if line.contains("\"kubernetes forwarding conntrack rule\"") {
                inf.add_in(
                    Clue::since("one KUBE-FORWARD conntrack rule", 23),
                    table,
                    chain,
                );
            }
            if line.contains("--nfacct-name") {
                inf.add_in(Clue::since("nfacct counters", 31), table, chain);
            }
        }
        ("filter", "INPUT") if line.contains("kubernetes health check service ports") => {
            inf.add_in(
                Clue::since("INPUT jump to filter KUBE-NODEPORTS", 21),
                table,
                chain,
            );
        }
        ("filter", "KUBE-EXTERNAL-SERVICES" | "KUBE-SERVICES")
            if line.contains("has no local endpoints") =>
        {
            inf.add_in(
                Clue::since("filter \"has no local endpoints\" drops", 25),
                table,
                chain,
            );
        }
        ("nat", "KUBE-SERVICES") => {
            if masq() && line.contains(" cluster IP\"") {
                inf.add_in(
                    Clue::new("cluster IP masquerade in KUBE-SERVICES", 20, 21),
                    table,
                    chain,
                );
            }
            if line.contains("--physdev-is-in") {
                inf.add_in(Clue::new("external IP physdev rules", 20, 20), table, chain);
            }
            if line.contains(NODEPORTS_TAIL)
                && (line.contains("! -d 127.0.0.0/8") || line.contains("! -d ::1/128"))
            {
                inf.add_in(
                    Clue::since("NodePort jump excluding localhost", 26),
                    table,
                    chain,
                );
            } else if seen.ipv6
                && line.contains(NODEPORTS_TAIL)
                && line.contains("--dst-type LOCAL")
            {
                // From 1.26 IPv6 NodePorts always exclude ::1.
                inf.add_in(
                    Clue::new("IPv6 NodePort jump including ::1", 20, 25),
                    table,
                    chain,
                );
            }
        }
        ("nat", "KUBE-NODEPORTS") => {
            if masq() && line.contains(" -s 127.0.0.0/8") {
                inf.add_in(
                    Clue::new("localhost NodePort masquerade in KUBE-NODEPORTS", 20, 23),
                    table,
                    chain,
                );
            }
            if line.contains("--nfacct-name") {
                inf.add_in(Clue::since("nfacct counters", 31), table, chain);
            }
        }
        ("nat", c) if c.starts_with("KUBE-SVC-") => {
            if masq() && line.contains(" cluster IP\"") {
                inf.add_in(
                    Clue::since("cluster IP masquerade in KUBE-SVC-…", 22),
                    table,
                    chain,
                );
            }
            if line.contains("-j KUBE-SEP-") && line.contains("--comment") {
                if line.contains(" -> ") {
                    inf.add_in(
                        Clue::since("\"<svc> -> <endpoint>\" comments", 24),
                        table,
                        chain,
                    );
                } else {
                    inf.add_in(
                        Clue::new("service-name-only endpoint comments", 20, 23),
                        table,
                        chain,
                    );
                }
            }
        }
        ("nat", c) if c.starts_with("KUBE-XLB-") && line.contains("\"Balancing rule ") => {
            inf.add_in(
                Clue::new("\"Balancing rule N\" comments", 20, 22),
                table,
                chain,
            );
        }
        ("nat", c) if c.starts_with("KUBE-FW-") => {
            let mut ended = false;
            if mark_drop() {
                ended = true;
                inf.add_in(
                    Clue::new("KUBE-MARK-DROP in KUBE-FW-…", 20, 24),
                    table,
                    chain,
                );
            }
            if masq() {
                inf.add_in(Clue::new("masquerade in KUBE-FW-…", 20, 23), table, chain);
            }
            if line.contains("will be dropped by KUBE-PROXY-FIREWALL") {
                ended = true;
                inf.add_in(
                    Clue::since("KUBE-FW-… \"other traffic\" rule", 27),
                    table,
                    chain,
                );
            }
            let e = seen.firewalls.entry(c).or_default();
            *e |= ended;
        }
        ("nat", c) if c.starts_with("KUBE-SVL-") && mark_drop() => {
            inf.add_in(
                Clue::new("KUBE-MARK-DROP in KUBE-SVL-…", 24, 24),
                table,
                chain,
            );
        }
        _ => {}
    }
}

const NODEPORTS_TAIL: &str = "kubernetes service nodeports; NOTE: this must be the last rule";

/// Where the release to compare with came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseSource {
    /// `--kube-proxy-version`.
    Flag,
    /// The kube-proxy pod's image (the reference).
    Image(String),
    /// The dump's own rules ([`Inference::pick`]), or the newest when they say nothing.
    Inferred,
}

/// The release `verify` or `repair` works with, why, and what the dump says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseChoice {
    /// The release.
    pub version: KubeProxyVersion,
    /// Where it came from.
    pub source: ReleaseSource,
    /// What the dump's rules say.
    pub inference: Inference,
    /// The release that wrote the rules, when the dump says it is not `version`.
    pub writer: Option<KubeProxyVersion>,
    /// What to tell the user on stderr, one line each.
    pub notes: Vec<String>,
}

impl ReleaseChoice {
    /// Why this release: `--kube-proxy-version`, `the kube-proxy pod's image …`, or what the
    /// rules say.
    pub fn source_text(&self) -> String {
        match &self.source {
            ReleaseSource::Flag => "--kube-proxy-version".to_string(),
            ReleaseSource::Image(img) => format!("the kube-proxy pod's image {img}"),
            ReleaseSource::Inferred => self.inference.describe(),
        }
    }

    /// `flag`, `image` or `rules`: [`ReleaseChoice::source`] as one word.
    pub fn source_word(&self) -> &'static str {
        match self.source {
            ReleaseSource::Flag => "flag",
            ReleaseSource::Image(_) => "image",
            ReleaseSource::Inferred => "rules",
        }
    }
}

/// A release this build cannot work with: the kube-proxy pod runs one newer than it knows.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the kube-proxy pod runs {image}: {reason} (pass --kube-proxy-version X.Y only if you know its rules are those of an older release)"
)]
pub struct NewerRelease {
    /// The pod's image.
    pub image: String,
    /// Why: the version error, naming the newest release this build knows.
    pub reason: crate::state::version::VersionError,
}

/// Chooses the release to `verb` ("verifying", "repairing") with: `flag`, else the kube-proxy
/// pod's `image` tag, else what `inference` says (the newest when it says nothing). An image
/// whose name or tag names no release (k3s, RKE2 and some managed offerings rebuild kube-proxy)
/// is noted and the rules decide. An image of a release newer than this build is refused, never
/// taken for the newest known: its rules may have a layout this build cannot read.
pub fn choose_release(
    flag: Option<KubeProxyVersion>,
    image: Option<&str>,
    inference: Inference,
    verb: &str,
) -> Result<ReleaseChoice, NewerRelease> {
    let mut notes = Vec::new();
    let from_image = match (flag, image) {
        (None, Some(img)) => match KubeProxyVersion::from_image(img) {
            Ok(v) => Some((v, img.to_string())),
            Err(reason @ crate::state::version::VersionError::TooNew(_)) => {
                return Err(NewerRelease {
                    image: img.to_string(),
                    reason,
                });
            }
            Err(e) => {
                notes.push(format!(
                    "the kube-proxy pod's {e}; meanwhile the rules' own clues decide"
                ));
                None
            }
        },
        _ => None,
    };
    let (version, source) = match (flag, from_image) {
        (Some(v), _) => (v, ReleaseSource::Flag),
        (None, Some((v, img))) => (v, ReleaseSource::Image(img)),
        (None, None) => {
            let v = inference.pick().unwrap_or_default();
            notes.push(format!(
                "{}; {verb} with {v}, pass --kube-proxy-version to choose",
                inference.describe()
            ));
            (v, ReleaseSource::Inferred)
        }
    };
    let writer = if source == ReleaseSource::Inferred || inference.admits(version) {
        None
    } else {
        inference.writer_nearest(version)
    };
    if let Some(w) = writer {
        let by = match &source {
            ReleaseSource::Image(img) => format!("the kube-proxy pod's image {img}"),
            _ => "--kube-proxy-version".to_string(),
        };
        notes.push(format!(
            "{}, not {version} as {by} says: the differences kube-proxy {w}'s rules explain are reported together (KP906)",
            inference.describe()
        ));
    }
    Ok(ReleaseChoice {
        version,
        source,
        inference,
        writer,
        notes,
    })
}

/// The info finding (KP907) that says which release the rules were verified with, chosen from
/// the dump.
pub fn inferred_finding(inference: &Inference, used: KubeProxyVersion) -> Finding {
    let clues: Vec<String> = inference.clues.iter().map(Clue::describe).collect();
    cat::VERSION_INFERRED
        .finding(format!(
            "{}; verifying with {used}, pass --kube-proxy-version to choose",
            inference.describe()
        ))
        .expected(format!("the rules of kube-proxy {used}"))
        .actual(if clues.is_empty() {
            "no version-specific rules".to_string()
        } else {
            clues.join(", ")
        })
}

/// KP908: rules of more than one release on the node.
pub fn mixed_finding(inference: &Inference) -> Option<Finding> {
    let strays = inference.strays_seen_in();
    let (oldest, newest) = inference.range()?;
    if strays.is_empty() {
        return None;
    }
    let first_at = strays.iter().map(|(_, at)| *at).find(|at| !at.is_empty());
    let stray_text: Vec<String> = strays
        .iter()
        .map(|(c, at)| {
            if at.is_empty() {
                c.describe()
            } else {
                format!("{} in {at}", c.describe())
            }
        })
        .collect();
    let f = cat::VERSIONS_MIXED
        .finding(format!(
            "rules of more than one kube-proxy release: most look written by {}, but {} (a half-finished upgrade or a downgrade?)",
            range_text(oldest, newest),
            stray_text.join(", ")
        ))
        .expected(format!("the rules of one release ({})", range_text(oldest, newest)))
        .actual(stray_text.join(", "));
    Some(match first_at {
        Some(at) => f.chain(at.to_string()),
        None => f,
    })
}

/// The findings of comparing with `asked` when the rules are `writer`'s: the differences that
/// also show when comparing with `writer` stay as they are; the others (`asked`'s findings that
/// `writer`'s rules explain) become one KP906 finding.
pub fn group_release_differences(
    asked_findings: Vec<Finding>,
    writer_findings: &[Finding],
    asked: KubeProxyVersion,
    writer: KubeProxyVersion,
    inference: &Inference,
) -> Vec<Finding> {
    let key = |f: &Finding| {
        (
            f.id,
            f.service.clone(),
            f.chain.clone(),
            f.message.clone(),
            f.expected.clone(),
            f.actual.clone(),
        )
    };
    let writers: HashSet<_> = writer_findings.iter().map(key).collect();
    let (kept, explained): (Vec<Finding>, Vec<Finding>) = asked_findings
        .into_iter()
        .partition(|f| writers.contains(&key(f)) || f.severity == super::Severity::Info);
    let mut out = kept;
    if explained.is_empty() {
        return out;
    }
    let chains: Vec<String> = {
        let mut c: Vec<String> = explained.iter().filter_map(|f| f.chain.clone()).collect();
        c.sort();
        c.dedup();
        c
    };
    let shown: Vec<&str> = chains.iter().take(6).map(String::as_str).collect();
    let more = chains.len().saturating_sub(shown.len());
    let clues: Vec<String> = inference.clues.iter().map(Clue::describe).collect();
    out.push(
        cat::OTHER_RELEASE
            .finding(format!(
                "{} rule(s) differ the way rules of kube-proxy {writer} differ from {asked}: rules written by another kube-proxy version?",
                explained.len()
            ))
            .expected(format!("the rules of kube-proxy {asked} (--kube-proxy-version)"))
            .actual(format!(
                "{} (compared as {writer}), in {}{}{}",
                inference.describe(),
                shown.join(", "),
                if more > 0 {
                    format!(" and {more} more chain(s)")
                } else {
                    String::new()
                },
                if clues.is_empty() {
                    String::new()
                } else {
                    format!("; clues: {}", clues.join(", "))
                }
            ))
            .hint(format!(
                "if the node runs kube-proxy {writer}, verify with --kube-proxy-version {writer}; if it runs {asked}, its kube-proxy has not rewritten the rules since the upgrade (restart it, or kubectl kproxy repair)"
            )),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(minor: u32) -> KubeProxyVersion {
        KubeProxyVersion::of_minor(minor).expect("known")
    }

    fn real_world(name: &str) -> Option<String> {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/conformance/iptables/real-world/"
        );
        std::fs::read_to_string(format!("{path}{name}")).ok()
    }

    const V123: &str = "*filter\n:KUBE-EXTERNAL-SERVICES - [0:0]\n:KUBE-FORWARD - [0:0]\n:KUBE-NODEPORTS - [0:0]\n:KUBE-SERVICES - [0:0]\n-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP\n-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\n-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT\nCOMMIT\n*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-SVC-AAAAAAAAAAAAAAAA - [0:0]\n-A KUBE-SVC-AAAAAAAAAAAAAAAA ! -s 10.0.0.0/8 -d 10.96.0.1/32 -p tcp -m comment --comment \"default/kubernetes:https cluster IP\" -m tcp --dport 443 -j KUBE-MARK-MASQ\n-A KUBE-SVC-AAAAAAAAAAAAAAAA -m comment --comment \"default/kubernetes:https\" -j KUBE-SEP-BBBBBBBBBBBBBBBB\nCOMMIT\n";

    #[test]
    fn a_1_23_dump_is_1_23() {
        let inf = infer([V123]);
        assert_eq!(inf.range(), Some((v(23), v(23))), "{:?}", inf.clues);
        assert_eq!(inf.pick(), Some(v(23)));
        assert!(inf.strays().is_empty());
        assert!(!inf.admits(v(24)) && inf.admits(v(23)));
        assert_eq!(inf.writer_nearest(v(35)), Some(v(23)));
        assert_eq!(inf.describe(), "rules look written by kube-proxy 1.23");
    }

    #[test]
    fn counters_before_rules_are_read_past() {
        let counted: String = V123
            .lines()
            .map(|l| {
                if l.starts_with("-A ") {
                    format!("[12:3456] {l}\n")
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        assert_eq!(infer([counted.as_str()]), infer([V123]));
    }

    #[test]
    fn clues_narrow_the_range() {
        // The masquerade rule in the service chain (1.22+) with the old conntrack rules (≤1.22).
        let t = V123.replace(
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\"",
            "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack pod source rule\"",
        );
        assert_eq!(infer([t.as_str()]).range(), Some((v(22), v(22))));
        // Without the service rules: 1.21 (filter KUBE-NODEPORTS) … 1.24 (no KUBE-PROXY-FIREWALL),
        // the merged conntrack rule narrows it to 1.23–1.24.
        let filter_only = V123.split("*nat").next().unwrap_or("");
        let inf = infer([filter_only]);
        assert_eq!(inf.range(), Some((v(23), v(24))));
        assert_eq!(inf.describe(), "rules look written by kube-proxy 1.23–1.24");
        assert_eq!(inf.pick(), Some(v(24)));
        // Nothing of kube-proxy's: no range.
        let none = infer(["*nat\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"]);
        assert_eq!((none.range(), none.has_rules), (None, false));
    }

    #[test]
    fn a_mix_of_releases_names_the_strays() {
        // A 1.24 node that still holds a KUBE-XLB chain of the release before.
        let v124 = V123.replace(
            "--comment \"default/kubernetes:https\" -j KUBE-SEP",
            "--comment \"default/kubernetes:https -> 10.0.0.1:6443\" -j KUBE-SEP",
        );
        let mixed = format!(
            "{v124}*nat\n:KUBE-EXT-CCCCCCCCCCCCCCCC - [0:0]\n:KUBE-XLB-DDDDDDDDDDDDDDDD - [0:0]\nCOMMIT\n"
        );
        let inf = infer([mixed.as_str()]);
        assert_eq!(inf.range(), Some((v(24), v(24))), "{:?}", inf.clues);
        let strays = inf.strays();
        assert_eq!(strays.len(), 1);
        assert_eq!(strays[0].what, "KUBE-XLB-… chains");
        let f = mixed_finding(&inf).expect("a mix");
        assert_eq!(f.id, "KP908");
        assert!(
            f.message
                .contains("KUBE-XLB-… chains (1.20–1.23) in nat KUBE-XLB-DDDDDDDDDDDDDDDD"),
            "{}",
            f.message
        );
        assert_eq!(f.chain.as_deref(), Some("nat KUBE-XLB-DDDDDDDDDDDDDDDD"));
        assert!(mixed_finding(&infer([V123])).is_none());
    }

    #[test]
    fn real_world_dumps() {
        let cases = [
            ("01-kind-v1.23-traefik-full.txt", 23, 23),
            (
                "27-gke-2018-xlb-session-affinity-recent-balancing-rule.txt",
                20,
                22,
            ),
            (
                "31-eks-v1.34-iptables-t-nat-S-nfacct-xor-mark-random-fully.txt",
                31,
                KubeProxyVersion::NEWEST.minor(),
            ),
        ];
        let mut read = 0;
        for (name, oldest, newest) in cases {
            let Some(text) = real_world(name) else {
                continue;
            };
            read += 1;
            let inf = infer([text.as_str()]);
            let (lo, hi) = inf.range().unwrap_or_else(|| panic!("{name}: no clue"));
            assert!(
                lo.minor() >= oldest && hi.minor() <= newest,
                "{name}: {} from {:?}",
                inf.describe(),
                inf.clues
            );
        }
        if read == 0 {
            println!("notice: ../shared absent; real-world dumps not read");
        }
    }

    /// The `kube-proxy` table of an `nft -f` text, parsed and normalised.
    fn nft_inference(text: &str) -> Inference {
        let mut rs = kproxy_parsers::nft::parse(text, &kproxy_parsers::nft::ParseOptions::strict())
            .expect("parses");
        rs.normalize();
        let table = rs
            .table(kproxy_parsers::nft::Family::Ip, "kube-proxy")
            .expect("table");
        infer_nftables(&[table])
    }

    const NFT_HEAD: &str = "add table ip kube-proxy\nadd chain ip kube-proxy services\n";

    #[test]
    fn nftables_tables_tell_their_release() {
        let g3 = format!(
            "{NFT_HEAD}add chain ip kube-proxy mark-for-masquerade\n\
             add chain ip kube-proxy endpoint-X\n\
             add rule ip kube-proxy endpoint-X ip saddr 10.0.0.1 jump mark-for-masquerade\n"
        );
        assert_eq!(nft_inference(&g3).range(), Some((v(29), v(35))));
        let g4 = format!(
            "{NFT_HEAD}add set ip kube-proxy hairpin-connections {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service ; }}\n\
             add chain ip kube-proxy service-A\n\
             add rule ip kube-proxy service-A meta l4proto tcp dnat ip addr . port to numgen random mod 1 map {{ 0 : 10.0.0.1 . 80 }}\n"
        );
        assert_eq!(nft_inference(&g4).range(), Some((v(36), v(36))));
        let v37 = format!(
            "{NFT_HEAD}add set ip kube-proxy hairpin-connections {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service ; }}\n\
             add chain ip kube-proxy service-A\n\
             add rule ip kube-proxy service-A meta l4proto tcp dnat to 10.0.0.1:80\n"
        );
        assert_eq!(nft_inference(&v37).range(), Some((v(37), v(37))));
        let v38 = format!(
            "{v37}add map ip kube-proxy localhost-nodeport-reject-ports {{ type inet_proto . inet_service : verdict ; }}\n"
        );
        assert_eq!(nft_inference(&v38).range(), Some((v(38), v(38))));
        // An upgraded node's orphan chain is residue, no clue.
        let upgraded = format!(
            "{v37}add chain ip kube-proxy mark-for-masquerade\nadd rule ip kube-proxy mark-for-masquerade mark set mark or 0x4000\n"
        );
        let inf = nft_inference(&upgraded);
        assert_eq!(inf.range(), Some((v(37), v(37))));
        assert!(inf.strays().is_empty());
        let mut rs =
            kproxy_parsers::nft::parse(&upgraded, &kproxy_parsers::nft::ParseOptions::strict())
                .expect("parses");
        rs.normalize();
        let table = rs
            .table(kproxy_parsers::nft::Family::Ip, "kube-proxy")
            .expect("table");
        assert!(upgrade_residue(table));
        let mut rs = kproxy_parsers::nft::parse(&g3, &kproxy_parsers::nft::ParseOptions::strict())
            .expect("parses");
        rs.normalize();
        let table = rs
            .table(kproxy_parsers::nft::Family::Ip, "kube-proxy")
            .expect("table");
        assert!(
            !upgrade_residue(table),
            "a chain something jumps to is no residue"
        );
    }

    #[test]
    fn the_flag_then_the_image_then_the_rules_choose() {
        let v123 = || infer([V123]);
        let c = choose_release(
            Some(v(35)),
            Some("registry.k8s.io/kube-proxy:v1.28.4"),
            v123(),
            "verifying",
        )
        .unwrap();
        assert_eq!(
            (c.version, &c.source, c.writer),
            (v(35), &ReleaseSource::Flag, Some(v(23)))
        );
        assert!(
            c.notes[0].contains("1.23, not 1.35 as --kube-proxy-version says"),
            "{:?}",
            c.notes
        );
        let c = choose_release(
            None,
            Some("registry.k8s.io/kube-proxy:v1.23.17"),
            v123(),
            "verifying",
        )
        .unwrap();
        assert_eq!((c.version, c.writer), (v(23), None));
        assert!(c.notes.is_empty(), "{:?}", c.notes);
        let c = choose_release(
            None,
            Some("rancher/hardened-kubernetes:v1.28.4-rke2r1"),
            v123(),
            "repairing",
        )
        .unwrap();
        assert_eq!((c.version, &c.source), (v(23), &ReleaseSource::Inferred));
        assert!(
            c.notes[0].contains("pass --kube-proxy-version X.Y"),
            "{:?}",
            c.notes
        );
        assert_eq!(
            c.notes[1],
            "rules look written by kube-proxy 1.23; repairing with 1.23, pass --kube-proxy-version to choose"
        );
        let c = choose_release(None, None, Inference::default(), "verifying").unwrap();
        assert_eq!(c.version, KubeProxyVersion::DEFAULT);
        assert!(c.notes[0].starts_with("the dump holds no kube-proxy rules; verifying with 1.35"));
        let refused = choose_release(
            None,
            Some("registry.k8s.io/kube-proxy:v1.40.0"),
            v123(),
            "verifying",
        )
        .expect_err("a release newer than the build is refused");
        assert!(
            refused.to_string().contains(&format!(
                "newer than the newest release this build knows ({})",
                KubeProxyVersion::NEWEST
            )),
            "{refused}"
        );
        let c = choose_release(
            Some(v(36)),
            Some("registry.k8s.io/kube-proxy:v1.40.0"),
            Inference::default(),
            "verifying",
        )
        .expect("the flag wins over the image");
        assert_eq!(c.version, v(36));
    }

    #[test]
    fn differences_the_writer_explains_become_one_finding() {
        let drift = cat::RULE_MISSING
            .finding("nat KUBE-SEP-X lacks a rule kube-proxy writes")
            .chain("nat KUBE-SEP-X");
        let release = |chain: &str| {
            cat::CHAIN_MISSING
                .finding(format!("{chain} is missing"))
                .chain(chain.to_string())
        };
        let asked = vec![
            drift.clone(),
            release("filter KUBE-PROXY-FIREWALL"),
            release("filter KUBE-FIREWALL"),
        ];
        let out = group_release_differences(
            asked,
            std::slice::from_ref(&drift),
            v(35),
            v(24),
            &infer([V123]),
        );
        assert_eq!(out.len(), 2);
        assert_eq!(out[0], drift);
        let grouped = &out[1];
        assert_eq!(grouped.id, "KP906");
        assert!(
            grouped
                .message
                .starts_with("2 rule(s) differ the way rules of kube-proxy 1.24 differ from 1.35"),
            "{}",
            grouped.message
        );
        assert!(
            grouped
                .actual
                .as_deref()
                .is_some_and(|a| a.contains("filter KUBE-FIREWALL, filter KUBE-PROXY-FIREWALL"))
        );
    }
}
