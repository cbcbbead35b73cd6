#!/usr/bin/env bash
# Skipping the device-side ready wait when the CPU already sees every flag:
# the previous build (prev/: copy graphs, no skip) against this one (bin/),
# then the whole GPU suite and the torch parts on this one. Same staging as
# run.sh; everything in $OUT/logs.tar.gz.
set -u
root="$(pwd)"
out="$(mktemp -d)"
cd .stage/gpu || exit 1
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/machine.log"
mkdir -p "$out/ab_prev_new" "$out/suite"
AB_SHAPES="4k_r4 4k_r8 1m_r4" OUT="$out/ab_prev_new" ./ab_hop.sh prev bin | tee "$out/ab_prev_new.txt"
grep -h 'ops; issue' "$out"/ab_prev_new/daemon_B_4k_r4_*.log | sed 's/.*cuda engine: //' | cut -c1-300
OUT="$out/suite" timeout 300 ./run.sh run >"$out/gpu_tests.log" 2>&1
grep -E "^(PASS|FAIL)|passed" "$out/gpu_tests.log" | tr '\n' ' '; echo
grep -o 'ready waits.*skipped: flags already seen)' "$out/gpu_tests.log" | head -3
cd "$root"
tmp="$(mktemp -d)"; export DMAGATHER_SOCKET="$tmp/d.sock"
.stage/gpu/bin/dmagatherd --socket="$DMAGATHER_SOCKET" --backend=cuda --socket_mode=0666 >"$out/daemon_trainers.log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do [ -S "$DMAGATHER_SOCKET" ] && break; sleep 0.1; done
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 PYTHONPATH=client/python \
  DMAGATHER_LIB="$root/.stage/gpu/bin/libdmagather.so" DMAGATHER_ALLGATHER=1 \
  timeout 200 python3 bench/gpu/trainers_gpu.py --out "$out/trainers" --world 4 --steps 4 \
  --parts vmm,graph,fsdp2 >"$out/trainers.log" 2>&1
tail -5 "$out/trainers.log"
kill -TERM $dpid; wait $dpid
grep -o 'ready waits.*' "$out/daemon_trainers.log" | cut -c1-400
tar -C "$out" -czf "${OUT:-/tmp}/logs.tar.gz" .
echo "total: $SECONDS s"
