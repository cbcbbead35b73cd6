// Request: one rank's part of one op, as the scheduler sees it. Ingress
// decodes each shared-memory descriptor (v1 or v2) once into a Request and
// validates it against the rank's own regions; from there on nothing reads
// the ABI structs.
//
// A coalesced op has several items (one per gathered tensor); a plain op has
// one. Item buffers are daemon-side pointers after validation.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/dtype.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::scheduler {

enum class OpKind : uint32_t {
  kAllGather = 1,      // all_gather_into_tensor: recv[0] holds world*count.
  kAllGatherList = 2,  // list output: recv[r] receives rank r's shard.
  // all_to_all_single with equal chunks (send chunk d -> rank d's recv
  // chunk `rank`), and the reduce-scatters, which are moved the same way
  // (the ranks then reduce their chunks themselves).
  kAllToAll = 4,
  kReduceScatterSum = 5,
  kReduceScatterAvg = 6,
};

inline bool IsAllToAll(OpKind kind) {
  return kind == OpKind::kAllToAll || kind == OpKind::kReduceScatterSum || kind == OpKind::kReduceScatterAvg;
}

// The op's name as users call it.
inline const char* OpKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllGather:
      return "allgather";
    case OpKind::kAllGatherList:
      return "allgather_list";
    case OpKind::kAllToAll:
      return "alltoall";
    case OpKind::kReduceScatterSum:
      return "reduce_scatter(sum)";
    case OpKind::kReduceScatterAvg:
      return "reduce_scatter(avg)";
  }
  return "unknown";
}

// An all-to-all's layout (abi::AllToAllV2).
struct AllToAllLayout {
  uint64_t send_stride = 0;
  uint64_t recv_stride = 0;
  bool skip_self = false;
};

// (region id, byte offset) as the client named a buffer.
struct BufferRef {
  uint32_t region_id = 0;
  uint64_t offset = 0;
};

// Output buffers one item can name (list output: one per rank).
inline constexpr uint32_t kMaxRecv = 64;

// One decoded descriptor: one item of an op, or a refusal.
struct Request {
  uint32_t abi_version = 0;
  uint32_t seq = 0;
  uint32_t raw_op = 0;  // As written (checked by validation).
  uint32_t dtype = 0;
  uint64_t count = 0;
  uint64_t submit_ns = 0;
  uint32_t items_following = 0;
  BufferRef send;
  uint32_t num_recv = 0;
  BufferRef recv[kMaxRecv];
  AllToAllLayout a2a;  // All-to-all kinds.
  // Set when the rank refused to take part (kOpRefuse) or the descriptor
  // could not be decoded: the op fails on every rank with this status.
  absl::Status refusal;
  // The rank's graph slot when the op is being defined as a persistent
  // (CUDA-graph captured) op (abi/graph_v1.h); -1 for an ordinary op.
  int graph_slot = -1;
};

// One validated item: what the rank's tensor looks like and where it is.
struct Item {
  OpKind kind = OpKind::kAllGather;
  uint32_t dtype = 0;
  uint64_t count = 0;
  const char* send = nullptr;
  uint32_t recv_begin = 0;  // Index into RankPart::recv.
  uint32_t num_recv = 0;
  AllToAllLayout a2a;  // All-to-all kinds.
};

// What one rank asked for in one op.
struct RankPart {
  bool started = false;         // The first item has been read (the op counts in the rank's inflight).
  bool arrived = false;         // Every item of the op has been read.
  bool error_recorded = false;  // The op's error record is in the rank's block (under completion_mu_).
  absl::Status status;          // First problem with this rank's part (refusal or validation).
  uint64_t submit_ns = 0;
  uint32_t items_expected = 0;  // From the first descriptor's items_following + 1.
  std::vector<Item> items;
  std::vector<char*> recv;  // Daemon-side output pointers of all items.
  int graph_slot = -1;      // Persistent op: the rank's graph slot (every item names the same).
  // Persistent op: references that keep the item buffers mapped while the
  // op stays armed (the client may deregister them meanwhile).
  std::vector<std::shared_ptr<engines::ImportedRegion>> holds;

  void Reset() {
    graph_slot = -1;
    holds.clear();
    started = false;
    arrived = false;
    error_recorded = false;
    status = absl::OkStatus();
    submit_ns = 0;
    items_expected = 0;
    items.clear();
    recv.clear();
  }
  // Bytes this rank's outputs receive (an all-gather's or all-to-all's:
  // one chunk from every rank).
  uint64_t payload_bytes(int world) const {
    uint64_t n = 0;
    for (const Item& it : items) n += it.count * common::DtypeSize(it.dtype) * uint64_t(world);
    return n;
  }
};

}  // namespace dmagather::server::scheduler
