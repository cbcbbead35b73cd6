// DoneFlag over an in-memory completion block: ops are done once done_seq
// reaches them (cyclically); when the daemon goes away waits end with its
// reason, and on stream-waiting backends done_seq and every graph slot are
// released while only ops finished before count as done.
#include "client/done_flag.h"

#include <gtest/gtest.h>

#include <thread>

#include "abi/graph_v1.h"
#include "abi/ring_v1.h"
#include "common/futex.h"
#include "common/memfd.h"

namespace dmagather::client {
namespace {

class DoneFlagTest : public ::testing::Test {
 protected:
  DoneFlagTest() : flag_(/*rank=*/4) {
    auto m = common::MemfdMapping::Create("done-flag", abi::SegmentLayoutV1::kBytes);
    EXPECT_TRUE(m.ok()) << m.status();
    segment_ = *std::move(m);
    c_ = abi::SegmentViewV1::At(segment_.data()).completion;
    flag_.SetSpin(4, 0);
  }

  common::MemfdMapping segment_;
  abi::CompletionV1* c_ = nullptr;
  DoneFlag flag_;
};

TEST_F(DoneFlagTest, AnOpIsDoneOnceDoneSeqReachesItCyclically) {
  flag_.Attach(c_, /*stream_waits=*/false);
  c_->done_seq = 5;
  EXPECT_TRUE(flag_.Wait(5).ok());
  EXPECT_TRUE(flag_.Wait(3).ok());
  EXPECT_EQ(flag_.Test(5), DoneFlag::Poll::kDone);
  EXPECT_EQ(flag_.Test(6), DoneFlag::Poll::kPending);
  c_->done_seq = 2;  // Wrapped past 2^32.
  EXPECT_EQ(flag_.Test(0xfffffff0u), DoneFlag::Poll::kDone);
  EXPECT_EQ(flag_.Test(3), DoneFlag::Poll::kPending);
  EXPECT_EQ(c_->done_waiters, 0u);
}

TEST_F(DoneFlagTest, AWaiterWakesWhenTheDaemonPublishes) {
  flag_.Attach(c_, false);
  std::thread daemon([&] {
    abi::StoreSeqCst(&c_->done_seq, 9u);
    common::FutexWakeAll(&c_->done_seq);
  });
  EXPECT_TRUE(flag_.Wait(9).ok());
  daemon.join();
  EXPECT_EQ(c_->done_waiters, 0u) << "every sleeper counted itself out";
}

TEST_F(DoneFlagTest, WhenTheDaemonGoesAwayWaitsEndWithItsReason) {
  flag_.Attach(c_, /*stream_waits=*/false);
  c_->done_seq = 3;
  std::thread watcher([&] { flag_.MarkGone("dmagatherd stopped: SIGTERM"); });
  absl::Status s = flag_.Wait(4);  // Never published: ends when the daemon is gone.
  watcher.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(s.message(), "rank 4: dmagatherd stopped: SIGTERM");
  EXPECT_TRUE(flag_.gone());
  EXPECT_TRUE(flag_.gone_flag().load());
  EXPECT_EQ(c_->done_seq, 3u) << "host backend: done_seq is left alone";
  EXPECT_EQ(flag_.Test(4), DoneFlag::Poll::kGone);
  EXPECT_EQ(flag_.Test(3), DoneFlag::Poll::kDone);
  EXPECT_TRUE(flag_.Wait(2).ok()) << "finished before the daemon went";
}

TEST_F(DoneFlagTest, StreamBackendsAreReleasedButOnlyFinishedOpsCountAsDone) {
  flag_.Attach(c_, /*stream_waits=*/true);
  c_->done_seq = 7;
  flag_.MarkGone("the connection to dmagatherd was lost");
  EXPECT_EQ(c_->done_seq, 7u + (1u << 30)) << "the streams' done waits pass";
  const abi::GraphFlagsV1* g = abi::GraphFlagsOf(c_);
  for (uint32_t s = 0; s < abi::kGraphSlotsV1; ++s) EXPECT_EQ(g->done[s].hi, 1u) << s;
  EXPECT_TRUE(flag_.Wait(7).ok());
  absl::Status later = flag_.Wait(8);
  EXPECT_EQ(later.code(), absl::StatusCode::kUnavailable) << "done_seq says done, but the daemon never ran it";
  EXPECT_EQ(flag_.Test(8), DoneFlag::Poll::kGone);
  EXPECT_EQ(flag_.Test(7), DoneFlag::Poll::kDone);
}

}  // namespace
}  // namespace dmagather::client
