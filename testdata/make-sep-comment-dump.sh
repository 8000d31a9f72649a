#!/usr/bin/env bash
# A node whose every service differs, from a clean dump: each KUBE-SEP rule gets the service's
# comment, as kube-proxy writes it on a node with at most 1,000 endpoints (in large-cluster mode,
# as on the 10k-service node, it leaves them out).
#
#   testdata/make-sep-comment-dump.sh [IN [OUT]]
#
# Defaults: IN target/scale/scale.nft.save (made by testdata/make-scale-dump.sh), OUT
# target/scale/sep-comments.nft.save. The comment of a KUBE-SEP-… chain is the service port name
# (`ns/svc:port`) of the KUBE-SVC-…/KUBE-SVL-… chain that jumps to it; it goes where iptables-save
# prints a comment match: after `-s`/`-p`, before the other matches.
# No root needed; the same input always gives the same bytes.
set -euo pipefail
export LC_ALL=C
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
in="${1:-$repo/target/scale/scale.nft.save}"
out="${2:-$repo/target/scale/sep-comments.nft.save}"
[ -r "$in" ] || { echo "make-sep-comment-dump: no $in (run testdata/make-scale-dump.sh first)" >&2; exit 2; }

# Pass 1: each KUBE-SVC-…/KUBE-SVL-… chain's service port name (the first word of a comment in it:
# in large-cluster mode the jumps to endpoint chains have none) and each KUBE-SEP chain's policy
# chain (the first that jumps to it).
# Pass 2: the same text, a comment added to every rule of a KUBE-SEP chain that has none.
awk '
  FNR == NR {
    if ($1 == "-A" && ($2 ~ /^KUBE-SVC-/ || $2 ~ /^KUBE-SVL-/)) {
      if (!($2 in cname) && match($0, /--comment "[^" ]*/)) cname[$2] = substr($0, RSTART + 11, RLENGTH - 11)
      if (match($0, /-j KUBE-SEP-[A-Z0-9]+$/)) {
        sep = substr($0, RSTART + 3)
        if (!(sep in policy)) policy[sep] = $2
      }
    }
    next
  }
  $1 == "-A" && $2 ~ /^KUBE-SEP-/ && cname[policy[$2]] != "" && index($0, "--comment") == 0 {
    n = split($0, w, " ")
    line = w[1] " " w[2]
    i = 3
    while (i + 1 <= n && (w[i] == "-s" || w[i] == "-p")) { line = line " " w[i] " " w[i+1]; i += 2 }
    line = line " -m comment --comment \"" cname[policy[$2]] "\""
    for (; i <= n; i++) line = line " " w[i]
    print line
    next
  }
  { print }
' "$in" "$in" > "$out"
printf '%s  %s lines  %s\n' "$(du -h "$out" | cut -f1)" "$(wc -l < "$out")" "$out"
