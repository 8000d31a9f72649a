#!/usr/bin/env bash
# Large real nftables listings for benchmarks (not checked in: tens of MB).
#
#   testdata/make-nft-scale-dump.sh [-s N_SERVICES] [-e N_ENDPOINTS] [OUTDIR]
#
# Defaults: 10000 services x 10 endpoints, OUTDIR target/scale. Steps:
#   1. testdata/gen-scale-state.py -> OUTDIR/state.json (+ OUTDIR/config.nft.yaml, mode nftables)
#   2. kubectl-kproxy render --mode nftables -> OUTDIR/scale.nft-f (the `nft -f` lines)
#      (binary: $KPROXY_BIN, default target/release/kubectl-kproxy, else target/debug/...)
#   3. in a throw-away network namespace: nft -f (minutes at this size: nft itself), then
#      nft list table ip kube-proxy -> OUTDIR/scale.nft.list and
#      nft -j list table ip kube-proxy -> OUTDIR/scale.nft.json; each step is timed into
#      OUTDIR/nft-timings.txt
# Root only. Nothing is connected to the namespace; it is deleted on exit.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" LC_ALL=C
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

services=10000 endpoints=10
while getopts "s:e:h" opt; do
  case "$opt" in
    s) services="$OPTARG" ;;
    e) endpoints="$OPTARG" ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
out="${1:-$repo/target/scale}"
[ "$(id -u)" -eq 0 ] || { echo "make-nft-scale-dump: needs root (ip netns, nft)" >&2; exit 2; }
command -v nft >/dev/null || { echo "make-nft-scale-dump: nft is not installed" >&2; exit 2; }
bin="${KPROXY_BIN:-}"
if [ -z "$bin" ]; then
  for b in "$repo/target/release/kubectl-kproxy" "$repo/target/debug/kubectl-kproxy"; do
    [ -x "$b" ] && { bin="$b"; break; }
  done
fi
[ -n "$bin" ] || { echo "make-nft-scale-dump: build kubectl-kproxy first (cargo build --release)" >&2; exit 2; }
mkdir -p "$out"
timings="$out/nft-timings.txt"
: > "$timings"

# Runs a command, appending "<seconds> <label>" to nft-timings.txt.
timed() {
  local label="$1" start end ms
  shift
  start=$(date +%s%N)
  "$@"
  end=$(date +%s%N)
  ms=$(( (end - start) / 1000000 ))
  printf '%5d.%03d s  %s\n' $((ms / 1000)) $((ms % 1000)) "$label" | tee -a "$timings"
}

# The same cluster as make-scale-dump.sh, in nftables mode.
cat > "$out/config.nft.yaml" <<'EOF'
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
hostnameOverride: node-1
clusterCIDR: 10.64.0.0/10
detectLocalMode: ClusterCIDR
nftables:
  masqueradeBit: 14
EOF

timed "generate state ($services services x $endpoints endpoints)" \
  sh -c "python3 '$here/gen-scale-state.py' $services $endpoints > '$out/state.json'"
timed "render --mode nftables ($bin)" \
  sh -c "'$bin' render --mode nftables --state '$out/state.json' --config '$out/config.nft.yaml' > '$out/scale.nft-f'"

ns="kpt-nftscale-$$"
ip netns add "$ns"
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
ip netns exec "$ns" ip link set lo up
timed "nft -f (real, empty namespace)" sh -c "ip netns exec '$ns' nft -f '$out/scale.nft-f'"
timed "nft list table ip kube-proxy" \
  sh -c "ip netns exec '$ns' nft list table ip kube-proxy > '$out/scale.nft.list'"
timed "nft -j list table ip kube-proxy" \
  sh -c "ip netns exec '$ns' nft -j list table ip kube-proxy > '$out/scale.nft.json'"

for f in scale.nft-f scale.nft.list scale.nft.json; do
  printf '%s  %s lines  %s\n' "$(du -h "$out/$f" | cut -f1)" "$(wc -l < "$out/$f")" "$out/$f" | tee -a "$timings"
done
