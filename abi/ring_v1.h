// A rank's shared-memory segment, v1, and the daemon's doorbell page.
//
// Segment (a sealed memfd created by the client, handed over on the fd
// channel, abi/fd_channel_v1.h, and mapped by the daemon at Join):
//   [SegmentHeaderV1][CompletionV1][RingV1 control][kRingSlotsV1 x DescriptorV1]
// The request ring is single-producer (the rank's submitting thread) and
// single-consumer (the daemon's ingress thread): the producer owns `tail`,
// the consumer owns `head`, both count descriptors since the start.
//
// Doorbell (a sealed memfd created by the daemon, handed to every client
// with its segment ticket, mapped by both): when the ingress
// thread has gone to sleep it sets `sleeping`; a producer that sees it bumps
// `seq` and wakes it with a futex. Store-then-load on both sides (seq_cst)
// means one of them always sees the other.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "abi/abi_v1.h"
#include "abi/completion_v1.h"
#include "abi/descriptor_v1.h"

namespace dmagather::abi {

struct SegmentHeaderV1 {
  uint32_t stamp;              // Stamp(sizeof(SegmentHeaderV1), 1)
  uint32_t magic;              // kMagic
  uint64_t token;              // Random; also sent in Join (checked against the handed-over segment).
  uint32_t ring_slots;         // kRingSlotsV1
  uint32_t descriptor_stamp;   // kDescriptorStampV1
  uint32_t completion_stamp;   // kCompletionStampV1
  uint32_t max_ranks;          // kMaxRanksV1
  uint64_t completion_offset;  // From the segment start.
  uint64_t ring_offset;
  uint64_t descriptors_offset;
  uint64_t segment_bytes;
  uint32_t pad[16];
};

struct RingV1 {
  uint64_t tail;  // Producer: descriptors published.
  uint64_t pad0[7];
  uint64_t head;  // Consumer: descriptors consumed.
  uint64_t pad1[7];
};

struct DoorbellV1 {
  uint32_t stamp;
  uint32_t magic;
  uint32_t pad0[14];
  uint32_t seq;       // Futex word.
  uint32_t sleeping;  // Ingress thread is (about to be) asleep.
  uint32_t pad1[14];
};

static_assert(sizeof(SegmentHeaderV1) == 128, "SegmentHeaderV1 layout");
static_assert(sizeof(RingV1) == 128, "RingV1 layout");
static_assert(sizeof(DoorbellV1) == 128, "DoorbellV1 layout");

constexpr uint32_t kSegmentStampV1 = Stamp(sizeof(SegmentHeaderV1), 1);
constexpr uint32_t kDoorbellStampV1 = Stamp(sizeof(DoorbellV1), 1);

struct SegmentLayoutV1 {
  static constexpr uint64_t kCompletionOffset = 4096;
  static constexpr uint64_t kRingOffset = kCompletionOffset + ((sizeof(CompletionV1) + 4095) / 4096) * 4096;
  static constexpr uint64_t kDescriptorsOffset = kRingOffset + 4096;
  static constexpr uint64_t kBytes =
      ((kDescriptorsOffset + uint64_t{kRingSlotsV1} * sizeof(DescriptorV1) + 4095) / 4096) * 4096;
};

// Typed views of a mapped segment (no ownership).
struct SegmentViewV1 {
  SegmentHeaderV1* header = nullptr;
  CompletionV1* completion = nullptr;
  RingV1* ring = nullptr;
  DescriptorV1* slots = nullptr;

  static SegmentViewV1 At(void* base) {
    auto* b = static_cast<char*>(base);
    SegmentViewV1 v;
    v.header = reinterpret_cast<SegmentHeaderV1*>(b);
    v.completion = reinterpret_cast<CompletionV1*>(b + SegmentLayoutV1::kCompletionOffset);
    v.ring = reinterpret_cast<RingV1*>(b + SegmentLayoutV1::kRingOffset);
    v.slots = reinterpret_cast<DescriptorV1*>(b + SegmentLayoutV1::kDescriptorsOffset);
    return v;
  }
};

// Writes a fresh segment header (the creator, i.e. the client, calls this
// once before Join; the stamp is stored last). `descriptor_stamp` names the
// descriptor version the client writes into the ring (v1 or later; all fill
// one slot).
inline void InitSegmentV1(void* base, uint64_t token, uint32_t descriptor_stamp = kDescriptorStampV1) {
  SegmentViewV1 v = SegmentViewV1::At(base);
  SegmentHeaderV1& h = *v.header;
  h.magic = kMagic;
  h.token = token;
  h.ring_slots = kRingSlotsV1;
  h.descriptor_stamp = descriptor_stamp;
  h.completion_stamp = kCompletionStampV1;
  h.max_ranks = kMaxRanksV1;
  h.completion_offset = SegmentLayoutV1::kCompletionOffset;
  h.ring_offset = SegmentLayoutV1::kRingOffset;
  h.descriptors_offset = SegmentLayoutV1::kDescriptorsOffset;
  h.segment_bytes = SegmentLayoutV1::kBytes;
  v.completion->stamp = kCompletionStampV1;
  StoreRelease(&h.stamp, kSegmentStampV1);
}

}  // namespace dmagather::abi
