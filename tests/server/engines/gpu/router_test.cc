// Router on ranks of the fake runtime: a copy is issued by its destination's
// device when that reaches the source (a pull), else by the source's (a
// push); between GPUs that reach each other neither way the op is a
// FALLBACK naming the pair and the reason; ranks sharing a GPU are counted
// as same-device copies; the devices marked are exactly the issuing ones.
#include "server/engines/gpu/router.h"

#include <gtest/gtest.h>

#include "common/status.h"
#include "tests/server/engines/gpu/objects_fixture.h"

namespace dmagather::server::engines::gpu::objtest {
namespace {

using RouterTest = ObjectsTest;

// A table of 3 devices where 0 cannot reach 1 (1 reaches 0) and 2 reaches
// nobody and is reached by nobody.
PeerTable ThreeDevices() {
  PeerTable peers(3);
  peers.Set(0, 1, false, "no link 0->1");
  peers.Set(1, 0, true);
  peers.Set(0, 2, false, "no link 0->2");
  peers.Set(2, 0, false, "no link 2->0");
  peers.Set(1, 2, false, "no link 1->2");
  peers.Set(2, 1, false, "no link 2->1");
  return peers;
}

TEST_F(RouterTest, PullWhereTheDestinationReachesElsePush) {
  FakeRuntime::Options fo;
  fo.devices = 3;
  Start(fo);
  const PeerTable peers = ThreeDevices();
  EXPECT_EQ(peers.IssuingDevice(0, 1), 1) << "1 reaches 0: a pull";
  EXPECT_EQ(peers.IssuingDevice(1, 0), 1) << "0 does not reach 1, 1 reaches 0: a push";
  EXPECT_EQ(peers.IssuingDevice(-1, 2), 2) << "host memory: the destination's";
  EXPECT_EQ(peers.IssuingDevice(0, 2), -1);
  EXPECT_EQ(peers.IssuingDevice(0, 3), -1) << "no such device";
  Router router(peers, "fake GPU");
  AddRank(0, 64, 2);
  AddRank(1, 64, 2);
  TestOp op(&log_, 0);
  Plan(&op, 1);
  ASSERT_TRUE(router.Route(&op).ok());
  for (const CopyCmd& c : op.plan.copies) {
    EXPECT_EQ(c.src_device, c.src_rank);  // Rank r is on device r.
    EXPECT_EQ(c.dst_device, c.dst_rank);
  }
  EXPECT_EQ(router.involved(), (std::vector<char>{0, 1, 0})) << "device 1 issues both copies";
  EXPECT_EQ(router.shares(), 1);
  EXPECT_EQ(router.pushes(), 1u) << "1 -> 0 is pushed by 1";
  EXPECT_EQ(router.same_device_copies(), 0u);
}

TEST_F(RouterTest, GpusThatReachEachOtherNeitherWayAreAFallback) {
  FakeRuntime::Options fo;
  fo.devices = 3;
  Start(fo);
  const PeerTable peers = ThreeDevices();
  Router router(peers, "fake GPU");
  AddRank(0, 64, 2);
  AddRank(2, 64, 2);
  TestOp op(&log_, 0);
  Plan(&op, 1);
  const absl::Status st = router.Route(&op);
  ASSERT_TRUE(common::IsFallback(st)) << st;
  EXPECT_NE(st.message().find("no link 0->2"), std::string::npos) << "why the destination cannot pull: " << st;
  EXPECT_NE(st.message().find("(device 0)"), std::string::npos) << st;
}

TEST_F(RouterTest, RanksSharingAGpuAreSameDeviceCopies) {
  FakeRuntime::Options fo;
  fo.devices = 2;
  Start(fo);
  PeerTable peers(2);
  peers.Set(0, 1, true);
  peers.Set(1, 0, true);
  Router router(peers, "fake GPU");
  AddRank(1, 64, 3);
  AddRank(1, 64, 3);
  AddRank(0, 64, 3);
  TestOp op(&log_, 0);
  Plan(&op, 1);
  ASSERT_TRUE(router.Route(&op).ok());
  EXPECT_EQ(router.same_device_copies(), 2u) << "rank 0 <-> rank 1";
  EXPECT_EQ(router.pushes(), 0u) << "every pair reaches each other: all pulls";
  EXPECT_EQ(router.involved(), (std::vector<char>{1, 1}));
  EXPECT_EQ(router.shares(), 2);
  // A second op re-marks from scratch.
  job_.ranks.pop_back();
  TestOp two(&log_, 0);
  Plan(&two, 2);
  ASSERT_TRUE(router.Route(&two).ok());
  EXPECT_EQ(router.involved(), (std::vector<char>{0, 1}));
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::objtest
