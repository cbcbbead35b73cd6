// dmagather-perf: the main job. Starts N rank processes (or runs one rank
// under an external launcher), checks AllGather bit-exact for every dtype
// against a locally computed reference, then times it and prints the
// results table (and writes it as CSV).
//
//   allgather_perf --socket=/tmp/x/dmagatherd.sock --ranks=4
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/verify.h"
#include "dmagather/client.h"

ABSL_FLAG(std::string, socket, "", "dmagatherd socket (default: $DMAGATHER_SOCKET, then /run/dmagather/dmagatherd.sock).");
ABSL_FLAG(int, ranks, 4, "Rank processes to start (ignored with --rank).");
ABSL_FLAG(int, rank, -1, "Run only this rank (external launcher); needs --world and --job.");
ABSL_FLAG(int, world, 0, "World size with --rank.");
ABSL_FLAG(std::string, job, "", "Job key (default: perf-<pid>).");
ABSL_FLAG(std::string, check_counts, "1,3,4095,1048583", "Element counts per rank for the correctness checks.");
ABSL_FLAG(std::string, sizes_mib, "1,16,64", "Shard sizes per rank (MiB) for the bandwidth table.");
ABSL_FLAG(std::string, bw_dtypes, "float32,bfloat16", "Dtypes timed in the bandwidth table.");
ABSL_FLAG(int, iters, 20, "Timed iterations per bandwidth row.");
ABSL_FLAG(int, warmup, 3, "Untimed iterations before each bandwidth row.");
ABSL_FLAG(std::string, csv, "allgather_results.csv", "Where to write the bandwidth table as CSV ('' to skip).");

namespace {

using dmagather::bench::CheckAllGather;
using dmagather::bench::FillPattern;
using dmagather::bench::Variant;

constexpr int kMaxRanks = 64;
constexpr int kMaxRows = 64;
constexpr int kMaxIters = 1000;

struct Shared {  // MAP_SHARED between the launcher and its rank processes.
  char backend[32];
  char version[32];
  int check_failed[DMAGATHER_NUM_DTYPES];
  int check_ran[DMAGATHER_NUM_DTYPES];
  char first_failure[512];
  double iter_ms[kMaxRows][kMaxIters][kMaxRanks];
  std::atomic<int> rank_errors;
};

struct Row {
  dmagather_dtype_t dtype;
  size_t count;
};

dmagather_dtype_t ParseDtype(const std::string& s) {
  for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
    if (s == dmagather_dtype_name(static_cast<dmagather_dtype_t>(d))) return static_cast<dmagather_dtype_t>(d);
  }
  std::cerr << "unknown dtype '" << s << "'\n";
  std::exit(2);
}

std::vector<size_t> ParseList(const std::string& s) {
  std::vector<size_t> out;
  for (absl::string_view p : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    size_t v = 0;
    if (!absl::SimpleAtoi(p, &v)) {
      std::cerr << "bad number '" << p << "'\n";
      std::exit(2);
    }
    out.push_back(v);
  }
  return out;
}

std::vector<Row> BandwidthRows() {
  std::vector<Row> rows;
  for (absl::string_view dt : absl::StrSplit(absl::GetFlag(FLAGS_bw_dtypes), ',', absl::SkipEmpty())) {
    dmagather_dtype_t d = ParseDtype(std::string(dt));
    for (size_t mib : ParseList(absl::GetFlag(FLAGS_sizes_mib))) {
      rows.push_back(Row{d, (mib << 20) / dmagather_dtype_size(d)});
    }
  }
  if (rows.size() > kMaxRows) rows.resize(kMaxRows);
  return rows;
}

void Fail(Shared* sh, int dtype, const std::string& what) {
  if (sh->check_failed[dtype]++ == 0 && sh->first_failure[0] == '\0') {
    snprintf(sh->first_failure, sizeof(sh->first_failure), "%s", what.c_str());
  }
}

int RunRank(int rank, int world, const std::string& job, Shared* sh) {
  dmagather::Comm comm(absl::GetFlag(FLAGS_socket).empty() ? nullptr : absl::GetFlag(FLAGS_socket).c_str(), job,
                       world, rank);
  if (!comm.ok()) {
    std::cerr << "rank " << rank << ": " << dmagather_status_string(comm.init_status()) << ": " << comm.error()
              << "\n";
    return 3;
  }
  if (rank == 0) {
    snprintf(sh->backend, sizeof(sh->backend), "%s", comm.backend().c_str());
    snprintf(sh->version, sizeof(sh->version), "%s", dmagather_version());
  }
  const std::vector<size_t> counts = ParseList(absl::GetFlag(FLAGS_check_counts));
  const std::vector<Row> rows = BandwidthRows();
  size_t max_shard = 0;
  for (size_t c : counts) max_shard = std::max(max_shard, c * 8);
  for (const Row& r : rows) max_shard = std::max(max_shard, r.count * dmagather_dtype_size(r.dtype));
  const size_t slack = 8192;
  char* sendbuf = static_cast<char*>(comm.Alloc(max_shard + slack));
  char* recvbuf = static_cast<char*>(comm.Alloc(max_shard * world + slack));
  if (sendbuf == nullptr || recvbuf == nullptr) {
    std::cerr << "rank " << rank << ": alloc: " << comm.error() << "\n";
    return 3;
  }

  // --- Correctness ---
  std::vector<char> expect;
  uint64_t seed = 0x5eed;
  for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
    for (size_t count : counts) {
      for (Variant variant : dmagather::bench::kAllVariants) {
        std::string why;
        ++seed;
        if (rank == 0) sh->check_ran[d]++;
        if (!CheckAllGather(comm, sendbuf, recvbuf, static_cast<dmagather_dtype_t>(d), count, variant, seed, &expect,
                            &why)) {
          Fail(sh, d, why);
        }
      }
    }
  }

  // --- Bandwidth ---
  const int iters = std::min(absl::GetFlag(FLAGS_iters), kMaxIters);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& row = rows[i];
    const size_t shard = row.count * dmagather_dtype_size(row.dtype);
    FillPattern(recvbuf + rank * shard, shard, seed + i, rank);
    char* send = recvbuf + rank * shard;  // In place, as ZeRO-3/FSDP2 lay it out.
    for (int it = -absl::GetFlag(FLAGS_warmup); it < iters; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      dmagather_status_t st = comm.AllGather(send, recvbuf, row.count, row.dtype);
      if (st == DMAGATHER_OK) st = comm.Wait();
      auto t1 = std::chrono::steady_clock::now();
      if (st != DMAGATHER_OK) {
        std::cerr << "rank " << rank << ": " << dmagather_status_string(st) << ": " << comm.error() << "\n";
        sh->rank_errors++;
        return 4;
      }
      if (it >= 0) sh->iter_ms[i][it][rank] = std::chrono::duration<double, std::milli>(t1 - t0).count();
    }
  }
  comm.Free(sendbuf);
  comm.Free(recvbuf);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("allgather_perf [--ranks=N] [--socket=PATH]: dmagather correctness + bandwidth table");
  absl::ParseCommandLine(argc, argv);
  const int single = absl::GetFlag(FLAGS_rank);
  const int world = single >= 0 ? absl::GetFlag(FLAGS_world) : absl::GetFlag(FLAGS_ranks);
  if (world < 1 || world > kMaxRanks) {
    std::cerr << "ranks must be 1.." << kMaxRanks << "\n";
    return 2;
  }
  std::string job = absl::GetFlag(FLAGS_job);
  if (job.empty()) job = absl::StrFormat("perf-%d", getpid());
  auto* sh = static_cast<Shared*>(
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  if (sh == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  if (single >= 0) return RunRank(single, world, job, sh);

  std::vector<pid_t> kids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(RunRank(r, world, job, sh));
    kids.push_back(pid);
  }
  int bad = 0;
  for (pid_t pid : kids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++bad;
  }
  if (bad != 0 && sh->backend[0] == '\0') {
    std::cerr << bad << " rank(s) failed before the run started\n";
    return 1;
  }

  std::printf("backend: %s (dmagatherd %s), %d ranks\n", sh->backend, sh->version, world);
  std::printf("--- Correctness ---\n");
  bool all_ok = bad == 0;
  for (int d = 0; d < DMAGATHER_NUM_DTYPES; ++d) {
    bool ok = sh->check_failed[d] == 0 && sh->check_ran[d] > 0;
    all_ok &= ok;
    std::printf("%-9s %s  (%d checks: out-of-place, in-place, list, offsets; counts %s)\n",
                dmagather_dtype_name(static_cast<dmagather_dtype_t>(d)), ok ? "PASSED" : "FAILED", sh->check_ran[d],
                absl::GetFlag(FLAGS_check_counts).c_str());
  }
  std::printf("--- Bandwidth ---\n");
  std::printf("%-9s %10s %10s %10s %10s %12s\n", "dtype", "data_MB", "avg_ms", "min_ms", "max_ms", "algo_BW");
  std::string csv = "backend,ranks,dtype,data_MB,avg_ms,min_ms,max_ms,algo_BW_GBps\n";
  const std::vector<Row> rows = BandwidthRows();
  const int iters = std::min(absl::GetFlag(FLAGS_iters), kMaxIters);
  for (size_t i = 0; i < rows.size() && bad == 0; ++i) {
    double sum = 0, mn = 1e30, mx = 0;
    for (int it = 0; it < iters; ++it) {
      double t = 0;  // An iteration takes as long as its slowest rank.
      for (int r = 0; r < world; ++r) t = std::max(t, sh->iter_ms[i][it][r]);
      sum += t;
      mn = std::min(mn, t);
      mx = std::max(mx, t);
    }
    const double avg = sum / iters;
    const double data_mb = double(rows[i].count * dmagather_dtype_size(rows[i].dtype) * world) / 1e6;
    const double bw = data_mb / 1e3 / (avg / 1e3);
    const char* dn = dmagather_dtype_name(rows[i].dtype);
    std::printf("%-9s %10.2f %10.3f %10.3f %10.3f %12.2f\n", dn, data_mb, avg, mn, mx, bw);
    csv += absl::StrFormat("%s,%d,%s,%.3f,%.4f,%.4f,%.4f,%.3f\n", sh->backend, world, dn, data_mb, avg, mn, mx, bw);
  }
  if (all_ok) {
    std::printf("Result: All correctness tests PASSED\n");
  } else {
    std::printf("Result: correctness FAILED: %s\n", sh->first_failure[0] ? sh->first_failure : "a rank exited with an error");
  }
  const std::string path = absl::GetFlag(FLAGS_csv);
  if (!path.empty() && bad == 0) {
    std::ofstream(path) << csv;
    std::printf("CSV: %s\n", path.c_str());
  }
  return all_ok ? 0 : 1;
}
