// PlanWaves: every byte of every copy is covered exactly once, chunks and
// batches respect their limits, batches are contiguous, streams are dealt
// round-robin, and the order spreads destinations (ring steps).
#include "server/engines/gpu/wave_plan.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

namespace dmagather::server::engines::gpu {
namespace {

// A flat AllGather of `world` ranks, shard `bytes`, outputs in one arena:
// rank d's output at out + d*world*bytes, rank s's input at in + s*bytes.
std::vector<CopyCmd> FlatPlan(int world, uint64_t bytes, char* out, const char* in, bool in_place) {
  std::vector<CopyCmd> copies;
  for (int d = 0; d < world; ++d) {
    for (int s = 0; s < world; ++s) {
      if (in_place && s == d) continue;
      copies.push_back(CopyCmd{out + (uint64_t(d) * world + s) * bytes, in + uint64_t(s) * bytes, bytes, s, d});
    }
  }
  return copies;
}

void CheckCoverage(const std::vector<CopyCmd>& copies, const std::vector<CopyCmd>& chunks, uint64_t chunk_bytes) {
  // Map each chunk back to its copy by destination range; all bytes once.
  std::map<const char*, const CopyCmd*> by_dst;
  for (const CopyCmd& c : copies) by_dst[c.dst] = &c;
  std::map<const CopyCmd*, std::map<uint64_t, uint64_t>> covered;  // copy -> offset -> bytes
  for (const CopyCmd& k : chunks) {
    ASSERT_GT(k.bytes, 0u);
    ASSERT_LE(k.bytes, chunk_bytes);
    auto it = by_dst.upper_bound(k.dst);
    ASSERT_NE(it, by_dst.begin());
    --it;
    const CopyCmd* c = it->second;
    const uint64_t off = k.dst - c->dst;
    ASSERT_LE(off + k.bytes, c->bytes);
    EXPECT_EQ(k.src, c->src + off) << "source and destination offsets differ";
    EXPECT_EQ(k.src_rank, c->src_rank);
    EXPECT_EQ(k.dst_rank, c->dst_rank);
    EXPECT_TRUE(covered[c].emplace(off, k.bytes).second) << "chunk issued twice";
  }
  for (const CopyCmd& c : copies) {
    uint64_t next = 0;
    for (const auto& [off, n] : covered[&c]) {
      EXPECT_EQ(off, next) << "gap or overlap in a copy";
      next = off + n;
    }
    EXPECT_EQ(next, c.bytes) << "copy not fully covered";
  }
}

TEST(WavePlan, CoversEveryByteOnceWithinLimits) {
  static char out[1], in[1];
  for (int world : {1, 2, 3, 8}) {
    for (uint64_t bytes : {uint64_t{1}, uint64_t{4095}, uint64_t{1 << 20} + 7, uint64_t{300} << 20}) {
      for (bool in_place : {false, true}) {
        std::vector<CopyCmd> copies = FlatPlan(world, bytes, out, in, in_place);
        WavePlanOptions o;
        o.chunk_bytes = 8 << 20;
        o.streams = 4;
        o.max_batch = 5;
        o.world_size = world;
        std::vector<CopyCmd> chunks;
        std::vector<WaveBatch> batches;
        PlanWaves(copies, o, &chunks, &batches);
        SCOPED_TRACE(::testing::Message() << "world " << world << " bytes " << bytes << " in_place " << in_place);
        CheckCoverage(copies, chunks, o.chunk_bytes);
        // Batches tile the chunk array in order, each within limits.
        uint32_t next = 0;
        for (const WaveBatch& b : batches) {
          EXPECT_EQ(b.begin, next);
          EXPECT_GT(b.end, b.begin);
          EXPECT_LE(b.end - b.begin, uint32_t(o.max_batch));
          EXPECT_GE(b.stream, 0);
          EXPECT_LT(b.stream, o.streams);
          next = b.end;
        }
        EXPECT_EQ(next, chunks.size());
      }
    }
  }
}

TEST(WavePlan, LargeCopiesAreCutBelowTheHangSize) {
  static char out[1], in[1];
  std::vector<CopyCmd> copies = {CopyCmd{out, in, uint64_t{1} << 30, 1, 0}};
  WavePlanOptions o;
  o.chunk_bytes = 64 << 20;
  o.streams = 4;
  o.max_batch = 16;
  o.world_size = 2;
  std::vector<CopyCmd> chunks;
  std::vector<WaveBatch> batches;
  PlanWaves(copies, o, &chunks, &batches);
  EXPECT_EQ(chunks.size(), 16u);
  std::set<int> streams;
  for (const WaveBatch& b : batches) streams.insert(b.stream);
  EXPECT_EQ(streams.size(), 4u) << "one large copy is spread over every stream";
  CheckCoverage(copies, chunks, o.chunk_bytes);
}

TEST(WavePlan, RingOrderSpreadsDestinationsAndSources) {
  static char out[1], in[1];
  const int world = 8;
  std::vector<CopyCmd> copies = FlatPlan(world, 4096, out, in, /*in_place=*/true);
  WavePlanOptions o;
  o.chunk_bytes = 1 << 20;
  o.streams = 1;
  o.max_batch = 1000;
  o.world_size = world;
  std::vector<CopyCmd> chunks;
  std::vector<WaveBatch> batches;
  PlanWaves(copies, o, &chunks, &batches);
  ASSERT_EQ(chunks.size(), size_t(world * (world - 1)));
  // Each group of `world` consecutive chunks is one ring step: every
  // destination once and every source once (no incast on a peer).
  for (size_t g = 0; g < chunks.size(); g += world) {
    std::set<int> dsts, srcs;
    for (size_t i = g; i < g + world; ++i) {
      dsts.insert(chunks[i].dst_rank);
      srcs.insert(chunks[i].src_rank);
    }
    EXPECT_EQ(dsts.size(), size_t(world)) << "step " << g / world;
    EXPECT_EQ(srcs.size(), size_t(world)) << "step " << g / world;
  }
}

TEST(WavePlan, StreamsAreDealtRoundRobinAndEmptyPlanIsEmpty) {
  static char out[1], in[1];
  std::vector<CopyCmd> copies = FlatPlan(4, 1 << 20, out, in, true);  // 12 copies of one chunk.
  WavePlanOptions o;
  o.chunk_bytes = 1 << 20;
  o.streams = 4;
  o.max_batch = 2;
  o.world_size = 4;
  std::vector<CopyCmd> chunks;
  std::vector<WaveBatch> batches;
  PlanWaves(copies, o, &chunks, &batches);
  std::vector<uint64_t> per_stream(4);
  for (const WaveBatch& b : batches) {
    for (uint32_t i = b.begin; i < b.end; ++i) per_stream[b.stream] += chunks[i].bytes;
  }
  for (uint64_t n : per_stream) EXPECT_EQ(n, 3u << 20);
  PlanWaves({}, o, &chunks, &batches);
  EXPECT_TRUE(chunks.empty());
  EXPECT_TRUE(batches.empty());
}

}  // namespace
}  // namespace dmagather::server::engines::gpu
