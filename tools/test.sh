#!/usr/bin/env bash
# Runs every test that needs no GPU (unit tests with fakes, integration tests
# with a real daemon and real rank processes), then two extra checks:
# tools/check_no_cuda_build.sh (the build as on a machine without the CUDA
# toolkit: counted as one case) and tools/test_tsan.sh (the CPU unit tests
# under ThreadSanitizer: its cases counted). Prints one closing line
# `N passed, N failed` counting test cases (from the JUnit XML Bazel writes).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh || exit 1
log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test //... --test_tag_filters=-gpu,-manual "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
read -r passed failed < <(tools/count_test_cases.sh "$log" "$(bazel info bazel-testlogs 2>/dev/null)")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi

# The build without CUDA (own output directory; the normal tree is untouched).
echo "== check_no_cuda_build"
if tools/check_no_cuda_build.sh; then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  rc=1
fi

# The CPU unit tests under ThreadSanitizer (ends with its own counts line).
echo "== test_tsan"
tools/test_tsan.sh 2>&1 | tee "$log"
tsan_rc=${PIPESTATUS[0]}
read -r tp tf < <(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed$/\1 \2/p' "$log" | tail -1)
passed=$((passed + ${tp:-0}))
failed=$((failed + ${tf:-1}))
if [ "$tsan_rc" -ne 0 ]; then rc=1; fi

echo "$passed passed, $failed failed"
exit $rc
