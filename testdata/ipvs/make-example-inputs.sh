#!/usr/bin/env bash
# Makes the inputs of testdata/ipvs/example-cluster/, the repository's own IPVS example (the other
# cases here take their state and configuration from ../shared/conformance/ipvs):
#   state.json   -> a symlink to ../../cluster/state.json, the example cluster of the README;
#   config.yaml  <- ../../cluster/config.yaml with `mode: ipvs` and an `ipvs:` section;
#   render-args.txt: node-1, IPv4.
# Then `testdata/ipvs/make-ipvs-dumps.sh testdata/ipvs example-cluster` installs what kube-proxy's
# IPVS proxier would for node-1 in a VM with IPVS and writes the real dumps and seeded drifts.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
case_dir=$here/example-cluster
mkdir -p "$case_dir"
ln -sfn ../../cluster/state.json "$case_dir/state.json"
{
  echo "# kube-proxy configuration of the example cluster (testdata/cluster/) in IPVS mode."
  echo "# Made by testdata/ipvs/make-example-inputs.sh from testdata/cluster/config.yaml."
  grep -v '^#' "$here/../cluster/config.yaml" | sed 's/^mode: iptables$/mode: ipvs/'
  cat <<'YAML'
ipvs:
  scheduler: rr
  syncPeriod: 30s
  minSyncPeriod: 1s
  strictARP: false
  tcpTimeout: 0s
  tcpFinTimeout: 0s
  udpTimeout: 0s
YAML
} > "$case_dir/config.yaml"
grep -q '^mode: ipvs$' "$case_dir/config.yaml" || { echo "make-example-inputs.sh: no mode line to switch" >&2; exit 1; }
printf '%s\n' --node node-1 --ip-family 4 > "$case_dir/render-args.txt"
echo "inputs written to $case_dir" >&2
