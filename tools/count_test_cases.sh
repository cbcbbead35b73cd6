#!/usr/bin/env bash
# count_test_cases.sh LOG TESTLOGS: counts the test cases of the targets a
# `bazel test` run reported in LOG, from the JUnit XML and the log Bazel
# writes under TESTLOGS (`bazel info bazel-testlogs` of that run's
# configuration), and prints "PASSED FAILED SKIPPED".
#
# - A skipped case is counted as skipped, never as passed: gtest's
#   GTEST_SKIP (the XML's skipped="N") and DISABLED_ cases (disabled="N");
#   Python unittest's skips (its log: "OK (skipped=N)"); pytest's (its
#   summary line: "N passed, N skipped").
# - A Python target is one XML case for Bazel; its log says how many cases
#   ran and how many failed ("Ran N tests", "FAILED (failures=N, errors=N)"
#   or pytest's summary).
# - A target that failed without reporting a failed case (crash, timeout,
#   build failure) counts as one failed case.
# - A FLAKY target (failed, then passed on a retry) counts each case that
#   failed on an earlier attempt (test_attempts/attempt_N.xml) as failed,
#   once, and its other cases as the last attempt reported them; one line
#   on stderr names it. A flake is a failure here, not a pass.
set -uo pipefail
log=$1
testlogs=$2

# attr FILE NAME: the sum of NAME="N" over the file's <testsuite> elements
# (gtest writes one per suite; Bazel's own XML for an sh_test has one).
attr() {
  grep -o "<testsuite [^>]*" "$1" | grep -oE " $2=\"[0-9]+\"" | tr -dc '0-9\n' | awk '{n += $1} END {print n + 0}'
}

# log_counts LOG: "RAN FAILED SKIPPED" from a Python test log (unittest's
# or pytest's closing lines); empty when the log has none.
log_counts() {
  local f=$1 ran fl sk line
  [ -f "$f" ] || return 0
  # unittest: "Ran N tests in Xs" then "OK", "OK (skipped=N)" or
  # "FAILED (failures=N, errors=N, skipped=N)".
  ran=$(grep -oE '^Ran [0-9]+ tests?' "$f" | tail -1 | tr -dc 0-9)
  if [ -n "$ran" ]; then
    line=$(grep -E '^(OK|FAILED)( \(.*\))?$' "$f" | tail -1)
    fl=$(grep -oE '(failures|errors|unexpected successes)=[0-9]+' <<<"$line" | tr -dc '0-9\n' | awk '{n += $1} END {print n + 0}')
    sk=$(grep -oE '(skipped|expected failures)=[0-9]+' <<<"$line" | tr -dc '0-9\n' | awk '{n += $1} END {print n + 0}')
    echo "$ran $fl $sk"
    return 0
  fi
  # pytest: "==== 3 passed, 1 failed, 2 skipped in 0.12s ====".
  line=$(grep -E '^=+ .*[0-9]+ (passed|failed|skipped|error).* in [0-9.]+s' "$f" | tail -1)
  if [ -n "$line" ]; then
    local p f2 e s
    p=$(grep -oE '[0-9]+ passed' <<<"$line" | tr -dc 0-9)
    f2=$(grep -oE '[0-9]+ failed' <<<"$line" | tr -dc 0-9)
    e=$(grep -oE '[0-9]+ errors?' <<<"$line" | tr -dc 0-9)
    s=$(grep -oE '[0-9]+ (skipped|xfailed|deselected)' <<<"$line" | tr -dc '0-9\n' | awk '{n += $1} END {print n + 0}')
    echo "$((${p:-0} + ${f2:-0} + ${e:-0} + s)) $((${f2:-0} + ${e:-0})) $s"
  fi
}

# counts XML: "TOTAL FAILED SKIPPED" for one attempt of one target.
counts() {
  local xml=$1 t f s pc
  t=$(attr "$xml" tests)
  f=$(($(attr "$xml" failures) + $(attr "$xml" errors)))
  s=$(($(attr "$xml" skipped) + $(attr "$xml" disabled)))
  # A Python target: one XML case; its log has the real counts.
  if [ "$t" -le 1 ] && [ "$s" -eq 0 ]; then
    pc=$(log_counts "${xml%.xml}.log")
    if [ -n "$pc" ]; then
      read -r t f s <<<"$pc"
      # The target failed but its log names no failed case (crashed after
      # the summary, a sanitizer report at exit): one failed case.
      if [ "$f" -eq 0 ] && [ "$(attr "$xml" failures)$(attr "$xml" errors)" != "00" ]; then f=1; t=$((t + 1)); fi
    fi
  fi
  echo "$t $f $s"
}

# failed_cases XML: the names of the cases that failed in one attempt (gtest:
# a <testcase> with a <failure> or <error>); "target" when the attempt
# failed without naming one (a Python target, a crash).
failed_cases() {
  local xml=$1 names
  [ -f "$xml" ] || { echo target; return 0; }
  names=$(awk '
    /<testcase / {
      cur = ""
      if (match($0, / name="[^"]*"/)) cur = substr($0, RSTART + 7, RLENGTH - 8)
      if (match($0, / classname="[^"]*"/)) cur = substr($0, RSTART + 12, RLENGTH - 13) "." cur
      if ($0 ~ /\/>[[:space:]]*$/) cur = ""
    }
    /<(failure|error)[ >]/ { if (cur != "") print cur }
    /<\/testcase>/ { cur = "" }' "$xml" | sort -u)
  if [ -n "$names" ]; then echo "$names"; else echo target; fi
}

passed=0
failed=0
skipped=0
while read -r target status; do
  pkg=${target#//}
  pkg=${pkg%%:*}
  name=${target##*:}
  dir="$testlogs/$pkg/$name"
  xml="$dir/test.xml"
  t=0 f=0 s=0
  if [ -f "$xml" ]; then read -r t f s < <(counts "$xml"); fi
  case "$status" in
    PASSED*)
      if [ "$t" -gt 0 ]; then
        passed=$((passed + (t > f + s ? t - f - s : 0)))
        failed=$((failed + f))
        skipped=$((skipped + s))
      else
        passed=$((passed + 1))
      fi
      ;;
    FLAKY*)
      # Every case that failed on some earlier attempt, counted once.
      flaky=$(for a in "$dir"/test_attempts/attempt_*.xml; do
                [ -e "$a" ] && failed_cases "$a"
              done | sort -u | grep -c .)
      [ "${flaky:-0}" -gt 0 ] || flaky=1
      echo "count_test_cases: FLAKY $target: $flaky case(s) failed before a retry passed; counted as failed" >&2
      failed=$((failed + flaky))
      skipped=$((skipped + s))
      passed=$((passed + (t > flaky + s ? t - flaky - s : 0)))
      ;;
    *)
      passed=$((passed + (t > f + s ? t - f - s : 0)))
      skipped=$((skipped + s))
      if [ "$f" -gt 0 ]; then failed=$((failed + f)); else failed=$((failed + 1)); fi
      ;;
  esac
done < <(sed -nE 's/^(\/\/[^ ]+) +(\(cached\) )?(PASSED|FLAKY|FAILED TO BUILD|FAILED|TIMEOUT|NO STATUS|INCOMPLETE).*/\1 \3/p' "$log")
echo "$passed $failed $skipped"
