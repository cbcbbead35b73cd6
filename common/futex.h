// Process-shared futex wait/wake on 32-bit words in shared memory (the
// doorbell and the completion flags). Used only after a spin phase, so the
// fast path makes no system call.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdint>

#include "common/cpu_relax.h"

namespace dmagather::common {

// Sleeps while *word == expected, at most timeout_ns. Spurious wake-ups are
// fine: callers re-check their condition.
inline void FutexWait(uint32_t* word, uint32_t expected, uint64_t timeout_ns) {
  timespec ts{static_cast<time_t>(timeout_ns / 1000000000ull), static_cast<long>(timeout_ns % 1000000000ull)};
  syscall(SYS_futex, word, FUTEX_WAIT, expected, &ts, nullptr, 0);
}

inline void FutexWakeAll(uint32_t* word) { syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0); }

// Exponential back-off for polling loops: spin, then yield, then short sleeps.
class Backoff {
 public:
  explicit Backoff(uint32_t spins = 4096, uint32_t yields = 64) : spins_(spins), yields_(yields) {}
  // Returns true once the caller should block (futex) instead of polling.
  bool Pause() {
    if (n_ < spins_) {
      ++n_;
      CpuRelax();
      return false;
    }
    if (n_ < spins_ + yields_) {
      ++n_;
      sched_yield_();
      return false;
    }
    return true;
  }
  void Reset() { n_ = 0; }

 private:
  static void sched_yield_() { syscall(SYS_sched_yield); }
  uint32_t spins_;
  uint32_t yields_;
  uint32_t n_ = 0;
};

}  // namespace dmagather::common
