#!/bin/sh
# Copies seed inputs from the repo's test data (and the shared conformance cases, when present)
# into fuzz/corpus/<target>/, one file per distinct input, named by its SHA-1.
# Usage: fuzz/seed.sh   (from anywhere; re-running only adds what is missing)
set -eu
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
shared="$repo/../shared/conformance"
corpus="$here/corpus"

# seed TARGET FILE...: copy each non-empty FILE into corpus/TARGET under its content hash.
seed() {
    target=$1
    shift
    mkdir -p "$corpus/$target"
    for f in "$@"; do
        [ -s "$f" ] || continue
        sum=$(sha1sum "$f" | cut -d' ' -f1)
        [ -e "$corpus/$target/$sum" ] || cp "$f" "$corpus/$target/$sum"
    done
}

# iptables text: save/restore/-S dumps from testdata and the shared real-world/render cases.
iptables_files=$(
    {
        find "$repo/testdata/dumps" "$repo/testdata/live" "$repo/testdata/trace" -type f \
            ! -name '*.md' ! -name '*.sh'
        find "$repo/testdata/ipvs" -type f -name 'iptables-save.txt'
        if [ -d "$shared" ]; then
            find "$shared/iptables/real-world" -type f -name '*.txt'
            find "$shared/iptables/render" -type f -name 'expected.*'
            find "$shared/ipvs" -type f -name 'expected.iptables*'
        fi
    } 2>/dev/null | sort
)
# shellcheck disable=SC2086 # word splitting on newlines is intended (paths have no blanks)
seed iptables_dump $iptables_files
# shellcheck disable=SC2086
seed round_trip $iptables_files
# `iptables -L` listings made by testdata/listing/make.sh.
seed iptables_listing "$repo"/testdata/listing/*.L*

# Single rule lines: each distinct `-A`/`-I` line (with or without a `[p:b]` prefix) of the dumps.
mkdir -p "$corpus/iptables_rule"
# shellcheck disable=SC2086
cat $iptables_files | grep -E '^(\[[0-9]+:[0-9]+\] )?-[AI] ' | sort -u | while IFS= read -r line; do
    sum=$(printf '%s\n' "$line" | sha1sum | cut -d' ' -f1)
    [ -e "$corpus/iptables_rule/$sum" ] || printf '%s\n' "$line" >"$corpus/iptables_rule/$sum"
done

# ipvsadm: -Ln (all layouts), -Lnc, --timeout, -Sn captures.
seed ipvsadm $(
    {
        find "$repo/testdata/ipvs" -type f -name 'ipvsadm-*.txt'
        if [ -d "$shared" ]; then
            find "$shared/ipvs" -type f \( -name 'expected.ipvsadm' -o -name '*.constructed.txt' \) \
                ! -name 'ipset-*' ! -name 'proc-net-*'
        fi
    } 2>/dev/null | sort
)

# ipset: save and list forms.
seed ipset $(
    {
        find "$repo/testdata/ipvs" -type f -name 'ipset-*.txt'
        if [ -d "$shared" ]; then
            find "$shared/ipvs" -type f \( -name 'ipset-*' -o -name 'expected.ipset-save' \)
        fi
    } 2>/dev/null | sort
)

# conntrack: every captured listing form.
seed conntrack $(find "$repo/testdata/conntrack" -type f -name '*.txt' ! -name 'topology.txt' | sort)

# paste: dumps, listings, ipvsadm and ipset text (what pastes wrap and mix).
seed paste $(
    {
        find "$repo/testdata/dumps" "$repo/testdata/listing" -type f ! -name '*.md' ! -name '*.sh'
        if [ -d "$shared" ]; then
            find "$shared/iptables/real-world" "$shared/ipvs/formats" -type f -name '*.txt'
        fi
    } 2>/dev/null | sort
)

# nftables: listings, JSON and command lines (the same files seed both forms; `nft::parse`
# detects which it is given).
seed nft $(
    {
        find "$repo/testdata/nft" -type f ! -name '*.sh'
        if [ -d "$shared" ]; then
            find "$shared/nftables/samples" -type f ! -name '*.md'
            find "$shared/nftables/render" -type f \( -name '*.nft' -o -name 'expected-live.json' \)
            find "$shared/nftables/packetflow/live" -type f
        fi
    } 2>/dev/null | sort
)

for d in "$corpus"/*/; do
    printf '%-14s %6d files\n' "$(basename "$d")" "$(find "$d" -type f | wc -l)"
done
