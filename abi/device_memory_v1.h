// Device memory handed over as file descriptors, v1: how a client exports
// GPU memory that legacy CUDA IPC cannot share (VMM allocations made with
// cuMemCreate, e.g. PyTorch's expandable segments, NCCL's cuMem buffers).
//
// A region is a run of physical allocations ("chunks") the client has mapped
// back to back in its address space. Each chunk's allocation is exported as
// a POSIX file descriptor (cuMemExportToShareableHandle) and handed over on
// the fd channel: kFdDeviceMemory requests carry 1..kMaxFdsPerRequestV1
// descriptors each (SCM_RIGHTS) and get one ticket. RegisterRequest then
// names the tickets in order (`tickets`) and carries the chunk table below
// in `handle`: chunk i is the i-th descriptor over all tickets. The daemon
// reserves one address range for the region and maps every chunk at its
// offset, so the region is one contiguous buffer to it as well.
#pragma once

#include <stdint.h>

#include "abi/abi_v1.h"

namespace dmagather::abi {

constexpr uint32_t kMaxFdsPerRequestV1 = 64;  // Descriptors in one kFdDeviceMemory hand-over.
constexpr uint32_t kMaxVmmChunksV1 = 4096;    // Chunks of one region.

struct VmmChunkV1 {
  uint64_t offset;      // From the region's base; a multiple of the allocation granularity.
  uint64_t bytes;       // Mapped bytes of this chunk (the allocation is mapped from its offset 0).
  uint64_t generation;  // The client's identity of this mapping (changes when the range is remapped).
};

struct VmmTableHeaderV1 {
  uint32_t stamp;   // kVmmTableStampV1
  uint32_t chunks;  // VmmChunkV1 entries that follow.
  uint32_t device;  // The owning rank's device ordinal.
  uint32_t reserved;
};

static_assert(sizeof(VmmChunkV1) == 24, "VmmChunkV1 layout");
static_assert(sizeof(VmmTableHeaderV1) == 16, "VmmTableHeaderV1 layout");

constexpr uint32_t kVmmTableStampV1 = Stamp(sizeof(VmmTableHeaderV1), 1);

}  // namespace dmagather::abi
