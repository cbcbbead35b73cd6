// A good job's rank (robustness.h): random ops, every output checked.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "bench/robustness/robustness.h"

namespace dmagather::bench::robustness {

// Random ops (flat out-of-place, flat in place, list) of random dtype and
// shard size in [min_bytes, max_bytes] (log-uniform), every output checked
// byte by byte against the pattern. Returns the exit code.
int GoodRank(const std::string& socket, const std::string& job, int world, int rank, size_t min_bytes, size_t max_bytes,
             uint64_t seed, GoodJob* g) {
  Comm comm(socket.c_str(), job, world, rank);
  if (!comm.ok()) {
    g->Say(absl::StrCat("good job ", job, " rank ", rank, " init: ", comm.error()));
    return 2;
  }
  char* send = static_cast<char*>(comm.Alloc(max_bytes));
  char* recv = static_cast<char*>(comm.Alloc(max_bytes * world));
  if (send == nullptr || recv == nullptr) {
    g->Say(absl::StrCat("good job rank ", rank, " alloc: ", comm.error()));
    return 2;
  }
  g->joined.fetch_add(1);
  std::vector<char> want(max_bytes);
  static constexpr dmagather_dtype_t kTypes[] = {DMAGATHER_UINT8, DMAGATHER_FLOAT16, DMAGATHER_BFLOAT16,
                                                 DMAGATHER_FLOAT32, DMAGATHER_INT64};
  static constexpr size_t kSizes[] = {1, 2, 2, 4, 8};
  const double lmin = std::log2(double(min_bytes)), lmax = std::log2(double(max_bytes));
  for (int64_t op = 0;; ++op) {
    if (rank == 0 && g->stop.load() && g->stop_at.load() < 0) g->stop_at.store(op + 1);
    const int64_t stop_at = g->stop_at.load();
    if (stop_at >= 0 && op >= stop_at) break;
    uint64_t x = seed ^ (uint64_t(op) * 0x9e3779b97f4a7c15ull);
    const uint64_t r1 = SplitMix64(x), r2 = SplitMix64(x), r3 = SplitMix64(x);
    const int t = int(r1 % 5);
    const double l = lmin + (lmax - lmin) * double(r2 % 1000001) / 1e6;
    const size_t count = std::max<size_t>(1, size_t(std::exp2(l)) / kSizes[t]);
    const size_t shard = count * kSizes[t];
    const int variant = int(r3 % 3);  // 0 out of place, 1 in place, 2 list.
    const uint64_t pseed = seed * 1000003 + op;
    dmagather_status_t st;
    if (variant == 1) {
      FillPattern(recv + rank * shard, shard, pseed, rank);
      st = comm.AllGather(recv + rank * shard, recv, count, kTypes[t]);
    } else {
      FillPattern(send, shard, pseed, rank);
      if (variant == 0) {
        st = comm.AllGather(send, recv, count, kTypes[t]);
      } else {
        std::vector<void*> outs(world);
        for (int r = 0; r < world; ++r) outs[r] = recv + r * shard;
        st = comm.AllGatherList(send, outs, count, kTypes[t]);
      }
    }
    if (st == DMAGATHER_OK) st = comm.Wait();
    if (st != DMAGATHER_OK) {
      g->failed_ops.fetch_add(1);
      g->Say(absl::StrFormat("good job %s rank %d op %d: %s: %s", job, rank, op, dmagather_status_string(st),
                             comm.error()));
      return 1;
    }
    for (int r = 0; r < world; ++r) {
      FillPattern(want.data(), shard, pseed, r);
      const char* got = recv + r * shard;
      if (std::memcmp(got, want.data(), shard) != 0) {
        uint64_t bad = 0;
        for (size_t i = 0; i < shard; ++i) bad += got[i] != want[i];
        g->bad_bytes.fetch_add(bad);
        g->Say(absl::StrFormat("good job %s rank %d op %d: %u bad bytes in rank %d's shard", job, rank, op, bad, r));
      }
    }
    g->bytes_checked.fetch_add(shard * world);
    g->progress.fetch_add(1);
    if (rank == 0) {
      g->done_ns[op % GoodJob::kDoneTimes].store(MonotonicNs());
      g->ops.fetch_add(1);
    }
  }
  return 0;
}

}  // namespace dmagather::bench::robustness
