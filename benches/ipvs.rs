//! ipvsadm parse speed on a large IPVS node: `ipvsadm -Ln --stats` with 10,000 virtual servers × 3 real
//! servers (target: ≤ 0.1 s), plus `-Ln` and `-Sn` of the same table and the merge of all three.

/// The binary's allocator, so the figures are the binary's.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kproxy::parsers::ipvsadm::parse_dump;
use std::fmt::Write as _;
use std::hint::black_box;

const SERVICES: u32 = 10_000;
const REAL_SERVERS: u32 = 3;

fn vip(i: u32) -> String {
    format!("10.{}.{}.{}", 96 + (i >> 16), (i >> 8) & 255, i & 255)
}

fn rs(i: u32, j: u32) -> String {
    let n = i * REAL_SERVERS + j;
    format!("10.244.{}.{}:8080", (n >> 8) & 255, n & 255)
}

/// `ipvsadm -Ln --stats` text with large counters (some printed with K/M/G suffixes).
fn stats_text() -> String {
    let mut s = String::from(
        "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n  -> RemoteAddress:Port\n",
    );
    for i in 0..SERVICES {
        let _ = writeln!(
            s,
            "{:<33} {:>8} {:>8} {:>8} {:>8} {:>8}",
            format!("TCP  {}:80", vip(i)),
            i,
            i * 7,
            "123456K",
            "987G",
            "1234M"
        );
        for j in 0..REAL_SERVERS {
            let _ = writeln!(
                s,
                "  -> {:<28} {:>8} {:>8} {:>8} {:>8} {:>8}",
                rs(i, j),
                j,
                i,
                i * 3,
                99_999_999,
                "123T"
            );
        }
    }
    s
}

fn list_text() -> String {
    let mut s = String::from(
        "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n",
    );
    for i in 0..SERVICES {
        let _ = writeln!(s, "TCP  {}:80 rr", vip(i));
        for j in 0..REAL_SERVERS {
            let _ = writeln!(
                s,
                "  -> {:<28} {:<7} {:<6} {:<10} {:<10}",
                rs(i, j),
                "Masq",
                1,
                j,
                i % 7
            );
        }
    }
    s
}

fn save_text() -> String {
    let mut s = String::new();
    for i in 0..SERVICES {
        let _ = writeln!(s, "-A -t {}:80 -s rr", vip(i));
        for j in 0..REAL_SERVERS {
            let _ = writeln!(s, "-a -t {}:80 -r {} -m -w 1", vip(i), rs(i, j));
        }
    }
    s
}

fn bench(c: &mut Criterion) {
    let stats = stats_text();
    let list = list_text();
    let save = save_text();
    let services = parse_dump(&stats)
        .map(|d| d.listings[0].services.len())
        .unwrap_or(0);
    assert_eq!(
        services, SERVICES as usize,
        "the generated --stats text must parse completely"
    );
    println!(
        "ipvsadm -Ln --stats: {} virtual servers, {} bytes",
        services,
        stats.len()
    );
    let mut g = c.benchmark_group("ipvs_parse");
    g.sample_size(20);
    g.throughput(Throughput::Bytes(stats.len() as u64));
    g.bench_function("ln_stats_10k", |b| {
        b.iter(|| parse_dump(black_box(&stats)).map(|d| d.listings.len()))
    });
    g.throughput(Throughput::Bytes(list.len() as u64));
    g.bench_function("ln_10k", |b| {
        b.iter(|| parse_dump(black_box(&list)).map(|d| d.listings.len()))
    });
    g.throughput(Throughput::Bytes(save.len() as u64));
    g.bench_function("sn_10k", |b| {
        b.iter(|| parse_dump(black_box(&save)).map(|d| d.listings.len()))
    });
    let all = format!("{list}{stats}");
    g.throughput(Throughput::Bytes(all.len() as u64));
    g.bench_function("ln_plus_stats_merged_10k", |b| {
        b.iter(|| parse_dump(black_box(&all)).map(|d| d.merged_services().len()))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
