#!/usr/bin/env bash
# count_test_cases.sh LOG TESTLOGS: counts the test cases of the targets a
# `bazel test` run reported in LOG, from the JUnit XML Bazel writes under
# TESTLOGS (`bazel info bazel-testlogs` of that run's configuration), and
# prints "PASSED FAILED". A target that failed without reporting a failed
# case (crash, timeout, build failure) counts as one failed case.
set -uo pipefail
log=$1
testlogs=$2
passed=0
failed=0
while read -r target status; do
  pkg=${target#//}
  pkg=${pkg%%:*}
  name=${target##*:}
  xml="$testlogs/$pkg/$name/test.xml"
  t=0 f=0 e=0
  if [ -f "$xml" ]; then
    t=$(grep -o 'tests="[0-9]*"' "$xml" | head -1 | tr -dc 0-9)
    f=$(grep -o 'failures="[0-9]*"' "$xml" | head -1 | tr -dc 0-9)
    e=$(grep -o 'errors="[0-9]*"' "$xml" | head -1 | tr -dc 0-9)
    t=${t:-0} f=${f:-0} e=${e:-0}
  fi
  case "$status" in
    PASSED* | FLAKY*)
      if [ "$t" -gt 0 ]; then
        passed=$((passed + t - f - e))
        failed=$((failed + f + e))
      else
        passed=$((passed + 1))
      fi
      ;;
    *)
      passed=$((passed + (t > f + e ? t - f - e : 0)))
      if [ $((f + e)) -gt 0 ]; then failed=$((failed + f + e)); else failed=$((failed + 1)); fi
      ;;
  esac
done < <(sed -nE 's/^(\/\/[^ ]+) +(\(cached\) )?(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE).*/\1 \3/p' "$log")
echo "$passed $failed"
