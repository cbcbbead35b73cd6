// Deadlock freedom of the GPU engine's issue path, on the fake runtime's
// driver model (fake_gpu_runtime.h): per-context locks taken by every
// driver call (a peer copy takes its device's context, then the peer's), a
// device wait that parks its stream, bounded stream queues whose full
// enqueue blocks the calling thread inside the call, and peer memory.
//
// Each test runs jobs whose ranks are threads standing for the ranks'
// streams as a blocking dmagather_allgather drives them: for op k, fill the
// input, write ready = k, wait for op k's done flag (written by a device
// after the copies on the cuda-like runtime; else the op's end), check the
// output byte for byte. Every op is handed to the engine up front (hundreds queued ahead
// of their flags, as the GPU suite's `stream` mode does). The verdicts:
// the checker's lock-order cycles (none), the watchdog (no stall: a stall
// fails the test with the wait-for report and aborts the model, so no test
// hangs), every op ended OK and every output exact. Each runs as cuda
// issues (ready waits on the device) and as hip does (ops gated on the CPU;
// peer copies take the same locks).
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/engines/gpu/gpu_engine.h"
#include "tests/fakes/fake_gpu_runtime.h"
#include "tests/fakes/lock_graph.h"
#include "tests/server/engines/gpu/engine_fixture.h"

namespace dmagather::server::engines::gpu {
namespace {

using enginetest::Job;
using enginetest::kCudaLike;
using enginetest::kHipLike;
using enginetest::TestOp;
using testing::FakeRuntime;
using testing::LockGraph;

// No op completed for this long: the watchdog reports a stall.
constexpr auto kStall = std::chrono::seconds(20);

struct Outcome {
  std::vector<std::string> lock_cycles;
  bool stalled = false;
  std::string report;  // The wait-for report at the stall.
  uint64_t wrong_bytes = 0;
  uint32_t ops_checked = 0;  // Rank-ops whose output was checked.
  uint32_t ops_failed = 0;
};

class DeadlockTest : public enginetest::GpuEngineTest {
 protected:
  void StartModel(int devices, int stream_depth, GpuEngine::Options eo) {
    FakeRuntime::Options fo;
    fo.devices = devices;
    fo.driver_model = true;
    fo.stream_depth = stream_depth;
    eo.stop_drain_ms = 2000;
    // The daemon's threads as the cuda backend runs them: awake, polling
    // without a lock, for 10 ms after their last work (--stay_awake_us).
    eo.stay_awake_ns = 10'000'000;
    Start(fo, eo);
  }

  // Runs `ops` ops of every job, each handed to the engine at once; the
  // ranks (one thread each) write ready k once op k-1 is done and checked.
  // `during` runs on a thread of its own while the ranks run, until `stop`.
  //
  // shared_ranks: rank r of every job is one thread (one process in several
  // jobs, e.g. two process groups), doing op k of each job in turn, in the
  // jobs' order; the ops are then handed to the engine in the reverse job
  // order (ingress matches each job on its own, so a later job's op k can
  // be complete first).
  Outcome Run(std::vector<Job*> jobs, uint32_t ops,
              const std::function<void(const std::atomic<bool>& stop)>& during = nullptr, bool shared_ranks = false) {
    Outcome out;
    std::vector<std::vector<std::unique_ptr<TestOp>>> all(jobs.size());
    for (size_t j = 0; j < jobs.size(); ++j) {
      Job& job = *jobs[j];
      for (size_t r = 0; r < job.ranks.size(); ++r) {
        fake_->DeclareFlagWriter(job.ranks[r]->ready,
                                 absl::StrCat("rank ", r, " of job ", job.id, " (writes ready k once op k-1 is done)"));
      }
      for (uint32_t k = 1; k <= ops; ++k) {
        all[j].push_back(std::make_unique<TestOp>(&log_, static_cast<int>(j)));
        job.Plan(all[j].back().get(), k);
      }
    }
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> progress{0}, wrong{0};
    std::atomic<uint32_t> checked{0}, failed{0};
    std::vector<std::thread> threads;
    Counts counts{stop, progress, wrong, checked, failed};
    for (size_t j = 0; j < (shared_ranks ? 1 : jobs.size()); ++j) {
      for (size_t r = 0; r < jobs[j]->ranks.size(); ++r) {
        threads.emplace_back([&, j, r] {
          pthread_setname_np(pthread_self(), absl::StrCat("rank", r, "job", jobs[j]->id).c_str());
          for (uint32_t seq = 1; seq <= ops && !stop.load(); ++seq) {
            for (size_t i = shared_ranks ? 0 : j; i < (shared_ranks ? jobs.size() : j + 1); ++i) {
              if (!RankOp(*jobs[i], static_cast<int>(r), seq, *all[i][seq - 1], counts)) return;
            }
          }
        });
      }
    }
    std::thread side;
    if (during) side = std::thread([&] { during(stop); });
    // Hand every op to the engine, job by job interleaved, as ingress does.
    for (uint32_t k = 0; k < ops; ++k) {
      for (size_t j = 0; j < jobs.size(); ++j) {
        engine_->Execute(all[shared_ranks ? jobs.size() - 1 - j : j][k].get());
      }
    }
    // The watchdog: progress or a stall, never a hang.
    const uint64_t want = [&] {
      uint64_t n = 0;
      for (Job* job : jobs) n += uint64_t{ops} * job->ranks.size();
      return n;
    }();
    uint64_t seen = progress.load();
    auto last = std::chrono::steady_clock::now();
    while (checked.load() + failed.load() < want) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      if (progress.load() != seen) {
        seen = progress.load();
        last = std::chrono::steady_clock::now();
      } else if (std::chrono::steady_clock::now() - last > kStall) {
        out.stalled = true;
        out.report = fake_->Diagnose();
        fake_->Abort();
        break;
      }
    }
    stop.store(true);
    for (auto& t : threads) t.join();
    if (side.joinable()) side.join();
    engine_->Stop();
    for (auto& v : all) {
      for (auto& op : v) {
        if (!op->Wait(out.stalled ? 10000 : 60000)) ADD_FAILURE() << "an op never ended, even after the abort";
      }
    }
    out.lock_cycles = fake_->locks().cycles();
    engine_.reset();  // Before the jobs' buffers go.
    out.wrong_bytes = wrong.load();
    out.ops_checked = checked.load();
    out.ops_failed = failed.load();
    return out;
  }

  struct Counts {
    const std::atomic<bool>& stop;
    std::atomic<uint64_t>& progress;
    std::atomic<uint64_t>& wrong;
    std::atomic<uint32_t>& checked;
    std::atomic<uint32_t>& failed;
  };

  // Rank r's op `seq` of `job`, as a blocking dmagather_allgather (or all-to-all) drives
  // it: fill the input, write ready, wait for done, check the output byte
  // for byte. False: stopped.
  static bool RankOp(Job& job, int r, uint32_t seq, TestOp& op, Counts& c) {
    enginetest::Rank& k = *job.ranks[r];
    for (uint64_t i = 0; i < job.shard; ++i) k.send[i] = Job::Byte(job.id, seq, r, i);
    job.CopyOwn(r, seq);
    k.SetReady(seq);
    // As a rank's stream: released by its done flag (written by a device
    // after the copies, where the runtime can), else by the op's end.
    bool flag = false;
    for (int i = 0;; ++i) {
      if (static_cast<int32_t>(k.Done() - seq) >= 0) {
        flag = true;
        break;
      }
      if (op.Wait(i < 100 ? 0 : 1)) break;
      if (c.stop.load()) return false;
    }
    c.progress.fetch_add(1);
    if (!flag && !op.result.ok()) {
      c.failed.fetch_add(1);
      return true;
    }
    uint64_t bad = 0;
    for (uint64_t j = 0; j < job.OutputBytes(seq); ++j) bad += k.recv[j] != job.Expected(seq, r, j);
    c.wrong.fetch_add(bad);
    c.checked.fetch_add(1);
    return true;
  }

  // The verdict every test asserts: no lock-order cycle, no stall, every
  // rank-op ended OK with its output exact.
  static void ExpectDeadlockFree(const Outcome& o, uint64_t rank_ops) {
    EXPECT_TRUE(o.lock_cycles.empty()) << "lock-order cycles:\n  " << absl::StrJoin(o.lock_cycles, "\n  ");
    EXPECT_FALSE(o.stalled) << "stalled; wait-for report:\n" << o.report;
    EXPECT_EQ(o.ops_failed, 0u);
    EXPECT_EQ(o.ops_checked, rank_ops) << "not every rank-op ran and was checked";
    EXPECT_EQ(o.wrong_bytes, 0u);
  }
};

// Two GPUs pulling from each other in every op: issuer 0 reads GPU 1's
// memory while issuer 1 reads GPU 0's, at the same instant.
TEST_P(DeadlockTest, TwoGpusPullFromEachOtherInOneOp) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 16 << 10;
  StartModel(2, 64, eo);
  auto job = MakeJob({0, 1}, 64 << 10);
  ASSERT_NE(job, nullptr);
  constexpr uint32_t kOps = 200;
  Outcome o = Run({job.get()}, kOps);
  ExpectDeadlockFree(o, 2 * kOps);
}

// Ops skewed across devices: device 0's issue is slow, so device 1 gets to
// op k+1 (and far beyond: 300 ops are queued) while device 0 is at op k;
// the streams' queues are short, so a device that runs ahead fills them.
TEST_P(DeadlockTest, OpsSkewedAcrossDevices) {
  for (bool parallel : {true, false}) {
    SCOPED_TRACE(parallel ? "parallel issue" : "serial issue");
    GpuEngine::Options eo;
    eo.chunk_bytes = 16 << 10;
    eo.parallel_issue = parallel;
    StartModel(2, 16, eo);
    fake_->SetCallDelayUs(0, 300);
    auto job = MakeJob({0, 1}, 32 << 10);
    ASSERT_NE(job, nullptr);
    constexpr uint32_t kOps = 300;
    Outcome o = Run({job.get()}, kOps);
    ExpectDeadlockFree(o, 2 * kOps);
  }
}

// Driver calls of other threads in the middle of issue: IPC opens and
// closes (each close also makes the next copy call of every device destroy
// the copy graphs over that memory), rank attach and release (portable
// host registrations, every context), on a gRPC-like thread while 4 GPUs
// issue.
TEST_P(DeadlockTest, ImportsGraphDestroyAndRanksRaceTheIssue) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 16 << 10;
  StartModel(4, 32, eo);
  auto job = MakeJob({0, 1, 2, 3}, 32 << 10);
  ASSERT_NE(job, nullptr);
  std::atomic<int> rounds{0};
  auto grpc = [&](const std::atomic<bool>& stop) {
    pthread_setname_np(pthread_self(), "grpc");
    fake_->locks().SetRole("gRPC thread (imports, attach, release)");
    std::vector<char> scratch(8192);
    for (int i = 0; !stop.load(); ++i) {
      enginetest::Rank& owner = *job->ranks[i % 4];
      auto region = Import(owner, scratch.data() + (i % 2) * 4096, 4096);  // OpenIpc on the owner's device.
      region.reset();                                                      // CloseIpc.
      auto extra =
          MakeJob(std::vector<int>{i % 4}, 4096);  // RegisterFlags, OpenIpc x2; released: CloseIpc x2, UnregisterFlags.
      extra.reset();
      rounds.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  };
  constexpr uint32_t kOps = 200;
  Outcome o = Run({job.get()}, kOps, grpc);
  ExpectDeadlockFree(o, 4 * kOps);
  EXPECT_GT(rounds.load(), 0) << "the racing thread never ran";
}

// Eight GPUs, one rank each: every issuer reads all seven peers.
TEST_P(DeadlockTest, EightGpus) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 16 << 10;
  StartModel(8, 32, eo);
  fake_->SetCallDelayUs(3, 200);
  auto job = MakeJob({0, 1, 2, 3, 4, 5, 6, 7}, 16 << 10);
  ASSERT_NE(job, nullptr);
  constexpr uint32_t kOps = 60;
  Outcome o = Run({job.get()}, kOps);
  ExpectDeadlockFree(o, 8 * kOps);
}

// Two jobs on the same four GPUs, ranks in opposite device order, ops
// interleaved: each job's waits park the streams the other job uses.
TEST_P(DeadlockTest, TwoJobs) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 16 << 10;
  StartModel(4, 32, eo);
  fake_->SetCallDelayUs(1, 200);
  auto a = MakeJob({0, 1, 2, 3}, 16 << 10);
  auto b = MakeJob({3, 2, 1, 0}, 24 << 10);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr uint32_t kOps = 80;
  Outcome o = Run({a.get(), b.get()}, kOps);
  ExpectDeadlockFree(o, 8 * kOps);
}

// All-gathers and all-to-alls (a reduce-scatter's movement) in one job and
// beside an all-gather job, on three GPUs that pull from each other: the
// all-to-all's copies read every peer's send at another offset, through the
// same issue path, locks and waits.
TEST_P(DeadlockTest, AllGathersAndAllToAllsMixed) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 8 << 10;
  StartModel(3, 32, eo);
  fake_->SetCallDelayUs(0, 150);
  auto a = MakeJob({0, 1, 2}, 24 << 10);
  auto b = MakeJob({2, 1, 0}, 12 << 10);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  a->mixed = true;
  constexpr uint32_t kOps = 80;
  Outcome o = Run({a.get(), b.get()}, kOps);
  ExpectDeadlockFree(o, 6 * kOps);
}

// One process per GPU in two jobs (two process groups over the same two
// GPUs, as DeepSpeed's expert and dense parameter groups): each rank does
// op k of job A, then op k of job B, and writes B's ready flag only once A's
// op k is done; ingress completes B's op k first. If B's ready wait parks a
// stream (or the CPU gate) that A's op k then queues behind, A waits for B,
// which waits for the ranks, which wait for A.
TEST_P(DeadlockTest, TwoJobsInOneProcessPerGpu) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 16 << 10;
  StartModel(2, 32, eo);
  auto a = MakeJob({0, 1}, 16 << 10);
  auto b = MakeJob({0, 1}, 24 << 10);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr uint32_t kOps = 60;
  Outcome o = Run({a.get(), b.get()}, kOps, nullptr, /*shared_ranks=*/true);
  ExpectDeadlockFree(o, 4 * kOps);
}

// The lockstep on its own: with device 0's calls slowed and every op ready
// at once (nothing else holds device 1 back), device 1 makes no copy call
// of op n before device 0 has made every copy call of op n - 1, and the
// other way round (the fake's call log is in call order).
TEST_P(DeadlockTest, OpsGoOutInLockstepAcrossDevices) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 16 << 10;
  StartModel(2, 0, eo);
  fake_->SetCallDelayUs(0, 500);
  auto job = MakeJob({0, 1}, 32 << 10);
  ASSERT_NE(job, nullptr);
  constexpr uint32_t kOps = 40;
  job->Fill(1);
  job->SetReady(kOps);
  fake_->ClearLogs();
  std::vector<std::unique_ptr<TestOp>> ops;
  for (uint32_t k = 1; k <= kOps; ++k) {
    ops.push_back(std::make_unique<TestOp>(&log_, 0));
    job->Plan(ops.back().get(), k);
    engine_->Execute(ops.back().get());
  }
  for (auto& op : ops) {
    ASSERT_TRUE(op->Wait());
    ASSERT_TRUE(op->result.ok()) << op->result;
  }
  EXPECT_EQ(job->Wrong(1), 0u);
  const auto calls = fake_->call_log();
  int total[2] = {0, 0};
  for (const auto& c : calls) ++total[c.device];
  ASSERT_GT(total[0], 0);
  ASSERT_EQ(total[0] % kOps, 0u);
  ASSERT_EQ(total[1] % kOps, 0u);
  const int per_op[2] = {total[0] / int(kOps), total[1] / int(kOps)};
  int seen[2] = {0, 0}, violations = 0;
  for (const auto& c : calls) {
    const int d = c.device, other = 1 - d;
    const int op = seen[d] / per_op[d];  // 0-based op of this call.
    if (seen[other] < op * per_op[other]) ++violations;
    ++seen[d];
  }
  EXPECT_EQ(violations, 0) << "copy calls of an op made before the other device had issued the op before it";
}

INSTANTIATE_TEST_SUITE_P(Runtimes, DeadlockTest, ::testing::Values(kCudaLike, kHipLike),
                         [](const ::testing::TestParamInfo<enginetest::Flavor>& i) {
                           return std::string(i.param.name);
                         });

// The checker itself: an AB-BA between two threads is a cycle; the same
// under a lock both hold around it, or made by one thread, is not.
TEST(LockGraphTest, FindsInversionsBetweenThreadsOnly) {
  LockGraph g;
  // Each list of lock orders is taken, one after another, by one new thread.
  auto take = [&](const std::string& role, std::vector<std::vector<std::string>> orders, const std::string& gate) {
    std::thread([&, role, orders, gate] {
      g.SetRole(role);
      for (const auto& order : orders) {
        if (!gate.empty()) g.Held(gate, "gate");
        for (const auto& l : order) ASSERT_TRUE(g.Acquire(l, "call"));
        for (auto it = order.rbegin(); it != order.rend(); ++it) g.Release(*it);
        if (!gate.empty()) g.Release(gate);
      }
    }).join();
  };
  take("t1", {{"a", "b"}}, "g");
  take("t2", {{"b", "a"}}, "g");             // Both under g: serialised.
  take("t3", {{"c", "d"}, {"d", "c"}}, "");  // One thread: it cannot wait for itself.
  EXPECT_TRUE(g.cycles().empty()) << absl::StrJoin(g.cycles(), "\n");
  take("t4", {{"e", "f"}}, "");
  take("t5", {{"f", "e"}}, "");
  const auto c = g.cycles();
  ASSERT_EQ(c.size(), 1u) << absl::StrJoin(c, "\n");
  EXPECT_NE(c[0].find("[t5"), std::string::npos) << c[0];
  EXPECT_NE(c[0].find("took e while holding f"), std::string::npos) << c[0];
}

}  // namespace
}  // namespace dmagather::server::engines::gpu
