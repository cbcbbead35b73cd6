// Done on the device (EngineOp::gpu_done): a GPU writes the ranks' done
// flags after an op's copies, before the scheduler ends the op. The
// scheduler's side of that protocol, on plain completion blocks with the
// "device" writes made by the test:
// - publishing never moves a done flag backwards, and counts the rank-ops
//   whose flag a device wrote first;
// - when a rank is gone, every op a device could still finish on what the
//   rank left (beyond the ops the rank saw done) has its error record in
//   every rank's block before the rank's ready flags are released, exactly
//   once, and the ops the rank saw done end normally.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "abi/completion_v1.h"
#include "abi/ring_v1.h"
#include "absl/status/status.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/completion_writer.h"
#include "server/scheduler/job.h"
#include "server/scheduler/op.h"
#include "server/scheduler/rank.h"

namespace dmagather::testing {
namespace {

using server::scheduler::Job;
using server::scheduler::Op;
using server::scheduler::Rank;

constexpr int kWorld = 2;

class DeviceDoneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (int r = 0; r < kWorld; ++r) {
      blocks_.push_back(std::make_unique<abi::CompletionV1>());
      ranks_.push_back(std::make_shared<Rank>(r, 1000 + r, 0, blocks_.back().get(),
                                              std::make_unique<server::engines::EngineRank>()));
      ASSERT_TRUE(job_.AddRank(ranks_.back()).ok());
    }
  }
  // Op `seq` as Dispatch leaves it for an engine that writes done flags.
  Op* Running(uint32_t seq) {
    Op* op = job_.SlotFor(seq, common::MonotonicNs());
    EXPECT_NE(op, nullptr);
    for (int r = 0; r < kWorld; ++r) {
      op->parts[r].started = true;
      op->parts[r].arrived = true;
      op->parts[r].submit_ns = common::MonotonicNs();
      ranks_[r]->inflight.fetch_add(1, std::memory_order_acq_rel);
    }
    op->arrived = kWorld;
    op->gpu_done = true;
    op->open_parts.store(1, std::memory_order_release);
    op->state.store(Op::kRunning, std::memory_order_release);
    return op;
  }
  // A device's write of every rank's done flag.
  void DeviceWrites(uint32_t seq) {
    for (auto& b : blocks_) __atomic_store_n(&b->done_seq, seq, __ATOMIC_RELEASE);
  }
  uint32_t Done(int r) const { return abi::LoadAcquire(&blocks_[r]->done_seq); }
  // The seqs of rank r's error records, in order.
  std::vector<uint32_t> Errors(int r) const {
    std::vector<uint32_t> seqs;
    const abi::CompletionV1& c = *blocks_[r];
    for (uint32_t i = 0; i < c.error_count; ++i) seqs.push_back(c.errors[i % abi::kErrorSlotsV1].seq);
    return seqs;
  }

  Job job_{"device-done", kWorld, 0};
  std::vector<std::unique_ptr<abi::CompletionV1>> blocks_;
  std::vector<std::shared_ptr<Rank>> ranks_;
};

TEST_F(DeviceDoneTest, PublishingNeverMovesADoneFlagBack) {
  Op* op1 = Running(1);
  Op* op2 = Running(2);
  DeviceWrites(1);
  DeviceWrites(2);  // The device is at op 2 before the CPU ends op 1.
  op1->OnEngineDone(absl::OkStatus());
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(Done(r), 2u) << "the CPU's publish of op 1 moved rank " << r << " back";
  op2->OnEngineDone(absl::OkStatus());
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(Done(r), 2u);
  EXPECT_EQ(job_.counters.ops.load(), 2u);
  EXPECT_EQ(job_.counters.device_done_ops.load(), 2u);
  EXPECT_EQ(job_.counters.done_before_cpu.load(), uint64_t{2} * kWorld);
  // An op the device did not finish (it failed): the CPU moves the flag,
  // after the error record.
  Op* op3 = Running(3);
  op3->OnEngineDone(absl::InternalError("injected: a share failed"));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(Done(r), 3u);
    EXPECT_EQ(Errors(r), std::vector<uint32_t>{3});
  }
  EXPECT_EQ(job_.counters.done_before_cpu.load(), uint64_t{2} * kWorld);
  EXPECT_FALSE(server::scheduler::PublishDone(blocks_[0].get(), 2)) << "an older seq moved the flag";
  EXPECT_EQ(Done(0), 3u);
}

TEST_F(DeviceDoneTest, ARankGoneGetsErrorRecordsBeforeItsFlagsAreReleased) {
  std::vector<Op*> ops;
  for (uint32_t k = 1; k <= 4; ++k) ops.push_back(Running(k));
  DeviceWrites(2);  // Ops 1 and 2 ended on the devices; rank 1 saw them done, then died.
  const absl::Status why = absl::AbortedError("rank 1 exited");
  const uint32_t spare = Done(1);
  job_.CloseDeviceDone(why, 1, &spare);
  // Before any release: records for ops 3 and 4 in every rank's block.
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(Errors(r), (std::vector<uint32_t>{3, 4})) << "rank " << r;
  ranks_[1]->ReleaseReadyWaiters();
  job_.FailAfter(why, spare, 1);
  // The devices now run ops 3 and 4 on what rank 1 left and write done.
  DeviceWrites(4);
  for (Op* op : ops) op->OnEngineDone(absl::OkStatus());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(Done(r), 4u);
    EXPECT_EQ(Errors(r), (std::vector<uint32_t>{3, 4})) << "rank " << r << ": each failed op recorded once";
  }
  EXPECT_EQ(job_.counters.ops.load(), 2u) << "the ops the rank saw done end normally";
  EXPECT_EQ(job_.counters.errors[common::ToApiStatus(why)].load(), uint64_t{2} * kWorld);  // Rank-ops.
}

}  // namespace
}  // namespace dmagather::testing
