//! kube-proxy's test canonicalisation of knftables dumps (`sortNFTablesTransaction` in
//! `pkg/proxy/nftables/helpers_test.go`): what its tests compare, so what a render is checked
//! against.

/// The rank of an object type; higher sorts first.
fn rank(object: &str) -> u8 {
    match object {
        "table" => 10,
        "chain" => 9,
        "rule" => 8,
        "set" => 7,
        "map" => 6,
        "element" => 5,
        _ => 0,
    }
}

/// The whole-line tiebreak, which rules do not take part in.
fn tiebreak<'a>(line: &(u8, &str, &'a str)) -> &'a str {
    if line.0 == rank("rule") { "" } else { line.2 }
}

/// `sortNFTablesTransaction`: drops empty lines and lines starting with `#`, then sorts stably by
/// object type (table, chain, rule, set, map, element), object name (the fifth word) and the
/// whole line, except that rules keep their order within a chain. Lines are joined with `\n`.
pub fn sort_like_kube_proxy_tests(text: &str) -> String {
    let mut lines: Vec<(u8, &str, &str)> = text
        .split('\n')
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let mut words = line.split(' ');
            let object = words.nth(1).unwrap_or("");
            let name = words.nth(2).unwrap_or("");
            (rank(object), name, line)
        })
        .collect();
    lines.sort_by(|a, b| {
        b.0.cmp(&a.0)
            .then(a.1.cmp(b.1))
            .then_with(|| tiebreak(a).cmp(tiebreak(b)))
    });
    let mut out = String::with_capacity(text.len());
    for (i, (_, _, line)) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_keep_their_order_within_a_chain() {
        let text = "add rule ip kube-proxy b x2\n\n# c\nadd element ip kube-proxy m { 2 }\nadd rule ip kube-proxy a y\nadd rule ip kube-proxy b x1\nadd chain ip kube-proxy b\nadd element ip kube-proxy m { 1 }\nadd table ip kube-proxy\n";
        assert_eq!(
            sort_like_kube_proxy_tests(text),
            "add table ip kube-proxy\nadd chain ip kube-proxy b\nadd rule ip kube-proxy a y\nadd rule ip kube-proxy b x2\nadd rule ip kube-proxy b x1\nadd element ip kube-proxy m { 1 }\nadd element ip kube-proxy m { 2 }"
        );
    }
}
