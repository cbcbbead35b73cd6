// Lock-free latency histogram: log-linear buckets (8 per power of two, so a
// percentile is within ~9% of the true value). Record() is called from the
// per-op path (one relaxed atomic add); Summary() from telemetry threads.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace dmagather::common {

struct LatencySummaryNs {
  double p50 = 0, p99 = 0, max = 0;
  uint64_t count = 0;
};

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 3;
  static constexpr int kBuckets = (64 - kSubBits + 1) << kSubBits;

  void Record(uint64_t ns);
  LatencySummaryNs Summary() const;
  // Value at quantile q in [0,1] (upper edge of the bucket), in ns.
  double Quantile(double q) const;
  void Merge(const LatencyHistogram& o);

  static int BucketOf(uint64_t ns);
  static uint64_t BucketUpper(int b);

 private:
  std::array<std::atomic<uint64_t>, kBuckets> buckets_{};
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> max_{0};
};

}  // namespace dmagather::common
