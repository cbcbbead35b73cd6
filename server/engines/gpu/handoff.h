// Handoff<T>: a bounded FIFO from any thread to one taking thread, which
// polls a while (yielding the core between polls) before it sleeps, so that
// the items of a burst cost no wake-up; a post wakes it only when asleep,
// and counts that. The GPU engine hands each device's shares to its issuing
// thread and its ended shares to its completion thread through one each.
//
// An item stays counted as pending (Pending) until the taker is done with
// it (Done), so a drain that waits for Pending() == 0 waits for the work
// itself, not only for the queue.
//
// Threads: Post from any thread (waits while full); Wait, Front, Take, Done
// on the one taking thread; Stop and Pending from any thread. Its mutex is
// level kHandoff of the engine's lock order (lock_order.h).
#pragma once

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "server/engines/gpu/lock_order.h"

namespace dmagather::server::engines::gpu {

template <typename T>
class Handoff {
 public:
  Handoff(size_t slots, common::Clock& clock, uint64_t spin_ns)
      : ring_(slots), slots_(slots), clock_(clock), spin_ns_(spin_ns) {}

  void Post(const T& item) ABSL_LOCKS_EXCLUDED(mu_) {
    bool wake = false;
    {
      absl::MutexLock lock(&mu_);
      while (tail_ - head_ >= slots_) space_.Wait(&mu_);
      ring_[tail_ % slots_] = item;
      ++tail_;
      posted_.store(tail_, std::memory_order_release);
      wake = sleeping_;
    }
    if (wake) {
      wakeups_.fetch_add(1, std::memory_order_relaxed);
      work_.Signal();
    }
  }

  // Taker: until an item is there (spin, then sleep). False: stopped with
  // nothing left.
  bool Wait() ABSL_LOCKS_EXCLUDED(mu_) {
    const uint64_t idle_since = clock_.NowNs();
    while (posted_.load(std::memory_order_acquire) == taken_ && !stop_.load(std::memory_order_relaxed) &&
           clock_.NowNs() - idle_since < spin_ns_) {
      sched_yield();
    }
    absl::MutexLock lock(&mu_);
    sleeping_ = true;
    while (head_ == tail_ && !stop_.load()) work_.Wait(&mu_);
    sleeping_ = false;
    return head_ != tail_;
  }
  // Taker: the oldest item, left in the queue (and pending) until Pop.
  T Front() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return ring_[head_ % slots_];
  }
  void Pop() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      taken_ = ++head_;
    }
    space_.Signal();
  }
  // Taker: moves every item there is (up to `max` in hand) into `out`; they
  // stay pending until Done.
  void Take(std::vector<T>* out, size_t max) ABSL_LOCKS_EXCLUDED(mu_) {
    bool took = false;
    {
      absl::MutexLock lock(&mu_);
      while (head_ != tail_ && out->size() < max) {
        out->push_back(ring_[head_ % slots_]);
        ++head_;
        in_hand_.fetch_add(1, std::memory_order_acq_rel);
        took = true;
      }
      taken_ = head_;
    }
    if (took) space_.SignalAll();
  }
  void Done() { in_hand_.fetch_sub(1, std::memory_order_acq_rel); }

  // Items posted and not yet done with.
  size_t Pending() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return static_cast<size_t>(tail_ - head_) + in_hand_.load(std::memory_order_acquire);
  }
  void Stop() ABSL_LOCKS_EXCLUDED(mu_) {
    {
      absl::MutexLock lock(&mu_);
      stop_.store(true);
    }
    work_.SignalAll();
  }
  bool stopping() const { return stop_.load(std::memory_order_relaxed); }
  // The taker sleeps on the condition variable (tests).
  bool asleep() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return sleeping_;
  }
  uint64_t wakeups() const { return wakeups_.load(std::memory_order_relaxed); }

 private:
  absl::Mutex mu_ ABSL_ACQUIRED_AFTER(lock_order::kHandoff) ABSL_ACQUIRED_BEFORE(lock_order::kEndEvents);
  absl::CondVar work_;   // An item was posted / stop.
  absl::CondVar space_;  // A slot was freed.
  std::vector<T> ring_ ABSL_GUARDED_BY(mu_);
  const size_t slots_;
  uint64_t head_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t tail_ ABSL_GUARDED_BY(mu_) = 0;
  bool sleeping_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<uint64_t> posted_{0};  // tail_, published for the taker's spin.
  uint64_t taken_ = 0;               // head_ as the taker last set it (its own).
  std::atomic<size_t> in_hand_{0};
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> wakeups_{0};
  common::Clock& clock_;
  const uint64_t spin_ns_;
};

}  // namespace dmagather::server::engines::gpu
