#!/usr/bin/env bash
# count_test_cases.sh LOG TESTLOGS: counts the test cases of the targets a
# `bazel test` run reported in LOG, from the JUnit XML Bazel writes under
# TESTLOGS (`bazel info bazel-testlogs` of that run's configuration), and
# prints "PASSED FAILED SKIPPED". A target that failed without reporting a
# failed case (crash, timeout, build failure) counts as one failed case. A
# skipped case (GTEST_SKIP: the XML's skipped="N"; Python unittest: its log's
# "skipped=N") is counted as skipped, never as passed. A FLAKY target (passed
# only on a retry) counts its cases as failed: a flake is a failure here.
set -uo pipefail
log=$1
testlogs=$2
passed=0
failed=0
skipped=0
while read -r target status; do
  pkg=${target#//}
  pkg=${pkg%%:*}
  name=${target##*:}
  xml="$testlogs/$pkg/$name/test.xml"
  t=0 f=0 e=0 s=0
  if [ -f "$xml" ]; then
    t=$(grep -o 'tests="[0-9]*"' "$xml" | head -1 | tr -dc 0-9)
    f=$(grep -o 'failures="[0-9]*"' "$xml" | head -1 | tr -dc 0-9)
    e=$(grep -o 'errors="[0-9]*"' "$xml" | head -1 | tr -dc 0-9)
    # gtest: per suite; Python: one case for the target, its skips in the log.
    s=$(grep -o '<testsuite [^>]*skipped="[0-9]*"' "$xml" | grep -o 'skipped="[0-9]*"' | tr -dc '0-9\n' |
        awk '{n += $1} END {print n + 0}')
    if [ "${s:-0}" -eq 0 ] && [ -f "${xml%.xml}.log" ]; then
      s=$(grep -oE '^OK \(skipped=[0-9]+\)|^FAILED \(.*skipped=[0-9]+' "${xml%.xml}.log" | grep -oE 'skipped=[0-9]+' |
          tr -dc '0-9\n' | awk '{n += $1} END {print n + 0}')
    fi
    t=${t:-0} f=${f:-0} e=${e:-0} s=${s:-0}
    # A Python target is one XML case; its log says how many ran ("Ran N tests").
    if [ "$t" -eq 1 ] && [ -f "${xml%.xml}.log" ]; then
      n=$(grep -oE '^Ran [0-9]+ tests?' "${xml%.xml}.log" | tail -1 | tr -dc 0-9)
      if [ -n "$n" ] && [ "$n" -gt 0 ]; then t=$n; fi
    fi
  fi
  case "$status" in
    PASSED*)
      if [ "$t" -gt 0 ]; then
        ran=$((t - f - e))
        passed=$((passed + (ran > s ? ran - s : 0)))
        failed=$((failed + f + e))
        skipped=$((skipped + s))
      else
        passed=$((passed + 1))
      fi
      ;;
    FLAKY*)
      failed=$((failed + (t > 0 ? t : 1)))
      ;;
    *)
      passed=$((passed + (t > f + e ? t - f - e : 0)))
      if [ $((f + e)) -gt 0 ]; then failed=$((failed + f + e)); else failed=$((failed + 1)); fi
      ;;
  esac
done < <(sed -nE 's/^(\/\/[^ ]+) +(\(cached\) )?(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE).*/\1 \3/p' "$log")
echo "$passed $failed $skipped"
