#!/usr/bin/env bash
# One GPU call, from the repository root, with `tests/gpu/trainers_cuda.sh
# stage` in .carry/trainers-gpu carried:
#   1. the trainer checks on the cuda backend (4 ranks on the one GPU, the
#      machine's torch) with this tree's Python package and the daemon's
#      defaults as they now are (threads awake while a job is active; the
#      CPU gate a class of its own);
#   2. bench/gpu/pair_bw.py from local, IPC-mapped and VMM (expandable
#      segments) source memory.
# Logs to $OUT.
set -u
out="${OUT:-/tmp/out}"
kit="$(cd .carry/trainers-gpu && pwd)"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$out/gpu.txt"
DMAGATHER_FROM_CHECKOUT=1 timeout -k 5 420 "$kit/run.sh" run "$out/trainers" 4 >"$out/trainers.log" 2>&1
echo "trainers rc=$?"
grep -E "^(PASS|FAIL)|passed|failed" "$out/trainers/summary.txt" >"$out/trainers_summary.txt"
grep -E "^FAIL|passed|failed" "$out/trainers_summary.txt"
grep -rh "threads awake" "$out/trainers" 2>/dev/null | head -1 | cut -c1-300
rm -rf "$out/trainers"
timeout -k 5 150 python3 bench/gpu/pair_bw.py --mib 256 --iters 10 --memory local,ipc,vmm --csv "$out/pair_bw.csv" \
  >"$out/pair_bw.log" 2>&1
echo "pair_bw rc=$?"; grep -v "^ *[0-9]*$" "$out/pair_bw.log" | tail -n 16
