// GraphSlots: slots are taken until none is left, come back when released
// or when the backend reports their graph destroyed, and captured ops are
// remembered by handle (with their one stream wait).
#include "client/graph_slots.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "abi/graph_v1.h"
#include "abi/ring_v1.h"
#include "common/memfd.h"

namespace dmagather::client {
namespace {

TEST(GraphSlotsTest, SlotsRunOutAndComeBack) {
  GraphSlots slots;
  for (uint32_t s = 0; s < abi::kGraphSlotsV1; ++s) EXPECT_EQ(slots.Take(), static_cast<int>(s));
  EXPECT_EQ(slots.used(), static_cast<int>(abi::kGraphSlotsV1));
  EXPECT_EQ(slots.Take(), -1);
  slots.Release(5);
  EXPECT_EQ(slots.Take(), 5);
  EXPECT_EQ(slots.Take(), -1);
  {
    // The backend's callback: graph of slot 9 destroyed (any thread).
    absl::MutexLock lock(&slots.freed()->mu);
    slots.freed()->freed.push_back(9);
  }
  EXPECT_EQ(slots.used(), static_cast<int>(abi::kGraphSlotsV1)) << "reclaimed at the next Take";
  EXPECT_EQ(slots.Take(), 9);
  absl::MutexLock lock(&slots.freed()->mu);
  EXPECT_TRUE(slots.freed()->freed.empty());
}

TEST(GraphSlotsTest, ACaptureIsNamedBySlotAndGenerationUntilItsGraphIsReclaimed) {
  // What a captured reduce-scatter's staging is held by: (slot, generation)
  // lives until the destroyed graph's slot is reclaimed, and a later capture
  // into the same slot is another generation.
  GraphSlots slots;
  const int s = slots.Take();
  ASSERT_GE(s, 0);
  const uint64_t gen = slots.generation(s);
  EXPECT_TRUE(slots.Holds(s, gen));
  {
    absl::MutexLock lock(&slots.freed()->mu);
    slots.freed()->freed.push_back(s);
  }
  EXPECT_TRUE(slots.Holds(s, gen)) << "not reclaimed yet";
  slots.Reclaim();
  EXPECT_FALSE(slots.Holds(s, gen));
  EXPECT_EQ(slots.used(), 0);
  EXPECT_EQ(slots.Take(), s);
  EXPECT_EQ(slots.generation(s), gen + 1);
  EXPECT_FALSE(slots.Holds(s, gen)) << "the slot is another capture's now";
  EXPECT_TRUE(slots.Holds(s, gen + 1));
}

TEST(GraphSlotsTest, CapturedOpsAreFoundByHandleAndTheOldestForgotten) {
  GraphSlots slots;
  EXPECT_EQ(slots.Find(1), nullptr);
  slots.Captured(1, 3);
  GraphSlots::CapturedOp* op = slots.Find(1);
  ASSERT_NE(op, nullptr);
  EXPECT_EQ(op->slot, 3u);
  EXPECT_FALSE(op->waited);
  op->waited = true;
  EXPECT_TRUE(slots.Find(1)->waited);
  for (uint64_t h = 2; h <= 4 * abi::kGraphSlotsV1 + 1; ++h) slots.Captured(h, h % abi::kGraphSlotsV1);
  EXPECT_EQ(slots.Find(1), nullptr) << "beyond 4 records per slot the oldest goes";
  EXPECT_NE(slots.Find(2), nullptr);
}

TEST(GraphSlotsTest, TheReadyWordsAreSharedWithTheCallback) {
  GraphSlots slots;
  uint32_t words[abi::kGraphSlotsV1] = {};
  slots.SetReadyWords(words);
  {
    absl::MutexLock lock(&slots.freed()->mu);
    EXPECT_EQ(slots.freed()->ready, words);
  }
  slots.SetReadyWords(nullptr);
  absl::MutexLock lock(&slots.freed()->mu);
  EXPECT_EQ(slots.freed()->ready, nullptr);
}

TEST(GraphSlotsTest, FlagsAreResetPerSlotAndReleasedForEveryOne) {
  auto m = common::MemfdMapping::Create("graph-flags", abi::SegmentLayoutV1::kBytes);
  ASSERT_TRUE(m.ok()) << m.status();
  abi::CompletionV1* c = abi::SegmentViewV1::At(m->data()).completion;
  abi::GraphFlagsV1* g = abi::GraphFlagsOf(c);
  for (uint32_t s = 0; s < abi::kGraphSlotsV1; ++s) {
    g->ready[s] = 1;
    g->done[s].hi = 4;
    g->done[s].lo = 5;
    g->status[s] = 2;
  }
  GraphSlots::ResetFlags(c, 7);
  EXPECT_EQ(g->stamp, abi::kGraphFlagsStampV1);
  EXPECT_EQ(g->ready[7], 0u);
  EXPECT_EQ(g->done[7].hi, 0u);
  EXPECT_EQ(g->done[7].lo, 0u);
  EXPECT_EQ(g->status[7], 0);
  EXPECT_EQ(g->ready[6], 1u) << "other slots untouched";
  EXPECT_EQ(g->done[8].lo, 5u);
  GraphSlots::ReleaseForever(c);
  for (uint32_t s = 0; s < abi::kGraphSlotsV1; ++s) EXPECT_EQ(g->done[s].hi, 1u) << s;
  EXPECT_EQ(g->done[7].lo, 0u) << "only the high words";
}

TEST(GraphSlotsTest, DefinitionsAreKeptWhileTheirGraphsLive) {
  GraphSlots slots;
  abi::DescriptorV2 ds[2]{};
  ds[0].seq = ds[1].seq = 7;
  ds[0].count = 11;
  ds[1].count = 22;
  ASSERT_EQ(slots.Take(), 0);
  ASSERT_EQ(slots.Take(), 1);
  slots.Define(0, 7, ds, 2);
  ds[0].count = 33;
  slots.Define(1, 8, ds, 1);
  std::vector<CapturedDefinition> defs = slots.Definitions();
  ASSERT_EQ(defs.size(), 2u);
  EXPECT_EQ(defs[0].seq, 7u);
  EXPECT_EQ(defs[0].slot, 0u);
  ASSERT_EQ(defs[0].descriptors.size(), 2 * sizeof(abi::DescriptorV2));
  abi::DescriptorV2 back[2];
  std::memcpy(back, defs[0].descriptors.data(), sizeof(back));
  EXPECT_EQ(back[0].count, 11u) << "as published, not as the scratch is later";
  EXPECT_EQ(back[1].count, 22u);
  EXPECT_EQ(defs[1].seq, 8u);
  // Slot 1's graph is destroyed: its definition is no longer handed back,
  // and is dropped when the slot is taken again.
  {
    absl::MutexLock lock(&slots.freed()->mu);
    slots.freed()->freed.push_back(1);
  }
  defs = slots.Definitions();
  ASSERT_EQ(defs.size(), 1u);
  EXPECT_EQ(defs[0].slot, 0u);
  EXPECT_EQ(slots.Take(), 1);
  EXPECT_EQ(slots.Definitions().size(), 1u);
  // A capture that failed gives its slot back, and its definition.
  slots.Release(0);
  EXPECT_TRUE(slots.Definitions().empty());
}

}  // namespace
}  // namespace dmagather::client
