// AllGather request descriptor, v1: written by the client into its request
// ring, read once by the daemon's ingress thread. Buffers are named by region
// id (from Register) plus a byte offset, never by raw pointer.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "abi/abi_v1.h"

namespace dmagather::abi {

enum OpCodeV1 : uint32_t {
  kOpAllGather = 1,      // all_gather_into_tensor: recv[0] holds world*count.
  kOpAllGatherList = 2,  // list output: recv[r] receives rank r's shard.
};

struct BufferRefV1 {
  uint32_t region_id;
  uint32_t reserved;
  uint64_t offset;  // Bytes from the region's base.
};

struct DescriptorV1 {
  uint32_t stamp;      // Stamp(sizeof(DescriptorV1), 1)
  uint32_t op;         // OpCodeV1
  uint32_t seq;        // This rank's op number, 1-based, wraps.
  uint32_t dtype;      // dmagather_dtype_t
  uint64_t count;      // Elements per rank.
  uint64_t submit_ns;  // CLOCK_MONOTONIC when the client wrote it.
  BufferRefV1 send;
  uint32_t num_recv;  // 1 for kOpAllGather, world_size for kOpAllGatherList.
  uint32_t reserved;
  BufferRefV1 recv[kMaxRanksV1];
};

static_assert(sizeof(BufferRefV1) == 16, "BufferRefV1 layout");
static_assert(offsetof(DescriptorV1, send) == 32, "DescriptorV1 layout");
static_assert(offsetof(DescriptorV1, recv) == 56, "DescriptorV1 layout");
static_assert(sizeof(DescriptorV1) == 56 + 16 * kMaxRanksV1, "DescriptorV1 layout");

constexpr uint32_t kDescriptorStampV1 = Stamp(sizeof(DescriptorV1), 1);

}  // namespace dmagather::abi
