#!/usr/bin/env bash
# check_no_cuda_build.sh: checks that dmagather builds where there is no
# GPU toolkit (a plain Debian 12 box): builds the daemon, the client
# library, dmagatherctl and allgather_perf with the CUDA toolkit and HIP
# hidden (DMAGATHER_CUDA_PATH=/nonexistent, DMAGATHER_HIP_PATH=/nonexistent),
# then checks that the generated config says HAS_CUDA=False and
# HAS_HIP=False, that no CUDA runtime was linked, and that
# `dmagatherd --backend=cuda` and `--backend=hip` say the backend is not
# part of this build. Then, on the normal build (when it is there), that
# neither dmagatherd nor libdmagather.so needs libamdhip64 at load time
# (the hip backend opens it with dlopen, so they start on nodes without
# ROCm).
#
# The outputs go to their own directory (--platform_suffix=-nocuda) and the
# bazel-* symlinks are left alone, so the normal tree is not rebuilt: the
# next bazel command without --repo_env detects the toolkit again and finds
# its outputs as they were. Exit status 0 when every check passes.
#
#   tools/check_no_cuda_build.sh [extra bazel build flags]
set -uo pipefail
cd "$(dirname "$0")/.."
FLAGS=(--repo_env=DMAGATHER_CUDA_PATH=/nonexistent --repo_env=DMAGATHER_HIP_PATH=/nonexistent
       --platform_suffix=-nocuda --symlink_prefix=/)
TARGETS=(//server:dmagatherd //client:libdmagather.so //tools:dmagatherctl //bench:allgather_perf //:build_config)
start=$(date +%s%N)
fail() {
  echo "check_no_cuda_build: FAILED: $*" >&2
  exit 1
}

bazel build "${FLAGS[@]}" "$@" "${TARGETS[@]}" || fail "bazel build without the CUDA toolkit"
bin=$(bazel info "${FLAGS[@]}" bazel-bin 2>/dev/null) || fail "bazel info bazel-bin"

grep -qx 'HAS_CUDA=False' "$bin/build_config.txt" ||
  fail "the generated config does not say HAS_CUDA=False: $(tr '\n' ' ' <"$bin/build_config.txt")"
grep -qx 'HAS_HIP=False' "$bin/build_config.txt" ||
  fail "the generated config does not say HAS_HIP=False: $(tr '\n' ' ' <"$bin/build_config.txt")"

for f in server/dmagatherd client/libdmagather.so bench/allgather_perf; do
  # Read whole, then searched: `nm | grep -q` under pipefail turns a match into
  # a failed pipe (grep leaves early, nm dies of SIGPIPE) and the check passes.
  syms="$(nm -D --defined-only "$bin/$f" 2>/dev/null; nm --defined-only "$bin/$f" 2>/dev/null)"
  if grep -q ' cudaGetDeviceCount$' <<<"$syms"; then
    fail "$f links the CUDA runtime"
  fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$(timeout 20 "$bin/server/dmagatherd" --backend=cuda --socket="$tmp/d.sock" 2>&1)
rc=$?
want="the cuda backend is not part of this build (built without the CUDA toolkit); this dmagatherd has: host"
[ "$rc" -ne 0 ] || fail "dmagatherd --backend=cuda exited 0"
grep -qF "$want" <<<"$out" || fail "dmagatherd --backend=cuda said: $(tail -3 <<<"$out")"
out=$(timeout 20 "$bin/server/dmagatherd" --backend=hip --socket="$tmp/d.sock" 2>&1)
rc=$?
want_hip="the hip backend is not part of this build (built without HIP: libamdhip64-dev and libhsa-runtime-dev were not found); this dmagatherd has: host"
[ "$rc" -ne 0 ] || fail "dmagatherd --backend=hip exited 0"
grep -qF "$want_hip" <<<"$out" || fail "dmagatherd --backend=hip said: $(tail -3 <<<"$out")"

# The normal build: libamdhip64 is never a load-time dependency.
normal=$(bazel info bazel-bin 2>/dev/null)
for f in server/dmagatherd client/libdmagather.so; do
  [ -f "$normal/$f" ] || continue
  if grep -q 'NEEDED.*libamdhip64' <<<"$(readelf -d "$normal/$f" 2>/dev/null)"; then
    fail "$f needs libamdhip64 at load time (it must be opened with dlopen)"
  fi
done

ms=$((($(date +%s%N) - start) / 1000000))
printf 'check_no_cuda_build: OK in %d.%01d s (HAS_CUDA=False, HAS_HIP=False; dmagatherd --backend=cuda: "%s")\n' \
  $((ms / 1000)) $((ms % 1000 / 100)) "$want"
