// A daemon restart is a fault the ranks survive: real dmagatherd processes
// killed (SIGKILL at random points, SIGTERM) and started again on the same
// socket under real rank processes that keep several ops in flight; every
// op's output checked byte by byte, every op done once, no rank failed.
// Also: no daemon within the grace period (UNAVAILABLE naming it), and
// another user's process racing for the job during the gap.
#include <grp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "dmagather/client.h"
#include "tests/integration/harness.h"
#include "tests/integration/rank_checks.h"
#include "tests/support/reduce_reference.h"
#include "tests/support/verify.h"

namespace dmagather::testing {
namespace {

constexpr int kMaxWorld = 8;

struct Progress {
  std::atomic<int> ops[kMaxWorld];  // Ops each rank has seen done and checked.
};

// Reduce-scatters among the ops (churn with `rs`): every third op, fp32,
// up to 100k floats per output (past a 1 MiB staging half at 3 ranks: some
// move in slices).
bool IsReduceScatter(bool rs, int i) { return rs && i % 3 == 1; }
size_t CountOf(bool rs, int i) {
  return size_t(1 + (uint64_t(i) * 7919) % (IsReduceScatter(rs, i) ? 100000 : 24 * 1024));
}

// Op i's submit (all-gather or reduce-scatter of floats).
dmagather_status_t SubmitChurnOp(Comm& comm, bool rs, int i, char* send, char* recv, dmagather_op_t* handle) {
  const int world = comm.size(), rank = comm.rank();
  const size_t count = CountOf(rs, i);
  if (IsReduceScatter(rs, i)) {
    const auto in = support::ReduceScatterInput(rank, world, common::kDtypeFloat32, count, 5000 + i);
    std::memcpy(send, in.data(), in.size());
    std::memset(recv, 0xEE, count * 4);
    return dmagather_reduce_scatter_async(comm.get(), send, recv, count, DMAGATHER_FLOAT32, DMAGATHER_SUM, nullptr,
                                          handle);
  }
  std::memset(recv, 0xEE, count * 4 * world);
  support::FillPattern(send, count * 4, 5000 + i, rank);
  return dmagather_allgather_async(comm.get(), send, recv, count, DMAGATHER_FLOAT32, nullptr, handle);
}

// Op i's output: "" or where it differs.
std::string CheckChurnOp(Comm& comm, bool rs, int i, const char* recv) {
  const size_t count = CountOf(rs, i);
  if (IsReduceScatter(rs, i)) {
    const auto want =
        support::ReduceScatterExpected(comm.rank(), comm.size(), common::kDtypeFloat32, 0, count, 5000 + i);
    return std::memcmp(recv, want.data(), count * 4) == 0 ? "" : absl::StrCat("reduce-scatter ", i, " differs");
  }
  const long bad = FirstMismatch(recv, count * 4, comm.size(), 5000 + i);
  return bad < 0 ? "" : absl::StrCat("op ", i, " (", count, " floats) differs at byte ", bad);
}

// A rank that keeps `window` ops in flight (each its own send and output
// buffer, sizes varying by op; with `rs` every third a reduce-scatter) and
// checks each op's output bit-exact once it is done; the op's send buffer
// is refilled only after that.
int ChurnRank(const std::string& socket, const std::string& job, int world, int rank, int ops, bool rs,
              Progress* progress, const Reporter& rep) {
  constexpr int kWindow = 4;
  constexpr size_t kMaxBytes = 100000 * 4;  // per rank and chunk
  Comm comm(socket.c_str(), job, world, rank);
  REQUIRE(comm.ok(), comm.error());
  char* send[kWindow];
  char* recv[kWindow];
  dmagather_op_t handle[kWindow] = {};
  for (int w = 0; w < kWindow; ++w) {
    send[w] = static_cast<char*>(comm.Alloc(kMaxBytes * world));
    recv[w] = static_cast<char*>(comm.Alloc(kMaxBytes * world));
    REQUIRE(send[w] != nullptr && recv[w] != nullptr, comm.error());
  }
  for (int i = 0; i < ops + kWindow; ++i) {
    const int w = i % kWindow;
    if (i >= kWindow) {
      const int done = i - kWindow;
      const dmagather_status_t st = dmagather_op_wait(comm.get(), handle[w]);
      REQUIRE(st == DMAGATHER_OK, absl::StrCat("op ", done, ": ", dmagather_status_string(st), " ", comm.error()));
      const std::string bad = CheckChurnOp(comm, rs, done, recv[w]);
      REQUIRE(bad.empty(), bad);
      progress->ops[rank].fetch_add(1);
    }
    if (i >= ops) continue;
    const dmagather_status_t st = SubmitChurnOp(comm, rs, i, send[w], recv[w], &handle[w]);
    REQUIRE(st == DMAGATHER_OK, absl::StrCat("submit of op ", i, ": ", comm.error()));
  }
  REQUIRE(comm.Wait() == DMAGATHER_OK, comm.error());
  return 0;
}

int MinOps(const Progress& p, int world) {
  int m = 1 << 30;
  for (int r = 0; r < world; ++r) m = std::min(m, p.ops[r].load());
  return m;
}

uint64_t JsonNumber(const std::string& json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\": \"?([0-9]+)\"?");
  return std::regex_search(json, m, re) ? std::stoull(m[1]) : ~0ull;
}

// Kills (SIGKILL, one SIGTERM) and restarts the daemon `kills` times while
// `world` ranks run `ops` ops each; every op of every rank must be right.
void ChurnThroughRestarts(int world, int ops, int kills, uint64_t seed, bool rs = false) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  const std::string dir = daemon->dir(), socket = daemon->socket();
  auto* progress = SharedPage<Progress>();
  const std::string job = UniqueJob("churn");
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < world; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(
        r, [&](int rank, const Reporter& rep) { return ChurnRank(socket, job, world, rank, ops, rs, progress, rep); }));
  }
  std::mt19937_64 rng(seed);
  int survived = 0;
  for (int k = 0; k < kills; ++k) {
    // Somewhere in the run, at a random point of an op's life.
    const int at = (k + 1) * ops / (kills + 2);
    ASSERT_TRUE(WaitFor([&] { return MinOps(*progress, world) >= at; }, 120)) << "the job stopped at " << at;
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    const int sig = k == kills / 2 ? SIGTERM : SIGKILL;  // One planned restart among the crashes.
    daemon->KeepDir();                                   // The next daemon serves the same socket path.
    const int st = daemon->Stop(sig);
    if (sig == SIGTERM) {
      EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "SIGTERM exit status " << st;
    } else {
      EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "exit status " << st;
    }
    daemon.reset();
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 300));  // The supervisor's restart delay.
    daemon = DaemonProcess::Start({}, dir);
    ASSERT_NE(daemon, nullptr) << "restart " << k;
    ++survived;
  }
  for (int r = 0; r < world; ++r) {
    RankReport rep = ranks[r]->Reap(180);
    EXPECT_EQ(rep.exit_code, 0) << "rank " << r << ": " << rep.message;
    EXPECT_EQ(progress->ops[r].load(), ops) << "rank " << r;
  }
  // The last daemon took the job back from the ranks of the one before it.
  int rc = 0;
  const std::string json = RunProgram({"tools/dmagatherctl", "--socket=" + socket, "--json", "stats"}, &rc);
  EXPECT_EQ(rc, 0) << json;
  EXPECT_EQ(JsonNumber(json, "jobs_taken_over"), 1u) << json;
  EXPECT_EQ(JsonNumber(json, "ranks_resumed"), uint64_t(world)) << json;
  EXPECT_EQ(survived, kills);
  FreeSharedPage(progress);
}

TEST(RestartTest, JobGoesOnBitExactThroughDaemonKillsAndARestart) { ChurnThroughRestarts(3, 400, 5, 1); }

TEST(RestartTest, EightRanksThroughKillsAtOtherPoints) { ChurnThroughRestarts(8, 200, 3, 2); }

// Reduce-scatters among the all-gathers: the daemon dies while their chunks
// move (or between slices); the next daemon moves them again from the
// ranks' unchanged sends, and every sum is bit-exact.
TEST(RestartTest, ReduceScattersGoOnBitExactThroughDaemonKills) {
  setenv("DMAGATHER_STAGING_MB", "2", 1);
  ChurnThroughRestarts(3, 300, 4, 3, /*rs=*/true);
  unsetenv("DMAGATHER_STAGING_MB");
}

TEST(RestartTest, NoDaemonWithinTheGracePeriodIsUnavailableNamingIt) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  setenv("DMAGATHER_RECONNECT_S", "1", 1);
  auto* ready = SharedPage<std::atomic<int>>();
  const std::string job = UniqueJob("grace"), socket = daemon->socket();
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(r, [&](int rank, const Reporter& rep) {
      Comm comm(socket.c_str(), job, 2, rank);
      REQUIRE(comm.ok(), comm.error());
      char* buf = static_cast<char*>(comm.Alloc(4096 * 2));
      REQUIRE(buf != nullptr, comm.error());
      REQUIRE(comm.AllGather(buf + rank * 4096, buf, 1024, DMAGATHER_FLOAT32) == DMAGATHER_OK, comm.error());
      REQUIRE(comm.Wait() == DMAGATHER_OK, comm.error());
      ready->fetch_add(1);
      // Rank 1 never submits its part: rank 0's op waits when the daemon dies.
      if (rank == 1) {
        WaitFor([] { return false; }, 6);
        return 0;
      }
      comm.AllGather(buf + rank * 4096, buf, 1024, DMAGATHER_FLOAT32);
      const auto t0 = std::chrono::steady_clock::now();
      const dmagather_status_t st = comm.Wait();
      *rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      *rep.status = st;
      rep.Say(comm.error());
      return 0;
    }));
  }
  unsetenv("DMAGATHER_RECONNECT_S");
  ASSERT_TRUE(WaitFor([&] { return ready->load() == 2; }, 30));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  daemon->Stop(SIGKILL);
  RankReport r0 = ranks[0]->Reap(30);
  EXPECT_EQ(r0.status, DMAGATHER_UNAVAILABLE) << r0.message;
  EXPECT_TRUE(Contains(r0.message, "within 1 s (DMAGATHER_RECONNECT_S")) << r0.message;
  EXPECT_GE(r0.seconds, 0.9) << "gave up before the grace period";
  std::cerr << "the rank gave up " << r0.seconds << " s after its wait began\n";
  FreeSharedPage(ready);
}

// Another uid's process that joins the same job key while the daemon is
// away gets a job of its own (jobs are keyed by uid): the ranks take
// theirs back and finish bit-exact; the intruder's join times out alone.
TEST(RestartTest, AnotherUserRacingForTheJobDuringTheGapCannotClaimIt) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a process as another uid";
  auto daemon = DaemonProcess::Start({"--socket_mode=0666"});
  ASSERT_NE(daemon, nullptr);
  const std::string dir = daemon->dir(), socket = daemon->socket();
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  auto* progress = SharedPage<Progress>();
  const std::string job = UniqueJob("contested");
  constexpr int kOps = 120;
  std::vector<std::unique_ptr<RankProcess>> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.push_back(std::make_unique<RankProcess>(
        r, [&](int rank, const Reporter& rep) { return ChurnRank(socket, job, 2, rank, kOps, false, progress, rep); }));
  }
  ASSERT_TRUE(WaitFor([&] { return MinOps(*progress, 2) >= kOps / 3; }, 60));
  daemon->KeepDir();
  daemon->Stop(SIGKILL);
  daemon.reset();
  // The intruder waits for the socket and joins the moment it answers.
  RankProcess intruder(0, [&](int, const Reporter& rep) {
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) {
      rep.Say("setuid failed");
      return 2;
    }
    WaitFor([&] { return CanConnect(socket); }, 20);
    setenv("DMAGATHER_JOIN_TIMEOUT_MS", "1500", 1);
    Comm comm(socket.c_str(), job, 2, 0);
    *rep.status = comm.init_status();
    rep.Say(comm.error());
    return 0;
  });
  daemon = DaemonProcess::Start({"--socket_mode=0666"}, dir);
  ASSERT_NE(daemon, nullptr);
  RankReport in = intruder.Reap(30);
  EXPECT_EQ(in.exit_code, 0) << in.message;
  EXPECT_NE(in.status, DMAGATHER_OK) << "the intruder joined: " << in.message;
  for (int r = 0; r < 2; ++r) {
    RankReport rep = ranks[r]->Reap(120);
    EXPECT_EQ(rep.exit_code, 0) << "rank " << r << ": " << rep.message;
    EXPECT_EQ(progress->ops[r].load(), kOps);
  }
  FreeSharedPage(progress);
}

}  // namespace
}  // namespace dmagather::testing
