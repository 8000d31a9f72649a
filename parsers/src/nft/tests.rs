//! Unit tests of the nft parsers and printer: each statement form, each input form's framing,
//! errors and lenient reading, hostile input, and printed-then-parsed round trips (proptest).

use std::borrow::Cow;
use std::net::IpAddr;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn addr(s: &str) -> Expr<'static> {
    Expr::Addr(s.parse().expect("address"))
}

fn sym(s: &str) -> Expr<'_> {
    Expr::Symbol(Cow::Borrowed(s))
}

fn payload<'a>(protocol: &'a str, field: &'a str) -> Expr<'a> {
    Expr::Payload {
        protocol: Cow::Borrowed(protocol),
        field: Cow::Borrowed(field),
    }
}

fn meta(key: &str) -> Expr<'_> {
    Expr::Meta(Cow::Borrowed(key))
}

fn eq<'a>(left: Expr<'a>, right: Expr<'a>) -> Stmt<'a> {
    Stmt::Match {
        left,
        op: RelOp::Eq,
        right,
    }
}

fn stmts(text: &str) -> Vec<Stmt<'_>> {
    parse_rule(text).expect("rule").stmts
}

fn one(text: &str) -> Stmt<'_> {
    let mut s = stmts(text);
    assert_eq!(s.len(), 1, "{text}: {s:?}");
    s.remove(0)
}

fn goto(c: &str) -> Expr<'_> {
    Expr::Verdict(Verdict::Goto(Cow::Borrowed(c)))
}

// ------------------------------------------------------------------------------------------
// Statements and expressions
// ------------------------------------------------------------------------------------------

#[test]
fn payload_matches() {
    assert_eq!(
        one("ip saddr 10.0.0.1"),
        eq(payload("ip", "saddr"), addr("10.0.0.1"))
    );
    assert_eq!(
        one("ip daddr != 10.0.0.0/8"),
        Stmt::Match {
            left: payload("ip", "daddr"),
            op: RelOp::Ne,
            right: Expr::Prefix("10.0.0.0".parse().expect("ip"), 8),
        }
    );
    assert_eq!(
        one("ip6 saddr fd00:10:180::2:1"),
        eq(payload("ip6", "saddr"), addr("fd00:10:180::2:1"))
    );
    assert_eq!(
        one("th dport 80"),
        eq(payload("th", "dport"), Expr::Number(80))
    );
    assert_eq!(
        one("udp dport 1000-2000"),
        eq(
            payload("udp", "dport"),
            Expr::Range(Box::new(Expr::Number(1000)), Box::new(Expr::Number(2000)))
        )
    );
    assert_eq!(
        one("ip protocol tcp"),
        eq(payload("ip", "protocol"), sym("tcp"))
    );
    assert_eq!(
        stmts("ip protocol tcp  tcp dport 443"),
        vec![
            eq(payload("ip", "protocol"), sym("tcp")),
            eq(payload("tcp", "dport"), Expr::Number(443)),
        ]
    );
    assert_eq!(
        one("ip length > 100"),
        Stmt::Match {
            left: payload("ip", "length"),
            op: RelOp::Gt,
            right: Expr::Number(100),
        }
    );
}

#[test]
fn meta_ct_fib_and_interfaces() {
    assert_eq!(one("meta l4proto tcp"), eq(meta("l4proto"), sym("tcp")));
    assert_eq!(
        one("fib daddr type local"),
        eq(
            Expr::Fib {
                flags: vec![Cow::Borrowed("daddr")],
                result: Cow::Borrowed("type"),
            },
            sym("local")
        )
    );
    assert_eq!(
        one("fib saddr . iif oif missing"),
        eq(
            Expr::Fib {
                flags: vec![Cow::Borrowed("saddr"), Cow::Borrowed("iif")],
                result: Cow::Borrowed("oif"),
            },
            sym("missing")
        )
    );
    // Quoted (as nft lists it) and bare (as kube-proxy writes it) are the same symbol.
    assert_eq!(one("iifname \"eth0\""), one("iifname eth0"));
    assert_eq!(one("iifname eth0"), eq(meta("iifname"), sym("eth0")));
    assert_eq!(
        one("oifname != \"lo\""),
        Stmt::Match {
            left: meta("oifname"),
            op: RelOp::Ne,
            right: sym("lo"),
        }
    );
    assert_eq!(one("iif veth*"), eq(meta("iif"), sym("veth*")));
    let ct = |key: &'static str| Expr::Ct {
        dir: None,
        key: Cow::Borrowed(key),
    };
    assert_eq!(one("ct state new"), eq(ct("state"), sym("new")));
    assert_eq!(
        one("ct state established,related"),
        eq(
            ct("state"),
            Expr::List(vec![sym("established"), sym("related")])
        )
    );
    assert_eq!(one("ct status dnat"), eq(ct("status"), sym("dnat")));
    assert_eq!(
        one("ct original ip saddr 1.1.1.1"),
        eq(
            Expr::Ct {
                dir: Some(Cow::Borrowed("original")),
                key: Cow::Borrowed("ip saddr"),
            },
            addr("1.1.1.1")
        )
    );
}

#[test]
fn marks_in_every_spelling_are_one_tree() {
    let and_zero = Stmt::Match {
        left: Expr::Binary {
            op: BinOp::And,
            left: Box::new(meta("mark")),
            right: Box::new(Expr::Number(0x4000)),
        },
        op: RelOp::Eq,
        right: Expr::Number(0),
    };
    // kube-proxy's spelling and nft's listing of it.
    assert_eq!(stmts("mark and 0x4000 == 0 return")[0], and_zero);
    assert_eq!(
        stmts("meta mark & 0x00004000 == 0x00000000 return")[0],
        and_zero
    );
    let or_set = Stmt::Mangle {
        key: meta("mark"),
        value: Expr::Binary {
            op: BinOp::Or,
            left: Box::new(meta("mark")),
            right: Box::new(Expr::Number(0x4000)),
        },
    };
    assert_eq!(one("mark set mark or 0x4000"), or_set);
    assert_eq!(one("meta mark set meta mark | 0x00004000"), or_set);
    // iptables-nft's listing mixes both.
    assert_eq!(one("meta mark set mark or 0x4000"), or_set);
    assert_eq!(one("meta mark set meta mark|16384"), or_set);
    assert_eq!(
        one("meta mark 0x00004000"),
        eq(meta("mark"), Expr::Number(16384))
    );
    assert_eq!(
        one("mark and 0x4000 != 0"),
        Stmt::Match {
            left: Expr::Binary {
                op: BinOp::And,
                left: Box::new(meta("mark")),
                right: Box::new(Expr::Number(0x4000)),
            },
            op: RelOp::Ne,
            right: Expr::Number(0),
        }
    );
}

#[test]
fn binary_operators_bind_by_precedence() {
    // `|` binds loosest, then `^`, then `&`.
    let s = one("meta mark set meta mark & 0xff00 | 0x1 ^ 0x2");
    let Stmt::Mangle { value, .. } = s else {
        panic!("{s:?}");
    };
    assert_eq!(value.to_string(), "mark and 0xff00 or 0x1 xor 0x2");
    let Expr::Binary { op, left, right } = value else {
        panic!("{value:?}");
    };
    assert_eq!(op, BinOp::Or);
    assert!(matches!(*left, Expr::Binary { op: BinOp::And, .. }));
    assert!(matches!(*right, Expr::Binary { op: BinOp::Xor, .. }));
    let s = one("meta mark set (meta mark | 0x1) & 0x2");
    assert_eq!(s.to_string(), "mark set (mark or 0x1) and 0x2");
}

#[test]
fn set_and_map_lookups() {
    let concat = Expr::Concat(vec![
        payload("ip", "daddr"),
        meta("l4proto"),
        payload("th", "dport"),
    ]);
    assert_eq!(
        one("ip daddr . meta l4proto . th dport vmap @service-ips"),
        Stmt::Vmap {
            key: concat.clone(),
            map: Expr::SetRef(Cow::Borrowed("service-ips")),
        }
    );
    assert_eq!(
        one("ip daddr @cluster-ips"),
        eq(
            payload("ip", "daddr"),
            Expr::SetRef(Cow::Borrowed("cluster-ips"))
        )
    );
    let anon = one("ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 , 1.2.3.4 }");
    let Stmt::Match {
        op: RelOp::Ne,
        right: Expr::Set(elems),
        ..
    } = &anon
    else {
        panic!("{anon:?}");
    };
    assert_eq!(elems.len(), 3);
    assert_eq!(elems[2].key, addr("1.2.3.4"));
    let nodeports = stmts("ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports");
    assert_eq!(nodeports.len(), 2);
    assert_eq!(
        nodeports[1],
        Stmt::Vmap {
            key: Expr::Concat(vec![meta("l4proto"), payload("th", "dport")]),
            map: Expr::SetRef(Cow::Borrowed("service-nodeports")),
        }
    );
    let numgen = one("numgen random mod 2 vmap { 0 : goto endpoint-A , 1 : goto endpoint-B }");
    let Stmt::Vmap {
        key:
            Expr::Numgen {
                mode,
                modulus: 2,
                offset: 0,
            },
        map: Expr::Set(entries),
    } = &numgen
    else {
        panic!("{numgen:?}");
    };
    assert_eq!(mode, "random");
    assert_eq!(entries[1].key, Expr::Number(1));
    assert_eq!(entries[1].value, Some(goto("endpoint-B")));
    // nft's listing separates entries with ", ", and may write an offset.
    assert_eq!(
        one("numgen random mod 2 vmap { 0 : goto endpoint-A, 1 : goto endpoint-B }"),
        numgen
    );
    assert!(matches!(
        one("numgen inc mod 3 offset 1 vmap { 1 : accept, 2 : drop, 3 : jump x }"),
        Stmt::Vmap {
            key: Expr::Numgen { offset: 1, .. },
            ..
        }
    ));
    assert_eq!(
        one("update @affinity-X { ip saddr }"),
        Stmt::SetUpdate {
            op: Cow::Borrowed("update"),
            set: Cow::Borrowed("affinity-X"),
            elem: payload("ip", "saddr"),
        }
    );
    assert!(matches!(
        one("ip daddr . tcp dport { 1.2.3.4 . 80, 5.6.7.8 . 443 }"),
        Stmt::Match {
            left: Expr::Concat(_),
            right: Expr::Set(_),
            ..
        }
    ));
}

#[test]
fn verdicts_nat_reject_counter_log_xt() {
    assert_eq!(
        one("jump services"),
        Stmt::Verdict(Verdict::Jump("services".into()))
    );
    assert_eq!(
        one("goto service-ULMVA6XW-ns1/svc1/tcp/p80"),
        Stmt::Verdict(Verdict::Goto("service-ULMVA6XW-ns1/svc1/tcp/p80".into()))
    );
    for (text, v) in [
        ("accept", Verdict::Accept),
        ("drop", Verdict::Drop),
        ("return", Verdict::Return),
        ("continue", Verdict::Continue),
    ] {
        assert_eq!(one(text), Stmt::Verdict(v));
    }
    let dnat = stmts("meta l4proto tcp dnat to 10.180.0.1:80");
    assert_eq!(
        dnat[1],
        Stmt::Nat(Nat {
            kind: NatKind::Dnat,
            family: None,
            addr: Some(addr("10.180.0.1")),
            port: Some(Expr::Number(80)),
            flags: vec![],
        })
    );
    assert_eq!(
        one("dnat ip6 to [fd00::1]:8080"),
        Stmt::Nat(Nat {
            kind: NatKind::Dnat,
            family: Some(Family::Ip6),
            addr: Some(addr("fd00::1")),
            port: Some(Expr::Number(8080)),
            flags: vec![],
        })
    );
    assert_eq!(
        one("dnat to fd00::1"),
        Stmt::Nat(Nat {
            kind: NatKind::Dnat,
            family: None,
            addr: Some(addr("fd00::1")),
            port: None,
            flags: vec![],
        })
    );
    assert_eq!(
        one("masquerade fully-random,persistent"),
        Stmt::Nat(Nat {
            kind: NatKind::Masquerade,
            family: None,
            addr: None,
            port: None,
            flags: vec!["fully-random".into(), "persistent".into()],
        })
    );
    assert!(matches!(
        one("redirect to :8080"),
        Stmt::Nat(Nat {
            kind: NatKind::Redirect,
            port: Some(Expr::Number(8080)),
            ..
        })
    ));
    assert!(matches!(
        one("snat ip to 1.2.3.4-1.2.3.9"),
        Stmt::Nat(Nat {
            kind: NatKind::Snat,
            addr: Some(Expr::Range(..)),
            ..
        })
    ));
    assert_eq!(one("reject"), Stmt::Reject(None));
    let with = |kind: &'static str, code: Option<&'static str>| {
        Stmt::Reject(Some(RejectWith {
            kind: kind.into(),
            code: code.map(Cow::Borrowed),
        }))
    };
    assert_eq!(
        one("reject with icmp host-unreachable"),
        with("icmp", Some("host-unreachable"))
    );
    assert_eq!(
        one("reject with icmp type host-unreachable"),
        with("icmp", Some("host-unreachable"))
    );
    assert_eq!(one("reject with tcp reset"), with("tcp reset", None));
    assert_eq!(one("counter"), Stmt::Counter(None));
    assert_eq!(
        one("counter packets 5 bytes 6"),
        Stmt::Counter(Some(Counter {
            packets: 5,
            bytes: 6
        }))
    );
    assert_eq!(
        one("log prefix \"hello \" level warn"),
        Stmt::Log(Log {
            prefix: Some("hello ".into()),
            level: Some("warn".into()),
            ..Log::default()
        })
    );
    assert_eq!(
        one("xt target \"DNAT\""),
        Stmt::Xt {
            kind: "target".into(),
            name: "DNAT".into()
        }
    );
    assert_eq!(
        one("xt match recent"),
        Stmt::Xt {
            kind: "match".into(),
            name: "recent".into()
        }
    );
}

#[test]
fn comments_and_handles() {
    let r = parse_rule(
        "ip saddr 10.0.0.0/8 goto service-X comment \"short-circuit pod traffic\" # handle 7",
    )
    .expect("rule");
    assert_eq!(r.comment.as_deref(), Some("short-circuit pod traffic"));
    assert_eq!(r.handle, Some(7));
    assert_eq!(r.stmts.len(), 2);
}

#[test]
fn unmodelled_statements_are_verbatim_from_there_on() {
    let s = stmts("ip saddr 1.2.3.4 limit rate 10/second burst 5 packets accept comment \"x\"");
    assert_eq!(s.len(), 2);
    assert_eq!(
        s[1],
        Stmt::Verbatim("limit rate 10/second burst 5 packets accept".into())
    );
    // `tcp option` is no header field: the whole statement is kept.
    let s = stmts("oifname wt0 tcp option maxseg size set 1240");
    assert_eq!(
        s[1],
        Stmt::Verbatim("tcp option maxseg size set 1240".into())
    );
    assert_eq!(one("notrack"), Stmt::Verbatim("notrack".into()));
    assert_eq!(
        stmts("ip saddr @s1 counter name \"x\" meter m { ip saddr }")[2],
        Stmt::Verbatim("meter m { ip saddr }".into())
    );
    let r = parse_rule("ip saddr @s1 counter name \"x\"").expect("rule");
    assert_eq!(r.stmts[1], Stmt::NamedCounter("x".into()));
    assert_eq!(r.to_string(), "ip saddr @s1 counter name \"x\"");
    // Garbage is a statement too, never an error.
    assert_eq!(
        one("den@pi:~$ sudo nft"),
        Stmt::Verbatim("den@pi:~$ sudo nft".into())
    );
}

#[test]
fn printer_writes_kube_proxy_text() {
    for text in [
        "ip daddr . meta l4proto . th dport vmap @service-ips",
        "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports",
        "ip daddr @cluster-ips reject comment \"Reject traffic to invalid ports of ClusterIPs\"",
        "ip daddr { 172.30.0.0/16 } drop comment \"Drop traffic to unallocated ClusterIPs\"",
        "ct state new jump firewall-check",
        "mark set mark or 0x4000",
        "mark and 0x4000 == 0 return",
        "mark set mark xor 0x4000",
        "masquerade fully-random",
        "ip daddr 172.30.0.41 ip saddr != 10.0.0.0/8 jump mark-for-masquerade",
        "numgen random mod 2 vmap { 0 : goto endpoint-UNZV3OEC-ns4/svc4/tcp/p80__10.180.0.4/80 , 1 : goto endpoint-5RFCDDV7-ns4/svc4/tcp/p80__10.180.0.5/80 }",
        "ip saddr @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 goto endpoint-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80",
        "update @affinity-GTK6MW7G-ns5/svc5/tcp/p80__10.180.0.3/80 { ip saddr }",
        "meta l4proto tcp dnat to 10.180.0.3:80",
        "meta l4proto tcp dnat to [fd00:10:180::2:1]:80",
        "ip saddr != { 192.168.0.0/24 , 203.0.113.0/25 , 1.2.3.4 , 5.6.7.8 } drop",
        "fib saddr type local jump mark-for-masquerade comment \"masquerade local traffic\"",
        "fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports",
        "ip6 daddr != ::1 meta l4proto . th dport vmap @no-endpoint-nodeports",
        "iif != eth0 jump mark-for-masquerade",
        "iifname veth* goto service-X",
        "reject",
        "counter packets 0 bytes 0 accept",
    ] {
        let r = parse_rule(text).expect("rule");
        assert_eq!(r.to_string(), text);
    }
    // nft's listing prints back in kube-proxy's words.
    let r = parse_rule("meta mark & 0x00004000 == 0x00000000 return").expect("rule");
    assert_eq!(r.to_string(), "mark and 0x4000 == 0 return");
    let r = parse_rule("iifname \"eth0\" oifname != \"lo\" accept").expect("rule");
    assert_eq!(r.to_string(), "iifname eth0 oifname != lo accept");
    // Symbols that would read back as something else are quoted.
    let r = parse_rule("meta l4proto \"accept\" iifname \"a b\" ct state \"==\"").expect("rule");
    assert_eq!(
        r.to_string(),
        "meta l4proto \"accept\" iifname \"a b\" ct state \"==\""
    );
}

// ------------------------------------------------------------------------------------------
// Listings
// ------------------------------------------------------------------------------------------

/// A listing in nft's layout with handles, wrapped element lists, a base chain with a symbolic
/// priority, an affinity set, element comments and an iptables-nft table.
const LISTING: &str = "# Warning: table ip nat is managed by iptables-nft, do not touch!
table ip nat { # handle 3
\tchain KUBE-SEP-X { # handle 5
\t\tip protocol tcp   counter packets 0 bytes 0 # Warning: XT target DNAT not found
xt target \"DNAT\" # handle 9
\t}
}
table ip kube-proxy { # handle 18
\tcomment \"rules for kube-proxy\"
\tset cluster-ips { # handle 39
\t\ttype ipv4_addr
\t\tcomment \"Active ClusterIPs\"
\t\telements = { 10.255.0.1, 10.255.0.10,
\t\t\t     10.255.8.50 }
\t}

    map no-endpoint-services { # handle 42
        type ipv4_addr . inet_proto . inet_service : verdict
        elements = { 10.43.21.102 . tcp . 4317 comment \"riset/otel:otlp\" : goto reject-chain }
    }
\tset affinity-A { # handle 44
\t\ttype ipv4_addr
\t\tsize 65535
\t\tflags dynamic,timeout
\t\ttimeout 3h
\t}

   \tchain filter-prerouting { # handle 1
\t\ttype filter hook prerouting priority dstnat - 10; policy accept;
\t\tct state new jump firewall-check # handle 60
\t}
\tchain reject-chain {
\t\tcomment \"helper\"
\t\treject
\t}
}
";

#[test]
fn listing_blocks_handles_and_warnings() {
    let rs = parse(LISTING, &ParseOptions::strict()).expect("listing");
    assert_eq!(rs.form, InputForm::Listing);
    assert_eq!(rs.tables.len(), 2);
    let nat = rs.table(Family::Ip, "nat").expect("nat");
    assert!(nat.managed_by_iptables_nft);
    assert_eq!(nat.handle, Some(3));
    let sep = nat.chain("KUBE-SEP-X").expect("chain");
    assert_eq!(sep.handle, Some(5));
    assert_eq!(sep.rules.len(), 1, "the XT line continues its rule");
    assert_eq!(sep.rules[0].handle, Some(9));
    assert_eq!(
        sep.rules[0].stmts.last(),
        Some(&Stmt::Xt {
            kind: "target".into(),
            name: "DNAT".into()
        })
    );
    let kp = rs.table(Family::Ip, "kube-proxy").expect("kube-proxy");
    assert!(!kp.managed_by_iptables_nft);
    assert_eq!(kp.comment.as_deref(), Some("rules for kube-proxy"));
    let ips = kp.set("cluster-ips").expect("set");
    assert_eq!(ips.handle, Some(39));
    assert_eq!(ips.elements.len(), 3);
    assert_eq!(ips.key, SetType::Named(vec!["ipv4_addr".into()]));
    let nes = kp.set("no-endpoint-services").expect("map");
    assert!(nes.is_map);
    assert_eq!(nes.data, Some(SetType::Named(vec!["verdict".into()])));
    assert_eq!(nes.elements[0].comment.as_deref(), Some("riset/otel:otlp"));
    assert_eq!(nes.elements[0].value, Some(goto("reject-chain")));
    let aff = kp.set("affinity-A").expect("affinity");
    assert!(aff.flags.dynamic && aff.flags.timeout);
    assert_eq!(aff.timeout, Some(Duration::from_secs(10800)));
    assert_eq!(aff.size, Some(65535));
    let pre = kp.chain("filter-prerouting").expect("base chain");
    let base = pre.base.as_ref().expect("base");
    assert_eq!(
        (&*base.kind, &*base.hook, base.priority),
        ("filter", "prerouting", -110)
    );
    assert_eq!(base.policy, Some(Policy::Accept));
    assert_eq!(pre.rules[0].handle, Some(60));
    assert_eq!(pre.rules[0].line, 30);
    let rc = kp.chain("reject-chain").expect("chain");
    assert_eq!(rc.comment.as_deref(), Some("helper"));
    assert_eq!(rc.rules.len(), 1);
}

#[test]
fn priorities_by_name_and_family() {
    for (family, prio, want) in [
        ("ip", "filter", 0),
        ("ip", "dstnat", -100),
        ("ip", "srcnat", 100),
        ("ip", "raw", -300),
        ("ip", "mangle - 5", -155),
        ("ip", "security + 1", 51),
        ("ip", "-110", -110),
        ("ip", "dstnat-10", -110),
        ("bridge", "filter", -200),
        ("bridge", "out", 100),
    ] {
        let text = format!(
            "table {family} t {{\n chain c {{\n type filter hook input priority {prio}; policy drop;\n }}\n}}\n"
        );
        let rs = parse(&text, &ParseOptions::strict()).expect("listing");
        let base = rs.tables[0].chains[0].base.clone().expect("base");
        assert_eq!(base.priority, want, "{prio}");
        assert_eq!(base.policy, Some(Policy::Drop));
    }
    let e = parse(
        "table ip t {\n chain c {\n type filter hook input priority nonsense;\n }\n}\n",
        &ParseOptions::strict(),
    )
    .expect_err("unknown priority name");
    assert_eq!((e.line, e.col), (3, 34));
}

#[test]
fn listing_objects_sets_typeof_and_defines() {
    let text = "define x = 1
table inet t {
\tcounter x {
\t\tpackets 0 bytes 0
\t}
\tset s3 {
\t\ttypeof ip saddr . tcp dport
\t}
\tmap m2 {
\t\ttypeof meta mark : verdict
\t}
\tset s4 {
\t\ttype ipv4_addr
\t\tflags constant,interval
\t\tcounter
\t\telements = { 10.0.0.0/8 counter packets 1 bytes 2, 192.168.1.1-192.168.1.9 counter packets 0 bytes 0 }
\t}
\tset s2 {
\t\ttype ipv4_addr . inet_service
\t\telements = { 1.2.3.4 . 80 timeout 30s expires 29s984ms comment \"e\" }
\t}
}
";
    let rs = parse(text, &ParseOptions::strict()).expect("listing");
    assert_eq!(rs.warnings.len(), 1, "{:?}", rs.warnings);
    let t = &rs.tables[0];
    assert_eq!(t.family, Family::Inet);
    assert_eq!(t.objects.len(), 1);
    assert_eq!(
        (
            &*t.objects[0].kind,
            &*t.objects[0].name,
            &*t.objects[0].body
        ),
        ("counter", "x", "packets 0 bytes 0")
    );
    assert!(matches!(
        t.set("s3").expect("s3").key,
        SetType::Typeof(Expr::Concat(_))
    ));
    let m2 = t.set("m2").expect("m2");
    assert!(m2.is_map);
    assert_eq!(m2.data, Some(SetType::Named(vec!["verdict".into()])));
    let s4 = t.set("s4").expect("s4");
    assert!(s4.flags.constant && s4.flags.interval && s4.counter);
    assert_eq!(
        s4.elements[0].counter,
        Some(Counter {
            packets: 1,
            bytes: 2
        })
    );
    assert!(matches!(s4.elements[1].key, Expr::Range(..)));
    let e = &t.set("s2").expect("s2").elements[0];
    assert_eq!(e.timeout, Some(Duration::from_secs(30)));
    assert_eq!(e.expires, Some(Duration::from_millis(29_984)));
    assert_eq!(e.comment.as_deref(), Some("e"));
}

// ------------------------------------------------------------------------------------------
// Command input
// ------------------------------------------------------------------------------------------

#[test]
fn commands_apply_in_order() {
    let text = "add table ip kube-proxy { comment \"rules for kube-proxy\" ; }
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add chain ip kube-proxy services
add chain ip kube-proxy nat-output { type nat hook output priority -100 ; }
add rule ip kube-proxy nat-output jump services
insert rule ip kube-proxy nat-output counter
add map ip kube-proxy service-ips { type ipv4_addr . inet_proto . inet_service : verdict ; comment \"x\" ; }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-A }
add element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 : goto service-B }
add element ip kube-proxy service-ips { 172.30.0.41 . tcp . 80 : goto service-C }
delete element ip kube-proxy service-ips { 172.30.0.42 . tcp . 80 }
add chain ip kube-proxy stale
add rule ip kube-proxy stale drop
flush chain ip kube-proxy stale
add chain ip kube-proxy gone
delete chain ip kube-proxy gone
add set ip kube-proxy affinity-A { type ipv4_addr ; flags dynamic,timeout ; timeout 10800s ; }
add element ip kube-proxy nodeport-ips { 192.168.0.2 }
";
    let rs = parse(text, &ParseOptions::strict()).expect("commands");
    assert_eq!(rs.form, InputForm::Commands);
    let t = &rs.tables[0];
    assert_eq!(t.comment.as_deref(), Some("rules for kube-proxy"));
    // `services` was used before `add chain` (kube-proxy's dumps are not in loadable order),
    // and so was `nodeport-ips`.
    assert_eq!(rs.warnings.len(), 2, "{:?}", rs.warnings);
    assert_eq!(rs.warnings[0].line, 2);
    assert_eq!(t.chain("services").expect("services").rules.len(), 1);
    let out = t.chain("nat-output").expect("nat-output");
    assert_eq!(out.base.as_ref().map(|b| b.priority), Some(-100));
    assert_eq!(out.rules.len(), 2);
    assert_eq!(out.rules[0].stmts, vec![Stmt::Counter(None)]);
    let m = t.set("service-ips").expect("map");
    assert!(m.is_map);
    assert_eq!(m.elements.len(), 1);
    assert_eq!(m.elements[0].value, Some(goto("service-C")));
    assert!(t.chain("stale").expect("stale").rules.is_empty());
    assert!(t.chain("gone").is_none());
    let aff = t.set("affinity-A").expect("affinity");
    assert_eq!(aff.timeout, Some(Duration::from_secs(10800)));
    assert_eq!(t.set("nodeport-ips").expect("set").elements.len(), 1);
}

#[test]
fn rule_positions_and_handles_in_commands() {
    let text = "table ip t {
chain c {
accept # handle 1
drop # handle 2
}
}
add rule ip t c position 1 counter
insert rule ip t c position 2 return
replace rule ip t c handle 1 continue
delete rule ip t c handle 2
flush set ip t nothing
";
    let rs = parse(text, &ParseOptions::strict()).expect("mixed input");
    assert_eq!(rs.form, InputForm::Commands);
    let c = &rs.tables[0].chains[0];
    let printed: Vec<String> = c.rules.iter().map(ToString::to_string).collect();
    assert_eq!(printed, vec!["continue", "counter", "return"]);
}

// ------------------------------------------------------------------------------------------
// JSON
// ------------------------------------------------------------------------------------------

const JSON: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
{"set": {"family": "ip", "name": "affinity-A", "table": "kube-proxy", "type": "ipv4_addr", "handle": 9, "size": 65535, "flags": ["timeout"], "timeout": 10800}},
{"map": {"family": "ip", "name": "no-endpoint-nodeports", "table": "kube-proxy", "type": ["inet_proto", "inet_service"], "handle": 4, "map": "verdict", "elem": [[{"elem": {"val": {"concat": ["tcp", 3001]}, "comment": "ns2/svc2:p80"}}, {"drop": null}]]}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "nat-prerouting", "handle": 2, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "masquerading", "handle": 3}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "masquerading", "handle": 7, "expr": [{"match": {"op": "==", "left": {"&": [{"meta": {"key": "mark"}}, 16384]}, "right": 0}}, {"return": null}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "masquerading", "handle": 8, "expr": [{"masquerade": {"flags": "fully-random"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "nat-prerouting", "handle": 9, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}}, {"limit": {"rate": 10, "per": "second"}}, {"jump": {"target": "masquerading"}}], "comment": "a \"quoted\" comment"}}
]}"#;

#[test]
fn json_maps_into_the_same_tree() {
    let rs = parse(JSON, &ParseOptions::strict()).expect("json");
    assert_eq!(rs.form, InputForm::Json);
    assert_eq!(rs.nft_version.as_deref(), Some("1.0.6"));
    let t = &rs.tables[0];
    assert_eq!(t.handle, Some(1));
    let aff = t.set("affinity-A").expect("set");
    assert!(aff.flags.timeout && !aff.flags.dynamic);
    assert_eq!(aff.timeout, Some(Duration::from_secs(10800)));
    let nen = t.set("no-endpoint-nodeports").expect("map");
    assert!(nen.is_map);
    assert_eq!(nen.elements[0].comment.as_deref(), Some("ns2/svc2:p80"));
    assert_eq!(
        nen.elements[0].key,
        Expr::Concat(vec![sym("tcp"), Expr::Number(3001)])
    );
    assert_eq!(nen.elements[0].value, Some(Expr::Verdict(Verdict::Drop)));
    let masq = t.chain("masquerading").expect("chain");
    assert_eq!(masq.rules[0].handle, Some(7));
    assert_eq!(masq.rules[0].stmts, stmts("mark and 0x4000 == 0 return"));
    assert_eq!(masq.rules[1].to_string(), "masquerade fully-random");
    let pre = t.chain("nat-prerouting").expect("chain");
    assert_eq!(pre.base.as_ref().map(|b| b.priority), Some(-100));
    let r = &pre.rules[0];
    assert_eq!(r.comment.as_deref(), Some("a \"quoted\" comment"));
    assert!(
        matches!(r.comment, Some(Cow::Owned(_))),
        "escapes make it owned"
    );
    assert_eq!(r.stmts[0], stmts("ct state established,related")[0]);
    assert_eq!(
        r.stmts[1],
        Stmt::Verbatim(r#"{"limit": {"rate": 10, "per": "second"}}"#.into())
    );
    assert_eq!(
        r.stmts[2],
        Stmt::Verdict(Verdict::Jump("masquerading".into()))
    );
    // Names without escapes are borrowed from the input.
    assert!(matches!(t.name, Cow::Borrowed(_)));
}

#[test]
fn json_errors_have_positions() {
    let e = parse(
        "{\"nftables\": [\n{\"table\": {\"family\": \"ip\"}}\n]}",
        &ParseOptions::strict(),
    )
    .expect_err("table without name");
    // The position is the item's (where serde_json found the field missing).
    assert_eq!(e.line, 2);
    assert!(e.expected.contains("missing field `name`"), "{e}");
    let e =
        parse("{\"nftables\": [\n{\"table\": \n", &ParseOptions::strict()).expect_err("cut JSON");
    assert_eq!(e.line, 3);
    assert_eq!(e.found, "end of input");
    let e = parse("{\"other\": 1}", &ParseOptions::strict()).expect_err("no nftables");
    assert!(e.expected.contains("nftables"), "{e}");
    // Lenient reading skips the bad item and keeps the others.
    let rs = parse(
        "{\"nftables\": [{\"table\": {\"family\": \"ip\"}}, {\"table\": {\"family\": \"ip6\", \"name\": \"x\"}}]}",
        &ParseOptions::lenient(),
    )
    .expect("lenient");
    assert_eq!(rs.tables.len(), 1);
    assert_eq!(rs.skipped.len(), 1);
}

#[test]
fn json_commands_apply() {
    let text = r#"{"nftables": [
{"add": {"table": {"family": "ip", "name": "t"}}},
{"add": {"chain": {"family": "ip", "table": "t", "name": "c"}}},
{"add": {"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"drop": null}]}}},
{"insert": {"rule": {"family": "ip", "table": "t", "chain": "c", "expr": [{"accept": null}]}}},
{"add": {"set": {"family": "ip", "table": "t", "name": "s", "type": "ipv4_addr"}}},
{"add": {"element": {"family": "ip", "table": "t", "name": "s", "elem": ["10.0.0.1", "10.0.0.2"]}}},
{"delete": {"element": {"family": "ip", "table": "t", "name": "s", "elem": ["10.0.0.1"]}}}
]}"#;
    let rs = parse(text, &ParseOptions::strict()).expect("json commands");
    let t = &rs.tables[0];
    let rules: Vec<String> = t.chains[0].rules.iter().map(ToString::to_string).collect();
    assert_eq!(rules, vec!["accept", "drop"]);
    assert_eq!(t.sets[0].elements, vec![Element::key(addr("10.0.0.2"))]);
}

// ------------------------------------------------------------------------------------------
// Errors, lenient reading, hostile input
// ------------------------------------------------------------------------------------------

#[test]
fn errors_carry_line_and_column() {
    let e = parse(
        "table ip t {\n  chain c {\n    ip saddr \"oops\n  }\n}\n",
        &ParseOptions::strict(),
    )
    .expect_err("unterminated string")
    .in_source("rules.nft");
    assert_eq!((e.line, e.col), (3, 14));
    assert!(
        e.to_string()
            .starts_with("rules.nft:3:14: expected a closing `\"`"),
        "{e}"
    );
    let e = parse(
        "table ip t {\n  chain c {\n    accept\n",
        &ParseOptions::strict(),
    )
    .expect_err("unterminated block");
    assert!(
        e.expected.contains("unterminated block opened at line 2"),
        "{e}"
    );
    let e = parse(
        "add rule ip t c accept\nadd frob ip t\n",
        &ParseOptions::strict(),
    )
    .expect_err("unknown object");
    assert_eq!((e.line, e.col), (2, 5));
    let e = parse(
        "add chain ip t c { type nat hook output ; }\n",
        &ParseOptions::strict(),
    )
    .expect_err("no priority");
    assert_eq!((e.line, e.col), (1, 40));
    assert_eq!((&*e.expected, &*e.found), ("`priority`", "end of line"));
}

#[test]
fn lenient_reading_skips_and_warns() {
    let text = "den@pi:~$ sudo nft list ruleset
table ip kube-proxy {
\tchain services {
\t\tjump x
\t\ttype filter hook
\t}
\tfrob
\tchain endpoint-A {
\t\tip saddr 10.0.0.1 jump mark-for-masquerade
\t}
....
";
    let e = parse(text, &ParseOptions::strict()).expect_err("strict");
    assert_eq!(e.line, 1);
    let rs = parse(text, &ParseOptions::lenient()).expect("lenient");
    let skipped: Vec<u32> = rs.skipped.iter().map(|s| s.line).collect();
    assert_eq!(skipped, vec![1, 5, 7, 11]);
    assert!(rs.skipped[0].reason.starts_with("expected "));
    assert_eq!(rs.warnings.len(), 1);
    assert!(rs.warnings[0].message.contains("unterminated block"));
    let t = &rs.tables[0];
    assert_eq!(t.chains.len(), 2);
    assert_eq!(t.chain("services").expect("chain").rules.len(), 1);
    assert_eq!(t.chain("endpoint-A").expect("chain").rules.len(), 1);
}

#[test]
fn deep_nesting_neither_overflows_nor_errors() {
    let deep = format!("ip saddr {}1{}", "{ ".repeat(100_000), " }".repeat(100_000));
    let s = stmts(&deep);
    assert!(
        matches!(s.last(), Some(Stmt::Verbatim(_))),
        "too deep is verbatim"
    );
    let deep = format!("add rule ip t c ip saddr {} accept\n", "(".repeat(100_000));
    parse(&deep, &ParseOptions::strict()).expect("deep parentheses are verbatim");
    let deep = format!(
        "table ip t {{ set s {{ elements = {} }} }}",
        "{".repeat(100_000)
    );
    parse(&deep, &ParseOptions::strict()).expect_err("deep element lists are an error");
    parse(&deep, &ParseOptions::lenient()).expect("lenient");
    let deep = format!("{{\"nftables\": {}", "[".repeat(100_000));
    parse(&deep, &ParseOptions::strict()).expect_err("deep JSON is an error");
    let deep = format!(
        "{{\"nftables\": [{{\"rule\": {{\"family\": \"ip\", \"table\": \"t\", \"chain\": \"c\", \"expr\": [{{\"match\": {{\"op\": \"==\", \"left\": {}1{}, \"right\": 1}}}}]}}}}]}}",
        "{\"&\": [".repeat(70),
        ", 1]}".repeat(70)
    );
    let rs = parse(&deep, &ParseOptions::strict()).expect("deep JSON expression");
    assert!(matches!(
        rs.tables[0].chains[0].rules[0].stmts[0],
        Stmt::Verbatim(_)
    ));
}

// ------------------------------------------------------------------------------------------
// Normalisation
// ------------------------------------------------------------------------------------------

#[test]
fn normalisation_removes_what_forms_differ_in() {
    let dump = "add table ip t { comment \"c\" ; }
add chain ip t c { type filter hook input priority 0 ; comment \"x\" ; }
add rule ip t c meta l4proto tcp th dport 80 ip daddr { 10.0.0.1 } reject with icmp port-unreachable
add rule ip t c ip saddr != { 10.0.0.2 , 10.0.0.1 } log level warn counter packets 3 bytes 4
add rule ip t c meta l4proto tcp reject with tcp reset
add set ip t s { type ipv4_addr ; flags dynamic,timeout ; size 65535 ; }
add set ip t s2 { typeof ip daddr . th dport ; }
add element ip t s { 10.0.0.2 expires 3s , 10.0.0.1 }
";
    let listing = "table ip t { # handle 4
\tset s {
\t\ttype ipv4_addr
\t\tflags timeout
\t\telements = { 10.0.0.1, 10.0.0.2 }
\t}
\tset s2 {
\t\ttype ipv4_addr . inet_service
\t}
\tchain c {
\t\ttype filter hook input priority filter; policy accept;
\t\ttcp dport 80 ip daddr 10.0.0.1 reject
\t\tip saddr != { 10.0.0.1, 10.0.0.2 } log counter
\t\treject with tcp reset # handle 9
\t}
}
";
    let mut a = parse(dump, &ParseOptions::strict()).expect("dump");
    let mut b = parse(listing, &ParseOptions::strict()).expect("listing");
    assert_ne!(a.tables, b.tables);
    a.normalize();
    b.normalize();
    assert_eq!(a.tables, b.tables);
}

/// kube-proxy 1.36's table (the "G4" layout: `dnat ip addr . port to numgen … map`, the
/// `hairpin-connections` lookup, inline marks) and 1.38's named counters, as kube-proxy writes
/// them and as nft 1.0.6 lists them (text and JSON, taken from a kernel that loaded the
/// commands): one tree after normalising.
#[test]
fn kube_proxy_136_forms_are_one_tree() {
    let commands = "add table ip kube-proxy
add set ip kube-proxy hairpin-connections { type ipv4_addr . ipv4_addr . inet_proto . inet_service ; }
add counter ip kube-proxy rejected-tcp
add chain ip kube-proxy masquerading
add chain ip kube-proxy svc
add chain ip kube-proxy reject-tcp
add rule ip kube-proxy masquerading mark and 0x4000 != 0 mark set mark xor 0x4000 masquerade fully-random
add rule ip kube-proxy masquerading ct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
add rule ip kube-proxy svc meta l4proto tcp dnat ip addr . port to numgen random mod 2 map { 0 : 10.180.0.4 . 80 , 1 : 10.180.0.5 . 80 }
add rule ip kube-proxy reject-tcp counter name \"rejected-tcp\" reject
add element ip kube-proxy hairpin-connections { 10.180.0.5 . 10.180.0.5 . tcp . 80 }
";
    let listing = "table ip kube-proxy {
\tcounter rejected-tcp {
\t\tpackets 0 bytes 0
\t}

\tset hairpin-connections {
\t\ttype ipv4_addr . ipv4_addr . inet_proto . inet_service
\t\telements = { 10.180.0.5 . 10.180.0.5 . tcp . 80 }
\t}

\tchain masquerading {
\t\tmeta mark & 0x00004000 != 0x00000000 meta mark set meta mark ^ 0x00004000 masquerade fully-random
\t\tct status dnat ip saddr . ip daddr . meta l4proto . th dport @hairpin-connections masquerade fully-random
\t}

\tchain svc {
\t\tmeta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.180.0.4 . 80, 1 : 10.180.0.5 . 80 }
\t}

\tchain reject-tcp {
\t\tcounter name \"rejected-tcp\" reject
\t}
}
";
    let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}},
{"table": {"family": "ip", "name": "kube-proxy", "handle": 1}},
{"counter": {"family": "ip", "name": "rejected-tcp", "table": "kube-proxy", "handle": 2, "packets": 0, "bytes": 0}},
{"set": {"family": "ip", "name": "hairpin-connections", "table": "kube-proxy", "type": ["ipv4_addr", "ipv4_addr", "inet_proto", "inet_service"], "handle": 3, "elem": [{"concat": ["10.180.0.5", "10.180.0.5", "tcp", 80]}]}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "masquerading", "handle": 4}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "svc", "handle": 5}},
{"chain": {"family": "ip", "table": "kube-proxy", "name": "reject-tcp", "handle": 6}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "masquerading", "handle": 7, "expr": [{"match": {"op": "!=", "left": {"&": [{"meta": {"key": "mark"}}, 16384]}, "right": 0}}, {"mangle": {"key": {"meta": {"key": "mark"}}, "value": {"^": [{"meta": {"key": "mark"}}, 16384]}}}, {"masquerade": {"flags": "fully-random"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "masquerading", "handle": 8, "expr": [{"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}}, {"match": {"op": "==", "left": {"concat": [{"payload": {"protocol": "ip", "field": "saddr"}}, {"payload": {"protocol": "ip", "field": "daddr"}}, {"meta": {"key": "l4proto"}}, {"payload": {"protocol": "th", "field": "dport"}}]}, "right": "@hairpin-connections"}}, {"masquerade": {"flags": "fully-random"}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "svc", "handle": 9, "expr": [{"match": {"op": "==", "left": {"meta": {"key": "l4proto"}}, "right": "tcp"}}, {"dnat": {"family": "ip", "addr": {"map": {"key": {"numgen": {"mode": "random", "mod": 2, "offset": 0}}, "data": {"set": [[0, {"concat": ["10.180.0.4", 80]}], [1, {"concat": ["10.180.0.5", 80]}]]}}}}}]}},
{"rule": {"family": "ip", "table": "kube-proxy", "chain": "reject-tcp", "handle": 10, "expr": [{"counter": "rejected-tcp"}, {"reject": {"type": "icmp", "expr": "port-unreachable"}}]}}]}"#;
    let mut trees = Vec::new();
    for text in [commands, listing, json] {
        let mut rs = parse(text, &ParseOptions::strict()).expect(text);
        let t = &rs.tables[0];
        for c in &t.chains {
            for r in &c.rules {
                assert!(
                    !r.stmts.iter().any(|s| matches!(s, Stmt::Verbatim(_))),
                    "{text}: {r:?}"
                );
            }
        }
        let svc = &t.chain("svc").expect("svc").rules[0].stmts[1];
        let Stmt::Nat(n) = svc else { panic!("{svc:?}") };
        assert_eq!((n.kind, n.family), (NatKind::Dnat, Some(Family::Ip)));
        let Some(Expr::Map { key, map }) = &n.addr else {
            panic!("{n:?}")
        };
        assert!(matches!(**key, Expr::Numgen { modulus: 2, .. }), "{key:?}");
        let Expr::Set(values) = &**map else {
            panic!("{map:?}")
        };
        assert_eq!(
            values[1].value,
            Some(Expr::Concat(vec![addr("10.180.0.5"), Expr::Number(80)]))
        );
        assert_eq!(
            t.chain("reject-tcp").expect("chain").rules[0].stmts[0],
            Stmt::NamedCounter("rejected-tcp".into())
        );
        rs.normalize();
        trees.push(rs.tables);
    }
    assert_eq!(trees[0], trees[1]);
    assert_eq!(trees[1], trees[2]);
    // Printed (normalised: no family in an `ip` table) and read back: the same tree, and text
    // nft loads (`dnat to numgen … map { 0 : A . P }` reads address and port from the map).
    assert_round_trip(commands);
    let printed = parse_rule(
        "meta l4proto tcp dnat ip6 addr . port to numgen random mod 1 map { 0 : fd00::1 . 80 }",
    )
    .expect("rule")
    .to_string();
    assert_eq!(
        printed,
        "meta l4proto tcp dnat ip6 to numgen random mod 1 map { 0 : fd00::1 . 80 }"
    );
    assert_eq!(
        one(r#"counter name "a b""#).to_string(),
        r#"counter name "a b""#
    );
}

/// The property of the `nft` fuzz target: text that parses prints to command lines that parse
/// to the same normalised tables, and printing is a fixed point.
fn assert_round_trip(text: &str) {
    let mut a = parse(text, &ParseOptions::strict()).expect("input parses");
    let printed = a.to_string();
    let mut b = parse(&printed, &ParseOptions::strict())
        .unwrap_or_else(|e| panic!("printed text does not parse: {e}\n{printed}"));
    assert_eq!(b.to_string(), printed, "printing is not a fixed point");
    a.normalize();
    b.normalize();
    assert_eq!(a.tables, b.tables, "printed:\n{printed}");
}

#[test]
fn fuzz_findings_round_trip() {
    // A set only used by `add element` has no declaration to print (was `type  ;`).
    assert_round_trip("add element ip t s { 10.0.0.1 }\n");
    // Whether a set is a map comes from its declaration only (elements with data did flip it).
    assert_round_trip("table ip t {\n set s {\n elements = { 1 : 2 }\n }\n}\n");
    // Object bodies are one canonical line (a comment inside swallowed the closing brace).
    assert_round_trip("table ip t {\n counter c {\n packets 0 byt #es 0\n }\n}\n");
    let rs = parse(
        "table ip t {\n counter c {\n packets 0 # x\n bytes 0\n }\n}\n",
        &ParseOptions::strict(),
    )
    .expect("object");
    assert_eq!(rs.tables[0].objects[0].body, "packets 0 ; bytes 0");
    // An object declared twice is kept once, in a listing as in command input.
    assert_round_trip("table ip t {\n counter c {\n }\n counter c {\n packets 1 bytes 2\n }\n}\n");
    // Objects are `KIND NAME {` (stray words before the brace were taken as the kind).
    parse(
        "table ip t {\n counter a b {\n }\n}\n",
        &ParseOptions::strict(),
    )
    .expect_err("two names");
    // `dnat to` a constant that is no address is not modelled.
    let r = parse_rule("dnat ip to ip d\u{fffd}ddr").expect("rule");
    assert!(matches!(r.stmts[0], Stmt::Verbatim(_)), "{:?}", r.stmts);
    // A NAT address that is an expression starts with a packet expression (`tcp . 3002` is none).
    let r = parse_rule("dnat ip6 to tcp . 3002").expect("rule");
    assert!(matches!(r.stmts[0], Stmt::Verbatim(_)), "{:?}", r.stmts);
    // A NAT address that is an expression may start with a parenthesis (as printed).
    assert_round_trip("add rule ip t c dnat ip to ip daddr map { 1.1.1.1 : 2.2.2.2 } and 0xff\n");
    // No statement starts with `handle N` (in command input that places the rule).
    parse(
        "table ip t {\n chain c {\n handle 26\n }\n}\n",
        &ParseOptions::strict(),
    )
    .expect_err("a listing rule `handle 26`");
    // Names that are no single word are quoted, also table names; a trailing backslash does not
    // continue the line.
    assert_round_trip(
        "add table ip \": [\"\nadd chain ip \": [\" \\\nadd rule ip \": [\" \\ accept\n",
    );
    // A parenthesised group left of a match is a packet expression too (a constant was taken).
    assert_round_trip("add rule ip t c ( x ) accept\n");
    // A `# Warning: XT …` comment inside braces does not continue the rule past the line end.
    assert_round_trip(
        "table ip t {\n chain c {\n notrack { 1 # Warning: XT target DNAT not found\n }\n}\n chain d {\n accept\n }\n}\n",
    );
}

// ------------------------------------------------------------------------------------------
// Round trips (proptest)
// ------------------------------------------------------------------------------------------

/// Names as kube-proxy makes them (and others): letters, digits, `-_./`.
fn name() -> impl Strategy<Value = String> {
    "[a-z][a-zA-Z0-9_/.-]{0,20}"
}

/// A symbol: a bare word, or something only a quoted string can hold.
fn symbol() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z][a-z0-9_-]{0,10}",
        "[a-z]{1,4}\\*",
        "[a-zA-Z0-9 .:/=!@$-]{0,12}",
        Just("accept".to_string()),
        Just("tcp".to_string()),
        Just("==".to_string()),
        Just("comment".to_string()),
    ]
}

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<[u8; 4]>().prop_map(IpAddr::from),
        any::<[u16; 8]>().prop_map(IpAddr::from),
    ]
}

/// A constant (what stands right of a match and in set elements).
fn constant() -> BoxedStrategy<Expr<'static>> {
    let leaf = prop_oneof![
        any::<u64>().prop_map(Expr::Number),
        ip().prop_map(Expr::Addr),
        ip().prop_flat_map(|a| {
            let max = if a.is_ipv4() { 32u8 } else { 128 };
            (Just(a), 0..=max).prop_map(|(a, l)| Expr::Prefix(a, l))
        }),
        (any::<u16>(), any::<u16>()).prop_map(|(a, b)| Expr::Range(
            Box::new(Expr::Number(a.into())),
            Box::new(Expr::Number(b.into()))
        )),
        any::<[u8; 8]>().prop_map(|b| Expr::Range(
            Box::new(Expr::Addr(IpAddr::from([b[0], b[1], b[2], b[3]]))),
            Box::new(Expr::Addr(IpAddr::from([b[4], b[5], b[6], b[7]])))
        )),
        symbol().prop_map(|s| Expr::Symbol(Cow::Owned(s))),
        name().prop_map(|s| Expr::SetRef(Cow::Owned(s))),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 2..4).prop_map(Expr::Concat),
            proptest::collection::vec(element(inner.clone()), 1..4).prop_map(Expr::Set),
        ]
    })
    .boxed()
}

/// A set element with a key from `key`.
fn element(
    key: impl Strategy<Value = Expr<'static>> + Clone,
) -> impl Strategy<Value = Element<'static>> {
    (
        key.clone(),
        proptest::option::of(prop_oneof![
            key,
            name().prop_map(|n| Expr::Verdict(Verdict::Goto(Cow::Owned(n)))),
            Just(Expr::Verdict(Verdict::Drop)),
        ]),
        proptest::option::of("[a-z0-9/:. -]{0,12}"),
        proptest::option::of(0u64..100_000),
        proptest::option::of((any::<u32>(), any::<u32>())),
    )
        .prop_map(|(key, value, comment, timeout, counter)| Element {
            key: match key {
                // A set element's key is one expression, not a flag list.
                Expr::Set(_) => Expr::Number(1),
                k => k,
            },
            value,
            comment: comment.map(Cow::Owned),
            timeout: timeout.map(Duration::from_secs),
            expires: None,
            counter: counter.map(|(p, b)| Counter {
                packets: p.into(),
                bytes: b.into(),
            }),
        })
}

/// A packet expression without operators.
fn packet_leaf() -> impl Strategy<Value = Expr<'static>> + Clone {
    prop_oneof![
        (
            prop::sample::select(vec!["ip", "ip6", "th", "tcp", "udp", "sctp", "icmp"]),
            prop::sample::select(vec!["saddr", "daddr", "dport", "sport", "protocol", "type"])
        )
            .prop_map(|(p, f)| Expr::Payload {
                protocol: Cow::Borrowed(p),
                field: Cow::Borrowed(f)
            }),
        prop::sample::select(vec![
            "mark", "l4proto", "iifname", "oifname", "iif", "nfproto", "skuid"
        ])
        .prop_map(|k| Expr::Meta(Cow::Borrowed(k))),
        (
            proptest::option::of(prop::sample::select(vec!["original", "reply"])),
            prop::sample::select(vec!["state", "status", "mark", "ip saddr"])
        )
            .prop_map(|(d, k)| Expr::Ct {
                dir: d.map(Cow::Borrowed),
                key: Cow::Borrowed(k)
            }),
        (
            proptest::collection::vec(
                prop::sample::select(vec!["saddr", "daddr", "iif", "mark"]),
                1..3
            ),
            prop::sample::select(vec!["type", "oif", "oifname"])
        )
            .prop_map(|(fl, r)| Expr::Fib {
                flags: fl.into_iter().map(Cow::Borrowed).collect(),
                result: Cow::Borrowed(r)
            }),
        (
            prop::sample::select(vec!["random", "inc"]),
            1u32..100,
            0u32..5
        )
            .prop_map(|(m, n, o)| Expr::Numgen {
                mode: Cow::Borrowed(m),
                modulus: n,
                offset: o
            }),
    ]
}

/// A packet expression (left of a match): a leaf, bitwise operations, a concatenation.
fn packet_expr() -> impl Strategy<Value = Expr<'static>> {
    let binary = packet_leaf().prop_recursive(2, 8, 2, |inner| {
        (
            prop::sample::select(vec![BinOp::And, BinOp::Or, BinOp::Xor, BinOp::Lshift]),
            inner.clone(),
            prop_oneof![any::<u32>().prop_map(|n| Expr::Number(n.into())), inner],
        )
            .prop_map(|(op, l, r)| Expr::Binary {
                op,
                left: Box::new(l),
                right: Box::new(r),
            })
    });
    prop_oneof![
        3 => binary.clone(),
        1 => proptest::collection::vec(binary, 2..4).prop_map(Expr::Concat),
    ]
}

/// A statement of any modelled kind.
fn statement() -> impl Strategy<Value = Stmt<'static>> {
    prop_oneof![
        (
            packet_expr(),
            prop::sample::select(vec![RelOp::Eq, RelOp::Ne, RelOp::Lt, RelOp::Ge]),
            prop_oneof![
                constant(),
                proptest::collection::vec(symbol().prop_map(|s| Expr::Symbol(Cow::Owned(s))), 2..4)
                    .prop_map(Expr::List)
            ]
        )
            .prop_map(|(left, op, right)| Stmt::Match { left, op, right }),
        (
            packet_expr(),
            prop_oneof![
                name().prop_map(|n| Expr::SetRef(Cow::Owned(n))),
                proptest::collection::vec(
                    (any::<u16>(), name()).prop_map(|(k, n)| {
                        let mut e = Element::key(Expr::Number(k.into()));
                        e.value = Some(Expr::Verdict(Verdict::Jump(Cow::Owned(n))));
                        e
                    }),
                    1..4
                )
                .prop_map(Expr::Set)
            ]
        )
            .prop_map(|(key, map)| Stmt::Vmap { key, map }),
        (
            packet_expr(),
            prop_oneof![
                packet_expr(),
                any::<u32>().prop_map(|n| Expr::Number(n.into()))
            ]
        )
            .prop_map(|(key, value)| Stmt::Mangle { key, value }),
        name().prop_map(|n| Stmt::Verdict(Verdict::Goto(Cow::Owned(n)))),
        Just(Stmt::Verdict(Verdict::Return)),
        proptest::option::of((any::<u64>(), any::<u64>()))
            .prop_map(|c| Stmt::Counter(c.map(|(packets, bytes)| Counter { packets, bytes }))),
        (
            prop::sample::select(vec![NatKind::Dnat, NatKind::Snat]),
            proptest::option::of(prop::sample::select(vec![Family::Ip, Family::Ip6])),
            ip(),
            proptest::option::of(any::<u16>()),
            proptest::collection::vec(
                prop::sample::select(vec!["random", "fully-random", "persistent"]),
                0..3
            )
        )
            .prop_map(|(kind, family, a, port, flags)| Stmt::Nat(Nat {
                kind,
                family,
                addr: Some(Expr::Addr(a)),
                port: port.map(|p| Expr::Number(p.into())),
                flags: flags.into_iter().map(Cow::Borrowed).collect()
            })),
        proptest::option::of(any::<u16>()).prop_map(|port| Stmt::Nat(Nat {
            kind: NatKind::Masquerade,
            family: None,
            addr: None,
            port: port.map(|p| Expr::Number(p.into())),
            flags: vec![]
        })),
        prop_oneof![
            Just(None),
            Just(Some(RejectWith {
                kind: "tcp reset".into(),
                code: None
            })),
            prop::sample::select(vec!["icmp", "icmpv6", "icmpx"]).prop_map(|k| Some(RejectWith {
                kind: Cow::Borrowed(k),
                code: Some(Cow::Borrowed("host-unreachable"))
            })),
        ]
        .prop_map(Stmt::Reject),
        (name(), packet_expr()).prop_map(|(s, e)| Stmt::SetUpdate {
            op: Cow::Borrowed("update"),
            set: Cow::Owned(s),
            elem: e
        }),
        (
            proptest::option::of("[a-z :]{0,10}"),
            proptest::option::of(0u32..10)
        )
            .prop_map(|(p, g)| Stmt::Log(Log {
                prefix: p.map(Cow::Owned),
                group: g,
                ..Log::default()
            })),
        (
            prop::sample::select(vec!["match", "target"]),
            "[A-Za-z_]{1,10}"
        )
            .prop_map(|(k, n)| Stmt::Xt {
                kind: Cow::Borrowed(k),
                name: Cow::Owned(n)
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Print → parse gives the same statements, and printing again gives the same text.
    #[test]
    fn statements_round_trip(stmts in proptest::collection::vec(statement(), 1..4),
                             comment in proptest::option::of("[a-zA-Z0-9 /:._-]{0,20}")) {
        let rule = Rule { stmts, comment: comment.map(Cow::Owned), handle: None, line: 1 };
        let text = rule.to_string();
        let back = parse_rule(&text).expect("printed rule parses");
        prop_assert_eq!(&back.stmts, &rule.stmts, "text: {}", text);
        prop_assert_eq!(&back.comment, &rule.comment);
        prop_assert_eq!(back.to_string(), text);
    }

    /// A ruleset printed as commands parses back to the same tables.
    #[test]
    fn rulesets_round_trip(chains in proptest::collection::vec(
            (name(), proptest::collection::vec(statement(), 0..3), any::<bool>()), 0..4),
        elems in proptest::collection::vec(element(constant()), 0..5)) {
        // A set holds each key once.
        let mut elems = elems;
        let mut seen = Vec::new();
        elems.retain(|e| if seen.contains(&e.key) { false } else { seen.push(e.key.clone()); true });
        let mut table = Table { family: Family::Inet, name: "t".into(), comment: Some("c".into()), ..Table::default() };
        for (n, body, base) in chains {
            if table.chain(&n).is_some() {
                continue;
            }
            table.chains.push(Chain {
                name: Cow::Owned(n),
                base: base.then(|| BaseChain {
                    kind: "filter".into(),
                    hook: "input".into(),
                    priority: -110,
                    device: None,
                    policy: Some(Policy::Drop),
                }),
                rules: body.into_iter().map(|s| Rule { stmts: vec![s], ..Rule::default() }).collect(),
                ..Chain::default()
            });
        }
        table.sets.push(Set {
            name: "m".into(),
            is_map: true,
            key: SetType::Named(vec!["ipv4_addr".into(), "inet_service".into()]),
            data: Some(SetType::Named(vec!["verdict".into()])),
            flags: SetFlags { interval: true, dynamic: true, ..SetFlags::default() },
            timeout: Some(Duration::from_secs(10800)),
            comment: Some("a map".into()),
            elements: elems,
            ..Set::default()
        });
        let mut rs = Ruleset { tables: vec![table], ..Ruleset::default() };
        let text = rs.to_string();
        let mut back = parse(&text, &ParseOptions::strict()).expect("printed ruleset parses");
        prop_assert!(back.warnings.is_empty(), "{:?}", back.warnings);
        rs.normalize();
        back.normalize();
        prop_assert_eq!(&back.tables, &rs.tables, "text:\n{}", text);
    }

    /// Any bytes: no panic; lenient text reading never fails; strict success means lenient
    /// reads the same with nothing skipped.
    #[test]
    fn arbitrary_input_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let text = String::from_utf8_lossy(&bytes);
        let strict = parse(&text, &ParseOptions::strict());
        let lenient = parse(&text, &ParseOptions::lenient());
        if !text.trim_start().starts_with('{') {
            prop_assert!(lenient.is_ok(), "{:?}", lenient);
        }
        if let (Ok(s), Ok(l)) = (&strict, &lenient) {
            prop_assert!(l.skipped.is_empty());
            prop_assert_eq!(&s.tables, &l.tables);
        }
    }

    /// Token soup built from nft's own words.
    #[test]
    fn token_soup_never_panics(words in proptest::collection::vec(prop::sample::select(vec![
        "table", "ip", "kube-proxy", "{", "}", "chain", "set", "map", "type", "hook", "priority",
        "elements", "=", ",", ":", ".", ";", "\n", "add", "rule", "element", "flush", "delete",
        "insert", "ip", "daddr", "saddr", "meta", "l4proto", "th", "dport", "vmap", "@s", "goto",
        "x", "10.0.0.1", "10.0.0.0/8", "0x4000", "mark", "and", "==", "!=", "numgen", "random",
        "mod", "2", "dnat", "to", "1.2.3.4:80", "[fd00::1]:80", "masquerade", "fully-random",
        "reject", "with", "icmp", "counter", "packets", "bytes", "comment", "\"c\"", "# handle 3",
        "(", ")", "|", "typeof", "flags", "timeout", "3h", "policy", "accept", "xt", "target",
        "update", "ct", "state", "new", ",", "fib", "type", "local", "define", "\"",
    ]), 0..60)) {
        let text = words.join(" ");
        let _ = parse(&text, &ParseOptions::strict());
        if !text.trim_start().starts_with('{') {
            prop_assert!(parse(&text, &ParseOptions::lenient()).is_ok());
        }
    }
}
