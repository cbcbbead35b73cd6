// --backend=cuda: a GpuEngine (gpu_backend.h) over the cuda runtime
// (cuda_runtime.h), registered with the engine registry
// (server/engines/engine_registry.h); tried by --backend=auto after hip.
// The one file of cuda/ that knows the engine. Owns nothing but the
// registration. Threads: the registration during static initialization;
// the runtime and the engine are made on the daemon's main thread at start
// (CreateEngine). Locks: none.
#include "server/engines/engine_registry.h"
#include "server/engines/factory.h"
#include "server/engines/gpu/cuda/cuda_runtime.h"
#include "server/engines/gpu/gpu_backend.h"

namespace dmagather::server::engines::gpu::cuda {
namespace {

const EngineRegistration kCudaRegistration(GpuEngineBackend({
    .name = "cuda",
    .priority = 200,
    .label = "CUDA",
    .unusable = "no usable CUDA GPU",
    .devices = "CUDA GPU(s)",
    .create_runtime = [](const EngineOptions& o) { return CreateCudaRuntime(o.cuda); },
}));

}  // namespace
}  // namespace dmagather::server::engines::gpu::cuda
