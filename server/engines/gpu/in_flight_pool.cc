// InFlightPool: see in_flight_pool.h.
#include "server/engines/gpu/in_flight_pool.h"

namespace dmagather::server::engines::gpu {

InFlightPool::InFlightPool(size_t size, common::Clock& clock) : clock_(clock), ops_(new InFlightOp[size]) {
  absl::MutexLock lock(&mu_);
  free_.reserve(size);
  for (size_t i = 0; i < size; ++i) free_.push_back(&ops_[i]);
}

InFlightOp* InFlightPool::Take() {
  absl::MutexLock lock(&mu_);
  while (free_.empty()) freed_.Wait(&mu_);
  InFlightOp* t = free_.back();
  free_.pop_back();
  return t;
}

void InFlightPool::Close(InFlightOp* t, const absl::Status& st) {
  if (!t->Close(st)) return;
  InFlightOp::Ending e = t->TakeEnding();
  {
    absl::MutexLock lock(&mu_);
    free_.push_back(t);
  }
  freed_.Signal();
  const uint64_t t_seen = clock_.NowNs();
  e.op->OnEngineDone(e.status);
  complete_ns_.Record(clock_.NowNs() - t_seen);
  // After OnEngineDone: an op that failed at issue has its error record
  // written now. The gate polls the load.
  JobLoads::End(e.load, e.waits_ahead, e.failed_at_issue);
}

size_t InFlightPool::free() {
  absl::MutexLock lock(&mu_);
  return free_.size();
}

}  // namespace dmagather::server::engines::gpu
