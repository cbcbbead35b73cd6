#!/usr/bin/env bash
# check_clock_test.sh: proves tools/check_clock.sh fails on a direct clock
# read outside its allow-list. Each case writes a small tree under a
# temporary directory (server/, client/, common/ files and an allow-list),
# runs the check on it and compares the exit status and the file:line it
# names. Runs as //tools:check_clock_test (so `bazel test //...` and
# tools/test.sh count it) or directly: tools/check_clock_test.sh.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
check="$here/check_clock.sh"
[ -x "$check" ] || check="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}/tools/check_clock.sh"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/check_clock_test.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0 n=0

# case NAME WANT_RC WANT_TEXT ALLOW_LIST FILE CONTENT [FILE CONTENT]...
# WANT_TEXT: a line the check's output must contain ("" for none).
case_() {
  local name=$1 want_rc=$2 want_text=$3 allow=$4
  shift 4
  n=$((n + 1))
  local root="$tmp/$n"
  mkdir -p "$root"
  printf '%s\n' "$allow" >"$root/allow.txt"
  while (($#)); do
    mkdir -p "$(dirname "$root/$1")"
    printf '%s\n' "$2" >"$root/$1"
    shift 2
  done
  local out rc
  out=$("$check" --allow "$root/allow.txt" "$root" 2>&1)
  rc=$?
  if [ "$rc" -eq "$want_rc" ] && { [ -z "$want_text" ] || grep -qF -- "$want_text" <<<"$out"; }; then
    passed=$((passed + 1))
    echo "ok: $name"
  else
    failed=$((failed + 1))
    echo "FAILED: $name: exit $rc (wanted $want_rc), wanted a line with: $want_text"
    sed 's/^/    /' <<<"$out"
  fi
}

CLEAN='#include "common/clock.h"
bool Expired(const dmagather::common::Clock& clock, absl::Time deadline) {
  return clock.Now() >= deadline;
}'

case_ "a tree that reads time only through the Clock passes" 0 "1 passed, 0 failed" "" server/a.cc "$CLEAN"

case_ "planted absl::Now() is named with file:line and function" 1 \
  "server/service/a.cc:3: direct clock read \`absl::Now()\` in Sweeper::Expired" "" \
  server/service/a.cc 'namespace x {
bool Sweeper::Expired(absl::Time deadline) {
  return absl::Now() >= deadline;
}
}  // namespace x'

case_ "planted MonotonicNs() in client/" 1 "client/b.cc:2: direct clock read \`MonotonicNs()\` in Late" "" \
  client/b.cc 'bool Late(uint64_t due) {
  return dmagather::common::MonotonicNs() > due;
}'

case_ "planted std::chrono::steady_clock::now() in a lambda names its function" 1 \
  "server/c.cc:3: direct clock read \`steady_clock::now(\` in Drain" "" \
  server/c.cc 'void Drain() {
  auto f = [&] {
    return std::chrono::steady_clock::now();
  };
}'

case_ "planted clock_gettime in common/ (a method defined in its class)" 1 \
  "common/d.h:4: direct clock read \`clock_gettime(\` in Timer::Now" "" \
  common/d.h 'class Timer {
 public:
  long Now() const {
    timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec;
  }
};'

case_ "planted gettimeofday and system_clock::now() are both named" 1 "server/e.cc:3:" "" \
  server/e.cc 'void F() {
  timeval tv; gettimeofday(&tv, nullptr);
  auto t = std::chrono::system_clock::now();
}'

case_ "planted CondVar::WaitWithDeadline (a wall-clock deadline) is named" 1 \
  "server/k.cc:3: direct clock read \`WaitWithDeadline(\` in Waiter::Wait" "" \
  server/k.cc 'void Waiter::Wait(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (!done_ && !cv_.WaitWithDeadline(&mu_, deadline)) {
  }
}'

case_ "reads in comments and strings are not code" 0 "1 passed, 0 failed" "" \
  server/f.cc '// absl::Now() was read here once.
/* MonotonicNs() in a block comment */
const char* kWhy = "absl::Now() in a string";
int G() { return 0; }'

case_ "a file entry allows the file" 0 "1 passed, 0 failed" "server/g.cc  pure measurement: a latency stamp" \
  server/g.cc 'uint64_t Stamp() { return dmagather::common::MonotonicNs(); }'

case_ "a function entry allows that function only" 1 "server/h.cc:3: direct clock read \`MonotonicNs()\` in Job::Timeout" \
  "server/h.cc:Job::Record  pure measurement: latency" \
  server/h.cc 'void Job::Record() { hist_.Record(dmagather::common::MonotonicNs() - t0_); }
bool Job::Timeout() {
  return dmagather::common::MonotonicNs() > deadline_;
}'

case_ "a folder entry allows the folder" 0 "1 passed, 0 failed" "bench/  pure measurement: benchmarks" \
  bench/x.cc 'int main() { auto t = std::chrono::steady_clock::now(); }'

case_ "an entry without a reason fails" 1 "has no reason" "server/i.cc" \
  server/i.cc 'uint64_t Stamp() { return dmagather::common::MonotonicNs(); }'

case_ "an entry that matches no read any more fails" 1 "matches no direct clock read any more" \
  "server/j.cc:Old  pure measurement: gone" server/j.cc "$CLEAN"

echo "$passed passed, $failed failed, 0 skipped"
[ "$failed" -eq 0 ] && [ "$passed" -eq "$n" ]
