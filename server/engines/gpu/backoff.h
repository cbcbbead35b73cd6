// How the GPU engine's threads poll (an event, a flag, an earlier op's
// enqueue): spin first (a sleep costs ~60 us of timer slack), yield after
// 200 us, sleep 50 us between polls only after 5 ms.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <cstdint>

#include "common/cpu_relax.h"

namespace dmagather::server::engines::gpu {

inline void Backoff(uint64_t waited_ns) {
  if (waited_ns < 200'000) {
    for (int i = 0; i < 32; ++i) common::CpuRelax();
  } else if (waited_ns < 5'000'000) {
    sched_yield();
  } else {
    usleep(50);
  }
}

}  // namespace dmagather::server::engines::gpu
