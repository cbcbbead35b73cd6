#!/usr/bin/env bash
# dmagather against NCCL on every GPU of one node, in one call (issue: multi-GPU headline
# numbers). Stages like tests/gpu/run.sh, then on the GPU machine runs the GPU test suite with
# one rank per GPU and bench/gpu/multi_gpu_bench.py (correctness, busbw 1 MiB..1 GiB, GEMM
# overlap, 64 KiB latency), writing CSV/PNG/JSON under $OUT (or ./results/multi_gpu).
#
#   bench/gpu/multi_gpu.sh stage DIR     (build machine)
#   DIR/multi_gpu.sh run                 (GPU machine; NVLink multicast stays off)
set -u
here="$(cd "$(dirname "$0")" && pwd)"

stage() {
  local dir="$1" root
  root="$(cd "$here/../.." && pwd)"
  "$root/tests/gpu/run.sh" stage "$dir" || exit 1
  (cd "$root" && bazel build -c opt //tools:dmagatherctl) || exit 1
  install -m 0755 "$root/bazel-bin/tools/dmagatherctl" "$dir/bin/dmagatherctl"
  strip "$dir/bin/dmagatherctl" 2>/dev/null || true
  mkdir -p "$dir/python/dmagather"
  cp "$root"/client/python/dmagather/*.py "$dir/python/dmagather/"
  cp "$dir/bin/libdmagather.so" "$dir/python/dmagather/libdmagather.so"
  install -m 0755 "$root/bench/gpu/multi_gpu_bench.py" "$dir/multi_gpu_bench.py"
  install -m 0644 "$root/bench/gpu/multi_gpu_rs.py" "$dir/multi_gpu_rs.py"
  install -m 0755 "$here/multi_gpu.sh" "$dir/multi_gpu.sh"
}

run() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
  local out="${OUT:-$PWD/results/multi_gpu}" gpus
  mkdir -p "$out"
  # The GPUs this run may use: CUDA_VISIBLE_DEVICES honoured, MIG lines not
  # counted as GPUs (nvidia-smi -L lists every GPU and partition).
  gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
  nvidia-smi topo -m >"$out/topology.txt" 2>&1 || true
  echo "=== $gpus GPUs"
  # 1. The GPU test suite, one rank per GPU where the tests take a rank count.
  "$here/run.sh" run 2>&1 | tee "$out/gpu_tests.log"   # ranks take GPUs round-robin
  # 2-4. Against NCCL.
  local tmp; tmp="$(mktemp -d)"
  export DMAGATHER_SOCKET="$tmp/dmagatherd.sock" DMAGATHERCTL="$here/bin/dmagatherctl"
  "$here/bin/dmagatherd" --socket="$DMAGATHER_SOCKET" --backend=cuda --socket_mode=0666 >"$out/daemon_bench.log" 2>&1 &
  local dpid=$!
  for _ in $(seq 1 100); do [ -S "$DMAGATHER_SOCKET" ] && break; sleep 0.1; done
  PYTHONPATH="$here/python:${PYTHONPATH:-}" DMAGATHER_LIB="$here/python/dmagather/libdmagather.so" \
    timeout 1500 python3 "$here/multi_gpu_bench.py" --ranks="$gpus" --out="$out" ${BENCH_ARGS:-} 2>&1 |
    tee "$out/bench.log"
  "$here/bin/dmagatherctl" --socket="$DMAGATHER_SOCKET" stats >"$out/dmagatherctl_stats.txt" 2>&1
  kill -TERM "$dpid"; wait "$dpid"
}

case "${1:-}" in
  stage) stage "${2:?stage DIR}" ;;
  run) run ;;
  *) echo "usage: $0 stage DIR | run" >&2; exit 2 ;;
esac
