#!/bin/bash
# The ring's commit, A/B: BEFORE (a checkout of 0b779cf, e.g. `git worktree add ../before 0b779cf`)
# and AFTER (this tree), alternated, 3 pairs; each run writes OUT/s2_{A,B}N.csv. Needs root.
#
#   docs/perf/multinode-commit-1207/run_ab.sh BEFORE AFTER OUT
set -euo pipefail
before=$(cd "$1" && pwd) after=$(cd "$2" && pwd) out=$(mkdir -p "$3" && cd "$3" && pwd)
args="--nodes=2,4 --sizes_kib=64,1024,16384 --rounds=1 --multi_rank= --chunk_sweep= --iperf_seconds=1"
for round in 1 2 3; do
  for side in A B; do
    dir=$after; [ $side = A ] && dir=$before
    echo "== $side$round $(date +%T) $(uptime)"
    (cd "$dir" && bench/multinode/ring_bench.sh $args --out="$out/s2_$side$round") > "$out/s2_$side$round.log" 2>&1
  done
done
