// The element arithmetic of the reduce-scatter's local reduction, one
// definition for the host (common/reduce.cc) and the GPU kernels
// (kernels/reduce_device.h): how an element is widened to its accumulator,
// added, averaged and narrowed back. Plain functions on bit patterns, no
// state; compiled as __host__ __device__ under nvcc and hipcc.
//
// The numerics (the contract; common/reduce.h states it for callers):
//   out[i] = R((...((x_0[i] + x_1[i]) + x_2[i]) ...) + x_{n-1}[i])   [/ n]
// summed strictly in chunk order. float16/bfloat16 are widened exactly to
// float32 and rounded once at the end (round to nearest, ties to even;
// overflow goes to infinity, subnormals are rounded correctly); float32 and
// float64 accumulate in their own type. AVG divides the sum by (float)n or
// (double)n with an IEEE division. Every NaN result is the positive quiet
// NaN without payload (0x7e00, 0x7fc0, 0x7fc00000, 0x7ff8000000000000), so
// hardware that propagates NaN payloads differently gives the same bits.
// Integers wrap: they are summed in the unsigned type of their width.
//
// There is no multiplication anywhere, so no fused multiply-add can change
// a result; the builds that compile this (common/BUILD, kernels/BUILD)
// keep IEEE division, no flush-to-zero and no fast-math.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define DMAG_HD __host__ __device__
#else
#define DMAG_HD
#endif

namespace dmagather::common::reduce {

DMAG_HD inline float FloatFromBits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof(f));
  return f;
}

DMAG_HD inline uint32_t BitsFromFloat(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof(u));
  return u;
}

DMAG_HD inline double DoubleFromBits(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof(d));
  return d;
}

DMAG_HD inline uint64_t BitsFromDouble(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof(u));
  return u;
}

constexpr uint16_t kHalfNan = 0x7e00;
constexpr uint16_t kBf16Nan = 0x7fc0;
constexpr uint32_t kFloatNan = 0x7fc00000u;
constexpr uint64_t kDoubleNan = 0x7ff8000000000000ull;

// float16 -> float32, exact. Normals and infinities/NaNs by moving the
// fields; a subnormal m * 2^-24 is built as the float 2^-14 * (1 + m/1024)
// less 2^-14, an exact subtraction (both terms and the result are float32
// normals). Every candidate is computed and one selected, without
// branches, so loops over it vectorize.
DMAG_HD inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t mag = uint32_t(h & 0x7fffu) << 13;  // exponent and mantissa, in float position
  const uint32_t exp = mag & 0x0f800000u;
  const uint32_t normal = mag + 0x38000000u;   // rebias 15 -> 127
  const uint32_t special = mag | 0x7f800000u;  // inf / NaN
  const uint32_t sub = BitsFromFloat(FloatFromBits(mag + 0x38800000u) - FloatFromBits(0x38800000u));
  const uint32_t r = exp == 0x0f800000u ? special : (exp == 0 ? sub : normal);
  return FloatFromBits(sign | r);
}

// float32 -> float16, round to nearest even. Normals round the 13 dropped
// mantissa bits as integers (a carry moves into the exponent, up to
// infinity from 65520 on); below 2^-14 the value is added to 0.5, whose
// ulp is the float16 subnormal step 2^-24, so the addition itself rounds
// to nearest even, and the low mantissa bits of the sum are the result.
// Branch-free like HalfToFloat.
DMAG_HD inline uint16_t FloatToHalf(float f) {
  const uint32_t x = BitsFromFloat(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  const uint32_t normal = (ax + 0xfffu + ((ax >> 13) & 1u) - 0x38000000u) >> 13;
  const uint32_t sub = BitsFromFloat(FloatFromBits(ax) + 0.5f) - 0x3f000000u;
  uint32_t r = ax >= 0x38800000u ? normal : sub;  // 2^-14: the smallest float16 normal
  r = ax >= 0x47800000u ? 0x7c00u : r;            // >= 65536 and inf: inf
  r = ax > 0x7f800000u ? kHalfNan : (r | sign);
  return uint16_t(r);
}

DMAG_HD inline float Bf16ToFloat(uint16_t b) { return FloatFromBits(uint32_t(b) << 16); }

// float32 -> bfloat16, round to nearest even on the 16 dropped bits; the
// carry of the largest finite values moves into the exponent: infinity.
DMAG_HD inline uint16_t FloatToBf16(float f) {
  const uint32_t x = BitsFromFloat(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return kBf16Nan;
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// One element type's arithmetic: Storage is the element's bits in memory,
// Acc the accumulator. Widen, Add, Avg (floating types only) and Narrow.
struct Float16Op {
  using Storage = uint16_t;
  using Acc = float;
  static constexpr bool kFloating = true;
  DMAG_HD static Acc Widen(Storage v) { return HalfToFloat(v); }
  DMAG_HD static Acc Add(Acc a, Acc b) { return a + b; }
  DMAG_HD static Acc Avg(Acc a, int n) { return a / float(n); }
  DMAG_HD static Storage Narrow(Acc a) { return FloatToHalf(a); }
};

struct Bfloat16Op {
  using Storage = uint16_t;
  using Acc = float;
  static constexpr bool kFloating = true;
  DMAG_HD static Acc Widen(Storage v) { return Bf16ToFloat(v); }
  DMAG_HD static Acc Add(Acc a, Acc b) { return a + b; }
  DMAG_HD static Acc Avg(Acc a, int n) { return a / float(n); }
  DMAG_HD static Storage Narrow(Acc a) { return FloatToBf16(a); }
};

struct Float32Op {
  using Storage = uint32_t;
  using Acc = float;
  static constexpr bool kFloating = true;
  DMAG_HD static Acc Widen(Storage v) { return FloatFromBits(v); }
  DMAG_HD static Acc Add(Acc a, Acc b) { return a + b; }
  DMAG_HD static Acc Avg(Acc a, int n) { return a / float(n); }
  DMAG_HD static Storage Narrow(Acc a) { return a != a ? kFloatNan : BitsFromFloat(a); }
};

struct Float64Op {
  using Storage = uint64_t;
  using Acc = double;
  static constexpr bool kFloating = true;
  DMAG_HD static Acc Widen(Storage v) { return DoubleFromBits(v); }
  DMAG_HD static Acc Add(Acc a, Acc b) { return a + b; }
  DMAG_HD static Acc Avg(Acc a, int n) { return a / double(n); }
  DMAG_HD static Storage Narrow(Acc a) { return a != a ? kDoubleNan : BitsFromDouble(a); }
};

// (a != a: true for NaN only; nothing here is built with fast-math.)

// Signed and unsigned integers alike: the unsigned type of the width, so a
// sum that overflows wraps (two's complement) with defined behaviour.
template <typename U>
struct WrapOp {
  using Storage = U;
  using Acc = U;
  static constexpr bool kFloating = false;
  DMAG_HD static Acc Widen(Storage v) { return v; }
  DMAG_HD static Acc Add(Acc a, Acc b) { return U(a + b); }
  DMAG_HD static Acc Avg(Acc a, int) { return a; }  // never called: AVG is refused for integers
  DMAG_HD static Storage Narrow(Acc a) { return a; }
};

}  // namespace dmagather::common::reduce
