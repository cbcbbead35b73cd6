// All-to-all ops (and the reduce-scatters, moved the same way) through
// ingress -> matcher -> planner -> (fake) engine -> completion: what lands
// where, and what is refused on every rank.
#include <gtest/gtest.h>

#include <string>

#include "abi/descriptor_v2.h"
#include "abi/graph_v1.h"
#include "tests/server/ingress/pipeline_fixture.h"

namespace dmagather::testing {
namespace {

using AllToAllTest = PipelineTest;

// The byte rank `r` puts at element i of the chunk it sends to rank `d`.
char Pattern(int r, int d, uint64_t i) { return char(r * 71 + d * 13 + i * 7 + 1); }

void FillSend(FakeRank& rank, int world, uint64_t count, uint64_t send, uint64_t stride) {
  for (int d = 0; d < world; ++d) {
    for (uint64_t i = 0; i < count; ++i)
      rank.region->base()[send + d * stride + i] = Pattern(rank.session->rank(), d, i);
  }
}

// Every rank's output chunk s is rank s's chunk for it (except, with
// `skip_self`, its own chunk, which stays as it was: 0).
void ExpectLanded(std::vector<std::unique_ptr<FakeRank>>& ranks, uint64_t count, uint64_t recv, uint64_t stride,
                  bool skip_self) {
  const int world = static_cast<int>(ranks.size());
  for (int d = 0; d < world; ++d) {
    EXPECT_EQ(ranks[d]->done(), 1u);
    EXPECT_EQ(ranks[d]->errors(), 0u);
    for (int s = 0; s < world; ++s) {
      for (uint64_t i = 0; i < count; ++i) {
        const char want = skip_self && s == d ? 0 : Pattern(s, d, i);
        ASSERT_EQ(ranks[d]->region->base()[recv + s * stride + i], want)
            << "rank " << d << " chunk " << s << " i " << i;
      }
    }
  }
}

TEST_F(AllToAllTest, EveryChunkLandsAtItsSourcesPlaceBitExact) {
  Make(3);
  for (auto& r : ranks_) FillSend(*r, 3, 50, 0, 50);
  for (auto& r : ranks_) r->SubmitAllToAll(abi::kOpAllToAllV2, 50, 0, 1000, 50, 50);
  EXPECT_EQ(Poll(), 3);
  ASSERT_EQ(engine_.pending.size(), 1u);
  EXPECT_EQ(engine_.pending[0]->plan.copies.size(), 9u);  // Its own chunk too.
  engine_.Complete(0);
  ExpectLanded(ranks_, 50, 1000, 50, /*skip_self=*/false);
}

TEST_F(AllToAllTest, ARankThatReadsItsOwnChunkItselfHasItSkipped) {
  Make(4);
  for (auto& r : ranks_) FillSend(*r, 4, 33, 0, 33);
  for (auto& r : ranks_) r->SubmitAllToAll(abi::kOpReduceScatterSumV2, 33, 0, 2000, 33, 33, abi::kAllToAllSkipSelf);
  Poll();
  ASSERT_EQ(engine_.pending.size(), 1u);
  EXPECT_EQ(engine_.pending[0]->plan.copies.size(), 12u);  // 4x4 minus the own chunks.
  EXPECT_EQ(engine_.pending[0]->plan.bytes, 12u * 33u);
  engine_.Complete(0);
  ExpectLanded(ranks_, 33, 2000, 33, /*skip_self=*/true);
}

TEST_F(AllToAllTest, ASliceReadsEveryChunkAtTheSendStrideAndLandsDense) {
  // Slice 1 (elements 40..79) of chunks of 100: send stride 100, dense output.
  Make(2);
  for (auto& r : ranks_) FillSend(*r, 2, 100, 0, 100);
  for (auto& r : ranks_) r->SubmitAllToAll(abi::kOpReduceScatterAvgV2, 40, 40, 4000, 100, 40);
  Poll();
  ASSERT_EQ(engine_.pending.size(), 1u);
  engine_.Complete(0);
  for (int d = 0; d < 2; ++d) {
    for (int s = 0; s < 2; ++s) {
      for (uint64_t i = 0; i < 40; ++i) {
        ASSERT_EQ(ranks_[d]->region->base()[4000 + s * 40 + i], Pattern(s, d, 40 + i));
      }
    }
  }
}

TEST_F(AllToAllTest, AllToAllsAndAllGathersOfOneJobLandInOrder) {
  Make(2);
  for (auto& r : ranks_) FillSend(*r, 2, 64, 8000, 64);
  for (int r = 0; r < 2; ++r) {
    for (int i = 0; i < 10; ++i) ranks_[r]->region->base()[r * 10 + i] = char(90 + r * 10 + i);
  }
  for (auto& r : ranks_) {
    r->Submit(10);  // An in-place all-gather at offset 0.
    r->SubmitAllToAll(abi::kOpAllToAllV2, 64, 8000, 9000, 64, 64);
  }
  Poll();
  ASSERT_EQ(engine_.pending.size(), 2u);
  engine_.Complete(0);
  engine_.Complete(0);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(ranks_[d]->done(), 2u);
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 10; ++i) ASSERT_EQ(ranks_[d]->region->base()[r * 10 + i], char(90 + r * 10 + i));
      for (uint64_t i = 0; i < 64; ++i) ASSERT_EQ(ranks_[d]->region->base()[9000 + r * 64 + i], Pattern(r, d, i));
    }
  }
}

// Op 1 of every rank fails with status `code` and a message containing `what`.
void ExpectFailedEverywhere(std::vector<std::unique_ptr<FakeRank>>& ranks, int32_t code, const std::string& what) {
  for (auto& r : ranks) {
    EXPECT_EQ(r->done(), 1u);
    ASSERT_EQ(r->errors(), 1u);
    EXPECT_EQ(r->error(0).status, code);
    EXPECT_NE(std::string(r->error(0).message).find(what), std::string::npos) << r->error(0).message;
  }
}

TEST_F(AllToAllTest, OverlappingSendAndOutputAreRefusedOnEveryRank) {
  Make(2);
  ranks_[0]->SubmitAllToAll(abi::kOpAllToAllV2, 16, 0, 16, 16, 16);  // Output starts inside send.
  ranks_[1]->SubmitAllToAll(abi::kOpAllToAllV2, 16, 0, 100, 16, 16);
  Poll();
  EXPECT_TRUE(engine_.pending.empty());
  ExpectFailedEverywhere(ranks_, 2, "rank 0: alltoall send and output buffers overlap");
}

TEST_F(AllToAllTest, StridesShorterThanAChunkAreRefused) {
  Make(2);
  for (auto& r : ranks_) r->SubmitAllToAll(abi::kOpAllToAllV2, 16, 0, 100, 8, 16);
  Poll();
  EXPECT_TRUE(engine_.pending.empty());
  ExpectFailedEverywhere(ranks_, 2, "must be at least a chunk");
}

TEST_F(AllToAllTest, ASendPastItsRegionIsRefused) {
  Make(2);
  // The last chunk (rank 1's) would end past the 64 KiB region.
  for (auto& r : ranks_) r->SubmitAllToAll(abi::kOpAllToAllV2, 100, (1 << 16) - 150, 0, 100, 100);
  Poll();
  EXPECT_TRUE(engine_.pending.empty());
  for (auto& r : ranks_) {
    ASSERT_EQ(r->errors(), 1u);
    EXPECT_EQ(r->error(0).status, 2) << r->error(0).message;
  }
}

TEST_F(AllToAllTest, RanksThatDisagreeOnTheReductionAreNamed) {
  Make(3);
  ranks_[0]->SubmitAllToAll(abi::kOpReduceScatterSumV2, 8, 0, 100, 32, 32, abi::kAllToAllSkipSelf, 6);
  ranks_[1]->SubmitAllToAll(abi::kOpReduceScatterAvgV2, 8, 0, 100, 32, 32, abi::kAllToAllSkipSelf, 6);
  ranks_[2]->SubmitAllToAll(abi::kOpReduceScatterSumV2, 8, 0, 100, 32, 32, abi::kAllToAllSkipSelf, 6);
  Poll();
  EXPECT_TRUE(engine_.pending.empty());
  ExpectFailedEverywhere(ranks_, 2, "rank 1 for reduce_scatter(avg) count=8 dtype=float32");
}

TEST_F(AllToAllTest, ACapturedReduceScatterIsArmedAndEachReplayMovesTheChunksBitExact) {
  // A reduce-scatter captured into a CUDA graph: its definition is armed
  // (no copies), then every replay (each rank's ready flag) moves the
  // chunks of the sends as they are at that replay.
  Make(3);
  constexpr uint32_t kSlot = 3;
  for (auto& r : ranks_) {
    r->SubmitAllToAll(abi::kOpReduceScatterSumV2 | abi::kOpPersistentBit | (kSlot << abi::kOpPersistentSlotShift), 40,
                      0, 1000, 40, 40, abi::kAllToAllSkipSelf);
  }
  Poll();
  EXPECT_TRUE(engine_.pending.empty());
  for (auto& r : ranks_) {
    EXPECT_EQ(r->done(), 1u);
    EXPECT_EQ(r->errors(), 0u);
  }
  for (int replay = 0; replay < 3; ++replay) {
    for (auto& r : ranks_) {
      for (int d = 0; d < 3; ++d) {
        for (uint64_t i = 0; i < 40; ++i) {
          r->region->base()[d * 40 + i] = char(Pattern(r->session->rank(), d, i) + replay);
        }
      }
      abi::StoreRelease(&r->graph()->ready[kSlot], 1u);
    }
    Poll();
    ASSERT_EQ(engine_.pending.size(), 1u) << "replay " << replay;
    EXPECT_EQ(engine_.pending[0]->plan.copies.size(), 6u);  // 3x3 minus the own chunks.
    engine_.Complete(0);
    for (int d = 0; d < 3; ++d) {
      EXPECT_EQ(abi::LoadAcquire(&ranks_[d]->graph()->done[kSlot].lo), 1u);
      for (int s = 0; s < 3; ++s) {
        if (s == d) continue;
        for (uint64_t i = 0; i < 40; ++i) {
          ASSERT_EQ(ranks_[d]->region->base()[1000 + s * 40 + i], char(Pattern(s, d, i) + replay))
              << "replay " << replay << " rank " << d << " chunk " << s << " i " << i;
        }
      }
      abi::StoreRelease(&ranks_[d]->graph()->done[kSlot].lo, 0u);  // The graph re-arms its wait.
    }
  }
}

TEST_F(AllToAllTest, AnUnknownOperationIsRefusedOnEveryRank) {
  Make(2);
  for (auto& r : ranks_) r->SubmitAllToAll(7, 8, 0, 100, 8, 8);
  Poll();
  ExpectFailedEverywhere(ranks_, 2, "unknown operation 7");
}

}  // namespace
}  // namespace dmagather::testing
