#!/usr/bin/env bash
# Makes testdata/dumps/drifted.nft-c.save: the example cluster's real rules (testdata/dumps/
# cluster.restore, restored with the real iptables-nft-restore into a throw-away network
# namespace) with real incidents applied by real iptables commands, then saved with
# `iptables-nft-save -c`. The README's quick start verifies this dump.
#
# Incidents (classes of docs/incidents.md):
#   F06 partial sync missed an EndpointSlice change: shop/web:http lost its third endpoint
#       (10.244.2.10) — the rule is deleted and the remaining shares are wrong (1/3, then 1/1);
#   stale endpoint: shop/cart:http still sends traffic to a deleted pod 10.244.1.99:8080;
#   F08 "has no endpoints" REJECT in filter KUBE-SERVICES for shop/checkout:http, which has one;
#   the nat OUTPUT jump to KUBE-SERVICES is gone (host-originated service traffic bypasses rules).
#
#   testdata/make-drift-demo.sh         Root only; nothing is connected to the namespace.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" LC_ALL=C
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[ "$(id -u)" -eq 0 ] || { echo "make-drift-demo: needs root" >&2; exit 2; }
ns="kpt-drift-$$"
ip netns add "$ns"
trap 'ip netns del "$ns" 2>/dev/null || true' EXIT
inns() { ip netns exec "$ns" "$@"; }
inns ip link set lo up
for counter in $(grep -o -- '--nfacct-name [^ ]*' "$here/dumps/cluster.restore" | cut -d' ' -f2 | sort -u); do
  inns nfacct add "$counter" >/dev/null
done
inns iptables-nft-restore -w < "$here/dumps/cluster.restore"
ipt() { inns iptables-nft -w "$@"; }

# kube-proxy's SEP chain name for an endpoint: base32(sha256(spn + proto + endpoint))[:16].
sep() { printf 'KUBE-SEP-%s' "$(printf '%s' "$1" | sha256sum | cut -d' ' -f1 | xxd -r -p | base32 | cut -c1-16)"; }

# F06: web:http's rule for 10.244.2.10 vanished; the middle rule now ends the chain.
web_c=$(sep "shop/web:httptcp10.244.2.10:8080")
ipt -t nat -D KUBE-SVC-67NZLRHBNDSAWJRO -m comment --comment "shop/web:http -> 10.244.2.10:8080" -j "$web_c"
ipt -t nat -X "$web_c" 2>/dev/null || ipt -t nat -F "$web_c"

# Stale endpoint for cart:http (a pod deleted long ago).
stale=$(sep "shop/cart:httptcp10.244.1.99:8080")
ipt -t nat -N "$stale"
ipt -t nat -A "$stale" -s 10.244.1.99/32 -m comment --comment "shop/cart:http" -j KUBE-MARK-MASQ
ipt -t nat -A "$stale" -p tcp -m comment --comment "shop/cart:http" -m tcp -j DNAT --to-destination 10.244.1.99:8080
ipt -t nat -I KUBE-SVC-I5LIAMPLWKMBJ54B 4 -m comment --comment "shop/cart:http -> 10.244.1.99:8080" \
  -m statistic --mode random --probability 0.33333333349 -j "$stale"

# F08: contradictory REJECT for a service that has endpoints.
ipt -t filter -I KUBE-SERVICES 1 -d 10.96.100.21/32 -p tcp -m comment --comment "shop/checkout:http has no endpoints" \
  -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable

# The nat OUTPUT jump is gone.
ipt -t nat -D OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES

inns iptables-nft-save -c > "$here/dumps/drifted.nft-c.save"
echo "wrote $here/dumps/drifted.nft-c.save"
