// common::ReduceChunks (the reduce-scatter's host reduction) against a
// naive scalar reference written another way: float16 through GCC's
// _Float16 (its conversions are libgcc's), bfloat16 rounding decided in
// double precision by comparing the distances to the two neighbours,
// integers summed in 64 bits and truncated. A rounding bug shared by the
// product's bit manipulations (common/reduce_numerics.h) and the reference
// cannot hide. Every compare is bit-exact.
#include "common/reduce.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/reduce_numerics.h"
#include "tests/support/reduce_reference.h"

namespace dmagather::common {
namespace {

using support::Bits;
using support::FillElement;
using support::Flt;
using support::RandomChunks;
using support::Reference;
using support::RefFloatToBf16;
using support::RefFloatToHalf;
using support::RefHalfToFloat;

// Index of the first element whose bits differ, or -1.
int64_t FirstMismatch(const unsigned char* a, const unsigned char* b, uint64_t count, size_t size) {
  if (count == 0 || memcmp(a, b, count * size) == 0) return -1;
  for (uint64_t i = 0; i < count; ++i) {
    if (memcmp(a + i * size, b + i * size, size) != 0) return int64_t(i);
  }
  return -1;
}

std::string Hex(const unsigned char* p, size_t size) {
  std::string s;
  char buf[4];
  for (size_t k = size; k-- > 0;) {
    snprintf(buf, sizeof(buf), "%02x", p[k]);
    s += buf;
  }
  return s;
}

// Runs ReduceChunks and the reference on the same chunks, `in` and `out`
// at the given byte offsets from an aligned allocation.
void CheckCase(uint32_t dtype, int redop, int n, uint64_t count, uint64_t seed, size_t in_off, size_t out_off) {
  const size_t size = DtypeSize(dtype);
  const std::vector<unsigned char> chunks = RandomChunks(seed, dtype, uint64_t(n) * count);
  std::vector<unsigned char> in_buf(chunks.size() + 16), out_buf(count * size + 16), ref(count * size + 1);
  unsigned char* in = in_buf.data() + in_off;
  unsigned char* out = out_buf.data() + out_off;
  if (!chunks.empty()) memcpy(in, chunks.data(), chunks.size());
  ReduceChunks(in, n, count, dtype, redop, out);
  Reference(chunks.data(), n, count, dtype, redop, ref.data());
  const int64_t bad = FirstMismatch(out, ref.data(), count, size);
  ASSERT_EQ(bad, -1) << DtypeName(dtype) << (redop == kRedopAvg ? " AVG" : " SUM") << " n=" << n << " count=" << count
                     << ": element " << bad << " is 0x" << Hex(out + bad * size, size) << ", the reference 0x"
                     << Hex(ref.data() + bad * size, size);
}

std::vector<int> Redops(uint32_t dtype) {
  return dtype >= kDtypeFloat16 ? std::vector<int>{kRedopSum, kRedopAvg} : std::vector<int>{kRedopSum};
}

TEST(ReduceTest, EveryDtypeOpAndChunkCountAgainstTheReference) {
  for (uint32_t dtype = 0; dtype < kNumDtypes; ++dtype) {
    for (int redop : Redops(dtype)) {
      for (int n = 1; n <= 8; ++n) {
        for (uint64_t count : {0ull, 1ull, 7ull, 4097ull}) {
          CheckCase(dtype, redop, n, count, dtype * 1000 + n * 10 + redop + count, 0, 0);
        }
      }
    }
  }
}

TEST(ReduceTest, LargeOddCountsEveryDtype) {
  const uint64_t count = (1ull << 20) + 3;
  for (uint32_t dtype = 0; dtype < kNumDtypes; ++dtype) {
    for (int redop : Redops(dtype)) {
      for (int n : {1, 2, 3, 5, 8}) CheckCase(dtype, redop, n, count, 77 + dtype * 16 + n + redop, 0, 0);
    }
  }
}

TEST(ReduceTest, UnalignedPointers) {
  for (uint32_t dtype = 0; dtype < kNumDtypes; ++dtype) {
    for (int redop : Redops(dtype)) {
      for (size_t in_off : {1, 3, 6}) {
        CheckCase(dtype, redop, 3, 4097, 5 + in_off + dtype, in_off, 7 - in_off);
        CheckCase(dtype, redop, 4, 1031, 9 + in_off + dtype, in_off, 2);
      }
    }
  }
}

// Splitting the output into sub-ranges (each with its own dense chunks)
// gives the same bits as one call: each element is reduced on its own.
TEST(ReduceTest, ResultIndependentOfSplit) {
  const int n = 5;
  const uint64_t count = 3 * 1024 + 517;
  for (uint32_t dtype = 0; dtype < kNumDtypes; ++dtype) {
    const size_t size = DtypeSize(dtype);
    const std::vector<unsigned char> chunks = RandomChunks(31 + dtype, dtype, n * count);
    for (int redop : Redops(dtype)) {
      std::vector<unsigned char> whole(count * size);
      ReduceChunks(chunks.data(), n, count, dtype, redop, whole.data());
      for (uint64_t step : {1ull, 13ull, 1000ull, 1025ull}) {
        for (uint64_t a = 0; a < count; a += step) {
          const uint64_t m = std::min(step, count - a);
          std::vector<unsigned char> sub_in(n * m * size), sub_out(m * size);
          for (int s = 0; s < n; ++s) memcpy(&sub_in[s * m * size], &chunks[(s * count + a) * size], m * size);
          ReduceChunks(sub_in.data(), n, m, dtype, redop, sub_out.data());
          ASSERT_EQ(memcmp(sub_out.data(), &whole[a * size], m * size), 0)
              << DtypeName(dtype) << " redop " << redop << " step " << step << " at " << a;
        }
      }
    }
  }
}

TEST(ReduceTest, RefusesAvgOnIntegersAndUnknowns) {
  for (uint32_t dtype = 0; dtype < kNumDtypes; ++dtype) {
    std::string why;
    EXPECT_TRUE(ReduceSupported(dtype, kRedopSum, &why)) << DtypeName(dtype);
    const bool floating = dtype >= kDtypeFloat16;
    EXPECT_EQ(ReduceSupported(dtype, kRedopAvg, &why), floating) << DtypeName(dtype);
    if (!floating) {
      EXPECT_NE(why.find("AVG is not defined for the integer dtype"), std::string::npos) << why;
      EXPECT_NE(why.find(DtypeName(dtype)), std::string::npos) << why;
    }
  }
  std::string why;
  EXPECT_FALSE(ReduceSupported(kNumDtypes, kRedopSum, &why));
  EXPECT_NE(why.find("unknown dtype 8"), std::string::npos) << why;
  EXPECT_FALSE(ReduceSupported(kDtypeFloat32, 2, &why));
  EXPECT_NE(why.find("unknown reduction op 2"), std::string::npos) << why;
  EXPECT_FALSE(ReduceSupported(kDtypeFloat32, -1, nullptr));
  // Refused: out untouched.
  uint8_t in[4] = {1, 2, 3, 4}, out[2] = {9, 9};
  ReduceChunks(in, 2, 2, kDtypeUint8, kRedopAvg, out);
  EXPECT_EQ(out[0], 9);
  ReduceChunks(in, 2, 2, kDtypeUint8, kRedopSum, out);
  EXPECT_EQ(out[0], 4);
  EXPECT_EQ(out[1], 6);
}

// --- The shared conversions alone, against the reference's ---

TEST(ReduceNumericsTest, EveryFloat16WidensExactly) {
  for (uint32_t u = 0; u < 0x10000; ++u) {
    const float got = reduce::HalfToFloat(uint16_t(u)), want = RefHalfToFloat(uint16_t(u));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << std::hex << u;
    } else {
      ASSERT_EQ(Bits(got), Bits(want)) << std::hex << u;
    }
    ASSERT_EQ(Bits(reduce::Bf16ToFloat(uint16_t(u))), u << 16);
  }
}

// Each 16-bit value, the midpoints to its neighbours (ties) and the floats
// just beside them, both signs; then random floats.
TEST(ReduceNumericsTest, RoundingToSixteenBitsAtTiesAndAround) {
  std::vector<float> probes = {0.0f,
                               -0.0f,
                               INFINITY,
                               -INFINITY,
                               NAN,
                               -NAN,
                               65504.0f,
                               65519.99f,
                               65520.0f,
                               65536.0f,
                               3.4028235e38f,
                               1e-45f,
                               2.9802322e-8f /* 2^-25 */,
                               5.9604645e-8f /* 2^-24 */};
  for (uint32_t u = 0; u < 0x7c00; ++u) {
    const double v = RefHalfToFloat(uint16_t(u)), up = RefHalfToFloat(uint16_t(u + 1));
    probes.push_back(float(v));
    probes.push_back(float((v + up) / 2));  // exact in float: 12 significant bits
  }
  for (uint32_t u = 0; u < 0x7f80; ++u) {
    probes.push_back(Flt(u << 16));
    probes.push_back(Flt((u << 16) | 0x8000u));  // the tie
  }
  const size_t base = probes.size();
  for (size_t i = 0; i < base; ++i) {
    probes.push_back(std::nextafter(probes[i], INFINITY));
    probes.push_back(std::nextafter(probes[i], -INFINITY));
  }
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 4000000; ++i) probes.push_back(Flt(uint32_t(rng())));
  for (uint64_t u = 0; u < (1ull << 32); u += 4093) probes.push_back(Flt(uint32_t(u)));
  for (float f : probes) {
    for (float g : {f, -f}) {
      ASSERT_EQ(reduce::FloatToHalf(g), RefFloatToHalf(g)) << std::hex << Bits(g);
      ASSERT_EQ(reduce::FloatToBf16(g), RefFloatToBf16(g)) << std::hex << Bits(g);
    }
  }
}

// Sums chosen by hand: overflow of the 16-bit type only after summing, a
// tie resolved once (not at each step), infinities meeting, NaN payloads.
TEST(ReduceTest, HandPickedSums) {
  auto half2 = [](uint16_t a, uint16_t b, int redop) {
    const uint16_t in[2] = {a, b};
    uint16_t out = 0;
    ReduceChunks(in, 2, 1, kDtypeFloat16, redop, &out);
    return out;
  };
  EXPECT_EQ(half2(0x7bff, 0x7bff, kRedopSum), 0x7c00);  // 65504 + 65504: inf
  EXPECT_EQ(half2(0x7bff, 0x7bff, kRedopAvg), 0x7bff);  // ... and its average is exact
  EXPECT_EQ(half2(0x3c00, 0x1000, kRedopSum), 0x3c00);  // 1 + 2^-11: the tie goes to even (1.0)
  EXPECT_EQ(half2(0x3c01, 0x1000, kRedopSum), 0x3c02);  // 1+2^-10 + 2^-11: the tie goes to even (up)
  EXPECT_EQ(half2(0x7c00, 0xfc00, kRedopSum), 0x7e00);  // inf - inf: the canonical NaN
  EXPECT_EQ(half2(0xfe01, 0x3c00, kRedopSum), 0x7e00);  // a NaN with payload and sign: canonical
  EXPECT_EQ(half2(0x8000, 0x8000, kRedopSum), 0x8000);  // -0 + -0 = -0
  EXPECT_EQ(half2(0x0001, 0x0001, kRedopSum), 0x0002);  // subnormals
  EXPECT_EQ(half2(0x0001, 0x0000, kRedopAvg), 0x0000);  // 2^-25: the tie goes to zero
  EXPECT_EQ(half2(0x0003, 0x0000, kRedopAvg), 0x0002);  // 1.5 * 2^-24: the tie goes to even (2)
  // Three 1 + 2^-10 in float16 one step at a time would round after the first
  // addition; rounding once gives 3 + 3 * 2^-10 -> 0x4202.
  const uint16_t three[3] = {0x3c01, 0x3c01, 0x3c01};
  uint16_t out = 0;
  ReduceChunks(three, 3, 1, kDtypeFloat16, kRedopSum, &out);
  EXPECT_EQ(out, 0x4202);
  const uint16_t bf[2] = {0x7f7f, 0x7f7f};  // the largest bfloat16, twice: inf
  ReduceChunks(bf, 2, 1, kDtypeBfloat16, kRedopSum, &out);
  EXPECT_EQ(out, 0x7f80);
  const int8_t i8[3] = {100, 100, -128};  // 72 after wrapping
  int8_t o8 = 0;
  ReduceChunks(i8, 3, 1, kDtypeInt8, kRedopSum, &o8);
  EXPECT_EQ(o8, 72);
  const float f[3] = {1.0f, 1e-8f, 1e-8f};  // in chunk order, both small terms are lost
  float of = 0;
  ReduceChunks(f, 3, 1, kDtypeFloat32, kRedopSum, &of);
  EXPECT_EQ(of, 1.0f);
  const float avg3[3] = {1.0f, 1.0f, 0.0f};  // 2 / 3, divided (not multiplied by 1/3)
  ReduceChunks(avg3, 3, 1, kDtypeFloat32, kRedopAvg, &of);
  EXPECT_EQ(Bits(of), Bits(2.0f / 3.0f));
}

}  // namespace
}  // namespace dmagather::common
