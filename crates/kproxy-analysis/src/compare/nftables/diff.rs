//! The difference between the expected `kube-proxy` table and the node's, both normalised
//! ([`kproxy_parsers::nft::Ruleset::normalize`]): per chain (missing, hooked differently, other
//! rules, not kube-proxy's), per set and map (missing, declared differently, elements missing,
//! extra or with another value, not kube-proxy's). `verify` turns it into findings, `repair` into
//! an `nft -f` transaction.
//!
//! What a stateless render cannot know is not a difference (as in kube-proxy's own tests,
//! `pkg/proxy/nftables/proxier_test.go`): a per-service chain (a `/` in its name) that is empty
//! and that nothing refers to is one kube-proxy flushed and deletes on a later sync; the
//! elements of session-affinity sets are written by packets (`update @affinity-…`), not by
//! kube-proxy; comments of elements (kube-proxy's element store ignores them, `ensureElem`).

use kproxy_parsers::nft::{Chain, Element, Expr, Family, Set, Stmt, Table, Verdict};
use std::cmp::Ordering;
use std::collections::HashSet;

/// One chain that differs.
#[derive(Debug, Clone)]
pub enum ChainDiff<'t, 'e, 'a> {
    /// The node lacks the chain.
    Missing {
        /// The expected chain.
        expected: &'t Chain<'e>,
    },
    /// The chain is a base chain where it should not be, or hooked with another type, hook,
    /// priority or policy (its rules may differ too).
    Hook {
        /// The expected chain.
        expected: &'t Chain<'e>,
        /// The node's chain.
        actual: &'t Chain<'a>,
    },
    /// The rules differ (in content or order).
    Rules {
        /// The expected chain.
        expected: &'t Chain<'e>,
        /// The node's chain.
        actual: &'t Chain<'a>,
    },
    /// A chain kube-proxy would not have (a stale per-service chain that still has rules or is
    /// referred to, or a chain that is none of kube-proxy's).
    Extra {
        /// The node's chain.
        actual: &'t Chain<'a>,
        /// A map element of the node's table leads to it (its deletion must wait for the
        /// element's on kernels before 6.2).
        from_element: bool,
    },
}

impl ChainDiff<'_, '_, '_> {
    /// The chain's name.
    pub fn name(&self) -> &str {
        match self {
            ChainDiff::Missing { expected }
            | ChainDiff::Hook { expected, .. }
            | ChainDiff::Rules { expected, .. } => &expected.name,
            ChainDiff::Extra { actual, .. } => &actual.name,
        }
    }
}

/// One set or map that differs.
#[derive(Debug, Clone)]
pub enum SetDiff<'t, 'e, 'a> {
    /// The node lacks it.
    Missing {
        /// The expected set.
        expected: &'t Set<'e>,
    },
    /// Declared with another type, flags or timeout (it must be made again).
    Declaration {
        /// The expected set.
        expected: &'t Set<'e>,
        /// The node's set.
        actual: &'t Set<'a>,
    },
    /// Same declaration, other elements.
    Elements {
        /// The expected set.
        expected: &'t Set<'e>,
        /// The node's set.
        actual: &'t Set<'a>,
        /// Expected elements the node lacks.
        missing: Vec<&'t Element<'e>>,
        /// The node's elements kube-proxy would not have.
        extra: Vec<&'t Element<'a>>,
        /// Keys with another value: (expected, node's).
        changed: Vec<(&'t Element<'e>, &'t Element<'a>)>,
    },
    /// A set kube-proxy would not have (a stale session-affinity set, or none of kube-proxy's).
    Extra {
        /// The node's set.
        actual: &'t Set<'a>,
    },
}

impl SetDiff<'_, '_, '_> {
    /// The set's name.
    pub fn name(&self) -> &str {
        match self {
            SetDiff::Missing { expected }
            | SetDiff::Declaration { expected, .. }
            | SetDiff::Elements { expected, .. } => &expected.name,
            SetDiff::Extra { actual } => &actual.name,
        }
    }
}

/// The differences of one family's table.
#[derive(Debug, Clone)]
pub struct TableDiff<'t, 'e, 'a> {
    /// `ip` or `ip6`.
    pub family: Family,
    /// The node has no `kube-proxy` table of this family at all.
    pub table_missing: bool,
    /// Chains that differ, by name.
    pub chains: Vec<ChainDiff<'t, 'e, 'a>>,
    /// Sets and maps that differ, by name.
    pub sets: Vec<SetDiff<'t, 'e, 'a>>,
    /// Named objects (counters, quotas, …) of the node's table that the render does not have.
    pub extra_objects: Vec<&'t kproxy_parsers::nft::Object<'a>>,
    /// Named objects of the render that the node's table lacks (a table that is missing as a
    /// whole lists none: it is made with everything in it).
    pub missing_objects: Vec<&'t kproxy_parsers::nft::Object<'e>>,
}

impl TableDiff<'_, '_, '_> {
    /// True when the tables are the same (as far as a render can know).
    pub fn is_empty(&self) -> bool {
        !self.table_missing
            && self.chains.is_empty()
            && self.sets.is_empty()
            && self.extra_objects.is_empty()
            && self.missing_objects.is_empty()
    }
}

/// Whether kube-proxy's element store manages `set`'s elements (the fixed sets and maps): the
/// elements of timeout sets (session affinity) are written by packets.
pub fn elements_managed(set: &Set<'_>) -> bool {
    !set.flags.timeout
        && !set
            .name
            .starts_with(crate::proxier::nftables::names::AFFINITY_PREFIX)
}

/// Whether two sets are declared alike (type, data type, flags, timeout; comments, sizes and
/// GC intervals are the kernel's or cosmetic).
fn same_declaration(e: &Set<'_>, a: &Set<'_>) -> bool {
    e.is_map == a.is_map
        && e.key == a.key
        && e.data == a.data
        && e.flags.constant == a.flags.constant
        && e.flags.interval == a.flags.interval
        && e.flags.timeout == a.flags.timeout
        && e.flags.other == a.flags.other
        && e.timeout == a.timeout
}

/// Compares two normalised tables (`actual` `None`: the node has no such table). Both must be
/// normalised: chains, sets and elements sorted.
pub fn diff<'t, 'e, 'a>(
    expected: &'t Table<'e>,
    actual: Option<&'t Table<'a>>,
) -> TableDiff<'t, 'e, 'a> {
    let Some(actual) = actual else {
        return TableDiff {
            family: expected.family,
            table_missing: true,
            chains: expected
                .chains
                .iter()
                .map(|c| ChainDiff::Missing { expected: c })
                .collect(),
            sets: expected
                .sets
                .iter()
                .map(|s| SetDiff::Missing { expected: s })
                .collect(),
            extra_objects: Vec::new(),
            missing_objects: Vec::new(),
        };
    };
    let mut chains = Vec::new();
    let mut extra_chains: Vec<&'t Chain<'a>> = Vec::new();
    merge(
        &expected.chains,
        &actual.chains,
        |e, a| e.name.as_ref().cmp(a.name.as_ref()),
        |e, a| match (e, a) {
            (Some(e), None) => chains.push(ChainDiff::Missing { expected: e }),
            (None, Some(a)) => extra_chains.push(a),
            (Some(e), Some(a)) => {
                if e.base != a.base {
                    chains.push(ChainDiff::Hook {
                        expected: e,
                        actual: a,
                    });
                } else if e.rules != a.rules {
                    chains.push(ChainDiff::Rules {
                        expected: e,
                        actual: a,
                    });
                }
            }
            (None, None) => {}
        },
    );
    if !extra_chains.is_empty() {
        let refs = References::of(actual);
        for a in extra_chains {
            let stale_and_flushed = crate::proxier::nftables::names::is_service_chain_name(&a.name)
                && a.rules.is_empty()
                && !refs.by_rule.contains(a.name.as_ref())
                && !refs.by_element.contains(a.name.as_ref());
            // kube-proxy 1.36+ leaves an upgraded node's `mark-for-masquerade`: residue
            // (`compare::version::upgrade_residue`), not drift, and not repair's to delete.
            let upgrade_residue = a.name == crate::proxier::nftables::names::MARK_MASQ_CHAIN
                && !refs.by_rule.contains(a.name.as_ref())
                && !refs.by_element.contains(a.name.as_ref());
            if !stale_and_flushed && !upgrade_residue {
                chains.push(ChainDiff::Extra {
                    actual: a,
                    from_element: refs.by_element.contains(a.name.as_ref()),
                });
            }
        }
        chains.sort_by(|x, y| x.name().cmp(y.name()));
    }
    let mut sets = Vec::new();
    merge(
        &expected.sets,
        &actual.sets,
        |e, a| e.name.as_ref().cmp(a.name.as_ref()),
        |e, a| match (e, a) {
            (Some(e), None) => sets.push(SetDiff::Missing { expected: e }),
            (None, Some(a)) => sets.push(SetDiff::Extra { actual: a }),
            (Some(e), Some(a)) => {
                if !same_declaration(e, a) {
                    sets.push(SetDiff::Declaration {
                        expected: e,
                        actual: a,
                    });
                } else if elements_managed(e) {
                    let d = element_diff(e, a);
                    if d.0.len() + d.1.len() + d.2.len() > 0 {
                        sets.push(SetDiff::Elements {
                            expected: e,
                            actual: a,
                            missing: d.0,
                            extra: d.1,
                            changed: d.2,
                        });
                    }
                }
            }
            (None, None) => {}
        },
    );
    TableDiff {
        family: expected.family,
        table_missing: false,
        chains,
        sets,
        // kube-proxy writes named counters from 1.37 with KubeProxyNFTablesLocalhostNodePorts on
        // (on by default from 1.38): the localhost NodePort rejects.
        extra_objects: actual
            .objects
            .iter()
            .filter(|o| !has_object(&expected.objects, o))
            .collect(),
        missing_objects: expected
            .objects
            .iter()
            .filter(|o| !has_object(&actual.objects, o))
            .collect(),
    }
}

/// Whether `objects` has one of `o`'s kind and name (bodies hold the kernel's counts).
fn has_object(
    objects: &[kproxy_parsers::nft::Object<'_>],
    o: &kproxy_parsers::nft::Object<'_>,
) -> bool {
    objects.iter().any(|x| x.kind == o.kind && x.name == o.name)
}

/// Missing, extra and changed elements (compared by key, then value; comments ignored).
#[allow(clippy::type_complexity)]
fn element_diff<'t, 'e, 'a>(
    e: &'t Set<'e>,
    a: &'t Set<'a>,
) -> (
    Vec<&'t Element<'e>>,
    Vec<&'t Element<'a>>,
    Vec<(&'t Element<'e>, &'t Element<'a>)>,
) {
    let (mut missing, mut extra, mut changed) = (Vec::new(), Vec::new(), Vec::new());
    merge(
        &e.elements,
        &a.elements,
        |x, y| x.key.cmp(&y.key),
        |x, y| match (x, y) {
            (Some(x), None) => missing.push(x),
            (None, Some(y)) => extra.push(y),
            (Some(x), Some(y)) if x.value != y.value => changed.push((x, y)),
            _ => {}
        },
    );
    (missing, extra, changed)
}

/// Walks two sorted lists together, calling `each` with the items of equal keys paired and the
/// others alone.
fn merge<'t, E, A>(
    expected: &'t [E],
    actual: &'t [A],
    cmp: impl Fn(&E, &A) -> Ordering,
    mut each: impl FnMut(Option<&'t E>, Option<&'t A>),
) {
    let (mut i, mut j) = (0, 0);
    while i < expected.len() || j < actual.len() {
        match (expected.get(i), actual.get(j)) {
            (Some(e), Some(a)) => match cmp(e, a) {
                Ordering::Less => {
                    each(Some(e), None);
                    i += 1;
                }
                Ordering::Greater => {
                    each(None, Some(a));
                    j += 1;
                }
                Ordering::Equal => {
                    each(Some(e), Some(a));
                    i += 1;
                    j += 1;
                }
            },
            (Some(e), None) => {
                each(Some(e), None);
                i += 1;
            }
            (None, Some(a)) => {
                each(None, Some(a));
                j += 1;
            }
            (None, None) => break,
        }
    }
}

/// The chains a table's rules and map elements lead to (`jump`/`goto`, also inside anonymous
/// verdict maps).
#[derive(Debug, Default)]
pub struct References<'t> {
    /// Chains named by a rule's verdict.
    pub by_rule: HashSet<&'t str>,
    /// Chains named by a named map's element.
    pub by_element: HashSet<&'t str>,
}

impl<'t> References<'t> {
    /// The references of `table`.
    pub fn of(table: &'t Table<'_>) -> References<'t> {
        let mut refs = References::default();
        for c in &table.chains {
            for r in &c.rules {
                for s in &r.stmts {
                    match s {
                        Stmt::Verdict(v) => refs.by_rule.extend(target(v)),
                        Stmt::Vmap {
                            map: Expr::Set(elements),
                            ..
                        } => {
                            for e in elements {
                                if let Some(Expr::Verdict(v)) = &e.value {
                                    refs.by_rule.extend(target(v));
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        for s in &table.sets {
            for e in &s.elements {
                if let Some(Expr::Verdict(v)) = &e.value {
                    refs.by_element.extend(target(v));
                }
            }
        }
        refs
    }
}

/// The chain a verdict leads to.
pub fn target<'t>(v: &'t Verdict<'_>) -> Option<&'t str> {
    match v {
        Verdict::Jump(c) | Verdict::Goto(c) => Some(c),
        _ => None,
    }
}
