#!/usr/bin/env bash
# test_tsan.sh: the CPU unit tests (//tests/server/..., //tests/common/...;
# among them the GPU engine on the fake runtime, //tests/server/engines/gpu)
# under ThreadSanitizer (--config=tsan in .bazelrc: tests tagged cuda, gpu
# or manual are skipped), then one closing line `N passed, N failed`
# counting test cases. A race report fails its test (TSan exits 66); the
# report is in the test's log (printed by --test_output=errors).
#
#   tools/test_tsan.sh [extra bazel test flags]
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
bazel test --config=tsan //tests/server/... //tests/common/... "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
read -r passed failed skipped < <(tools/count_test_cases.sh "$log" "$(bazel info --config=tsan bazel-testlogs 2>/dev/null)")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "$passed passed, $failed failed, $skipped skipped"
exit "$rc"
