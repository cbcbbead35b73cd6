#!/usr/bin/env bash
# The trainer tests: real DeepSpeed ZeRO-3 and FSDP2 runs on CPU (gloo, the
# daemon's host backend), with and without DMAGATHER_ALLGATHER=1, and the
# start-up hook itself, on the oldest and on the newest torch dmagather
# supports (tools/install_venv.sh oldest|newest: one pinned venv each). Builds
# the library, daemon and dmagatherctl once, runs tests/trainers/*_test.py with
# each venv's python and ends with `N passed, N failed` (`, N skipped` added
# when something was skipped) over both.
# Arguments: test module names (default all; launchers_test on the newest
# torch only: it tests the launchers, not torch).
# DMAGATHER_TRAINER_TORCH=oldest|newest runs one venv only (default: both).
# DMAGATHER_KEEP_LOGS=1 keeps each run's output under /tmp/dmagather-*.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$SECONDS
if ! nice -n 10 bazel build //client:libdmagather.so //server:dmagatherd //tools:dmagatherctl; then
  echo "0 passed, 1 failed"
  exit 1
fi
bin=$(bazel info bazel-bin 2>/dev/null)
# restart_test.py replaces the daemon once by another build of it: the one
# tools/check_no_cuda_build.sh made without the GPU toolkits, where it ran
# before (tools/test.sh runs it first); else the test says it had none.
other=$(bazel info --repo_env=DMAGATHER_CUDA_PATH=/nonexistent --repo_env=DMAGATHER_HIP_PATH=/nonexistent \
  --platform_suffix=-nocuda bazel-bin 2>/dev/null)/server/dmagatherd
if [ -x "$other" ] && ! cmp -s "$other" "$bin/server/dmagatherd"; then export DMAGATHER_OTHER_DAEMON="$other"; fi
# The launchers launchers_test.py runs (pdsh, SLURM): installed where missing.
# Its classes need root for their network namespaces, and are skipped
# without it, so only root installs.
if [ "$(id -u)" -eq 0 ] && ! tools/install_deps.sh --launchers; then
  echo "0 passed, 1 failed"
  exit 1
fi
passed=0 failed=0 skipped=0 rc=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for which in ${DMAGATHER_TRAINER_TORCH:-oldest newest}; do
  t1=$SECONDS
  # Shown as it goes (a cold venv takes minutes), then read back.
  tools/install_venv.sh "$which" | tee "$log"
  venv=$(sed -n 's/^venv: //p' "$log")
  if [ -z "$venv" ] || [ ! -x "$venv/bin/python" ]; then
    echo "== trainers ($which torch): the venv could not be made"
    failed=$((failed + 1)) rc=1
    continue
  fi
  echo "== trainers ($which torch): venv ready after $((SECONDS - t1)) s"
  # The launchers (how DMAGATHER_ALLGATHER=1 reaches the ranks) do not
  # depend on torch's version: they run on the newest only.
  names=("$@")
  if [ ${#names[@]} -eq 0 ] && [ "$which" = oldest ]; then
    for f in tests/trainers/*_test.py; do
      n=$(basename "$f" .py)
      [ "$n" != launchers_test ] && names+=("$n")
    done
  fi
  DMAGATHER_BIN=$bin nice -n 10 "$venv/bin/python" tests/trainers/run_tests.py "${names[@]}" 2>&1 | tee "$log"
  sub_rc=${PIPESTATUS[0]}
  read -r p f s < <(sed -nE 's/^([0-9]+) passed, ([0-9]+) failed(, ([0-9]+) skipped)?$/\1 \2 \4/p' "$log" | tail -1)
  passed=$((passed + ${p:-0})) failed=$((failed + ${f:-1})) skipped=$((skipped + ${s:-0}))
  if [ "$sub_rc" -ne 0 ]; then
    rc=1
    [ "${f:-1}" -eq 0 ] && failed=$((failed + 1))
  fi
  echo "== trainers ($which torch): $((SECONDS - t1)) s"
done
echo "== trainers: $((SECONDS - t0)) s in all"
echo "$passed passed, $failed failed$([ "$skipped" -gt 0 ] && echo ", $skipped skipped")"
exit $rc
