#!/usr/bin/env bash
# The fleet figures of BENCHMARKS.md: `status` over 5,000 nodes and `verify --all-nodes` over
# 1,000 small nodes (default concurrency), each against the fake API server of the integration
# tests (tests/fleet.rs), the binary under /usr/bin/time -v. Prints the wall time and peak RSS of
# each run, then the median of each.
#
#   scripts/bench-fleet.sh [-b BIN] [-t TESTS] [-r RUNS] [-n NODES]
#
#   -b BIN    the binary measured (default target/release/kubectl-kproxy, built first)
#   -t TESTS  the integration-test binary (default: built with --release, so that the fake API
#             server is not what is measured)
#   -r RUNS   runs of each (default 5)
#   -n NODES  nodes of the verify run (default 1000)
set -euo pipefail
export LC_ALL=C
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bin="" tests="" runs=5 nodes=1000
while getopts "b:t:r:n:h" opt; do
  case "$opt" in
    b) bin="$OPTARG" ;;
    t) tests="$OPTARG" ;;
    r) runs="$OPTARG" ;;
    n) nodes="$OPTARG" ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
  esac
done
[ -x /usr/bin/time ] || { echo "bench-fleet: /usr/bin/time is missing (Debian: apt-get install time)" >&2; exit 2; }
if [ -z "$bin" ]; then
  cargo build --release --locked --bin kubectl-kproxy >&2
  bin=target/release/kubectl-kproxy
fi
if [ -z "$tests" ]; then
  tests=$(cargo test --release --locked --test integration --no-run --message-format=json 2>/dev/null \
    | jq -r 'select(.reason == "compiler-artifact" and .target.name == "integration" and .executable != null) | .executable' \
    | tail -n 1)
fi
[ -x "$tests" ] || { echo "bench-fleet: no integration-test binary" >&2; exit 2; }
bin=$(realpath "$bin")

# "Elapsed (wall clock) time (h:mm:ss or m:ss): 0:02.71" → seconds.
seconds() { awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; printf "%.2f", s }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else printf "%.2f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

report=$(mktemp)
trap 'rm -f "$report"' EXIT
for test in status_over_five_thousand_nodes verify_all_nodes_at_scale; do
  walls=() rss=()
  for i in $(seq "$runs"); do
    KPROXY_BENCH_BIN="$bin" FLEET_NODES="$nodes" FLEET_TIME="$report" \
      "$tests" "fleet::$test" --exact --test-threads 1 >/dev/null 2>&1 \
      || { echo "bench-fleet: $test failed (run it with --nocapture)" >&2; exit 1; }
    w=$(sed -n 's/.*Elapsed (wall clock) time.*: //p' "$report" | seconds)
    m=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$report")
    walls+=("$w") rss+=("$m")
    echo "$test run $i: ${w} s, $((m / 1024)) MB"
  done
  mw=$(printf '%s\n' "${walls[@]}" | median)
  mr=$(printf '%s\n' "${rss[@]}" | median)
  echo "$test: median ${mw} s wall, median peak RSS $(awk -v k="$mr" 'BEGIN { printf "%d", k / 1024 }') MB over $runs runs"
done
