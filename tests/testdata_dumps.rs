//! The checked-in real dumps (`testdata/dumps/`, made by `testdata/make-dumps.sh`) must still be
//! what this machine's iptables prints after restoring their restore input: a fresh restore +
//! save with each backend is compared with the files (minus the `#` timestamp comments).

use crate::support::netns::{Backend, Family, Netns, require_root_and_tools};
use std::path::PathBuf;

fn dumps() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/dumps")
}

fn read(name: &str) -> String {
    let path = dumps().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Drops the `#` timestamp comments and zeroes the counters (`[p:b]` and `-c p b`): the dumps
/// were made after a few connection attempts (`make-dumps.sh -t`), the fresh restore has none.
fn normalized(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("{}\n", zero_counters(l)))
        .collect()
}

fn zero_counters(line: &str) -> String {
    let is_num = |w: &str| !w.is_empty() && w.bytes().all(|b| b.is_ascii_digit());
    let mut out: Vec<&str> = Vec::new();
    let mut words = line.split(' ').peekable();
    while let Some(w) = words.next() {
        let bracketed = w
            .strip_prefix('[')
            .and_then(|w| w.strip_suffix(']'))
            .and_then(|w| w.split_once(':'))
            .is_some_and(|(p, b)| is_num(p) && is_num(b));
        if bracketed {
            out.push("[0:0]");
        } else if w == "-c" {
            out.push(w);
            // `-c PACKETS BYTES` (iptables -S -v)
            for _ in 0..2 {
                match words.peek() {
                    Some(n) if is_num(n) => {
                        words.next();
                        out.push("0");
                    }
                    _ => break,
                }
            }
        } else {
            out.push(w);
        }
    }
    out.join(" ")
}

fn check(base: &str, family: Family) {
    let input = read(&format!("{base}.restore"));
    for backend in Backend::ALL {
        let ns = Netns::new(&format!("dumps-{backend}")).expect("netns");
        ns.add_nfacct_counters(&input).expect("nfacct counters");
        ns.restore_family(backend, family, &input, false)
            .expect("restore");
        let forms = [
            (
                "save",
                ns.save_family(backend, family, false).expect("save"),
            ),
            (
                "-c.save",
                ns.save_family(backend, family, true).expect("save -c"),
            ),
            (
                "S",
                ns.iptables_family(backend, family, &["-S"]).expect("-S"),
            ),
            (
                "nat-v.S",
                ns.iptables_family(backend, family, &["-t", "nat", "-S", "-v"])
                    .expect("-t nat -S -v"),
            ),
        ];
        for (suffix, fresh) in forms {
            let name = if suffix.starts_with('-') {
                format!("{base}.{backend}{suffix}")
            } else {
                format!("{base}.{backend}.{suffix}")
            };
            assert_eq!(
                normalized(&read(&name)),
                normalized(&fresh),
                "testdata/dumps/{name} differs from a fresh restore + save; \
                 regenerate with testdata/make-cluster-dumps.sh"
            );
        }
    }
}

#[test]
fn checked_in_dumps_match_a_fresh_restore() {
    let mut tools = vec!["nfacct"];
    tools.extend(Backend::Nft.tools());
    tools.extend(Backend::Legacy.tools());
    if !require_root_and_tools(&tools) {
        return;
    }
    check("cluster", Family::V4);
    check("cluster-v6", Family::V6);
}

#[test]
fn dumps_are_small_and_complete() {
    for base in ["cluster", "cluster-v6"] {
        for backend in ["nft", "legacy"] {
            for suffix in [".save", "-c.save", ".S", ".nat-v.S"] {
                let name = format!("{base}.{backend}{suffix}");
                let len = read(&name).len();
                assert!(len > 0 && len < 256 * 1024, "{name}: {len} bytes");
            }
        }
    }
    let v4 = read("cluster.nft-c.save");
    assert!(v4.contains("*nat") && v4.contains("*filter") && v4.contains("] -A KUBE-SERVICES"));
    assert!(
        v4.lines()
            .any(|l| l.starts_with('[') && !l.starts_with("[0:0]")),
        "made with make-dumps.sh -t: some counters are not zero"
    );
    assert_eq!(
        zero_counters("[12:720] -A X -c 3 180 -j Y"),
        "[0:0] -A X -c 0 0 -j Y"
    );
}
