// ReadyGate: the GPU engine's CPU gate. An op that may not be issued yet -
// its ranks' ready flags not seen where the runtime cannot wait for them on
// the device, or its job over the bound of ops ahead of their flags
// (job_loads.h) - waits here, in order within its job (jobs pass each
// other), and the gate's thread issues it once the step after the gate
// says it may go. That step is an OpIssuer, declared below: the engine's
// router (gpu_engine.h), which the gate asks MayIssue and calls Issue.
//
// The gate's lock is the engine's issue lock: Issue runs under it whether
// Submit calls it (the ingress thread) or the gate's thread does, so the
// engine's routing scratch has one writer at a time. Lock order: this lock
// (kIssue, the first of lock_order.h), then whatever MayIssue and Issue
// take (JobLoads, the in-flight ops, the FIFOs, the device-order locks;
// docs/CUDA.md, "Locks and waits").
//
// While work came within `awake_ns`, the thread polls for the next gated op
// instead of sleeping (an active job costs no wake-up); ops that may not go
// yet are polled with a growing back-off (backoff.h).
//
// Threads: Submit from the engine's one submitting thread (the ingress);
// Empty, Stop and the counters from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/lock_order.h"

namespace dmagather::server::engines::gpu {

// The step after the gate: what the gate asks of an op and hands it to.
class OpIssuer {
 public:
  // Under the gate's lock: the op may be issued now.
  virtual bool MayIssue(const EngineOp& op) = 0;
  // Under the gate's lock: issue it.
  virtual void Issue(EngineOp* op) = 0;
  // Not under the lock: the op is failed (the gate was abandoned).
  virtual void Fail(EngineOp* op, const absl::Status& status) = 0;

 protected:
  ~OpIssuer() = default;
};

class ReadyGate {
 public:
  // `issuer` outlives the gate.
  ReadyGate(common::Clock& clock, uint64_t awake_ns, size_t slots, OpIssuer& issuer);
  ~ReadyGate();
  ReadyGate(const ReadyGate&) = delete;
  ReadyGate& operator=(const ReadyGate&) = delete;

  // Starts the gate's thread.
  void Start();
  // Issues `op` now when no op of its job is gated and it may go; else
  // gates it (waiting while the gate is full). True: gated.
  bool Submit(EngineOp* op) ABSL_LOCKS_EXCLUDED(mu_);
  // No op is gated.
  bool Empty() ABSL_LOCKS_EXCLUDED(mu_);
  // From now on the thread fails the ops it holds instead of issuing them.
  void Abandon() { abandon_.store(true); }
  // Stops the thread once the gate is empty (after Abandon: at once, each
  // op held failed).
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // The thread was woken from sleep with work.
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }
  // The thread sleeps on the condition variable (tests).
  bool asleep() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return sleeping_;
  }

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  void Push(EngineOp* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the gated op at `index`.
  EngineOp* Remove(size_t index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  common::Clock& clock_;
  const uint64_t awake_ns_;
  const size_t slots_;
  OpIssuer& issuer_;
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(lock_order::kIssue) ABSL_ACQUIRED_BEFORE(lock_order::kLoads);
  std::deque<EngineOp*> ops_ ABSL_GUARDED_BY(mu_);                      // In order within each job.
  absl::flat_hash_map<uint64_t, size_t> per_job_ ABSL_GUARDED_BY(mu_);  // Gated ops by job.
  std::atomic<size_t> size_{0};  // ops_.size(), for the thread's polls without the lock.
  absl::CondVar changed_;        // An op was gated / left the gate / stopping.
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> abandon_{false};
  std::atomic<uint64_t> wakeups_{0};
  std::thread thread_;
};

}  // namespace dmagather::server::engines::gpu
