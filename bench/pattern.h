// Deterministic pseudo-random test data: every rank can compute every other
// rank's shard, so outputs are checked bit-exact without communication.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace dmagather::bench {

inline uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

inline void FillPattern(char* dst, size_t bytes, uint64_t seed, int rank) {
  uint64_t s = seed * 0x100000001b3ull + uint64_t(rank) * 0x9e3779b97f4a7c15ull + 1;
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t v = SplitMix64(s);
    std::memcpy(dst + i, &v, 8);
  }
  if (i < bytes) {
    uint64_t v = SplitMix64(s);
    std::memcpy(dst + i, &v, bytes - i);
  }
}

}  // namespace dmagather::bench
