// The ring's wire frame between daemons: a fixed 256-byte header, then
// `len` payload bytes (kData only). All fields little-endian (x86-64 and
// aarch64 daemons; the magic check refuses anything else).
#pragma once

#include <cstdint>

namespace dmagather::server::cluster {

inline constexpr uint32_t kRingMagic = 0x474e5244;  // "DRNG"
// 2: ops commit (kFrameEnded) before their done flags are written.
inline constexpr uint16_t kRingVersion = 2;

enum RingFrameType : uint16_t {
  kFrameHeader = 1,     // A node's verdict and shape for one op (one per node per op).
  kFrameData = 2,       // One chunk of one rank's shard of one item.
  kFrameSkip = 3,       // A chunk that could not be landed (the op is failing): counted, no payload.
  kFrameAbort = 4,      // The job failed on the origin node; text says why. Both directions.
  kFrameHeartbeat = 5,  // Backwards only (receiver to sender): this node is alive.
  kFrameEnded = 6,      // The origin ended op `seq` (all its data landed there); forwarded once round.
};

struct RingFrameV1 {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  uint32_t seq;
  int32_t origin;  // Node whose block (or verdict) this is.
  // kFrameData / kFrameSkip.
  uint32_t item;
  int32_t rank;
  uint64_t offset;
  uint64_t len;
  // kFrameHeader.
  int32_t code;         // dmagather_status_t of the node's verdict.
  int32_t failed_rank;  // Rank the verdict names, -1 none. kFrameAbort: the node blamed, -1 none.
  uint64_t signature;   // Hash of the op's shape (items, kinds, counts, dtypes).
  uint64_t chunks;      // Data/skip frames the origin's block has.
  char text[192];       // Error message, or the shape for messages; NUL-terminated.
};
static_assert(sizeof(RingFrameV1) == 256, "ring frame header is 256 bytes");

}  // namespace dmagather::server::cluster
