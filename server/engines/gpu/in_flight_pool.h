// InFlightPool: the GPU engine's fixed pool of InFlightOps (in_flight_op.h)
// and the end of an op. Take hands out a free one (waiting while every one
// is in flight: back-pressure when completions lag); Close closes one share
// of an op, and the last close ends it: the object goes back to the pool,
// then the scheduler is told (EngineOp::OnEngineDone: error records, done
// flags where no device wrote them), then its job's load (JobLoads::End:
// after OnEngineDone, so that an op that failed at issue has its error
// record written before a later op's done flag may be).
//
// Threads: Take on the routing thread (ingress or gate, under the issue
// lock); Close on any thread (routing, issuing and completion threads). The
// free list is guarded by the pool's mutex (level kOpPool, lock_order.h),
// never held across OnEngineDone.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/latency_histogram.h"
#include "server/engines/gpu/in_flight_op.h"
#include "server/engines/gpu/lock_order.h"

namespace dmagather::server::engines::gpu {

class InFlightPool {
 public:
  InFlightPool(size_t size, common::Clock& clock);
  InFlightPool(const InFlightPool&) = delete;
  InFlightPool& operator=(const InFlightPool&) = delete;

  // A free op to track (waits while there is none).
  InFlightOp* Take() ABSL_LOCKS_EXCLUDED(mu_);
  // Records `st` (if an error) and closes one share of `t`; the last close
  // ends the op (above).
  void Close(InFlightOp* t, const absl::Status& st) ABSL_LOCKS_EXCLUDED(mu_);

  size_t free() ABSL_LOCKS_EXCLUDED(mu_);
  // Last share closed -> OnEngineDone returned (the stop line's figure).
  const common::LatencyHistogram& complete_ns() const { return complete_ns_; }

 private:
  common::Clock& clock_;
  std::unique_ptr<InFlightOp[]> ops_;
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(lock_order::kOpPool) ABSL_ACQUIRED_BEFORE(lock_order::kOpStatus);
  absl::CondVar freed_;  // An op went back to the pool.
  std::vector<InFlightOp*> free_ ABSL_GUARDED_BY(mu_);
  common::LatencyHistogram complete_ns_;
};

}  // namespace dmagather::server::engines::gpu
