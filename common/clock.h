// Time for the daemon and the client: one seam every timeout, sweep and
// poller reads through, so tests move time instead of sleeping.
//
// MonotonicNs() is CLOCK_MONOTONIC, shared by all processes of the node (client
// submit stamps and daemon stamps compare). Code that decides on time (op
// timeouts, ticket expiry, reaper sweeps, ring heartbeats) takes a `Clock&`
// (RealClock() in production); tests pass a FakeClock and Advance() it.
// Latency figures may keep reading MonotonicNs() directly: they are measured,
// never decided on.
#pragma once

#include <time.h>

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"

namespace dmagather::common {

inline uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

// Thread-safe; implementations are shared by every thread of a process.
class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds (an arbitrary epoch).
  virtual uint64_t NowNs() const = 0;
  // The same instant as an absl::Time (for absl::Mutex/CondVar deadlines and
  // code written in absl time). Only differences are meaningful.
  absl::Time Now() const { return absl::UnixEpoch() + absl::Nanoseconds(int64_t(NowNs())); }
};

// CLOCK_MONOTONIC.
class SystemClock final : public Clock {
 public:
  uint64_t NowNs() const override { return MonotonicNs(); }
};

// The process-wide real clock.
inline Clock& RealClock() {
  static SystemClock* clock = new SystemClock;
  return *clock;
}

// A clock that moves only when told. Starts at a non-zero instant so "0 means
// unset" stamps stay distinguishable.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(uint64_t start_ns = 1'000'000'000ull) : now_(start_ns) {}
  uint64_t NowNs() const override { return now_.load(std::memory_order_acquire); }
  void Advance(absl::Duration d) { now_.fetch_add(uint64_t(absl::ToInt64Nanoseconds(d)), std::memory_order_acq_rel); }
  void AdvanceNs(uint64_t ns) { now_.fetch_add(ns, std::memory_order_acq_rel); }

 private:
  std::atomic<uint64_t> now_;
};

}  // namespace dmagather::common
