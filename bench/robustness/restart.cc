// Run "restart": daemon restarts under a running job, on one socket path.
// A 2-rank good job (random ops, every output checked byte by byte) runs
// through --restarts SIGKILLs, each followed by a supervisor's restart
// after --restart_delay_ms, then --restarts planned restarts (SIGTERM, then
// a start at once: systemctl restart, a package upgrade). Measured: the gap
// of each (the last op the old daemon completed to the first op the new one
// completed, as the rank saw them), ops per second before and after, and
// that nothing was lost (no op failed, no byte wrong, no stale file).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>
#include <random>

#include "bench/robustness/robustness.h"

namespace dmagather::bench::robustness {
namespace {

// Ops per second the job completes over `seconds`.
double Rate(GoodJob* g, double seconds) {
  const uint64_t n0 = g->ops.load(), t0 = MonotonicNs();
  usleep(useconds_t(seconds * 1e6));
  return double(g->ops.load() - n0) / Seconds(t0, MonotonicNs());
}

struct Gaps {
  std::vector<double> ms;
  double P50() const { return ms.empty() ? 0 : ms[ms.size() / 2]; }
  double Max() const { return ms.empty() ? 0 : ms.back(); }
};

}  // namespace

void RunRestart(const std::string& base) {
  const uint64_t t0 = MonotonicNs();
  const int cycles = absl::GetFlag(FLAGS_restarts);
  const int delay_ms = absl::GetFlag(FLAGS_restart_delay_ms);
  const std::string dir = base + "/restart";
  mkdir(dir.c_str(), 0700);
  Daemon daemon(dir, {});
  std::string first_problem;
  int stuck = 0, restart_failed = 0, bad_status = 0, stale = 0;
  auto problem = [&](const std::string& s) {
    if (first_problem.empty()) first_problem = s;
  };
  if (!daemon.Start()) {
    printf("restart: the daemon did not start\n");
    return;
  }
  const std::vector<std::string> shm_before = DirEntries("/dev/shm", "dmagather");
  auto* g = SharedArray<GoodJob>(1);
  const std::string socket = daemon.socket(), job = absl::StrCat("through-restarts-", getpid());
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    pids.push_back(Spawn([&, r] { return GoodRank(socket, job, 2, r, 4 << 10, 256 << 10, 77, g); }));
  }
  const uint64_t deadline = MonotonicNs() + 60'000'000'000ull;
  while (g->ops.load() < 10 && MonotonicNs() < deadline) usleep(1000);
  const double rate_before = Rate(g, 2.0);
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  Gaps kill_gaps, term_gaps;
  for (int kind = 0; kind < 2; ++kind) {
    const int sig = kind == 0 ? SIGKILL : SIGTERM;
    for (int c = 0; c < cycles && stuck == 0 && restart_failed == 0; ++c) {
      usleep(20000 + rng() % 100000);  // Mid-run, at a random point of an op.
      const int st = daemon.Stop(sig);
      const uint64_t ops_at = g->ops.load();
      const uint64_t last_before = ops_at > 0 ? g->done_ns[(ops_at - 1) % GoodJob::kDoneTimes].load() : 0;
      if (sig == SIGKILL ? !(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) : !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        ++bad_status;
        problem(absl::StrCat("cycle ", c, " signal ", sig, ": daemon exit status ", st));
      }
      if (sig == SIGKILL) usleep(delay_ms * 1000);
      if (!daemon.Start()) {
        ++restart_failed;
        problem(absl::StrCat("cycle ", c, " signal ", sig, ": restart failed"));
        break;
      }
      if (DirEntries(dir) != std::vector<std::string>{"dmagatherd.log", "dmagatherd.sock", "dmagatherd.sock.fd"}) {
        ++stale;
        problem(absl::StrCat("cycle ", c, ": socket dir holds ", Join(DirEntries(dir))));
      }
      // The first op the new daemon completes.
      const uint64_t wait_until = MonotonicNs() + 30'000'000'000ull;
      while (g->ops.load() <= ops_at && MonotonicNs() < wait_until && g->failed_ops.load() == 0) usleep(200);
      if (g->ops.load() <= ops_at) {
        ++stuck;
        problem(absl::StrCat("cycle ", c, " signal ", sig, ": no op completed within 30 s of the restart (",
                             g->why_set.load() ? g->why : "no rank said why", ")"));
        break;
      }
      const double gap_ms = (g->done_ns[ops_at % GoodJob::kDoneTimes].load() - last_before) / 1e6;
      (sig == SIGKILL ? kill_gaps : term_gaps).ms.push_back(gap_ms);
      printf("restart: %s cycle %d: gap %.1f ms (op %" PRIu64 " -> %" PRIu64 ")\n",
             sig == SIGKILL ? "SIGKILL" : "SIGTERM", c, gap_ms, ops_at, ops_at + 1);
    }
  }
  const double rate_after = Rate(g, 2.0);
  g->stop.store(1);
  int bad_exit = 0;
  for (pid_t p : pids) bad_exit += Reap(p, 60) != 0;
  std::sort(kill_gaps.ms.begin(), kill_gaps.ms.end());
  std::sort(term_gaps.ms.begin(), term_gaps.ms.end());
  const bool serving = daemon.Alive() && daemon.Healthy();
  const int term = daemon.Stop(SIGTERM);
  const bool clean_end = WIFEXITED(term) && WEXITSTATUS(term) == 0 &&
                         DirEntries(dir) == std::vector<std::string>{"dmagatherd.log"} &&
                         DirEntries("/dev/shm", "dmagather") == shm_before;
  printf(
      "\n== restart: a 2-rank job (random ops of 4 KiB-256 KiB, each checked) through %d SIGKILLs "
      "(restart after %d ms) and %d SIGTERM restarts of its daemon\n",
      cycles, delay_ms, cycles);
  printf(
      "   gap (last op of the old daemon -> first op of the new): SIGKILL p50 %.1f ms max %.1f ms (n=%zu); "
      "SIGTERM p50 %.1f ms max %.1f ms (n=%zu)\n",
      kill_gaps.P50(), kill_gaps.Max(), kill_gaps.ms.size(), term_gaps.P50(), term_gaps.Max(), term_gaps.ms.size());
  printf("   ops/s before %.0f, after %.0f (ratio %.2f); ops %" PRIu64 ", bytes checked %" PRIu64 ", bad bytes %" PRIu64
         ", failed ops %" PRIu64 ", ranks exiting non-zero %d\n",
         rate_before, rate_after, rate_before > 0 ? rate_after / rate_before : 0.0, g->ops.load(),
         g->bytes_checked.load(), g->bad_bytes.load(), g->failed_ops.load(), bad_exit);
  printf(
      "   restarts failed %d, stuck %d, bad exit statuses %d, stale files %d; after SIGTERM: clean %s, health "
      "before stop %s\n",
      restart_failed, stuck, bad_status, stale, clean_end ? "yes" : "no", serving ? "SERVING" : "NOT SERVING");
  if (!first_problem.empty()) printf("   first problem: %s\n", first_problem.c_str());
  Row row;
  row.run = "3. daemon restarts under a job";
  row.load = "a 2-rank job of random ops (4 KiB-256 KiB), every output checked, running through every restart";
  row.faults = absl::StrFormat("%d SIGKILLs (restart after %d ms) + %d SIGTERM restarts on the same socket path",
                               cycles, delay_ms, cycles);
  row.bad_inputs = "stale sockets of the killed daemon, every time";
  row.ok = stuck == 0 && restart_failed == 0 && bad_status == 0 && stale == 0 && bad_exit == 0 &&
           g->bad_bytes.load() == 0 && g->failed_ops.load() == 0 && clean_end && serving &&
           kill_gaps.ms.size() == size_t(cycles) && term_gaps.ms.size() == size_t(cycles);
  row.lost = absl::StrFormat(
      "nothing: %d/%d restarts survived, failed ops %u, bad bytes %u; gap SIGKILL p50 %.0f / max %.0f ms, SIGTERM "
      "p50 %.0f / max %.0f ms",
      int(kill_gaps.ms.size() + term_gaps.ms.size()), 2 * cycles, unsigned(g->failed_ops.load()),
      unsigned(g->bad_bytes.load()), kill_gaps.P50(), kill_gaps.Max(), term_gaps.P50(), term_gaps.Max());
  if (!row.ok) row.lost = absl::StrCat("LOST: ", first_problem, "; ", row.lost);
  row.seconds = Seconds(t0, MonotonicNs());
  g_rows.push_back(row);
  munmap(g, sizeof(GoodJob));
}

}  // namespace dmagather::bench::robustness
