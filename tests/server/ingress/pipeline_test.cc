// Ingress -> matcher -> planner -> (fake) engine -> completion, driven one
// poll at a time: descriptors are written into real shm rings, buffers are
// fake regions, and the engine completes ops when and how the test says.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "abi/descriptor_v2.h"
#include "abi/graph_v1.h"
#include "abi/ring_v1.h"
#include "common/clock.h"
#include "common/memfd.h"
#include "server/ingress/ingress.h"
#include "server/scheduler/job.h"
#include "tests/fakes/fake_clock.h"
#include "tests/fakes/fake_copy_engine.h"
#include "tests/server/ingress/pipeline_fixture.h"

namespace dmagather::testing {
namespace {

TEST_F(PipelineTest, WaitsForEveryRankThenCopiesBitExact) {
  Make(3);
  for (int r = 0; r < 3; ++r) {
    for (int i = 0; i < 100; ++i) ranks_[r]->region->base()[r * 100 + i] = char(r * 31 + i);
  }
  ranks_[0]->Submit(100);
  ranks_[2]->Submit(100);
  EXPECT_EQ(Poll(), 2);
  EXPECT_TRUE(engine_.pending.empty());  // Rank 1 has not asked yet.
  ranks_[1]->Submit(100);
  EXPECT_EQ(Poll(), 1);
  ASSERT_EQ(engine_.pending.size(), 1u);
  EXPECT_EQ(engine_.pending[0]->plan.copies.size(), 6u);  // 3x3 minus the in-place self shards.
  engine_.Complete(0);
  for (int d = 0; d < 3; ++d) {
    EXPECT_EQ(ranks_[d]->done(), 1u);
    EXPECT_EQ(ranks_[d]->errors(), 0u);
    for (int r = 0; r < 3; ++r) {
      for (int i = 0; i < 100; ++i) ASSERT_EQ(ranks_[d]->region->base()[r * 100 + i], char(r * 31 + i));
    }
  }
}

TEST_F(PipelineTest, ATakenBackJobSkipsTheOpsTheEarlierDaemonEnded) {
  // Two segments as an earlier daemon left them when it died between the
  // done flags of op 3: rank 0 saw it done, rank 1 did not, so rank 1's
  // ring still holds op 3 (coalesced, 3 items) ahead of ops 4 and 5.
  for (int r = 0; r < 2; ++r) ranks_.push_back(std::make_unique<FakeRank>(r, &engine_));
  ranks_[1]->seq = 2;
  ranks_[1]->SubmitCoalesced({8, 8, 8}, {0, 100, 200});
  ranks_[0]->seq = 3;
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 10; ++i) ranks_[r]->region->base()[1000 + r * 10 + i] = char(50 + r * 10 + i);
    ranks_[r]->Submit(10, 1000);
    ranks_[r]->SubmitCoalesced({4, 4}, {2000, 3000});
  }
  ranks_[0]->TakeBack(3);
  ranks_[1]->TakeBack(2);
  job_ = std::make_shared<Job>("job", 2, 0);
  job_->MarkResuming();
  for (auto& r : ranks_) ASSERT_TRUE(job_->AddRank(r->session).ok());
  EXPECT_TRUE(job_->awaiting_resume());
  job_->StartAfter(3);  // The newest op any rank saw done.
  EXPECT_FALSE(job_->awaiting_resume());
  EXPECT_EQ(ranks_[1]->done(), 3u) << "op 3's data is complete everywhere: done on every rank";
  MakeIngress();
  EXPECT_EQ(Poll(), 3 + 3 + 3) << "rank 1's op 3 read past, ops 4 and 5 read";
  ASSERT_EQ(engine_.pending.size(), 2u) << "nothing of op 3 runs again";
  engine_.Complete(0);
  engine_.Complete(0);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(ranks_[d]->done(), 5u);
    EXPECT_EQ(ranks_[d]->errors(), 0u) << Message(*ranks_[d], 0);
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 10; ++i) ASSERT_EQ(ranks_[d]->region->base()[1000 + r * 10 + i], char(50 + r * 10 + i));
    }
  }
}

TEST_F(PipelineTest, DoneFlagsArePublishedInOrder) {
  Make(2);
  for (auto& r : ranks_) {
    r->Submit(10, 0);
    r->Submit(10, 1000);
  }
  Poll();
  ASSERT_EQ(engine_.pending.size(), 2u);
  engine_.Complete(1);               // Op 2 finishes first...
  EXPECT_EQ(ranks_[0]->done(), 0u);  // ...but is not published before op 1.
  EXPECT_EQ(ranks_[1]->done(), 0u);
  engine_.Complete(0);
  EXPECT_EQ(ranks_[0]->done(), 2u);
  EXPECT_EQ(ranks_[1]->done(), 2u);
  EXPECT_EQ(ranks_[0]->session->inflight.load(), 0u);
}

TEST_F(PipelineTest, EngineErrorReachesEveryRank) {
  Make(2);
  for (auto& r : ranks_) r->Submit(10);
  Poll();
  engine_.Complete(0, absl::InternalError("cudaMemcpyBatchAsync: an illegal memory access (700)"));
  for (auto& r : ranks_) {
    EXPECT_EQ(r->done(), 1u);
    ASSERT_EQ(r->errors(), 1u);
    EXPECT_EQ(r->error(0).status, 6);
    EXPECT_EQ(r->error(0).seq, 1u);
    EXPECT_NE(Message(*r, 0).find("illegal memory access"), std::string::npos);
  }
}

TEST_F(PipelineTest, InvalidPartFailsTheOpOnEveryRank) {
  Make(2);
  ranks_[0]->Submit(10);
  ranks_[1]->Submit(10, 0, /*region_id=*/100);  // Rank 0's region.
  Poll();
  EXPECT_TRUE(engine_.pending.empty());
  for (auto& r : ranks_) {
    EXPECT_EQ(r->done(), 1u);
    ASSERT_EQ(r->errors(), 1u);
    EXPECT_EQ(r->error(0).status, 2);  // INVALID_ARGUMENT
    EXPECT_EQ(r->error(0).failed_rank, 1);
    EXPECT_NE(Message(*r, 0).find("region 100, which rank 1 has not registered"), std::string::npos) << Message(*r, 0);
  }
}

TEST_F(PipelineTest, PeerFailureFailsWaitingAndLaterOps) {
  Make(3);
  ranks_[0]->Submit(10);
  ranks_[1]->Submit(10);
  Poll();
  job_->Fail(absl::AbortedError("rank 2 (pid 1002) of job 'job' exited or was killed"), 2);
  Poll(/*sweep=*/true);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ranks_[r]->done(), 1u);
    ASSERT_EQ(ranks_[r]->errors(), 1u);
    EXPECT_EQ(ranks_[r]->error(0).status, 4);  // PEER_FAILED
    EXPECT_EQ(ranks_[r]->error(0).failed_rank, 2);
  }
  ranks_[0]->Submit(10);  // Later ops fail at once.
  Poll(true);
  EXPECT_EQ(ranks_[0]->done(), 2u);
  EXPECT_EQ(ranks_[0]->errors(), 2u);
  EXPECT_EQ(ranks_[2]->done(), 0u);  // Never submitted: never told it finished.
}

TEST_F(PipelineTest, TimeoutNamesMissingRanksAndStopsTheJob) {
  Make(3, absl::Milliseconds(100));
  ranks_[1]->Submit(10);
  const uint64_t t0 = common::MonotonicNs();
  Poll(true, t0);
  EXPECT_EQ(ranks_[1]->done(), 0u);  // Not yet timed out.
  Poll(true, t0 + 200'000'000);
  EXPECT_EQ(ranks_[1]->done(), 1u);
  ASSERT_EQ(ranks_[1]->errors(), 1u);
  EXPECT_EQ(ranks_[1]->error(0).status, 5);  // TIMEOUT
  EXPECT_NE(Message(*ranks_[1], 0).find("rank(s) 0,2 never submitted it (rank(s) 1 did)"), std::string::npos)
      << Message(*ranks_[1], 0);
  EXPECT_TRUE(job_->failed());
}

TEST_F(PipelineTest, BusySlotLeavesDescriptorsInTheRing) {
  Make(2);
  for (uint32_t i = 0; i < abi::kRingSlotsV1; ++i) ranks_[0]->Submit(1, 0);
  EXPECT_EQ(Poll(), int(abi::kRingSlotsV1));
  ranks_[0]->Submit(1, 0);  // Seq 257 maps to op 1's slot, still waiting for rank 1.
  EXPECT_EQ(Poll(), 0);
  EXPECT_EQ(ranks_[0]->view().ring->head, uint64_t{abi::kRingSlotsV1});
  ranks_[1]->Submit(1, 0);  // Op 1 matches...
  Poll();
  ASSERT_EQ(engine_.pending.size(), 1u);
  engine_.Complete(0);  // ...finishes, frees the slot, and seq 257 moves in.
  EXPECT_EQ(Poll(), 1);
  EXPECT_EQ(ranks_[0]->view().ring->head, uint64_t{abi::kRingSlotsV1} + 1);
}

TEST_F(PipelineTest, ClientCannotRewindTheDaemonsRingIndex) {
  Make(1);
  ranks_[0]->Submit(10);
  EXPECT_EQ(Poll(), 1);
  ranks_[0]->view().ring->head = 0;  // A client scribbling on the consumer index...
  EXPECT_EQ(Poll(), 0);              // ...does not make the daemon replay descriptors.
  ranks_[0]->Submit(10);
  EXPECT_EQ(Poll(), 1);
  EXPECT_EQ(engine_.pending.size(), 2u);
}

TEST_F(PipelineTest, RanksThatDisagreeAreNamed) {
  Make(3);
  ranks_[0]->Submit(10);
  ranks_[1]->Submit(10);
  ranks_[2]->Submit(11);
  Poll();
  EXPECT_TRUE(engine_.pending.empty());
  for (auto& r : ranks_) {
    ASSERT_EQ(r->errors(), 1u);
    EXPECT_EQ(r->error(0).status, 2);
    EXPECT_NE(Message(*r, 0).find("ranks 2 differ from rank 0"), std::string::npos) << Message(*r, 0);
  }
}

TEST_F(PipelineTest, CoalescedItemsAreOneOpAndLandBitExact) {
  Make(2);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 7; ++i) ranks_[r]->region->base()[r * 7 + i] = char(50 + r * 7 + i);
    for (int i = 0; i < 300; ++i) ranks_[r]->region->base()[1000 + r * 300 + i] = char(r * 3 + i);
  }
  ranks_[0]->SubmitCoalesced({7, 300}, {0, 1000});
  EXPECT_EQ(Poll(), 2);                  // Both of rank 0's items read...
  EXPECT_TRUE(engine_.pending.empty());  // ...but one op: it waits for rank 1.
  ranks_[1]->SubmitCoalesced({7, 300}, {0, 1000});
  EXPECT_EQ(Poll(), 2);
  ASSERT_EQ(engine_.pending.size(), 1u);
  EXPECT_EQ(engine_.pending[0]->plan.copies.size(), 4u);  // 2 items x 2 ranks x 1 peer each.
  engine_.Complete(0);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(ranks_[d]->done(), 1u);
    EXPECT_EQ(ranks_[d]->errors(), 0u);
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 7; ++i) ASSERT_EQ(ranks_[d]->region->base()[r * 7 + i], char(50 + r * 7 + i));
      for (int i = 0; i < 300; ++i) ASSERT_EQ(ranks_[d]->region->base()[1000 + r * 300 + i], char(r * 3 + i));
    }
  }
}

TEST_F(PipelineTest, ARefusalFailsTheOpOnEveryRankWithoutTheEngine) {
  Make(3);
  ranks_[0]->Submit(10);
  ranks_[1]->Refuse(1, "rank 1: its tensors live in memory the backend cannot reach");
  ranks_[2]->Submit(10);
  Poll();
  EXPECT_TRUE(engine_.pending.empty());
  for (auto& r : ranks_) {
    EXPECT_EQ(r->done(), 1u);
    ASSERT_EQ(r->errors(), 1u);
    EXPECT_EQ(r->error(0).status, 1);  // FALLBACK, on every rank.
    EXPECT_EQ(r->error(0).failed_rank, 1);
    EXPECT_NE(Message(*r, 0).find("cannot reach"), std::string::npos) << Message(*r, 0);
    EXPECT_EQ(Message(*r, 0).find("rank 1: rank 1:"), std::string::npos) << Message(*r, 0);
  }
  EXPECT_EQ(job_->counters.fallback_ops.load(), 1u);
  // The job goes on: the next op runs.
  for (auto& r : ranks_) r->Submit(10);
  Poll();
  EXPECT_EQ(engine_.pending.size(), 1u);
}

}  // namespace
}  // namespace dmagather::testing

namespace dmagather::testing {
namespace {

// A graph-captured op end to end through the ingress thread: the definition
// is decoded (slot from the op code), validated and completed at once; each
// replay (every rank's ready flag of its slot) is started by the ingress
// poll and lands bit-exact, also after a rank deregistered the buffer (the
// armed op holds it); a slot out of range fails the definition everywhere.
TEST_F(PipelineTest, CapturedOpIsDefinedOnceAndReplayedByReadyFlags) {
  Make(2);
  ranks_[0]->SubmitCaptured(100, 5);
  ranks_[1]->SubmitCaptured(100, 9);
  Poll();
  EXPECT_TRUE(engine_.pending.empty());
  for (auto& r : ranks_) {
    EXPECT_EQ(r->done(), 1u);
    EXPECT_EQ(r->errors(), 0u);
  }
  EXPECT_TRUE(job_->has_persistent());
  // Rank 1's buffer is deregistered: the armed op keeps it mapped.
  std::atomic<uint32_t> none{0};
  ASSERT_TRUE(ranks_[1]->input->regions.Remove(101, none).ok());
  EXPECT_GT(ranks_[1]->region.use_count(), 1);  // Besides this test's own reference: the op's.
  for (int replay = 0; replay < 3; ++replay) {
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 100; ++i) ranks_[r]->region->base()[r * 100 + i] = char(replay * 7 + r * 31 + i);
    }
    ranks_[0]->graph()->ready[5] = 1;
    Poll();
    EXPECT_TRUE(engine_.pending.empty());
    ranks_[1]->graph()->ready[9] = 1;
    Poll();
    ASSERT_EQ(engine_.pending.size(), 1u);
    EXPECT_EQ(ranks_[0]->graph()->ready[5], 0u);
    engine_.Complete(0);
    EXPECT_EQ(ranks_[0]->graph()->done[5].lo, 1u);
    EXPECT_EQ(ranks_[1]->graph()->done[9].lo, 1u);
    for (int d = 0; d < 2; ++d) {
      for (int r = 0; r < 2; ++r) {
        for (int i = 0; i < 100; ++i) ASSERT_EQ(ranks_[d]->region->base()[r * 100 + i], char(replay * 7 + r * 31 + i));
      }
    }
    ranks_[0]->graph()->done[5].lo = 0;
    ranks_[1]->graph()->done[9].lo = 0;
  }
}

TEST_F(PipelineTest, CapturedOpWithASlotOutOfRangeFailsEverywhere) {
  Make(2);
  ranks_[0]->SubmitCaptured(100, 1);
  ranks_[1]->SubmitCaptured(100, 40);
  Poll();
  EXPECT_FALSE(job_->has_persistent());
  for (auto& r : ranks_) {
    EXPECT_EQ(r->done(), 1u);
    ASSERT_EQ(r->errors(), 1u);
    EXPECT_NE(Message(*r, 0).find("graph slot 40"), std::string::npos) << Message(*r, 0);
  }
}

TEST_F(PipelineTest, CapturedOpsAreRefusedOnHostMemorySoNothingIsPolled) {
  engine_.host_memory = true;
  Make(2);
  ranks_[0]->SubmitCaptured(100, 1);
  ranks_[1]->SubmitCaptured(100, 1);
  Poll();
  EXPECT_FALSE(job_->has_persistent()) << "an armed op would keep the ingress thread polling";
  for (auto& r : ranks_) {
    EXPECT_EQ(r->done(), 1u);
    ASSERT_EQ(r->errors(), 1u);
    EXPECT_EQ(r->error(0).status, 2);  // INVALID_ARGUMENT
    EXPECT_NE(Message(*r, 0).find("need a GPU backend"), std::string::npos) << Message(*r, 0);
  }
}

// While a job is active (work within stay_awake_ns on the ingress's clock)
// the thread polls on and never sleeps, so an op after a gap rings no
// doorbell and wakes nobody; once the window has passed it sleeps. The
// clock is a fake that moves only when told, so the window is exact; the
// control arm (no window) must sleep under the same clock, or the test
// could not fail.
TEST_F(PipelineTest, StaysAwakeWhileAJobIsActiveThenSleeps) {
  for (const uint64_t window : {uint64_t{0}, uint64_t{50'000'000}}) {
    SCOPED_TRACE(::testing::Message() << "stay_awake_ns " << window);
    common::testing::FakeClock clock;
    options_.clock = &clock;
    options_.stay_awake_ns = window;
    ranks_.clear();
    Make(2);
    ingress_->Start();
    for (auto& r : ranks_) r->Submit(10);
    for (int i = 0; i < 5000 && abi::LoadAcquire(&ranks_[1]->view().ring->head) != 1; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(abi::LoadAcquire(&ranks_[1]->view().ring->head), 1u) << "the op was never taken";
    if (window == 0) {
      // No window: the thread sleeps after its short spin though the clock stands still.
      for (int i = 0; i < 5000 && ingress_->sleeps() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_GE(ingress_->sleeps(), 1u);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // Real time passes; the job's does not.
      EXPECT_EQ(ingress_->sleeps(), 0u) << "asleep inside the window";
      EXPECT_EQ(abi::LoadAcquire(&bell_.sleeping), 0u) << "a rank would ring the doorbell";
      clock.AdvanceNs(window + 1);  // The job goes quiet.
      for (int i = 0; i < 5000 && ingress_->sleeps() == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_GE(ingress_->sleeps(), 1u) << "still awake after the window";
    }
    ingress_->Stop();
    ingress_.reset();
    engine_.pending.clear();  // Ops of this arm's job, never completed.
  }
}

TEST(PersistentPollTest, TheSleepGrowsWithIdleTimeAndIsBounded) {
  EXPECT_EQ(PersistentPollNs(0), kPersistentPollNs);
  EXPECT_EQ(PersistentPollNs(1'000'000), kPersistentPollNs) << "1 ms after work: still 20 us";
  EXPECT_EQ(PersistentPollNs(32'000'000), 500'000u);
  EXPECT_EQ(PersistentPollNs(64'000'000), kPersistentIdlePollNs);
  EXPECT_EQ(PersistentPollNs(3'600'000'000'000ull), kPersistentIdlePollNs) << "an hour idle: 1 ms, no more";
  EXPECT_LE(1'000'000'000ull / kPersistentIdlePollNs, 1000u) << "at most 1000 wake-ups a second when idle";
}

}  // namespace
}  // namespace dmagather::testing
