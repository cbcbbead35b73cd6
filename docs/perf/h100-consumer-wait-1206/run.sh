#!/usr/bin/env bash
# One GPU call, from the repository root, with `tests/gpu/trainers_cuda.sh
# stage` in .carry/trainers-gpu carried:
#   1. bench/gpu/consumer_wait.py: a rank's GEMMs beside a gather it does not
#      consume yet, the done-wait at submit against at the consumer, with
#      CUDA_DEVICE_MAX_CONNECTIONS unset and 1 (2 ranks on the one GPU);
#      and the daemon's counts of done flags the GPU wrote;
#   2. the trainer checks on the cuda backend (tests/gpu/trainers_cuda.sh run,
#      4 ranks on the one GPU) with this tree's Python package, and FSDP2 and
#      ZeRO-3 once more with CUDA_DEVICE_MAX_CONNECTIONS=1.
# Logs and tables go to $OUT.
set -u
out="${OUT:-/tmp/out}"
kit="$(cd .carry/trainers-gpu && pwd)"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$out/gpu.txt"
export LD_LIBRARY_PATH="$kit/lib:${LD_LIBRARY_PATH:-}"
sock="$(mktemp -d)/d.sock"
"$kit/bin/dmagatherd" --socket="$sock" --backend=cuda --log_level=warning --metrics_listen= >"$out/dmagatherd.log" 2>&1 &
dpid=$!
for _ in $(seq 100); do [ -S "$sock" ] && break; sleep 0.1; done
for c in unset 1; do
  if [ "$c" = unset ]; then e=(env -u CUDA_DEVICE_MAX_CONNECTIONS); else e=(env CUDA_DEVICE_MAX_CONNECTIONS="$c"); fi
  "${e[@]}" DMAGATHER_SOCKET="$sock" PYTHONPATH="$kit/python" DMAGATHER_LIB="$kit/bin/libdmagather.so" \
    timeout -k 5 150 python3 -m torch.distributed.run --nproc_per_node 2 bench/gpu/consumer_wait.py --reps 3 \
    >"$out/consumer_wait_$c.log" 2>&1
  echo "consumer_wait connections=$c rc=$?"
  grep '^{' "$out/consumer_wait_$c.log"
done
# The ops' done flags: written by the GPU (device_done_ops) and seen there
# before the CPU came to publish them (done_before_cpu).
"$kit/bin/dmagatherctl" --socket="$sock" --json stats >"$out/consumer_wait_stats.json" 2>&1
python3 - "$out/consumer_wait_stats.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for j in d.get("jobs", []):
    print("job", j.get("jobKey", j.get("job_key")), "ops", j.get("ops"), "device_done_ops",
          j.get("deviceDoneOps", j.get("device_done_ops")), "done_before_cpu", j.get("doneBeforeCpu", j.get("done_before_cpu")))
PY
kill "$dpid"; wait "$dpid" 2>/dev/null
DMAGATHER_FROM_CHECKOUT=1 timeout -k 5 330 "$kit/run.sh" run "$out/trainers" 4 >"$out/trainers.log" 2>&1
echo "trainers rc=$?"
grep -E "^(PASS|FAIL)|passed|failed" "$out/trainers/summary.txt" | tail -60
tar czf "$out/trainers.tgz" -C "$out" trainers --exclude='*.bin' 2>/dev/null
rm -rf "$out/trainers"
