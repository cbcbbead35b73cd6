// Run "restart": daemon SIGKILL + restart cycles on one socket path; no
// stale files, old ranks UNAVAILABLE, new jobs bit-exact.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>

#include "bench/robustness/robustness.h"

namespace dmagather::bench::robustness {

void RunRestart(const std::string& base) {
  const uint64_t t0 = MonotonicNs();
  const int cycles = absl::GetFlag(FLAGS_restarts);
  const std::string dir = base + "/restart";
  mkdir(dir.c_str(), 0700);
  Daemon daemon(dir, {});
  int unavailable = 0, hangs = 0, other = 0, restart_failed = 0, stale = 0, new_job_bad = 0, shm_left = 0;
  std::vector<double> lat_ms;
  std::string first_problem;
  auto problem = [&](const std::string& s) {
    if (first_problem.empty()) first_problem = s;
  };
  if (!daemon.Start()) {
    printf("restart: the daemon did not start\n");
    restart_failed = cycles;
  }
  const std::vector<std::string> shm_before = DirEntries("/dev/shm", "dmagather");
  for (int cyc = 0; cyc < cycles && restart_failed == 0; ++cyc) {
    const std::string socket = daemon.socket();
    // The old job: 2 ranks running ops until something fails.
    auto* sh = SharedArray<KillShared>(1);
    const std::string job = absl::StrCat("old-", getpid(), "-", cyc);
    std::vector<pid_t> pids;
    for (int r = 0; r < 2; ++r) pids.push_back(Spawn([&, r] { return KillRank(socket, job, 2, r, -1, sh); }));
    const uint64_t deadline = MonotonicNs() + 60'000'000'000ull;
    while (sh->ready.load() < 2 && MonotonicNs() < deadline) usleep(1000);
    usleep(20000);
    const uint64_t kill_ns = MonotonicNs();
    const int ds = daemon.Stop(SIGKILL);
    if (!(WIFSIGNALED(ds) && WTERMSIG(ds) == SIGKILL)) problem(absl::StrCat("cycle ", cyc, ": daemon status ", ds));
    for (int r = 0; r < 2; ++r) {
      bool to = false;
      const int rc = Reap(pids[r], 10, &to);
      if (to) {
        ++hangs;
        problem(absl::StrCat("cycle ", cyc, ": old rank ", r, " hung after the daemon was killed"));
      } else if (rc == 0 && sh->status[r] == DMAGATHER_UNAVAILABLE) {
        ++unavailable;
        lat_ms.push_back((sh->error_ns[r].load() - kill_ns) / 1e6);
      } else {
        ++other;
        problem(absl::StrCat("cycle ", cyc, ": old rank ", r, " exit ", rc, " status ", sh->status[r].load(), " ",
                             sh->why));
      }
    }
    munmap(sh, sizeof(KillShared));
    // Restart on the same path; afterwards only the new daemon's files exist.
    if (!daemon.Start()) {
      ++restart_failed;
      problem(absl::StrCat("cycle ", cyc, ": restart failed"));
      break;
    }
    const std::vector<std::string> files = DirEntries(dir);
    const std::vector<std::string> want = {"dmagatherd.log", "dmagatherd.sock", "dmagatherd.sock.fd"};
    if (files != want) {
      ++stale;
      problem(absl::StrCat("cycle ", cyc, ": socket dir holds ", Join(files)));
    }
    if (DirEntries("/dev/shm", "dmagather") != shm_before) ++shm_left;
    // A new job, bit-exact.
    auto* g = SharedArray<GoodJob>(1);
    g->stop_at = 20;
    const std::string njob = absl::StrCat("new-", getpid(), "-", cyc);
    std::vector<pid_t> np;
    for (int r = 0; r < 2; ++r) {
      np.push_back(Spawn([&, r] { return GoodRank(socket, njob, 2, r, 4 << 10, 1 << 20, 1000 + cyc, g); }));
    }
    int bad_exit = 0;
    for (pid_t p : np) bad_exit += Reap(p, 60) != 0;
    if (bad_exit || g->bad_bytes || g->ops != 20) {
      ++new_job_bad;
      problem(absl::StrCat("cycle ", cyc, ": new job: ", g->why));
    }
    munmap(g, sizeof(GoodJob));
  }
  const bool serving = daemon.Alive() && daemon.Healthy();
  const int term = daemon.Stop(SIGTERM);
  const std::vector<std::string> left = DirEntries(dir);
  const bool clean_end =
      WIFEXITED(term) && WEXITSTATUS(term) == 0 && left == std::vector<std::string>{"dmagatherd.log"};
  const std::vector<std::string> shm_after = DirEntries("/dev/shm", "dmagather");
  std::sort(lat_ms.begin(), lat_ms.end());
  const double p50 = lat_ms.empty() ? 0 : lat_ms[lat_ms.size() / 2], mx = lat_ms.empty() ? 0 : lat_ms.back();
  printf("\n== restart: %d cycles of SIGKILL of the daemon under a running 2-rank job, restart on the same socket\n",
         cycles);
  printf("   old ranks: UNAVAILABLE %d/%d (kill -> error p50 %.1f ms, max %.1f ms), other %d, hangs %d\n", unavailable,
         2 * cycles, p50, mx, other, hangs);
  printf(
      "   restarts failed %d, cycles with stale files in the socket dir %d, with new /dev/shm entries %d, new jobs not "
      "bit-exact %d\n",
      restart_failed, stale, shm_left, new_job_bad);
  printf(
      "   after SIGTERM: exit %d, socket dir holds %s; /dev/shm dmagather entries: before %s, after %s; health before "
      "stop %s\n",
      WIFEXITED(term) ? WEXITSTATUS(term) : -1, Join(left).c_str(), Join(shm_before).c_str(), Join(shm_after).c_str(),
      serving ? "SERVING" : "NOT SERVING");
  if (!first_problem.empty()) printf("   first problem: %s\n", first_problem.c_str());
  Row row;
  row.run = "3. daemon SIGKILL + restart";
  row.load = absl::StrFormat("a 2-rank job running in each cycle; a new 2-rank job x 20 ops after each restart");
  row.faults = absl::StrFormat("%d daemon SIGKILLs + restarts on the same socket path", cycles);
  row.bad_inputs = "stale sockets of the killed daemon, every time";
  row.ok = unavailable == 2 * cycles && hangs == 0 && other == 0 && restart_failed == 0 && stale == 0 &&
           shm_left == 0 && new_job_bad == 0 && clean_end && serving && shm_after == shm_before;
  row.lost = absl::StrFormat(
      "%d/%d old ranks got UNAVAILABLE (max %.0f ms), hangs %d, failed restarts %d, stale files %d, new jobs not "
      "bit-exact %d/%d",
      unavailable, 2 * cycles, mx, hangs, restart_failed, stale + shm_left + (clean_end ? 0 : 1), new_job_bad, cycles);
  row.seconds = Seconds(t0, MonotonicNs());
  g_rows.push_back(row);
}

}  // namespace dmagather::bench::robustness
