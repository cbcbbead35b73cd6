// DeviceMemory: the part of the GPU client backends (cuda_backend.cc,
// hip_backend.cc) that does not depend on the vendor - the checks on a
// caller's device buffer, its export through the vendor's IPC handle of the
// allocation base, and the buffers dmagather_alloc hands out - written once
// over DeviceMemoryApi, the few pointer and allocation calls each vendor's
// runtime answers. The rules and the messages are the same for every GPU;
// each backend supplies its calls (and, for what only it has, such as CUDA
// VMM, its own path).
//
// Threads: the rank's submitting thread (CommImpl's caller); a buffer is
// freed on whatever thread drops it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/backend.h"

namespace dmagather::client {

class DeviceMemoryApi {
 public:
  virtual ~DeviceMemoryApi() = default;
  // Names in messages and the registration: "cuda", "CUDA", "cudaMalloc",
  // and the memory kind of its IPC handles (common/memory_kinds.h).
  virtual const char* backend() const = 0;
  virtual const char* label() const = 0;
  virtual const char* malloc_name() const = 0;
  virtual const char* ipc_memory_kind() const = 0;

  // Whether `p` is device memory of this runtime (not host, not managed).
  virtual bool IsDeviceMemory(const void* p) const = 0;
  virtual absl::StatusOr<int> DeviceOrdinal(const void* p) const = 0;
  // The buffer id the registration cache keys on.
  virtual absl::StatusOr<uint64_t> BufferIdOf(const void* p) const = 0;
  // The allocation containing `p`.
  virtual absl::Status AddressRange(const void* p, uintptr_t* base, uint64_t* bytes) const = 0;
  // The IPC handle of the allocation at `base` (the runtime's error as is).
  virtual absl::StatusOr<std::string> IpcHandle(uintptr_t base) const = 0;

  virtual absl::Status SetDevice(int device) const = 0;
  virtual absl::StatusOr<void*> Malloc(uint64_t bytes) const = 0;
  virtual void Free(void* p) const = 0;
};

// FALLBACK when `ptr` is not device memory of this runtime; INVALID_ARGUMENT
// when it is on another device than the rank's.
absl::Status CheckDeviceBuffer(const DeviceMemoryApi& m, const void* ptr, int device);

// [ptr, ptr+bytes) exported as the IPC handle of its allocation's base:
// INVALID_ARGUMENT when it runs past the allocation's end, FALLBACK when
// the allocation has no IPC handle (pools, VMM).
absl::StatusOr<MemoryExport> ExportIpcBuffer(const DeviceMemoryApi& m, const void* ptr, uint64_t bytes);

// dmagather_alloc: `bytes` of device memory on `device`, described by the
// backend's `describe` (freed again when that fails).
absl::StatusOr<std::unique_ptr<OwnedBuffer>> AllocateDeviceBuffer(
    std::shared_ptr<const DeviceMemoryApi> m, int device, uint64_t bytes,
    const std::function<absl::StatusOr<MemoryExport>(const void*, uint64_t)>& describe);

}  // namespace dmagather::client
