#!/usr/bin/env bash
# check_thread_safety.sh: builds every CPU target (//... less those tagged
# cuda, gpu or manual) with clang-14 under --config=tsa (.bazelrc):
# -Wthread-safety checks the ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED /
# ABSL_LOCKS_EXCLUDED annotations on absl::Mutex-guarded state, and -Werror
# makes any warning fail the build. Then checks that the build's output has
# no `warning:` line. Own output directory (-tsa); the normal tree is left as
# it was. Ends with one line `N passed, N failed, N skipped` (one case):
# skipped, with the reason, where clang-14 is not installed.
#
#   tools/check_thread_safety.sh [extra bazel build flags]
set -uo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-14 >/dev/null; then
  echo "check_thread_safety: SKIPPED: clang-14 is not installed (tools/install_deps.sh installs it)"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$SECONDS
bazel build --config=tsa --keep_going "$@" //... 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
warnings=$(grep -cE '(warning|error): ' "$log")
if [ "$rc" -ne 0 ] || [ "$warnings" -ne 0 ]; then
  echo "check_thread_safety: FAILED: bazel exit $rc, $warnings compiler warning/error line(s) (above)"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
echo "check_thread_safety: OK in $((SECONDS - start)) s (clang-14 -Wthread-safety -Werror, 0 warnings)"
echo "1 passed, 0 failed, 0 skipped"
