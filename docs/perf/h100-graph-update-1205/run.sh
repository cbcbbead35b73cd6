#!/usr/bin/env bash
# Copy graphs updated in place (docs/PERFORMANCE.md, "Medium ops: a graph per
# shape, updated in place"). On the GPU machine, from the repository root,
# with a build staged by `tools/nvidia/first_contact.sh stage DIR`:
#
#   docs/perf/h100-graph-update-1205/run.sh DIR cost    # bench/gpu/issue_cost at 1 MiB: batch, build, update
#   docs/perf/h100-graph-update-1205/run.sh DIR train   # FSDP2 trainers, each arm in $ARMS, $ROUNDS rounds
#   docs/perf/h100-graph-update-1205/run.sh DIR suite   # the GPU suite (tests/gpu/run.sh)
#
# An arm is LABEL:SETTINGS, settings as words joined by commas (NAME=VALUE for
# the daemon's environment, --flag for its command line). Everything goes to
# $OUT/res.tgz.
set -u
fc="$(cd "${1:?staged DIR}" && pwd)"
parts="${2:?cost train suite}"
here="$(cd "$(dirname "$0")" && pwd)"
res="$(mktemp -d)/res"
mkdir -p "$res"
pack() { tar czf "${OUT:-/tmp}/res.tgz" -C "$(dirname "$res")" res; }
trap pack EXIT
export LD_LIBRARY_PATH="$fc/lib:${LD_LIBRARY_PATH:-}"
one="--streams=1,DMAGATHER_CUDA_GRAPH_MAX_KIB=65536"
default_arms="default:X=1 onestream_exact:$one,DMAGATHER_CUDA_GRAPH_PER_SHAPE=0 onestream:$one"
default_arms+=" lanes4_exact:DMAGATHER_CUDA_GRAPH_LANES=4,DMAGATHER_CUDA_GRAPH_PER_SHAPE=0 lanes4:DMAGATHER_CUDA_GRAPH_LANES=4"
for part in $parts; do
  t0=$SECONDS
  case "$part" in
    cost)
      timeout -k 5 120 "$fc/bin/issue_cost" --shard_kib="${COST_KIB:-1024}" --ranks=4,8 --iters=500 \
        --csv="$res/issue_cost.csv" >"$res/issue_cost.txt" 2>&1
      cat "$res/issue_cost.txt" ;;
    train)
      for round in $(seq 1 "${ROUNDS:-1}"); do
        for arm in ${ARMS:-$default_arms}; do
          OUT="$res/train" timeout -k 5 200 "$here/../h200-zero-copy-1204/run.sh" "$fc" arm \
            "${arm%%:*}_r$round" "$(tr , ' ' <<<"${arm#*:}")" "${TRAIN_PARTS:-fsdp2_hf_fp32,fsdp2_hf}"
        done
      done ;;
    suite)
      OUT="$res/suite" timeout -k 5 400 "$fc/run.sh" run >"$res/suite.log" 2>&1
      tail -n 30 "$res/suite.log" ;;
    *) echo "unknown part $part (cost train suite)" >&2; exit 2 ;;
  esac
  echo "== part $part: $((SECONDS - t0)) s"
done 2>&1 | tee "$res/all.log"
