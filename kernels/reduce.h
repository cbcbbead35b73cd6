// The reduce-scatter's local reduction on an NVIDIA GPU: the n chunks of a
// rank's staging buffer (chunk s at element offset s * count is rank s's
// contribution, written there by the copy engines' all-to-all) folded into
// its output, with the numerics of common/reduce.h, bit for bit the same as
// common::ReduceChunks on the host. Linked into libdmagather's cuda backend
// and into the GPU test and benchmark; runs in the caller's CUDA context, on
// the current device.
//
// Launch shape: a fixed grid of 512-thread blocks, at most one block per 4
// SMs (a quarter of the GPU) and no more than the output needs: the
// reduction is memory-bound and runs beside the training's compute, so it
// takes few SMs (bench/reduce_sm_cost measures its bandwidth and what it
// costs a concurrent GEMM). The fast path reads 16-byte words and needs
// `in` and `out` 16-byte aligned and count * element size a multiple of
// 16; other calls take an element-wise path (any alignment).
#pragma once

#include <cstdint>

namespace dmagather::kernels {

// out[0, count) = the reduction of the n chunks at `in` (device memory,
// n * count elements; `out` must not overlap it). dtype and redop are
// dmagather_dtype_t and dmagather_redop_t values. Enqueues on `stream` (a
// cudaStream_t; NULL = the legacy default stream) and never synchronizes.
// Returns a cudaError_t as int: cudaErrorInvalidValue where
// common::ReduceSupported refuses (dtype, redop) or n < 1; count == 0
// enqueues nothing and returns 0.
int ReduceChunks(const void* in, int n, uint64_t count, uint32_t dtype, int redop, void* out, void* stream);
// The same with chunk s at chunks[s] (n <= 64), as the client reduces: the
// other ranks' chunks in staging, its own in its send buffer, which `out`
// may be exactly (in place), never in part.
int ReduceChunks(const void* const* chunks, int n, uint64_t count, uint32_t dtype, int redop, void* out, void* stream);

// The launch ReduceChunks (or ReduceChunksOnBlocks with max_blocks) uses
// for these arguments on the current device.
struct ReduceGrid {
  unsigned blocks = 0;      // 0 when count == 0 (nothing launched)
  unsigned threads = 0;     // per block
  bool vectorized = false;  // the 16-byte path
  int sms = 0;              // the device's multiprocessors
};
int ReduceGridFor(const void* in, uint64_t count, uint32_t dtype, const void* out, ReduceGrid* grid,
                  unsigned max_blocks = 0);

// ReduceChunks with the grid capped at `max_blocks` blocks instead of the
// default quarter of the SMs (0 = the default): for the benchmark's sweep.
int ReduceChunksOnBlocks(const void* in, int n, uint64_t count, uint32_t dtype, int redop, void* out,
                         unsigned max_blocks, void* stream);
int ReduceChunksOnBlocks(const void* const* chunks, int n, uint64_t count, uint32_t dtype, int redop, void* out,
                         unsigned max_blocks, void* stream);

}  // namespace dmagather::kernels
