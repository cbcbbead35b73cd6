// Lockstep: the GPU engine's cross-device order. Ops go out in lockstep
// across devices: no device enqueues anything of op n (its ready waits
// first) before every device has enqueued all of op n - 1, so no device's
// queue holds an op whose predecessor some other device has yet to issue
// (docs/CUDA.md, "Locks and waits", rule 2). One thread issuing every
// device keeps it by itself; with an issuing thread per device each waits
// here (WaitForEarlier), holding no lock.
//
// Threads: Next on the routing thread (under the issue lock, so orders
// follow the routing); WaitForEarlier and Enqueued on the issuing threads.
// Lock-free: one atomic, polled with backoff.h's back-off.
#pragma once

#include <atomic>
#include <cstdint>

#include "common/clock.h"
#include "server/engines/gpu/backoff.h"

namespace dmagather::server::engines::gpu {

class Lockstep {
 public:
  // `abandon`: set when the engine stops waiting for the GPU; a wait then
  // returns at once.
  Lockstep(common::Clock& clock, const std::atomic<bool>& abandon) : clock_(clock), abandon_(abandon) {}

  // The next op's place in the order: 1, 2, ...
  uint64_t Next() { return ++next_; }
  // Until every share of the op before `order` is enqueued (or abandon).
  void WaitForEarlier(uint64_t order) const {
    if (order <= 1) return;
    const uint64_t t0 = clock_.NowNs();
    while (enqueued_through_.load(std::memory_order_acquire) < order - 1 && !abandon_.load(std::memory_order_relaxed)) {
      Backoff(clock_.NowNs() - t0);
    }
  }
  // Every share of the op at `order` is enqueued.
  void Enqueued(uint64_t order) { enqueued_through_.store(order, std::memory_order_release); }
  uint64_t enqueued_through() const { return enqueued_through_.load(std::memory_order_acquire); }

 private:
  common::Clock& clock_;
  const std::atomic<bool>& abandon_;
  uint64_t next_ = 0;  // Routing thread only.
  std::atomic<uint64_t> enqueued_through_{0};
};

}  // namespace dmagather::server::engines::gpu
