// FakeClock: a common::Clock (common/clock.h) that moves only when a test
// says, so timeouts, sweeps, expiry and heartbeats are decided by moved time
// instead of sleeping. Test-only; the product uses common::RealClock().
//
// Thread-safe: any thread may read it while the test thread Advance()s it.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "common/clock.h"

namespace dmagather::common::testing {

// Starts at a non-zero instant so "0 means unset" stamps stay
// distinguishable.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(uint64_t start_ns = 1'000'000'000ull) : now_(start_ns) {}
  uint64_t NowNs() const override { return now_.load(std::memory_order_acquire); }
  void Advance(absl::Duration d) { now_.fetch_add(uint64_t(absl::ToInt64Nanoseconds(d)), std::memory_order_acq_rel); }
  void AdvanceNs(uint64_t ns) { now_.fetch_add(ns, std::memory_order_acq_rel); }

 private:
  std::atomic<uint64_t> now_;
};

}  // namespace dmagather::common::testing
