// Small AllGathers on dmagather, timed the way bench/mpi_allgather.cc times
// Open MPI with --sizes_kib: W rank processes; per iteration every rank
// fills its shard, meets the others at a barrier, then times one in-place
// AllGather + wait; an iteration lasts as long as its slowest rank; every
// result is checked bit-exact (outside the timed region). Prints CSV:
//   impl,ranks,shard_KiB,p50_us,p99_us,avg_us,iters
//
//   small_ops --socket=PATH --ranks=4 --sizes_kib=4,16,64,256,1024 --iters=500
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "dmagather/client.h"
#include "tests/support/verify.h"

ABSL_FLAG(std::string, socket, "", "dmagatherd socket (default: $DMAGATHER_SOCKET).");
ABSL_FLAG(int, ranks, 4, "Rank processes.");
ABSL_FLAG(std::string, sizes_kib, "4,16,64,256,1024", "Shard sizes per rank (KiB).");
ABSL_FLAG(int, iters, 500, "Timed iterations per size.");
ABSL_FLAG(int, warmup, 20, "Untimed iterations per size.");

namespace {

constexpr int kMaxRanks = 16;
constexpr int kMaxIters = 5000;
constexpr int kMaxSizes = 16;

struct Shared : dmagather::support::RankSync {
  double us[kMaxSizes][kMaxIters][kMaxRanks];
};

int RunRank(int rank, int world, const std::string& job, const std::vector<size_t>& kib, int iters, int warmup,
            Shared* sh) {
  const std::string sock = absl::GetFlag(FLAGS_socket);
  dmagather::Comm comm(sock.empty() ? nullptr : sock.c_str(), job, world, rank);
  if (!comm.ok()) {
    sh->Fail("init: " + comm.error());
    return 1;
  }
  const size_t max_shard = *std::max_element(kib.begin(), kib.end()) << 10;
  char* buf = static_cast<char*>(comm.Alloc(max_shard * world));
  if (buf == nullptr) {
    sh->Fail("alloc: " + comm.error());
    return 1;
  }
  std::vector<char> want(max_shard);
  for (size_t s = 0; s < kib.size(); ++s) {
    const size_t shard = kib[s] << 10;
    for (int it = -warmup; it < iters; ++it) {
      const uint64_t seed = s * 100000 + (it + warmup);
      dmagather::support::FillPattern(buf + rank * shard, shard, seed, rank);
      sh->Barrier(world);
      const auto t0 = std::chrono::steady_clock::now();
      dmagather_status_t st = comm.AllGather(buf + rank * shard, buf, shard, DMAGATHER_UINT8);
      if (st == DMAGATHER_OK) st = comm.Wait();
      const auto t1 = std::chrono::steady_clock::now();
      if (st != DMAGATHER_OK) {
        sh->Fail(absl::StrFormat("rank %d: %s: %s", rank, dmagather_status_string(st), comm.error()));
        return 1;
      }
      // Every result is checked.
      if (const int r = dmagather::support::FirstWrongShard(buf, shard, world, seed, want.data()); r >= 0) {
        sh->Fail(absl::StrFormat("rank %d: shard %d wrong at %u KiB iteration %d", rank, r, kib[s], it));
        return 1;
      }
      if (it >= 0) sh->us[s][it][rank] = std::chrono::duration<double, std::micro>(t1 - t0).count();
      sh->Barrier(world);  // Nobody refills its shard while another still checks.
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("small_ops --socket=PATH [--ranks=4] [--sizes_kib=...]: small AllGather latency");
  absl::ParseCommandLine(argc, argv);
  const int world = absl::GetFlag(FLAGS_ranks);
  const int iters = std::min(absl::GetFlag(FLAGS_iters), kMaxIters);
  const int warmup = absl::GetFlag(FLAGS_warmup);
  std::vector<size_t> kib;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_sizes_kib), ',', absl::SkipEmpty())) {
    kib.push_back(std::stoul(std::string(p)));
  }
  if (world < 1 || world > kMaxRanks || kib.empty() || kib.size() > kMaxSizes || iters < 1) {
    std::cerr << "small_ops: ranks 1.." << kMaxRanks << ", 1.." << kMaxSizes << " sizes, iters >= 1\n";
    return 2;
  }
  auto* sh =
      static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) return 1;
  const std::string job = absl::StrFormat("small-%d", getpid());
  const int bad =
      dmagather::support::ForkRanks(world, [&](int r) { return RunRank(r, world, job, kib, iters, warmup, sh); });
  if (bad != 0 || sh->failures.load() != 0) {
    std::cerr << "small_ops: FAILED: " << sh->why << "\n";
    return 1;
  }
  std::printf("impl,ranks,shard_KiB,p50_us,p99_us,avg_us,iters\n");
  for (size_t s = 0; s < kib.size(); ++s) {
    std::vector<double> t(iters);
    for (int it = 0; it < iters; ++it) {
      t[it] = 0;
      for (int r = 0; r < world; ++r) t[it] = std::max(t[it], sh->us[s][it][r]);
    }
    double sum = 0;
    for (double x : t) sum += x;
    std::sort(t.begin(), t.end());
    std::printf("dmagather,%d,%zu,%.1f,%.1f,%.1f,%d\n", world, kib[s], t[iters / 2],
                t[std::min(iters - 1, iters * 99 / 100)], sum / iters, iters);
  }
  return 0;
}
