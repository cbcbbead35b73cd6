#!/usr/bin/env bash
# Small AllGathers on a machine with more cores than ranks (the GPU machine's
# 16 cores; the CPU backend, no GPU involved): bench/compare_cpu_small.sh with
# staged binaries (tests/gpu/run.sh stage .stage/gpu, plus bench/small_ops and
# bench/mpi_allgather copied into .stage/gpu/bin) and Debian's Open MPI 4.1
# unpacked there from .stage/cpu/ompi-root.tar.gz (files of openmpi-bin,
# libopenmpi3, openmpi-common, libpmix2, libevent, libhwloc15 at their own
# paths; no existing file is overwritten). Then the GPU suite and the 4 KiB
# hop of the same build. Everything in $OUT/logs.tar.gz.
set -u
root="$(pwd)"
out="$(mktemp -d)"
{ nproc; lscpu | grep -E 'Model name|^CPU\(s\)|Thread|Socket|NUMA node\(s\)'; uptime; } | tee "$out/machine.log"
tar -C / --skip-old-files -xzf .stage/cpu/ompi-root.tar.gz
export LD_LIBRARY_PATH="$root/.stage/gpu/lib"
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
mpirun=/usr/bin/mpirun.openmpi
"$mpirun" --version | head -1
export BIN="$root/.stage/gpu/bin" MPIRUN="$mpirun"
for spin in 0 256 4096; do
  echo "=== 4 ranks, DMAGATHER_SPIN=$spin"
  DMAGATHER_SPIN=$spin RESULTS="$out/r4_spin$spin" bench/compare_cpu_small.sh --ranks=4 --iters=500 --rounds=3 \
    2>"$out/r4_spin$spin.err" | tee "$out/r4_spin$spin.txt"
done
echo "=== 4 ranks, DMAGATHER_SPIN=4096, --ingress_spin=16384"
DMAGATHER_SPIN=4096 DAEMON_FLAGS=--ingress_spin=16384 RESULTS="$out/r4_spin4096_ing16k" \
  bench/compare_cpu_small.sh --ranks=4 --iters=500 --rounds=3 2>"$out/r4_spin4096_ing16k.err" | tee "$out/r4_spin4096_ing16k.txt"
for spin in 0 4096; do
  echo "=== 8 ranks, DMAGATHER_SPIN=$spin"
  DMAGATHER_SPIN=$spin RESULTS="$out/r8_spin$spin" bench/compare_cpu_small.sh --ranks=8 --iters=500 --rounds=3 \
    2>"$out/r8_spin$spin.err" | tee "$out/r8_spin$spin.txt"
done
tail -3 "$out"/r4_spin0.err
# The GPU side of the final build on the same machine: the whole GPU suite,
# and the 4 KiB hop with copy graphs off and on.
mkdir -p "$out/suite" "$out/ab_graphs"
(cd .stage/gpu && OUT="$out/suite" timeout 200 ./run.sh run >"$out/gpu_tests.log" 2>&1)
grep -E "^(PASS|FAIL)|passed" "$out/gpu_tests.log" | tr '\n' ' '; echo
(cd .stage/gpu && AB_SHAPES=4k_r4 OUT="$out/ab_graphs" ./ab_hop.sh bin:DMAGATHER_CUDA_GRAPHS=0 bin | tee "$out/ab_graphs.txt")
tar -C "$out" -czf "${OUT:-/tmp}/logs.tar.gz" .
echo "total: $SECONDS s"
