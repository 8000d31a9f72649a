#!/usr/bin/env bash
# Builds the release archive kubectl-kproxy_<version>_<os>_<arch>.tar.gz (kubectl-kproxy,
# kubectl_complete-kproxy and LICENSE at the archive root, as the krew manifest's `files` expect)
# and prints its path and sha256.
#
#   scripts/package.sh [--target TRIPLE] [--bin PATH] [--out DIR]
#
#   --target TRIPLE   cargo target (default: the host's); it decides <os>_<arch>
#   --bin PATH        package this binary, built for TRIPLE (default: build it with
#                     `cargo build --release --locked [--target TRIPLE]`)
#   --out DIR         where the archive goes (default: target/package)
#
# The archive is reproducible (sorted names, owner 0, mtime 0, gzip -n): the same binary gives
# the same sha256. Needs GNU tar; the release workflow packs every platform's binary on Linux.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target="" bin="" out="target/package"
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "package.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

version="v$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
triple="${target:-$(rustc -vV | sed -n 's/^host: //p')}"
case "$triple" in
  x86_64-*) arch=amd64 ;;
  aarch64-*) arch=arm64 ;;
  *) echo "package.sh: unsupported architecture in $triple" >&2; exit 2 ;;
esac
case "$triple" in
  *-linux-*) os=linux ;;
  *-apple-darwin) os=darwin ;;
  *) echo "package.sh: unsupported OS in $triple" >&2; exit 2 ;;
esac

if [ -z "$bin" ]; then
  cargo build --release --locked --bin kubectl-kproxy ${target:+--target "$target"}
  bin="target/${target:+$target/}release/kubectl-kproxy"
fi
[ -f "$bin" ] || { echo "package.sh: no binary at $bin" >&2; exit 2; }

name="kubectl-kproxy_${version}_${os}_${arch}.tar.gz"
mkdir -p "$out"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$bin" "$stage/kubectl-kproxy"
install -m 0755 scripts/kubectl_complete-kproxy "$stage/kubectl_complete-kproxy"
install -m 0644 LICENSE "$stage/LICENSE"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" -cf - \
    kubectl-kproxy kubectl_complete-kproxy LICENSE \
  | gzip -n -9 > "$out/$name"
sha="$(sha256sum "$out/$name" | cut -d' ' -f1)"

echo "$out/$name"
echo "sha256 $sha"
