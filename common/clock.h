// Monotonic clock in nanoseconds (CLOCK_MONOTONIC is shared by all processes
// of the node, so client submit stamps and daemon stamps compare).
#pragma once

#include <time.h>

#include <cstdint>

namespace dmagather::common {

inline uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

}  // namespace dmagather::common
