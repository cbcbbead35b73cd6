// Time for the daemon and the client: one seam every timeout, sweep and
// poller reads through, so tests move time instead of sleeping.
//
// MonotonicNs() is CLOCK_MONOTONIC, shared by all processes of the node (client
// submit stamps and daemon stamps compare). Code that decides on time (op
// timeouts, ticket expiry, reaper sweeps, ring heartbeats) takes a `Clock&`
// (RealClock() in production); tests pass a FakeClock (tests/fakes/fake_clock.h)
// and Advance() it.
// Latency figures may keep reading MonotonicNs() directly: they are measured,
// never decided on.
#pragma once

#include <time.h>

#include <chrono>
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
  // The same instant as an absl::Time (for deadlines written in absl time).
  // Only differences are meaningful: it is no wall-clock time, so never an
  // absl::Mutex/CondVar deadline; a thread that sleeps until a deadline
  // waits with a timeout (real time) and decides on the clock when it wakes.
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

// A gRPC deadline (a call's, the server's Shutdown) `d` from now. gRPC's own
// timers enforce it on the system clock, so no Clock can move it: use it for
// how long gRPC may take, never for a verdict of ours.
inline std::chrono::system_clock::time_point GrpcDeadlineIn(absl::Duration d) {
  return std::chrono::system_clock::now() + absl::ToChronoMilliseconds(d);
}

}  // namespace dmagather::common
