// Helpers shared by the libFuzzer targets (tools/fuzz.sh) and their seed
// writer (make_seeds.cc): a cursor over the fuzzer's bytes, and the fake
// regions each target registers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "server/engines/copy_engine.h"

namespace dmagather::fuzz {

// Reads fixed-size values from the input; zeros once it runs out.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return pos_ >= size_; }
  size_t left() const { return empty() ? 0 : size_ - pos_; }
  template <typename T>
  T Take() {
    T v{};
    const size_t n = sizeof(T) < left() ? sizeof(T) : left();
    if (n != 0) std::memcpy(&v, data_ + pos_, n);
    pos_ += sizeof(T);
    return v;
  }
  // Copies up to `n` bytes into `out` (the rest of `out` is left alone).
  size_t TakeBytes(void* out, size_t n) {
    const size_t m = n < left() ? n : left();
    if (m != 0) std::memcpy(out, data_ + pos_, m);
    pos_ += m;
    return m;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A region that is exactly its own heap block, so AddressSanitizer reports
// any byte a validated plan would read or write outside it.
class ExactRegion : public server::engines::ImportedRegion {
 public:
  explicit ExactRegion(uint64_t bytes) : bytes_(bytes), mem_(static_cast<char*>(std::malloc(bytes == 0 ? 1 : bytes))) {}
  ~ExactRegion() override { std::free(mem_); }
  char* base() const override { return mem_; }
  uint64_t bytes() const override { return bytes_; }

 private:
  uint64_t bytes_;
  char* mem_;
};

// Region ids and sizes every rank registers in the targets: rank r has
// region kRegionBase + 8*r + i of kRegionBytes[i] bytes.
inline constexpr uint32_t kRegionBase = 100;
inline constexpr uint64_t kRegionBytes[] = {0, 1, 64, 4096};
inline constexpr int kNumRegions = 4;
inline uint32_t RegionId(int rank, int i) { return kRegionBase + 8 * uint32_t(rank) + uint32_t(i); }

}  // namespace dmagather::fuzz
