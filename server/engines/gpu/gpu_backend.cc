// GpuEngineBackend: see gpu_backend.h.
#include "server/engines/gpu/gpu_backend.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "server/engines/factory.h"
#include "server/engines/gpu/gpu_engine.h"

namespace dmagather::server::engines::gpu {

EngineBackend GpuEngineBackend(GpuBackendSpec spec) {
  EngineBackend b;
  b.name = spec.name;
  b.priority = spec.priority;
  b.label = spec.label;
  b.unusable = spec.unusable;
  b.default_stay_awake_ns = kGpuStayAwakeNs;
  b.create = [create_runtime = spec.create_runtime, chunk_mib_env = spec.chunk_mib_env](
                 const EngineOptions& o) -> absl::StatusOr<std::unique_ptr<CopyEngine>> {
    GpuEngine::Options go;
    go.streams_per_device = o.streams_per_device;
    go.parallel_issue = o.parallel_issue;
    go.stay_awake_ns = static_cast<uint64_t>(std::max<int64_t>(0, o.stay_awake_ns));
    go.chunk_bytes = o.chunk_bytes;
    if (const char* c = chunk_mib_env != nullptr ? std::getenv(chunk_mib_env) : nullptr;
        c != nullptr && std::atoi(c) > 0) {
      go.chunk_bytes = uint64_t(std::atoi(c)) << 20;
    }
    DMAG_ASSIGN_OR_RETURN(std::unique_ptr<GpuRuntime> rt, create_runtime());
    DMAG_ASSIGN_OR_RETURN(std::unique_ptr<GpuEngine> engine, GpuEngine::Create(std::move(rt), go));
    return std::unique_ptr<CopyEngine>(std::move(engine));
  };
  b.describe = [devices = spec.devices](const CopyEngine& e) {
    return absl::StrCat(static_cast<const GpuEngine&>(e).num_devices(), " ", devices);
  };
  return b;
}

}  // namespace dmagather::server::engines::gpu
