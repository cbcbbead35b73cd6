#!/usr/bin/env bash
# The cuda backend's benchmark on one GPU: allgather_perf against a
# dmagatherd --backend=cuda (ranks as processes on the same GPU), without and
# with MPS. Run from a directory staged by `tests/gpu/run.sh stage DIR`:
#   DIR/cuda_bench.sh            (logs under $OUT when set, else ./results/cuda_bench)
set -u
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$PWD/results/cuda_bench}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"
export LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
# cuBLAS for the GEMM overlap test (dlopened): the toolkit's, or PyTorch's.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null); do
  [ -e "$d/libcublas.so.13" ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d" && break
done
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

run_one() {  # name, then allgather_perf flags
  local name="$1"; shift
  local tmp; tmp="$(mktemp -d)"
  export DMAGATHER_SOCKET="$tmp/d.sock"
  # DAEMON_FLAGS: more dmagatherd flags for this run (word-split).
  # shellcheck disable=SC2086
  "$here/bin/dmagatherd" --socket="$DMAGATHER_SOCKET" --backend=cuda ${DAEMON_FLAGS:-} >"$out/daemon_$name.log" 2>&1 &
  local dpid=$!
  for _ in $(seq 1 100); do [ -S "$DMAGATHER_SOCKET" ] && break; sleep 0.1; done
  echo "=== $name: allgather_perf $*"
  (cd "$tmp" && timeout 240 "$here/bin/allgather_perf" "$@" --csv="$out/results_$name.csv") 2>&1 | tee "$out/bench_$name.log"
  kill -TERM "$dpid"; wait "$dpid"
}

nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
run_one r4 --ranks=4 --sizes_mib=1,16,64,256 --iters=20 --overlap_s=3
# The daemon hop per op size: jobs with one op size each (the hop histogram is
# per job), sweeping the chunk size and the copy API.
hop_small=(--ranks=4 --check_counts=1 --sizes_mib= --latency_kib=4 --latency_iters=2000 --overlap_s=0)
hop_large=(--ranks=4 --check_counts=1 --sizes_mib= --latency_kib=65536 --latency_iters=200 --overlap_s=0)
run_one hop4k "${hop_small[@]}"
DMAGATHER_CUDA_BATCH=0 DAEMON_FLAGS=--cuda_batch=false run_one hop4k_memcpy "${hop_small[@]}"
for mib in 8 32 64; do DAEMON_FLAGS="--chunk_kib=$((mib * 1024))" run_one "hop64m_chunk$mib" "${hop_large[@]}"; done
DMAGATHER_CUDA_BATCH=0 DAEMON_FLAGS=--cuda_batch=false run_one hop64m_chunk32_memcpy "${hop_large[@]}"
run_one r8 --ranks=8 --sizes_mib=1,16,64 --iters=20 --overlap_s=0 --latency_kib=4,1024,16384
if [ "${WITH_MPS:-1}" = 1 ] && command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    sleep 1
    run_one r4_mps --ranks=4 --sizes_mib=1,16,64,256 --iters=20 --overlap_s=3
    echo quit | nvidia-cuda-mps-control
    sleep 1
  fi
fi
echo "=== engine breakdown (logged at daemon stop)"
grep -H "cuda engine:" "$out"/daemon_*.log | sed 's/.*daemon_/daemon_/'
