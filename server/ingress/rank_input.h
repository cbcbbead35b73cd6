// RankInput: what the ingress thread reads for one rank - its request ring
// (a view into the rank's segment; the segment itself is owned by the
// control service's Session) and its registered regions - plus the
// scheduler's Rank it feeds.
//
// Threads: ring_head/next_seq/items_left/current/skip_left only on the ingress
// thread; regions as RegionTable says.
#pragma once

#include <cstdint>
#include <memory>

#include "abi/ring_v1.h"
#include "server/ingress/region_table.h"
#include "server/scheduler/op.h"
#include "server/scheduler/rank.h"

namespace dmagather::server::ingress {

struct RankInput {
  // `view` is the rank's mapped segment. A new session's consumer index
  // starts at whatever the client published before Join. A resumed one
  // (its job taken back from an earlier daemon) starts where the client
  // rewound `head` to, its first op not seen done, whose sequence number
  // follows the segment's done_seq (Session::Open checked the span).
  RankInput(std::shared_ptr<scheduler::Rank> r, const abi::SegmentViewV1& view, bool resume = false)
      : rank(std::move(r)), regions(rank->rank()), ring(view.ring), slots(view.slots) {
    if (resume) {
      ring_head = abi::LoadAcquire(&ring->head);
      next_seq = abi::LoadAcquire(&view.completion->done_seq) + 1;
      return;
    }
    ring_head = abi::LoadAcquire(&ring->tail);
    abi::StoreRelease(&ring->head, ring_head);
  }

  const std::shared_ptr<scheduler::Rank> rank;
  RegionTable regions;

  // Ingress thread only.
  abi::RingV1* const ring;
  const abi::DescriptorV1* const slots;  // Ring slots (every version fills one).
  uint64_t ring_head = 0;                // The daemon's consumer index (mirrored to ring->head, never read back).
  uint32_t next_seq = 1;                 // Sequence number of the op being read.
  uint32_t items_left = 0;               // Items of a coalesced op still to come.
  scheduler::Op* current = nullptr;      // The op those items belong to.
  uint32_t skip_left = 0;                // Items still to skip of an op the earlier daemon ended.
};

}  // namespace dmagather::server::ingress
