// RingWriter over an in-memory segment: the descriptors of an op land in
// consecutive slots with their sequence number and item counts, only the
// bytes they use are copied, the doorbell rings only for a sleeping
// daemon, a slot is free only once its op is done (a full ring gives up
// once the daemon is gone), and Rewind finds the first op not seen done.
#include "client/ring_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>

#include "abi/descriptor_v2.h"
#include "abi/graph_v1.h"
#include "common/memfd.h"

namespace dmagather::client {
namespace {

class RingWriterTest : public ::testing::Test {
 protected:
  RingWriterTest() {
    auto m = common::MemfdMapping::Create("ring-test", abi::SegmentLayoutV1::kBytes);
    EXPECT_TRUE(m.ok()) << m.status();
    segment_ = *std::move(m);
    abi::InitSegmentV1(segment_.data(), 1, abi::kDescriptorStampV2);
    view_ = abi::SegmentViewV1::At(segment_.data());
    std::memset(&bell_, 0, sizeof(bell_));
    writer_.Attach(view_, &bell_);
  }

  const abi::DescriptorV2& Slot(uint64_t i) const {
    return *reinterpret_cast<const abi::DescriptorV2*>(&view_.slots[i % abi::kRingSlotsV1]);
  }

  common::MemfdMapping segment_;
  abi::SegmentViewV1 view_;
  abi::DoorbellV1 bell_;
  RingWriter writer_;
  std::atomic<bool> gone_{false};
};

TEST_F(RingWriterTest, AnOpsItemsLandInConsecutiveSlots) {
  abi::DescriptorV2 ds[2];
  std::memset(ds, 0, sizeof(ds));
  for (auto& d : ds) {
    d.op = abi::kOpAllGatherV2;
    d.num_recv = 1;
    d.recv[0].region_id = 7;
    d.recv[1].region_id = 99;  // Beyond num_recv: not published.
  }
  ds[1].count = 5;
  std::memset(&view_.slots[0], 0xff, sizeof(abi::DescriptorV1) * 2);
  ASSERT_TRUE(writer_.PublishOp(ds, 2, /*seq=*/11, /*now_ns=*/1234, gone_));
  EXPECT_EQ(view_.ring->tail, 2u);
  for (int i = 0; i < 2; ++i) {
    const abi::DescriptorV2& d = Slot(i);
    EXPECT_EQ(d.stamp, abi::kDescriptorStampV2);
    EXPECT_EQ(d.seq, 11u);
    EXPECT_EQ(d.submit_ns, 1234u);
    EXPECT_EQ(d.items_following, static_cast<uint32_t>(1 - i));
    EXPECT_EQ(d.recv[0].region_id, 7u);
    EXPECT_NE(d.recv[1].region_id, 99u) << "only the references the op uses are copied";
  }
  EXPECT_EQ(Slot(1).count, 5u);
  EXPECT_EQ(bell_.seq, 0u) << "the daemon was not asleep";
}

TEST_F(RingWriterTest, AnAllToAllsArgumentsArePublishedCapturedOrNot) {
  // The all-to-all's strides and flags lie past recv[0]; a captured op's
  // code carries the persistent bit and its slot above the low byte.
  for (uint32_t op : {uint32_t{abi::kOpReduceScatterSumV2},
                      abi::kOpReduceScatterSumV2 | abi::kOpPersistentBit | (5u << abi::kOpPersistentSlotShift),
                      abi::kOpAllToAllV2 | abi::kOpPersistentBit}) {
    abi::DescriptorV2 d;
    std::memset(&d, 0, sizeof(d));
    d.op = op;
    d.num_recv = 1;
    d.count = 4097;
    d.a2a.recv = {3, 0, 64};
    d.a2a.send_stride = 8194;
    d.a2a.recv_stride = 8194;
    d.a2a.flags = abi::kAllToAllSkipSelf;
    const uint64_t at = view_.ring->tail;
    std::memset(&view_.slots[at % abi::kRingSlotsV1], 0, sizeof(abi::DescriptorV1));
    ASSERT_TRUE(writer_.PublishOp(&d, 1, static_cast<uint32_t>(at + 1), 0, gone_));
    const abi::DescriptorV2& got = Slot(at);
    EXPECT_EQ(got.op, op);
    EXPECT_EQ(got.a2a.recv.region_id, 3u);
    EXPECT_EQ(got.a2a.recv.offset, 64u);
    EXPECT_EQ(got.a2a.send_stride, 8194u) << "op 0x" << std::hex << op;
    EXPECT_EQ(got.a2a.recv_stride, 8194u) << "op 0x" << std::hex << op;
    EXPECT_EQ(got.a2a.flags, abi::kAllToAllSkipSelf) << "op 0x" << std::hex << op;
    view_.completion->done_seq = static_cast<uint32_t>(at + 1);  // Its slot is free again.
  }
}

TEST_F(RingWriterTest, TheDoorbellRingsForASleepingDaemon) {
  bell_.sleeping = 1;
  abi::DescriptorV2 d;
  std::memset(&d, 0, sizeof(d));
  ASSERT_TRUE(writer_.PublishOp(&d, 1, 1, 0, gone_));
  ASSERT_TRUE(writer_.PublishOp(&d, 1, 2, 0, gone_));
  EXPECT_EQ(bell_.seq, 2u);
  EXPECT_EQ(view_.ring->tail, 2u);
}

TEST_F(RingWriterTest, ASlotIsFreeOnlyOnceItsOpIsDoneNotOnceItWasRead) {
  abi::DescriptorV2 ds[2];
  std::memset(ds, 0, sizeof(ds));
  constexpr uint32_t kOps = abi::kRingSlotsV1 / 2;  // Two slots each: the ring full.
  for (uint32_t seq = 1; seq <= kOps; ++seq) ASSERT_TRUE(writer_.PublishOp(ds, 2, seq, 0, gone_));
  view_.ring->head = view_.ring->tail;  // The daemon read every slot; no op is done.
  gone_ = true;
  EXPECT_FALSE(writer_.PublishOp(ds, 2, kOps + 1, 0, gone_))
      << "a read slot of an op not done must stay: a daemon that takes the job back reads it again";
  EXPECT_EQ(view_.ring->tail, uint64_t{abi::kRingSlotsV1}) << "nothing published";
  view_.completion->done_seq = 1;  // Op 1 done: its two slots are free.
  EXPECT_TRUE(writer_.PublishOp(ds, 2, kOps + 1, 0, gone_));
  EXPECT_EQ(view_.ring->tail, uint64_t{abi::kRingSlotsV1} + 2);
}

TEST_F(RingWriterTest, RewindPointsHeadAtTheFirstOpNotSeenDone) {
  abi::DescriptorV2 ds[3];
  std::memset(ds, 0, sizeof(ds));
  EXPECT_EQ(writer_.Rewind(), 0u) << "nothing begun";
  EXPECT_EQ(view_.ring->head, 0u);
  ASSERT_TRUE(writer_.PublishOp(ds, 2, 1, 0, gone_));  // Slots 0-1.
  ASSERT_TRUE(writer_.PublishOp(ds, 3, 2, 0, gone_));  // Slots 2-4.
  ASSERT_TRUE(writer_.PublishOp(ds, 1, 3, 0, gone_));  // Slot 5.
  view_.ring->head = 6;                                // The dead daemon had read them all.
  view_.completion->done_seq = 1;
  EXPECT_EQ(writer_.Rewind(), 2u) << "ops 2 and 3 are handed over";
  EXPECT_EQ(view_.ring->head, 2u) << "op 2's first descriptor";
  EXPECT_EQ(Slot(2).seq, 2u);
  view_.completion->done_seq = 3;
  EXPECT_EQ(writer_.Rewind(), 0u);
  EXPECT_EQ(view_.ring->head, 6u) << "every op done: nothing to read again";
}

TEST(RingWriterRefusalTest, ARefusalCarriesItsCodeAndATruncatedReason) {
  abi::DescriptorV2 d;
  std::memset(&d, 0xab, sizeof(d));
  RingWriter::FillRefusal(2, absl::InvalidArgumentError("recv is NULL"), &d);
  EXPECT_EQ(d.op, abi::kOpRefuse);
  EXPECT_EQ(d.refusal.status, 2);
  EXPECT_STREQ(d.refusal.reason, "recv is NULL");
  EXPECT_EQ(d.seq, 0u) << "the rest is cleared";
  const std::string long_reason(4 * sizeof(d.refusal.reason), 'x');
  RingWriter::FillRefusal(1, absl::FailedPreconditionError(long_reason), &d);
  EXPECT_EQ(std::strlen(d.refusal.reason), sizeof(d.refusal.reason) - 1);
}

}  // namespace
}  // namespace dmagather::client
