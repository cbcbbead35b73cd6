// RingWriter: the producer side of the rank's request ring in its segment.
// An op is n descriptors (one per item) sharing a sequence number, each
// stamped and told how many items follow it; a descriptor is copied into
// the next free slot, then the tail moves (the daemon's ingress thread reads
// up to it), and the daemon's doorbell rings when its ingress thread sleeps.
// Refusals (this rank cannot take part in an op) are descriptors too.
//
// A slot is free only once the op it holds is done (done_seq), not merely
// consumed (head): so the ring holds every descriptor of every op this rank
// has not seen done, and a daemon that takes the job back after the
// earlier one went away reads them again from the first such op (Rewind).
//
// Threads: the communicator's user thread publishes (single producer);
// the reconnecting thread calls Rewind and SetDoorbell while no daemon
// serves the ring (the user thread may publish meanwhile: op starts and the
// doorbell are atomics). head, tail, done_seq and the doorbell words are
// shared with the daemon through atomics.
#pragma once

#include <array>
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
    bell_.store(bell);
  }
  // A new daemon's doorbell (the old mapping stays valid: the caller keeps it).
  void SetDoorbell(abi::DoorbellV1* bell) { bell_.store(bell); }
  // Rings the doorbell if the daemon's ingress thread sleeps.
  void Ring();

  // Op `seq` starts at the next slot (before its first PublishSlot).
  void BeginOp(uint32_t seq);
  // Copies the first `bytes` of descriptor `d` into the next slot once one
  // is free; false when `gone` turns true while the ring is full.
  bool PublishSlot(const void* d, size_t bytes, const std::atomic<bool>& gone);
  // Stamps the `n` descriptors of op `seq` (stamp, seq, submit time, items
  // following) and publishes each (only the receive references it uses);
  // false as PublishSlot.
  bool PublishOp(abi::DescriptorV2* ds, size_t n, uint32_t seq, uint64_t now_ns, const std::atomic<bool>& gone);

  // No daemon reads the ring (it went away): moves head back to the first
  // descriptor of the first op not seen done, for the daemon that takes the
  // job back. Returns the ops from there on that were begun (handed over).
  uint32_t Rewind();

  // A refusal descriptor: status `code` and the reason (truncated).
  static void FillRefusal(int code, const absl::Status& why, abi::DescriptorV2* d);

 private:
  // Ring index of the first descriptor of the oldest op not seen done
  // (tail when every op begun is done): slots before it are free.
  uint64_t Retired(uint64_t tail) const;

  abi::SegmentViewV1 view_;
  std::atomic<abi::DoorbellV1*> bell_{nullptr};
  // By seq % kRingSlotsV1: the ring index of op seq's first descriptor (at
  // most kRingSlotsV1 ops are outstanding: the communicator waits).
  std::array<std::atomic<uint64_t>, abi::kRingSlotsV1> op_start_{};
  std::atomic<uint32_t> begun_{0};  // The newest op begun (0: none).
};

}  // namespace dmagather::client
