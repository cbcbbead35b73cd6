// PersistentOp: an AllGather captured into a CUDA graph. Defined once, at
// capture, through an ordinary op (every rank's descriptor names one of its
// graph slots; one verdict as for any op); from then on it stays armed and
// is started by every replay of the ranks' graphs, which write only
// constant values (abi/graph_v1.h):
//
//   kArmed    every rank's ready[slot] == 1 (polled by the ingress thread)
//             -> reset every ready[slot] to 0, hand the plan to the engine
//   kRunning  engine done -> status[slot], then done_lo[slot] = 1 for every
//             rank -> kArmed again
//   kReleased the job failed: every rank's done word gets its permanent
//             release (high word) and the failure, so no replay waits
//             forever; nothing is copied any more
//
// Each rank's phase[slot] records the daemon's side of a replay (taken,
// ending, idle: abi/graph_v1.h), so that a daemon taking the job back after
// this one died re-arms the op from the ranks' definitions (Job::
// RearmCaptured) and TakeBack() finishes or repeats the replay it left.
//
// Holds references to the ranks' buffers so they stay mapped while armed.
//
// Threads: created and polled on the ingress thread (Job::PollPersistent);
// OnEngineDone on an engine thread. state is the hand-off between them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "abi/graph_v1.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::scheduler {

class Job;
class Rank;

class PersistentOp : public engines::EngineOp {
 public:
  enum State : int { kArmed = 0, kRunning = 1, kReleased = 2 };

  // What Poll() decided (for the caller's counting).
  enum class Polled { kIdle, kStarted, kReleased, kRetired };

  // `ranks`: the job's ranks (fixed for its life), `slots`: each one's graph slot.
  PersistentOp(Job* job, std::vector<Rank*> ranks, std::vector<int> slots);

  // One look at the ready flags (ingress thread). `failed`: the job failed
  // (status: its failure code) - release instead of starting. A rank whose
  // graph is gone (kGraphSlotReleasedV1): retire.
  Polled Poll(engines::CopyEngine* engine, bool failed, int32_t failed_code);
  void OnEngineDone(absl::Status status) override;

  int state() const { return state_.load(std::memory_order_acquire); }
  int slot(int rank) const { return slots_[rank]; }
  // A daemon taking the job back, before the op is armed: what the ranks'
  // flags say of the replay the earlier daemon served. kRunAgain: it was
  // taken and never ended (every rank waits, inputs in place): its ready
  // flags are set again, so the next Poll starts it. kEnded: its done flags
  // were all written. kReleased: it died while writing them and some rank
  // may have gone on: every rank gets the permanent release and
  // UNAVAILABLE (never a second, wrong copy). kIdle: nothing was served.
  enum class Resumed { kIdle, kRunAgain, kEnded, kReleased };
  Resumed TakeBack();
  // Every rank's done word gets the permanent release and status `code`;
  // nothing is copied any more (also the job's failure, through Poll).
  void Release(int32_t code);

  // Replaced by a new definition of its slots: never started again.
  void Retire() { retired_.store(true, std::memory_order_release); }
  bool retired() const { return retired_.load(std::memory_order_acquire); }
  uint64_t replays() const { return replays_.load(std::memory_order_relaxed); }

  std::vector<std::shared_ptr<engines::ImportedRegion>> holds;

 private:
  // Every rank's phase word of the op's slot.
  void SetPhase(uint32_t phase);

  Job* const job_;
  // The rank's graph flags, or null once its segment is being released.
  abi::GraphFlagsV1* Flags(size_t r) const;

  const std::vector<Rank*> ranks_;
  const std::vector<int> slots_;  // Per rank.
  std::atomic<int> state_{kArmed};
  std::atomic<uint64_t> replays_{0};
  std::atomic<bool> retired_{false};
};

}  // namespace dmagather::server::scheduler
