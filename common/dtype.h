// Element types of the public API: sizes and names. Bytes are copied, so
// every type is bit-exact; the dtype is checked for agreement across ranks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dmagather::common {

constexpr int kNumDtypes = 8;

// dmagather_dtype_t's values (client/include/dmagather/dmagather.h).
constexpr uint32_t kDtypeUint8 = 0;
constexpr uint32_t kDtypeInt8 = 1;
constexpr uint32_t kDtypeInt32 = 2;
constexpr uint32_t kDtypeInt64 = 3;
constexpr uint32_t kDtypeFloat16 = 4;
constexpr uint32_t kDtypeBfloat16 = 5;
constexpr uint32_t kDtypeFloat32 = 6;
constexpr uint32_t kDtypeFloat64 = 7;

inline size_t DtypeSize(uint32_t dtype) {
  static constexpr size_t kSizes[kNumDtypes] = {1, 1, 4, 8, 2, 2, 4, 8};
  return dtype < kNumDtypes ? kSizes[dtype] : 0;
}

inline const char* DtypeName(uint32_t dtype) {
  static constexpr const char* kNames[kNumDtypes] = {"uint8",   "int8",     "int32",   "int64",
                                                     "float16", "bfloat16", "float32", "float64"};
  return dtype < kNumDtypes ? kNames[dtype] : "unknown";
}

}  // namespace dmagather::common
