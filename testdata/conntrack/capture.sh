#!/usr/bin/env bash
# Captures real conntrack listings for the parser's tests: builds throw-away network namespaces
# (a client, a "node" that routes and DNATs as kube-proxy does, two endpoint namespaces), makes real
# TCP, UDP, SCTP, ICMP and IPv6 flows through the node, and saves what the node's conntrack table
# then holds, in every form the parser reads.
#
#   testdata/conntrack/capture.sh [OUTDIR]      (default: the directory of this script)
#
# Writes into OUTDIR:
#   list.txt          conntrack -L                 (then its stderr line "N flow entries have been shown.")
#   extended.txt      conntrack -L -o extended      (and the stderr line)
#   id.txt            conntrack -L -o id            (stdout only)
#   ipv6.txt          conntrack -L -f ipv6          (and the stderr line)
#   extended-ipv6.txt conntrack -L -f ipv6 -o extended,id (and the stderr line)
#   timestamp.txt     conntrack -L -o ktimestamp    (and the stderr line; net.netfilter.nf_conntrack_timestamp
#                     is turned on half-way, so some flows have a start time and some none)
#   proc.txt          cat /proc/net/nf_conntrack    (when the kernel has it)
#   topology.txt      the addresses and services behind the flows, for the tests' expectations
# (state.json beside them is not written here: it holds, by hand, the API objects of the services
# the rules stand for, which the conntrack checks compare the flows with.)
# Counters (packets= bytes=) are on: net.netfilter.nf_conntrack_acct=1 in the node namespace.
# Root only. The namespaces are connected to nothing but each other and are deleted on exit.
set -euo pipefail
export PATH="$PATH:/usr/local/sbin:/usr/sbin:/sbin" LC_ALL=C

outdir="${1:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
[ "$(id -u)" -eq 0 ] || { echo "capture: needs root (ip netns, iptables, conntrack)" >&2; exit 2; }
for tool in ip iptables-restore ip6tables-restore conntrack python3 sysctl; do
  command -v "$tool" >/dev/null || { echo "capture: $tool not found" >&2; exit 2; }
done
mkdir -p "$outdir"

tag="kpt-ct-$$"
node="$tag-node" client="$tag-client" ep1="$tag-ep1" ep2="$tag-ep2"
work="$(mktemp -d)"
pids=()
cleanup() {
  local p ns
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for ns in "$node" "$client" "$ep1" "$ep2"; do ip netns del "$ns" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

inns() { local ns="$1"; shift; ip netns exec "$ns" "$@"; }

# ---- traffic helper: servers and clients over real sockets (raw sockets for SCTP and ICMP) ----
cat > "$work/flows.py" <<'PY'
import socket, struct, sys, time, select

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def sctp_packet(sport, dport, vtag, chunk_type, body):
    chunk = struct.pack("!BBH", chunk_type, 0, 4 + len(body)) + body
    chunk += b"\0" * (-len(chunk) % 4)
    hdr = struct.pack("!HHII", sport, dport, vtag, 0)
    crc = crc32c(hdr + chunk)
    return struct.pack("!HHI", sport, dport, vtag) + struct.pack("<I", crc) + chunk

def family(addr):
    return socket.AF_INET6 if ":" in addr else socket.AF_INET

def v6only(s, addr):
    if family(addr) == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)

def udp_server(addr, port):
    s = socket.socket(family(addr), socket.SOCK_DGRAM)
    v6only(s, addr)
    s.bind((addr, int(port)))
    while True:
        data, peer = s.recvfrom(2048)
        s.sendto(b"pong " + data, peer)

def tcp_server(addr, port):
    s = socket.socket(family(addr), socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    v6only(s, addr)
    s.bind((addr, int(port)))
    s.listen(64)
    conns = []
    while True:
        r, _, _ = select.select([s] + conns, [], [])
        for c in r:
            if c is s:
                conns.append(s.accept()[0])
                continue
            data = c.recv(2048)
            if not data:
                conns.remove(c)
                c.close()
            else:
                c.sendall(b"pong " + data)

def udp_client(addr, port, count, expect_reply, src_port="0"):
    s = socket.socket(family(addr), socket.SOCK_DGRAM)
    s.bind(("::" if family(addr) == socket.AF_INET6 else "0.0.0.0", int(src_port)))
    s.settimeout(0.3)
    got = 0
    for i in range(int(count)):
        s.sendto(b"ping %d" % i, (addr, int(port)))
        try:
            s.recvfrom(2048)
            got += 1
        except socket.timeout:
            pass
        time.sleep(0.05)
    if expect_reply == "yes" and got == 0:
        sys.exit("no UDP reply from %s:%s" % (addr, port))

def tcp_exchange(addr, port, hold):
    s = socket.create_connection((addr, int(port)), timeout=2)
    s.sendall(b"ping")
    s.recv(2048)
    if hold == "hold":
        time.sleep(3600)
    s.close()

def tcp_syn(addr, port):
    s = socket.socket(family(addr), socket.SOCK_STREAM)
    s.setblocking(False)
    try:
        s.connect((addr, int(port)))
    except BlockingIOError:
        pass
    time.sleep(0.5)

def sctp_recv(s, fam, want):
    # The next SCTP packet whose first chunk has type `want` (the IPv4 raw socket hands the
    # IP header too).
    while True:
        pkt, peer = s.recvfrom(4096)
        if fam == socket.AF_INET:
            pkt = pkt[(pkt[0] & 0x0F) * 4:]
        if len(pkt) >= 16 and pkt[12] == want:
            return pkt, peer

def sctp_client(addr, dport, sport):
    # INIT, INIT ACK, COOKIE ECHO, COOKIE ACK: an association the node's conntrack sees as
    # ESTABLISHED (the client has no SCTP stack; its raw socket plays one).
    fam = family(addr)
    s = socket.socket(fam, socket.SOCK_RAW, 132)
    s.settimeout(2)
    my_tag = 0x1234ABCD
    body = struct.pack("!IIHHI", my_tag, 65535, 1, 1, 1)
    s.sendto(sctp_packet(int(sport), int(dport), 0, 1, body), (addr, 0))
    pkt, _ = sctp_recv(s, fam, 2)
    peer_tag = struct.unpack("!I", pkt[16:20])[0]
    cookie = pkt[36:36 + struct.unpack("!H", pkt[34:36])[0] - 4]
    s.sendto(sctp_packet(int(sport), int(dport), peer_tag, 10, cookie), (addr, 0))
    sctp_recv(s, fam, 11)

def sctp_responder(addr):
    # Answers INIT with INIT ACK (a state cookie parameter included) and COOKIE ECHO with
    # COOKIE ACK, as a real SCTP stack would.
    fam = family(addr)
    s = socket.socket(fam, socket.SOCK_RAW, 132)
    my_tag = 0x5678EF01
    while True:
        pkt, peer = s.recvfrom(4096)
        if fam == socket.AF_INET:
            pkt = pkt[(pkt[0] & 0x0F) * 4:]
        if len(pkt) < 16:
            continue
        sport, dport = struct.unpack("!HH", pkt[:4])
        if pkt[12] == 1:
            peer_tag = struct.unpack("!I", pkt[16:20])[0]
            cookie = struct.pack("!I", peer_tag) + b"kproxy-cookie"
            params = struct.pack("!HH", 7, 4 + len(cookie)) + cookie
            body = struct.pack("!IIHHI", my_tag, 65535, 1, 1, 1) + params
            s.sendto(sctp_packet(dport, sport, peer_tag, 2, body), (peer[0], 0))
        elif pkt[12] == 10:
            peer_tag = struct.unpack("!I", pkt[16:20])[0]
            s.sendto(sctp_packet(dport, sport, peer_tag, 11, b""), (peer[0], 0))

def icmp_echo(addr, count):
    v6 = family(addr) == socket.AF_INET6
    proto = socket.IPPROTO_ICMPV6 if v6 else socket.IPPROTO_ICMP
    s = socket.socket(family(addr), socket.SOCK_RAW, proto)
    s.settimeout(0.5)
    ident = 0x4B50
    for seq in range(1, int(count) + 1):
        typ = 128 if v6 else 8
        hdr = struct.pack("!BBHHH", typ, 0, 0, ident, seq) + b"kproxy"
        if not v6:
            csum = 0
            data = hdr + (b"\0" if len(hdr) % 2 else b"")
            for i in range(0, len(data), 2):
                csum += (data[i] << 8) + data[i + 1]
            csum = (csum >> 16) + (csum & 0xFFFF)
            csum = ~(csum + (csum >> 16)) & 0xFFFF
            hdr = hdr[:2] + struct.pack("!H", csum) + hdr[4:]
        s.sendto(hdr, (addr, 0))
        try:
            s.recvfrom(2048)
        except socket.timeout:
            pass
        time.sleep(0.1)

if __name__ == "__main__":
    globals()[sys.argv[1].replace("-", "_")](*sys.argv[2:])
PY
flows() { local ns="$1"; shift; inns "$ns" python3 "$work/flows.py" "$@"; }
serve() { local ns="$1"; shift; flows "$ns" "$@" & pids+=("$!"); }

# ---- topology ----
for ns in "$node" "$client" "$ep1" "$ep2"; do
  ip netns add "$ns"
  inns "$ns" ip link set lo up
done
link() { # link NS_A IF_A NS_B IF_B
  ip link add "$2" netns "$1" type veth peer name "$4" netns "$3"
  inns "$1" ip link set "$2" up
  inns "$3" ip link set "$4" up
}
link "$client" eth0 "$node" cli0
link "$ep1" eth0 "$node" ep1
link "$ep2" eth0 "$node" ep2
inns "$node" sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 \
  net.netfilter.nf_conntrack_acct=1
for ns in "$node" "$client" "$ep1" "$ep2"; do
  inns "$ns" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
done
inns "$node" ip addr add 192.168.50.1/24 dev cli0
inns "$node" ip addr add fd00:50::1/64 dev cli0 nodad
inns "$node" ip addr add 10.244.1.1/24 dev ep1
inns "$node" ip addr add fd00:244:1::1/64 dev ep1 nodad
inns "$node" ip addr add 10.244.2.1/24 dev ep2
inns "$node" ip addr add fd00:244:2::1/64 dev ep2 nodad
inns "$client" ip addr add 192.168.50.2/24 dev eth0
inns "$client" ip addr add fd00:50::2/64 dev eth0 nodad
inns "$client" ip route add default via 192.168.50.1
inns "$client" ip -6 route add default via fd00:50::1
inns "$ep1" ip addr add 10.244.1.5/24 dev eth0
inns "$ep1" ip addr add fd00:244:1::5/64 dev eth0 nodad
inns "$ep1" ip route add default via 10.244.1.1
inns "$ep1" ip -6 route add default via fd00:244:1::1
inns "$ep2" ip addr add 10.244.2.6/24 dev eth0
inns "$ep2" ip addr add fd00:244:2::6/64 dev eth0 nodad
inns "$ep2" ip route add default via 10.244.2.1
inns "$ep2" ip -6 route add default via fd00:244:2::1
# Service addresses route into a veth whose peer stays down (it transmits nothing): a flow no
# rule DNATs is still confirmed (and stays UNREPLIED), as on a node whose REJECT rule was missing
# when the flow began.
inns "$node" ip link add svc0 type veth peer name svc0-peer
inns "$node" ip link set svc0 up
inns "$node" ip route add 10.96.0.0/16 dev svc0
inns "$node" ip -6 route add fd00:96::/112 dev svc0

# ---- kube-proxy-style DNAT (KUBE-SERVICES -> KUBE-SVC -> KUBE-SEP), masquerade for NodePorts ----
inns "$node" iptables-restore <<'RULES'
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-NODEPORTS - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-DNS - [0:0]
:KUBE-SVC-WEB - [0:0]
:KUBE-SVC-SCTP - [0:0]
:KUBE-SEP-DNS1 - [0:0]
:KUBE-SEP-DNS2 - [0:0]
:KUBE-SEP-WEB - [0:0]
:KUBE-SEP-SCTP - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
-A KUBE-POSTROUTING -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-DNS
-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEB
-A KUBE-SERVICES -d 10.96.0.30/32 -p sctp -m comment --comment "default/assoc:sctp cluster IP" -m sctp --dport 9000 -j KUBE-SVC-SCTP
-A KUBE-SERVICES -m comment --comment "kubernetes service nodeports" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS
-A KUBE-NODEPORTS -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp --dport 30053 -j KUBE-MARK-MASQ
-A KUBE-NODEPORTS -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp --dport 30053 -j KUBE-SEP-DNS2
-A KUBE-SVC-DNS -m comment --comment "kube-system/kube-dns:dns -> 10.244.1.5:53" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-DNS1
-A KUBE-SVC-DNS -m comment --comment "kube-system/kube-dns:dns -> 10.244.2.6:53" -j KUBE-SEP-DNS2
-A KUBE-SVC-WEB -m comment --comment "default/web:http -> 10.244.2.6:8080" -j KUBE-SEP-WEB
-A KUBE-SVC-SCTP -m comment --comment "default/assoc:sctp -> 10.244.1.5:9000" -j KUBE-SEP-SCTP
-A KUBE-SEP-DNS1 -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.1.5:53
-A KUBE-SEP-DNS2 -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination 10.244.2.6:53
-A KUBE-SEP-WEB -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination 10.244.2.6:8080
-A KUBE-SEP-SCTP -p sctp -m comment --comment "default/assoc:sctp" -m sctp -j DNAT --to-destination 10.244.1.5:9000
COMMIT
RULES
inns "$node" ip6tables-restore <<'RULES'
*nat
:PREROUTING ACCEPT [0:0]
:INPUT ACCEPT [0:0]
:OUTPUT ACCEPT [0:0]
:POSTROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-DNS6 - [0:0]
:KUBE-SVC-WEB6 - [0:0]
:KUBE-SEP-DNS6 - [0:0]
:KUBE-SEP-WEB6 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d fd00:96::10/128 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-DNS6
-A KUBE-SERVICES -d fd00:96::20/128 -p tcp -m comment --comment "default/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEB6
-A KUBE-SVC-DNS6 -m comment --comment "kube-system/kube-dns:dns -> [fd00:244:1::5]:53" -j KUBE-SEP-DNS6
-A KUBE-SVC-WEB6 -m comment --comment "default/web:http -> [fd00:244:2::6]:8080" -j KUBE-SEP-WEB6
-A KUBE-SEP-DNS6 -p udp -m comment --comment "kube-system/kube-dns:dns" -m udp -j DNAT --to-destination [fd00:244:1::5]:53
-A KUBE-SEP-WEB6 -p tcp -m comment --comment "default/web:http" -m tcp -j DNAT --to-destination [fd00:244:2::6]:8080
COMMIT
RULES

# ---- servers ----
serve "$ep1" udp-server 0.0.0.0 53
serve "$ep2" udp-server 0.0.0.0 53
serve "$ep1" udp-server :: 53
serve "$ep2" tcp-server 0.0.0.0 8080
serve "$ep2" tcp-server :: 8080
serve "$ep1" sctp-responder 0.0.0.0
sleep 0.5

# ---- flows ----
# UDP to the cluster IP from several source ports (both endpoints get some), and to the NodePort.
for sport in 40001 40002 40003 40004 40005 40006; do
  flows "$client" udp-client 10.96.0.10 53 4 yes "$sport"
done
flows "$client" udp-client 192.168.50.1 30053 4 yes 40100
# UDP to a service address no rule DNATs: stays UNREPLIED, reply source = the service IP.
flows "$client" udp-client 10.96.0.99 53 3 no 40200
# UDP straight to a pod (no NAT).
flows "$client" udp-client 10.244.1.5 53 2 yes 40300
# TCP: one connection held open (ESTABLISHED), one closed (TIME_WAIT), one SYN to nowhere (SYN_SENT).
flows "$client" tcp-exchange 10.96.0.20 80 hold & pids+=("$!")
flows "$client" tcp-exchange 10.96.0.20 80 close
flows "$client" tcp-syn 10.96.0.21 80
# ICMP echo to a pod and to the node.
flows "$client" icmp-echo 10.244.2.6 2
flows "$client" icmp-echo 192.168.50.1 1
# From here on flows carry a start time (delta-time=, [start=…] with -o ktimestamp): the listings
# then hold lines with and without it, as on a node where the sysctl was turned on at some point.
inns "$node" sysctl -qw net.netfilter.nf_conntrack_timestamp=1
# IPv6: UDP and TCP through the cluster IPs, ICMPv6 echo.
flows "$client" udp-client fd00:96::10 53 3 yes 41001
flows "$client" tcp-exchange fd00:96::20 80 hold & pids+=("$!")
flows "$client" udp-client fd00:96::99 53 2 no 41002
flows "$client" icmp-echo fd00:244:2::6 2
# SCTP last: an association through the cluster IP (INIT .. COOKIE ACK).
flows "$client" sctp-client 10.96.0.30 9000 45000
sleep 0.5

# ---- capture ----
ct() { inns "$node" conntrack "$@"; }
# As a terminal shows it: the listing, then conntrack's stderr line "N flow entries have been
# shown." (a pipe can interleave the two anywhere; terminals and pastes have the line last).
ct_paste() { ct "$@" 2> "$work/stderr"; cat "$work/stderr"; }
ct_paste -L > "$outdir/list.txt"
ct_paste -L -o extended > "$outdir/extended.txt"
ct -L -o id > "$outdir/id.txt" 2>/dev/null
ct_paste -L -f ipv6 > "$outdir/ipv6.txt"
ct_paste -L -f ipv6 -o extended,id > "$outdir/extended-ipv6.txt"
ct_paste -L -o ktimestamp > "$outdir/timestamp.txt"
if inns "$node" test -r /proc/net/nf_conntrack; then
  inns "$node" cat /proc/net/nf_conntrack > "$outdir/proc.txt"
fi
{
  echo "# Captured by testdata/conntrack/capture.sh with $(conntrack --version 2>&1) on Linux $(uname -r)"
  echo "node      192.168.50.1 fd00:50::1"
  echo "client    192.168.50.2 fd00:50::2"
  echo "endpoint  10.244.1.5 fd00:244:1::5 (ep1: udp 53, sctp 9000)"
  echo "endpoint  10.244.2.6 fd00:244:2::6 (ep2: udp 53, tcp 8080)"
  echo "service   kube-system/kube-dns:dns udp 10.96.0.10:53 fd00:96::10:53 nodePort 30053 -> ep1, ep2 (NodePort -> ep2)"
  echo "service   default/web:http tcp 10.96.0.20:80 fd00:96::20:80 -> ep2:8080"
  echo "service   default/assoc:sctp sctp 10.96.0.30:9000 -> ep1:9000"
  echo "no rule   10.96.0.99:53 udp, fd00:96::99:53 udp, 10.96.0.21:80 tcp (routed into a veth whose peer is down)"
} > "$outdir/topology.txt"
for f in list extended id ipv6 extended-ipv6 timestamp proc; do
  [ -f "$outdir/$f.txt" ] && printf '%-18s %s lines\n' "$f.txt" "$(wc -l < "$outdir/$f.txt")"
done
