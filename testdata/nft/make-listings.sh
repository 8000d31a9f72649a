#!/bin/sh
# Produces the checked-in nft listings of this directory (run as root; needs nft, iptables-nft,
# ip, stdbuf). Everything happens in a scratch network namespace that is deleted afterwards.
#   syntax-tour.list.txt    nft list ruleset        of syntax-tour.nft
#   syntax-tour.list-a.txt  nft -a list ruleset     (with handles)
#   syntax-tour.json        nft -j list ruleset
#   iptables-nft.list.txt   nft list ruleset of rules made with iptables-nft (stdout and stderr
#                           interleaved, as a terminal shows them: the "managed by iptables-nft"
#                           warnings are on stderr)
#   iptables-nft.json       nft -j list ruleset of the same
set -eu
here=$(cd "$(dirname "$0")" && pwd)
ns=kproxy-nft-listings-$$
ip netns add "$ns"
trap 'ip netns del "$ns"' EXIT
in_ns() { ip netns exec "$ns" "$@"; }
in_ns ip link set lo up

in_ns nft -f "$here/syntax-tour.nft"
in_ns nft list ruleset >"$here/syntax-tour.list.txt"
in_ns nft -a list ruleset >"$here/syntax-tour.list-a.txt"
in_ns nft -j list ruleset >"$here/syntax-tour.json"
in_ns nft flush ruleset

in_ns iptables-nft -t nat -N KUBE-SEP-X
in_ns iptables-nft -t nat -A KUBE-SEP-X -s 10.0.0.1/32 -m comment --comment "ns/svc:p" -j MARK --set-xmark 0x4000/0x4000
in_ns iptables-nft -t nat -A KUBE-SEP-X -p tcp -m comment --comment "ns/svc:p" -m tcp -j DNAT --to-destination 10.0.0.1:80
in_ns iptables-nft -t nat -A KUBE-SEP-X -m statistic --mode random --probability 0.5 -j RETURN
in_ns iptables-nft -t nat -A KUBE-SEP-X -m recent --name foo --set --rsource
in_ns iptables-nft -t nat -A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE --random-fully
in_ns iptables-nft -t filter -A INPUT -m conntrack --ctstate INVALID -j DROP
in_ns iptables-nft -t filter -A INPUT -p tcp -j REJECT --reject-with icmp-port-unreachable
in_ns stdbuf -oL -eL nft list ruleset >"$here/iptables-nft.list.txt" 2>&1
in_ns nft -j list ruleset >"$here/iptables-nft.json" 2>/dev/null
nft --version >&2
