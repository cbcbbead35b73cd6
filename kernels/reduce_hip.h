// kernels/reduce.h's functions on AMD GPUs (HIP): the same kernels, the
// same numerics and bits, the same grid rule (compute units for SMs).
// hipStream_t as void*, hipError_t as int. Only where //kernels:reduce_hip
// builds (kernels/BUILD says what it needs).
#pragma once

#include <cstdint>

#include "kernels/reduce.h"

namespace dmagather::kernels::hip {

int ReduceChunks(const void* in, int n, uint64_t count, uint32_t dtype, int redop, void* out, void* stream);
// The same with chunk s at chunks[s] (n <= 64), as the client reduces: the
// other ranks' chunks in staging, its own in its send buffer, which `out`
// may be exactly (in place), never in part.
int ReduceChunks(const void* const* chunks, int n, uint64_t count, uint32_t dtype, int redop, void* out, void* stream);
int ReduceGridFor(const void* in, uint64_t count, uint32_t dtype, const void* out, ReduceGrid* grid,
                  unsigned max_blocks = 0);
int ReduceChunksOnBlocks(const void* in, int n, uint64_t count, uint32_t dtype, int redop, void* out,
                         unsigned max_blocks, void* stream);
int ReduceChunksOnBlocks(const void* const* chunks, int n, uint64_t count, uint32_t dtype, int redop, void* out,
                         unsigned max_blocks, void* stream);

}  // namespace dmagather::kernels::hip
