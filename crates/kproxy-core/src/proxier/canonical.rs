//! kube-proxy's test canonicalisation of restore text (`pkg/proxy/iptables/proxier_test.go` `sortIPTablesRules`), used to
//! compare a render with golden dumps: tables by name, chains `KUBE-NODEPORTS`, `KUBE-SERVICES`,
//! other `KUBE-*`, then the rest (alphabetically); rules of `KUBE-NODEPORTS`/`KUBE-SERVICES`
//! stably sorted by the service name in their comment (nat `KUBE-SERVICES` tail rule last); all
//! other chains keep their order. Whitespace runs are collapsed.

use std::collections::BTreeMap;

/// A line that is not restore syntax.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("line {line}: {message}")]
pub struct CanonError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
}

#[derive(Default)]
struct Chain {
    decl: Option<String>,
    rules: Vec<String>,
}

#[derive(Default)]
struct Table {
    chains: BTreeMap<String, Chain>,
    cmds: Vec<String>,
}

fn table_rank(name: &str) -> (u8, &str) {
    let r = match name {
        "filter" => 0,
        "nat" => 1,
        "mangle" => 2,
        "raw" => 3,
        "security" => 4,
        _ => 9,
    };
    (r, name)
}

fn chain_rank(name: &str) -> (u8, &str) {
    if name == "KUBE-NODEPORTS" {
        (0, name)
    } else if name == "KUBE-SERVICES" {
        (1, name)
    } else if name.starts_with("KUBE-") {
        (2, name)
    } else {
        (3, name)
    }
}

/// The `--comment` value of a rule (quotes removed), "" if none.
pub fn comment_of(rule: &str) -> &str {
    let Some(at) = rule.find("--comment ") else {
        return "";
    };
    let rest = &rule[at + "--comment ".len()..];
    if let Some(q) = rest.strip_prefix('"') {
        &q[..q.find('"').unwrap_or(q.len())]
    } else {
        &rest[..rest.find(' ').unwrap_or(rest.len())]
    }
}

/// The service name kube-proxy's test sort uses: the comment up to the first space or colon.
pub fn service_name_key(rule: &str) -> &str {
    let c = comment_of(rule);
    &c[..c.find([' ', ':']).unwrap_or(c.len())]
}

/// Canonicalises restore text the way kube-proxy's tests do before comparing.
pub fn sort_like_kube_proxy_tests(text: &str) -> Result<String, CanonError> {
    let mut tables: Vec<(String, Table)> = Vec::new();
    let mut cur: Option<usize> = None;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split_whitespace().collect::<Vec<_>>().join(" ");
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |m: &str| CanonError {
            line: n + 1,
            message: m.to_string(),
        };
        if let Some(t) = line.strip_prefix('*') {
            tables.push((t.to_string(), Table::default()));
            cur = Some(tables.len() - 1);
        } else if line == "COMMIT" {
            cur = None;
        } else {
            let table = cur
                .and_then(|i| tables.get_mut(i))
                .map(|t| &mut t.1)
                .ok_or_else(|| err("line outside a table"))?;
            if let Some(decl) = line.strip_prefix(':') {
                let name = decl.split(' ').next().unwrap_or("").to_string();
                table.chains.entry(name).or_default().decl = Some(line.clone());
            } else if line.starts_with("-A ") || line.starts_with("-I ") {
                let name = line.split(' ').nth(1).unwrap_or("").to_string();
                table.chains.entry(name).or_default().rules.push(line);
            } else if line.starts_with("-X ") || line.starts_with("-F ") {
                table.cmds.push(line);
            } else {
                return Err(err("not a restore line"));
            }
        }
    }
    tables.sort_by(|a, b| table_rank(&a.0).cmp(&table_rank(&b.0)));
    let mut out = String::new();
    for (name, table) in &tables {
        out.push('*');
        out.push_str(name);
        out.push('\n');
        let mut names: Vec<&String> = table.chains.keys().collect();
        names.sort_by(|a, b| chain_rank(a).cmp(&chain_rank(b)));
        for c in &names {
            match table.chains.get(*c).and_then(|ch| ch.decl.as_ref()) {
                Some(d) => out.push_str(d),
                None => {
                    out.push_str("(undeclared chain ");
                    out.push_str(c);
                    out.push(')');
                }
            }
            out.push('\n');
        }
        for c in &names {
            let Some(chain) = table.chains.get(*c) else {
                continue;
            };
            let mut rules: Vec<&String> = chain.rules.iter().collect();
            if c.as_str() == "KUBE-NODEPORTS" || c.as_str() == "KUBE-SERVICES" {
                let is_tail = |r: &String| {
                    name == "nat"
                        && c.as_str() == "KUBE-SERVICES"
                        && comment_of(r).contains("must be the last rule")
                };
                let (mut body, tail): (Vec<&String>, Vec<&String>) =
                    rules.into_iter().partition(|r| !is_tail(r));
                body.sort_by(|a, b| service_name_key(a).cmp(service_name_key(b)));
                body.extend(tail);
                rules = body;
            }
            for r in rules {
                out.push_str(r);
                out.push('\n');
            }
        }
        for cmd in &table.cmds {
            out.push_str(cmd);
            out.push('\n');
        }
        out.push_str("COMMIT\n");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_service_chains_by_service_keeping_tail_last() {
        let t = "*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-NODEPORTS - [0:0]\n\
-A KUBE-SERVICES -m comment --comment \"ns2/b:p cluster IP\" -j X\n\
-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -j KUBE-NODEPORTS\n\
-A KUBE-SERVICES -m comment --comment \"ns1/a:p cluster IP\" -j Y\nCOMMIT\n";
        let c = sort_like_kube_proxy_tests(t).unwrap_or_else(|e| panic!("{e}"));
        let lines: Vec<&str> = c.lines().collect();
        assert_eq!(lines.get(1), Some(&":KUBE-NODEPORTS - [0:0]"));
        assert!(lines.get(3).is_some_and(|l| l.contains("ns1/a")));
        assert!(lines.get(5).is_some_and(|l| l.contains("must be the last")));
        assert_eq!(
            service_name_key("-A X -m comment --comment ns2/svc2:p80 -j Y"),
            "ns2/svc2"
        );
    }

    #[test]
    fn rejects_garbage() {
        assert!(sort_like_kube_proxy_tests("*nat\nhello\nCOMMIT\n").is_err());
    }
}
