// The GPU engine's logic on the fake runtime (CPU threads + memcpy): the
// same engine code that runs over CUDA and HIP. Every test runs twice: with
// device-side ready waits and the CUDA transfer cap (as --backend=cuda), and
// with CPU gating and the HIP cap (as --backend=hip). Assertions are on the
// bytes that land in the output buffers and on the order and status of
// completions.
#include "server/engines/gpu/gpu_engine.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_gpu_runtime.h"
#include "tests/server/engines/gpu/engine_fixture.h"

namespace dmagather::server::engines::gpu {
namespace {

using testing::FakeRuntime;

using enginetest::Flavor;
using enginetest::GpuEngineTest;
using enginetest::Job;
using enginetest::kCudaLike;
using enginetest::kHipLike;
using enginetest::Rank;
using enginetest::TestOp;

TEST_P(GpuEngineTest, ChunkedMultiWaveOpsAreBitExact) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 64 << 10;
  eo.streams_per_device = 3;
  eo.max_batch = 2;
  Start(2, eo);
  // 4 ranks over 2 devices; shards not a multiple of the chunk.
  auto job = MakeJob({0, 1, 0, 1}, (1 << 20) + 4097);
  for (uint32_t seq = 1; seq <= 3; ++seq) {
    job->Fill(seq);
    TestOp op(&log_, 0);
    job->Plan(&op, seq);
    job->SetReady(seq);
    engine_->Execute(&op);
    ASSERT_TRUE(op.Wait());
    ASSERT_TRUE(op.result.ok()) << op.result;
    EXPECT_EQ(job->Wrong(seq), 0u) << "op " << seq;
  }
  EXPECT_LE(fake_->largest_chunk(), 64u << 10);
  // 12 copies of 17 chunks each, 3 times.
  EXPECT_EQ(engine_->stats().chunks, 3u * 12 * 17);
  EXPECT_EQ(engine_->stats().same_device_copies, 3u * 4);  // Ranks 0/2 and 1/3 share a device.
}

TEST_P(GpuEngineTest, ChunksNeverExceedTheRuntimeCap) {
  GpuEngine::Options eo;
  eo.chunk_bytes = uint64_t{1} << 30;  // Asked for 1 GiB...
  Start(1, eo);
  EXPECT_EQ(engine_->chunk_bytes(), GetParam().cap);  // ...capped at the runtime's limit.
  engine_.reset();
  // The same cap logic with a small cap, moving real data.
  Start(2, eo, /*cap=*/32 << 10);
  EXPECT_EQ(engine_->chunk_bytes(), 32u << 10);
  auto job = MakeJob({0, 1}, 300000);
  job->Fill(1);
  TestOp op(&log_, 0);
  job->Plan(&op, 1);
  job->SetReady(1);
  engine_->Execute(&op);
  ASSERT_TRUE(op.Wait());
  ASSERT_TRUE(op.result.ok()) << op.result;
  EXPECT_EQ(job->Wrong(1), 0u);
  EXPECT_LE(fake_->largest_chunk(), 32u << 10);
}

TEST_P(GpuEngineTest, ManyDevicesManyJobsInterleaved) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 16 << 10;
  Start(8, eo);
  std::vector<std::unique_ptr<Job>> jobs;
  jobs.push_back(MakeJob({0, 1, 2, 3, 4, 5, 6, 7}, 40000));
  jobs.push_back(MakeJob({7, 6, 5, 4}, 70001));
  jobs.push_back(MakeJob({2, 5}, 123457));
  constexpr uint32_t kOps = 6;
  for (uint32_t seq = 1; seq <= kOps; ++seq) {
    std::vector<std::unique_ptr<TestOp>> ops;
    for (size_t j = 0; j < jobs.size(); ++j) {
      jobs[j]->Fill(seq);
      ops.push_back(std::make_unique<TestOp>(&log_, static_cast<int>(j)));
      jobs[j]->Plan(ops.back().get(), seq);
      jobs[j]->SetReady(seq);
      engine_->Execute(ops.back().get());
    }
    for (size_t j = 0; j < jobs.size(); ++j) {
      ASSERT_TRUE(ops[j]->Wait());
      ASSERT_TRUE(ops[j]->result.ok()) << ops[j]->result;
      EXPECT_EQ(ops[j]->calls, 1);
      EXPECT_EQ(jobs[j]->Wrong(seq), 0u) << "job " << j << " op " << seq;
    }
  }
}

TEST_P(GpuEngineTest, CompletionIsInOrderPerDeviceAndASlowDeviceDelaysOnlyItsOwn) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 8 << 10;
  Start(4, eo);
  // Device 0 is held: its chunks wait until the test releases it, so the
  // slow job cannot finish an op before the fast job has finished all of
  // its own, however the threads are scheduled.
  fake_->HoldDevice(0);
  auto slow = MakeJob({0, 1}, 16 << 10);  // Its copies into rank 0 run on device 0.
  auto fast = MakeJob({2, 3}, 16 << 10);
  constexpr uint32_t kOps = 5;
  std::vector<std::unique_ptr<TestOp>> slow_ops, fast_ops;
  slow->SetReady(kOps);
  fast->SetReady(kOps);
  slow->Fill(1);
  fast->Fill(1);
  for (uint32_t seq = 1; seq <= kOps; ++seq) {
    slow_ops.push_back(std::make_unique<TestOp>(&log_, 0));
    slow->Plan(slow_ops.back().get(), seq);
    engine_->Execute(slow_ops.back().get());
  }
  for (uint32_t seq = 1; seq <= kOps; ++seq) {
    fast_ops.push_back(std::make_unique<TestOp>(&log_, 1));
    fast->Plan(fast_ops.back().get(), seq);
    engine_->Execute(fast_ops.back().get());
  }
  // Issued after every slow op, the fast job's ops are not held behind them.
  for (auto& op : fast_ops) ASSERT_TRUE(op->Wait());
  for (auto& op : slow_ops) EXPECT_FALSE(op->Done()) << "a slow op finished while its device was held";
  fake_->ReleaseDevice(0);
  for (auto& op : slow_ops) ASSERT_TRUE(op->Wait());
  std::vector<uint32_t> slow_order, fast_order;
  {
    std::lock_guard<std::mutex> lock(log_.mu);
    for (const auto& [job_index, seq] : log_.done) (job_index == 0 ? slow_order : fast_order).push_back(seq);
  }
  EXPECT_EQ(slow_order, (std::vector<uint32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(fast_order, (std::vector<uint32_t>{1, 2, 3, 4, 5}));
  for (auto& op : slow_ops) EXPECT_TRUE(op->result.ok()) << op->result;
  EXPECT_EQ(slow->Wrong(1), 0u);
  EXPECT_EQ(fast->Wrong(1), 0u);
}

TEST_P(GpuEngineTest, CopiesDoNotStartBeforeEveryReadyFlagReachesTheSeq) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 16 << 10;
  Start(2, eo);
  auto job = MakeJob({0, 1, 0}, 50000);
  job->Fill(7);
  job->SetReady(6);
  job->ranks[0]->SetReady(7);
  job->ranks[1]->SetReady(7);  // Rank 2 is one op behind.
  TestOp op(&log_, 0);
  job->Plan(&op, 7);
  engine_->Execute(&op);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(op.Done());
  EXPECT_EQ(job->Untouched(), uint64_t{6} * 50000);  // Not one byte moved.
  job->ranks[2]->SetReady(7);
  ASSERT_TRUE(op.Wait());
  ASSERT_TRUE(op.result.ok()) << op.result;
  EXPECT_EQ(job->Wrong(7), 0u);
}

// Ops queued far ahead of their ranks' ready flags: without a bound every
// one is issued with its device waits (cuda-like: one WaitValues call per
// device and op); with max_waits_ahead = 3 only three are, the rest wait
// on the CPU and go out without device waits once the flags are seen. All
// complete in order, bytes exact. CPU gating (hip-like) never waits on the
// device.
TEST_P(GpuEngineTest, DeviceWaitsStayWithinMaxWaitsAhead) {
  constexpr int kOps = 12;
  for (int bound : {0, 3}) {
    SCOPED_TRACE(::testing::Message() << "max_waits_ahead " << bound);
    GpuEngine::Options eo;
    eo.max_waits_ahead = bound;
    Start(2, eo);
    {
      std::lock_guard<std::mutex> lock(log_.mu);
      log_.done.clear();
    }
    auto job = MakeJob({0, 1}, 4096);
    ASSERT_NE(job, nullptr);
    job->Fill(1);
    std::vector<std::unique_ptr<TestOp>> ops;
    for (int i = 1; i <= kOps; ++i) {
      ops.push_back(std::make_unique<TestOp>(&log_, i));
      job->Plan(ops.back().get(), i);
      engine_->Execute(ops.back().get());
    }
    const int ahead = !GetParam().device_waits ? 0 : bound == 0 ? kOps : bound;
    for (int i = 0; i < 30000 && fake_->wait_calls() < 2 * ahead; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Room for a wrong engine to issue more.
    EXPECT_EQ(fake_->wait_calls(), 2 * ahead);
    EXPECT_EQ(job->Untouched(), uint64_t{2} * 4096);  // Nothing ran: no flag is set.
    job->SetReady(kOps);
    for (auto& op : ops) {
      ASSERT_TRUE(op->Wait());
      EXPECT_TRUE(op->result.ok()) << op->result;
    }
    EXPECT_EQ(fake_->wait_calls(), 2 * ahead);  // The held ops went out with their flags seen.
    if (GetParam().device_waits) {
      EXPECT_EQ(engine_->stats().held_on_cpu, uint64_t(kOps - ahead)) << "the ops the bound held, counted";
    }
    EXPECT_EQ(job->Wrong(1), 0u);
    std::lock_guard<std::mutex> lock(log_.mu);
    ASSERT_EQ(log_.done.size(), size_t{kOps});
    for (int i = 0; i < kOps; ++i) EXPECT_EQ(log_.done[i].second, uint32_t(i + 1));
  }
}

TEST_P(GpuEngineTest, ReadyFlagsCompareWrapping) {
  Start(2);
  auto job = MakeJob({0, 1}, 4096);
  const uint32_t seq = 2;  // The flag wrapped from 0xffffffff to 3: >= 2.
  job->Fill(seq);
  job->SetReady(3);
  TestOp op(&log_, 0);
  job->Plan(&op, seq);
  engine_->Execute(&op);
  ASSERT_TRUE(op.Wait());
  EXPECT_TRUE(op.result.ok()) << op.result;
  EXPECT_EQ(job->Wrong(seq), 0u);
}

TEST_P(GpuEngineTest, AChunkThatFailsFailsItsOpAndLaterOpsProceed) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 8 << 10;
  Start(2, eo);
  auto job = MakeJob({0, 1}, 40000);
  fake_->FailChunk(1, 3, absl::DataLossError("injected: SDMA descriptor error"));
  job->Fill(1);
  job->SetReady(1);
  TestOp op1(&log_, 0);
  job->Plan(&op1, 1);
  engine_->Execute(&op1);
  ASSERT_TRUE(op1.Wait());
  EXPECT_EQ(op1.calls, 1);
  EXPECT_EQ(op1.result.code(), absl::StatusCode::kDataLoss) << op1.result;
  EXPECT_NE(op1.result.message().find("injected"), std::string::npos);
  for (uint32_t seq = 2; seq <= 3; ++seq) {
    job->Fill(seq);
    job->SetReady(seq);
    TestOp op(&log_, 0);
    job->Plan(&op, seq);
    engine_->Execute(&op);
    ASSERT_TRUE(op.Wait());
    ASSERT_TRUE(op.result.ok()) << op.result;
    EXPECT_EQ(job->Wrong(seq), 0u);
  }
}

TEST_P(GpuEngineTest, ACopyCallThatFailsFailsItsOpAndLaterOpsProceed) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 8 << 10;
  eo.max_batch = 1;
  Start(2, eo);
  auto job = MakeJob({0, 1, 1}, 30000);
  fake_->FailCopyCall(1, 2, absl::InternalError("injected: copy call refused"));
  job->Fill(1);
  job->SetReady(1);
  TestOp op1(&log_, 0);
  job->Plan(&op1, 1);
  engine_->Execute(&op1);
  ASSERT_TRUE(op1.Wait());
  EXPECT_EQ(op1.calls, 1);
  EXPECT_EQ(op1.result.code(), absl::StatusCode::kInternal);
  EXPECT_NE(op1.result.message().find("injected: copy call refused"), std::string::npos) << op1.result;
  job->Fill(2);
  job->SetReady(2);
  TestOp op2(&log_, 0);
  job->Plan(&op2, 2);
  engine_->Execute(&op2);
  ASSERT_TRUE(op2.Wait());
  ASSERT_TRUE(op2.result.ok()) << op2.result;
  EXPECT_EQ(job->Wrong(2), 0u);
}

TEST_P(GpuEngineTest, StopFinishesWorkInFlight) {
  GpuEngine::Options eo;
  eo.chunk_bytes = 8 << 10;
  Start(2, eo);
  fake_->SetChunkDelayUs(0, 500);
  fake_->SetChunkDelayUs(1, 500);
  auto job = MakeJob({0, 1}, 64 << 10);
  job->Fill(1);
  job->SetReady(3);
  std::vector<std::unique_ptr<TestOp>> ops;
  for (uint32_t seq = 1; seq <= 3; ++seq) {
    ops.push_back(std::make_unique<TestOp>(&log_, 0));
    job->Plan(ops.back().get(), seq);
    engine_->Execute(ops.back().get());
  }
  engine_->Stop();
  for (auto& op : ops) {
    EXPECT_TRUE(op->Done());
    EXPECT_TRUE(op->result.ok()) << op->result;
  }
  EXPECT_EQ(job->Wrong(1), 0u);
}

// The design case's steady state: the ranks' done flags are written by the
// devices after the copies, so ranks go from op to op with the engine's
// completion threads seeing nothing end (no CPU on the data path). Two GPUs
// pulling from each other: the finisher (device 0) waits for device 1's
// share before it writes. The CPU then ends every op as before. On the
// hip-like runtime (no device writes) the flags stay the CPU's.
TEST_P(GpuEngineTest, DevicesWriteDoneFlagsWithoutTheCpu) {
  Start(2);
  auto job = MakeJob({0, 1}, 64 << 10);
  ASSERT_NE(job, nullptr);
  constexpr uint32_t kOps = 20;
  std::vector<std::unique_ptr<TestOp>> ops;
  if (!GetParam().device_waits) {
    job->Fill(1);
    job->SetReady(1);
    ops.push_back(std::make_unique<TestOp>(&log_, 0));
    job->Plan(ops.back().get(), 1);
    engine_->Execute(ops.back().get());
    ASSERT_TRUE(ops.back()->Wait());
    EXPECT_TRUE(ops.back()->result.ok()) << ops.back()->result;
    EXPECT_EQ(job->Wrong(1), 0u);
    EXPECT_EQ(fake_->write_calls(), 0);
    for (auto& k : job->ranks) EXPECT_EQ(k->Done(), 0u) << "no device writes: the scheduler publishes done";
    return;
  }
  fake_->HoldQueries(true);
  for (uint32_t k = 1; k <= kOps; ++k) {
    job->Fill(k);
    job->SetReady(k);
    ops.push_back(std::make_unique<TestOp>(&log_, 0));
    job->Plan(ops.back().get(), k);
    engine_->Execute(ops.back().get());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (auto& r : job->ranks) {
      while (static_cast<int32_t>(r->Done() - k) < 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
      ASSERT_EQ(r->Done(), k) << "op " << k << ": the rank's done flag did not move";
    }
    ASSERT_EQ(job->Wrong(k), 0u) << "op " << k << ": done written before the copies ended";
  }
  EXPECT_EQ(fake_->write_calls(), int(kOps)) << "one write per op, by one device";
  for (auto& op : ops) EXPECT_FALSE(op->Done()) << "the CPU saw an op end while its queries were held";
  fake_->HoldQueries(false);
  for (auto& op : ops) {
    ASSERT_TRUE(op->Wait());
    EXPECT_TRUE(op->result.ok()) << op->result;
  }
}

// While a job is active the engine's threads stay awake: ops that come
// after gaps (a trainer's compute between layers) cost no thread a wake-up
// while the gaps are inside Options::stay_awake_ns. The window arm's clock
// is a fake the test moves 2 ms a gap (past the 200 us spin, 24 ms in all,
// inside the 1 s window), so the threads may never sleep there whatever
// the machine's load; the control arm (no window, the real clock) posts each op
// only once every engine thread is seen asleep, so each op must wake one.
TEST_P(GpuEngineTest, OpsAfterGapsWakeNoThreadWhileTheJobIsActive) {
  for (const bool awake : {false, true}) {
    SCOPED_TRACE(::testing::Message() << (awake ? "window" : "no window"));
    common::testing::FakeClock clock;
    GpuEngine::Options eo;
    if (awake) {
      eo.stay_awake_ns = 1'000'000'000;
      eo.clock = &clock;
    }
    Start(2, eo);
    auto job = MakeJob({0, 1}, 16 << 10);
    ASSERT_NE(job, nullptr);
    constexpr uint32_t kOps = 12;
    uint64_t woken_before = 0;
    for (uint32_t k = 1; k <= kOps; ++k) {
      if (k == 2) woken_before = engine_->wakeups();  // The first op may find the threads asleep.
      if (awake) {
        clock.AdvanceNs(2'000'000);  // A gap of the job's.
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ASSERT_FALSE(engine_->ThreadsAsleep()) << "op " << k << ": asleep inside the window";
      } else {
        for (int i = 0; i < 20000 && !engine_->ThreadsAsleep(); ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ASSERT_TRUE(engine_->ThreadsAsleep()) << "op " << k << ": the engine's threads never slept";
      }
      job->Fill(k);
      job->SetReady(k);
      TestOp op(&log_, 0);
      job->Plan(&op, k);
      engine_->Execute(&op);
      ASSERT_TRUE(op.Wait());
      ASSERT_TRUE(op.result.ok()) << op.result;
      ASSERT_EQ(job->Wrong(k), 0u) << "op " << k;
    }
    const uint64_t woken = engine_->wakeups() - woken_before;
    if (awake) {
      EXPECT_EQ(woken, 0u) << "a thread slept inside the window";
    } else {
      EXPECT_GE(woken, uint64_t{kOps - 1}) << "each op found the threads asleep";
    }
    job.reset();
    engine_->Stop();
    engine_.reset();
  }
}

// A share that fails, refused at its copy call or in a chunk on the
// device: no device writes that op's done flags (the scheduler publishes
// them after the error record), and the next op's are written.
TEST_P(GpuEngineTest, AFailedShareWritesNoDoneFlag) {
  Start(2);
  auto job = MakeJob({0, 1}, 16 << 10);
  ASSERT_NE(job, nullptr);
  auto run = [&](uint32_t k) {
    job->Fill(k);
    job->SetReady(k);
    auto op = std::make_unique<TestOp>(&log_, 0);
    job->Plan(op.get(), k);
    engine_->Execute(op.get());
    EXPECT_TRUE(op->Wait());
    return op->result;
  };
  fake_->FailCopyCall(1, 1, absl::InternalError("injected: copy call refused"));
  EXPECT_FALSE(run(1).ok());
  fake_->FailChunk(1, 1, absl::DataLossError("injected: descriptor error"));
  EXPECT_FALSE(run(2).ok());
  for (auto& k : job->ranks) EXPECT_EQ(k->Done(), 0u) << "a failed op's done flag was written by a device";
  EXPECT_TRUE(run(3).ok());
  EXPECT_EQ(job->Wrong(3), 0u);
  const uint32_t want = GetParam().device_waits ? 3u : 0u;  // hip-like: no device writes at all.
  for (auto& k : job->ranks) EXPECT_EQ(k->Done(), want);
}

TEST_P(GpuEngineTest, StopFailsWorkThatCannotFinish) {
  GpuEngine::Options eo;
  eo.stop_drain_ms = 100;
  Start(2, eo);
  auto job = MakeJob({0, 1}, 8192);
  job->Fill(1);  // Never ready.
  TestOp op(&log_, 0);
  job->Plan(&op, 1);
  engine_->Execute(&op);
  const auto t0 = std::chrono::steady_clock::now();
  engine_->Stop();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_TRUE(op.Done());
  EXPECT_EQ(op.calls, 1);
  EXPECT_EQ(op.result.code(), absl::StatusCode::kUnavailable) << op.result;
  EXPECT_EQ(job->Untouched(), uint64_t{2} * 8192);
  // The abandoned copies are still queued on the fake streams: destroy the
  // engine (which cancels them) before the buffers go.
  engine_.reset();
  EXPECT_EQ(job->Untouched(), uint64_t{2} * 8192);
}

TEST_P(GpuEngineTest, ImportsAreCachedByHandleAndClosedWithTheLastReference) {
  Start(2);
  auto job = MakeJob({0, 1}, 4096);
  const int opens = fake_->ipc_opens();
  // The same allocation again: no second open.
  auto again = Import(*job->ranks[0], job->ranks[0]->recv.data(), job->ranks[0]->recv.size());
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again.get(), job->ranks[0]->recv_region.get());
  EXPECT_EQ(fake_->ipc_opens(), opens);
  EXPECT_EQ(fake_->ipc_open_now(), 4);
  // More bytes than the allocation has.
  RegionSpec spec;
  spec.kind = fake_->ipc_memory_kind();
  spec.bytes = 1 << 20;
  spec.handle = FakeRuntime::MakeHandle(job->ranks[1]->send.data() + 1, 4096);
  spec.rank = job->ranks[1]->er.get();
  auto big = engine_->Import(spec);
  EXPECT_EQ(big.status().code(), absl::StatusCode::kInvalidArgument) << big.status();
  EXPECT_EQ(fake_->ipc_open_now(), 4);
  // Another memory kind: FALLBACK from the runtime.
  spec.kind = "host_memfd";
  auto other = engine_->Import(spec);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition) << other.status();
  // A wrong handle size.
  spec.kind = fake_->ipc_memory_kind();
  spec.handle = "short";
  EXPECT_EQ(engine_->Import(spec).status().code(), absl::StatusCode::kInvalidArgument);
  again.reset();
  job.reset();
  EXPECT_EQ(fake_->ipc_open_now(), 0);
  EXPECT_EQ(fake_->flags_registered(), 0);
}

TEST_P(GpuEngineTest, AttachRankChecksTheDevice) {
  Start(2);
  alignas(4096) static uint32_t page[1024];
  RankAttach a;
  a.flag_pages = page;
  a.flag_bytes = sizeof(page);
  a.ready_word = page;
  a.device = DeviceRef{"cpu", -1};
  EXPECT_EQ(engine_->AttachRank(a).status().code(), absl::StatusCode::kFailedPrecondition);
  a.device = DeviceRef{fake_->device_kind(), 2};
  auto r = engine_->AttachRank(a);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("sees 2 device(s)"), std::string::npos) << r.status();
}

// The ring's staging (multi-node jobs) reads a rank's input and writes its
// output only once the rank has reached the op: WaitRankReady blocks until
// the rank's ready flag reaches the op's sequence number (wrapping compare),
// and ends with CANCELLED when the ring stops. Then StageOut/StageIn move
// the bytes between pinned host memory and rank memory.
TEST_P(GpuEngineTest, StagingWaitsForTheRanksReadyFlag) {
  Start(2);
  auto job = MakeJob({0, 1}, 4096);
  ASSERT_NE(job, nullptr);
  Rank& k = *job->ranks[1];
  std::atomic<bool> cancel{false};
  __atomic_store_n(k.ready, 6u, __ATOMIC_RELEASE);
  EXPECT_TRUE(engine_->WaitRankReady(k.er.get(), 6, cancel).ok());  // Reached: at once.
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    EXPECT_TRUE(engine_->WaitRankReady(k.er.get(), 7, cancel).ok());
    done.store(true);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(done.load()) << "returned before the rank reached op 7";
  __atomic_store_n(k.ready, 7u, __ATOMIC_RELEASE);
  waiter.join();
  EXPECT_TRUE(done.load());
  __atomic_store_n(k.ready, 0xfffffffeu, __ATOMIC_RELEASE);  // Just before the wrap: op 1 is ahead.
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    cancel.store(true);
  });
  EXPECT_EQ(engine_->WaitRankReady(k.er.get(), 1, cancel).code(), absl::StatusCode::kCancelled);
  stopper.join();
  // The staging copies, bit-exact both ways.
  auto host = engine_->AllocStaging(4096);
  ASSERT_TRUE(host.ok()) << host.status();
  for (size_t i = 0; i < k.send.size(); ++i) k.send[i] = char(i * 7 + 3);
  ASSERT_TRUE(engine_->StageOut(*host, k.send.data(), 4096, k.er.get()).ok());
  ASSERT_TRUE(engine_->StageIn(k.recv.data() + 4096, *host, 4096, k.er.get()).ok());
  EXPECT_EQ(std::memcmp(k.recv.data() + 4096, k.send.data(), 4096), 0);
  engine_->FreeStaging(*host);
}

INSTANTIATE_TEST_SUITE_P(Runtimes, GpuEngineTest, ::testing::Values(kCudaLike, kHipLike),
                         [](const ::testing::TestParamInfo<Flavor>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace dmagather::server::engines::gpu
