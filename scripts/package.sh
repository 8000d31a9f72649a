#!/usr/bin/env bash
# Builds the release archive kubectl-kproxy_<version>_<os>_<arch>.tar.gz (kubectl-kproxy + LICENSE
# at the archive root, as krew-manifest.yaml's `files` expect) and prints its sha256.
#
#   scripts/package.sh [--target TRIPLE] [--out DIR] [--manifest FILE]
#
#   --target TRIPLE   cargo target (default: the host's); it decides <os>_<arch>
#   --out DIR         where the archive goes (default: target/package)
#   --manifest FILE   also write the sha256 into FILE for the platform whose uri names the archive
#   KPROXY_PACKAGE_BIN=path   package this binary instead of building one (used by the tests)
#
# The archive is reproducible (sorted names, owner 0, mtime 0, gzip -n): the same binary gives
# the same sha256.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

target="" out="target/package" manifest=""
while [ $# -gt 0 ]; do
  case "$1" in
    --target) target="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --manifest) manifest="$2"; shift 2 ;;
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

if [ -n "${KPROXY_PACKAGE_BIN:-}" ]; then
  bin="$KPROXY_PACKAGE_BIN"
else
  cargo build --release --locked --bin kubectl-kproxy ${target:+--target "$target"}
  bin="target/${target:+$target/}release/kubectl-kproxy"
fi

name="kubectl-kproxy_${version}_${os}_${arch}.tar.gz"
mkdir -p "$out"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
install -m 0755 "$bin" "$stage/kubectl-kproxy"
install -m 0644 LICENSE "$stage/LICENSE"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$stage" -cf - kubectl-kproxy LICENSE \
  | gzip -n -9 > "$out/$name"
sha="$(sha256sum "$out/$name" | cut -d' ' -f1)"

if [ -n "$manifest" ]; then
  # The sha256 line follows the uri line of the same platform.
  awk -v name="$name" -v sha="$sha" '
    index($0, "uri:") && index($0, "/" name) { hit = 1; print; next }
    hit && $1 == "sha256:" { sub(/sha256:.*/, "sha256: \"" sha "\""); hit = 0 }
    { print }' "$manifest" > "$manifest.tmp"
  mv "$manifest.tmp" "$manifest"
fi

echo "$out/$name"
echo "sha256 $sha"
