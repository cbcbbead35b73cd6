#include "tests/support/verify.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_format.h"

namespace dmagather::support {

void RankSync::Barrier(int world) {
  const int gen = generation.load(std::memory_order_acquire);
  if (arrived.fetch_add(1) + 1 == world) {
    arrived.store(0);
    generation.fetch_add(1, std::memory_order_release);
    return;
  }
  for (int i = 0; generation.load(std::memory_order_acquire) == gen; ++i) {
    if (failures.load() != 0) return;
    if (i > 200) sched_yield();
    if (i > 100000) usleep(50);
  }
}

int ForkRanks(int world, const std::function<int(int)>& rank) {
  std::vector<pid_t> kids;
  for (int r = 0; r < world; ++r) {
    pid_t pid = fork();
    if (pid == 0) _exit(rank(r));
    kids.push_back(pid);
  }
  int bad = 0;
  for (pid_t p : kids) {
    int st = 0;
    waitpid(p, &st, 0);
    bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
  }
  return bad;
}

int FirstWrongShard(const char* out, size_t shard, int world, uint64_t seed, char* scratch) {
  for (int r = 0; r < world; ++r) {
    FillPattern(scratch, shard, seed, r);
    if (std::memcmp(out + r * shard, scratch, shard) != 0) return r;
  }
  return -1;
}

void FillPattern(char* dst, size_t bytes, uint64_t seed, int rank) {
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

const char* VariantName(Variant v) {
  switch (v) {
    case Variant::kOutOfPlace:
      return "out-of-place";
    case Variant::kInPlace:
      return "in-place";
    case Variant::kList:
      return "list";
    case Variant::kOffsets:
      return "offsets";
  }
  return "?";
}

bool CheckAllGather(Comm& comm, char* sendbuf, char* recvbuf, dmagather_dtype_t dtype, size_t count, Variant variant,
                    uint64_t seed, std::vector<char>* scratch, std::string* why) {
  const int world = comm.size(), rank = comm.rank();
  const size_t es = dmagather_dtype_size(dtype), shard = count * es;
  const size_t offset = variant == Variant::kOffsets ? 4096 + 3 * es : 0;  // Misaligned inside the allocation.
  char* recv = recvbuf + offset;
  char* send = variant == Variant::kInPlace ? recv + rank * shard : sendbuf + offset;
  std::vector<char>& expect = *scratch;
  expect.resize(shard * world);
  for (int r = 0; r < world; ++r) FillPattern(expect.data() + r * shard, shard, seed, r);
  std::memset(recvbuf, 0xA5, shard * world + offset + 64);  // Poison.
  std::memcpy(send, expect.data() + rank * shard, shard);
  dmagather_status_t st;
  if (variant == Variant::kList) {
    std::vector<void*> outs(world);
    for (int r = 0; r < world; ++r) outs[r] = recv + r * shard;
    st = comm.AllGatherList(send, outs, count, dtype);
  } else {
    st = comm.AllGather(send, recv, count, dtype);
  }
  if (st == DMAGATHER_OK) st = comm.Wait();
  if (st != DMAGATHER_OK) {
    *why = absl::StrFormat("rank %d %s count=%u %s: %s: %s", rank, dmagather_dtype_name(dtype), count,
                           VariantName(variant), dmagather_status_string(st), comm.error());
    return false;
  }
  if (std::memcmp(recv, expect.data(), shard * world) != 0) {
    size_t i = 0;
    while (recv[i] == expect[i]) ++i;
    *why = absl::StrFormat("rank %d %s count=%u %s: first wrong byte at %u (shard of rank %u)", rank,
                           dmagather_dtype_name(dtype), count, VariantName(variant), i, i / std::max<size_t>(shard, 1));
    return false;
  }
  return true;
}

}  // namespace dmagather::support
