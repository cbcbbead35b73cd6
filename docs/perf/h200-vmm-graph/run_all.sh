#!/usr/bin/env bash
# GPU run of the VMM and graph work: probe, GPU tests, torch expandable segments.
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/machine.log"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$out/machine.log"
[ "${PROBE:-1}" = 1 ] && timeout 120 python3 .stage/probe_vmm.py > "$out/probe.log" 2>&1
GPU_TESTS="${GPU_TESTS:-vmm vmm_unshareable graph}" timeout 400 .stage/gpu/run.sh run > "$out/gpu_tests.log" 2>&1
grep -E "^(===|PASS|FAIL|  )|passed" "$out/gpu_tests.log" | grep -v "^  check" | head -60
if [ -n "${TRAINERS:-}" ]; then
  export LD_LIBRARY_PATH="$root/.stage/gpu/lib:${LD_LIBRARY_PATH:-}"
  tmp="$(mktemp -d)"; export DMAGATHER_SOCKET="$tmp/d.sock"
  .stage/gpu/bin/dmagatherd --socket="$DMAGATHER_SOCKET" --backend=cuda --socket_mode=0666 > "$out/daemon_trainers.log" 2>&1 &
  dpid=$!
  for _ in $(seq 1 100); do [ -S "$DMAGATHER_SOCKET" ] && break; sleep 0.1; done
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 PYTHONPATH=client/python \
    DMAGATHER_LIB="$root/.stage/gpu/bin/libdmagather.so" DMAGATHER_ALLGATHER=1 \
    timeout 300 python3 bench/gpu/trainers_gpu.py --out "$out/trainers" --world ${WORLD:-3} --steps 4 --parts "$TRAINERS" \
    > "$out/trainers.log" 2>&1
  tail -25 "$out/trainers.log"
  kill -TERM $dpid; wait $dpid
  tail -5 "$out/daemon_trainers.log"
fi
