#!/usr/bin/env bash
# Measures `repair --local --apply` on a 10,000-service × 10-endpoint node with one drifted
# service, next to a full restore of the same rules, with the real iptables-nft in a throw-away
# network namespace. Prints the plan's restore-input size and the times (figures for
# BENCHMARKS.md).
#
#   testdata/measure-repair-scale.sh [OUTDIR]     (default target/scale; binary: $KPROXY_BIN,
#                                                  default target/release/kubectl-kproxy). Root only.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" LC_ALL=C
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$(dirname "$here")/target/scale}"
bin="${KPROXY_BIN:-$(dirname "$here")/target/release/kubectl-kproxy}"
[ "$(id -u)" -eq 0 ] || { echo "needs root" >&2; exit 2; }
mkdir -p "$out"
[ -s "$out/state.json" ] || python3 "$here/gen-scale-state.py" 10000 10 > "$out/state.json"
[ -s "$out/config.yaml" ] || cat > "$out/config.yaml" <<'CFG'
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
hostnameOverride: node-1
clusterCIDR: 10.0.0.0/8
CFG
ns="kpt-rscale-$$"
ip netns add "$ns"
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
inns() { ip netns exec "$ns" "$@"; }
args=(--state "$out/state.json" --config "$out/config.yaml" --nfacct none)
"$bin" render "${args[@]}" --with-base-jumps > "$out/repair-scale.restore"
t0=$(date +%s.%N)
inns iptables-nft-restore -w < "$out/repair-scale.restore"
t1=$(date +%s.%N)
printf 'full restore into an empty namespace: %.2f s, %s bytes\n' "$(awk "BEGIN{print $t1 - $t0}")" "$(wc -c < "$out/repair-scale.restore")"
# One drifted service: the first SVC chain loses its first endpoint rule.
inns iptables-nft-save -t nat > "$out/repair-before.save"
svc=$(grep -m1 -o '^:KUBE-SVC-[A-Z0-9]*' "$out/repair-before.save" | tr -d :)
inns iptables-nft -w -t nat -D "$svc" 2
"$bin" repair --local --netns "$ns" --backend nft "${args[@]}" --show-restore > "$out/repair-plan.txt" || true
grep -E '^(plan|restore input)' "$out/repair-plan.txt" || true
bytes=$(sed -n '/^--- iptables-restore --noflush input ---$/,/^---$/p' "$out/repair-plan.txt" | sed '1d;$d' | wc -c)
echo "repair restore input: $bytes bytes"
t2=$(date +%s.%N)
"$bin" repair --local --netns "$ns" --backend nft "${args[@]}" --apply --backup-dir "$out/backups" | tail -2
t3=$(date +%s.%N)
printf 'repair --apply end to end (read, plan, backup, apply, read back, verify): %.2f s\n' "$(awk "BEGIN{print $t3 - $t2}")"
