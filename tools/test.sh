#!/usr/bin/env bash
# Runs every test that needs no GPU (unit tests with fakes, integration tests
# with a real daemon and real rank processes), then the extra checks:
# tools/check_no_cuda_build.sh (the build as on a machine without the CUDA
# toolkit: one case), tools/check_unit.sh (systemd-analyze verify of the
# unit: one case), tools/check_thread_safety.sh (every CPU target built with
# clang's -Wthread-safety -Werror: one case), tools/check_sizes.sh (product
# files and functions within their size limits: one case), tools/check_clock.sh
# (no direct clock read outside its allow-list: one case; its own test,
# //tools:check_clock_test, runs with the Bazel tests), tools/check_docs.sh
# (README.md at most 200 lines, docs/PERFORMANCE.md at most 400, every
# relative markdown link and its anchor resolves, docs/ARCHITECTURE.md's tree
# names files that exist and every server/engines/gpu/ file: three cases; its
# own test, //tools:check_docs_test, runs with the Bazel tests),
# tools/check_format.sh (the C/C++ sources as .clang-format lays them out:
# one case),
# tools/test_tsan.sh (the CPU unit tests under
# ThreadSanitizer: its cases counted), tools/test_asan.sh (every CPU test
# under ASan+UBSan: its cases counted) and tools/fuzz.sh (each libFuzzer
# target for DMAGATHER_FUZZ_SECONDS, default 15: one case per target) and
# tests/trainers/run.sh (DeepSpeed and FSDP2 from PyPI: its cases counted)
# and tests/packaging/run.sh (the Debian packages on a clean Debian 12 root,
# the DaemonSet's image: its cases counted).
# Prints one closing line `N passed, N failed, N skipped` counting test
# cases (from the JUnit XML and logs Bazel writes: tools/count_test_cases.sh).
# A skip is counted as a skip, never as a pass: GTEST_SKIP and DISABLED_
# cases, unittest and pytest skips, and a one-case script that exits 77
# (the skip status, as in Automake: tools/check_unit.sh where systemd-analyze
# cannot run). A FLAKY target's cases that failed before a retry passed
# count as failed. docs/TESTING.md says what each covers.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh || exit 1
log=$(mktemp)
stages=$(mktemp)
trap 'rm -f "$log" "$stages"' EXIT
test_started=$SECONDS
# One row a stage (name, seconds, its passed/failed/skipped), printed as a
# table before the closing line.
stage_row() { printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" "$5" >>"$stages"; }
t0=$SECONDS
bazel test //... --test_tag_filters=-gpu,-manual "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
read -r passed failed skipped < <(tools/count_test_cases.sh "$log" "$(bazel info bazel-testlogs 2>/dev/null)")
if [ "$rc" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
stage_row "bazel test //..." $((SECONDS - t0)) "$passed" "$failed" "$skipped"

# A one-case script: exit 0 passed, 77 skipped (it prints why), else failed.
run_case() {
  local name=$1 t0=$SECONDS p=0 f=0 s=0
  shift
  echo "== $name"
  "$@"
  local case_rc=$?
  case $case_rc in
    0) passed=$((passed + 1)); p=1 ;;
    77) skipped=$((skipped + 1)); s=1; echo "== $name: skipped" ;;
    *) failed=$((failed + 1)); f=1; rc=1 ;;
  esac
  stage_row "$name" $((SECONDS - t0)) "$p" "$f" "$s"
}
# The build without CUDA (own output directory; the normal tree is untouched).
run_case check_no_cuda_build tools/check_no_cuda_build.sh
# The systemd unit (exit 77 where systemd-analyze cannot run).
run_case check_unit tools/check_unit.sh "$(bazel info bazel-bin 2>/dev/null)/server/dmagatherd"

# Scripts that end with their own `N passed, N failed[, N skipped]` line:
# their counts are added. A script that printed none counts as one failure,
# or as one skip when it exited 77.
run_counted() {
  local name=$1
  shift
  echo "== $name"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$log"
  local sub_rc=${PIPESTATUS[0]}
  local sp sf ss
  read -r sp sf ss < <(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?$/\1 \2 \4/p' "$log" | tail -1)
  local np=0 nf=0 ns=0
  if [ -z "${sp:-}" ] && [ "$sub_rc" -eq 77 ]; then
    ns=1
  else
    np=${sp:-0}
    nf=${sf:-1}
    ns=${ss:-0}
    # A non-zero exit with no failed case in its line is still a failure.
    if [ "$sub_rc" -ne 0 ] && [ "$sub_rc" -ne 77 ] && [ "${sf:-1}" -eq 0 ]; then nf=$((nf + 1)); fi
  fi
  passed=$((passed + np)) failed=$((failed + nf)) skipped=$((skipped + ns))
  if [ "$sub_rc" -ne 0 ] && [ "$sub_rc" -ne 77 ]; then rc=1; fi
  echo "== $name: $((SECONDS - t0)) s"
  stage_row "$name" $((SECONDS - t0)) "$np" "$nf" "$ns"
}
# Clang's thread-safety analysis over every CPU target (one case; skipped
# where clang-14 is missing), the product files' sizes, the clock seam and
# the sources' layout (one case each), the CPU
# unit tests under ThreadSanitizer, every CPU test under ASan+UBSan, and the
# fuzz targets for a bounded time each.
run_counted check_thread_safety tools/check_thread_safety.sh
run_counted check_sizes tools/check_sizes.sh
run_counted check_knobs tools/check_knobs.sh
run_counted check_clock tools/check_clock.sh
run_counted check_docs tools/check_docs.sh
run_counted check_format tools/check_format.sh
run_counted test_tsan tools/test_tsan.sh
run_counted test_asan tools/test_asan.sh
run_counted fuzz tools/fuzz.sh -t "${DMAGATHER_FUZZ_SECONDS:-15}"
# Real DeepSpeed ZeRO-3 and FSDP2 (torch and DeepSpeed from PyPI in a pinned
# venv, tools/install_venv.sh) with and without DMAGATHER_ALLGATHER=1.
run_counted trainers tests/trainers/run.sh
# The Debian packages installed on a clean Debian 12 root (debootstrap,
# cached), a C program built with pkg-config, the daemon started as its unit
# says, python3 -m dmagather.check; the DaemonSet's OCI image.
run_counted packaging tests/packaging/run.sh

echo "== stages (seconds; passed, failed, skipped)"
{
  printf 'stage\ts\tpassed\tfailed\tskipped\n'
  cat "$stages"
  printf 'total\t%s\t%s\t%s\t%s\n' $((SECONDS - test_started)) "$passed" "$failed" "$skipped"
} | awk -F'\t' '{ printf "%-28s %6s %7s %7s %8s\n", $1, $2, $3, $4, $5 }'
echo "$passed passed, $failed failed, $skipped skipped"
exit $rc
