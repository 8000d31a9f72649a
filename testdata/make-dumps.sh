#!/usr/bin/env bash
# Turns an iptables-restore input into real dumps: restores it into a throw-away network
# namespace with the real iptables-restore of each backend (nf_tables and legacy, one namespace
# each) and saves what the kernel then holds.
#
#   testdata/make-dumps.sh [-6] [-t] [-o OUTDIR] [-n NAME] INPUT
#
#   -6         the input is for ip6tables (ip6tables-restore / ip6tables-save / ip6tables -S)
#   -t         traffic: before saving, open one TCP connection attempt from inside the namespace
#              to every `-d ADDR ... --dport PORT` of KUBE-SERVICES, so that counters are not all
#              zero (the namespace's default route leads into a veth whose peer is down: nothing
#              leaves it, whatever the rules do)
#   -o OUTDIR  output folder (default: testdata/dumps)
#   -n NAME    output base name (default: INPUT's file name without its extension)
#
# Writes, for BACKEND in nft and legacy:
#   NAME.BACKEND.save      iptables-save
#   NAME.BACKEND-c.save    iptables-save -c
#   NAME.BACKEND.S         iptables -S              (filter table)
#   NAME.BACKEND.nat-v.S   iptables -t nat -S -v    (rules with counters)
# nfacct counters named by the input (--nfacct-name) are created first, as kube-proxy does.
# Root only. Nothing is connected to the namespaces; they are deleted on exit.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" LC_ALL=C

family=4 outdir="" name="" traffic=0
while getopts "6to:n:h" opt; do
  case "$opt" in
    6) family=6 ;;
    t) traffic=1 ;;
    o) outdir="$OPTARG" ;;
    n) name="$OPTARG" ;;
    *) sed -n '2,22p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[ $# -eq 1 ] || { sed -n '2,22p' "$0"; exit 2; }
input="$1"
[ -r "$input" ] || { echo "make-dumps: cannot read $input" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "make-dumps: needs root (ip netns, iptables)" >&2; exit 2; }
outdir="${outdir:-$(dirname "${BASH_SOURCE[0]}")/dumps}"
if [ -z "$name" ]; then
  name="$(basename "$input")"
  name="${name%.*}"
fi
mkdir -p "$outdir"
ipt=iptables
[ "$family" = 6 ] && ipt=ip6tables

namespaces=()
cleanup() {
  local ns
  for ns in "${namespaces[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap cleanup EXIT

for backend in nft legacy; do
  ns="kpt-dumps-$$-$backend"
  ip netns add "$ns"
  namespaces+=("$ns")
  inns() { ip netns exec "$ns" "$@"; }
  inns ip link set lo up
  # kube-proxy creates its nfacct counters before restoring rules that use them.
  for counter in $(grep -o -- '--nfacct-name [^ ]*' "$input" | cut -d' ' -f2 | sort -u); do
    inns nfacct add "$counter"
  done
  if ! inns "$ipt-$backend-restore" -w < "$input"; then
    echo "make-dumps: $ipt-$backend-restore rejected $input" >&2
    exit 1
  fi
  if [ "$traffic" = 1 ]; then
    inns ip link add uplink type veth peer name uplink-peer
    inns ip link set uplink up
    inns ip route add default dev uplink
    inns ip -6 route add default dev uplink
    for dst in $(sed -n 's/^-A KUBE-SERVICES .*-d \([0-9a-f.:]*\)\(\/[0-9]*\)\{0,1\} .*--dport \([0-9]*\) .*/\1,\3/p' "$input" | sort -u); do
      inns timeout 0.5 bash -c "exec 3<>/dev/tcp/${dst%,*}/${dst#*,}" 2>/dev/null &
    done
    wait
  fi
  base="$outdir/$name.$backend"
  inns "$ipt-$backend-save" > "$base.save"
  inns "$ipt-$backend-save" -c > "$base-c.save"
  inns "$ipt-$backend" -w -S > "$base.S"
  inns "$ipt-$backend" -w -t nat -S -v > "$base.nat-v.S"
  echo "$base.save, $base-c.save, $base.S, $base.nat-v.S: $(grep -c "^-A" "$base.save") rules"
done
