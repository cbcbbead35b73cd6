// The daemon's VMM import over a fake driver table (no GPU): the chunk
// table is checked against the handed-over descriptors; every chunk is
// imported and mapped at its offset of one reserved range, access is
// granted to the owner's device and, one grant each, to the devices the peer
// table says reach it (a refused grant fails the import as a FALLBACK and
// undoes it), imports are cached by (process, device, table)
// - a remapped chunk (new generation) is a new import -, and the last
// reference unmaps every chunk and frees the range. A failed map undoes
// what was done.
#include "server/engines/gpu/cuda/vmm_import.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "common/status.h"

namespace dmagather::server::engines::gpu::cuda {
namespace {

struct FakeDriver {
  std::map<CUdeviceptr, size_t> reserved;
  std::vector<std::pair<CUdeviceptr, size_t>> mapped;  // (address, bytes)
  std::vector<int> imported_fds;
  std::vector<int> access_devices;  // Every grant, in order.
  int released = 0;
  int fail_map_at = -1;
  int refuse_access_for = -1;  // A device whose grant the driver refuses.
  CUdeviceptr next = 0x100000000;
};
FakeDriver* fake = nullptr;

CUresult Gran(size_t* g, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) {
  *g = 2 << 20;
  return CUDA_SUCCESS;
}
CUresult Reserve(CUdeviceptr* p, size_t n, size_t, CUdeviceptr, unsigned long long) {
  *p = fake->next;
  fake->next += n + (64 << 20);
  fake->reserved[*p] = n;
  return CUDA_SUCCESS;
}
CUresult Free(CUdeviceptr p, size_t) {
  fake->reserved.erase(p);
  return CUDA_SUCCESS;
}
CUresult Import(CUmemGenericAllocationHandle* h, void* fd, CUmemAllocationHandleType) {
  fake->imported_fds.push_back(int(reinterpret_cast<intptr_t>(fd)));
  *h = 1000 + fake->imported_fds.size();
  return CUDA_SUCCESS;
}
CUresult Map(CUdeviceptr p, size_t n, size_t, CUmemGenericAllocationHandle, unsigned long long) {
  if (fake->fail_map_at >= 0 && int(fake->mapped.size()) == fake->fail_map_at) return CUDA_ERROR_INVALID_VALUE;
  fake->mapped.emplace_back(p, n);
  return CUDA_SUCCESS;
}
CUresult Unmap(CUdeviceptr p, size_t n) {
  for (auto it = fake->mapped.begin(); it != fake->mapped.end(); ++it) {
    if (it->first == p && it->second == n) {
      fake->mapped.erase(it);
      return CUDA_SUCCESS;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}
CUresult Release(CUmemGenericAllocationHandle) {
  ++fake->released;
  return CUDA_SUCCESS;
}
CUresult Access(CUdeviceptr, size_t, const CUmemAccessDesc* d, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (d[i].location.id == fake->refuse_access_for) return CUDA_ERROR_INVALID_DEVICE;
  }
  for (size_t i = 0; i < n; ++i) fake->access_devices.push_back(d[i].location.id);
  return CUDA_SUCCESS;
}

common::cuda::DriverApi FakeApi() {
  common::cuda::DriverApi a;
  a.cuMemGetAllocationGranularity = Gran;
  a.cuMemAddressReserve = Reserve;
  a.cuMemAddressFree = Free;
  a.cuMemImportFromShareableHandle = Import;
  a.cuMemMap = Map;
  a.cuMemUnmap = Unmap;
  a.cuMemRelease = Release;
  a.cuMemSetAccess = Access;
  return a;
}

constexpr uint64_t kChunk = 2 << 20;

std::vector<abi::VmmChunkV1> Chunks(int n, uint64_t gen0) {
  std::vector<abi::VmmChunkV1> c;
  for (int i = 0; i < n; ++i) c.push_back(abi::VmmChunkV1{i * kChunk, kChunk, gen0 + i});
  return c;
}

RegionSpec Spec(int n, uint64_t gen0, std::vector<int> fds, int device = 0) {
  RegionSpec s;
  s.kind = kMemoryCudaVmm;
  s.bytes = n * kChunk;
  s.fds = std::move(fds);
  s.owner_pid = 42;
  s.handle = EncodeVmmTable(device, Chunks(n, gen0));
  return s;
}

TEST(VmmImportTest, ParseRejectsBadTables) {
  EXPECT_TRUE(ParseVmmTable(EncodeVmmTable(0, Chunks(3, 1)), 3 * kChunk, 3).ok());
  EXPECT_FALSE(ParseVmmTable("", 3 * kChunk, 3).ok());
  EXPECT_FALSE(ParseVmmTable(EncodeVmmTable(0, Chunks(3, 1)), 3 * kChunk, 2).ok());  // fds != chunks
  EXPECT_FALSE(ParseVmmTable(EncodeVmmTable(0, Chunks(3, 1)), 4 * kChunk, 3).ok());  // bytes != sum
  auto gap = Chunks(3, 1);
  gap[2].offset += kChunk;
  EXPECT_FALSE(ParseVmmTable(EncodeVmmTable(0, gap), 4 * kChunk, 3).ok());  // not back to back
  std::string t = EncodeVmmTable(0, Chunks(2, 1));
  t[0] ^= 1;  // stamp
  EXPECT_FALSE(ParseVmmTable(t, 2 * kChunk, 2).ok());
}

TEST(VmmImportTest, MapsEveryChunkIntoOneRangeCachesAndReleases) {
  FakeDriver f;
  fake = &f;
  const common::cuda::DriverApi api = FakeApi();
  int released_regions = 0;
  // The release callback runs once per region with its range, before the
  // range is unmapped and freed (so nothing can reuse it meanwhile).
  VmmImporter imp(&api, [&](uint64_t base, uint64_t bytes) {
    ++released_regions;
    EXPECT_EQ(f.reserved.count(base), 1u);
    EXPECT_EQ(bytes, 3 * kChunk);
  });
  PeerTable peers(2);
  peers.Set(1, 0, true);  // Device 1 reaches device 0: it gets access too.
  imp.SetPeers(peers);
  auto r = imp.Import(Spec(3, 7, {10, 11, 12}), 0, 0);
  ASSERT_TRUE(r.ok()) << r.status();
  const CUdeviceptr va = reinterpret_cast<CUdeviceptr>((*r)->base());
  EXPECT_EQ((*r)->bytes(), 3 * kChunk);
  ASSERT_EQ(f.mapped.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f.mapped[i], std::make_pair(va + i * kChunk, size_t(kChunk)));
  EXPECT_EQ(f.imported_fds, (std::vector<int>{10, 11, 12}));
  EXPECT_EQ(f.released, 3);  // Handles released once mapped (the mappings hold the memory).
  EXPECT_EQ(f.access_devices, (std::vector<int>{0, 1}));
  // Same process, device and chunks: the same import.
  auto again = imp.Import(Spec(3, 7, {20, 21, 22}), 0, 0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), r->get());
  EXPECT_EQ(f.mapped.size(), 3u);
  // Chunk 1 remapped by the client (new generation): a new import.
  auto spec = Spec(3, 7, {30, 31, 32});
  auto chunks = Chunks(3, 7);
  chunks[1].generation = 99;
  spec.handle = EncodeVmmTable(0, chunks);
  auto remapped = imp.Import(spec, 0, 0);
  ASSERT_TRUE(remapped.ok());
  EXPECT_NE(remapped->get(), r->get());
  EXPECT_EQ(f.mapped.size(), 6u);
  EXPECT_EQ(imp.live_imports(), 2u);
  // Wrong device for the rank.
  EXPECT_FALSE(imp.Import(Spec(3, 7, {1, 2, 3}), 1, 1).ok());
  // Last references go: every chunk unmapped, both ranges freed.
  r->reset();
  EXPECT_EQ(released_regions, 0);  // `again` still holds the first region.
  again->reset();
  EXPECT_EQ(released_regions, 1);
  remapped->reset();
  EXPECT_EQ(released_regions, 2);
  EXPECT_TRUE(f.mapped.empty());
  EXPECT_TRUE(f.reserved.empty());
  EXPECT_EQ(imp.live_imports(), 0u);
}

TEST(VmmImportTest, FailedMapUndoes) {
  FakeDriver f;
  f.fail_map_at = 2;
  fake = &f;
  const common::cuda::DriverApi api = FakeApi();
  VmmImporter imp(&api);
  auto r = imp.Import(Spec(4, 1, {1, 2, 3, 4}), 0, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("chunk 2"), std::string::npos) << r.status();
  EXPECT_TRUE(f.mapped.empty());
  EXPECT_TRUE(f.reserved.empty());
}

// Four devices; 0 and 1 reach each other, 2 reaches 1 but not the reverse,
// 3 reaches no one. A region on device 1 is granted to 1 itself, then to 0
// and 2 (which reach it), never to 3.
TEST(VmmImportTest, AccessIsGrantedPerDeviceByThePeerTable) {
  FakeDriver f;
  fake = &f;
  const common::cuda::DriverApi api = FakeApi();
  VmmImporter imp(&api);
  PeerTable peers(4);
  peers.Set(0, 1, true);
  peers.Set(1, 0, true);
  peers.Set(2, 1, true);
  imp.SetPeers(peers);
  auto r = imp.Import(Spec(2, 1, {1, 2}, /*device=*/1), 1, 1);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(f.access_devices, (std::vector<int>{1, 0, 2}));
  // The rank numbers its device 0 (one visible GPU) while the daemon's is 3:
  // the table is checked against the rank's number, the mapping lives on 3.
  f.access_devices.clear();
  auto mapped = imp.Import(Spec(1, 9, {5}, /*device=*/0), 3, 0);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(f.access_devices, (std::vector<int>{3}));
  auto wrong = imp.Import(Spec(1, 9, {5}, /*device=*/0), 3, 3);
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument) << wrong.status();
}

// A grant the driver refuses fails the import (a FALLBACK naming the
// device) and undoes everything: no device may be left unable to read
// memory a copy could be routed to read from it.
TEST(VmmImportTest, ARefusedGrantFailsTheImportAndUndoes) {
  FakeDriver f;
  f.refuse_access_for = 2;
  fake = &f;
  const common::cuda::DriverApi api = FakeApi();
  VmmImporter imp(&api);
  PeerTable peers(3);
  for (int a = 0; a < 3; ++a) {
    for (int b = 0; b < 3; ++b) peers.Set(a, b, true);
  }
  imp.SetPeers(peers);
  auto r = imp.Import(Spec(2, 1, {1, 2}), 0, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(common::IsFallback(r.status())) << r.status();
  EXPECT_NE(r.status().message().find("granting device 2"), std::string::npos) << r.status();
  EXPECT_TRUE(f.mapped.empty());
  EXPECT_TRUE(f.reserved.empty());
  EXPECT_EQ(imp.live_imports(), 0u);
}

}  // namespace
}  // namespace dmagather::server::engines::gpu::cuda
