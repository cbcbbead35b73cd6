#include "server/service/wait_spin.h"

#include <sched.h>

namespace dmagather::server::service {

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  const int n = CPU_COUNT(&set);
  return n > 0 ? n : 1;
}

uint32_t AdvisedWaitSpin(int cpus, int sessions) {
  return cpus >= sessions + 2 ? kWaitSpinSpareCores : 0;
}

}  // namespace dmagather::server::service
