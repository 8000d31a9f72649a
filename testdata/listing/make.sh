#!/usr/bin/env bash
# Real `iptables -L` listings for the listing reader's tests (tests/listing.rs): restores a ruleset
# into a throw-away network namespace with the real iptables-restore, gives every rule and
# built-in chain large counters (so `-v` shows K/M/G suffixes and `-x` long numbers), then saves
# what the kernel holds (the reference the tests compare with) and lists it in the forms people
# paste.
#
#   testdata/listing/make.sh
#
# Inputs: testdata/dumps/cluster.restore and cluster-v6.restore (kube-proxy's rules for
# testdata/cluster/state.json, see testdata/make-cluster-dumps.sh) and extras.restore here (other
# matches and targets a listing prints). Writes here, for NAME in cluster, cluster-v6, extras:
#   NAME.BACKEND.save                  iptables-save -c (the reference)
#   NAME.BACKEND.TABLE.L               iptables -t TABLE -L
#   NAME.BACKEND.TABLE.L-n             iptables -t TABLE -L -n
#   NAME.BACKEND.TABLE.L-n-v           iptables -t TABLE -L -n -v
#   NAME.BACKEND.TABLE.L-n-v-x         iptables -t TABLE -L -n -v -x
#   NAME.BACKEND.TABLE.L-n-line        iptables -t TABLE -L -n --line-numbers
# BACKEND nft: every form of nat and filter; BACKEND legacy: nat `-L -n` and `-L -n -v -x`.
# (ip6tables for cluster-v6.) Root only. Nothing is connected to the namespaces; they are
# deleted on exit.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" LC_ALL=C

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dumps="$(dirname "$here")/dumps"
[ "$(id -u)" -eq 0 ] || { echo "listing/make.sh: needs root (ip netns, iptables)" >&2; exit 2; }

namespaces=()
cleanup() {
  local ns
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT

# Rewrites the counters of `iptables-save -c` output: the Nth counted line gets packets
# (N*7919 mod 9973 + 1) * 10^(N mod 8) and bytes = packets * (60 + N*37 mod 1400), so that
# listings show every magnitude from units to gigabytes.
big_counters() {
  awk '
    /^(:[^ ]+ [^ ]+ )?\[[0-9]+:[0-9]+\]/ || /^:/ {
      n++
      p = (n * 7919 % 9973 + 1) * 10 ^ (n % 8)
      b = p * (60 + n * 37 % 1400)
      sub(/\[[0-9]+:[0-9]+\]/, sprintf("[%.0f:%.0f]", p, b))
    }
    { print }'
}

# list NAME FAMILY BACKEND INPUT TABLES FORMS
list() {
  local name="$1" family="$2" backend="$3" input="$4" tables="$5" forms="$6"
  local ipt=iptables ns="kpt-listing-$$-$name-$backend"
  [ "$family" = 6 ] && ipt=ip6tables
  ip netns add "$ns"
  namespaces+=("$ns")
  inns() { ip netns exec "$ns" "$@"; }
  inns ip link set lo up
  # kube-proxy creates its nfacct counters before restoring rules that use them.
  for counter in $(grep -o -- '--nfacct-name [^ ]*' "$input" | cut -d' ' -f2 | sort -u); do
    inns nfacct add "$counter"
  done
  for set in $(grep -o -- '--match-set [^ ]*' "$input" | cut -d' ' -f2 | sort -u); do
    inns ipset create "$set" hash:ip,port
  done
  inns "$ipt-$backend-restore" -w < "$input"
  inns "$ipt-$backend-save" -c | big_counters | inns "$ipt-$backend-restore" -w -c
  local base="$here/$name.$backend"
  inns "$ipt-$backend-save" -c | grep -v '^# \(Generated\|Completed\)' > "$base.save"
  local table form
  for table in $tables; do
    for form in $forms; do
      case "$form" in
        L) inns "$ipt-$backend" -w -t "$table" -L ;;
        L-n) inns "$ipt-$backend" -w -t "$table" -L -n ;;
        L-n-v) inns "$ipt-$backend" -w -t "$table" -L -n -v ;;
        L-n-v-x) inns "$ipt-$backend" -w -t "$table" -L -n -v -x ;;
        L-n-line) inns "$ipt-$backend" -w -t "$table" -L -n --line-numbers ;;
      esac > "$base.$table.$form"
    done
  done
  echo "$base: $(grep -c '^\[' "$base.save") rules, tables $tables, forms $forms"
}

all="L L-n L-n-v L-n-v-x L-n-line"
list cluster 4 nft "$dumps/cluster.restore" "nat filter" "$all"
list cluster 4 legacy "$dumps/cluster.restore" nat "L-n L-n-v-x"
list cluster-v6 6 nft "$dumps/cluster-v6.restore" "nat filter" "$all"
list cluster-v6 6 legacy "$dumps/cluster-v6.restore" nat "L-n L-n-v-x"
list extras 4 nft "$here/extras.restore" "nat filter" "$all"
