// InFlightOp: one op on the GPU engine from routing to its end. It owns
// what the op's shares share: how many are still open (the router's own
// guard, one per issuing device until its copies are enqueued, then one per
// end event handed to a completion thread), how many are not enqueued yet,
// the op's first error, each device's end event, the choice of finisher
// (the device that writes the ranks' done flags: ChooseFinisher) and the
// op's place in the cross-device order (issue_order, lockstep.h). The last
// Close of a share says so; the pool (in_flight_pool.h) then ends the op.
//
// Threads: Begin, ChooseFinisher and OpenShares on the routing thread (the
// ingress or gate thread, under the issue lock) before any share is handed
// out; set_end, ShareFailed and ShareEnqueued on the thread issuing a
// device's share; Close on any thread (the issuing and completion
// threads); TakeEnding on the thread of the last Close. The status is
// guarded by the op's mutex (level kOpStatus, lock_order.h), the counts are
// atomics, the rest is written before the shares are handed out.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/copy_engine.h"
#include "server/engines/gpu/job_loads.h"
#include "server/engines/gpu/lock_order.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu {

class InFlightOp {
 public:
  // What the last Close hands back to end the op with.
  struct Ending {
    EngineOp* op = nullptr;
    absl::Status status;
    JobLoads::Load* load = nullptr;
    bool waits_ahead = false;
    bool failed_at_issue = false;
  };

  // Starts tracking `op` of the job `load` counts (waits_ahead: issued ahead
  // of its ranks' ready flags), routed with `routed` (an error fails the op
  // before any share), on an engine of `devices` devices. One share is open:
  // the router's own, closed once it has handed out the others.
  void Begin(EngineOp* op, JobLoads::Load* load, bool waits_ahead, const absl::Status& routed, int devices)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The device that writes the op's done flags after every share's copies,
  // or -1 (the CPU publishes them): only where the op asks for it and the
  // runtime can (device_writes), every rank knows its done flag, and the
  // job's finisher (JobLoads::Finisher) is the op's lowest issuing device.
  // `involved[d]`: device d issues a share of the op.
  int ChooseFinisher(const std::vector<char>& involved, bool device_writes, JobLoads& loads);
  // Opens one share per issuing device (`shares`), at `issue_order` in the
  // cross-device order (1, 2, ...).
  void OpenShares(int shares, uint64_t issue_order);

  EngineOp* op() const { return op_; }
  JobLoads::Load* load() const { return load_; }
  int finisher() const { return finisher_; }
  uint64_t issue_order() const { return issue_order_; }
  // Device d's end event (null: none yet, or its share recorded none).
  GpuEvent end(int device) const { return ends_[device]; }
  // Set before the share counts as enqueued (the finisher reads it).
  void set_end(int device, GpuEvent end) { ends_[device] = end; }
  // Shares not enqueued yet (the finisher waits until it is the last).
  int unenqueued() const { return unenqueued_.load(std::memory_order_acquire); }

  // A share failed at issue: the op fails, and its job is told once
  // (JobLoads::FailedAtIssue), before the share counts as enqueued.
  void ShareFailed(const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);
  // The op has failed so far (a share's or the routing's error).
  bool failed() ABSL_LOCKS_EXCLUDED(mu_);
  // A device's share is enqueued; true when it was the op's last.
  bool ShareEnqueued();
  // One more share to close: an end event handed to a completion thread.
  void OpenEnd() { open_.fetch_add(1, std::memory_order_acq_rel); }
  // Records `st` (if an error) and closes one share; true when it was the
  // last: the caller then ends the op (TakeEnding).
  bool Close(const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);
  // After the last Close: what ends the op; the object is free for reuse.
  Ending TakeEnding() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  EngineOp* op_ = nullptr;
  JobLoads::Load* load_ = nullptr;
  bool waits_ahead_ = false;  // Counted in its job's load until the op ends.
  uint64_t issue_order_ = 0;  // 1, 2, ... in routing order; 0: no share to issue.
  int finisher_ = -1;
  std::vector<GpuEvent> ends_;                // Per device.
  std::atomic<bool> failed_at_issue_{false};  // Counted in its load's unsettled_errors.
  std::atomic<int> unenqueued_{0};
  std::atomic<int> open_{0};
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(lock_order::kOpStatus) ABSL_ACQUIRED_BEFORE(lock_order::kImports);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dmagather::server::engines::gpu
