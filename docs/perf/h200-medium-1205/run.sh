#!/usr/bin/env bash
# Medium ops (1-64 MiB shards) and the own-shard copy on one H200, 2026-12-05
# (docs/PERFORMANCE.md, "Own shards on a copy engine" and "Medium ops").
# On the GPU machine, from the repository root, with a build staged by
# `tools/nvidia/first_contact.sh stage DIR`:
#
#   docs/perf/h200-medium-1205/run.sh DIR own     # zero-copy fp32: batch call vs plain copies; bf16 too
#   docs/perf/h200-medium-1205/run.sh DIR diag    # 4 MiB x 4 ranks: the graph-lanes tail, one setting at a time
#   docs/perf/h200-medium-1205/run.sh DIR sweep   # issue cost, 1-64 MiB x 2-8 ranks, lanes 0 vs 4
#   docs/perf/h200-medium-1205/run.sh DIR chain       # the trainers with copy chains up to 64 MiB
#   docs/perf/h200-medium-1205/run.sh DIR chainsweep  # issue cost, 1-64 MiB x 2-8 ranks, batch vs chain
#   docs/perf/h200-medium-1205/run.sh DIR sole        # the sole-stream chain rule off vs on (the change)
#   docs/perf/h200-medium-1205/run.sh DIR onestream   # fanned-out ops: default vs one stream, all chained
#   docs/perf/h200-medium-1205/run.sh DIR trainone    # the trainers, one stream per device, all chained
#   docs/perf/h200-medium-1205/run.sh DIR traindefault  # the same trainers, the daemon's defaults
#   docs/perf/h200-medium-1205/run.sh DIR mps         # the 2 ms step: lanes 4, and fanned-out chains, without vs with MPS
#   docs/perf/h200-medium-1205/run.sh DIR suite       # the GPU suite (tests/gpu/run.sh)
#
# Several parts in one call: run.sh DIR "own diag sweep". Everything goes to
# $OUT/res.tgz (the device tool brings back few files).
set -u
fc="$(cd "${1:?staged DIR}" && pwd)"
parts="${2:?own diag sweep suite}"
here="$(cd "$(dirname "$0")" && pwd)"
res="$(mktemp -d)/res"
mkdir -p "$res"
pack() { tar czf "${OUT:-/tmp}/res.tgz" -C "$(dirname "$res")" res; }
trap pack EXIT
lanes() { local n="$1"; shift; echo "bin:DMAGATHER_CUDA_GRAPH_LANES=$n${*:+ $*}"; }
for part in $parts; do
  t0=$SECONDS
  case "$part" in
    own)
      OUT="$res/own" timeout -k 5 330 "$here/../h200-zero-copy-1204/run.sh" "$fc" ownshard ;;
    diag)
      # Each pair: lanes 4 against lanes 4 with one thing changed (first: lanes 0).
      n=0
      for b in "$(lanes 0)" "$(lanes 4 CUDA_DEVICE_MAX_CONNECTIONS=32)" "$(lanes 4 --streams=1)" \
          "$(lanes 4 --max_waits_ahead=1)" "$(lanes 4 --parallel_issue=false)" \
          "$(lanes 0 DMAGATHER_CUDA_GRAPH_MAX_KIB=65536)"; do
        n=$((n + 1))
        OUT="$res/diag$n" AB_SHAPES="${DIAG_SHAPES:-4m_r4}" AB_TRACE=1 timeout -k 5 120 "$fc/ab_hop.sh" "$(lanes 4)" "$b"
      done ;;
    sweep)
      OUT="$res/sweep" AB_TRACE=1 AB_SHAPES="${SWEEP_SHAPES:-1m_r2 1m_r4 1m_r8 4m_r2 4m_r4 4m_r8 16m_r2 16m_r4 16m_r8 64m_r4 64m_r8}" \
        timeout -k 5 "${SWEEP_S:-300}" "$fc/ab_hop.sh" "$(lanes 0)" "$(lanes 4)" ;;
    chain)  # the trainers with copy calls of chunks up to 64 MiB replayed as one chain
      OUT="$res/chain" timeout -k 5 200 "$here/../h200-zero-copy-1204/run.sh" "$fc" chain ;;
    chainsweep)  # issue cost and end to end: batch (chain cap 1 MiB) vs one chain up to 64 MiB
      OUT="$res/chainsweep" AB_TRACE=1 AB_SHAPES="${SWEEP_SHAPES:-1m_r2 1m_r4 1m_r8 4m_r2 4m_r4 4m_r8 16m_r2 16m_r4 16m_r8 64m_r4 64m_r8}" \
        timeout -k 5 "${SWEEP_S:-300}" "$fc/ab_hop.sh" "$(lanes 0)" "$(lanes 0 DMAGATHER_CUDA_GRAPH_MAX_KIB=65536)" ;;
    sole)  # the sole-stream chain rule: off (DMAGATHER_CUDA_GRAPH_SOLE_MAX_KIB=0) vs the default
      OUT="$res/sole" AB_TRACE=1 AB_SHAPES="${SOLE_SHAPES:-1m_r2 1m_r8 4m_r2 4m_r4 4m_r8 16m_r2 16m_r4 64m_r4}" \
        timeout -k 5 "${SWEEP_S:-300}" "$fc/ab_hop.sh" "$(lanes 0 DMAGATHER_CUDA_GRAPH_SOLE_MAX_KIB=0)" "$(lanes 0)" ;;
    onestream)  # ops that fan out: the default vs one stream per device with every call one chain
      OUT="$res/onestream" AB_TRACE=1 AB_SHAPES="${ONE_SHAPES:-4m_r8 16m_r4 16m_r8 64m_r4}" \
        timeout -k 5 "${SWEEP_S:-300}" "$fc/ab_hop.sh" "$(lanes 0)" "$(lanes 0 --streams=1 DMAGATHER_CUDA_GRAPH_MAX_KIB=65536)" ;;
    mps)  # is the 2 ms step the GPU's time-slice between processes? The same arm without vs with MPS
      OUT="$res/mps1" AB_TRACE=1 AB_SHAPES="4m_r4" timeout -k 5 100 "$fc/ab_hop.sh" "$(lanes 4)" "$(lanes 4 mps)"
      OUT="$res/mps2" AB_TRACE=1 AB_SHAPES="4m_r8 16m_r4" timeout -k 5 150 "$fc/ab_hop.sh" \
        "$(lanes 0 DMAGATHER_CUDA_GRAPH_MAX_KIB=65536)" "$(lanes 0 DMAGATHER_CUDA_GRAPH_MAX_KIB=65536 mps)" ;;
    trainone)  # the trainers with --streams=1 and chains up to 64 MiB
      OUT="$res/trainone" timeout -k 5 200 "$here/../h200-zero-copy-1204/run.sh" "$fc" onestream ;;
    traindefault)  # the same trainers with the daemon's defaults (trainone's baseline)
      OUT="$res/traindefault" timeout -k 5 200 "$here/../h200-zero-copy-1204/run.sh" "$fc" default ;;
    suite)
      OUT="$res/suite" timeout -k 5 400 "$fc/run.sh" run >"$res/suite.log" 2>&1
      tail -n 30 "$res/suite.log" ;;
    *) echo "unknown part $part (own diag sweep chain chainsweep sole onestream mps trainone traindefault suite)" >&2; exit 2 ;;
  esac
  echo "== part $part: $((SECONDS - t0)) s"
done 2>&1 | tee "$res/all.log"
