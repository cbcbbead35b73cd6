#!/usr/bin/env bash
# One GPU call, from the repository root, with `tests/gpu/trainers_cuda.sh
# stage` in .carry/trainers-gpu and bench/gpu/connections/build carried:
#   1. bench/gpu/connections/run.sh: does a done-wait parked on one stream hold
#      up a rank's GEMMs (CUDA_DEVICE_MAX_CONNECTIONS unset, 1, 32);
#   2. the trainer checks on the cuda backend (tests/gpu/trainers_cuda.sh run,
#      4 ranks on the one GPU), with this tree's Python package (torch of the
#      machine; HSDP arms included).
# Logs and tables go to $OUT.
set -u
out="${OUT:-/tmp/out}"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$out/gpu.txt"
timeout -k 5 150 bench/gpu/connections/run.sh 2>&1 | tail -40
echo "connections rc=$?"
DMAGATHER_FROM_CHECKOUT=1 timeout -k 5 420 .carry/trainers-gpu/run.sh run "$out/trainers" 4 >"$out/trainers.log" 2>&1
echo "trainers rc=$?"
grep -E "^(PASS|FAIL)|passed|failed" "$out/trainers/summary.txt" | tail -60
tar czf "$out/trainers.tgz" -C "$out" trainers --exclude='*.bin' 2>/dev/null
rm -rf "$out/trainers"
