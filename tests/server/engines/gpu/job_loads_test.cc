// JobLoads: the max_waits_ahead bound counts per job (one job's parked ops
// never hold another's), a job's finisher is its first op's and an op with
// another lowest device gets none, an op that failed at issue holds the
// job's device-written done flags until it ends, and idle loads are dropped
// when there are many (busy ones never).
#include "server/engines/gpu/job_loads.h"

#include <gtest/gtest.h>

#include <vector>

namespace dmagather::server::engines::gpu {
namespace {

TEST(JobLoadsTest, TheBoundCountsPerJob) {
  JobLoads loads;
  constexpr int kBound = 2;
  auto* a1 = loads.Begin(1, /*waits_ahead=*/true);
  auto* a2 = loads.Begin(1, true);
  // Job 1 is at the bound with ops parked ahead of their flags: its next
  // op waits, ready or not; job 2 is untouched by it.
  EXPECT_FALSE(loads.MayIssue(1, /*ranks_ready=*/false, kBound));
  EXPECT_FALSE(loads.MayIssue(1, /*ranks_ready=*/true, kBound));
  EXPECT_TRUE(loads.MayIssue(2, false, kBound));
  auto* b1 = loads.Begin(2, true);
  auto* b2 = loads.Begin(2, true);
  EXPECT_FALSE(loads.MayIssue(2, false, kBound));
  JobLoads::End(a1, true, false);
  EXPECT_TRUE(loads.MayIssue(1, false, kBound));
  EXPECT_FALSE(loads.MayIssue(2, false, kBound));
  // At the bound with nothing parked ahead: a ready op goes, a waiting one does not.
  auto* a3 = loads.Begin(1, false);
  JobLoads::End(a2, true, false);
  auto* a4 = loads.Begin(1, false);
  EXPECT_TRUE(loads.MayIssue(1, true, kBound));
  EXPECT_FALSE(loads.MayIssue(1, false, kBound));
  EXPECT_TRUE(loads.MayIssue(3, false, 0)) << "bound 0: no bound";
  for (auto* l : {a3, a4}) JobLoads::End(l, false, false);
  for (auto* l : {b1, b2}) JobLoads::End(l, true, false);
}

TEST(JobLoadsTest, TheFinisherIsTheFirstOpsAndAnIssueFailureHoldsDoneFlags) {
  JobLoads loads;
  auto* op1 = loads.Begin(7, false);
  EXPECT_EQ(loads.Finisher(op1, 2), 2);
  auto* op2 = loads.Begin(7, false);
  EXPECT_EQ(loads.Finisher(op2, 2), 2);
  EXPECT_EQ(loads.Finisher(op2, 0), -1) << "another device would write the job's flags out of order";
  EXPECT_FALSE(JobLoads::Unsettled(op2));
  JobLoads::FailedAtIssue(op1);
  EXPECT_TRUE(JobLoads::Unsettled(op2)) << "op 2's flags could show done before op 1's error";
  JobLoads::End(op1, false, /*failed_at_issue=*/true);
  EXPECT_FALSE(JobLoads::Unsettled(op2));
  JobLoads::End(op2, false, false);
}

TEST(JobLoadsTest, IdleLoadsAreDroppedWhenThereAreMany) {
  JobLoads loads;
  std::vector<JobLoads::Load*> busy;
  for (uint64_t j = 1; j <= 10; ++j) busy.push_back(loads.Begin(j, false));
  for (uint64_t j = 11; j <= 1030; ++j) JobLoads::End(loads.Begin(j, false), false, false);
  EXPECT_LT(loads.size(), 1030u) << "idle loads kept";
  EXPECT_GE(loads.size(), 10u);
  // The busy ones survived the drops: their counts are intact.
  for (auto* l : busy) EXPECT_EQ(l->in_flight.load(), 1);
  for (auto* l : busy) JobLoads::End(l, false, false);
}

}  // namespace
}  // namespace dmagather::server::engines::gpu
