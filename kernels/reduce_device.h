// The reduce-scatter's reduction kernels, one source for nvcc
// (kernels/reduce.cu) and HIP-Clang (kernels/reduce_hip.cc): the includer
// has included its runtime header first. Each output element is reduced by
// one thread, in chunk order, with the element arithmetic of
// common/reduce_numerics.h, so every launch shape gives the same bits as
// common::ReduceChunks on the host.
//
// The chunks come as n pointers (ChunkPtrs, a kernel argument): the
// client's are the other ranks' chunks in its staging buffer and its own
// chunk in its send buffer, which `out` may be exactly (in place: a thread
// reads every input of its elements before it writes them; no __restrict__).
// Two paths, chosen per call by PlanReduce:
//   vector  every chunk and `out` 16-byte aligned and the chunk length a multiple of
//           16 bytes: a thread handles 16 bytes of output, reading 16 bytes
//           of up to 8 chunks before adding them (8 loads in flight);
//   scalar  anything else: one element per thread, typed loads where `in`
//           and `out` are aligned to the element, byte loads otherwise.
// Both are grid-stride loops over a fixed grid of kThreads-thread blocks.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/dtype.h"
#include "common/reduce.h"
#include "common/reduce_numerics.h"

namespace dmagather::kernels::reduce_device {

namespace numerics = ::dmagather::common::reduce;

constexpr unsigned kThreads = 512;
// Blocks: enough for the output, at most one per kSmsPerBlock SMs (a
// quarter of the GPU). The reduction is memory-bound and runs beside the
// training's compute kernels: a small fixed grid leaves them most SMs and
// still keeps 8 x 16 bytes in flight per thread (kernels/reduce.h; the
// benchmark bench/reduce_sm_cost measures what it reaches).
constexpr int kSmsPerBlock = 4;
constexpr int kChunksPerPass = 8;
constexpr int kMaxChunks = 64;  // Ranks of one job.

struct ChunkPtrs {
  const unsigned char* p[kMaxChunks];
};

// Chunk s of a dense buffer at s * count elements.
inline ChunkPtrs DenseChunks(const void* in, int n, uint64_t count, size_t elem_size) {
  ChunkPtrs c{};
  for (int s = 0; s < n && s < kMaxChunks; ++s)
    c.p[s] = static_cast<const unsigned char*>(in) + uint64_t(s) * count * elem_size;
  return c;
}

struct Plan {
  unsigned blocks = 0;
  bool vectorized = false;
  bool aligned = false;  // scalar path: element-aligned typed loads
};

inline Plan PlanReduce(const ChunkPtrs& in, int n, uint64_t count, size_t elem_size, const void* out, int sms,
                       unsigned max_blocks) {
  Plan p;
  uintptr_t bits = reinterpret_cast<uintptr_t>(out);  // Every address's low bits.
  for (int s = 0; s < n; ++s) bits |= reinterpret_cast<uintptr_t>(in.p[s]);
  p.vectorized = elem_size != 0 && (bits % 16) == 0 && (count * elem_size) % 16 == 0;
  p.aligned = elem_size != 0 && (bits % elem_size) == 0;
  const uint64_t items = p.vectorized ? count * elem_size / 16 : count;
  const uint64_t needed = (items + kThreads - 1) / kThreads;
  uint64_t cap = max_blocks != 0 ? max_blocks : uint64_t(sms > kSmsPerBlock ? sms / kSmsPerBlock : 1);
  p.blocks = unsigned(needed < cap ? needed : cap);
  return p;
}

template <typename Op>
__device__ __forceinline__ typename Op::Storage LoadElem(const unsigned char* in, uint64_t i, bool aligned) {
  typename Op::Storage v;
  if (aligned) {
    v = reinterpret_cast<const typename Op::Storage*>(in)[i];
  } else {
    const unsigned char* p = in + i * sizeof(v);
    unsigned char b[sizeof(v)];
    for (unsigned k = 0; k < sizeof(v); ++k) b[k] = p[k];
    memcpy(&v, b, sizeof(v));
  }
  return v;
}

template <typename Op>
__device__ __forceinline__ void StoreElem(unsigned char* out, uint64_t i, typename Op::Storage v, bool aligned) {
  if (aligned) {
    reinterpret_cast<typename Op::Storage*>(out)[i] = v;
  } else {
    unsigned char b[sizeof(v)];
    memcpy(b, &v, sizeof(v));
    for (unsigned k = 0; k < sizeof(v); ++k) out[i * sizeof(v) + k] = b[k];
  }
}

template <typename Op>
__global__ void __launch_bounds__(kThreads)
    ReduceScalarKernel(const ChunkPtrs in, int n, uint64_t count, bool avg, unsigned char* out, bool aligned) {
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    typename Op::Acc acc = Op::Widen(LoadElem<Op>(in.p[0], i, aligned));
    for (int s = 1; s < n; ++s) acc = Op::Add(acc, Op::Widen(LoadElem<Op>(in.p[s], i, aligned)));
    if (Op::kFloating && avg) acc = Op::Avg(acc, n);
    StoreElem<Op>(out, i, Op::Narrow(acc), aligned);
  }
}

// Adds the 16-byte word w (V elements) into acc[0, V); the first chunk's
// word initializes it.
template <typename Op, int V>
__device__ __forceinline__ void Accumulate(typename Op::Acc (&acc)[V], const uint4& w, bool first) {
  typename Op::Storage e[V];
  memcpy(e, &w, sizeof(e));
#pragma unroll
  for (int j = 0; j < V; ++j) acc[j] = first ? Op::Widen(e[j]) : Op::Add(acc[j], Op::Widen(e[j]));
}

template <typename Op>
__global__ void __launch_bounds__(kThreads)
    ReduceVectorKernel(const ChunkPtrs in, int n, uint64_t words, bool avg, uint4* out) {
  constexpr int V = 16 / sizeof(typename Op::Storage);
  const uint64_t stride = uint64_t(gridDim.x) * blockDim.x;
  for (uint64_t w = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < words; w += stride) {
    typename Op::Acc acc[V];
    for (int s0 = 0; s0 < n; s0 += kChunksPerPass) {
      uint4 v[kChunksPerPass];
#pragma unroll
      for (int k = 0; k < kChunksPerPass; ++k) {
        if (s0 + k < n) v[k] = reinterpret_cast<const uint4*>(in.p[s0 + k])[w];
      }
#pragma unroll
      for (int k = 0; k < kChunksPerPass; ++k) {
        if (s0 + k < n) Accumulate<Op, V>(acc, v[k], s0 + k == 0);
      }
    }
    typename Op::Storage o[V];
#pragma unroll
    for (int j = 0; j < V; ++j) o[j] = Op::Narrow(Op::kFloating && avg ? Op::Avg(acc[j], n) : acc[j]);
    uint4 r;
    memcpy(&r, o, sizeof(r));
    out[w] = r;
  }
}

template <typename Op, typename Stream>
void LaunchTyped(const ChunkPtrs& in, int n, uint64_t count, bool avg, void* out, const Plan& p, Stream stream) {
  if (p.vectorized) {
    ReduceVectorKernel<Op><<<p.blocks, kThreads, 0, stream>>>(in, n, count * sizeof(typename Op::Storage) / 16, avg,
                                                              static_cast<uint4*>(out));
  } else {
    ReduceScalarKernel<Op>
        <<<p.blocks, kThreads, 0, stream>>>(in, n, count, avg, static_cast<unsigned char*>(out), p.aligned);
  }
}

// Enqueues the kernel for a supported (dtype, redop) and n >= 1, count >= 1
// (the caller checked); dtype values as in common/dtype.h.
template <typename Stream>
void Launch(const ChunkPtrs& in, int n, uint64_t count, uint32_t dtype, bool avg, void* out, const Plan& p,
            Stream stream) {
  switch (dtype) {
    case 0:
    case 1:
      return LaunchTyped<numerics::WrapOp<uint8_t>>(in, n, count, avg, out, p, stream);
    case 2:
      return LaunchTyped<numerics::WrapOp<uint32_t>>(in, n, count, avg, out, p, stream);
    case 3:
      return LaunchTyped<numerics::WrapOp<uint64_t>>(in, n, count, avg, out, p, stream);
    case 4:
      return LaunchTyped<numerics::Float16Op>(in, n, count, avg, out, p, stream);
    case 5:
      return LaunchTyped<numerics::Bfloat16Op>(in, n, count, avg, out, p, stream);
    case 6:
      return LaunchTyped<numerics::Float32Op>(in, n, count, avg, out, p, stream);
    case 7:
      return LaunchTyped<numerics::Float64Op>(in, n, count, avg, out, p, stream);
  }
}

// The host side of kernels/reduce.h over a runtime Rt (CUDA or HIP): the
// argument checks, the grid plan from the current device's SM count, the
// launch. Rt has Stream, kInvalidValue, Sms(int*) and LastError() (errors
// as int).
template <typename Rt>
struct HostCalls {
  static int GridFor(const void* in, uint64_t count, uint32_t dtype, const void* out, unsigned max_blocks, Plan* plan,
                     int* sms) {
    if (const int e = Rt::Sms(sms); e != 0) return e;
    const size_t size = ::dmagather::common::DtypeSize(dtype);
    *plan = PlanReduce(DenseChunks(in, 1, count, size), 1, count, size, out, *sms, max_blocks);
    return 0;
  }
  static int OnBlocks(const void* const* chunks, int n, uint64_t count, uint32_t dtype, int redop, void* out,
                      unsigned max_blocks, void* stream) {
    if (n < 1 || n > kMaxChunks || !::dmagather::common::ReduceSupported(dtype, redop, nullptr)) {
      return Rt::kInvalidValue;
    }
    if (count == 0) return 0;
    int sms = 0;
    if (const int e = Rt::Sms(&sms); e != 0) return e;
    ChunkPtrs in{};
    for (int s = 0; s < n; ++s) in.p[s] = static_cast<const unsigned char*>(chunks[s]);
    const Plan p = PlanReduce(in, n, count, ::dmagather::common::DtypeSize(dtype), out, sms, max_blocks);
    Launch(in, n, count, dtype, redop == ::dmagather::common::kRedopAvg, out, p,
           static_cast<typename Rt::Stream>(stream));
    return Rt::LastError();
  }
  static int OnBlocksDense(const void* in, int n, uint64_t count, uint32_t dtype, int redop, void* out,
                           unsigned max_blocks, void* stream) {
    if (n < 1 || n > kMaxChunks) return Rt::kInvalidValue;
    const ChunkPtrs c = DenseChunks(in, n, count, ::dmagather::common::DtypeSize(dtype));
    return OnBlocks(reinterpret_cast<const void* const*>(c.p), n, count, dtype, redop, out, max_blocks, stream);
  }
};

}  // namespace dmagather::kernels::reduce_device
