#!/usr/bin/env bash
# Final GPU run: the whole GPU suite (single node incl. vmm and graph, then
# several daemons on the one GPU with the ring between them), then the torch
# parts with expandable segments.
set -u
root="$(pwd)"; out="${OUT:-/tmp/out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/machine.log"
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a "$out/machine.log"
t0=$SECONDS
timeout 330 .stage/gpu/run.sh run > "$out/gpu_tests.log" 2>&1
echo "gpu tests: $((SECONDS - t0)) s"
grep -E "^(===|PASS|FAIL)|passed|ring:|^gputest" "$out/gpu_tests.log" | head -60
export LD_LIBRARY_PATH="$root/.stage/gpu/lib:${LD_LIBRARY_PATH:-}"
tmp="$(mktemp -d)"; export DMAGATHER_SOCKET="$tmp/d.sock"
.stage/gpu/bin/dmagatherd --socket="$DMAGATHER_SOCKET" --backend=cuda --socket_mode=0666 > "$out/daemon_trainers.log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do [ -S "$DMAGATHER_SOCKET" ] && break; sleep 0.1; done
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 PYTHONPATH=client/python \
  DMAGATHER_LIB="$root/.stage/gpu/bin/libdmagather.so" DMAGATHER_ALLGATHER=1 \
  timeout $((450 - SECONDS)) python3 bench/gpu/trainers_gpu.py --out "$out/trainers" --world 4 --steps 4 \
  --parts vmm,graph,fsdp2 > "$out/trainers.log" 2>&1
tail -25 "$out/trainers.log"
kill -TERM $dpid; wait $dpid
tail -5 "$out/daemon_trainers.log"
echo "total: $SECONDS s"
