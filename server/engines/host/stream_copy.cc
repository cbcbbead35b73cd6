#include "server/engines/host/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace dmagather::server::engines::host {
#if defined(__x86_64__)
namespace {

// Copies `body` bytes (a multiple of 64) to a 64-byte aligned destination.
__attribute__((target("avx2"))) void StreamBlocksAvx2(char* d, const char* s, size_t body) {
  for (size_t i = 0; i < body; i += 64) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
  }
}

void StreamBlocksSse2(char* d, const char* s, size_t body) {
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2");

}  // namespace
#endif

void StreamCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  if (n < kStreamMinBytes) {
    std::memcpy(dst, src, n);
    return;
  }
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;  // Align the destination.
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t body = n & ~size_t{63};
  if (kHasAvx2) {
    StreamBlocksAvx2(d, s, body);
  } else {
    StreamBlocksSse2(d, s, body);
  }
  std::memcpy(d + body, s + body, n - body);
  _mm_sfence();
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace dmagather::server::engines::host
