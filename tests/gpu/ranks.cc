#include "tests/gpu/ranks.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tests/support/verify.h"

namespace dmagather::testing {
namespace {

std::vector<std::string> SplitCommas(const char* text) {
  std::vector<std::string> list;
  for (const char *p = text, *q; *p != '\0'; p = *q ? q + 1 : q) {
    q = strchr(p, ',');
    if (q == nullptr) q = p + strlen(p);
    list.emplace_back(p, q);
  }
  return list;
}

// Rank r's environment and device, before its first CUDA call but the count.
void Place(int r) {
  if (const char* socks = getenv("DMAGATHER_TEST_SOCKETS"); socks != nullptr && *socks != '\0') {
    const std::vector<std::string> list = SplitCommas(socks);
    setenv("DMAGATHER_SOCKET", list[r % list.size()].c_str(), 1);
  }
  if (const char* vis = getenv("DMAGATHER_TEST_RANK_VISIBLE"); vis != nullptr && *vis != '\0') {
    const std::vector<std::string> list = SplitCommas(vis);
    setenv("CUDA_VISIBLE_DEVICES", list[r % list.size()].c_str(), 1);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 1) cudaSetDevice(r % devices);
}

}  // namespace

int LaunchRanks(int world, const std::function<int(int, int)>& fn) {
  return support::ForkRanks(world, [&](int r) {
    Place(r);
    const int rc = fn(r, world);
    fflush(stdout);
    fflush(stderr);
    return rc;
  });
}

}  // namespace dmagather::testing
