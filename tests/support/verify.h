// Deterministic test data and the bit-exact AllGather check shared by the
// main job (allgather_perf) and the integration tests. Every rank can
// compute every other rank's shard, so outputs are checked without
// communication.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "dmagather/client.h"

namespace dmagather::support {

inline uint64_t SplitMix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Runs rank(r) for r in [0, world) in forked processes (each exits with
// its return value) and returns how many failed (non-zero exit or signal).
int ForkRanks(int world, const std::function<int(int)>& rank);

// What the forked ranks of a benchmark share (placed in a MAP_SHARED page):
// a barrier and the first failure.
struct RankSync {
  std::atomic<int> arrived;
  std::atomic<int> generation;
  std::atomic<int> failures;
  char why[512];
  // Spins briefly, then yields, then naps (ranks on an oversubscribed
  // machine must not starve each other); returns early once a rank failed.
  void Barrier(int world);
  void Fail(const std::string& message) {
    if (failures.fetch_add(1) == 0) std::snprintf(why, sizeof(why), "%s", message.c_str());
  }
};

// Fills `bytes` with the pattern of (seed, rank).
void FillPattern(char* dst, size_t bytes, uint64_t seed, int rank);

// The first rank r whose shard r of an AllGather output `out` (world shards
// of `shard` bytes) is not FillPattern(seed, r); -1 when all are. `scratch`
// holds at least `shard` bytes.
int FirstWrongShard(const char* out, size_t shard, int world, uint64_t seed, char* scratch);

enum class Variant {
  kOutOfPlace,  // send and recv are separate buffers.
  kInPlace,     // send == recv + rank*count.
  kList,        // one output pointer per rank.
  kOffsets,     // send and recv at odd offsets inside their allocations.
};
inline constexpr Variant kAllVariants[] = {Variant::kOutOfPlace, Variant::kInPlace, Variant::kList, Variant::kOffsets};
const char* VariantName(Variant v);

// Runs one AllGather of `count` elements per rank (send from `sendbuf`,
// output into `recvbuf`, both from comm.Alloc with room for
// world*count*size + 8 KiB), waits, and compares the output bit-exact with
// the reference; poisons the output first. On failure *why says where.
bool CheckAllGather(Comm& comm, char* sendbuf, char* recvbuf, dmagather_dtype_t dtype, size_t count, Variant variant,
                    uint64_t seed, std::vector<char>* scratch, std::string* why);

}  // namespace dmagather::support
