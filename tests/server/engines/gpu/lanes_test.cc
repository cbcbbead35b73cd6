// LaneSet on the fake runtime: a job keeps its lane; a busy lane (a share
// open on it) is never handed to another job, an idle one is; idle lanes
// beyond what is kept are destroyed (their streams with them), busy ones
// never; a lane the runtime cannot make is an error, not a shared lane.
#include "server/engines/gpu/lanes.h"

#include <gtest/gtest.h>

#include <memory>

#include "tests/fakes/fake_gpu_runtime.h"

namespace dmagather::server::engines::gpu {
namespace {

using testing::FakeRuntime;

class LanesTest : public ::testing::Test {
 protected:
  LanesTest() : rt_(std::make_unique<FakeRuntime>(FakeRuntime::Options{})) {}
  std::unique_ptr<FakeRuntime> rt_;
};

TEST_F(LanesTest, AJobKeepsItsLaneAndABusyLaneIsNeverShared) {
  const int base = rt_->live_streams();
  {
    LaneSet lanes(rt_.get(), 0, 3, 4);
    auto a = lanes.Take(1);
    ASSERT_TRUE(a.ok()) << a.status();
    EXPECT_EQ((*a)->streams.size(), 3u);
    EXPECT_EQ((*a)->joins.size(), 3u);
    EXPECT_NE((*a)->gate, nullptr);
    EXPECT_EQ(rt_->live_streams(), base + 3);
    EXPECT_EQ(*lanes.Take(1), *a);
    (*a)->open.fetch_add(1);  // Job 1 has a share in flight.
    auto b = lanes.Take(2);
    ASSERT_TRUE(b.ok());
    EXPECT_NE(*b, *a) << "job 2 got job 1's busy lane";
    EXPECT_EQ(*lanes.Take(1), *a) << "job 1 lost its lane";
    (*b)->open.fetch_add(1);
    // Job 1's lane idle again: job 3 takes it (no new streams).
    (*a)->open.fetch_sub(1);
    auto c = lanes.Take(3);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ(*c, *a);
    EXPECT_EQ((*c)->job, 3u);
    EXPECT_EQ(lanes.size(), 2u);
    EXPECT_EQ(rt_->live_streams(), base + 6);
  }
  EXPECT_EQ(rt_->live_streams(), base) << "the set's streams outlived it";
}

TEST_F(LanesTest, IdleLanesBeyondWhatIsKeptAreDestroyed) {
  const int base = rt_->live_streams();
  LaneSet lanes(rt_.get(), 0, 2, 2);
  LaneSet::Lane* busy[5];
  for (uint64_t j = 1; j <= 5; ++j) {  // Five jobs busy at once: five lanes.
    auto l = lanes.Take(j);
    ASSERT_TRUE(l.ok());
    busy[j - 1] = *l;
    (*l)->open.fetch_add(1);
  }
  EXPECT_EQ(lanes.size(), 5u) << "busy lanes are never destroyed";
  EXPECT_EQ(rt_->live_streams(), base + 10);
  for (auto* l : busy) l->open.fetch_sub(1);  // All idle.
  ASSERT_TRUE(lanes.Take(6).ok());            // Reuses one, destroys the idle rest beyond 2.
  EXPECT_EQ(lanes.size(), 2u);
  EXPECT_EQ(rt_->live_streams(), base + 4);
}

}  // namespace
}  // namespace dmagather::server::engines::gpu
