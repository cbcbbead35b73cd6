// The ring's state machine (RingState) on a simulated network (SimRing):
// ops, verdicts, and every failure interleaving named in
// docs/ARCHITECTURE.md ("Multi-node"). Time is a FakeClock: "at once" means
// without moving it.
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/fakes/fake_clock.h"
#include "tests/server/cluster/sim_ring.h"

namespace dmagather::server::cluster::testing {
namespace {

constexpr int kChunks = 4;  // Own chunks per node per op.

// Every node in `survivors` failed its job with PEER_FAILED naming a node of
// `named` first ("node N (host ...) ..."), and every op it started has ended:
// OK (it completed before) or with that failure - none is left to time out.
void ExpectPeerFailed(SimRing& net, const std::set<int>& survivors, const std::set<int>& named) {
  for (int i : survivors) {
    SimNode& s = net.node(i);
    ASSERT_TRUE(s.failed) << "node " << i << " never learned of the failure";
    EXPECT_EQ(s.failure.code(), absl::StatusCode::kAborted) << "node " << i << ": " << s.failure;
    bool names = false;
    for (int d : named) names |= absl::StartsWith(s.failure.message(), absl::StrCat("node ", d, " (host", d, " "));
    EXPECT_TRUE(names) << "node " << i << " blames the wrong node: " << s.failure;
    for (uint32_t seq : s.started) {
      auto it = s.results.find(seq);
      ASSERT_NE(it, s.results.end()) << "node " << i << ": op " << seq << " still waits (it would time out)";
      EXPECT_TRUE(it->second.ok() || it->second == s.failure) << "node " << i << " op " << seq << ": " << it->second;
    }
  }
}

std::set<int> AllBut(int n, std::set<int> out) {
  std::set<int> s;
  for (int i = 0; i < n; ++i) {
    if (!out.count(i)) s.insert(i);
  }
  return s;
}

TEST(RingStateTest, OpsCompleteOnEveryNode) {
  common::testing::FakeClock clock;
  SimRing net(4, 2, clock);
  for (uint32_t seq = 1; seq <= 5; ++seq) {
    net.StartAll(seq, kChunks);
    net.Pump();
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_FALSE(net.node(i).failed) << net.node(i).failure;
    ASSERT_EQ(net.node(i).results.size(), 5u) << "node " << i;
    for (auto& [seq, st] : net.node(i).results) EXPECT_TRUE(st.ok()) << "node " << i << " op " << seq << ": " << st;
  }
}

TEST(RingStateTest, OpsStartedOutOfStepStillComplete) {
  // Node 0's ranks submit late: its receivers wait for the op, then go on.
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock);
  net.StartOp(1, 1, kChunks);
  net.StartOp(2, 1, kChunks);
  net.Pump();
  EXPECT_EQ(net.node(1).results.count(1), 0u);
  net.StartOp(0, 1, kChunks);
  net.Pump();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(net.node(i).results.count(1), 1u) << "node " << i;
    EXPECT_TRUE(net.node(i).results[1].ok()) << net.node(i).results[1];
  }
}

TEST(RingStateTest, ARefusalIsEveryNodesVerdict) {
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock);
  net.StartOp(0, 1, kChunks);
  net.StartOp(1, 1, kChunks, /*code=*/1);  // FALLBACK
  net.StartOp(2, 1, kChunks);
  net.Pump();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(net.node(i).results.count(1), 1u) << "node " << i;
    EXPECT_EQ(net.node(i).results[1].message(), "rank 1 refused") << "node " << i;
    EXPECT_FALSE(net.node(i).failed);
  }
}

// Kill one node's daemon after `rounds` rounds of op 1 (0: before anything
// moved; large: after op 1 ended and op 2 started), for every victim.
struct KillCase {
  int nodes;
  int links;
};
class KillSweepTest : public ::testing::TestWithParam<KillCase> {};

TEST_P(KillSweepTest, EveryNodeLearnsAtOnceAndBlamesTheDeadOne) {
  const KillCase kc = GetParam();
  // How many rounds an undisturbed op takes.
  int op_rounds;
  {
    common::testing::FakeClock clock;
    SimRing net(kc.nodes, kc.links, clock);
    net.StartAll(1, kChunks);
    op_rounds = net.Pump();
  }
  for (int victim = 0; victim < kc.nodes; ++victim) {
    for (int rounds = 0; rounds <= op_rounds + 2; ++rounds) {
      SCOPED_TRACE(absl::StrCat("victim node ", victim, " killed after ", rounds, " rounds"));
      common::testing::FakeClock clock;
      SimRing net(kc.nodes, kc.links, clock);
      net.StartAll(1, kChunks);
      for (int r = 0; r < rounds; ++r) net.Round();
      if (rounds > op_rounds) net.StartAll(2, kChunks);  // The next op is under way.
      net.Kill(victim);
      net.Pump();  // No time passes.
      ExpectPeerFailed(net, AllBut(kc.nodes, {victim}), {victim});
      if (HasFatalFailure() || HasFailure()) return;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Rings, KillSweepTest,
                         ::testing::Values(KillCase{2, 1}, KillCase{3, 2}, KillCase{4, 2}, KillCase{5, 1}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.nodes, "nodes_", info.param.links, "links");
                         });

TEST(RingStateTest, KilledRightAfterTheRingCameUp) {
  // Bootstrap's last step: the ring is up, no op has started anywhere.
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock);
  net.Kill(1);
  net.Pump();
  ExpectPeerFailed(net, {0, 2}, {1});
  // The ranks' first op ends at once with the failure.
  net.StartOp(0, 1, kChunks);
  net.StartOp(2, 1, kChunks);
  net.Pump();
  ExpectPeerFailed(net, {0, 2}, {1});
}

TEST(RingStateTest, KilledAfterAnOpEndedEverywhere) {
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock);
  net.StartAll(1, kChunks);
  net.Pump();
  net.Kill(2);
  net.Pump();
  ExpectPeerFailed(net, {0, 1}, {2});
  EXPECT_TRUE(net.node(0).results[1].ok());
}

TEST(RingStateTest, ASuccessorThatIsNotReadingStillLearnsAtOnce) {
  // Node 0's ranks have not submitted op 2: its receivers wait, so the end
  // of node 2's links queues behind frames node 0 does not read. It learns
  // from node 1, backwards.
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock);
  net.StartAll(1, kChunks);
  net.Pump();
  net.StartOp(1, 2, kChunks);
  net.StartOp(2, 2, kChunks);
  net.Pump();
  ASSERT_FALSE(net.conn(2, 0).fwd.empty() && net.conn(2, 1).fwd.empty()) << "node 0 should have unread frames";
  net.Kill(2);
  net.Pump();
  ExpectPeerFailed(net, {0, 1}, {2});
  net.StartOp(0, 2, kChunks);  // Its ranks submit it after all: it ends at once.
  net.Pump();
  ExpectPeerFailed(net, {0, 1}, {2});
}

TEST(RingStateTest, APredecessorWithNothingToSendStillLearnsAtOnce) {
  // Node 1 has sent everything of op 1 and waits for its ranks: only its
  // control reader can notice node 2's end of the link closing.
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock);
  net.StartAll(1, kChunks);
  net.Pump();
  net.Kill(2);
  net.Pump();
  ExpectPeerFailed(net, {0, 1}, {2});
}

TEST(RingStateTest, TwoDaemonsKilledAtOnce) {
  for (int rounds = 0; rounds < 30; rounds += 3) {
    SCOPED_TRACE(absl::StrCat("killed after ", rounds, " rounds"));
    common::testing::FakeClock clock;
    SimRing net(5, 2, clock);
    net.StartAll(1, kChunks);
    for (int r = 0; r < rounds; ++r) net.Round();
    net.Kill(1);
    net.Kill(3);
    net.Pump();
    ExpectPeerFailed(net, {0, 2, 4}, {1, 3});
  }
}

TEST(RingStateTest, NeighboursKilledAtOnce) {
  common::testing::FakeClock clock;
  SimRing net(4, 2, clock);
  net.StartAll(1, kChunks);
  for (int r = 0; r < 5; ++r) net.Round();
  net.Kill(1);
  net.Kill(2);
  net.Pump();
  ExpectPeerFailed(net, {0, 3}, {1, 2});
}

TEST(RingStateTest, AResetLinkFailsEveryNode) {
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock);
  net.StartAll(1, kChunks);
  for (int r = 0; r < 3; ++r) net.Round();
  net.conn(0, 1).reset = true;  // Between node 0 and node 1, both alive.
  net.Pump();
  ExpectPeerFailed(net, {0, 1, 2}, {0, 1});
  EXPECT_TRUE(absl::StartsWith(net.node(0).failure.message(), "node 1 ")) << net.node(0).failure;
  EXPECT_TRUE(absl::StartsWith(net.node(1).failure.message(), "node 0 ")) << net.node(1).failure;
}

// A host that loses power: no FIN, nothing fails by itself. Heartbeats stop;
// after the configured silence every survivor fails naming it - not before.
class SilenceTest : public ::testing::TestWithParam<int> {};

TEST_P(SilenceTest, ASilentHostIsFailedAfterThePeerTimeout) {
  const absl::Duration timeout = absl::Seconds(GetParam()), beat = timeout / 5, step = beat / 4;
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock, timeout, beat);
  net.StartAll(1, kChunks);
  net.Pump();
  net.PowerOff(2);
  net.StartOp(0, 2, kChunks);
  net.StartOp(1, 2, kChunks);
  net.AdvanceAndPump(timeout - beat, step);
  EXPECT_FALSE(net.node(0).failed) << net.node(0).failure;
  EXPECT_FALSE(net.node(1).failed) << net.node(1).failure;
  net.AdvanceAndPump(2 * beat, step);
  ExpectPeerFailed(net, {0, 1}, {2});
  EXPECT_TRUE(absl::StrContains(net.node(1).failure.message(), "nothing heard")) << net.node(1).failure;
}

INSTANTIATE_TEST_SUITE_P(Timeouts, SilenceTest, ::testing::Values(2, 5, 30));

TEST(RingStateTest, ASilentHostMidOpSparesNothing) {
  // Node 1 has all of op 1; node 0 still waits for node 1's block, which
  // had to pass through node 2 - whose host then loses power. The abort
  // names a dead node, so node 0 does not wait for op 1 to end first: it
  // never would. Nor does node 1 end op 1 well: not every node has it.
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock, absl::Seconds(5), absl::Seconds(1));
  net.StartAll(1, kChunks);
  int guard = 0;
  while (!net.node(1).st->local_ended(1) && guard++ < 1000) net.Round();
  ASSERT_TRUE(net.node(1).st->local_ended(1));
  ASSERT_FALSE(net.node(0).st->local_ended(1)) << "the case needs op 1 still under way on node 0";
  EXPECT_EQ(net.node(1).results.count(1), 0u) << "node 1 ended op 1 before node 0 had it";
  net.PowerOff(2);
  net.AdvanceAndPump(absl::Seconds(7), absl::Milliseconds(250));
  ExpectPeerFailed(net, {0, 1}, {2});
  EXPECT_FALSE(net.node(0).results[1].ok());
  EXPECT_FALSE(net.node(1).results[1].ok());
}

// The commit: an op ends (its done flags may be written) on no node before
// every node has all of it. Node 1's block reaches nodes 2 and 0 only over
// the link 1 -> 2; while that is held, node 1 has every block of op 1 and
// still does not end it.
// Nor do the next op's own frames go out: a staged own chunk waits in its
// link's send thread for its rank to reach the op, and a rank whose stream
// waits for the op before does so only once that one is done - so nothing of
// op 2 may be queued before op 1's "ended" frames (the GPU suite's stream
// mode stalled on exactly that).
TEST(RingStateTest, NoNodeEndsAnOpNorSendsTheNextBeforeEveryNodeHasIt) {
  common::testing::FakeClock clock;
  SimRing net(3, 1, clock);
  net.conn(1, 0).held = true;  // Node 1 -> node 2.
  net.StartAll(1, kChunks);
  net.Pump();
  ASSERT_TRUE(net.node(1).st->local_ended(1));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(net.node(i).results.count(1), 0u) << "node " << i;
  EXPECT_NE(net.node(1).st->Pending(1).find("the end of it on node 2"), std::string::npos)
      << net.node(1).st->Pending(1);
  net.StartAll(2, kChunks);
  net.Pump();
  EXPECT_NE(net.node(1).st->Pending(2).find("allgather #1 to end first"), std::string::npos)
      << net.node(1).st->Pending(2);
  net.conn(1, 0).held = false;
  net.Pump();
  for (int i = 0; i < 3; ++i) {
    for (uint32_t seq : {1u, 2u}) {
      ASSERT_EQ(net.node(i).results.count(seq), 1u) << "node " << i << " op " << seq;
      EXPECT_TRUE(net.node(i).results[seq].ok()) << net.node(i).results[seq];
    }
  }
}

TEST(RingStateTest, OneSilentLinkIsFailedAfterThePeerTimeout) {
  // One connection of two stalls (both hosts up): its sender notices.
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock, absl::Seconds(5), absl::Seconds(1));
  net.StartAll(1, kChunks);
  for (int r = 0; r < 4; ++r) net.Round();
  net.conn(1, 0).stalled = true;
  net.AdvanceAndPump(absl::Seconds(7), absl::Milliseconds(250));
  ExpectPeerFailed(net, {0, 1, 2}, {2});
}

TEST(RingStateTest, SilenceDetectionCanBeTurnedOff) {
  common::testing::FakeClock clock;
  SimRing net(3, 1, clock, absl::ZeroDuration(), absl::ZeroDuration());
  net.StartAll(1, kChunks);
  net.Pump();
  net.PowerOff(2);
  net.AdvanceAndPump(absl::Seconds(60), absl::Seconds(1));
  EXPECT_FALSE(net.node(0).failed);
  EXPECT_FALSE(net.node(1).failed);
}

TEST(RingStateTest, DelayedDataIsNotAFailure) {
  // Forward frames held far past the peer timeout: the heartbeats go the
  // other way, so nobody is failed, and the op completes once they move.
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock, absl::Seconds(5), absl::Seconds(1));
  net.StartAll(1, kChunks);
  net.Round();
  net.conn(0, 0).held = true;
  net.AdvanceAndPump(absl::Seconds(20), absl::Milliseconds(500));
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(net.node(i).failed) << net.node(i).failure;
  EXPECT_EQ(net.node(1).results.count(1), 0u) << "op 1 cannot have ended while its frames are held";
  net.conn(0, 0).held = false;
  net.Pump();
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(net.node(i).results.count(1), 1u) << "node " << i;
    EXPECT_TRUE(net.node(i).results[1].ok()) << net.node(i).results[1];
  }
}

// Node 1's ranks leave right after its op 1 ended, while op 1 is still under
// way elsewhere: every node completes op 1, then fails with node 1's reason
// (not a dead peer: nothing is blamed). `slow`: node 0's last frames of op 1
// arrive only after node 1 has shut its links.
class JobEndTest : public ::testing::TestWithParam<bool> {};

TEST_P(JobEndTest, AJobEndingOnOneNodeLosesNothing) {
  const bool slow = GetParam();
  common::testing::FakeClock clock;
  SimRing net(3, 2, clock);
  net.StartAll(1, kChunks);
  int guard = 0;
  while (!net.node(1).st->local_ended(1) && guard++ < 1000) net.Round();
  ASSERT_TRUE(net.node(1).st->local_ended(1));
  ASSERT_FALSE(net.node(0).st->local_ended(1)) << "the case needs op 1 still under way on node 0";
  for (int k = 0; k < 2; ++k) net.conn(2, k).held = slow;
  net.FailJob(1, absl::AbortedError("rank 1 left the job"), false, 0);
  net.AdvanceAndPump(absl::Seconds(3), absl::Milliseconds(500));
  for (int k = 0; k < 2; ++k) net.conn(2, k).held = false;
  net.AdvanceAndPump(absl::Seconds(3), absl::Milliseconds(500));
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(net.node(i).results.count(1), 1u) << "node " << i;
    EXPECT_TRUE(net.node(i).results[1].ok()) << "node " << i << ": " << net.node(i).results[1];
    EXPECT_TRUE(net.node(i).failed) << "node " << i;
    EXPECT_EQ(net.node(i).failure.message(),
              i == 1 ? "rank 1 left the job" : "node 1 (host1 10.0.0.2:7411): rank 1 left the job");
  }
}

INSTANTIATE_TEST_SUITE_P(Speeds, JobEndTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "slow" : "fast"; });

TEST(RingStateTest, AMalformedFrameFailsTheJobNamingItsSender) {
  common::testing::FakeClock clock;
  SimRing net(3, 1, clock);
  net.StartAll(1, kChunks);
  RingFrameV1 junk = NewRingFrame(kFrameData, 1, 0);
  junk.magic = 0x12345678;
  net.conn(0, 0).fwd.push_front(junk);
  net.Pump();
  ExpectPeerFailed(net, {0, 1, 2}, {0});
  EXPECT_TRUE(absl::StrContains(net.node(1).failure.message(), "malformed")) << net.node(1).failure;
}

TEST(RingStateTest, PendingNamesWhatAnOpWaitsFor) {
  common::testing::FakeClock clock;
  SimRing net(3, 1, clock);
  net.StartOp(0, 1, kChunks);
  net.Pump();
  const std::string p = net.node(0).st->Pending(1);
  EXPECT_TRUE(absl::StrContains(p, "node 1 (host1")) << p;
  EXPECT_TRUE(absl::StrContains(p, "node 2 (host2")) << p;
  EXPECT_EQ(net.node(0).st->Pending(2), "");
}

}  // namespace
}  // namespace dmagather::server::cluster::testing
