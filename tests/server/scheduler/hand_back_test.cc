// Job::HandBack: a multi-node job whose ring lost a node is handed back to
// its ranks instead of failing, only where every local rank waits for a
// daemon (DMAGATHER_RECONNECT_S) - and from then on nothing of it reaches
// the ranks: no done flag, no error record (the job they join next takes
// the ops again, after the newest op done anywhere).
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "abi/completion_v1.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "server/engines/copy_engine.h"
#include "server/scheduler/job.h"
#include "server/scheduler/op.h"
#include "server/scheduler/rank.h"
#include "server/scheduler/remote.h"

namespace dmagather::testing {
namespace {

using server::scheduler::Job;
using server::scheduler::Op;
using server::scheduler::Rank;

class FakeRing : public server::scheduler::RemotePart {
 public:
  void Start(Op*, const absl::Status&, int) override {}
  void Abort(const absl::Status& why) override { aborts.push_back(why); }
  std::string Pending(uint32_t) const override { return ""; }
  void Close() override {}
  server::scheduler::RemoteStats stats() const override { return {}; }
  std::vector<absl::Status> aborts;
};

// Ranks 0 and 1 of a 4-rank job on this node, 2 and 3 on another.
class HandBackTest : public ::testing::Test {
 protected:
  void Join(int reconnect_s0, int reconnect_s1, bool multi_node = true) {
    job_ = std::make_unique<Job>("hb", multi_node ? 4 : 2, 0, multi_node);
    const int reconnect[2] = {reconnect_s0, reconnect_s1};
    for (int r = 0; r < 2; ++r) {
      completions_.push_back(std::make_unique<abi::CompletionV1>());
      ranks_.push_back(std::make_shared<Rank>(r, 1000 + r, 0, completions_.back().get(),
                                              std::make_unique<server::engines::EngineRank>()));
      ASSERT_TRUE(job_->AddRank(ranks_.back()).ok());
      job_->NoteReconnect(reconnect[r]);
    }
    if (!multi_node) return;
    auto topo = std::make_shared<server::scheduler::Topology>();
    topo->world_size = 4;
    topo->node_ranks = {{0, 1}, {2, 3}};
    topo->node_names = {"a", "b"};
    topo->node_of_rank = {0, 0, 1, 1};
    ring_ = std::make_shared<FakeRing>();
    ASSERT_TRUE(job_->SetTopology(topo, ring_).ok());
  }
  Op* Submit(uint32_t seq) {
    Op* op = job_->SlotFor(seq, common::MonotonicNs());
    for (int r = 0; r < 2; ++r) {
      op->parts[r].started = true;
      op->parts[r].arrived = true;
      op->parts[r].submit_ns = common::MonotonicNs();
      ranks_[r]->inflight.fetch_add(1);
    }
    op->arrived = 2;
    return op;
  }

  std::unique_ptr<Job> job_;
  std::vector<std::unique_ptr<abi::CompletionV1>> completions_;
  std::vector<std::shared_ptr<Rank>> ranks_;
  std::shared_ptr<FakeRing> ring_;
};

TEST_F(HandBackTest, NothingOfAJobHandedBackReachesItsRanks) {
  Join(120, 5);
  Op* first = Submit(1);
  Op* second = Submit(2);
  job_->FinishOp(first, absl::OkStatus(), -1);
  for (const auto& c : completions_) ASSERT_EQ(c->done_seq, 1u);

  const absl::Status lost = absl::AbortedError("node 1 (b) failed: ring link 0 to it broke");
  ASSERT_TRUE(job_->HandBack(lost));
  EXPECT_TRUE(job_->handing_back());
  ASSERT_EQ(ring_->aborts.size(), 1u);  // Its ring's ops in flight end now.
  EXPECT_EQ(ring_->aborts[0], lost);
  EXPECT_EQ(job_->hand_back_why(), lost);

  // The ring ends op 2 with the loss: no error record, no done flag.
  job_->FinishOp(second, lost, -1);
  for (const auto& c : completions_) {
    EXPECT_EQ(c->done_seq, 1u);
    EXPECT_EQ(c->error_count, 0u);
  }
  EXPECT_EQ(job_->ops_in_flight(), 0);
  // Nor does a later failure (an op timeout, a rank's session ending).
  job_->Fail(absl::DeadlineExceededError("op timed out"), -1);
  EXPECT_FALSE(job_->failed());
  EXPECT_FALSE(job_->HandBack(lost));  // Once.
}

TEST_F(HandBackTest, ARankThatDoesNotWaitMeansTheJobFails) {
  Join(120, 0);  // Rank 1 runs with DMAGATHER_RECONNECT_S=0.
  Op* op = Submit(1);
  EXPECT_FALSE(job_->HandBack(absl::AbortedError("node 1 failed")));
  EXPECT_FALSE(job_->handing_back());
  EXPECT_TRUE(ring_->aborts.empty());
  job_->Fail(absl::AbortedError("node 1 failed"), -1);
  job_->FinishOp(op, absl::AbortedError("node 1 failed"), -1);
  for (const auto& c : completions_) {
    EXPECT_EQ(c->done_seq, 1u);
    EXPECT_EQ(c->error_count, 1u);  // The failure reaches the ranks.
  }
}

TEST_F(HandBackTest, AOneNodeJobIsNeverHandedBack) {
  Join(120, 120, /*multi_node=*/false);
  EXPECT_FALSE(job_->HandBack(absl::AbortedError("x")));
}

TEST(HandBackExpectLocal, RanksComingBackMustAgreeOnTheNode) {
  Job job("back", 4, 0, true);
  EXPECT_FALSE(job.ExpectLocal({}).ok());
  EXPECT_FALSE(job.ExpectLocal({0, 4}).ok());
  ASSERT_TRUE(job.ExpectLocal({1, 0}).ok());
  EXPECT_EQ(job.local_count(), 2);
  EXPECT_TRUE(job.ExpectLocal({0, 1}).ok());
  EXPECT_FALSE(job.ExpectLocal({0, 2}).ok());
  abi::CompletionV1 c{};
  auto stranger = std::make_shared<Rank>(2, 1002, 0, &c, std::make_unique<server::engines::EngineRank>());
  EXPECT_FALSE(job.AddRank(stranger).ok());  // Rank 2 was on another node.
  auto r0 = std::make_shared<Rank>(0, 1000, 0, &c, std::make_unique<server::engines::EngineRank>());
  ASSERT_TRUE(job.AddRank(r0).ok());
  EXPECT_FALSE(job.local_joined());
  abi::CompletionV1 c1{};
  auto r1 = std::make_shared<Rank>(1, 1001, 0, &c1, std::make_unique<server::engines::EngineRank>());
  ASSERT_TRUE(job.AddRank(r1).ok());
  EXPECT_TRUE(job.local_joined());
}

}  // namespace
}  // namespace dmagather::testing
