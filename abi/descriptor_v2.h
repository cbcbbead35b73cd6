// AllGather request descriptor, v2: what libdmagather writes into its
// request ring from version 0.2 on. Same slot size as v1, so the segment
// layout is unchanged; the daemon accepts v2 and v1 (newest first) and
// decodes either, once, into its internal request type.
//
// New in v2:
//  - `items_following`: a coalesced op (several tensors gathered as one op,
//    one matching and one completion) is one descriptor per item, all with
//    the op's sequence number; each says how many items of the op follow it.
//  - kOpRefuse: the rank cannot take part in this op (memory its backend
//    cannot reach, bad arguments found before submit). The daemon fails the
//    op on every rank with the rank's status (FALLBACK or INVALID_ARGUMENT)
//    and reason, so ranks never diverge (some submitting, some not).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "abi/abi_v1.h"
#include "abi/descriptor_v1.h"

namespace dmagather::abi {

enum OpCodeV2 : uint32_t {
  kOpAllGatherV2 = 1,      // as kOpAllGather
  kOpAllGatherListV2 = 2,  // as kOpAllGatherList
  kOpRefuse = 3,           // refusal{status, reason}; no buffers.
};

constexpr uint32_t kRefusalReasonBytesV2 = 1016;
constexpr uint32_t kMaxItemsPerOpV2 = 64;  // Items of one coalesced op.

struct RefusalV2 {
  int32_t status;  // dmagather_status_t: FALLBACK or INVALID_ARGUMENT.
  uint32_t reserved;
  char reason[kRefusalReasonBytesV2];  // NUL-terminated sentence.
};

struct DescriptorV2 {
  uint32_t stamp;      // Stamp(sizeof(DescriptorV2), 2)
  uint32_t op;         // OpCodeV2
  uint32_t seq;        // This rank's op number, 1-based, wraps.
  uint32_t dtype;      // dmagather_dtype_t
  uint64_t count;      // Elements per rank.
  uint64_t submit_ns;  // CLOCK_MONOTONIC when the client wrote it.
  BufferRefV1 send;
  uint32_t num_recv;         // 1 for kOpAllGather, world_size for kOpAllGatherList.
  uint32_t items_following;  // Descriptors of the same op after this one.
  union {
    BufferRefV1 recv[kMaxRanksV1];
    RefusalV2 refusal;
  };
};

static_assert(sizeof(RefusalV2) == 16 * kMaxRanksV1, "RefusalV2 layout");
static_assert(offsetof(DescriptorV2, send) == 32, "DescriptorV2 layout");
static_assert(offsetof(DescriptorV2, items_following) == 52, "DescriptorV2 layout");
static_assert(offsetof(DescriptorV2, recv) == 56, "DescriptorV2 layout");
static_assert(sizeof(DescriptorV2) == sizeof(DescriptorV1), "a v2 descriptor fills a v1 ring slot");

constexpr uint32_t kDescriptorStampV2 = Stamp(sizeof(DescriptorV2), 2);

}  // namespace dmagather::abi
