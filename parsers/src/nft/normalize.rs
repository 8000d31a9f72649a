//! The canonical form in which a ruleset read from any input form compares equal to the same
//! ruleset read from the others (see the module doc of [`super`] for the list of rewrites).

use std::borrow::Cow;

use super::ast::{
    Chain, Element, Expr, Family, Policy, RejectWith, RelOp, Ruleset, Set, SetType, Stmt, Table,
};

impl Ruleset<'_> {
    /// Rewrites the tables into their canonical form, in place: what one form keeps and another
    /// drops or rewrites is brought to one spelling, order that carries no meaning is sorted, and
    /// kernel state (handles, counters, `expires`) is cleared. Rule order within a chain is kept.
    /// `form`, `warnings` and `skipped` are left as they are.
    pub fn normalize(&mut self) {
        for t in &mut self.tables {
            normalize_table(t);
        }
        self.tables
            .sort_by(|a, b| (a.family, &a.name).cmp(&(b.family, &b.name)));
    }
}

/// One table.
fn normalize_table(t: &mut Table<'_>) {
    t.handle = None;
    t.line = 0;
    t.comment = None;
    t.managed_by_iptables_nft = false;
    t.flags.sort();
    for o in &mut t.objects {
        o.line = 0;
        // A counter object holds nothing but its values (kernel state), listed as text or as
        // the whole JSON object.
        if o.kind == "counter" {
            o.body = Cow::Borrowed("");
        }
    }
    t.objects
        .sort_by(|a, b| (&a.kind, &a.name).cmp(&(&b.kind, &b.name)));
    for s in &mut t.sets {
        normalize_set(s);
    }
    t.sets.sort_by(|a, b| a.name.cmp(&b.name));
    for c in &mut t.chains {
        normalize_chain(c, t.family);
    }
    t.chains.sort_by(|a, b| a.name.cmp(&b.name));
}

/// One set or map.
fn normalize_set(s: &mut Set<'_>) {
    s.handle = None;
    s.line = 0;
    s.size = None;
    s.flags.dynamic = false;
    s.flags.other.sort();
    named_type(&mut s.key);
    if let Some(d) = &mut s.data {
        named_type(d);
    }
    normalize_elements(&mut s.elements);
}

/// Elements of a set, map or anonymous set: each normalised, then sorted, duplicates dropped.
fn normalize_elements(elements: &mut Vec<Element<'_>>) {
    for e in elements.iter_mut() {
        normalize_expr(&mut e.key);
        if let Some(v) = &mut e.value {
            normalize_expr(v);
        }
        e.expires = None;
        e.counter = None;
    }
    elements.sort();
    elements.dedup();
}

/// `typeof EXPR` → `type NAME` for the expressions whose type nft names in JSON.
fn named_type(t: &mut SetType<'_>) {
    let SetType::Typeof(e) = t else {
        return;
    };
    let parts = match e {
        Expr::Concat(parts) => parts.iter().collect::<Vec<_>>(),
        other => vec![&*other],
    };
    let names: Option<Vec<Cow<'static, str>>> = parts
        .into_iter()
        .map(|p| type_name(p).map(Cow::Borrowed))
        .collect();
    if let Some(names) = names {
        *t = SetType::Named(names);
    }
}

/// The data type name of an expression, where nft has one.
fn type_name(e: &Expr<'_>) -> Option<&'static str> {
    Some(match e {
        Expr::Payload { protocol, field } => match (&**protocol, &**field) {
            ("ip", "saddr" | "daddr") => "ipv4_addr",
            ("ip6", "saddr" | "daddr") => "ipv6_addr",
            ("th" | "tcp" | "udp" | "udplite" | "sctp" | "dccp", "sport" | "dport") => {
                "inet_service"
            }
            ("ip", "protocol") | ("ip6", "nexthdr") => "inet_proto",
            ("ether", "saddr" | "daddr") => "ether_addr",
            _ => return None,
        },
        Expr::Meta(key) => match &**key {
            "l4proto" => "inet_proto",
            "mark" => "mark",
            "iifname" | "oifname" => "ifname",
            "iif" | "oif" => "iface_index",
            "nfproto" => "nf_proto",
            _ => return None,
        },
        Expr::Ct { dir: None, key } => match &**key {
            "mark" => "mark",
            "state" => "ct_state",
            "status" => "ct_status",
            _ => return None,
        },
        _ => return None,
    })
}

/// One chain.
fn normalize_chain(c: &mut Chain<'_>, family: Family) {
    c.handle = None;
    c.line = 0;
    c.comment = None;
    if let Some(b) = &mut c.base {
        b.policy = b.policy.or(Some(Policy::Accept));
        b.device = None;
    }
    for r in &mut c.rules {
        r.handle = None;
        r.line = 0;
        th_to_protocol(&mut r.stmts);
        drop_tcp_reset_dependency(&mut r.stmts);
        for s in &mut r.stmts {
            normalize_stmt(s, family);
        }
    }
}

/// Transport protocols that `meta l4proto P th FIELD` is listed as `P FIELD` for.
const TH_PROTOCOLS: &[&str] = &["tcp", "udp", "udplite", "sctp", "dccp"];

/// `meta l4proto tcp th dport 80` → `tcp dport 80`, as nft lists it.
fn th_to_protocol(stmts: &mut Vec<Stmt<'_>>) {
    let mut i = 0;
    while i + 1 < stmts.len() {
        let proto = match &stmts[i] {
            Stmt::Match {
                left: Expr::Meta(key),
                op: RelOp::Eq,
                right: Expr::Symbol(p),
            } if key == "l4proto" && TH_PROTOCOLS.contains(&&**p) => p.clone(),
            _ => {
                i += 1;
                continue;
            }
        };
        if let Stmt::Match {
            left: Expr::Payload { protocol, .. },
            ..
        } = &mut stmts[i + 1]
            && protocol == "th"
        {
            *protocol = proto;
            stmts.remove(i);
        } else {
            i += 1;
        }
    }
}

/// `meta l4proto tcp reject with tcp reset` → `reject with tcp reset`: nft adds the protocol
/// match that a TCP reset needs when it lists the rule.
fn drop_tcp_reset_dependency(stmts: &mut Vec<Stmt<'_>>) {
    let mut i = 0;
    while i + 1 < stmts.len() {
        let is_dep = matches!(&stmts[i], Stmt::Match {
                left: Expr::Meta(key),
                op: RelOp::Eq,
                right: Expr::Symbol(p),
            } if key == "l4proto" && p == "tcp");
        let is_reset = matches!(&stmts[i + 1], Stmt::Reject(Some(RejectWith { kind, .. })) if kind == "tcp reset");
        if is_dep && is_reset {
            stmts.remove(i);
        } else {
            i += 1;
        }
    }
}

/// The `reject` type of a family's bare `reject`.
fn default_reject(family: Family) -> &'static str {
    match family {
        Family::Ip => "icmp",
        Family::Ip6 => "icmpv6",
        _ => "icmpx",
    }
}

/// One statement.
fn normalize_stmt(s: &mut Stmt<'_>, family: Family) {
    match s {
        Stmt::Match { left, right, .. } => {
            normalize_expr(left);
            normalize_expr(right);
            // A one-element anonymous set is listed as its element.
            if let Expr::Set(elems) = right
                && let [only] = elems.as_slice()
                && only.value.is_none()
                && only.comment.is_none()
                && only.timeout.is_none()
                && only.counter.is_none()
            {
                *right = only.key.clone();
            }
        }
        Stmt::Vmap { key, map } => {
            normalize_expr(key);
            normalize_expr(map);
        }
        Stmt::Counter(c) => *c = None,
        Stmt::Mangle { key, value } => {
            normalize_expr(key);
            normalize_expr(value);
        }
        Stmt::Nat(n) => {
            if n.family == Some(family) {
                n.family = None;
            }
            if let Some(a) = &mut n.addr {
                normalize_expr(a);
            }
            if let Some(p) = &mut n.port {
                normalize_expr(p);
            }
            n.flags.sort();
        }
        Stmt::Reject(Some(RejectWith { kind, code }))
            if *kind == default_reject(family) && code.as_deref() == Some("port-unreachable") =>
        {
            *s = Stmt::Reject(None);
        }
        Stmt::SetUpdate { elem, .. } => normalize_expr(elem),
        Stmt::Log(l) => {
            if l.level.as_deref() == Some("warn") {
                l.level = None;
            }
        }
        Stmt::Verdict(_)
        | Stmt::Reject(_)
        | Stmt::NamedCounter(_)
        | Stmt::Xt { .. }
        | Stmt::Verbatim(_) => {}
    }
}

/// One expression, recursively.
fn normalize_expr(e: &mut Expr<'_>) {
    match e {
        Expr::Concat(parts) => parts.iter_mut().for_each(normalize_expr),
        Expr::Binary { left, right, .. } | Expr::Range(left, right) => {
            normalize_expr(left);
            normalize_expr(right);
        }
        Expr::Map { key, map } => {
            normalize_expr(key);
            normalize_expr(map);
        }
        Expr::List(items) => {
            items.iter_mut().for_each(normalize_expr);
            items.sort();
        }
        Expr::Set(elems) => normalize_elements(elems),
        Expr::Payload { .. }
        | Expr::Meta(_)
        | Expr::Ct { .. }
        | Expr::Fib { .. }
        | Expr::Numgen { .. }
        | Expr::Number(_)
        | Expr::Addr(_)
        | Expr::Prefix(..)
        | Expr::Symbol(_)
        | Expr::SetRef(_)
        | Expr::Verdict(_) => {}
    }
}
