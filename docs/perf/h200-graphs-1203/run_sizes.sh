#!/usr/bin/env bash
# Copy graphs by size: graphs off against graphs for every chunk size
# (DMAGATHER_CUDA_GRAPH_MAX_KIB=65536) at 1, 16 and 64 MiB shards; then the
# baseline build (old/) against this one with its defaults; issue_cost at
# 1 MiB copies. Same staging as run.sh; everything in $OUT/logs.tar.gz.
set -u
out="$(mktemp -d)"
cd .stage/gpu || exit 1
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$out/machine.log"
mkdir -p "$out/ab_sizes" "$out/ab_old_new"
AB_SHAPES="1m_r4 16m_r4 64m_r4" OUT="$out/ab_sizes" ./ab_hop.sh bin:DMAGATHER_CUDA_GRAPHS=0 \
  bin:DMAGATHER_CUDA_GRAPH_MAX_KIB=65536 | tee "$out/ab_sizes.txt"
AB_SHAPES="4k_r4 4k_r8 1m_r4 64m_r4" OUT="$out/ab_old_new" ./ab_hop.sh old bin | tee "$out/ab_old_new.txt"
./bin/issue_cost --iters=500 --ranks=4,8 --shard_kib=1024 --csv="$out/issue_cost_1m.csv" >"$out/issue_cost_1m.txt" 2>"$out/issue_cost_1m.err"
echo "issue_cost 1m rc=$?"; cat "$out/issue_cost_1m.txt"
tar -C "$out" -czf "${OUT:-/tmp}/logs.tar.gz" .
echo "total: $SECONDS s"
