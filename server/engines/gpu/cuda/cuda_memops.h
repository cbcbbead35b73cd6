// Stream memory operations on 32-bit flags for the cuda runtime: waits
// (>= value: the ranks' ready flags) and writes (a fence first: the ranks'
// done flags), one cuStreamBatchMemOp where the driver takes it, else one
// call per flag (and the batch stays off for that device).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/cuda/cuda_api.h"

namespace dmagather::server::engines::gpu::cuda {

// `scratch` and `batch_ok` are the issuing device's own (one thread at a time).
absl::Status StreamMemOps(const common::cuda::DriverApi& api, int device, CUstream stream, const uint64_t* flags,
                          size_t n, uint32_t value, bool write, std::vector<CUstreamBatchMemOpParams>* scratch,
                          bool* batch_ok);

}  // namespace dmagather::server::engines::gpu::cuda
