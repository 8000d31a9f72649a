#!/usr/bin/env bash
# Renders the krew plugin manifest from its template (.krew.yaml, krew-release-bot's form) for a
# release whose archives are already built and checksummed:
#
#   scripts/krew-manifest.sh --tag vX.Y.Z --checksums SHA256SUMS [--template FILE] > krew-manifest.yaml
#   scripts/krew-manifest.sh --tag vX.Y.Z --unreleased > krew-manifest.yaml
#
#   --tag TAG          the release tag; must be v<version of Cargo.toml>
#   --checksums FILE   `sha256sum` output for the archives (`HASH  NAME`, one a line)
#   --unreleased       no archives yet: each sha256 says it is filled at release (krew refuses
#                      such a manifest, as it should: the version is not released)
#   --template FILE    default: .krew.yaml
#
# Each `{{ .TagName }}` becomes TAG; each line holding only an addURIAndSha expression
# (`{{addURIAndSha "URL" .TagName }}`) becomes `uri: URL` and `sha256: "HASH"` at the same
# indentation, HASH being the checksum of URL's file name. It fails, printing nothing, when the
# tag is not the crate's version, an archive has no well-formed checksum, or any `{{` is left.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

tag="" sums="" unreleased="" template=".krew.yaml"
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag="$2"; shift 2 ;;
    --checksums) sums="$2"; shift 2 ;;
    --unreleased) unreleased=1; shift ;;
    --template) template="$2"; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "krew-manifest.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$tag" ] && { [ -n "$sums" ] || [ -n "$unreleased" ]; } \
  || { echo "krew-manifest.sh: --tag and --checksums (or --unreleased) are required" >&2; exit 2; }
[ -z "$sums" ] || [ -z "$unreleased" ] \
  || { echo "krew-manifest.sh: --checksums and --unreleased exclude each other" >&2; exit 2; }
version="v$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
if [ "$tag" != "$version" ]; then
  echo "krew-manifest.sh: tag $tag is not the version in Cargo.toml ($version)" >&2
  exit 2
fi

manifest="$(awk -v tag="$tag" -v sums="$sums" -v template="$template" '
  function fail(msg) { print "krew-manifest.sh: " msg > "/dev/stderr"; exit 2 }
  function subst_tag(s) { gsub(/\{\{ *\.TagName *\}\}/, tag, s); return s }
  BEGIN {
    if (sums == "") {
      print "# kproxy " tag " is not released yet: scripts/krew-manifest.sh writes the archives'"'"'"
      print "# checksums here when the release workflow builds them."
    } else {
      print "# kproxy " tag ", rendered from .krew.yaml by scripts/krew-manifest.sh."
    }
    while (sums != "" && (status = (getline line < sums)) > 0) {
      if (line ~ /^[ \t]*$/) continue
      hash = line; sub(/[ \t].*$/, "", hash)
      name = line; sub(/^[^ \t]+[ \t]+\*?/, "", name); sub(/^.*\//, "", name)
      if (length(hash) != 64 || hash ~ /[^0-9a-f]/) fail(sums ": not a sha256 line: " line)
      sha[name] = hash
    }
    if (status < 0) fail("cannot read " sums)
  }
  # The template'"'"'s leading comment is about the template, not the plugin.
  !body && /^#/ { next }
  { body = 1 }
  /^[ \t]*\{\{ *addURIAndSha / {
    indent = $0; sub(/[^ \t].*$/, "", indent)
    rest = $0; sub(/^[^"]*"/, "", rest)
    url = rest; sub(/".*$/, "", url)
    tail = rest; sub(/^[^"]*"/, "", tail)
    if (tail !~ /^ *\.TagName *\}\} *$/) fail(template ":" NR ": unexpected addURIAndSha form: " $0)
    url = subst_tag(url)
    file = url; sub(/^.*\//, "", file)
    print indent "uri: " url
    if (sums == "") {
      print indent "sha256: \"unreleased\""
      next
    }
    if (!(file in sha)) fail(sums ": no checksum for " file)
    print indent "sha256: \"" sha[file] "\""
    next
  }
  {
    line = subst_tag($0)
    if (index(line, "{{")) fail(template ":" NR ": template expression left: " $0)
    print line
  }
' "$template")"
printf '%s\n' "$manifest"
