#!/usr/bin/env bash
# Copy graphs on the H200: what issuing costs per API (issue_cost); the hop
# of the baseline build (old/) against this one (bin/), and of this build with
# copy graphs off and on (ab_hop.sh); the whole GPU suite; the torch parts
# with expandable segments (VMM imports released and re-made between steps,
# which drops the graphs built on them). Run from the repository root after
# `tests/gpu/run.sh stage .stage/gpu` (and a baseline's dmagatherd and
# allgather_perf copied into .stage/gpu/old); everything lands in
# $OUT/logs.tar.gz.
set -u
root="$(pwd)"
out="$(mktemp -d)"
cd .stage/gpu || exit 1
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/machine.log"
./bin/issue_cost --iters=2000 --ranks=2,4,8 --csv="$out/issue_cost_4k.csv" >"$out/issue_cost_4k.txt" 2>"$out/issue_cost_4k.err"
echo "issue_cost 4k rc=$?"; cat "$out/issue_cost_4k.txt"
mkdir -p "$out/ab_old_new" "$out/ab_graphs"
OUT="$out/ab_old_new" ./ab_hop.sh old bin | tee "$out/ab_old_new.txt"
OUT="$out/ab_graphs" ./ab_hop.sh bin:DMAGATHER_CUDA_GRAPHS=0 bin | tee "$out/ab_graphs.txt"
t0=$SECONDS
mkdir -p "$out/suite"
OUT="$out/suite" timeout 300 ./run.sh run >"$out/gpu_tests.log" 2>&1
echo "gpu tests: $((SECONDS - t0)) s"
grep -E "^(PASS|FAIL)|passed|copy path" "$out/gpu_tests.log" | sed 's/.*copy path/  copy path/' | tr '\n' ' ' | head -c 3000; echo
cd "$root"
tmp="$(mktemp -d)"; export DMAGATHER_SOCKET="$tmp/d.sock"
.stage/gpu/bin/dmagatherd --socket="$DMAGATHER_SOCKET" --backend=cuda --socket_mode=0666 >"$out/daemon_trainers.log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do [ -S "$DMAGATHER_SOCKET" ] && break; sleep 0.1; done
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 PYTHONPATH=client/python \
  DMAGATHER_LIB="$root/.stage/gpu/bin/libdmagather.so" DMAGATHER_ALLGATHER=1 \
  timeout $((540 - SECONDS)) python3 bench/gpu/trainers_gpu.py --out "$out/trainers" --world 4 --steps 4 \
  --parts vmm,graph,fsdp2 >"$out/trainers.log" 2>&1
tail -8 "$out/trainers.log"
kill -TERM $dpid; wait $dpid
grep -o 'copy path.*' "$out/daemon_trainers.log"
tar -C "$out" -czf "${OUT:-/tmp}/logs.tar.gz" .
echo "total: $SECONDS s"
