// DeviceWorker (with its ShareCompletion and EndEvents) on the fake runtime,
// driven as the engine's router drives it: a share issued on the posting
// thread and one on the device's own issuing thread land byte for byte and
// end their op through the completion thread, their end events back in the
// pool and their bytes counted; a refused copy call fails the op with its
// error; two devices' shares of one op end with the finisher's done write
// of every rank's flag; end events are reused; two devices pulling from each other on the driver
// model make no lock-order cycle; an abandoned worker fails what it was
// handed.
#include "server/engines/gpu/device_worker.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "server/engines/gpu/gpu_rank.h"
#include "server/engines/gpu/router.h"
#include "tests/server/engines/gpu/objects_fixture.h"

namespace dmagather::server::engines::gpu::objtest {
namespace {

class DeviceWorkerTest : public ObjectsTest {
 protected:
  // `devices` workers over a fake of that many devices, every pair peers.
  // driver_model: the fake's context locks and bounded stream queues, with
  // its lock-order checker (fake_gpu_runtime.h).
  void StartWorkers(int devices, bool issuing_threads, bool driver_model = false) {
    FakeRuntime::Options fo;
    fo.devices = devices;
    fo.driver_model = driver_model;
    fo.stream_depth = driver_model ? 16 : 0;
    Start(fo);
    peers_ = PeerTable(devices);
    for (int a = 0; a < devices; ++a) {
      for (int b = 0; b < devices; ++b) {
        if (a == b) continue;
        auto ok = runtime_->EnablePeerAccess(a, b);
        ASSERT_TRUE(ok.ok() && *ok);
        peers_.Set(a, b, true);
      }
    }
    runtime_->UsePeers(peers_);
    router_ = std::make_unique<Router>(peers_, "fake GPU");
    watch_ = std::make_unique<IssueWatch>(devices, common::RealClock(), [](const EngineRank* r) {
      return IssueWatch::Words{AsGpu(r)->ready_word(), AsGpu(r)->done_word()};
    });
    DeviceWorker::Shared s;
    s.runtime = runtime_.get();
    s.order = order_.get();
    s.peers = &peers_;
    s.lockstep = &lockstep_;
    s.ops = &pool_;
    s.watch = watch_.get();
    s.figures = &figures_;
    s.clock = &common::RealClock();
    s.abandon = &abandon_;
    s.chunk_bytes = 1 << 20;
    s.streams = 4;
    for (int d = 0; d < devices; ++d) {
      workers_.push_back(std::make_unique<DeviceWorker>(s, d));
      ASSERT_TRUE(workers_.back()->Init().ok());
      workers_.back()->Start(issuing_threads);
    }
  }
  void TearDown() override {
    workers_.clear();
    ObjectsTest::TearDown();
  }
  // What the engine's Issue does: route, track, post each share, close the
  // router's own share.
  void Issue(EngineOp* op) {
    ASSERT_TRUE(router_->Route(op).ok());
    InFlightOp* t = pool_.Take();
    t->Begin(op, loads_.Begin(op->job_id, false), false, absl::OkStatus(), static_cast<int>(workers_.size()));
    const int finisher = t->ChooseFinisher(router_->involved(), runtime_->device_writes(), loads_);
    t->OpenShares(router_->shares(), lockstep_.Next());
    const int n = static_cast<int>(workers_.size());
    for (int i = 0; i < n; ++i) {
      const int d = finisher < 0 ? i : (finisher + 1 + i) % n;
      if (router_->involved()[d]) workers_[d]->Post(t);
    }
    pool_.Close(t, absl::OkStatus());
  }
  // Until every worker's completion holds nothing (bounded).
  bool Drained() {
    for (int i = 0; i < 10000; ++i) {
      bool empty = true;
      for (auto& w : workers_) empty &= w->CompletionPending() == 0 && w->IssuePending() == 0;
      if (empty) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  PeerTable peers_;
  std::unique_ptr<Router> router_;
  std::atomic<bool> abandon_{false};
  Lockstep lockstep_{common::RealClock(), abandon_};
  InFlightPool pool_{64, common::RealClock()};
  JobLoads loads_;
  std::unique_ptr<IssueWatch> watch_;
  DeviceWorker::Figures figures_;
  std::vector<std::unique_ptr<DeviceWorker>> workers_;
};

TEST_F(DeviceWorkerTest, AShareLandsAndEndsThroughTheCompletionThread) {
  for (bool thread : {false, true}) {
    SCOPED_TRACE(thread ? "issuing thread" : "posting thread issues");
    StartWorkers(1, thread);
    AddRank(0, 3 << 20, 2);  // Three chunks of a MiB per copy.
    AddRank(0, 3 << 20, 2);
    for (uint32_t seq = 1; seq <= 3; ++seq) {
      TestOp op(&log_, 0);
      Plan(&op, seq);
      Issue(&op);
      ASSERT_TRUE(Ended(op).ok());
      EXPECT_EQ(job_.Wrong(seq), 0u);
    }
    ASSERT_TRUE(Drained());
    EXPECT_EQ(workers_[0]->issued_bytes(), 3 * 2 * (3u << 20));
    EXPECT_EQ(figures_.chunks.load(), 3u * 2 * 3);
    EXPECT_EQ(pool_.free(), 64u);
    TearDown();
    figures_.chunks = 0;
  }
}

TEST_F(DeviceWorkerTest, ARefusedCopyCallFailsTheOp) {
  StartWorkers(1, false);
  AddRank(0, 4096, 2);
  AddRank(0, 4096, 2);
  fake_->FailCopyCall(0, 1, absl::InternalError("refused by the fake"));
  TestOp op(&log_, 0);
  Plan(&op, 1);
  Issue(&op);
  const absl::Status st = Ended(op);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  // The next op of the job goes through.
  TestOp next(&log_, 0);
  Plan(&next, 2);
  Issue(&next);
  EXPECT_TRUE(Ended(next).ok());
  EXPECT_EQ(job_.Wrong(2), 0u);
}

TEST_F(DeviceWorkerTest, TheFinisherWritesEveryRanksDoneFlag) {
  StartWorkers(2, true);
  AddRank(0, 64 << 10, 2);
  AddRank(1, 64 << 10, 2);
  for (uint32_t seq = 1; seq <= 4; ++seq) {
    TestOp op(&log_, 0);
    Plan(&op, seq);
    op.gpu_done = true;
    Issue(&op);
    const absl::Status st = Ended(op);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_EQ(job_.Wrong(seq), 0u);
    for (auto& r : job_.ranks) EXPECT_EQ(__atomic_load_n(r->done, __ATOMIC_ACQUIRE), seq) << "written by a device";
  }
  EXPECT_EQ(fake_->write_calls(), 4);
  EXPECT_EQ(figures_.done_written.load(), 4u);
  EXPECT_EQ(lockstep_.enqueued_through(), 4u);
}

// Two devices pulling from each other at once, each peer copy taking its
// own context and then the peer's in the driver model (the H1a case of
// docs/CUDA.md, "Locks and waits"): the device-order locks around each copy
// call leave the model no lock-order cycle, and every output is exact.
TEST_F(DeviceWorkerTest, TwoDevicesPullingFromEachOtherMakeNoLockCycle) {
  StartWorkers(2, /*issuing_threads=*/true, /*driver_model=*/true);
  AddRank(0, 3 << 20, 2);
  AddRank(1, 3 << 20, 2);
  for (uint32_t seq = 1; seq <= 20; ++seq) {
    TestOp op(&log_, 0);
    Plan(&op, seq);
    Issue(&op);
    const absl::Status st = Ended(op);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(job_.Wrong(seq), 0u) << "op " << seq;
  }
  EXPECT_TRUE(fake_->locks().cycles().empty()) << fake_->locks().cycles().front();
}

// A device's end events: filled at start, taken and given back; a new one
// is made when the pool is empty, and kept once given back.
TEST_F(DeviceWorkerTest, EndEventsAreReusedAndMadeWhenThePoolIsEmpty) {
  FakeRuntime::Options fo;
  fo.devices = 1;
  Start(fo);
  EndEvents events(*runtime_, 0);
  ASSERT_TRUE(events.Fill(2).ok());
  EXPECT_EQ(events.free(), 2u);
  GpuEvent a = events.Take();
  GpuEvent b = events.Take();
  EXPECT_EQ(events.free(), 0u);
  GpuEvent c = events.Take();  // Made now.
  ASSERT_NE(c, nullptr);
  EXPECT_NE(c, a);
  EXPECT_NE(c, b);
  for (GpuEvent e : {a, b, c}) events.Give(e);
  EXPECT_EQ(events.free(), 3u);
  EXPECT_EQ(events.Take(), c) << "the last given back first";
  events.Give(c);
}

TEST_F(DeviceWorkerTest, AnAbandonedWorkerFailsWhatItIsHanded) {
  StartWorkers(1, true);
  AddRank(0, 4096, 2);
  AddRank(0, 4096, 2);
  abandon_ = true;
  TestOp op(&log_, 0);
  Plan(&op, 1);
  Issue(&op);
  EXPECT_EQ(Ended(op).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(fake_->chunks_run(), 0u) << "nothing was issued";
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::objtest
