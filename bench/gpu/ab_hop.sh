#!/usr/bin/env bash
# A/B of the daemon hop between two arms on the same GPU, alternated twice,
# for each op shape below. Run from a directory staged by
# `tests/gpu/run.sh stage DIR` on the GPU machine; logs under $OUT.
#
#   ab_hop.sh ARM_A ARM_B
#
# An arm is DIR[:VAR=VALUE[ VAR=VALUE...]]: the dmagatherd and allgather_perf
# in DIR (bin = this build, old = a baseline copied beside it), run with those
# settings (several separated by spaces, the arm quoted). E.g.
#   ab_hop.sh old bin                            (baseline build vs this one)
#   ab_hop.sh bin:--cuda_graphs=false bin        (one build, a daemon flag off/on)
# A word of an arm that starts with -- is a dmagatherd flag
# (bin:--stay_awake_us=0), any other VAR=VALUE an environment setting
# (bin:DMAGATHER_CUDA_BATCH=0); the word mps runs that arm's daemon and ranks
# under an MPS server of its own (bin:mps). AB_SHAPES picks the shapes, SIZE_rRANKS each
# (default: 4k_r4 4k_r8 64m_r4); AB_TRACE=1 keeps rank 0's every timed
# iteration in trace_LABEL.csv (allgather_perf --latency_trace).
set -u
here="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$here/lib:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
out="${OUT:-$PWD/results/ab_hop}"
mkdir -p "$out" && out="$(cd "$out" && pwd)"

shape_flags() {  # SIZE_rRANKS: SIZE is Nk or Nm per rank shard (4k_r4, 16m_r8, ...)
  local size="${1%_r*}" ranks="${1##*_r}" kib iters
  case "$size" in
    *k) kib="${size%k}" ;;
    *m) kib=$(( ${size%m} * 1024 )) ;;
    *) echo "unknown shape $1 (SIZE_rRANKS, e.g. 4k_r4 or 16m_r8)" >&2; exit 2 ;;
  esac
  if ! [[ "$kib" =~ ^[0-9]+$ && "$ranks" =~ ^[0-9]+$ ]] || [ "$kib" -eq 0 ] || [ "$ranks" -lt 2 ]; then
    echo "unknown shape $1 (SIZE_rRANKS, e.g. 4k_r4 or 16m_r8)" >&2; exit 2
  fi
  iters=1000
  [ "$kib" -gt 1024 ] && iters=400
  [ "$kib" -gt 16384 ] && iters=200
  [ "$ranks" -gt 4 ] && iters=$(( iters / 2 ))
  echo "--ranks=$ranks --check_counts=1 --sizes_mib= --latency_kib=$kib --latency_iters=$iters --overlap_s=0"
}

one() {  # arm label shape
  local arm="$1" label="$2" shape="$3" dir envs
  dir="${arm%%:*}"
  envs=""
  [ "$dir" != "$arm" ] && envs="${arm#*:}"
  local tmp; tmp="$(mktemp -d)"
  local sock="$tmp/d.sock" word vars=() flags=() trace=() mps=0
  for word in $envs; do
    case "$word" in mps) mps=1 ;; --*) flags+=("$word") ;; *) vars+=("$word") ;; esac
  done
  if [ "$mps" = 1 ]; then  # exported for this arm's processes only
    local -x CUDA_MPS_PIPE_DIRECTORY="$tmp/mps-pipe" CUDA_MPS_LOG_DIRECTORY="$tmp/mps-log"
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d || { echo "$label: no MPS server (nvidia-cuda-mps-control -d failed)"; return; }
  fi
  [ -n "${AB_TRACE:-}" ] && trace=(--latency_trace="$out/trace_$label.csv")
  env "${vars[@]}" "$here/$dir/dmagatherd" --socket="$sock" --backend=cuda "${flags[@]}" \
    >"$out/daemon_$label.log" 2>&1 &
  local dpid=$!
  for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.1; done
  # shellcheck disable=SC2046
  (cd "$tmp" && DMAGATHER_SOCKET="$sock" timeout 180 "$here/$dir/allgather_perf" $(shape_flags "$shape") \
    "${trace[@]}") \
    >"$out/ab_$label.log" 2>&1
  kill -TERM "$dpid"; wait "$dpid"
  [ "$mps" = 1 ] && echo quit | nvidia-cuda-mps-control && sleep 1
  printf '%-28s %s | %s | %s\n' "$label" \
    "$(grep -E '^ +[0-9]+ +[0-9.]+' "$out/ab_$label.log" | tail -1 | awk '{print "e2e p50 "$2" us, p99 "$3" us"}')" \
    "$(grep -o 'issue p50 [0-9.]* us, p99 [0-9.]* us' "$out/daemon_$label.log")" \
    "$(grep -o 'copy calls (per device) p50 [0-9.]* us' "$out/daemon_$label.log")"
}

[ $# -eq 2 ] || { echo "usage: $0 ARM_A ARM_B" >&2; exit 2; }
for shape in ${AB_SHAPES:-4k_r4 4k_r8 64m_r4}; do shape_flags "$shape" >/dev/null || exit 2; done
for shape in ${AB_SHAPES:-4k_r4 4k_r8 64m_r4}; do
  for round in 1 2; do
    one "$1" "A_${shape}_$round" "$shape"
    one "$2" "B_${shape}_$round" "$shape"
  done
done
echo "A = $1, B = $2"
