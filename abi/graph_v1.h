// Persistent (CUDA-graph captured) AllGathers, v1.
//
// A graph replays the stream operations of a captured submit without the
// host, so they cannot carry a per-op sequence number. A captured op is
// instead defined once, at capture, by a descriptor whose op code has
// kOpPersistentBit set and names one of the rank's kGraphSlotsV1 slots; the
// daemon keeps the op armed after the definition completes (all ranks must
// define it; one verdict as for any op). Each replay then uses only
// constant values, as NCCL's copy-engine collectives do under capture:
//
//   rank's graph:  write32 ready[slot] = 1            (inputs ready)
//                  wait64  done[slot] >= 1            (lo word 1, or hi word set)
//                  write32 done_lo[slot] = 0          (re-arm its own wait)
//   daemon:        sees every rank's ready[slot] == 1 -> ready[slot] = 0 for
//                  all -> copies -> status[slot], then done_lo[slot] = 1.
//
// When a rank's graph is destroyed, its client writes kGraphSlotReleasedV1
// into ready[slot]; the daemon then retires the op. The client may reuse the
// slot at once (it resets the slot's words before defining a new op there;
// the daemon retires any op still armed on a slot defined again).
//
// phase[slot] is the daemon's own record of where a replay stands, so that a
// daemon that takes the job back after this one dies knows what to do with
// the slot (docs/ARCHITECTURE.md, "Daemon restarts"):
//
//   daemon:        phase = kPhaseTaken for every rank, then ready = 0 ...
//                  copies ... phase = kPhaseEnding for every rank, then
//                  status and done for every rank, then phase = kPhaseIdle.
//
// Taken on any rank: no rank's done was written, every rank waits for this
// replay with its inputs in place: run it again. Ending on every rank: done
// may be written for some ranks only; unless every rank's low done word is
// still 1, the replay is released with an error. Older daemons leave it 0.
//
// done[slot] is 64-bit: the daemon writes the low word per replay; the high
// word is the permanent release, set when the job fails or the daemon goes
// away (by the daemon, or by the client's watcher), so no replay after that
// waits forever. status[slot] holds the dmagather_status_t of the last
// replay (0 = OK).
//
// The block sits in the completion pages of the rank segment, after
// CompletionV1 (both processes map and CUDA-register those pages already).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "abi/completion_v1.h"

namespace dmagather::abi {

constexpr uint32_t kGraphSlotsV1 = 32;
constexpr uint32_t kOpPersistentBit = 0x100;  // In DescriptorV2::op, with the slot in bits 16..23.
constexpr uint32_t kOpPersistentSlotShift = 16;
constexpr uint32_t kOpBaseMask = 0xff;
// ready[slot] value the client writes (from the CPU) when the graph that held
// the slot was destroyed: the daemon retires the op (and stops polling it).
constexpr uint32_t kGraphSlotReleasedV1 = 0xdead0001;

// The done flag of a slot: read by the graph as one little-endian 64-bit
// word (hi << 32 | lo), written as two 32-bit words.
struct alignas(8) DoneWordV1 {
  uint32_t lo;  // Daemon writes 1 per replay; the graph resets it to 0.
  uint32_t hi;  // Released for good (job failed, daemon gone): nonzero.
};

struct GraphFlagsV1 {
  uint32_t stamp;  // Stamp(sizeof(GraphFlagsV1), 1), written by the client.
  uint32_t pad0[15];
  uint32_t ready[kGraphSlotsV1];  // Client graph writes 1; daemon resets to 0.
  DoneWordV1 done[kGraphSlotsV1];
  int32_t status[kGraphSlotsV1];  // Daemon: status of the slot's last replay.
  uint32_t phase[kGraphSlotsV1];  // Daemon: kPhase* of the slot's replay.
};

constexpr uint32_t kPhaseIdle = 0;    // No replay is being served.
constexpr uint32_t kPhaseTaken = 1;   // A replay was taken: its copies may be partial.
constexpr uint32_t kPhaseEnding = 2;  // Its copies ended: done is being written.

// Offset of the block from the start of the completion block.
constexpr uint64_t kGraphFlagsOffsetV1 = 4608;
static_assert(sizeof(CompletionV1) <= kGraphFlagsOffsetV1, "graph flags follow CompletionV1");
static_assert(kGraphFlagsOffsetV1 + sizeof(GraphFlagsV1) <= 8192, "graph flags fit the completion pages");
static_assert(offsetof(GraphFlagsV1, done) % 8 == 0 && sizeof(DoneWordV1) == 8, "64-bit done words");
static_assert(offsetof(GraphFlagsV1, ready) == 64 && offsetof(GraphFlagsV1, done) == 192 &&
                  offsetof(GraphFlagsV1, status) == 448 && offsetof(GraphFlagsV1, phase) == 576,
              "GraphFlagsV1 layout");

constexpr uint32_t kGraphFlagsStampV1 = Stamp(sizeof(GraphFlagsV1), 1);

inline GraphFlagsV1* GraphFlagsOf(CompletionV1* c) {
  return reinterpret_cast<GraphFlagsV1*>(reinterpret_cast<char*>(c) + kGraphFlagsOffsetV1);
}

}  // namespace dmagather::abi
