// CreateCudaRuntime: the GpuRuntime of NVIDIA GPUs (cuda_runtime.cc: the
// CUDA runtime linked statically, driver functions through entry points,
// copy engines). It knows nothing of the engine that drives it;
// register.cc puts the two together for --backend=cuda.
//
// Threads: Create on the daemon's main thread at start; the runtime's calls
// as runtime.h says. Locks: the runtime's own, taken inside its calls, which
// the engine makes under its device-order locks where a call touches
// several devices (device_order.h); none of the engine's.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/engines/factory.h"
#include "server/engines/gpu/runtime.h"

namespace dmagather::server::engines::gpu::cuda {

// Fails (Unavailable) when there is no driver or no device.
absl::StatusOr<std::unique_ptr<GpuRuntime>> CreateCudaRuntime(const CudaEngineOptions& options);

}  // namespace dmagather::server::engines::gpu::cuda
