// The client's view of VMM memory (cuMemCreate allocations mapped into a
// reserved range, e.g. PyTorch's expandable segments): a tensor may span
// several physical allocations ("chunks") mapped back to back. WalkVmm
// finds the chunks that cover [ptr, ptr+bytes) one mapping at a time and,
// for a registration, exports each as a file descriptor; VmmCurrent tells at
// submit whether the chunks under a range are still the ones registered
// (an allocator that unmapped and remapped the range - empty_cache, a
// segment shrinking and growing - leaves the same addresses backed by new
// allocations with new identities).
//
// Pure logic over a VmmDriver, so the walk and the invalidation rules are
// tested on CPU-only machines with a fake mapping table
// (tests/client/vmm_walk_test); the cuda backend implements VmmDriver with
// the driver's entry points.
//
// Threads: the rank's submitting thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/memfd.h"

namespace dmagather::client {

class VmmDriver {
 public:
  virtual ~VmmDriver() = default;
  // The mapping containing `addr`: its base, size and identity (unique per
  // mapping: a remap gives a new one). NOT_FOUND when nothing is mapped there.
  virtual absl::Status Mapping(uintptr_t addr, uintptr_t* base, uint64_t* size, uint64_t* id) const = 0;
  // The allocation mapped at `base` as a POSIX file descriptor; FALLBACK
  // (with the reason) when it cannot be shared with another process.
  virtual absl::StatusOr<int> Export(uintptr_t base) const = 0;
};

struct VmmChunk {
  uint64_t offset = 0;  // From the region's base.
  uint64_t bytes = 0;
  uint64_t id = 0;  // Mapping identity when walked.
};

struct VmmWalk {
  uintptr_t base = 0;  // Base of the first chunk.
  uint64_t bytes = 0;  // Sum of the chunks.
  std::vector<VmmChunk> chunks;
  std::vector<common::UniqueFd> fds;  // One per chunk when exported.
};

// At most this many chunks per region (abi::kMaxVmmChunksV1).
inline constexpr size_t kMaxWalkChunks = 4096;

// The chunks covering [ptr, ptr+bytes); with `export_fds`, their
// descriptors too. INVALID_ARGUMENT when part of the range is not mapped.
absl::StatusOr<VmmWalk> WalkVmm(const VmmDriver& driver, uintptr_t ptr, uint64_t bytes, bool export_fds);

// Whether every chunk of a region (`base`, `chunks`) that [ptr, ptr+bytes)
// touches is still the mapping that was registered. One Mapping() per chunk
// touched.
bool VmmCurrent(const VmmDriver& driver, uintptr_t base, const std::vector<VmmChunk>& chunks, uintptr_t ptr,
                uint64_t bytes);

}  // namespace dmagather::client
