// How long a waiting rank should spin before it sleeps, advised by the daemon
// in its Join reply (JoinReply.wait_spin).
//
// A rank waiting for its op's done flag first polls it (a CPU pause per poll),
// then sleeps on the futex. Polling answers in well under a microsecond; a
// futex wake costs the daemon a system call and the rank a trip through the
// scheduler. But a polling rank holds a core: on a node with fewer cores than
// ranks plus the daemon's ingress thread, it takes the core the daemon needs
// to copy. Measured (docs/PERFORMANCE.md "Small AllGathers", 4 KiB shards):
// 16 cores, 4 ranks: 11 us per op spinning 4096 polls vs 21 us with 256;
// 2 cores, 4 ranks: 35-41 us sleeping at once vs 52-69 us with 256.
//
// The advice is computed once per Join, from the ranks the daemon serves at
// that moment; a rank keeps it for its session.
//
// Threads: any.
#pragma once

#include <cstdint>
#include <string>

namespace dmagather::server::service {

// Polls advised when every rank has a core and the daemon two (~0.2 ms).
inline constexpr uint32_t kWaitSpinSpareCores = 4096;

// CPUs this process may use: its affinity mask, lowered by its cgroup's CPU
// quota (cgroup v2 cpu.max, e.g. systemd CPUQuota= or a container limit);
// at least 1.
int UsableCpus();

// The CPUs a cgroup v2 cpu.max line allows ("200000 100000" -> 2, rounded
// up); 0 when it sets no limit ("max ...") or cannot be read.
int CpusFromCpuMax(const std::string& line);

// The advice for `sessions` ranks served on `cpus` CPUs: kWaitSpinSpareCores
// when cpus >= sessions + 2, else 0 (sleep at once).
uint32_t AdvisedWaitSpin(int cpus, int sessions);

}  // namespace dmagather::server::service
