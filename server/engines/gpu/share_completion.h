// ShareCompletion: one device's completion - the FIFO of the device's
// shares enqueued on the GPU and the thread that sees them end. The thread
// polls every share it holds (a share parked on its job's ready flags
// delays no other), ends them in the order of their lane (share_poll.h:
// every job's ops end in order on each device), gives each end event back
// to the device's pool (end_events.h), drops the share's hold on its lane
// and closes the share of its op (InFlightPool::Close: the last close ends
// the op, the step after this one). Owned by the device's worker
// (device_worker.h), which posts to it.
//
// Threads: Post on the device's issuing thread; the loop on its own thread
// ("dmag-done-N"); Pending, Stop and the counters from the engine's
// thread. Locks: the FIFO's (kHandoff) for a post or a take, then, per
// ended share, the pool's (kEndEvents) and the op's (kOpStatus, kOpPool),
// one at a time (lock_order.h).
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>

#include "common/clock.h"
#include "server/engines/gpu/end_events.h"
#include "server/engines/gpu/handoff.h"
#include "server/engines/gpu/in_flight_pool.h"
#include "server/engines/gpu/lanes.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu {

// One device's share of an op: done when `end` has completed.
struct Share {
  InFlightOp* op = nullptr;
  GpuEvent end = nullptr;
  LaneSet::Lane* lane = nullptr;
};

class ShareCompletion {
 public:
  static constexpr size_t kSlots = 4096;

  // `abandon`: set when the engine stops waiting for the GPU; a share still
  // queued then fails. `awake_ns`: how long the thread polls after its last
  // work before it sleeps.
  ShareCompletion(int device, GpuRuntime& runtime, EndEvents& events, InFlightPool& ops, common::Clock& clock,
                  uint64_t awake_ns, const std::atomic<bool>& abandon);
  ~ShareCompletion();
  ShareCompletion(const ShareCompletion&) = delete;
  ShareCompletion& operator=(const ShareCompletion&) = delete;

  void Start();
  void Post(const Share& share) { shares_.Post(share); }
  // Shares posted and not ended yet.
  size_t Pending() { return shares_.Pending(); }
  // Stops the thread once it holds nothing, and joins it.
  void Stop();
  uint64_t wakeups() const { return shares_.wakeups(); }
  bool asleep() { return shares_.asleep(); }

 private:
  void Loop();

  const int device_;
  GpuRuntime& runtime_;
  EndEvents& events_;
  InFlightPool& ops_;
  common::Clock& clock_;
  const std::atomic<bool>& abandon_;
  Handoff<Share> shares_;
  std::thread thread_;
};

}  // namespace dmagather::server::engines::gpu
