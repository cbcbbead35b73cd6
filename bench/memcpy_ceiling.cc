// Copy-bandwidth ceiling of this machine for the host backend: memcpy of
// 256 MiB between shm (memfd) buffers, 1 and 2 threads, best of 5.
//   g++ -O2 -pthread bench/memcpy_ceiling.cc -o /tmp/memcpy_ceiling && /tmp/memcpy_ceiling
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>
char* ShmBuf(size_t n) {
  int fd = memfd_create("x", 0);
  ftruncate(fd, n);
  char* p = (char*)mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  memset(p, 1, n);
  return p;
}
int main() {
  const size_t n = 256u << 20;
  for (int threads : {1, 2}) {
    std::vector<char*> src, dst;
    for (int t = 0; t < threads; ++t) {
      src.push_back(ShmBuf(n));
      dst.push_back(ShmBuf(n));
    }
    double best = 1e9;
    for (int it = 0; it < 5; ++it) {
      auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> ts;
      for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { memcpy(dst[t], src[t], n); });
      for (auto& t : ts) t.join();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    printf("%d thread(s): shm memcpy %.2f GB/s copied\n", threads, threads * n / best / 1e9);
  }
}
