#!/usr/bin/env bash
# One GPU call, from the repository root, with `tests/gpu/run.sh stage
# .carry/gpu33` carried:
#   1. the handshake's cost with tiny copies: bench/gpu/ab_hop.sh, done flags
#      published by the CPU (DMAGATHER_CUDA_DONE_ON_DEVICE=0) against written
#      by the GPU (the default), 4 KiB x 2 and x 4 ranks, alternated twice;
#   2. the GPU suite (every mode, per-rank visibility, 3 daemons) with lanes
#      per job, device-written done and the table-driven test;
#   3. the stream mode (300 ops queued ahead of late ready flags) REPEATS
#      more times per arm (defaults; done by the CPU), each with fresh daemons;
#   4. bench/gpu/pair_bw.py from local and IPC-mapped memory.
# Logs to $OUT. Ranks share the one GPU: a harness for correctness and for
# the CPU's part of the hop, not a one-rank-per-GPU figure.
set -u
fc="$(cd "${1:-.carry/gpu33}" && pwd)"
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
t0=$SECONDS
AB_SHAPES="4k_r2 4k_r4" OUT="$out/ab" timeout -k 5 170 "$fc/ab_hop.sh" "bin:DMAGATHER_CUDA_DONE_ON_DEVICE=0" bin \
  >"$out/ab.log" 2>&1
echo "ab_hop rc=$? ($((SECONDS - t0)) s)"
tail -n 25 "$out/ab.log"
t0=$SECONDS
OUT="$out/suite" timeout -k 5 300 "$fc/run.sh" run >"$out/suite.log" 2>&1
echo "suite rc=$? ($((SECONDS - t0)) s)"
grep -E "^=== |passed, |FAILED|issue watch" "$out/suite.log" | tail -45
for arm in defaults cpu_done; do
  ok=0 bad=0
  for i in $(seq 1 "${REPEATS:-4}"); do
    # Leave the call's last minutes to pair_bw and the logs.
    [ "$SECONDS" -lt "${STREAM_UNTIL_S:-430}" ] || { echo "stream repeats ($arm): stopped at $i, out of time"; break; }
    e=(); [ "$arm" = cpu_done ] && e=(DMAGATHER_CUDA_DONE_ON_DEVICE=0)
    mkdir -p "$out/stream_${arm}_$i"
    if env "${e[@]}" GPU_TESTS=stream GPU_VISIBILITY_TESTS=stream GPU_MULTINODE_TESTS=stream \
        OUT="$out/stream_${arm}_$i" timeout -k 5 60 "$fc/run.sh" run >"$out/stream_${arm}_$i.log" 2>&1; then
      ok=$((ok + 1))
    else
      bad=$((bad + 1))
    fi
  done
  echo "stream repeats ($arm): $ok passed, $bad failed or stalled"
done
grep -h "done flags\|issue watch" "$out"/suite/daemon_tests.log 2>/dev/null | head -5
# pair_bw.py from local and from IPC-mapped memory (one GPU: the same-device copy, to exercise it).
timeout -k 5 120 python3 bench/gpu/pair_bw.py --mib 256 --iters 10 --csv "$out/pair_bw.csv" >"$out/pair_bw.log" 2>&1
echo "pair_bw rc=$?"; tail -n 12 "$out/pair_bw.log"
tar czf "$out/logs.tgz" -C "$out" . --exclude=logs.tgz 2>/dev/null
