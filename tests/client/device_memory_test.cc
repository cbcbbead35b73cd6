// DeviceMemory (client/device_memory.h) over a fake runtime: which buffers
// are refused and how, what an export carries, and that dmagather_alloc's
// buffers are freed (also when their description fails).
#include "client/device_memory.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "gtest/gtest.h"

namespace dmagather::client {
namespace {

// Allocations are ranges of a host array (nothing is dereferenced).
class FakeMemory final : public DeviceMemoryApi {
 public:
  struct Allocation {
    uint64_t bytes;
    int device;
    uint64_t id;
    bool ipc;
  };
  const char* backend() const override { return "fake"; }
  const char* label() const override { return "FAKE"; }
  const char* malloc_name() const override { return "fakeMalloc"; }
  const char* ipc_memory_kind() const override { return "fake_ipc"; }

  bool IsDeviceMemory(const void* p) const override { return Find(p) != allocs.end(); }
  absl::StatusOr<int> DeviceOrdinal(const void* p) const override { return Find(p)->second.device; }
  absl::StatusOr<uint64_t> BufferIdOf(const void* p) const override { return Find(p)->second.id; }
  absl::Status AddressRange(const void* p, uintptr_t* base, uint64_t* bytes) const override {
    auto it = Find(p);
    *base = it->first;
    *bytes = it->second.bytes;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> IpcHandle(uintptr_t base) const override {
    if (!allocs.at(base).ipc) return absl::InternalError("fakeIpcGetMemHandle: not shareable");
    return "handle@" + std::to_string(base - uintptr_t(arena));
  }
  absl::Status SetDevice(int device) const override {
    current = device;
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Malloc(uint64_t bytes) const override {
    void* p = arena + used;
    allocs[uintptr_t(p)] = Allocation{bytes, current, 100 + used, true};
    used += bytes;
    return p;
  }
  void Free(void* p) const override { freed.push_back(uintptr_t(p)); }

  std::map<uintptr_t, Allocation>::const_iterator Find(const void* p) const {
    const uintptr_t a = uintptr_t(p);
    auto it = allocs.upper_bound(a);
    if (it == allocs.begin()) return allocs.end();
    --it;
    return a < it->first + it->second.bytes ? it : allocs.end();
  }

  mutable char arena[1 << 16];
  mutable uint64_t used = 0;
  mutable int current = -1;
  mutable std::map<uintptr_t, Allocation> allocs;
  mutable std::vector<uintptr_t> freed;
};

TEST(DeviceMemoryTest, HostMemoryIsAFallbackNamingTheBackend) {
  FakeMemory m;
  char host[16];
  absl::Status st = CheckDeviceBuffer(m, host, 0);
  EXPECT_TRUE(common::IsFallback(st)) << st;
  EXPECT_NE(st.message().find("is not FAKE device memory (the fake backend moves device buffers"), std::string::npos)
      << st;
}

TEST(DeviceMemoryTest, AnotherDevicesBufferIsInvalid) {
  FakeMemory m;
  m.current = 1;
  void* p = *m.Malloc(4096);
  absl::Status st = CheckDeviceBuffer(m, p, 0);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("is on FAKE device 1, but the rank uses device 0"), std::string::npos) << st;
  EXPECT_TRUE(CheckDeviceBuffer(m, p, 1).ok());
}

TEST(DeviceMemoryTest, ASubBufferExportsItsAllocationBase) {
  FakeMemory m;
  m.current = 0;
  (void)*m.Malloc(1024);  // Something before it in the arena.
  char* base = static_cast<char*>(*m.Malloc(8192));
  auto e = ExportIpcBuffer(m, base + 1000, 4096);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->base, uintptr_t(base));
  EXPECT_EQ(e->bytes, 8192u);
  EXPECT_EQ(e->buffer_id, 100u + 1024u);
  EXPECT_EQ(e->memory_kind, "fake_ipc");
  EXPECT_EQ(e->handle, "handle@1024");
  // Exactly to the end is fine; one byte more is not.
  EXPECT_TRUE(ExportIpcBuffer(m, base + 4096, 4096).ok());
  auto past = ExportIpcBuffer(m, base + 4096, 4097);
  EXPECT_EQ(past.status().code(), absl::StatusCode::kInvalidArgument) << past.status();
  EXPECT_NE(past.status().message().find("runs past the end of its FAKE allocation (8192 bytes"), std::string::npos)
      << past.status();
}

TEST(DeviceMemoryTest, AnAllocationWithoutIpcHandleIsAFallbackWithTheRuntimesError) {
  FakeMemory m;
  m.current = 0;
  void* p = *m.Malloc(4096);
  m.allocs[uintptr_t(p)].ipc = false;
  auto e = ExportIpcBuffer(m, p, 4096);
  EXPECT_TRUE(common::IsFallback(e.status())) << e.status();
  EXPECT_NE(e.status().message().find("fakeIpcGetMemHandle: not shareable: this allocation cannot be shared with "
                                      "dmagatherd through FAKE IPC (memory from fakeMalloc can"),
            std::string::npos)
      << e.status();
}

TEST(DeviceMemoryTest, AllocatedBuffersAreFreedAlsoWhenTheirDescriptionFails) {
  auto m = std::make_shared<FakeMemory>();
  auto describe = [&](const void* p, uint64_t n) { return ExportIpcBuffer(*m, p, n); };
  {
    auto buf = AllocateDeviceBuffer(m, 3, 4096, describe);
    ASSERT_TRUE(buf.ok()) << buf.status();
    EXPECT_EQ(m->current, 3);  // Allocated on the rank's device.
    EXPECT_EQ((*buf)->export_info().base, uintptr_t((*buf)->data()));
    EXPECT_EQ((*buf)->export_info().bytes, 4096u);
    EXPECT_TRUE(m->freed.empty());
  }
  ASSERT_EQ(m->freed.size(), 1u);
  EXPECT_EQ(m->freed[0], uintptr_t(m->arena));
  auto refused = AllocateDeviceBuffer(
      m, 3, 4096, [](const void*, uint64_t) -> absl::StatusOr<MemoryExport> { return absl::InternalError("no"); });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInternal);
  ASSERT_EQ(m->freed.size(), 2u);
  EXPECT_EQ(m->freed[1], uintptr_t(m->arena) + 4096);
}

}  // namespace
}  // namespace dmagather::client
