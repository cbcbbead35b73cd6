// Element types of the public API: sizes and names. Bytes are copied, so
// every type is bit-exact; the dtype is checked for agreement across ranks.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dmagather::common {

constexpr int kNumDtypes = 8;

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
