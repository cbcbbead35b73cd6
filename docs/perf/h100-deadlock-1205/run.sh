#!/usr/bin/env bash
# The GPU suite with the issue path that cannot deadlock as the default (one
# device lock order, lockstep across devices, --max_waits_ahead=2), on the one
# GPU lent, from the repository root, with a build staged by
# `tests/gpu/run.sh stage .carry/gpu33` carried:
#   1. the whole suite (tests/gpu/run.sh run: every mode, per-rank visibility,
#      3 daemons on one GPU);
#   2. the `stream` mode (300 ops queued ahead of late ready flags) REPEATS
#      more times, each with a fresh daemon: stalls out of REPEATS.
# Logs to $OUT.
set -u
fc="$(cd "${1:-.carry/gpu33}" && pwd)"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
OUT="$out/suite" timeout -k 5 400 "$fc/run.sh" run >"$out/suite.log" 2>&1
echo "suite rc=$?"
grep -E "^=== |passed, " "$out/suite.log" | tail -40
ok=0 bad=0
for i in $(seq 1 "${REPEATS:-10}"); do
  if GPU_TESTS=stream GPU_VISIBILITY_TESTS=stream GPU_MULTINODE_TESTS=stream OUT="$out/stream$i" \
      timeout -k 5 120 "$fc/run.sh" run >"$out/stream$i.log" 2>&1; then ok=$((ok + 1)); else bad=$((bad + 1)); fi
done
echo "stream repeats: $ok passed, $bad failed or stalled (of ${REPEATS:-10})"
tar czf "$out/logs.tgz" -C "$out" . --exclude=logs.tgz 2>/dev/null
