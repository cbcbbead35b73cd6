// EndEvents: one device's pool of end events (the event that closes a
// device's share of an op). Taken by the thread that issues the device's
// shares, given back by the device's completion thread once the share's
// end was seen; a new event is made when the pool is empty. The free ones
// are destroyed with the pool.
//
// Threads: Take on the device's issuing thread; Give on it or on the
// device's completion thread; Fill and the destructor on the engine's
// start-up / stop thread. The free list is guarded by the pool's mutex
// (level kEndEvents, the last of lock_order.h), held for a push or a pop.
#pragma once

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "server/engines/gpu/lock_order.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu {

class EndEvents {
 public:
  EndEvents(GpuRuntime& runtime, int device) : runtime_(runtime), device_(device) {}
  ~EndEvents() ABSL_LOCKS_EXCLUDED(mu_);
  EndEvents(const EndEvents&) = delete;
  EndEvents& operator=(const EndEvents&) = delete;

  // Makes `n` events for the pool.
  absl::Status Fill(int n) ABSL_LOCKS_EXCLUDED(mu_);
  // A free event, else a new one; null when none can be made.
  GpuEvent Take() ABSL_LOCKS_EXCLUDED(mu_);
  void Give(GpuEvent e) ABSL_LOCKS_EXCLUDED(mu_);
  size_t free() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  GpuRuntime& runtime_;
  const int device_;
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(lock_order::kEndEvents) ABSL_ACQUIRED_BEFORE(lock_order::kLast);
  std::vector<GpuEvent> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dmagather::server::engines::gpu
