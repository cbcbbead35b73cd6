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
//  - kOpAllToAll and the reduce-scatters (same slot, from version 0.4 on):
//    chunk d of the rank's send goes to rank d, where it lands as chunk
//    `rank` of that rank's output. The op's arguments (AllToAllV2) overlay
//    `recv` (num_recv = 1). A reduce-scatter is moved exactly as an
//    all-to-all; its op code says the reduction the ranks then run
//    themselves, so ranks that disagree on it are told so. A daemon that
//    does not know these codes fails the op on every rank; clients ask
//    first (JoinReply.takes_alltoall).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "abi/abi_v1.h"
#include "abi/descriptor_v1.h"

namespace dmagather::abi {

enum OpCodeV2 : uint32_t {
  kOpAllGatherV2 = 1,         // as kOpAllGather
  kOpAllGatherListV2 = 2,     // as kOpAllGatherList
  kOpRefuse = 3,              // refusal{status, reason}; no buffers.
  kOpAllToAllV2 = 4,          // all_to_all_single, equal chunks: a2a{...}
  kOpReduceScatterSumV2 = 5,  // moved as kOpAllToAllV2; the ranks sum
  kOpReduceScatterAvgV2 = 6,  // moved as kOpAllToAllV2; the ranks average
};

// Whether an op code (a captured op's too: its persistent bit and slot,
// abi/graph_v1.h, lie above the low byte) moves an all-to-all's chunks.
inline bool IsAllToAllV2(uint32_t op) {
  op &= 0xff;  // graph_v1.h's kOpBaseMask
  return op == kOpAllToAllV2 || op == kOpReduceScatterSumV2 || op == kOpReduceScatterAvgV2;
}

// AllToAllV2.flags
constexpr uint32_t kAllToAllSkipSelf = 1;  // The rank's own chunk is not moved (the rank reads or copies it itself).

constexpr uint32_t kRefusalReasonBytesV2 = 1016;
constexpr uint32_t kMaxItemsPerOpV2 = 64;  // Items of one coalesced op.

struct RefusalV2 {
  int32_t status;  // dmagather_status_t: FALLBACK or INVALID_ARGUMENT.
  uint32_t reserved;
  char reason[kRefusalReasonBytesV2];  // NUL-terminated sentence.
};

// The arguments of an all-to-all: chunk d of the send buffer starts at
// send + d*send_stride bytes, and the chunk from rank s lands at recv +
// s*recv_stride; each chunk is `count` elements. Strides are at least a
// chunk's bytes; a reduce-scatter moved in slices uses a send stride of the
// whole chunk and a recv stride of one slice.
struct AllToAllV2 {
  BufferRefV1 recv;  // Overlays recv[0].
  uint64_t send_stride;
  uint64_t recv_stride;
  uint32_t flags;  // kAllToAllSkipSelf
  uint32_t reserved;
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
    AllToAllV2 a2a;
  };
};

static_assert(sizeof(RefusalV2) == 16 * kMaxRanksV1, "RefusalV2 layout");
static_assert(offsetof(DescriptorV2, send) == 32, "DescriptorV2 layout");
static_assert(offsetof(DescriptorV2, items_following) == 52, "DescriptorV2 layout");
static_assert(offsetof(DescriptorV2, recv) == 56, "DescriptorV2 layout");
static_assert(sizeof(DescriptorV2) == sizeof(DescriptorV1), "a v2 descriptor fills a v1 ring slot");
static_assert(offsetof(DescriptorV2, a2a.recv) == offsetof(DescriptorV2, recv), "AllToAllV2 overlays recv[0]");
static_assert(sizeof(AllToAllV2) == 40, "AllToAllV2 layout");

constexpr uint32_t kDescriptorStampV2 = Stamp(sizeof(DescriptorV2), 2);

}  // namespace dmagather::abi
