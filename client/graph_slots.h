// GraphSlots: the CUDA-graph capture bookkeeping of one communicator. A
// captured op (all-gather, all-to-all, reduce-scatter) is a persistent op
// in one of abi::kGraphSlotsV1 graph slots, held until its graph is destroyed; the backend's destroy callback
// (any thread) names the freed slot in GraphSlotsFreed, and the next Take()
// reclaims it. Captured ops are remembered by handle (their slot, and
// whether their stream wait was captured: a captured op is waited exactly
// once, in the same capture).
//
// Each slot's definition (the descriptors as published) is kept while its
// graph lives: a daemon that takes the job back arms the ops again from them
// (DaemonLink, Definitions()).
//
// Threads: Take/Release/Captured/Find/Define on the communicator's user
// thread; the shared GraphSlotsFreed is filled from any thread under its
// mutex; Definitions() from any thread (defs_mu_; never held with freed's).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "abi/completion_v1.h"
#include "abi/descriptor_v2.h"
#include "abi/graph_v1.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/backend.h"

namespace dmagather::client {

class GraphSlots {
 public:
  struct CapturedOp {
    uint32_t slot = 0;
    bool waited = false;  // Its stream wait was captured.
  };

  // Handed to the backend with each slot taken (its destroy callback).
  const std::shared_ptr<GraphSlotsFreed>& freed() const { return freed_; }
  // The graph flags' ready words (null: nobody to tell any more).
  void SetReadyWords(uint32_t* ready);

  // A free slot (reclaiming those whose graphs were destroyed), or -1 when
  // every slot is held.
  int Take();
  // Frees the slots whose graphs were destroyed since.
  void Reclaim();
  // How often `slot` was taken: (slot, generation) names one capture.
  uint64_t generation(uint32_t slot) const { return generation_[slot]; }
  // Whether the capture (slot, generation) still holds its slot (its graph lives).
  bool Holds(uint32_t slot, uint64_t generation) const {
    return (used_ & (1u << slot)) != 0 && generation_[slot] == generation;
  }
  void Release(uint32_t slot);
  // The op `seq` being defined in `slot`: its `n` descriptors as published.
  void Define(uint32_t slot, uint32_t seq, const abi::DescriptorV2* ds, size_t n) ABSL_LOCKS_EXCLUDED(defs_mu_);
  // The definitions of the slots whose graphs live.
  std::vector<CapturedDefinition> Definitions() const ABSL_LOCKS_EXCLUDED(defs_mu_);
  // Op `op` was captured into `slot`. The oldest records go beyond
  // 4 * kGraphSlotsV1.
  void Captured(uint64_t op, uint32_t slot);
  // The captured op `op`, or null when it was not captured (or forgotten).
  CapturedOp* Find(uint64_t op);
  int used() const;  // Slots held.

  // The graph flags in the completion pages after `completion`:
  // fresh words for an op captured into `slot` (the daemon retires any
  // earlier op of the slot when it arms the new one);
  static void ResetFlags(abi::CompletionV1* completion, uint32_t slot);
  // the permanent release of every slot (high word of its done flag) when
  // the daemon is gone, so no replay waits forever.
  static void ReleaseForever(abi::CompletionV1* completion);

 private:
  void Undefine(uint32_t slot) ABSL_LOCKS_EXCLUDED(defs_mu_);

  uint32_t used_ = 0;  // Bit per slot.
  uint64_t generation_[abi::kGraphSlotsV1] = {};
  mutable absl::Mutex defs_mu_;
  std::map<uint32_t, CapturedDefinition> defs_ ABSL_GUARDED_BY(defs_mu_);  // By slot.
  std::map<uint64_t, CapturedOp> ops_;
  const std::shared_ptr<GraphSlotsFreed> freed_ = std::make_shared<GraphSlotsFreed>();
};

}  // namespace dmagather::client
