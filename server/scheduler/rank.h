// Rank: one rank of one job as the scheduler sees it - its completion block
// (done flag, error records), in-order publishing state, in-flight count,
// liveness and counters, and the engine's context for it.
//
// Owner: created by the control service at Join, shared by the Job (which
// publishes completions) and the ingress side (which counts ops in).
// Threads: state/inflight/counters are atomics; next_publish/finished only
// under the owning Job's completion lock; Release() by the reaper once
// nothing in flight can touch the rank.
#pragma once

#include <sys/types.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "abi/completion_v1.h"
#include "common/api_names.h"
#include "common/latency_histogram.h"
#include "server/engines/copy_engine.h"

namespace dmagather::server::scheduler {

struct RankCounters {
  std::atomic<uint64_t> ops{0};
  std::atomic<uint64_t> bytes{0};
  std::array<std::atomic<uint64_t>, common::kNumApiStatus> errors{};
  common::LatencyHistogram latency;  // Descriptor submitted -> done flag written.
};

class Rank {
 public:
  enum class State : int { kJoining = 0, kActive = 1, kLeft = 2, kGone = 3 };

  Rank(int rank, int pid, uid_t uid, abi::CompletionV1* completion, std::unique_ptr<engines::EngineRank> engine);

  int rank() const { return rank_; }
  int pid() const { return pid_; }
  uid_t uid() const { return uid_; }

  State state() const { return static_cast<State>(state_.load(std::memory_order_acquire)); }
  void set_state(State s) { state_.store(static_cast<int>(s), std::memory_order_release); }
  const char* state_name() const;

  // Null after Release().
  abi::CompletionV1* completion() const { return completion_; }
  const engines::EngineRank* engine() const { return engine_.get(); }

  // The rank went away: moves its ready flag past every op it may still
  // have in flight, so engine streams waiting on it (cuda) drain; the job
  // has failed by then, so those ops complete with its error.
  void ReleaseReadyWaiters();
  // Undoes the engine's attach and forgets the completion block (before
  // the segment is unmapped). Safe to call more than once.
  void Release();
  bool released() const { return released_.load(std::memory_order_acquire); }

  // Ops consumed from the ring and not yet published done.
  std::atomic<uint32_t> inflight{0};
  RankCounters counters;

  // Under the job's completion lock: in-order publishing of done flags.
  uint32_t next_publish = 1;
  std::vector<uint32_t> finished;  // finished[seq % slots] == seq once done.

 private:
  const int rank_;
  const int pid_;
  const uid_t uid_;
  abi::CompletionV1* completion_;
  std::unique_ptr<engines::EngineRank> engine_;
  std::atomic<int> state_{0};
  std::atomic<bool> released_{false};
};

}  // namespace dmagather::server::scheduler
