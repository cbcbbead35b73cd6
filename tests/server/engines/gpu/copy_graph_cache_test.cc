// CopyGraphCache on fake graph calls: what is built, launched, dropped and
// destroyed, and when (server/engines/gpu/cuda/copy_graph_cache.h).
#include "server/engines/gpu/cuda/copy_graph_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <thread>
#include <vector>

#include "absl/status/status.h"

namespace dmagather::server::engines::gpu::cuda {
namespace {

// A fake runtime: a graph is a number; it records the chunks each graph
// copies (as built, then as updated), every launch (graph, stream, what it
// copied) and every destroy. `with_update`: the runtime updates nodes in
// place.
struct FakeGraphs {
  int next = 1;
  std::map<int, std::vector<CopyCmd>> built;
  std::vector<std::pair<int, void*>> launches;
  std::vector<std::vector<CopyCmd>> copied;  // At each launch.
  std::vector<int> destroyed;
  size_t node_updates = 0;
  bool with_update = false;
  bool fail_build = false;
  bool fail_launch = false;
  bool fail_update = false;

  CopyGraphCache::Ops Ops() {
    CopyGraphCache::Ops ops;
    ops.build = [this](const CopyCmd* c, size_t n) -> absl::StatusOr<CopyGraphCache::Graph> {
      if (fail_build) return absl::InternalError("no graph today");
      const int id = next++;
      built[id] = std::vector<CopyCmd>(c, c + n);
      return reinterpret_cast<CopyGraphCache::Graph>(static_cast<intptr_t>(id));
    };
    ops.launch = [this](CopyGraphCache::Graph g, void* s) {
      if (fail_launch) return absl::InternalError("launch failed");
      const int id = static_cast<int>(reinterpret_cast<intptr_t>(g));
      launches.emplace_back(id, s);
      copied.push_back(built[id]);
      return absl::OkStatus();
    };
    ops.destroy = [this](CopyGraphCache::Graph g) {
      destroyed.push_back(static_cast<int>(reinterpret_cast<intptr_t>(g)));
    };
    if (with_update) {
      ops.update = [this](CopyGraphCache::Graph g, size_t node, const CopyCmd& c) {
        if (fail_update) return absl::InvalidArgumentError("mapping changed");
        CopyCmd& old = built.at(static_cast<int>(reinterpret_cast<intptr_t>(g))).at(node);
        EXPECT_EQ(old.bytes, c.bytes);  // Same shape.
        old = c;
        ++node_updates;
        return absl::OkStatus();
      };
    }
    return ops;
  }
};

bool Same(const std::vector<CopyCmd>& a, const std::vector<CopyCmd>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].dst != b[i].dst || a[i].src != b[i].src || a[i].bytes != b[i].bytes) return false;
  }
  return true;
}

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

TEST(CopyGraphCacheTest, ASoleStreamCallChainsLargerChunks) {
  FakeGraphs f;
  CopyGraphCache::Options o;
  o.max_chunk_bytes = 8192;
  o.max_sole_chunk_bytes = 32768;
  CopyGraphCache cache(f.Ops(), o);
  auto mid = Call(0, 6, 16384);          // Over the cap, under the sole-stream cap.
  auto big = Call(256 << 10, 6, 65536);  // Over both.
  // The op's sole stream: one chain; the same call fanned out: the batch path.
  EXPECT_FALSE(cache.Replay(0, kStream, mid.data(), mid.size(), true));
  EXPECT_TRUE(cache.Replay(0, kStream, mid.data(), mid.size(), true));
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(cache.Replay(0, kStream, mid.data(), mid.size(), false));
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(cache.Replay(0, kStream, big.data(), big.size(), true));
  EXPECT_EQ(f.built.size(), 1u);
  EXPECT_EQ(f.built[1].size(), 6u);

  o.max_sole_chunk_bytes = 0;  // Off: a sole stream's call is as any other.
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

// FSDP2's case: the same op (sizes) at new destinations. One graph follows
// them, only the nodes whose addresses changed are updated, and every launch
// copies exactly what its call asked.
TEST(CopyGraphCacheTest, AKnownShapeAtNewAddressesUpdatesAGraphInPlace) {
  FakeGraphs f;
  f.with_update = true;
  CopyGraphCache::Options o;
  o.max_per_shape = 1;
  CopyGraphCache cache(f.Ops(), o);
  auto a = Call(0, 4);
  auto b = a;
  b[1].dst = arena + (512 << 10);
  b[2].dst = arena + (520 << 10);
  auto c = b;
  c[0].src = arena + (600 << 10);
  EXPECT_FALSE(cache.Replay(0, kStream, a.data(), a.size(), false));  // The shape's first sight.
  EXPECT_EQ(cache.last_served(), CopyGraphCache::Served::kNot);
  EXPECT_TRUE(cache.Replay(0, kStream, b.data(), b.size(), false));  // Its second: built for b.
  EXPECT_EQ(cache.last_served(), CopyGraphCache::Served::kBuilt);
  EXPECT_EQ(cache.built(), 1u);
  EXPECT_EQ(cache.updated(), 0u);
  EXPECT_TRUE(cache.Replay(0, kStream, c.data(), c.size(), false));  // Updated: one node.
  EXPECT_EQ(cache.last_served(), CopyGraphCache::Served::kUpdated);
  EXPECT_EQ(cache.updated(), 1u);
  EXPECT_EQ(cache.nodes_updated(), 1u);
  EXPECT_TRUE(cache.Replay(0, kStream, a.data(), a.size(), false));  // Back to a: three nodes.
  EXPECT_EQ(cache.nodes_updated(), 4u);
  EXPECT_TRUE(cache.Replay(0, kStream, a.data(), a.size(), false));  // An exact hit: nothing to update.
  EXPECT_EQ(cache.last_served(), CopyGraphCache::Served::kReplayed);
  EXPECT_EQ(cache.nodes_updated(), 4u);
  EXPECT_EQ(f.node_updates, 4u);
  EXPECT_EQ(cache.built(), 1u);
  EXPECT_EQ(cache.size(), 1u);
  ASSERT_EQ(f.copied.size(), 4u);
  EXPECT_TRUE(Same(f.copied[0], b));
  EXPECT_TRUE(Same(f.copied[1], c));
  EXPECT_TRUE(Same(f.copied[2], a));
  EXPECT_TRUE(Same(f.copied[3], a));
  // Another shape (one size differs) is not this graph's.
  auto d = a;
  d[3].bytes = 2048;
  EXPECT_FALSE(cache.Replay(0, kStream, d.data(), d.size(), false));
  // Nor is the same call on another device.
  EXPECT_FALSE(cache.Replay(1, kStream, a.data(), a.size(), false));
  EXPECT_EQ(cache.updated(), 2u);
}

// A model's layers share shapes: address sets that come back get graphs of
// their own (up to the cap), so the steady state is exact replays.
TEST(CopyGraphCacheTest, AddressSetsThatComeBackGetTheirOwnGraphs) {
  FakeGraphs f;
  f.with_update = true;
  CopyGraphCache cache(f.Ops(), {});  // Up to 4 per shape.
  std::vector<std::vector<CopyCmd>> layers = {Call(0, 3), Call(64 << 10, 3), Call(128 << 10, 3)};
  size_t replayed = 0;
  for (int round = 0; round < 5; ++round) {
    for (const auto& l : layers) {
      if (cache.Replay(0, kStream, l.data(), l.size(), false)) {
        ++replayed;
        EXPECT_TRUE(Same(f.copied.back(), l));
      }
    }
    if (round == 2) {
      EXPECT_EQ(cache.built(), 3u);
      EXPECT_EQ(cache.size(), 3u);
    }
  }
  EXPECT_EQ(replayed, 14u);  // All but the very first call.
  EXPECT_EQ(cache.built(), 3u);
  const uint64_t updated = cache.updated();
  for (const auto& l : layers) EXPECT_TRUE(cache.Replay(0, kStream, l.data(), l.size(), false));
  EXPECT_EQ(cache.updated(), updated);  // Rounds 4 and 5 and these: exact hits only.
  EXPECT_LE(updated, 2u);

  // A fourth and fifth layer: the cap is 4, so the fifth's set is served by
  // updating the least recently used graph.
  layers.push_back(Call(192 << 10, 3));
  layers.push_back(Call(256 << 10, 3));
  for (int round = 0; round < 3; ++round) {
    for (const auto& l : layers) {
      ASSERT_TRUE(cache.Replay(0, kStream, l.data(), l.size(), false));
      EXPECT_TRUE(Same(f.copied.back(), l));
    }
  }
  EXPECT_EQ(cache.size(), 4u);
}

TEST(CopyGraphCacheTest, AFailedUpdateDropsThatGraphAndTurnsUpdatesOff) {
  FakeGraphs f;
  f.with_update = true;
  CopyGraphCache cache(f.Ops(), {});
  auto a = Call(0, 2), b = Call(64 << 10, 2), c = Call(128 << 10, 2);
  cache.Replay(0, kStream, a.data(), a.size(), false);
  ASSERT_TRUE(cache.Replay(0, kStream, b.data(), b.size(), false));  // Built for b.
  f.fail_update = true;
  EXPECT_FALSE(cache.Replay(0, kStream, c.data(), c.size(), false));  // Update fails: c issued without.
  EXPECT_FALSE(cache.updates_on());
  EXPECT_TRUE(cache.enabled());
  EXPECT_EQ(f.destroyed, (std::vector<int>{1}));  // The half-updated graph is gone.
  EXPECT_EQ(cache.size(), 0u);
  // From now on exact addresses only: c's second sight builds its own.
  EXPECT_TRUE(cache.Replay(0, kStream, c.data(), c.size(), false));
  EXPECT_TRUE(Same(f.copied.back(), c));
  EXPECT_FALSE(cache.Replay(0, kStream, b.data(), b.size(), false));  // b: a first sight again.
  EXPECT_EQ(f.node_updates, 0u);
}

// After an update a graph's copies are its new addresses: a release of the
// old ones keeps it, a release of the new ones drops it.
TEST(CopyGraphCacheTest, AReleaseSeesAGraphsAddressesAfterAnUpdate) {
  FakeGraphs f;
  f.with_update = true;
  CopyGraphCache::Options o;
  o.max_per_shape = 1;
  CopyGraphCache cache(f.Ops(), o);
  auto a = Call(0, 2), b = Call(64 << 10, 2), c = Call(256 << 10, 2);
  cache.Replay(0, kStream, a.data(), a.size(), false);
  ASSERT_TRUE(cache.Replay(0, kStream, b.data(), b.size(), false));                 // Built for b.
  ASSERT_TRUE(cache.Replay(0, kStream, c.data(), c.size(), false));                 // Updated to c.
  cache.releases()->Add(reinterpret_cast<uint64_t>(arena) + (64 << 10), 32 << 10);  // b's range.
  EXPECT_TRUE(cache.Replay(0, kStream, c.data(), c.size(), false));
  EXPECT_EQ(cache.dropped(), 0u);
  cache.releases()->Add(reinterpret_cast<uint64_t>(arena) + (256 << 10), 1);  // c's first byte.
  EXPECT_FALSE(cache.Replay(0, kStream, c.data(), c.size(), false));
  EXPECT_EQ(cache.dropped(), 1u);
  EXPECT_EQ(f.destroyed, (std::vector<int>{1}));
}

// Without an update op (or max_per_shape = 0) a graph serves its exact
// addresses only: a known shape at new addresses is a first sight.
TEST(CopyGraphCacheTest, WithoutUpdatesNewAddressesAreANewCall) {
  for (bool with_update : {false, true}) {
    FakeGraphs f;
    f.with_update = with_update;
    CopyGraphCache::Options o;
    o.max_per_shape = with_update ? 0 : 4;
    CopyGraphCache cache(f.Ops(), o);
    EXPECT_FALSE(cache.updates_on());
    auto a = Call(0, 2), b = Call(64 << 10, 2);
    for (int i = 0; i < 2; ++i) cache.Replay(0, kStream, a.data(), a.size(), false);
    EXPECT_FALSE(cache.Replay(0, kStream, b.data(), b.size(), false));
    EXPECT_TRUE(cache.Replay(0, kStream, b.data(), b.size(), false));
    EXPECT_EQ(cache.built(), 2u);
    EXPECT_EQ(cache.updated(), 0u);
  }
}

// A graph's launches run one after another: a graph that follows new
// addresses serves one stream, so calls of one shape on two streams (an op
// fanned out) keep overlapping.
TEST(CopyGraphCacheTest, AGraphFollowsNewAddressesOnItsOwnStreamOnly) {
  FakeGraphs f;
  f.with_update = true;
  CopyGraphCache cache(f.Ops(), {});
  void* const other = reinterpret_cast<void*>(0x52);
  auto a = Call(0, 2), b = Call(64 << 10, 2), c = Call(128 << 10, 2);
  cache.Replay(0, kStream, a.data(), a.size(), false);
  ASSERT_TRUE(cache.Replay(0, kStream, b.data(), b.size(), false));  // Graph 1, on kStream.
  EXPECT_FALSE(cache.Replay(0, other, c.data(), c.size(), false));   // The shape's first sight on `other`.
  EXPECT_EQ(cache.updated(), 0u);
  auto d = Call(192 << 10, 2), e = Call(256 << 10, 2), g = Call(320 << 10, 2);
  ASSERT_TRUE(cache.Replay(0, other, d.data(), d.size(), false));  // Its second: graph 2.
  EXPECT_EQ(cache.last_served(), CopyGraphCache::Served::kBuilt);
  ASSERT_TRUE(cache.Replay(0, other, e.data(), e.size(), false));  // `other`'s graph follows e.
  EXPECT_EQ(cache.last_served(), CopyGraphCache::Served::kUpdated);
  EXPECT_EQ(f.launches.back(), std::make_pair(2, other));
  ASSERT_TRUE(cache.Replay(0, kStream, g.data(), g.size(), false));  // kStream's graph follows g.
  EXPECT_EQ(cache.last_served(), CopyGraphCache::Served::kUpdated);
  EXPECT_EQ(f.launches.back(), std::make_pair(1, kStream));
  EXPECT_TRUE(Same(f.copied.back(), g));
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::cuda
