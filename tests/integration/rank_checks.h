// Helpers shared by the integration tests whose rank processes report
// through a Reporter (harness.h): REQUIRE, pages shared across fork, a
// polling wait, and the bit-exact AllGather output check.
#pragma once

#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/verify.h"

namespace dmagather::testing {

// In a rank function (with `rep` a Reporter): fails the rank with a
// message naming the line.
#define REQUIRE(cond, msg)                                                 \
  do {                                                                     \
    if (!(cond)) {                                                         \
      rep.Say(absl::StrCat("line ", __LINE__, ": ", #cond, ": ", (msg))); \
      return 1;                                                            \
    }                                                                      \
  } while (0)

// A T in memory shared with the processes forked after this call.
template <typename T>
T* SharedPage() {
  void* p = mmap(nullptr, sizeof(T), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  return new (p) T();
}

template <typename T>
void FreeSharedPage(T* p) {
  p->~T();
  munmap(p, sizeof(T));
}

// Polls (sleeping 1 ms) until pred() or `seconds` pass; returns pred().
template <typename Pred>
bool WaitFor(Pred pred, double seconds = 30) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

inline bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// First byte offset where the output of an AllGather of `shard` bytes per
// rank (rank r's shard = FillPattern(seed, r)) differs, or -1.
inline long FirstMismatch(const char* out, size_t shard, int world, uint64_t seed) {
  std::vector<char> want(shard);
  for (int r = 0; r < world; ++r) {
    bench::FillPattern(want.data(), shard, seed, r);
    if (std::memcmp(out + r * shard, want.data(), shard) == 0) continue;
    for (size_t i = 0; i < shard; ++i) {
      if (out[r * shard + i] != want[i]) return long(r * shard + i);
    }
  }
  return -1;
}

}  // namespace dmagather::testing
