#!/usr/bin/env bash
# Regenerates testdata/dumps/cluster{,-v6}.* from testdata/cluster/{state.json,config.yaml}:
# renders the restore input with kubectl-kproxy (IPv4 and IPv6) and turns each into real
# iptables-save / iptables -S dumps of both backends with testdata/make-dumps.sh (with -t: a
# connection attempt to every service address first, so counters are not all zero).
#
#   testdata/make-cluster-dumps.sh        (binary: $KPROXY_BIN, default target/debug/kubectl-kproxy)
# Root only.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${KPROXY_BIN:-$(dirname "$here")/target/debug/kubectl-kproxy}"
dumps="$here/dumps"
mkdir -p "$dumps"
render() {
  "$bin" render --state "$here/cluster/state.json" --config "$here/cluster/config.yaml" --with-base-jumps "$@"
}
render --ip-family 4 > "$dumps/cluster.restore"
render --ip-family 6 > "$dumps/cluster-v6.restore"
"$here/make-dumps.sh" -t "$dumps/cluster.restore"
"$here/make-dumps.sh" -6 -t "$dumps/cluster-v6.restore"
