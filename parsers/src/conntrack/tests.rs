//! Tests on real listings captured by `testdata/conntrack/capture.sh` (see `topology.txt` there for
//! the addresses behind the flows), and on lines edited from them for the error cases.

use super::*;
use std::collections::BTreeSet;
use std::net::IpAddr;

fn capture(name: &str) -> String {
    let path = format!(
        "{}/../testdata/conntrack/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn strict(text: &str) -> ConntrackListing<'_> {
    parse(text, ParseOptions::strict()).unwrap_or_else(|e| panic!("{e}"))
}

/// (protocol, original, reply) of every flow: what stays the same between two listings of one
/// table taken moments apart.
fn tuples(l: &ConntrackListing<'_>) -> BTreeSet<(u8, String, String)> {
    l.flows
        .iter()
        .map(|f| {
            (
                f.protocol,
                format!("{:?}", f.original),
                format!("{:?}", f.reply),
            )
        })
        .collect()
}

const FILES: [&str; 7] = [
    "list.txt",
    "extended.txt",
    "id.txt",
    "ipv6.txt",
    "extended-ipv6.txt",
    "timestamp.txt",
    "proc.txt",
];

#[test]
fn every_capture_parses_strictly_and_matches_its_summary() {
    for name in FILES {
        let text = capture(name);
        let l = strict(&text);
        assert!(!l.flows.is_empty(), "{name}: no flows");
        assert!(l.skipped.is_empty());
        let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
        assert_eq!(
            l.flows.len() + l.summaries.len(),
            lines,
            "{name}: every line is a flow or a summary"
        );
        for s in &l.summaries {
            assert_eq!(s.verb, "shown");
            assert_eq!(s.count as usize, l.flows.len(), "{name}: summary count");
        }
    }
}

#[test]
fn all_forms_list_the_same_flows() {
    let list = capture("list.txt");
    let reference = tuples(&strict(&list));
    for name in ["extended.txt", "id.txt", "timestamp.txt", "proc.txt"] {
        let text = capture(name);
        assert_eq!(tuples(&strict(&text)), reference, "{name}");
    }
    let v6: BTreeSet<_> = strict(&list)
        .flows
        .iter()
        .filter(|f| f.family == Family::Ipv6)
        .map(|f| {
            (
                f.protocol,
                format!("{:?}", f.original),
                format!("{:?}", f.reply),
            )
        })
        .collect();
    for name in ["ipv6.txt", "extended-ipv6.txt"] {
        assert_eq!(tuples(&strict(&capture(name))), v6, "{name}");
    }
}

#[test]
fn udp_through_the_cluster_ip_is_dnatted_to_the_endpoints() {
    let text = capture("list.txt");
    let l = strict(&text);
    let dns: Vec<_> = l
        .flows
        .iter()
        .filter(|f| f.protocol == 17 && f.original.dst == ip("10.96.0.10"))
        .collect();
    assert_eq!(dns.len(), 6);
    for f in &dns {
        assert_eq!(f.protocol_name, "udp");
        assert_eq!(f.original.src, ip("192.168.50.2"));
        assert_eq!(f.original.dport(), Some(53));
        assert!((40001..=40006).contains(&f.original.sport().unwrap()));
        assert!([ip("10.244.1.5"), ip("10.244.2.6")].contains(&f.reply.src));
        assert_eq!(f.reply.sport(), Some(53));
        assert_eq!(f.reply.dst, ip("192.168.50.2"));
        assert_eq!(f.reply.dport(), f.original.sport());
        assert!(f.is_dnat());
        assert!(!f.unreplied);
        assert!(f.timeout.is_some_and(|t| t <= 30));
        assert_eq!(f.state, None);
        let c = f.original_counters.unwrap();
        assert_eq!((c.packets, c.bytes), (4, 136));
        assert_eq!(f.reply_counters.unwrap().packets, 4);
        assert_eq!(f.mark, Some(0));
        assert_eq!(f.use_count, Some(1));
    }
    // The NodePort flow is masqueraded: the reply goes to the node's address on the endpoint link.
    let np = l
        .flows
        .iter()
        .find(|f| f.original.dport() == Some(30053))
        .unwrap();
    assert_eq!(np.original.dst, ip("192.168.50.1"));
    assert_eq!(np.reply.src, ip("10.244.2.6"));
    assert_eq!(np.reply.dst, ip("10.244.2.1"));
    assert!(np.is_dnat());
}

#[test]
fn a_flow_no_rule_translated_stays_unreplied_with_the_service_ip_as_reply_source() {
    let text = capture("list.txt");
    let l = strict(&text);
    for (dst, family) in [("10.96.0.99", Family::Ipv4), ("fd00:96::99", Family::Ipv6)] {
        let f = l.flows.iter().find(|f| f.original.dst == ip(dst)).unwrap();
        assert_eq!(f.family, family);
        assert!(f.unreplied);
        assert!(!f.assured);
        assert_eq!(f.reply.src, ip(dst));
        assert!(!f.is_dnat());
        assert_eq!(f.reply_counters.unwrap().packets, 0);
    }
    let syn = l
        .flows
        .iter()
        .find(|f| f.original.dst == ip("10.96.0.21"))
        .unwrap();
    assert_eq!((syn.protocol, syn.state), (6, Some("SYN_SENT")));
    assert!(syn.unreplied && !syn.is_dnat());
}

#[test]
fn tcp_sctp_and_icmp_states_flags_and_tuples() {
    let text = capture("list.txt");
    let l = strict(&text);
    let tcp: Vec<_> = l
        .flows
        .iter()
        .filter(|f| f.protocol == 6 && f.original.dst == ip("10.96.0.20"))
        .collect();
    let states: BTreeSet<_> = tcp.iter().filter_map(|f| f.state).collect();
    assert_eq!(states, BTreeSet::from(["ESTABLISHED", "TIME_WAIT"]));
    for f in &tcp {
        assert!(f.assured);
        assert_eq!(f.reply.src, ip("10.244.2.6"));
        assert_eq!(f.reply.sport(), Some(8080));
    }
    let sctp = l.flows.iter().find(|f| f.protocol == 132).unwrap();
    assert_eq!(sctp.protocol_name, "sctp");
    assert_eq!(sctp.state, Some("ESTABLISHED"));
    assert!(sctp.assured);
    assert_eq!(
        sctp.original.ports,
        Ports::Ports {
            sport: 45000,
            dport: 9000
        }
    );
    assert_eq!(sctp.reply.src, ip("10.244.1.5"));
    let icmp = l
        .flows
        .iter()
        .find(|f| f.protocol == 1 && f.original.dst == ip("10.244.2.6"))
        .unwrap();
    assert_eq!(
        icmp.original.ports,
        Ports::Icmp {
            icmp_type: 8,
            code: 0,
            id: 19280
        }
    );
    assert_eq!(
        icmp.reply.ports,
        Ports::Icmp {
            icmp_type: 0,
            code: 0,
            id: 19280
        }
    );
    assert!(!icmp.is_dnat());
    let icmp6 = l.flows.iter().find(|f| f.protocol == 58).unwrap();
    assert_eq!(icmp6.protocol_name, "icmpv6");
    assert_eq!(icmp6.family, Family::Ipv6);
    assert!(matches!(
        icmp6.original.ports,
        Ports::Icmp { icmp_type: 128, .. }
    ));
    let v6_dns = l
        .flows
        .iter()
        .find(|f| f.original.dst == ip("fd00:96::10"))
        .unwrap();
    assert_eq!(v6_dns.reply.src, ip("fd00:244:1::5"));
    assert!(v6_dns.is_dnat());
}

#[test]
fn ids_follow_the_tuples_even_after_an_icmp_id() {
    let text = capture("id.txt");
    let l = strict(&text);
    assert!(l.flows.iter().all(|f| f.id.is_some()));
    let ids: BTreeSet<_> = l.flows.iter().map(|f| f.id).collect();
    assert_eq!(ids.len(), l.flows.len(), "conntrack ids are unique");
    for f in l.flows.iter().filter(|f| f.protocol == 1) {
        let Ports::Icmp { id, .. } = f.reply.ports else {
            panic!("icmp tuple")
        };
        assert_eq!(id, 19280);
        assert_ne!(f.id, Some(19280));
    }
}

#[test]
fn extended_and_proc_forms_carry_the_family_column_and_zone() {
    let ext = capture("extended.txt");
    let proc_text = capture("proc.txt");
    for (name, text) in [("extended", &ext), ("proc", &proc_text)] {
        let l = strict(text);
        assert!(l.flows.iter().any(|f| f.family == Family::Ipv6), "{name}");
        assert!(l.flows.iter().any(|f| f.family == Family::Ipv4), "{name}");
    }
    let p = strict(&proc_text);
    assert!(p.flows.iter().all(|f| f.zone == Some(0)));
    // /proc prints IPv6 groups in full; they read as the same addresses.
    assert!(proc_text.contains("fd00:0096:0000:0000:0000:0000:0000:0010"));
    assert!(p.flows.iter().any(|f| f.original.dst == ip("fd00:96::10")));
}

#[test]
fn timestamps_are_kept_as_extra_fields() {
    let text = capture("timestamp.txt");
    let l = strict(&text);
    let stamped: Vec<_> = l
        .flows
        .iter()
        .filter(|f| f.extra_value("start").is_some())
        .collect();
    assert!(!stamped.is_empty());
    assert!(
        stamped.len() < l.flows.len(),
        "the sysctl was turned on half-way"
    );
    for f in &stamped {
        assert!(f.delta_time.is_some());
        // `[start=Thu Dec  3 09:41:18 2026]`: the weekday, month, day, time and year.
        assert_eq!(
            f.extra_value("start").unwrap().split_whitespace().count(),
            5
        );
    }
}

#[test]
fn unknown_keys_and_flags_are_kept() {
    let line = "udp      17 29 src=10.0.0.1 dst=10.96.0.10 sport=1 dport=53 src=10.244.1.5 dst=10.0.0.1 sport=53 dport=1 [OFFLOAD] [NEWFLAG] mark=16384 secctx=system_u:object_r:unlabeled_t:s0 zone=7 helper=tftp labels=0x1 use=2 id=42\n";
    let l = strict(line);
    let f = &l.flows[0];
    assert!(f.offload);
    assert_eq!(f.mark, Some(16384));
    assert_eq!(f.secctx, Some("system_u:object_r:unlabeled_t:s0"));
    assert_eq!(f.zone, Some(7));
    assert_eq!(f.id, Some(42));
    assert_eq!(
        f.extra,
        vec![("NEWFLAG", ""), ("helper", "tftp"), ("labels", "0x1")]
    );
    assert_eq!(f.original_counters, None);
}

#[test]
fn events_gre_and_untracked_protocols() {
    let text = "    [NEW] udp      17 30 src=10.0.0.1 dst=10.96.0.10 sport=1 dport=53 [UNREPLIED] src=10.96.0.10 dst=10.0.0.1 sport=53 dport=1\n\
                 [DESTROY] tcp      6 src=10.0.0.1 dst=10.0.0.2 sport=5 dport=80 src=10.0.0.2 dst=10.0.0.1 sport=80 dport=5 [ASSURED] [stop=Thu Dec  3 09:41:18 2026]\n\
                 gre      47 179 src=10.0.0.1 dst=10.0.0.2 srckey=0x0 dstkey=0x1f src=10.0.0.2 dst=10.0.0.1 srckey=0x1f dstkey=0x0 mark=0 use=1\n\
                 unknown  99 599 src=10.0.0.1 dst=10.0.0.2 src=10.0.0.2 dst=10.0.0.1 mark=0 use=1\n";
    let l = strict(text);
    assert_eq!(l.flows.len(), 4);
    assert_eq!(l.flows[0].event, Some("NEW"));
    assert!(l.flows[0].unreplied);
    assert_eq!(l.flows[1].event, Some("DESTROY"));
    assert_eq!(l.flows[1].timeout, None);
    assert_eq!(
        l.flows[1].extra_value("stop"),
        Some("Thu Dec  3 09:41:18 2026")
    );
    assert_eq!(
        l.flows[2].original.ports,
        Ports::Gre {
            srckey: 0,
            dstkey: 0x1f
        }
    );
    assert_eq!(l.flows[3].protocol, 99);
    assert_eq!(l.flows[3].original.ports, Ports::None);
    assert_eq!(l.flows[3].timeout, Some(599));
}

fn error(text: &str) -> ParseError {
    parse(text, ParseOptions::strict()).unwrap_err()
}

#[test]
fn errors_name_line_column_expected_and_found() {
    let good = capture("list.txt");
    let first = good.lines().find(|l| l.starts_with("udp ")).unwrap();
    // A bad address on line 2.
    let bad = first.replacen("dst=10.96.0.", "dst=10.96.0.x", 1);
    let e = error(&format!("{first}\n{bad}\n"));
    assert_eq!(e.line, 2);
    assert_eq!(e.col as usize, bad.find(" dst=").unwrap() + 2);
    assert_eq!(e.expected, "`dst=ADDR` with an IP address");
    assert!(e.found.starts_with("`dst=10.96.0.x"));
    // A port out of range.
    let bad = first.replacen("dport=53", "dport=65536", 1);
    let e = error(&bad);
    assert_eq!(e.expected, "a port number (0-65535)");
    assert_eq!(e.col as usize, bad.find("dport=65536").unwrap() + 1);
    // A line cut before its reply tuple.
    let cut = &first[..first.rfind(" src=").unwrap()];
    let cut = &cut[..cut.find(" mark").unwrap_or(cut.len())];
    let e = error(cut);
    assert_eq!(e.expected, "`src=ADDR` (the reply tuple)");
    assert_eq!(e.found, "end of line");
    assert_eq!(e.col as usize, cut.chars().count() + 1);
    // A tuple without its ports.
    let e = error(
        "udp 17 20 src=10.0.0.1 dst=10.0.0.2 sport=1 src=10.0.0.2 dst=10.0.0.1 sport=2 dport=1\n",
    );
    assert_eq!(e.expected, "`dport=PORT`");
    // Mixed families; an `ipv6` column over IPv4 addresses.
    let e = error(
        "udp 17 20 src=10.0.0.1 dst=fd00::1 sport=1 dport=2 src=fd00::1 dst=10.0.0.1 sport=2 dport=1\n",
    );
    assert_eq!(e.expected, "addresses of one family");
    let e = error(
        "ipv6 10 udp 17 20 src=10.0.0.1 dst=10.0.0.2 sport=1 dport=2 src=10.0.0.2 dst=10.0.0.1 sport=2 dport=1\n",
    );
    assert_eq!(
        (e.col, e.expected.as_str()),
        (1, "`ipv4 2` or `ipv6 10` matching the addresses")
    );
    // A shell prompt.
    let e = error(&format!("$ conntrack -L\n{first}\n"));
    assert_eq!((e.line, e.col), (1, 1));
    assert_eq!(e.expected, "a protocol name (`tcp`, `udp`, `ipv4` …)");
    assert!(e.to_string().contains("<input>:1:1: expected"));
}

#[test]
fn lenient_skips_prompts_and_lines_cut_by_stderr() {
    let good = capture("timestamp.txt");
    // conntrack's stderr line lands inside a stdout line when both go to one pipe.
    let last_flow = good.lines().rfind(|l| l.contains("[start=")).unwrap();
    let cut_at = last_flow.find("[start=").unwrap() + 10;
    let interleaved = format!(
        "{}conntrack v1.4.7 (conntrack-tools): 3 flow entries have been shown.\n{}",
        &last_flow[..cut_at],
        &last_flow[cut_at..]
    );
    let text = format!(
        "[root@node ~]# conntrack -L -o ktimestamp\n{}\n{interleaved}\n[root@node ~]#\n",
        good.lines()
            .filter(|l| !l.starts_with("conntrack v"))
            .take(2)
            .collect::<Vec<_>>()
            .join("\n"),
    );
    assert!(parse(&text, ParseOptions::strict()).is_err());
    let l = parse(&text, ParseOptions::lenient()).unwrap();
    assert_eq!(l.flows.len(), 2);
    let skipped: Vec<u32> = l.skipped.iter().map(|s| s.line).collect();
    assert_eq!(skipped, vec![1, 4, 5, 6]);
    assert!(l.skipped[0].reason.starts_with("expected "));
    assert!(l.summaries.is_empty());
}

#[test]
fn summaries_of_other_commands() {
    let l = strict("conntrack v1.4.8 (conntrack-tools): 2 flow entries have been deleted.\n");
    assert_eq!(l.summaries[0].count, 2);
    assert_eq!(l.summaries[0].verb, "deleted");
    assert!(l.flows.is_empty());
    let e = error(
        "conntrack v1.4.7 (conntrack-tools): Operation failed: such conntrack doesn't exist\n",
    );
    assert_eq!(e.line, 1);
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn never_panics_and_lenient_never_fails(text in "\\PC{0,300}") {
            let _ = parse(&text, ParseOptions::strict());
            prop_assert!(parse(&text, ParseOptions::lenient()).is_ok());
        }

        #[test]
        fn edited_real_lines_parse_or_fail_with_a_position(
            line_idx in 0usize..19,
            cut in 0usize..400,
            insert in "[ =\\[\\]a-z0-9.:]{0,6}",
        ) {
            let text = capture("extended.txt");
            let lines: Vec<&str> = text.lines().collect();
            let line = lines[line_idx % lines.len()];
            let mut at = cut.min(line.len());
            while !line.is_char_boundary(at) { at -= 1; }
            let edited = format!("{}{}{}", &line[..at], insert, &line[at..]);
            match parse(&edited, ParseOptions::strict()) {
                Ok(l) => prop_assert!(l.flows.len() + l.summaries.len() <= 1),
                Err(e) => {
                    prop_assert_eq!(e.line, 1);
                    prop_assert!(e.col as usize <= edited.chars().count() + 1);
                }
            }
        }
    }
}
