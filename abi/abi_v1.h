// Shared definitions of the v1 shared-memory ABI between libdmagather and
// dmagatherd: stamps, limits and the atomic helpers both sides use on shared
// words. Plain C-compatible types only; a released v1 layout is never edited.
#pragma once

#include <stdint.h>

namespace dmagather::abi {

// Every shared struct starts with `size | version << 24`.
constexpr uint32_t Stamp(uint32_t size, uint32_t version) { return size | (version << 24); }

constexpr uint32_t kMagic = 0x474d4144u;  // "DAMG" little-endian
constexpr uint32_t kMaxRanksV1 = 64;      // Ranks of one job (all its nodes).
constexpr uint32_t kRingSlotsV1 = 256;    // Descriptors in flight per rank.
constexpr uint32_t kErrorSlotsV1 = 16;    // Error records kept per rank.
constexpr uint32_t kErrorMessageBytesV1 = 240;

// Shared words are touched with the compiler's atomic builtins (the structs
// stay plain PODs so their layout is fixed and checkable).
template <typename T>
inline T LoadAcquire(const T* p) {
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
template <typename T>
inline T LoadSeqCst(const T* p) {
  return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
template <typename T>
inline void StoreRelease(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
template <typename T>
inline void StoreSeqCst(T* p, T v) {
  __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
template <typename T>
inline T FetchAdd(T* p, T v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

// Sequence numbers are 32-bit and wrap; a >= b in the cyclic sense (the same
// rule as CU_STREAM_WAIT_VALUE_GEQ).
inline bool SeqGeq(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

}  // namespace dmagather::abi
