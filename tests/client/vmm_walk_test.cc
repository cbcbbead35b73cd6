// The client's VMM chunk walk and its invalidation rule over a fake mapping
// table: tensors spanning several chunks, a gap in the mappings, memory
// that cannot be shared (FALLBACK, never INVALID_ARGUMENT), and a remap
// under a registered range detected by the chunk identities.
#include "client/vmm_walk.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <map>

#include "common/status.h"

namespace dmagather::client {
namespace {

constexpr uint64_t kChunk = 2 << 20;
constexpr uintptr_t kBase = 0x7f0000000000;

class FakeVmm : public VmmDriver {
 public:
  struct M {
    uint64_t size, id;
    bool shareable;
  };
  void Map(int i, uint64_t id, bool shareable = true) { maps[kBase + i * kChunk] = M{kChunk, id, shareable}; }
  void Unmap(int i) { maps.erase(kBase + i * kChunk); }
  absl::Status Mapping(uintptr_t addr, uintptr_t* base, uint64_t* size, uint64_t* id) const override {
    ++lookups;
    auto it = maps.upper_bound(addr);
    if (it == maps.begin()) return absl::NotFoundError("unmapped");
    --it;
    if (addr >= it->first + it->second.size) return absl::NotFoundError("unmapped");
    *base = it->first;
    *size = it->second.size;
    *id = it->second.id;
    return absl::OkStatus();
  }
  absl::StatusOr<int> Export(uintptr_t base) const override {
    if (!maps.at(base).shareable) return common::FallbackError("no shareable handle type");
    return dup(0);
  }
  std::map<uintptr_t, M> maps;
  mutable int lookups = 0;
};

TEST(VmmWalkTest, TensorSpanningChunks) {
  FakeVmm f;
  for (int i = 0; i < 6; ++i) f.Map(i, 100 + i);
  const uintptr_t ptr = kBase + kChunk + 12345;  // Inside chunk 1 ...
  const uint64_t bytes = 2 * kChunk + 100;       // ... to inside chunk 3.
  auto w = WalkVmm(f, ptr, bytes, /*export_fds=*/true);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->base, kBase + kChunk);
  EXPECT_EQ(w->bytes, 3 * kChunk);
  ASSERT_EQ(w->chunks.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(w->chunks[i].offset, i * kChunk);
    EXPECT_EQ(w->chunks[i].bytes, kChunk);
    EXPECT_EQ(w->chunks[i].id, uint64_t(101 + i));
  }
  ASSERT_EQ(w->fds.size(), 3u);
  for (const auto& fd : w->fds) EXPECT_TRUE(fd.valid());
  // Exactly at a chunk end: one chunk.
  auto one = WalkVmm(f, kBase, kChunk, false);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->chunks.size(), 1u);
  EXPECT_TRUE(one->fds.empty());
}

TEST(VmmWalkTest, GapIsInvalidArgumentUnshareableIsFallback) {
  FakeVmm f;
  f.Map(0, 1);
  f.Map(2, 3);  // Chunk 1 not mapped.
  auto gap = WalkVmm(f, kBase + 10, kChunk + 10, false);
  ASSERT_FALSE(gap.ok());
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(gap.status().message().find("runs past the end"), std::string::npos);
  f.Map(1, 2, /*shareable=*/false);
  auto unshareable = WalkVmm(f, kBase + 10, kChunk + 10, true);
  ASSERT_FALSE(unshareable.ok());
  EXPECT_TRUE(common::IsFallback(unshareable.status())) << unshareable.status();
}

TEST(VmmWalkTest, RemapUnderTheRangeIsDetectedAndOnlyTouchedChunksAreChecked) {
  FakeVmm f;
  for (int i = 0; i < 8; ++i) f.Map(i, 10 + i);
  auto w = WalkVmm(f, kBase, 8 * kChunk, false);
  ASSERT_TRUE(w.ok());
  const uintptr_t t = kBase + 2 * kChunk + 5;  // A tensor over chunks 2..3.
  f.lookups = 0;
  EXPECT_TRUE(VmmCurrent(f, w->base, w->chunks, t, kChunk));
  EXPECT_EQ(f.lookups, 2);  // One lookup per chunk touched.
  // The allocator unmaps chunk 6 and maps a new allocation there: tensors
  // over chunks 2..3 are still current, one over chunk 6 is not.
  f.Unmap(6);
  f.Map(6, 99);
  EXPECT_TRUE(VmmCurrent(f, w->base, w->chunks, t, kChunk));
  EXPECT_FALSE(VmmCurrent(f, w->base, w->chunks, kBase + 6 * kChunk + 1, 100));
  // Unmapped altogether.
  f.Unmap(3);
  EXPECT_FALSE(VmmCurrent(f, w->base, w->chunks, t, kChunk));
}

}  // namespace
}  // namespace dmagather::client
