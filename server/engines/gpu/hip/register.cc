// --backend=hip: a GpuEngine (gpu_backend.h) over the hip runtime
// (hip_runtime.h), registered with the engine registry
// (server/engines/engine_registry.h) during static initialization; the
// first choice of --backend=auto. The one file of hip/ that knows the
// engine. Owns nothing but the registration. Threads: the registration
// during static initialization; the runtime and the engine are made on the
// daemon's main thread at start (CreateEngine). Locks: none.
#include "server/engines/engine_registry.h"
#include "server/engines/factory.h"
#include "server/engines/gpu/gpu_backend.h"
#include "server/engines/gpu/hip/hip_runtime.h"

namespace dmagather::server::engines::gpu::hip {
namespace {

const EngineRegistration kHipRegistration(GpuEngineBackend({
    .name = "hip",
    .priority = 300,
    .label = "HIP",
    .unusable = "no usable AMD GPU",
    .devices = "AMD GPU(s) (HIP, SDMA)",
    .create_runtime = [](const EngineOptions& o) { return CreateHipRuntime(o.hip); },
}));

}  // namespace
}  // namespace dmagather::server::engines::gpu::hip
