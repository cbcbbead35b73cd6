#include "server/service/wait_spin.h"

#include <sched.h>

#include <fstream>
#include <sstream>

namespace dmagather::server::service {

int CpusFromCpuMax(const std::string& line) {
  std::istringstream in(line);
  std::string quota;
  long long period = 0;
  if (!(in >> quota >> period) || quota == "max" || period <= 0) return 0;
  long long q = 0;
  try {
    q = std::stoll(quota);
  } catch (...) {
    return 0;
  }
  if (q <= 0) return 0;
  return static_cast<int>((q + period - 1) / period);
}

namespace {

// cpu.max of this process's cgroup (v2: the "0::" line of /proc/self/cgroup).
std::string OwnCpuMax() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line;
  while (std::getline(cg, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    std::ifstream max("/sys/fs/cgroup" + line.substr(3) + "/cpu.max");
    std::string v;
    std::getline(max, v);
    return v;
  }
  return "";
}

}  // namespace

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  int n = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  const int quota = CpusFromCpuMax(OwnCpuMax());
  if (quota > 0 && quota < n) n = quota;
  return n > 0 ? n : 1;
}

uint32_t AdvisedWaitSpin(int cpus, int sessions) { return cpus >= sessions + 2 ? kWaitSpinSpareCores : 0; }

}  // namespace dmagather::server::service
