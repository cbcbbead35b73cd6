#!/usr/bin/env bash
# The FSDP2 zero-copy unshard and the medium-op issue cost on one H200 (ranks
# share the GPU). On the GPU machine, from the repository root, with a build
# staged by `tools/nvidia/first_contact.sh stage DIR`:
#
#   docs/perf/h200-zero-copy-1204/run.sh DIR trainers   # bench/gpu/trainers_gpu.py fsdp2 + fsdp2_hf
#   docs/perf/h200-zero-copy-1204/run.sh DIR hop        # bench/gpu/ab_hop.sh, graph lanes 0 vs 4
#   docs/perf/h200-zero-copy-1204/run.sh DIR chain      # fsdp2_hf_fp32 + fsdp2_hf, chains up to 64 MiB
#   docs/perf/h200-zero-copy-1204/run.sh DIR onestream  # the same with --streams=1
#   docs/perf/h200-zero-copy-1204/run.sh DIR default    # the same with the daemon's defaults
#   docs/perf/h200-zero-copy-1204/run.sh DIR ownshard   # fsdp2_hf_fp32: own shards by the library's
#                                                       # batch copy (copy engine) vs DMAGATHER_CUDA_BATCH=0
#   docs/perf/h200-zero-copy-1204/run.sh DIR arm LABEL "DAEMON_ENV=1 --daemon_flag" [PARTS]
#                                                       # one arm of the trainers, named and set up as given
#
# Logs and results under $OUT.
set -u
fc="$(cd "${1:?staged DIR}" && pwd)"
what="${2:?trainers | hop}"
out="${OUT:-/tmp/zc-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$fc/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export DMAGATHER_LIB="$fc/bin/libdmagather.so" PYTHONPATH="$PWD/client/python"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv >"$out/gpu.txt" 2>&1

trainers() {  # label daemon-envs... -- trainer-envs... -- parts
  local label="$1"; shift
  local denv=() dflags=() tenv=()
  while [ "$1" != "--" ]; do
    case "$1" in --*) dflags+=("$1") ;; *) denv+=("$1") ;; esac
    shift
  done
  shift
  while [ "$1" != "--" ]; do tenv+=("$1"); shift; done; shift
  local parts="$1" sock="/tmp/zc-$label.sock"
  rm -f "$sock"
  env "${denv[@]}" "$fc/bin/dmagatherd" --socket="$sock" --backend=cuda --socket_mode=0666 "${dflags[@]}" \
    >"$out/daemon_$label.log" 2>&1 &
  local dpid=$!
  for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
  local t0=$SECONDS
  env "${tenv[@]}" DMAGATHER_SOCKET="$sock" timeout 280 python3 bench/gpu/trainers_gpu.py --out "$out/$label" \
    --world 4 --steps 6 --parts "$parts" >"$out/$label.log" 2>&1
  echo "== $label: rc=$? in $((SECONDS - t0)) s"
  kill -TERM "$dpid"; wait "$dpid"
  grep -E "PASSED|FAILED|fsdp2_hf(_fp32)? arm|^ +(reference|copyout|zerocopy)|^ +[0-9]+ x " "$out/$label.log" | head -40
  grep -o 'issue p50 [0-9.]* us, p99 [0-9.]* us' "$out/daemon_$label.log"
  grep -o 'copy calls (per device) p50 [0-9.]* us[^;]*' "$out/daemon_$label.log"
  grep -o '[0-9]* replays, [0-9]* built, [^;]*import releases' "$out/daemon_$label.log"
  grep -o 'copy calls by path: .*' "$out/daemon_$label.log"
}

case "$what" in
  trainers)
    trainers lanes0 DMAGATHER_CUDA_GRAPH_LANES=0 -- X=1 -- fsdp2,fsdp2_hf,fsdp2_hf_fp32
    trainers lanes0_vmm DMAGATHER_CUDA_GRAPH_LANES=0 -- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- fsdp2_hf
    [ -n "${TRAINERS_LANES4:-}" ] && trainers lanes4 DMAGATHER_CUDA_GRAPH_LANES=4 -- X=1 -- fsdp2_hf
    ;;
  ownshard)
    trainers own_batch DMAGATHER_CUDA_GRAPH_LANES=0 -- X=1 -- fsdp2_hf_fp32,fsdp2_hf
    trainers own_plain DMAGATHER_CUDA_GRAPH_LANES=0 -- DMAGATHER_CUDA_BATCH=0 -- fsdp2_hf_fp32
    ;;
  chain)  # copy calls of chunks up to 64 MiB replayed as one chain (the medium-op candidate)
    trainers chain64 DMAGATHER_CUDA_GRAPH_LANES=0 DMAGATHER_CUDA_GRAPH_MAX_KIB=65536 -- X=1 -- fsdp2_hf_fp32,fsdp2_hf
    ;;
  default)  # the same trainers with the daemon's defaults (the baseline of chain and onestream)
    trainers default DMAGATHER_CUDA_GRAPH_LANES=0 -- X=1 -- fsdp2_hf_fp32,fsdp2_hf
    ;;
  onestream)  # the same, every op on one stream per device (no fan-out)
    trainers onestream DMAGATHER_CUDA_GRAPH_MAX_KIB=65536 --streams=1 -- X=1 -- fsdp2_hf_fp32,fsdp2_hf
    ;;
  arm)  # the daemon's settings as words: NAME=VALUE (environment) or --flag
    read -r -a words <<<"${4:-}"
    trainers "${3:?arm LABEL}" "${words[@]}" -- X=1 -- "${5:-fsdp2_hf_fp32,fsdp2_hf}"
    ;;
  hop)
    (cd "$fc" && OUT="$out" AB_SHAPES="${AB_SHAPES:-4m_r2 4m_r4 4m_r8 16m_r4 64m_r4}" ./ab_hop.sh \
      "bin:DMAGATHER_CUDA_GRAPH_LANES=0" "bin:DMAGATHER_CUDA_GRAPH_LANES=4")
    ;;
  *) echo "usage: $0 DIR trainers|hop|ownshard|chain|onestream|default|arm" >&2; exit 2 ;;
esac
