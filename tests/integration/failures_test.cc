// Failure handling through a real daemon and real rank processes: ranks that
// disagree, a rank killed mid-op, a daemon that is killed or stopped, an op
// that times out, joins that cannot complete. Every case must end in a
// clear status on every rank (never a hang) and leave the daemon serving.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "dmagather/client.h"
#include "tests/integration/harness.h"
#include "tests/integration/rank_checks.h"
#include "tests/support/verify.h"

namespace dmagather::testing {
namespace {

using support::CheckAllGather;
using support::Variant;

int Report(const Reporter& rep, dmagather_status_t st, const std::string& msg, double seconds = 0) {
  *rep.status = st;
  *rep.seconds = seconds;
  rep.Say(msg);
  return 0;
}

// One bit-exact op in a fresh job: proves the daemon still serves.
void ExpectDaemonServes(const std::string& socket) {
  const std::string job = UniqueJob("after");
  auto reports = RunRanks(2, [&](int rank, const Reporter& rep) {
    Comm comm(socket.c_str(), job, 2, rank);
    if (!comm.ok()) return rep.Say(comm.error()), 2;
    char* s = static_cast<char*>(comm.Alloc(1 << 16));
    char* r = static_cast<char*>(comm.Alloc(1 << 18));
    std::vector<char> scratch;
    std::string why;
    if (!CheckAllGather(comm, s, r, DMAGATHER_BFLOAT16, 12345, Variant::kOutOfPlace, 77, &scratch, &why)) {
      return rep.Say(why), 1;
    }
    return 0;
  });
  for (const auto& r : reports) EXPECT_EQ(r.exit_code, 0) << r.message;
}

TEST(FailuresTest, MismatchedCountsFailEveryRankNamingThemAndJobGoesOn) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  const std::string job = UniqueJob("mismatch");
  const int world = 3;
  auto reports = RunRanks(world, [&](int rank, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), job, world, rank);
    if (!comm.ok()) return rep.Say(comm.error()), 2;
    char* s = static_cast<char*>(comm.Alloc(1 << 16));
    char* r = static_cast<char*>(comm.Alloc(1 << 18));
    const size_t count = rank == 2 ? 512 : 1024;
    dmagather_status_t st = comm.AllGather(s, r, count, DMAGATHER_FLOAT32);
    if (st == DMAGATHER_OK) st = comm.Wait();
    Report(rep, st, comm.error());
    // The job is still usable: the next (agreeing) op is bit-exact.
    std::vector<char> scratch;
    std::string why;
    if (!CheckAllGather(comm, s, r, DMAGATHER_FLOAT32, 1024, Variant::kOutOfPlace, 3, &scratch, &why)) {
      return rep.Say(why), 1;
    }
    return 0;
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(reports[r].exit_code, 0) << reports[r].message;
    EXPECT_EQ(reports[r].status, DMAGATHER_INVALID_ARGUMENT) << "rank " << r << ": " << reports[r].message;
    EXPECT_NE(reports[r].message.find("ranks disagree"), std::string::npos) << reports[r].message;
    EXPECT_NE(reports[r].message.find("rank 2 for allgather count=512"), std::string::npos) << reports[r].message;
  }
}

TEST(FailuresTest, MismatchedDtypeFailsEveryRank) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  const std::string job = UniqueJob("dtype");
  auto reports = RunRanks(2, [&](int rank, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), job, 2, rank);
    if (!comm.ok()) return rep.Say(comm.error()), 2;
    char* s = static_cast<char*>(comm.Alloc(1 << 16));
    char* r = static_cast<char*>(comm.Alloc(1 << 18));
    dmagather_status_t st = comm.AllGather(s, r, 100, rank == 0 ? DMAGATHER_FLOAT16 : DMAGATHER_BFLOAT16);
    if (st == DMAGATHER_OK) st = comm.Wait();
    return Report(rep, st, comm.error());
  });
  for (const auto& r : reports) {
    EXPECT_EQ(r.status, DMAGATHER_INVALID_ARGUMENT) << r.message;
    EXPECT_NE(r.message.find("dtype=bfloat16"), std::string::npos) << r.message;
  }
}

TEST(FailuresTest, RankKilledMidOpGivesPeerFailedWithinOneSecond) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  struct Shared {
    std::atomic<uint64_t> kill_ns{0};
    std::atomic<uint64_t> error_ns[3];
  };
  Shared* sh = SharedPage<Shared>();
  const std::string job = UniqueJob("kill");
  const int world = 3;
  auto reports = RunRanks(world, [&](int rank, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), job, world, rank);
    if (!comm.ok()) return rep.Say(comm.error()), 2;
    char* s = static_cast<char*>(comm.Alloc(1 << 20));
    char* r = static_cast<char*>(comm.Alloc(4 << 20));
    std::vector<char> scratch;
    std::string why;
    if (!CheckAllGather(comm, s, r, DMAGATHER_INT64, 1000, Variant::kOutOfPlace, 11, &scratch, &why)) {
      return rep.Say(why), 1;
    }
    if (rank == 2) {  // Dies while ranks 0 and 1 wait for it in op #2.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      sh->kill_ns = common::MonotonicNs();
      raise(SIGKILL);
    }
    dmagather_status_t st = comm.AllGather(s, r, 1000, DMAGATHER_INT64);
    if (st == DMAGATHER_OK) st = comm.Wait();
    sh->error_ns[rank] = common::MonotonicNs();
    Report(rep, st, comm.error());
    // Later calls fail fast too, with the same reason.
    dmagather_status_t again = comm.AllGather(s, r, 1000, DMAGATHER_INT64);
    if (again == DMAGATHER_OK) again = comm.Wait();
    return again == DMAGATHER_PEER_FAILED ? 0 : 5;
  });
  EXPECT_EQ(reports[2].exit_code, 128 + SIGKILL);
  ASSERT_NE(sh->kill_ns.load(), 0u);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(reports[r].exit_code, 0) << reports[r].message;
    EXPECT_EQ(reports[r].status, DMAGATHER_PEER_FAILED) << reports[r].message;
    EXPECT_NE(reports[r].message.find("rank 2"), std::string::npos) << reports[r].message;
    // How fast is measured (bench/robustness), not asserted: a loaded
    // machine may take longer, and the verdict is the status above.
    const double latency_s = (sh->error_ns[r].load() - sh->kill_ns.load()) / 1e9;
    std::cerr << "rank " << r << " learned of the death after " << latency_s << " s\n";
  }
  ExpectDaemonServes(daemon->socket());
}

TEST(FailuresTest, OpTimeoutNamesTheMissingRank) {
  auto daemon = DaemonProcess::Start({"--op_timeout_s=0.5"});
  ASSERT_NE(daemon, nullptr);
  const std::string job = UniqueJob("timeout");
  struct Shared {
    std::atomic<int> answered{0};
  };
  Shared* sh = SharedPage<Shared>();
  auto reports = RunRanks(2, [&](int rank, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), job, 2, rank);
    if (!comm.ok()) return rep.Say(comm.error()), 2;
    char* s = static_cast<char*>(comm.Alloc(1 << 16));
    char* r = static_cast<char*>(comm.Alloc(1 << 18));
    if (rank == 1) {  // Never submits; stays until rank 0 has its answer.
      return WaitFor([&] { return sh->answered.load() != 0; }, 100) ? 0 : 3;
    }
    auto t0 = std::chrono::steady_clock::now();
    dmagather_status_t st = comm.AllGather(s, r, 10, DMAGATHER_UINT8);
    if (st == DMAGATHER_OK) st = comm.Wait();
    const int rc =
        Report(rep, st, comm.error(), std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    sh->answered.store(1);
    return rc;
  });
  EXPECT_EQ(reports[0].status, DMAGATHER_TIMEOUT) << reports[0].message;
  EXPECT_NE(reports[0].message.find("rank(s) 1 never submitted it"), std::string::npos) << reports[0].message;
  EXPECT_EQ(reports[1].exit_code, 0);
  EXPECT_GE(reports[0].seconds, 0.5) << "timed out before --op_timeout_s";
  FreeSharedPage(sh);
}

// A 2-rank job in which rank 0 has submitted an op and waits for it while
// rank 1 has joined but never submits: something else must end the wait.
class StuckOp {
 public:
  explicit StuckOp(DaemonProcess* daemon) {
    struct Shared {
      std::atomic<int> submitted{0};
      std::atomic<int> release{0};
    };
    auto* sh = SharedPage<Shared>();
    shared_release_ = &sh->release;
    const std::string job = UniqueJob("stuck");
    const std::string socket = daemon->socket();
    waiter_ = std::make_unique<RankProcess>(0, [=](int rank, const Reporter& rep) {
      Comm comm(socket.c_str(), job, 2, rank);
      if (!comm.ok()) return rep.Say(comm.error()), 2;
      char* s = static_cast<char*>(comm.Alloc(1 << 16));
      char* r = static_cast<char*>(comm.Alloc(1 << 18));
      dmagather_status_t st = comm.AllGather(s, r, 10, DMAGATHER_UINT8);
      sh->submitted = 1;
      auto t0 = std::chrono::steady_clock::now();
      if (st == DMAGATHER_OK) st = comm.Wait();
      return Report(rep, st, comm.error(),
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    });
    idler_ = std::make_unique<RankProcess>(1, [=](int rank, const Reporter&) {
      Comm comm(socket.c_str(), job, 2, rank);
      // Joins, never submits, and stays until the waiter's verdict is in.
      WaitFor([&] { return sh->release.load() != 0; }, 100);
      return 0;
    });
    for (int i = 0; i < 500 && sh->submitted == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    submitted_ = sh->submitted == 1;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // Rank 0 is in its wait now.
  }
  bool submitted() const { return submitted_; }
  RankReport Waiter() {
    RankReport r = waiter_->Reap(60);
    shared_release_->store(1);
    return r;
  }
  ~StuckOp() { shared_release_->store(1); }

 private:
  std::atomic<int>* shared_release_ = nullptr;
  std::unique_ptr<RankProcess> waiter_, idler_;
  bool submitted_ = false;
};

// A daemon that does not come back: after the grace period the waiting
// rank gets UNAVAILABLE naming it (a daemon that does come back takes the
// job back: restart_test).
TEST(FailuresTest, DaemonKilledAndNotBackGivesUnavailable) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  setenv("DMAGATHER_RECONNECT_S", "1", 1);
  StuckOp stuck(daemon.get());
  unsetenv("DMAGATHER_RECONNECT_S");
  ASSERT_TRUE(stuck.submitted());
  daemon->Stop(SIGKILL);
  RankReport r0 = stuck.Waiter();
  EXPECT_EQ(r0.status, DMAGATHER_UNAVAILABLE) << r0.message;
  EXPECT_NE(r0.message.find("dmagatherd"), std::string::npos) << r0.message;
  EXPECT_NE(r0.message.find("DMAGATHER_RECONNECT_S"), std::string::npos) << r0.message;
  std::cerr << "the waiting rank gave up on the daemon after " << r0.seconds << " s\n";
}

// SIGTERM fails no op: it leaves the waiting op to the next daemon and
// exits cleanly; with none within the grace period, UNAVAILABLE.
TEST(FailuresTest, SigtermLeavesWaitingOpsToTheNextDaemonAndExitsCleanly) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  setenv("DMAGATHER_RECONNECT_S", "1", 1);
  StuckOp stuck(daemon.get());
  unsetenv("DMAGATHER_RECONNECT_S");
  ASSERT_TRUE(stuck.submitted());
  const std::string socket = daemon->socket();
  int status = daemon->Stop(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "exit status " << status;
  RankReport r0 = stuck.Waiter();
  EXPECT_EQ(r0.status, DMAGATHER_UNAVAILABLE) << r0.message;
  EXPECT_NE(r0.message.find("shutting down"), std::string::npos) << r0.message;
  EXPECT_NE(r0.message.find("no dmagatherd took the job back within 1 s"), std::string::npos) << r0.message;
  EXPECT_NE(access(socket.c_str(), F_OK), 0) << "socket left behind";
}

TEST(FailuresTest, NoDaemonIsUnavailableWithinOneSecond) {
  char dir[] = "/tmp/dmagather-nodaemon-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string missing = std::string(dir) + "/absent.sock";
  auto t0 = std::chrono::steady_clock::now();
  auto reports = RunRanks(1, [&](int, const Reporter& rep) {
    Comm comm(missing.c_str(), "nodaemon", 1, 0);
    return Report(rep, comm.init_status(), comm.error());
  });
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(reports[0].status, DMAGATHER_UNAVAILABLE);
  EXPECT_NE(reports[0].message.find("is dmagatherd running"), std::string::npos) << reports[0].message;
  EXPECT_LT(s, 1.0);

  // A stale socket file with nobody listening.
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  const std::string stale = daemon->dir() + "/stale.sock";
  ASSERT_EQ(link(daemon->socket().c_str(), stale.c_str()), 0);
  daemon->Stop(SIGKILL);
  t0 = std::chrono::steady_clock::now();
  reports = RunRanks(1, [&](int, const Reporter& rep) {
    Comm comm(stale.c_str(), "stale", 1, 0);
    return Report(rep, comm.init_status(), comm.error());
  });
  s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(reports[0].status, DMAGATHER_UNAVAILABLE) << reports[0].message;
  EXPECT_LT(s, 1.5);
  rmdir(dir);
}

TEST(FailuresTest, JoinTimesOutNamingMissingRanks) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  setenv("DMAGATHER_JOIN_TIMEOUT_MS", "400", 1);
  auto reports = RunRanks(1, [&](int, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), UniqueJob("lonely"), 3, 0);
    return Report(rep, comm.init_status(), comm.error());
  });
  unsetenv("DMAGATHER_JOIN_TIMEOUT_MS");
  EXPECT_EQ(reports[0].status, DMAGATHER_TIMEOUT) << reports[0].message;
  EXPECT_NE(reports[0].message.find("missing rank(s) 1,2"), std::string::npos) << reports[0].message;
  ExpectDaemonServes(daemon->socket());
}

TEST(FailuresTest, SameRankTwiceIsRefused) {
  auto daemon = DaemonProcess::Start();
  ASSERT_NE(daemon, nullptr);
  const std::string job = UniqueJob("dup");
  setenv("DMAGATHER_JOIN_TIMEOUT_MS", "1500", 1);
  RankProcess first(0, [&](int, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), job, 2, 0);
    return Report(rep, comm.init_status(), comm.error());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // A head start, not a guarantee.
  auto second = RunRanks(1, [&](int, const Reporter& rep) {
    Comm comm(daemon->socket().c_str(), job, 2, 0);
    return Report(rep, comm.init_status(), comm.error());
  });
  unsetenv("DMAGATHER_JOIN_TIMEOUT_MS");
  // Usually the first is in first; on a loaded machine the second may be.
  // Either way one of them is refused, naming the rank, and the other
  // times out waiting for rank 1.
  RankReport a = first.Reap(30);
  const RankReport& refused = a.status == DMAGATHER_INVALID_ARGUMENT ? a : second[0];
  const RankReport& waited = a.status == DMAGATHER_INVALID_ARGUMENT ? second[0] : a;
  EXPECT_EQ(refused.status, DMAGATHER_INVALID_ARGUMENT) << refused.message;
  EXPECT_NE(refused.message.find("rank 0 of job"), std::string::npos) << refused.message;
  EXPECT_EQ(waited.status, DMAGATHER_TIMEOUT) << waited.message;
}

}  // namespace
}  // namespace dmagather::testing
