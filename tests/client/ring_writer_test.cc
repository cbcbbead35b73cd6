// RingWriter over an in-memory segment: the descriptors of an op land in
// consecutive slots with their sequence number and item counts, only the
// bytes they use are copied, the doorbell rings only for a sleeping
// daemon, and a full ring gives up once the daemon is gone.
#include "client/ring_writer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>

#include "abi/descriptor_v2.h"
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

TEST_F(RingWriterTest, TheDoorbellRingsForASleepingDaemon) {
  bell_.sleeping = 1;
  abi::DescriptorV2 d;
  std::memset(&d, 0, sizeof(d));
  ASSERT_TRUE(writer_.PublishOp(&d, 1, 1, 0, gone_));
  ASSERT_TRUE(writer_.PublishOp(&d, 1, 2, 0, gone_));
  EXPECT_EQ(bell_.seq, 2u);
  EXPECT_EQ(view_.ring->tail, 2u);
}

TEST_F(RingWriterTest, AFullRingGivesUpWhenTheDaemonIsGone) {
  view_.ring->head = 5;
  view_.ring->tail = 5 + abi::kRingSlotsV1;  // Every slot unread.
  gone_ = true;
  abi::DescriptorV2 d;
  std::memset(&d, 0, sizeof(d));
  EXPECT_FALSE(writer_.PublishOp(&d, 1, 1, 0, gone_));
  EXPECT_EQ(view_.ring->tail, 5 + abi::kRingSlotsV1) << "nothing published";
  view_.ring->head = 6;  // One slot read.
  EXPECT_TRUE(writer_.PublishSlot(&d, sizeof(d), gone_));
  EXPECT_EQ(view_.ring->tail, 6 + abi::kRingSlotsV1);
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
