#!/usr/bin/env bash
# Large real dump for benchmarks (not checked in: tens of MB).
#
#   testdata/make-scale-dump.sh [-s N_SERVICES] [-e N_ENDPOINTS] [-b nft|legacy] [OUTDIR]
#
# Defaults: 10000 services x 10 endpoints, nft backend, OUTDIR target/scale. Steps:
#   1. testdata/gen-scale-state.py -> OUTDIR/state.json (+ OUTDIR/config.yaml)
#   2. kubectl-kproxy render --with-base-jumps -> OUTDIR/scale.restore
#      (binary: $KPROXY_BIN, default target/release/kubectl-kproxy, else target/debug/...)
#   3. in a throw-away network namespace: iptables-restore --test, a real restore, iptables-save
#      -> OUTDIR/scale.<backend>.save; each step is timed into OUTDIR/timings.txt
# Root only. Nothing is connected to the namespace; it is deleted on exit.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" LC_ALL=C
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"

services=10000 endpoints=10 backend=nft
while getopts "s:e:b:h" opt; do
  case "$opt" in
    s) services="$OPTARG" ;;
    e) endpoints="$OPTARG" ;;
    b) backend="$OPTARG" ;;
    *) sed -n '2,12p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
out="${1:-$repo/target/scale}"
case "$backend" in nft|legacy) ;; *) echo "make-scale-dump: backend nft or legacy" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "make-scale-dump: needs root (ip netns, iptables)" >&2; exit 2; }
bin="${KPROXY_BIN:-}"
if [ -z "$bin" ]; then
  for b in "$repo/target/release/kubectl-kproxy" "$repo/target/debug/kubectl-kproxy"; do
    [ -x "$b" ] && { bin="$b"; break; }
  done
fi
[ -n "$bin" ] || { echo "make-scale-dump: build kubectl-kproxy first (cargo build --release)" >&2; exit 2; }
mkdir -p "$out"
timings="$out/timings.txt"
: > "$timings"

# Runs a command, appending "<seconds> <label>" to timings.txt.
timed() {
  local label="$1" start end ms
  shift
  start=$(date +%s%N)
  "$@"
  end=$(date +%s%N)
  ms=$(( (end - start) / 1000000 ))
  printf '%5d.%03d s  %s\n' $((ms / 1000)) $((ms % 1000)) "$label" | tee -a "$timings"
}

cat > "$out/config.yaml" <<'EOF'
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: node-1
clusterCIDR: 10.64.0.0/10
detectLocalMode: ClusterCIDR
iptables:
  masqueradeBit: 14
  localhostNodePorts: true
EOF

timed "generate state ($services services x $endpoints endpoints)" \
  sh -c "python3 '$here/gen-scale-state.py' $services $endpoints > '$out/state.json'"
timed "render ($bin)" \
  sh -c "'$bin' render --state '$out/state.json' --config '$out/config.yaml' --with-base-jumps --nfacct none > '$out/scale.restore'"

ns="kpt-scale-$$"
ip netns add "$ns"
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
ip netns exec "$ns" ip link set lo up
restore="iptables-$backend-restore"
save="iptables-$backend-save"
timed "$restore --test" sh -c "ip netns exec '$ns' $restore -w --test < '$out/scale.restore'"
timed "$restore (real, empty namespace)" sh -c "ip netns exec '$ns' $restore -w < '$out/scale.restore'"
timed "$save" sh -c "ip netns exec '$ns' $save > '$out/scale.$backend.save'"
timed "$restore (real, replacing the same rules)" sh -c "ip netns exec '$ns' $restore -w < '$out/scale.restore'"

printf '%s  %s lines  %s\n' "$(du -h "$out/scale.restore" | cut -f1)" "$(wc -l < "$out/scale.restore")" "$out/scale.restore" | tee -a "$timings"
printf '%s  %s lines  %s\n' "$(du -h "$out/scale.$backend.save" | cut -f1)" "$(wc -l < "$out/scale.$backend.save")" "$out/scale.$backend.save" | tee -a "$timings"
