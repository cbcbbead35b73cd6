// AllGathers of a multi-node dmagather job, timed the way
// bench/mpi_allgather.cc times Open MPI (--sizes_kib): per iteration every
// rank fills its shard, meets the others at a barrier, then times one
// in-place AllGather + wait; an iteration lasts as long as its slowest rank;
// every result is checked bit-exact (outside the timed region).
//
// One process starts every rank of the job: rank r runs on node
// r / ranks_per_node, i.e. it talks to that node's daemon (--sockets) and,
// with --netns, first enters that node's network namespace. The barrier is
// in shared memory (the namespaces share this machine's memory), so it adds
// no traffic to the links being measured and no skew of its own.
//
// Each size is its own job (its own job id and key PREFIX-SIZE_KIB), so
// the daemons' per-job telemetry (`dmagatherctl stats`: ring busy time,
// chunk latency) belongs to one size. Prints CSV:
//   impl,nodes,ranks,shard_KiB,p50_us,p99_us,avg_us,min_us,iters,job_key
//
//   ring_ops --sockets=/tmp/x/n0.sock,/tmp/x/n1.sock --netns=ns0,ns1 --ranks_per_node=1 \
//            --sizes_kib=64,1024,65536 --iters=50 --budget_mib=1024 --key=run1
#include <fcntl.h>
#include <sched.h>
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
#include "dmagather/dmagather.h"
#include "tests/support/verify.h"

ABSL_FLAG(std::string, sockets, "", "Comma-separated dmagatherd sockets, one per node (node order).");
ABSL_FLAG(std::string, netns, "", "Comma-separated network namespaces, one per node (empty: stay here).");
ABSL_FLAG(int, ranks_per_node, 1, "Rank processes per node.");
ABSL_FLAG(std::string, sizes_kib, "64,1024,16384", "Shard sizes per rank (KiB).");
ABSL_FLAG(int, iters, 50, "Timed iterations per size (at most).");
ABSL_FLAG(int, min_iters, 5, "Timed iterations per size (at least).");
ABSL_FLAG(int, budget_mib, 1024, "Output bytes per rank per size (MiB) that bound the iterations.");
ABSL_FLAG(int, warmup, 5, "Untimed iterations per size (at most; a fifth of the timed ones).");
ABSL_FLAG(std::string, key, "ringops", "Job key prefix.");

namespace {

constexpr int kMaxRanks = 32;
constexpr int kMaxIters = 2000;
constexpr int kMaxSizes = 16;

struct Shared : dmagather::support::RankSync {
  char job_ids[kMaxSizes][DMAGATHER_JOB_ID_MAX];
  double us[kMaxSizes][kMaxIters][kMaxRanks];
};

int ItersFor(size_t kib, int world) {
  const double out_mib = double(kib) * world / 1024.0;
  int n = int(absl::GetFlag(FLAGS_budget_mib) / out_mib);
  return std::clamp(n, absl::GetFlag(FLAGS_min_iters), std::min(absl::GetFlag(FLAGS_iters), kMaxIters));
}

int WarmupFor(int iters) { return std::max(1, std::min(absl::GetFlag(FLAGS_warmup), iters / 5)); }

int RunRank(int rank, int world, int rpn, const std::vector<std::string>& sockets,
            const std::vector<std::string>& netns, const std::vector<size_t>& kib, Shared* sh) {
  const int node = rank / rpn;
  if (!netns.empty()) {
    const std::string path = "/var/run/netns/" + netns[node];
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      sh->Fail(absl::StrFormat("rank %d: cannot enter %s: %s", rank, path, strerror(errno)));
      return 1;
    }
    close(fd);
  }
  const size_t max_shard = *std::max_element(kib.begin(), kib.end()) << 10;
  std::vector<char> want(max_shard);
  for (size_t s = 0; s < kib.size(); ++s) {
    const size_t shard = kib[s] << 10;
    const int iters = ItersFor(kib[s], world), warmup = WarmupFor(iters);
    dmagather_config_t cfg = DMAGATHER_CONFIG_INITIALIZER;
    cfg.socket_path = sockets[node].c_str();
    cfg.job_id = sh->job_ids[s];
    cfg.local_rank = rank % rpn;
    cfg.local_world_size = rpn;
    cfg.join_timeout_ms = 60000;
    const std::string key = absl::StrFormat("%s-%u", absl::GetFlag(FLAGS_key), kib[s]);
    dmagather_comm_t comm = nullptr;
    if (dmagather_comm_init_config(key.c_str(), world, rank, &cfg, &comm) != DMAGATHER_OK) {
      sh->Fail(absl::StrFormat("rank %d: join %s: %s", rank, key, dmagather_last_error(nullptr)));
      return 1;
    }
    char* buf = nullptr;
    if (dmagather_alloc(comm, shard * world, reinterpret_cast<void**>(&buf)) != DMAGATHER_OK) {
      sh->Fail(absl::StrFormat("rank %d: alloc: %s", rank, dmagather_last_error(comm)));
      return 1;
    }
    for (int it = -warmup; it < iters; ++it) {
      const uint64_t seed = s * 100000 + (it + warmup);
      dmagather::support::FillPattern(buf + rank * shard, shard, seed, rank);
      sh->Barrier(world);
      if (sh->failures.load() != 0) return 1;
      const auto t0 = std::chrono::steady_clock::now();
      dmagather_status_t st = dmagather_allgather(comm, buf + rank * shard, buf, shard, DMAGATHER_UINT8, nullptr);
      if (st == DMAGATHER_OK) st = dmagather_wait(comm);
      const auto t1 = std::chrono::steady_clock::now();
      if (st != DMAGATHER_OK) {
        sh->Fail(absl::StrFormat("rank %d: %s: %s", rank, dmagather_status_string(st), dmagather_last_error(comm)));
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
    dmagather_free(comm, buf);
    if (dmagather_comm_destroy(comm) != DMAGATHER_OK) {
      sh->Fail(absl::StrFormat("rank %d: close %s: %s", rank, key, dmagather_last_error(nullptr)));
      return 1;
    }
    sh->Barrier(world);  // Every rank left this job before the next one starts.
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("ring_ops --sockets=S0,S1,... [--netns=NS0,NS1,...]: multi-node AllGather times");
  absl::ParseCommandLine(argc, argv);
  const std::vector<std::string> sockets = absl::StrSplit(absl::GetFlag(FLAGS_sockets), ',', absl::SkipEmpty());
  const std::vector<std::string> netns = absl::StrSplit(absl::GetFlag(FLAGS_netns), ',', absl::SkipEmpty());
  const int rpn = absl::GetFlag(FLAGS_ranks_per_node);
  const int nodes = int(sockets.size()), world = nodes * rpn;
  std::vector<size_t> kib;
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_sizes_kib), ',', absl::SkipEmpty())) {
    kib.push_back(std::stoul(std::string(p)));
  }
  if (nodes < 1 || rpn < 1 || world > kMaxRanks || kib.empty() || kib.size() > kMaxSizes ||
      (!netns.empty() && netns.size() != sockets.size())) {
    std::cerr << "ring_ops: 1.." << kMaxRanks << " ranks, 1.." << kMaxSizes
              << " sizes, one namespace per socket (or none)\n";
    return 2;
  }
  auto* sh =
      static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) return 1;
  // Rank 0's daemon coordinates every job. The ids come from a child of
  // their own: gRPC (which the library speaks) must not have run in a
  // process that forks ranks afterwards (its threads do not survive fork:
  // a rank's first connection can then hang).
  if (pid_t pid = fork(); pid == 0) {
    for (size_t s = 0; s < kib.size(); ++s) {
      if (dmagather_job_id_create(sockets[0].c_str(), sh->job_ids[s], DMAGATHER_JOB_ID_MAX) != DMAGATHER_OK) {
        std::cerr << "ring_ops: job id: " << dmagather_last_error(nullptr) << "\n";
        _exit(1);
      }
    }
    _exit(0);
  } else {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;
  }
  const int bad =
      dmagather::support::ForkRanks(world, [&](int r) { return RunRank(r, world, rpn, sockets, netns, kib, sh); });
  if (bad != 0 || sh->failures.load() != 0) {
    std::cerr << "ring_ops: FAILED: " << sh->why << "\n";
    return 1;
  }
  std::printf("impl,nodes,ranks,shard_KiB,p50_us,p99_us,avg_us,min_us,iters,job_key\n");
  for (size_t s = 0; s < kib.size(); ++s) {
    const int iters = ItersFor(kib[s], world);
    std::vector<double> t(iters);
    for (int it = 0; it < iters; ++it) {
      t[it] = 0;
      for (int r = 0; r < world; ++r) t[it] = std::max(t[it], sh->us[s][it][r]);
    }
    double sum = 0;
    for (double x : t) sum += x;
    std::sort(t.begin(), t.end());
    std::printf("dmagather,%d,%d,%zu,%.1f,%.1f,%.1f,%.1f,%d,%s-%zu\n", nodes, world, kib[s], t[iters / 2],
                t[std::min(iters - 1, iters * 99 / 100)], sum / iters, t[0], iters, absl::GetFlag(FLAGS_key).c_str(),
                kib[s]);
  }
  return 0;
}
