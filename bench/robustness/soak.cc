// Run "soak": jobs x ranks for a while, every result checked; the daemon's
// memory, threads and descriptors sampled.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>

#include "bench/robustness/robustness.h"

namespace dmagather::bench::robustness {

void RunSoak(Daemon& daemon) {
  const uint64_t t0 = MonotonicNs();
  const int jobs = absl::GetFlag(FLAGS_soak_jobs), ranks = absl::GetFlag(FLAGS_soak_ranks);
  const int secs = absl::GetFlag(FLAGS_soak_s);
  const size_t min_b = size_t(absl::GetFlag(FLAGS_soak_min_kib)) << 10,
               max_b = size_t(absl::GetFlag(FLAGS_soak_max_kib)) << 10;
  const ProcStats before = ReadProc(daemon.pid());
  const std::string socket = daemon.socket();
  auto* g = SharedArray<GoodJob>(jobs);
  std::vector<pid_t> pids;
  for (int j = 0; j < jobs; ++j) {
    const std::string job = absl::StrCat("soak-", getpid(), "-", j);
    for (int r = 0; r < ranks; ++r) {
      pids.push_back(Spawn([&, j, r, job] {
        return GoodRank(socket, job, ranks, r, min_b, max_b, absl::GetFlag(FLAGS_seed) * 31 + j, &g[j]);
      }));
    }
  }
  ProcStats peak = before, during = before;
  const uint64_t end = MonotonicNs() + uint64_t(secs) * 1000000000ull;
  while (MonotonicNs() < end) {
    sleep(1);
    if (!daemon.Alive()) break;
    during = ReadProc(daemon.pid());
    peak.rss_kib = std::max(peak.rss_kib, during.rss_kib);
    peak.anon_kib = std::max(peak.anon_kib, during.anon_kib);
    peak.threads = std::max(peak.threads, during.threads);
    peak.fds = std::max(peak.fds, during.fds);
  }
  for (int j = 0; j < jobs; ++j) g[j].stop = 1;
  int bad_exit = 0;
  for (pid_t p : pids) bad_exit += Reap(p, 2 * absl::GetFlag(FLAGS_op_timeout_s) + 60) != 0;
  usleep(500000);  // The reaper retires the sessions.
  const bool alive = daemon.Alive();
  const bool serving = alive && daemon.Healthy();
  const ProcStats after = alive ? ReadProc(daemon.pid()) : ProcStats{};
  uint64_t ops = 0, bytes = 0, bad = 0, failed = 0;
  std::string why;
  for (int j = 0; j < jobs; ++j) {
    ops += g[j].ops;
    bytes += g[j].bytes_checked;
    bad += g[j].bad_bytes;
    failed += g[j].failed_ops;
    if (g[j].why_set && why.empty()) why = g[j].why;
  }
  const double wall = Seconds(t0, MonotonicNs());
  printf(
      "\n== soak: %d jobs x %d ranks for %d s, shards %zu KiB-%zu KiB (log-uniform; 5 dtypes; flat, in place, list)\n",
      jobs, ranks, secs, min_b >> 10, max_b >> 10);
  printf("   ops %" PRIu64 ", output bytes checked %.2f GiB, corrupt bytes %" PRIu64 ", failed ops %" PRIu64
         ", ranks exiting non-zero %d\n",
         ops, bytes / double(1ull << 30), bad, failed, bad_exit);
  printf(
      "   daemon %s, health %s\n   daemon at start: %s\n   daemon peak:     %s\n   daemon at end:   %s (jobs gone)\n",
      alive ? "alive" : "DEAD", serving ? "SERVING" : "NOT SERVING", before.Str().c_str(), peak.Str().c_str(),
      after.Str().c_str());
  if (!why.empty()) printf("   first problem: %s\n", why.c_str());
  Row row;
  row.run = "4. soak";
  row.load = absl::StrFormat("%d jobs x %d ranks, %d s, %zu KiB-%zu KiB shards: %u ops, %.1f GiB checked", jobs, ranks,
                             secs, min_b >> 10, max_b >> 10, ops, bytes / double(1ull << 30));
  row.faults = "-";
  row.bad_inputs = "-";
  row.ok = alive && serving && bad == 0 && failed == 0 && bad_exit == 0 && ops > 0;
  row.lost =
      absl::StrFormat("%sdaemon crashes %d, corrupt bytes %u, failed ops %u; daemon RSS %.0f->%.0f MiB, threads %d->%d",
                      serving || !alive ? "" : "daemon NOT SERVING; ", alive ? 0 : 1, bad, failed,
                      before.rss_kib / 1024.0, after.rss_kib / 1024.0, int(before.threads), int(after.threads));
  row.seconds = wall;
  g_rows.push_back(row);
}

}  // namespace dmagather::bench::robustness
