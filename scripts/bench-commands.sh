#!/usr/bin/env bash
# Whole-command timings of the commands users run on a node-sized input (BENCHMARKS.md): for each
# row, min and median wall time over several runs (hyperfine) and the peak RSS (/usr/bin/time).
# Builds nothing: give it a release binary.
#
#   scripts/bench-commands.sh [-b BIN] [-d DIR] [-r RUNS] [-c CPUS] [-j JSON_DIR] [ROW...]
#
#   -b BIN       the binary (default target/release/kubectl-kproxy)
#   -d DIR       the inputs (default target/scale): state.json, config.yaml, scale.nft.save made by
#                `sudo testdata/make-scale-dump.sh`, sep-comments.nft.save by
#                testdata/make-sep-comment-dump.sh
#   -r RUNS      runs per row (default 7, after one warm-up run)
#   -c CPUS      run pinned to these CPUs (`taskset -c CPUS`, e.g. 0 for one core)
#   -j JSON_DIR  keep hyperfine's JSON exports there
#   ROW          graph-json graph-table render verify-clean verify-clean-inferred verify-drift
#                verify-drift-inferred (default: all)
#
# Prints one Markdown table row per command: wall min / median, peak RSS (max over RUNS runs) and,
# for verify, the exit status and the number of findings of `-o json`.
set -euo pipefail
export LC_ALL=C
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bin=target/release/kubectl-kproxy dir=target/scale runs=7 cpus="" json_dir=""
while getopts "b:d:r:c:j:h" opt; do
  case "$opt" in
    b) bin="$OPTARG" ;;
    d) dir="$OPTARG" ;;
    r) runs="$OPTARG" ;;
    c) cpus="$OPTARG" ;;
    j) json_dir="$OPTARG" ;;
    *) sed -n '2,20p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
rows=("$@")
[ ${#rows[@]} -gt 0 ] || rows=(graph-json graph-table render verify-clean verify-clean-inferred verify-drift verify-drift-inferred)
[ -x "$bin" ] || { echo "bench-commands: no binary $bin (cargo build --release)" >&2; exit 2; }
for f in state.json config.yaml scale.nft.save; do
  [ -r "$dir/$f" ] || { echo "bench-commands: no $dir/$f (sudo testdata/make-scale-dump.sh)" >&2; exit 2; }
done
command -v hyperfine >/dev/null || { echo "bench-commands: hyperfine not installed" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "bench-commands: /usr/bin/time not installed" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
pin=()
[ -z "$cpus" ] || pin=(taskset -c "$cpus")

state="--state $dir/state.json --config $dir/config.yaml"
clean="$dir/scale.nft.save"
drift="$dir/sep-comments.nft.save"
old="--kube-proxy-version 1.35"

# The command line of a row.
row_command() {
  case "$1" in
    graph-json) echo "$bin graph --iptables-save $clean -o json" ;;
    graph-table) echo "$bin graph --iptables-save $clean -o table" ;;
    render) echo "$bin render $state --with-base-jumps --nfacct none" ;;
    verify-clean) echo "$bin verify $state --iptables-save $clean $old node-1" ;;
    verify-clean-inferred) echo "$bin verify $state --iptables-save $clean node-1" ;;
    verify-drift) echo "$bin verify $state --iptables-save $drift $old node-1" ;;
    verify-drift-inferred) echo "$bin verify $state --iptables-save $drift node-1" ;;
    *) echo "bench-commands: unknown row $1" >&2; return 2 ;;
  esac
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); cpus: ${cpus:-all} of $(nproc); runs: $runs"
echo
echo "| row | min | median | peak RSS | exit, findings |"
echo "|---|---|---|---|---|"
for row in "${rows[@]}"; do
  cmd="$(row_command "$row")"
  case "$row" in verify-drift*) [ -r "$drift" ] || { echo "bench-commands: no $drift (testdata/make-sep-comment-dump.sh)" >&2; exit 2; } ;; esac
  export_json="$tmp/$row.json"
  # Exit status 1 is verify's "drift": not a failure here.
  hyperfine --style none --warmup 1 --runs "$runs" -i --export-json "$export_json" \
    "${pin[*]} $cmd" >/dev/null 2>"$tmp/hyperfine.err" || { cat "$tmp/hyperfine.err" >&2; exit 1; }
  [ -z "$json_dir" ] || { mkdir -p "$json_dir"; cp "$export_json" "$json_dir/"; }
  rss=0
  for _ in $(seq "$runs"); do
    # shellcheck disable=SC2086
    /usr/bin/time -f '%M' -o "$tmp/time" "${pin[@]}" $cmd >/dev/null 2>"$tmp/stderr" || true
    kb="$(tail -1 "$tmp/time")"
    [ "$kb" -gt "$rss" ] && rss="$kb"
  done
  extra="-"
  case "$row" in
    verify-*)
      # shellcheck disable=SC2086
      status=0; $cmd -o json >"$tmp/out.json" 2>/dev/null || status=$?
      extra="$status, $(python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(len(d["findings"]) + d.get("findings_truncated", 0), "findings,", len(d["findings"]), "shown")' "$tmp/out.json")"
      ;;
  esac
  python3 - "$export_json" "$row" "$rss" "$extra" <<'PY'
import json, statistics, sys
path, row, rss_kb, extra = sys.argv[1:]
times = json.load(open(path))["results"][0]["times"]
print(f"| {row} | {min(times):.3f} s | {statistics.median(times):.3f} s | {int(rss_kb) / 1024:.0f} MB | {extra} |")
PY
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
