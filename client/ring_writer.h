// RingWriter: the producer side of the rank's request ring in its segment.
// An op is n descriptors (one per item) sharing a sequence number, each
// stamped and told how many items follow it; a descriptor is copied into
// the next free slot, then the tail moves (the daemon's ingress thread reads
// up to it), and the daemon's doorbell rings when its ingress thread sleeps.
// Refusals (this rank cannot take part in an op) are descriptors too.
//
// Threads: the communicator's user thread only (single producer); the
// head, tail and doorbell words are shared with the daemon through atomics.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "abi/descriptor_v2.h"
#include "abi/ring_v1.h"
#include "absl/status/status.h"

namespace dmagather::client {

class RingWriter {
 public:
  // The rank's segment and the daemon's doorbell (set once, at Join).
  void Attach(const abi::SegmentViewV1& view, abi::DoorbellV1* bell) {
    view_ = view;
    bell_ = bell;
  }

  // Copies the first `bytes` of descriptor `d` into the next slot once one
  // is free; false when `gone` turns true while the ring is full.
  bool PublishSlot(const void* d, size_t bytes, const std::atomic<bool>& gone);
  // Stamps the `n` descriptors of op `seq` (stamp, seq, submit time, items
  // following) and publishes each (only the receive references it uses);
  // false as PublishSlot.
  bool PublishOp(abi::DescriptorV2* ds, size_t n, uint32_t seq, uint64_t now_ns, const std::atomic<bool>& gone);

  // A refusal descriptor: status `code` and the reason (truncated).
  static void FillRefusal(int code, const absl::Status& why, abi::DescriptorV2* d);

 private:
  abi::SegmentViewV1 view_;
  abi::DoorbellV1* bell_ = nullptr;
};

}  // namespace dmagather::client
