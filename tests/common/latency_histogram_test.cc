#include "common/latency_histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

namespace dmagather::common {
namespace {

TEST(LatencyHistogramTest, BucketsCoverEveryValueAndAreOrdered) {
  for (uint64_t v : {0ull, 1ull, 7ull, 8ull, 9ull, 1000ull, 123456789ull, ~0ull >> 1}) {
    int b = common::LatencyHistogram::BucketOf(v);
    EXPECT_GE(common::LatencyHistogram::BucketUpper(b), v) << v;
    if (b > 0) {
      EXPECT_LT(common::LatencyHistogram::BucketUpper(b - 1), v) << v;
    }
  }
}

TEST(LatencyHistogramTest, QuantilesWithinBucketErrorOfExact) {
  std::mt19937_64 rng(7);
  std::lognormal_distribution<double> dist(9.0, 1.2);  // ~8 us median, long tail.
  std::vector<uint64_t> v;
  common::LatencyHistogram h;
  for (int i = 0; i < 100000; ++i) {
    uint64_t x = static_cast<uint64_t>(dist(rng));
    v.push_back(x);
    h.Record(x);
  }
  std::sort(v.begin(), v.end());
  for (double q : {0.5, 0.9, 0.99}) {
    double exact = double(v[size_t(q * (v.size() - 1))]);
    double got = h.Quantile(q);
    EXPECT_GE(got, exact) << q;         // Upper edge of the bucket...
    EXPECT_LE(got, exact * 1.13) << q;  // ...at most one 1/8-octave bucket above.
  }
  common::LatencySummaryNs s = h.Summary();
  EXPECT_EQ(s.count, 100000u);
  EXPECT_EQ(s.max, double(v.back()));
}

TEST(LatencyHistogramTest, MergeAddsCounts) {
  common::LatencyHistogram a, b;
  for (int i = 0; i < 10; ++i) a.Record(100);
  for (int i = 0; i < 30; ++i) b.Record(5000);
  a.Merge(b);
  EXPECT_EQ(a.Summary().count, 40u);
  EXPECT_GE(a.Quantile(0.5), 5000);
  EXPECT_LE(a.Quantile(0.2), 104);
}

}  // namespace
}  // namespace dmagather::common
