#!/usr/bin/env bash
# test_asan.sh: every CPU test (//... less the tags cuda, gpu, manual) under
# AddressSanitizer + UndefinedBehaviorSanitizer (--config=asan in .bazelrc):
# unit tests, integration tests (the daemon they start is built with ASan
# too) and the Python tests (Debian's python3 with the ASan runtime
# preloaded, DMAGATHER_ASAN_PRELOAD, since libdmagather.so is instrumented).
# Ends with one closing line `N passed, N failed` counting test cases. An
# ASan or UBSan report fails its test; the report is in the test's log
# (printed by --test_output=errors).
#
#   tools/test_asan.sh [extra bazel test flags]
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
trap 'rm -f "$log"' EXIT
asan_lib=$(gcc -print-file-name=libasan.so)
# ASAN_OPTIONS: see docs/TESTING.md for the leak-checking decision.
ASAN_OPTS=${DMAGATHER_ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1}
# Tests that cannot run under ASan, each with its reason (see docs/TESTING.md).
EXCLUDE=(
  # Checks the DT_NEEDED list of the shipped libdmagather.so; an instrumented
  # build needs libasan/libubsan by design, so it says nothing here.
  -//tests/python:client_closure_test
)
bazel test --config=asan \
  --test_env=ASAN_OPTIONS="$ASAN_OPTS" \
  --test_env=LSAN_OPTIONS="suppressions=$PWD/tools/lsan.supp:print_suppressions=0" \
  --test_env=DMAGATHER_ASAN_PRELOAD="$asan_lib" \
  "$@" -- //... "${EXCLUDE[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
read -r passed failed skipped < <(tools/count_test_cases.sh "$log" "$(bazel info --config=asan bazel-testlogs 2>/dev/null)")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "$passed passed, $failed failed, $skipped skipped"
exit "$rc"
