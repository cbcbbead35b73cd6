#!/usr/bin/env bash
# Runs every test that needs no GPU (unit tests with fakes, integration tests
# with a real daemon and real rank processes), then prints one closing line
# `N passed, N failed` counting test cases (from the JUnit XML Bazel writes).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh || exit 1
bazel test //... --test_tag_filters=-gpu,-manual "$@" 2>&1 | tee /tmp/dmagather-test.log
rc=${PIPESTATUS[0]}
targets_failed=$(grep -cE '^//.* (FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD|INCOMPLETE)' /tmp/dmagather-test.log || true)
passed=0
failed=0
testlogs=$(bazel info bazel-testlogs 2>/dev/null)
if [ -d "$testlogs" ]; then
  while IFS= read -r xml; do
    t=$(grep -o 'tests="[0-9]*"' "$xml" | head -1 | tr -dc 0-9)
    f=$(grep -o 'failures="[0-9]*"' "$xml" | head -1 | tr -dc 0-9)
    e=$(grep -o 'errors="[0-9]*"' "$xml" | head -1 | tr -dc 0-9)
    passed=$((passed + ${t:-0} - ${f:-0} - ${e:-0}))
    failed=$((failed + ${f:-0} + ${e:-0}))
  done < <(find "$testlogs" -name test.xml)
fi
# A target that failed without reporting cases (crash, timeout, build) still counts.
if [ "$targets_failed" -gt "$failed" ]; then failed=$targets_failed; fi
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo "$passed passed, $failed failed"
exit $rc
