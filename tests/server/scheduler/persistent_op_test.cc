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

}  // namespace
}  // namespace dmagather::testing
