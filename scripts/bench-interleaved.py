#!/usr/bin/env python3
"""Two or more builds compared on the same rows, interleaved (A, B, B, A, ...), so that a shared
machine's drift hits them alike (BENCHMARKS.md). Prints wall min/median, CPU (user + sys) median
and peak RSS per row and binary; the raw runs go to /tmp/ab-CPUS.json.

    scripts/bench-interleaved.py CPUS RUNS BIN_A BIN_B [BIN...]     (CPUS: all, or e.g. 0)
    ROWS=graph-table,render scripts/bench-interleaved.py all 5 A B  (some rows only)

Inputs: target/scale (sudo testdata/make-scale-dump.sh, testdata/make-sep-comment-dump.sh).
"""
import os, sys, time, statistics, subprocess, json
cpus, n, bins = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
d = "target/scale"
st = f"--state {d}/state.json --config {d}/config.yaml"
rows = {
 "graph-json": f"graph --iptables-save {d}/scale.nft.save -o json",
 "graph-table": f"graph --iptables-save {d}/scale.nft.save -o table",
 "render": f"render {st} --with-base-jumps --nfacct none",
 "verify-clean": f"verify {st} --iptables-save {d}/scale.nft.save --kube-proxy-version 1.35 node-1",
 "verify-drift": f"verify {st} --iptables-save {d}/sep-comments.nft.save --kube-proxy-version 1.35 node-1",
 "verify-drift-inferred": f"verify {st} --iptables-save {d}/sep-comments.nft.save node-1",
}
sel = os.environ.get("ROWS")
out = {}
for row, args in rows.items():
    if sel and row not in sel.split(","): continue
    res = {b: [] for b in bins}
    for i in range(n + 1):
        for b in (bins if i % 2 == 0 else bins[::-1]):
            cmd = ([ "taskset", "-c", cpus] if cpus != "all" else []) + [b] + args.split()
            t = time.perf_counter()
            p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _, status, ru = os.wait4(p.pid, 0)
            w = time.perf_counter() - t
            if i > 0: res[b].append((w, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024))
    for b in bins:
        r = res[b]
        print(f"{row:22s} {os.path.basename(b):10s} wall min {min(x[0] for x in r):.3f} med {statistics.median(x[0] for x in r):.3f}  cpu med {statistics.median(x[1] for x in r):.3f}  rss {max(x[2] for x in r):.0f} MB", flush=True)
    out[row] = res
json.dump(out, open(f"/tmp/ab-{cpus}.json", "w"))
