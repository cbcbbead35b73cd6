// The CPU alternative to dmagather's reduce-scatter: Open MPI's
// MPI_Reduce_scatter_block (MPI_FLOAT, MPI_SUM) on the same node, timed the
// way bench/reduce_scatter_perf.cc times dmagather: per iteration every rank
// meets the others at MPI_Barrier, then times one op; an iteration lasts as
// long as its slowest rank (MPI_MAX of the ranks' times). fp32 only: MPI has
// no bfloat16 datatype.
//
// Every result (warmup and timed) is checked exactly, outside the timed
// region: the inputs are small integers held in floats, so every sum is
// exact whatever order Open MPI's algorithm adds in; the output is
// poisoned before each op. Prints CSV on rank 0, the columns of
// reduce_scatter_perf (staging_MiB empty: not applicable):
//   impl,ranks,dtype,out_MiB,avg_ms,p50_ms,algo_BW_GBps,staging_MiB
// algo_BW_GBps: input bytes per rank (ranks x out bytes) / time, 1e9 B/s.
//
//   mpirun -np 4 mpi_reduce_scatter --sizes_mib=1,4,16,64 --iters=10 --warmup=2
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/mpi_args.h"

namespace {

using dmagather::bench::Arg;
using dmagather::bench::ParseSizes;

// Element i of chunk c of rank r's send: an integer below 256 / world, so a
// sum over the ranks stays an exact float (and bfloat16, in the gloo twin).
float Value(size_t i, int c, int r, int world) {
  return float((i * 7 + size_t(c) * 13 + size_t(r) * 31) % (256 / world));
}

// One size: warmup + iters ops, every result checked; rank 0 prints its row.
void RunSize(size_t mib, int iters, int warmup, int rank, int world) {
  const size_t count = (mib << 20) / sizeof(float);
  std::vector<float> send(count * world), recv(count), want(count, 0.0f);
  for (int c = 0; c < world; ++c) {
    for (size_t i = 0; i < count; ++i) send[c * count + i] = Value(i, c, rank, world);
  }
  for (int s = 0; s < world; ++s) {
    for (size_t i = 0; i < count; ++i) want[i] += Value(i, rank, s, world);
  }
  std::vector<double> t;
  for (int it = -warmup; it < iters; ++it) {
    std::fill(recv.begin(), recv.end(), -1.0f);  // Poison: a stale result cannot pass.
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = MPI_Wtime();
    MPI_Reduce_scatter_block(send.data(), recv.data(), int(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double ms = (MPI_Wtime() - t0) * 1e3, ms_max = 0;
    MPI_Reduce(&ms, &ms_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (std::memcmp(recv.data(), want.data(), count * sizeof(float)) != 0) {
      std::fprintf(stderr, "rank %d: MPI_Reduce_scatter_block wrong (%zu MiB, iteration %d)\n", rank, mib, it);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (it >= 0) t.push_back(ms_max);
  }
  if (rank != 0) return;
  double sum = 0;
  for (double x : t) sum += x;
  std::sort(t.begin(), t.end());
  const double avg = sum / iters;
  const double p50 = iters % 2 == 1 ? t[iters / 2] : (t[iters / 2 - 1] + t[iters / 2]) / 2;
  const double in_bytes = double(mib << 20) * world;
  std::printf("openmpi,%d,float32,%zu,%.3f,%.3f,%.3f,\n", world, mib, avg, p50, in_bytes / 1e9 / (avg / 1e3));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  const std::vector<size_t> sizes = ParseSizes(Arg(argc, argv, "--sizes_mib", "1,4,16,64"));
  const int iters = std::max(1, std::atoi(Arg(argc, argv, "--iters", "10")));
  const int warmup = std::max(0, std::atoi(Arg(argc, argv, "--warmup", "2")));
  if (world > 256) MPI_Abort(MPI_COMM_WORLD, 2);
  if (rank == 0) std::printf("impl,ranks,dtype,out_MiB,avg_ms,p50_ms,algo_BW_GBps,staging_MiB\n");
  for (size_t mib : sizes) RunSize(mib, iters, warmup, rank, world);
  MPI_Finalize();
  return 0;
}
