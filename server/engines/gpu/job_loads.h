// JobLoads: what each job has in flight on the GPU engine, and the two rules
// that read it (docs/CUDA.md, "Locks and waits" and "Completion"):
// - the max_waits_ahead bound, per job (rule 3): while any op of a job issued
//   ahead of its ranks' ready flags is in flight, at most `bound` ops of
//   that job are; a job's parked waits never hold another job's ops;
// - done on the device: one device of the job, its first op's lowest
//   issuing device, writes the job's done flags (so they never go back),
//   and none while an op of the job that failed at issue has not ended (its
//   error record must come first).
//
// Threads: Begin, MayIssue and Finisher under the engine's issue order (any
// thread; the map under its own mutex, level kLoads of lock_order.h: after the gate's);
// End on the thread that ends the op; the counters are atomics. A load is
// dropped once idle (End's decrement of in_flight is its last touch) when
// there are many.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/gpu/lock_order.h"

namespace dmagather::server::engines::gpu {

class JobLoads {
 public:
  struct Load {
    std::atomic<int> in_flight{0};
    std::atomic<int> waits_ahead{0};       // Of in_flight: issued ahead of their ready flags.
    std::atomic<int> unsettled_errors{0};  // Of in_flight: failed at issue, not ended.
    int finisher = -1;                     // Set once, under the map's mutex.
  };

  // An op of `job` is issued (waits_ahead: ahead of its ready flags).
  Load* Begin(uint64_t job, bool waits_ahead) ABSL_LOCKS_EXCLUDED(mu_);
  // It failed at issue (once per op; its error record is not written yet).
  static void FailedAtIssue(Load* load) { load->unsettled_errors.fetch_add(1, std::memory_order_acq_rel); }
  // It ended, after its error record (if any) was written.
  static void End(Load* load, bool waits_ahead, bool failed_at_issue);

  // Rule 3: may an op of `job` be issued now? (ranks_ready: every rank's
  // ready flag is at the op already; bound 0: no bound.)
  bool MayIssue(uint64_t job, bool ranks_ready, int bound) ABSL_LOCKS_EXCLUDED(mu_);
  // The device that writes the job's done flags for an op whose lowest
  // issuing device is `first` (-1: not this op: the CPU publishes).
  int Finisher(Load* load, int first) ABSL_LOCKS_EXCLUDED(mu_);
  // No device may write the job's done flags now (an earlier op failed at
  // issue and has not ended).
  static bool Unsettled(const Load* load) { return load->unsettled_errors.load(std::memory_order_acquire) != 0; }

  size_t size() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Load* Of(uint64_t job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(lock_order::kLoads) ABSL_ACQUIRED_BEFORE(lock_order::kOpPool);
  std::map<uint64_t, std::unique_ptr<Load>> loads_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dmagather::server::engines::gpu
