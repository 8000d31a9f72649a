//! `trace --packet` speed on a large node: 10,000 services × 10 endpoints in kube-proxy's rule
//! layout (generated in-process). The traced packet goes to the *last* service, so the walk scans
//! all of KUBE-SERVICES and splits into 10 branches. Parsing is measured separately
//! (`benches/parse.rs`); here the ruleset is parsed once.

/// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use kproxy::model::Ruleset;
use kproxy::parsers::iptables::ParseOptions;
use kproxy::trace::sim::iptables::{kernel, kptest};
use kproxy::trace::sim::{KernelInput, LocalAddrs, Origin, PacketSpec};
use std::fmt::Write as _;
use std::hint::black_box;

const SERVICES: usize = 10_000;
const ENDPOINTS: usize = 10;

fn cluster_ip(i: usize) -> String {
    format!("172.30.{}.{}", i / 250, i % 250 + 1)
}

fn generate() -> String {
    let mut chains = String::new();
    let mut rules = String::new();
    for i in 0..SERVICES {
        let cip = cluster_ip(i);
        let _ = writeln!(chains, ":KUBE-SVC-{i:06} - [0:0]");
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {cip}/32 -p tcp -m comment --comment \"ns/svc{i}:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-{i:06}"
        );
        let _ = writeln!(
            rules,
            "-A KUBE-SVC-{i:06} ! -s 10.244.0.0/16 -d {cip}/32 -p tcp -m comment --comment \"ns/svc{i}:http cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ"
        );
        for e in 0..ENDPOINTS {
            let ep = format!("10.{}.{}.{}", 100 + e, i / 250, i % 250 + 1);
            let _ = writeln!(chains, ":KUBE-SEP-{i:06}-{e} - [0:0]");
            let stat = match ENDPOINTS - e {
                1 => String::new(),
                k => format!(
                    " -m statistic --mode random --probability {:.11}",
                    1.0 / k as f64
                ),
            };
            let _ = writeln!(
                rules,
                "-A KUBE-SVC-{i:06} -m comment --comment \"ns/svc{i}:http -> {ep}:8080\"{stat} -j KUBE-SEP-{i:06}-{e}"
            );
            let _ = writeln!(
                rules,
                "-A KUBE-SEP-{i:06}-{e} -s {ep}/32 -m comment --comment ns/svc{i}:http -j KUBE-MARK-MASQ"
            );
            let _ = writeln!(
                rules,
                "-A KUBE-SEP-{i:06}-{e} -p tcp -m comment --comment ns/svc{i}:http -m tcp -j DNAT --to-destination {ep}:8080"
            );
        }
    }
    format!(
        "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:KUBE-FORWARD - [0:0]\n\
         -A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n\
         -A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT\nCOMMIT\n\
         *nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n:KUBE-SERVICES - [0:0]\n\
         :KUBE-MARK-MASQ - [0:0]\n:KUBE-POSTROUTING - [0:0]\n{chains}\
         -A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n\
         -A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING\n\
         -A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n\
         -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN\n\
         -A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0\n\
         -A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully\n\
         {rules}COMMIT\n"
    )
}

fn benches(c: &mut Criterion) {
    let text = generate();
    let rules = Ruleset::parse(&text, &ParseOptions::strict()).expect("generated rules parse");
    let last = cluster_ip(SERVICES - 1);
    let packet: PacketSpec = format!("192.168.1.9->{last}:80/tcp")
        .parse()
        .expect("packet");
    let input = KernelInput {
        packet,
        origin: Origin::External,
        local: LocalAddrs::kernel(vec!["192.168.1.2".parse().expect("ip")]),
        in_iface: None,
        out_iface: None,
    };
    let check = kernel::simulate(&rules, &input).expect("simulate");
    assert_eq!(check.outcomes.len(), ENDPOINTS);
    let mut g = c.benchmark_group("trace");
    g.sample_size(20);
    g.bench_function("kernel/10k_services_x10_last_service", |b| {
        b.iter(|| black_box(kernel::simulate(&rules, black_box(&input)).expect("simulate")))
    });
    let local = LocalAddrs::exact(vec![
        "127.0.0.1".parse().expect("ip"),
        "192.168.1.2".parse().expect("ip"),
    ]);
    g.bench_function("kube_proxy_test/10k_services_x10_last_service", |b| {
        b.iter(|| black_box(kptest::trace(&rules, black_box(&packet), &local).expect("trace")))
    });
    g.finish();
}

criterion_group!(trace_benches, benches);
criterion_main!(trace_benches);
