#!/bin/bash
# The stream-mode stall: repeated runs, batch copies vs one cudaMemcpyAsync per chunk;
# STALL_AHEAD="8 2": also runs with --max_waits_ahead=N (the bound on ops issued ahead of their
# ready flags, the working hypothesis in PERFORMANCE.md "First contact on two H200s").
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
one() {  # name [--daemon_flag] env...
  local name=$1; shift
  local flags=()
  while [[ "${1:-}" == --* ]]; do flags+=("$1"); shift; done
  local sock=/tmp/$name.sock
  env "$@" ./bin/dmagatherd --socket=$sock --backend=cuda --socket_mode=0666 --metrics_listen= "${flags[@]}" \
    >$OUT/$name.daemon.log 2>&1 &
  local dp=$!
  for _ in $(seq 1 200); do [ -S $sock ] && break; sleep 0.1; done
  local t0=$(date +%s.%N)
  DMAGATHER_SOCKET=$sock timeout 22 ./bin/allgather_gpu_test stream >$OUT/$name.test.log 2>&1
  local rc=$?
  local t1=$(date +%s.%N)
  local st; st=$(./bin/dmagatherctl --socket=$sock stats 2>/dev/null | awk '/^gputest/{print $4" ops, p50 "$6" us"}' | head -1)
  kill -TERM $dp; sleep 1; kill -9 $dp 2>/dev/null; wait $dp 2>/dev/null
  echo "$name: rc=$rc $(echo "$t1 - $t0" | bc) s; ${st:-job ended}; $(grep -o 'copy calls (per device) p50 [0-9.]* us, p99 [0-9.]* us' $OUT/$name.daemon.log | tail -1)"
}
for i in 1 2 3; do
  one batch$i
  one nobatch$i DMAGATHER_CUDA_BATCH=0
  for n in ${STALL_AHEAD:-}; do one ahead${n}_$i --max_waits_ahead=$n; done
done
