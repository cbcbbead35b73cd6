#include "server/engines/gpu/job_loads.h"

namespace dmagather::server::engines::gpu {

JobLoads::Load* JobLoads::Of(uint64_t job) {
  auto it = loads_.find(job);
  if (it != loads_.end()) return it->second.get();
  if (loads_.size() >= 1024) {  // Drop the idle ones (End's decrement of in_flight is its last touch).
    for (auto i = loads_.begin(); i != loads_.end();) {
      if (i->second->in_flight.load(std::memory_order_acquire) == 0) {
        i = loads_.erase(i);
      } else {
        ++i;
      }
    }
  }
  return loads_.emplace(job, std::make_unique<Load>()).first->second.get();
}

JobLoads::Load* JobLoads::Begin(uint64_t job, bool waits_ahead) {
  absl::MutexLock lock(&mu_);
  Load* load = Of(job);
  if (waits_ahead) load->waits_ahead.fetch_add(1, std::memory_order_acq_rel);
  load->in_flight.fetch_add(1, std::memory_order_acq_rel);
  return load;
}

void JobLoads::End(Load* load, bool waits_ahead, bool failed_at_issue) {
  if (failed_at_issue) load->unsettled_errors.fetch_sub(1, std::memory_order_acq_rel);
  if (waits_ahead) load->waits_ahead.fetch_sub(1, std::memory_order_acq_rel);
  load->in_flight.fetch_sub(1, std::memory_order_acq_rel);  // The last touch.
}

bool JobLoads::MayIssue(uint64_t job, bool ranks_ready, int bound) {
  if (bound <= 0) return true;
  absl::MutexLock lock(&mu_);
  const Load& load = *Of(job);
  if (load.in_flight.load(std::memory_order_acquire) < bound) return true;
  return ranks_ready && load.waits_ahead.load(std::memory_order_acquire) == 0;
}

int JobLoads::Finisher(Load* load, int first) {
  absl::MutexLock lock(&mu_);
  if (load->finisher < 0) load->finisher = first;
  return load->finisher == first ? first : -1;
}

size_t JobLoads::size() {
  absl::MutexLock lock(&mu_);
  return loads_.size();
}

}  // namespace dmagather::server::engines::gpu
