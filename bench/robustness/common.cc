// The robustness driver's flags and helpers (robustness.h).
#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>

#include "bench/robustness/robustness.h"

ABSL_FLAG(std::string, dmagatherd, "bazel-bin/server/dmagatherd", "The daemon binary.");
ABSL_FLAG(std::string, dmagatherctl, "bazel-bin/tools/dmagatherctl", "The CLI (health).");
ABSL_FLAG(std::string, runs, "mutate,kill,restart,soak", "Runs, in order.");
ABSL_FLAG(std::string, dir, "", "Socket directories go under here (default: a fresh /tmp dir).");
ABSL_FLAG(int, op_timeout_s, 5, "The daemon's --op_timeout_s (a hang = no answer within 2x this + 5 s).");
ABSL_FLAG(uint64_t, seed, 12, "Random seed.");
ABSL_FLAG(int, mutations, 100000, "mutate: mutated descriptors (ops) rank 0 submits.");
ABSL_FLAG(int, window, 8, "mutate: ops in flight per rank (<= 8: the error block keeps 16 records).");
ABSL_FLAG(int, good_ranks, 3, "mutate: ranks of the concurrent good job.");
ABSL_FLAG(int, kills, 200, "kill: rank SIGKILLs.");
ABSL_FLAG(int, kill_world, 3, "kill: ranks per job.");
ABSL_FLAG(int, restarts, 20,
          "restart: daemon restarts under a running job, of each kind (SIGKILL + a supervisor's restart; SIGTERM + "
          "start: a planned restart or upgrade).");
ABSL_FLAG(int, restart_delay_ms, 250, "restart: the supervisor's delay after a SIGKILL (the unit's RestartSec).");
ABSL_FLAG(int, soak_jobs, 8, "soak: jobs.");
ABSL_FLAG(int, soak_ranks, 4, "soak: ranks per job.");
ABSL_FLAG(int, soak_s, 120, "soak: seconds.");
ABSL_FLAG(int, soak_min_kib, 4, "soak: smallest shard (KiB).");
ABSL_FLAG(int, soak_max_kib, 4096, "soak: largest shard (KiB).");

namespace dmagather::bench::robustness {

pid_t Spawn(const std::function<int()>& fn) {
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) _exit(fn());
  return pid;
}

// Waits for `pid` at most timeout_s; kills it after that. Returns the exit
// code (128+signal when killed), and *timed_out.
int Reap(pid_t pid, double timeout_s, bool* timed_out) {
  const uint64_t deadline = MonotonicNs() + uint64_t(timeout_s * 1e9);
  int status = 0;
  if (timed_out) *timed_out = false;
  for (;;) {
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    if (MonotonicNs() > deadline) {
      if (timed_out) *timed_out = true;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    usleep(2000);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

std::vector<std::string> DirEntries(const std::string& dir, const std::string& contains) {
  std::vector<std::string> out;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    if (!contains.empty() && n.find(contains) == std::string::npos) continue;
    out.push_back(n);
  }
  closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) absl::StrAppend(&s, s.empty() ? "" : ",", x);
  return s.empty() ? "-" : s;
}

ProcStats ReadProc(pid_t pid) {
  ProcStats s;
  std::ifstream f(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    long v = 0;
    if (sscanf(line.c_str(), "VmRSS: %ld", &v) == 1) s.rss_kib = v;
    if (sscanf(line.c_str(), "RssAnon: %ld", &v) == 1) s.anon_kib = v;
    if (sscanf(line.c_str(), "Threads: %ld", &v) == 1) s.threads = v;
  }
  s.fds = long(DirEntries(absl::StrCat("/proc/", pid, "/fd")).size());
  return s;
}

std::vector<Row> g_rows;

void PrintTable() {
  printf("\n| run | load held | faults injected | bad inputs tried | what was lost | verdict | wall |\n");
  printf("|---|---|---|---|---|---|---|\n");
  for (const Row& r : g_rows) {
    printf("| %s | %s | %s | %s | %s | %s | %.1f s |\n", r.run.c_str(), r.load.c_str(), r.faults.c_str(),
           r.bad_inputs.c_str(), r.lost.c_str(), r.ok ? "held" : "**LOST**", r.seconds);
  }
  fflush(stdout);
}

}  // namespace dmagather::bench::robustness
