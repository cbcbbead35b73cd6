#!/bin/bash
# Diagnose the stream-mode hang on 2 GPUs: variants, backtraces while hung.
cd "$(dirname "$0")"
export LD_LIBRARY_PATH=$PWD/lib NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CG=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
echo "cuda-gdb: $CG"
diag() {
  local name=$1 mode=$2; shift 2
  local sock=/tmp/$name.sock
  env $ENVS ./bin/dmagatherd --socket=$sock --backend=cuda --socket_mode=0666 --metrics_listen= "$@" >$OUT/$name.daemon.log 2>&1 &
  local dp=$!
  for _ in $(seq 1 200); do [ -S $sock ] && break; sleep 0.1; done
  local t0=$SECONDS
  DMAGATHER_SOCKET=$sock timeout ${T:-45} ./bin/allgather_gpu_test $mode >$OUT/$name.test.log 2>&1 &
  local tp=$!
  for _ in $(seq 1 $(( ${T:-45} - 8 ))); do kill -0 $tp 2>/dev/null || break; sleep 1; done
  if kill -0 $tp 2>/dev/null; then
    echo "$name: still running after $((SECONDS - t0)) s; backtraces"
    ./bin/dmagatherctl --socket=$sock stats >$OUT/$name.stats.txt 2>&1
    timeout 60 $CG -p $dp -batch -ex "set pagination off" -ex "thread apply all bt 25" >$OUT/$name.bt.txt 2>&1
    nvidia-smi >$OUT/$name.smi.txt 2>&1
  fi
  wait $tp; echo "$name ($mode $* $ENVS): rc=$? in $((SECONDS - t0)) s; $(tail -n 2 $OUT/$name.test.log | tr '\n' ' ')"
  kill -TERM $dp; sleep 2; kill -9 $dp 2>/dev/null; wait $dp 2>/dev/null
}
diag default stream
diag serial_issue stream --parallel_issue=false
ENVS=DMAGATHER_CUDA_GRAPHS=0 diag nographs stream
diag streams1 stream --streams=1
T=30 diag dtypes dtypes
grep -h "is dmagatherd's device\|WARNING\|ERROR\|peer\|device [0-9]:" $OUT/default.daemon.log | head -20
