// Host ReduceChunks: the output in blocks of kBlock elements; each block's
// accumulators sit in a small array (at most 8 KiB) that stays in L1 while
// the n chunks' slices are added into it one after the other, in chunk
// order. Elements are copied in and out with memcpy (any alignment), and
// the loops are plain element-wise loops the compiler vectorizes.
#include "common/reduce.h"

#include <algorithm>
#include <cstring>

#include "common/dtype.h"
#include "common/reduce_numerics.h"

namespace dmagather::common {
namespace {

constexpr uint64_t kBlock = 1024;
constexpr int kMaxChunks = 64;  // Ranks of one job (abi::kMaxRanksV1).

template <typename Op>
void ReduceTyped(const unsigned char* const* in, int n, uint64_t count, bool avg, unsigned char* out) {
  using S = typename Op::Storage;
  using A = typename Op::Acc;
  S elems[kBlock];
  A acc[kBlock];
  for (uint64_t base = 0; base < count; base += kBlock) {
    const uint64_t m = std::min(kBlock, count - base);
    const size_t bytes = m * sizeof(S);
    memcpy(elems, in[0] + base * sizeof(S), bytes);
    for (uint64_t i = 0; i < m; ++i) acc[i] = Op::Widen(elems[i]);
    for (int s = 1; s < n; ++s) {
      memcpy(elems, in[s] + base * sizeof(S), bytes);
      for (uint64_t i = 0; i < m; ++i) acc[i] = Op::Add(acc[i], Op::Widen(elems[i]));
    }
    if constexpr (Op::kFloating) {
      if (avg) {
        for (uint64_t i = 0; i < m; ++i) acc[i] = Op::Avg(acc[i], n);
      }
    }
    for (uint64_t i = 0; i < m; ++i) elems[i] = Op::Narrow(acc[i]);
    memcpy(out + base * sizeof(S), elems, bytes);
  }
}

}  // namespace

bool ReduceSupported(uint32_t dtype, int redop, std::string* why) {
  std::string reason;
  if (dtype >= kNumDtypes) {
    reason = "unknown dtype " + std::to_string(dtype) + " for a reduction";
  } else if (redop != kRedopSum && redop != kRedopAvg) {
    reason = "unknown reduction op " + std::to_string(redop) + " (SUM = 0 and AVG = 1 are defined)";
  } else if (redop == kRedopAvg && dtype < kDtypeFloat16) {
    reason = std::string("AVG is not defined for the integer dtype ") + DtypeName(dtype) +
             " (the quotient would need a rounding rule); use SUM and divide, or a floating dtype";
  } else {
    return true;
  }
  if (why != nullptr) *why = reason;
  return false;
}

void ReduceChunks(const void* in, int n, uint64_t count, uint32_t dtype, int redop, void* out) {
  if (n < 1 || n > kMaxChunks) return;
  const void* chunks[kMaxChunks];
  for (int s = 0; s < n; ++s)
    chunks[s] = static_cast<const unsigned char*>(in) + uint64_t(s) * count * DtypeSize(dtype);
  ReduceChunks(chunks, n, count, dtype, redop, out);
}

void ReduceChunks(const void* const* chunks, int n, uint64_t count, uint32_t dtype, int redop, void* out) {
  if (n < 1 || n > kMaxChunks || !ReduceSupported(dtype, redop, nullptr)) return;
  const auto* const* src = reinterpret_cast<const unsigned char* const*>(chunks);
  auto* dst = static_cast<unsigned char*>(out);
  const bool avg = redop == kRedopAvg;
  switch (dtype) {
    case kDtypeUint8:
    case kDtypeInt8:
      return ReduceTyped<reduce::WrapOp<uint8_t>>(src, n, count, avg, dst);
    case kDtypeInt32:
      return ReduceTyped<reduce::WrapOp<uint32_t>>(src, n, count, avg, dst);
    case kDtypeInt64:
      return ReduceTyped<reduce::WrapOp<uint64_t>>(src, n, count, avg, dst);
    case kDtypeFloat16:
      return ReduceTyped<reduce::Float16Op>(src, n, count, avg, dst);
    case kDtypeBfloat16:
      return ReduceTyped<reduce::Bfloat16Op>(src, n, count, avg, dst);
    case kDtypeFloat32:
      return ReduceTyped<reduce::Float32Op>(src, n, count, avg, dst);
    case kDtypeFloat64:
      return ReduceTyped<reduce::Float64Op>(src, n, count, avg, dst);
  }
}

}  // namespace dmagather::common
