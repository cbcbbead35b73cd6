// CreateHipRuntime: the GpuRuntime of AMD GPUs (hip_runtime.cc: HIP through
// dlopen, SDMA engines, own engine choice through hsa-runtime where it can).
// It knows nothing of the engine that drives it; register.cc puts the two
// together for --backend=hip.
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

namespace dmagather::server::engines::gpu::hip {

// Fails (Unavailable) without libamdhip64 or without an AMD GPU, and
// (FailedPrecondition) when SDMA is disabled.
absl::StatusOr<std::unique_ptr<GpuRuntime>> CreateHipRuntime(const HipEngineOptions& options);

}  // namespace dmagather::server::engines::gpu::hip
