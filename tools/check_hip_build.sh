#!/usr/bin/env bash
# check_hip_build.sh: checks that the hip backend builds against a given
# ROCm's headers and that its run-time version mapping passes there:
#
#   tools/check_hip_build.sh ROCM_DIR [extra bazel flags]
#
# ROCM_DIR is an installed ROCm (/opt/rocm-6.4.1) or any tree with
# include/hip (hip_runtime_api.h, hip_version.h, amd_detail/) and
# include/hsa: headers only, no library (libamdhip64 is opened at run time).
# It builds //common/hip:hip_api, //server/engines/gpu/hip:register,
# :hsa_copy_queue, :hsa_streams and :hsa_api, and //client:hip_backend with
# DMAGATHER_HIP_PATH=ROCM_DIR (hip_api.cc checks at compile time that its
# per-major table agrees with these headers and that HipApi's function
# types are these headers' prototypes), runs the fake-runtime tests
# built against them (tests/common/hip:hip_abi_test,
# tests/server/engines/gpu:hsa_{copy_queue,streams,api,engine}_test,
# tests/client:hip_backend_rocm{5,6,7_0,7}_test,
# tests/server/engines/factory_hip:hip_runtime_fake_rocm{5,6,7_0,7}_test and
# :hip_engines_fake_*_test, on a fake libhsa-runtime64), and checks that
# build_config.txt names ROCM_DIR and its version. Prints one PASS/FAIL
# line; exit status 0 on PASS.
#
# Only the targets above are built (the rest of the tree does not depend on
# the HIP headers). The next bazel command without --repo_env detects the
# default ROCm (/opt/rocm, else /usr) again.
set -uo pipefail
if [[ $# -lt 1 ]]; then
  sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
rocm=$(cd "$1" 2>/dev/null && pwd) || { echo "check_hip_build: FAIL: no directory $1" >&2; exit 1; }
shift
cd "$(dirname "$0")/.."
fail() {
  echo "check_hip_build: FAIL ($rocm): $*" >&2
  exit 1
}
for f in include/hip/hip_runtime_api.h include/hip/hip_version.h; do
  [[ -f "$rocm/$f" ]] || fail "no $f"
done
version=$(awk '/#define HIP_VERSION_(MAJOR|MINOR|PATCH)/ {v[$2]=$3} END {print v["HIP_VERSION_MAJOR"] "." v["HIP_VERSION_MINOR"] "." v["HIP_VERSION_PATCH"]}' \
  "$rocm/include/hip/hip_version.h")

FLAGS=(--repo_env=DMAGATHER_HIP_PATH="$rocm")
BUILD=(//:build_config //common/hip:hip_api //server/engines/gpu/hip:register //server/engines/gpu/hip:hsa_copy_queue
       //server/engines/gpu/hip:hsa_streams //server/engines/gpu/hip:hsa_api //client:hip_backend)
TESTS=(//tests/common/hip:hip_abi_test)
for t in hsa_copy_queue hsa_streams hsa_api hsa_engine; do
  TESTS+=("//tests/server/engines/gpu:${t}_test")
done
for t in own own_rocm7 unusable_engine old_hsa rocr_asked; do
  TESTS+=("//tests/server/engines/factory_hip:hip_engines_fake_${t}_test")
done
for major in 5 6 7_0 7; do
  TESTS+=("//tests/client:hip_backend_rocm${major}_test"
          "//tests/server/engines/factory_hip:hip_runtime_fake_rocm${major}_test")
done

bazel build "${FLAGS[@]}" "$@" "${BUILD[@]}" || fail "bazel build against HIP $version"
bin=$(bazel info "${FLAGS[@]}" bazel-bin 2>/dev/null) || fail "bazel info bazel-bin"
grep -qx "HIP_PATH=$rocm" "$bin/build_config.txt" ||
  fail "build_config.txt does not name $rocm: $(tr '\n' ' ' <"$bin/build_config.txt")"
grep -qx "HIP_VERSION=$version" "$bin/build_config.txt" ||
  fail "build_config.txt does not say HIP_VERSION=$version: $(tr '\n' ' ' <"$bin/build_config.txt")"
bazel test "${FLAGS[@]}" "$@" "${TESTS[@]}" || fail "fake-runtime tests built against HIP $version"
echo "check_hip_build: PASS ($rocm): HIP $version; $(grep '^HIP_HAS' "$bin/build_config.txt" | tr '\n' ' ')"
