// Reduce-scatter on dmagather (any backend the daemon serves; the CPU
// comparison runs it on the host backend), timed the way
// bench/mpi_reduce_scatter.cc times Open MPI: W forked rank processes; per
// iteration every rank meets the others at a barrier, then times one
// dmagather_reduce_scatter (SUM; on the CPU backend complete when the call
// returns); an iteration lasts as long as its slowest rank. Every result
// (warmup and timed) is checked bit-exact against the reference of
// tests/support/reduce_reference.h, outside the timed region: the inputs
// are that file's random chunks (random bits, rounding ties, specials), the
// output is poisoned before each op.
//
// Prints CSV (and writes it to --csv):
//   impl,ranks,dtype,out_MiB,avg_ms,p50_ms,algo_BW_GBps,staging_MiB
// out_MiB: the output per rank; each rank's input is ranks x out_MiB.
// algo_BW_GBps: input bytes per rank (ranks x out bytes) / time, 1e9 B/s.
// staging_MiB: the bound $DMAGATHER_STAGING_MB sets (64 when unset); an op
// whose chunks (ranks x out) do not fit half of it moves in slices.
//
// --parts adds two rows per row, timed the same way, to see where the time
// goes: impl "alltoall" (dmagather_alltoall_async + wait: the daemon's
// copies alone, into a full-size output, no staging, no sum) and impl
// "local_sum" (common::ReduceChunks on the rank's thread over the chunks
// that all-to-all left, every rank at once: the library's sum alone, no
// daemon). Both checked too (the all-to-all bytes, the sum bit-exact).
//
//   reduce_scatter_perf --socket=PATH --ranks=4 --sizes_mib=1,4,16,64 --iters=10
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/reduce.h"
#include "dmagather/client.h"
#include "tests/support/reduce_reference.h"
#include "tests/support/verify.h"

ABSL_FLAG(std::string, socket, "", "dmagatherd socket (default: $DMAGATHER_SOCKET).");
ABSL_FLAG(int, ranks, 4, "Rank processes.");
ABSL_FLAG(std::string, sizes_mib, "1,4,16,64", "Output sizes per rank (MiB); each rank's input is ranks times that.");
ABSL_FLAG(std::string, dtypes, "bfloat16,float32", "Dtypes (SUM).");
ABSL_FLAG(int, iters, 10, "Timed iterations per row.");
ABSL_FLAG(int, warmup, 2, "Untimed iterations per row (checked too).");
ABSL_FLAG(std::string, csv, "", "Also write the CSV here ('' to skip).");
ABSL_FLAG(bool, parts, false, "Also time the all-to-all alone and the local sum alone (rows alltoall, local_sum).");

namespace {

constexpr int kMaxRanks = 16;
constexpr int kMaxIters = 500;
constexpr int kMaxRows = 48;  // With --parts: 3 per size and dtype.

struct Shared : dmagather::support::RankSync {
  double ms[kMaxRows][kMaxIters][kMaxRanks];
  std::atomic<long> checked;  // Results compared bit-exact (all ranks, all iterations).
};

struct Row {
  dmagather_dtype_t dtype;
  size_t mib;
};

std::vector<size_t> ParseList(const std::string& s) {
  std::vector<size_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    size_t v = 0;
    if (!absl::SimpleAtoi(p, &v) || v == 0) {
      std::cerr << "reduce_scatter_perf: bad size '" << p << "'\n";
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

std::vector<Row> Rows() {
  std::vector<Row> rows;
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_dtypes), ',', absl::SkipEmpty())) {
    int d = 0;
    while (d < DMAGATHER_NUM_DTYPES && name != dmagather_dtype_name(static_cast<dmagather_dtype_t>(d))) ++d;
    if (d == DMAGATHER_NUM_DTYPES) {
      std::cerr << "reduce_scatter_perf: unknown dtype '" << name << "'\n";
      std::exit(2);
    }
    for (size_t mib : ParseList(absl::GetFlag(FLAGS_sizes_mib))) {
      rows.push_back(Row{static_cast<dmagather_dtype_t>(d), mib});
    }
  }
  return rows;
}

// The library's bound on staging (client/reduce_scatter.cc reads the same
// variable the same way), for the CSV.
long StagingMiB() {
  const char* v = std::getenv("DMAGATHER_STAGING_MB");
  const long mb = v != nullptr ? std::atol(v) : 0;
  return mb >= 1 ? mb : 64;
}

// Chunk `chunk` of rank `src`'s send in row `row`: the same on every rank,
// so a rank rebuilds the chunks the others send it.
std::vector<unsigned char> Chunk(size_t row, int src, int chunk, dmagather_dtype_t dtype, size_t count) {
  const uint64_t seed = 0x5eed0000ull + row * 10007 + uint64_t(src) * 131 + uint64_t(chunk);
  return dmagather::support::RandomChunks(seed, dtype, count);
}

// Fills this rank's send (world chunks) and returns what its recv must hold:
// the reference sum of chunk `rank` of every rank's send, in rank order.
// *in_out gets those chunks (what an all-to-all leaves this rank).
std::vector<unsigned char> Prepare(size_t row, int rank, int world, dmagather_dtype_t dtype, size_t count, char* send,
                                   std::vector<unsigned char>* in_out) {
  const size_t bytes = count * dmagather_dtype_size(dtype);
  for (int c = 0; c < world; ++c) {
    const std::vector<unsigned char> v = Chunk(row, rank, c, dtype, count);
    std::memcpy(send + c * bytes, v.data(), bytes);
  }
  std::vector<unsigned char> in(bytes * world), want(bytes);
  for (int s = 0; s < world; ++s) {
    if (s == rank) {
      std::memcpy(in.data() + s * bytes, send + rank * bytes, bytes);
    } else {
      const std::vector<unsigned char> v = Chunk(row, s, rank, dtype, count);
      std::memcpy(in.data() + s * bytes, v.data(), bytes);
    }
  }
  dmagather::support::Reference(in.data(), world, count, dtype, dmagather::common::kRedopSum, want.data());
  *in_out = std::move(in);
  return want;
}

// Warmup and timed iterations of `op` (slot `slot` of the times): poison
// `out`, barrier, time op, compare `out` with `want`. False after a failure.
bool Loop(Shared* sh, int rank, int world, size_t slot, const std::string& what, int iters, int warmup, char* out,
          const std::vector<unsigned char>& want, const std::function<std::string()>& op) {
  for (int it = -warmup; it < iters; ++it) {
    std::memset(out, 0x5a, want.size());  // Poison: a stale or missing result cannot pass.
    sh->Barrier(world);
    const auto t0 = std::chrono::steady_clock::now();
    const std::string err = op();
    const auto t1 = std::chrono::steady_clock::now();
    if (!err.empty()) {
      sh->Fail(absl::StrFormat("rank %d: %s iteration %d: %s", rank, what, it, err));
      return false;
    }
    if (std::memcmp(out, want.data(), want.size()) != 0) {
      size_t i = 0;
      while (i < want.size() && static_cast<unsigned char>(out[i]) == want[i]) ++i;
      sh->Fail(absl::StrFormat("rank %d: %s iteration %d: result differs from the reference at byte %zu", rank, what,
                               it, i));
      return false;
    }
    sh->checked++;
    if (it >= 0) sh->ms[slot][it][rank] = std::chrono::duration<double, std::milli>(t1 - t0).count();
  }
  return true;
}

// One row: the reduce-scatter; with a2a (--parts) then the all-to-all alone
// into a2a and the local sum alone over what it left (slots row + n, row + 2n).
bool RunRow(dmagather::Comm& comm, Shared* sh, size_t row, size_t n, const Row& r, char* send, char* recv, char* a2a,
            int iters, int warmup) {
  const int rank = comm.rank(), world = comm.size();
  const size_t bytes = r.mib << 20, count = bytes / dmagather_dtype_size(r.dtype);
  std::vector<unsigned char> in;
  const std::vector<unsigned char> want = Prepare(row, rank, world, r.dtype, count, send, &in);
  const std::string what = absl::StrFormat("%s %zu MiB", dmagather_dtype_name(r.dtype), r.mib);
  auto status = [&](dmagather_status_t st) {
    return st == DMAGATHER_OK ? std::string() : absl::StrCat(dmagather_status_string(st), ": ", comm.error());
  };
  if (!Loop(sh, rank, world, row, "reduce-scatter " + what, iters, warmup, recv, want,
            [&] { return status(comm.ReduceScatter(send, recv, count, r.dtype, DMAGATHER_SUM)); })) {
    return false;
  }
  if (a2a == nullptr) return true;
  if (!Loop(sh, rank, world, row + n, "all-to-all " + what, iters, warmup, a2a, in,
            [&] { return status(comm.AllToAll(send, a2a, count, r.dtype)); })) {
    return false;
  }
  std::memcpy(a2a, in.data(), in.size());  // What an all-to-all leaves, as the library sums it.
  const void* chunks[kMaxRanks];
  for (int k = 0; k < world; ++k) chunks[k] = k == rank ? send + k * bytes : a2a + k * bytes;
  return Loop(sh, rank, world, row + 2 * n, "local sum " + what, iters, warmup, recv, want, [&] {
    dmagather::common::ReduceChunks(chunks, world, count, r.dtype, dmagather::common::kRedopSum, recv);
    return std::string();
  });
}
int RunRank(int rank, int world, const std::string& job, const std::vector<Row>& rows, int iters, int warmup,
            Shared* sh) {
  const std::string sock = absl::GetFlag(FLAGS_socket);
  dmagather::Comm comm(sock.empty() ? nullptr : sock.c_str(), job, world, rank);
  if (!comm.ok()) {
    sh->Fail("init: " + comm.error());
    return 1;
  }
  size_t max_mib = 0;
  for (const Row& r : rows) max_mib = std::max(max_mib, r.mib);
  char* send = static_cast<char*>(comm.Alloc((max_mib << 20) * world));
  char* recv = static_cast<char*>(comm.Alloc(max_mib << 20));
  const bool parts = absl::GetFlag(FLAGS_parts);
  char* a2a = parts ? static_cast<char*>(comm.Alloc((max_mib << 20) * world)) : nullptr;
  if (send == nullptr || recv == nullptr || (parts && a2a == nullptr)) {
    sh->Fail(absl::StrFormat("rank %d: alloc: %s", rank, comm.error()));
    return 1;
  }
  if (rank == 0 && comm.backend() != "host") {
    std::cerr << "reduce_scatter_perf: note: backend " << comm.backend() << " (the CPU comparison wants host)\n";
  }
  for (size_t row = 0; row < rows.size(); ++row) {
    if (!RunRow(comm, sh, row, rows.size(), rows[row], send, recv, a2a, iters, warmup)) return 1;
  }
  return 0;
}

// Per iteration the slowest rank's time; avg and p50 of those.
std::string CsvRow(const Shared* sh, const char* impl, size_t slot, const Row& r, int world, int iters) {
  std::vector<double> t(iters, 0.0);
  for (int it = 0; it < iters; ++it) {
    for (int k = 0; k < world; ++k) t[it] = std::max(t[it], sh->ms[slot][it][k]);
  }
  double sum = 0;
  for (double x : t) sum += x;
  std::sort(t.begin(), t.end());
  const double avg = sum / iters;
  const double p50 = iters % 2 == 1 ? t[iters / 2] : (t[iters / 2 - 1] + t[iters / 2]) / 2;
  const double in_bytes = double(r.mib << 20) * world;
  return absl::StrFormat("%s,%d,%s,%zu,%.3f,%.3f,%.3f,%ld\n", impl, world, dmagather_dtype_name(r.dtype), r.mib, avg,
                         p50, in_bytes / 1e9 / (avg / 1e3), StagingMiB());
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "reduce_scatter_perf --socket=PATH [--ranks=4] [--sizes_mib=1,4,16,64] [--iters=10]: reduce-scatter timing");
  absl::ParseCommandLine(argc, argv);
  const int world = absl::GetFlag(FLAGS_ranks);
  const int iters = absl::GetFlag(FLAGS_iters), warmup = absl::GetFlag(FLAGS_warmup);
  const std::vector<Row> rows = Rows();
  if (world < 1 || world > kMaxRanks || rows.empty() || rows.size() * 3 > size_t(kMaxRows) || iters < 1 ||
      iters > kMaxIters || warmup < 0) {
    std::cerr << "reduce_scatter_perf: ranks 1.." << kMaxRanks << ", 1.." << kMaxRows / 3 << " rows, iters 1.."
              << kMaxIters << "\n";
    return 2;
  }
  auto* sh =
      static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) return 1;
  const std::string job = absl::StrFormat("rs-perf-%d", getpid());
  const int bad =
      dmagather::support::ForkRanks(world, [&](int r) { return RunRank(r, world, job, rows, iters, warmup, sh); });
  if (bad != 0 || sh->failures.load() != 0) {
    std::cerr << "reduce_scatter_perf: FAILED: " << sh->why << "\n";
    return 1;
  }
  std::string csv = "impl,ranks,dtype,out_MiB,avg_ms,p50_ms,algo_BW_GBps,staging_MiB\n";
  const size_t n = rows.size();
  for (size_t row = 0; row < n; ++row) csv += CsvRow(sh, "dmagather", row, rows[row], world, iters);
  if (absl::GetFlag(FLAGS_parts)) {
    for (size_t row = 0; row < n; ++row) csv += CsvRow(sh, "alltoall", row + n, rows[row], world, iters);
    for (size_t row = 0; row < n; ++row) csv += CsvRow(sh, "local_sum", row + 2 * n, rows[row], world, iters);
  }
  std::fputs(csv.c_str(), stdout);
  std::cerr << "reduce_scatter_perf: " << sh->checked.load() << " results checked bit-exact against the reference\n";
  if (const std::string path = absl::GetFlag(FLAGS_csv); !path.empty()) std::ofstream(path) << csv;
  return 0;
}
