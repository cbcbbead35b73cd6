// Run "kill": rank SIGKILLs at random moments; every survivor must get
// PEER_FAILED naming the victim.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstring>

#include "bench/robustness/robustness.h"

namespace dmagather::bench::robustness {

int KillRank(const std::string& socket, const std::string& job, int world, int rank, int victim, KillShared* sh) {
  Comm comm(socket.c_str(), job, world, rank);
  if (!comm.ok()) {
    if (sh->why_set.fetch_add(1) == 0) snprintf(sh->why, sizeof(sh->why), "init: %s", comm.error().c_str());
    return 2;
  }
  const size_t shard = 16 << 10;
  char* send = static_cast<char*>(comm.Alloc(shard));
  char* recv = static_cast<char*>(comm.Alloc(shard * world));
  if (send == nullptr || recv == nullptr) return 2;
  std::vector<char> want(shard);
  for (uint64_t op = 0;; ++op) {
    FillPattern(send, shard, op, rank);
    dmagather_status_t st = comm.AllGather(send, recv, shard / 8, DMAGATHER_INT64);
    if (st == DMAGATHER_OK) st = comm.Wait();
    if (st != DMAGATHER_OK) {
      sh->error_ns[rank] = MonotonicNs();
      sh->status[rank] = st;
      sh->names_victim[rank] = comm.error().find(absl::StrCat("rank ", victim)) != std::string::npos;
      return 0;
    }
    for (int r = 0; r < world; ++r) {
      FillPattern(want.data(), shard, op, r);
      if (std::memcmp(recv + r * shard, want.data(), shard) != 0) sh->bad.fetch_add(1);
    }
    sh->ops_checked.fetch_add(1);
    if (op == 2) sh->ready.fetch_add(1);
  }
}

void RunKill(Daemon& daemon) {
  const uint64_t t0 = MonotonicNs();
  const int kills = absl::GetFlag(FLAGS_kills);
  const int world = std::clamp(absl::GetFlag(FLAGS_kill_world), 2, 8);
  const ProcStats before = ReadProc(daemon.pid());
  const std::string socket = daemon.socket();
  const double hang_s = 2 * absl::GetFlag(FLAGS_op_timeout_s) + 5;
  uint64_t rng = absl::GetFlag(FLAGS_seed) * 7 + 1;
  std::vector<double> lat_ms;
  int survivors = 0, peer_failed = 0, named = 0, hangs = 0, setup_failures = 0, other = 0;
  uint64_t ops = 0, bad = 0;
  std::string first_problem;
  for (int it = 0; it < kills; ++it) {
    auto* sh = SharedArray<KillShared>(1);
    const int victim = int(SplitMix64(rng) % world);
    const std::string job = absl::StrCat("kill-", getpid(), "-", it);
    std::vector<pid_t> pids;
    for (int r = 0; r < world; ++r)
      pids.push_back(Spawn([&, r] { return KillRank(socket, job, world, r, victim, sh); }));
    const uint64_t deadline = MonotonicNs() + 60'000'000'000ull;
    while (sh->ready.load() < world && MonotonicNs() < deadline) usleep(1000);
    if (sh->ready.load() < world) {
      ++setup_failures;
      if (first_problem.empty()) first_problem = absl::StrCat("iteration ", it, ": ranks not running: ", sh->why);
      for (pid_t p : pids) kill(p, SIGKILL), Reap(p, 5);
      munmap(sh, sizeof(KillShared));
      continue;
    }
    usleep(useconds_t(SplitMix64(rng) % 20000));  // A random moment, mostly mid-op.
    const uint64_t kill_ns = MonotonicNs();
    kill(pids[victim], SIGKILL);
    for (int r = 0; r < world; ++r) {
      bool to = false;
      const int rc = Reap(pids[r], r == victim ? 5 : hang_s, &to);
      if (r == victim) continue;
      ++survivors;
      if (to) {
        ++hangs;
        if (first_problem.empty()) first_problem = absl::StrCat("iteration ", it, ": rank ", r, " hung");
        continue;
      }
      if (rc == 0 && sh->status[r] == DMAGATHER_PEER_FAILED) {
        ++peer_failed;
        named += sh->names_victim[r].load();
        lat_ms.push_back((sh->error_ns[r].load() - kill_ns) / 1e6);
      } else {
        ++other;
        if (first_problem.empty()) {
          first_problem = absl::StrCat("iteration ", it, ": rank ", r, " exit ", rc, " status ", sh->status[r].load());
        }
      }
    }
    ops += sh->ops_checked;
    bad += sh->bad;
    munmap(sh, sizeof(KillShared));
  }
  std::sort(lat_ms.begin(), lat_ms.end());
  auto pct = [&](double q) {
    return lat_ms.empty() ? 0.0 : lat_ms[std::min(lat_ms.size() - 1, size_t(q * lat_ms.size()))];
  };
  usleep(200000);  // The reaper retires the last sessions.
  const bool alive = daemon.Alive();
  const bool serving = alive && daemon.Healthy();
  const ProcStats after = alive ? ReadProc(daemon.pid()) : ProcStats{};
  printf("\n== kill: %d jobs of %d ranks, one rank SIGKILLed at a random moment (0-20 ms after all ran 3 ops)\n", kills,
         world);
  printf("   survivors %d: PEER_FAILED %d (naming the killed rank %d), other %d, hangs %d; setup failures %d\n",
         survivors, peer_failed, named, other, hangs, setup_failures);
  printf("   kill -> PEER_FAILED: p50 %.1f ms, p99 %.1f ms, max %.1f ms\n", pct(0.5), pct(0.99),
         lat_ms.empty() ? 0 : lat_ms.back());
  printf("   ops before the kills, checked bit-exact: %" PRIu64 ", bad results %" PRIu64 "\n", ops, bad);
  printf("   daemon %s, health %s; before %s; after %s\n", alive ? "alive" : "DEAD",
         serving ? "SERVING" : "NOT SERVING", before.Str().c_str(), after.Str().c_str());
  if (!first_problem.empty()) printf("   first problem: %s\n", first_problem.c_str());
  Row row;
  row.run = "2. rank SIGKILLs";
  row.load = absl::StrFormat("%d jobs x %d ranks, %u ops checked before the kills", kills, world, ops);
  row.faults = absl::StrFormat("%d rank SIGKILLs mid-run", kills - setup_failures);
  row.bad_inputs = "-";
  row.ok = alive && serving && peer_failed == survivors && survivors == kills * (world - 1) && hangs == 0 && bad == 0 &&
           setup_failures == 0;
  row.lost = absl::StrFormat(
      "%sdaemon crashes %d; %d/%d survivors got PEER_FAILED (p50 %.1f ms, p99 %.1f ms, max %.1f ms), hangs %d, bad "
      "results %u",
      serving || !alive ? "" : "daemon NOT SERVING; ", alive ? 0 : 1, peer_failed, survivors, pct(0.5), pct(0.99),
      lat_ms.empty() ? 0 : lat_ms.back(), hangs, bad);
  row.seconds = Seconds(t0, MonotonicNs());
  g_rows.push_back(row);
}

}  // namespace dmagather::bench::robustness
