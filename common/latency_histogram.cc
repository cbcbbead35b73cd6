#include "common/latency_histogram.h"

#include <algorithm>

namespace dmagather::common {

int LatencyHistogram::BucketOf(uint64_t ns) {
  if (ns < (1u << kSubBits)) return static_cast<int>(ns);
  int msb = 63 - __builtin_clzll(ns);
  int shift = msb - kSubBits;
  int sub = static_cast<int>((ns >> shift) & ((1u << kSubBits) - 1));
  return ((shift + 1) << kSubBits) + sub;
}

uint64_t LatencyHistogram::BucketUpper(int b) {
  if (b < (1 << kSubBits)) return static_cast<uint64_t>(b);
  int shift = (b >> kSubBits) - 1;
  uint64_t sub = static_cast<uint64_t>(b & ((1 << kSubBits) - 1));
  uint64_t lo = ((uint64_t{1} << kSubBits) | sub) << shift;
  return lo + ((uint64_t{1} << shift) - 1);
}

void LatencyHistogram::Record(uint64_t ns) {
  buckets_[BucketOf(ns)].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  uint64_t m = max_.load(std::memory_order_relaxed);
  while (ns > m && !max_.compare_exchange_weak(m, ns, std::memory_order_relaxed)) {
  }
}

double LatencyHistogram::Quantile(double q) const {
  uint64_t total = 0;
  for (const auto& b : buckets_) total += b.load(std::memory_order_relaxed);
  if (total == 0) return 0;
  uint64_t rank = static_cast<uint64_t>(q * static_cast<double>(total - 1)) + 1;
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; ++i) {
    seen += buckets_[i].load(std::memory_order_relaxed);
    if (seen >= rank) {
      return static_cast<double>(std::min(BucketUpper(i), max_.load(std::memory_order_relaxed)));
    }
  }
  return static_cast<double>(max_.load(std::memory_order_relaxed));
}

LatencySummaryNs LatencyHistogram::Summary() const {
  LatencySummaryNs s;
  s.count = count_.load(std::memory_order_relaxed);
  s.p50 = Quantile(0.50);
  s.p99 = Quantile(0.99);
  s.max = static_cast<double>(max_.load(std::memory_order_relaxed));
  return s;
}

void LatencyHistogram::Merge(const LatencyHistogram& o) {
  for (int i = 0; i < kBuckets; ++i) {
    buckets_[i].fetch_add(o.buckets_[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  count_.fetch_add(o.count_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  uint64_t om = o.max_.load(std::memory_order_relaxed);
  uint64_t m = max_.load(std::memory_order_relaxed);
  while (om > m && !max_.compare_exchange_weak(m, om, std::memory_order_relaxed)) {
  }
}

}  // namespace dmagather::common
