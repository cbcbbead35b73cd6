// ReadyGate: the GPU engine's CPU gate on its own, with an issuer that records
// what was issued and failed. Ops of one job go in order, jobs pass each
// other, a full gate holds its submitter back, an abandoned gate fails what
// it holds, and an active gate's thread is woken by no op.
#include "server/engines/gpu/ready_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "tests/fakes/fake_clock.h"

namespace dmagather::server::engines::gpu {
namespace {

struct Op : EngineOp {
  Op(uint64_t job, uint32_t s) {
    job_id = job;
    seq = s;
  }
  void OnEngineDone(absl::Status status) override {
    result = std::move(status);
    done = true;
  }
  std::atomic<bool> ready{false};
  std::atomic<bool> done{false};
  absl::Status result;
};

// The issuer's record: ops issued, in order ("job:seq").
class Record : public OpIssuer {
 public:
  OpIssuer& Issuer() { return *this; }
  bool MayIssue(const EngineOp& op) override { return static_cast<const Op&>(op).ready.load(); }
  void Issue(EngineOp* op) override { Add(op); }
  void Fail(EngineOp* op, const absl::Status& st) override { op->OnEngineDone(st); }
  void Add(EngineOp* op) {
    absl::MutexLock lock(&mu_);
    issued_.push_back(std::to_string(op->job_id) + ":" + std::to_string(op->seq));
  }
  std::vector<std::string> issued() {
    absl::MutexLock lock(&mu_);
    return issued_;
  }
  // Waits (a few seconds at most) until `n` ops were issued.
  bool AwaitIssued(size_t n) {
    for (int i = 0; i < 5000; ++i) {
      if (issued().size() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> issued_ ABSL_GUARDED_BY(mu_);
};

TEST(ReadyGateTest, OpsOfAJobGoInOrderAndJobsPassEachOther) {
  Record rec;
  ReadyGate gate(common::RealClock(), 0, 64, rec.Issuer());
  gate.Start();
  Op a1(1, 1), a2(1, 2), b1(2, 1);
  a2.ready = true;
  b1.ready = true;
  EXPECT_TRUE(gate.Submit(&a1)) << "not ready: gated";
  EXPECT_TRUE(gate.Submit(&a2)) << "ready, but behind its job's gated op";
  EXPECT_FALSE(gate.Submit(&b1)) << "another job's ready op passes";
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(rec.issued(), std::vector<std::string>({"2:1"}));
  a1.ready = true;
  ASSERT_TRUE(rec.AwaitIssued(3));
  EXPECT_EQ(rec.issued(), std::vector<std::string>({"2:1", "1:1", "1:2"}));
  EXPECT_TRUE(gate.Empty());
  gate.Stop();
}

TEST(ReadyGateTest, AFullGateHoldsItsSubmitterBack) {
  Record rec;
  ReadyGate gate(common::RealClock(), 0, 2, rec.Issuer());
  gate.Start();
  Op a1(1, 1), a2(1, 2), a3(1, 3);
  EXPECT_TRUE(gate.Submit(&a1));
  EXPECT_TRUE(gate.Submit(&a2));
  std::atomic<bool> submitted{false};
  std::thread t([&] {
    gate.Submit(&a3);
    submitted = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(submitted) << "a third op went into a gate of two slots";
  a1.ready = true;
  t.join();
  EXPECT_TRUE(submitted);
  a2.ready = true;
  a3.ready = true;
  ASSERT_TRUE(rec.AwaitIssued(3));
  EXPECT_EQ(rec.issued(), std::vector<std::string>({"1:1", "1:2", "1:3"}));
  gate.Stop();
}

TEST(ReadyGateTest, AnAbandonedGateFailsWhatItHolds) {
  Record rec;
  ReadyGate gate(common::RealClock(), 0, 64, rec.Issuer());
  gate.Start();
  Op a1(1, 1), b1(2, 1);
  EXPECT_TRUE(gate.Submit(&a1));
  EXPECT_TRUE(gate.Submit(&b1));
  gate.Abandon();
  gate.Stop();
  for (Op* op : {&a1, &b1}) {
    EXPECT_TRUE(op->done);
    EXPECT_EQ(op->result.code(), absl::StatusCode::kUnavailable) << op->result;
  }
  EXPECT_TRUE(rec.issued().empty());
}

// Ops gated after gaps (each held until its flag is set a moment later).
// With the window, on a fake clock moved 2 ms a gap (inside the 1 s
// window), the gate's thread polls on and is woken by none whatever the
// machine's load; without it (the real
// clock), each op is gated only once the thread is seen asleep, so each
// wakes it.
TEST(ReadyGateTest, AnActiveGateIsWokenByNoOp) {
  for (const bool awake : {false, true}) {
    SCOPED_TRACE(::testing::Message() << (awake ? "window" : "no window"));
    common::testing::FakeClock clock;
    Record rec;
    ReadyGate gate(awake ? static_cast<common::Clock&>(clock) : common::RealClock(), awake ? 1'000'000'000 : 0, 64,
                   rec.Issuer());
    gate.Start();
    constexpr int kOps = 8;
    std::vector<std::unique_ptr<Op>> ops;
    for (int k = 1; k <= kOps; ++k) {
      if (awake) {
        clock.AdvanceNs(2'000'000);
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ASSERT_FALSE(gate.asleep()) << "op " << k << ": asleep inside the window";
      } else {
        for (int i = 0; i < 20000 && !gate.asleep(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        ASSERT_TRUE(gate.asleep()) << "op " << k << ": the gate's thread never slept";
      }
      ops.push_back(std::make_unique<Op>(1, k));
      ASSERT_TRUE(gate.Submit(ops.back().get()));
      ops.back()->ready = true;
      ASSERT_TRUE(rec.AwaitIssued(size_t(k)));
    }
    if (awake) {
      EXPECT_EQ(gate.wakeups(), 0u) << "the thread slept inside the window";
    } else {
      EXPECT_GE(gate.wakeups(), uint64_t{kOps}) << "each op found the thread asleep";
    }
    gate.Stop();
  }
}

}  // namespace
}  // namespace dmagather::server::engines::gpu
