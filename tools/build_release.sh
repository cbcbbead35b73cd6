#!/usr/bin/env bash
# The release: the Debian packages, the wheel and (as root) the DaemonSet
# image from one build, and the proof that they carry the same binaries.
#
#   tools/build_release.sh [OUTDIR]     (default dist/release)
#
# OUTDIR/debs (tools/build_debs.sh), OUTDIR/wheel (tools/build_wheel.sh) and,
# when run as root, OUTDIR/image (tools/build_image.sh with those packages:
# the image installs the .deb). Both package scripts take the same Bazel
# targets of the same configuration, so Bazel builds them once; this script
# then reads the GNU build id of dmagatherd, dmagatherctl and libdmagather.so
# in the .deb and in the wheel (strip and the wheel's RPATH edits keep the
# note) and fails if any differs. Prints `release: DIR (build id ...)` last.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:-dist/release}" && cd "${1:-dist/release}" && pwd)
rm -rf "$out/debs" "$out/wheel" "$out/image"
tools/build_debs.sh "$out/debs" >&2
tools/build_wheel.sh "$out/wheel" >&2

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for deb in "$out"/debs/dmagatherd_*.deb "$out"/debs/libdmagather[0-9]*_*.deb; do dpkg-deb -x "$deb" "$work/deb"; done
python3 -m zipfile -e "$(ls "$out"/wheel/dmagather-*.whl | head -1)" "$work/wheel"

build_id() { readelf -n "$1" 2>/dev/null | sed -nE 's/.*Build ID: ([0-9a-f]+).*/\1/p'; }
first() { find "$1" -name "$2" -type f | sort | head -1; }
ids=()
for name in dmagatherd dmagatherctl libdmagather.so; do
  pattern=$name
  [ "$name" = libdmagather.so ] && pattern="$name.*.*.*"  # The .deb's versioned file; the wheel's is plain.
  deb_file=$(first "$work/deb" "$pattern")
  whl_file=$(first "$work/wheel/dmagather" "$name")
  a=$(build_id "$deb_file") b=$(build_id "$whl_file")
  if [ -z "$a" ] || [ "$a" != "$b" ]; then
    echo "build_release: $name differs: .deb ${deb_file#"$work"/} build id '${a}', wheel ${whl_file#"$work"/} '${b}'" >&2
    exit 1
  fi
  ids+=("$name=${a:0:12}")
done

if [ "$(id -u)" -eq 0 ]; then
  DMAGATHER_DEBS="$out/debs" tools/build_image.sh "$out/image" >&2
else
  echo "build_release: not root: no image (tools/build_image.sh needs root)" >&2
fi
echo "release: $out (the .deb and the wheel carry the same build: ${ids[*]})"
