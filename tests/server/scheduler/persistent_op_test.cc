// Persistent (CUDA-graph captured) ops in the scheduler, driven one step at
// a time with the fake engine: the definition is one ordinary op (one
// verdict, done published at once); a replay starts only when every rank's
// graph ready flag is 1, resets them, and publishes the done words (low
// word) after the engine's copies; failure releases every slot for good
// (high word). Data is checked bit-exact after every replay.
#include "server/scheduler/persistent_op.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "abi/completion_v1.h"
#include "abi/graph_v1.h"
#include "abi/ring_v1.h"
#include "absl/status/status.h"
#include "common/api_names.h"
#include "common/clock.h"
#include "server/scheduler/job.h"
#include "server/scheduler/op.h"
#include "server/scheduler/rank.h"
#include "tests/fakes/fake_copy_engine.h"

namespace dmagather::testing {
namespace {

using server::engines::testing::FakeCopyEngine;
using server::engines::testing::FakeRegion;
using server::scheduler::Item;
using server::scheduler::Job;
using server::scheduler::Op;
using server::scheduler::OpKind;
using server::scheduler::Rank;

constexpr int kWorld = 3;
constexpr uint64_t kShard = 4099;

struct Fixture {
  // Completion pages as the segment has them (8 KiB: CompletionV1 + graph flags).
  std::vector<std::unique_ptr<char[]>> pages;
  std::vector<std::shared_ptr<Rank>> ranks;
  std::vector<std::vector<char>> send, recv;
  Job job{"graph", kWorld, 0};
  FakeCopyEngine engine;

  Fixture() {
    for (int r = 0; r < kWorld; ++r) {
      pages.emplace_back(new char[8192]());
      ranks.push_back(
          std::make_shared<Rank>(r, 100 + r, 0, completion(r), std::make_unique<server::engines::EngineRank>()));
      EXPECT_TRUE(job.AddRank(ranks.back()).ok());
      send.emplace_back(kShard);
      recv.emplace_back(kShard * kWorld);
    }
  }
  abi::CompletionV1* completion(int r) { return reinterpret_cast<abi::CompletionV1*>(pages[r].get()); }
  abi::GraphFlagsV1* flags(int r) { return abi::GraphFlagsOf(completion(r)); }
  uint32_t done_lo(int r, int slot) { return flags(r)->done[slot].lo; }
  uint32_t done_hi(int r, int slot) { return flags(r)->done[slot].hi; }

  // One op whose parts every rank sent; graph_slot[r] < 0: not captured.
  Op* Submit(uint32_t seq, const std::vector<int>& slots) {
    Op* op = job.SlotFor(seq, common::MonotonicNs());
    for (int r = 0; r < kWorld; ++r) {
      auto& p = op->parts[r];
      p.started = p.arrived = true;
      p.submit_ns = common::MonotonicNs();
      p.graph_slot = slots[r];
      Item it;
      it.kind = OpKind::kAllGather;
      it.dtype = 0;  // uint8
      it.count = kShard;
      it.send = send[r].data();
      it.recv_begin = 0;
      it.num_recv = 1;
      p.items.push_back(it);
      p.recv.push_back(recv[r].data());
      ranks[r]->inflight.fetch_add(1);
    }
    op->arrived = kWorld;
    return op;
  }
};

TEST(PersistentOpTest, DefineThenReplayBitExact) {
  Fixture f;
  const std::vector<int> slots = {3, 0, 7};  // Each rank chose its own slot.
  Op* def = f.Submit(1, slots);
  f.job.Dispatch(def, &f.engine);
  // The definition completes at once, with no copies and no engine op.
  EXPECT_TRUE(f.engine.pending.empty());
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(f.completion(r)->done_seq, 1u);
  EXPECT_EQ(f.job.persistent_ops(), 1u);
  EXPECT_TRUE(f.job.has_persistent());
  for (int replay = 0; replay < 20; ++replay) {
    for (int r = 0; r < kWorld; ++r) {
      for (uint64_t i = 0; i < kShard; ++i) f.send[r][i] = char(replay * 31 + r * 7 + i);
      std::memset(f.recv[r].data(), 0x5A, f.recv[r].size());
    }
    // Two ranks' graphs replayed: nothing starts.
    f.flags(0)->ready[slots[0]] = 1;
    f.flags(2)->ready[slots[2]] = 1;
    EXPECT_EQ(f.job.PollPersistent(&f.engine), 0);
    EXPECT_TRUE(f.engine.pending.empty());
    // The last one: the replay starts and the ready flags are reset.
    f.flags(1)->ready[slots[1]] = 1;
    EXPECT_EQ(f.job.PollPersistent(&f.engine), 1);
    ASSERT_EQ(f.engine.pending.size(), 1u);
    for (int r = 0; r < kWorld; ++r) EXPECT_EQ(f.flags(r)->ready[slots[r]], 0u);
    EXPECT_TRUE(f.engine.pending[0]->ready_observed);
    EXPECT_EQ(f.job.PollPersistent(&f.engine), 0);  // Running: not started twice.
    EXPECT_EQ(f.job.ops_in_flight(), 1);            // Holds the ranks' segments.
    for (int r = 0; r < kWorld; ++r) EXPECT_EQ(f.done_lo(r, slots[r]), 0u);
    f.engine.Complete(0);
    EXPECT_EQ(f.job.ops_in_flight(), 0);
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(f.done_lo(r, slots[r]), 1u);
      EXPECT_EQ(f.done_hi(r, slots[r]), 0u);
      EXPECT_EQ(f.flags(r)->status[slots[r]], 0);
      for (int src = 0; src < kWorld; ++src) {
        ASSERT_EQ(std::memcmp(f.recv[r].data() + src * kShard, f.send[src].data(), kShard), 0)
            << "replay " << replay << " rank " << r << " shard " << src;
      }
      // The rank's graph re-arms its own wait (low word back to 0).
      f.flags(r)->done[slots[r]].lo = 0;
    }
  }
  // An ordinary op still runs beside it.
  Op* plain = f.Submit(2, {-1, -1, -1});
  f.job.Dispatch(plain, &f.engine);
  ASSERT_EQ(f.engine.pending.size(), 1u);
  EXPECT_FALSE(f.engine.pending[0]->ready_observed);
  f.engine.Complete(0);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(f.completion(r)->done_seq, 2u);
}

TEST(PersistentOpTest, EngineErrorAndJobFailureReleaseForGood) {
  Fixture f;
  const std::vector<int> slots = {1, 1, 1};
  f.job.Dispatch(f.Submit(1, slots), &f.engine);
  for (int r = 0; r < kWorld; ++r) f.flags(r)->ready[1] = 1;
  ASSERT_EQ(f.job.PollPersistent(&f.engine), 1);
  f.engine.Complete(0, absl::InternalError("copy failed"));
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(f.done_lo(r, 1), 1u);
    EXPECT_EQ(f.done_hi(r, 1), 1u);  // Released: no later replay can wait forever.
    EXPECT_EQ(f.flags(r)->status[1], common::ToApiStatus(absl::InternalError("x")));
  }
  // A second op, then the job fails while it is armed.
  f.job.Dispatch(f.Submit(2, {2, 2, 2}), &f.engine);
  f.job.Fail(absl::AbortedError("rank 2 died"), 2);
  EXPECT_EQ(f.job.PollPersistent(&f.engine), 0);
  EXPECT_TRUE(f.engine.pending.empty());
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(f.done_hi(r, 2), 1u);
    EXPECT_EQ(f.flags(r)->status[2], common::ToApiStatus(absl::AbortedError("x")));
  }
}

TEST(PersistentOpTest, CapturedOnSomeRanksOnlyFailsEverywhere) {
  Fixture f;
  f.job.Dispatch(f.Submit(1, {0, -1, 0}), &f.engine);
  EXPECT_TRUE(f.engine.pending.empty());
  EXPECT_EQ(f.job.persistent_ops(), 0u);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(f.completion(r)->done_seq, 1u);
    ASSERT_EQ(f.completion(r)->error_count, 1u);
    EXPECT_EQ(f.completion(r)->errors[0].status, common::ToApiStatus(absl::InvalidArgumentError("x")));
    EXPECT_NE(std::strstr(f.completion(r)->errors[0].message, "captured it into a CUDA graph"), nullptr);
  }
}

TEST(PersistentOpTest, RedefiningASlotRetiresTheOldOp) {
  Fixture f;
  f.job.Dispatch(f.Submit(1, {4, 4, 4}), &f.engine);
  f.job.Dispatch(f.Submit(2, {4, 5, 6}), &f.engine);  // Rank 0 reuses slot 4 (its graph was destroyed).
  f.job.PollPersistent(&f.engine);                    // Drops the retired op.
  EXPECT_EQ(f.job.persistent_ops(), 1u);
  for (int r = 0; r < kWorld; ++r) f.flags(r)->ready[4 + r] = 1;
  EXPECT_EQ(f.job.PollPersistent(&f.engine), 1);
  f.engine.Complete(0);
  EXPECT_EQ(f.done_lo(0, 4), 1u);
  EXPECT_EQ(f.done_lo(2, 6), 1u);
}

}  // namespace
}  // namespace dmagather::testing

namespace dmagather::testing {
namespace {

TEST(PersistentOpTest, ARanksDestroyedGraphRetiresTheOp) {
  Fixture f;
  f.job.Dispatch(f.Submit(1, {2, 3, 4}), &f.engine);
  ASSERT_TRUE(f.job.has_persistent());
  f.flags(0)->ready[2] = 1;                          // Rank 0 replayed ...
  f.flags(1)->ready[3] = abi::kGraphSlotReleasedV1;  // ... rank 1's graph is gone.
  EXPECT_EQ(f.job.PollPersistent(&f.engine), 0);
  EXPECT_TRUE(f.engine.pending.empty());
  const std::vector<int> slots = {2, 3, 4};
  for (int r = 0; r < kWorld; ++r) {
    // No done word is touched: a slot may already be reused by its owner.
    EXPECT_EQ(f.done_hi(r, slots[r]), 0u) << "rank " << r;
    EXPECT_EQ(f.done_lo(r, slots[r]), 0u) << "rank " << r;
  }
  EXPECT_EQ(f.flags(1)->ready[3], 0u);
  f.job.PollPersistent(&f.engine);
  EXPECT_EQ(f.job.persistent_ops(), 0u);
  EXPECT_FALSE(f.job.has_persistent());  // The ingress thread may sleep on its doorbell again.
}

// --- A daemon that takes the job back (Job::RearmCaptured, PersistentOp::TakeBack) ---

// The next daemon's view of the same ranks: its own Job and Rank objects
// over the same completion pages and buffers (what the ranks hand back).
struct NextDaemon {
  Fixture& f;
  std::vector<std::shared_ptr<Rank>> ranks;
  Job job{"graph", kWorld, 0};
  FakeCopyEngine engine;

  explicit NextDaemon(Fixture& old) : f(old) {
    for (int r = 0; r < kWorld; ++r) {
      ranks.push_back(
          std::make_shared<Rank>(r, 100 + r, 0, f.completion(r), std::make_unique<server::engines::EngineRank>()));
      EXPECT_TRUE(job.AddRank(ranks.back()).ok());
    }
  }
  // Every rank hands back its definition of op `seq` in `slots[r]`.
  void HandBack(uint32_t seq, const std::vector<int>& slots, int ranks_handing = kWorld) {
    for (int r = 0; r < ranks_handing; ++r) {
      server::scheduler::RankPart p;
      p.graph_slot = slots[r];
      Item it;
      it.kind = OpKind::kAllGather;
      it.dtype = 0;
      it.count = kShard;
      it.send = f.send[r].data();
      it.num_recv = 1;
      p.items.push_back(it);
      p.recv.push_back(f.recv[r].data());
      job.AddCapturedDefinition(r, seq, std::move(p));
    }
  }
};

void FillInputs(Fixture& f, int replay) {
  for (int r = 0; r < kWorld; ++r) {
    for (uint64_t i = 0; i < kShard; ++i) f.send[r][i] = char(replay * 13 + r * 5 + i);
  }
}

void ExpectGathered(Fixture& f, const std::vector<int>& slots) {
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(f.done_lo(r, slots[r]), 1u);
    EXPECT_EQ(f.done_hi(r, slots[r]), 0u);
    for (int src = 0; src < kWorld; ++src) {
      ASSERT_EQ(std::memcmp(f.recv[r].data() + src * kShard, f.send[src].data(), kShard), 0)
          << "rank " << r << " shard " << src;
    }
  }
}

TEST(PersistentOpTest, AReplayRecordsTheDaemonsPhase) {
  Fixture f;
  const std::vector<int> slots = {1, 2, 3};
  f.job.Dispatch(f.Submit(1, slots), &f.engine);
  for (int r = 0; r < kWorld; ++r) f.flags(r)->ready[slots[r]] = 1;
  ASSERT_EQ(f.job.PollPersistent(&f.engine), 1);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(f.flags(r)->phase[slots[r]], abi::kPhaseTaken);
  f.engine.Complete(0);
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(f.flags(r)->phase[slots[r]], abi::kPhaseIdle);
}

TEST(PersistentOpTest, AReplayTheDaemonDiedInRunsAgainUnderTheNextBitExact) {
  Fixture f;
  const std::vector<int> slots = {3, 0, 7};
  f.job.Dispatch(f.Submit(1, slots), &f.engine);
  FillInputs(f, 1);
  for (int r = 0; r < kWorld; ++r) f.flags(r)->ready[slots[r]] = 1;
  ASSERT_EQ(f.job.PollPersistent(&f.engine), 1);
  // The daemon dies with the copies half done: rank 1's output is garbage,
  // nobody's done word is written, and the ranks' graphs wait.
  std::memset(f.recv[1].data(), 0x5A, f.recv[1].size());
  NextDaemon next(f);
  next.HandBack(1, slots);
  const Job::Rearmed r = next.job.RearmCaptured(1, next.engine);
  EXPECT_EQ(r.ops, 1);
  EXPECT_EQ(r.run_again, 1);
  EXPECT_EQ(r.released, 0);
  ASSERT_EQ(next.job.PollPersistent(&next.engine), 1);
  next.engine.Complete(0);
  ExpectGathered(f, slots);
  // The next replays go on under the new daemon.
  for (int replay = 2; replay < 5; ++replay) {
    for (int r = 0; r < kWorld; ++r) f.flags(r)->done[slots[r]].lo = 0;
    FillInputs(f, replay);
    for (int r = 0; r < kWorld; ++r) f.flags(r)->ready[slots[r]] = 1;
    ASSERT_EQ(next.job.PollPersistent(&next.engine), 1);
    next.engine.Complete(0);
    ExpectGathered(f, slots);
  }
}

TEST(PersistentOpTest, DoneWrittenForEveryRankIsNotRunAgain) {
  Fixture f;
  const std::vector<int> slots = {0, 1, 2};
  f.job.Dispatch(f.Submit(1, slots), &f.engine);
  // Cut after every done word was written, before the phase went idle.
  for (int r = 0; r < kWorld; ++r) {
    f.flags(r)->phase[slots[r]] = abi::kPhaseEnding;
    f.flags(r)->done[slots[r]].lo = 1;
  }
  NextDaemon next(f);
  next.HandBack(1, slots);
  const Job::Rearmed r = next.job.RearmCaptured(1, next.engine);
  EXPECT_EQ(r.ops, 1);
  EXPECT_EQ(r.run_again + r.released, 0);
  EXPECT_EQ(next.job.PollPersistent(&next.engine), 0);
  for (int k = 0; k < kWorld; ++k) EXPECT_EQ(f.flags(k)->phase[slots[k]], abi::kPhaseIdle);
}

TEST(PersistentOpTest, CutWhileWritingDoneReleasesRatherThanGuess) {
  Fixture f;
  const std::vector<int> slots = {4, 5, 6};
  f.job.Dispatch(f.Submit(1, slots), &f.engine);
  // Rank 0 got its done word; ranks 1 and 2 show 0: not written yet, or
  // taken and reset by a graph that went on. Neither a copy nor a done is safe.
  for (int r = 0; r < kWorld; ++r) f.flags(r)->phase[slots[r]] = abi::kPhaseEnding;
  f.flags(0)->done[slots[0]].lo = 1;
  NextDaemon next(f);
  next.HandBack(1, slots);
  const Job::Rearmed r = next.job.RearmCaptured(1, next.engine);
  EXPECT_EQ(r.released, 1);
  EXPECT_EQ(next.job.PollPersistent(&next.engine), 0);
  EXPECT_TRUE(next.engine.pending.empty());
  for (int k = 0; k < kWorld; ++k) {
    EXPECT_EQ(f.done_hi(k, slots[k]), 1u) << "rank " << k;
    EXPECT_EQ(f.flags(k)->status[slots[k]], common::ToApiStatus(absl::UnavailableError("")));
  }
}

TEST(PersistentOpTest, IdleSlotsAreArmedAsBeforeAndReplaysAskedForMeanwhileRun) {
  Fixture f;
  const std::vector<int> slots = {9, 8, 7};
  f.job.Dispatch(f.Submit(1, slots), &f.engine);
  NextDaemon next(f);
  next.HandBack(1, slots);
  EXPECT_EQ(next.job.RearmCaptured(1, next.engine).run_again, 0);
  EXPECT_EQ(next.job.PollPersistent(&next.engine), 0);
  // The ranks replayed during the gap: asked for, served.
  FillInputs(f, 7);
  for (int r = 0; r < kWorld; ++r) f.flags(r)->ready[slots[r]] = 1;
  ASSERT_EQ(next.job.PollPersistent(&next.engine), 1);
  next.engine.Complete(0);
  ExpectGathered(f, slots);
}

TEST(PersistentOpTest, DefinitionsNotDoneOrNotHeldByEveryRankAreNotArmed) {
  Fixture f;
  NextDaemon next(f);
  next.HandBack(5, {0, 0, 0});     // After the newest op done: read from the rings again.
  next.HandBack(3, {1, 1, 1}, 2);  // Rank 2 does not hold it.
  const Job::Rearmed r = next.job.RearmCaptured(4, next.engine);
  EXPECT_EQ(r.ops, 0);
  EXPECT_EQ(r.dropped, 1);
  EXPECT_FALSE(next.job.has_persistent());
}

TEST(PersistentOpTest, ANextDaemonOnHostMemoryReleasesCapturedOps) {
  Fixture f;
  const std::vector<int> slots = {2, 2, 2};
  f.job.Dispatch(f.Submit(1, slots), &f.engine);
  NextDaemon next(f);
  next.engine.host_memory = true;
  next.HandBack(1, slots);
  EXPECT_EQ(next.job.RearmCaptured(1, next.engine).released, 1);
  for (int k = 0; k < kWorld; ++k) EXPECT_EQ(f.done_hi(k, slots[k]), 1u);
}

}  // namespace
}  // namespace dmagather::testing
