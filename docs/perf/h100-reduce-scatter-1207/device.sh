#!/usr/bin/env bash
# One device call: the kernel test after the refactor, the multi-GPU bench's
# reduce-scatter parts (2 ranks sharing the GPU, gloo, the wheel's daemon),
# then the wheel's check and the trainers with the reduce-scatter.
here="$(cd "$(dirname "$0")" && pwd)"
out="${OUT:-$here/out}"; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt"
"$here/reduce_gpu_test" > "$out/reduce_gpu_test.log" 2>&1; tail -1 "$out/reduce_gpu_test.log"
python3 -m pip install --quiet --no-index --no-deps --target /tmp/dmw "$here"/wheels/dmagather-*.whl
export PYTHONPATH=/tmp/dmw NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
/tmp/dmw/bin/dmagatherd --socket=/tmp/mg.sock --backend=cuda --log_level=warning --metrics_listen= > "$out/mg_daemon.log" 2>&1 &
dp=$!; sleep 2
mkdir -p /tmp/mgb && cp "$here"/multi_gpu_*.py /tmp/mgb/ && (cd /tmp/mgb && timeout 150 python3 multi_gpu_bench.py --socket=/tmp/mg.sock --ranks 2 --parts rs_correct --correct_max_mib 4 \
  --out "$out/mg" --job mg) > "$out/mg.log" 2>&1; echo "mg rc=$?"; grep -iE "correct|PASS|FAIL|Error" "$out/mg.log" | tail -5
kill $dp; wait $dp 2>/dev/null; unset PYTHONPATH
timeout 420 "$here/run.sh" rs "$out/rs" 4 > "$out/rs.log" 2>&1; echo "rs rc=$?"
grep -E "PASS|FAIL|passed" "$out/rs/summary.txt" 2>/dev/null | cut -c1-220
