#!/usr/bin/env bash
# Runs the test suites repeatedly on a fresh clone while another process
# keeps every core busy: the proof that no test depends on the machine
# being idle (docs/TESTING.md "Under load").
#
#   tools/prove_under_load.sh [CLONE_DIR]     # default: a new mktemp dir
#
# Clones this repository's HEAD into CLONE_DIR, starts `stress-ng --cpu N`
# (N = the machine's cores) for the whole run, then runs
#   bazel test //... --test_tag_filters=-gpu,-manual --runs_per_test=3
#   tools/test_tsan.sh --runs_per_test=2
#   tools/test_asan.sh --runs_per_test=2
# and prints each one's closing line and time; exits non-zero if any failed.
set -uo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
dir="${1:-$(mktemp -d /tmp/dmagather-proof-XXXXXX)}"
command -v stress-ng > /dev/null || { echo "stress-ng is not installed (apt-get install stress-ng)" >&2; exit 2; }
"$src/tools/install_deps.sh" || exit 1
git clone -q "$src" "$dir/repo" || exit 1
cd "$dir/repo" || exit 1
echo "== proof under load: $(git log --oneline -1) in $dir/repo, $(nproc) cores, stress-ng --cpu $(nproc)"
stress-ng --cpu "$(nproc)" --timeout 3h --quiet &
stress_pid=$!
trap 'kill "$stress_pid" 2>/dev/null' EXIT
rc=0
step() {
  local name=$1
  shift
  local t0=$SECONDS
  "$@" > "$dir/$name.log" 2>&1
  local r=$?
  [ "$r" -eq 0 ] || rc=1
  echo "== $name: exit $r, $((SECONDS - t0)) s: $(grep -E '^Executed|passed, [0-9]+ failed' "$dir/$name.log" | tail -1)"
}
step cpu_suite bazel test //... --test_tag_filters=-gpu,-manual --runs_per_test=3
step tsan tools/test_tsan.sh --runs_per_test=2
step asan tools/test_asan.sh --runs_per_test=2
echo "== logs in $dir"
exit $rc
