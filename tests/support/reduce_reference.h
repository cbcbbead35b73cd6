// The reduce-scatter's reference reduction, written apart from
// common/reduce (one element at a time; fp16 through the compiler's
// _Float16, bfloat16 rounding by comparing distances in double) so a bug
// shared with the product code cannot hide; and the inputs the tests feed
// both (random bits, values whose sums land on rounding ties, specials).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/reduce.h"

namespace dmagather::support {

using namespace ::dmagather::common;  // NOLINT: the dtype and redop constants.

inline uint32_t Bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
inline float Flt(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

// --- The reference ---

#if defined(__clang__) && __clang_major__ < 15
// clang before 15 (the thread-safety build's clang-14) has no _Float16 on
// x86: the same two conversions by arithmetic in double, still apart from
// common/reduce_numerics.h's bit manipulation.
inline float RefHalfToFloat(uint16_t u) {
  const int e = (u >> 10) & 31, m = u & 1023;
  const double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
  return static_cast<float>((u & 0x8000) ? -v : v);
}

inline uint16_t RefFloatToHalf(float f) {
  if (std::isnan(f)) return 0x7e00;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(double(f));
  if (a >= 65520.0) return sign | 0x7c00;  // Rounds past 65504: infinity.
  if (a < std::ldexp(1.0, -14)) return sign | uint16_t(std::nearbyint(std::ldexp(a, 24)));  // Subnormal.
  int ex = 0;
  std::frexp(a, &ex);                                   // a in [2^(ex-1), 2^ex)
  int m = int(std::nearbyint(std::ldexp(a, 11 - ex)));  // In [1024, 2048], ties to even.
  if (m == 2048) m = 1024, ++ex;
  return sign | uint16_t(((ex - 1 + 15) << 10) | (m - 1024));
}
#else
inline float RefHalfToFloat(uint16_t u) {
  _Float16 h;
  memcpy(&h, &u, 2);
  return static_cast<float>(h);
}

inline uint16_t RefFloatToHalf(float f) {
  if (std::isnan(f)) return 0x7e00;
  const _Float16 h = static_cast<_Float16>(f);
  uint16_t u;
  memcpy(&u, &h, 2);
  return u;
}
#endif

inline uint16_t RefFloatToBf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  const uint32_t x = Bits(f);
  const uint32_t lo = x & 0xffff0000u;  // toward zero
  if (lo == x) return uint16_t(x >> 16);
  const uint32_t hi = lo + 0x10000u;  // away from zero; past the largest finite: infinity
  const double v = f, vlo = Flt(lo);
  // Overflow rounds as if the exponent went on: the neighbour above the
  // largest finite bfloat16 is 2^128.
  const double vhi = (hi & 0x7fffffffu) == 0x7f800000u ? std::copysign(std::ldexp(1.0, 128), v) : double(Flt(hi));
  const double dlo = std::fabs(v - vlo), dhi = std::fabs(vhi - v);  // exact in double
  if (dlo < dhi) return uint16_t(lo >> 16);
  if (dhi < dlo) return uint16_t(hi >> 16);
  return ((lo >> 16) & 1u) == 0 ? uint16_t(lo >> 16) : uint16_t(hi >> 16);
}

template <typename T>
inline T Load(const unsigned char* p, uint64_t i) {
  T v;
  memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
inline void Store(unsigned char* p, uint64_t i, T v) {
  memcpy(p + i * sizeof(T), &v, sizeof(T));
}

// The definition, one element at a time.
inline void Reference(const unsigned char* in, int n, uint64_t count, uint32_t dtype, int redop, unsigned char* out) {
  const bool avg = redop == kRedopAvg;
  for (uint64_t i = 0; i < count; ++i) {
    if (dtype <= kDtypeInt64) {
      uint64_t acc = 0;
      for (int s = 0; s < n; ++s) {
        const uint64_t k = uint64_t(s) * count + i;
        acc += dtype <= kDtypeInt8    ? Load<uint8_t>(in, k)
               : dtype == kDtypeInt32 ? Load<uint32_t>(in, k)
                                      : Load<uint64_t>(in, k);
      }
      if (dtype <= kDtypeInt8) Store<uint8_t>(out, i, uint8_t(acc & 0xff));
      if (dtype == kDtypeInt32) Store<uint32_t>(out, i, uint32_t(acc & 0xffffffffu));
      if (dtype == kDtypeInt64) Store<uint64_t>(out, i, acc);
    } else if (dtype == kDtypeFloat64) {
      double acc = Load<double>(in, i);
      for (int s = 1; s < n; ++s) acc = acc + Load<double>(in, uint64_t(s) * count + i);
      if (avg) acc = acc / double(n);
      Store<double>(out, i, std::isnan(acc) ? std::nan("") : acc);
    } else {
      auto widen = [&](uint64_t k) {
        if (dtype == kDtypeFloat16) return RefHalfToFloat(Load<uint16_t>(in, k));
        if (dtype == kDtypeBfloat16) return Flt(uint32_t(Load<uint16_t>(in, k)) << 16);
        return Load<float>(in, k);
      };
      float acc = widen(i);
      for (int s = 1; s < n; ++s) acc = acc + widen(uint64_t(s) * count + i);
      if (avg) acc = acc / float(n);
      if (dtype == kDtypeFloat16) Store<uint16_t>(out, i, RefFloatToHalf(acc));
      if (dtype == kDtypeBfloat16) Store<uint16_t>(out, i, RefFloatToBf16(acc));
      if (dtype == kDtypeFloat32) Store<uint32_t>(out, i, std::isnan(acc) ? 0x7fc00000u : Bits(acc));
    }
  }
}

// --- Inputs: random bits, values of close magnitude (rounding ties), specials ---

inline void FillElement(std::mt19937_64& rng, uint32_t dtype, unsigned char* p) {
  const size_t size = DtypeSize(dtype);
  uint64_t r = rng();
  const int kind = int((r >> 56) % 16);
  if (dtype == kDtypeFloat16 || dtype == kDtypeBfloat16) {
    static constexpr uint16_t kHalfSpecial[] = {0x0000, 0x8000, 0x0001, 0x83ff, 0x7c00, 0xfc00, 0x7e01, 0x7bff, 0xfbff};
    static constexpr uint16_t kBfSpecial[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc1, 0x7f7f, 0xff7f};
    uint16_t v = uint16_t(r);
    if (kind == 0) v = (dtype == kDtypeFloat16 ? kHalfSpecial : kBfSpecial)[(r >> 20) % 9];
    // Exponent near 1.0: sums of such values land on ties of the 16-bit type.
    if (kind >= 8) v = dtype == kDtypeFloat16 ? uint16_t((v & 0x83ff) | 0x3c00) : uint16_t((v & 0x807f) | 0x3f80);
    memcpy(p, &v, 2);
  } else if (dtype == kDtypeFloat32) {
    uint32_t v = uint32_t(r);
    if (kind == 0)
      v = std::vector<uint32_t>{
          0, 0x80000000u, 1, 0x807fffffu, 0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f7fffffu}[(r >> 20) % 8];
    if (kind >= 8) v = (v & 0x807fffffu) | 0x3f800000u;
    memcpy(p, &v, 4);
  } else if (dtype == kDtypeFloat64) {
    if (kind == 0)
      r = std::vector<uint64_t>{
          0, 1ull << 63, 1, 0x7ff0000000000000ull, 0x7ff8000000000001ull, 0x7fefffffffffffffull}[(r >> 20) % 6];
    if (kind >= 8) r = (r & 0x800fffffffffffffull) | 0x3ff0000000000000ull;
    memcpy(p, &r, 8);
  } else {
    memcpy(p, &r, size);
  }
}

inline std::vector<unsigned char> RandomChunks(uint64_t seed, uint32_t dtype, uint64_t elems) {
  std::mt19937_64 rng(seed);
  const size_t size = DtypeSize(dtype);
  std::vector<unsigned char> v(elems * size);
  for (uint64_t i = 0; i < elems; ++i) FillElement(rng, dtype, &v[i * size]);
  return v;
}

// A reduce-scatter test's inputs and answers: rank r's whole send buffer
// (world chunks of count) for case `seed`, and what rank `rank` must get
// (the reference over chunk `rank` of every rank's send).
inline std::vector<unsigned char> ReduceScatterInput(int r, int world, uint32_t dtype, uint64_t count, uint64_t seed) {
  return RandomChunks(seed * 131 + r, dtype, uint64_t(world) * count);
}

inline std::vector<unsigned char> ReduceScatterExpected(int rank, int world, uint32_t dtype, int redop, uint64_t count,
                                                        uint64_t seed) {
  const size_t size = DtypeSize(dtype);
  std::vector<unsigned char> dense(uint64_t(world) * count * size), out(count * size + 1);
  for (int s = 0; s < world; ++s) {
    const std::vector<unsigned char> send = ReduceScatterInput(s, world, dtype, count, seed);
    std::memcpy(dense.data() + uint64_t(s) * count * size, send.data() + uint64_t(rank) * count * size, count * size);
  }
  Reference(dense.data(), world, count, dtype, redop, out.data());
  return out;
}

}  // namespace dmagather::support
