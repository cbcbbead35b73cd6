#!/usr/bin/env bash
# Copy graphs on the H200: what issuing costs per API (issue_cost), the hop
# with graphs off and on (ab_hop.sh, same build), then the whole GPU suite
# with graphs on (the default). Run from the repository root after
# `tests/gpu/run.sh stage .stage/gpu`; logs under $OUT.
set -u
out="${OUT:-/tmp/out}"; mkdir -p "$out"
cd .stage/gpu || exit 1
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/machine.log"
./bin/issue_cost --iters=2000 --ranks=2,4,8 --csv="$out/issue_cost_4k.csv" >"$out/issue_cost_4k.txt" 2>"$out/issue_cost_4k.err"
echo "issue_cost 4k rc=$?"; cat "$out/issue_cost_4k.txt"
./bin/issue_cost --iters=500 --ranks=4,8 --shard_kib=1024 --csv="$out/issue_cost_1m.csv" >"$out/issue_cost_1m.txt" 2>"$out/issue_cost_1m.err"
echo "issue_cost 1m rc=$?"; cat "$out/issue_cost_1m.txt"
OUT="$out" ./ab_hop.sh bin:DMAGATHER_CUDA_GRAPHS=0 bin | tee "$out/ab.txt"
grep -h 'copy path' "$out"/daemon_B_*_1.log | sed 's/.*copy path/copy path/' | head -3
t0=$SECONDS
OUT="$out" timeout 330 ./run.sh run >"$out/gpu_tests.log" 2>&1
echo "gpu tests: $((SECONDS - t0)) s"
grep -E "^(===|PASS|FAIL)|passed|copy path" "$out/gpu_tests.log" | sed 's/.*copy path/  copy path/' | head -40
