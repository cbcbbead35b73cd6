#!/usr/bin/env bash
# The daemon's wait-spin advice on the 16-core machine: ranks that take the
# advice (DMAGATHER_SPIN unset: 4096 polls here) against the previous default
# (DMAGATHER_SPIN=256), alternated, 4 and 8 ranks. Same staging as run.sh.
set -u
root="$(pwd)"
out="$(mktemp -d)"
{ nproc; uptime; } | tee "$out/machine.log"
tar -C / --skip-old-files -xzf .stage/cpu/ompi-root.tar.gz
export LD_LIBRARY_PATH="$root/.stage/gpu/lib" OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
export BIN="$root/.stage/gpu/bin" MPIRUN=/usr/bin/mpirun.openmpi
for ranks in 4 8; do
  for round in 1 2; do
    echo "=== $ranks ranks, round $round, DMAGATHER_SPIN=256"
    DMAGATHER_SPIN=256 RESULTS="$out/r${ranks}_old_$round" bench/compare_cpu_small.sh --ranks=$ranks --iters=500 \
      --rounds=3 --sizes_kib=4,16,64 2>/dev/null | sed -n 3,6p | tee "$out/r${ranks}_old_$round.txt"
    echo "=== $ranks ranks, round $round, the daemon's advice"
    RESULTS="$out/r${ranks}_advice_$round" bench/compare_cpu_small.sh --ranks=$ranks --iters=500 \
      --rounds=3 --sizes_kib=4,16,64 2>/dev/null | sed -n 3,6p | tee "$out/r${ranks}_advice_$round.txt"
  done
done
tar -C "$out" -czf "${OUT:-/tmp}/logs.tar.gz" .
echo "total: $SECONDS s"
