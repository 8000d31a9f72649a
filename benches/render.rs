//! `render` speed: 10,000 services × 10 endpoints (a generated `kubectl get -o json` List).
//! `render_iptables/10k_services_x10` measures rendering from parsed state (incl. writing the
//! restore text to a sink); `load_state_json/10k_services_x10` measures JSON → ClusterState.
//! Both are measured in wall time and (group `*_cpu`) in this thread's CPU time from
//! `/proc/thread-self/schedstat`, which stays meaningful on a busy machine.
//! The render's peak heap (a counting allocator) is printed before the benchmarks.

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use kproxy::proxier::iptables::{RenderOptions, render};
use kproxy::state::config::ProxyConfig;
use kproxy::state::ip::IpFamily;
use kproxy::state::load;
use kproxy::state::node::NodeFacts;
use mimalloc::MiMalloc;
use serde_json::{Value, json};
use std::alloc::{GlobalAlloc, Layout};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts live heap bytes and their peak, to report render's working memory.
struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);
static COUNTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

// SAFETY: delegates to mimalloc (the binary's allocator); only adds bookkeeping.
#[expect(unsafe_code, reason = "a global allocator is an unsafe trait")]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.load(Ordering::Relaxed) {
            let size = l.size() as isize;
            let now = LIVE.fetch_add(size, Ordering::Relaxed) + size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { MiMalloc.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if COUNTING.load(Ordering::Relaxed) {
            LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { MiMalloc.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// This thread's on-CPU time in ns (`/proc/thread-self/schedstat`, first field).
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

/// Criterion measurement: thread CPU time.
struct CpuTime;

struct CpuFormatter;

impl ValueFormatter for CpuFormatter {
    fn scale_values(&self, _typical: f64, values: &mut [f64]) -> &'static str {
        values.iter_mut().for_each(|v| *v /= 1e6);
        "ms(cpu)"
    }
    fn scale_throughputs(
        &self,
        _typical: f64,
        _t: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        values.iter_mut().for_each(|v| *v /= 1e6);
        "ms(cpu)"
    }
    fn scale_for_machines(&self, _values: &mut [f64]) -> &'static str {
        "ns"
    }
}

impl Measurement for CpuTime {
    type Intermediate = u64;
    type Value = u64;
    fn start(&self) -> u64 {
        thread_cpu_ns()
    }
    fn end(&self, i: u64) -> u64 {
        thread_cpu_ns().saturating_sub(i)
    }
    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }
    fn zero(&self) -> u64 {
        0
    }
    fn to_f64(&self, v: &u64) -> f64 {
        *v as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuFormatter
    }
}

const SERVICES: usize = 10_000;
const ENDPOINTS: usize = 10;

fn generate() -> String {
    let mut items: Vec<Value> = Vec::with_capacity(SERVICES * 2 + 1);
    for i in 0..SERVICES {
        let ns = format!("ns{}", i % 50);
        let name = format!("svc{i}");
        let cip = format!("172.30.{}.{}", i / 250, i % 250 + 1);
        let (ty, etp) = match i % 20 {
            0 => ("LoadBalancer", "Local"),
            1..=3 => ("NodePort", "Cluster"),
            _ => ("ClusterIP", "Cluster"),
        };
        let mut port = json!({"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080});
        if ty != "ClusterIP" {
            port["nodePort"] = json!(30000 + (i % 2700));
        }
        let mut svc = json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"type": ty, "clusterIP": cip, "clusterIPs": [cip], "ipFamilies": ["IPv4"],
                     "ports": [port], "sessionAffinity": "None", "internalTrafficPolicy": "Cluster"},
            "status": {"loadBalancer": {}}
        });
        if ty != "ClusterIP" {
            svc["spec"]["externalTrafficPolicy"] = json!(etp);
        }
        if ty == "LoadBalancer" {
            svc["spec"]["healthCheckNodePort"] = json!(32000 + i % 700);
            svc["status"]["loadBalancer"]["ingress"] =
                json!([{"ip": format!("5.{}.{}.1", i / 250, i % 250)}]);
        }
        items.push(svc);
        let endpoints: Vec<Value> = (0..ENDPOINTS)
            .map(|e| {
                json!({
                    "addresses": [format!("10.{}.{}.{}", i / 250, i % 250, e + 1)],
                    "conditions": {"ready": true, "serving": true, "terminating": false},
                    "nodeName": format!("node{}", e % 5),
                    "targetRef": {"kind": "Pod", "namespace": ns, "name": format!("{name}-{e}")}
                })
            })
            .collect();
        items.push(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-abcde"), "namespace": ns,
                         "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
            "endpoints": endpoints
        }));
    }
    items.push(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node0",
        "labels": {"topology.kubernetes.io/zone": "z1"}},
        "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.2"}]}}),
    );
    serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items}))
        .unwrap_or_default()
}

fn benches(c: &mut Criterion) {
    let text = generate();
    let state = load::from_str(&text, "generated.json").unwrap_or_else(|e| panic!("{e}"));
    let (config, facts) = inputs();
    phases(&state, &config, &facts);
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let rendered = render(&state, &config, &facts, RenderOptions::default());
    let mut sink = std::io::sink();
    rendered
        .write_restore(&mut sink)
        .unwrap_or_else(|e| panic!("{e}"));
    let peak = PEAK.load(Ordering::Relaxed) - base;
    let sample = rendered.to_restore_text();
    drop(rendered);
    eprintln!(
        "state JSON {:.1} MB; restore text {:.1} MB, {} lines; render peak heap {:.1} MB = {:.2}x output",
        text.len() as f64 / 1e6,
        sample.len() as f64 / 1e6,
        sample.lines().count(),
        peak as f64 / 1e6,
        peak as f64 / sample.len() as f64
    );

    run_group(c, "", &state, &text, &config, &facts);
}

fn cpu_benches(c: &mut Criterion<CpuTime>) {
    let text = generate();
    let state = load::from_str(&text, "generated.json").unwrap_or_else(|e| panic!("{e}"));
    let (config, facts) = inputs();
    run_group(c, "_cpu", &state, &text, &config, &facts);
}

/// Prints the thread CPU time of render's phases (one run each, after a warm-up run).
fn phases(state: &kproxy::state::ClusterState, config: &ProxyConfig, facts: &NodeFacts) {
    use kproxy::proxier::endpoints::{EndpointDetail, endpoints_map_with};
    use kproxy::proxier::iptables::{decide_with, render_decisions};
    drop(render(state, config, facts, RenderOptions::default()));
    let t = thread_cpu_ns();
    let m = endpoints_map_with(
        &state.endpoint_slices,
        IpFamily::V4,
        "node0",
        EndpointDetail::Lean,
        &mut Vec::new(),
    );
    let t_map = thread_cpu_ns() - t;
    drop(m);
    let t = thread_cpu_ns();
    let plan = decide_with(state, config, facts, EndpointDetail::Lean);
    let t_plan = thread_cpu_ns() - t;
    let t = thread_cpu_ns();
    let r = render_decisions(&plan, facts, RenderOptions::default());
    let t_emit = thread_cpu_ns() - t;
    let t = thread_cpu_ns();
    drop(r);
    drop(plan);
    let t_drop = thread_cpu_ns() - t;
    let t = thread_cpu_ns();
    drop(render(state, config, facts, RenderOptions::default()));
    let t_all = thread_cpu_ns() - t;
    eprintln!(
        "cpu ms: endpoints_map {:.1}, plan (incl. map) {:.1}, emit {:.1}, drop {:.1}; streaming render {:.1}",
        t_map as f64 / 1e6,
        t_plan as f64 / 1e6,
        t_emit as f64 / 1e6,
        t_drop as f64 / 1e6,
        t_all as f64 / 1e6
    );
}

fn inputs() -> (ProxyConfig, NodeFacts) {
    let config = ProxyConfig {
        cluster_cidrs: vec!["10.0.0.0/8".into()],
        ..ProxyConfig::default()
    };
    let mut facts = NodeFacts::new("node0", IpFamily::V4);
    facts.node_ips = vec!["192.168.0.2".parse().unwrap_or_else(|_| panic!("ip"))];
    (config, facts)
}

fn run_group<M: Measurement>(
    c: &mut Criterion<M>,
    suffix: &str,
    state: &kproxy::state::ClusterState,
    text: &str,
    config: &ProxyConfig,
    facts: &NodeFacts,
) {
    let mut g = c.benchmark_group(format!("render_iptables{suffix}"));
    g.sample_size(10);
    g.bench_function("10k_services_x10", |b| {
        b.iter(|| {
            let r = render(black_box(state), config, facts, RenderOptions::default());
            let mut sink = std::io::sink();
            r.write_restore(&mut sink).unwrap_or_else(|e| panic!("{e}"));
            black_box(r.tables.len())
        })
    });
    g.finish();

    let mut g = c.benchmark_group(format!("load_state_json{suffix}"));
    g.sample_size(10);
    g.bench_function("10k_services_x10", |b| {
        b.iter(|| {
            let s =
                load::from_str(black_box(text), "generated.json").unwrap_or_else(|e| panic!("{e}"));
            black_box(s.services.len())
        })
    });
    g.finish();
}

criterion_group!(render_benches, benches);
criterion_group! {
    name = render_benches_cpu;
    config = Criterion::default().with_measurement(CpuTime);
    targets = cpu_benches
}
criterion_main!(render_benches, render_benches_cpu);
