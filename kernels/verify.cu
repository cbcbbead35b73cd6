#include <cuda_runtime.h>

#include "kernels/verify.h"

namespace dmagather::kernels {
namespace {

__device__ __forceinline__ uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Word w of the pattern: SplitMix64's (w+1)-th output from state s0.
__device__ __forceinline__ uint64_t Word(uint64_t s0, uint64_t w) { return Mix(s0 + (w + 1) * 0x9e3779b97f4a7c15ull); }

__host__ __device__ inline uint64_t Seed0(uint64_t seed, int rank) {
  return seed * 0x100000001b3ull + uint64_t(rank) * 0x9e3779b97f4a7c15ull + 1;
}

__device__ __forceinline__ void FillBody(unsigned char* dst, size_t bytes, uint64_t s0) {
  const size_t words = (bytes + 7) / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(dst) & 7) == 0;
  for (size_t w = blockIdx.x * size_t(blockDim.x) + threadIdx.x; w < words; w += size_t(gridDim.x) * blockDim.x) {
    const uint64_t v = Word(s0, w);
    const size_t off = w * 8;
    if (aligned && off + 8 <= bytes) {
      *reinterpret_cast<uint64_t*>(dst + off) = v;
    } else {
      for (int b = 0; b < 8 && off + b < bytes; ++b) dst[off + b] = static_cast<unsigned char>(v >> (8 * b));
    }
  }
}

__device__ __forceinline__ void CompareBody(const unsigned char* src, size_t bytes, uint64_t s0,
                                            unsigned long long* bad, unsigned long long* first) {
  const size_t words = (bytes + 7) / 8;
  const bool aligned = (reinterpret_cast<uintptr_t>(src) & 7) == 0;
  unsigned long long n = 0, lo = ~0ull;
  for (size_t w = blockIdx.x * size_t(blockDim.x) + threadIdx.x; w < words; w += size_t(gridDim.x) * blockDim.x) {
    const uint64_t v = Word(s0, w);
    const size_t off = w * 8;
    bool ok = true;
    if (aligned && off + 8 <= bytes) {
      ok = *reinterpret_cast<const uint64_t*>(src + off) == v;
    } else {
      for (int b = 0; b < 8 && off + b < bytes; ++b) ok &= src[off + b] == static_cast<unsigned char>(v >> (8 * b));
    }
    if (!ok) {
      ++n;
      if (off < lo) lo = off;
    }
  }
  if (n != 0) {
    atomicAdd(bad, n);
    atomicMin(first, lo);
  }
}

__global__ void FillKernel(unsigned char* dst, size_t bytes, uint64_t s0) { FillBody(dst, bytes, s0); }

__global__ void CompareKernel(const unsigned char* src, size_t bytes, uint64_t s0, unsigned long long* bad,
                              unsigned long long* first) {
  CompareBody(src, bytes, s0, bad, first);
}

// The seed read from device memory (a step counter a CUDA graph advances).
__global__ void FillKernelDev(unsigned char* dst, size_t bytes, const unsigned long long* seed, int rank) {
  FillBody(dst, bytes, Seed0(*seed, rank));
}

__global__ void CompareKernelDev(const unsigned char* src, size_t bytes, const unsigned long long* seed, int rank,
                                 unsigned long long* bad, unsigned long long* first) {
  CompareBody(src, bytes, Seed0(*seed, rank), bad, first);
}

__global__ void IncrementKernel(unsigned long long* p) { *p += 1; }

__global__ void Bf16Kernel(unsigned short* dst, size_t n, uint64_t s0) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = float(Word(s0, i) >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;  // [-1, 1)
    dst[i] = static_cast<unsigned short>(__float_as_uint(u) >> 16);
  }
}

__global__ void DelayKernel(uint64_t ns) {
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

int Blocks(size_t bytes) {
  const size_t words = (bytes + 7) / 8;
  size_t b = (words + 255) / 256;
  if (b > 4096) b = 4096;
  return b == 0 ? 1 : int(b);
}

}  // namespace

int FillPattern(void* dst, size_t bytes, uint64_t seed, int rank, void* stream) {
  if (bytes == 0) return 0;
  FillKernel<<<Blocks(bytes), 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned char*>(dst), bytes,
                                                                           Seed0(seed, rank));
  return int(cudaGetLastError());
}

int ComparePattern(const void* src, size_t bytes, uint64_t seed, int rank, unsigned long long* d_mismatches,
                   unsigned long long* d_first_bad, void* stream) {
  if (bytes == 0) return 0;
  CompareKernel<<<Blocks(bytes), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const unsigned char*>(src), bytes, Seed0(seed, rank), d_mismatches, d_first_bad);
  return int(cudaGetLastError());
}

int FillRandomBf16(void* dst, size_t n, uint64_t seed, void* stream) {
  if (n == 0) return 0;
  Bf16Kernel<<<Blocks(n * 8), 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned short*>(dst), n,
                                                                           Seed0(seed, 0));
  return int(cudaGetLastError());
}

int FillPatternDeviceSeed(void* dst, size_t bytes, const unsigned long long* d_seed, int rank, void* stream) {
  if (bytes == 0) return 0;
  FillKernelDev<<<Blocks(bytes), 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<unsigned char*>(dst), bytes,
                                                                              d_seed, rank);
  return int(cudaGetLastError());
}

int ComparePatternDeviceSeed(const void* src, size_t bytes, const unsigned long long* d_seed, int rank,
                             unsigned long long* d_mismatches, unsigned long long* d_first_bad, void* stream) {
  if (bytes == 0) return 0;
  CompareKernelDev<<<Blocks(bytes), 256, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const unsigned char*>(src), bytes, d_seed, rank, d_mismatches, d_first_bad);
  return int(cudaGetLastError());
}

int Increment(unsigned long long* d_value, void* stream) {
  IncrementKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(d_value);
  return int(cudaGetLastError());
}

int Delay(uint64_t ns, void* stream) {
  DelayKernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>(ns);
  return int(cudaGetLastError());
}

}  // namespace dmagather::kernels
