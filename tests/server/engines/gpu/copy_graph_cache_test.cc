// CopyGraphCache on fake graph calls: what is built, launched, dropped and
// destroyed, and when (server/engines/gpu/copy_graph_cache.h).
#include "server/engines/gpu/copy_graph_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace dmagather::server::engines::gpu {
namespace {

// A fake runtime: a graph is a number; it records the chunks each graph was
// built from, every launch (graph, stream) and every destroy.
struct FakeGraphs {
  int next = 1;
  std::map<int, std::vector<CopyCmd>> built;
  std::map<int, size_t> lanes;  // Of each graph built.
  std::vector<std::pair<int, void*>> launches;
  std::vector<int> destroyed;
  bool fail_build = false;
  bool fail_launch = false;

  CopyGraphCache::Ops Ops() {
    CopyGraphCache::Ops ops;
    ops.build = [this](const CopyCmd* c, size_t n, size_t l) -> absl::StatusOr<CopyGraphCache::Graph> {
      if (fail_build) return absl::InternalError("no graph today");
      const int id = next++;
      built[id] = std::vector<CopyCmd>(c, c + n);
      lanes[id] = l;
      return reinterpret_cast<CopyGraphCache::Graph>(static_cast<intptr_t>(id));
    };
    ops.launch = [this](CopyGraphCache::Graph g, void* s) {
      if (fail_launch) return absl::InternalError("launch failed");
      launches.emplace_back(static_cast<int>(reinterpret_cast<intptr_t>(g)), s);
      return absl::OkStatus();
    };
    ops.destroy = [this](CopyGraphCache::Graph g) {
      destroyed.push_back(static_cast<int>(reinterpret_cast<intptr_t>(g)));
    };
    return ops;
  }
};

char arena[1 << 20];

std::vector<CopyCmd> Call(size_t first, int n, uint64_t bytes = 4096) {
  std::vector<CopyCmd> c;
  for (int i = 0; i < n; ++i) {
    CopyCmd x;
    x.src = arena + first + i * 2 * bytes;
    x.dst = arena + first + (i * 2 + 1) * bytes;
    x.bytes = bytes;
    c.push_back(x);
  }
  return c;
}

void* const kStream = reinterpret_cast<void*>(0x51);

TEST(CopyGraphCacheTest, BuiltOnTheSecondSightThenLaunchedEachTime) {
  FakeGraphs f;
  CopyGraphCache cache(f.Ops(), {});
  auto call = Call(0, 12);
  EXPECT_FALSE(cache.Replay(0, kStream, call.data(), call.size(), false));  // First sight.
  EXPECT_TRUE(f.built.empty());
  EXPECT_TRUE(cache.Replay(0, kStream, call.data(), call.size(), false));  // Second: built and launched.
  ASSERT_EQ(f.built.size(), 1u);
  const std::vector<CopyCmd>& g = f.built.begin()->second;
  ASSERT_EQ(g.size(), 12u);
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(g[i].dst, call[i].dst);
    EXPECT_EQ(g[i].src, call[i].src);
    EXPECT_EQ(g[i].bytes, call[i].bytes);
  }
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(cache.Replay(0, kStream, call.data(), call.size(), false));
  EXPECT_EQ(f.built.size(), 1u);
  ASSERT_EQ(f.launches.size(), 6u);
  for (const auto& [graph, stream] : f.launches) {
    EXPECT_EQ(graph, 1);
    EXPECT_EQ(stream, kStream);
  }
  EXPECT_EQ(cache.replays(), 6u);
  EXPECT_EQ(cache.built(), 1u);
}

TEST(CopyGraphCacheTest, KeyIsDeviceAddressesAndSizes) {
  FakeGraphs f;
  CopyGraphCache cache(f.Ops(), {});
  auto a = Call(0, 3);
  auto b = a;
  b[2].bytes = 2048;  // Same addresses, one size differs.
  for (int i = 0; i < 2; ++i) cache.Replay(0, kStream, a.data(), a.size(), false);
  EXPECT_FALSE(cache.Replay(0, kStream, b.data(), b.size(), false));  // A different call: its first sight.
  EXPECT_FALSE(cache.Replay(1, kStream, a.data(), a.size(), false));  // Another device: its first sight.
  EXPECT_TRUE(cache.Replay(1, kStream, a.data(), a.size(), false));
  EXPECT_EQ(f.built.size(), 2u);
}

TEST(CopyGraphCacheTest, LargeChunksAreNeverReplayed) {
  FakeGraphs f;
  CopyGraphCache::Options o;
  o.max_chunk_bytes = 8192;
  CopyGraphCache cache(f.Ops(), o);
  auto call = Call(0, 2, 16384);
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(cache.Replay(0, kStream, call.data(), call.size(), false));
  EXPECT_TRUE(f.built.empty());
}

TEST(CopyGraphCacheTest, LargeChunksWithLanesAreChainsSideBySide) {
  FakeGraphs f;
  CopyGraphCache::Options o;
  o.max_chunk_bytes = 8192;
  o.lanes = 4;
  CopyGraphCache cache(f.Ops(), o);
  auto small = Call(0, 6, 4096);         // All chunks under the cap: one chain.
  auto large = Call(64 << 10, 6, 8192);  // At the cap: still one chain.
  auto mixed = Call(256 << 10, 6, 4096);
  mixed[3].bytes = 8193;                 // One chunk over the cap: lanes.
  auto two = Call(512 << 10, 2, 16384);  // Fewer chunks than lanes: one lane per chunk.
  for (auto* c : {&small, &large, &mixed, &two}) {
    EXPECT_FALSE(cache.Replay(0, kStream, c->data(), c->size(), false));
    EXPECT_TRUE(cache.Replay(0, kStream, c->data(), c->size(), false));
  }
  EXPECT_EQ(f.lanes, (std::map<int, size_t>{{1, 1}, {2, 1}, {3, 4}, {4, 2}}));
  EXPECT_EQ(f.built[3].size(), 6u);
  EXPECT_EQ(f.built[3][3].bytes, 8193u);
  EXPECT_EQ(cache.replays(), 4u);
}

TEST(CopyGraphCacheTest, ASoleStreamCallChainsLargerChunks) {
  FakeGraphs f;
  CopyGraphCache::Options o;
  o.max_chunk_bytes = 8192;
  o.max_sole_chunk_bytes = 32768;
  o.lanes = 4;
  CopyGraphCache cache(f.Ops(), o);
  auto mid = Call(0, 6, 16384);          // Over the cap, under the sole-stream cap.
  auto big = Call(256 << 10, 6, 65536);  // Over both.
  // The op's sole stream: one chain; the same call fanned out: lanes, its own graph.
  for (bool sole : {true, false}) {
    EXPECT_FALSE(cache.Replay(0, kStream, mid.data(), mid.size(), sole));
    EXPECT_TRUE(cache.Replay(0, kStream, mid.data(), mid.size(), sole));
  }
  EXPECT_EQ(f.lanes, (std::map<int, size_t>{{1, 1}, {2, 4}}));
  EXPECT_FALSE(cache.Replay(0, kStream, big.data(), big.size(), true));
  EXPECT_TRUE(cache.Replay(0, kStream, big.data(), big.size(), true));
  EXPECT_EQ(f.lanes.at(3), 4u);  // Over the sole-stream cap: lanes as any call.

  o.max_sole_chunk_bytes = 0;  // Off: a sole stream's call is as any other.
  o.lanes = 0;
  CopyGraphCache off(f.Ops(), o);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(off.Replay(0, kStream, mid.data(), mid.size(), true));
  EXPECT_EQ(off.built(), 0u);
}

TEST(CopyGraphCacheTest, AReleaseDropsOnlyTheGraphsThatTouchIt) {
  FakeGraphs f;
  CopyGraphCache cache(f.Ops(), {});
  auto a = Call(0, 4);          // Bytes [0, 32 KiB) of the arena.
  auto b = Call(256 << 10, 4);  // From 256 KiB.
  for (int i = 0; i < 2; ++i) {
    cache.Replay(0, kStream, a.data(), a.size(), false);
    cache.Replay(0, kStream, b.data(), b.size(), false);
  }
  ASSERT_EQ(cache.size(), 2u);
  // b's last destination ends at 256 KiB + 32 KiB; release its last byte only.
  cache.releases()->Add(reinterpret_cast<uint64_t>(arena) + (256 << 10) + (32 << 10) - 1, 1);
  EXPECT_TRUE(cache.Replay(0, kStream, a.data(), a.size(), false));   // a kept: replayed.
  EXPECT_FALSE(cache.Replay(0, kStream, b.data(), b.size(), false));  // b dropped: a first sight again.
  EXPECT_EQ(f.destroyed, (std::vector<int>{2}));
  EXPECT_EQ(cache.dropped(), 1u);
  EXPECT_TRUE(cache.Replay(0, kStream, b.data(), b.size(), false));  // Rebuilt on its second sight.
  EXPECT_EQ(f.built.size(), 3u);
  // A range next to a graph's copies (not overlapping) drops nothing.
  cache.releases()->Add(reinterpret_cast<uint64_t>(arena) + (32 << 10), 4096);
  EXPECT_TRUE(cache.Replay(0, kStream, a.data(), a.size(), false));
  EXPECT_EQ(cache.dropped(), 1u);
}

TEST(CopyGraphCacheTest, LeastRecentlyUsedGoesFirst) {
  FakeGraphs f;
  CopyGraphCache::Options o;
  o.max_graphs = 2;
  CopyGraphCache cache(f.Ops(), o);
  auto a = Call(0, 1), b = Call(64 << 10, 1), c = Call(128 << 10, 1);
  for (int i = 0; i < 2; ++i) cache.Replay(0, kStream, a.data(), a.size(), false);  // Graph 1.
  for (int i = 0; i < 2; ++i) cache.Replay(0, kStream, b.data(), b.size(), false);  // Graph 2.
  cache.Replay(0, kStream, a.data(), a.size(), false);                              // a used last.
  for (int i = 0; i < 2; ++i) cache.Replay(0, kStream, c.data(), c.size(), false);  // Graph 3: b goes.
  EXPECT_EQ(f.destroyed, (std::vector<int>{2}));
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_TRUE(cache.Replay(0, kStream, a.data(), a.size(), false));
}

TEST(CopyGraphCacheTest, ABuildFailureSkipsThatCallAndRepeatedOnesTurnItOff) {
  FakeGraphs f;
  CopyGraphCache::Options o;
  o.max_build_failures = 2;
  CopyGraphCache cache(f.Ops(), o);
  auto a = Call(0, 1), b = Call(64 << 10, 1), c = Call(128 << 10, 1);
  for (int i = 0; i < 2; ++i) cache.Replay(0, kStream, a.data(), a.size(), false);  // Built.
  f.fail_build = true;
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(cache.Replay(0, kStream, b.data(), b.size(), false));
  f.fail_build = false;
  EXPECT_FALSE(cache.Replay(0, kStream, b.data(), b.size(), false));  // Not tried again.
  EXPECT_TRUE(cache.Replay(0, kStream, a.data(), a.size(), false));   // Others still replay.
  EXPECT_TRUE(cache.enabled());
  f.fail_build = true;
  for (int i = 0; i < 2; ++i) EXPECT_FALSE(cache.Replay(0, kStream, c.data(), c.size(), false));  // Second failure.
  EXPECT_FALSE(cache.enabled());
  EXPECT_EQ(f.destroyed, (std::vector<int>{1}));  // Turned off: everything destroyed.
  f.fail_build = false;
  EXPECT_FALSE(cache.Replay(0, kStream, a.data(), a.size(), false));
}

TEST(CopyGraphCacheTest, ALaunchFailureTurnsItOffAndDestroysEverything) {
  FakeGraphs f;
  CopyGraphCache cache(f.Ops(), {});
  auto a = Call(0, 2);
  cache.Replay(0, kStream, a.data(), a.size(), false);
  f.fail_launch = true;
  EXPECT_FALSE(cache.Replay(0, kStream, a.data(), a.size(), false));
  EXPECT_FALSE(cache.enabled());
  EXPECT_EQ(f.destroyed, (std::vector<int>{1}));
}

TEST(CopyGraphCacheTest, DestructorDestroysEveryGraph) {
  FakeGraphs f;
  {
    CopyGraphCache cache(f.Ops(), {});
    auto a = Call(0, 1), b = Call(64 << 10, 1);
    for (int i = 0; i < 2; ++i) {
      cache.Replay(0, kStream, a.data(), a.size(), false);
      cache.Replay(0, kStream, b.data(), b.size(), false);
    }
  }
  std::vector<int> d = f.destroyed;
  std::sort(d.begin(), d.end());
  EXPECT_EQ(d, (std::vector<int>{1, 2}));
}

TEST(CopyGraphCacheTest, ReleasesFromAnotherThreadAreSeen) {
  FakeGraphs f;
  CopyGraphCache cache(f.Ops(), {});
  auto a = Call(0, 1);
  for (int i = 0; i < 2; ++i) cache.Replay(0, kStream, a.data(), a.size(), false);
  std::thread t([&] { cache.releases()->Add(reinterpret_cast<uint64_t>(arena), 1); });
  t.join();
  EXPECT_FALSE(cache.Replay(0, kStream, a.data(), a.size(), false));
  EXPECT_EQ(cache.dropped(), 1u);
}

}  // namespace
}  // namespace dmagather::server::engines::gpu
