#!/usr/bin/env bash
# Makes real IPVS/ipset/iptables dumps for the IPVS verify tests (testdata/ipvs/<case>/).
#
# For each case of ../shared/conformance/ipvs, and this directory's own example-cluster (inputs
# made by make-example-inputs.sh): `kubectl-kproxy render --mode ipvs -o json` computes
# kube-proxy's expected state; this script turns it into real commands (ip link/addr, ipset, ipvsadm,
# iptables-restore), runs them inside a throw-away VM whose kernel has IPVS (../shared/tools/ipvs-vm.sh),
# reads everything back (ipvsadm -Ln, -Ln --stats, -Sn, -Lnc, -L --timeout, ipset save, iptables-save,
# ip -o addr), then seeds drifts with real commands (one at a time, reverting each) and dumps again.
#
#   make-ipvs-dumps.sh [OUT_DIR [CASE...]]     default OUT_DIR: this directory; default cases below
# Needs: python3, qemu-system-x86_64, busybox, ipvsadm, ipset, iptables (see ipvs-vm.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out=${1:-$here}; shift || true
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(constructed-kind-worker-example only-local-nodeports nodeport-ipv4-sctp-etp-local load-balancer-source-ranges nodeport-ipv6-sctp-multiple-node-ips example-cluster)
shared=${KPROXY_SHARED:-$repo/../shared}
bin=${KPROXY_BIN:-$repo/target/debug/kubectl-kproxy}
[ -x "$bin" ] || (cd "$repo" && cargo build --quiet)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

# JSON (render output) -> shell commands that install it, and the drift commands.
gen() { # CASE_DIR NAME FAMILY
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
d, name, fam = sys.argv[1:4]
r = json.load(open(f"{d}/render.json"))
v6 = fam == "6"
ipt = "ip6tables" if v6 else "iptables"
plen = "128" if v6 else "32"
def sock(a, p): return f"[{a}]:{p}" if ":" in a else f"{a}:{p}"
opt = {"TCP": "-t", "UDP": "-u", "SCTP": "--sctp-service"}
L = []
L.append("ip link add kube-ipvs0 type dummy")
L.append("ip link add eth0 type dummy; ip link set eth0 up")
for a in r["node_port_ips"]:
    L.append(f"ip addr add {a}/{'64' if v6 else '24'} dev eth0" if v6 else f"ip addr add {a}/24 dev eth0")
for a in r["kube_ipvs0_addresses"]:
    L.append(f"ip addr add {a}/{plen} dev kube-ipvs0")
types = {}
for line in open(f"{d}/sets.save"):
    if line.startswith("create "):
        L.append("ipset " + line.strip())
    elif line.startswith("add "):
        L.append("ipset " + line.strip())
for vs in r["virtual_servers"]:
    s = f"{opt[vs['protocol']]} {sock(vs['address'], vs['port'])}"
    c = f"ipvsadm -A {s} -s {vs['scheduler']}"
    if vs["persistent_timeout_s"] is not None: c += f" -p {vs['persistent_timeout_s']}"
    if vs["flags"]: c += " -b " + ",".join(vs["flags"])
    L.append(c)
    for rs in vs["real_servers"]:
        L.append(f"ipvsadm -a {s} -r {sock(rs['address'], rs['port'])} -m -w {rs['weight']}")
L.append(f"{ipt}-restore --noflush /data/{name}.iptables")
jumps = [("nat","OUTPUT","KUBE-SERVICES","kubernetes service portals"),("nat","PREROUTING","KUBE-SERVICES","kubernetes service portals"),
         ("nat","POSTROUTING","KUBE-POSTROUTING","kubernetes postrouting rules"),("filter","FORWARD","KUBE-FORWARD","kubernetes forwarding rules"),
         ("filter","INPUT","KUBE-NODE-PORT","kubernetes health check rules"),("filter","INPUT","KUBE-PROXY-FIREWALL","kube-proxy firewall rules"),
         ("filter","FORWARD","KUBE-PROXY-FIREWALL","kube-proxy firewall rules"),("filter","INPUT","KUBE-IPVS-FILTER","kubernetes ipvs access filter"),
         ("filter","OUTPUT","KUBE-IPVS-OUT-FILTER","kubernetes ipvs access filter")]
for t, f, to, cm in jumps:
    L.append(f'{ipt} -t {t} -I {f} -m comment --comment "{cm}" -j {to}')
open(f"{d}/install.sh", "w").write("\n".join(L) + "\n")
# Drifts: (name, do, undo); each is applied alone and reverted.
vs = next((v for v in r["virtual_servers"] if v["real_servers"]), r["virtual_servers"][0])
s = f"{opt[vs['protocol']]} {sock(vs['address'], vs['port'])}"
keep = (f" -p {vs['persistent_timeout_s']}" if vs["persistent_timeout_s"] is not None else "") + (" -b " + ",".join(vs["flags"]) if vs["flags"] else "")
ghost = "[fd00:dead::1]:8080" if v6 else "10.255.255.254:8080"
D = []
if vs["real_servers"]:
    rs = vs["real_servers"][0]
    D.append(("rs-removed", f"ipvsadm -d {s} -r {sock(rs['address'], rs['port'])}", f"ipvsadm -a {s} -r {sock(rs['address'], rs['port'])} -m -w 1"))
    D.append(("rs-weight0", f"ipvsadm -e {s} -r {sock(rs['address'], rs['port'])} -m -w 0", f"ipvsadm -e {s} -r {sock(rs['address'], rs['port'])} -m -w 1"))
D.append(("ghost-weight0", f"ipvsadm -a {s} -r {ghost} -m -w 0", f"ipvsadm -d {s} -r {ghost}"))
D.append(("scheduler", f"ipvsadm -E {s} -s wrr{keep}", f"ipvsadm -E {s} -s {vs['scheduler']}{keep}"))
adds = [l.split(None, 2) for l in open(f"{d}/sets.save") if l.startswith("add ")]
if adds:
    _, sname, entry = adds[0]
    D.append(("ipset-entry", f"ipset del {sname} {entry.strip()}", f"ipset add {sname} {entry.strip()}"))
a0 = r["kube_ipvs0_addresses"][0]
D.append(("kube-ipvs0-addr", f"ip addr del {a0}/{plen} dev kube-ipvs0", f"ip addr add {a0}/{plen} dev kube-ipvs0"))
D.append(("iptables-rule", f"{ipt} -t nat -D KUBE-MARK-MASQ 1", f"{ipt}-restore --noflush /data/{name}.iptables"))
D.append(("stale-vs", f"ipvsadm -A {opt[vs['protocol']]} {sock('fd00:beef::9' if v6 else '10.99.99.99', 80)} -s rr", f"ipvsadm -D {opt[vs['protocol']]} {sock('fd00:beef::9' if v6 else '10.99.99.99', 80)}"))
with open(f"{d}/drifts.sh", "w") as f:
    for n, do, undo in D:
        f.write(f"drift {n} '{do}' '{undo}'\n")
PY
}

vm=$work/vm.sh
files=()
cat > "$vm" <<'VM'
# Runs inside the VM (busybox sh). Each file is printed between "=== FILE <case>/<name> ===" markers.
# Matches kube-proxy's rules use that the VM's init does not load (no /sbin/modprobe for autoloading):
for m in xt_physdev xt_ipvs xt_set xt_conntrack xt_addrtype xt_MASQUERADE ipt_REJECT ip6t_REJECT; do modprobe $m 2>/dev/null; done
emit() { echo "=== FILE $1 ==="; cat; echo "=== END ==="; }
dumps() { # CASE PREFIX FAMILY
  c=$1; p=$2; ipt=iptables; [ "$3" = 6 ] && ipt=ip6tables
  ipvsadm -Ln | emit "$c/${p}ipvsadm-Ln.txt"
  ipvsadm -Ln --stats | emit "$c/${p}ipvsadm-Ln-stats.txt"
  ipvsadm -Sn | emit "$c/${p}ipvsadm-Sn.txt"
  ipvsadm -Lnc | emit "$c/${p}ipvsadm-Lnc.txt"
  ipvsadm -L --timeout | emit "$c/${p}ipvsadm-timeout.txt"
  ipset save | emit "$c/${p}ipset-save.txt"
  $ipt-save | grep -v '^#' | emit "$c/${p}iptables-save.txt"
  ip -o addr show dev kube-ipvs0 | emit "$c/${p}ip-addr-kube-ipvs0.txt"
}
reset() {
  ipvsadm -C
  for t in iptables ip6tables; do for tb in nat filter; do $t -t $tb -F; $t -t $tb -X; done; done
  ipset destroy 2>/dev/null
  ip link del kube-ipvs0 2>/dev/null; ip link del eth0 2>/dev/null
}
VM
for c in "${cases[@]}"; do
  if [ -f "$here/$c/config.yaml" ]; then
    # A case of this repository (make-example-inputs.sh): its own inputs and render-args.txt.
    d=$here/$c
    mapfile -t own < "$d/render-args.txt"
    args=(--state "$d/state.json" --config "$d/config.yaml" "${own[@]}")
    fam=${own[3]}
  else
    d=$shared/conformance/ipvs/$c
    fam=4; grep -q 'proxier_families: \[IPv6\]' "$d/case.yaml" && fam=6
    node=$(sed -n '/^node:/,/^[a-z]/s/^  name: *\([^ #]*\).*/\1/p' "$d/case.yaml" | head -1)
    args=(--state "$d/state.json" --config "$d/config.yaml" --node "${node:-test-node}" --ip-family "$fam")
  fi
  cd_=$work/$c; mkdir -p "$cd_"
  "$bin" render --mode ipvs "${args[@]}" -o json > "$cd_/render.json" 2>/dev/null
  python3 - "$cd_" <<'PY'
import json, sys
d = sys.argv[1]; r = json.load(open(f"{d}/render.json"))
open(f"{d}/iptables", "w").write(r["iptables"])
fam6 = r["ip_family"] == "IPv6"
hdr = "family inet6 hashsize 1024 maxelem 65536" if fam6 else "family inet hashsize 1024 maxelem 65536"
types = {"LOOP-BACK":"hash:ip,port,ip","SOURCE-IP":"hash:ip,port,ip","SOURCE-CID":"hash:ip,port,net","IPVS-IPS":"hash:ip"}
with open(f"{d}/sets.save", "w") as f:
    for name, entries in r["ipsets"].items():
        t = "hash:ip,port"
        for k, v in types.items():
            if k in name: t = v
        if ("NODE-PORT" in name and "SCTP" not in name) or "HEALTH-CHECK" in name: t = "bitmap:port"
        f.write(f"create {name} {t} {'range 0-65535' if t.startswith('bitmap') else hdr}\n")
        for e in entries: f.write(f"add {name} {e}\n")
PY
  gen "$cd_" "$c" "$fam"
  cp "$cd_/iptables" "$work/$c.iptables"; files+=("$work/$c.iptables")
  cp "$cd_/render.json" "$work/$c.render.json"
  mkdir -p "$out/$c"
  printf '%s\n' "${args[@]:4}" > "$out/$c/render-args.txt"   # --node N --ip-family F (state/config: the case's own or the shared case's)
  {
    echo "echo '### case $c'"
    echo "reset"
    cat "$cd_/install.sh"
    echo "dumps $c '' $fam"
    echo "drift() { sh -c \"\$2\"; dumps $c \"drift-\$1/\" $fam; sh -c \"\$3\"; }"
    cat "$cd_/drifts.sh"
  } >> "$vm"
  cp "$cd_/install.sh" "$out/$c/install.sh"; cp "$cd_/drifts.sh" "$out/$c/drifts.sh"
done
"$shared/tools/ipvs-vm.sh" "$vm" "${files[@]}" > "$work/vm.out"
awk -v out="$out" '
  /^=== FILE / { f = out "/" $3; n = split(f, parts, "/"); dir = substr(f, 1, length(f) - length(parts[n])); system("mkdir -p \"" dir "\""); printf "" > f; next }
  /^=== END ===$/ { close(f); f = ""; next }
  f != "" { print >> f; next }
  { print > "/dev/stderr" }
' "$work/vm.out"
# `ipvsadm -Ln` identical to the case's shared expected.ipvsadm is not kept (the tests read the
# shared file instead of a copy of it).
for f in $(find "$out" -name ipvsadm-Ln.txt); do
  c=$(realpath --relative-to="$out" "$f" | cut -d/ -f1)
  [ -f "$shared/conformance/ipvs/$c/expected.ipvsadm" ] || continue
  cmp -s "$f" "$shared/conformance/ipvs/$c/expected.ipvsadm" && rm -f "$f"
done
echo "dumps written under $out" >&2
