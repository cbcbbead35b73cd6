// RegistrationCache: pointers resolve inside one registration; a hit is
// the very same allocation; freed-and-reused or remapped memory is no
// longer current; a new registration takes out the ones it makes stale.
#include "client/registration_cache.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>

namespace dmagather::client {
namespace {

// Only the memory-identity calls matter to the cache.
class IdentityBackend : public ClientBackend {
 public:
  const char* name() const override { return "identity"; }
  absl::StatusOr<std::unique_ptr<OwnedBuffer>> Allocate(uint64_t) override {
    return absl::UnimplementedError("not in this test");
  }
  absl::StatusOr<MemoryExport> Describe(const void*, uint64_t) const override {
    return absl::UnimplementedError("not in this test");
  }
  // The id of the allocation holding `ptr`: ids_ by base (the largest base
  // not above ptr).
  uint64_t BufferId(const void* ptr) const override {
    auto it = ids.upper_bound(reinterpret_cast<uintptr_t>(ptr));
    return it == ids.begin() ? 0 : (--it)->second;
  }
  bool ChunksCurrent(uintptr_t base, const std::vector<VmmChunk>&, const void*, uint64_t) const override {
    return remapped.count(base) == 0;
  }
  bool registers_on_submit() const override { return true; }
  absl::Status CheckStream(void*) const override { return absl::OkStatus(); }
  bool copies_own_shard() const override { return false; }
  absl::Status CopyOwnShards(const OwnShardCopy*, size_t, void*, bool) override { return absl::OkStatus(); }
  absl::Status WriteReady(void*, uint32_t) override { return absl::OkStatus(); }
  bool has_stream_waits() const override { return false; }
  absl::Status WaitDoneOnStream(void*, uint32_t) override { return absl::OkStatus(); }

  std::map<uintptr_t, uint64_t> ids;
  std::set<uintptr_t> remapped;  // VMM bases whose chunks are no longer the registered mappings.
};

class CountedBuffer : public OwnedBuffer {
 public:
  explicit CountedBuffer(int* alive) : alive_(alive) { ++*alive_; }
  ~CountedBuffer() override { --*alive_; }
  void* data() const override { return nullptr; }
  const MemoryExport& export_info() const override { return e_; }

 private:
  int* const alive_;
  MemoryExport e_;
};

MemoryExport Export(uintptr_t base, uint64_t bytes, uint64_t buffer_id) {
  MemoryExport e;
  e.base = base;
  e.bytes = bytes;
  e.buffer_id = buffer_id;
  e.memory_kind = "host_memfd";
  return e;
}

const void* P(uintptr_t a) { return reinterpret_cast<const void*>(a); }

TEST(RegistrationCacheTest, PointersResolveInsideOneRegistration) {
  RegistrationCache cache(/*rank=*/3);
  auto miss = cache.Lookup(P(0x10000), 16, "send");
  EXPECT_EQ(miss.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(miss.status().message().find("rank 3: send buffer"), std::string::npos) << miss.status();
  EXPECT_NE(miss.status().message().find("not inside memory"), std::string::npos) << miss.status();

  cache.Insert(Export(0x10000, 0x1000, 1), /*region_id=*/42, nullptr);
  auto hit = cache.Lookup(P(0x10100), 0x100, "recv");
  ASSERT_TRUE(hit.ok()) << hit.status();
  EXPECT_EQ(hit->region_id, 42u);
  EXPECT_EQ(hit->offset, 0x100u);
  auto whole = cache.Lookup(P(0x10000), 0x1000, "recv");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->offset, 0u);
  auto past = cache.Lookup(P(0x10f00), 0x200, "recv");
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(past.status().message().find("runs past the end"), std::string::npos) << past.status();
  EXPECT_FALSE(cache.Lookup(P(0x11000), 1, "recv").ok()) << "one past the end is outside";
  EXPECT_FALSE(cache.Lookup(P(0xffff), 1, "recv").ok()) << "just before the start";
}

TEST(RegistrationCacheTest, AHitIsTheVerySameAllocation) {
  RegistrationCache cache(0);
  MemoryExport e = Export(0x20000, 0x1000, 7);
  EXPECT_FALSE(cache.Hit(e));
  cache.Insert(e, 1, nullptr);
  EXPECT_TRUE(cache.Hit(e));
  EXPECT_FALSE(cache.Hit(Export(0x20000, 0x1000, 8))) << "the range was freed and reused";
  EXPECT_FALSE(cache.Hit(Export(0x20000, 0x2000, 7))) << "a different size";
  EXPECT_FALSE(cache.Hit(Export(0x20100, 0x100, 7))) << "inside it, but not it";

  MemoryExport v = Export(0x40000, 0x2000, 0);
  v.chunks = {VmmChunk{0, 0x1000, 11}, VmmChunk{0x1000, 0x1000, 12}};
  cache.Insert(v, 2, nullptr);
  EXPECT_TRUE(cache.Hit(v));
  MemoryExport remapped = v;
  remapped.chunks[1].id = 13;
  EXPECT_FALSE(cache.Hit(remapped)) << "a chunk was remapped";
}

TEST(RegistrationCacheTest, FreedAndReusedMemoryIsNoLongerCurrent) {
  IdentityBackend backend;
  backend.ids[0x30000] = 5;
  RegistrationCache cache(0);
  cache.Insert(Export(0x30000, 0x1000, 5), 1, nullptr);
  EXPECT_TRUE(cache.Current(P(0x30010), 16, backend));
  EXPECT_TRUE(cache.Held(P(0x30010), 16, backend));
  backend.ids[0x30000] = 6;  // Freed, and the range handed out again.
  EXPECT_FALSE(cache.Current(P(0x30010), 16, backend));
  EXPECT_FALSE(cache.Held(P(0x30010), 16, backend));
  EXPECT_FALSE(cache.Current(P(0x50000), 16, backend)) << "not registered at all";

  int alive = 0;
  backend.ids[0x60000] = 9;
  cache.Insert(Export(0x60000, 0x1000, 9), 2, std::make_unique<CountedBuffer>(&alive));
  backend.ids[0x60000] = 10;
  EXPECT_FALSE(cache.Current(P(0x60000), 16, backend));
  EXPECT_TRUE(cache.Held(P(0x60000), 16, backend)) << "dmagather_alloc memory lives until Free";
}

TEST(RegistrationCacheTest, ANewRegistrationTakesOutWhatItOverlaps) {
  IdentityBackend backend;
  RegistrationCache cache(0);
  cache.Insert(Export(0x10000, 0x1000, 1), 1, nullptr);
  cache.Insert(Export(0x11000, 0x1000, 2), 2, nullptr);
  cache.Insert(Export(0x20000, 0x1000, 3), 3, nullptr);
  MemoryExport reused = Export(0x10800, 0x1000, 4);  // Over the first two.
  EXPECT_FALSE(cache.AnyStale(Export(0x30000, 0x1000, 5), backend)) << "no overlap";
  ASSERT_TRUE(cache.AnyStale(reused, backend));
  std::vector<std::pair<uintptr_t, RegistrationCache::Region>> gone = cache.TakeStale(reused, backend);
  ASSERT_EQ(gone.size(), 2u);
  EXPECT_EQ(gone[0].first, 0x10000u);
  EXPECT_EQ(gone[0].second.id, 1u);
  EXPECT_EQ(gone[1].first, 0x11000u);
  EXPECT_EQ(gone[1].second.id, 2u);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_NE(cache.Find(P(0x20000)), nullptr);
  EXPECT_FALSE(cache.AnyStale(reused, backend));
}

TEST(RegistrationCacheTest, VmmRegistrationsSharingTheSameMappingsStay) {
  IdentityBackend backend;
  RegistrationCache cache(0);
  MemoryExport a = Export(0x100000, 0x2000, 0);
  a.chunks = {VmmChunk{0, 0x1000, 1}, VmmChunk{0x1000, 0x1000, 2}};
  cache.Insert(a, 1, nullptr);
  MemoryExport b = Export(0x101000, 0x2000, 0);  // Shares chunk 2, same mapping.
  b.chunks = {VmmChunk{0, 0x1000, 2}, VmmChunk{0x1000, 0x1000, 3}};
  EXPECT_FALSE(cache.AnyStale(b, backend));
  MemoryExport c = b;
  c.chunks[0].id = 99;  // The shared chunk is another mapping now.
  EXPECT_TRUE(cache.AnyStale(c, backend));

  // Remapped since (not overlapping the new one): stale too, unless owned.
  backend.remapped.insert(0x100000);
  MemoryExport far = Export(0x900000, 0x1000, 1);
  EXPECT_TRUE(cache.AnyStale(far, backend));
  int alive = 0;
  RegistrationCache owned_cache(0);
  owned_cache.Insert(a, 1, std::make_unique<CountedBuffer>(&alive));
  EXPECT_FALSE(owned_cache.AnyStale(far, backend));
}

TEST(RegistrationCacheTest, EraseAndClearFreeWhatTheLibraryAllocated) {
  int alive = 0;
  RegistrationCache cache(0);
  cache.Insert(Export(0x10000, 0x1000, 1), 1, std::make_unique<CountedBuffer>(&alive));
  cache.Insert(Export(0x20000, 0x1000, 2), 2, std::make_unique<CountedBuffer>(&alive));
  cache.Insert(Export(0x30000, 0x1000, 3), 3, nullptr);
  EXPECT_EQ(alive, 2);
  ASSERT_NE(cache.Find(P(0x10000)), nullptr);
  EXPECT_NE(cache.Find(P(0x10000))->owned, nullptr);
  EXPECT_EQ(cache.Find(P(0x10010)), nullptr) << "Find is by base";
  cache.Erase(P(0x10000));
  EXPECT_EQ(alive, 1);
  EXPECT_EQ(cache.Find(P(0x10000)), nullptr);
  cache.Clear();
  EXPECT_EQ(alive, 0);
  EXPECT_EQ(cache.size(), 0u);
}

}  // namespace
}  // namespace dmagather::client
