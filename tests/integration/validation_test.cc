// The daemon validates every descriptor against the caller's own session:
// a region of another job, an offset past the end, a malformed descriptor
// or an overlapping send all fail with INVALID_ARGUMENT, read no foreign
// memory, and leave the job usable. One process, two single-rank jobs.
#include <gtest/gtest.h>

#include <cstring>

#include "client/comm.h"
#include "tests/integration/harness.h"
#include "tests/support/verify.h"

namespace dmagather::testing {
namespace {

using client::CommImpl;
using client::CommOptions;

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = DaemonProcess::Start();
    ASSERT_NE(daemon_, nullptr);
    a_ = Join("victim");
    b_ = Join("intruder");
    ASSERT_NE(a_, nullptr);
    ASSERT_NE(b_, nullptr);
    auto pa = a_->Alloc(1 << 16);
    auto pb = b_->Alloc(1 << 16);
    ASSERT_TRUE(pa.ok() && pb.ok());
    victim_ = static_cast<char*>(*pa);
    mine_ = static_cast<char*>(*pb);
    std::memset(victim_, 0x5A, 1 << 16);
  }

  std::unique_ptr<CommImpl> Join(const std::string& job) {
    CommOptions o;
    o.socket_path = daemon_->socket();
    o.job_key = UniqueJob(job);
    o.world_size = 1;
    o.rank = 0;
    auto c = CommImpl::Create(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  // A well-formed flat descriptor over b's buffer (region ids learned from a
  // first real op are not exposed, so ids are probed: b's own buffer is the
  // highest id registered so far).
  abi::DescriptorV1 Valid(uint32_t region) {
    abi::DescriptorV1 d{};
    d.op = abi::kOpAllGather;
    d.dtype = DMAGATHER_UINT8;
    d.count = 256;
    d.num_recv = 1;
    d.send = {region, 0, 0};
    d.recv[0] = {region, 0, 1024};
    return d;
  }

  absl::Status Submit(const abi::DescriptorV1& d) {
    absl::Status st = b_->SubmitRawForTesting(d);
    if (!st.ok()) return st;
    return b_->Wait();
  }

  std::unique_ptr<DaemonProcess> daemon_;
  std::unique_ptr<CommImpl> a_, b_;
  char* victim_ = nullptr;
  char* mine_ = nullptr;
};

// Region ids are handed out in order: a's buffer is 1, b's is 2.
constexpr uint32_t kVictimRegion = 1;
constexpr uint32_t kMyRegion = 2;

TEST_F(ValidationTest, OwnRegionWorks) {
  support::FillPattern(mine_, 256, 1, 0);
  std::vector<char> want(mine_, mine_ + 256);
  ASSERT_TRUE(Submit(Valid(kMyRegion)).ok());
  EXPECT_EQ(std::memcmp(mine_ + 1024, want.data(), 256), 0);
}

TEST_F(ValidationTest, ForeignRegionIsRejectedAndUntouched) {
  abi::DescriptorV1 d = Valid(kMyRegion);
  d.send.region_id = kVictimRegion;  // Read another job's memory...
  absl::Status st = Submit(d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("region 1, which rank 0 has not registered"), std::string::npos) << st;

  d = Valid(kMyRegion);
  d.recv[0].region_id = kVictimRegion;  // ...or write into it.
  st = Submit(d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  for (int i = 0; i < (1 << 16); ++i) ASSERT_EQ(victim_[i], 0x5A) << "foreign memory written at " << i;
}

TEST_F(ValidationTest, OffsetPastTheEndIsRejected) {
  abi::DescriptorV1 d = Valid(kMyRegion);
  d.recv[0].offset = (1 << 16) - 100;  // 256 bytes do not fit.
  absl::Status st = Submit(d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("runs past the end of region 2"), std::string::npos) << st;

  d = Valid(kMyRegion);
  d.send.offset = ~uint64_t{0} - 10;  // Overflowing offset.
  st = Submit(d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
}

TEST_F(ValidationTest, MalformedDescriptorsAreRejected) {
  abi::DescriptorV1 d = Valid(kMyRegion);
  d.stamp = 0x12345678;
  EXPECT_EQ(Submit(d).code(), absl::StatusCode::kInvalidArgument);
  d = Valid(kMyRegion);
  d.dtype = 99;
  EXPECT_EQ(Submit(d).code(), absl::StatusCode::kInvalidArgument);
  d = Valid(kMyRegion);
  d.op = 42;
  EXPECT_EQ(Submit(d).code(), absl::StatusCode::kInvalidArgument);
  d = Valid(kMyRegion);
  d.num_recv = 7;
  EXPECT_EQ(Submit(d).code(), absl::StatusCode::kInvalidArgument);
  d = Valid(kMyRegion);
  d.count = uint64_t{1} << 60;
  EXPECT_EQ(Submit(d).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ValidationTest, OverlappingSendThatIsNotInPlaceIsRejected) {
  abi::DescriptorV1 d = Valid(kMyRegion);
  d.send.offset = 1024 + 10;  // Inside the output, but not rank 0's slot.
  absl::Status st = Submit(d);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("overlaps output"), std::string::npos) << st;
}

TEST_F(ValidationTest, JobStaysUsableAfterRejections) {
  abi::DescriptorV1 bad = Valid(kMyRegion);
  bad.send.region_id = 999;
  EXPECT_FALSE(Submit(bad).ok());
  support::FillPattern(mine_, 256, 9, 0);
  std::vector<char> want(mine_, mine_ + 256);
  ASSERT_TRUE(Submit(Valid(kMyRegion)).ok());
  EXPECT_EQ(std::memcmp(mine_ + 1024, want.data(), 256), 0);
}

TEST_F(ValidationTest, ClientRejectsPointersItDoesNotKnow) {
  std::vector<char> private_mem(4096);
  absl::Status st = b_->AllGather(private_mem.data(), mine_, 16, DMAGATHER_UINT8, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("not inside memory from dmagather_alloc"), std::string::npos) << st;
  st = b_->AllGather(mine_, mine_ + (1 << 16) - 8, 16, DMAGATHER_UINT8, nullptr);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("runs past the end"), std::string::npos) << st;
  EXPECT_EQ(b_->Register(private_mem.data(), 4096).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace dmagather::testing
