// The CPU alternative to dmagather: MPI_Allgather (in place) of Open MPI on
// the same node, timed the way allgather_perf times dmagather (an iteration
// lasts as long as its slowest rank). Prints CSV rows on rank 0.
//
//   mpirun -np 4 mpi_allgather --sizes_mib=1,16,64 --iters=20 --warmup=3
//   mpirun -np 4 mpi_allgather --sizes_kib=4,16,64 --iters=500 --warmup=20
//
// With --sizes_kib it times small ops as bench/small_ops.cc times dmagather:
// each rank fills its shard, MPI_Barrier, one timed MPI_Allgather, every
// result checked bit-exact; CSV impl,ranks,shard_KiB,p50_us,p99_us,avg_us,iters.
// --budget_mib=M (bench/multinode/ring_bench.py) bounds each size's iterations
// by output bytes, as bench/multinode/ring_ops.cc does: iterations =
// clamp(M MiB / (shard * ranks), --min_iters, --iters), warmup at most a fifth.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/mpi_args.h"
#include "tests/support/verify.h"

namespace {

using dmagather::bench::Arg;
using dmagather::bench::ParseSizes;

// Small ops: per-op latency (max over ranks), every result checked.
void RunSmall(const std::vector<size_t>& kib, int max_iters, int max_warmup, int budget_mib, int min_iters, int rank,
              int world) {
  if (rank == 0) std::printf("impl,ranks,shard_KiB,p50_us,p99_us,avg_us,iters\n");
  for (size_t k : kib) {
    const size_t shard = k << 10;
    int iters = max_iters, warmup = max_warmup;
    if (budget_mib > 0) {
      iters = std::clamp(int(budget_mib / (double(k) * world / 1024.0)), min_iters, max_iters);
      warmup = std::max(1, std::min(max_warmup, iters / 5));
    }
    std::vector<char> buf(shard * world), want(shard);
    std::vector<double> t;
    for (int it = -warmup; it < iters; ++it) {
      const uint64_t seed = k * 100000 + (it + warmup);
      dmagather::support::FillPattern(buf.data() + rank * shard, shard, seed, rank);
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, buf.data(), int(shard), MPI_BYTE, MPI_COMM_WORLD);
      double us = (MPI_Wtime() - t0) * 1e6, umax = 0;
      MPI_Reduce(&us, &umax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      for (int r = 0; r < world; ++r) {
        dmagather::support::FillPattern(want.data(), shard, seed, r);
        if (std::memcmp(buf.data() + r * shard, want.data(), shard) != 0) {
          std::fprintf(stderr, "rank %d: MPI_Allgather shard %d wrong (%zu KiB, iteration %d)\n", rank, r, k, it);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
      if (it >= 0) t.push_back(umax);
    }
    if (rank == 0) {
      double sum = 0;
      for (double x : t) sum += x;
      std::sort(t.begin(), t.end());
      std::printf("openmpi,%d,%zu,%.1f,%.1f,%.1f,%d\n", world, k, t[iters / 2],
                  t[std::min(iters - 1, iters * 99 / 100)], sum / iters, iters);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (const char* kib = Arg(argc, argv, "--sizes_kib", nullptr)) {
    RunSmall(ParseSizes(kib), std::atoi(Arg(argc, argv, "--iters", "500")),
             std::atoi(Arg(argc, argv, "--warmup", "20")), std::atoi(Arg(argc, argv, "--budget_mib", "0")),
             std::atoi(Arg(argc, argv, "--min_iters", "5")), rank, world);
    MPI_Finalize();
    return 0;
  }
  const std::vector<size_t> sizes = ParseSizes(Arg(argc, argv, "--sizes_mib", "1,16,64"));
  const int iters = std::atoi(Arg(argc, argv, "--iters", "20"));
  const int warmup = std::atoi(Arg(argc, argv, "--warmup", "3"));
  if (rank == 0) std::printf("impl,ranks,shard_MiB,data_MB,avg_ms,min_ms,max_ms,algo_BW_GBps\n");
  for (size_t mib : sizes) {
    const size_t shard = mib << 20;
    std::vector<char> buf(shard * world);
    for (size_t i = 0; i < shard; ++i) buf[rank * shard + i] = char(i * 131 + rank);
    double sum = 0, mn = 1e30, mx = 0;
    for (int it = -warmup; it < iters; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      const double t0 = MPI_Wtime();
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, buf.data(), int(shard), MPI_BYTE, MPI_COMM_WORLD);
      double t = (MPI_Wtime() - t0) * 1e3, tmax = 0;
      MPI_Reduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
      if (it < 0) continue;
      sum += tmax;
      mn = std::min(mn, tmax);
      mx = std::max(mx, tmax);
    }
    for (int r = 0; r < world; ++r) {  // The result must be right to count.
      for (size_t i = 0; i < shard; i += 4093) {
        if (buf[r * shard + i] != char(i * 131 + r)) {
          std::fprintf(stderr, "rank %d: MPI_Allgather output wrong at shard %d byte %zu\n", rank, r, i);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
    }
    if (rank == 0) {
      const double avg = sum / iters, data_mb = double(shard * world) / 1e6;
      std::printf("openmpi,%d,%zu,%.3f,%.4f,%.4f,%.4f,%.3f\n", world, mib, data_mb, avg, mn, mx, data_mb / avg);
    }
  }
  MPI_Finalize();
  return 0;
}
