#!/usr/bin/env bash
# The trainer tests: real DeepSpeed ZeRO-3 and FSDP2 runs on CPU (gloo, the
# daemon's host backend), with and without DMAGATHER_ALLGATHER=1, and the
# start-up hook itself. Makes (or reuses) the pinned venv
# (tools/install_venv.sh), builds the library, daemon and dmagatherctl, runs
# tests/trainers/*_test.py with the venv's python and ends with
# `N passed, N failed` (`, N skipped` added when something was skipped).
# Arguments: test module names (default all).
# DMAGATHER_KEEP_LOGS=1 keeps each run's output under /tmp/dmagather-*.
set -uo pipefail
cd "$(dirname "$0")/../.."
t0=$SECONDS
venv=$(tools/install_venv.sh | tee /dev/stderr | sed -n 's/^venv: //p')
if [ -z "$venv" ] || [ ! -x "$venv/bin/python" ]; then
  echo "trainers: the venv could not be made"
  echo "0 passed, 1 failed"
  exit 1
fi
echo "== trainers: venv ready after $((SECONDS - t0)) s"
if ! nice -n 10 bazel build //client:libdmagather.so //server:dmagatherd //tools:dmagatherctl; then
  echo "0 passed, 1 failed"
  exit 1
fi
bin=$(bazel info bazel-bin 2>/dev/null)
DMAGATHER_BIN=$bin nice -n 10 "$venv/bin/python" tests/trainers/run_tests.py "$@"
rc=$?
echo "== trainers: $((SECONDS - t0)) s in all"
exit $rc
